// Whole-model cases shared by the host-execution test (tests/kernels/test_executor.cpp) and the GPU test
// (tests/gpu/test_gpu_kernels.cpp): one micro-batch's forward/backward through two executors, compared bit for bit
// (loss totals with the MoE auxiliary losses, logits, every parameter gradient). Shapes are awkward on purpose: odd
// vocabulary and widths, GQA 5:1, window 1, a window longer than the sequence, full attention, a micro-batch whose
// last call is shorter, and two mixtures of experts.
#pragma once

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/executor.h"
#include "model/gradient_tree.h"
#include "model/olmo3.h"
#include "model/init.h"

namespace olmoref::testing {

struct ModelCase {
  ModelConfig cfg;
  int64_t micro_batch = 2, instances = 3, seq_len = 13;
  Precision precision = Precision::fp32;
  int64_t head_rows = 0;  // > 0: the head's runs of rows (Olmo3::set_head_chunk_rows_for_test); 0: the model's own
};

inline std::vector<ModelCase> model_cases() {
  const ModelConfig c{.vocab_size = 97, .d_model = 40, .n_layers = 3, .n_heads = 5, .n_kv_heads = 1, .head_dim = 6,
                      .ffn_hidden = 70, .swa_pattern = {1, 20, -1}, .moe = {}};
  // rows wider than one 32-lane pass and the 64-wide GEMM tiles
  const ModelConfig wide{.vocab_size = 300, .d_model = 130, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
                         .head_dim = 34, .ffn_hidden = 200, .swa_pattern = {5, -1, 5}, .moe = {}};
  std::vector<ModelCase> out;
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    out.push_back({c, 2, 3, 13, p});
    out.push_back({wide, 3, 3, 70, p});
  }
  // Mixture of experts (fp32 only: bf16 MoE is refused). E past the warp width, top-3, L2-normalised weights, the lb
  // loss per micro-batch and a router z-loss; then 5 experts, top-2, L1-normalised weights, a shared expert, the lb
  // loss per instance and no z-loss.
  ModelConfig moe_wide = c, moe_shared = c;
  moe_wide.moe = {33, 3, 24, 0, 0.01, 0.001, true, 2, MoELbGranularity::local_batch};
  moe_shared.moe = {5, 2, 16, 20, 0.01, 0.0, true, 1, MoELbGranularity::instance};
  out.push_back({moe_wide, 2, 3, 13, Precision::fp32});
  out.push_back({moe_shared, 2, 3, 13, Precision::fp32});
  return out;
}

struct ModelRun {
  LossSums sums;
  std::vector<LossSums> per_instance;
  std::vector<float> grad, logits;
};

// The step gradient of `instances` instances fed in micro-batches of micro_batch, on executor ex.
inline ModelRun run_model_case(const ModelCase& mc, Executor& ex) {
  Olmo3 model(mc.cfg, mc.micro_batch, mc.seq_len, mc.precision, &ex);
  if (mc.head_rows > 0) model.set_head_chunk_rows_for_test(mc.head_rows);
  const ParamLayout& L = model.layout();
  const int64_t T = mc.seq_len, N = mc.instances, V = mc.cfg.vocab_size;
  std::vector<float> host_params(static_cast<size_t>(L.total));
  init_params(mc.cfg, L, host_params.data());
  Buffer<float> params(ex, L.total, "test parameters");
  params.upload(host_params.data(), L.total);
  std::vector<uint32_t> tokens(static_cast<size_t>(N * T));
  std::mt19937 rng(static_cast<uint32_t>(mc.cfg.d_model * 31 + T));
  for (auto& t : tokens) t = static_cast<uint32_t>(rng() % static_cast<uint32_t>(V));
  ModelRun run;
  run.per_instance.resize(static_cast<size_t>(N));
  run.logits.resize(static_cast<size_t>(N * T * V));
  GradientTree tree(N, L.total, ex);
  for (int64_t a = 0; a < N; a += mc.micro_batch) {
    const int64_t n = std::min(mc.micro_batch, N - a);
    tree.begin_microbatch(a, n);
    model.forward_backward(params.data(), tokens.data() + a * T, n, N * (T - 1), tree, run.per_instance.data() + a,
                           nullptr, run.logits.data() + a * T * V);
  }
  run.grad.resize(static_cast<size_t>(L.total));
  ex.to_host(run.grad.data(), tree.slot(0), run.grad.size() * sizeof(float));
  return run;
}

// "" when the two runs have the same bits; else what differs first.
inline std::string model_runs_differ(const ModelRun& a, const ModelRun& b, const ParamLayout& L) {
  for (size_t i = 0; i < a.per_instance.size(); ++i)
    if (std::memcmp(&a.per_instance[i].ce, &b.per_instance[i].ce, 8) != 0 ||
        std::memcmp(&a.per_instance[i].z, &b.per_instance[i].z, 8) != 0 ||
        std::memcmp(&a.per_instance[i].moe_lb, &b.per_instance[i].moe_lb, 8) != 0 ||
        std::memcmp(&a.per_instance[i].moe_z, &b.per_instance[i].moe_z, 8) != 0)
      return "loss totals of instance " + std::to_string(i);
  if (std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) != 0) return "logits";
  for (const ParamInfo& p : L.params)
    if (std::memcmp(a.grad.data() + p.offset, b.grad.data() + p.offset, static_cast<size_t>(p.numel) * sizeof(float)))
      return "gradient of " + p.name;
  return "";
}

}  // namespace olmoref::testing
