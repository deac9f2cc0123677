//! A profiler window around one forward (LAMBADA batch) or one optimizer step, for
//! `ncu --profile-from-start off`: with `TB_CUDA_PROFILE=N` in the environment, the N-th call
//! of this process (counting from 0, warm-up included) runs between `cuProfilerStart` and
//! `cuProfilerStop`, so the profiler sees exactly that call's kernels. Unset: nothing happens.
//! The HF worker reads the same variable (src/engines/hf/worker.py), so both engines are profiled
//! at the same call.

use candle_core::Device;
use std::sync::atomic::{AtomicUsize, Ordering};

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// The profiled call, from `TB_CUDA_PROFILE`.
fn target() -> Option<usize> {
    std::env::var("TB_CUDA_PROFILE").ok()?.trim().parse().ok()
}

/// Open while the profiled call runs; stops the profiler when dropped.
pub struct Window<'a> {
    device: Option<&'a Device>,
}

/// Counts a call; starts the profiler when it is the `TB_CUDA_PROFILE`-th.
pub fn window(device: &Device) -> Window<'_> {
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let on = device.is_cuda() && target() == Some(call);
    if on {
        // Earlier calls' kernels must not leak into the window.
        let _ = device.synchronize();
        set_profiler(device, true);
    }
    Window {
        device: on.then_some(device),
    }
}

impl Drop for Window<'_> {
    fn drop(&mut self) {
        if let Some(device) = self.device {
            let _ = device.synchronize();
            set_profiler(device, false);
        }
    }
}

#[cfg(feature = "cuda")]
fn set_profiler(device: &Device, on: bool) {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let Device::Cuda(d) = device else { return };
    let _ = d.cuda_stream().context().bind_to_thread();
    // SAFETY: plain driver calls on the current context; failures only lose the profile.
    let r = unsafe {
        if on {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        eprintln!(
            "warning: cuProfiler{} failed: {r:?}",
            if on { "Start" } else { "Stop" }
        );
    }
}

#[cfg(not(feature = "cuda"))]
fn set_profiler(_device: &Device, _on: bool) {}
