//! Fused CUDA kernels and cuBLASLt epilogues for the candle engine. The profile in
//! docs/perf-notes.md says why each exists: candle runs a bias add, an activation, a scale, a
//! cast, a mask add and a softmax as separate passes, and its broadcast add takes the slow
//! strided path.
//!
//! Here: the `--fused` switchboard ([`Fused`], [`enabled`], [`describe`]) and the shared
//! [`Act`]. One file a kernel family, its `.cu` beside it (PTX built by build.rs; shared
//! device helpers in common.cuh): the public entry point, its CUDA launchers (custom ops,
//! forward and backward side by side) and its CPU stub. `launch` holds the launcher plumbing.
//!
//! Every entry point returns `Ok(None)` where it does not apply (a CPU tensor, a kernel
//! switched off with `--fused`, a dtype or layout it does not take); the caller then runs
//! candle's composed ops, which stay the reference that the GPU tests compare against.

use std::sync::atomic::{AtomicU64, Ordering};

mod adamw;
mod argmax;
mod attn_softmax;
mod bias_act;
mod cross_entropy;
mod decode_attention;
mod decode_step;
mod dropout;
mod embedding;
mod flash_attn;
mod flash_prefill;
mod fp8;
mod gemv;
mod graph;
mod heads;
#[cfg(feature = "cuda")]
mod launch;
mod layer_norm;
mod linear_lt;
mod multi_tensor;
mod oneshot;
pub(crate) mod pdl;
mod residual;
mod skinny;

pub use adamw::{adamw, sum_squares, AdamStep};
#[cfg(test)]
pub use argmax::RECORDED_PICKS;
pub use argmax::{argmax, argmax_into, Record};
pub use attn_softmax::{attn_softmax, attn_softmax_bwd};
pub use bias_act::{bias_act, bias_act_bwd, bias_grad};
pub use cross_entropy::{
    cross_entropy, cross_entropy_bwd, cross_entropy_bwd_in_place, cross_entropy_fused_in_place,
};
pub use decode_attention::{decode_attention, decode_begin, CacheSlot, QkvLayout};
#[cfg(test)]
pub use decode_attention::{CACHE_FIRST_LAUNCHES, CLUSTER_LAUNCHES};
pub use decode_step::{step_launches, StepAttention, StepLayer, StepModel, STEP_MAX_ROWS};
pub use dropout::{apply_keep, draw_keep, dropout, keep_mask, set_dropout_seed, Keep};
#[cfg(test)]
pub use embedding::EMBED_LAUNCHES;
pub use embedding::{embed_rows, embedding_bwd, embedding_bwd_in_place, embedding_fwd};
pub use flash_attn::{flash_attention, flash_attention_bwd, FLASH_HEAD_SIZE};
pub use flash_prefill::{flash_prefill, prefill_applies, prefill_kv, SeqRows};
pub use fp8::{dequant_fp8, gemv_fp8, quantize_fp8, FP8_GEMV_MAX_ROWS};
pub use gemv::{
    gemv, gemv_add, gemv_head, gemv_ln, Summed, MAX_ROWS as GEMV_MAX_ROWS, NORM_LINE, NORM_SLOTS,
};
#[cfg(test)]
pub use gemv::{LN_LAUNCHES, SUMMED_LAUNCHES, WIDE_LAUNCHES};
pub use graph::{capture, param_cache, programmatic_edges, replays, Graph, ParamCache};
pub use heads::{merge_heads, split_heads};
pub use layer_norm::{
    add_layer_norm, layer_norm, layer_norm_bwd, layer_norm_bwd_add, ResidualGrads,
};
pub use linear_lt::linear;
pub use multi_tensor::{
    adamw_multi, adamw_multi_copies, cast_multi, cast_multi_flat, grad_norm_clip,
};
pub use oneshot::{
    gemv_oneshot_add_layer_norm, oneshot_add_layer_norm, oneshot_sum, PeerBuffers, PendingGemv,
    ONESHOT_CAP, ONESHOT_MAX_RANKS,
};
#[cfg(feature = "cuda")]
pub use oneshot::{pair_add_in_place, pair_signal, pair_wait};
pub use residual::{residual_add, residual_add_dropped, residual_add_then_drop};
pub use skinny::{
    skinny, skinny_add, skinny_fp8, skinny_linear, skinny_ln, MAX_ROWS as SKINNY_MAX_ROWS,
    MAX_WEIGHT as SKINNY_MAX_WEIGHT,
};
#[cfg(test)]
pub use skinny::{
    ADD_LAUNCHES as SKINNY_ADD_LAUNCHES, HEAD_LAUNCHES as SKINNY_HEAD_LAUNCHES,
    LN_LAUNCHES as SKINNY_LN_LAUNCHES,
};

/// The fused paths `--fused` switches (each on by default on CUDA but `step`, which is opt-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fused {
    /// Every fused path but the opt-in `step`.
    All,
    /// None: candle's own ops only (the "before" of docs/perf-notes.md).
    None,
    /// Inference projections as one cuBLASLt matmul with the bias (and GELU) in its epilogue.
    Lt,
    /// Attention softmax: scale, mask / ALiBi bias, softmax and dropout in one pass; its backward.
    Softmax,
    /// Bias + activation in one pass, with its backward (training; inference in fp32).
    BiasAct,
    /// AdamW and the gradient norm over every parameter in a few launches, the clip factor
    /// computed on the device (per tensor where a step's tensors differ in dtype); the manual
    /// step's compute-dtype copies of the masters likewise.
    Adamw,
    /// Training LayerNorm: one kernel forward, two backward (instead of ~10 ops with casts).
    LayerNorm,
    /// Dropout masks drawn inside the kernels from a hash (nothing stored; the backward
    /// redraws them) instead of candle's f32 uniforms + compare.
    Dropout,
    /// Training loss: cross-entropy over the logits in one kernel each way (no f32 copies); in
    /// the manual step one kernel writes the loss and its gradient over the logits.
    CrossEntropy,
    /// Generation: residual add + LayerNorm in one pass, single-query attention over the KV
    /// cache in one kernel (and a merge kernel where it splits the keys), the greedy argmax in
    /// one block a row.
    Decode,
    /// Generation: each decode step after the first recorded once as a CUDA graph and
    /// replayed (needs `decode`).
    Graph,
    /// Training: the token embedding's gradient as one scatter-add kernel (instead of
    /// candle's row-by-row index_add), and the forward's token + position sum in one pass.
    Embedding,
    /// Training: the attention's head split and merge as one vectorised copy each (instead of
    /// candle's strided copy).
    Heads,
    /// Training: causal attention without dropout as one tensor-core kernel forward and three
    /// backward (FlashAttention-2's tiling; the T × T scores never stored) instead of the
    /// matmuls, the softmax and the head split / merge. bf16 / f16, head size 64.
    Flash,
    /// Training: the residual adds (forward and backward) in 16-byte vectors (instead of
    /// candle's add).
    Residual,
    /// Inference at 1–4 rows (decode steps): nn.Linear projections (BLOOM's; GPT-2's once the
    /// engine lays them out so) as one GEMV kernel, four warps an output column, bias and GELU
    /// in it (instead of cuBLASLt's small-M kernels and split-K reduces).
    Gemv,
    /// Inference at 1–16 rows (decode steps): the LM head on tensor cores, all rows against
    /// each tile of the head read once, where the vocabulary is no multiple of 8 (GPT-2's;
    /// cuBLAS falls back to a slow kernel there).
    Skinny,
    /// Inference at 5–16 rows (decode steps of a batch): nn.Linear projections (BLOOM's;
    /// GPT-2's once the engine lays them out so) with bf16 / f16 weights of at most 8 MiB, fp8
    /// projections and the fp8 LM head, on the tensor cores with the bias and GELU in the
    /// kernel, instead of cuBLASLt's small-M kernels (bf16 / f16) or a weight turned back into
    /// bf16 every step (fp8).
    SkinnyProj,
    /// Tensor parallelism on GPUs of one host: sums of at most 512 KiB (a decode step's) as
    /// one kernel that writes each rank's values into the others' memory over NVLink (CUDA
    /// IPC) instead of NCCL's all-reduce, whose latency floor is ≈ 18 µs.
    Oneshot,
    /// Tensor parallelism, decoding: each rank multiplies its run of the LM head's rows and
    /// the ranks all-gather the logits, instead of every rank reading the whole head.
    SplitHead,
    /// Tensor parallelism, decoding: a row-parallel projection's one-shot sum, the residual
    /// add and the next LayerNorm in one kernel (needs `oneshot` and `decode`), instead of
    /// the sum and then the add + norm.
    SumNorm,
    /// Tensor parallelism, decoding at 1–4 rows: a row-parallel nn.Linear projection's GEMV
    /// pushes its output into every rank's one-shot buffer as its blocks finish, and the
    /// sum + add + norm kernel only receives (needs `sum-norm`, `oneshot`, `decode` and
    /// `gemv`), instead of the GEMV
    /// writing its output and the next kernel pushing it.
    PushSum,
    /// Data parallelism on two GPUs of one host with `--dp-overlap`: each gradient group
    /// crosses to the other GPU as a copy-engine copy over NVLink under the backward, and one
    /// add after it sums (no SMs held by the transfer), instead of NCCL's all-reduce on a
    /// second stream.
    CopySum,
    /// Inference over whole sequences in bf16 / f16 (scoring, and generation's prefill): the
    /// causal attention as one tensor-core kernel reading the qkv projection's rows in place
    /// (head sizes 64 and 128, ALiBi), over right-padded rows or the sequences packed end to
    /// end (scoring's batches, generation's prompts: their keys and values then written into
    /// the KV cache), instead of the head split, the matmuls, the softmax over a (B, nh, T, T)
    /// bias and the head merge over padded rows.
    Prefill,
    /// Training (manual step, bf16 / f16, no ZeRO): AdamW writes the next step's compute
    /// copies of the f32 masters as it updates them (needs `adamw`), instead of a cast pass
    /// that reads the masters again.
    AdamwCopies,
    /// Training (manual step): the LayerNorm backward adds the residual stream's gradient to
    /// its dx and sums it over the rows for the projections' bias gradients (needs
    /// `layer-norm`, its one-pass kernel), instead of an add kernel and a column sum after it.
    LnResidual,
    /// Training: the fused attention's dq inside its dk/dv kernel, from the dSᵀ it has,
    /// summed over the key tiles by f32 atomics and cast once (needs `flash`), instead of a
    /// third kernel that recomputes the scores and dP (that one's dq is bit-reproducible).
    FlashDq,
    /// Generation at 1–4 rows: a decode step's blocks as one persistent kernel, a block an
    /// SM, grid-wide barriers between the stages and each stage's weights streamed into
    /// shared memory two stages ahead, instead of ≈ 7 launches a layer. Not in `all` (opt in:
    /// `--fused all,step`): measured no faster than the graphed launches (docs/perf-notes.md).
    Step,
    /// Decoding at 1–4 rows under a CUDA graph on Hopper (needs `graph`): each edge into a
    /// decode kernel from the kernel before it made programmatic, so that the kernel's blocks
    /// are launched while the kernel before it runs and wait for it on the device, instead of
    /// being launched once it has finished (its output allocations made roots of the graph to
    /// allow it).
    Pdl,
    /// Decoding at 1–4 rows with `pdl` and fp8 weights: each fp8 GEMV loads its first weight
    /// vectors before it waits for the kernel before, so that they stream in while that kernel
    /// (a norm, the attention's merge) runs, instead of after it ends. (The bf16 GEMV doing the
    /// same made bloom-7b1's step slower: docs/perf-notes.md.)
    EarlyWeights,
    /// Logits of 1–4 rows (decode steps, a prefill's last positions): the LM head (bf16 / f16,
    /// a vocabulary that is a multiple of 8: BLOOM's; rows of 8 KB or more: bloom-7b1's) as the
    /// decode GEMV without a bias, instead of cuBLAS's matmul.
    GemvHead,
    /// Decoding with `pdl`: the norms and the attention's merge let the next kernel (a GEMV;
    /// the fp8 ones load their first weights then, `early-weights`) start before they wait for
    /// the kernel before them, instead of after.
    TriggerFirst,
    /// Decoding at one row (5–16 rows: `skinny-fold`), one GPU, bf16 / f16 weights, hidden
    /// sizes up to 1024 (gpt2's, bloom-560m's; any with `norm-stats`) (needs `gemv`): each
    /// block's two LayerNorms folded into the projections after them before the first such
    /// generation (W·diag(γ),
    /// b + W β), their statistics taken by those projections' GEMVs from the loads of x they
    /// make anyway, and the residual adds in the GEMVs before them, instead of an add-and-norm
    /// kernel each.
    NormFold,
    /// Decoding one row on Hopper (needs `decode`): a head's key splits (64 keys a block,
    /// caches of at most 512 keys) as one thread-block cluster, the splits' partial results
    /// pushed into its first block's shared memory, which merges them, instead of a second
    /// kernel reading them back from memory. (At four rows bloom-560m's step was slower.)
    Cluster,
    /// Graphed decode steps (needs `decode`, `graph`): the step's first and last kernels ours,
    /// with programmatic edges (`pdl`): the embedding (gpt2's token + position sum, BLOOM's
    /// gather and LayerNorm) in one kernel, and the greedy pick writing the next step's input
    /// and the token's record itself, instead of candle's gathers, add, norm and copies.
    StepIo,
    /// With `norm-fold`, rows of the residual stream over 2 KB (bloom-7b1's): a folded norm's
    /// statistics (Σ x, Σ x²) summed by the GEMV that writes its input, as f64 adds into 32
    /// slots, so that the folded GEMV reads them instead of summing them inside its dot
    /// products (which held fewer weight loads in flight at those rows: bloom-7b1's folded
    /// step was slower on H200 without this), and those rows fold too.
    NormStats,
    /// With `norm-fold` (and its `gemv`) and `skinny-proj`, decode steps of 5–16 rows (bf16 /
    /// f16, models whose folded weights the tensor-core kernel takes): the norms folded as at
    /// one row, their statistics summed
    /// by the tensor-core projection from the x it loads for its products, and the residual
    /// adds in the projections before them, instead of an add-and-norm kernel each.
    SkinnyFold,
    /// Decoding at one row (needs `gemv`): the bf16 / f16 projections with a bias and no
    /// norm-stats slots (the attention's output projection and the MLP's second; K ≤ 4096) and
    /// those with a folded norm and no slots (qkv and the MLP's first; K ≤ 1024) as blocks of
    /// eight warps that let the next kernel launch (with `pdl`), load their weight vectors, then
    /// wait for the kernel before: at K ≤ 1024 a few wide blocks, one wave; above, a block a
    /// column. Each is resident a stage or more ahead, its weights in registers when its input
    /// arrives, instead of a block of four warps a column loading them after the wait.
    GemvWide,
    /// Decoding one row with `cluster` (Hopper): the attention reads the step's cursor, its
    /// cached keys and values, the mask and the key positions before it waits for the qkv
    /// projection (all written by kernels that ended before it launched), and only q and the
    /// new key and value after, instead of every load after the wait, where the cursor's
    /// load delayed the cache's.
    CacheFirst,
}

const LT: u64 = 1;
const SOFTMAX: u64 = 2;
const BIAS_ACT: u64 = 4;
const ADAMW: u64 = 8;
const LAYER_NORM: u64 = 16;
const DROPOUT: u64 = 32;
const XENT: u64 = 64;
const DECODE: u64 = 128;
const GRAPH: u64 = 256;
const EMBEDDING: u64 = 512;
const HEADS: u64 = 1024;
const FLASH: u64 = 2048;
const RESIDUAL: u64 = 4096;
const GEMV: u64 = 8192;
const SKINNY: u64 = 16384;
const ONESHOT: u64 = 32768;
const SPLIT_HEAD: u64 = 65536;
const SUM_NORM: u64 = 131072;
const COPY_SUM: u64 = 262144;
const PREFILL: u64 = 524288;
const PUSH_SUM: u64 = 1048576;
const ADAMW_COPIES: u64 = 1 << 21;
const LN_RESIDUAL: u64 = 1 << 22;
const FLASH_DQ: u64 = 1 << 23;
const STEP: u64 = 1 << 24;
const SKINNY_PROJ: u64 = 1 << 25;
const PDL: u64 = 1 << 26;
const EARLY_WEIGHTS: u64 = 1 << 27;
const GEMV_HEAD: u64 = 1 << 28;
const TRIGGER_FIRST: u64 = 1 << 29;
const NORM_FOLD: u64 = 1 << 30;
const CLUSTER: u64 = 1 << 31;
const STEP_IO: u64 = 1 << 32;
const NORM_STATS: u64 = 1 << 33;
const SKINNY_FOLD: u64 = 1 << 34;
const GEMV_WIDE: u64 = 1 << 35;
const CACHE_FIRST: u64 = 1 << 36;
const ALL: u64 = LT
    | SOFTMAX
    | BIAS_ACT
    | ADAMW
    | LAYER_NORM
    | DROPOUT
    | XENT
    | DECODE
    | GRAPH
    | EMBEDDING
    | HEADS
    | FLASH
    | RESIDUAL
    | GEMV
    | SKINNY
    | ONESHOT
    | SPLIT_HEAD
    | SUM_NORM
    | COPY_SUM
    | PREFILL
    | PUSH_SUM
    | ADAMW_COPIES
    | LN_RESIDUAL
    | FLASH_DQ
    | SKINNY_PROJ
    | PDL
    | EARLY_WEIGHTS
    | GEMV_HEAD
    | NORM_FOLD
    | TRIGGER_FIRST
    | CLUSTER
    | STEP_IO
    | NORM_STATS
    | SKINNY_FOLD
    | GEMV_WIDE
    | CACHE_FIRST;

static ENABLED: AtomicU64 = AtomicU64::new(ALL);

fn bit(f: Fused) -> u64 {
    match f {
        Fused::All => ALL,
        Fused::None => 0,
        Fused::Lt => LT,
        Fused::Softmax => SOFTMAX,
        Fused::BiasAct => BIAS_ACT,
        Fused::Adamw => ADAMW,
        Fused::LayerNorm => LAYER_NORM,
        Fused::Dropout => DROPOUT,
        Fused::CrossEntropy => XENT,
        Fused::Decode => DECODE,
        Fused::Graph => GRAPH,
        Fused::Embedding => EMBEDDING,
        Fused::Heads => HEADS,
        Fused::Flash => FLASH,
        Fused::Residual => RESIDUAL,
        Fused::Gemv => GEMV,
        Fused::Skinny => SKINNY,
        Fused::SkinnyProj => SKINNY_PROJ,
        Fused::Oneshot => ONESHOT,
        Fused::SplitHead => SPLIT_HEAD,
        Fused::SumNorm => SUM_NORM,
        Fused::CopySum => COPY_SUM,
        Fused::Prefill => PREFILL,
        Fused::PushSum => PUSH_SUM,
        Fused::AdamwCopies => ADAMW_COPIES,
        Fused::LnResidual => LN_RESIDUAL,
        Fused::FlashDq => FLASH_DQ,
        Fused::Step => STEP,
        Fused::Pdl => PDL,
        Fused::EarlyWeights => EARLY_WEIGHTS,
        Fused::GemvHead => GEMV_HEAD,
        Fused::TriggerFirst => TRIGGER_FIRST,
        Fused::NormFold => NORM_FOLD,
        Fused::Cluster => CLUSTER,
        Fused::StepIo => STEP_IO,
        Fused::NormStats => NORM_STATS,
        Fused::SkinnyFold => SKINNY_FOLD,
        Fused::GemvWide => GEMV_WIDE,
        Fused::CacheFirst => CACHE_FIRST,
    }
}

/// Process-wide, like the matmul precision mode: set once from the command line.
pub fn set_enabled(list: &[Fused]) {
    ENABLED.store(
        list.iter().fold(0, |acc, &f| acc | bit(f)),
        Ordering::Relaxed,
    );
}

fn on(b: u64) -> bool {
    ENABLED.load(Ordering::Relaxed) & b != 0
}

/// Whether the fused path `f` (one path, not `All` / `None`) is switched on.
pub fn enabled(f: Fused) -> bool {
    on(bit(f))
}

/// The enabled paths as `--fused` takes them, for the log header ("none" when off).
pub fn describe() -> String {
    let names: Vec<&str> = [
        (LT, "lt"),
        (SOFTMAX, "softmax"),
        (BIAS_ACT, "bias-act"),
        (ADAMW, "adamw"),
        (LAYER_NORM, "layer-norm"),
        (DROPOUT, "dropout"),
        (XENT, "cross-entropy"),
        (DECODE, "decode"),
        (GRAPH, "graph"),
        (EMBEDDING, "embedding"),
        (HEADS, "heads"),
        (FLASH, "flash"),
        (RESIDUAL, "residual"),
        (GEMV, "gemv"),
        (SKINNY, "skinny"),
        (SKINNY_PROJ, "skinny-proj"),
        (ONESHOT, "oneshot"),
        (SPLIT_HEAD, "split-head"),
        (SUM_NORM, "sum-norm"),
        (COPY_SUM, "copy-sum"),
        (PREFILL, "prefill"),
        (PUSH_SUM, "push-sum"),
        (ADAMW_COPIES, "adamw-copies"),
        (LN_RESIDUAL, "ln-residual"),
        (FLASH_DQ, "flash-dq"),
        (STEP, "step"),
        (PDL, "pdl"),
        (EARLY_WEIGHTS, "early-weights"),
        (GEMV_HEAD, "gemv-head"),
        (TRIGGER_FIRST, "trigger-first"),
        (NORM_FOLD, "norm-fold"),
        (CLUSTER, "cluster"),
        (STEP_IO, "step-io"),
        (NORM_STATS, "norm-stats"),
        (SKINNY_FOLD, "skinny-fold"),
        (GEMV_WIDE, "gemv-wide"),
        (CACHE_FIRST, "cache-first"),
    ]
    .iter()
    .filter(|(b, _)| on(*b))
    .map(|&(_, n)| n)
    .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(",")
    }
}

/// The activation a fused epilogue applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    None,
    /// tanh approximation (gelu_new, bloom_gelu); cuBLASLt's GELU epilogue is this one.
    GeluTanh,
    GeluErf,
    Relu,
}

impl Act {
    /// The `act` argument of bias_act.cu.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn code(self) -> i32 {
        match self {
            Act::None => 0,
            Act::GeluTanh => 1,
            Act::GeluErf => 2,
            Act::Relu => 3,
        }
    }
}
