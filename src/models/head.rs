//! The LM head: logits of a forward's last hidden states against the head (V, C) as each
//! shape is fastest (the tensor-core kernel, the decode GEMV, cuBLAS), against an fp8 head, and
//! split over the ranks of tensor parallelism.

use super::fp8::Fp8Weight;
use crate::dist::Tp;
use crate::kernels::{self, Act};
use candle_core::Tensor;

/// Bytes of a head's row up to which one row takes the tensor-core kernel rather than cuBLAS:
/// bloom-560m's 2 KB rows, its step 18 µs shorter on an H100 (results/h100/head-run78) and 7 µs
/// on an H200; bloom-1b1's 3 KB rows were 19 µs slower on the H200 (results/h200x2/gate-run79).
const SKINNY_ROW_BYTES: usize = 2048;

/// Logits of the rows of `hidden` (N, C) against the LM head (V, C): (N, V). A decode step's
/// few rows against a vocabulary that is no multiple of 8 take the tensor-core kernel
/// (`--fused skinny`): cuBLAS's kernel for that shape reads the head at 0.8 TB/s, and is faster
/// than ours for the others at 5–16 rows (docs/perf-notes.md); at 1–4 rows, where the head's
/// rows hold 8 KB or more (bloom-7b1's), they take the decode GEMV (`--fused gemv-head`), which
/// a programmatic edge can start early; one row against rows of at most
/// [`SKINNY_ROW_BYTES`] takes the tensor-core kernel too.
pub fn lm_head(hidden: &Tensor, head: &Tensor) -> candle_core::Result<Tensor> {
    let odd = !head.dim(0)?.is_multiple_of(8);
    if !odd {
        if let Some(logits) = kernels::gemv_head(hidden, head)? {
            return Ok(logits);
        }
    }
    let short = head.dim(1)? * head.dtype().size_in_bytes() <= SKINNY_ROW_BYTES;
    if odd || (hidden.dim(0)? == 1 && short) {
        if let Some(logits) = kernels::skinny(hidden, head)? {
            return Ok(logits);
        }
    }
    hidden.matmul(&head.t()?) // (N, C) @ (C, V)
}

/// [`lm_head`] against an fp8 head (V, C): the fp8 GEMV at 1–4 rows, the tensor-core kernel at
/// 5–16, else the head turned back into the hidden states' dtype.
pub fn fp8_lm_head(hidden: &Tensor, head: &Fp8Weight) -> candle_core::Result<Tensor> {
    if let Some(y) = head.gemv(hidden, Act::None)? {
        return Ok(y);
    }
    lm_head(hidden, &head.dequantize(hidden.dtype())?)
}

/// Logits of the last positions `hidden` (B, C) against the LM head (V, C), the vocabulary
/// split over the ranks of `tp` (`--fused split-head`): each rank multiplies its run of
/// V / size rows (a view of the replicated head) and the ranks all-gather the runs, so a
/// decode step reads 1 / size of the head a rank (bloom-7b1's head is 2 GB of its 14).
/// None at one rank, with the path off, or where the ranks' runs would differ in length.
pub fn split_head_logits(
    hidden: &Tensor,
    head: &Tensor,
    tp: &Tp,
) -> candle_core::Result<Option<Tensor>> {
    let v = head.dim(0)?;
    let Some(reduce) = &tp.reduce else {
        return Ok(None);
    };
    if tp.size == 1 || !v.is_multiple_of(tp.size) || !kernels::enabled(kernels::Fused::SplitHead) {
        return Ok(None);
    }
    let run = v / tp.size;
    let b = hidden.dim(0)?;
    let mine = lm_head(hidden, &head.narrow(0, tp.rank * run, run)?)?; // (B, V/size)
    let all = reduce.all_gather(&mine.contiguous()?, tp.rank, tp.size)?; // (size·B·V/size,)
    let by_rank = all.reshape((tp.size, b, run))?; // rank r's run of every row
    Ok(Some(
        by_rank.transpose(0, 1)?.contiguous()?.reshape((b, v))?,
    )) // (B, V)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::collective::TcpAllReduce;
    use crate::dist::AllReduce;
    use candle_core::Device;
    use std::sync::Arc;
    use std::time::Duration;

    /// Rank `rank` of `size` CPU ranks (threads over TCP) computes its split-head logits.
    fn split_on_ranks(hidden: &Tensor, head: &Tensor, size: usize) -> Vec<Option<Tensor>> {
        let listener = TcpAllReduce::listen([127, 0, 0, 1].into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let run = move |rank: usize, reduce: Arc<dyn AllReduce>, h: Tensor, w: Tensor| {
            let tp = Tp {
                rank,
                size,
                reduce: Some(reduce),
            };
            split_head_logits(&h, &w, &tp).unwrap()
        };
        let others: Vec<_> = (1..size)
            .map(|r| {
                let (h, w) = (hidden.clone(), head.clone());
                std::thread::spawn(move || {
                    run(r, Arc::new(TcpAllReduce::connect(addr, r).unwrap()), h, w)
                })
            })
            .collect();
        let root = TcpAllReduce::serve(listener, size, Duration::from_secs(10)).unwrap();
        let mut out = vec![run(0, Arc::new(root), hidden.clone(), head.clone())];
        out.extend(others.into_iter().map(|t| t.join().unwrap()));
        out
    }

    /// Every rank gets the whole logits, (B, V) in vocabulary order, as the unsplit head
    /// gives them; a vocabulary the ranks cannot split evenly keeps the unsplit head.
    #[test]
    fn split_head_logits_are_the_whole_heads_on_every_rank() {
        let dev = Device::Cpu;
        let hidden = Tensor::randn(0f32, 1., (3, 8), &dev).unwrap(); // (B, C)
        let head = Tensor::randn(0f32, 1., (12, 8), &dev).unwrap(); // (V, C)
        let want: Vec<Vec<f32>> = lm_head(&hidden, &head).unwrap().to_vec2().unwrap();
        for size in [2, 3] {
            for got in split_on_ranks(&hidden, &head, size) {
                let got: Vec<Vec<f32>> = got.expect("12 splits over 2 and 3").to_vec2().unwrap();
                for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                    assert!(
                        (g - w).abs() <= 1e-5 * w.abs().max(1.),
                        "{g} vs {w} at {size} ranks"
                    );
                }
            }
        }
        let odd = Tensor::randn(0f32, 1., (13, 8), &dev).unwrap();
        assert!(split_on_ranks(&hidden, &odd, 2).iter().all(Option::is_none));
    }

    /// Where no fp8 GEMV applies (the CPU), the logits are the dequantized head's.
    #[test]
    fn an_fp8_heads_logits_on_the_cpu_are_the_dequantized_heads() {
        let dev = Device::Cpu;
        let head = Tensor::randn(0f32, 1., (10, 32), &dev).unwrap(); // (V, K)
        let hidden = Tensor::randn(0f32, 1., (3, 32), &dev).unwrap(); // (N, K)
        let fp8 = Fp8Weight::quantize(&head, None).unwrap();
        let want: Vec<Vec<f32>> = hidden
            .matmul(
                &fp8.dequantize(candle_core::DType::F32)
                    .unwrap()
                    .t()
                    .unwrap(),
            )
            .unwrap()
            .to_vec2()
            .unwrap();
        let got: Vec<Vec<f32>> = fp8_lm_head(&hidden, &fp8).unwrap().to_vec2().unwrap();
        assert_eq!(got, want);
    }
}
