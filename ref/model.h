// ref/model.h — Olmo 3 forward and backward for one micro-batch on the CPU.
//
// data -> embedding -> L × [h = x + RMSNorm(Attn(x)); out = h + RMSNorm(SwiGLU(h))] -> RMSNorm -> LM head
//      -> cross-entropy + z-loss over shifted labels, divided by the *global* target count.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ref/gradient_tree.h"
#include "ref/model_config.h"
#include "ref/ops.h"
#include "ref/params.h"

namespace olmoref {

class ThreadPool;

// Activations kept from forward for backward, sized for one micro-batch shape (B instances × T).
struct LayerActs {
  std::vector<float> x;                 // [R, d]   block input
  std::vector<float> q_raw, k_raw;      // [R, qd], [R, kd]  projections before QK-norm
  std::vector<float> q_rms, k_rms;      // [R]      inverse RMS of q_raw, k_raw
  std::vector<float> q, k, v;           // [R, qd], [R, kd], [R, kd]  after QK-norm + RoPE (v: projection)
  std::vector<float> att;               // [R, qd]  attention output (before w_out)
  std::vector<float> att_max, att_sum;  // [B, H, T] softmax statistics
  std::vector<float> ao, ao_rms;        // [R, d], [R]  w_out output, before attention_norm
  std::vector<float> h;                 // [R, d]   x + RMSNorm(ao)
  std::vector<float> g, u, a;           // [R, F]   gate, up, silu(gate) ⊙ up
  std::vector<float> f, f_rms;          // [R, d], [R]  w2 output, before feed_forward_norm
};

// FSDP-style parameter gathering. A model with a gate asks for each unit's parameters just before it
// uses them and lets them go right after (forward, then again in backward), so a data-parallel rank
// never needs the whole parameter vector at once. Units: 0 = embedding, 1 + l = block l,
// n_layers + 1 = head (final norm + LM head); each is a contiguous range of the flat vector.
class ParamGate {
 public:
  virtual ~ParamGate() = default;
  virtual void acquire(int unit) = 0;  // the unit's range of the parameter buffer is valid from now on
  virtual void release(int unit) = 0;  // ... and may be dropped from now on
};

class Olmo3 {
 public:
  // precision bf16: the Olmo 3 recipe (docs/canonical/bf16.md). `params` stay the fp32 master weights;
  // each call rounds them to a bf16 copy, activations and gradients are rounded at the documented points,
  // and `grad` receives the bf16-valued parameter gradients of this micro-batch (the caller sums them in fp32).
  Olmo3(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision = Precision::fp32);

  const ModelConfig& config() const { return cfg_; }
  Precision precision() const { return precision_; }
  // Without a gate (the default) the whole parameter vector must be valid for every call.
  void set_param_gate(ParamGate* gate) { gate_ = gate; }
  int n_units() const { return static_cast<int>(cfg_.n_layers) + 2; }
  std::pair<int64_t, int64_t> unit_range(int unit) const;  // [begin, end) in the flat vector
  const ParamLayout& layout() const { return layout_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_len() const { return T_; }

  // Forward and backward of one micro-batch of n_instances <= micro_batch() instances. tokens: [n, T].
  // The parameter gradients (of the loss divided by global_n_targets) go to `grads` instance by instance
  // (GradientLeaves: the leaves of the step's instance tree); per_instance[b] receives instance b's fp64
  // loss totals. If logits_out is not null it receives the fp32 logits [n, T, V] before the loss.
  void forward_backward(const float* params, const uint32_t* tokens, int64_t n_instances, int64_t global_n_targets,
                        GradientLeaves& grads, LossSums* per_instance, ThreadPool* pool, float* logits_out = nullptr);

  // The micro-batch's gradient on its own: the instance tree over its micro_batch() instances, into grad
  // (layout().total floats, overwritten); the loss totals are the same tree over the instances.
  LossSums forward_backward(const float* params, const uint32_t* tokens, int64_t global_n_targets, float* grad,
                            ThreadPool* pool, float* logits_out = nullptr);

  // FSDP with uneven runs: a rank with fewer micro-batches than others in its shard group takes part in the
  // parameter gathers of one forward/backward without computing (the gate sees exactly the acquire/release
  // sequence of forward_backward), so the group's collectives stay matched.
  void gather_only_pass();

  // Forward only: loss sums (no gradient). Used by evaluation. If logits_out is not null it receives the
  // logits [B, T, V] (bf16-valued in bf16 precision), as in forward_backward.
  LossSums forward_loss(const float* params, const uint32_t* tokens, ThreadPool* pool, float* logits_out = nullptr);

 private:
  void forward(const float* params, const uint32_t* tokens, int64_t n_instances, ThreadPool* pool);
  // The parameters the forward and backward read: `params` itself in fp32, its bf16 copy in bf16.
  const float* working_params(const float* params, ThreadPool* pool);
  void use_unit(const float* master, int unit, ThreadPool* pool);  // acquire (+ the bf16 copy of the unit)
  void drop_unit(int unit);
  // bf16: rounds x[0..n) to bf16 in place; fp32: nothing.
  void round_act(float* x, int64_t n, ThreadPool* pool) const;

  ModelConfig cfg_;
  Precision precision_ = Precision::fp32;
  std::vector<float> params_bf16_;  // bf16 copy of the master weights (bf16 precision only)
  ParamGate* gate_ = nullptr;
  const float* master_ = nullptr;  // the fp32 parameters of the current call (what use_unit rounds from)
  ParamLayout layout_;
  int64_t B_, T_, R_;
  RopeTable rope_;
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, final_rms_, hn_, logits_;  // [R, d], [R], [R, d], [R, V]
};

}  // namespace olmoref
