//! Text statistics: counts and word frequencies, two tools in one component.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolhost_sdk::{Context, Tool, ToolError, export_tools};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StatsArgs {
    /// The text to measure.
    text: String,
}

/// What `text_stats` returns: its output schema.
#[derive(Serialize, JsonSchema)]
struct Stats {
    chars: usize,
    bytes: usize,
    words: usize,
    lines: usize,
    sentences: usize,
    avg_word_len: f64,
}

fn text_stats(args: StatsArgs, _ctx: &Context) -> Result<Stats, ToolError> {
    let text = args.text;
    let words: Vec<&str> = text.split_whitespace().collect();
    let word_chars: usize = words.iter().map(|w| w.chars().count()).sum();
    Ok(Stats {
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
    })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FrequencyArgs {
    /// The text to analyse.
    text: String,
    /// How many of the most frequent words to return (default 10).
    #[schemars(range(min = 1, max = 1000))]
    top: Option<usize>,
}

#[derive(Serialize)]
struct WordCount {
    word: String,
    count: usize,
}

fn word_frequency(args: FrequencyArgs, _ctx: &Context) -> Result<Vec<WordCount>, ToolError> {
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for word in args.text.split(|c: char| !c.is_alphanumeric() && c != '\'') {
        if !word.is_empty() {
            *counts.entry(word.to_lowercase()).or_default() += 1;
        }
    }
    let mut counts: Vec<WordCount> = counts
        .into_iter()
        .map(|(word, count)| WordCount { word, count })
        .collect();
    // Most frequent first; ties alphabetically so the answer is stable.
    counts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.word.cmp(&b.word)));
    counts.truncate(args.top.unwrap_or(10));
    Ok(counts)
}

export_tools!(
    Tool::new(
        "text_stats",
        "Counts characters, bytes, words, lines and sentences in a text, and the average word length.",
        text_stats,
    )
    .output_schema::<Stats>()
    .group("text")
    .strict(),
    Tool::new(
        "word_frequency",
        "Lists the most frequent words in a text (case-insensitive), most frequent first.",
        word_frequency,
    )
    .group("text")
    .strict(),
);
