// The blocks of a decode step in one persistent kernel (#37, `--fused step`), launched by
// decode_step.rs: one block an SM, the layers' stages separated by grid-wide barriers instead of
// kernel boundaries, and each stage's weights streamed into shared memory (Hopper's bulk copy)
// while the stages before it run, so that the weights' latency hides under the barriers.
// A layer (GPT-2 and BLOOM, pre-LayerNorm):
//   S1 qkv = LN1(x) Wqkvᵀ + b       S2 attention of one new query a row over the cache
//   S3 x1 = x + (att Wprojᵀ + b)    S4 a = GELU(LN2(x1) Wfcᵀ + b)    S5 x = x1 + (a Wfc2ᵀ + b)
// then out = LN_f(x). Each stage rounds where the kernels it replaces round (the projections'
// outputs, the residual sums, the normed inputs, the scores): gpu_tests/step.rs. Hopper
// (sm_90: CUDA_COMPUTE_CAP=90, as the GPU build sets it) copies the weights with the bulk
// copy; an older target's PTX copies them synchronously in the stage that reads them.
// Shapes: M rows (batch, one new position each), C channels, I the MLP's inner size, nh heads
// of hs, T_max cached positions; weights nn.Linear (out, in), contiguous.
#include "common.cuh"

#define MASKED (-1e9f)  // decode_attention.cu's padding score
#define STEP_THREADS 512
#define STEP_WARPS 16
#define STEP_MAX_LAYERS 64

// One layer's weights: the table decode_step.rs uploads, a row a layer.
template <typename T>
struct LayerW {
  const T *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
};

// Each layer's cache, (M, nh, T_max, hs) keys and values (by value: 1 KiB of parameters).
struct StepCaches {
  unsigned long long k[STEP_MAX_LAYERS], v[STEP_MAX_LAYERS];
};

// Sizes, the attention's layout (decode_attention.cu's head_stride and part) and the dynamic
// shared memory's layout (byte offsets, computed once by decode_step.rs).
struct StepDims {
  int n_layer, c, inner, nh, hs, t_max, head_stride, part, pos, splits;
  float eps, scale;
  int wbuf, off_x, off_part, off_p, off_acc, off_q, off_w, off_bias, off_res;
};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Reads of what other blocks wrote in this launch go through L2 (an SM's L1 is not coherent).
template <typename T>
__device__ __forceinline__ T ldcg(const T* p) {
  if constexpr (sizeof(T) == 2) {
    const unsigned short u = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return *reinterpret_cast<const T*>(&u);
  } else {
    return __ldcg(p);
  }
}
template <typename T>
__device__ __forceinline__ Vec16<T> ldcg16(const Vec16<T>* p) {
  const int4 u = __ldcg(reinterpret_cast<const int4*>(p));
  return *reinterpret_cast<const Vec16<T>*>(&u);
}

// ---- grid-wide barrier: a counter that each block's thread 0 raises, zeroed at exit ----

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block's writes before it are visible to every block after it (CUTLASS's generic
// barrier: a release add, acquire loads). `passed` counts the barriers so far times the grid;
// a block missing for 2 s (not resident: a grid larger than the GPU holds at once) traps
// instead of hanging the GPU. With `trace`, each block's arrival and departure times.
__device__ void grid_sync(unsigned* count, unsigned& passed, unsigned long long* trace) {
  __syncthreads();
  passed += gridDim.x;
  if (threadIdx.x == 0) {
    const unsigned k = passed / gridDim.x;  // this barrier's number, from 1
    if (trace) trace[(2 * k - 1) * gridDim.x + blockIdx.x] = global_ns();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    const unsigned long long t0 = global_ns();
    for (unsigned spins = 1; ld_acquire(count) < passed; ++spins)
      if (spins % 1024 == 0 && global_ns() - t0 > 2000000000ull) __trap();
    if (trace) trace[2 * k * gridDim.x + blockIdx.x] = global_ns();
  }
  __syncthreads();
}

// Inside a stage, with `trace`: this block's time at the stage's mark `which` (0 or 1), in
// the rows after the barriers' (2 + 10·L + 2·stage + which, the stage counted from 0).
__device__ __forceinline__ unsigned long long* mark_row(unsigned long long* trace, int n_layer, unsigned passed,
                                                        int which) {
  if (!trace) return nullptr;
  return trace + (2 + 10 * n_layer + 2 * (passed / gridDim.x) + which) * gridDim.x;
}
__device__ __forceinline__ void mark(unsigned long long* row) {
  if (row && threadIdx.x == 0) row[blockIdx.x] = global_ns();
}

// After the last barrier: the last block out zeroes the counters for the next launch (every
// block has left its last wait by then).
__device__ void grid_exit(unsigned* sync) {
  if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
    sync[0] = 0;
    sync[1] = 0;
    __threadfence();
  }
}

// ---- weights into shared memory: a block's run of output columns, rows contiguous ----

// The block's columns of an N-column projection: [col0, col0 + ncols).
__device__ __forceinline__ void tile_of(int n, int& col0, int& ncols) {
  const int per = (n + gridDim.x - 1) / gridDim.x;
  col0 = blockIdx.x * per;
  ncols = max(0, min(per, n - col0));
}

// The thread that starts the weights' copies: not thread 0, whose release add at the grid
// barrier waited for copies it had started (results/h100/step-run83: the barriers after a copy
// 2.3-3.3 us with thread 0 starting it, 1.0-2.3 with thread 32, 0.8 after none).
#define COPIER 32

// Thread COPIER starts the copy of the block's rows of W (N, K) into buf; `bar` completes with it.
// Not inlined: inlined at its seven calls it made the step spill (ptxas, sm_90).
template <typename T>
__device__ __noinline__ void fetch_tile(const T* w, int n, int k, unsigned char* buf, unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  int col0, ncols;
  tile_of(n, col0, ncols);
  if (threadIdx.x != COPIER || ncols == 0) return;
  const unsigned bytes = (unsigned)ncols * k * sizeof(T);
  // The block's reads of buf (generic proxy) ordered before the copy's writes (async proxy).
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
  const char* src = reinterpret_cast<const char*>(w + (long)col0 * k);
  // Read once a step: first out of L2, before the activations and the prefetched cache lines.
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  for (unsigned o = 0; o < bytes; o += 32768u) {
    const unsigned len = min(32768u, bytes - o);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            smem_u32(buf + o)),
        "l"(src + o), "r"(len), "r"(smem_u32(bar)), "l"(policy)
        : "memory");
  }
#endif
}

// Waits for fetch_tile's rows (before Hopper: copies them now, the whole block).
template <typename T>
__device__ void wait_tile(const T* w, int n, int k, unsigned char* buf, unsigned long long* bar, unsigned& parity) {
  int col0, ncols;
  tile_of(n, col0, ncols);
  if (ncols == 0) return;
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}" ::"r"(
          smem_u32(bar)),
      "r"(parity)
      : "memory");
  parity ^= 1u;
#else
  const int4* src = reinterpret_cast<const int4*>(w + (long)col0 * k);
  int4* dst = reinterpret_cast<int4*>(buf);
  for (int i = threadIdx.x; i < ncols * k * (int)sizeof(T) / 16; i += blockDim.x) dst[i] = src[i];
  __syncthreads();
#endif
}

// ---- small reads into L2 ahead of their stage ----

// The 128-byte lines of [p, p + bytes) prefetched into L2 by the block's threads.
__device__ __forceinline__ void prefetch_l2(const void* p, long bytes) {
  const unsigned long long from = reinterpret_cast<unsigned long long>(p) & ~127ull;
  const unsigned long long end = reinterpret_cast<unsigned long long>(p) + bytes;
  for (unsigned long long a = from + threadIdx.x * 128ull; a < end; a += blockDim.x * 128ull)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// What the block's attention units (attend's) read from the cache: each unit's keys and values,
// its mask and positions. Issued a stage ahead, so that the attention's loads hit L2 instead of
// queueing behind the weights' copies (step-run84: the scores' max 6.1 us after the release).
template <typename T>
__device__ void prefetch_units(const T* kc, const T* vc, const StepDims& d, int rows, int pos, const float* key_mask,
                               const float* key_pos, const float* slopes) {
  const int ks_len = (d.t_max + d.splits - 1) / d.splits;
  for (int unit = blockIdx.x; unit < rows * d.nh * d.splits; unit += gridDim.x) {
    const int bh = unit / d.splits, sp = unit % d.splits, b = bh / d.nh;
    const int lo = sp * ks_len, n = max(0, min(ks_len, pos + 1 - lo));
    if (n == 0) continue;
    const long off = (long)bh * d.t_max * d.hs + (long)lo * d.hs;
    prefetch_l2(kc + off, (long)n * d.hs * sizeof(T));
    prefetch_l2(vc + off, (long)n * d.hs * sizeof(T));
    prefetch_l2(key_mask + (long)b * d.t_max + lo, n * 4l);
    if (slopes) prefetch_l2(key_pos + (long)b * d.t_max + lo, n * 4l);
  }
}

// The columns a block takes of an N-column projection at most (tile_of's `per`).
__device__ __forceinline__ int per_block(int n) { return (n + gridDim.x - 1) / gridDim.x; }

// Every layer's biases of the block's columns into shared memory `out`, once a step: a layer's
// per_block(3C) qkv, then proj's per_block(C), fc's per_block(I), fc2's per_block(C) (the
// projections' outputs then wait on no global load: step-run86 had fc and fc2 2.8-3.3 us from
// their weights in shared memory to their outputs).
template <typename T>
__device__ void stage_biases(const LayerW<T>* layers, const StepDims& d, T* out) {
  const int ns[4] = {3 * d.c, d.c, d.inner, d.c};
  int col0[4], ncols[4], per[4], per_layer = 0;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    tile_of(ns[p], col0[p], ncols[p]);
    per[p] = per_block(ns[p]);
    per_layer += per[p];
  }
  for (int i = threadIdx.x; i < d.n_layer * per_layer; i += blockDim.x) {
    const int l = i / per_layer;
    int r = i % per_layer, p = 0;
    while (p < 3 && r >= per[p]) r -= per[p++];
    const LayerW<T>& w = layers[l];
    const T* b = p == 0 ? w.qkv_b : p == 1 ? w.proj_b : p == 2 ? w.fc_b : w.fc2_b;
    if (r < ncols[p]) out[i] = b[col0[p] + r];
  }
}

// ---- the stages ----

// xs (M, K) = rows of `in` (M, K), through LayerNorm (w, b) when w is given: layer_norm.cu's
// add_layer_norm without the add (two passes over the row in registers; K <= 8·512).
template <typename T, int M>
__device__ void stage_input(const T* in, const T* w, const T* b, T* xs, int k, float eps, float* sh) {
  if (!w) {
    const int kv = k * (int)sizeof(T) / 16;
    for (int i = threadIdx.x; i < M * kv; i += blockDim.x)
      reinterpret_cast<Vec16<T>*>(xs)[i] = ldcg16(reinterpret_cast<const Vec16<T>*>(in) + i);
    __syncthreads();
    return;
  }
  // The norm's weight and bias loaded with the first row, not after its two reductions.
  float gw[8], gb[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int j = threadIdx.x + u * STEP_THREADS;
    gw[u] = j < k ? to_f(w[j]) : 0.f;
    gb[u] = j < k ? to_f(b[j]) : 0.f;
  }
  for (int m = 0; m < M; ++m) {
    float v[8], sum = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = threadIdx.x + u * STEP_THREADS;
      v[u] = j < k ? to_f(ldcg(in + (long)m * k + j)) : 0.f;
      sum += v[u];
    }
    const float mean = block_sum(sum, sh) / k;
    float var = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (threadIdx.x + u * STEP_THREADS < k) var += (v[u] - mean) * (v[u] - mean);
    const float rstd = rsqrtf(block_sum(var, sh) / k + eps);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = threadIdx.x + u * STEP_THREADS;
      if (j < k) xs[m * k + j] = from_f<T>((v[u] - mean) * rstd * gw[u] + gb[u]);
    }
  }
  __syncthreads();
}

// The block's columns of y (M, N) = act(xs Wᵀ + b), W's rows for them in `wt` (shared), xs in
// shared, b's in `bias` (shared, the block's columns); with `res`, y = res + that (rounded as
// the branch, then as the add; res may be y). `keep` (shared, M · per_block(N), or null): the
// block's columns of y kept for the next projection of the same columns, whose `res` they are
// (`kept`: read res from it, not from memory).
// Warps a column: as many as 16 warps share among the block's columns (split K), their sums
// met in `part`.
template <typename T, int M>
__device__ void project(const T* wt, const T* xs, const T* bias, T* y, const T* res, T* keep, bool kept, int n, int k,
                        bool gelu, float* part) {
  int col0, ncols;
  tile_of(n, col0, ncols);
  if (ncols == 0) return;
  const int kv = k * (int)sizeof(T) / 16;
  int split = 1;
  while (split * 2 * ncols <= STEP_WARPS) split *= 2;
  const int groups = STEP_WARPS / split, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = warp / split, s = warp % split;
  // The first output a thread finishes: its residual, when not kept, loaded under the dot
  // products (every block's ncols·M fits the block at the models' widths; more take the loop's).
  float res0 = 0.f;
  if (res && !kept && threadIdx.x < ncols * M) {
    const int j = threadIdx.x / M, m = threadIdx.x % M;
    res0 = to_f(ldcg(res + (long)m * n + col0 + j));
  }
  const Vec16<T>* xv = reinterpret_cast<const Vec16<T>*>(xs);
  for (int j = g; j < ncols; j += groups) {
    const Vec16<T>* row = reinterpret_cast<const Vec16<T>*>(wt) + (long)j * kv;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
#pragma unroll 4
    for (int i = s * 32 + lane; i < kv; i += 32 * split) {
      const Vec16<T> wv = row[i];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const Vec16<T> x = xv[m * kv + i];
#pragma unroll
        for (int e = 0; e < 16 / (int)sizeof(T); ++e) acc[m] += to_f(wv.e[e]) * to_f(x.e[e]);
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc[m] = warp_sum(acc[m]);
      if (lane == 0) part[(j * split + s) * M + m] = acc[m];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ncols * M; idx += blockDim.x) {
    const int j = idx / M, m = idx % M, col = col0 + j;
    const bool first = idx == (int)threadIdx.x;
    float v = to_f(bias[j]);
    for (int t = 0; t < split; ++t) v += part[(j * split + t) * M + m];
    if (gelu) v = gelu_tanh(v);
    T out = from_f<T>(v);
    T* kept_at = keep ? keep + m * per_block(n) + j : nullptr;
    if (res) {
      const float r = kept ? to_f(*kept_at) : first ? res0 : to_f(ldcg(res + (long)m * n + col));
      out = from_f<T>(r + to_f(out));
    }
    if (keep) *kept_at = out;
    y[(long)m * n + col] = out;
  }
}

// The attention of one new query a row over keys 0..pos, split over the keys (flash-decoding)
// so that most blocks take a part: unit (row b, head h, split s) takes keys [s·KS, (s + 1)·KS),
// KS = ceil(T_max / splits), a key's 16-byte vectors over as many threads (a thread a key where
// a row is not a power of two of vectors up to 32), and writes its max score, its sum of
// exp(score − max) and its unnormalised p·v (f32) to `ml` (M, nh, splits, 2) and `pv` (M,
// nh, splits, hs); merge_heads merges them in the next stage. Rounded where decode_attention.cu's
// split attention rounds. The split holding pos first writes the new key and value there.
// `loaded()`: called by every thread once the block's first unit's loads have arrived (to start
// a weight copy behind them); not at all by a block without a unit with keys.
template <typename T, typename F>
__device__ void attend(const T* qkv, T* kc, T* vc, float* ml, float* pv, const StepDims& d, int rows, int pos,
                       const float* key_mask, const float* key_pos, const float* slopes, unsigned char* smem,
                       float* sh, unsigned long long* scored, unsigned long long* summed, const F& loaded) {
  constexpr int E = 16 / sizeof(T);
  constexpr int VREG = 4;   // the values a thread of p·v holds (its first four keys)
  float* q = reinterpret_cast<float*>(smem + d.off_q);
  float* p = reinterpret_cast<float*>(smem + d.off_p);
  float* acc = reinterpret_cast<float*>(smem + d.off_acc);
  const int hs = d.hs, tk = pos + 1, ks_len = (d.t_max + d.splits - 1) / d.splits;
  const int hv = hs / E, groups = blockDim.x / hs, g = threadIdx.x / hs, jd = threadIdx.x % hs;
  for (int unit = blockIdx.x; unit < rows * d.nh * d.splits; unit += gridDim.x) {
    const int bh = unit / d.splits, sp = unit % d.splits, b = bh / d.nh, h = bh % d.nh;
    const int lo = sp * ks_len, n = max(0, min(ks_len, tk - lo));
    if (n == 0) {  // past the cache's end: nothing to merge
      if (threadIdx.x == 0) ml[2 * unit] = -INFINITY, ml[2 * unit + 1] = 0.f;
      for (int j = threadIdx.x; j < hs; j += blockDim.x) pv[(long)unit * hs + j] = 0.f;
      continue;
    }
    const T* qr = qkv + (long)b * 3 * d.c + (long)h * d.head_stride;
    const long head_off = ((long)b * d.nh + h) * d.t_max * hs;
    T* kr = kc + head_off;
    T* vr = vc + head_off;
    const float* mrow = key_mask + (long)b * d.t_max;
    const float* prow = key_pos + (long)b * d.t_max;
    // Every load of the unit first, none waiting on another (the new position's key and value
    // from qkv, as the cache will hold them): with `grouped`, a key's hv vectors over hv
    // threads, its first pass of keys held (a vector a thread), its mask and position; each
    // thread's first values; then the query.
    const bool grouped = hv <= 32 && (hv & (hv - 1)) == 0;
    const int sub = threadIdx.x % hv, kslot = threadIdx.x / hv, per_pass = blockDim.x / hv;
    Vec16<T> key;
    float mk = 0.f, kp = 0.f;
    if (grouped && kslot < n) {
      const int kk = lo + kslot;
      if (kk == pos) {
#pragma unroll
        for (int e = 0; e < E; ++e) key.e[e] = ldcg(qr + d.part + sub * E + e);
      } else {
        key = ldcg16(reinterpret_cast<const Vec16<T>*>(kr + (long)kk * hs) + sub);
      }
      mk = mrow[kk];
      kp = slopes ? prow[kk] : 0.f;
    }
    float val[VREG];
#pragma unroll
    for (int r = 0; r < VREG; ++r) {
      const int i = g + r * groups, kk = lo + i;
      val[r] = g < groups && i < n ? to_f(ldcg(kk == pos ? qr + 2 * d.part + jd : vr + (long)kk * hs + jd)) : 0.f;
    }
    const bool writes = pos >= lo && pos < lo + n;
    for (int j = threadIdx.x; j < hs; j += blockDim.x) {
      q[j] = to_f(ldcg(qr + j));
      if (writes) {
        kr[(long)pos * hs + j] = ldcg(qr + d.part + j);
        vr[(long)pos * hs + j] = ldcg(qr + 2 * d.part + j);
      }
    }
    __syncthreads();
    if (unit == (int)blockIdx.x) loaded();
    const float slope = slopes ? slopes[h] : 0.f;
    float mx = -INFINITY;
    if (grouped) {
      // Scores: hv threads a key, their sums met by shuffles within the group.
      for (int j = kslot, pass = 0; j - kslot < n; j += per_pass, ++pass) {
        const int kk = lo + j;
        float dot = 0.f;
        if (j < n) {
          const Vec16<T> kx = pass == 0 ? key : ldcg16(reinterpret_cast<const Vec16<T>*>(kr + (long)kk * hs) + sub);
#pragma unroll
          for (int e = 0; e < E; ++e) dot += q[sub * E + e] * to_f(kx.e[e]);
        }
        for (int o = 1; o < hv; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (j < n && sub == 0) {
          const float m = pass == 0 ? mk : mrow[kk];
          float sc = to_f(from_f<T>(dot)) * d.scale + (1.f - m) * MASKED;
          if (slopes) sc += slope * (pass == 0 ? kp : prow[kk]);
          p[j] = sc;
          mx = fmaxf(mx, sc);
        }
      }
    } else {
      // Scores: a thread a key, its row in 16-byte loads (hs·sizeof(T) % 16 == 0).
      for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int kk = lo + j;
        const Vec16<T>* kv = reinterpret_cast<const Vec16<T>*>(kr + (long)kk * hs);
        float dot = 0.f;
#pragma unroll 8
        for (int i = 0; i < hv; ++i) {
          const Vec16<T> kx = ldcg16(kv + i);
#pragma unroll
          for (int e = 0; e < E; ++e) dot += q[i * E + e] * to_f(kx.e[e]);
        }
        float sc = to_f(from_f<T>(dot)) * d.scale + (1.f - mrow[kk]) * MASKED;
        if (slopes) sc += slope * prow[kk];
        p[j] = sc;
        mx = fmaxf(mx, sc);
      }
    }
    mx = block_max(mx, sh);
    mark(scored);
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float e = expf(p[j] - mx);
      p[j] = e;
      sum += e;
    }
    const float l = block_sum(sum, sh);  // its __syncthreads publish p
    mark(summed);
    // p·v: thread (group g, dim jd), the groups split the keys; coalesced reads of v rows.
    float a = 0.f;
    if (g < groups) {
#pragma unroll
      for (int r = 0; r < VREG; ++r)
        if (g + r * groups < n) a += p[g + r * groups] * val[r];
#pragma unroll 4
      for (int i = g + VREG * groups; i < n; i += groups) a += p[i] * to_f(ldcg(vr + (long)(lo + i) * hs + jd));
    }
    acc[threadIdx.x] = a;
    __syncthreads();
    for (int jj = threadIdx.x; jj < hs; jj += blockDim.x) {
      float o = 0.f;
      for (int gi = 0; gi < groups; ++gi) o += acc[gi * hs + jj];
      pv[(long)unit * hs + jj] = o;
    }
    if (threadIdx.x == 0) ml[2 * unit] = mx, ml[2 * unit + 1] = l;
    __syncthreads();  // q, p and acc are the next unit's
  }
}

// xs (M, C) = the attention's output, heads merged: for each (row, head) the splits' partials
// merged as decode_attention.cu's decode_combine merges its 64-key splits, Σ_s w_s·pv_s with
// w_s = e^(m_s − max) / Σ e^(m_s − max)·l_s (the same terms, the division first).
// Every split's (m, l) first into `wt` (shared, 2·M·nh·splits floats), all loads in flight at
// once rather than a chain of them, then each split's weight in its m's place.
template <typename T, int M>
__device__ void merge_heads(const float* ml, const float* pv, T* xs, float* wt, const StepDims& d) {
  constexpr int PREG = 16;  // the partials a thread holds: its first outputs' splits
  const int hs = d.hs, splits = d.splits, units = M * d.nh * splits;
  // The partials loaded with the (m, l) pairs, not after the weights they wait for.
  float held[PREG];
#pragma unroll
  for (int r = 0; r < PREG; ++r) {
    const int idx = threadIdx.x + (r / 8) * blockDim.x, sp = r % 8;
    const int bh = idx / hs, j = idx % hs;
    held[r] = idx < M * d.c && sp < splits ? __ldcg(pv + ((long)bh * splits + sp) * hs + j) : 0.f;
  }
  for (int u = threadIdx.x; u < 2 * units; u += blockDim.x) wt[u] = __ldcg(ml + u);
  __syncthreads();
  for (int bh = threadIdx.x; bh < M * d.nh; bh += blockDim.x) {
    float* m = wt + 2 * bh * splits;  // (m, l) pairs of this head's splits
    float mx = -INFINITY, den = 0.f;
    for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, m[2 * sp]);
    for (int sp = 0; sp < splits; ++sp) {
      const float w = m[2 * sp] == -INFINITY ? 0.f : expf(m[2 * sp] - mx);
      m[2 * sp] = w;
      den += w * m[2 * sp + 1];
    }
    for (int sp = 0; sp < splits; ++sp) m[2 * sp] /= den;
  }
  __syncthreads();
  for (int idx = threadIdx.x, it = 0; idx < M * d.c; idx += blockDim.x, ++it) {
    const int bh = idx / hs, j = idx % hs;  // row-major (M, nh, hs): bh = b·nh + h
    const float* part = pv + (long)bh * splits * hs + j;
    const float* w = wt + 2 * bh * splits;
    float num = 0.f;
    if (it < 2 && splits <= 8) {  // the held partials (it and sp known to the unrolled loop)
#pragma unroll
      for (int sp = 0; sp < 8; ++sp)
        if (sp < splits) num += w[2 * sp] * (it == 0 ? held[sp] : held[8 + sp]);
    } else {
#pragma unroll 8
      for (int sp = 0; sp < splits; ++sp) num += w[2 * sp] * __ldcg(part + (long)sp * hs);
    }
    xs[idx] = from_f<T>(num);
  }
  __syncthreads();
}

// ---- the step ----

// x_in (M, C): the residual stream entering layer 0 (GPT-2: token + position embeddings;
// BLOOM: the embeddings' LayerNorm), not written. work: qkv (M, 3C), the attention's partials
// ml (M, nh, splits, 2) and pv (M, nh, splits, hs) f32, mlp (M, I), resid (M, C), all
// scratch. out (M, C) = LN_f(the last layer's residual stream). sync: 2 u32, zero between
// launches. trace: null, or (2 + 20·L, grid) u64 times (ns): each block's start, its arrival
// at and departure from each barrier, its end; then two marks a stage (mark_row). Launch: grid = the SMs (all resident),
// STEP_THREADS.
template <typename T, int M>
__device__ void decode_step(const LayerW<T>* layers, const StepCaches& caches, const StepDims& d, const T* lnf_w,
                            const T* lnf_b, const T* x_in, T* qkv, float* ml, float* pv, T* mlp, T* resid, T* out,
                            const float* key_mask, const float* key_pos, const float* slopes, const uint32_t* cursor,
                            unsigned* sync, unsigned long long* trace) {
  if (trace && threadIdx.x == 0) trace[blockIdx.x] = global_ns();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bars[2];
  __shared__ float sh[32];
  unsigned char* buf[2] = {smem, smem + d.wbuf};
  T* xs = reinterpret_cast<T*>(smem + d.off_x);
  float* part = reinterpret_cast<float*>(smem + d.off_part);
  const int pos = cursor ? (int)*cursor - 1 : d.pos;
  const int c = d.c, ic = d.inner;
  unsigned passed = 0, parity[2] = {0u, 0u};
#if __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[i])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
#endif
  T* biases = reinterpret_cast<T*>(smem + d.off_bias);
  T* keep = reinterpret_cast<T*>(smem + d.off_res);  // the block's columns of the residual stream
  stage_biases(layers, d, biases);  // read after stage_input's barrier
  const int pq = per_block(3 * c), pc = per_block(c), pi = per_block(ic), per_layer = pq + 2 * pc + pi;
  // Buffer 0 takes qkv and fc, buffer 1 proj and fc2. Each copy starts in the stage after its
  // buffer's last reader, once that stage's own input is in shared memory (the attention's:
  // its first loads), one to two stages before the copy's reader: a copy started before a
  // barrier lengthened the barrier (results/h100/step-run83), one started with a stage's loads
  // delayed them (step-run84 to step-run86).
  fetch_tile(layers[0].qkv_w, 3 * c, c, buf[0], &bars[0]);
  fetch_tile(layers[0].proj_w, c, c, buf[1], &bars[1]);
  const T* x = x_in;
  for (int l = 0; l < d.n_layer; ++l) {
    const LayerW<T> w = layers[l];
    const bool more = l + 1 < d.n_layer;
    // S1: qkv = LN1(x) Wqkvᵀ + b; the layer's small reads after this stage into L2 under it
    prefetch_units<T>(reinterpret_cast<const T*>(caches.k[l]), reinterpret_cast<const T*>(caches.v[l]), d, M, pos,
                      key_mask, key_pos, slopes);
    prefetch_l2(w.ln2_w, (long)c * sizeof(T));
    prefetch_l2(w.ln2_b, (long)c * sizeof(T));
    stage_input<T, M>(x, w.ln1_w, w.ln1_b, xs, c, d.eps, sh);
    if (l > 0) fetch_tile(w.proj_w, c, c, buf[1], &bars[1]);
    mark(mark_row(trace, d.n_layer, passed, 0));
    wait_tile(w.qkv_w, 3 * c, c, buf[0], &bars[0], parity[0]);
    mark(mark_row(trace, d.n_layer, passed, 1));
    const T* lb = biases + l * per_layer;  // the layer's biases: qkv, proj, fc, fc2
    project<T, M>(reinterpret_cast<const T*>(buf[0]), xs, lb, qkv, nullptr, nullptr, false, 3 * c, c, false, part);
    grid_sync(sync, passed, trace);
    // S2: the attention
    bool fetched = false;
    attend<T>(qkv, reinterpret_cast<T*>(caches.k[l]), reinterpret_cast<T*>(caches.v[l]), ml, pv, d, M, pos, key_mask,
              key_pos, slopes, smem, sh, mark_row(trace, d.n_layer, passed, 0), mark_row(trace, d.n_layer, passed, 1),
              [&] {
                fetch_tile(w.fc_w, ic, c, buf[0], &bars[0]);
                fetched = true;
              });
    if (!fetched) fetch_tile(w.fc_w, ic, c, buf[0], &bars[0]);  // no unit, or none with keys
    grid_sync(sync, passed, trace);
    // S3: x1 = x + (att Wprojᵀ + b)
    merge_heads<T, M>(ml, pv, xs, reinterpret_cast<float*>(smem + d.off_w), d);
    mark(mark_row(trace, d.n_layer, passed, 0));
    wait_tile(w.proj_w, c, c, buf[1], &bars[1], parity[1]);
    mark(mark_row(trace, d.n_layer, passed, 1));
    // The residual is the columns this block wrote in the layer before (its fc2's), except at 0.
    project<T, M>(reinterpret_cast<const T*>(buf[1]), xs, lb + pq, resid, x, keep, l > 0, c, c, false, part);
    x = resid;
    grid_sync(sync, passed, trace);
    // S4: a = GELU(LN2(x1) Wfcᵀ + b)
    stage_input<T, M>(x, w.ln2_w, w.ln2_b, xs, c, d.eps, sh);
    fetch_tile(w.fc2_w, c, ic, buf[1], &bars[1]);
    mark(mark_row(trace, d.n_layer, passed, 0));
    wait_tile(w.fc_w, ic, c, buf[0], &bars[0], parity[0]);
    mark(mark_row(trace, d.n_layer, passed, 1));
    project<T, M>(reinterpret_cast<const T*>(buf[0]), xs, lb + pq + pc, mlp, nullptr, nullptr, false, ic, c, true, part);
    grid_sync(sync, passed, trace);
    // S5: x = x1 + (a Wfc2ᵀ + b); the next layer's first norm into L2 under it
    if (more) {
      prefetch_l2(layers[l + 1].ln1_w, (long)c * sizeof(T));
      prefetch_l2(layers[l + 1].ln1_b, (long)c * sizeof(T));
    }
    stage_input<T, M>(mlp, nullptr, nullptr, xs, ic, d.eps, sh);
    if (more) fetch_tile(layers[l + 1].qkv_w, 3 * c, c, buf[0], &bars[0]);
    mark(mark_row(trace, d.n_layer, passed, 0));
    wait_tile(w.fc2_w, c, ic, buf[1], &bars[1], parity[1]);
    mark(mark_row(trace, d.n_layer, passed, 1));
    project<T, M>(reinterpret_cast<const T*>(buf[1]), xs, lb + pq + pc + pi, resid, resid, keep, true, c, ic, false,
                  part);
    grid_sync(sync, passed, trace);
  }
  // out = LN_f(x), a block a row
  if (blockIdx.x < M) {
    stage_input<T, M>(x, lnf_w, lnf_b, xs, c, d.eps, sh);  // every row's norm; this block's row out
    for (int j = threadIdx.x; j < c; j += blockDim.x) out[(long)blockIdx.x * c + j] = xs[blockIdx.x * c + j];
  }
  if (trace && threadIdx.x == 0) trace[(2 * passed / gridDim.x + 1) * gridDim.x + blockIdx.x] = global_ns();
  grid_exit(sync);
}

#define INSTANTIATE_M(T, S, M)                                                                                       \
  extern "C" __global__ void __launch_bounds__(STEP_THREADS, 1) tb_decode_step##M##_##S(                            \
      const LayerW<T>* layers, StepCaches caches, StepDims d, const T* lnf_w, const T* lnf_b, const T* x_in, T* qkv, \
      float* ml, float* pv, T* mlp, T* resid, T* out, const float* key_mask, const float* key_pos,                   \
      const float* slopes, const uint32_t* cursor, unsigned* sync, unsigned long long* trace) {                      \
    decode_step<T, M>(layers, caches, d, lnf_w, lnf_b, x_in, qkv, ml, pv, mlp, resid, out, key_mask, key_pos, slopes, \
                      cursor, sync, trace);                                                                          \
  }
#define INSTANTIATE(T, S) INSTANTIATE_M(T, S, 1) INSTANTIATE_M(T, S, 2) INSTANTIATE_M(T, S, 3) INSTANTIATE_M(T, S, 4)
FOR_TYPES(INSTANTIATE)
