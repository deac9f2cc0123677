//! The scoring forward's attention (`--fused prefill`) against f32 composed attention, alone
//! and inside whole models.

use super::*;
use crate::models::attention::causal_padding_bias;
use crate::models::bloom::alibi_slopes;
use candle_core::D;

/// Lengths of right-padded rows at T = 150: across three tiles, across two, one token, one
/// whole tile.
const LENS: [u32; 4] = [150, 97, 1, 64];

/// softmax(q kᵀ·scale + causal + padding [+ slope_h · key]) v in f32, heads merged:
/// qkv (B, T, 3C) laid out as `layout` -> (B, T, C).
fn prefill_f32(qkv: &Tensor, layout: QkvLayout, hs: usize, slopes: Option<&Tensor>) -> Tensor {
    let (b, t, c3) = qkv.dims3().unwrap();
    let nh = c3 / 3 / hs;
    let x = qkv.to_dtype(DType::F32).unwrap();
    // Part i (q, k, v) of every head, (B, nh, T, hs).
    let part = |i: usize| -> Tensor {
        let heads = match layout.part == hs {
            true => x
                .reshape((b, t, nh, 3, hs))
                .unwrap()
                .narrow(3, i, 1)
                .unwrap(),
            false => x
                .reshape((b, t, 3, nh, hs))
                .unwrap()
                .narrow(2, i, 1)
                .unwrap(),
        };
        let heads = heads.reshape((b, t, nh, hs)).unwrap();
        heads.transpose(1, 2).unwrap().contiguous().unwrap()
    };
    let (q, k, v) = (part(0), part(1), part(2));
    let rows: Vec<u32> = (0..b * t)
        .map(|i| u32::from(i % t < LENS[i / t] as usize))
        .collect();
    let mask = Tensor::from_vec(rows, (b, t), qkv.device()).unwrap();
    let mut bias = causal_padding_bias(&mask).unwrap(); // (B, 1, T, T)
    if let Some(s) = slopes {
        let keys = Tensor::arange(0f32, t as f32, qkv.device()).unwrap();
        let alibi = s
            .reshape((nh, 1, 1))
            .unwrap()
            .broadcast_mul(&keys.reshape((1, 1, t)).unwrap());
        bias = bias
            .broadcast_add(&alibi.unwrap().unsqueeze(0).unwrap())
            .unwrap(); // (B, nh, T, T)
    }
    let scale = 1. / (hs as f64).sqrt();
    let s = ((q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap())
        .broadcast_add(&bias)
        .unwrap();
    let y = candle_nn::ops::softmax(&s, D::Minus1)
        .unwrap()
        .matmul(&v)
        .unwrap(); // (B, nh, T, hs)
    y.transpose(1, 2).unwrap().reshape((b, t, nh * hs)).unwrap()
}

/// GPT-2's [q | k | v] and BLOOM's (nh, 3, hs) with ALiBi, head sizes 64 and 128, bf16 and
/// f16: each real row within bf16 rounding of f32 attention, every padded row zero, and the
/// same rows packed end to end equal to the padded ones.
#[test]
fn flash_prefill_matches_f32_attention_on_right_padded_rows() {
    let (dev, _one_at_a_time) = gpu();
    let (b, t, nh) = (LENS.len(), 150, 3);
    let lens = Tensor::new(&LENS, &dev).unwrap();
    let cases = [
        (64, false, DType::BF16),
        (64, true, DType::F16),
        (128, true, DType::BF16),
        (128, false, DType::F16),
    ];
    for (hs, bloom, dtype) in cases {
        let c = nh * hs;
        let layout = qkv_layout(bloom, hs, c);
        let slopes: Vec<f32> = alibi_slopes(nh).iter().map(|&s| s as f32).collect();
        let slopes = bloom.then(|| Tensor::new(slopes, &dev).unwrap());
        let qkv = randn(&[b, t, 3 * c], &dev).to_dtype(dtype).unwrap();
        let scale = 1. / (hs as f64).sqrt();
        let padded = SeqRows {
            lens: &lens,
            starts: None,
            longest: t,
        };
        let y = flash_prefill(&qkv, layout, (nh, hs), padded, slopes.as_ref(), scale)
            .unwrap()
            .expect("applies");
        let want = prefill_f32(&qkv, layout, hs, slopes.as_ref());
        let packed_y = packed(&qkv, layout, (nh, hs), slopes.as_ref(), scale);
        for (i, &len) in LENS.iter().enumerate() {
            let len = len as usize;
            let row =
                |x: &Tensor, from: usize, n: usize| x.get(i).unwrap().narrow(0, from, n).unwrap();
            let r = rel(&row(&y, 0, len), &row(&want, 0, len));
            eprintln!("hs {hs} bloom {bloom} {dtype:?} row {i} (len {len}): rel {r:.2e}");
            assert!(r < 2e-2, "hs {hs} bloom {bloom} {dtype:?} row {i}: rel {r}");
            // Packed, the same rows come out bit for bit: the same tiles in the same order.
            let at: usize = LENS[..i].iter().map(|&l| l as usize).sum();
            let same = packed_y.narrow(0, at, len).unwrap();
            assert_eq!(rel(&same, &row(&y, 0, len)), 0., "packed row {i}");
            if len < t {
                let pad = row(&y, len, t - len).to_dtype(DType::F32).unwrap();
                let max = pad.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
                assert_eq!(
                    max.to_scalar::<f32>().unwrap(),
                    0.,
                    "padded rows of row {i}"
                );
            }
        }
    }
    let f32_qkv = randn(&[b, t, 3 * nh * 64], &dev);
    let layout = QkvLayout {
        head_stride: 64,
        part: nh * 64,
    };
    let padded = SeqRows {
        lens: &lens,
        starts: None,
        longest: t,
    };
    let none = flash_prefill(&f32_qkv, layout, (nh, 64), padded, None, 0.125).unwrap();
    assert!(none.is_none(), "f32 is the composed path's");
}

/// The real rows of qkv (B, T, 3C) end to end, (1, N, 3C), through the kernel's packed
/// layout: y (N, C).
fn packed(
    qkv: &Tensor,
    layout: QkvLayout,
    (nh, hs): (usize, usize),
    slopes: Option<&Tensor>,
    scale: f64,
) -> Tensor {
    let dev = qkv.device();
    let rows: Vec<Tensor> = LENS
        .iter()
        .enumerate()
        .map(|(i, &l)| qkv.get(i).unwrap().narrow(0, 0, l as usize).unwrap())
        .collect();
    let packed = Tensor::cat(&rows, 0).unwrap().unsqueeze(0).unwrap(); // (1, N, 3C)
    let starts: Vec<u32> = (0..LENS.len()).map(|i| LENS[..i].iter().sum()).collect();
    let (lens, starts) = (
        Tensor::new(&LENS, dev).unwrap(),
        Tensor::new(starts, dev).unwrap(),
    );
    let rows = SeqRows {
        lens: &lens,
        starts: Some(&starts),
        longest: 150,
    };
    let y = flash_prefill(&packed, layout, (nh, hs), rows, slopes, scale)
        .unwrap()
        .expect("applies");
    y.squeeze(0).unwrap()
}
