// The LayerNorm after a decode GEMV, run by the GEMV's last block to finish (#37): the GEMV's
// blocks each add their columns of y = x Wᵀ + b to the residual (s = r + y, each rounded as the
// composed add), then the block that finishes last normalises s's rows. A decode step's
// residual add + norm kernel (60 a bloom-7b1 step, ≈ 4 µs each with the launch between) goes.
// Included by gemv.cu (bf16 / f16 weights) and fp8.cu (E4M3 weights); each module has its own
// arrival counter, and a module's launches on one device run one at a time (one stream).
// Shapes: s, y (M, c), w and b (c,); c / (16 / sizeof(T)) ≤ V · blockDim.x vectors a row.
#pragma once
#include "common.cuh"

// Blocks of the current launch that have written their part of s; the last one resets it.
__device__ unsigned int tb_norm_arrivals;

// Sum over the block of each of v[0..M), returned to every thread (two barriers for all M).
template <int M>
__device__ void block_sums(float (&v)[M], float (*sh)[M]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int m = 0; m < M; m++) v[m] = warp_sum(v[m]);
  __syncthreads();  // sh may still be read from the previous call
  if (lane == 0)
#pragma unroll
    for (int m = 0; m < M; m++) sh[w][m] = v[m];
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; m++) {
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += sh[i][m];
    v[m] = t;
  }
}

// Called by every thread of every block once the block's stores of s are issued. All blocks
// but the last to arrive return; the last (acquiring the others' stores through the counter,
// as CUTLASS's grid barrier does) writes y = LN(s) for the M rows, statistics in f32, holding
// V 16-byte vectors of each row a thread (registers the kernel keeps for all its blocks).
template <typename T, int M, int V>
__device__ void last_block_layer_norm(const T* s, const T* w, const T* b, T* y, int c, float eps) {
  constexpr int N = 16 / sizeof(T);
  __shared__ float sh[32][M];
  __shared__ bool last;
  __syncthreads();  // the block's stores happen before thread 0's release below
  if (threadIdx.x == 0) {
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&tb_norm_arrivals) : "memory");
    last = prev == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  const int vecs = c / N;
  // Every row's vectors first (loads in flight together), read at L2: other SMs wrote them.
  Vec16<T> sv[M][V];
  float sum[M];
#pragma unroll
  for (int m = 0; m < M; m++) {
    sum[m] = 0.f;
#pragma unroll
    for (int i = 0; i < V; i++) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v < vecs) {
        const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(s + (long)m * c) + v);
        sv[m][i] = *reinterpret_cast<const Vec16<T>*>(&raw);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; m++)
#pragma unroll
    for (int i = 0; i < V; i++)
      if (threadIdx.x + i * blockDim.x < vecs)
#pragma unroll
        for (int j = 0; j < N; j++) sum[m] += to_f(sv[m][i].e[j]);
  block_sums<M>(sum, sh);
  float var[M];
#pragma unroll
  for (int m = 0; m < M; m++) {
    sum[m] /= c;  // the mean
    var[m] = 0.f;
#pragma unroll
    for (int i = 0; i < V; i++)
      if (threadIdx.x + i * blockDim.x < vecs)
#pragma unroll
        for (int j = 0; j < N; j++) {
          const float d = to_f(sv[m][i].e[j]) - sum[m];
          var[m] += d * d;
        }
  }
  block_sums<M>(var, sh);
#pragma unroll
  for (int i = 0; i < V; i++) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= vecs) break;
    const Vec16<T> wv = reinterpret_cast<const Vec16<T>*>(w)[v], bv = reinterpret_cast<const Vec16<T>*>(b)[v];
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float rstd = rsqrtf(var[m] / c + eps);
      Vec16<T> yv;
#pragma unroll
      for (int j = 0; j < N; j++)
        yv.e[j] = from_f<T>((to_f(sv[m][i].e[j]) - sum[m]) * rstd * to_f(wv.e[j]) + to_f(bv.e[j]));
      reinterpret_cast<Vec16<T>*>(y + (long)m * c)[v] = yv;
    }
  }
  if (threadIdx.x == 0) tb_norm_arrivals = 0;  // the next launch starts after this one ends
}
