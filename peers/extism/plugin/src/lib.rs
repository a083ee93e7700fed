//! `text_stats` for Extism: the logic of `plugins/text-stats`, JSON in and out.

use extism_pdk::{FnResult, Json, plugin_fn};
use serde_json::{Value, json};

#[plugin_fn]
pub fn text_stats(Json(args): Json<Value>) -> FnResult<Json<Value>> {
    let text = args["text"].as_str().unwrap_or_default();
    let words: Vec<&str> = text.split_whitespace().collect();
    let word_chars: usize = words.iter().map(|w| w.chars().count()).sum();
    let avg_word_len = if words.is_empty() {
        0.0
    } else {
        (word_chars as f64 / words.len() as f64 * 100.0).round() / 100.0
    };
    Ok(Json(json!({
        "chars": text.chars().count(),
        "bytes": text.len(),
        "words": words.len(),
        "lines": text.lines().count(),
        "sentences": text
            .split(['.', '!', '?'])
            .filter(|s| s.chars().any(char::is_alphanumeric))
            .count(),
        "avg_word_len": avg_word_len,
    })))
}
