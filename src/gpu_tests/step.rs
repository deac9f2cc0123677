//! The decode step kernel (`--fused step`) against the same blocks in candle's ops (f32), at
//! GPT-2's and BLOOM's widths and qkv layouts, with LayerNorm weights, biases, ALiBi and
//! padding that random checkpoints would leave trivial (ones, zeros); and end to end in the
//! models against the layers it replaces.

use super::*;
use candle_core::D;

/// A (C,)-or-(out, in) tensor of the test's weights: normal, scaled.
fn w(shape: &[usize], scale: f64, dev: &Device, dtype: DType) -> Tensor {
    (randn(shape, dev) * scale)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn layer(c: usize, dev: &Device, dtype: DType) -> StepLayer {
    let i = 4 * c;
    let s = 1. / (c as f64).sqrt();
    let norm = || {
        (
            randn(&[c], dev)
                .affine(0.2, 1.)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
            w(&[c], 0.1, dev, dtype),
        )
    };
    StepLayer {
        ln1: norm(),
        qkv: (w(&[3 * c, c], s, dev, dtype), w(&[3 * c], 0.1, dev, dtype)),
        proj: (w(&[c, c], s, dev, dtype), w(&[c], 0.1, dev, dtype)),
        ln2: norm(),
        fc: (w(&[i, c], s, dev, dtype), w(&[i], 0.1, dev, dtype)),
        fc2: (
            w(&[c, i], 0.5 / (i as f64).sqrt(), dev, dtype),
            w(&[c], 0.1, dev, dtype),
        ),
    }
}

fn f32s(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32).unwrap()
}

/// x (M, C) Wᵀ + b in f32.
fn linear(x: &Tensor, (wt, b): &(Tensor, Tensor)) -> Tensor {
    x.matmul(&f32s(wt).t().unwrap())
        .unwrap()
        .broadcast_add(&f32s(b))
        .unwrap()
}

fn norm(x: &Tensor, (g, b): &(Tensor, Tensor)) -> Tensor {
    candle_nn::ops::layer_norm_slow(x, &f32s(g), &f32s(b), 1e-5).unwrap()
}

/// The caches and the attention's per-row inputs of one test step.
struct Keys<'a> {
    k: &'a Tensor, // (M, nh, T_max, hs) f32, the cache before the step
    v: &'a Tensor,
    mask: &'a Tensor,    // (M, T_max) f32
    key_pos: &'a Tensor, // (M, T_max) f32
    pos: usize,
}

/// One new query a row against keys 0..=pos (the new key and value at pos), in f32.
fn attend(qkv: &Tensor, a: &StepAttention, keys: &Keys) -> Tensor {
    let (rows, nh, hs) = (qkv.dim(0).unwrap(), a.nh, a.hs);
    let tk = keys.pos + 1;
    let mut out = Vec::new();
    for m in 0..rows {
        let row = qkv.get(m).unwrap();
        for h in 0..nh {
            let at = |off: usize| row.narrow(0, h * a.layout.head_stride + off, hs).unwrap();
            let (q, k_new, v_new) = (at(0), at(a.layout.part), at(2 * a.layout.part));
            let cached = |c: &Tensor, new: &Tensor| {
                let old = c
                    .get(m)
                    .unwrap()
                    .get(h)
                    .unwrap()
                    .narrow(0, 0, keys.pos)
                    .unwrap();
                Tensor::cat(&[&old, &new.unsqueeze(0).unwrap()], 0).unwrap() // (tk, hs)
            };
            let (k, v) = (cached(keys.k, &k_new), cached(keys.v, &v_new));
            let mut s = (k
                .matmul(&q.unsqueeze(1).unwrap())
                .unwrap()
                .squeeze(1)
                .unwrap()
                * a.scale)
                .unwrap();
            let mask = keys.mask.get(m).unwrap().narrow(0, 0, tk).unwrap();
            s = (s + ((1. - mask).unwrap() * -1e9f64).unwrap()).unwrap();
            if let Some(slopes) = &a.slopes {
                let slope = slopes.get(h).unwrap().to_scalar::<f32>().unwrap() as f64;
                let kp = keys.key_pos.get(m).unwrap().narrow(0, 0, tk).unwrap();
                s = (s + (kp * slope).unwrap()).unwrap();
            }
            let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
            out.push(
                p.unsqueeze(0)
                    .unwrap()
                    .matmul(&v)
                    .unwrap()
                    .squeeze(0)
                    .unwrap(),
            );
        }
    }
    Tensor::cat(&out, 0)
        .unwrap()
        .reshape((rows, nh * hs))
        .unwrap()
}

/// LN_f of the blocks over x (M, C) in f32: what the kernel computes.
fn blocks_ref(
    x: &Tensor,
    layers: &[StepLayer],
    lnf: &(Tensor, Tensor),
    a: &StepAttention,
    keys: &[Keys],
) -> Tensor {
    let mut x = f32s(x);
    for (l, keys) in layers.iter().zip(keys) {
        let qkv = linear(&norm(&x, &l.ln1), &l.qkv);
        x = (&x + linear(&attend(&qkv, a, keys), &l.proj)).unwrap();
        let up = linear(&norm(&x, &l.ln2), &l.fc).gelu().unwrap();
        x = (&x + linear(&up, &l.fc2)).unwrap();
    }
    norm(&x, lnf)
}

/// (mask, key positions), (rows, t_max) f32 each: row 1 left-padded over its first 5 keys,
/// positions counting real keys.
fn padded_keys(rows: usize, t_max: usize, dev: &Device) -> (Tensor, Tensor) {
    let (mut mask, mut key_pos) = (vec![1f32; rows * t_max], vec![0f32; rows * t_max]);
    for m in 0..rows {
        let pad = if m == 1 { 5 } else { 0 };
        for t in 0..t_max {
            mask[m * t_max + t] = if t < pad { 0. } else { 1. };
            key_pos[m * t_max + t] = t.saturating_sub(pad) as f32;
        }
    }
    let mask = Tensor::from_vec(mask, (rows, t_max), dev).unwrap();
    (mask, Tensor::from_vec(key_pos, (rows, t_max), dev).unwrap())
}

/// GPT-2's attention ([q | k | v]) or BLOOM's ((nh, 3, hs), ALiBi slopes) at `c` channels.
fn attention_of(c: usize, nh: usize, bloom: bool, dev: &Device) -> StepAttention {
    let hs = c / nh;
    let (layout, slopes) = match bloom {
        true => {
            let slopes = (Tensor::arange(1f32, nh as f32 + 1., dev).unwrap() * -0.05).unwrap();
            let layout = QkvLayout {
                head_stride: 3 * hs,
                part: hs,
            };
            (layout, Some(slopes))
        }
        false => {
            let layout = QkvLayout {
                head_stride: hs,
                part: c,
            };
            (layout, None)
        }
    };
    StepAttention {
        nh,
        hs,
        layout,
        scale: 1. / (hs as f64).sqrt(),
        slopes,
    }
}

/// GPT-2's [q | k | v] (C = 768, 12 heads) at one row, BLOOM's (nh, 3, hs) with ALiBi (C =
/// 1024, 16 heads; 768, 12 in f32) at three rows, one left-padded: two layers, a cache of 40
/// with the step at 21, f32 and bf16, against candle's ops in f32.
#[test]
fn the_step_kernel_matches_the_blocks_in_candles_ops() {
    let (gpu, _one_at_a_time) = gpu();
    set_enabled(&[Fused::All, Fused::Step]);
    // f32 at BLOOM's 1024 channels does not fit the kernel's shared memory: 768 there.
    let cases = [
        (DType::F32, 1e-4, 768, 12, 1, false),
        (DType::F32, 1e-4, 768, 12, 3, true),
        (DType::BF16, 4e-2, 768, 12, 1, false),
        (DType::BF16, 4e-2, 1024, 16, 3, true),
    ];
    for (dtype, tol, c, nh, rows, bloom) in cases {
        {
            let (hs, t_max, pos) = (c / nh, 40, 21);
            let attention = || attention_of(c, nh, bloom, &gpu);
            let layout = attention().layout;
            let layers: Vec<_> = (0..2).map(|_| layer(c, &gpu, dtype)).collect();
            let lnf = (
                w(&[c], 0.2, &gpu, dtype).affine(1., 1.).unwrap(),
                w(&[c], 0.1, &gpu, dtype),
            );
            let cache = || w(&[rows, nh, t_max, hs], 1., &gpu, dtype);
            let kv: Vec<_> = (0..2).map(|_| (cache(), cache())).collect();
            let (mask, key_pos) = padded_keys(rows, t_max, &gpu);
            let x = w(&[rows, 1, c], 1., &gpu, dtype);
            // The reference first: the kernel writes the caches.
            let cached: Vec<_> = kv.iter().map(|(k, v)| (f32s(k), f32s(v))).collect();
            let keys: Vec<_> = cached
                .iter()
                .map(|(k, v)| Keys {
                    k,
                    v,
                    mask: &mask,
                    key_pos: &key_pos,
                    pos,
                })
                .collect();
            let want = blocks_ref(&x.squeeze(1).unwrap(), &layers, &lnf, &attention(), &keys);
            let want_k = linear(
                &norm(&f32s(&x.squeeze(1).unwrap()), &layers[0].ln1),
                &layers[0].qkv,
            );
            let model = StepModel::new(layers, lnf, 1e-5, attention())
                .unwrap()
                .expect("applies");
            let slots: Vec<_> = kv
                .iter()
                .map(|(k, v)| CacheSlot {
                    k,
                    v,
                    key_mask: &mask,
                    key_pos: &key_pos,
                    pos,
                    cursor: None,
                })
                .collect();
            let got = model.forward(&x, &slots).unwrap().expect("applies");
            let case = format!("{dtype:?} C {c} rows {rows}");
            let r = rel(&got.squeeze(1).unwrap(), &want);
            assert!(r < tol, "{case}: rel {r}");
            // Layer 0's new key of head 0, row 0, written at pos.
            let k_at = kv[0].0.get(0).unwrap().get(0).unwrap().get(pos).unwrap();
            let k_want = want_k.get(0).unwrap().narrow(0, layout.part, hs).unwrap();
            let r = rel(&k_at, &k_want);
            assert!(r < tol, "{case}: the new key, rel {r}");
        }
    }
}

/// In the models: cached decoding with the step kernel gives the logits of the layers it
/// replaces (gpt2 and bloom-560m shapes cut to two layers, and the tiny ones), one to four
/// rows (each of the kernel's instantiations), the kernel counted as launched (4 decode steps: the prefill is the layers').
#[test]
fn cached_decoding_with_the_step_kernel_matches_the_layers() {
    use crate::models::generate::left_pad;
    use crate::models::Architecture;
    let (gpu, _one_at_a_time) = gpu();
    let (mut gpt2, mut bloom) = (
        crate::models::gpt2::Config::gpt2_124m(),
        crate::models::bloom::Config::bloom_560m(),
    );
    (gpt2.n_layer, bloom.n_layer) = (2, 2);
    let specs = [
        ModelSpec {
            name: "gpt2-2l".into(),
            arch: Architecture::Gpt2(gpt2),
        },
        ModelSpec {
            name: "bloom-560m-2l".into(),
            arch: Architecture::Bloom(bloom),
        },
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    let ids = |n: u32| (0..n).map(|i| 1 + i * 7 % 50).collect::<Vec<u32>>();
    // bloom-560m's widths in f32 do not fit the kernel's shared memory: bf16 only.
    let cases = [
        (0, DType::F32),
        (0, DType::BF16),
        (1, DType::BF16),
        (2, DType::F32),
        (3, DType::F32),
        (3, DType::BF16),
    ];
    for (i, dtype) in cases {
        let spec = &specs[i];
        let tol = if dtype == DType::F32 { 1e-4 } else { 4e-2 };
        {
            for rows in 1..=4 {
                let prompts: Vec<_> = [30, 17, 25, 9][..rows].iter().map(|&n| ids(n)).collect();
                let prompts = left_pad(&prompts, 0, &gpu).unwrap();
                let mut steps = Vec::new();
                for fused in [all_but(Fused::Step), vec![Fused::All, Fused::Step]] {
                    set_enabled(&fused);
                    let model = spec
                        .load(&WeightSource::Random { seed: 0 }, dtype, &gpu)
                        .unwrap();
                    let mut cache = model.new_cache(rows, 40).unwrap();
                    let before = step_launches();
                    let mut logits = vec![model
                        .forward_cached(&prompts.ids, &prompts.mask, &mut cache)
                        .unwrap()];
                    let real = Tensor::ones((rows, 1), DType::U32, &gpu).unwrap();
                    for id in [11u32, 12, 13, 14] {
                        let next = Tensor::from_vec(vec![id; rows], (rows, 1), &gpu).unwrap();
                        logits.push(model.forward_cached(&next, &real, &mut cache).unwrap());
                    }
                    let launched = step_launches() - before;
                    let want = if fused.contains(&Fused::Step) { 4 } else { 0 };
                    assert_eq!(
                        launched, want,
                        "{} {dtype:?}: step kernel launches",
                        spec.name
                    );
                    steps.push(logits);
                }
                for (i, (on, off)) in steps[1].iter().zip(&steps[0]).enumerate() {
                    let r = rel(on, off);
                    assert!(
                        r < tol,
                        "{} {dtype:?} rows {rows} step {i}: rel {r}",
                        spec.name
                    );
                }
            }
        }
    }
}

/// Decode steps with the step kernel replayed as a CUDA graph (its position read on the
/// device) choose the ids of eager steps through the layers (fp32, greedy, 12 new tokens: one
/// eager step, the capture, ten replays), GPT-2 at 768 channels cut to two layers and the
/// tiny models, two rows left-padded.
#[test]
fn graph_replayed_decoding_with_the_step_kernel_matches_eager_decoding() {
    use crate::models::generate::{generate, left_pad, Greedy};
    use crate::models::Architecture;
    let (gpu, _one_at_a_time) = gpu();
    let prompts = left_pad(&[vec![5, 9, 2, 7, 1, 3], vec![4, 8, 6]], 0, &gpu).unwrap();
    let g = Greedy {
        new_tokens: 12,
        banned: vec![],
    };
    let mut gpt2 = crate::models::gpt2::Config::gpt2_124m();
    gpt2.n_layer = 2;
    let specs = [
        ModelSpec {
            name: "gpt2-2l".into(),
            arch: Architecture::Gpt2(gpt2),
        },
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    for spec in &specs {
        let mut ids = Vec::new();
        for step in [false, true] {
            match step {
                true => set_enabled(&[Fused::All, Fused::Step]),
                false => {
                    let eager = all_but(Fused::Graph)
                        .into_iter()
                        .filter(|&f| f != Fused::Step);
                    set_enabled(&eager.collect::<Vec<_>>())
                }
            }
            let model = spec
                .load(&WeightSource::Random { seed: 0 }, DType::F32, &gpu)
                .unwrap();
            let (replayed, launched) = (replays(), step_launches());
            ids.push(generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap());
            let replayed = replays() - replayed;
            let launched = step_launches() - launched;
            let want = if step { (10, 2) } else { (0, 0) }; // step 1 and the capture launch
            assert_eq!(
                (replayed, launched),
                want,
                "{}: replays, launches",
                spec.name
            );
        }
        assert_eq!(ids[1], ids[0], "{}", spec.name);
    }
}
