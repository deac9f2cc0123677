//! A decode step's LayerNorms folded into the projections after them (`--fused norm-fold`,
//! #37 item 1). LN(x) = (x − mean)·rstd·γ + β, so with W' = W·diag(γ) and b' = b + W β,
//! LN(x) Wᵀ + b = LN₀(x) W'ᵀ + b' = rstd·(x W'ᵀ − mean·Σₖ W') + b', LN₀ the norm without its
//! weight and bias. The decode GEMV that reads x (one row; the tensor-core kernel at 5–16 rows,
//! `--fused skinny-fold`) then takes mean and rstd from the loads it makes anyway
//! ([`crate::kernels::gemv_ln`], [`crate::kernels::skinny_ln`]): no norm kernel. Every other
//! path runs the norm as LN₀ before the folded projection: the same function, rounded
//! differently.
//! Shapes: W (N, K) nn.Linear's, b (N,), γ and β (K,).

use crate::dist::Tp;
use crate::kernels::{enabled, Fused, Summed, GEMV_MAX_ROWS, SKINNY_MAX_ROWS, SKINNY_MAX_WEIGHT};
use candle_core::{DType, Device, Result, Tensor};

/// Rows (a decode step's sequences) up to which a model takes the folded GEMVs. The kernels
/// take 1–4; at 4 rows bloom-560m's step was 5.8 % slower with them (0.960 → 1.016 ms, gpt2 +2 µs:
/// results/h100x2/gate-run39), so 2–4 rows run the norms ([`folds`]: 5–16 the tensor-core kernel).
pub const MAX_ROWS: usize = 1;

/// Whether a decode step of `rows` rows takes the folded projections, for a model whose
/// largest folded weight (qkv's or the MLP's first) holds `widest` elements: [`MAX_ROWS`] (the
/// GEMV, any weight), or with `skinny-fold` 5–16 rows where the tensor-core kernel takes every
/// such weight ([`SKINNY_MAX_WEIGHT`]: a folded step has no norm kernel to fall back on).
pub fn folds(rows: usize, widest: usize) -> bool {
    let paths = enabled(Fused::SkinnyFold) && enabled(Fused::SkinnyProj);
    let skinny = (GEMV_MAX_ROWS + 1..=SKINNY_MAX_ROWS).contains(&rows);
    rows <= MAX_ROWS || (paths && skinny && widest <= SKINNY_MAX_WEIGHT)
}

/// Bytes of a row of the residual stream (the hidden size) up to which a model folds its
/// norms without `norm-stats`: each lane of the one-row GEMV then holds one 16-byte vector of
/// x, and the statistics add no loads in flight. bloom-7b1's 8 KB rows (four vectors a lane)
/// made its step slower on 2× H200 hosts at every launch bound tried (3.79 → 3.83–3.91 ms,
/// results/h200x2/ln1-run1), though 1 % faster on 2× H100 (5.090 → 5.036–5.039, gate-run39);
/// gpt2's 1.5 KB and bloom-560m's 2 KB rows 13–15 % faster on both. (The SASS: the GEMV summing
/// the statistics issues its weight loads two at a time between the sums, the plain one four;
/// with `norm-stats` the folded GEMV's loop is the plain one's.)
pub const MAX_ROW_BYTES: usize = 2048;

/// Whether a model of `dtype` and `hidden` size on `device` under `tp` folds its norms when
/// laid out for decoding: the path on, with the GEMV that reads the folded weights (bf16 / f16
/// on CUDA), rows of at most [`MAX_ROW_BYTES`], one GPU (a row-parallel projection's sum keeps
/// its own add + norm kernel).
pub fn applies(dtype: DType, hidden: usize, device: &Device, tp: &Tp) -> bool {
    let half = matches!(dtype, DType::BF16 | DType::F16);
    let on = enabled(Fused::NormFold) && enabled(Fused::Gemv);
    let short = hidden * dtype.size_in_bytes() <= MAX_ROW_BYTES || enabled(Fused::NormStats);
    on && half && short && device.is_cuda() && tp.size == 1
}

/// Folded norms a step of `n_layer` blocks has slots for (`--fused norm-stats`): each
/// block's two, norm 2i before block i's qkv, 2i + 1 before its MLP (ln_f keeps its kernel).
pub fn norms(n_layer: usize) -> usize {
    2 * n_layer
}

/// Where block i's folded GEMVs find their norms' statistics (`--fused norm-stats`), in the
/// cache's slots ([`crate::models::KvCache::norm_stats`], (2L, slots, line), one row):
/// - the qkv GEMV reads norm 2i's (block 0's embedding kernel sums none: it sums them itself)
///   and zeroes norm 2i − 1's (cyclically: block 0 the last block's, of the step before);
/// - the attention's output GEMV sums norm 2i + 1's, which the MLP's first GEMV reads, zeroing
///   norm 2i's;
/// - the MLP's second GEMV sums norm 2i + 2's (the last block's: none, ln_f is a kernel).
///
/// Each folded GEMV zeroes slots only once the one that read them has ended (a kernel of the
/// step waits for the one before, which waited for its own, …), so the next step finds zeros.
pub struct BlockSlots {
    ln1: Tensor,
    ln1_prev: Tensor,
    ln2: Tensor,
    next: Option<Tensor>,
    first: bool,
}

impl BlockSlots {
    /// Block i of `n_layer`'s slots; None where the cache has none for this model.
    pub fn of(all: Option<&Tensor>, i: usize, n_layer: usize) -> Result<Option<Self>> {
        let n = norms(n_layer);
        let Some(all) = all.filter(|a| a.dims().first() == Some(&n)) else {
            return Ok(None);
        };
        Ok(Some(Self {
            ln1: all.get(2 * i)?,
            ln1_prev: all.get((2 * i + n - 1) % n)?,
            ln2: all.get(2 * i + 1)?,
            next: (i + 1 < n_layer).then(|| all.get(2 * i + 2)).transpose()?,
            first: i == 0,
        }))
    }

    /// The qkv GEMV's.
    pub fn qkv(&self) -> Summed<'_> {
        let stats = (!self.first).then_some(&self.ln1);
        Summed {
            stats,
            clear: &self.ln1_prev,
        }
    }

    /// The attention output GEMV's: where it sums the MLP's norm's statistics.
    pub fn dense(&self) -> &Tensor {
        &self.ln2
    }

    /// The MLP's first GEMV's.
    pub fn up(&self) -> Summed<'_> {
        Summed {
            stats: Some(&self.ln2),
            clear: &self.ln1,
        }
    }

    /// The MLP's second GEMV's: where it sums the next block's first norm's statistics.
    pub fn down(&self) -> Option<&Tensor> {
        self.next.as_ref()
    }
}

/// The folded norms a model's cache of `batch` rows keeps slots for
/// ([`crate::models::KvCache::with_norm_stats`]): [`norms`] where the model folded its norms
/// (`folded`), the cache is for one row, its rows of the residual stream are longer than
/// [`MAX_ROW_BYTES`] and `norm-stats` is on. At shorter rows summing inside the GEMV's loop
/// costs no loads in flight, and the slots' adds cost more than they save (one H100,
/// results/h100/gate-run50: gpt2 0.248 → 0.259 ms with them, bloom-560m 0.688 → 0.731;
/// bloom-7b1 5.050 unfolded → 4.977 folded with them).
pub fn slots_for(folded: bool, batch: usize, n_layer: usize, row_bytes: usize) -> Option<usize> {
    let long = row_bytes > MAX_ROW_BYTES;
    let on = folded && long && batch == 1 && enabled(Fused::NormStats); // one row's slots
    on.then_some(norms(n_layer))
}

/// Per-block slots of a step of `n_layer` blocks over the residual stream x (B, T, C): None
/// each where the cache has none or x is more than one row (a one-row cache's prefill of 5–16
/// tokens runs the tensor-core kernels, which sum their own statistics).
pub fn slots(all: Option<&Tensor>, n_layer: usize, x: &Tensor) -> Result<Vec<Option<BlockSlots>>> {
    let one_row = x.elem_count() == x.dim(candle_core::D::Minus1)?;
    let all = all.filter(|_| one_row);
    (0..n_layer)
        .map(|i| BlockSlots::of(all, i, n_layer))
        .collect()
}

/// A projection with a norm folded into it.
pub struct Folded {
    /// W·diag(γ), (N, K) in W's dtype.
    pub w: Tensor,
    /// b + W β, (N,) in b's dtype.
    pub b: Tensor,
    /// (N, 2) f32: each row's Σₖ W' (of the rounded W', the weights the GEMV reads, so that the
    /// identity above holds for them) and b + W β unrounded.
    pub sb: Tensor,
}

/// Rows of W folded at a time: their f32 copies, not W's, live during the fold (bloom-7b1's MLP
/// weight is 268 MB in f32; folded whole, its copies raised the decode's peak memory from
/// 13.42 to 14.05 GB, results/h100x2/gate-run51).
const FOLD_ROWS: usize = 1024;

/// Folds the norm (γ, β) before the projection (w, b) into it.
pub fn fold(w: &Tensor, b: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<Folded> {
    let n = w.dim(0)?;
    let gamma = gamma.to_dtype(DType::F32)?.unsqueeze(0)?; // (1, K)
    let beta = beta.to_dtype(DType::F32)?.unsqueeze(1)?; // (K, 1)
    let w2 = Tensor::zeros(w.dims(), w.dtype(), w.device())?; // (N, K)
    let (mut shifts, mut sums) = (Vec::new(), Vec::new());
    for start in (0..n).step_by(FOLD_ROWS) {
        let rows = FOLD_ROWS.min(n - start);
        let wf = w.narrow(0, start, rows)?.to_dtype(DType::F32)?; // (rows, K)
        let scaled = wf.broadcast_mul(&gamma)?.to_dtype(w.dtype())?; // W' rows, rounded
        shifts.push(wf.matmul(&beta)?.squeeze(1)?); // (rows,)
        sums.push(scaled.to_dtype(DType::F32)?.sum(1)?); // (rows,)
        w2.slice_set(&scaled, 0, start)?;
    }
    let b2 = (b.to_dtype(DType::F32)? + Tensor::cat(&shifts, 0)?)?; // (N,)
    let sb = Tensor::stack(&[&Tensor::cat(&sums, 0)?, &b2], 1)?.contiguous()?; // (N, 2)
    Ok(Folded {
        w: w2,
        b: b2.to_dtype(b.dtype())?,
        sb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, D};

    /// LayerNorm over the last dim, two-pass, as torch computes it.
    fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Tensor {
        let mean = x.mean_keepdim(D::Minus1).unwrap();
        let centred = x.broadcast_sub(&mean).unwrap();
        let var = centred.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let normed = centred
            .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
            .unwrap();
        normed
            .broadcast_mul(gamma)
            .unwrap()
            .broadcast_add(beta)
            .unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
        d.max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    /// What the GEMV computes from sb (gemv.cu's gemv_ln), one-pass statistics included.
    fn gemv_ln_reference(x: &Tensor, f: &Folded, eps: f64) -> Tensor {
        let k = x.dim(1).unwrap() as f64;
        let mean = (x.sum_keepdim(1).unwrap() / k).unwrap(); // (M, 1)
        let sq = (x.sqr().unwrap().sum_keepdim(1).unwrap() / k).unwrap();
        let var = (sq - mean.sqr().unwrap()).unwrap();
        let rstd = (var + eps).unwrap().sqrt().unwrap().recip().unwrap(); // (M, 1)
        let sums = f.sb.narrow(1, 0, 1).unwrap().t().unwrap(); // (1, N)
        let bias = f.sb.narrow(1, 1, 1).unwrap().t().unwrap();
        let dot = x.matmul(&f.w.t().unwrap()).unwrap(); // (M, N)
        let centred = (dot - mean.broadcast_mul(&sums).unwrap()).unwrap();
        centred
            .broadcast_mul(&rstd)
            .unwrap()
            .broadcast_add(&bias)
            .unwrap()
    }

    #[test]
    fn the_folded_projection_is_the_norm_then_the_projection() {
        let dev = Device::Cpu;
        let (m, k, n, eps) = (3, 64, 24, 1e-5);
        // Rows off zero mean and unit scale, as a residual stream is.
        let x = ((Tensor::randn(0f32, 2., (m, k), &dev).unwrap() + 0.7).unwrap())
            .contiguous()
            .unwrap();
        let w = Tensor::randn(0f32, 0.2, (n, k), &dev).unwrap();
        let b = Tensor::randn(0f32, 0.5, n, &dev).unwrap();
        let gamma = Tensor::randn(1f32, 0.3, k, &dev).unwrap();
        let beta = Tensor::randn(0f32, 0.3, k, &dev).unwrap();
        let want = layer_norm(&x, &gamma, &beta, eps)
            .matmul(&w.t().unwrap())
            .unwrap()
            .broadcast_add(&b)
            .unwrap(); // (M, N)
        let f = fold(&w, &b, &gamma, &beta).unwrap();
        let (ones, zeros) = (gamma.ones_like().unwrap(), beta.zeros_like().unwrap());
        let unit_norm = layer_norm(&x, &ones, &zeros, eps)
            .matmul(&f.w.t().unwrap())
            .unwrap()
            .broadcast_add(&f.b)
            .unwrap();
        assert!(
            max_diff(&unit_norm, &want) < 1e-4,
            "{}",
            max_diff(&unit_norm, &want)
        );
        let gemv = gemv_ln_reference(&x, &f, eps);
        assert!(max_diff(&gemv, &want) < 1e-4, "{}", max_diff(&gemv, &want));
        assert_eq!(f.sb.dims(), [n, 2]);
    }

    /// norm-stats' slot protocol over three steps, for 1–4 blocks: each GEMV that sums into a
    /// slot finds it zero, each that reads one finds this step's sums, none clears what it
    /// reads, and only the last block's MLP slot is left for the next step's block 0 to clear.
    #[test]
    fn every_slot_is_zero_before_its_sums_and_summed_before_it_is_read() {
        for n_layer in 1..=4 {
            let n = norms(n_layer);
            let all = Tensor::arange(0f64, n as f64, &Device::Cpu).unwrap();
            let all = all.reshape((n, 1)).unwrap();
            let at = |t: &Tensor| t.to_vec1::<f64>().unwrap()[0] as usize;
            let row = Tensor::zeros((1, 1, 8), DType::F32, &Device::Cpu).unwrap(); // (B, T, C)
            let blocks = slots(Some(&all), n_layer, &row).unwrap();
            // held[j]: the step whose sums slot j holds, None where it is zero.
            let mut held: Vec<Option<usize>> = vec![None; n];
            for step in 0..3 {
                let read = |s: Summed, held: &mut Vec<Option<usize>>| {
                    let c = at(s.clear);
                    if let Some(t) = s.stats {
                        assert_eq!(held[at(t)], Some(step), "{n_layer} blocks: slot {}", at(t));
                        assert_ne!(at(t), c, "{n_layer} blocks: reads what it clears");
                    }
                    held[c] = None;
                };
                let sum = |t: &Tensor, held: &mut Vec<Option<usize>>| {
                    assert_eq!(
                        held[at(t)],
                        None,
                        "{n_layer} blocks: slot {} not zero",
                        at(t)
                    );
                    held[at(t)] = Some(step);
                };
                for (i, b) in blocks.iter().enumerate() {
                    let b = b.as_ref().unwrap();
                    assert_eq!(b.qkv().stats.is_none(), i == 0);
                    read(b.qkv(), &mut held);
                    sum(b.dense(), &mut held);
                    read(b.up(), &mut held);
                    if let Some(t) = b.down() {
                        sum(t, &mut held);
                    }
                    assert_eq!(b.down().is_none(), i + 1 == n_layer);
                }
                let left: Vec<usize> = (0..n).filter(|&j| held[j].is_some()).collect();
                assert_eq!(left, [n - 1], "{n_layer} blocks after step {step}");
            }
        }
        let other = Tensor::zeros((3, 1), DType::F64, &Device::Cpu).unwrap();
        assert!(BlockSlots::of(Some(&other), 0, 2).unwrap().is_none());
    }

    /// A weight of more rows than a chunk folds as the formula over all of it: W' = W·diag(γ)
    /// bit for bit, Σ W' and b + W β to f32 rounding, in order.
    /// Steps of more than one row have no slots (a one-row cache's prefill of 5–16 tokens runs
    /// the tensor-core kernels, which sum their own statistics).
    #[test]
    fn only_one_row_reads_the_slots() {
        let dims = (
            norms(2),
            crate::kernels::NORM_SLOTS,
            crate::kernels::NORM_LINE,
        );
        let all = Tensor::zeros(dims, DType::F64, &Device::Cpu);
        let all = all.unwrap();
        for (b, t, some) in [(1, 1, true), (1, 5, false), (16, 1, false)] {
            let x = Tensor::zeros((b, t, 8), DType::F32, &Device::Cpu).unwrap();
            let got = slots(Some(&all), 2, &x).unwrap();
            assert!(got.iter().all(|s| s.is_some() == some), "{b}x{t}");
        }
    }

    /// The rows that take the folded projections with the default paths: one (the GEMV, any
    /// weight), and 5–16 where the tensor-core kernel takes the widest weight (bloom-560m's and
    /// gpt2-medium's MLP weight, 4 Mi elements, is the largest it takes).
    #[test]
    fn folded_rows_are_one_and_the_tensor_core_kernels() {
        let widest = SKINNY_MAX_WEIGHT;
        let folded: Vec<usize> = (1..=20).filter(|&r| folds(r, widest)).collect();
        assert_eq!(folded, [1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert!(folds(1, usize::MAX) && !folds(16, widest + 1));
        assert!(folds(16, 4 * 1024 * 1024)); // bloom-560m: (4·1024, 1024)
    }

    #[test]
    fn folding_in_chunks_is_folding_the_whole_weight() {
        let dev = Device::Cpu;
        let (n, k) = (2 * FOLD_ROWS + 5, 16);
        let w = Tensor::randn(0f32, 0.2, (n, k), &dev).unwrap();
        let w = w.to_dtype(DType::BF16).unwrap();
        let b = Tensor::randn(0f32, 0.5, n, &dev).unwrap();
        let gamma = Tensor::randn(1f32, 0.3, k, &dev).unwrap();
        let beta = Tensor::randn(0f32, 0.3, k, &dev).unwrap();
        let f = fold(&w, &b, &gamma, &beta).unwrap();
        let wf = w.to_dtype(DType::F32).unwrap();
        let scaled = wf.broadcast_mul(&gamma.unsqueeze(0).unwrap()).unwrap();
        let scaled = scaled.to_dtype(DType::BF16).unwrap();
        assert_eq!(
            max_diff(
                &f.w.to_dtype(DType::F32).unwrap(),
                &scaled.to_dtype(DType::F32).unwrap()
            ),
            0.
        );
        let sums = scaled.to_dtype(DType::F32).unwrap().sum(1).unwrap();
        let shift = wf
            .matmul(&beta.unsqueeze(1).unwrap())
            .unwrap()
            .squeeze(1)
            .unwrap();
        let b2 = (&b + shift).unwrap();
        assert!(max_diff(&f.sb.narrow(1, 0, 1).unwrap().squeeze(1).unwrap(), &sums) < 1e-5);
        assert!(max_diff(&f.sb.narrow(1, 1, 1).unwrap().squeeze(1).unwrap(), &b2) < 1e-5);
        assert!(max_diff(&f.b, &b2) < 1e-5);
    }

    #[test]
    fn a_unit_norm_folds_to_the_same_weights_bit_for_bit() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 0.2, (8, 16), &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let b = Tensor::randn(0f32, 0.5, 8, &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let (ones, zeros) = (
            Tensor::ones(16, DType::BF16, &dev).unwrap(),
            Tensor::zeros(16, DType::BF16, &dev).unwrap(),
        );
        let f = fold(&w, &b, &ones, &zeros).unwrap();
        let bits = |t: &Tensor| {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_eq!(bits(&f.w), bits(&w));
        assert_eq!(bits(&f.b), bits(&b));
        assert_eq!(f.w.dtype(), DType::BF16);
    }
}
