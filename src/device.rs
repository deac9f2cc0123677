//! Where a model runs (`--device`) and in what precision (`--dtype`).

use crate::error::{Error, Result};
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A precision as users name it. `tf32` stores fp32 but lets cuBLAS use TF32 tensor cores
/// for matmuls (torch's `allow_tf32`); on CPU it computes exactly like fp32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    /// fp8 (E4M3) weights of the projections and the LM head with a scale per output row,
    /// activations and sums in bf16 (candle engine, inference).
    Fp8,
}

impl Precision {
    /// The dtype weights and activations are stored in.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Fp32 | Precision::Tf32 => DType::F32,
            Precision::Fp16 => DType::F16,
            Precision::Bf16 | Precision::Fp8 => DType::BF16,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }

    /// Sets the process-wide matmul mode this precision needs (TF32 on or off).
    pub fn apply_matmul_mode(self, device: &Device) {
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            candle_core::cuda::set_gemm_reduced_precision_f32(self == Precision::Tf32);
        }
        let _ = device;
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("invalid device '{s}': use cpu, cuda or cuda:N")),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// Opens the device. A CUDA request in a build without the `cuda` feature names the fix.
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => open_cuda(n),
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device> {
    let device = Device::new_cuda(ordinal).map_err(|e| {
        Error::Unsupported(format!(
            "cannot open CUDA device {ordinal} ({e}): check that a GPU is visible (nvidia-smi) and that the driver supports CUDA 13"
        ))
    })?;
    if let Device::Cuda(cuda) = &device {
        keep_freed_memory(cuda)?;
    }
    Ok(device)
}

/// The memory pool every candle allocation comes from (cuMemAllocAsync): the device's current
/// pool.
#[cfg(feature = "cuda")]
pub fn mem_pool(
    d: &candle_core::cuda_backend::CudaDevice,
) -> Result<candle_core::cuda::cudarc::driver::sys::CUmemoryPool> {
    use candle_core::cuda::cudarc::driver::result;
    let stream = d.cuda_stream();
    let ctx = stream.context();
    ctx.bind_to_thread().map_err(cuda_err)?;
    // SAFETY: cu_device comes from a live context; the pool is owned by the driver.
    unsafe { result::device::get_mem_pool(ctx.cu_device()) }.map_err(cuda_err)
}

#[cfg(feature = "cuda")]
pub fn cuda_err(e: candle_core::cuda::cudarc::driver::result::DriverError) -> Error {
    Error::Unsupported(format!("CUDA memory pool call failed: {e:?}"))
}

/// Hands the memory this process's CUDA pool keeps (see [`keep_freed_memory`]) back to the
/// driver, so that another process on the GPU (HF's worker, after candle's run with `--engine
/// both`) finds it free. Does nothing when this process never opened the GPU (opening it here
/// would take a context's memory instead) and on CPU builds.
pub fn release_pool_memory(spec: DeviceSpec) -> Result<()> {
    match spec {
        DeviceSpec::Cpu => Ok(()),
        DeviceSpec::Cuda(n) => release_cuda_pool(n),
    }
}

#[cfg(feature = "cuda")]
fn release_cuda_pool(ordinal: usize) -> Result<()> {
    use candle_core::cuda::cudarc::driver::{result, sys};
    result::init().map_err(cuda_err)?;
    let dev = result::device::get(ordinal as i32).map_err(cuda_err)?;
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: `dev` is a valid device; both outputs outlive the call.
    unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
        .result()
        .map_err(cuda_err)?;
    if active == 0 {
        return Ok(());
    }
    // SAFETY: the device's pool lives as long as its context, which is active; trimming only
    // releases memory no allocation holds.
    unsafe {
        let pool = result::device::get_mem_pool(dev).map_err(cuda_err)?;
        result::mem_pool::trim_to(pool, 0).map_err(cuda_err)
    }
}

#[cfg(not(feature = "cuda"))]
fn release_cuda_pool(_: usize) -> Result<()> {
    Ok(())
}

/// Memory freed into the pool stays there (release threshold: no limit) instead of going back
/// to the driver at every synchronisation, the pool's default. With the default, a training
/// step's activations were unmapped at the step's end and mapped again by the next step's
/// allocations, on the host, while the GPU waited (torch's caching allocator keeps them too).
/// Peak memory is read from the pool's used-bytes mark, which this does not change.
#[cfg(feature = "cuda")]
pub fn keep_freed_memory(d: &candle_core::cuda_backend::CudaDevice) -> Result<()> {
    use candle_core::cuda::cudarc::driver::{result, sys};
    let pool = mem_pool(d)?;
    let mut no_limit = u64::MAX;
    let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    // SAFETY: the release threshold is a cuuint64_t, read from `no_limit`, which outlives the
    // call.
    unsafe { result::mem_pool::set_attribute(pool, attr, &mut no_limit as *mut u64 as *mut _) }
        .map_err(cuda_err)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Device> {
    Err(Error::Unsupported(
        "this binary was built without CUDA: rebuild with `cargo build --release --features cuda` (see docs/environment.md, CUDA build)".into(),
    ))
}

/// Blocks until the device has finished all queued work, so a host clock read after it
/// measures the work (CUDA launches are asynchronous).
pub fn synchronize(device: &Device) -> Result<()> {
    Ok(device.synchronize()?)
}

/// The GPU's UUID as NVML writes it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), for CUDA
/// devices: NVML numbers GPUs differently from CUDA, the UUID ties them.
#[cfg(feature = "cuda")]
pub fn cuda_uuid(device: &Device) -> Option<String> {
    let Device::Cuda(d) = device else {
        return None;
    };
    let u = d.cuda_stream().context().uuid().ok()?;
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    Some(format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    ))
}

/// Without CUDA there is no CUDA device to name.
#[cfg(not(feature = "cuda"))]
pub fn cuda_uuid(_device: &Device) -> Option<String> {
    None
}

/// What `--device auto` and `--dtype auto` chose, and why (printed with the summary and kept
/// in the log header).
#[derive(Clone, Debug, PartialEq)]
pub struct AutoChoice {
    pub device: DeviceSpec,
    /// bf16 where the GPU has it (compute capability 8.0 and up), else fp32.
    pub precision: Precision,
    /// One line: what was chosen and why.
    pub why: String,
}

/// The GPUs this process may use as NVML sees them (no CUDA context is created): the compute
/// capability's major of each, or why none could be listed. `CUDA_VISIBLE_DEVICES=""` hides
/// them all.
pub fn visible_gpus() -> std::result::Result<Vec<u32>, String> {
    if std::env::var("CUDA_VISIBLE_DEVICES").is_ok_and(|v| v.trim().is_empty()) {
        return Ok(vec![]);
    }
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?;
    let n = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    (0..n)
        .map(|i| {
            let d = nvml.device_by_index(i).map_err(|e| format!("NVML: {e}"))?;
            Ok(d.cuda_compute_capability()
                .map(|c| c.major as u32)
                .unwrap_or(0))
        })
        .collect()
}

/// `--device auto` / `--dtype auto`: the first GPU when this build has CUDA and a GPU is
/// there (bf16 when it has it), else the CPU in fp32, with the reason.
pub fn choose_auto(cuda_built: bool, gpus: std::result::Result<Vec<u32>, String>) -> AutoChoice {
    let cpu = |why: String| AutoChoice {
        device: DeviceSpec::Cpu,
        precision: Precision::Fp32,
        why,
    };
    if !cuda_built {
        return cpu(
            "auto: cpu, fp32 (this build has no CUDA: build with --features cuda for GPUs)".into(),
        );
    }
    match gpus {
        Ok(g) if !g.is_empty() => {
            let bf16 = g[0] >= 8;
            let precision = if bf16 { Precision::Bf16 } else { Precision::Fp32 };
            AutoChoice {
                device: DeviceSpec::Cuda(0),
                precision,
                why: format!("auto: cuda:0, {precision} (first of {} visible GPUs)", g.len()),
            }
        }
        Ok(_) => cpu("auto: cpu, fp32 (no GPU found: nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them)".into()),
        Err(e) => cpu(format!("auto: cpu, fp32 (no GPU found: {e})")),
    }
}

#[cfg(test)]
mod auto_tests {
    use super::*;

    #[test]
    fn auto_takes_the_first_gpu_in_bf16_where_it_can() {
        let hopper = choose_auto(true, Ok(vec![9, 9]));
        assert_eq!(
            (hopper.device, hopper.precision),
            (DeviceSpec::Cuda(0), Precision::Bf16)
        );
        let turing = choose_auto(true, Ok(vec![7]));
        assert_eq!(
            (turing.device, turing.precision),
            (DeviceSpec::Cuda(0), Precision::Fp32)
        );
    }

    #[test]
    fn auto_falls_back_to_the_cpu_and_says_why() {
        let no_cuda = choose_auto(false, Ok(vec![9]));
        assert_eq!(
            (no_cuda.device, no_cuda.precision),
            (DeviceSpec::Cpu, Precision::Fp32)
        );
        assert!(no_cuda.why.contains("--features cuda"), "{}", no_cuda.why);
        let none = choose_auto(true, Ok(vec![]));
        assert!(none.why.contains("no GPU found"), "{}", none.why);
        let nvml = choose_auto(true, Err("NVML: library not found".into()));
        assert!(nvml.why.contains("library not found"), "{}", nvml.why);
    }
}
