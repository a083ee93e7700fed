//! Static word-piece embeddings for tool search: one 128-dimensional vector per word piece of
//! MiniLM's vocabulary, distilled from paraphrase-MiniLM-L3-v2 (see
//! `scripts/distill-embeddings`). A text's vector is the weighted mean of its pieces' vectors,
//! so embedding a query costs microseconds and no model runs.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::f32s_from_le;

/// Dimensions of a static embedding.
pub const DIMS: usize = 128;

static VOCAB: &str = include_str!("../data/minilm-vocab.txt");
/// `VOCAB.len()` little-endian f32 scales, then one int8 row of `DIMS` per token.
static TABLE: &[u8] = include_bytes!("../data/minilm-static-128.bin");

/// Longer words are one unknown piece, as in BERT.
const MAX_WORD_CHARS: usize = 100;

/// Static word embeddings distilled from MiniLM: a vector per word piece, averaged per text.
pub struct Embeddings {
    ids: HashMap<&'static str, u32>,
    scales: Vec<f32>,
    rows: &'static [u8],
    unknown: Option<u32>,
}

impl Embeddings {
    /// The table, parsed on first use.
    pub fn get() -> &'static Embeddings {
        static TABLE_ONCE: OnceLock<Embeddings> = OnceLock::new();
        TABLE_ONCE.get_or_init(|| {
            let tokens: Vec<&'static str> = VOCAB.lines().collect();
            let n = tokens.len();
            let (scales, rows) = TABLE.split_at(n * 4);
            assert_eq!(
                rows.len(),
                n * DIMS,
                "embedding table and vocabulary disagree"
            );
            let ids: HashMap<&'static str, u32> = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (*t, i as u32))
                .collect();
            Embeddings {
                unknown: ids.get("[UNK]").copied(),
                ids,
                scales: f32s_from_le(scales),
                rows,
            }
        })
    }

    /// How many pieces the vocabulary has.
    pub fn vocabulary_size(&self) -> usize {
        self.scales.len()
    }

    /// BERT's uncased word pieces: lower-cased words split at whitespace and punctuation, each
    /// word matched greedily, longest piece first, continuations marked `##`.
    pub fn pieces(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        for word in words(text) {
            self.word_pieces(&word, &mut ids);
        }
        ids
    }

    fn word_pieces(&self, word: &str, ids: &mut Vec<u32>) {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        if chars.len() > MAX_WORD_CHARS {
            ids.extend(self.unknown);
            return;
        }
        let mut found = Vec::new();
        let mut start = 0;
        while start < chars.len() {
            let begin = chars[start].0;
            let mut end = chars.len();
            let piece = loop {
                if end == start {
                    break None;
                }
                let stop = chars.get(end).map_or(word.len(), |c| c.0);
                let candidate = &word[begin..stop];
                let id = if start == 0 {
                    self.ids.get(candidate).copied()
                } else {
                    self.ids.get(format!("##{candidate}").as_str()).copied()
                };
                if let Some(id) = id {
                    break Some(id);
                }
                end -= 1;
            };
            match piece {
                Some(id) => found.push(id),
                // A word with no piece for some part is one unknown piece.
                None => {
                    ids.extend(self.unknown);
                    return;
                }
            }
            start = end;
        }
        ids.extend(found);
    }

    /// Adds `weight ×` the vector of piece `id` to `into`.
    pub fn accumulate(&self, id: u32, weight: f32, into: &mut [f32; DIMS]) {
        let i = id as usize;
        let scale = self.scales[i] * weight;
        let row = &self.rows[i * DIMS..(i + 1) * DIMS];
        for (out, &q) in into.iter_mut().zip(row) {
            *out += f32::from(q as i8) * scale;
        }
    }
}

/// Lower-cased words, split at whitespace and around each punctuation character.
fn words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if c.is_whitespace() || c.is_control() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
        } else if c.is_ascii_punctuation() || (!c.is_alphanumeric() && !c.is_ascii()) {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            words.push(c.to_lowercase().collect());
        } else {
            current.extend(c.to_lowercase());
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32; DIMS]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_splits_into_bert_word_pieces() {
        let e = Embeddings::get();
        let piece = |t: &str| e.ids[t];
        assert_eq!(
            e.pieces("Hello, world!"),
            [piece("hello"), piece(","), piece("world"), piece("!")]
        );
        // A word not in the vocabulary is matched longest piece first.
        let ids = e.pieces("geocoding");
        assert!(ids.len() > 1, "{ids:?}");
        assert_eq!(ids[0], piece("geo"));
        assert_eq!(e.pieces(&"x".repeat(101)), [piece("[UNK]")]);
        assert!(e.pieces("  ").is_empty());
    }

    #[test]
    fn related_words_are_closer_than_unrelated_ones() {
        let e = Embeddings::get();
        let vector = |text: &str| {
            let mut v = [0.0; DIMS];
            for id in e.pieces(text) {
                e.accumulate(id, 1.0, &mut v);
            }
            normalize(&mut v);
            v
        };
        let cos =
            |a: &[f32; DIMS], b: &[f32; DIMS]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let rain = vector("rain");
        assert!(cos(&rain, &vector("weather")) > cos(&rain, &vector("invoice")));
        let refund = vector("refund");
        assert!(cos(&refund, &vector("money back")) > cos(&refund, &vector("kubernetes")));
    }
}
