//! The encoder's dense layers in int8. Weights are quantised per output at load; activations
//! per token at each product; the products are summed exactly in i32. Because the sums are
//! exact, the AVX-512 VNNI kernel and the portable one return the same vectors on any machine.
//! A query's products then read 10 MB of weights instead of 42 MB and, with VNNI, run 64
//! multiply-adds per instruction.

use std::ops::Range;
use std::sync::Arc;

use super::ROUND;

/// Inputs are taken four at a time (one VNNI lane) and outputs 16 at a time (one register).
const INPUT_STEP: usize = 4;
const OUTPUT_STEP: usize = 16;
/// Rows computed together: every weight read serves this many tokens, so a query's product
/// reads the weights once. 24 accumulators and a weight register fit the 32 registers.
const MAX_ROWS: usize = 24;
/// u8 activations are signed values moved up by this; each output subtracts it back.
const ZERO: i32 = 128;

/// `x · weightᵀ + bias` with int8 weights.
pub(super) struct Linear {
    /// With VNNI, per block of 16 outputs, per 4 inputs: 16 × 4 weights, the layout
    /// `vpdpbusd` reads. Without, one row of `width` per output. They live in `pages`,
    /// which `share_pages` makes one allocation for every layer.
    pages: Arc<Pages>,
    range: Range<usize>,
    vnni: bool,
    /// Per output: weight = `scale × packed`, and `ZERO × Σ packed` to take off each sum.
    scales: Vec<f32>,
    offsets: Vec<i32>,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
    /// `inputs` and `outputs` rounded up to the steps above; the padding weights are 0.
    width: usize,
    height: usize,
}

impl Linear {
    /// `weight` is `outputs × inputs`, row-major, as PyTorch stores it.
    pub(super) fn new(weight: &[f32], bias: Vec<f32>, inputs: usize, outputs: usize) -> Self {
        Self::with_layout(weight, bias, inputs, outputs, has_vnni())
    }

    fn with_layout(
        weight: &[f32],
        bias: Vec<f32>,
        inputs: usize,
        outputs: usize,
        vnni: bool,
    ) -> Self {
        let width = inputs.div_ceil(INPUT_STEP) * INPUT_STEP;
        let height = outputs.div_ceil(OUTPUT_STEP) * OUTPUT_STEP;
        let mut packed = vec![0_i8; width * height];
        let mut scales = vec![0.0; height];
        let mut offsets = vec![0; height];
        for (o, row) in weight.chunks_exact(inputs).enumerate() {
            let (codes, scale) = quantise_symmetric(row, inputs);
            scales[o] = scale;
            for (i, q) in codes.into_iter().enumerate() {
                let at = if vnni {
                    packed_at(o, i, width)
                } else {
                    o * width + i
                };
                packed[at] = q;
                offsets[o] += ZERO * i32::from(q);
            }
        }
        let range = 0..packed.len();
        Linear {
            pages: Arc::new(Pages::from(&[&packed[..]])),
            range,
            vnni,
            scales,
            offsets,
            bias,
            inputs,
            outputs,
            width,
            height,
        }
    }

    fn weights(&self) -> &[i8] {
        &self.pages.bytes()[self.range.clone()]
    }

    /// The product for the `rows` rows of `x` (each `inputs` long).
    #[inline(always)]
    pub(super) fn apply(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let (quantised, row_scales) = self.quantise(x, rows);
        let mut sums = vec![0_i32; rows * self.height];
        products(&quantised, self, &mut sums);
        let mut out = vec![0.0; rows * self.outputs];
        for ((out, sums), scale) in out
            .chunks_exact_mut(self.outputs)
            .zip(sums.chunks_exact(self.height))
            .zip(row_scales)
        {
            let per_output = self.offsets.iter().zip(&self.scales).zip(&self.bias);
            for ((out, &sum), ((&offset, &weight_scale), &bias)) in
                out.iter_mut().zip(sums).zip(per_output)
            {
                *out = (sum - offset) as f32 * scale * weight_scale + bias;
            }
        }
        out
    }

    /// Each row as u8 (value / scale + `ZERO`) with its own scale, padded to `width`.
    #[inline(always)]
    fn quantise(&self, x: &[f32], rows: usize) -> (Vec<u8>, Vec<f32>) {
        let mut quantised = vec![ZERO as u8; rows * self.width];
        let mut scales = Vec::with_capacity(rows);
        for (row, out) in x
            .chunks_exact(self.inputs)
            .zip(quantised.chunks_exact_mut(self.width))
        {
            let scale = symmetric_scale(row);
            let inverse = 1.0 / scale;
            // v · inverse + ZERO is within 1..=255: its low byte after adding ROUND.
            for (q, &v) in out.iter_mut().zip(row) {
                *q = (v * inverse + (ROUND + ZERO as f32)).to_bits() as u8;
            }
            scales.push(scale);
        }
        (quantised, scales)
    }
}

/// `v` as int8 codes (the largest |v| becomes ±127), padded with zeros to `length`, and the
/// scale that maps them back.
pub(crate) fn quantise_symmetric(v: &[f32], length: usize) -> (Vec<i8>, f32) {
    let scale = symmetric_scale(v);
    let mut codes: Vec<i8> = v.iter().map(|x| (x / scale).round() as i8).collect();
    codes.resize(length, 0);
    (codes, scale)
}

/// The scale that maps the largest |v| to 127 (1 for a zero vector, whose codes are all 0).
#[inline(always)]
fn symmetric_scale(v: &[f32]) -> f32 {
    let max = max_abs(v);
    if max > 0.0 { max / 127.0 } else { 1.0 }
}

/// The largest |v|, in sixteen lanes: a plain `fold` of `max` must run in order.
#[inline(always)]
fn max_abs(v: &[f32]) -> f32 {
    let mut lanes = [0.0_f32; 16];
    let chunks = v.chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x.abs());
        }
    }
    rest.iter().chain(&lanes).fold(0.0, |m, x| m.max(x.abs()))
}

/// Where weight (`output`, `input`) lives in the packed layout.
fn packed_at(output: usize, input: usize, width: usize) -> usize {
    let (block, lane) = (output / 16, output % 16);
    let (step, byte) = (input / INPUT_STEP, input % INPUT_STEP);
    block * 16 * width + (step * 16 + lane) * INPUT_STEP + byte
}

/// Moves the weights of `layers` into one allocation on 2 MB pages.
pub(super) fn share_pages(layers: &mut [&mut Linear]) {
    let parts: Vec<&[i8]> = layers.iter().map(|l| l.weights()).collect();
    let pages = Arc::new(Pages::from(&parts[..]));
    let mut start = 0;
    for layer in layers {
        let len = layer.range.len();
        layer.pages = pages.clone();
        layer.range = start..start + len;
        start += len;
    }
}

/// Bytes aligned to 2 MB and, on Linux, advised onto transparent huge pages: a query streams
/// 10 MB of weights (and a search 4 MB of tool vectors), and on 4 KB pages the TLB misses cost
/// about a tenth of its time. Only whole 2 MB pages are advised, so a small table costs no
/// more memory than its size.
pub(crate) struct Pages {
    storage: Vec<i8>,
    start: usize,
    len: usize,
}

const HUGE_PAGE: usize = 2 << 20;

impl Pages {
    /// `parts` one after another.
    pub(crate) fn from(parts: &[&[i8]]) -> Self {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let whole_pages = len / HUGE_PAGE * HUGE_PAGE;
        let padding = if whole_pages > 0 { HUGE_PAGE } else { 0 };
        // Fresh zeroed memory is not yet backed, so the advice applies when it is written.
        let mut storage = vec![0_i8; len + padding];
        let start = storage.as_ptr().align_offset(HUGE_PAGE).min(padding);
        advise_huge_pages(&mut storage[start..start + whole_pages]);
        let mut at = start;
        for part in parts {
            storage[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Pages {
            storage,
            start,
            len,
        }
    }

    pub(crate) fn bytes(&self) -> &[i8] {
        &self.storage[self.start..self.start + self.len]
    }
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(bytes: &mut [i8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: the range is inside one live allocation; the advice only changes how the
    // kernel backs it. Failing (no THP) leaves ordinary pages, which is fine.
    unsafe {
        libc::madvise(bytes.as_mut_ptr().cast(), bytes.len(), libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: &mut [i8]) {}

/// Whether the CPU has AVX-512 VNNI (and BW), which the int8 kernels use when present.
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `sums[r][o] = Σᵢ x[r][i] · w[o][i]` over all rows of `x`.
fn products(x: &[u8], layer: &Linear, sums: &mut [i32]) {
    let (width, height) = (layer.width, layer.height);
    #[cfg(target_arch = "x86_64")]
    if layer.vnni {
        // In even blocks of up to MAX_ROWS rows.
        let rows = x.len() / width;
        let block = rows.div_ceil(rows.div_ceil(MAX_ROWS).max(1));
        for (x, sums) in x.chunks(block * width).zip(sums.chunks_mut(block * height)) {
            // SAFETY: `vnni` is set only when the CPU has the features; the slices have the
            // shapes `products` reads.
            unsafe { vnni::products(x, layer.weights(), width, height, sums) };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the feature.
        return unsafe { row_products_avx2(x, layer.weights(), width, sums) };
    }
    row_products(x, layer.weights(), width, sums);
}

/// `row_products` compiled for 32-byte vectors; integer sums, so the same result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_products_avx2(x: &[u8], weights: &[i8], width: usize, sums: &mut [i32]) {
    row_products(x, weights, width, sums);
}

/// One dot product per row and output, over weights stored a row per output: compilers turn
/// each into `pmaddwd`, 8 or 16 multiply-adds an instruction.
#[inline(always)]
fn row_products(x: &[u8], weights: &[i8], width: usize, sums: &mut [i32]) {
    let height = weights.len() / width;
    for (x, sums) in x.chunks_exact(width).zip(sums.chunks_exact_mut(height)) {
        for (sum, w) in sums.iter_mut().zip(weights.chunks_exact(width)) {
            let mut total = 0_i32;
            for (&a, &b) in x.iter().zip(w) {
                total += i32::from(a) * i32::from(b);
            }
            *sum = total;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{INPUT_STEP, MAX_ROWS};
    const PREFETCH: usize = 4096;

    /// One call per row count, so the accumulators are a fixed set of registers.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn products(
        x: &[u8],
        packed: &[i8],
        width: usize,
        height: usize,
        sums: &mut [i32],
    ) {
        let rows = x.len() / width;
        debug_assert!(rows <= MAX_ROWS && sums.len() == rows * height);
        macro_rules! by_rows {
            ($($n:literal)*) => {
                match rows {
                    $($n => block::<$n>(x, packed, width, height, sums),)*
                    _ => unreachable!("at most MAX_ROWS rows"),
                }
            };
        }
        // SAFETY: as for this function.
        unsafe { by_rows!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn block<const ROWS: usize>(
        x: &[u8],
        packed: &[i8],
        width: usize,
        height: usize,
        sums: &mut [i32],
    ) {
        let steps = width / INPUT_STEP;
        // Per block of 16 outputs (16 × width bytes), 64 bytes a step.
        for (block, weights) in packed.chunks_exact(16 * width).enumerate() {
            let mut acc = [_mm512_setzero_si512(); ROWS];
            for step in 0..steps {
                // SAFETY: each block holds `steps` runs of 64 bytes; each row `width` bytes.
                unsafe {
                    let w = _mm512_loadu_si512(weights.as_ptr().add(step * 64).cast());
                    let ahead = weights.as_ptr().wrapping_add(step * 64 + PREFETCH);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let four = x
                            .as_ptr()
                            .add(r * width + step * INPUT_STEP)
                            .cast::<i32>()
                            .read_unaligned();
                        *acc = _mm512_dpbusd_epi32(*acc, _mm512_set1_epi32(four), w);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                // SAFETY: row r of `sums` has `height` ≥ (block + 1) × 16 entries.
                unsafe {
                    let at = sums.as_mut_ptr().add(r * height + block * 16);
                    _mm512_storeu_si512(at.cast(), *acc);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator, so a failure reproduces.
    fn values(count: usize, seed: u32) -> Vec<f32> {
        let mut state = seed;
        (0..count)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn the_product_is_close_to_the_float_product_for_any_shape() {
        // Shapes off the steps (inputs not a multiple of 4, outputs not of 16), and more
        // rows than one block.
        for (rows, inputs, outputs) in [(1, 4, 32), (3, 7, 5), (13, 30, 40), (25, 64, 96)] {
            let weight = values(inputs * outputs, 1);
            let bias = values(outputs, 2);
            let x = values(rows * inputs, 3);
            let got = Linear::new(&weight, bias.clone(), inputs, outputs).apply(&x, rows);
            assert_eq!(got.len(), rows * outputs);
            for r in 0..rows {
                for o in 0..outputs {
                    let exact: f32 = (0..inputs)
                        .map(|i| x[r * inputs + i] * weight[o * inputs + i])
                        .sum::<f32>()
                        + bias[o];
                    // Two 8-bit roundings per term: a few hundredths over these sizes.
                    let tolerance = 0.01 * (inputs as f32).sqrt();
                    assert!(
                        (got[r * outputs + o] - exact).abs() < tolerance,
                        "{rows}×{inputs}×{outputs} at ({r}, {o}): {} against {exact}",
                        got[r * outputs + o]
                    );
                }
            }
        }
    }

    #[test]
    fn every_kernel_gives_the_same_sums() {
        let (width, height) = (48, 64);
        let weight = values(width * height, 4);
        let rows_layout = Linear::with_layout(&weight, vec![0.0; height], width, height, false);
        for rows in [1, 2, 7, 13, 24, 25, 50] {
            let (x, _) = rows_layout.quantise(&values(rows * width, 5), rows);
            let mut portable = vec![0; rows * height];
            row_products(&x, rows_layout.weights(), width, &mut portable);
            let mut dispatched = vec![0; rows * height];
            products(&x, &rows_layout, &mut dispatched);
            assert_eq!(portable, dispatched, "{rows} rows");
            // Both are the plain sum.
            let plain: i32 = (0..width)
                .map(|i| i32::from(x[i]) * i32::from(rows_layout.weights()[3 * width + i]))
                .sum();
            assert_eq!(portable[3], plain);
            if has_vnni() {
                let packed = Linear::with_layout(&weight, vec![0.0; height], width, height, true);
                let mut vnni = vec![0; rows * height];
                products(&x, &packed, &mut vnni);
                assert_eq!(portable, vnni, "{rows} rows");
            } else {
                eprintln!("skipped the VNNI kernel: this CPU has no AVX-512 VNNI");
            }
        }
    }
}
