//! The scoring forward's attention (`--fused prefill`) against f32 composed attention, alone
//! and inside whole models; and a generation's packed prefill's keys and values written into
//! its KV cache (`prefill_kv`).

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

/// A generation's packed prefill's keys and values into its KV cache (`prefill_kv`): each
/// sequence's rows copied bit for bit to the columns left padding gives them (ending at
/// column 72 of 80, past the longest sequence: `--pad-multiple`; or at 70, the longest
/// sequence's own length: no padding), its padding columns zeroed, the columns from the end
/// on untouched; GPT-2's and BLOOM's layouts, head sizes 64 and 128, bf16 and f16. Not in f32
/// (the padded forward's), and only for packed rows.
#[test]
fn prefill_kv_writes_each_row_where_left_padding_puts_it() {
    let (dev, _one_at_a_time) = gpu();
    let lens: [u32; 4] = [5, 1, 70, 33];
    let (b, nh, t_max) = (lens.len(), 3, 80);
    let n: usize = lens.iter().map(|&l| l as usize).sum();
    let starts: Vec<u32> = (0..b).map(|i| lens[..i].iter().sum()).collect();
    let (lens_t, starts_t) = (
        Tensor::new(&lens, &dev).unwrap(),
        Tensor::new(starts.clone(), &dev).unwrap(),
    );
    let rows = SeqRows {
        lens: &lens_t,
        starts: Some(&starts_t),
        longest: 70,
    };
    let cases = [
        (64, false, DType::BF16, 72),
        (64, true, DType::F16, 72),
        (128, true, DType::BF16, 70),
        (128, false, DType::F16, 70),
    ];
    for (hs, bloom, dtype, end) in cases {
        let why = format!("hs {hs} bloom {bloom} {dtype:?} end {end}");
        let c = nh * hs;
        let layout = qkv_layout(bloom, hs, c);
        let qkv = randn(&[1, n, 3 * c], &dev).to_dtype(dtype).unwrap();
        let cache = || (Tensor::ones((b, nh, t_max, hs), dtype, &dev).unwrap() * 7.).unwrap();
        let (k, v) = (cache(), cache());
        assert!(
            prefill_kv(&qkv, layout, (nh, hs), rows, (&k, &v), end).unwrap(),
            "{why}"
        );
        for (s, &len) in lens.iter().enumerate() {
            let (len, pad) = (len as usize, end - len as usize);
            for (i, cache) in [(1, &k), (2, &v)] {
                let row = cache.get(s).unwrap(); // (nh, T_max, hs)
                let got = row.narrow(1, pad, len).unwrap();
                let rows = qkv
                    .get(0)
                    .unwrap()
                    .narrow(0, starts[s] as usize, len)
                    .unwrap();
                let want = head_part(&rows, bloom, i, (nh, hs));
                assert_eq!(rel(&got, &want), 0., "{why}: sequence {s} part {i}");
                let padding = row.narrow(1, 0, pad).unwrap();
                let zeroed = max_abs_from(&padding, 0.);
                assert_eq!(zeroed, 0., "{why}: sequence {s} padding zeroed");
                let after = row.narrow(1, end, t_max - end).unwrap();
                let kept = max_abs_from(&after, 7.);
                assert_eq!(kept, 0., "{why}: sequence {s} past the end");
            }
        }
    }
    let f32_qkv = randn(&[1, n, 3 * nh * 64], &dev);
    let f32_cache = Tensor::zeros((b, nh, t_max, 64), DType::F32, &dev).unwrap();
    let layout = qkv_layout(false, 64, nh * 64);
    let end = 72;
    let f32s = prefill_kv(
        &f32_qkv,
        layout,
        (nh, 64),
        rows,
        (&f32_cache, &f32_cache),
        end,
    );
    assert!(!f32s.unwrap(), "f32 is the padded forward's");
    let qkv = f32_qkv.to_dtype(DType::BF16).unwrap();
    let cache = f32_cache.to_dtype(DType::BF16).unwrap();
    let padded = SeqRows {
        starts: None,
        ..rows
    };
    let err = prefill_kv(&qkv, layout, (nh, 64), padded, (&cache, &cache), end);
    assert!(err.is_err(), "padded rows are refused");
}

/// Part i (0 q, 1 k, 2 v) of every head of qkv rows (len, 3C) laid out as BLOOM's (nh, 3, hs)
/// or GPT-2's [q | k | v]: (nh, len, hs).
fn head_part(rows: &Tensor, bloom: bool, i: usize, (nh, hs): (usize, usize)) -> Tensor {
    let len = rows.dim(0).unwrap();
    let heads = match bloom {
        true => rows.reshape((len, nh, 3, hs)).unwrap().narrow(2, i, 1),
        false => rows.reshape((len, 3, nh, hs)).unwrap().narrow(1, i, 1),
    };
    let heads = heads.unwrap().reshape((len, nh, hs)).unwrap();
    heads.transpose(0, 1).unwrap()
}

/// The largest |x − want| over x's elements, in f32; 0 for no elements (a prompt without
/// padding: candle's cast of an empty CUDA tensor launches an empty grid, which CUDA refuses).
fn max_abs_from(x: &Tensor, want: f64) -> f32 {
    if x.elem_count() == 0 {
        return 0.;
    }
    let d = (x.to_dtype(DType::F32).unwrap() - want).unwrap();
    let d = d.abs().unwrap().flatten_all().unwrap();
    d.max(0).unwrap().to_scalar::<f32>().unwrap()
}
