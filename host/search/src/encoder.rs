//! The contextual sentence encoder for tool search: a BERT model in the layout of
//! sentence-transformers' all-MiniLM-L6-v2 (`config.json` + `model.safetensors`), run on the
//! CPU with int8 dense layers (`int8`), mean-pooled and normalised. It ranks far better than
//! the static embeddings of `embed.rs` (the misses there need a phrase read as a whole). It
//! needs a 90 MB model file, so it is configured rather than built in:
//! `toolhost serve --search-model DIR`.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::Deserialize;
use thiserror::Error;

mod int8;

pub(crate) use int8::{Pages, has_vnni, quantise_symmetric};

use self::int8::Linear;
use crate::embed::Embeddings;
use crate::f32s_from_le;
use toolhost_spec::digest::sha256_hex;

/// `[CLS]` and `[SEP]` in BERT's uncased vocabulary, which `embed.rs` also uses.
const CLS: u32 = 101;
const SEP: u32 = 102;
/// The length the model was trained with; longer texts are cut.
const MAX_TOKENS: usize = 256;

/// Why a search model cannot be loaded.
#[derive(Debug, Error)]
pub enum EncoderError {
    /// A file of the model cannot be read.
    #[error("search model: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file of the model is not what the encoder expects.
    #[error("search model: {0}")]
    Format(String),
}

#[derive(Deserialize)]
struct Config {
    model_type: String,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f32,
    #[serde(default)]
    hidden_act: String,
}

fn default_eps() -> f32 {
    1e-12
}

struct Norm {
    gain: Vec<f32>,
    bias: Vec<f32>,
}

struct Layer {
    /// Query, key and value projections stacked, so one product computes all three.
    qkv: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    intermediate: Linear,
    output: Linear,
    output_norm: Norm,
}

/// The contextual encoder: all-MiniLM-L6-v2 with int8 weights, mean-pooled and normalized.
pub struct SentenceEncoder {
    hidden: usize,
    heads: usize,
    eps: f32,
    max_tokens: usize,
    words: Vec<f32>,
    positions: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    /// sha256 of `model.safetensors`: stored vectors are only reused by the same weights.
    fingerprint: String,
    encoded: AtomicU64,
}

impl fmt::Debug for SentenceEncoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentenceEncoder")
            .field("hidden", &self.hidden)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

impl SentenceEncoder {
    /// Loads `dir/config.json` and `dir/model.safetensors`. The vocabulary must be BERT's
    /// uncased one (30 522 pieces), which the static embeddings already carry.
    pub fn load(dir: &Path) -> Result<Self, EncoderError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| EncoderError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        let config: Config = serde_json::from_slice(&read("config.json")?)
            .map_err(|e| EncoderError::Format(format!("config.json: {e}")))?;
        if config.model_type != "bert" || !config.hidden_act.starts_with("gelu") {
            return Err(EncoderError::Format(format!(
                "config.json: model_type {:?} with hidden_act {:?}; only BERT with GELU is supported",
                config.model_type, config.hidden_act
            )));
        }
        if config.vocab_size != Embeddings::get().vocabulary_size()
            || config.num_attention_heads == 0
            || config.hidden_size == 0
            || config.intermediate_size == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
            || config.max_position_embeddings < 2
        {
            return Err(EncoderError::Format(format!(
                "config.json: vocab_size {} (must be BERT uncased's {}), hidden_size {} over {} heads, {} positions",
                config.vocab_size,
                Embeddings::get().vocabulary_size(),
                config.hidden_size,
                config.num_attention_heads,
                config.max_position_embeddings
            )));
        }
        let weights = read("model.safetensors")?;
        let fingerprint = sha256_hex(&weights);
        let tensors = Tensors::parse(&weights)?;
        let h = config.hidden_size;
        let dense = |t: &Tensors, name: &str, inputs: usize, outputs: usize| {
            Ok::<_, EncoderError>((
                t.take(&format!("{name}.weight"), &[outputs, inputs])?,
                t.take(&format!("{name}.bias"), &[outputs])?,
            ))
        };
        let linear = |t: &Tensors, name: &str, inputs: usize, outputs: usize| {
            let (weight, bias) = dense(t, name, inputs, outputs)?;
            Ok::<_, EncoderError>(Linear::new(&weight, bias, inputs, outputs))
        };
        let norm = |t: &Tensors, name: &str| {
            Ok::<_, EncoderError>(Norm {
                gain: t.take(&format!("{name}.weight"), &[h])?,
                bias: t.take(&format!("{name}.bias"), &[h])?,
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let (mut weight, mut bias) = (Vec::new(), Vec::new());
            for part in ["query", "key", "value"] {
                let (w, b) = dense(&tensors, &format!("{p}.attention.self.{part}"), h, h)?;
                weight.extend(w);
                bias.extend(b);
            }
            layers.push(Layer {
                qkv: Linear::new(&weight, bias, h, 3 * h),
                attention_out: linear(&tensors, &format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: norm(&tensors, &format!("{p}.attention.output.LayerNorm"))?,
                intermediate: linear(
                    &tensors,
                    &format!("{p}.intermediate.dense"),
                    h,
                    config.intermediate_size,
                )?,
                output: linear(
                    &tensors,
                    &format!("{p}.output.dense"),
                    config.intermediate_size,
                    h,
                )?,
                output_norm: norm(&tensors, &format!("{p}.output.LayerNorm"))?,
            });
        }
        let mut linears: Vec<&mut Linear> = layers
            .iter_mut()
            .flat_map(|l| {
                [
                    &mut l.qkv,
                    &mut l.attention_out,
                    &mut l.intermediate,
                    &mut l.output,
                ]
            })
            .collect();
        int8::share_pages(&mut linears);
        let max_positions = config.max_position_embeddings;
        Ok(SentenceEncoder {
            hidden: h,
            heads: config.num_attention_heads,
            eps: config.layer_norm_eps,
            max_tokens: MAX_TOKENS.min(max_positions),
            words: tensors.take("embeddings.word_embeddings.weight", &[config.vocab_size, h])?,
            positions: tensors
                .take("embeddings.position_embeddings.weight", &[max_positions, h])?,
            token_type: tensors.take_rows("embeddings.token_type_embeddings.weight", h, 1)?,
            embedding_norm: norm(&tensors, "embeddings.LayerNorm")?,
            layers,
            fingerprint,
            encoded: AtomicU64::new(0),
        })
    }

    /// Dimensions of its vectors.
    pub fn dimensions(&self) -> usize {
        self.hidden
    }

    /// sha256 (hex) of its weights, which keys its stored vectors.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// How many texts this encoder has run over.
    pub fn encoded(&self) -> u64 {
        self.encoded.load(Ordering::Relaxed)
    }

    /// The unit vector of `text`: the mean of the last layer's token states.
    pub fn encode(&self, text: &str) -> Vec<f32> {
        self.encoded.fetch_add(1, Ordering::Relaxed);
        let mut ids = vec![CLS];
        ids.extend(Embeddings::get().pieces(text));
        ids.truncate(self.max_tokens - 1);
        ids.push(SEP);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature.
            return unsafe { self.forward_avx512(&ids) };
        }
        self.forward(&ids)
    }

    /// `forward` compiled for 16-lane vectors; the arithmetic, and so the result, is the same.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn forward_avx512(&self, ids: &[u32]) -> Vec<f32> {
        self.forward(ids)
    }

    #[inline(always)]
    fn forward(&self, ids: &[u32]) -> Vec<f32> {
        let h = self.hidden;
        let n = ids.len();
        let mut x = vec![0.0_f32; n * h];
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            let row = &mut x[t * h..(t + 1) * h];
            let word = &self.words[id * h..(id + 1) * h];
            let position = &self.positions[t * h..(t + 1) * h];
            for i in 0..h {
                row[i] = word[i] + position[i] + self.token_type[i];
            }
        }
        layer_norm(&mut x, &self.embedding_norm, self.eps);
        for layer in &self.layers {
            self.layer(layer, &mut x, n);
        }
        let mut pooled = vec![0.0_f32; h];
        for row in x.chunks_exact(h) {
            pooled.iter_mut().zip(row).for_each(|(p, v)| *p += v);
        }
        let norm = pooled.iter().map(|v| v * v).sum::<f32>().sqrt();
        if norm > 0.0 {
            pooled.iter_mut().for_each(|v| *v /= norm);
        }
        pooled
    }

    #[inline(always)]
    fn layer(&self, layer: &Layer, x: &mut [f32], n: usize) {
        let h = self.hidden;
        let head = h / self.heads;
        let qkv = layer.qkv.apply(x, n);
        let mut context = vec![0.0_f32; n * h];
        let scale = 1.0 / (head as f32).sqrt();
        let at = |t: usize, part: usize, hd: usize| {
            let start = t * 3 * h + part * h + hd * head;
            &qkv[start..start + head]
        };
        // Token i's attention weights over the n tokens, for every head at once, so that
        // the softmax's exponentials run as one vectorised pass.
        let mut weights = vec![0.0_f32; self.heads * n];
        for i in 0..n {
            for (hd, scores) in weights.chunks_exact_mut(n).enumerate() {
                for (j, w) in scores.iter_mut().enumerate() {
                    *w = dot(at(i, 0, hd), at(j, 1, hd)) * scale;
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                scores.iter_mut().for_each(|w| *w -= max);
            }
            weights.iter_mut().for_each(|w| *w = exp(*w));
            for (hd, scores) in weights.chunks_exact(n).enumerate() {
                let total: f32 = scores.iter().sum();
                let out = &mut context[i * h + hd * head..i * h + (hd + 1) * head];
                for (j, &w) in scores.iter().enumerate() {
                    let w = w / total;
                    out.iter_mut()
                        .zip(at(j, 2, hd))
                        .for_each(|(o, v)| *o += w * v);
                }
            }
        }
        let attended = layer.attention_out.apply(&context, n);
        x.iter_mut().zip(&attended).for_each(|(a, b)| *a += b);
        layer_norm(x, &layer.attention_norm, self.eps);
        let mut inner = layer.intermediate.apply(x, n);
        inner.iter_mut().for_each(|v| *v = gelu(*v));
        let out = layer.output.apply(&inner, n);
        x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        layer_norm(x, &layer.output_norm, self.eps);
    }
}

#[inline(always)]
fn layer_norm(x: &mut [f32], norm: &Norm, eps: f32) {
    let h = norm.gain.len();
    for row in x.chunks_exact_mut(h) {
        let mean = sum(row) / h as f32;
        row.iter_mut().for_each(|v| *v -= mean);
        let inv = 1.0 / (dot(row, row) / h as f32 + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(&norm.gain).zip(&norm.bias) {
            *v = *v * inv * g + b;
        }
    }
}

/// BERT's GELU, `x · Φ(x)`, with erf from Abramowitz and Stegun 7.1.26 (error under 1.5e-7).
#[inline(always)]
fn gelu(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let erf = (1.0 - poly * exp(-z * z)).copysign(z);
    0.5 * x * (1.0 + erf)
}

/// e^x without a libm call, so that loops over it vectorise on the baseline (SSE2) target:
/// 2^k · e^f with k = round(x · log₂ e), f = x − k · ln 2 taken off in two parts for
/// precision, and a degree-6 series for e^f (relative error under 3e-7).
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LN_2_HIGH: f32 = 0.693_359_4;
    const LN_2_LOW: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let k = shifted - ROUND;
    let f = x - k * LN_2_HIGH - k * LN_2_LOW;
    let series = 1.0
        + f * (1.0
            + f * (1.0 / 2.0
                + f * (1.0 / 6.0 + f * (1.0 / 24.0 + f * (1.0 / 120.0 + f * (1.0 / 720.0))))));
    // 2^k, built from k's bits (see `ROUND`) with no float-to-int conversion.
    series * f32::from_bits(shifted.to_bits().wrapping_add(127) << 23)
}

/// For |x| < 2²², `x + ROUND` holds round(x) in the low bits of its representation
/// (two's complement, round half to even), and `x + ROUND − ROUND` is round(x) itself. Unlike
/// `round` or `as i32`, this vectorises on the baseline target.
const ROUND: f32 = 12_582_912.0;

/// In eight lanes, as `dot`.
#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut lanes = [0.0_f32; 8];
    for chunk in v.chunks_exact(8) {
        for i in 0..8 {
            lanes[i] += chunk[i];
        }
    }
    let tail: f32 = v.chunks_exact(8).remainder().iter().sum();
    lanes.iter().sum::<f32>() + tail
}

/// In eight lanes, so that the compiler can use SIMD (a plain float sum must stay in order).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0_f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let rest = a.len() / 8 * 8;
    let tail: f32 = a[rest..].iter().zip(&b[rest..]).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

/// The f32 tensors of a safetensors file, by name; the `safetensors` crate checks the header.
struct Tensors<'a>(SafeTensors<'a>);

impl<'a> Tensors<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, EncoderError> {
        SafeTensors::deserialize(data)
            .map(Tensors)
            .map_err(|e| EncoderError::Format(format!("model.safetensors: {e}")))
    }

    /// The f32 tensor `name`, with or without a `bert.` prefix.
    fn view(&self, name: &str) -> Result<TensorView<'a>, EncoderError> {
        self.0
            .tensor(name)
            .or_else(|_| self.0.tensor(&format!("bert.{name}")))
            .ok()
            .filter(|view| view.dtype() == Dtype::F32)
            .ok_or_else(|| EncoderError::Format(format!("model.safetensors: no f32 tensor {name}")))
    }

    /// The tensor `name`, which must have `shape`.
    fn take(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EncoderError> {
        let view = self.view(name)?;
        if view.shape() != shape {
            return Err(EncoderError::Format(format!(
                "model.safetensors: {name} has shape {:?}, expected {shape:?}",
                view.shape()
            )));
        }
        Ok(f32s_from_le(view.data()))
    }

    /// The first `rows` rows of the `? × width` tensor `name`.
    fn take_rows(&self, name: &str, width: usize, rows: usize) -> Result<Vec<f32>, EncoderError> {
        let view = self.view(name)?;
        let shape = view.shape();
        if shape.len() != 2 || shape[1] != width || shape[0] < rows {
            return Err(EncoderError::Format(format!(
                "model.safetensors: {name} has shape {shape:?}, expected at least [{rows}, {width}]"
            )));
        }
        Ok(f32s_from_le(&view.data()[..rows * width * 4]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_avx512_forward_pass_gives_the_same_bits() {
        let Some(dir) = std::env::var_os("TOOLHOST_SEARCH_MODEL") else {
            // CI must run it: scripts/test fetches the model and sets the variable.
            assert!(
                std::env::var_os("CI").is_none(),
                "TOOLHOST_SEARCH_MODEL is not set under CI"
            );
            eprintln!("skipped: TOOLHOST_SEARCH_MODEL is not set (scripts/test sets it)");
            return;
        };
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let encoder = SentenceEncoder::load(dir.as_ref()).unwrap();
        let ids = [CLS, 2054, 2003, 6207, 6202, 2012, 2157, 2085, SEP];
        // SAFETY: the CPU has the feature.
        let wide = unsafe { encoder.forward_avx512(&ids) };
        assert_eq!(encoder.forward(&ids), wide);
    }

    #[test]
    fn exp_matches_the_library_exp() {
        for i in -2000..=2000 {
            let x = i as f32 / 25.0;
            let (got, want) = (exp(x), x.exp());
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}) = {got}, not {want}"
            );
        }
        // Far outside the range: clamped to e^±87, never 0 · ∞ or NaN.
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 2e-38);
        assert!(exp(1000.0).is_finite() && exp(1000.0) > 1e38);
    }

    #[test]
    fn gelu_matches_its_definition_at_known_points() {
        // x · Φ(x): Φ(1) = 0.841345, Φ(-1) = 0.158655, Φ(0) = 0.5.
        assert!((gelu(1.0) - 0.841_345).abs() < 1e-5);
        assert!((gelu(-1.0) + 0.158_655).abs() < 1e-5);
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(6.0) - 6.0).abs() < 1e-5);
    }

    #[test]
    fn a_damaged_model_file_is_an_error_that_says_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let err = SentenceEncoder::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("config.json"), "{err}");

        let config = r#"{"model_type":"bert","hidden_size":4,"num_hidden_layers":1,
            "num_attention_heads":2,"intermediate_size":8,"max_position_embeddings":8,
            "vocab_size":30522,"hidden_act":"gelu"}"#;
        let no_positions = config.replace(
            "\"max_position_embeddings\":8",
            "\"max_position_embeddings\":0",
        );
        std::fs::write(dir.path().join("config.json"), no_positions).unwrap();
        let err = SentenceEncoder::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("0 positions"), "{err}");

        std::fs::write(dir.path().join("config.json"), config).unwrap();
        let short = r#"{"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,4]}}"#;
        let huge = r#"{"x":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,0]}}"#;
        for (bytes, expected) in [
            (b"\x05\x00".to_vec(), "header too small"),
            (
                [&200_u64.to_le_bytes()[..], b"{}"].concat(),
                "invalid header length",
            ),
            (
                [&2_u64.to_le_bytes()[..], b"{}"].concat(),
                "no f32 tensor encoder.layer.0.attention.self.query.weight",
            ),
            (
                [&huge.len().to_le_bytes()[..], huge.as_bytes()].concat(),
                "overflow computing buffer size",
            ),
            (
                [&short.len().to_le_bytes()[..], short.as_bytes(), &[0; 4]].concat(),
                "invalid shape, data type, or offset for tensor",
            ),
        ] {
            std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
            let err = SentenceEncoder::load(dir.path()).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }
}
