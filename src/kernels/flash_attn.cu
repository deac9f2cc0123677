// Fused causal attention for training (#21 item 2), launched by flash_attn.rs: FlashAttention-2's
// tiling on tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate; mma.cuh). The (T, T) scores never
// reach memory: the forward keeps one log-sum-exp a row, the backward recomputes the
// probabilities from it. The composed path (two batched matmuls + attn_softmax.cu, and five
// matmuls + its backward) wrote and read them at 201 MB a layer for gpt2 at 8 × 1024.
//
// Shapes: B batch, T time, nh heads, HS = 64 head size, C = nh·HS.
//   qkv, dqkv (B, T, 3C) = [q | k | v], the attention projection's rows, read and written in
//   place (no head split or merge); y, dy (B, T, C); lse, dsum (B, nh, T) f32.
// A block of 4 warps takes 64 rows of one (b, h): each warp 16 rows; a loop walks the 64-row
// tiles of the other side up to the diagonal (causal), the next tile copied in (cp.async)
// while this one is used. Every product is warp-local; the shared tiles are the operands all
// four warps read (ldmatrix), and a product's accumulators are the next product's A operand,
// so P, Pᵀ, dSᵀ and dS stay in registers (FlashAttention-2's layout; the wmma kernels before
// c28dda5 stored them to shared memory and took 1.9× as long, dq 1.4×: docs/perf-notes.md).
// The tile loads are flash_tiles.cuh's, the products and stores mma.cuh's.
// lse is kept in base 2 (m·log2 e + log2 l): the scores are scaled by scale·log2 e once.
// Dropout on the probabilities (#36): the mask of dropout.cuh's hash over the (B, nh, T, T)
// probabilities' flat index, drawn in the forward and redrawn in the backward's kernels (the
// dk/dv one, and the dq one where dq has its own); the row sums and lse stay those of the
// undropped probabilities, dsum = Σ dy·y holds as is.
// dq two ways (`--fused flash-dq`, #36): in the dk/dv kernel from its dSᵀ (through shared
// memory), summed over the key tiles by f32 atomics into a (B, T, C) buffer the dsum kernel
// zeroes and a cast writes into dqkv (FlashAttention-2's way); or by a third kernel that
// recomputes s and dp for its query tile (no atomics: dq bit-reproducible).
#include "dropout.cuh"
#include "flash_tiles.cuh"
#include "mma.cuh"

#define HS 64
#define LD tile_ld<HS>()  // shared row stride of a 16-bit tile
#define TILE_ELEMS (TILE * LD)

// The attention dropout (thresh 0: none; scale is then 1). The launcher passes it only where
// every flat index of the (B, nh, T, T) probabilities fits 32 bits and T is even, so an index
// is a u32, a pair's word keep_word32 and a row's pairs start at even columns. Kept
// probabilities enter the products unscaled; the outputs (y, dv) take 1 / (1 − p) once.
struct Drop {
  unsigned int klo, khi, thresh;
  float scale;  // 1 / (1 − p)
  // The word of the pair holding flat index i.
  __device__ __forceinline__ unsigned int word(unsigned int i) const { return keep_word32(klo, khi, i >> 1); }
  // Whether the element at `half` (0 low, 1 high) of a word is kept.
  __device__ __forceinline__ bool keeps(unsigned int w, int half) const {
    return (half ? w >> 16 : w & 0xffffu) >= thresh;
  }
};

// The operand tiles: two buffers of two tiles (the one in use, the next one arriving) and 64
// rows' lse and dsum in two buffers (the dk/dv kernel's).
template <typename T> struct Shared {
  T x[2][TILE_ELEMS], y[2][TILE_ELEMS];
  float lse[2][TILE], dsum[2][TILE];
};
// The dk/dv kernel's with dq (dynamic shared memory: 56 KB): the block's keys kept as dq's B
// operand, and dSᵀ (64 keys × 64 queries) as its A operand.
template <typename T> struct SharedDq : Shared<T> {
  T k[TILE_ELEMS], ds[TILE_ELEMS];
};

// Accumulator element e of tile j: row g + 8·(e / 2), column 8j + 2t + e % 2 of the warp's
// 16 × 64 (g = lane / 4, t = lane % 4; mma.cuh).
__device__ __forceinline__ int acc_row(int e) { return ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int j, int e) { return 8 * j + 2 * (threadIdx.x & 3) + (e & 1); }

__device__ __forceinline__ void zero(float (&a)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) a[j][e] = 0.f;
}

// out[r][:] += acc for rows r = r0 + g, r0 + g + 8 below T (row stride `stride` floats), four
// columns an atomic (sm_90's float4 atomicAdd, its result unused: a reduction; four scalar ones
// on older GPUs). Lanes t, t ^ 1 swap halves: the even one adds row g's columns 8j + 2t..+3,
// the odd one row g + 8's 8j + 2t − 2..+1.
__device__ __forceinline__ void red_acc(const float (&acc)[8][4], float* out, long stride, int r0, int T_) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, odd = t & 1;
  const int r = r0 + g + 8 * odd;
  float4* row = reinterpret_cast<float4*>(out + (long)r * stride + 2 * (t - odd));
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const float x0 = odd ? acc[j][0] : acc[j][2], x1 = odd ? acc[j][1] : acc[j][3];
    const float y0 = __shfl_xor_sync(0xffffffff, x0, 1), y1 = __shfl_xor_sync(0xffffffff, x1, 1);
    const float4 v = odd ? make_float4(y0, y1, acc[j][2], acc[j][3]) : make_float4(acc[j][0], acc[j][1], y0, y1);
    if (r >= T_) continue;
#if __CUDA_ARCH__ >= 900
    atomicAdd(row + 2 * j, v);
#else
    float* f = reinterpret_cast<float*>(row + 2 * j);
    atomicAdd(f, v.x), atomicAdd(f + 1, v.y), atomicAdd(f + 2, v.z), atomicAdd(f + 3, v.w);
#endif
  }
}

// y = softmax(q kᵀ·scale, causal) v, and lse. Grid (⌈T/64⌉, B·nh), 128 threads; the query
// tiles run longest first. Each lane keeps the max and sum of its two rows (g, g + 8).
template <typename T>
__device__ void flash_fwd(const T* qkv, T* y, float* lse, int T_, int nh, float scale2, Drop drop) {
  __shared__ __align__(128) Shared<T> sh;
  const int w = threadIdx.x / 32, g = (threadIdx.x & 31) / 4;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, q0 = qt * TILE, qw = q0 + w * 16;
  const long stride = 3L * C;
  const T* q_src = qkv + (long)b * T_ * stride + h * HS;
  load_tile<HS>(sh.x[1], q_src, stride, q0, T_);  // q, staged where tile 1 goes later
  load_tile<HS>(sh.x[0], q_src + C, stride, 0, T_);
  load_tile<HS>(sh.y[0], q_src + 2 * C, stride, 0, T_);
  cp_async_commit();
  cp_async_wait();
  __syncthreads();
  uint32_t qa[4][4], pa[4][4];
  load_a<LD>(qa, sh.x[1], w * 16);
  float s[8][4], o[8][4];
  zero(o);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // The flat index of the lane's rows g and g + 8 in the probabilities (dropout only).
  const unsigned int rb0 = (unsigned int)(bh * T_ + qw + g) * (unsigned int)T_, rb1 = rb0 + 8u * T_;
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE, buf = kt & 1;
    cp_async_wait();
    __syncthreads();  // tile kt is in; every warp is done with tile kt − 1 (and q)
    if (kt < qt) {
      load_tile<HS>(sh.x[buf ^ 1], q_src + C, stride, k0 + TILE, T_);
      load_tile<HS>(sh.y[buf ^ 1], q_src + 2 * C, stride, k0 + TILE, T_);
      cp_async_commit();
    }
    zero(s);
    mma_abt<LD>(s, qa, sh.x[buf]);
    const bool edge = kt == qt || k0 + TILE > T_;  // some key past a row or past T
    float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + acc_col(j, e);
        const float v = edge && (key > qw + acc_row(e) || key >= T_) ? -INFINITY : s[j][e] * scale2;
        s[j][e] = v;
        if (e < 2) x0 = fmaxf(x0, v); else x1 = fmaxf(x1, v);
      }
    // Tile kt ≤ qt holds key k0 ≤ every row's position: each max is finite.
    const float n0 = fmaxf(m0, quad_max(x0)), n1 = fmaxf(m1, quad_max(x1));
    const float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);  // 0 on the first tile
    m0 = n0, m1 = n1;
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float v = exp2f(s[j][e] - (e < 2 ? n0 : n1));
        if (e < 2) s0 += v; else s1 += v;
        s[j][e] = v;
        o[j][e] *= e < 2 ? a0 : a1;
      }
      if (drop.thresh)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {  // row g (elements 0, 1), row g + 8 (2, 3): a word each
          const unsigned int wd = drop.word((hh ? rb1 : rb0) + k0 + acc_col(j, 0));
          if (!drop.keeps(wd, 0)) s[j][2 * hh] = 0.f;
          if (!drop.keeps(wd, 1)) s[j][2 * hh + 1] = 0.f;
        }
    }
    l0 = l0 * a0 + quad_sum(s0), l1 = l1 * a1 + quad_sum(s1);
    to_a<T>(pa, s);
    mma_ab<LD>(o, pa, sh.y[buf]);
  }
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[j][e] /= e < 2 ? l0 : l1;
  store_acc<T>(o, drop.scale, y + (long)b * T_ * C + h * HS, C, qw, T_);
  if ((threadIdx.x & 3) == 0) {
    float* out = lse + (long)bh * T_ + qw;
    if (qw + g < T_) out[g] = m0 + log2f(l0);
    if (qw + g + 8 < T_) out[g + 8] = m1 + log2f(l1);
  }
}

// dsum[b, h, t] = Σ_d dy · y over a head's row: 8 lanes a row (16 bytes each), 4 rows a warp,
// grid-strided; and where dq_acc is not null (dq by atomics), zeros over the row's 64 floats of
// dq_acc (B, T, C). y and dy 16-byte aligned.
template <typename T>
__device__ void flash_bwd_dsum(const T* y, const T* dy, float* dsum, float* dq_acc, int B, int T_, int nh) {
  const int lane = threadIdx.x & 31, part = lane & 7;
  const long rows = (long)B * T_ * nh, warps = (long)gridDim.x * blockDim.x / 32;
  for (long i4 = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32; 4 * i4 < rows; i4 += warps) {
    const long i = 4 * i4 + lane / 8;  // the row (b, t, h): y's elements i·64.. (rows of C = nh·64)
    const bool in = i < rows;
    float acc = 0.f;
    if (in) {
      const uint4 yv = reinterpret_cast<const uint4*>(y + i * HS)[part];
      const uint4 dv = reinterpret_cast<const uint4*>(dy + i * HS)[part];
      const T* ye = reinterpret_cast<const T*>(&yv);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; e++) acc += to_f(ye[e]) * to_f(de[e]);
    }
    acc += __shfl_xor_sync(0xffffffff, acc, 1);
    acc += __shfl_xor_sync(0xffffffff, acc, 2);
    acc += __shfl_xor_sync(0xffffffff, acc, 4);
    if (!in) continue;
    const long bt = i / nh, h = i % nh, b = bt / T_, t = bt % T_;
    if (part == 0) dsum[(b * nh + h) * T_ + t] = acc;
    if (dq_acc) {
      float4* z = reinterpret_cast<float4*>(dq_acc + i * HS) + 2 * part;
      z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// Rows t0.. of lse and dsum (zeros past T) into buffer `buf` (plain loads: 64 floats each).
template <typename T>
__device__ void load_row_stats(Shared<T>& sh, int buf, const float* lse, const float* dsum, int t0, int T_) {
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    const bool in = t0 + i < T_;
    sh.lse[buf][i] = in ? lse[t0 + i] : 0.f;
    sh.dsum[buf][i] = in ? dsum[t0 + i] : 0.f;
  }
}

// The dk/dv kernel's dq of its query tile from these keys: the warp's 16 queries' rows of ds
// (rows r.. of dSᵀ's transpose: dSᵀ, 64 keys × 64 queries, in shared memory) times the keys,
// added to dq_acc's rows q0 + r.. (row stride C). a and acc are the caller's registers, free here.
template <typename T>
__device__ __forceinline__ void dq_from_ds(const T* ds_t, const T* k, uint32_t (&a)[4][4], float (&acc)[8][4],
                                           float* dq_acc, int C, int q0, int r, int T_) {
  load_a_t<LD>(a, ds_t, r);  // ds: the warp's 16 queries × the tile's 64 keys
  zero(acc);
  mma_ab<LD>(acc, a, k);  // (16 queries × 64 dims)
  red_acc(acc, dq_acc, C, q0 + r, T_);
}

// dk and dv of one 64-key tile: for every query tile at or past it (q in x, dO in y), sᵀ = k qᵀ,
// pᵀ from lse, dv += pᵀ dO, dpᵀ = v dOᵀ, dsᵀ = pᵀ ⊙ (dpᵀ − dsum), dk += dsᵀ q · scale; a warp's
// 16 keys are the rows of each product. With DQ (sh a SharedDq) also dq of the query tile
// from these keys, ds k (a warp's 16 queries, dS read back transposed from shared memory),
// added to dq_acc (B, T, C) f32 unscaled. Grid (⌈T/64⌉, B·nh), 128 threads; block 0 has the
// most query tiles.
template <typename T, bool DQ, typename S>
__device__ void flash_bwd_dkv(S& sh, const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv,
                              float* dq_acc, int T_, int nh, float scale, float scale2, Drop drop) {
  const int w = threadIdx.x / 32, g = (threadIdx.x & 31) / 4;
  const int kt = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, k0 = kt * TILE, kw = k0 + w * 16, nq = (T_ + TILE - 1) / TILE;
  const long stride = 3L * C, row0 = (long)b * T_;
  const T* q_src = qkv + row0 * stride + h * HS;
  const T* dy_src = dy + row0 * C + h * HS;
  lse += (long)bh * T_, dsum += (long)bh * T_;
  T* k_tile;  // k stays in shared memory with DQ; else staged where the second buffer goes
  if constexpr (DQ) k_tile = sh.k; else k_tile = sh.x[1];
  load_tile<HS>(k_tile, q_src + C, stride, k0, T_);
  load_tile<HS>(sh.y[1], q_src + 2 * C, stride, k0, T_);
  load_tile<HS>(sh.x[0], q_src, stride, k0, T_);
  load_tile<HS>(sh.y[0], dy_src, C, k0, T_);
  cp_async_commit();
  load_row_stats(sh, 0, lse, dsum, k0, T_);
  cp_async_wait();
  __syncthreads();
  uint32_t ka[4][4], va[4][4], pa[4][4];
  load_a<LD>(ka, k_tile, w * 16);
  load_a<LD>(va, sh.y[1], w * 16);
  float s[8][4], dp[8][4], dk[8][4], dv[8][4];
  zero(dk), zero(dv);
  const unsigned int odd = g & 1;
  for (int qt = kt; qt < nq; qt++) {
    const int q0 = qt * TILE, buf = (qt - kt) & 1;
    cp_async_wait();
    __syncthreads();  // tile qt is in; every warp is done with tile qt − 1 (and its dSᵀ)
    if (qt + 1 < nq) {
      load_tile<HS>(sh.x[buf ^ 1], q_src, stride, q0 + TILE, T_);
      load_tile<HS>(sh.y[buf ^ 1], dy_src, C, q0 + TILE, T_);
      cp_async_commit();
      load_row_stats(sh, buf ^ 1, lse, dsum, q0 + TILE, T_);
    }
    const float* lse_s = sh.lse[buf];
    const float* dsum_s = sh.dsum[buf];
    zero(s);
    mma_abt<LD>(s, ka, sh.x[buf]);  // sᵀ (16 keys × 64 queries)
    const bool edge = qt == kt || q0 + TILE > T_;
    // A lane's neighbours in the flat index (keys k, k + 1) sit in lanes g, g ^ 1 (lane ^ 4):
    // each of the two hashes the words of one of its two rows and they swap. A dropped
    // probability is kept negated in s for dsᵀ (p ≥ 0): no mask registers.
    const unsigned int qb = (unsigned int)(bh * T_ + q0);
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = acc_col(j, e);
        const bool seen = !edge || (kw + acc_row(e) <= q0 + c && q0 + c < T_);
        s[j][e] = seen ? exp2f(s[j][e] * scale2 - lse_s[c]) : 0.f;
      }
    if (drop.thresh)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {  // e: column 2t + e, rows g (element e) and g + 8 (e + 2)
          const unsigned int c = acc_col(j, e);
          const unsigned int mine = drop.word((qb + c) * (unsigned int)T_ + kw + g + (odd ? 8 : 0));
          const unsigned int other = __shfl_xor_sync(0xffffffff, mine, 4);
          if (!drop.keeps(odd ? other : mine, odd)) s[j][e] = -s[j][e];
          if (!drop.keeps(odd ? mine : other, odd)) s[j][e + 2] = -s[j][e + 2];
        }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {  // pᵀ with the dropped ones zero
      pa[kk][0] = pack2<T>(fmaxf(s[2 * kk][0], 0.f), fmaxf(s[2 * kk][1], 0.f));
      pa[kk][1] = pack2<T>(fmaxf(s[2 * kk][2], 0.f), fmaxf(s[2 * kk][3], 0.f));
      pa[kk][2] = pack2<T>(fmaxf(s[2 * kk + 1][0], 0.f), fmaxf(s[2 * kk + 1][1], 0.f));
      pa[kk][3] = pack2<T>(fmaxf(s[2 * kk + 1][2], 0.f), fmaxf(s[2 * kk + 1][3], 0.f));
    }
    mma_ab<LD>(dv, pa, sh.y[buf]);
    zero(dp);
    mma_abt<LD>(dp, va, sh.y[buf]);  // dpᵀ (16 keys × 64 queries)
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float pv = s[j][e], dpk = pv > 0.f ? dp[j][e] * drop.scale : 0.f;
        dp[j][e] = fabsf(pv) * (dpk - dsum_s[acc_col(j, e)]);
      }
    to_a<T>(pa, dp);
    if constexpr (DQ) store_a<LD>(sh.ds, pa, w * 16);
    mma_ab<LD>(dk, pa, sh.x[buf]);
    if constexpr (DQ) {
      __syncthreads();  // every warp's dSᵀ rows are in
      dq_from_ds<T>(sh.ds, sh.k, pa, s, dq_acc + row0 * C + h * HS, C, q0, w * 16, T_);
    }
  }
  T* out = dqkv + row0 * stride + h * HS;
  store_acc<T>(dk, scale, out + C, stride, kw, T_);
  store_acc<T>(dv, drop.scale, out + 2 * C, stride, kw, T_);
}

// dqkv's q columns = dq_acc (B, T, C) · scale in T, 4 values a thread, grid-strided.
template <typename T>
__device__ void flash_bwd_dq_cast(const float* dq_acc, T* dqkv, long rows, int C, float scale) {
  const long n4 = rows * C / 4;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(dq_acc)[i];
    const long r = 4 * i / C, c = 4 * i % C;
    uint2 out;
    out.x = pack2<T>(v.x * scale, v.y * scale);
    out.y = pack2<T>(v.z * scale, v.w * scale);
    *reinterpret_cast<uint2*>(dqkv + r * 3 * C + c) = out;
  }
}

// dq of one 64-query tile (its q and dO held as A operands, its rows' lse and dsum in
// registers): for every key tile up to the diagonal (k in x, v in y), s = q kᵀ, p from lse,
// dp = dO vᵀ, ds = p ⊙ (dp − dsum), dq += ds k · scale. Grid (⌈T/64⌉, B·nh), longest first.
template <typename T>
__device__ void flash_bwd_dq(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,
                             int nh, float scale, float scale2, Drop drop) {
  __shared__ __align__(128) Shared<T> sh;
  const int w = threadIdx.x / 32, g = (threadIdx.x & 31) / 4;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, q0 = qt * TILE, qw = q0 + w * 16;
  const long stride = 3L * C, row0 = (long)b * T_;
  const T* q_src = qkv + row0 * stride + h * HS;
  load_tile<HS>(sh.x[1], q_src, stride, q0, T_);  // q and dO, staged where the second buffer goes
  load_tile<HS>(sh.y[1], dy + row0 * C + h * HS, C, q0, T_);
  load_tile<HS>(sh.x[0], q_src + C, stride, 0, T_);
  load_tile<HS>(sh.y[0], q_src + 2 * C, stride, 0, T_);
  cp_async_commit();
  const long at = (long)bh * T_ + qw + g;
  // The flat index of the lane's rows g and g + 8 in the probabilities (dropout only).
  const unsigned int rb0 = (unsigned int)(bh * T_ + qw + g) * (unsigned int)T_, rb1 = rb0 + 8u * T_;
  const bool in0 = qw + g < T_, in1 = qw + g + 8 < T_;
  const float lse0 = in0 ? lse[at] : 0.f, lse1 = in1 ? lse[at + 8] : 0.f;
  const float ds0 = in0 ? dsum[at] : 0.f, ds1 = in1 ? dsum[at + 8] : 0.f;
  cp_async_wait();
  __syncthreads();
  uint32_t qa[4][4], doa[4][4], pa[4][4];
  load_a<LD>(qa, sh.x[1], w * 16);
  load_a<LD>(doa, sh.y[1], w * 16);
  float s[8][4], dp[8][4], dq[8][4];
  zero(dq);
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE, buf = kt & 1;
    cp_async_wait();
    __syncthreads();
    if (kt < qt) {
      load_tile<HS>(sh.x[buf ^ 1], q_src + C, stride, k0 + TILE, T_);
      load_tile<HS>(sh.y[buf ^ 1], q_src + 2 * C, stride, k0 + TILE, T_);
      cp_async_commit();
    }
    zero(s), zero(dp);
    mma_abt<LD>(s, qa, sh.x[buf]);
    mma_abt<LD>(dp, doa, sh.y[buf]);
    const bool edge = kt == qt || k0 + TILE > T_;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      unsigned int wd[2] = {0u, 0u};
      if (drop.thresh) wd[0] = drop.word(rb0 + k0 + acc_col(j, 0)), wd[1] = drop.word(rb1 + k0 + acc_col(j, 0));
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + acc_col(j, e);
        const bool seen = !edge || (key <= qw + acc_row(e) && key < T_);
        const float pr = seen ? exp2f(s[j][e] * scale2 - (e < 2 ? lse0 : lse1)) : 0.f;
        const float dpk = drop.thresh ? (drop.keeps(wd[e >> 1], e & 1) ? dp[j][e] * drop.scale : 0.f) : dp[j][e];
        s[j][e] = pr * (dpk - (e < 2 ? ds0 : ds1));
      }
    }
    to_a<T>(pa, s);
    mma_ab<LD>(dq, pa, sh.x[buf]);
  }
  store_acc<T>(dq, scale, dqkv + row0 * stride + h * HS, stride, qw, T_);
}

// The dropout arguments every kernel but dsum takes last: the hash key, the threshold (0: no
// dropout) and 1 / (1 − p).
#define DROP_PARAMS unsigned long long key, unsigned int thresh, float drop_scale
#define DROP Drop{(unsigned int)key, (unsigned int)(key >> 32), thresh, drop_scale}
#define FLASH(T, S)                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_fwd_##S(const T* qkv, T* y, float* lse, int T_, int nh, float scale2, DROP_PARAMS) {          \
    flash_fwd<T>(qkv, y, lse, T_, nh, scale2, DROP);                                                         \
  }                                                                                                          \
  extern "C" __global__ void tb_flash_bwd_dsum_##S(const T* y, const T* dy, float* dsum, float* dq_acc, int B, \
                                                   int T_, int nh) {                                         \
    flash_bwd_dsum<T>(y, dy, dsum, dq_acc, B, T_, nh);                                                       \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dkv_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,  \
                           int nh, float scale, float scale2, DROP_PARAMS) {                                 \
    __shared__ __align__(128) Shared<T> sh;                                                                  \
    flash_bwd_dkv<T, false>(sh, qkv, dy, lse, dsum, dqkv, nullptr, T_, nh, scale, scale2, DROP);             \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dkvq_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv,         \
                            float* dq_acc, int T_, int nh, float scale, float scale2, DROP_PARAMS) {         \
    extern __shared__ __align__(128) unsigned char smem[];                                                   \
    flash_bwd_dkv<T, true>(*reinterpret_cast<SharedDq<T>*>(smem), qkv, dy, lse, dsum, dqkv, dq_acc, T_, nh,  \
                           scale, scale2, DROP);                                                             \
  }                                                                                                          \
  extern "C" __global__ void tb_flash_bwd_dq_cast_##S(const float* dq_acc, T* dqkv, long rows, int C,          \
                                                      float scale) {                                         \
    flash_bwd_dq_cast<T>(dq_acc, dqkv, rows, C, scale);                                                      \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dq_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,   \
                          int nh, float scale, float scale2, DROP_PARAMS) {                                  \
    flash_bwd_dq<T>(qkv, dy, lse, dsum, dqkv, T_, nh, scale, scale2, DROP);                                  \
  }
FLASH(__nv_bfloat16, bf16)
FLASH(__half, f16)
