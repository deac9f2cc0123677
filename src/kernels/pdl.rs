//! Programmatic dependent launch inside the decode graphs (`--fused pdl`, Hopper): the edge
//! of a captured graph into a decode kernel from the operation before it becomes
//! programmatic, so that the kernel's blocks are launched while that kernel runs and wait on
//! the device (`pdl_begin` in common.cuh) instead of being launched once it has finished.
//!
//! In a capture of one stream every node follows the one before it, and candle's
//! stream-ordered allocations and frees are graph memory nodes: each output's allocation sits
//! between its kernel and the kernel before. A programmatic edge goes from a kernel node only,
//! and with an allocation and a free around every launch the launch attribute changed nothing
//! (scripts/probes/pdl_probe.cu; docs/perf-notes.md, "Programmatic dependent launch inside the
//! graph"); the driver refuses to remove a dependency from a graph that holds memory nodes, so
//! the edges cannot be redrawn after the capture. [`Early`] draws them during it instead, around
//! a decode kernel's launch: its output allocations become roots of the graph (an allocation
//! that follows nothing reuses no memory freed in the graph, so nothing it gets is still in
//! use), and the kernel then follows them and, programmatically, the last operation before
//! them, found by walking back past memory nodes. A free that sat between the two is left
//! after the operation that used the memory last, with nothing after it.

/// The kernels whose launchers go through `Early` (name prefixes, all dtypes): each calls
/// `pdl_begin` or `pdl_begin_trigger_first` (the `_tf` variants) first (a GPU test reads their
/// PTX).
#[cfg(test)]
pub const WAITS_FIRST: &[&str] = &[
    "tb_gemv1_",
    "tb_gemv2_",
    "tb_gemv3_",
    "tb_gemv4_",
    "tb_gemv_ln",
    "tb_gemv_fp8_",
    "tb_skinny",
    "tb_argmax",
    "tb_add_layer_norm_",
    "tb_layer_norm_fwd",
    "tb_decode_attention",
    "tb_decode_combine_",
    "tb_decode_begin",
    "tb_embed_rows",
];

/// Whether the kernel `name` is one that waits for the kernel before it first (not the
/// cache-first attention kernels, whose family prefix the list holds).
#[cfg(test)]
pub fn waits_first(name: &str) -> bool {
    WAITS_FIRST.iter().any(|p| name.starts_with(p)) && !cache_first(name)
}

/// The kernels launched through `Early` that read their weights (kernel parameter 1) before
/// the wait, and nothing else (`--fused early-weights`, `gemv-wide`; a GPU test reads their
/// PTX).
#[cfg(test)]
pub const WEIGHTS_FIRST: &[&str] = &["tb_early_gemv_fp8_", "tb_wgemv"];

/// Whether the kernel `name` is one that loads its weights before the wait.
#[cfg(test)]
pub fn weights_first(name: &str) -> bool {
    WEIGHTS_FIRST.iter().any(|p| name.starts_with(p))
}

/// The decode attention kernels that read the cursor, their cached keys and values, the mask
/// and the key positions before the wait (`--fused cache-first`), and neither qkv nor their
/// output (a GPU test reads their PTX). What they read early was written before they
/// launched: the cursor, and the mask and positions at the new position, by the step's first
/// kernel (decode_begin), which has ended before the embedding lets the next kernel launch
/// (the embedding waits first, and every later kernel of the step launches after that); the
/// cache's earlier positions by earlier steps.
#[cfg(test)]
pub const CACHE_FIRST: &[&str] = &["tb_decode_attention_cf"];

/// Whether the kernel `name` is one that reads the KV cache before the wait.
#[cfg(test)]
pub fn cache_first(name: &str) -> bool {
    CACHE_FIRST.iter().any(|p| name.starts_with(p))
}

#[cfg(feature = "cuda")]
pub use imp::{during_capture, hopper_ptx, programmatic_edges, Early};

/// The name suffix of the decode norms' and merge's kernels: `_tf` (pdl_begin_trigger_first,
/// the next kernel let start before the wait) with `--fused trigger-first`, else none.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn trigger_first_suffix() -> &'static str {
    if crate::kernels::enabled(crate::kernels::Fused::TriggerFirst) {
        "_tf"
    } else {
        ""
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::{enabled, Fused};
    use candle_core::cuda_backend::cudarc::driver::sys::{
        self, CUdevice_attribute, CUgraph, CUgraphDependencyType, CUgraphEdgeData, CUgraphNode,
        CUgraphNodeType, CUstream, CUstreamCaptureStatus, CUstreamUpdateCaptureDependencies_flags,
    };
    use candle_core::cuda_backend::{CudaDevice, WrapErr as _};
    use candle_core::{bail, Result};
    use std::cell::Cell;

    /// Rows (a batch's sequences) up to which a decode kernel starts early. At 16 rows the
    /// graphed step was 19–23 % slower with the programmatic edges (gpt2 0.449 → 0.533 ms,
    /// bloom-560m 1.097 → 1.347; one row 6 % and 5 % faster: results/h100x2/gate-run30).
    const MAX_ROWS: usize = 4;

    #[derive(Clone, Copy, PartialEq)]
    enum Capture {
        Off,
        On,
        /// An [`Early`] could not restore the stream's dependencies: the graph is not used.
        Broken,
    }

    thread_local! {
        /// Whether this thread is inside [`during_capture`] (eager launches skip the driver's
        /// capture query: a decode kernel is launched eagerly far more often than captured).
        static CAPTURE: Cell<Capture> = const { Cell::new(Capture::Off) };
    }

    /// Runs `f`, a graph capture's launches, with [`Early`] active on this thread; Err where
    /// an `Early` left the stream's dependencies broken (the caller then drops the graph).
    pub fn during_capture<R>(f: impl FnOnce() -> R) -> Result<R> {
        CAPTURE.set(Capture::On);
        let r = f();
        let state = CAPTURE.replace(Capture::Off);
        if state == Capture::Broken {
            bail!("a programmatic edge could not be drawn: the capture is not used");
        }
        Ok(r)
    }

    /// Whether the decode kernels' PTX holds `pdl_begin`'s wait (built for compute 90 and up;
    /// below, a kernel started early would not wait for the one before it).
    fn ptx_waits() -> bool {
        let cap = env!("TB_PTX_CAP").trim_end_matches(|c: char| !c.is_ascii_digit());
        cap.parse::<u32>().is_ok_and(|c| c >= 90)
    }

    /// Around a decode kernel's output allocations and launch while a graph is captured with
    /// `--fused pdl` on Hopper (inert otherwise): [`Early::begin`] before the allocations,
    /// [`Early::launch`] just before the launch, nothing but allocations between them (checked:
    /// anything else would have become a root of the graph). Dropped without `launch` (an
    /// early return), the stream's next node follows the allocations and the last operation in
    /// full.
    #[must_use = "Early::launch must come just before the kernel's launch"]
    pub struct Early {
        stream: CUstream,
        /// The last operation before `begin` and whether it is a kernel.
        last: Option<(CUgraphNode, bool)>,
        /// Allocations between it and `begin` made outside an [`Early`]: kept as dependencies
        /// (in full: that kernel then waits for the operation's end, correct if slower).
        allocs: Vec<CUgraphNode>,
    }

    impl Early {
        /// For a kernel over `rows` rows (sequences), launched on `dev`'s stream.
        pub fn begin(dev: &CudaDevice, rows: usize) -> Result<Early> {
            let stream = dev.cuda_stream().cu_stream();
            let inert = Early {
                stream,
                last: None,
                allocs: Vec::new(),
            };
            let applies = CAPTURE.get() == Capture::On && rows <= MAX_ROWS;
            if !applies || !enabled(Fused::Pdl) || !ptx_waits() || !hopper(dev)? {
                return Ok(inert);
            }
            let Some(deps) = capture_deps(stream)? else {
                return Ok(inert);
            };
            let [head] = deps[..] else {
                return Ok(inert);
            };
            let Some((last, allocs)) = last_operation(head)? else {
                return Ok(inert);
            };
            set_deps(stream, &[], &[])?;
            Ok(Early {
                stream,
                last: Some(last),
                allocs,
            })
        }

        /// The stream's next node (the kernel) follows the allocations made since `begin`,
        /// those kept, and programmatically the last operation where that is a kernel.
        pub fn launch(mut self) -> Result<()> {
            self.join(true)
        }

        fn join(&mut self, programmatic: bool) -> Result<()> {
            let Some((last, kernel)) = self.last else {
                return Ok(());
            };
            let mut nodes = capture_deps(self.stream)?.unwrap_or_default();
            if programmatic && !only_allocations(&nodes)? {
                bail!("Early: an operation was captured between begin and launch");
            }
            nodes.extend_from_slice(&self.allocs);
            // SAFETY: a zeroed edge is the default one (ports 0, type default).
            let mut data: Vec<CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; nodes.len()];
            // SAFETY: as above.
            let mut edge: CUgraphEdgeData = unsafe { std::mem::zeroed() };
            if programmatic && kernel {
                edge.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
                edge.type_ = CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
            }
            nodes.push(last);
            data.push(edge);
            set_deps(self.stream, &nodes, &data)?;
            self.last = None;
            Ok(())
        }
    }

    impl Drop for Early {
        fn drop(&mut self) {
            if self.join(false).is_err() {
                CAPTURE.set(Capture::Broken);
            }
        }
    }

    /// Whether `dev` is Hopper or later and the kernels' PTX was built for it (clusters, the
    /// `griddepcontrol` wait). Asked once a device ordinal: eager one-row decoding asks it at
    /// every layer.
    pub fn hopper_ptx(dev: &CudaDevice) -> Result<bool> {
        use std::sync::Mutex;
        static KNOWN: Mutex<Vec<(usize, bool)>> = Mutex::new(Vec::new());
        let ordinal = dev.cuda_stream().context().ordinal();
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, yes)) = known.iter().find(|(o, _)| *o == ordinal) {
            return Ok(yes);
        }
        let yes = ptx_waits() && hopper(dev)?;
        known.push((ordinal, yes));
        Ok(yes)
    }

    /// Whether `dev` is Hopper or later (programmatic edges need compute capability 9.0).
    /// (The driver is asked directly: cudarc's `attribute` first returns any error an earlier
    /// drop recorded on the context, which would fail the capture here.)
    fn hopper(dev: &CudaDevice) -> Result<bool> {
        let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
        let device = dev.cuda_stream().context().cu_device();
        let mut major = 0i32;
        // SAFETY: an out-pointer to a local; the device of a live context.
        unsafe { sys::cuDeviceGetAttribute(&mut major, attribute, device) }
            .result()
            .w()?;
        Ok(major >= 9)
    }

    /// From the capture's head back past memory nodes: the last operation and whether it is a
    /// kernel, with the allocations passed; None where a node on the way has two parents.
    #[allow(clippy::type_complexity)]
    fn last_operation(
        mut at: CUgraphNode,
    ) -> Result<Option<((CUgraphNode, bool), Vec<CUgraphNode>)>> {
        let mut allocs = Vec::new();
        loop {
            match node_type(at)? {
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => allocs.push(at),
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {}
                t => {
                    return Ok(Some((
                        (at, t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL),
                        allocs,
                    )))
                }
            }
            match dependencies(at)?[..] {
                [one] => at = one,
                _ => return Ok(None),
            }
        }
    }

    /// Whether `heads` and everything before them back to the graph's roots are allocations
    /// (what an [`Early`] may have captured since `begin` emptied the dependencies).
    fn only_allocations(heads: &[CUgraphNode]) -> Result<bool> {
        let mut todo = heads.to_vec();
        while let Some(n) = todo.pop() {
            if node_type(n)? != CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
                return Ok(false);
            }
            todo.extend(dependencies(n)?);
        }
        Ok(true)
    }

    /// The stream's current dependencies while it captures, else None.
    fn capture_deps(stream: CUstream) -> Result<Option<Vec<CUgraphNode>>> {
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut deps: *const CUgraphNode = std::ptr::null();
        let mut n = 0usize;
        let (id, graph, data) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: out-pointers to locals (null: not asked); the driver's array lives until the
        // next capture call, and is copied below before any.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(stream, &mut status, id, graph, &mut deps, data, &mut n)
        }
        .result()
        .w()?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Ok(None);
        }
        // SAFETY: n nodes at deps (none when n is 0).
        Ok(Some(match n {
            0 => Vec::new(),
            _ => unsafe { std::slice::from_raw_parts(deps, n) }.to_vec(),
        }))
    }

    fn set_deps(stream: CUstream, nodes: &[CUgraphNode], data: &[CUgraphEdgeData]) -> Result<()> {
        let flags = CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES;
        // The node array is passed even when empty (as measured in gate-run31), the edge data
        // only where there are edges.
        let data_ptr = match nodes.is_empty() {
            true => std::ptr::null(),
            false => data.as_ptr(),
        };
        // SAFETY: nodes of the capture's graph, one edge datum each; the driver copies both.
        unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream,
                nodes.as_ptr() as *mut CUgraphNode,
                data_ptr,
                nodes.len(),
                flags as u32,
            )
        }
        .result()
        .w()
    }

    fn node_type(n: CUgraphNode) -> Result<CUgraphNodeType> {
        let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: n is a node of the capture's graph.
        unsafe { sys::cuGraphNodeGetType(n, &mut t) }.result().w()?;
        Ok(t)
    }

    fn dependencies(n: CUgraphNode) -> Result<Vec<CUgraphNode>> {
        let mut count = 0usize;
        // The edges' data is not asked for: null.
        let data = std::ptr::null_mut();
        // SAFETY: a null node array asks for the count only.
        unsafe { sys::cuGraphNodeGetDependencies_v2(n, std::ptr::null_mut(), data, &mut count) }
            .result()
            .w()?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut deps = vec![std::ptr::null_mut(); count];
        // SAFETY: the array holds count nodes.
        unsafe { sys::cuGraphNodeGetDependencies_v2(n, deps.as_mut_ptr(), data, &mut count) }
            .result()
            .w()?;
        Ok(deps)
    }

    /// How many of `graph`'s edges are programmatic.
    pub fn programmatic_edges(graph: CUgraph) -> Result<usize> {
        let (nodes, data) = (std::ptr::null_mut(), std::ptr::null_mut());
        let mut n = 0usize;
        // SAFETY: null arrays ask for the count only.
        unsafe { sys::cuGraphGetEdges_v2(graph, nodes, nodes, data, &mut n) }
            .result()
            .w()?;
        let mut from = vec![std::ptr::null_mut(); n];
        let mut to = vec![std::ptr::null_mut(); n];
        // SAFETY: a zeroed edge datum is a valid value to overwrite.
        let mut data: Vec<CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; n];
        let (f, t, d) = (from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr());
        // SAFETY: the arrays hold n entries, the count the driver gave.
        unsafe { sys::cuGraphGetEdges_v2(graph, f, t, d, &mut n) }
            .result()
            .w()?;
        let programmatic = CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        Ok(data.iter().filter(|d| d.type_ == programmatic).count())
    }
}

#[cfg(test)]
mod tests {
    use super::{cache_first, waits_first, weights_first};

    #[test]
    fn the_cache_first_attention_is_told_apart_from_the_cluster_kernels_that_wait_first() {
        for name in [
            "tb_decode_attention_cf4_h64_bf16",
            "tb_decode_attention_cf8_h128_f32",
        ] {
            assert!(cache_first(name) && !waits_first(name), "{name}");
        }
        for name in ["tb_decode_attention_c4_bf16", "tb_decode_attention_c2_f16"] {
            assert!(!cache_first(name) && waits_first(name), "{name}");
        }
    }

    #[test]
    fn the_early_gemvs_are_told_apart_from_those_that_wait_first() {
        for name in [
            "tb_early_gemv_fp8_1_bf16",
            "tb_early_gemv_fp8_1w8_f16",
            "tb_wgemv3_bf16",
            "tb_wgemv1_f16",
            "tb_wgemv_ln4_bf16",
            "tb_wgemv_row_bf16",
        ] {
            assert!(weights_first(name) && !waits_first(name), "{name}");
        }
        for name in ["tb_gemv1_bf16", "tb_gemv_fp8_1w8_f16"] {
            assert!(!weights_first(name) && waits_first(name), "{name}");
        }
    }

    #[test]
    fn the_decode_kernels_wait_first_and_the_others_do_not() {
        for name in [
            "tb_gemv1_bf16",
            "tb_gemv_fp8_1w8_bf16",
            "tb_skinny_head_f16",
            "tb_decode_attention_head64_bf16",
            "tb_decode_combine_f32",
            "tb_add_layer_norm_bf16",
            "tb_add_layer_norm_tf_bf16",
            "tb_layer_norm_fwd_vec3_tf_f16",
        ] {
            assert!(waits_first(name), "{name}");
        }
        for name in [
            "tb_gemv_push1_bf16",
            "tb_oneshot_sum_bf16",
            "tb_decode_step1_bf16",
        ] {
            assert!(!waits_first(name), "{name}");
        }
    }
}
