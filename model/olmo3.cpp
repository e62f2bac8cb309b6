// model/olmo3.cpp — the model's walk over its units: the embedding, the blocks (model/dense_block.cpp for the
// attention sublayer and the dense feed-forward, model/moe_block.cpp for the mixture of experts) and the head, forward
// and then backward, with each unit gathered just before it is used (FSDP, ParamGate). The walk is written once
// (walk_forward, walk_training_pass) and the steps plugged in: the model's work here (ComputeSteps), only the
// exchanges in model/idle_pass.cpp (the collectives of a pass without instances). The expert-parallel exchange lives
// apart: model/ep_exchange.cpp.
//
// Shapes: R = n_inst·T rows, d the model width, V the vocabulary.
#include "model/olmo3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/documents.h"
#include "core/loss_tree.h"
#include "core/reduce.h"
#include "model/executors.h"

namespace olmoref {

std::pair<int64_t, int64_t> fsdp_unit_range(const ModelConfig& cfg, const ParamLayout& layout, int unit) {
  const int64_t d = cfg.d_model, V = cfg.vocab_size;
  if (unit == 0) return {layout.embeddings, layout.embeddings + V * d};
  if (unit == cfg.n_layers + 1) return {layout.final_norm, layout.lm_head + V * d};
  const BlockOffsets& o = layout.blocks[static_cast<size_t>(unit - 1)];
  return {o.w_q, o.ffn_norm + d};
}

std::vector<std::pair<int64_t, int64_t>> fsdp_unit_ranges(const ModelConfig& cfg, const ParamLayout& layout) {
  std::vector<std::pair<int64_t, int64_t>> units;
  for (int u = 0; u < cfg.n_layers + 2; ++u) units.push_back(fsdp_unit_range(cfg, layout, u));
  return units;
}

int64_t Olmo3::largest_unit() const {
  int64_t longest = 0;
  for (int u = 0; u < n_units(); ++u) longest = std::max(longest, unit_range(u).second - unit_range(u).first);
  return longest;
}

std::vector<std::pair<int64_t, int64_t>> fsdp_unit_reads(const ModelConfig& cfg, const ParamLayout& layout, int unit,
                                                         int ep_size, int ep_index) {
  const auto [a, b] = fsdp_unit_range(cfg, layout, unit);
  if (ep_size <= 1 || !cfg.moe.enabled() || unit == 0 || unit == cfg.n_layers + 1) return {{a, b}};
  const BlockOffsets& o = layout.blocks[static_cast<size_t>(unit - 1)];
  const int64_t per = cfg.moe.hidden * cfg.d_model, E = cfg.moe.n_experts;
  const auto [first, last] = moe::ep_experts(E, ep_size, ep_index);
  // The other experts' rows of w1, w2, w3 [E·h, d] are cut out of the unit.
  std::vector<std::pair<int64_t, int64_t>> cuts;
  for (const int64_t w : {o.moe_w1, o.moe_w2, o.moe_w3}) cuts.push_back({w, w + first * per}), cuts.push_back({w + last * per, w + E * per});
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = a;
  for (const auto& [c0, c1] : cuts) {
    if (c0 > at) out.push_back({at, c0});
    at = std::max(at, c1);
  }
  if (at < b) out.push_back({at, b});
  return out;
}

void Olmo3::use_unit(int unit, bool working_copy, int next) {
  if (!gate_) return;
  const float* fp32 = gate_->acquire(unit);
  if (next >= 0) gate_->prefetch(next);
  unit_read_ = fp32;
  // bf16 with a gate: the working copy is made unit by unit as units arrive (same bits: it is elementwise), into
  // a buffer one unit long, so no rank holds a bf16 copy of the whole vector either.
  if (working_copy && precision_ == Precision::bf16) {
    const auto [a, b] = unit_range(unit);
    if (unit_bf16_.size() == 0) unit_bf16_.reset(*ex_, largest_unit(), "bf16 working copy of one unit");
    ex_->copy_round_bf16(fp32 + a, unit_bf16_.data(), b - a);
    unit_read_ = unit_at_flat_offsets(unit_bf16_.data(), a);
  }
}

void Olmo3::drop_unit(int unit) {
  if (!gate_) return;
  gate_->release(unit);
  unit_read_ = nullptr;
}

const float* Olmo3::working_params(const float* params) {
  if (precision_ == Precision::fp32 || gate_) return params;  // with a gate the steps read the unit in use
  if (params_bf16_.size() != layout_.total) params_bf16_.reset(*ex_, layout_.total, "bf16 working copy of the parameters");
  // FSDP2 MixedPrecisionPolicy(param_dtype=bf16): every parameter, norms and embeddings included, is used
  // as a bf16 copy rounded from the fp32 master. The copy is a pure function of the master, so making it
  // per micro-batch gives the same bits as once per step.
  ex_->copy_round_bf16(params, params_bf16_.data(), layout_.total);
  return params_bf16_.data();
}

void Olmo3::round_act(float* x, int64_t n) const {
  if (precision_ == Precision::bf16) ex_->round_bf16(x, n);
}

std::string activation_checkpointing_modes() {
  return "it must be \"none\" (keep every block's activations), \"full\" (keep each block's input and recompute the "
         "block in backward: same bits, less memory) or \"selected_blocks\" (recompute blocks 0, n, 2n, ... for "
         "train.activation_checkpointing_block_interval = n, keep the others': same bits, memory between the two)";
}

ActivationCheckpointing parse_activation_checkpointing(const std::string& mode, int64_t block_interval) {
  const bool selected = mode == "selected_blocks";
  if (mode != "none" && mode != "full" && !selected)
    throw std::invalid_argument("config key 'train.activation_checkpointing' is \"" + mode + "\"; " +
                                activation_checkpointing_modes());
  if (selected && block_interval < 1)
    throw std::invalid_argument("config key 'train.activation_checkpointing_block_interval' is " +
                                std::to_string(block_interval) + "; train.activation_checkpointing = \"selected_blocks\" "
                                "needs it >= 1 (blocks 0, n, 2n, ... are recomputed, as OLMo-core's block_interval)");
  if (!selected && block_interval != 0)
    throw std::invalid_argument("config key 'train.activation_checkpointing_block_interval' is " +
                                std::to_string(block_interval) + " with train.activation_checkpointing = \"" + mode +
                                "\": it applies to \"selected_blocks\" only; remove it or set that mode");
  if (selected) return ActivationCheckpointing::selected_blocks(block_interval);
  return mode == "full" ? ActivationCheckpointing::full() : ActivationCheckpointing::none();
}

namespace {

// Every executor buffer of LayerActs but x: the block's work, one set the recomputed blocks share (bind_block_work).
constexpr Buffer<float> LayerActs::*kBlockWork[] = {
    &LayerActs::q_raw, &LayerActs::k_raw, &LayerActs::q_rms, &LayerActs::k_rms, &LayerActs::q,
    &LayerActs::k, &LayerActs::v, &LayerActs::att, &LayerActs::att_max, &LayerActs::att_sum,
    &LayerActs::ao, &LayerActs::ao_rms, &LayerActs::h, &LayerActs::g, &LayerActs::u,
    &LayerActs::a, &LayerActs::f, &LayerActs::f_rms, &LayerActs::router_logits, &LayerActs::xg,
    &LayerActs::eg, &LayerActs::eu, &LayerActs::ea, &LayerActs::ey, &LayerActs::sg,
    &LayerActs::su, &LayerActs::sa, &LayerActs::sy, &LayerActs::weight_copy, &LayerActs::route_scores,
    &LayerActs::route_lse};
constexpr Buffer<int64_t> LayerActs::*kBlockWorkIndices[] = {&LayerActs::plan_row_of, &LayerActs::plan_position};
constexpr Buffer<int32_t> LayerActs::*kBlockWorkChoices[] = {&LayerActs::route_top};

// The block buffers (all of LayerActs' executor memory but x) for R = B·L rows (L of each instance's T positions; the
// softmax statistics are the whole instance's); `at` names the block in allocation errors.
void allocate_block_work(Executor& e, const ModelConfig& cfg, LayerActs& a, int64_t B, int64_t T, int64_t L,
                         const std::string& at) {
  const int64_t R = B * L, d = cfg.d_model, qd = cfg.q_dim(), kd = cfg.kv_dim(), F = cfg.ffn_hidden;
  const int64_t stats = B * cfg.n_heads * T;
  a.q_raw.reset(e, R * qd, "activation q_raw" + at);
  a.k_raw.reset(e, R * kd, "activation k_raw" + at);
  a.q_rms.reset(e, R, "activation q_rms" + at);
  a.k_rms.reset(e, R, "activation k_rms" + at);
  a.q.reset(e, R * qd, "activation q" + at);
  a.k.reset(e, R * kd, "activation k" + at);
  a.v.reset(e, R * kd, "activation v" + at);
  a.att.reset(e, R * qd, "activation att" + at);
  a.att_max.reset(e, stats, "attention row max" + at);
  a.att_sum.reset(e, stats, "attention row sum" + at);
  a.ao.reset(e, R * d, "activation ao" + at);
  a.ao_rms.reset(e, R, "activation ao_rms" + at);
  a.h.reset(e, R * d, "activation h" + at);
  if (!cfg.moe.enabled()) {
    a.g.reset(e, R * F, "activation g (gate)" + at);
    a.u.reset(e, R * F, "activation u (up)" + at);
    a.a.reset(e, R * F, "activation a (SwiGLU)" + at);
  } else {
    const int64_t E = cfg.moe.n_experts, k = cfg.moe.top_k, S = R * k, h = cfg.moe.hidden;
    const int64_t Fs = cfg.moe.shared_hidden;
    a.router_logits.reset(e, R * E, "router logits" + at);
    a.xg.reset(e, S * d, "dispatched expert inputs" + at);
    a.eg.reset(e, S * h, "expert gate" + at);
    a.eu.reset(e, S * h, "expert up" + at);
    a.ea.reset(e, S * h, "expert SwiGLU" + at);
    a.ey.reset(e, S * d, "expert outputs" + at);
    if (!e.host_memory()) {
      a.plan_row_of.reset(e, S, "dispatch plan rows" + at);
      a.plan_position.reset(e, S, "dispatch plan positions" + at);
      a.weight_copy.reset(e, R * k, "expert weights" + at);
    }
    if (Fs > 0) {
      a.sg.reset(e, R * Fs, "shared expert gate" + at);
      a.su.reset(e, R * Fs, "shared expert up" + at);
      a.sa.reset(e, R * Fs, "shared expert SwiGLU" + at);
      a.sy.reset(e, R * d, "shared expert output" + at);
    }
  }
  a.f.reset(e, R * d, "activation f" + at);
  a.f_rms.reset(e, R, "activation f_rms" + at);
}

}  // namespace

Olmo3::Olmo3(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision, Executor* ex,
             ActivationCheckpointing checkpointing, int64_t context_parallel)
    : cfg_(cfg),
      precision_(precision),
      checkpointing_(checkpointing),
      own_ex_(ex ? nullptr : std::make_unique<CpuExecutor>()),
      ex_(ex ? ex : own_ex_.get()),
      layout_(cfg),
      B_(micro_batch),
      T_(seq_len),
      cp_(context_parallel),
      L_(context_parallel >= 1 ? seq_len / context_parallel : seq_len),
      R_(micro_batch * L_) {
  cfg_.validate();
  if (cfg_.moe.enabled() && precision_ != Precision::fp32)
    throw std::invalid_argument("config key 'train.precision': mixture-of-experts models train in fp32 only so far "
                                "(bf16 MoE is not implemented yet); set train.precision=\"fp32\"");
  if (B_ <= 0 || T_ < 2) throw std::invalid_argument("micro-batch must hold >= 1 instance of >= 2 tokens");
  if (cp_ < 1 || T_ % cp_ != 0)
    throw std::invalid_argument("config key 'train.cp_degree' is " + std::to_string(cp_) + ": it must be >= 1 and "
                                "divide train.seq_len = " + std::to_string(T_) + " (each rank computes seq_len / "
                                "cp_degree consecutive positions of every instance)");
  Executor& e = *ex_;
  // The rows the MPI transport's expert and context exchanges stage on the host: the executor's staging.
  for (StagingVector<float>* v : {&mirror_.xg, &mirror_.ey, &mirror_.ea, &mirror_.f, &mirror_.dy, &mirror_.dxg,
                                  &mirror_.deg, &mirror_.deu, &mirror_.dh, &cpb_.mine, &cpb_.full, &cpb_.partial_host})
    *v = StagingVector<float>(StagingAllocator<float>(e, "expert or context rows staged on the host"));
  const RopeTable table = make_rope_table(T_, cfg_.head_dim, cfg_.rope_theta);
  rope_cos_.reset(e, static_cast<int64_t>(table.cos.size()), "RoPE cos table");
  rope_sin_.reset(e, static_cast<int64_t>(table.sin.size()), "RoPE sin table");
  rope_cos_.upload(table.cos.data(), rope_cos_.size());
  rope_sin_.upload(table.sin.data(), rope_sin_.size());
  rope_ = {T_, cfg_.head_dim, rope_cos_.data(), rope_sin_.data()};
  if (cfg_.rope_scaling.on()) {
    const RopeTable scaled = make_rope_table(T_, cfg_.head_dim, cfg_.rope_theta, cfg_.rope_scaling);
    scaled_cos_.reset(e, static_cast<int64_t>(scaled.cos.size()), "scaled RoPE cos table");
    scaled_sin_.reset(e, static_cast<int64_t>(scaled.sin.size()), "scaled RoPE sin table");
    scaled_cos_.upload(scaled.cos.data(), scaled_cos_.size());
    scaled_sin_.upload(scaled.sin.data(), scaled_sin_.size());
    scaled_rope_ = {T_, cfg_.head_dim, scaled_cos_.data(), scaled_sin_.data()};
  }
  const int64_t R = R_, d = cfg_.d_model;
  if (!e.host_memory()) tokens_.reset(e, B_ * T_, "tokens of a micro-batch");  // whole instances: the labels
  acts_.resize(static_cast<size_t>(cfg_.n_layers));
  for (size_t l = 0; l < acts_.size(); ++l) {
    const std::string at = " of block " + std::to_string(l);
    acts_[l].x.reset(e, R * d, "activation x" + at);
    // A block that keeps its activations has its own set; the recomputed blocks (block 0 is one whenever any is)
    // share one, made at block 0 (bind_block_work moves it).
    const bool recomputed = checkpointing_.recomputes(static_cast<int64_t>(l));
    if (!recomputed || l == 0)
      allocate_block_work(e, cfg_, acts_[l], B_, T_, L_,
                          !recomputed ? at
                          : checkpointing_.mode == ActivationCheckpointing::Mode::full
                              ? " (every block's, recomputed)"
                              : " (the recomputed blocks', in turn)");
  }
  x_final_.reset(e, R * d, "final block output");
  final_rms_.reset(e, R, "final norm statistics");
  hn_.reset(e, R * d, "final norm output");
  if (cp_ > 1) {
    const int64_t full = B_ * T_, qd = cfg_.q_dim(), kd = cfg_.kv_dim();
    for (Buffer<float>* b : {&cpb_.q, &cpb_.out, &cpb_.dout, &cpb_.dq})
      b->reset(e, full * qd, "context parallelism: one layer's whole-instance queries, outputs and their gradients");
    for (Buffer<float>* b : {&cpb_.k, &cpb_.v, &cpb_.dk, &cpb_.dv})
      b->reset(e, full * kd, "context parallelism: one layer's whole-instance keys, values and their gradients");
    if (!e.host_memory()) {
      cpb_.tokens.reset(e, R, "context parallelism: the tokens of this rank's rows");
      cpb_.positions.reset(e, R, "context parallelism: the RoPE positions of this rank's rows");
    }
  }
  set_head_chunk_rows_for_test(head_chunk_rows(cfg_.vocab_size, T_));
}

void Olmo3::set_head_chunk_rows_for_test(int64_t rows) {
  if (rows < 1) throw std::invalid_argument("head chunk rows must be >= 1");
  head_rows_ = std::min(rows, L_);
  logits_.reset(*ex_, head_rows_ * cfg_.vocab_size, "logits [a run of an instance's rows, vocabulary]");
  ce_terms_.assign(static_cast<size_t>(T_), 0.0);
  z_terms_.assign(static_cast<size_t>(T_), 0.0);
}

int64_t head_chunk_rows(int64_t vocab_size, int64_t seq_len) {
  constexpr int64_t kLogitsBytes = int64_t{256} << 20;
  const int64_t row_bytes = vocab_size * static_cast<int64_t>(sizeof(float));
  int64_t rows = 1;
  while (rows < seq_len && 2 * rows * row_bytes <= kLogitsBytes) rows *= 2;
  return std::min(rows, seq_len);
}

void Olmo3::bind_block_work(int64_t layer) {
  if (!checkpointing_.recomputes(layer) || work_at_ == layer) return;
  LayerActs &from = acts_[static_cast<size_t>(work_at_)], &to = acts_[static_cast<size_t>(layer)];
  for (const auto member : kBlockWork) to.*member = std::move(from.*member);
  for (const auto member : kBlockWorkIndices) to.*member = std::move(from.*member);
  for (const auto member : kBlockWorkChoices) to.*member = std::move(from.*member);
  work_at_ = layer;
}

ModelMemory olmo3_memory(const ModelConfig& cfg, int64_t B, int64_t T, Precision precision, bool kernel_scratch,
                         ActivationCheckpointing checkpointing, int64_t cp) {
  // R: the rows a rank holds, each instance's T / cp positions
  const int64_t R = B * (T / std::max<int64_t>(cp, 1)), d = cfg.d_model, qd = cfg.q_dim(), kd = cfg.kv_dim();
  const int64_t F = cfg.ffn_hidden;
  const int64_t V = cfg.vocab_size, stats = B * cfg.n_heads * T, f32 = sizeof(float);
  // Per block: ao, h, f [R, d]; q_raw, q, att [R, qd]; k_raw, k, v [R, kd]; g, u, a [R, F]; five row statistics.
  int64_t ffn = 3 * R * F, ffn_bw = 2 * R * F;
  if (cfg.moe.enabled()) {
    // Router logits [R, E]; dispatched inputs and outputs [S, d]; the experts' g, u, a [S, h]; the shared expert's
    // g, u, a [R, Fs] and output [R, d]; backward: ∂logits, ∂y, ∂xg, ∂a, ∂g, ∂u and the shared expert's.
    const int64_t E = cfg.moe.n_experts, S = R * cfg.moe.top_k, h = cfg.moe.hidden, Fs = cfg.moe.shared_hidden;
    ffn = R * E + 2 * S * d + 3 * S * h + (Fs > 0 ? 3 * R * Fs + R * d : 0);
    ffn_bw = R * E + 2 * S * d + 3 * S * h + (Fs > 0 ? 2 * R * d + 2 * R * Fs : 0);
    // On a device executor: the plan's two int64 arrays and the weights [S]; the routing's scores [R, E], lse [R] and
    // choices [S] (int32).
    if (kernel_scratch) ffn += 5 * S + R * E + R + S;
  }
  const int64_t block_work = R * (3 * d + 3 * qd + 3 * kd + 5) + ffn + 2 * stats;  // all but the input x [R, d]
  // Sets of block work: each block's that keeps its activations, and one the recomputed blocks share.
  const int64_t recomputed = checkpointing.recomputed_blocks(cfg.n_layers);
  const int64_t kept_blocks = cfg.n_layers - recomputed + (recomputed > 0 ? 1 : 0);
  ModelMemory m;
  m.activations = f32 * (cfg.n_layers * R * d + kept_blocks * block_work);
  // dx, dhn, df, dao [R, d]; datt, dq, dq_raw [R, qd]; dk, dk_raw, dv [R, kd]; the feed-forward's
  m.backward = f32 * (R * (4 * d + 3 * qd + 3 * kd) + ffn_bw);
  // x_final, hn [R, d], final_rms [R], one run's logits [rows, V]
  m.logits = f32 * (R * (2 * d + 1) + std::min(head_chunk_rows(V, T), R / B) * V);
  m.working = f32 * T * cfg.head_dim + R * 24;  // RoPE tables [T, hd/2] x 2; tokens and the loss's fp64 row terms
  if (cfg.rope_scaling.on()) m.working += f32 * T * cfg.head_dim;  // the scaled layers' own pair of tables
  if (precision == Precision::bf16) m.working += f32 * ParamLayout(cfg).total;
  if (kernel_scratch) m.kernel_scratch = cuda_attention_workspace_bytes(B, cfg.n_heads, T, cfg.head_dim);
  if (cp > 1) {
    // One layer's whole-instance attention tensors (q, out, ∂out, dq [B·T, qd]; k, v, dk, dv [B·T, kd]), the partial
    // of a chain on its way (the largest leaf: the embedding's or the head's [V, d]), the rows' tokens and positions.
    m.context_parallel = f32 * (4 * B * T * (qd + kd) + V * d) + 8 * R;
  }
  return m;
}

int64_t olmo3_memory_bytes(const ModelConfig& cfg, int64_t B, int64_t T, Precision precision, bool kernel_scratch,
                           ActivationCheckpointing checkpointing, int64_t cp) {
  return olmo3_memory(cfg, B, T, precision, kernel_scratch, checkpointing, cp).total();
}

void Olmo3::set_z_loss(double z_loss) {
  if (!(z_loss >= 0) || !std::isfinite(z_loss))
    throw std::invalid_argument("z_loss " + std::to_string(z_loss) + " must be finite and >= 0 (train.z_loss)");
  z_loss_ = static_cast<float>(z_loss);
}

const uint32_t* Olmo3::begin_call(const uint32_t* host_tokens, int64_t n_inst, ThreadPool* pool) {
  if (own_ex_) own_ex_->set_pool(pool);
  pool_ = pool;
  const int64_t R = n_inst * T_, V = cfg_.vocab_size;
  for (int64_t r = 0; r < R; ++r)
    if (host_tokens[r] >= static_cast<uint64_t>(V))
      throw std::out_of_range("token id " + std::to_string(host_tokens[r]) + " >= vocab_size " + std::to_string(V));
  documents_of(host_tokens, n_inst);
  rows_of_call(host_tokens, n_inst);
  if (ex_->host_memory()) return host_tokens;
  tokens_.upload(host_tokens, R);
  return tokens_.data();
}

void Olmo3::documents_of(const uint32_t* host_tokens, int64_t n_inst) {
  doc_start_ = doc_end_ = doc_pos_ = nullptr;
  if (doc_eos_ < 0) return;
  const int64_t R = n_inst * T_;
  for (auto& h : doc_host_) h.resize(static_cast<size_t>(R));
  for (int64_t b = 0; b < n_inst; ++b) {
    const DocumentPositions p = document_positions(host_tokens + b * T_, T_, static_cast<uint32_t>(doc_eos_));
    const auto at = static_cast<std::ptrdiff_t>(b * T_);
    std::copy(p.start.begin(), p.start.end(), doc_host_[0].begin() + at);
    std::copy(p.end.begin(), p.end.end(), doc_host_[1].begin() + at);
    std::copy(p.rope_position.begin(), p.rope_position.end(), doc_host_[2].begin() + at);
  }
  const int32_t** ptrs[3] = {&doc_start_, &doc_end_, &doc_pos_};
  for (int k = 0; k < 3; ++k) {
    if (ex_->host_memory()) {
      *ptrs[k] = doc_host_[k].data();
      continue;
    }
    if (doc_buf_[k].size() < R) doc_buf_[k].reset(*ex_, B_ * T_, "document boundaries of a micro-batch");
    doc_buf_[k].upload(doc_host_[k].data(), R);
    *ptrs[k] = doc_buf_[k].data();
  }
}

void Olmo3::block_forward(const float* params, int64_t l, int64_t n_inst) {
  bind_block_work(l);
  LayerActs& A = acts_[static_cast<size_t>(l)];
  const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
  const int64_t R = n_inst * L_;
  attention_forward(params, A, o, l, n_inst);  // h [R, d] = x + RMSNorm(Attn(x))
  if (cfg_.moe.enabled())
    moe_forward(params, A, o, n_inst);  // f [R, d] = MoE(h)
  else
    dense_ffn_forward(params, A, o, n_inst);  // f [R, d] = SwiGLU(h)
  float* next = l + 1 < cfg_.n_layers ? acts_[static_cast<size_t>(l + 1)].x.data() : x_final_.data();
  // next [R, d] = h [R, d] + RMSNorm(f [R, d]), the normed value and the sum each rounded in bf16. A recompute writes
  // next again with the same bits; backward has read it already (the next block's x, or x_final).
  ex_->rmsnorm_residual_forward(A.h.data(), A.f.data(), params + o.ffn_norm, next, A.f_rms.data(), R, cfg_.d_model,
                                cfg_.norm_eps, precision_ == Precision::bf16);
}

void Olmo3::block_backward(const float* params, int64_t l, int64_t n_inst, int64_t global_n_targets,
                           GradientLeaves& grads) {
  LayerActs& A = acts_[static_cast<size_t>(l)];
  const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
  const int64_t R = n_inst * L_, d = cfg_.d_model;
  // out = h + RMSNorm(f): ∂h = dx (kept in dx, accumulated into below), ∂f [R, d] via the norm.
  instance_norm_grads(grads, n_inst, o.ffn_norm, A.f.data(), params + o.ffn_norm, A.f_rms.data(), bw_.dx.data(),
                      bw_.df.data(), d);
  round_act(bw_.df.data(), R * d);
  if (cfg_.moe.enabled())
    moe_backward(params, A, o, n_inst, global_n_targets, grads);
  else
    dense_ffn_backward(params, A, o, n_inst, grads);
  round_act(bw_.dx.data(), R * d);
  attention_backward(params, A, o, l, n_inst, grads);  // ∂x [R, d] into dx
}

// The one order of a pass (olmo3.h, PassSteps): each unit gathered around its steps, forward here, backward below.
// use_unit(u, ..., next) announces `next` (ParamGate::prefetch) once u is in hand: a gate may gather it under u's work.
void Olmo3::walk_forward(PassSteps& steps, int then) {
  use_unit(0, steps.working_copy, 1);
  steps.embedding_forward();
  drop_unit(0);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    use_unit(static_cast<int>(l) + 1, steps.working_copy, static_cast<int>(l) + 2);
    steps.block_forward(l);
    drop_unit(static_cast<int>(l) + 1);
  }
  use_unit(n_units() - 1, steps.working_copy, then);
  steps.head_forward();
  drop_unit(n_units() - 1);
}

void Olmo3::walk_training_pass(PassSteps& steps) {
  // Expert parallelism applies to a training pass only (forward_loss runs every expert here).
  struct EpScope {
    ExpertExchange*& now;
    ~EpScope() { now = nullptr; }
  } ep_scope{ep_now_};
  ep_now_ = cfg_.moe.enabled() ? ep_ : nullptr;
  walk_forward(steps, n_units() - 1);
  auto unit_gradient = [this](int unit, auto&& backward) {
    if (sink_) sink_->unit_backward_begins(unit);
    backward();
    if (sink_) sink_->unit_backward_done(unit);
  };
  use_unit(n_units() - 1, steps.working_copy, static_cast<int>(cfg_.n_layers));
  unit_gradient(n_units() - 1, [&] { steps.head_backward(); });
  drop_unit(n_units() - 1);
  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    // Gathered again for backward, as FSDP does; the embedding's backward reads no parameter (unit 0: none next).
    use_unit(static_cast<int>(l) + 1, steps.working_copy, l > 0 ? static_cast<int>(l) : -1);
    if (checkpointing_.recomputes(l)) {
      recomputing_ = true;
      steps.block_forward(l);  // the block's activations again, the same bits (and exchanges) as forward's
      recomputing_ = false;
    }
    unit_gradient(static_cast<int>(l) + 1, [&] { steps.block_backward(l); });
    drop_unit(static_cast<int>(l) + 1);
  }
  unit_gradient(0, [&] { steps.embedding_backward(); });  // reads no parameter: nothing to gather
}

// The model's work at each step of the walk.
class Olmo3::ComputeSteps final : public Olmo3::PassSteps {
 public:
  ComputeSteps(Olmo3& model, const PassInputs& in) : PassSteps(true), m_(model), in_(in) {
    // A forward records its instances' MoE sums afresh.
    if (m_.cfg_.moe.enabled()) m_.moe_inst_.assign(static_cast<size_t>(in.n_instances), MoEInstance{});
  }
  void embedding_forward() override { m_.embedding_forward(unit()); }
  void block_forward(int64_t l) override { m_.block_forward(m_.reading(in_.params), l, in_.n_instances); }
  void head_forward() override { m_.head_forward(unit()); }
  void head_backward() override { m_.head_backward(unit()); }
  void block_backward(int64_t l) override {
    m_.block_backward(m_.reading(in_.params), l, in_.n_instances, in_.global_n_targets, *in_.grads);
  }
  void embedding_backward() override { m_.embedding_backward(in_); }

 private:
  // The pass's inputs with the parameters of the unit in use (Olmo3::reading).
  const PassInputs& unit() {
    at_unit_ = in_;
    at_unit_.params = m_.reading(in_.params);
    return at_unit_;
  }
  Olmo3& m_;
  const PassInputs& in_;
  PassInputs at_unit_;
};

void Olmo3::embedding_forward(const PassInputs& in) {
  // x [R, d] = embeddings [V, d] at the rows' tokens [R]
  ex_->embedding_forward(in.params + layout_.embeddings, in.row_tokens, acts_[0].x.data(), in.n_instances * L_,
                         cfg_.d_model);
}

void Olmo3::head_forward(const PassInputs& in) {
  const int64_t R = in.n_instances * L_, d = cfg_.d_model;
  // hn [R, d] = RMSNorm(x_final [R, d])
  ex_->rmsnorm_forward(x_final_.data(), in.params + layout_.final_norm, hn_.data(), final_rms_.data(), R, d,
                       cfg_.norm_eps);
  round_act(hn_.data(), R * d);
  // A training pass takes the loss in the head's backward, where the head's products need the same logits.
  const bool forward_only = in.grads == nullptr;
  if (forward_only) head_rows(in, false);
}

// The logits, the loss and (backward) the head's two gradient products, over runs of at most head_rows_ rows of one
// instance, so the logits are never [R, V] at once. Per run of n rows from position t0:
//   logits [n, V] = hn rows [n, d] · lm_headᵀ [d, V]; the loss turns them into ∂logits and n row terms;
//   ∂lm_head_b [V, d]: its chain over the instance's rows goes on over the run's (accumulate after the first run);
//   ∂hn rows [n, d] = ∂logits [n, V] · lm_head [V, d].
// The logits and ∂hn are row-local, each ∂lm_head output is one chain continued in row order and the instance's
// loss totals sum its T row terms as one vector, so every split into runs gives the whole instance's bits
// (docs/canonical/loss.md). Under context parallelism the runs are this rank's positions, each ∂lm_head chain goes on
// from the previous rank's (leaf_begin) and the row terms of every rank are gathered before they are summed.
void Olmo3::head_rows(const PassInputs& in, bool backward) {
  Executor& e = *ex_;
  const int64_t d = cfg_.d_model, V = cfg_.vocab_size, p0 = first_position();
  const float* lm_head = in.params + layout_.lm_head;
  for (int64_t b = 0; b < in.n_instances; ++b) {
    float* leaf = backward ? leaf_begin(*in.grads, b, layout_.lm_head, V * d) : nullptr;
    for (int64_t t0 = 0; t0 < L_; t0 += head_rows_) {
      // n rows from this rank's row t0 of instance b, at position p = p0 + t0 of the instance
      const int64_t n = std::min(head_rows_, L_ - t0), row = b * L_ + t0, p = p0 + t0;
      const float* hn = hn_.data() + row * d;
      e.matmul_forward(hn, lm_head, logits_.data(), n, V, d);
      round_act(logits_.data(), n * V);  // bf16 logits; the loss upcasts them (`.float()`)
      if (in.logits_out) logits_.download(in.logits_out + (b * T_ + p) * V, n * V);
      e.cross_entropy_rows(logits_.data(), in.tokens + b * T_, p, n, T_, V, z_loss_, in.global_n_targets,
                           ce_terms_.data() + p, z_terms_.data() + p);
      if (!backward) continue;
      // bf16: ∂logits rounded (the gradient of the bf16 logits tensor); every activation gradient is rounded once
      // it is complete and every parameter gradient leaf once it is written (round_act, a no-op in fp32).
      round_act(logits_.data(), n * V);
      e.matmul_backward_weight(logits_.data(), hn, leaf, n, V, d, t0 > 0 || leaf_continues());
      e.matmul_backward_input(logits_.data(), lm_head, bw_.dhn.data() + row * d, n, V, d, false);
    }
    if (backward) leaf_end(*in.grads, b, layout_.lm_head, V * d, leaf);
    if (cp_ > 1) {  // every rank's row terms [T] (fp64: exact copies), so that the sum below is the whole instance's
      cpb_.terms.assign(ce_terms_.begin() + p0, ce_terms_.begin() + p0 + L_);
      cpb_.terms.insert(cpb_.terms.end(), z_terms_.begin() + p0, z_terms_.begin() + p0 + L_);
      cpb_.all_terms.resize(cpb_.terms.size() * static_cast<size_t>(cp_));
      cp_ex_->allgather(cpb_.terms.data(), cpb_.terms.size() * sizeof(double), cpb_.all_terms.data());
      for (int64_t r = 0; r < cp_; ++r) {
        const double* got = cpb_.all_terms.data() + r * 2 * L_;
        std::copy(got, got + L_, ce_terms_.begin() + r * L_);
        std::copy(got + L_, got + 2 * L_, z_terms_.begin() + r * L_);
      }
    }
    // The instance's fp64 totals are the leaves of the loss tree.
    in.per_instance[b] = {canonical_sum_f64(ce_terms_.data(), T_), canonical_sum_f64(z_terms_.data(), T_), T_ - 1};
    if (cfg_.moe.enabled())
      in.per_instance[b].moe_lb = moe_inst_[static_cast<size_t>(b)].lb,
      in.per_instance[b].moe_z = moe_inst_[static_cast<size_t>(b)].z;
  }
}

void Olmo3::head_backward(const PassInputs& in) {
  const int64_t n_inst = in.n_instances, R = n_inst * L_, d = cfg_.d_model;
  allocate_backward_buffers();
  head_rows(in, true);
  round_act(bw_.dhn.data(), R * d);
  // ∂x_final [R, d] into dx, the final norm's leaf per instance
  instance_norm_grads(*in.grads, n_inst, layout_.final_norm, x_final_.data(), in.params + layout_.final_norm,
                      final_rms_.data(), bw_.dhn.data(), bw_.dx.data(), d);
  round_act(bw_.dx.data(), R * d);
  // dx now holds ∂loss/∂(output of the last block).
}

void Olmo3::embedding_backward(const PassInputs& in) {
  const int64_t d = cfg_.d_model, V = cfg_.vocab_size;
  // ∂embeddings_b [V, d]: instance b's rows of dx added at their tokens, in position order
  for (int64_t b = 0; b < in.n_instances; ++b) {
    float* leaf = leaf_begin(*in.grads, b, layout_.embeddings, V * d);
    ex_->embedding_backward(in.row_host_tokens + b * L_, bw_.dx.data() + b * L_ * d, leaf, L_, V, d, leaf_continues());
    leaf_end(*in.grads, b, layout_.embeddings, V * d, leaf);
  }
}

LossSums Olmo3::forward_loss(const float* params, const uint32_t* host_tokens, ThreadPool* pool, float* logits_out) {
  PassInputs in;
  in.tokens = begin_call(host_tokens, B_, pool);
  in.params = working_params(params);
  in.host_tokens = host_tokens;
  set_row_tokens(in);
  in.n_instances = B_;
  in.global_n_targets = B_ * (T_ - 1);
  per_scratch_.assign(static_cast<size_t>(B_), LossSums{});
  in.per_instance = per_scratch_.data();
  in.logits_out = logits_out;
  ComputeSteps steps(*this, in);
  walk_forward(steps);  // the loss too (head_forward)
  return loss_tree_sums(per_scratch_.data(), B_);
}

LossSums Olmo3::forward_backward(const float* params, const uint32_t* tokens, int64_t global_n_targets, float* grad,
                                 ThreadPool* pool, float* logits_out) {
  if (own_ex_) own_ex_->set_pool(pool);
  GradientTree tree(B_, layout_.total, *ex_);
  tree.begin_microbatch(0, B_);
  std::vector<LossSums> per(static_cast<size_t>(B_));
  forward_backward(params, tokens, B_, global_n_targets, tree, per.data(), pool, logits_out);
  ex_->copy(grad, tree.slot(0), static_cast<size_t>(layout_.total) * sizeof(float));
  return loss_tree_sums(per.data(), B_);
}

void Olmo3::forward_backward(const float* params, const uint32_t* host_tokens, int64_t n_inst,
                             int64_t global_n_targets, GradientLeaves& grads, LossSums* per_instance, ThreadPool* pool,
                             float* logits_out) {
  if (n_inst < 1 || n_inst > B_)
    throw std::invalid_argument("forward_backward: " + std::to_string(n_inst) + " instances for a model sized for " +
                                std::to_string(B_));
  PassInputs in;
  in.tokens = begin_call(host_tokens, n_inst, pool);
  in.params = working_params(params);  // bf16: the bf16 copy, for forward and backward alike
  in.host_tokens = host_tokens;
  set_row_tokens(in);
  in.n_instances = n_inst;
  in.global_n_targets = global_n_targets;
  in.grads = &grads;
  in.per_instance = per_instance;
  in.logits_out = logits_out;
  ComputeSteps steps(*this, in);
  walk_training_pass(steps);
}

// The gradient temporaries, sized for micro_batch() instances, at the first backward (forward_loss never needs them).
void Olmo3::allocate_backward_buffers() {
  if (bw_.dx.size() != 0) return;
  Executor& e = *ex_;
  const int64_t Rm = R_, d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden;
  bw_.dx.reset(e, Rm * d, "gradient dx");
  bw_.dhn.reset(e, Rm * d, "gradient of the final norm output");
  bw_.df.reset(e, Rm * d, "gradient of the feed-forward output f");
  bw_.dao.reset(e, Rm * d, "gradient of the attention projection ao");
  bw_.datt.reset(e, Rm * qd, "gradient of the attention output");
  bw_.dq.reset(e, Rm * qd, "gradient dq");
  bw_.dq_raw.reset(e, Rm * qd, "gradient dq (before QK-norm)");
  bw_.dk.reset(e, Rm * kd, "gradient dk");
  bw_.dk_raw.reset(e, Rm * kd, "gradient dk (before QK-norm)");
  bw_.dv.reset(e, Rm * kd, "gradient dv");
  if (!cfg_.moe.enabled()) {
    bw_.dg.reset(e, Rm * F, "gradient dg (gate)");
    bw_.du.reset(e, Rm * F, "gradient du (up)");
  } else {
    const int64_t E = cfg_.moe.n_experts, S = Rm * cfg_.moe.top_k, h = cfg_.moe.hidden, Fs = cfg_.moe.shared_hidden;
    bw_.dlogits.reset(e, Rm * E, "gradient of the router logits");
    bw_.dy.reset(e, S * d, "gradient of the expert outputs");
    bw_.dxg.reset(e, S * d, "gradient of the dispatched expert inputs");
    bw_.da.reset(e, S * h, "gradient of the expert SwiGLU");
    bw_.deg.reset(e, S * h, "gradient of the expert gate");
    bw_.deu.reset(e, S * h, "gradient of the expert up");
    if (Fs > 0) {
      bw_.dsy.reset(e, Rm * d, "gradient of the shared expert output");
      bw_.dsg.reset(e, Rm * Fs, "gradient of the shared expert gate");
      bw_.dsu.reset(e, Rm * Fs, "gradient of the shared expert up");
      bw_.drouted.reset(e, Rm * d, "gradient of the routed experts' combined output");
    }
  }
}

// Parameter gradients: every token-axis reduction runs over one instance's T rows (docs/canonical/step.md).
// One weight's leaf per instance: dW_b [N, K] = dY_bᵀ·X_b over the instance's T rows (dY [R, N], X [R, K]),
// rounded to bf16 under that recipe, then committed to the instance tree.
void Olmo3::instance_weight_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const float* dY, const float* X,
                                  int64_t N, int64_t K) {
  for (int64_t b = 0; b < n_inst; ++b) {
    float* leaf = leaf_begin(grads, b, offset, N * K);
    ex_->matmul_backward_weight(dY + b * L_ * N, X + b * L_ * K, leaf, L_, N, K, leaf_continues());
    leaf_end(grads, b, offset, N * K, leaf);
  }
}

// RMSNorm backward instance by instance: dx rows [R, n] and the norm weight's leaf [n] per instance.
void Olmo3::instance_norm_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const float* x, const float* w,
                                const float* inv_rms, const float* dy, float* dx, int64_t n) {
  for (int64_t b = 0; b < n_inst; ++b) {
    float* leaf = leaf_begin(grads, b, offset, n);
    ex_->rmsnorm_backward(x + b * L_ * n, w, inv_rms + b * L_, dy + b * L_ * n, dx + b * L_ * n, leaf, L_, n,
                          leaf_continues());
    leaf_end(grads, b, offset, n, leaf);
  }
}

// The same for QK-norm + RoPE over n_heads heads: dy [R, n_heads·hd] rotated back in place first.
void Olmo3::instance_rope_norm_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const RopeView& rope, const float* x,
                                     const float* w, const float* inv_rms, float* dy, float* dx, int64_t n_heads) {
  const int64_t n = n_heads * cfg_.head_dim;
  for (int64_t b = 0; b < n_inst; ++b) {
    float* leaf = leaf_begin(grads, b, offset, n);
    RopeView instance = rope;  // instance b's rows are rows b·L .. b·L + L - 1 of this call
    if (instance.positions) instance.positions += b * L_;
    ex_->rope_rmsnorm_backward(x + b * L_ * n, w, inv_rms + b * L_, dy + b * L_ * n, dx + b * L_ * n, leaf, L_,
                               n_heads, instance, precision_ == Precision::bf16, leaf_continues());
    leaf_end(grads, b, offset, n, leaf);
  }
}

}  // namespace olmoref
