//! CUDA graphs (`--fused graph`): a decode step's ≈ 100 launches recorded once and replayed
//! as one, so that the host's cost per launch (≈ 15 µs through candle, measured: docs/
//! perf-notes.md) is paid once a step instead of a hundred times.
//!
//! What a captured closure may do: launch kernels and cuBLAS calls on the device's stream,
//! allocate and free through candle (stream-ordered: graph memory nodes). Every tensor it
//! allocates must be dropped before it returns (else the graph could not be replayed), it
//! must not free a tensor made before the capture, copy to or from the host, or synchronise;
//! every kernel it launches must have run once before (module loading is not captured).

use super::{enabled, Fused};
use candle_core::{Device, Result};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Graph replays in this process (the log and the tests tell a replayed decode from an eager
/// one by it).
static REPLAYS: AtomicUsize = AtomicUsize::new(0);

/// How many times a graph was replayed in this process.
pub fn replays() -> usize {
    REPLAYS.load(Ordering::Relaxed)
}

/// Programmatic edges in the graph captured last (`--fused pdl`; the GPU tests read it).
static PROGRAMMATIC: AtomicUsize = AtomicUsize::new(0);

/// How many edges of the last captured graph are programmatic.
pub fn programmatic_edges() -> usize {
    PROGRAMMATIC.load(Ordering::Relaxed)
}

/// While alive (on a CUDA device), candle keeps the layout parameters its kernels upload
/// from the host (dims and strides: every `index_select`, every strided op) in persistent
/// device buffers, keyed by value. A capture must run under it, after an eager run of the same
/// shapes under it: a graph would otherwise replay copies from host memory long freed.
pub struct ParamCache(#[allow(dead_code)] Option<Box<dyn std::any::Any>>);

/// [`ParamCache`] for `device` (nothing on the CPU).
pub fn param_cache(device: &Device) -> ParamCache {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => ParamCache(Some(Box::new(d.enable_cuda_graph_htod_cache()))),
        _ => ParamCache(None),
    }
}

/// A recorded sequence of launches, replayed on the stream it was captured on.
pub struct Graph {
    #[cfg(feature = "cuda")]
    inner: candle_core::cuda_backend::cudarc::driver::CudaGraph,
}

impl Graph {
    /// Replays the launches (asynchronously, as the launches themselves).
    pub fn launch(&self) -> Result<()> {
        REPLAYS.fetch_add(1, Ordering::Relaxed);
        imp::launch(self)
    }
}

/// Records what `f` launches on `device`'s stream, without running it. None on the CPU or
/// with the graph path switched off; an error when `f` fails or did what a capture cannot
/// hold (the stream is usable again either way).
pub fn capture(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<Option<Graph>> {
    if !enabled(Fused::Graph) || !device.is_cuda() {
        return Ok(None);
    }
    imp::capture(device, f)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Graph;
    use candle_core::{Device, Result};

    pub fn launch(_: &Graph) -> Result<()> {
        Ok(())
    }

    pub fn capture(_: &Device, _: impl FnOnce() -> Result<()>) -> Result<Option<Graph>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Graph;
    use crate::kernels::pdl;
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUgraphInstantiate_flags, CUstreamCaptureMode,
    };
    use candle_core::cuda_backend::WrapErr as _;
    use candle_core::{Device, Result};

    pub fn launch(g: &Graph) -> Result<()> {
        g.inner.launch().w()
    }

    pub fn capture(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<Option<Graph>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let stream = dev.cuda_stream();
        // Thread-local: only this thread's unsafe calls would invalidate the capture (the
        // GPU watch thread reads NVML, which is not CUDA).
        super::PROGRAMMATIC.store(0, super::Ordering::Relaxed);
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .w()?;
        let recorded = pdl::during_capture(f);
        // Ended whatever f did, so that the stream leaves capture mode.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        recorded??;
        let graph = graph.w()?.map(|inner| Graph { inner });
        if let Some(g) = &graph {
            let made = pdl::programmatic_edges(g.inner.cu_graph())?;
            super::PROGRAMMATIC.store(made, super::Ordering::Relaxed);
        }
        Ok(graph)
    }
}
