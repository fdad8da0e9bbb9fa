// Issue 60: what cuDNN's fused attention gives Qwen3-8B's prompt shapes on this GPU in bf16 (what
// MLX runs) and in FP8 (e4m3 q, k and v with one scale a tensor; Hopper writes FP8 output), and how
// far the FP8 output lands from the bf16 one. Standalone: built on the GPU machine by
// eval/device-issue60-rest.sh against cudnn-frontend's headers (PyPI nvidia-cudnn-frontend) and the
// cuDNN that MLX loads.
//   cudnn_sdpa_fp8 S [S ...]   (one line per length: bf16 and FP8 times, TFLOP/s, error)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

static void check_fe(fe::error_t e, const char* what) {
  if (!e.is_good()) {
    std::fprintf(stderr, "%s: %s\n", what, e.get_message().c_str());
    std::exit(1);
  }
}

// Qwen3-8B: 32 query heads, 8 key/value heads, head size 128, one sequence.
constexpr int64_t HQ = 32, HKV = 8, D = 128;

struct Graph {
  fe::graph::Graph graph;
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v, o, dq, dk, dv, ds, ss, so, amax_s, amax_o;
  void* workspace = nullptr;
};

// BSHD in memory (what the projections write), given as BHSD dimensions.
static std::vector<int64_t> bshd_strides(int64_t s, int64_t h) { return {s * h * D, D, h * D, 1}; }

static std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph& g, const char* name) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT));
}

static Graph build(cudnnHandle_t handle, int64_t s, bool fp8) {
  Graph g;
  auto io = fp8 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::BFLOAT16;
  g.graph.set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t h) {
    return g.graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim({1, h, s, D}).set_stride(bshd_strides(s, h)).set_data_type(io));
  };
  g.q = tensor("q", HQ);
  g.k = tensor("k", HKV);
  g.v = tensor("v", HKV);
  auto attributes = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_causal_mask(true).set_attn_scale(1.0f / std::sqrt(float(D)));
  if (fp8) {
    g.dq = scalar(g.graph, "descale_q");
    g.dk = scalar(g.graph, "descale_k");
    g.dv = scalar(g.graph, "descale_v");
    g.ds = scalar(g.graph, "descale_s");
    g.ss = scalar(g.graph, "scale_s");
    g.so = scalar(g.graph, "scale_o");
    auto [o, stats, amax_s, amax_o] = g.graph.sdpa_fp8(g.q, g.k, g.v, g.dq, g.dk, g.dv, g.ds, g.ss, g.so, attributes);
    g.o = o;
    g.amax_s = amax_s;
    g.amax_o = amax_o;
    amax_s->set_output(true).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
    amax_o->set_output(true).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto [o, stats] = g.graph.sdpa(g.q, g.k, g.v, attributes);
    g.o = o;
  }
  g.o->set_output(true).set_dim({1, HQ, s, D}).set_stride(bshd_strides(s, HQ)).set_data_type(io);
  check_fe(g.graph.validate(), "validate");
  check_fe(g.graph.build_operation_graph(handle), "build_operation_graph");
  check_fe(g.graph.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check_fe(g.graph.check_support(handle), "check_support");
  check_fe(g.graph.build_plans(handle), "build_plans");
  int64_t bytes = 0;
  check_fe(g.graph.get_workspace_size(bytes), "get_workspace_size");
  if (bytes > 0) CHECK_CUDA(cudaMalloc(&g.workspace, bytes));
  return g;
}

static float run(cudnnHandle_t handle, Graph& g, std::unordered_map<std::shared_ptr<fe::graph::Tensor_attributes>, void*>& pack, int reps) {
  check_fe(g.graph.execute(handle, pack, g.workspace), "execute");
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; i++) check_fe(g.graph.execute(handle, pack, g.workspace), "execute");
  cudaEventRecord(b);
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms / reps;
}

template <typename T>
static T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, host.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}

int main(int argc, char** argv) {
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnCreate failed\n");
    return 1;
  }
  std::printf("cudnn %zu, frontend %d\n", cudnnGetVersion(), CUDNN_FRONTEND_VERSION);
  std::printf("S,bf16_ms,bf16_tflops,fp8_ms,fp8_tflops,fp8_over_bf16,rel_l2_fp8_vs_bf16,rel_l2_bf16_rounded_to_fp8,amax_o\n");
  for (int arg = 1; arg < argc; arg++) {
    int64_t s = std::atoll(argv[arg]);
    // q and k as Qwen3 gives them after its per-head RMS norm (entries about 1), v about 1.
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> qf(s * HQ * D), kf(s * HKV * D), vf(s * HKV * D);
    for (auto* t : {&qf, &kf, &vf})
      for (auto& x : *t) x = normal(rng);
    auto amax = [](const std::vector<float>& t) { float m = 0; for (float x : t) m = std::fmax(m, std::fabs(x)); return m; };
    float aq = amax(qf), ak = amax(kf), av = amax(vf);
    auto to_bf16 = [](const std::vector<float>& t) { std::vector<__nv_bfloat16> r(t.size()); for (size_t i = 0; i < t.size(); i++) r[i] = __float2bfloat16(t[i]); return r; };
    auto to_fp8 = [](const std::vector<float>& t, float scale) { std::vector<__nv_fp8_e4m3> r(t.size()); for (size_t i = 0; i < t.size(); i++) r[i] = __nv_fp8_e4m3(t[i] * scale); return r; };
    // Scales put each tensor's largest magnitude at e4m3's largest (448); P in [0, 1] likewise;
    // |o| <= max |v|, so o takes v's scale.
    float sq = 448.0f / aq, sk = 448.0f / ak, sv = 448.0f / av;
    std::vector<float> scales = {1 / sq, 1 / sk, 1 / sv, 1 / 448.0f, 448.0f, sv};
    auto qb = upload(to_bf16(qf)), kb = upload(to_bf16(kf)), vb = upload(to_bf16(vf));
    auto q8 = upload(to_fp8(qf, sq)), k8 = upload(to_fp8(kf, sk)), v8 = upload(to_fp8(vf, sv));
    __nv_bfloat16* ob;
    __nv_fp8_e4m3* o8;
    float *scale_dev, *amax_dev;
    CHECK_CUDA(cudaMalloc(&ob, s * HQ * D * 2));
    CHECK_CUDA(cudaMalloc(&o8, s * HQ * D));
    scale_dev = upload(scales);
    CHECK_CUDA(cudaMalloc(&amax_dev, 2 * sizeof(float)));
    int reps = s >= 16384 ? 5 : 20;
    double flop = 2.0 * 2.0 * HQ * D * double(s) * double(s) / 2.0;  // causal: half of QK^T and PV

    Graph gb = build(handle, s, false);
    std::unordered_map<std::shared_ptr<fe::graph::Tensor_attributes>, void*> pb = {{gb.q, qb}, {gb.k, kb}, {gb.v, vb}, {gb.o, ob}};
    float bf16_ms = run(handle, gb, pb, reps);

    Graph g8 = build(handle, s, true);
    std::unordered_map<std::shared_ptr<fe::graph::Tensor_attributes>, void*> p8 = {
        {g8.q, q8}, {g8.k, k8}, {g8.v, v8}, {g8.o, o8}, {g8.dq, scale_dev}, {g8.dk, scale_dev + 1}, {g8.dv, scale_dev + 2},
        {g8.ds, scale_dev + 3}, {g8.ss, scale_dev + 4}, {g8.so, scale_dev + 5}, {g8.amax_s, amax_dev}, {g8.amax_o, amax_dev + 1}};
    float fp8_ms = run(handle, g8, p8, reps);

    std::vector<__nv_bfloat16> obh(s * HQ * D);
    std::vector<__nv_fp8_e4m3> o8h(s * HQ * D);
    float amax_h[2];
    CHECK_CUDA(cudaMemcpy(obh.data(), ob, obh.size() * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(o8h.data(), o8, o8h.size(), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(amax_h, amax_dev, sizeof amax_h, cudaMemcpyDeviceToHost));
    double diff = 0, norm = 0, floor = 0;
    for (size_t i = 0; i < obh.size(); i++) {
      float ref = __bfloat162float(obh[i]);
      float got = float(o8h[i]) / sv;
      float rounded = float(__nv_fp8_e4m3(ref * sv)) / sv;
      diff += double(got - ref) * (got - ref);
      floor += double(rounded - ref) * (rounded - ref);
      norm += double(ref) * ref;
    }
    std::printf("%lld,%.3f,%.0f,%.3f,%.0f,%.2f,%.4f,%.4f,%.3f\n", (long long)s, bf16_ms, flop / bf16_ms / 1e9, fp8_ms, flop / fp8_ms / 1e9,
                bf16_ms / fp8_ms, std::sqrt(diff / norm), std::sqrt(floor / norm), amax_h[1]);
    std::fflush(stdout);
    for (void* p : {(void*)qb, (void*)kb, (void*)vb, (void*)q8, (void*)k8, (void*)v8, (void*)ob, (void*)o8, (void*)scale_dev, (void*)amax_dev, gb.workspace, g8.workspace})
      if (p) cudaFree(p);
  }
  cudnnDestroy(handle);
  return 0;
}
