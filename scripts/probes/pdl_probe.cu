// Does programmatic dependent launch (PDL) shorten a chain of small dependent kernels inside
// a CUDA graph on this host, and by how much? (#37: pdl-run1 measured the decode step equal to
// the microsecond with and without the launch attribute, and could not tell whether the
// programmatic edges existed.)
//
// The chain has the shape of GPT-2 small's decode step at one row (bf16 bytes as u16): per
// layer a norm (one block), the qkv GEMV (768 -> 2304), an attention stand-in (12 blocks), the
// projection (768 -> 768), a norm, fc (768 -> 3072), fc2 (3072 -> 768), a third one-block norm
// (standing for the attention's merge: eight kernels a layer, as the engine's step); then the
// LM head (768 -> 50257). Each GEMV has a column a 128-thread block, as gemv.cu at one row; the weights are
// distinct buffers (170 MB + 77 MB, past L2). Values are not meaningful; only time is.
//
// Variants, each a captured graph replayed: plain launches; PDL (the launch attribute, every
// kernel waits first and then triggers its dependents); PDL with each GEMV loading its weights
// before the wait. On a created stream and on the per-thread default stream (candle's); and
// with a stream-ordered allocation before each launch and its free after it, as candle's
// tensors make (graph memory nodes between the kernels); and with those allocations made roots
// of the graph during the capture and each kernel's programmatic edge drawn from the last
// operation (cudaStreamUpdateCaptureDependencies: what src/kernels/pdl.rs does).
//
// Build (here): nvcc -O3 -std=c++17 -arch=sm_90 -cudart static scripts/probes/pdl_probe.cu -o pdl_probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// y[0..c) = x normalised (stand-in: x scaled by its mean square), one block.
__global__ void norm(const float* x, float* y, int c) {
  pdl_wait();
  pdl_trigger();
  __shared__ float s[32];
  float a = 0.f;
  for (int i = threadIdx.x; i < c; i += blockDim.x) a += x[i] * x[i];
  for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(~0u, a, o);
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x < 32) {
    a = threadIdx.x < blockDim.x / 32 ? s[threadIdx.x] : 0.f;
    for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(~0u, a, o);
    if (threadIdx.x == 0) s[0] = rsqrtf(a / c + 1e-5f);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < c; i += blockDim.x) y[i] = x[i] * s[0];
}

// Attention stand-in: a block a head reads 64 of x's values and writes them.
__global__ void attn(const float* x, float* y) {
  pdl_wait();
  pdl_trigger();
  if (threadIdx.x < 64) y[blockIdx.x * 64 + threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x] * 0.5f;
}

// y[col] = Σ_k x[k] w[col, k], a column a 128-thread block, w as 16-byte vectors (8 u16).
template <bool PRELOAD>
__global__ void gemv(const float* x, const uint4* w, float* y, int kv) {
  const int col = blockIdx.x;
  const uint4* row = w + (long)col * kv;
  constexpr int PRE = 4;
  uint4 pre[PRE];
  if (PRELOAD) {
#pragma unroll
    for (int p = 0; p < PRE; p++) {
      const int i = threadIdx.x + 128 * p;
      if (i < kv) pre[p] = row[i];
    }
  }
  pdl_wait();
  pdl_trigger();
  float acc = 0.f;
  int start = threadIdx.x;
  if (PRELOAD) {
#pragma unroll
    for (int p = 0; p < PRE; p++) {
      const int i = threadIdx.x + 128 * p;
      if (i < kv) acc += x[i * 8 % 3072] * (float)(pre[p].x & 0xff);
    }
    start += 128 * PRE;
  }
  for (int i = start; i < kv; i += 128) {
    const uint4 v = row[i];
    acc += x[i * 8 % 3072] * (float)(v.x & 0xff);
  }
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
  __shared__ float s[4];
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) y[col] = s[0] + s[1] + s[2] + s[3];
}

// The capture's last operation: its current dependency, walked back past memory nodes.
static cudaGraphNode_t last_operation(cudaStream_t s) {
  cudaStreamCaptureStatus st;
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
  CHECK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &n));
  cudaGraphNode_t at = n == 1 ? deps[0] : nullptr;
  while (at) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(at, &t));
    if (t != cudaGraphNodeTypeMemAlloc && t != cudaGraphNodeTypeMemFree) return at;
    size_t m = 0;
    CHECK(cudaGraphNodeGetDependencies(at, nullptr, nullptr, &m));
    if (m != 1) return nullptr;
    CHECK(cudaGraphNodeGetDependencies(at, &at, nullptr, &m));
  }
  return nullptr;
}

struct Launcher {
  cudaStream_t stream;
  bool pdl;
  bool alloc;  // a stream-ordered allocation and free around every launch (candle's pattern)
  bool hoist;  // the allocation made a root of the graph, the kernel after the last operation
  template <typename... A>
  void operator()(void (*k)(A...), int grid, int block, A... args) {
    void* scratch = nullptr;
    cudaGraphNode_t prev = nullptr;
    if (hoist) {
      prev = last_operation(stream);
      CHECK(cudaStreamUpdateCaptureDependencies(stream, nullptr, nullptr, 0, cudaStreamSetCaptureDependencies));
    }
    if (alloc) CHECK(cudaMallocAsync(&scratch, 4096, stream));
    if (hoist && prev) {
      cudaStreamCaptureStatus st;
      const cudaGraphNode_t* deps = nullptr;
      size_t n = 0;
      CHECK(cudaStreamGetCaptureInfo(stream, &st, nullptr, nullptr, &deps, nullptr, &n));
      std::vector<cudaGraphNode_t> nodes(deps, deps + n);
      std::vector<cudaGraphEdgeData> data(n + 1);
      memset(data.data(), 0, sizeof(cudaGraphEdgeData) * data.size());
      nodes.push_back(prev);
      if (pdl) {
        data[n].from_port = cudaGraphKernelNodePortProgrammatic;
        data[n].type = cudaGraphDependencyTypeProgrammatic;
      }
      CHECK(cudaStreamUpdateCaptureDependencies(stream, nodes.data(), data.data(), nodes.size(),
                                                cudaStreamSetCaptureDependencies));
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl && !hoist ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, k, args...));
    if (alloc) CHECK(cudaFreeAsync(scratch, stream));
  }
};

int main() {
  const int C = 768, L = 12, V = 50257;
  struct W { uint4 *qkv, *proj, *fc, *fc2; };
  std::vector<W> layers(L);
  auto alloc_w = [](int n, int k) {
    uint4* p;
    CHECK(cudaMalloc(&p, (size_t)n * k * 2));
    CHECK(cudaMemset(p, 1, (size_t)n * k * 2));
    return p;
  };
  for (auto& l : layers) l = {alloc_w(3 * C, C), alloc_w(C, C), alloc_w(4 * C, C), alloc_w(C, 4 * C)};
  uint4* head = alloc_w(V, C);
  float *a, *b, *logits;
  CHECK(cudaMalloc(&a, 4 * C * 4));
  CHECK(cudaMalloc(&b, 4 * C * 4));
  CHECK(cudaMalloc(&logits, V * 4));
  CHECK(cudaMemset(a, 0, 4 * C * 4));
  CHECK(cudaMemset(b, 0, 4 * C * 4));

  auto step = [&](Launcher& go, bool preload) {
    auto g = preload ? gemv<true> : gemv<false>;
    for (auto& l : layers) {
      go(norm, 1, 256, (const float*)a, b, C);
      go(g, 3 * C, 128, (const float*)b, (const uint4*)l.qkv, a, C / 8);
      go(attn, 12, 64, (const float*)a, b);
      go(g, C, 128, (const float*)b, (const uint4*)l.proj, a, C / 8);
      go(norm, 1, 256, (const float*)a, b, C);
      go(g, 4 * C, 128, (const float*)b, (const uint4*)l.fc, a, C / 8);
      go(g, C, 128, (const float*)a, (const uint4*)l.fc2, b, 4 * C / 8);
      go(norm, 1, 256, (const float*)b, a, C);
    }
    go(g, V, 128, (const float*)a, (const uint4*)head, logits, C / 8);
  };

  cudaStream_t created;
  CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
  struct Variant { const char* name; cudaStream_t s; bool pdl, preload, alloc = false, hoist = false; };
  const Variant variants[] = {
      {"created stream, plain", created, false, false},
      {"created stream, pdl", created, true, false},
      {"created stream, pdl + weights before the wait", created, true, true},
      {"created stream, plain (weights-first kernel)", created, false, true},
      {"per-thread stream, plain", cudaStreamPerThread, false, false},
      {"per-thread stream, pdl", cudaStreamPerThread, true, false},
      {"per-thread stream, pdl + weights before the wait", cudaStreamPerThread, true, true},
      {"per-thread stream, plain, alloc + free a launch", cudaStreamPerThread, false, false, true},
      {"per-thread stream, pdl, alloc + free a launch", cudaStreamPerThread, true, false, true},
      {"per-thread stream, pdl, alloc + free, alloc hoisted", cudaStreamPerThread, true, false, true, true},
      {"per-thread stream, plain, alloc + free, alloc hoisted", cudaStreamPerThread, false, false, true, true},
  };
  printf("kernels a step: %d (12 layers x 8 + head)\n", L * 8 + 1);
  for (int round = 0; round < 2; round++)
    for (const auto& v : variants) {
      Launcher go{v.s, v.pdl, v.alloc, v.hoist};
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK(cudaStreamBeginCapture(v.s, cudaStreamCaptureModeThreadLocal));
      step(go, v.preload);
      CHECK(cudaStreamEndCapture(v.s, &graph));
      size_t nodes = 0;
      CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 20; i++) CHECK(cudaGraphLaunch(exec, v.s));
      CHECK(cudaStreamSynchronize(v.s));
      std::vector<float> ms;
      cudaEvent_t e0, e1;
      CHECK(cudaEventCreate(&e0));
      CHECK(cudaEventCreate(&e1));
      for (int rep = 0; rep < 200; rep++) {
        CHECK(cudaEventRecord(e0, v.s));
        CHECK(cudaGraphLaunch(exec, v.s));
        CHECK(cudaEventRecord(e1, v.s));
        CHECK(cudaEventSynchronize(e1));
        float t;
        CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      printf("round %d  %-50s p50 %.1f us  p10 %.1f  p90 %.1f  (%zu nodes)\n", round, v.name, ms[100] * 1e3,
             ms[20] * 1e3, ms[180] * 1e3, nodes);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
    }
  return 0;
}
