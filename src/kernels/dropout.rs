//! Dropout keep-masks (`--fused dropout`; kernels in dropout.cu, the hash in dropout.cuh):
//! [`Keep`], a stored u8 mask or a key that the kernels hash into the mask (nothing stored, the
//! backward redraws it), and inverted dropout of a whole tensor with the hashed mask.
//!
//! Shapes: x, y, dy, dx (n,) flat, any shape outside; a u8 mask has the masked tensor's shape.

use super::{enabled, Fused};
use candle_core::{Device, Result, Shape, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// A dropout keep-mask: kept elements are scaled by 1/(1 − p), the rest zeroed.
#[derive(Clone, Debug)]
pub enum Keep {
    /// A u8 tensor (1 = kept) of the masked shape: candle's `rand` + `ge` (the CPU, and
    /// `--fused` without `dropout`).
    Mask(Tensor),
    /// Drawn inside the kernels from a hash of (key, element index); nothing is stored.
    Hash(u64),
}

static DROPOUT_SEED: AtomicU64 = AtomicU64::new(0);
static DROPOUT_DRAWS: AtomicU64 = AtomicU64::new(0);

/// Seeds the hashed dropout masks (the run's `--seed`): the same run draws the same masks.
pub fn set_dropout_seed(seed: u64) {
    DROPOUT_SEED.store(seed, Ordering::Relaxed);
    DROPOUT_DRAWS.store(0, Ordering::Relaxed);
}

/// splitmix64's finalizer: well-mixed keys from a seed and a draw counter.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

/// The next hash key: a new mask per draw, the same sequence for the same seed.
fn next_key() -> u64 {
    let draw = DROPOUT_DRAWS.fetch_add(1, Ordering::Relaxed);
    mix(DROPOUT_SEED.load(Ordering::Relaxed) ^ mix(draw.wrapping_add(1)))
}

/// A fresh keep-mask with drop probability `p` for a tensor of `shape`: hashed on CUDA when
/// `dropout` is fused, else a u8 tensor from `rand` + `ge`.
pub fn draw_keep(shape: &Shape, p: f32, dev: &Device) -> Result<Keep> {
    if enabled(Fused::Dropout) && dev.is_cuda() {
        return Ok(Keep::Hash(next_key()));
    }
    Ok(Keep::Mask(Tensor::rand(0f32, 1., shape, dev)?.ge(p)?))
}

/// The keep-mask as a u8 tensor of `shape` (1 = kept), for the composed ops.
pub fn keep_mask(keep: &Keep, p: f32, shape: &Shape, dev: &Device) -> Result<Tensor> {
    match keep {
        Keep::Mask(m) => Ok(m.clone()),
        Keep::Hash(key) => imp::hash_mask(*key, p, shape, dev),
    }
}

/// Inverted dropout with a hashed mask, differentiable (its backward redraws the mask):
/// one pass each way instead of rand, ge, mul and affine. `None` off CUDA or when `dropout`
/// is not fused.
pub fn dropout(x: &Tensor, p: f32) -> Result<Option<Tensor>> {
    if !enabled(Fused::Dropout) || !x.device().is_cuda() {
        return Ok(None);
    }
    imp::dropout(x, next_key(), p)
}

/// x ⊙ keep / (1 − p) with a mask already drawn ([`draw_keep`]): the forward of dropout, and
/// its backward (the same op on the gradient). Not differentiable. A hashed mask is one kernel
/// (CUDA); a stored one candle's multiply and scale, as `candle_nn::ops::dropout`.
pub fn apply_keep(x: &Tensor, keep: &Keep, p: f32) -> Result<Tensor> {
    match keep {
        Keep::Mask(m) => (x * m.to_dtype(x.dtype())?)?.affine(1. / (1. - p as f64), 0.),
        Keep::Hash(key) => match imp::dropout(&x.detach(), *key, p)? {
            Some(y) => Ok(y),
            None => candle_core::bail!("a hashed dropout mask on a {:?} tensor", x.dtype()),
        },
    }
}

/// The CPU draws stored masks only (`rand` + `ge`).
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Device, Result, Shape, Tensor};

    pub fn hash_mask(_: u64, _: f32, _: &Shape, _: &Device) -> Result<Tensor> {
        candle_core::bail!("hashed dropout masks are drawn on CUDA only")
    }
    pub fn dropout(_: &Tensor, _: u64, _: f32) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

/// `pub(super)`: attn_softmax.rs passes its keep-mask to the kernels as [`imp::KeepArgs`].
#[cfg(feature = "cuda")]
pub(super) mod imp {
    use super::Keep;
    use crate::kernels::launch::{
        alloc, flat_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{bail, CudaStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("dropout");

    /// Drop when an element's 16-bit uniform (dropout.cuh) is below p·2¹⁶ (at least 1 for
    /// p > 0).
    pub fn threshold(p: f32) -> u32 {
        ((p as f64 * 65536.).round() as u32).clamp(1, 65535)
    }

    /// The dropout arguments every kernel with a `Keep` takes (dropout.cuh's `Keep`): the u8
    /// mask (or null), the hash key and threshold (0: no hashed mask), and 1/(1 − p).
    #[derive(Clone, Copy, Default)]
    pub struct KeepArgs {
        pub key: u64,
        pub thresh: u32,
        pub scale: f32,
        /// Dropout applies (a mask tensor comes as the op's last input, or the hash).
        pub active: bool,
    }

    impl KeepArgs {
        pub fn new(keep: Option<(&Keep, f32)>) -> Self {
            match keep {
                None => Self {
                    scale: 1.,
                    ..Self::default()
                },
                Some((k, p)) => Self {
                    key: match k {
                        Keep::Hash(key) => *key,
                        Keep::Mask(_) => 0,
                    },
                    thresh: match k {
                        Keep::Hash(_) => threshold(p),
                        Keep::Mask(_) => 0,
                    },
                    scale: 1. / (1. - p),
                    active: true,
                },
            }
        }
    }

    /// y = x ⊙ keep(key) / (1 − p); the backward is the same op on the gradient.
    #[derive(Clone, Copy)]
    struct HashDropout {
        key: u64,
        thresh: u32,
        scale: f32,
    }

    impl CustomOp1 for HashDropout {
        fn name(&self) -> &'static str {
            "tb-dropout"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let n = xl.shape().elem_count();
            let func = kernel!(dev, PTX, "tb_dropout", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let xv = view::<T>(x, xl)?;
                let out = alloc::<T>(&dev, n)?;
                let n_i = n as i64;
                // SAFETY: x and out hold n elements.
                launch!(unsafe func, flat_config(n);
                    &xv, &out, &n_i, &self.key, &self.thresh, &self.scale)?;
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
        fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
            Ok(Some(dy.contiguous()?.apply_op1_no_bwd(self)?))
        }
    }

    pub fn dropout(x: &Tensor, key: u64, p: f32) -> Result<Option<Tensor>> {
        if !float_dtype(x) {
            return Ok(None);
        }
        let op = HashDropout {
            key,
            thresh: threshold(p),
            scale: 1. / (1. - p),
        };
        Ok(Some(x.contiguous()?.apply_op1(op)?))
    }

    pub fn hash_mask(key: u64, p: f32, shape: &Shape, dev: &Device) -> Result<Tensor> {
        let Device::Cuda(cuda) = dev else {
            bail!("hashed dropout masks are drawn on CUDA only");
        };
        let n = shape.elem_count();
        let func = kernel!(cuda, PTX, "tb_dropout_mask")?;
        let out = alloc::<u8>(cuda, n)?;
        let (n_i, thresh) = (n as i64, threshold(p));
        // SAFETY: out holds n elements.
        launch!(unsafe func, flat_config(n); &out, &n_i, &key, &thresh)?;
        let storage = candle_core::Storage::Cuda(CudaStorage::wrap_cuda_slice(out, cuda.clone()));
        Ok(Tensor::from_storage(
            storage,
            shape.clone(),
            candle_core::op::BackpropOp::none(),
            false,
        ))
    }
}
