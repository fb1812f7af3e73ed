// The whole CUDA engine against the oracle fixtures (1e-4, as the CPU engine: weights stay in their
// checkpoint dtype and compute is f32), against the CPU engine on batched generation (graphs on,
// sequences of different lengths), graphs vs eager, host lane vs local lane and PDL on vs off
// (bitwise equal: same kernels), hooks, and bad options.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cuda/cuda_diagnostics.h"
#include "backends/cuda/cuda_engine.h"
#include "backends/cuda/mla_decode.cuh"
#include "backends/cuda/moe.cuh"
#include "engine/generate.h"
#include "engine/verify.h"
#include "models/synth.h"
#include "runtime/lane_plan.h"
#include "test_util.h"

namespace tandem {
namespace {

class CudaOracle : public ::testing::TestWithParam<std::string> {};

// A CUDA engine that runs every step eagerly (no graphs): the reference the graph-replaying one must
// match bit for bit.
std::unique_ptr<Engine> make_eager_engine(const Model& model) {
  CudaOptions o;
  o.graphs = false;
  return make_cuda_engine(model, {}, o);
}

TEST_P(CudaOracle, MatchesTransformers) {
  const std::string dir = test::oracle_dir(GetParam());
  auto model = Model::load(dir);
  auto engine = make_cuda_engine(*model, {}, {});
  auto checks = verify_against(*engine, dir + "/expected.safetensors");
  ASSERT_GE(checks.size(), 4u);
  for (const auto& c : checks) EXPECT_TRUE(c.pass) << c.name << " max_rel_err " << c.max_rel_err;
}

std::vector<std::vector<float>> run_generate(Engine& e, int64_t chunk) {
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 99, 3, 250, 7, 8}, {42}, {300, 301, 302, 7}};
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.prompt = prompts[i];
    r.max_tokens = 4 + int64_t(i);  // sequences finish at different steps: batch sizes 3, 2, 1
    reqs.push_back(r);
  }
  GenerateOptions o;
  o.keep_logits = true;
  o.prefill_chunk = chunk;
  auto res = generate(e, reqs, o);
  std::vector<std::vector<float>> out;
  for (auto& r : res) out.push_back(r.logits);
  return out;
}

TEST_P(CudaOracle, BatchedGenerationMatchesCpuEngine) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  CpuEngine cpu(*model);
  auto ref = run_generate(cpu, 2);
  auto gpu = make_cuda_engine(*model, {}, {});
  auto got = run_generate(*gpu, 2);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].size(), ref[i].size());
    EXPECT_LT(max_rel_err(got[i].data(), ref[i].data(), int64_t(ref[i].size())), 1e-4) << "prompt " << i;
  }
  // A second run on the same engine replays the captured graphs: same answers.
  auto again = run_generate(*gpu, 2);
  EXPECT_EQ(again, got);
}

TEST_P(CudaOracle, GraphsHostLaneAndEagerAgreeBitwise) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  auto local = make_cuda_engine(*model, {}, {});
  auto eager = make_eager_engine(*model);
  CudaOptions host_opt;
  host_opt.lane = CudaLane::kHost;
  host_opt.cold = cold_tail(model->cfg, 0.5);
  auto host = make_cuda_engine(*model, {}, host_opt);
  CudaOptions sleep_opt;  // the host sleeps on a blocking-sync event instead of spinning: same bits, complete
  sleep_opt.host_wait = CudaHostWait::kSleep;
  auto sleeping = make_cuda_engine(*model, {}, sleep_opt);
  auto a = run_generate(*local, 256);
  EXPECT_EQ(run_generate(*eager, 256), a);
  EXPECT_EQ(run_generate(*host, 256), a);
  EXPECT_EQ(run_generate(*sleeping, 256), a);
  EXPECT_EQ(run_generate(*sleeping, 256), a);  // its graphs replayed
}

// PDL only changes when a kernel is scheduled, never what it computes: with graphs on (captured and
// replayed steps) and eagerly, the logits are the same bits with it on and off.
TEST_P(CudaOracle, PdlOnAndOffAgreeBitwise) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  CudaOptions on_opt, off_opt, eager_on_opt;
  on_opt.pdl = true;
  off_opt.pdl = false;
  eager_on_opt.graphs = false;
  auto on = make_cuda_engine(*model, {}, on_opt);
  auto off = make_cuda_engine(*model, {}, off_opt);
  auto eager_on = make_cuda_engine(*model, {}, eager_on_opt);
  auto a = run_generate(*off, 2);
  EXPECT_EQ(run_generate(*on, 2), a);
  EXPECT_EQ(run_generate(*on, 2), a);  // graphs replayed
  EXPECT_EQ(run_generate(*eager_on, 2), a);
}

TEST_P(CudaOracle, RoutingHookSeesEveryMoeLayer) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  auto gpu = make_cuda_engine(*model, {}, {});
  CpuEngine cpu(*model);
  std::vector<Routing> got, ref;
  gpu->hooks.on_routing = [&](int64_t, const Routing& r) { got.push_back(r); };
  cpu.hooks.on_routing = [&](int64_t, const Routing& r) { ref.push_back(r); };
  std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  for (Engine* e : {static_cast<Engine*>(gpu.get()), static_cast<Engine*>(&cpu)}) {
    int s = e->add_sequence();
    Engine::Item it{s, toks};
    e->forward(std::span<const Engine::Item>(&it, 1));
  }
  ASSERT_EQ(got.size(), size_t(model->cfg.n_moe_layers()));
  ASSERT_EQ(got.size(), ref.size());
  for (size_t l = 0; l < got.size(); ++l) {
    EXPECT_EQ(got[l].ids, ref[l].ids) << "layer " << l;
    EXPECT_EQ(got[l].k, model->cfg.n_expert_used);
  }
}

// One-row steps without a peer route inside the expert gate_up blocks (moe.cuh,
// launch_expert_gate_up_routed): the same bits as the separate routing launch, graphs replayed and
// eager, and the routing its first block writes out (read by expert_down, the combine and the hooks) is
// the CPU router's.
TEST_P(CudaOracle, RoutingInTheExpertBlocksAgreesBitwise) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  auto gpu = make_cuda_engine(*model, {}, {});
  auto eager = make_eager_engine(*model);
  const CudaKernelPolicy before = cuda_kernel_policy(*gpu);
  ASSERT_TRUE(before.moe_route_in_gate_up);
  CudaKernelPolicy off = before;
  off.moe_route_in_gate_up = false;
  cuda_set_kernel_policy(*gpu, off);
  const auto ref = run_generate(*gpu, 2);  // batch sizes 3, 2, 1: the last steps are one row
  cuda_set_kernel_policy(*gpu, before);
  EXPECT_EQ(run_generate(*gpu, 2), ref);
  EXPECT_EQ(run_generate(*gpu, 2), ref);  // graphs replayed
  EXPECT_EQ(run_generate(*eager, 2), ref);

  // The routing hook on a one-row decode step (hooks run eagerly): fused, unfused and the CPU's.
  auto one_row_routing = [](Engine& e) {
    std::vector<Routing> out;
    e.hooks.on_routing = [&](int64_t, const Routing& r) { out.push_back(r); };
    const int s = e.add_sequence();
    std::vector<int32_t> prompt = {1, 2, 3}, next = {4};
    Engine::Item a{s, prompt}, b{s, next};
    e.forward(std::span<const Engine::Item>(&a, 1));
    out.clear();
    e.forward(std::span<const Engine::Item>(&b, 1));
    e.hooks.on_routing = nullptr;
    return out;
  };
  CpuEngine cpu(*model);
  const auto want = one_row_routing(cpu);
  const auto fused = one_row_routing(*eager);
  cuda_set_kernel_policy(*eager, off);
  const auto unfused = one_row_routing(*eager);
  cuda_set_kernel_policy(*eager, before);
  ASSERT_EQ(fused.size(), size_t(model->cfg.n_moe_layers()));
  ASSERT_EQ(fused.size(), want.size());
  ASSERT_EQ(fused.size(), unfused.size());
  for (size_t l = 0; l < fused.size(); ++l) {
    EXPECT_EQ(fused[l].ids, want[l].ids) << "layer " << l;
    EXPECT_EQ(fused[l].ids, unfused[l].ids) << "layer " << l;
    EXPECT_EQ(fused[l].weights, unfused[l].weights) << "layer " << l;
  }
}

// The expert kernels' evict-first weight loads (CudaKernelPolicy::expert_evict_first, default on) are
// a cache hint: the same bits as evict-normal loads, graphs replayed and eager, host lane too.
TEST_P(CudaOracle, EvictFirstExpertLoadsChangeNoBits) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  CudaOptions host_opt;
  host_opt.lane = CudaLane::kHost;
  host_opt.cold = cold_tail(model->cfg, 0.5);
  auto gpu = make_cuda_engine(*model, {}, {});
  auto eager = make_eager_engine(*model);
  auto host = make_cuda_engine(*model, {}, host_opt);
  const CudaKernelPolicy before = cuda_kernel_policy(*gpu);
  ASSERT_TRUE(before.expert_evict_first);
  CudaKernelPolicy off = before;
  off.expert_evict_first = false;
  cuda_set_kernel_policy(*gpu, off);
  const auto ref = run_generate(*gpu, 2);
  cuda_set_kernel_policy(*gpu, before);
  EXPECT_EQ(run_generate(*gpu, 2), ref);
  EXPECT_EQ(run_generate(*gpu, 2), ref);  // graphs replayed
  EXPECT_EQ(run_generate(*eager, 2), ref);
  EXPECT_EQ(run_generate(*host, 2), ref);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaOracle,
                         ::testing::Values("qwen3moe_f32", "mixtral_bf16", "olmoe_f32", "deepseekv3_f32"));

// MLA attention at the benchmark model's widths (16 heads, kv_lora 512, rope 64: every latent column
// pass of the weighted sum in use) over a context past 512 positions, against the CPU engine: a long
// prompt prefilled in chunks (each row's positions split over 1 to 16 blocks as the context grows),
// then decode steps through captured graphs (16 blocks per row). 24 heads: a second, partial tile of heads. The
// fixtures' contexts are a few tokens and their kv_lora is 32.
class CudaLongMla : public ::testing::TestWithParam<int> {};

// A two-layer MLA model at the benchmark's widths with n_head heads, written to dir.
std::unique_ptr<Model> long_mla_model(int n_head, const std::string& dir, int q_lora = 96) {
  nlohmann::json cfg = synth_preset_config("tiny");
  cfg.update({{"hidden_size", 256}, {"num_hidden_layers", 2}, {"num_attention_heads", n_head},
              {"num_key_value_heads", n_head}, {"q_lora_rank", q_lora}, {"kv_lora_rank", 512},
              {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128}});
  SynthOptions so;
  so.seed = 5;
  write_synthetic_model(cfg, dir, so);
  return Model::load(dir);
}

// A prompt of prompt_len tokens prefilled in chunks of 64, then `tokens` greedy decode steps.
GenerateResult run_long_mla(Engine& e, int prompt_len, int64_t tokens) {
  GenerateRequest r;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(int32_t((i * 37 + 11) % 512));
  r.max_tokens = tokens;
  GenerateOptions o;
  o.keep_logits = true;
  o.prefill_chunk = 64;
  std::vector<GenerateRequest> reqs{r};
  return generate(e, reqs, o).at(0);
}

TEST_P(CudaLongMla, MatchesCpuEngine) {
  test::TempDir tmp;
  auto model = long_mla_model(GetParam(), tmp.path);
  CpuEngine cpu(*model);
  auto gpu = make_cuda_engine(*model, {}, {});
  const auto ref = run_long_mla(cpu, 520, 6);
  // Decode steps fused into one cluster launch (the default at one row), then unfused: split blocks of
  // at least 16 positions (the default), 5 and 1 (other chunk sizes, split counts and a last split
  // shorter than the others), each row's new cache entry built inside attention (the default) and by
  // mla_prep.
  const CudaKernelPolicy before = cuda_kernel_policy(*gpu);
  // The fused launch also in clusters of 8 blocks (mla_cluster; default 4).
  struct Case {
    int chunk;
    bool fresh;
    int fused;
    int cluster = 4;
  };
  for (const Case k : {Case{16, true, 1}, {16, true, 1, 8}, {16, true, 0}, {5, true, 0},
                       {1, true, 0}, {16, false, 0}, {5, false, 0}, {1, false, 0}}) {
    SCOPED_TRACE(fmt::format("chunk {}, fresh rows {}, fused rows {}, cluster {}", k.chunk, k.fresh, k.fused,
                             k.cluster));
    CudaKernelPolicy p = before;
    p.mla_min_chunk = k.chunk;
    p.mla_fresh_rows = k.fresh;
    p.mla_fused_rows = k.fused;
    p.mla_cluster = k.cluster;
    cuda_set_kernel_policy(*gpu, p);
    const auto got = run_long_mla(*gpu, 520, 6);
    EXPECT_EQ(got.tokens, ref.tokens);
    ASSERT_EQ(got.logits.size(), ref.logits.size());
    EXPECT_LT(max_rel_err(got.logits.data(), ref.logits.data(), int64_t(ref.logits.size())), 1e-4);
  }
  cuda_set_kernel_policy(*gpu, before);
}

// Decode across kMlaFusedMaxPos: the fused launch below it, the unfused kernels from it on, each in
// its own captured graph (the engine keys its graphs by the bound); the same tokens and logits as the
// CPU engine, and again when the graphs are replayed.
TEST(CudaFusedMla, DecodeAcrossTheLongContextBound) {
  test::TempDir tmp;
  auto model = long_mla_model(16, tmp.path);
  CpuEngine cpu(*model);
  auto gpu = make_cuda_engine(*model, {}, {});
  const int prompt = cuda::kMlaFusedMaxPos - 5;
  const auto ref = run_long_mla(cpu, prompt, 10);
  for (int pass = 0; pass < 2; ++pass) {
    const auto got = run_long_mla(*gpu, prompt, 10);
    EXPECT_EQ(got.tokens, ref.tokens) << "pass " << pass;
    ASSERT_EQ(got.logits.size(), ref.logits.size());
    EXPECT_LT(max_rel_err(got.logits.data(), ref.logits.data(), int64_t(ref.logits.size())), 1e-4) << "pass " << pass;
  }
}

// The fused decode's cluster size: the policy's (4 by default, or 8) where a block of that size fits
// kMlaDecodeMaxSmem, the portable 8 where it would not (DeepSeek-V3's q_lora of 1536: a quarter of
// the head's q_b rows alone is 147 KB in bf16); the launch's grid says which ran, and each run matches
// the CPU engine (q_lora 768 and 1536 are wider than the hidden size, as no preset is).
TEST(CudaFusedMla, ClusterSizeFollowsThePolicyWhereItFits) {
  const CudaKernelPolicy before;
  ASSERT_EQ(before.mla_cluster, 4);
  for (const int q_lora : {96, 768, 1536}) {
    test::TempDir tmp;
    auto model = long_mla_model(16, tmp.path, q_lora);
    CpuEngine cpu(*model);
    const auto ref = run_long_mla(cpu, 20, 3);
    auto gpu = make_eager_engine(*model);
    ASSERT_EQ(cuda_kernel_policy(*gpu).mla_cluster, 4);
    for (const int cluster : {4, 8}) {
      SCOPED_TRACE(fmt::format("q_lora {}, cluster {}", q_lora, cluster));
      CudaKernelPolicy p = before;
      p.mla_cluster = cluster;
      cuda_set_kernel_policy(*gpu, p);
      KernelProfile profile;
      const auto got = run_long_mla(*gpu, 20, 3);
      profile.end_step();
      EXPECT_EQ(got.tokens, ref.tokens);
      ASSERT_EQ(got.logits.size(), ref.logits.size());
      EXPECT_LT(max_rel_err(got.logits.data(), ref.logits.data(), int64_t(ref.logits.size())), 1e-4);
      std::vector<std::string> fused;
      for (const KernelTime& k : profile.totals())
        if (k.name.find("mla_decode_kernel") != std::string::npos) fused.push_back(k.name);
      ASSERT_EQ(fused.size(), 1u) << fmt::format("{}", fmt::join(fused, "; "));
      const int want = q_lora == 1536 ? 8 : cluster;
      EXPECT_NE(fused[0].find(fmt::format("[{}x16x1]", want)), std::string::npos) << fused[0];
    }
    cuda_set_kernel_policy(*gpu, before);
  }
}

// The fused decode's L2 prefetch of o_proj, the router and the shared expert (layer 1 is MoE with a
// shared expert) and the experts' evict-first loads are hints: on (the defaults) and off give the same
// bits, graphs replayed and eager.
TEST(CudaFusedMla, CacheHintsChangeNoBits) {
  test::TempDir tmp;
  auto model = long_mla_model(16, tmp.path);
  auto gpu = make_cuda_engine(*model, {}, {});
  auto eager = make_eager_engine(*model);
  const CudaKernelPolicy before = cuda_kernel_policy(*gpu);
  ASSERT_TRUE(before.mla_prefetch_moe && before.expert_evict_first);
  CudaKernelPolicy off = before;
  off.mla_prefetch_moe = off.expert_evict_first = false;
  cuda_set_kernel_policy(*gpu, off);
  const auto ref = run_long_mla(*gpu, 40, 6);
  cuda_set_kernel_policy(*gpu, before);
  for (int pass = 0; pass < 2; ++pass) {  // captured, then replayed
    const auto got = run_long_mla(*gpu, 40, 6);
    EXPECT_EQ(got.tokens, ref.tokens) << "pass " << pass;
    EXPECT_EQ(got.logits, ref.logits) << "pass " << pass;
  }
  const auto got = run_long_mla(*eager, 40, 6);
  EXPECT_EQ(got.logits, ref.logits);
}

INSTANTIATE_TEST_SUITE_P(Heads, CudaLongMla, ::testing::Values(16, 18, 24));  // 18: a group of two heads

// Shapes the GPU kernels do not take are refused at construction, naming the limit: MLA with
// kv_lora + rope above kMlaMaxWidth, more routed experts than the router holds.
TEST(CudaEngineOptions, UnsupportedModelShapesAreInputErrors) {
  test::TempDir wide, many;
  nlohmann::json cfg = synth_preset_config("tiny");
  cfg["kv_lora_rank"] = 1024;
  write_synthetic_model(cfg, wide.path, {});
  EXPECT_THROW(make_cuda_engine(*Model::load(wide.path), {}, {}), InputError);
  cfg = synth_preset_config("tiny");
  cfg["n_routed_experts"] = cuda::kMaxRouteExperts + 32;
  write_synthetic_model(cfg, many.path, {});
  EXPECT_THROW(make_cuda_engine(*Model::load(many.path), {}, {}), InputError);
}

TEST(CudaEngineOptions, BadOptionsAreInputErrors) {
  auto model = Model::load(test::oracle_dir("deepseekv3_f32"));
  CudaOptions o;
  o.device = 99;
  EXPECT_THROW(make_cuda_engine(*model, {}, o), InputError);
  EXPECT_THROW(cold_tail(model->cfg, 1.5), InputError);
}

// Memory the device does not have is an OutOfMemoryError naming what and how much, never an
// InputError: a KV cache larger than the free memory (refused before allocating it), and an
// allocation the driver refuses.
TEST(CudaEngineOptions, OutOfMemoryIsItsOwnError) {
  auto model = Model::load(test::oracle_dir("qwen3moe_f32"));
  EngineOptions eo;
  eo.max_ctx = 64;
  eo.max_seqs = 1 << 24;
  try {
    make_cuda_engine(*model, eo, {});
    ADD_FAILURE() << "a KV cache of 16M sequences was allocated";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache"), std::string::npos) << e.what();
  }
  try {
    cuda::device_alloc(size_t(1) << 50, "a petabyte");
    ADD_FAILURE() << "a petabyte of device memory was allocated";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("a petabyte"), std::string::npos) << e.what();
  }
  auto e = make_cuda_engine(*model, {}, {});  // the failures left the device usable
  const int s = e->add_sequence();
  std::vector<int32_t> toks = {1, 2};
  Engine::Item it{s, toks};
  EXPECT_EQ(e->forward(std::span<const Engine::Item>(&it, 1)).size(), size_t(model->cfg.vocab_size));
}

void expect_policy(const CudaKernelPolicy& got, const CudaKernelPolicy& want) {
  EXPECT_EQ(got.expert_max_rows, want.expert_max_rows);
  EXPECT_EQ(got.linear_mma_min_rows, want.linear_mma_min_rows);
  EXPECT_EQ(got.linear_row_split, want.linear_row_split);
  EXPECT_EQ(got.linear_split_target, want.linear_split_target);
  EXPECT_EQ(got.mla_min_chunk, want.mla_min_chunk);
  EXPECT_EQ(got.mla_fresh_rows, want.mla_fresh_rows);
  EXPECT_EQ(got.mla_fused_rows, want.mla_fused_rows);
  EXPECT_EQ(got.mla_cluster, want.mla_cluster);
  EXPECT_EQ(got.mla_prefetch_moe, want.mla_prefetch_moe);
  EXPECT_EQ(got.moe_route_in_gate_up, want.moe_route_in_gate_up);
  EXPECT_EQ(got.expert_evict_first, want.expert_evict_first);
}

// The kernel choices a benchmark may set: an engine starts with the product's defaults, bad values are
// input errors that leave its policy as it was, good ones read back; each engine holds its own (a
// second engine keeps the defaults while the first runs others).
TEST(CudaEngineOptions, KernelPolicyChecksItsValues) {
  auto model = Model::load(test::oracle_dir("deepseekv3_f32"));
  auto e = make_cuda_engine(*model, {}, {});
  auto other_engine = make_cuda_engine(*model, {}, {});
  const CudaKernelPolicy before = cuda_kernel_policy(*e);
  expect_policy(before, {.expert_max_rows = 4,
                         .linear_mma_min_rows = 2,
                         .linear_row_split = 0,
                         .linear_split_target = 2,
                         .mla_min_chunk = 16,
                         .mla_fresh_rows = true,
                         .mla_fused_rows = 1,
                         .mla_cluster = 4,
                         .mla_prefetch_moe = true,
                         .moe_route_in_gate_up = true,
                         .expert_evict_first = true});
  using Set = void (*)(CudaKernelPolicy&, int);
  const std::vector<std::pair<Set, std::vector<int>>> bad = {
      {[](CudaKernelPolicy& p, int v) { p.expert_max_rows = v; }, {0, 3, 16}},
      {[](CudaKernelPolicy& p, int v) { p.linear_mma_min_rows = v; }, {-1}},
      {[](CudaKernelPolicy& p, int v) { p.linear_row_split = v; }, {-1, 3, 8}},
      {[](CudaKernelPolicy& p, int v) { p.linear_split_target = v; }, {0, 65}},
      {[](CudaKernelPolicy& p, int v) { p.mla_min_chunk = v; }, {0, 1025}},
      {[](CudaKernelPolicy& p, int v) { p.mla_fused_rows = v; }, {-1, 9}},
      {[](CudaKernelPolicy& p, int v) { p.mla_cluster = v; }, {0, 2, 6, 16, 32}}};
  for (const auto& [set, values] : bad)
    for (int v : values) {
      CudaKernelPolicy p = before;
      set(p, v);
      EXPECT_THROW(cuda_set_kernel_policy(*e, p), InputError) << v;
      expect_policy(cuda_kernel_policy(*e), before);
    }
  const CudaKernelPolicy other{.expert_max_rows = 8,
                               .linear_mma_min_rows = 0,
                               .linear_row_split = 4,
                               .linear_split_target = 3,
                               .mla_min_chunk = 7,
                               .mla_fresh_rows = false,
                               .mla_fused_rows = 4,
                               .mla_cluster = 8,
                               .mla_prefetch_moe = false,
                               .moe_route_in_gate_up = false,
                               .expert_evict_first = false};
  cuda_set_kernel_policy(*e, other);
  expect_policy(cuda_kernel_policy(*e), other);
  expect_policy(cuda_kernel_policy(*other_engine), before);
  cuda_set_kernel_policy(*e, before);
  expect_policy(cuda_kernel_policy(*e), before);
  EXPECT_THROW(KernelRepeat(""), InputError);
}

TEST(CudaEngineOptions, ContextAndSlotLimits) {
  auto model = Model::load(test::oracle_dir("qwen3moe_f32"));
  EngineOptions eo;
  eo.max_ctx = 8;
  eo.max_seqs = 1;
  auto e = make_cuda_engine(*model, eo, {});
  int s = e->add_sequence();
  EXPECT_THROW(e->add_sequence(), InputError);
  std::vector<int32_t> toks(9, 1);
  Engine::Item it{s, toks};
  EXPECT_THROW(e->forward(std::span<const Engine::Item>(&it, 1)), InputError);
  EXPECT_EQ(e->seq_len(s), 0);
  std::vector<int32_t> bad = {int32_t(model->cfg.vocab_size)};
  Engine::Item it2{s, bad};
  EXPECT_THROW(e->forward(std::span<const Engine::Item>(&it2, 1)), InputError);
  toks.resize(8);
  Engine::Item it3{s, toks};
  EXPECT_EQ(e->forward(std::span<const Engine::Item>(&it3, 1)).size(), size_t(model->cfg.vocab_size));
  EXPECT_EQ(e->seq_len(s), 8);
}

}  // namespace
}  // namespace tandem
#endif
