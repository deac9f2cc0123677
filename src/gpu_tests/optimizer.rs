//! The optimizer step: AdamW one tensor and many at a time, the gradient norm and the clip
//! factor on the device, the compute-dtype copies, ZeRO-2/3 on one GPU.

use super::*;
use candle_core::Var;

#[test]
fn fused_adamw_takes_the_composed_step() {
    let (gpu, _one_at_a_time) = gpu();
    let hyper = Hyper {
        weight_decay: 0.01,
        ..Hyper::default()
    };
    let init = randn(&[300, 7], &Device::Cpu);
    let mut params = Vec::new();
    let mut opts = Vec::new();
    for dev in [&Device::Cpu, &gpu] {
        let p = Var::from_tensor(&init.to_device(dev).unwrap()).unwrap();
        opts.push(crate::train::AdamW::new(vec![p.clone()], &hyper).unwrap());
        params.push(p);
    }
    for step in 0..3 {
        let g = (randn(&[300, 7], &Device::Cpu) * (step + 1) as f64).unwrap();
        for (opt, dev) in opts.iter_mut().zip([&Device::Cpu, &gpu]) {
            opt.step(&[g.to_device(dev).unwrap()], 1e-3, 0.5).unwrap();
        }
        let r = rel(params[1].as_tensor(), params[0].as_tensor());
        assert!(r < 1e-6, "step {step}: rel {r}");
    }
}

/// Σ x² in one kernel (the gradient norm) against square + sum, fp32 and bf16, a length that
/// is not a multiple of the block.
#[test]
fn sum_squares_matches_square_then_sum() {
    let (dev, _one_at_a_time) = gpu();
    for dtype in [DType::F32, DType::BF16] {
        let x = randn(&[(1 << 20) + 7], &dev).to_dtype(dtype).unwrap();
        let got = sum_squares(&x).unwrap().expect("applies");
        let want = x
            .to_dtype(DType::F32)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let (g, w) = (
            got.to_vec1::<f32>().unwrap()[0],
            want.to_scalar::<f32>().unwrap(),
        );
        assert!((g - w).abs() < 1e-4 * w, "{dtype:?}: {g} vs {w}");
    }
}

/// The multi-tensor update (40 tensors: two launches, chunk tails, one tensor of one element;
/// every third gradient in bf16, as the manual step makes them) against AdamW's composed ops on
/// the CPU with the host's norm and clip factor, loss scale 1 and 1024, three steps.
#[test]
fn multi_tensor_adamw_matches_the_composed_step() {
    let (gpu, _one_at_a_time) = gpu();
    let hyper = Hyper {
        weight_decay: 0.01,
        ..Hyper::default()
    };
    let sizes: Vec<usize> = (0..40)
        .map(|i| [1, 7, 300, 16384, 16385, 50_003][i % 6] + i)
        .collect();
    for loss_scale in [1., 1024.] {
        let init: Vec<Tensor> = sizes.iter().map(|&n| randn(&[n], &Device::Cpu)).collect();
        let cpu_params: Vec<Var> = init.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let mut cpu_opt = crate::train::AdamW::new(cpu_params.clone(), &hyper).unwrap();
        let gpu_params: Vec<Tensor> = init.iter().map(|t| t.to_device(&gpu).unwrap()).collect();
        let moments: Vec<Tensor> = sizes
            .iter()
            .map(|&n| Tensor::zeros((2, n), DType::F32, &gpu).unwrap())
            .collect();
        for step in 1..=3 {
            let stored: Vec<Tensor> = (0..sizes.len())
                .map(|i| {
                    let g = (randn(&[sizes[i]], &Device::Cpu) * (0.01 * loss_scale)).unwrap();
                    match i % 3 {
                        0 => g.to_dtype(DType::BF16).unwrap(),
                        _ => g,
                    }
                })
                .collect();
            // The reference sees the bf16 gradients' values in f32.
            let grads: Vec<Tensor> = stored
                .iter()
                .map(|g| g.to_dtype(DType::F32).unwrap())
                .collect();
            let norm = crate::train::global_grad_norm(&grads).unwrap() / loss_scale;
            let factor = crate::train::clip_coefficient(norm, 1.0) / loss_scale;
            assert!(factor * loss_scale < 1., "the test must clip (norm {norm})");
            let on_gpu: Vec<Tensor> = stored.iter().map(|g| g.to_device(&gpu).unwrap()).collect();
            let clip = grad_norm_clip(&on_gpu, loss_scale, 1.0)
                .unwrap()
                .expect("applies");
            let got = clip.to_vec1::<f32>().unwrap();
            assert!(
                (got[0] as f64 - norm).abs() < 1e-5 * norm,
                "norm {got:?} vs {norm}"
            );
            assert!(
                (got[1] as f64 - factor).abs() < 1e-5 * factor,
                "{got:?} vs {factor}"
            );
            cpu_opt.step(&grads, 1e-3, factor).unwrap();
            let h = AdamStep {
                lr: 1e-3,
                beta1: hyper.beta1,
                beta2: hyper.beta2,
                eps: hyper.eps,
                weight_decay: hyper.weight_decay,
                bc1: 1. - hyper.beta1.powi(step),
                bc2_sqrt: (1. - hyper.beta2.powi(step)).sqrt(),
                grad_scale: 1.,
            };
            let applied = adamw_multi(&gpu_params, &on_gpu, &moments, &h, &clip).unwrap();
            assert!(applied, "the multi-tensor kernel must apply");
            for (i, (g, c)) in gpu_params.iter().zip(&cpu_params).enumerate() {
                let r = rel(g, c.as_tensor());
                assert!(
                    r < 1e-5,
                    "scale {loss_scale} step {step} tensor {i}: rel {r}"
                );
            }
        }
    }
}

/// The update that also writes the compute copies: the same parameters and moments, bit for
/// bit, as the update without them, and each copy the updated parameter cast (as cast_multi
/// rounds it), from a 16-byte boundary; over two launches of tensors with bf16 and f32
/// gradients. Parameters that are not f32 are refused, nothing updated.
#[test]
fn adamw_copies_are_the_updated_parameters_cast() {
    let (gpu, _one_at_a_time) = gpu();
    let sizes: Vec<usize> = (0..40).map(|i| [1, 7, 300, 16385][i % 4] + i).collect();
    let h = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        bc1: 0.1,
        bc2_sqrt: 0.001f64.sqrt(),
        grad_scale: 1.,
    };
    let clip = Tensor::new(&[1f32, 0.5], &gpu).unwrap();
    for dtype in [DType::BF16, DType::F16] {
        let init: Vec<Tensor> = sizes.iter().map(|&n| randn(&[n], &gpu)).collect();
        let grads: Vec<Tensor> = (0..sizes.len())
            .map(|i| match i % 3 {
                0 => randn(&[sizes[i]], &gpu).to_dtype(DType::BF16).unwrap(),
                _ => randn(&[sizes[i]], &gpu),
            })
            .collect();
        let fresh =
            |ts: &[Tensor]| -> Vec<Tensor> { ts.iter().map(|t| t.copy().unwrap()).collect() };
        let zeros: Vec<Tensor> = sizes
            .iter()
            .map(|&n| Tensor::zeros((2, n), DType::F32, &gpu).unwrap())
            .collect();
        let (plain, plain_mv) = (fresh(&init), fresh(&zeros));
        let (with, with_mv) = (fresh(&init), fresh(&zeros));
        assert!(adamw_multi(&plain, &grads, &plain_mv, &h, &clip).unwrap());
        let copies = adamw_multi_copies(&with, &grads, &with_mv, &h, &clip, dtype)
            .unwrap()
            .expect("applies to f32 parameters");
        for i in 0..sizes.len() {
            assert_eq!(rel(&with[i], &plain[i]), 0., "{dtype:?} parameter {i}");
            assert_eq!(rel(&with_mv[i], &plain_mv[i]), 0., "{dtype:?} moments {i}");
            let c = &copies[i];
            assert_eq!((c.dtype(), c.dims()), (dtype, with[i].dims()));
            assert_eq!(
                rel(c, &with[i].to_dtype(dtype).unwrap()),
                0.,
                "{dtype:?} copy {i}"
            );
            assert_eq!(c.layout().start_offset() % 8, 0);
        }
        let half = vec![init[0].to_dtype(DType::BF16).unwrap()];
        let refused = adamw_multi_copies(&half, &grads[..1], &zeros[..1], &h, &clip, dtype);
        assert!(refused.unwrap().is_none(), "bf16 parameters have no copies");
        assert_eq!(rel(&half[0], &init[0].to_dtype(DType::BF16).unwrap()), 0.);
    }
}

/// A bf16 trainer's manual steps: after each update the copies it wrote are its masters cast
/// to bf16, bit for bit (the next step's weights, in place of a cast pass); an fp32 trainer
/// writes none.
#[test]
fn trainer_copies_equal_the_masters_cast_after_each_step() {
    let (dev, _one_at_a_time) = gpu();
    let (mut trainer, ids) = tiny_gpt2_trainer(&dev, DType::BF16, false);
    for step in 0..3 {
        trainer.step(std::slice::from_ref(&ids)).unwrap();
        let copies = trainer
            .written_copies()
            .expect("the update wrote copies")
            .to_vec();
        let masters = trainer.named_params().unwrap();
        assert_eq!(copies.len(), masters.len());
        for (c, (name, m)) in copies.iter().zip(&masters) {
            let cast = m.to_dtype(DType::BF16).unwrap();
            assert_eq!(rel(c, &cast), 0., "step {step} {name}");
        }
    }
    let (mut fp32, ids) = tiny_gpt2_trainer(&dev, DType::F32, false);
    fp32.step(std::slice::from_ref(&ids)).unwrap();
    assert!(fp32.written_copies().is_none(), "f32 steps use the masters");
}

/// gpt2-tiny trainer steps with the clip factor on the device (multi-tensor AdamW; in bf16 it
/// reads the bf16 gradients) against the host's norm and candle's AdamW ops on f32 gradients:
/// the same losses, norms and weights, fp32 and bf16.
#[test]
fn trainer_steps_with_the_device_clip_match_the_host_clip() {
    for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 2e-3)] {
        device_clip_against_host_clip(dtype, tol);
    }
}

fn device_clip_against_host_clip(dtype: DType, tol: f64) {
    let (dev, _one_at_a_time) = gpu();
    let (mut device_clip, ids) = tiny_gpt2_trainer(&dev, dtype, false);
    let (mut host_clip, _) = tiny_gpt2_trainer(&dev, dtype, false);
    let without_adamw = [
        Fused::Lt,
        Fused::Softmax,
        Fused::BiasAct,
        Fused::LayerNorm,
        Fused::Dropout,
        Fused::CrossEntropy,
        Fused::Embedding,
        Fused::Heads,
    ];
    for step in 0..3 {
        set_enabled(&[Fused::All]);
        let a = device_clip.step(std::slice::from_ref(&ids)).unwrap();
        set_enabled(&without_adamw);
        let b = host_clip.step(std::slice::from_ref(&ids)).unwrap();
        let why = format!("{dtype:?} step {step}: {a:?} vs {b:?}");
        assert!((a.loss - b.loss).abs() < tol * b.loss, "{why}");
        assert!(
            (a.grad_norm - b.grad_norm).abs() < tol * b.grad_norm,
            "{why}"
        );
    }
    set_enabled(&[Fused::All]);
    let (named_a, named_b) = (
        device_clip.named_params().unwrap(),
        host_clip.named_params().unwrap(),
    );
    for ((name, a), (_, b)) in named_a.iter().zip(&named_b) {
        let r = rel(a, b) as f64;
        assert!(r < tol, "{dtype:?} {name}: rel {r}");
    }
}

/// The multi-tensor cast against candle's to_dtype, element for element (both round to
/// nearest even), over more tensors than one launch takes and sizes that leave the flat
/// buffer's starts to be padded; every copy starts on a 16-byte boundary.
#[test]
fn cast_multi_matches_to_dtype() {
    let (dev, _one_at_a_time) = gpu();
    let sizes = (0..40).map(|i| [1, 7, 768, 20_001][i % 4] + i);
    let srcs: Vec<Tensor> = sizes.map(|n| randn(&[n], &dev)).collect();
    for dtype in [DType::BF16, DType::F16] {
        let got = cast_multi(&srcs, dtype).unwrap().expect("applies");
        for (g, s) in got.iter().zip(&srcs) {
            assert_eq!((g.dtype(), g.dims()), (dtype, s.dims()));
            assert_eq!(
                rel(g, &s.to_dtype(dtype).unwrap()),
                0.,
                "{dtype:?} {:?}",
                s.dims()
            );
            assert_eq!(g.layout().start_offset() % 8, 0);
        }
    }
    let half = srcs[0].to_dtype(DType::BF16).unwrap();
    assert!(
        cast_multi(&[half], DType::F16).unwrap().is_none(),
        "the sources are f32"
    );
}

/// Data parallelism's buckets: gradients of mixed dtypes (bf16, f16, f32, as a bucket with the
/// loss holds them) cast to f32 into one buffer, over more tensors than one launch takes: each
/// copy exactly its source's `to_dtype`, from a start on a 16-byte boundary.
#[test]
fn cast_multi_flat_buckets_mixed_dtypes_in_f32() {
    let (dev, _one_at_a_time) = gpu();
    let dtypes = [DType::BF16, DType::F16, DType::F32];
    let srcs: Vec<Tensor> = (0..80)
        .map(|i| {
            let n = [1, 7, 768, 20_001][i % 4] + i;
            randn(&[n], &dev).to_dtype(dtypes[i % 3]).unwrap()
        })
        .collect();
    let (flat, starts) = cast_multi_flat(&srcs, DType::F32)
        .unwrap()
        .expect("applies");
    assert_eq!(flat.dtype(), DType::F32);
    for (s, &at) in srcs.iter().zip(&starts) {
        assert_eq!(at % 8, 0);
        let got = flat.narrow(0, at, s.elem_count()).unwrap();
        assert_eq!(
            rel(&got, &s.to_dtype(DType::F32).unwrap()),
            0.,
            "{:?} {:?}",
            s.dtype(),
            s.dims()
        );
    }
}

/// ZeRO-2 and ZeRO-3 steps on one GPU (one NCCL rank: every shard is the whole unit) against
/// the plain trainer, bf16 with the fused kernels: the gathered blocks, the shards' device
/// clip and the multi-tensor update on shards take the same steps, up to the norm's f32
/// summation order.
#[cfg(feature = "nccl")]
#[test]
fn zero2_and_zero3_steps_match_the_plain_trainer_on_one_gpu() {
    use crate::dist::nccl::NcclAllReduce;
    use crate::train::{DataParallel, ZeroStage};
    let (dev, _one_at_a_time) = gpu();
    let id = NcclAllReduce::new_id().unwrap();
    let nccl = std::sync::Arc::new(NcclAllReduce::join(&dev, 0, 1, &id).unwrap());
    for zero in [ZeroStage::Gradients, ZeroStage::Parameters] {
        let (mut plain, ids) = tiny_gpt2_trainer(&dev, DType::BF16, false);
        let (mut sharded, _) = tiny_gpt2_trainer(&dev, DType::BF16, false);
        sharded
            .set_data_parallel(DataParallel {
                rank: 0,
                size: 1,
                reduce: nccl.clone(),
                zero,
                overlap: false,
            })
            .unwrap();
        for step in 0..3 {
            let a = plain.step(std::slice::from_ref(&ids)).unwrap();
            let b = sharded.step(std::slice::from_ref(&ids)).unwrap();
            let why = format!("{zero:?} step {step}: {a:?} vs {b:?}");
            assert!((a.loss - b.loss).abs() < 2e-3 * a.loss, "{why}");
            assert!(
                (a.grad_norm - b.grad_norm).abs() < 2e-3 * a.grad_norm,
                "{why}"
            );
        }
        let (pa, pb) = (
            plain.named_params().unwrap(),
            sharded.named_params().unwrap(),
        );
        for ((name, a), (_, b)) in pa.iter().zip(&pb) {
            assert!(rel(b, a) < 1e-2, "{zero:?} {name}: {}", rel(b, a));
        }
    }
}
