//! The optimizer side of a step, as HF Trainer does it: AdamW with torch's update order
//! ([`AdamW`]), the learning rate from [`LinearSchedule`] (`get_linear_schedule_with_warmup`),
//! global-norm clipping (torch `clip_grad_norm_`) and fp16's dynamic loss scale
//! ([`GradScaler`], torch's defaults).

use crate::record::Hyper;
use candle_core::{DType, Result, Tensor, Var};

/// `get_linear_schedule_with_warmup`: lr(step) = base · step/warmup while step < warmup, then
/// base · max(0, (total − step) / max(1, total − warmup)). Optimizer step k (0-based) uses lr(k).
#[derive(Clone, Copy, Debug)]
pub struct LinearSchedule {
    pub base: f64,
    pub warmup: usize,
    pub total: usize,
}

impl LinearSchedule {
    pub fn lr(&self, step: usize) -> f64 {
        let factor = if step < self.warmup {
            step as f64 / self.warmup.max(1) as f64
        } else {
            let left = self.total.saturating_sub(step) as f64;
            (left / (self.total.saturating_sub(self.warmup)).max(1) as f64).max(0.)
        };
        self.base * factor
    }
}

/// torch.optim.AdamW (single-tensor path), in its operation order:
/// p ← p·(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2·v + (1−β2)·g²;
/// p ← p − lr/(1−β1ᵗ) · m / (√v / √(1−β2ᵗ) + ε).
pub struct AdamW {
    params: Vec<Var>,
    pub(crate) moments: Vec<Moments>,
    step: usize,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    /// The parameters in the compute dtype as the last update left them (CUDA's multi-tensor
    /// update writes them beside the f32 masters): the next step's weights. Dropped by the next
    /// update, before it writes new ones.
    copies: Option<Vec<Tensor>>,
}

/// A parameter's first and second moments (fp32): two tensors for candle's ops, or packed
/// (2, numel) for the fused kernel (CUDA).
pub(crate) enum Moments {
    Split { m: Tensor, v: Tensor },
    Packed(Tensor),
}

impl AdamW {
    pub fn new(params: Vec<Var>, h: &Hyper) -> Result<Self> {
        let zeros = |p: &Var| -> Result<Moments> {
            Ok(Moments::Split {
                m: p.zeros_like()?,
                v: p.zeros_like()?,
            })
        };
        Ok(Self {
            moments: params.iter().map(zeros).collect::<Result<_>>()?,
            params,
            step: 0,
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            weight_decay: h.weight_decay,
            copies: None,
        })
    }

    /// The compute-dtype copies of the parameters that the last update wrote, where it wrote
    /// them: equal to the parameters cast to that dtype, as long as only this optimizer
    /// changes them (the caller asks for copies only where that holds).
    pub fn copies(&self) -> Option<&[Tensor]> {
        self.copies.as_deref()
    }

    /// The hyper-parameters of update number `t` (1-based).
    fn hyper(&self, t: usize, lr: f64, grad_scale: f64) -> crate::kernels::AdamStep {
        let t = t as i32;
        crate::kernels::AdamStep {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            bc1: 1. - self.beta1.powi(t),
            bc2_sqrt: (1. - self.beta2.powi(t)).sqrt(),
            grad_scale,
        }
    }

    /// One update with learning rate `lr` and gradients `grads[i]` times `clip`'s factor. On
    /// CUDA every parameter in a few launches, the factor read on the device (no sync), and
    /// with `copies` (bf16 / f16) each updated parameter also written in that dtype for
    /// [`AdamW::copies`]; elsewhere [`AdamW::step`] with the factor read back.
    pub fn step_clipped(
        &mut self,
        grads: &[Tensor],
        lr: f64,
        clip: &Clip,
        copies: Option<DType>,
    ) -> Result<()> {
        if let Clip::Device(factor) = clip {
            if self.step_multi(grads, lr, factor, copies)? {
                return Ok(());
            }
        }
        self.step(grads, lr, clip.factor()?)
    }

    /// The multi-tensor kernel's update (writing the compute copies where asked and the
    /// kernel applies); false where it does not apply.
    fn step_multi(
        &mut self,
        grads: &[Tensor],
        lr: f64,
        clip: &Tensor,
        copies: Option<DType>,
    ) -> Result<bool> {
        self.copies = None;
        if !clip.device().is_cuda() || self.params.is_empty() {
            return Ok(false);
        }
        // The moments packed once, (2, n) f32 each, then updated in place step after step.
        for (i, p) in self.params.iter().enumerate() {
            if let Moments::Split { m, v } = &self.moments[i] {
                let mv = Tensor::stack(&[m.flatten_all()?, v.flatten_all()?], 0)?;
                self.moments[i] = Moments::Packed(mv.reshape((2, p.elem_count()))?);
            }
        }
        let moments: Vec<Tensor> = self
            .moments
            .iter()
            .map(|m| match m {
                Moments::Packed(mv) => mv.clone(),
                Moments::Split { .. } => unreachable!("packed above"),
            })
            .collect();
        let params: Vec<Tensor> = self.params.iter().map(|p| p.as_detached_tensor()).collect();
        let h = self.hyper(self.step + 1, lr, 1.);
        if let Some(dtype) = copies {
            let written =
                crate::kernels::adamw_multi_copies(&params, grads, &moments, &h, clip, dtype)?;
            if written.is_some() {
                (self.copies, self.step) = (written, self.step + 1);
                return Ok(true);
            }
        }
        let applied = crate::kernels::adamw_multi(&params, grads, &moments, &h, clip)?;
        if applied {
            self.step += 1;
        }
        Ok(applied)
    }

    /// One update with learning rate `lr` and gradients `grads[i] · grad_scale` (`grads[i]`
    /// belongs to `params[i]`, fp32; `grad_scale`: the clip coefficient over the loss scale).
    pub fn step(&mut self, grads: &[Tensor], lr: f64, grad_scale: f64) -> Result<()> {
        self.copies = None;
        self.step += 1;
        let h = self.hyper(self.step, lr, grad_scale);
        for (i, g) in grads.iter().enumerate() {
            let param = self.params[i].as_tensor();
            if param.device().is_cuda() {
                let packed = match &self.moments[i] {
                    Moments::Packed(mv) => mv.clone(),
                    Moments::Split { m, v } => {
                        Tensor::stack(&[m.flatten_all()?, v.flatten_all()?], 0)?
                    }
                };
                if let Some(mv) = crate::kernels::adamw(param, g, &packed, &h)? {
                    self.moments[i] = Moments::Packed(mv);
                    continue;
                }
            }
            let (m, v) = match &self.moments[i] {
                Moments::Split { m, v } => (m.clone(), v.clone()),
                Moments::Packed(mv) => (
                    mv.get(0)?.reshape(g.shape())?,
                    mv.get(1)?.reshape(g.shape())?,
                ),
            };
            let g = &g.to_dtype(DType::F32)?; // a no-op for the f32 gradients it usually gets
            let g = &match grad_scale {
                1. => g.clone(),
                k => (g * k)?,
            };
            let mut p = self.params[i].as_detached_tensor();
            if self.weight_decay != 0. {
                p = p.affine(1. - lr * self.weight_decay, 0.)?;
            }
            let m = (&m + ((g - &m)? * (1. - self.beta1))?)?;
            let v = ((&v * self.beta2)? + (g.sqr()? * (1. - self.beta2))?)?;
            let denom = ((v.sqrt()? / h.bc2_sqrt)? + self.eps)?;
            let p = (p - ((&m / &denom)? * (lr / h.bc1))?)?;
            self.params[i].set(&p)?;
            self.moments[i] = Moments::Split { m, v };
        }
        Ok(())
    }
}

/// The global L2 norm of `grads`, torch `clip_grad_norm_`'s total = ‖(‖g_i‖₂)_i‖₂. On CUDA one
/// sum-of-squares kernel per tensor; one sync for all of them.
pub fn global_grad_norm(grads: &[Tensor]) -> Result<f64> {
    Ok(sum_squares(grads)?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?
        .sqrt())
}

/// Σ over `grads` of their squared values, (1,) f32 on their device (nothing read back).
pub fn sum_squares(grads: &[Tensor]) -> Result<Tensor> {
    let mut sq = Vec::with_capacity(grads.len());
    for g in grads {
        sq.push(match crate::kernels::sum_squares(g)? {
            Some(s) => s,                                                  // (1,) f32
            None => g.to_dtype(DType::F32)?.sqr()?.sum_all()?.reshape(1)?, // (1,)
        });
    }
    Tensor::cat(&sq, 0)?.sum_all()?.reshape(1)
}

/// torch `clip_grad_norm_`'s factor for every gradient: min(1, max_norm / (norm + 1e-6)); 1
/// when max_norm ≤ 0 (HF Trainer then does not clip).
pub fn clip_coefficient(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0. {
        return 1.;
    }
    (max_norm / (norm + 1e-6)).min(1.)
}

/// A step's gradient norm (unscaled) and the factor every gradient is multiplied by (the clip
/// coefficient over the loss scale).
pub enum Clip {
    /// Computed on the host (CPU, or `--fused` without adamw).
    Host { norm: f64, factor: f64 },
    /// (2,) f32 = (norm, factor) left on the device: the update reads it there, the host only
    /// at the end of the step.
    Device(Tensor),
}

impl Clip {
    /// torch `clip_grad_norm_(max_norm)` over `grads` divided by `loss_scale` (unscaling).
    pub fn of(grads: &[Tensor], loss_scale: f64, max_norm: f64) -> Result<Self> {
        if let Some(t) = crate::kernels::grad_norm_clip(grads, loss_scale, max_norm)? {
            return Ok(Clip::Device(t));
        }
        let norm = global_grad_norm(grads)? / loss_scale;
        let factor = clip_coefficient(norm, max_norm) / loss_scale;
        Ok(Clip::Host { norm, factor })
    }

    /// The norm and the factor (a device sync for `Device`).
    pub fn read(&self) -> Result<(f64, f64)> {
        match self {
            Clip::Host { norm, factor } => Ok((*norm, *factor)),
            Clip::Device(t) => {
                let v = t.to_vec1::<f32>()?;
                Ok((v[0] as f64, v[1] as f64))
            }
        }
    }

    pub fn factor(&self) -> Result<f64> {
        Ok(self.read()?.1)
    }
}

/// torch.amp.GradScaler with its defaults: scale 2¹⁶, ×2 after 2000 finite steps, ×0.5 and
/// the step skipped when a gradient is inf/NaN.
#[derive(Clone, Debug)]
pub struct GradScaler {
    pub scale: f64,
    good_steps: usize,
}

impl Default for GradScaler {
    fn default() -> Self {
        Self {
            scale: 65536.,
            good_steps: 0,
        }
    }
}

impl GradScaler {
    /// Records whether the step's gradients were finite; returns whether to apply the step.
    pub fn update(&mut self, finite: bool) -> bool {
        if finite {
            self.good_steps += 1;
            if self.good_steps == 2000 {
                self.scale *= 2.;
                self.good_steps = 0;
            }
        } else {
            self.scale *= 0.5;
            self.good_steps = 0;
        }
        finite
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// fp32 weights are the Vars themselves, so their raw gradients carry the forward graph;
    /// if the optimizer state kept it, every step's activations would stay alive.
    #[test]
    fn linear_schedule_matches_hf() {
        let s = LinearSchedule {
            base: 1.0,
            warmup: 2,
            total: 6,
        };
        let lrs: Vec<f64> = (0..7).map(|k| s.lr(k)).collect();
        assert_eq!(lrs, vec![0., 0.5, 1., 0.75, 0.5, 0.25, 0.]);
        let s = LinearSchedule {
            base: 5e-5,
            warmup: 0,
            total: 4,
        };
        assert_eq!(s.lr(0), 5e-5);
        assert_eq!(s.lr(3), 5e-5 * 0.25);
    }

    #[test]
    fn grad_clipping_scales_to_max_norm() {
        let g = vec![
            Tensor::new(&[3f32, 0.], &Device::Cpu).unwrap(),
            Tensor::new(&[4f32], &Device::Cpu).unwrap(),
        ];
        let norm = global_grad_norm(&g).unwrap();
        assert!((norm - 5.).abs() < 1e-9);
        assert!((clip_coefficient(norm, 1.0) - 0.2).abs() < 1e-6);
        assert_eq!(clip_coefficient(0.5, 1.0), 1.);
        assert_eq!(clip_coefficient(100., 0.), 1., "max_norm 0: no clipping");
        let clip = Clip::of(&g, 4., 0.25).unwrap();
        let (norm, factor) = clip.read().unwrap();
        assert!((norm - 1.25).abs() < 1e-9, "unscaled norm {norm}");
        assert!(
            (factor - 0.2 / 4.).abs() < 1e-6,
            "clip over the loss scale {factor}"
        );
    }

    /// The clip factor given to the optimizer acts as scaling the gradients first.
    #[test]
    fn adamw_grad_scale_equals_scaled_gradients() {
        let init = Tensor::new(&[0.5f32, -1., 2.], &Device::Cpu).unwrap();
        let g = Tensor::new(&[3f32, -4., 0.25], &Device::Cpu).unwrap();
        let h = Hyper {
            weight_decay: 0.01,
            ..Hyper::default()
        };
        let mut out = Vec::new();
        for (grad, k) in [((&g * 0.2).unwrap(), 1.), (g.clone(), 0.2)] {
            let p = Var::from_tensor(&init).unwrap();
            let mut opt = AdamW::new(vec![p.clone()], &h).unwrap();
            for _ in 0..3 {
                opt.step(std::slice::from_ref(&grad), 1e-2, k).unwrap();
            }
            out.push(p.as_tensor().to_vec1::<f32>().unwrap());
        }
        for (a, b) in out[0].iter().zip(&out[1]) {
            assert!((a - b).abs() < 1e-6, "{:?} vs {:?}", out[0], out[1]);
        }
    }

    #[test]
    fn grad_scaler_backs_off_and_skips() {
        let mut s = GradScaler::default();
        assert!(!s.update(false));
        assert_eq!(s.scale, 32768.);
        assert!(s.update(true));
    }
}
