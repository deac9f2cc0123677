// The tile machinery FlashAttention-2's tiling needs on tensor cores (wmma 16×16×16, bf16/f16
// in, f32 accumulate), for the inference forward (flash_prefill.cu, head sizes 64 and 128); the
// training kernels (flash_attn.cu, head size 64, on mma.cuh's products) share its tile loads
// and quad reductions.
// A block of WARPS warps takes TILE rows: each warp 16 of them. Tiles of 16-bit rows sit in
// shared memory at stride H + 8 (H the head size: skews banks, a 16-byte multiple); a warp's
// 16 × TILE probabilities at stride TILE + 8; its f32 staging at stride H + 4.
// The fragments' element → (row, col) map is unspecified, so each warp reads it once from a
// fragment loaded with r·16 + c (fragment_map): the element-wise steps run in registers. The
// row reductions rely on one more fact, checked at start (a trap if not): a lane's rows are
// lane/4 and lane/4 + 8, so a row's elements sit in one quad of lanes.
#pragma once
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

#define TILE 64
#define WARPS 4
#define LDP (TILE + 8)  // shared row stride of a warp's 16-bit probabilities (16 × TILE)
#define LDF (TILE + 4)  // shared row stride of the f32 scratch fragment_map reads

// Shared row stride of a 16-bit tile of head size H, and of a warp's f32 staging.
template <int H> __host__ __device__ constexpr int tile_ld() { return H + 8; }
template <int H> __host__ __device__ constexpr int stage_ld() { return H + 4; }

template <typename T> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T> using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool in) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits for this thread's copies; a __syncthreads after it publishes everyone's.
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Starts copying rows t0.. of src (stride `stride` elements) into dst[r][:] (TILE × H, stride
// tile_ld<H>); zeros past T.
template <int H, typename T>
__device__ void load_tile(T* dst, const T* src, long stride, int t0, int T_) {
  constexpr int V = H * sizeof(T) / 16, E = 16 / sizeof(T);  // vectors a row, elements a vector
  for (int i = threadIdx.x; i < TILE * V; i += blockDim.x) {
    const int r = i / V, v = i % V, t = t0 + r;
    const bool in = t < T_;
    cp_async16(dst + r * tile_ld<H>() + v * E, src + (long)(in ? t : 0) * stride + v * E, in);
  }
}

// rc[e] = r·16 + c of a 16×16 accumulator fragment's element e, read through the fragment map
// (scratch: the warp's 16 × LDF floats); traps unless a lane's rows are lane/4 and lane/4 + 8,
// elements e, e + 1 (e even) are neighbours in a row, the first at an even column (one dropout
// word serves both), element e + 2 (e = 0, 1, 4, 5) is e's column eight rows down, and lane ^ 4
// holds the same columns (the last three served the wmma training kernels before c28dda5, whose
// dropout shared words between lanes; they cost nothing at start and stay).
__device__ void fragment_map(int (&rc)[8], float* scratch) {
  const int lane = threadIdx.x & 31;
  for (int i = lane; i < 256; i += 32) scratch[(i / 16) * LDF + i % 16] = (float)i;
  __syncwarp();
  Acc f;
  wmma::load_matrix_sync(f, scratch, LDF, wmma::mem_row_major);
  #pragma unroll
  for (int e = 0; e < 8; e++) {
    rc[e] = (int)f.x[e];
    if ((rc[e] >> 4) % 8 != lane / 4) __trap();
    if (e % 2 == 1 && (rc[e] != rc[e - 1] + 1 || rc[e - 1] % 2 != 0)) __trap();
    if ((e & 2) && rc[e] != rc[e - 2] + 128) __trap();
    if ((__shfl_xor_sync(0xffffffff, rc[e], 4) & 15) != (rc[e] & 15)) __trap();
  }
  __syncwarp();
}

// Writes a warp's 16 × H result acc·factor to rows t0.. of out (stride `stride`), rows < T,
// through the warp's f32 staging tile (16 × stage_ld<H>); two lanes a row, H / 2 columns
// each, 16-byte stores.
template <int H, typename T>
__device__ void store_rows(Acc (&acc)[H / 16], float factor, float* stage, T* out, long stride, int t0, int T_) {
  constexpr int SL = stage_ld<H>();
  const int lane = threadIdx.x & 31, r = lane / 2, c0 = (lane % 2) * (H / 2);
  #pragma unroll
  for (int n = 0; n < H / 16; n++) {
    for (int e = 0; e < acc[n].num_elements; e++) acc[n].x[e] *= factor;
    wmma::store_matrix_sync(stage + n * 16, acc[n], SL, wmma::mem_row_major);
  }
  __syncwarp();
  if (t0 + r < T_) {
    uint4* dst = reinterpret_cast<uint4*>(out + (long)(t0 + r) * stride + c0);
    for (int v = 0; v < H / 16; v++) {
      T x[8];
      for (int j = 0; j < 8; j++) x[j] = from_f<T>(stage[r * SL + c0 + v * 8 + j]);
      dst[v] = *reinterpret_cast<uint4*>(x);
    }
  }
  __syncwarp();
}

// A warp's 16 rows of a shared tile (stride LDX) as N matrix_a fragments (k = N·16 columns).
template <int N, int LDX, typename T>
__device__ void load_rows_a(FragA<T> (&a)[N], const T* tile) {
  for (int kk = 0; kk < N; kk++) wmma::load_matrix_sync(a[kk], tile + kk * 16, LDX);
}

// out[n] (16 × TILE) = a (16 × H) · tileᵀ, tile (TILE × H) in shared memory: scores against a
// tile's TILE rows.
template <int H, typename T>
__device__ void mul_transposed(Acc (&out)[TILE / 16], const FragA<T> (&a)[H / 16], const T* tile) {
  FragBCol<T> b;
  #pragma unroll
  for (int n = 0; n < TILE / 16; n++) {
    wmma::fill_fragment(out[n], 0.f);
    for (int kk = 0; kk < H / 16; kk++) {
      wmma::load_matrix_sync(b, tile + n * 16 * tile_ld<H>() + kk * 16, tile_ld<H>());
      wmma::mma_sync(out[n], a[kk], b, out[n]);
    }
  }
}

// acc[n] (16 × H) += p (16 × TILE, shared, stride LDP) · tile (TILE × H).
template <int H, typename T>
__device__ void mul_acc(Acc (&acc)[H / 16], const T* p, const T* tile) {
  FragA<T> a[TILE / 16];
  load_rows_a<TILE / 16, LDP>(a, p);
  FragBRow<T> b;
  #pragma unroll
  for (int n = 0; n < H / 16; n++)
    for (int kk = 0; kk < TILE / 16; kk++) {
      wmma::load_matrix_sync(b, tile + kk * 16 * tile_ld<H>() + n * 16, tile_ld<H>());
      wmma::mma_sync(acc[n], a[kk], b, acc[n]);
    }
}

// Max / sum over a row's quad of lanes.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}
