//! Programmatic dependent launch inside the decode graphs (`--fused pdl`, Hopper): an edge
//! of a captured graph from one kernel to the next becomes programmatic, so that the next
//! kernel's blocks are launched while the kernel before it runs and wait on the device
//! (`pdl_begin` in common.cuh) instead of being launched once it has finished.
//!
//! A captured step is a chain: kernels, copies, and between them the graph memory nodes of
//! candle's stream-ordered allocations and frees (each output allocated before its kernel,
//! each input freed after its last use). A programmatic edge goes from a kernel to a kernel
//! only: with an allocation and a free around every launch, the launch attribute changed
//! nothing (scripts/probes/pdl_probe.cu; docs/perf-notes.md, "Programmatic dependent launch
//! inside the graph"). So [`plan`] redraws the chain's edges, keeping every order that memory
//! needs and no other:
//! - an operation (a kernel, a copy, anything but a memory node) follows the operation before
//!   it (programmatically where both are kernels and the later one waits first, [`waits_first`]),
//!   and the allocations made since that operation (its outputs);
//! - an allocation follows only the frees before it whose memory it overlaps (the allocator
//!   may have handed it that memory), else nothing: it no longer waits for the kernel before it;
//! - a free follows the operation before it (the last that may have used the memory) and, if no
//!   operation came after it, its own allocation.

/// One node of a captured chain, in capture order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// A kernel; `early`: it waits for the kernel before it on the device ([`waits_first`]).
    Kernel { early: bool },
    /// A stream-ordered allocation of `bytes` at `ptr`.
    Alloc { ptr: u64, bytes: u64 },
    /// The free of the allocation at `ptr`.
    Free { ptr: u64 },
    /// Anything else (a copy, a memset): ordered like a kernel that does not wait first.
    Other,
}

/// An edge of the redrawn chain: `to` follows `from`, programmatically or in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub programmatic: bool,
}

/// The kernels that call `pdl_begin` first (name prefixes, all dtypes): the decode step's.
const WAITS_FIRST: &[&str] = &[
    "tb_gemv1_",
    "tb_gemv2_",
    "tb_gemv3_",
    "tb_gemv4_",
    "tb_gemv_fp8_",
    "tb_skinny",
    "tb_argmax",
    "tb_add_layer_norm_",
    "tb_layer_norm_fwd_vec",
    "tb_decode_attention",
    "tb_decode_combine_",
    "tb_decode_begin",
];

/// Whether the kernel `name` waits for the kernel before it first (a programmatic edge into it
/// is safe).
pub fn waits_first(name: &str) -> bool {
    WAITS_FIRST.iter().any(|p| name.starts_with(p))
}

/// The edges of `chain` (nodes in capture order) as the module's rules draw them.
pub fn plan(chain: &[Node]) -> Vec<Edge> {
    let mut edges = Vec::new();
    let mut add = |from, to, programmatic| {
        edges.push(Edge {
            from,
            to,
            programmatic,
        })
    };
    let mut last_op: Option<usize> = None;
    let mut pending: Vec<usize> = Vec::new(); // allocations since last_op
    let mut frees: Vec<(usize, Option<(u64, u64)>)> = Vec::new(); // the freed range, if known
    let range = |ptr: u64| {
        chain.iter().find_map(|n| match *n {
            Node::Alloc { ptr: p, bytes } if p == ptr => Some((p, p + bytes)),
            _ => None,
        })
    };
    for (i, node) in chain.iter().enumerate() {
        match *node {
            Node::Kernel { .. } | Node::Other => {
                if let Some(prev) = last_op {
                    let kernels = matches!(chain[prev], Node::Kernel { .. });
                    add(prev, i, kernels && *node == Node::Kernel { early: true });
                }
                for a in pending.drain(..) {
                    add(a, i, false);
                }
                last_op = Some(i);
            }
            Node::Alloc { ptr, bytes } => {
                for &(f, freed) in &frees {
                    // A free of memory the chain did not allocate: assume it may be reused.
                    if freed.is_none_or(|(s, e)| s < ptr + bytes && ptr < e) {
                        add(f, i, false);
                    }
                }
                pending.push(i);
            }
            Node::Free { ptr } => {
                if let Some(prev) = last_op {
                    add(prev, i, false);
                }
                let own = |&a: &usize| matches!(chain[a], Node::Alloc { ptr: p, .. } if p == ptr);
                if let Some(k) = pending.iter().position(own) {
                    add(pending.remove(k), i, false);
                }
                frees.push((i, range(ptr)));
            }
        }
    }
    edges
}

#[cfg(feature = "cuda")]
pub use imp::rewire;

#[cfg(feature = "cuda")]
mod imp {
    use super::{plan, waits_first, Node};
    use candle_core::cuda_backend::cudarc::driver::sys::{
        self, CUgraph, CUgraphDependencyType, CUgraphEdgeData, CUgraphNode, CUgraphNodeType,
    };
    use candle_core::cuda_backend::WrapErr as _;
    use candle_core::Result;
    use std::ffi::CStr;

    /// Redraws `graph`'s edges by [`plan`] where the graph is one chain (a capture of one
    /// stream); leaves any other graph as it is. Returns the programmatic edges made.
    pub fn rewire(graph: CUgraph) -> Result<usize> {
        let Some(chain) = chain(graph)? else {
            return Ok(0);
        };
        let nodes = chain.iter().map(|&n| node(n)).collect::<Result<Vec<_>>>()?;
        let edges = plan(&nodes);
        let (old_from, old_to): (Vec<_>, Vec<_>) = chain.windows(2).map(|w| (w[0], w[1])).unzip();
        let old_data = vec![edge_data(false); old_from.len()];
        // SAFETY: the arrays hold as many nodes and edge data as the count; every node is
        // the graph's, every removed edge one that chain() found.
        unsafe {
            sys::cuGraphRemoveDependencies_v2(
                graph,
                old_from.as_ptr(),
                old_to.as_ptr(),
                old_data.as_ptr(),
                old_from.len(),
            )
        }
        .result()
        .w()?;
        let from: Vec<CUgraphNode> = edges.iter().map(|e| chain[e.from]).collect();
        let to: Vec<CUgraphNode> = edges.iter().map(|e| chain[e.to]).collect();
        let data: Vec<CUgraphEdgeData> = edges.iter().map(|e| edge_data(e.programmatic)).collect();
        // SAFETY: as above; plan() draws each edge forwards in the chain, so no cycle.
        unsafe {
            sys::cuGraphAddDependencies_v2(
                graph,
                from.as_ptr(),
                to.as_ptr(),
                data.as_ptr(),
                from.len(),
            )
        }
        .result()
        .w()?;
        Ok(edges.iter().filter(|e| e.programmatic).count())
    }

    fn edge_data(programmatic: bool) -> CUgraphEdgeData {
        // SAFETY: a zeroed edge is the default one (ports 0, type default).
        let mut d: CUgraphEdgeData = unsafe { std::mem::zeroed() };
        if programmatic {
            d.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
            d.type_ = CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        }
        d
    }

    /// The graph's nodes in order if its edges make one chain of default edges, else None.
    fn chain(graph: CUgraph) -> Result<Option<Vec<CUgraphNode>>> {
        let mut n = 0usize;
        // SAFETY: a null array asks for the count only.
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }
            .result()
            .w()?;
        let mut e = 0usize;
        let (no_nodes, no_data) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: null arrays ask for the count only.
        unsafe { sys::cuGraphGetEdges_v2(graph, no_nodes, no_nodes, no_data, &mut e) }
            .result()
            .w()?;
        if n < 2 || e != n - 1 {
            return Ok(None);
        }
        let mut from = vec![std::ptr::null_mut(); e];
        let mut to = vec![std::ptr::null_mut(); e];
        // SAFETY: a zeroed edge datum is a valid value to overwrite.
        let mut data: Vec<CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; e];
        // SAFETY: the arrays hold e entries, the count the driver gave.
        unsafe {
            sys::cuGraphGetEdges_v2(
                graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut e,
            )
        }
        .result()
        .w()?;
        if data.iter().any(|d| d.type_ != 0 || d.from_port != 0) {
            return Ok(None);
        }
        // One chain: no node with two parents or two children, one root.
        let unique = |v: &[CUgraphNode]| {
            let mut s = v.to_vec();
            s.sort();
            s.dedup();
            s.len() == v.len()
        };
        if !unique(&from) || !unique(&to) {
            return Ok(None);
        }
        let Some(mut at) = from.iter().copied().find(|f| !to.contains(f)) else {
            return Ok(None);
        };
        let mut order = vec![at];
        while let Some(k) = from.iter().position(|&f| f == at) {
            at = to[k];
            order.push(at);
        }
        Ok((order.len() == n).then_some(order))
    }

    fn node(n: CUgraphNode) -> Result<Node> {
        let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: n is a node of a live graph.
        unsafe { sys::cuGraphNodeGetType(n, &mut kind) }
            .result()
            .w()?;
        Ok(match kind {
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => Node::Kernel {
                early: kernel_name(n)?.is_some_and(|name| waits_first(&name)),
            },
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                // SAFETY: a zeroed parameter struct is a valid value to overwrite.
                let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: n is an allocation node.
                unsafe { sys::cuGraphMemAllocNodeGetParams(n, &mut p) }
                    .result()
                    .w()?;
                Node::Alloc {
                    ptr: p.dptr,
                    bytes: p.bytesize as u64,
                }
            }
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                let mut ptr = 0;
                // SAFETY: n is a free node.
                unsafe { sys::cuGraphMemFreeNodeGetParams(n, &mut ptr) }
                    .result()
                    .w()?;
                Node::Free { ptr }
            }
            _ => Node::Other,
        })
    }

    /// The kernel node's function name (None where the node holds no function handle).
    fn kernel_name(n: CUgraphNode) -> Result<Option<String>> {
        // SAFETY: a zeroed parameter struct is a valid value to overwrite.
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: n is a kernel node.
        unsafe { sys::cuGraphKernelNodeGetParams_v2(n, &mut p) }
            .result()
            .w()?;
        if p.func.is_null() {
            return Ok(None);
        }
        let mut name = std::ptr::null();
        // SAFETY: func is the node's function; the driver owns the returned string.
        unsafe { sys::cuFuncGetName(&mut name, p.func) }
            .result()
            .w()?;
        // SAFETY: a NUL-terminated string the driver keeps alive with the function.
        Ok(Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(early: bool) -> Node {
        Node::Kernel { early }
    }

    fn edge(from: usize, to: usize, programmatic: bool) -> Edge {
        Edge {
            from,
            to,
            programmatic,
        }
    }

    #[test]
    fn allocations_leave_the_kernel_chain_and_the_edge_between_waiting_kernels_is_programmatic() {
        // k0, alloc(out1), k1 (waits first), free(out1), alloc(out2), k2 (does not wait first)
        let chain = [
            kernel(true),
            Node::Alloc { ptr: 0, bytes: 64 },
            kernel(true),
            Node::Free { ptr: 0 },
            Node::Alloc {
                ptr: 1024,
                bytes: 64,
            },
            kernel(false),
        ];
        let edges = plan(&chain);
        let want = [
            edge(1, 2, false), // k1 after its output's allocation
            edge(0, 2, true),  // k1 after k0, programmatically
            edge(2, 3, false), // the free after k1, the last user
            edge(2, 5, false), // k2 after k1 in full: k2 does not wait first
            edge(4, 5, false), // k2 after its output's allocation, which follows nothing
        ];
        let mut got = edges.clone();
        got.sort_by_key(|e| (e.to, e.from));
        let mut want = want.to_vec();
        want.sort_by_key(|e| (e.to, e.from));
        assert_eq!(got, want);
    }

    #[test]
    fn an_allocation_that_may_reuse_freed_memory_follows_that_free() {
        let chain = [
            Node::Alloc { ptr: 0, bytes: 256 },
            kernel(true),
            Node::Free { ptr: 0 },
            Node::Alloc {
                ptr: 128,
                bytes: 64,
            }, // inside the freed range
            Node::Free { ptr: 7 }, // memory the chain did not allocate: may be reused
            Node::Alloc {
                ptr: 4096,
                bytes: 64,
            },
            kernel(true),
        ];
        let edges = plan(&chain);
        assert!(edges.contains(&edge(2, 3, false)));
        assert!(edges.contains(&edge(4, 5, false)));
        assert!(
            !edges.contains(&edge(2, 5, false)),
            "disjoint from the first free"
        );
        // The second kernel uses memory that may have been the first's: it follows it in
        // full through the allocation, and programmatically as the next kernel.
        assert!(edges.contains(&edge(3, 6, false)));
        assert!(edges.contains(&edge(1, 6, true)));
    }

    #[test]
    fn a_free_of_memory_no_operation_used_follows_its_allocation() {
        let chain = [
            kernel(false),
            Node::Alloc { ptr: 0, bytes: 64 },
            Node::Free { ptr: 0 },
            kernel(true),
        ];
        let edges = plan(&chain);
        assert!(edges.contains(&edge(1, 2, false)));
        assert!(edges.contains(&edge(0, 2, false)));
        assert!(edges.contains(&edge(0, 3, true)));
        assert_eq!(edges.len(), 3, "{edges:?}");
    }

    #[test]
    fn every_node_but_the_first_allocations_follows_an_earlier_one() {
        let chain = [
            Node::Other,
            Node::Alloc { ptr: 0, bytes: 8 },
            kernel(true),
            Node::Other,
            kernel(true),
            Node::Free { ptr: 0 },
        ];
        let edges = plan(&chain);
        assert!(edges.iter().all(|e| e.from < e.to));
        for (i, n) in chain.iter().enumerate().skip(1) {
            let has_parent = edges.iter().any(|e| e.to == i);
            assert_eq!(has_parent, !matches!(n, Node::Alloc { .. }), "node {i}");
        }
        // A copy between two kernels keeps both edges in full.
        assert!(edges.contains(&edge(2, 3, false)) && edges.contains(&edge(3, 4, false)));
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
