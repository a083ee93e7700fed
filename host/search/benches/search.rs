//! Tool search quality and speed: `cargo bench -p toolhost --bench search`.
//!
//! Quality: the labelled set in `benches/data/search-eval.json` (500 tools over 50 domains, 50
//! queries with their expected tool and 50 more held out from tuning; regenerate with
//! `scripts/gen-search-eval.py`), ranked by
//! the hybrid index (BM25 and static embeddings) and, as peers, BM25 alone and plain keyword
//! overlap with the same tokenizer.
//! Speed: p50/p99 of one search over 10 000 tools (the set 20 times), against rebuilding the
//! index for every query.
//!
//! With `TOOLHOST_SEARCH_MODEL=DIR` (`scripts/fetch-search-model` prints it), the same figures
//! for the index that ranks with that contextual encoder.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use toolhost_search::SentenceEncoder;
use toolhost_search::{Index, ToolVectors, tokens};
use toolhost_spec::ToolSpec;

#[derive(Deserialize)]
struct EvalSet {
    tools: Vec<EvalTool>,
    queries: Vec<EvalQuery>,
    /// Written before the ranking was tuned and never used to tune it.
    held_out_queries: Vec<EvalQuery>,
}

#[derive(Deserialize)]
struct EvalTool {
    name: String,
    description: String,
    parameters: Value,
}

#[derive(Deserialize)]
struct EvalQuery {
    query: String,
    expected: String,
}

/// The peer: how many distinct query words a tool's text contains.
fn overlap_ranking(specs: &[ToolSpec], query: &str, limit: usize) -> Vec<usize> {
    let wanted: HashSet<String> = tokens(query).into_iter().collect();
    let mut scored: Vec<(usize, usize)> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let text = format!("{} {} {}", s.name, s.description, s.parameters);
            let have: HashSet<String> = tokens(&text).into_iter().collect();
            (i, wanted.intersection(&have).count())
        })
        .filter(|&(_, n)| n > 0)
        .collect();
    scored.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.into_iter().take(limit).map(|(i, _)| i).collect()
}

fn recall(rankings: &[(Vec<usize>, usize)], k: usize) -> f64 {
    let hits = rankings
        .iter()
        .filter(|(ranked, expected)| ranked.iter().take(k).any(|i| i == expected))
        .count();
    hits as f64 / rankings.len() as f64
}

/// One table row: `label`, then the p50 and p99 of `sorted` in µs.
fn latency_row(label: &str, sorted: &[Duration]) {
    let (p50, p99) = (percentile(sorted, 50), percentile(sorted, 99));
    println!("{label:<34} {p50:>9.1} {p99:>9.1}");
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1e6
}

fn main() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/search-eval.json");
    let set: EvalSet = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let specs: Vec<ToolSpec> = set
        .tools
        .iter()
        .map(|t| ToolSpec::new(&t.name, &t.description, t.parameters.clone()))
        .collect();
    let position = |name: &str| specs.iter().position(|s| s.name == name).unwrap();

    let index = Index::build(&specs);
    println!(
        "search quality: {} tools; {} labelled queries, {} more held out from tuning",
        specs.len(),
        set.queries.len(),
        set.held_out_queries.len()
    );
    println!("{:<34} {:>9} {:>9}", "", "recall@1", "recall@5");
    let mut misses = Vec::new();
    for (label, queries) in [("", &set.queries), (" (held out)", &set.held_out_queries)] {
        let mut hybrid = Vec::new();
        let mut bm25 = Vec::new();
        let mut overlap = Vec::new();
        for q in queries {
            let expected = position(&q.expected);
            let ids = |ranked: Vec<(usize, f32)>| ranked.into_iter().map(|(i, _)| i).collect();
            let ranked: Vec<usize> = ids(index.search(&q.query, 5));
            if !ranked.contains(&expected) {
                let top = ranked
                    .first()
                    .map_or("(nothing)", |&i| specs[i].name.as_str());
                misses.push(format!(
                    "  {:?}: expected {}, got {top}",
                    q.query, q.expected
                ));
            }
            hybrid.push((ranked, expected));
            bm25.push((ids(index.search_weighted(&q.query, 5, 0.0)), expected));
            overlap.push((overlap_ranking(&specs, &q.query, 5), expected));
        }
        for (name, rankings) in [
            ("BM25 + static embeddings", &hybrid),
            ("peer: BM25 alone", &bm25),
            ("peer: keyword overlap", &overlap),
        ] {
            println!(
                "{:<34} {:>9.2} {:>9.2}",
                format!("{name}{label}"),
                recall(rankings, 1),
                recall(rankings, 5)
            );
        }
    }
    println!("misses in the top 5:\n{}", misses.join("\n"));

    // 10 000 tools: the set 20 times over, names made unique.
    let large: Vec<ToolSpec> = (0..20)
        .flat_map(|copy| {
            specs.iter().map(move |s| {
                let mut s = s.clone();
                s.name = format!("{}_{copy}", s.name);
                s
            })
        })
        .collect();
    let start = Instant::now();
    let large_index = Index::build(&large);
    let build = start.elapsed();
    let mut samples = Vec::new();
    let mut lexical = Vec::new();
    for _ in 0..40 {
        for q in &set.queries {
            let start = Instant::now();
            std::hint::black_box(large_index.search(&q.query, 5));
            samples.push(start.elapsed());
            let start = Instant::now();
            std::hint::black_box(large_index.search_weighted(&q.query, 5, 0.0));
            lexical.push(start.elapsed());
        }
    }
    samples.sort();
    lexical.sort();
    let mut rebuild = Vec::new();
    for q in set.queries.iter().take(10) {
        let start = Instant::now();
        std::hint::black_box(Index::build(&large).search(&q.query, 5));
        rebuild.push(start.elapsed());
    }
    rebuild.sort();
    println!();
    println!(
        "search latency over {} tools ({} searches)",
        large.len(),
        samples.len()
    );
    println!("{:<34} {:>9} {:>9}", "", "p50 µs", "p99 µs");
    latency_row("cached index, hybrid", &samples);
    latency_row("peer: cached index, BM25 alone", &lexical);
    latency_row("peer: rebuild index per query", &rebuild);
    println!("index build: {:.1} ms", build.as_secs_f64() * 1e3);

    if let Some(dir) = std::env::var_os("TOOLHOST_SEARCH_MODEL") {
        let encoder = std::sync::Arc::new(SentenceEncoder::load(dir.as_ref()).unwrap());
        contextual(&set, &specs, encoder);
    }
}

/// Quality and speed of the index that ranks with a contextual encoder.
fn contextual(set: &EvalSet, specs: &[ToolSpec], encoder: std::sync::Arc<SentenceEncoder>) {
    let position = |name: &str| specs.iter().position(|s| s.name == name).unwrap();
    let start = Instant::now();
    let vectors = ToolVectors::new(encoder, None);
    let index = Index::build_contextual(specs, &vectors);
    let per_tool = start.elapsed() / specs.len() as u32;
    println!();
    println!("{:<34} {:>9} {:>9}", "", "recall@1", "recall@5");
    let mut misses = Vec::new();
    for (label, queries) in [("", &set.queries), (" (held out)", &set.held_out_queries)] {
        let rankings: Vec<(Vec<usize>, usize)> = queries
            .iter()
            .map(|q| {
                let ranked: Vec<usize> = index
                    .search(&q.query, 5)
                    .into_iter()
                    .map(|(i, _)| i)
                    .collect();
                let expected = position(&q.expected);
                if !ranked.contains(&expected) {
                    misses.push(format!("  {:?}: expected {}", q.query, q.expected));
                }
                (ranked, expected)
            })
            .collect();
        println!(
            "{:<34} {:>9.2} {:>9.2}",
            format!("BM25 + contextual encoder{label}"),
            recall(&rankings, 1),
            recall(&rankings, 5)
        );
    }
    println!("misses in the top 5:\n{}", misses.join("\n"));

    // The set 20 times over with its texts unchanged, so its vectors come from memory;
    // encoding was timed above.
    let large: Vec<ToolSpec> = (0..20).flat_map(|_| specs.iter().cloned()).collect();
    let large_index = Index::build_contextual(&large, &vectors);
    let mut samples = Vec::new();
    for _ in 0..4 {
        for q in &set.queries {
            let start = Instant::now();
            std::hint::black_box(large_index.search(&q.query, 5));
            samples.push(start.elapsed());
        }
    }
    samples.sort();
    println!();
    println!("{:<34} {:>9} {:>9}", "", "p50 µs", "p99 µs");
    latency_row(
        &format!("cached index, contextual, {} tools", large.len()),
        &samples,
    );
    println!(
        "index build: {:.1} ms a tool, encoding each",
        per_tool.as_secs_f64() * 1e3
    );
}
