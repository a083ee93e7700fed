//! Ranked tool search: BM25 blended with static embeddings, or with a contextual model when
//! one is configured (`encoder.rs`). An index is built from a list of specs and knows
//! nothing of tenants or hosts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use toolhost_spec::digest::sha256_hex;
use toolhost_spec::spec::ToolSpec;

use crate::embed::{DIMS, Embeddings, normalize};
use crate::encoder::{Pages, SentenceEncoder, has_vnni, quantise_symmetric};
use crate::f32s_from_le;

/// A hybrid index over tools. Lexical: BM25 over name (weighted 3), description, parameter
/// names (2) and their descriptions. Semantic: each tool's static embedding (`embed.rs`), the
/// IDF-weighted mean of its text's word pieces. A tool's score is
/// `SEMANTIC_WEIGHT × cosine + (1 − SEMANTIC_WEIGHT) × BM25 / best BM25`. Built with a
/// contextual encoder, the cosine is the encoder's and weighs `CONTEXTUAL_WEIGHT`. Documents
/// are the positions of the specs it was built from.
pub struct Index {
    postings: HashMap<String, Vec<(u32, f32)>>,
    lengths: Vec<f32>,
    average_length: f32,
    semantic: Semantic,
}

/// One unit vector per document, and how the query is embedded in the same space.
enum Semantic {
    Static {
        vectors: UnitVectors,
        /// Inverse document frequency of each word piece in these tools' texts.
        piece_idf: HashMap<u32, f32>,
        /// The weight of a piece no tool has.
        unseen_idf: f32,
    },
    /// A contextual encoder, which also embeds the query.
    Contextual {
        encoder: Arc<SentenceEncoder>,
        vectors: UnitVectors,
    },
}

/// Unit vectors in int8, each with its scale, in one table: a search over 10 000 tools reads
/// 3.8 MB of the model's vectors instead of 15 MB, and the products are exact integer sums.
struct UnitVectors {
    /// Each row padded with zeros to a multiple of 64 bytes, one AVX-512 register.
    stride: usize,
    codes: Pages,
    scales: Vec<f32>,
    /// Per row, 128 × the sum of its codes: what a query moved up by 128 (to u8) adds.
    offsets: Vec<i32>,
}

impl UnitVectors {
    fn new<'a>(dimensions: usize, vectors: impl IntoIterator<Item = &'a [f32]>) -> Self {
        let stride = dimensions.div_ceil(64) * 64;
        let (mut codes, mut scales, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
        for v in vectors {
            let (row, scale) = quantise_symmetric(v, stride);
            offsets.push(128 * row.iter().map(|&c| i32::from(c)).sum::<i32>());
            codes.extend(row);
            scales.push(scale);
        }
        UnitVectors {
            stride,
            codes: Pages::from(&[&codes]),
            scales,
            offsets,
        }
    }

    /// The cosine of the unit vector `query` with each vector, in order.
    fn cosines(&self, query: &[f32]) -> Vec<f32> {
        let (query, scale) = quantise_symmetric(query, self.stride);
        #[cfg(target_arch = "x86_64")]
        if has_vnni() {
            // SAFETY: the CPU has the features.
            return unsafe { self.cosines_vnni(&query, scale) };
        }
        self.portable_cosines(&query, scale)
    }

    fn portable_cosines(&self, query: &[i8], scale: f32) -> Vec<f32> {
        let rows = self.codes.bytes().chunks_exact(self.stride);
        rows.zip(&self.scales)
            .map(|(codes, row_scale)| {
                let sum: i32 = codes
                    .iter()
                    .zip(query)
                    .map(|(&a, &b)| i32::from(a) * i32::from(b))
                    .sum();
                sum as f32 * row_scale * scale
            })
            .collect()
    }

    /// The same sums by `vpdpbusd`, 64 products an instruction, reading ahead of the scan.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn cosines_vnni(&self, query: &[i8], scale: f32) -> Vec<f32> {
        use std::arch::x86_64::*;
        let moved: Vec<u8> = query.iter().map(|&q| (q as u8) ^ 0x80).collect();
        let mut cosines = Vec::with_capacity(self.scales.len());
        let rows = self.codes.bytes().chunks_exact(self.stride);
        for (codes, (row_scale, offset)) in rows.zip(self.scales.iter().zip(&self.offsets)) {
            let mut acc = _mm512_setzero_si512();
            // SAFETY: `codes` and `moved` are `stride` bytes, a multiple of 64; a prefetch of
            // any address is harmless.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(codes.as_ptr().wrapping_add(8192).cast());
                for at in (0..self.stride).step_by(64) {
                    let q = _mm512_loadu_si512(moved.as_ptr().add(at).cast());
                    let c = _mm512_loadu_si512(codes.as_ptr().add(at).cast());
                    acc = _mm512_dpbusd_epi32(acc, q, c);
                }
            }
            let sum = _mm512_reduce_add_epi32(acc) - offset;
            cosines.push(sum as f32 * row_scale * scale);
        }
        cosines
    }
}

/// Where a search model's vectors of tool texts persist (the host's store, in a server), as
/// little-endian f32 bytes. Failures are the cache's to log: a miss only means encoding again.
pub trait VectorCache: Send + Sync {
    /// The stored vector under `key`, if any.
    fn get(&self, key: &str) -> Option<Vec<u8>>;
    /// Stores a vector under `key`.
    fn put(&self, key: &str, vector: &[u8]);
}

/// A search model's vectors of tool texts: from memory, else from the cache, else encoded
/// (and kept in both), so neither a catalog change nor a restart encodes a text twice.
pub struct ToolVectors {
    encoder: Arc<SentenceEncoder>,
    cache: Option<Arc<dyn VectorCache>>,
    memory: Mutex<HashMap<String, Arc<[f32]>>>,
}

/// Past this many texts in memory, the memory starts over (the store still has them).
const MEMORY_VECTORS: usize = 100_000;

impl ToolVectors {
    /// Vectors from `encoder`, persisted in `cache` if there is one.
    pub fn new(encoder: Arc<SentenceEncoder>, cache: Option<Arc<dyn VectorCache>>) -> Self {
        ToolVectors {
            encoder,
            cache,
            memory: Mutex::default(),
        }
    }

    /// What this model's keys in the cache start with.
    pub fn prefix(&self) -> String {
        format!("{}/", self.encoder.fingerprint())
    }

    /// The cache key of `spec`'s vector: what a collection of vectors no tool needs keeps.
    pub fn key(&self, spec: &ToolSpec) -> String {
        self.key_of(&embedding_text(spec))
    }

    fn key_of(&self, text: &str) -> String {
        format!("{}{}", self.prefix(), sha256_hex(text.as_bytes()))
    }

    fn get(&self, text: &str) -> Arc<[f32]> {
        let key = self.key_of(text);
        let memory = || self.memory.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = memory().get(&key) {
            return v.clone();
        }
        let stored = self.cache.as_ref().and_then(|cache| cache.get(&key));
        let stored = stored
            .filter(|bytes| bytes.len() == 4 * self.encoder.dimensions())
            .map(|bytes| f32s_from_le(&bytes));
        let vector: Arc<[f32]> = match stored {
            Some(v) => v.into(),
            None => {
                let v = self.encoder.encode(text);
                if let Some(cache) = &self.cache {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    cache.put(&key, &bytes);
                }
                v.into()
            }
        };
        let mut memory = memory();
        if memory.len() >= MEMORY_VECTORS {
            memory.clear();
        }
        memory.insert(key, vector.clone());
        vector
    }
}

/// Chosen on the tuned half of the evaluation set (0.7 and 0.8 tie there).
pub const SEMANTIC_WEIGHT: f32 = 0.7;
/// A tool with no query word in common must be at least this similar to be a result.
const MIN_SIMILARITY: f32 = 0.3;
/// Chosen on the tuned half: 1.0 and 0.9 tie there, and a little BM25 keeps a tool named
/// verbatim in the query first.
pub const CONTEXTUAL_WEIGHT: f32 = 0.9;
/// The contextual encoder's cosines run lower: unrelated tools sit near 0.02.
const MIN_CONTEXTUAL_SIMILARITY: f32 = 0.05;

const K1: f32 = 1.2;
const B: f32 = 0.75;
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "i", "in", "into", "is", "it",
    "its", "me", "my", "of", "on", "or", "that", "the", "this", "to", "with", "what", "which",
    "who", "how", "do", "does", "can", "you", "your", "please", "want", "need", "some", "any",
    "all",
];

/// The text a tool is embedded from: its name as words, description and parameters.
fn embedding_text(spec: &ToolSpec) -> String {
    let mut text = format!(
        "{}. {}",
        spec.name.replace(['_', '-'], " "),
        spec.description
    );
    if let Some(props) = spec.parameters.get("properties").and_then(Value::as_object) {
        for (name, schema) in props {
            text.push(' ');
            text.push_str(&name.replace('_', " "));
            if let Some(d) = schema.get("description").and_then(Value::as_str) {
                text.push(' ');
                text.push_str(d);
            }
        }
    }
    text
}

impl Index {
    /// An index of `specs` with static embeddings for its semantic half.
    pub fn build(specs: &[ToolSpec]) -> Self {
        Index::with_semantic(specs, static_vectors(specs))
    }

    /// [`Index::build`] that ranks with a search model's vectors.
    pub fn build_contextual(specs: &[ToolSpec], tool_vectors: &ToolVectors) -> Self {
        let encoder = tool_vectors.encoder.clone();
        let vectors: Vec<Arc<[f32]>> = specs
            .iter()
            .map(|s| tool_vectors.get(&embedding_text(s)))
            .collect();
        let vectors = UnitVectors::new(encoder.dimensions(), vectors.iter().map(|v| &v[..]));
        Index::with_semantic(specs, Semantic::Contextual { encoder, vectors })
    }

    /// The BM25 postings of `specs`, beside their vectors.
    fn with_semantic(specs: &[ToolSpec], semantic: Semantic) -> Self {
        let mut postings: HashMap<String, Vec<(u32, f32)>> = HashMap::new();
        let mut lengths = Vec::with_capacity(specs.len());
        for (doc, spec) in specs.iter().enumerate() {
            let mut terms: HashMap<String, f32> = HashMap::new();
            let mut add = |text: &str, weight: f32| {
                for term in tokens(text) {
                    *terms.entry(term).or_default() += weight;
                }
            };
            add(&spec.name, 3.0);
            add(&spec.description, 1.0);
            if let Some(props) = spec.parameters.get("properties").and_then(Value::as_object) {
                for (name, schema) in props {
                    add(name, 2.0);
                    if let Some(d) = schema.get("description").and_then(Value::as_str) {
                        add(d, 0.5);
                    }
                }
            }
            lengths.push(terms.values().sum());
            for (term, frequency) in terms {
                postings
                    .entry(term)
                    .or_default()
                    .push((doc as u32, frequency));
            }
        }
        let average_length = lengths.iter().sum::<f32>() / lengths.len().max(1) as f32;
        Index {
            postings,
            lengths,
            average_length: average_length.max(1.0),
            semantic,
        }
    }

    /// The `limit` best documents for `query`, best first: (document, score).
    pub fn search(&self, query: &str, limit: usize) -> Vec<(usize, f32)> {
        let weight = match self.semantic {
            Semantic::Static { .. } => SEMANTIC_WEIGHT,
            Semantic::Contextual { .. } => CONTEXTUAL_WEIGHT,
        };
        self.search_weighted(query, limit, weight)
    }

    /// [`Index::search`] with another weight of the semantic score: 0 is BM25 alone.
    pub fn search_weighted(&self, query: &str, limit: usize, semantic: f32) -> Vec<(usize, f32)> {
        let lexical = self.bm25(query);
        let best = lexical.values().copied().fold(0.0_f32, f32::max);
        if semantic <= 0.0 {
            let ranked = lexical.iter().map(|(&doc, &s)| (doc as usize, s / best));
            return best_first(ranked, limit);
        }
        let (cosines, floor) = match &self.semantic {
            Semantic::Static {
                vectors,
                piece_idf,
                unseen_idf,
            } => {
                let embeddings = Embeddings::get();
                let mut q = [0.0; DIMS];
                for id in embeddings.pieces(query) {
                    let weight = piece_idf.get(&id).copied().unwrap_or(*unseen_idf);
                    embeddings.accumulate(id, weight, &mut q);
                }
                normalize(&mut q);
                (vectors.cosines(&q), MIN_SIMILARITY)
            }
            Semantic::Contextual { encoder, vectors } => (
                vectors.cosines(&encoder.encode(query)),
                MIN_CONTEXTUAL_SIMILARITY,
            ),
        };
        let mut bm25 = vec![0.0; cosines.len()];
        for (&doc, &score) in &lexical {
            bm25[doc as usize] = score / best;
        }
        // A document with no query word counts only when its cosine reaches the floor.
        let ranked =
            cosines
                .into_iter()
                .zip(bm25)
                .enumerate()
                .filter_map(|(doc, (cosine, bm25))| {
                    (bm25 > 0.0 || cosine >= floor)
                        .then_some((doc, semantic * cosine + (1.0 - semantic) * bm25))
                });
        best_first(ranked, limit)
    }

    /// BM25 score of each document with a query word.
    fn bm25(&self, query: &str) -> HashMap<u32, f32> {
        let n = self.lengths.len() as f32;
        let mut scores: HashMap<u32, f32> = HashMap::new();
        let mut terms = tokens(query);
        terms.sort();
        terms.dedup();
        for term in terms {
            let Some(postings) = self.postings.get(&term) else {
                continue;
            };
            let df = postings.len() as f32;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for &(doc, tf) in postings {
                let length = self.lengths[doc as usize] / self.average_length;
                let score = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * length));
                *scores.entry(doc).or_default() += score;
            }
        }
        scores
    }
}

/// Each document's static embedding: the IDF-weighted mean of its text's word pieces.
fn static_vectors(specs: &[ToolSpec]) -> Semantic {
    let embeddings = Embeddings::get();
    let pieces: Vec<Vec<u32>> = specs
        .iter()
        .map(|s| embeddings.pieces(&embedding_text(s)))
        .collect();
    let mut document_frequency: HashMap<u32, u32> = HashMap::new();
    for doc in &pieces {
        let mut seen: Vec<u32> = doc.clone();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            *document_frequency.entry(id).or_default() += 1;
        }
    }
    let n = specs.len() as f32;
    let idf = |df: u32| ((n + 1.0) / (df as f32 + 1.0)).ln() + 1.0;
    let piece_idf: HashMap<u32, f32> = document_frequency
        .into_iter()
        .map(|(id, df)| (id, idf(df)))
        .collect();
    let vectors: Vec<[f32; DIMS]> = pieces
        .iter()
        .map(|doc| {
            let mut v = [0.0; DIMS];
            for &id in doc {
                embeddings.accumulate(id, piece_idf[&id], &mut v);
            }
            normalize(&mut v);
            v
        })
        .collect();
    let vectors = UnitVectors::new(DIMS, vectors.iter().map(|v| &v[..]));
    Semantic::Static {
        vectors,
        piece_idf,
        unseen_idf: idf(0),
    }
}

/// The `limit` highest scores, best first; ties broken by position, so results are stable.
/// One pass that keeps only the best so far: most documents are one comparison.
fn best_first(ranked: impl Iterator<Item = (usize, f32)>, limit: usize) -> Vec<(usize, f32)> {
    let before =
        |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)).is_lt();
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(limit + 1);
    for item in ranked {
        if best.len() == limit && best.last().is_none_or(|worst| !before(&item, worst)) {
            continue;
        }
        let at = best.partition_point(|kept| before(kept, &item));
        best.insert(at, item);
        best.truncate(limit);
    }
    best
}

/// Lower-cased words, split at punctuation, `snake_case` and `camelCase`, lightly stemmed.
pub fn tokens(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && previous_lower && !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = c.is_lowercase() || c.is_numeric();
            current.extend(c.to_lowercase());
        } else {
            previous_lower = false;
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
        .into_iter()
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .map(|w| stem(&w))
        .collect()
}

/// A light suffix stripper: enough that "converts", "converting" and "convert" meet.
fn stem(word: &str) -> String {
    for suffix in ["ing", "ies", "es", "ed", "s"] {
        if let Some(stem) = word.strip_suffix(suffix)
            && stem.chars().count() >= 3
        {
            return match suffix {
                "ies" => format!("{stem}y"),
                _ => stem.to_owned(),
            };
        }
    }
    word.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small deterministic generator, so a failure reproduces.
    fn unit_vector(dimensions: usize, seed: u32) -> Vec<f32> {
        let mut state = seed;
        let mut v: Vec<f32> = (0..dimensions)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
        v
    }

    #[test]
    fn int8_cosines_are_close_to_the_float_ones_on_every_path() {
        // 384 dimensions (the model's) over 6 000 rows, more than one 2 MB page; and 100
        // (padded to 128) over a few rows.
        for (dimensions, rows) in [(384, 6000), (100, 50)] {
            let vectors: Vec<Vec<f32>> = (0..rows).map(|i| unit_vector(dimensions, i)).collect();
            let table = UnitVectors::new(dimensions, vectors.iter().map(|v| &v[..]));
            let query = unit_vector(dimensions, 99_999);
            let got = table.cosines(&query);
            let (codes, scale) = quantise_symmetric(&query, table.stride);
            assert_eq!(got, table.portable_cosines(&codes, scale));
            for (v, cosine) in vectors.iter().zip(&got) {
                let exact: f32 = v.iter().zip(&query).map(|(a, b)| a * b).sum();
                assert!((cosine - exact).abs() < 0.01, "{cosine} against {exact}");
            }
        }
    }

    #[test]
    fn best_first_keeps_the_top_scores_in_order_with_ties_by_position() {
        let scores: Vec<(usize, f32)> = (0..500)
            .map(|i| (i, ((i * 7919) % 101) as f32 / 10.0))
            .collect();
        let mut sorted = scores.clone();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for limit in [0, 1, 5, 37, 500, 600] {
            let got = best_first(scores.iter().copied(), limit);
            assert_eq!(got, sorted[..limit.min(500)], "limit {limit}");
        }
    }

    #[test]
    fn tokens_split_names_and_stem() {
        assert_eq!(tokens("convertUnits"), ["convert", "unit"]);
        assert_eq!(tokens("send_email to the Team!"), ["send", "email", "team"]);
        assert_eq!(tokens("Converting queries"), ["convert", "query"]);
    }

    #[test]
    fn search_ranks_the_matching_tool_first() {
        let spec = |name: &str, description: &str| {
            ToolSpec::new(name, description, json!({"type": "object"}))
        };
        let specs = [
            spec("send_email", "Sends an email message to a recipient."),
            spec(
                "convert_units",
                "Converts a quantity between units of length, mass and time.",
            ),
            spec(
                "weather_forecast",
                "Returns the weather forecast for a city.",
            ),
        ];
        let index = Index::build(&specs);
        assert_eq!(
            index.search("how many km is 3 miles? convert length", 3)[0].0,
            1
        );
        assert_eq!(index.search("email my boss", 3)[0].0, 0);
        assert_eq!(
            index.search("will it rain in Oslo tomorrow forecast", 1)[0].0,
            2
        );
        // Nothing in common and nothing similar: no results.
        assert!(index.search("zzzz", 3).is_empty());
    }
}
