// Does a one-row GEMV stage of a decode step cost less with a few wide blocks than with a block
// a column? (#37: exchange-run99 timed a chained hand-off of 4 KB at 1.3-1.6 us a stage with 132
// blocks and 2.4-2.9 us with 1024; the engine's one-row GEMV (gemv.cu) takes a block of four
// warps a column: 1024-4096 blocks a projection.)
//
// A graph of S chained stages with programmatic edges (each kernel waits, then triggers), each a
// bf16 GEMV y = x Wᵀ at one row with its own weights (past L2), x the stage before's y:
//   col1    gemv.cu's one-row layout: a block of 4 warps a column, each warp every 4th run of
//           32 16-byte vectors of the row, sums met in shared memory (N blocks)
//   cpbC    C columns a block of 8 warps (N / C blocks): a warp takes C / 8 columns (C >= 8) or
//           8 / C warps share a column's row (C < 8); every lane issues all its weight loads
//           first, before the wait (`late`: after it), x's vectors (the same for each of its
//           columns) from L2 once
// for three shapes of bloom-560m's layer: proj (N 1024, K 1024), fc (4096, 1024), fc2 (1024,
// 4096). Reports us a stage (replay time / S, median of 20) and the weights' read rate.
//
// Build (here): nvcc -O3 -std=c++17 -arch=sm_90 -cudart static scripts/probes/gemv_grid_probe.cu -o gemv_grid_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t err_ = (x);                                                                  \
    if (err_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_));   \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

constexpr int S = 120;

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 fa = __bfloat1622float2(a[j]), fb = __bfloat1622float2(b[j]);
    s += fa.x * fb.x + fa.y * fb.y;
  }
  return s;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  return v;
}
__device__ __forceinline__ void pdl() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// x's vector i: y of the stage before (ny vectors), wrapped where K is longer.
__device__ __forceinline__ uint4 xv(const uint4* x, int i, int ny) { return __ldcg(x + i % ny); }

// gemv.cu at one row: block = column, 4 warps over the row.
__global__ void col1(const uint4* x, const uint4* w, __nv_bfloat16* y, int kv, int ny) {
  pdl();
  __shared__ float part[4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, col = blockIdx.x;
  const uint4* row = w + (long)col * kv;
  float a = 0.f;
#pragma unroll 4
  for (int i = warp * 32 + lane; i < kv; i += 128) a += dot8(row[i], xv(x, i, ny));
  a = warp_sum(a);
  if (lane == 0) part[warp] = a;
  __syncthreads();
  if (threadIdx.x == 0) y[col] = __float2bfloat16(part[0] + part[1] + part[2] + part[3]);
}

// C columns a block of 8 warps; VPL vectors a lane a column (kv = 32 · WPC · VPL).
template <int C, int VPL, bool EARLY = true>
__global__ void __launch_bounds__(256) cpb(const uint4* x, const uint4* w, __nv_bfloat16* y, int kv, int ny) {
  constexpr int CPW = C >= 8 ? C / 8 : 1, WPC = C >= 8 ? 1 : 8 / C;
  __shared__ float part[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slice = warp % WPC, first = blockIdx.x * C + warp / WPC;
  uint4 wr[CPW][VPL];
  if (!EARLY) pdl();
  // Weights first: they never depend on the stage before (as the fp8 GEMV's early loads).
#pragma unroll
  for (int c = 0; c < CPW; c++)
#pragma unroll
    for (int v = 0; v < VPL; v++) wr[c][v] = __ldg(w + (long)(first + c * (8 / WPC)) * kv + (slice * VPL + v) * 32 + lane);
  if (EARLY) pdl();
  uint4 xr[VPL];
#pragma unroll
  for (int v = 0; v < VPL; v++) xr[v] = xv(x, (slice * VPL + v) * 32 + lane, ny);
#pragma unroll
  for (int c = 0; c < CPW; c++) {
    float a = 0.f;
#pragma unroll
    for (int v = 0; v < VPL; v++) a += dot8(wr[c][v], xr[v]);
    a = warp_sum(a);
    if (WPC == 1) {
      if (lane == 0) y[first + c * 8] = __float2bfloat16(a);
    } else {
      if (lane == 0) part[warp] = a;
      __syncthreads();
      if (slice == 0 && lane == 0) {
        float s = 0.f;
        for (int k = 0; k < WPC; k++) s += part[warp + k];
        y[first] = __float2bfloat16(s);
      }
    }
  }
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  const char* name;
  int n, k;
};

typedef void (*Kernel)(const uint4*, const uint4*, __nv_bfloat16*, int, int);

// us a stage of a graph of S stages of `kern` over `blocks` x `threads`.
static float run(cudaStream_t st, Kernel kern, int blocks, int threads, Shape s, uint4* w, __nv_bfloat16* ya,
                 __nv_bfloat16* yb) {
  const int kv = s.k / 8, ny = s.n / 8;
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < S; i++) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const uint4* x = reinterpret_cast<const uint4*>(i % 2 ? yb : ya);
    __nv_bfloat16* y = i % 2 ? ya : yb;
    const uint4* wi = w + (long)i * s.n * kv;
    CHECK(cudaLaunchKernelEx(&cfg, kern, x, wi, y, kv, ny));
  }
  CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  std::vector<float> ms;
  for (int r = 0; r < 25; r++) {
    CHECK(cudaEventRecord(t0, st));
    CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaEventRecord(t1, st));
    CHECK(cudaEventSynchronize(t1));
    float m;
    CHECK(cudaEventElapsedTime(&m, t0, t1));
    if (r >= 5) ms.push_back(m);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  return median(ms) * 1000.f / S;
}

int main() {
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("%s, %d SMs; graphs of %d chained one-row bf16 GEMVs, programmatic edges; us a stage (median of 20)\n",
         p.name, p.multiProcessorCount, S);
  const Shape shapes[] = {{"proj", 1024, 1024}, {"fc", 4096, 1024}, {"fc2", 1024, 4096}};
  uint4* w;
  const size_t wbytes = (size_t)S * 4096 * 1024 * 2;
  CHECK(cudaMalloc(&w, wbytes));
  CHECK(cudaMemset(w, 0, wbytes));
  __nv_bfloat16 *ya, *yb;
  CHECK(cudaMalloc(&ya, 4096 * 2));
  CHECK(cudaMalloc(&yb, 4096 * 2));
  CHECK(cudaMemset(ya, 0, 4096 * 2));
  CHECK(cudaMemset(yb, 0, 4096 * 2));
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const Shape& s : shapes) {
    const double mb = (double)s.n * s.k * 2 / 1e6;
    auto report = [&](const char* v, int blocks, float us) {
      printf("%-4s N %4d K %4d %-9s %5d blocks %6.2f us  (%.2f TB/s)\n", s.name, s.n, s.k, v, blocks, us, mb / us);
    };
    report("col1", s.n, run(st, col1, s.n, 128, s, w, ya, yb));
    if (s.k == 1024) {  // kv 128: VPL = 4 / WPC
      report("cpb32", s.n / 32, run(st, cpb<32, 4>, s.n / 32, 256, s, w, ya, yb));
      report("cpb32late", s.n / 32, run(st, cpb<32, 4, false>, s.n / 32, 256, s, w, ya, yb));
      report("cpb8late", s.n / 8, run(st, cpb<8, 4, false>, s.n / 8, 256, s, w, ya, yb));
      report("cpb16", s.n / 16, run(st, cpb<16, 4>, s.n / 16, 256, s, w, ya, yb));
      report("cpb8", s.n / 8, run(st, cpb<8, 4>, s.n / 8, 256, s, w, ya, yb));
      report("cpb4", s.n / 4, run(st, cpb<4, 2>, s.n / 4, 256, s, w, ya, yb));
      report("cpb2", s.n / 2, run(st, cpb<2, 1>, s.n / 2, 256, s, w, ya, yb));
    } else {  // kv 512
      report("cpb8", s.n / 8, run(st, cpb<8, 16>, s.n / 8, 256, s, w, ya, yb));
      report("cpb8late", s.n / 8, run(st, cpb<8, 16, false>, s.n / 8, 256, s, w, ya, yb));
      report("cpb4", s.n / 4, run(st, cpb<4, 8>, s.n / 4, 256, s, w, ya, yb));
      report("cpb2", s.n / 2, run(st, cpb<2, 4>, s.n / 2, 256, s, w, ya, yb));
      report("cpb1", s.n, run(st, cpb<1, 2>, s.n, 256, s, w, ya, yb));
    }
  }
  return 0;
}
