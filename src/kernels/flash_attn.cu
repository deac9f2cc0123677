// Fused causal attention for training (#21 item 2), launched by flash_attn.rs: FlashAttention-2's
// tiling on tensor cores (wmma 16×16×16, bf16/f16 in, f32 accumulate). The (T, T) scores never
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
// four warps read.
// The tile helpers (fragment map, loads, products, stores) are flash_tiles.cuh's.
// lse is kept in base 2 (m·log2 e + log2 l): the scores are scaled by scale·log2 e once.
// Dropout on the probabilities (#36): the mask of dropout.cuh's hash over the (B, nh, T, T)
// probabilities' flat index, drawn in the forward and redrawn in both backward kernels; the
// row sums and lse stay those of the undropped probabilities, dsum = Σ dy·y holds as is.
#include "dropout.cuh"
#include "flash_tiles.cuh"

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

// The operand tiles: two buffers of two tiles (the one in use, the next one arriving), each
// warp's 16-bit probabilities (or score gradients), and 64 rows' lse and dsum in two buffers.
// After the loops the tiles hold the warps' f32 staging (4 × 16 × stage_ld floats ≤ 2 tiles).
template <typename T> struct Shared {
  T x[2][TILE_ELEMS], y[2][TILE_ELEMS];
  T p[WARPS][16 * LDP];
  float lse[2][TILE], dsum[2][TILE];
  __device__ float* stage(int w) { return reinterpret_cast<float*>(&x[0][0]) + w * 16 * LDF; }
};

// y = softmax(q kᵀ·scale, causal) v, and lse. Grid (⌈T/64⌉, B·nh), 128 threads; the query
// tiles run longest first. Each lane keeps the max and sum of its two rows (g, g + 8).
template <typename T>
__device__ void flash_fwd(const T* qkv, T* y, float* lse, int T_, int nh, float scale2, Drop drop) {
  __shared__ __align__(128) Shared<T> sh;
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, q0 = qt * TILE, qw = q0 + w * 16;
  const long stride = 3L * C;
  const T* q_src = qkv + (long)b * T_ * stride + h * HS;
  int rc[8];
  fragment_map(rc, sh.stage(w));
  __syncthreads();
  load_tile<HS>(sh.x[1], q_src, stride, q0, T_);  // q, staged where tile 1 goes later
  load_tile<HS>(sh.x[0], q_src + C, stride, 0, T_);
  load_tile<HS>(sh.y[0], q_src + 2 * C, stride, 0, T_);
  cp_async_commit();
  cp_async_wait();
  __syncthreads();
  FragA<T> qa[4];
  load_rows_a<HS / 16, LD>(qa, sh.x[1] + w * 16 * LD);
  Acc s[4], o[4];
  #pragma unroll
  for (int n = 0; n < 4; n++) wmma::fill_fragment(o[n], 0.f);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // The flat index of the lane's rows g and g + 8 in the probabilities (dropout only).
  const unsigned int rb0 = (unsigned int)(bh * T_ + qw + g) * (unsigned int)T_, rb1 = rb0 + 8u * T_;
  T* p = sh.p[w];
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE, buf = kt & 1;
    cp_async_wait();
    __syncthreads();  // tile kt is in; every warp is done with tile kt − 1 (and q)
    if (kt < qt) {
      load_tile<HS>(sh.x[buf ^ 1], q_src + C, stride, k0 + TILE, T_);
      load_tile<HS>(sh.y[buf ^ 1], q_src + 2 * C, stride, k0 + TILE, T_);
      cp_async_commit();
    }
    mul_transposed<HS>(s, qa, sh.x[buf]);
    float x0 = -INFINITY, x1 = -INFINITY;
    #pragma unroll
    for (int n = 0; n < 4; n++)
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, key = k0 + n * 16 + (rc[e] & 15);
        const float v = (key > qw + r || key >= T_) ? -INFINITY : s[n].x[e] * scale2;
        s[n].x[e] = v;
        if (r < 8) x0 = fmaxf(x0, v); else x1 = fmaxf(x1, v);
      }
    // Tile kt ≤ qt holds key k0 ≤ every row's position: each max is finite.
    const float n0 = fmaxf(m0, quad_max(x0)), n1 = fmaxf(m1, quad_max(x1));
    const float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);  // 0 on the first tile
    m0 = n0, m1 = n1;
    float s0 = 0.f, s1 = 0.f;
    #pragma unroll
    for (int n = 0; n < 4; n++) {
      unsigned int wd = 0;
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, c = n * 16 + (rc[e] & 15);
        const float v = exp2f(s[n].x[e] - (r < 8 ? n0 : n1));
        if (r < 8) s0 += v; else s1 += v;
        if (drop.thresh && e % 2 == 0) wd = drop.word((r < 8 ? rb0 : rb1) + k0 + c);
        p[r * LDP + c] = from_f<T>(drop.thresh && !drop.keeps(wd, e % 2) ? 0.f : v);
        o[n].x[e] *= r < 8 ? a0 : a1;
      }
    }
    l0 = l0 * a0 + quad_sum(s0), l1 = l1 * a1 + quad_sum(s1);
    __syncwarp();
    mul_acc<HS>(o, p, sh.y[buf]);
  }
  #pragma unroll
  for (int n = 0; n < 4; n++)
    #pragma unroll
    for (int e = 0; e < 8; e++) o[n].x[e] /= (rc[e] >> 4) < 8 ? l0 : l1;
  __syncthreads();  // the tiles become the staging
  store_rows<HS>(o, drop.scale, sh.stage(w), y + (long)b * T_ * C + h * HS, C, qw, T_);
  if (lane % 4 == 0) {
    float* out = lse + (long)bh * T_ + qw;
    if (qw + g < T_) out[g] = m0 + log2f(l0);
    if (qw + g + 8 < T_) out[g + 8] = m1 + log2f(l1);
  }
}

// dsum[b, h, t] = Σ_d dy · y over a head's row: one warp a row, grid-strided.
template <typename T>
__device__ void flash_bwd_dsum(const T* y, const T* dy, float* dsum, int B, int T_, int nh) {
  const int lane = threadIdx.x & 31;
  const long rows = (long)B * T_ * nh, warps = (long)gridDim.x * blockDim.x / 32;
  for (long i = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32; i < rows; i += warps) {
    const long bt = i / nh, h = i % nh, b = bt / T_, t = bt % T_;
    const long at = bt * nh * HS + h * HS;
    float acc = 0.f;
    for (int d = lane; d < HS; d += 32) acc += to_f(y[at + d]) * to_f(dy[at + d]);
    acc = warp_sum(acc);
    if (lane == 0) dsum[(b * nh + h) * T_ + t] = acc;
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

// dk and dv of one 64-key tile: for every query tile at or past it (q in x, dO in y), sᵀ = k qᵀ,
// pᵀ from lse, dv += pᵀ dO, dpᵀ = v dOᵀ, dsᵀ = pᵀ ⊙ (dpᵀ − dsum), dk += dsᵀ q · scale.
// Grid (⌈T/64⌉, B·nh), 128 threads; block 0 has the most query tiles.
template <typename T>
__device__ void flash_bwd_dkv(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,
                              int nh, float scale, float scale2, Drop drop) {
  __shared__ __align__(128) Shared<T> sh;
  const int w = threadIdx.x / 32, g = (threadIdx.x & 31) / 4;
  const int kt = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, k0 = kt * TILE, kw = k0 + w * 16, nq = (T_ + TILE - 1) / TILE;
  const long stride = 3L * C, row0 = (long)b * T_;
  const T* q_src = qkv + row0 * stride + h * HS;
  const T* dy_src = dy + row0 * C + h * HS;
  lse += (long)bh * T_, dsum += (long)bh * T_;
  int rc[8];
  fragment_map(rc, sh.stage(w));
  __syncthreads();
  load_tile<HS>(sh.x[1], q_src + C, stride, k0, T_);  // k and v, staged where the second buffer goes
  load_tile<HS>(sh.y[1], q_src + 2 * C, stride, k0, T_);
  load_tile<HS>(sh.x[0], q_src, stride, k0, T_);
  load_tile<HS>(sh.y[0], dy_src, C, k0, T_);
  cp_async_commit();
  load_row_stats(sh, 0, lse, dsum, k0, T_);
  cp_async_wait();
  __syncthreads();
  FragA<T> ka[4], va[4];
  load_rows_a<HS / 16, LD>(ka, sh.x[1] + w * 16 * LD);
  load_rows_a<HS / 16, LD>(va, sh.y[1] + w * 16 * LD);
  Acc s[4], dp[4], dk[4], dv[4];
  #pragma unroll
  for (int n = 0; n < 4; n++) wmma::fill_fragment(dk[n], 0.f), wmma::fill_fragment(dv[n], 0.f);
  T* p = sh.p[w];
  for (int qt = kt; qt < nq; qt++) {
    const int q0 = qt * TILE, buf = (qt - kt) & 1;
    cp_async_wait();
    __syncthreads();
    if (qt + 1 < nq) {
      load_tile<HS>(sh.x[buf ^ 1], q_src, stride, q0 + TILE, T_);
      load_tile<HS>(sh.y[buf ^ 1], dy_src, C, q0 + TILE, T_);
      cp_async_commit();
      load_row_stats(sh, buf ^ 1, lse, dsum, q0 + TILE, T_);
    }
    const float* lse_s = sh.lse[buf];
    const float* dsum_s = sh.dsum[buf];
    mul_transposed<HS>(s, ka, sh.x[buf]);  // sᵀ (16 keys × 64 queries)
    // A lane's neighbours in the flat index (keys k, k + 1) sit in lanes g, g ^ 1 (lane ^ 4):
    // each of the two hashes the words of one of its two rows and they swap. A dropped
    // probability is kept negated in s for the second pass (p ≥ 0): no mask registers.
    const unsigned int qb = (unsigned int)(bh * T_ + q0), odd = g & 1;
    #pragma unroll
    for (int n = 0; n < 4; n++) {
      unsigned int wd[8] = {};  // the words of this fragment's elements
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        if (!drop.thresh || (e & 2)) continue;  // e and e + 2: one column, rows g and g + 8
        const unsigned int c = n * 16 + (rc[e] & 15);
        const unsigned int mine = drop.word((qb + c) * (unsigned int)T_ + kw + g + (odd ? 8 : 0));
        const unsigned int other = __shfl_xor_sync(0xffffffff, mine, 4);
        wd[e] = odd ? other : mine, wd[e + 2] = odd ? mine : other;
      }
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, c = n * 16 + (rc[e] & 15);
        const bool seen = kw + r <= q0 + c && q0 + c < T_;
        const float pv = seen ? exp2f(s[n].x[e] * scale2 - lse_s[c]) : 0.f;
        s[n].x[e] = drop.thresh && !drop.keeps(wd[e], odd) ? -pv : pv;
        p[r * LDP + c] = from_f<T>(fmaxf(s[n].x[e], 0.f));
      }
    }
    __syncwarp();
    mul_acc<HS>(dv, p, sh.y[buf]);
    mul_transposed<HS>(dp, va, sh.y[buf]);  // dpᵀ (16 keys × 64 queries)
    __syncwarp();                       // every lane has read p
    #pragma unroll
    for (int n = 0; n < 4; n++)
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, c = n * 16 + (rc[e] & 15);
        const float pv = s[n].x[e], dpk = pv > 0.f ? dp[n].x[e] * drop.scale : 0.f;
        p[r * LDP + c] = from_f<T>(fabsf(pv) * (dpk - dsum_s[c]));
      }
    __syncwarp();
    mul_acc<HS>(dk, p, sh.x[buf]);
  }
  __syncthreads();  // the tiles become the staging
  T* out = dqkv + row0 * stride + h * HS;
  store_rows<HS>(dk, scale, sh.stage(w), out + C, stride, kw, T_);
  store_rows<HS>(dv, drop.scale, sh.stage(w), out + 2 * C, stride, kw, T_);
}

// dq of one 64-query tile (its q and dO held as fragments, its rows' lse and dsum in
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
  int rc[8];
  fragment_map(rc, sh.stage(w));
  __syncthreads();
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
  FragA<T> qa[4], doa[4];
  load_rows_a<HS / 16, LD>(qa, sh.x[1] + w * 16 * LD);
  load_rows_a<HS / 16, LD>(doa, sh.y[1] + w * 16 * LD);
  Acc s[4], dp[4], dq[4];
  #pragma unroll
  for (int n = 0; n < 4; n++) wmma::fill_fragment(dq[n], 0.f);
  T* p = sh.p[w];
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE, buf = kt & 1;
    cp_async_wait();
    __syncthreads();
    if (kt < qt) {
      load_tile<HS>(sh.x[buf ^ 1], q_src + C, stride, k0 + TILE, T_);
      load_tile<HS>(sh.y[buf ^ 1], q_src + 2 * C, stride, k0 + TILE, T_);
      cp_async_commit();
    }
    mul_transposed<HS>(s, qa, sh.x[buf]);
    mul_transposed<HS>(dp, doa, sh.y[buf]);
    #pragma unroll
    for (int n = 0; n < 4; n++) {
      unsigned int wd = 0;
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, key = k0 + n * 16 + (rc[e] & 15);
        const bool seen = key <= qw + r && key < T_;
        const float pr = seen ? exp2f(s[n].x[e] * scale2 - (r < 8 ? lse0 : lse1)) : 0.f;
        if (drop.thresh && e % 2 == 0) wd = drop.word((r < 8 ? rb0 : rb1) + key);
        const float dpk = drop.thresh ? (drop.keeps(wd, e % 2) ? dp[n].x[e] * drop.scale : 0.f) : dp[n].x[e];
        p[r * LDP + n * 16 + (rc[e] & 15)] = from_f<T>(pr * (dpk - (r < 8 ? ds0 : ds1)));
      }
    }
    __syncwarp();
    mul_acc<HS>(dq, p, sh.x[buf]);
  }
  __syncthreads();  // the tiles become the staging
  store_rows<HS>(dq, scale, sh.stage(w), dqkv + row0 * stride + h * HS, stride, qw, T_);
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
  extern "C" __global__ void tb_flash_bwd_dsum_##S(const T* y, const T* dy, float* dsum, int B, int T_, int nh) { \
    flash_bwd_dsum<T>(y, dy, dsum, B, T_, nh);                                                               \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dkv_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,  \
                           int nh, float scale, float scale2, DROP_PARAMS) {                                 \
    flash_bwd_dkv<T>(qkv, dy, lse, dsum, dqkv, T_, nh, scale, scale2, DROP);                                 \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dq_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,   \
                          int nh, float scale, float scale2, DROP_PARAMS) {                                  \
    flash_bwd_dq<T>(qkv, dy, lse, dsum, dqkv, T_, nh, scale, scale2, DROP);                                  \
  }
FLASH(__nv_bfloat16, bf16)
FLASH(__half, f16)
