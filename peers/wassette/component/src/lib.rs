//! `text_stats` for Wassette: the logic of `plugins/text-stats`, string in, JSON text out.

use serde::Serialize;

wit_bindgen::generate!({ world: "text-stats", path: "wit" });

/// Same fields, in the same order, as toolhost's `Stats`.
#[derive(Serialize)]
struct Stats {
    chars: usize,
    bytes: usize,
    words: usize,
    lines: usize,
    sentences: usize,
    avg_word_len: f64,
}

fn stats(text: &str) -> Stats {
    let words: Vec<&str> = text.split_whitespace().collect();
    let word_chars: usize = words.iter().map(|w| w.chars().count()).sum();
    Stats {
        chars: text.chars().count(),
        bytes: text.len(),
        words: words.len(),
        lines: text.lines().count(),
        sentences: text
            .split(['.', '!', '?'])
            .filter(|s| s.chars().any(char::is_alphanumeric))
            .count(),
        avg_word_len: if words.is_empty() {
            0.0
        } else {
            (word_chars as f64 / words.len() as f64 * 100.0).round() / 100.0
        },
    }
}

struct Component;

impl Guest for Component {
    fn text_stats(text: String) -> String {
        serde_json::to_string(&stats(&text)).unwrap_or_default()
    }
}

export!(Component);
