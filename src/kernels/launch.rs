//! The plumbing every CUDA launcher of [`super`] shares (CUDA builds only): a family's PTX
//! (`ptx!`, built from its `.cu` by build.rs), its kernels by dtype (`kernel!`), the dtype
//! dispatch (`with_dtype!`), the argument push and launch (`launch!`), the `cpu_fwd` every
//! custom op must have (`no_cpu_fwd!`), launch shapes, views and allocation.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DevicePtr, DeviceRepr, LaunchConfig,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{
    bail, CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, StorageRef, Tensor,
};

/// One kernel family's PTX, loaded once per device as its own module.
pub struct Ptx {
    pub module: &'static str,
    pub text: &'static str,
}

/// The PTX build.rs compiled from `src/kernels/$family.cu`, as module `tb_$family`.
macro_rules! ptx {
    ($family:literal) => {
        $crate::kernels::launch::Ptx {
            module: concat!("tb_", $family),
            text: include_str!(concat!(env!("OUT_DIR"), "/", $family, ".ptx")),
        }
    };
}
pub(crate) use ptx;

/// The kernel `$name` of `$ptx` on device `$dev`; with `$dtype`, `$name` + `_f32|_bf16|_f16`.
/// (A macro: candle's `CudaFunc` has no public name to return.)
macro_rules! kernel {
    ($dev:expr, $ptx:expr, $name:literal) => {
        $dev.get_or_load_custom_func($name, $ptx.module, $ptx.text)
    };
    ($dev:expr, $ptx:expr, $name:literal, $dtype:expr) => {
        $dev.get_or_load_custom_func(
            &format!(
                concat!($name, "_{}"),
                $crate::kernels::launch::suffix($dtype)?
            ),
            $ptx.module,
            $ptx.text,
        )
    };
}
pub(crate) use kernel;

/// Pushes the `$arg`s (references, in the kernel's parameter order) and launches `$func` on
/// `$cfg`. The leading `unsafe` marks the call site, whose SAFETY comment says why every
/// buffer holds what the kernel indexes.
macro_rules! launch {
    (unsafe $func:expr, $cfg:expr; $($arg:expr),+ $(,)?) => {{
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg as _;
        use candle_core::cuda_backend::WrapErr as _;
        let cfg: candle_core::cuda_backend::cudarc::driver::LaunchConfig = $cfg;
        let mut args = $func.builder();
        $(args.arg($arg);)+
        // SAFETY: the caller's: the arguments match the kernel's parameters, and the buffers
        // hold every element the kernel reads or writes for `cfg`.
        unsafe { args.launch(cfg) }.w()
    }};
}
pub(crate) use launch;

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            candle_core::DType::F16 => {
                type $t = half::f16;
                $body
            }
            d => candle_core::bail!("fused kernels take f32, bf16 or f16, not {d:?}"),
        }
    };
}
pub(crate) use with_dtype;

/// The `cpu_fwd` every custom op here must have: an error (callers never reach it on CPU).
macro_rules! no_cpu_fwd {
    (CustomOp1) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            $crate::kernels::launch::cpu_only(candle_core::CustomOp1::name(self))
        }
    };
    (CustomOp2) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            $crate::kernels::launch::cpu_only(candle_core::CustomOp2::name(self))
        }
    };
    (CustomOp3) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            $crate::kernels::launch::cpu_only(candle_core::CustomOp3::name(self))
        }
    };
    (InplaceOp2) => {
        fn cpu_fwd(
            &self,
            _: &mut candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<()> {
            $crate::kernels::launch::cpu_only(candle_core::InplaceOp2::name(self))
        }
    };
    (InplaceOp3) => {
        fn cpu_fwd(
            &self,
            _: &mut candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<()> {
            $crate::kernels::launch::cpu_only(candle_core::InplaceOp3::name(self))
        }
    };
}
pub(crate) use no_cpu_fwd;

pub fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        d => bail!("fused kernels take f32, bf16 or f16, not {d:?}"),
    })
}

pub fn float_dtype(t: &Tensor) -> bool {
    matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
}

/// The view of a contiguous storage from its layout's offset.
pub fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    if !l.is_contiguous() {
        bail!("fused kernel input is not contiguous");
    }
    Ok(T::as_cuda_slice(s)?.slice(l.start_offset()..))
}

pub fn cpu_only<T>(name: &str) -> Result<T> {
    bail!("{name} is a CUDA kernel; the CPU runs candle's composed ops")
}

/// One block per row, enough threads to cover `cols` (at most 256: the rest loop).
pub fn row_config(rows: usize, cols: usize) -> LaunchConfig {
    let threads = cols.next_power_of_two().clamp(32, 256) as u32;
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// 256 columns per block along x, rows along y (grid-strided past 65535).
pub fn column_config(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(256) as u32, rows.clamp(1, 65535) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Grid-stride elementwise launch over `n` elements.
pub fn flat_config(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub fn alloc<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written by the kernel that follows.
    unsafe { dev.alloc::<T>(n) }
}

/// Whether a tensor is contiguous from a 16-byte boundary (the vector kernels' loads).
pub fn aligned16(t: &Tensor) -> bool {
    let size = t.dtype().size_in_bytes();
    t.is_contiguous() && (t.layout().start_offset() * size).is_multiple_of(16)
}

/// A tensor's CUDA storage, read-locked while the guard lives; None on another device (for
/// launchers that take tensors rather than a custom op's storages).
pub fn cuda(t: &Tensor) -> Option<(StorageRef<'_>, &Layout)> {
    let (s, l) = t.storage_and_layout();
    matches!(&*s, Storage::Cuda(_)).then_some((s, l))
}

/// The CUDA storage behind a guard of [`cuda`].
pub fn storage<'a>(s: &'a StorageRef<'_>) -> &'a CudaStorage {
    match &**s {
        Storage::Cuda(c) => c,
        _ => unreachable!("checked by cuda()"),
    }
}

/// A new tensor over `slice`, shape `shape`, outside autograd.
pub fn wrap<T: CudaDType>(
    slice: CudaSlice<T>,
    dev: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let s = Storage::Cuda(T::wrap_cuda_slice(slice, dev.clone()));
    Tensor::from_storage(s, shape, BackpropOp::none(), false)
}

/// A null device pointer for an absent optional argument.
pub const NULL: u64 = 0;

/// The device address of a contiguous CUDA tensor's first element (a float or u32 tensor), for
/// kernels that take a tensor beside a custom op's inputs (or a table of them).
pub fn device_address(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        bail!("fused kernels take CUDA tensors")
    };
    if !layout.is_contiguous() {
        bail!("fused kernels take contiguous tensors");
    }
    let stream = s.device().cuda_stream();
    let base = match s.dtype() {
        DType::U32 => u32::as_cuda_slice(s)?.device_ptr(&stream).0,
        DType::F64 => f64::as_cuda_slice(s)?.device_ptr(&stream).0, // norm-stats' slots
        dtype => with_dtype!(dtype, T => {
            let (ptr, _record) = T::as_cuda_slice(s)?.device_ptr(&stream);
            ptr
        }),
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}
