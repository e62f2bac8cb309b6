// model/olmo3.h — Olmo 3 forward and backward for one micro-batch, written once over the executor interface
// (core/executor.h): the same code drives the CPU reference and the CUDA kernels.
//
// data -> embedding -> L × [h = x + RMSNorm(Attn(x)); out = h + RMSNorm(SwiGLU(h))] -> RMSNorm -> LM head
//      -> cross-entropy + z-loss over shifted labels, divided by the *global* target count.
//
// Memory: parameters, activations and gradients are executor memory (the device for CUDA); tokens, loss totals
// and the optional logits copy are host memory.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/exchange_plan.h"
#include "core/executor.h"
#include "model/gradient_tree.h"
#include "ref/cpu_executor.h"
#include "core/model_config.h"
#include "ref/moe.h"
#include "ref/ops.h"
#include "core/params.h"

namespace olmoref {

class ThreadPool;

// moe_route's outputs in executor memory (core/executor.h): scores [R, E], lse [R], top [R, k], weight [R, k].
struct MoERouteTensors {
  float* scores = nullptr;
  float* lse = nullptr;
  int32_t* top = nullptr;
  float* weight = nullptr;
};

// Activations kept from forward for backward, sized for one micro-batch shape (B instances × T). Of a block that
// activation checkpointing recomputes only x is its own; the executor buffers after it are one set that moves from
// recomputed block to recomputed block (kBlockWork in model/olmo3.cpp lists them: a new executor buffer here belongs
// in that list).
struct LayerActs {
  Buffer<float> x;                 // [R, d]   block input
  Buffer<float> q_raw, k_raw;      // [R, qd], [R, kd]  projections before QK-norm
  Buffer<float> q_rms, k_rms;      // [R]      inverse RMS of q_raw, k_raw
  Buffer<float> q, k, v;           // [R, qd], [R, kd], [R, kd]  after QK-norm + RoPE (v: projection)
  Buffer<float> att;               // [R, qd]  attention output (before w_out)
  Buffer<float> att_max, att_sum;  // [B, H, T] softmax statistics
  Buffer<float> ao, ao_rms;        // [R, d], [R]  w_out output, before attention_norm
  Buffer<float> h;                 // [R, d]   x + RMSNorm(ao)
  Buffer<float> g, u, a;           // [R, F]   gate, up, silu(gate) ⊙ up
  Buffer<float> f, f_rms;          // [R, d], [R]  w2 output (MoE: the combined experts), before feed_forward_norm
  // Mixture of experts (docs/canonical/moe.md), S = R·k dispatched slots in (expert, row) order:
  Buffer<float> router_logits;     // [R, E]
  Buffer<float> xg;                // [S, d]   h's rows, dispatched
  Buffer<float> eg, eu, ea;        // [S, h]   each expert's gate, up, SwiGLU
  Buffer<float> ey;                // [S, d]   each expert's output
  Buffer<float> sg, su, sa, sy;    // [R, Fs], [R, Fs], [R, Fs], [R, d]  the shared expert
  // The routing (moe_route's outputs) where the executor's ops read it: scores [R, E], lse [R], top [R, k], weight
  // [R, k]. On a host-memory executor these point into the host vectors below; else into route_scores, route_lse,
  // route_top (made at the first forward) and weight_copy (the weights [R, k] on the device; olmo3.cpp allocates it).
  MoERouteTensors route;
  Buffer<float> route_scores, route_lse;
  Buffer<int32_t> route_top;
  Buffer<float> weight_copy;
  // The routing's host side: top always (the plan, the expert loads, the routing digest); scores and lse for the
  // fp64 auxiliary losses; weight for the unordered negative control. Device executors copy only what is read.
  std::vector<float> scores, lse, weight;
  std::vector<int32_t> top;
  moe::Plan plan;
  // The plan where the executor's MoE ops read it: on a host-memory executor the plan's own vectors; else these
  // copies of row_of and position [S].
  MoEDispatch dispatch;
  Buffer<int64_t> plan_row_of, plan_position;
};

// Gradient temporaries of backward (allocated at the first backward), one buffer per tensor.
struct BackwardBuffers {
  Buffer<float> dx;           // [R, d]   ∂(block output), then ∂h, then ∂(block input): one chain, one tensor
  Buffer<float> dhn;          // [R, d]   ∂hn, the final norm's output
  Buffer<float> df, dao;      // [R, d]   ∂f (before feed_forward_norm), ∂ao (before attention_norm)
  Buffer<float> datt;         // [R, qd]  ∂att, the attention output's gradient
  Buffer<float> dq, dq_raw;   // [R, qd]  ∂q (rotated back in place by the RoPE backward), ∂q_raw
  Buffer<float> dk, dk_raw;   // [R, kd]  ∂k (likewise), ∂k_raw
  Buffer<float> dv;           // [R, kd]
  Buffer<float> dg, du;       // [R, F] (dg first holds ∂a, the SwiGLU output's gradient: inside the fused op)
  // Mixture of experts: ∂logits [R, E]; ∂y, ∂xg [S, d]; ∂a, ∂g, ∂u [S, h]; the shared expert's ∂y [R, d], ∂g, ∂u [R, Fs]
  // and the routed part's ∂ [R, d] (with a shared expert; without one it is ∂f itself).
  Buffer<float> dlogits, dy, dxg, da, deg, deu, dsy, dsg, dsu, drouted;
  // ∂weight [R, k] and the load-balancing gradient [units, E] of the router backward (made at the first MoE backward).
  Buffer<float> dweight, lb_grad;
};

// Host copies of executor tensors for the MoE paths that stage rows on the host (the expert-parallel exchange, the
// test-only unordered sums): on a host-memory executor they stay empty (the host reads the tensors themselves).
// One vector per tensor.
// The executor's staging (page-locked on a device: Executor::allocate_staging), bound in Olmo3's constructor.
struct MoEHostMirrors {
  StagingVector<float> xg, ey, ea;     // [S, d], [S, d], [S, h]
  StagingVector<float> f;              // [R, d]   the combined output (unordered negative control)
  StagingVector<float> dy;             // [S, d]
  StagingVector<float> dxg, deg, deu;  // [S, d], [S, h], [S, h]
  StagingVector<float> dh;             // [R, d]   ∂h (unordered negative control)
};

// Expert-major rows of a run of experts [first, last): expert first + i's rows are [begin[i], begin[i] + count[i]).
struct ExpertRows {
  int64_t first = 0, last = 0;
  std::vector<int64_t> count, begin;  // [last − first]
};

// What a MoE model's forward records per instance: its auxiliary-loss sums (fp64, weighted, summed over layers
// in order; the step divides them by its target count) and the digest of its tokens' expert choices.
struct MoEInstance {
  double lb = 0.0, z = 0.0;
  uint64_t routing = 0;
};

// FSDP-style parameter gathering. A model with a gate asks for each unit's parameters just before it
// uses them and lets them go right after (forward, then again in backward), so a data-parallel rank
// never needs the whole parameter vector at once. Units: 0 = embedding, 1 + l = block l,
// n_layers + 1 = head (final norm + LM head); each is a contiguous range of the flat vector.
class ParamGate {
 public:
  virtual ~ParamGate() = default;
  // The unit's parameters are valid from now on at base + x for x in the unit's range [a, b) of the flat vector
  // (base need not point at an allocation: a unit-sized device buffer is returned as unit_at_flat_offsets).
  virtual const float* acquire(int unit) = 0;
  virtual void release(int unit) = 0;  // ... and may be dropped from now on
  // The unit the walk acquires next, told right after acquire(unit) returns, before the unit's work: a gate may
  // start gathering it now, under that work (FSDP's prefetch). Only a hint: every acquire must be served whatever
  // was announced. Every rank's walk announces the same units in the same order.
  virtual void prefetch(int unit) { (void)unit; }
};

// A pointer p with p + x addressing unit[x - a] for x in [a, a + unit's length): a buffer holding one unit, read at
// the flat vector's offsets. Integer arithmetic, modulo 2^64, so the address may lie below the buffer.
inline float* unit_at_flat_offsets(float* unit, int64_t a) {
  return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(unit) - static_cast<uintptr_t>(a) * sizeof(float));
}

// Told around each unit's backward in a training pass, a pass without instances (idle_pass) included: every leaf
// of the unit is written and committed between the two calls, and no other unit's. The reduction at the owners
// (dist/gradient_owners.h) sends a unit's finished subtrees to their owners as soon as its backward ends, so a rank
// holds the gradient of one unit at a time; every rank makes the same calls, so its exchanges match.
class UnitGradientSink {
 public:
  virtual ~UnitGradientSink() = default;
  virtual void unit_backward_begins(int unit) = 0;
  virtual void unit_backward_done(int unit) = 0;
};

// Expert parallelism (docs/canonical/moe.md "Expert parallelism"): the ranks of an EP group route their own
// tokens, send each dispatched row to the rank that owns its expert (moe::ep_experts) and get the expert's
// results back. Data movement only; every float is computed by the same op on the same inputs as in one process.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int size() const = 0;   // ranks in the EP group
  virtual int index() const = 0;  // this rank's place in it
  // all [size() · n]: block i is rank i's `mine` [n].
  virtual void allgather(const int64_t* mine, int64_t n, int64_t* all) = 0;
  // send_counts[j] floats to rank j (blocks back to back in rank order); recv_counts[i] floats from rank i.
  virtual void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) = 0;
  // True when the rows move between buffers in executor memory (the NCCL transport): the model then hands move() its
  // device tensors and their pieces instead of staging rows through the host for alltoallv.
  virtual bool device_resident() const { return false; }
  // The plan's pieces of src (executor memory) into dst (executor memory): the same rows, peer for peer, as the
  // alltoallv the host path issues.
  virtual void move(const std::vector<const float*>& src, const std::vector<float*>& dst, const ExchangePlan& plan);
};

// Context parallelism (train.cp_degree, docs/canonical/context_parallel.md): the n ranks of a group each compute
// L = T / n consecutive positions of every instance of one micro-batch, rank i the positions [i·L, (i+1)·L)
// (OLMo-core's llama3 sharding). Data movement only, so every value has the bits of one rank's whole instance:
// attention gathers every rank's keys and values (in backward also the queries, outputs, their gradients) and computes
// its own queries and keys (AttentionShape's parts); every chain over an instance's positions (a weight's gradient,
// a norm weight's, the embedding's, the LM head's) starts on rank 0, goes on on rank 1 from rank 0's partial, and so
// on, and ends on the last rank, which alone writes the instance's gradient leaves; the loss's row terms are gathered
// and summed whole.
class ContextExchange {
 public:
  virtual ~ContextExchange() = default;
  virtual int size() const = 0;   // ranks in the group
  virtual int index() const = 0;  // this rank's place in it: its positions are [index·L, (index+1)·L)
  // all [size() · bytes]: block i is rank i's `mine` (host memory).
  virtual void allgather(const void* mine, size_t bytes, void* all) = 0;
  // A chain's partial [n] (host memory) to the next rank, and from the previous one.
  virtual void send_next(const float* partial, int64_t n) = 0;
  virtual void recv_prev(float* partial, int64_t n) = 0;
  // True when the tensors move between buffers in executor memory (the NCCL transport): the model then hands
  // move_positions and the chains' _on_device calls its device tensors instead of staging them through the host.
  virtual bool device_resident() const { return false; }
  // The plan's pieces of src into dst (executor memory): an all-gather of positions, peer for peer the bytes of the
  // allgather the host path issues.
  virtual void move_positions(const std::vector<const float*>& src, const std::vector<float*>& dst,
                              const ExchangePlan& plan);
  virtual void send_next_on_device(const float* partial, int64_t n);
  virtual void recv_prev_on_device(float* partial, int64_t n);
};

// OLMo-core's activation checkpointing (train.activation_checkpointing, its mode; for selected_blocks also
// train.activation_checkpointing_block_interval). A recomputed block keeps only its input x [R, d] from forward, and
// its backward first runs the block's forward again with the same ops on the same x, so every bit of every gradient
// is the same; the recomputed blocks' other activations are one set of buffers they take in turn. none: no block is
// recomputed (backward reads every block's activations as forward left them); full: every block (L times less
// activation memory); selected_blocks: blocks l with l % block_interval == 0, as OLMo-core wraps them, the others
// keeping their own sets (what memory allows of the recompute's time back: docs/memory.md).
struct ActivationCheckpointing {
  enum class Mode { none, full, selected_blocks };
  Mode mode = Mode::none;
  int64_t block_interval = 0;  // selected_blocks only, >= 1

  static ActivationCheckpointing none() { return {}; }
  static ActivationCheckpointing full() { return {Mode::full, 0}; }
  static ActivationCheckpointing selected_blocks(int64_t interval) { return {Mode::selected_blocks, interval}; }
  bool recomputes(int64_t block) const {
    return mode == Mode::full || (mode == Mode::selected_blocks && block % block_interval == 0);
  }
  // Of blocks 0 .. n_layers - 1.
  int64_t recomputed_blocks(int64_t n_layers) const {
    if (mode == Mode::none) return 0;
    if (mode == Mode::full) return n_layers;
    return (n_layers + block_interval - 1) / block_interval;
  }
};
// What train.activation_checkpointing may be, for the refusals that name it: "it must be ...".
std::string activation_checkpointing_modes();
// "none" | "full" | "selected_blocks" (with block_interval >= 1; 0 elsewhere); anything else throws
// std::invalid_argument naming the key.
ActivationCheckpointing parse_activation_checkpointing(const std::string& mode, int64_t block_interval = 0);

// Bytes a model of this shape allocates on its executor, by part (docs/memory.md). Mirrors the constructor and
// forward_backward; used to refuse a run before it allocates anything.
struct ModelMemory {
  int64_t activations = 0;  // the blocks' activations kept for backward (full: the inputs plus one block's set)
  int64_t backward = 0;     // the backward's gradient temporaries
  int64_t logits = 0;       // the head: final norm input and output [R, d] and one run of rows' logits [rows, V]
  int64_t working = 0;      // RoPE tables, tokens, the loss's row terms and (bf16) the working copy of the weights
  int64_t kernel_scratch = 0;  // the CUDA kernels' largest scratch: attention's rows of T per block, D, dk/dv
  // Context parallelism: one layer's whole-instance attention tensors, a chain's partial, the rows' tokens and
  // positions (Olmo3::ContextBuffers)
  int64_t context_parallel = 0;
  int64_t total() const { return activations + backward + logits + working + kernel_scratch + context_parallel; }
};
// The rows of one instance whose logits the head holds at once. Whole micro-batches would hold [R, V] (6.6 GiB at
// 7B, micro-batch 2, V 100352), so the head and the loss run over runs of at most this many rows of one instance:
// the largest power of two whose [rows, V] fp32 logits fit 256 MiB (at least 1), or the whole instance if smaller.
int64_t head_chunk_rows(int64_t vocab_size, int64_t seq_len);

// context_parallel: the ranks one instance's positions are split over (each holds seq_len / context_parallel rows
// of activations, and one layer's whole-instance attention tensors).
ModelMemory olmo3_memory(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision,
                         bool kernel_scratch, ActivationCheckpointing checkpointing = ActivationCheckpointing::none(),
                         int64_t context_parallel = 1);
int64_t olmo3_memory_bytes(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision,
                           bool kernel_scratch, ActivationCheckpointing checkpointing = ActivationCheckpointing::none(),
                           int64_t context_parallel = 1);

// FSDP's units of the flat vector, for the model (Olmo3::unit_range, unit_reads) and for the models of memory and
// step time that need no model: unit 0 the embedding, 1..n_layers the blocks, n_layers + 1 the final norm and the LM
// head. [begin, end) in the flat vector.
std::pair<int64_t, int64_t> fsdp_unit_range(const ModelConfig& cfg, const ParamLayout& layout, int unit);
std::vector<std::pair<int64_t, int64_t>> fsdp_unit_ranges(const ModelConfig& cfg, const ParamLayout& layout);
// The parts of a unit that rank ep_index of an EP group of ep_size reads (ascending, disjoint): the whole unit,
// except that a block's routed experts are only its own (the others run on their owners, moe::ep_experts).
std::vector<std::pair<int64_t, int64_t>> fsdp_unit_reads(const ModelConfig& cfg, const ParamLayout& layout, int unit,
                                                         int ep_size, int ep_index);

class Olmo3 {
 public:
  // precision bf16: the Olmo 3 recipe (docs/canonical/bf16.md). `params` stay the fp32 master weights;
  // each call rounds them to a bf16 copy, activations and gradients are rounded at the documented points,
  // and `grad` receives the bf16-valued parameter gradients of this micro-batch (the caller sums them in fp32).
  // ex: the executor every op runs on; nullptr: a CPU executor of the model's own, using the ThreadPool each
  // call passes (`pool` is ignored with any other executor).
  // checkpointing: what forward keeps for backward (ActivationCheckpointing); never changes a bit.
  // context_parallel: the group size of set_context_exchange (1: none); it must divide seq_len.
  Olmo3(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision = Precision::fp32,
        Executor* ex = nullptr, ActivationCheckpointing checkpointing = ActivationCheckpointing::none(),
        int64_t context_parallel = 1);
  Executor& executor() { return *ex_; }

  const ModelConfig& config() const { return cfg_; }
  Precision precision() const { return precision_; }
  // The z-loss multiplier of the cross-entropy (train.z_loss): loss = Σ CE + z_loss · Σ logsumexp². Model-level
  // callers that have no training config get Olmo 3's 1e-5; every caller that has one must pass its value.
  void set_z_loss(double z_loss);
  // Intra-document masking (data.document_masking, docs/canonical/documents.md): every call cuts each instance into
  // documents at `eos` (core/documents.h); attention stays inside a document and RoPE rotates by the position in it.
  // -1 (the default): one document per instance.
  void set_document_masking(int64_t eos) { doc_eos_ = eos; }
  float z_loss() const { return z_loss_; }
  ActivationCheckpointing checkpointing() const { return checkpointing_; }
  // Without a gate (the default) the whole parameter vector must be valid for every call.
  void set_param_gate(ParamGate* gate) { gate_ = gate; }
  void set_unit_gradient_sink(UnitGradientSink* sink) { sink_ = sink; }
  int n_units() const { return static_cast<int>(cfg_.n_layers) + 2; }
  std::pair<int64_t, int64_t> unit_range(int unit) const {  // [begin, end) in the flat vector
    return fsdp_unit_range(cfg_, layout_, unit);
  }
  int64_t largest_unit() const;                             // the longest unit_range, in floats
  // The parts of unit_range(unit) that forward_backward and idle_pass read on rank ep_index of an EP group of
  // ep_size (fsdp_unit_reads). ep_size 1: the whole unit.
  std::vector<std::pair<int64_t, int64_t>> unit_reads(int unit, int ep_size, int ep_index) const {
    return fsdp_unit_reads(cfg_, layout_, unit, ep_size, ep_index);
  }
  const ParamLayout& layout() const { return layout_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_len() const { return T_; }

  // Forward and backward of one micro-batch of n_instances <= micro_batch() instances. tokens (host): [n, T].
  // The parameter gradients (of the loss divided by global_n_targets) go to `grads` instance by instance
  // (GradientLeaves: the leaves of the step's instance tree); per_instance[b] receives instance b's fp64
  // loss totals. If logits_out is not null it receives the fp32 logits [n, T, V] before the loss.
  void forward_backward(const float* params, const uint32_t* tokens, int64_t n_instances, int64_t global_n_targets,
                        GradientLeaves& grads, LossSums* per_instance, ThreadPool* pool, float* logits_out = nullptr);

  // The micro-batch's gradient on its own: the instance tree over its micro_batch() instances, into grad
  // (executor memory, layout().total floats, overwritten); the loss totals are the same tree over the instances.
  LossSums forward_backward(const float* params, const uint32_t* tokens, int64_t global_n_targets, float* grad,
                            ThreadPool* pool, float* logits_out = nullptr);

  // FSDP with uneven runs: a rank with fewer micro-batches than others in its shard group takes part in the
  // parameter gathers of one forward/backward without computing (it walks the units as forward_backward does,
  // walk_training_pass, so the gate sees exactly the same acquire/release sequence): the group's collectives match.
  //
  // With expert parallelism the pass also serves as an expert owner: every MoE layer's exchanges of forward and
  // backward run with no rows of its own, computing the owned experts on what the other ranks send.
  void idle_pass(const float* params);

  // Context parallelism: the group this model computes a part of every instance with, of the constructor's size; it
  // must outlive the model's use of it. Every call then runs on all of the group's ranks together, with the same
  // tokens; on every rank but the last, forward_backward writes no gradient leaf (the chains go on to the next rank).
  void set_context_exchange(ContextExchange* cp);
  int64_t context_parallel() const { return cp_; }
  // TEST ONLY negative control (host-memory executors): each rank's chains start from zero over its own positions and
  // the partials are added rank after rank, as a context-parallel all-reduce of the weight gradients would; must break
  // the bits.
  void set_debug_cp_partial_sums(bool on) { debug_cp_partial_sums_ = on; }

  // Expert parallelism for forward_backward (forward_loss stays local: it needs every expert's weights, which a
  // rank holds); nullptr: every expert runs here. The exchange must outlive the model's use of it.
  void set_expert_exchange(ExpertExchange* ep);

  // Forward only: loss sums (no gradient), the instance tree's totals over the micro_batch() instances. If
  // logits_out (host) is not null it receives the logits [B, T, V] (bf16-valued in bf16 precision), as in
  // forward_backward.
  LossSums forward_loss(const float* params, const uint32_t* tokens, ThreadPool* pool, float* logits_out = nullptr);

  // TEST ONLY: the head's runs of rows (head_chunk_rows), to check that any split gives the same bits.
  void set_head_chunk_rows_for_test(int64_t rows);
  // TEST ONLY: combine the experts in arrival order (moe::combine_unordered_for_test); MoE models only.
  void set_debug_unordered_combine(bool on);
  // MoE only: the instances of the last forward (forward_backward or forward_loss), [n_instances].
  const std::vector<MoEInstance>& moe_instances() const { return moe_inst_; }
  // MoE only: tokens routed to each expert, [n_layers, E], summed over every forward since the last take (choices,
  // so each token counts k times); returns them and starts again from zero.
  std::vector<int64_t> take_expert_load();
  // MoE only: layer l's expert choices of the last forward, [n_instances · T, k] (host memory).
  const std::vector<int32_t>& routing(int64_t layer) const { return acts_[static_cast<size_t>(layer)].top; }

 private:
  // Points the model's CPU executor at this call's threads; returns the tokens in executor memory.
  const uint32_t* begin_call(const uint32_t* host_tokens, int64_t n_instances, ThreadPool* pool);
  // Under intra-document masking, the call's documents into doc_start_, doc_end_, doc_pos_ (else they are null).
  void documents_of(const uint32_t* host_tokens, int64_t n_instances);

  // A pass over the units has one order, the walk's (model/olmo3.cpp). Forward: the embedding, blocks 0..L-1, the
  // head. A training pass goes on with the loss, then backward: the head, blocks L-1..0 (first recomputed where
  // activation checkpointing says so), the embedding. The walk gathers each unit around its steps (FSDP: use_unit,
  // drop_unit), holds the expert exchange for a training pass and marks the recompute; the steps do the work.
  // ComputeSteps (olmo3.cpp) runs the model; IdleSteps (model/idle_pass.cpp) only the exchanges, so a rank without
  // instances makes the same collectives in the same order.
  class PassSteps {
   public:
    explicit PassSteps(bool working_copy) : working_copy(working_copy) {}
    virtual ~PassSteps() = default;
    // bf16 with a gate: the walk makes each unit's bf16 working copy as it arrives. An idle pass computes nothing in
    // bf16 (its experts run in fp32: MoE is fp32 only), so it makes none.
    const bool working_copy;
    virtual void embedding_forward() {}
    virtual void block_forward(int64_t layer) = 0;  // forward, and backward's recompute (recomputing_ set)
    virtual void head_forward() {}
    virtual void head_backward() {}
    virtual void block_backward(int64_t layer) = 0;
    virtual void embedding_backward() {}
  };
  class ComputeSteps;
  class IdleSteps;
  // then: the unit the walk acquires after the head's forward (a training pass: the head again), -1 for none.
  void walk_forward(PassSteps& steps, int then = -1);
  void walk_training_pass(PassSteps& steps);
  // What one forward_loss or forward_backward call computes on, carried through the walk by ComputeSteps.
  struct PassInputs {
    const float* params = nullptr;          // the working parameters (bf16: the copy)
    const uint32_t* tokens = nullptr;       // [R] in executor memory
    const uint32_t* host_tokens = nullptr;  // [n, T] on the host
    // This rank's rows' tokens [R] (the embedding's), in executor memory and on the host (the embedding backward
    // reads them there): tokens and host_tokens themselves without context parallelism.
    const uint32_t* row_tokens = nullptr;
    const uint32_t* row_host_tokens = nullptr;
    int64_t n_instances = 0;
    // forward_backward only: the loss's divisor, where the gradient leaves and the loss totals go, the logits copy.
    int64_t global_n_targets = 0;
    GradientLeaves* grads = nullptr;
    LossSums* per_instance = nullptr;
    float* logits_out = nullptr;
  };
  // The steps of ComputeSteps. The head's forward reads x_final_ and writes hn_ (forward_loss: and the loss, by
  // head_rows); the head's backward runs the loss and the head's products by head_rows and leaves ∂x_final in bw_.dx.
  // The per-instance loss totals come from head_rows in both.
  void embedding_forward(const PassInputs& in);
  void head_forward(const PassInputs& in);
  void head_rows(const PassInputs& in, bool backward);
  void head_backward(const PassInputs& in);
  void embedding_backward(const PassInputs& in);
  // Block l from its input acts_[l].x [R, d] to the next block's input (x_final_ after the last), its activations
  // in acts_[l]; forward and, for a recomputed block, backward's recompute run this same code.
  void block_forward(const float* params, int64_t layer, int64_t n_instances);
  // Block l's backward from ∂(its output) in bw_.dx to ∂(its input) there, its leaves to `grads`.
  void block_backward(const float* params, int64_t layer, int64_t n_instances, int64_t global_n_targets,
                      GradientLeaves& grads);
  // A recomputed block: moves the recomputed blocks' one set of block buffers to acts_[layer] (kBlockWork); a block
  // that keeps its activations has its own set: nothing to do.
  void bind_block_work(int64_t layer);
  // The parameters the forward and backward read: `params` itself in fp32, its bf16 copy in bf16.
  const float* working_params(const float* params);
  // acquire (+ the bf16 copy of the unit), then announce `next` to the gate (-1: nothing follows in this pass)
  void use_unit(int unit, bool working_copy, int next);
  void drop_unit(int unit);
  // Where a step reads parameters: `params` without a gate; with one, the unit in use (its fp32 values from the
  // gate, or its bf16 working copy), valid on that unit's range only.
  const float* reading(const float* params) const { return gate_ ? unit_read_ : params; }
  // bf16: rounds x[0..n) to bf16 in place; fp32: nothing.
  void round_act(float* x, int64_t n) const;
  AttentionShape attention_shape(int64_t layer, int64_t n_instances) const;
  void allocate_backward_buffers();
  // Points A.route at where moe_route writes R rows (executor memory).
  void place_route_outputs(LayerActs& A, int64_t R);
  // Copies to the host what of the routing the host reads (nothing on a host-memory executor): LayerActs::top etc.
  void routing_to_host(LayerActs& A, int64_t R);
  // Points A.dispatch at the plan in executor memory (copies its index arrays there on a device executor).
  void place_routing(LayerActs& A);

  // One block's sublayers over R = n_instances·T rows. Forward (model/dense_block.cpp, model/moe_block.cpp): the
  // attention sublayer A.x -> A.h, the feed-forward A.h -> A.f (the block's residual is the walk's, olmo3.cpp).
  void attention_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t layer, int64_t n_instances);
  void dense_ffn_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_instances);
  void moe_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_instances);
  // Backward, each from its output's gradient: the feed-forward's from ∂f (bw_.df), adding ∂h into bw_.dx; the
  // attention sublayer's from ∂h (bw_.dx), leaving ∂x there. Leaves go to `grads` instance by instance.
  void dense_ffn_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_instances,
                          GradientLeaves& grads);
  void moe_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_instances,
                    int64_t global_n_targets, GradientLeaves& grads);
  void attention_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t layer, int64_t n_instances,
                          GradientLeaves& grads);
  // The routed experts' weight-gradient leaves of the instances, from the backward buffers (model/moe_block.cpp).
  void expert_weight_grads(const LayerActs& A, const BlockOffsets& o, int64_t n_instances, GradientLeaves& grads);
  // The router backward into ∂logits [R, E] from ∂weight [R, k] (executor memory) and the auxiliary losses' terms.
  void moe_router_backward(LayerActs& A, const float* dweight, int64_t n_instances, int64_t global_n_targets);

  // Expert parallelism, layer `layer` (model/ep_exchange.cpp): this rank's slots (plan, rows in plan order: on the
  // host, or in executor memory when the exchange is device-resident; all nullptr in an idle pass) go to their
  // experts' owners; the owned experts run on what arrives; the results
  // come back to the slots. Forward sends xg [S, d] and receives ey [S, d], ea [S, h]; backward sends dy [S, d] and
  // receives dxg [S, d], deg, deu [S, h] (the weight-gradient leaves stay with the instances, docs/canonical/moe.md).
  void ep_forward(const float* params, const BlockOffsets& o, int64_t layer, const moe::Plan* plan, const float* xg,
                  float* ey, float* ea);
  void ep_backward(const float* params, const BlockOffsets& o, int64_t layer, const moe::Plan* plan, const float* dy,
                   float* dxg, float* deg, float* deu);
  // The experts' forward and input-gradient products over expert-major rows (ExpertRows), on whichever rank runs
  // them: the local loop and the EP owner call the same code, so every row gets the same ops.
  // Forward: g, u, a [n, h] and y [n, d] from X [n, d]. Backward: ∂a, ∂g, ∂u [n, h] and ∂X [n, d] from ∂y [n, d].
  void experts_forward(const float* params, const BlockOffsets& o, const ExpertRows& rows, const float* X, float* g,
                       float* u, float* a, float* y);
  void experts_backward(const float* params, const BlockOffsets& o, const ExpertRows& rows, const float* dy,
                        const float* g, const float* u, float* da, float* dg, float* du, float* dX);

  // Context parallelism (model/context_parallel.cpp). The attention op over this rank's part of each instance:
  // forward from q, k, v [R, ·] to att [R, qd] and the whole instance's statistics [n, H, T]; backward from them and
  // ∂att to dq [R, qd], dk, dv [R, kd]. Without context parallelism these are the executor's ops on the rows as they are.
  void attention_op_forward(LayerActs& A, int64_t layer, int64_t n_inst);
  void attention_op_backward(LayerActs& A, int64_t layer, int64_t n_inst);
  // Every rank's rows [n, L, w] of `mine` (executor memory) at their positions of full [n, T, w] (executor memory).
  void gather_positions(const float* mine, int64_t n_inst, int64_t w, float* full);
  // The statistics [n, H, T] this rank wrote (its positions) completed with every other rank's.
  void gather_statistics(float* stats, int64_t n_inst);
  // The routing of the call's instances over their whole rows [n·T, ·] on the host, for what is summed over an
  // instance (the auxiliary losses, the routing digest, the load-balancing gradient): A's own vectors without context
  // parallelism, else every rank's rows gathered into their positions (scores when the load-balancing loss is on, lse
  // when the z-loss is, the choices always; choices_only: the choices alone).
  struct MoEInstanceRows {
    const float* scores = nullptr;
    const float* lse = nullptr;
    const int32_t* top = nullptr;
  };
  MoEInstanceRows whole_instance_rows(const LayerActs& A, int64_t n_inst, bool choices_only = false);
  // Every rank's rows [n, L] of `row_bytes` each (host) at their positions of full [n, T] (host).
  void gather_host_positions(const void* mine, int64_t n_inst, size_t row_bytes, void* full);
  // Under context parallelism, this call's row tokens and RoPE positions (begin_call).
  void rows_of_call(const uint32_t* host_tokens, int64_t n_inst);
  // The pass's row_tokens and row_host_tokens: this call's (rows_of_call), or the instances' own without it.
  void set_row_tokens(PassInputs& in) const;
  // One instance's leaf of the parameters [offset, offset + n), as a chain over the instance's positions: leaf_begin
  // says where the chain's op writes (the leaf itself, or on a rank before the last one the partial to pass on), with
  // the previous rank's partial there when one came (leaf_continues: the op continues it, accumulate); leaf_end
  // rounds (bf16) and commits the finished leaf, or passes the partial on.
  float* leaf_begin(GradientLeaves& grads, int64_t b, int64_t offset, int64_t n);
  bool leaf_continues() const { return cp_index() > 0 && !debug_cp_partial_sums_; }
  void leaf_end(GradientLeaves& grads, int64_t b, int64_t offset, int64_t n, float* at);
  int cp_index() const { return cp_ex_ ? cp_ex_->index() : 0; }
  int64_t first_position() const { return cp_index() * L_; }  // of this rank's rows, in each instance

  // Per-instance gradient leaves (forward_backward and the blocks): of one linear layer, dW_b [N, K] from dY [R, N],
  // X [R, K]; of an RMSNorm, dx [R, n] and the weight's leaf; of QK-norm + RoPE over n_heads heads, likewise after
  // rotating dy [R, n_heads·hd] back in place.
  void instance_weight_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const float* dY, const float* X,
                             int64_t N, int64_t K);
  void instance_norm_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const float* x, const float* w,
                           const float* inv_rms, const float* dy, float* dx, int64_t n);
  void instance_rope_norm_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const RopeView& rope, const float* x, const float* w,
                                const float* inv_rms, float* dy, float* dx, int64_t n_heads);
  // Host access to executor memory: the pointer itself on host-memory executors, else a copy in `mirror`.
  const float* host_read(const float* src, int64_t n, StagingVector<float>& mirror) const;
  // Where the host writes a tensor bound for `dst`: dst itself on host-memory executors, else `mirror` resized.
  float* host_target(float* dst, int64_t n, StagingVector<float>& mirror) const;
  // Writes host data back (nothing to do when `host` is the executor memory itself).
  void host_write(float* dst, const float* host, int64_t n) const;
  double moe_lb_coef() const;
  double moe_z_coef() const;

  ModelConfig cfg_;
  Precision precision_ = Precision::fp32;
  float z_loss_ = 1e-5f;  // the op takes fp32; (float)1e-5 is 1e-5f, so the default's bits are those of old
  ActivationCheckpointing checkpointing_;
  int64_t work_at_ = 0;       // the recomputed block whose acts_ entry holds their one set of block buffers now
  // True while backward recomputes a block's forward: what forward counts once per step (the expert load, the
  // auxiliary losses, the routing digest) was counted by the first forward (model/moe_block.cpp).
  bool recomputing_ = false;
  std::unique_ptr<CpuExecutor> own_ex_;  // when no executor was given
  Executor* ex_;
  Buffer<float> params_bf16_;  // bf16 copy of the master weights (bf16 precision only)
  ParamGate* gate_ = nullptr;
  UnitGradientSink* sink_ = nullptr;
  const float* unit_read_ = nullptr;  // with a gate: the unit in use, read at flat offsets (reading())
  Buffer<float> unit_bf16_;           // with a gate in bf16: the unit in use's working copy
  ParamLayout layout_;
  // T_ positions an instance, L_ of them this rank's rows (T_ / cp_), R_ = B_·L_ rows a micro-batch.
  int64_t B_, T_, cp_, L_, R_;
  ContextExchange* cp_ex_ = nullptr;  // set_context_exchange
  bool debug_cp_partial_sums_ = false;
  // Context parallelism's buffers: one layer's whole-instance attention tensors [B, T, qd] (q, out, ∂out, dq) and
  // [B, T, kd] (k, v, dk, dv), shared by every layer; the partial of a chain on its way (on the largest leaf, V·d);
  // the call's row tokens and RoPE positions [R] (executor memory, and on the host); host staging of the exchanges.
  struct ContextBuffers {
    Buffer<float> q, k, v, out, dout, dq, dk, dv, partial;
    Buffer<float> own_run;  // device-resident exchange: my run of the attention statistics sent to myself [B·H, L]
    Buffer<uint32_t> tokens;
    Buffer<int32_t> positions;
    std::vector<uint32_t> host_tokens;
    std::vector<int32_t> host_positions;
    StagingVector<float> mine, full, partial_host;  // cross PCIe: the executor's staging, bound in the constructor
    std::vector<float> all;
    std::vector<double> terms, all_terms;
    std::vector<unsigned char> bytes;  // gather_host_positions' receive
    std::vector<float> scores, lse;    // whole_instance_rows
    std::vector<int32_t> top;
  } cpb_;
  Buffer<float> rope_cos_, rope_sin_;  // [T, hd/2] (ref/ops.h make_rope_table)
  RopeView rope_;
  // model.rope_scaling's table [T, hd/2] for the layers it applies to (cfg_.rope_scaled); empty when off.
  Buffer<float> scaled_cos_, scaled_sin_;
  RopeView scaled_rope_;
  // The layer's table, at the call's document positions under intra-document masking.
  // Under context parallelism every row has its position there (its place in the instance, or in its document).
  RopeView rope_of(int64_t layer) const {
    RopeView r = cfg_.rope_scaled(layer) ? scaled_rope_ : rope_;
    r.positions = cp_ > 1 ? row_pos_ : doc_pos_;
    return r;
  }
  const int32_t* row_pos_ = nullptr;  // context parallelism: the call's RoPE positions of this rank's rows [R]
  // Under intra-document masking: the call's documents (begin_call), each [R] in executor memory, and their host
  // copies; null pointers without masking.
  int64_t doc_eos_ = -1;
  std::vector<int32_t> doc_host_[3];  // start, end, position in the document
  Buffer<int32_t> doc_buf_[3];
  const int32_t *doc_start_ = nullptr, *doc_end_ = nullptr, *doc_pos_ = nullptr;
  Buffer<uint32_t> tokens_;            // [B, T]: the host tokens, copied when executor memory is not host memory
  std::vector<LayerActs> acts_;
  Buffer<float> x_final_, final_rms_, hn_;  // [R, d], [R], [R, d]
  int64_t head_rows_;                        // head_chunk_rows, or set_head_chunk_rows_for_test
  Buffer<float> logits_;                     // [head_rows_, V]: one run of rows' logits, then their ∂logits
  std::vector<double> ce_terms_, z_terms_;   // [T] (host): the instance's loss row terms, run by run
  BackwardBuffers bw_;
  std::vector<LossSums> per_scratch_;
  std::vector<MoEInstance> moe_inst_;
  std::vector<int64_t> expert_load_;  // [L, E]
  bool debug_unordered_combine_ = false;
  ExpertExchange* ep_ = nullptr;       // set_expert_exchange
  ExpertExchange* ep_now_ = nullptr;   // ep_ during forward_backward and idle_pass, else nullptr
  // What an expert owner keeps of layer l from forward to backward: the rows each source sent each expert
  // ([n_ep, E]), their total over the owned experts, and the owned experts' gate and up [rows, h].
  struct OwnedExperts {
    std::vector<int64_t> counts;
    int64_t rows = 0;
    Buffer<float> eg, eu;
  };
  std::vector<OwnedExperts> owned_;           // [n_layers]
  Buffer<float> ep_x_, ep_y_, ep_a_, ep_g_, ep_u_;  // the owner's scratch, grown as needed
  ThreadPool* pool_ = nullptr;         // set by begin_call; unread since the routing became executor ops
  MoEHostMirrors mirror_;              // rows the expert-parallel exchange and the negative control stage on the host
};

}  // namespace olmoref
