// Warp-level tensor-core products without wmma (#36): mma.sync m16n8k16 (bf16 / f16 in, f32
// accumulate) fed by ldmatrix, the fragment layouts PTX documents. An accumulator's layout is
// the A operand's, so a product's result (scores, probabilities) feeds the next product from
// registers (FlashAttention-2's way) instead of through shared memory.
// Layouts (g = lane / 4, t = lane % 4), PTX ISA "mma.m16n8k16":
//   A 16×16 (4 regs of 2 values): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16×8 (2 regs): b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C 16×8 (4 f32): c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
#pragma once
#include "common.cuh"

template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 matrices of 16-bit values from shared memory; lanes 8i..8i+7 give matrix i's row
// addresses. Plain: lane gets (row g, cols 2t..2t+1) of each; trans: (rows 2t..2t+1, col g).
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Two values as one register of the A / B operands (lo the lower column).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A tile of R rows × 64 columns of 16-bit values in shared memory at row stride LDS elements.
// The A operand of rows r0..r0+15, columns 16kk..16kk+15 (kk = 0..3): a[kk].
template <int LDS, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4][4], const T* tile, int r0) {
  const int lane = threadIdx.x & 31;
  const T* p = tile + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LDS + 8 * (lane >> 4);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) ldsm4(a[kk], p + 16 * kk);
}

// acc[j] (16 × 8, j = 0..7: 64 columns) += a (16 × 64) · tileᵀ, tile 64 rows × 64 in shared
// memory (stride LDS): B[k][n] = tile[n][k], the scores against a tile's rows.
template <int LDS, typename T>
__device__ __forceinline__ void mma_abt(float (&acc)[8][4], const uint32_t (&a)[4][4], const T* tile) {
  const int lane = threadIdx.x & 31;
  const T* p = tile + ((lane & 7) + 8 * (lane >> 4)) * LDS + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int np = 0; np < 4; np++)
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t b[4];
      ldsm4(b, p + 16 * np * LDS + 16 * kk);
      mma16816<T>(acc[2 * np], a[kk], b[0], b[1]);
      mma16816<T>(acc[2 * np + 1], a[kk], b[2], b[3]);
    }
}

// The A operand of a 16 × 64 product held as accumulators (8 tiles of 16 × 8): a[kk] holds
// columns 16kk..16kk+15, each value rounded to T.
template <typename T>
__device__ __forceinline__ void to_a(uint32_t (&a)[4][4], const float (&f)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    a[kk][0] = pack2<T>(f[2 * kk][0], f[2 * kk][1]);
    a[kk][1] = pack2<T>(f[2 * kk][2], f[2 * kk][3]);
    a[kk][2] = pack2<T>(f[2 * kk + 1][0], f[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(f[2 * kk + 1][2], f[2 * kk + 1][3]);
  }
}

// The A operand a (rows r0..r0+15 of a 16 × 64 product, as to_a packs it) into rows
// r0..r0+15 of a 64-column tile in shared memory (stride LDS), one 32-bit store a pair.
template <int LDS, typename T>
__device__ __forceinline__ void store_a(T* tile, const uint32_t (&a)[4][4], int r0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t* lo = reinterpret_cast<uint32_t*>(tile + (r0 + g) * LDS + 2 * t);
  uint32_t* hi = reinterpret_cast<uint32_t*>(tile + (r0 + g + 8) * LDS + 2 * t);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {  // columns 16kk + 2t (words 8kk) and 16kk + 8 + 2t (+4)
    lo[8 * kk] = a[kk][0], hi[8 * kk] = a[kk][1];
    lo[8 * kk + 4] = a[kk][2], hi[8 * kk + 4] = a[kk][3];
  }
}

// The A operand of rows c0..c0+15 of tileᵀ (tile 64 rows × 64 in shared memory, stride LDS):
// A[i][k] = tile[k][c0 + i]. Matrix m of ldsm4_t (lanes 8m..8m+7) is rows 16kk + 8·(m / 2)..
// from column c0 + 8·(m % 2): a0 (rows i 0..7, k 0..7), a1 (i 8..), a2 (k 8..), a3 (both).
template <int LDS, typename T>
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4][4], const T* tile, int c0) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
  const T* p = tile + ((lane & 7) + 8 * (m >> 1)) * LDS + c0 + 8 * (m & 1);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) ldsm4_t(a[kk], p + 16 * kk * LDS);
}

// acc[j] (16 × 8, 64 columns) += a (16 × 64) · tile, tile 64 rows × 64 in shared memory
// (stride LDS): B[k][n] = tile[k][n].
template <int LDS, typename T>
__device__ __forceinline__ void mma_ab(float (&acc)[8][4], const uint32_t (&a)[4][4], const T* tile) {
  const int lane = threadIdx.x & 31;
  const T* p = tile + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LDS + 8 * (lane >> 4);
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int np = 0; np < 4; np++) {
      uint32_t b[4];
      ldsm4_t(b, p + 16 * kk * LDS + 16 * np);
      mma16816<T>(acc[2 * np], a[kk], b[0], b[1]);
      mma16816<T>(acc[2 * np + 1], a[kk], b[2], b[3]);
    }
}

// Rows r0 + g and r0 + g + 8 (those < T_) of acc · factor to out (row stride `stride`), two
// values a store.
template <typename T>
__device__ __forceinline__ void store_acc(const float (&acc)[8][4], float factor, T* out, long stride, int r0, int T_) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = r0 + g + 8 * h;
    if (r >= T_) continue;
    uint32_t* row = reinterpret_cast<uint32_t*>(out + (long)r * stride + 2 * t);
#pragma unroll
    for (int j = 0; j < 8; j++) row[4 * j] = pack2<T>(acc[j][2 * h] * factor, acc[j][2 * h + 1] * factor);
  }
}
