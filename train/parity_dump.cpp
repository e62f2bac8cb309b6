#include "train/parity_dump.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "interop/hf_export.h"
#include "train/weights.h"
#include "interop/safetensors.h"
#include "core/rng.h"
#include "train/golden_export.h"
#include "train/trainer.h"

namespace olmoref {

namespace {

// Parity tokens: arithmetic progressions modulo the vocabulary with counter-based random starts and
// steps, so the loss moves visibly over the steps (pure noise would keep it flat at ln V).
std::vector<StepBatch> parity_batches(const TrainConfig& cfg, int64_t steps) {
  const int64_t G = cfg.train.global_batch_instances, T = cfg.train.seq_len, V = cfg.model.vocab_size;
  std::vector<StepBatch> out;
  for (int64_t s = 0; s < steps; ++s) {
    StepBatch b;
    b.tokens.resize(static_cast<size_t>(G * T));
    for (int64_t i = 0; i < G; ++i) {
      double u1, u2;
      uniform2(20251129, RngPurpose::test, static_cast<uint32_t>(s), static_cast<uint64_t>(i), 0, &u1, &u2);
      const int64_t start = static_cast<int64_t>(u1 * V), stride = 1 + static_cast<int64_t>(u2 * 5);
      for (int64_t t = 0; t < T; ++t) b.tokens[i * T + t] = static_cast<uint32_t>((start + t * stride) % V);
      // Under intra-document masking, documents of every kind in turn (docs/canonical/documents.md): one, two, many
      // (an EOS every 7 tokens), and one ending exactly at the instance's end.
      if (cfg.data.document_masking) {
        const auto eos = static_cast<uint32_t>(cfg.data.eos_id);
        uint32_t* inst = b.tokens.data() + i * T;
        if (i % 4 == 1) inst[T / 2] = eos;
        if (i % 4 == 2)
          for (int64_t t = 6; t < T; t += 7) inst[t] = eos;
        if (i % 4 == 3) inst[T / 3] = inst[T - 1] = eos;
      }
      b.instance_ids.push_back(s * G + i);
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

void write_parity_bundle(const TrainConfig& cfg, const std::string& out_dir, int64_t steps, int threads) {
  namespace fs = std::filesystem;
  // Refused before anything is written, so a refusal leaves no partial bundle.
  if (steps < 1)
    throw std::invalid_argument("parity-dump --steps " + std::to_string(steps) +
                                ": the bundle records at least one AdamW step (use --steps 1 or more)");
  if (cfg.train.precision != "fp32")
    throw std::invalid_argument(cfg.in_file("config key 'train.precision' is \"" + cfg.train.precision +
                                            "\": parity-dump replays training steps against Hugging Face in fp32; set "
                                            "train.precision=\"fp32\" (the bf16 recipe is compared through its "
                                            "logits: golden/parity/run_parity_bf16.sh)"));
  if (const std::string why = cfg.pytorch_replay_unsupported(); !why.empty())
    throw std::invalid_argument(cfg.in_file("parity-dump: " + why));
  // Dense: Hugging Face Olmo3ForCausalLM is the peer (hf/, grad.<HF name>, hf_parity.py). MoE, and any model under
  // intra-document masking (Hugging Face's Olmo3, Megatron, MaxText and LitGPT attend across documents; OLMo-core
  // takes doc_lens): OLMo-core's own Transformer or MoETransformer (olmo_core/model.safetensors under its state_dict
  // names, grad.<OLMo-core name>, MoE's step-1 routing; olmo_core_moe_parity.py). golden/parity/README.md has both.
  const bool moe = cfg.model.moe.enabled();
  const bool olmo_core_peer = moe || cfg.data.document_masking;
  if (!olmo_core_peer) require_hf_form(cfg, "Hugging Face export");
  const std::vector<StepBatch> batches = parity_batches(cfg, steps);
  Trainer trainer(cfg, threads, std::make_unique<FixedBatchSource>(batches, "parity"));
  const ParamLayout& L = trainer.model().layout();
  const int64_t G = cfg.train.global_batch_instances, T = cfg.train.seq_len, V = cfg.model.vocab_size;
  auto peer_name = [&](const ParamInfo& p) { return olmo_core_peer ? p.name : p.hf_name; };

  if (olmo_core_peer) {
    fs::create_directories(out_dir + "/olmo_core");
    const float* w = trainer.host_params();
    std::vector<SafeTensorView> views;
    for (const ParamInfo& p : L.params)
      views.push_back({p.name, "F32", p.shape, w + p.offset, static_cast<size_t>(p.numel) * sizeof(float)});
    write_safetensors(out_dir + "/olmo_core/model.safetensors", views);
  } else {
    fs::create_directories(out_dir + "/hf");
    HfExportOptions hf;
    hf.max_position_embeddings = T;
    export_hf_checkpoint(out_dir + "/hf", cfg.model, L, trainer.host_params(), hf);
  }

  {
    std::ofstream tok(out_dir + "/batches.u32", std::ios::binary);
    for (const auto& b : batches)
      tok.write(reinterpret_cast<const char*>(b.tokens.data()), static_cast<std::streamsize>(b.tokens.size() * 4));
    if (!tok) throw std::runtime_error(out_dir + "/batches.u32: write failed");
  }

  // Step-1 batch at the step-0 weights: logits, the unclipped gradient and (MoE) every layer's top-k choices.
  std::vector<float> grad(static_cast<size_t>(L.total)), logits(static_cast<size_t>(G * T * V));
  const LossSums s0 = trainer.compute_gradient(batches[0], grad.data(), logits.data());
  std::vector<SafeTensorView> views;
  views.push_back({"logits", "F32", {G, T, V}, logits.data(), logits.size() * sizeof(float)});
  std::vector<std::string> names;
  names.reserve(L.params.size() + static_cast<size_t>(cfg.model.n_layers));
  for (const ParamInfo& p : L.params) names.push_back("grad." + peer_name(p));
  for (size_t i = 0; i < L.params.size(); ++i) {
    const ParamInfo& p = L.params[i];
    views.push_back({names[i], "F32", p.shape, grad.data() + p.offset, static_cast<size_t>(p.numel) * sizeof(float)});
  }
  if (moe) {
    const auto& routing = trainer.last_routing();  // [n_layers][G · T · k]
    const int64_t k = cfg.model.moe.top_k;
    for (int64_t l = 0; l < cfg.model.n_layers; ++l) {
      const std::vector<int32_t>& top = routing.at(static_cast<size_t>(l));
      if (static_cast<int64_t>(top.size()) != G * T * k)
        throw std::logic_error("parity-dump: layer " + std::to_string(l) + " routing holds " +
                               std::to_string(top.size()) + " choices, expected " + std::to_string(G * T * k));
      names.push_back("routing.blocks." + std::to_string(l));
      views.push_back({names.back(), "I32", {G, T, k}, top.data(), top.size() * sizeof(int32_t)});
    }
  }
  write_safetensors(out_dir + "/ours_step0.safetensors", views);

  nlohmann::json j;
  const double N = static_cast<double>(cfg.targets_per_step());
  j["model"] = {{"name", cfg.model.name}, {"norm_eps", cfg.model.norm_eps}, {"vocab_size", V}, {"d_model", cfg.model.d_model}, {"n_layers", cfg.model.n_layers},
                {"n_heads", cfg.model.n_heads}, {"n_kv_heads", cfg.model.n_kv_heads}, {"head_dim", cfg.model.head_dim},
                {"ffn_hidden", cfg.model.ffn_hidden}, {"rope_theta", cfg.model.rope_theta},
                {"swa_pattern", cfg.model.swa_pattern}};
  add_rope_scaling_json(cfg.model, j["model"]);
  add_moe_json(cfg.model, j["model"]);
  if (olmo_core_peer) j["micro_batch_instances"] = cfg.train.micro_batch_instances;
  j["seq_len"] = T;
  j["instances_per_step"] = G;
  j["steps"] = steps;
  j["z_loss"] = cfg.train.z_loss;
  // OLMo-core's generate_doc_lengths at this EOS (docs/canonical/documents.md); absent: no document masking.
  if (cfg.data.document_masking) j["document_masking_eos"] = cfg.data.eos_id;
  j["loss_step0"] = (s0.ce + s0.z + s0.moe_lb + s0.moe_z) / N;
  j["ce_step0"] = s0.ce / N;
  j["z_step0"] = s0.z / N;
  if (olmo_core_peer) j["lb_step0"] = s0.moe_lb / N, j["rz_step0"] = s0.moe_z / N;
  nlohmann::json lrs = nlohmann::json::array(), trace = nlohmann::json::array();
  // Every step's pre-clip gradient and the parameters after it: the peer re-runs each step from our weights of the
  // step before and feeds our gradient to its optimizer (the comparison's per-step gates), so no step is judged
  // through the amplified drift of a whole trajectory. compute_gradient is the step's own instance tree, so its
  // gradient is the one train_step clips and applies, bit for bit.
  std::vector<std::vector<float>> grads(static_cast<size_t>(steps)), after(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    if (s == 0) {
      grads[0] = grad;
    } else {
      grads[static_cast<size_t>(s)].resize(static_cast<size_t>(L.total));
      trainer.compute_gradient(batches[static_cast<size_t>(s)], grads[static_cast<size_t>(s)].data());
    }
    const TraceRecord r = trainer.train_step().record;
    lrs.push_back(r.lr);
    trace.push_back({{"step", r.step}, {"loss", r.loss}, {"grad_norm", r.grad_norm}, {"lr", r.lr}});
    if (olmo_core_peer) trace.back()["ce"] = r.ce, trace.back()["lb"] = r.moe_lb, trace.back()["rz"] = r.moe_z;
    const float* w = trainer.host_params();
    after[static_cast<size_t>(s)].assign(w, w + L.total);
  }
  auto write_per_step = [&](const std::string& file, const std::vector<std::vector<float>>& per_step) {
    std::vector<SafeTensorView> views;
    for (int64_t s = 0; s < steps; ++s)
      for (const ParamInfo& p : L.params)
        views.push_back({"step" + std::to_string(s + 1) + "." + peer_name(p), "F32", p.shape,
                         per_step[static_cast<size_t>(s)].data() + p.offset, static_cast<size_t>(p.numel) * sizeof(float)});
    write_safetensors(out_dir + "/" + file, views);
  };
  write_per_step("ours_grads.safetensors", grads);
  write_per_step("ours_params.safetensors", after);
  const ParamInfo* embeddings = L.find("embeddings.weight");
  j["optim"] = {{"lr_per_step", lrs},
                {"betas", {cfg.optim.beta1, cfg.optim.beta2}},
                {"eps", cfg.optim.eps},
                {"weight_decay", cfg.optim.weight_decay},
                {"max_grad_norm", cfg.optim.max_grad_norm},
                {"no_decay", {peer_name(*embeddings)}}};
  j["trace"] = trace;
  std::ofstream out(out_dir + "/ours.json");
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error(out_dir + "/ours.json: write failed");
}

}  // namespace olmoref
