// What does one hand-off of a decode step's activations between SMs cost at best on this GPU?
// (#37: a one-row stage of the graphed step costs ~3.5 us on the H100, a stage of the
// persistent step kernel ~3-3.5 us before its input is ready; mlp-run98's fused MLP showed that
// removing one kernel boundary a layer saved ~1.6 us. This times the hand-off alone.)
//
// A chain of S stages with no weights: in each, every block reads the C floats the stage before
// wrote (4 KB at C = 1024, from L2), sums them (a block reduction, as a norm's statistics), and
// writes its share of the next stage's C floats. Timed as:
//   graph-plain  S kernels captured in a CUDA graph, ordinary edges
//   graph-pdl    the same with programmatic edges (each kernel waits first, then triggers)
//   graph-tf     programmatic edges, each kernel triggers first, then waits
//   persistent   one kernel of one block an SM, a grid barrier (release add, acquire spin:
//                decode_step.cu's grid_sync) between the stages
// at G = 132 blocks (one an SM) and G = 1024 (a one-row GEMV's grid of 1024 one-column blocks;
// graphs only), 128 threads a block; each without and with "+weights": every block also reads
// its own 2 KB row of the stage's weights from DRAM (a one-row GEMV's row; the persistent
// kernel's 132 blocks read rows 0-131). Reports us a stage (graph replay or kernel time / S,
// median of 20 runs).
//
// Build (here): nvcc -O3 -std=c++17 -arch=sm_90 -cudart static scripts/probes/exchange_probe.cu -o exchange_probe
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t err_ = (x);                                                                \
    if (err_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

constexpr int C = 1024, S = 120, THREADS = 128;

__device__ __forceinline__ float block_sum(float a, float* sh) {
  for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(~0u, a, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = a;
  __syncthreads();
  a = 0.f;
  for (int w = 0; w < THREADS / 32; w++) a += sh[w];
  return a;
}

// With weights: the block's own 2 KB row of this stage's weights, from DRAM (each stage has its
// own buffer: 120 stages x 1024 rows x 2 KB, past L2), summed: a one-row GEMV's read.
__device__ __forceinline__ float dot_row(const float4* w) {
  const float4 v = __ldg(w + (long)blockIdx.x * (2048 / 16) + threadIdx.x);
  return v.x + v.y + v.z + v.w;
}

// One stage: every block reads all of `in` (through L2: written by other SMs), reduces it,
// writes its share of `out`.
__device__ __forceinline__ void stage(const float* in, float* out, const float4* w = nullptr) {
  __shared__ float sh[THREADS / 32];
  float a = 0.f;
  if (w) a = dot_row(w);
  for (int i = threadIdx.x; i < C / 4; i += THREADS) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(in) + i);
    a += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  a = block_sum(a, sh);
  const float f = rsqrtf(a / C + 1.f) * 1e-3f;
  if (gridDim.x >= C) {  // a column a block, as the one-row GEMV
    if (threadIdx.x == 0 && blockIdx.x < C) out[blockIdx.x] = __ldcg(in + blockIdx.x) * 0.5f + f;
    return;
  }
  for (int j = blockIdx.x * THREADS + threadIdx.x; j < C; j += gridDim.x * THREADS) out[j] = __ldcg(in + j) * 0.5f + f;
}

template <int MODE>  // 0 plain, 1 wait then trigger, 2 trigger then wait
__global__ void stage_kernel(const float* in, float* out, const float4* w) {
  if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE >= 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (MODE == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
  stage(in, out, w);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// S stages in one launch, a grid barrier between them; `count` zero at the start.
__global__ void persistent(float* a, float* b, unsigned* count, const float4* w) {
  unsigned passed = 0;
  for (int s = 0; s < S; s++) {
    stage(s % 2 ? b : a, s % 2 ? a : b, w ? w + (long)s * 1024 * 128 : nullptr);
    __syncthreads();
    passed += gridDim.x;
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
      while (ld_acquire(count) < passed) {
      }
    }
    __syncthreads();
  }
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A graph of S stage kernels of `blocks` blocks (MODE as stage_kernel), ping-ponging a and b.
template <int MODE>
static cudaGraphExec_t chain(cudaStream_t st, float* a, float* b, int blocks, const float4* w) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < S; s++) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = MODE ? 1 : 0;
    const float* in = s % 2 ? b : a;
    float* out = s % 2 ? a : b;
    const float4* ws = w ? w + (long)s * 1024 * 128 : nullptr;
    CHECK(cudaLaunchKernelEx(&cfg, stage_kernel<MODE>, in, out, ws));
  }
  CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  return exec;
}

static float time_graph(cudaStream_t st, cudaGraphExec_t e) {
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  std::vector<float> ms;
  for (int r = 0; r < 25; r++) {
    CHECK(cudaEventRecord(t0, st));
    CHECK(cudaGraphLaunch(e, st));
    CHECK(cudaEventRecord(t1, st));
    CHECK(cudaEventSynchronize(t1));
    float m;
    CHECK(cudaEventElapsedTime(&m, t0, t1));
    if (r >= 5) ms.push_back(m);
  }
  return median(ms) * 1000.f / S;
}

int main() {
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("%s, %d SMs; %d stages of %d floats, %d threads a block; us a stage (median of 20)\n", p.name,
         p.multiProcessorCount, S, C, THREADS);
  float *a, *b;
  unsigned* count;
  CHECK(cudaMalloc(&a, C * 4));
  CHECK(cudaMalloc(&b, C * 4));
  CHECK(cudaMalloc(&count, 4));
  std::vector<float> ones(C, 1.f);
  CHECK(cudaMemcpy(a, ones.data(), C * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  float4* w;  // S stages x 1024 rows x 2 KB
  CHECK(cudaMalloc(&w, (size_t)S * 1024 * 2048));
  CHECK(cudaMemset(w, 0, (size_t)S * 1024 * 2048));
  for (const float4* wt : {(const float4*)nullptr, (const float4*)w}) {
    const char* tag = wt ? " +weights" : "";
    for (int blocks : {p.multiProcessorCount, 1024}) {
      printf("graph-plain G=%d%s %.2f\n", blocks, tag, time_graph(st, chain<0>(st, a, b, blocks, wt)));
      printf("graph-pdl   G=%d%s %.2f\n", blocks, tag, time_graph(st, chain<1>(st, a, b, blocks, wt)));
      printf("graph-tf    G=%d%s %.2f\n", blocks, tag, time_graph(st, chain<2>(st, a, b, blocks, wt)));
    }
  }
  // The persistent kernel: one block an SM (all resident), the barrier's counter zeroed each run.
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  for (const float4* wt : {(const float4*)nullptr, (const float4*)w}) {
    std::vector<float> ms;
    for (int r = 0; r < 25; r++) {
      CHECK(cudaMemsetAsync(count, 0, 4, st));
      CHECK(cudaEventRecord(t0, st));
      persistent<<<p.multiProcessorCount, THREADS, 0, st>>>(a, b, count, wt);
      CHECK(cudaEventRecord(t1, st));
      CHECK(cudaEventSynchronize(t1));
      CHECK(cudaGetLastError());
      float m;
      CHECK(cudaEventElapsedTime(&m, t0, t1));
      if (r >= 5) ms.push_back(m);
    }
    printf("persistent  G=%d%s %.2f\n", p.multiProcessorCount, wt ? " +weights" : "", median(ms) * 1000.f / S);
  }
  return 0;
}
