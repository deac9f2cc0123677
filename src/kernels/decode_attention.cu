// Single-query attention over the KV cache (#20), one new position a row, and the cache
// bookkeeping of a graphed decode step; launched by decode_attention.rs.
// Shapes: B batch, nh heads (of this rank), hs head size, C channels, T_max cached positions.
#include "common.cuh"
#include <cooperative_groups.h>

// Added to the score of a padding key: attention.rs's MASKED (finite, so that a row of padding
// gives a uniform softmax, not NaN).
#define MASKED (-1e9f)

// One new query per row against every cached key, one block per (row b, head h):
//   qkv:  (B, ·) row stride `qkv_stride`; head h's q at h·head_stride, its k at + part, its v
//         at + 2·part (GPT-2 [q | k | v]: head_stride hs, part C; BLOOM (nh, 3, hs): 3·hs, hs)
//   kc, vc: (B, nh, T_max, hs) the cache; the new k and v are written at position `pos`
//   key_mask: (B, T_max) f32, 1 real / 0 padding; keys 0..pos (inclusive) are attended
//   slopes: (nh,) f32 ALiBi slopes or null; key_pos: (B, T_max) f32 key positions (with slopes)
//   out:  (B, nh·hs), heads merged
//   cursor: null, or (1,) u32 positions written after this step's (a CUDA graph replays the
//         step at each position: pos = *cursor − 1 then, read on the device)
// Scores round through T as the composed q·kᵀ matmul's output, probabilities as the fused
// softmax's; sums in f32. Replaces the split-heads copies, the two cache copies, q·kᵀ, the
// softmax, p·v and the merge copy: eight launches a layer become one.
// Dynamic shared memory: (hs + pos + 1 + blockDim.x) floats (with a cursor: T_max for pos + 1).
template <typename T>
__device__ void decode_attention(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                                 const float* key_mask, const float* slopes, const float* key_pos, T* out,
                                 float scale, int nh, int hs, int t_max, int pos_arg, const uint32_t* cursor) {
  extern __shared__ float smem[];
  const int pos = cursor ? (int)*cursor - 1 : pos_arg;
  const int tk = pos + 1;
  float* q = smem;            // (hs,)
  float* p = smem + hs;       // (tk,) scores, then probabilities
  float* acc = p + tk;        // (blockDim.x,) partial p·v sums
  __shared__ float sh[32];
  const int b = blockIdx.x / nh, h = blockIdx.x % nh;
  const T* qr = qkv + b * qkv_stride + (long)h * head_stride;
  const long head_off = ((long)b * nh + h) * t_max * hs;
  T* kr = kc + head_off;
  T* vr = vc + head_off;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    q[d] = to_f(qr[d]);
    kr[(long)pos * hs + d] = qr[part + d];
    vr[(long)pos * hs + d] = qr[2 * part + d];
  }
  __syncthreads();  // q and the new key and value are visible to the whole block
  const float* mrow = key_mask + (long)b * t_max;
  const float slope = slopes ? slopes[h] : 0.f;
  // Scores: a thread a key, the dot product over hs in registers (independent loads).
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const T* ks = kr + (long)k * hs;
    float dot = 0.f;
    for (int d = 0; d < hs; ++d) dot += q[d] * to_f(ks[d]);
    float sc = to_f(from_f<T>(dot)) * scale + (1.f - mrow[k]) * MASKED;
    if (slopes) sc += slope * key_pos[(long)b * t_max + k];
    p[k] = sc;
    mx = fmaxf(mx, sc);
  }
  mx = block_max(mx, sh);
  float sum = 0.f;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float e = expf(p[k] - mx);
    p[k] = e;
    sum += e;
  }
  const float inv = 1.f / block_sum(sum, sh);  // its __syncthreads publish p
  // p·v: thread (group g, dim d), the groups split the keys; coalesced reads of v rows.
  const int groups = blockDim.x / hs, g = threadIdx.x / hs, d = threadIdx.x % hs;
  float a = 0.f;
  if (g < groups)
    for (int k = g; k < tk; k += groups) a += to_f(from_f<T>(p[k] * inv)) * to_f(vr[(long)k * hs + d]);
  acc[threadIdx.x] = a;
  __syncthreads();
  for (int j = threadIdx.x; j < hs; j += blockDim.x) {
    float o = 0.f;
    for (int gi = 0; gi < groups; ++gi) o += acc[gi * hs + j];
    out[(long)b * nh * hs + (long)h * hs + j] = from_f<T>(o);
  }
}

// decode_attention split over the keys (flash-decoding), for head sizes 64 and 128: block
// (row·head, s) takes keys [s·SPLIT_KEYS, (s + 1)·SPLIT_KEYS) with a warp a key, and finds its
// max score, its sum of exp(score − max) and its unnormalised p·v, which tb_decode_combine (from
// memory) or the block's cluster (`--fused cluster`, from shared memory) merges. One block per
// head (a thread a key; then a warp a key) kept a dozen SMs busy and waited on a chain of loads
// (ncu, bloom-560m: 16 blocks, 11–13 µs, 55–60 % of the cycles stalled on L1TEX). Every load is
// issued first: the keys and values (the new position's from qkv, not from the cache this block
// writes), the mask and positions, q straight from qkv; no barrier before the dot products
// (one H100, knob-run2: gpt2 0.271 → 0.263 ms a token, bloom-560m 0.720 → 0.706). The
// probabilities are not rounded to T before p·v here (the merge needs the sums first).
#define SPLIT_KEYS 64

// An unsigned word of BYTES bytes (4, 8 or 16), for loads of a lane's run of a row at once.
template <int BYTES>
struct WordOf;
template <>
struct WordOf<4> {
  using type = uint32_t;
};
template <>
struct WordOf<8> {
  using type = uint2;
};
template <>
struct WordOf<16> {
  using type = uint4;
};

// One split block's share: keys [s·SPLIT_KEYS, ...) of (row b, head h) = (bh / nh, bh % nh), s
// = blockIdx.y: its max score *mx, exp-sum *l (thread 0's) and unnormalised p·v in res[HS]
// (shared, complete for every thread on return). A split past the cache's end gives −∞, 0, 0.
template <typename T, int HS, bool CACHE_FIRST = false>
__device__ void split_attend(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                             const float* key_mask, const float* slopes, const float* key_pos, float scale, int nh,
                             int t_max, int pos_arg, const uint32_t* cursor, float* res, float* mx_out,
                             float* l_out) {
  constexpr int DPL = HS / 32;
  constexpr int WARPS = 8;  // blockDim.x == 256
  constexpr int PER_WARP = SPLIT_KEYS / WARPS;  // 8 keys a warp, all in flight
  __shared__ float p[SPLIT_KEYS];
  __shared__ float sums[WARPS][HS];
  __shared__ float sh[32];
  const int pos = cursor ? (int)*cursor - 1 : pos_arg;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bh = blockIdx.x, b = bh / nh, h = bh % nh;
  const int lo = blockIdx.y * SPLIT_KEYS, n = min(pos + 1 - lo, SPLIT_KEYS);
  const T* qr = qkv + b * qkv_stride + (long)h * head_stride;
  const long head_off = ((long)b * nh + h) * t_max * HS;
  T* kr = kc + head_off;
  T* vr = vc + head_off;
  const float* mrow = key_mask + (long)b * t_max;
  const float* prow = key_pos + (long)b * t_max;
  T key[PER_WARP][DPL], val[PER_WARP][DPL];
  float mk[PER_WARP], kp[PER_WARP];
  // CACHE_FIRST: the cached keys and values (a lane's DPL elements as one word: plain loads,
  // which ptxas keeps before the wait, unlike read-only ones; no streaming hint, which would
  // evict them from L2 for the next step), the mask and the positions here; the new
  // position's key and value from qkv after the wait.
  using Word = typename WordOf<DPL * sizeof(T)>::type;
#pragma unroll
  for (int u = 0; u < PER_WARP; ++u) {
    const int j = warp + u * WARPS, k = lo + j;
    if (j < n) {
      const bool fresh = k == pos;
      if (CACHE_FIRST && !fresh) {
        const Word kw = *reinterpret_cast<const Word*>(kr + (long)k * HS + lane * DPL);
        const Word vw = *reinterpret_cast<const Word*>(vr + (long)k * HS + lane * DPL);
        memcpy(key[u], &kw, sizeof(Word));
        memcpy(val[u], &vw, sizeof(Word));
      } else if (!CACHE_FIRST) {
        const T* ks = (fresh ? qr + part : kr + (long)k * HS) + lane * DPL;
        const T* vs = (fresh ? qr + 2 * part : vr + (long)k * HS) + lane * DPL;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          key[u][i] = ks[i];
          val[u][i] = vs[i];
        }
      }
      mk[u] = mrow[k];
      kp[u] = slopes ? prow[k] : 0.f;
    }
  }
  if constexpr (CACHE_FIRST) {
    pdl_begin();  // the qkv projection's output from here
#pragma unroll
    for (int u = 0; u < PER_WARP; ++u)
      if (lo + warp + u * WARPS == pos)
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          key[u][i] = qr[part + lane * DPL + i];
          val[u][i] = qr[2 * part + lane * DPL + i];
        }
  }
  if (n <= 0) {  // past the cache's end: nothing to merge
    for (int d = threadIdx.x; d < HS; d += blockDim.x) res[d] = 0.f;
    *mx_out = -INFINITY;
    *l_out = 0.f;
    __syncthreads();
    return;
  }
  float qd[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) qd[i] = to_f(qr[lane * DPL + i]);
  const float slope = slopes ? slopes[h] : 0.f;
  if (pos >= lo && pos < lo + n)  // this block holds the new position: into the cache
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
      kr[(long)pos * HS + d] = qr[part + d];
      vr[(long)pos * HS + d] = qr[2 * part + d];
    }
  float dot[PER_WARP];
#pragma unroll
  for (int u = 0; u < PER_WARP; ++u) {
    dot[u] = 0.f;
    if (warp + u * WARPS < n)
#pragma unroll
      for (int i = 0; i < DPL; ++i) dot[u] += qd[i] * to_f(key[u][i]);
    dot[u] = warp_sum(dot[u]);
  }
  if (lane == 0)
#pragma unroll
    for (int u = 0; u < PER_WARP; ++u) {
      const int j = warp + u * WARPS;
      if (j < n) p[j] = to_f(from_f<T>(dot[u])) * scale + (1.f - mk[u]) * MASKED + slope * kp[u];
    }
  __syncthreads();
  const float mx = block_max(threadIdx.x < n ? p[threadIdx.x] : -INFINITY, sh);
  float e = 0.f;
  if (threadIdx.x < n) {
    e = expf(p[threadIdx.x] - mx);
    p[threadIdx.x] = e;
  }
  const float l = block_sum(e, sh);  // its __syncthreads publish p
  float a[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) a[i] = 0.f;
#pragma unroll
  for (int u = 0; u < PER_WARP; ++u) {
    const int j = warp + u * WARPS;
    if (j < n)
#pragma unroll
      for (int i = 0; i < DPL; ++i) a[i] += p[j] * to_f(val[u][i]);
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) sums[warp][lane * DPL + i] = a[i];
  __syncthreads();
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) acc += sums[w][d];
    res[d] = acc;
  }
  *mx_out = mx;
  *l_out = l;
  __syncthreads();
}

// The split blocks' partials to memory, for tb_decode_combine.
//   part_m, part_l: (B·nh, S); part_acc: (B·nh, S, HS); other arguments as decode_attention
template <typename T, int HS>
__device__ void decode_attention_part(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                                      const float* key_mask, const float* slopes, const float* key_pos,
                                      float* part_m, float* part_l, float* part_acc, float scale, int nh, int t_max,
                                      int pos_arg, const uint32_t* cursor) {
  __shared__ float res[HS];
  float mx, l;
  split_attend<T, HS>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos, scale, nh, t_max,
                      pos_arg, cursor, res, &mx, &l);
  const long o = (long)blockIdx.x * gridDim.y + blockIdx.y;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) part_acc[o * HS + d] = res[d];
  if (threadIdx.x == 0) {
    part_m[o] = mx;
    part_l[o] = l;
  }
}

// Every split of a head in one thread-block cluster of CS blocks (Hopper; grid (B·nh, CS)):
// each split pushes its partials into the cluster's first block's shared memory, and after one
// cluster barrier that block merges them there into out (B, nh·hs), in tb_decode_combine's
// order (the same bits), without its launch: one kernel a layer instead of two. The barrier
// the pushes need (every block of the cluster started) is arrived at before the split's work
// and waited for after it.
template <typename T, int HS, int CS, bool CACHE_FIRST = false>
__device__ void decode_attention_cluster(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                                         const float* key_mask, const float* slopes, const float* key_pos, T* out,
                                         float scale, int nh, int t_max, int pos_arg, const uint32_t* cursor) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  __shared__ float res[HS];
  __shared__ float slot_acc[CS][HS];  // the first block's: each split's p·v
  __shared__ float slot_ml[CS][2];    // and its max and exp-sum
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  float mx, l;
  split_attend<T, HS, CACHE_FIRST>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos, scale,
                                   nh, t_max, pos_arg, cursor, res, &mx, &l);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = cluster.block_rank();
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every block started
  float* acc0 = cluster.map_shared_rank(&slot_acc[0][0], 0);
  float* ml0 = cluster.map_shared_rank(&slot_ml[0][0], 0);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) acc0[rank * HS + d] = res[d];
  if (threadIdx.x == 0) {
    ml0[2 * rank] = mx;
    ml0[2 * rank + 1] = l;
  }
  cluster.sync();  // every split's partials in the first block's shared memory
  if (rank != 0) return;
  float top = -INFINITY, den = 0.f, w[CS];
#pragma unroll
  for (int r = 0; r < CS; ++r) top = fmaxf(top, slot_ml[r][0]);
#pragma unroll
  for (int r = 0; r < CS; ++r) {
    w[r] = slot_ml[r][0] == -INFINITY ? 0.f : expf(slot_ml[r][0] - top);
    den += w[r] * slot_ml[r][1];
  }
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float num = 0.f;
#pragma unroll
    for (int r = 0; r < CS; ++r) num += w[r] * slot_acc[r][d];
    out[(long)blockIdx.x * HS + d] = from_f<T>(num / den);
  }
#endif
}

// decode_attention with a block a (row, head) over all its keys, for head sizes 64 and 128
// where the heads alone fill the GPU and the cache holds at most 256 positions (batch 16:
// decode_attention.rs picks it): no merge kernel.
// Every load a round needs (q, keys, values, mask, positions) is issued at once, and the next
// round's before this round's arithmetic. At batch 16 the split kernel above and its merge
// cost 11–14 µs a layer inside the graph (results/h100x2/ablate1); this one took gpt2's step
// 0.503 → 0.478 ms and bloom-560m's 1.220 → 1.120 (attn1). At batch 1 (few heads) it took the
// split kernel's place too, with 64-key blocks and the merge: 1–11 µs a step slower; the split
// kernel stays there.
// Lanes: a group of G = HS / EV lanes reads a key's row in 16-byte vectors (EV elements each);
// a warp holds KPW = 32 / G keys at a time, R of them a lane a round, and keeps a running max, sum
// and p·v (online softmax) for its keys; the warps' results meet in shared memory. The new
// position's key and value are read from qkv (and written to the cache by their block), so no
// block waits for its own write. Probabilities are not rounded to T before p·v (as the split
// kernel's); scores round through T as the composed q·kᵀ's output. Arguments as
// decode_attention's (hs in the kernel's name).
constexpr int HEAD_WARPS = 8;  // blockDim.x == 256

// k and v as raw 16-byte words: held as Vec16<T> (16-bit elements), each load was followed at
// once by the moves that unpack it, so the lane waited for each key before loading the next
// (the SASS: results/h100/attn-prof61); unpacked where used.
template <typename T, int HS>
struct HeadRound {
  static constexpr int EV = 16 / sizeof(T), G = HS / EV, KPW = 32 / G;
  static constexpr int R = 2;  // keys a lane a round
  uint4 k[R], v[R];
  float mask[R], kpos[R];
};

// A raw 16-byte word as its elements.
template <typename T>
__device__ __forceinline__ Vec16<T> unpack(const uint4& w) {
  Vec16<T> v;
  memcpy(&v, &w, sizeof(v));
  return v;
}

// The key of slot u of round `base` for this lane's group.
template <typename T, int HS>
__device__ __forceinline__ int round_key(int base, int u) {
  using S = HeadRound<T, HS>;
  return base + (u * HEAD_WARPS + (threadIdx.x >> 5)) * S::KPW + (threadIdx.x & 31) / S::G;
}

// Round `base`'s loads for this lane (keys by round_key).
template <typename T, int HS>
__device__ __forceinline__ void load_round(HeadRound<T, HS>& r, int base, int hi, int pos, const T* kr,
                                           const T* vr, const T* qr, int part, const float* mrow,
                                           const float* prow, bool alibi) {
  using S = HeadRound<T, HS>;
  const int gl = (threadIdx.x & 31) % S::G;
#pragma unroll
  for (int u = 0; u < S::R; ++u) {
    const int j = round_key<T, HS>(base, u);
    if (j < hi) {
      const bool fresh = j == pos;  // the new position: from qkv
      const T* ks = fresh ? qr + part : kr + (long)j * HS;
      const T* vs = fresh ? qr + 2 * part : vr + (long)j * HS;
      r.k[u] = reinterpret_cast<const uint4*>(ks)[gl];
      r.v[u] = reinterpret_cast<const uint4*>(vs)[gl];
      r.mask[u] = mrow[j];
      r.kpos[u] = alibi ? prow[j] : 0.f;
    }
  }
}

// exp(a − b) with −inf − −inf as 0 (a running max before any key).
__device__ __forceinline__ float rescale(float a, float b) { return a == -INFINITY ? 0.f : expf(a - b); }

template <typename T, int HS>
__device__ void decode_attention_head(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                                      const float* key_mask, const float* slopes, const float* key_pos, T* out,
                                      float scale, int nh, int t_max, int pos_arg, const uint32_t* cursor) {
  using S = HeadRound<T, HS>;
  constexpr int EV = S::EV, G = S::G, KPR = HEAD_WARPS * S::KPW * S::R;
  __shared__ float wm[HEAD_WARPS], wl[HEAD_WARPS], wacc[HEAD_WARPS][HS];
  const int pos = cursor ? (int)*cursor - 1 : pos_arg;
  const int tk = pos + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gl = lane % G;
  const int bh = blockIdx.x, b = bh / nh, h = bh % nh;
  const T* qr = qkv + b * qkv_stride + (long)h * head_stride;
  const long head_off = ((long)b * nh + h) * t_max * HS;
  T* kr = kc + head_off;
  T* vr = vc + head_off;
  const float* mrow = key_mask + (long)b * t_max;
  const float* prow = key_pos + (long)b * t_max;
  const float slope = slopes ? slopes[h] : 0.f;
  HeadRound<T, HS> cur, next;
  load_round<T, HS>(cur, 0, tk, pos, kr, vr, qr, part, mrow, prow, slopes != nullptr);
  const Vec16<T> qv = reinterpret_cast<const Vec16<T>*>(qr)[gl];
  if (threadIdx.x < 2 * G) {  // the new key and value into the cache
    const int t = threadIdx.x % G, which = threadIdx.x / G;
    const Vec16<T>* src = reinterpret_cast<const Vec16<T>*>(qr + (which + 1) * part);
    reinterpret_cast<Vec16<T>*>((which ? vr : kr) + (long)pos * HS)[t] = src[t];
  }
  float m = -INFINITY, l = 0.f, acc[EV];
#pragma unroll
  for (int e = 0; e < EV; ++e) acc[e] = 0.f;
  for (int base = 0; base < tk; base += KPR) {
    if (base + KPR < tk) load_round<T, HS>(next, base + KPR, tk, pos, kr, vr, qr, part, mrow, prow, slopes != nullptr);
    float sc[S::R], mx = m;
#pragma unroll
    for (int u = 0; u < S::R; ++u) {
      float dot = 0.f;
      const Vec16<T> key = unpack<T>(cur.k[u]);
#pragma unroll
      for (int e = 0; e < EV; ++e) dot += to_f(qv.e[e]) * to_f(key.e[e]);
#pragma unroll
      for (int o = G / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
      sc[u] = -INFINITY;
      if (round_key<T, HS>(base, u) < tk) sc[u] = to_f(from_f<T>(dot)) * scale + (1.f - cur.mask[u]) * MASKED + slope * cur.kpos[u];
      mx = fmaxf(mx, sc[u]);
    }
    if (mx != -INFINITY) {
      const float c = rescale(m, mx);
      l *= c;
#pragma unroll
      for (int e = 0; e < EV; ++e) acc[e] *= c;
#pragma unroll
      for (int u = 0; u < S::R; ++u) {
        if (sc[u] == -INFINITY) continue;  // past the block's keys: its registers never loaded
        const float p = expf(sc[u] - mx);
        l += p;
        const Vec16<T> val = unpack<T>(cur.v[u]);
#pragma unroll
        for (int e = 0; e < EV; ++e) acc[e] += p * to_f(val.e[e]);
      }
      m = mx;
    }
    cur = next;
  }
  // The warp's groups (lanes gl, gl + G, ...) merged, then the warps in shared memory.
#pragma unroll
  for (int o = G; o < 32; o <<= 1) {
    const float mo = __shfl_xor_sync(0xffffffff, m, o), lo_ = __shfl_xor_sync(0xffffffff, l, o);
    const float mm = fmaxf(m, mo), ca = rescale(m, mm), cb = rescale(mo, mm);
    l = l * ca + lo_ * cb;
#pragma unroll
    for (int e = 0; e < EV; ++e) acc[e] = acc[e] * ca + __shfl_xor_sync(0xffffffff, acc[e], o) * cb;
    m = mm;
  }
  if (lane < G)
#pragma unroll
    for (int e = 0; e < EV; ++e) wacc[warp][gl * EV + e] = acc[e];
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
  __syncthreads();
  float mm = -INFINITY;
#pragma unroll
  for (int w = 0; w < HEAD_WARPS; ++w) mm = fmaxf(mm, wm[w]);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < HEAD_WARPS; ++w) {
      const float c = rescale(wm[w], mm);
      num += c * wacc[w][d];
      den += c * wl[w];
    }
    out[(long)bh * HS + d] = from_f<T>(num / den);  // den ≥ 1: key pos is real
  }
}

// Merges a head's split blocks: out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s, M the
// largest m_s; one block (hs threads) per (row, head), heads merged on the way out.
//   out: (B, nh·hs)
template <typename T>
__device__ void decode_combine(const float* part_m, const float* part_l, const float* part_acc, T* out, int splits,
                               int hs) {
  const int bh = blockIdx.x;
  const float* m = part_m + (long)bh * splits;
  const float* l = part_l + (long)bh * splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m[s]);
  float den = 0.f, num = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float w = m[s] == -INFINITY ? 0.f : expf(m[s] - mx);
    den += w * l[s];
    if (threadIdx.x < hs) num += w * part_acc[((long)bh * splits + s) * hs + threadIdx.x];
  }
  if (threadIdx.x < hs) out[(long)bh * hs + threadIdx.x] = from_f<T>(num / den);
}

// The cache bookkeeping of one decode step at the position in `cursor` (device memory, so that
// a CUDA graph of the step replays at every position): each row's new token is real; its
// position is the row's real tokens so far. One block:
//   mask, key_pos: (B, T_max) f32, written at *cursor; seen: (B,) f32 real tokens per row,
//   advanced; positions: (B,) f32 out, the new tokens' positions; cursor: (1,) u32, advanced.
extern "C" __global__ void tb_decode_begin(float* mask, float* key_pos, float* seen, float* positions,
                                           uint32_t* cursor, int b, int t_max) {
  pdl_begin();
  const uint32_t pos = *cursor;
  for (int r = threadIdx.x; r < b; r += blockDim.x) {
    const float p = seen[r];
    mask[(long)r * t_max + pos] = 1.f;
    key_pos[(long)r * t_max + pos] = p;
    positions[r] = p;
    seen[r] = p + 1.f;
  }
  __syncthreads();  // every thread has read the cursor
  if (threadIdx.x == 0) *cursor = pos + 1;
}

// The merge twice: waiting first and, named _tf, letting the next kernel start first
// (`--fused trigger-first`).
#define COMBINE(T, S, TF, BEGIN)                                                                   \
  extern "C" __global__ void tb_decode_combine##TF##_##S(const float* part_m, const float* part_l, \
                                                         const float* part_acc, T* out, int splits, \
                                                         int hs) {                                 \
    BEGIN();                                                                                       \
    decode_combine<T>(part_m, part_l, part_acc, out, splits, hs);                                  \
  }
// One kernel a head size, each with its own register allocation.
#define HEAD_KERNEL(T, S, HS)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256, 2) tb_decode_attention_head##HS##_##S(                   \
      const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc, const float* key_mask,          \
      const float* slopes, const float* key_pos, T* out, float scale, int nh, int t_max, int pos,             \
      const uint32_t* cursor) {                                                                               \
    pdl_begin();                                                                                              \
    decode_attention_head<T, HS>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos, out,  \
                                 scale, nh, t_max, pos, cursor);                                              \
  }
#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_decode_attention_##S(const T* qkv, long qkv_stride, int head_stride, int part, \
                                                     T* kc, T* vc, const float* key_mask, const float* slopes, \
                                                     const float* key_pos, T* out, float scale, int nh, int hs, \
                                                     int t_max, int pos, const uint32_t* cursor) {            \
    pdl_begin();                                                                                              \
    decode_attention<T>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos, out, scale, nh, \
                        hs, t_max, pos, cursor);                                                              \
  }                                                                                                           \
  extern "C" __global__ void tb_decode_attention_part_##S(                                                    \
      const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc, const float* key_mask,          \
      const float* slopes, const float* key_pos, float* part_m, float* part_l, float* part_acc, float scale,  \
      int nh, int hs, int t_max, int pos, const uint32_t* cursor) {                                           \
    pdl_begin();                                                                                              \
    if (hs == 64)                                                                                             \
      decode_attention_part<T, 64>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos,     \
                                   part_m, part_l, part_acc, scale, nh, t_max, pos, cursor);                  \
    else                                                                                                      \
      decode_attention_part<T, 128>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos,    \
                                    part_m, part_l, part_acc, scale, nh, t_max, pos, cursor);                 \
  }                                                                                                           \
  HEAD_KERNEL(T, S, 64) HEAD_KERNEL(T, S, 128)                                                                \
  COMBINE(T, S, , pdl_begin) COMBINE(T, S, _tf, pdl_begin_trigger_first)
FOR_TYPES(INSTANTIATE)

// tb_decode_attention_c<CS>_<type>: the split attention and its merge in one launch, a cluster
// of CS blocks a (row, head), for caches of at most CS·SPLIT_KEYS keys (decode_attention.rs).
#define CLUSTER(T, S, CS)                                                                                     \
  extern "C" __global__ void __cluster_dims__(1, CS, 1) tb_decode_attention_c##CS##_##S(                     \
      const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc, const float* key_mask,          \
      const float* slopes, const float* key_pos, T* out, float scale, int nh, int hs, int t_max, int pos,     \
      const uint32_t* cursor) {                                                                               \
    pdl_begin();                                                                                              \
    if (hs == 64)                                                                                             \
      decode_attention_cluster<T, 64, CS>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes,       \
                                          key_pos, out, scale, nh, t_max, pos, cursor);                       \
    else                                                                                                      \
      decode_attention_cluster<T, 128, CS>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes,      \
                                           key_pos, out, scale, nh, t_max, pos, cursor);                      \
  }
// tb_decode_attention_cf<CS>_h<HS>_<type> (`--fused cache-first`): the cluster kernel reading
// the cursor, its split's cached keys and values, the mask and the positions before it waits
// for the qkv projection, and only q and the new key and value after: one L2 round trip after
// the wait instead of two (the cursor, then what its position selects). Everything it reads
// early was written before it launched: by the step's first kernel (the cursor, the mask and
// the positions at the new position), which has ended before the embedding, waiting first,
// lets the next kernel launch (kernels/pdl.rs, CACHE_FIRST), or by an earlier step (the
// cache). One wait a kernel (a head size a kernel), so that the PTX test sees what comes
// before it.
#define CLUSTER_CF(T, S, CS, HS)                                                                              \
  extern "C" __global__ void __cluster_dims__(1, CS, 1) tb_decode_attention_cf##CS##_h##HS##_##S(            \
      const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc, const float* key_mask,          \
      const float* slopes, const float* key_pos, T* out, float scale, int nh, int hs, int t_max, int pos,     \
      const uint32_t* cursor) {                                                                               \
    decode_attention_cluster<T, HS, CS, true>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes,   \
                                              key_pos, out, scale, nh, t_max, pos, cursor);                   \
  }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define CLUSTERS(T, S)                                                                                        \
  CLUSTER(T, S, 2) CLUSTER(T, S, 4) CLUSTER(T, S, 8) CLUSTER_CF(T, S, 2, 64) CLUSTER_CF(T, S, 4, 64)          \
  CLUSTER_CF(T, S, 8, 64) CLUSTER_CF(T, S, 2, 128) CLUSTER_CF(T, S, 4, 128) CLUSTER_CF(T, S, 8, 128)
FOR_TYPES(CLUSTERS)
#endif
