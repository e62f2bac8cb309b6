// train/trainer.h — one training run: batch -> micro-batch forward/backward -> canonical gradient
// reduction -> clipping -> AdamW -> fingerprint and trace record. train/trainer.cpp holds the trainer and its step;
// train/run.cpp where a run starts (resume) and the loop of `olmoref train`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "dist/comm.h"
#include "dist/expert_placement.h"
#include "dist/gradient_owners.h"
#include "dist/layout.h"
#include "dist/state_pieces.h"
#include "dist/unit_gather.h"
#include "golden/state_digest.h"
#include "golden/trace.h"
#include "interop/hf_export.h"
#include "core/instance_tree.h"
#include "model/olmo3.h"
#include "core/parallel.h"
#include "train/batch_source.h"
#include "core/skip_step.h"
#include "train/config.h"

namespace olmoref {

struct StepResult {
  TraceRecord record;
  double seconds = 0.0;
  // Of `seconds`, the parameter digest (golden/state_digest): what the step would take without the fingerprint's
  // Merkle root (the benchmarks report both).
  double digest_seconds = 0.0;
};

// Data-parallel placement of this process (HSDP): dp_shard ranks split the state, dp_replicate
// groups hold copies. Defaults: one process, no MPI.
struct Parallelism {
  int dp_shard = 1, dp_replicate = 1;
  // Expert parallelism (MoE): groups of `ep` consecutive world ranks exchange dispatched rows so that each rank
  // computes only its own experts (moe::ep_experts); 1: every rank runs every expert. Must divide the world size.
  int ep = 1;
  dist::Comm* comm = nullptr;                 // the world; nullptr = single process
  bool debug_float_allreduce = false;         // TEST ONLY negative control (see train_step)
  TreeShape debug_tree_shape = TreeShape::balanced;  // TEST ONLY: microbatch_chain breaks T6 (single process)
  bool debug_moe_unordered_combine = false;  // TEST ONLY: MoE combine in arrival order (moe.h); must change the trace
  // TEST ONLY: context parallelism's chains as per-rank partials added rank after rank (Olmo3::set_debug_cp_partial_sums);
  // must change the trace.
  bool debug_cp_partial_sums = false;
  bool profile_ops = false;  // time every executor op (model/profiled_executor.h); no value changes
  // FSDP (dp_shard > 1): gather the unit the model announces next while it works on this one (dist::UnitGather: over
  // MPI on a thread of its own, where the MPI library allows concurrent collectives; over NCCL into a second unit
  // buffer on a stream of its own); and several ranks on a device executor (cuda, cuda-host): each unit's gradient
  // exchange to its owners under the next unit's backward (dist::OwnerReduction, ExchangeOverlap::on: over MPI on a
  // thread of its own, over NCCL on a side stream). No value changes. `train --no-prefetch` turns both off.
  bool prefetch_units = true;
  bool debug_prefetch_other_unit = false;  // TEST ONLY: every prefetch gathers a unit other than the one asked next
  bool debug_prefetch_no_stream_wait = false;  // TEST ONLY: the prefetch's acquire skips the side-stream wait
  bool debug_exchange_no_wait = false;  // TEST ONLY: the root is read before the last unit's exchange ends
  bool debug_exchange_no_stream_wait = false;  // TEST ONLY: nothing waits for the owners' exchange's side stream
  bool debug_exchange_no_staging_wait = false;  // TEST ONLY: MPI's thread sends before the subtrees reach the host
  bool debug_exchange_no_refill_wait = false;   // TEST ONLY: the backward refills the subtrees' device block unwaited
  // How the FSDP gathers, the owners' gradient exchange, the parameter all-gather, the expert rows and context
  // parallelism's gathers and chains move: staged through the host by MPI, or on the device by NCCL
  // (dist/nccl_comm.h; executor cuda). No value changes. `train --transport`.
  dist::Transport transport = dist::Transport::mpi;
  int debug_nccl_group_ops = 0;  // TEST ONLY: NCCL groups of at most this many operations (0: NCCL's limit)
  int debug_exchange_chunks = 0;  // TEST ONLY: the owners' exchange in this many chunks (0: dist::exchange_chunks)
  // The run takes no step (train --stop-after 0: a resume and nothing more), so check_run_fits weighs only what a
  // resume holds on the host.
  bool no_steps = false;
  // The run's weights come from a checkpoint (a resume, or init.checkpoint) loaded before any is read: every
  // parameter this rank holds is overwritten (or the load throws), so the init is not computed. It is most of a small
  // model's resume, and at 7B over 8 ranks 875 million values of transcendental functions per rank.
  bool weights_from_checkpoint = false;
};

class Trainer {
 public:
  ~Trainer();
  // threads <= 0: all hardware threads.
  Trainer(const TrainConfig& cfg, int threads, std::unique_ptr<BatchSource> source = nullptr,
          Parallelism par = {});

  const TrainConfig& config() const { return cfg_; }
  const Olmo3& model() const { return model_; }
  Executor& executor() { return *ex_; }
  const Executor& executor() const { return *ex_; }
  // The per-op timing table of a run with Parallelism::profile_ops ("" otherwise).
  std::string op_profile() const;
  int64_t step() const { return step_; }          // optimizer steps completed
  int64_t n_params() const { return model_.layout().total; }
  // This rank's shard [layout().lo(), layout().hi()) of the fp32 master parameters (the whole vector in a
  // single-process run), in executor memory.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  // The same on the host: the buffer itself for host-memory executors, else a copy made now.
  const float* host_params();
  // The AdamW moments of this rank's optimizer range [layout().optimizer_lo(), layout().optimizer_hi()).
  std::vector<float> adam_m() const { return dist::host_copy(m_); }
  std::vector<float> adam_v() const { return dist::host_copy(v_); }
  // optim.kind = "skip_step_adamw": the loss and gradient-norm windows and the step count (checkpointed).
  const SkipStepState& skip_state() const { return skip_; }
  const dist::Layout& layout() const { return layout_; }
  dist::Comm& comm() { return *comm_; }
  // Bytes of persistent state this rank holds (params + grad shard + m + v), for the memory figures: the gradient
  // and moments of its optimizer range only; under expert-resident state, of the parameters, only the experts its
  // replicate group runs and its optimizer range (dist/expert_placement.h).
  int64_t state_bytes() const;
  // The same measured: bytes of those buffers resident in host memory (mincore), -1 on a device executor.
  int64_t state_resident_bytes() const;
  // Of bytes_sent, what moved state pieces (expert-resident state only) to the ranks that hash the steps' parameter
  // digests, and to the ranks that write and hash checkpoints (and check them on resume) or run the [eval] backstop.
  uint64_t digest_pieces_sent() const { return digest_pieces_sent_; }
  uint64_t checkpoint_pieces_sent() const { return checkpoint_pieces_sent_; }
  // True when rank r holds every element of its shard's range (always, except expert-resident state).
  bool holds_whole_shard(int r) const {
    return dist::floats_in(placement_.held_parameters(r)) ==
           layout_.end(layout_.shard_index_of(r)) - layout_.begin(layout_.shard_index_of(r));
  }
  // dp_shard = 1 only, collective: the whole parameter vector on rank 0 (empty elsewhere), the pieces rank 0 does
  // not hold coming from the ranks that do (expert-resident state; the [eval] backstop reads every parameter).
  std::vector<float> params_on_rank0();
  // Bytes this rank sent through collectives (world, shard-group and replica communicators).
  uint64_t bytes_sent() const {
    uint64_t nccl = 0;  // nccl_ep_'s are in ep_bytes_sent()
    for (const auto* c : {nccl_world_.get(), nccl_shard_.get(), nccl_replica_.get(), nccl_cp_.get()})
      nccl += c ? c->bytes_sent() : 0;
    return comm_->bytes_sent() + (shard_comm_ ? shard_comm_->bytes_sent() : 0) +
           (replica_comm_ ? replica_comm_->bytes_sent() : 0) + ep_bytes_sent() +
           (cp_comm_ ? cp_comm_->bytes_sent() : 0) + (unit_gather_ ? unit_gather_->prefetch_bytes_sent() : 0) +
           (owners_ && owners_->overlap_comm() ? owners_->overlap_comm()->bytes_sent() : 0) + nccl;
  }
  // The same by operation (each collective's `what`), over the same communicators.
  std::map<std::string, uint64_t> bytes_sent_by_what() const;
  // Of those, the expert-parallel all-to-alls' (0 without expert parallelism).
  uint64_t ep_bytes_sent() const {
    return (ep_comm_ ? ep_comm_->bytes_sent() : 0) + (nccl_ep_ ? nccl_ep_->bytes_sent() : 0);
  }
  // FSDP unit gathers so far: served by a prefetch, and gathered on the spot ({0, 0} without dp_shard > 1).
  std::pair<int64_t, int64_t> unit_gathers() const {
    return unit_gather_ ? std::pair{unit_gather_->prefetch_hits(), unit_gather_->gathers_on_the_spot()}
                        : std::pair<int64_t, int64_t>{0, 0};
  }
  // Several ranks: the most gradient bytes held at once during a step's reduction, and the longest single gradient
  // value held (a tree slot or one exchanged block; never the flat vector's length); -1 in one process.
  int64_t gradient_peak_bytes() const { return owners_ ? 4 * owners_->peak_floats() : -1; }
  int64_t gradient_longest_buffer_bytes() const { return owners_ ? 4 * owners_->longest_buffer() : -1; }
  double gradient_exchange_seconds() const { return owners_ ? owners_->exchange_seconds() : 0.0; }
  int ep() const { return par_.ep; }
  int cp() const { return static_cast<int>(cfg_.train.cp_degree); }
  ThreadPool& pool() { return pool_; }

  // One optimizer step on the next global batch.
  StepResult train_step();

  // Checkpoints (ckpt/checkpoint.h). save writes <root>/stepNNNNNNNN; resume loads a checkpoint
  // directory and continues exactly where it was taken.
  std::string save_checkpoint(const std::string& root);  // collective in a multi-rank run
  struct ResumeOptions {
    bool ignore_fingerprint_mismatch = false;
    bool allow_config_change = false;
    // Test-only negative controls: each leaves part of the state at its fresh-start value, which
    // resume-check must then detect.
    bool skip_moments = false, skip_loader = false, skip_step = false;
    // TEST ONLY (tests/train): forget SkipStepAdamW's windows, as OLMo-core's own resume does (cli/ sets it from
    // OLMOREF_TEST_DROP_SKIP_WINDOWS=1).
    bool drop_skip_windows = false;
  };
  void resume(const std::string& dir, const ResumeOptions& opts);
  // Before the first step of a new run (init.checkpoint, Olmo 3's stage 2): the parameters of checkpoint `dir`, read
  // at this run's layout whatever layout wrote it, every shard and whole-state digest verified; with
  // load_optimizer, also Adam's m and v and the optimizer's step count (the bias correction continues from it, as
  // OLMo-core's per-parameter state["step"] does). Nothing else: the step, tokens, schedule, data loader and
  // SkipStepAdamW's loss windows start fresh (OLMo-core does not save the windows). Collective.
  void init_from_checkpoint(const std::string& dir, bool load_optimizer);
  // Optimizer steps taken before this run's step 1 (init.checkpoint with init.load_optimizer), for plain AdamW's
  // bias correction: step s of this run is AdamW step s + this. 0 for every other run.
  int64_t adam_step_offset() const { return adam_step_offset_; }
  // TEST ONLY (tests/core), single process: every step appends what the optimizer is fed and gives back to
  // DIR (params0.f32, grads.f32, params.f32, steps.jsonl), for OLMo-core's own optimizer to be driven with it.
  void dump_optimizer_to(const std::string& dir) { optim_dump_dir_ = dir; }
  // Replaces the step-0 parameters with what `read` gives for this rank's range of the flat vector (read in 4 MiB
  // blocks, nothing else of it): a run that starts from other weights than the init ([init] hf_dir). Before the
  // first step only.
  void set_initial_params(const FlatReader& read);
  // Before the first step: the batch source continues from this loader state (data.olmo_core_state: where an
  // OLMo-core run's data loader stopped) instead of the start of epoch 1.
  void start_data_at(const nlohmann::json& loader_state);
  int64_t tokens() const { return tokens_; }
  const BatchSource& source() const { return *source_; }
  BatchSource& source_mut() { return *source_; }

  // The step gradient of `batch` at the current parameters (the instance tree, before clipping) into grad
  // (n_params floats); optionally the logits [instances, T, V]. Single process only.
  LossSums compute_gradient(const StepBatch& batch, float* grad, float* logits_out = nullptr);
  // MoE, single process: compute_gradient's expert choices of every layer, [n_layers][instances · T · k] in
  // instance order (parity-dump writes them for the comparison against OLMo-core's router).
  const std::vector<std::vector<int32_t>>& last_routing() const { return routing_choices_; }

 private:
  // Reads this rank's range of checkpoint `dir` (written at any layout) into the parameters and moments, then checks
  // the whole-state digests recomputed from what every rank now holds (collectives: every rank computes all three
  // before any throws). keep_moments: the moments are read and checked, then m_ and v_ get their values back.
  // hint: appended to a refused read's message and to the digest mismatch's (resume's and init.checkpoint's words).
  ckpt::CheckpointMeta load_checked_state(const std::string& dir, const ckpt::CheckpointMeta& expect,
                                          const ckpt::LoadOptions& lo, bool keep_moments, const std::string& hint);
  // What the step's named parts hand on (train_step reads as the loop).
  struct StepLoss;
  struct ClippedGradient;
  struct OptimizerOutcome;
  dist::ShardedState sharded_state();
  // Who computes which instances of a step (core/instance_tree.h: BatchSplit).
  BatchSplit batch_split() const;
  std::vector<LossSums> gradients(const StepBatch& batch);
  std::vector<LossSums> float_allreduce_gradient(const StepBatch& batch);  // TEST ONLY negative control
  StepLoss loss(const std::vector<LossSums>& mine);
  ClippedGradient clip();
  OptimizerOutcome optimizer(int64_t batch_tokens, float ce_loss, const ClippedGradient& g);
  void adamw_update(int64_t step, const std::vector<double>& group_lr);
  float* optimizer_params();      // params_ at this rank's optimizer range
  void gather_updated_params();   // the replicas of my shard exchange the ranges they updated
  std::unique_ptr<dist::NcclComm> make_nccl(dist::Comm& group);  // collective over group
  float skip_step_update(float ce_loss, float norm, const std::vector<double>& group_lr);
  StepResult fingerprint(const StepBatch& batch, const StepLoss& loss, const ClippedGradient& g,
                         const OptimizerOutcome& opt);
  void dump_optim_state(const std::string& name, const Buffer<float>& b) const;  // TEST ONLY
  void dump_optim_step(const OptimizerOutcome& opt, float ce_loss, const ClippedGradient& g) const;  // TEST ONLY
  // Forward/backward of this rank's micro-batches: one process into tree_ (the root is left in slot 0), several
  // ranks round by round into owners_ (each unit's subtrees reduced at their owners as its backward ends);
  // per_instance[i] receives global instance i's loss totals for this rank's instances.
  void compute_local_tree(const StepBatch& batch, std::vector<LossSums>& per_instance, float* logits_out);
  void release_transients();           // frees the gradient buffers of a sharded step
  // The range b is indexed by: params_ the shard's, the gradient and moments the optimizer range (dist::Span).
  dist::Span span_of(const Buffer<float>& b) const;
  // Writes a host copy of b's whole range (span_of(b)) into the parts of b this rank holds.
  void upload_held(Buffer<float>& b, const float* range);
  // The instance tree's root on this rank's optimizer range (several ranks: finished by owners_ during backward).
  void reduce_gradient_to_shard(float* shard_out);

  TrainConfig cfg_;
  ThreadPool pool_;
  std::unique_ptr<Executor> ex_;  // train.executor: every op of the step runs on it
  Olmo3 model_;
  std::unique_ptr<BatchSource> source_;
  Parallelism par_;
  dist::Comm* comm_;
  std::unique_ptr<dist::Comm> shard_comm_;  // ranks of my replicate group (they split the vector)
  std::unique_ptr<dist::Comm> replica_comm_;  // ranks of my shard index, by replicate index (dp_replicate > 1 only)
  std::unique_ptr<dist::Comm> ep_comm_;     // ranks of my expert-parallel group (ep > 1 only)
  std::unique_ptr<dist::NcclComm> nccl_ep_;  // the same ranks by NCCL (Parallelism::transport nccl)
  std::unique_ptr<dist::CommExpertExchange> ep_exchange_;
  // Context parallelism (train.cp_degree > 1): the ranks of my group (cp consecutive world ranks, ordered by rank),
  // which compute parts of the same micro-batches.
  std::unique_ptr<dist::Comm> cp_comm_;
  std::unique_ptr<dist::NcclComm> nccl_cp_;  // the same ranks by NCCL (Parallelism::transport nccl)
  std::unique_ptr<dist::CommContextExchange> cp_exchange_;
  // Parallelism::transport nccl: the world's (the owners' exchange), my replicate group's (the FSDP gathers) and my
  // shard's replicas' (the parameter all-gather), where the run has several of those ranks (and nccl_ep_ above).
  // Declared before what uses them, so they outlive it.
  std::unique_ptr<dist::NcclComm> nccl_world_, nccl_shard_, nccl_replica_;
  dist::Layout layout_;
  dist::StatePlacement placement_;  // which parts of its range a rank holds (all, without expert-resident state)
  uint64_t digest_pieces_sent_ = 0, checkpoint_pieces_sent_ = 0;  // see digest_pieces_sent()
  std::unique_ptr<StateDigest> state_digest_;  // the whole-vector roots of params_, m_ and v_
  // In executor memory: params_ on this rank's shard range, grad_shard_, m_ and v_ on its optimizer range (a part of
  // the shard's: the distributed optimizer). Under expert-resident state params_ is indexed as the whole range but
  // only its held parts (StatePlacement::held_parameters) are ever written (host memory: the rest takes no pages).
  Buffer<float> params_, m_, v_, grad_shard_;
  std::vector<float> host_staging_;             // host_params() of a device executor
  // FSDP: the model's view of the full parameter vector when dp_shard > 1. Virtual memory only: each
  // unit (embedding, block, head) is all-gathered into it just before use and its pages are returned
  // to the OS right after (ParamGate), so a rank never holds more than a unit or two of other ranks'
  // parameters.
  std::unique_ptr<dist::UnitGather> unit_gather_;
  // What forward_backward and idle_pass are given: the whole vector without FSDP; with it nothing, since the model
  // reads only the unit in use (ParamGate::acquire), and a stray read should fault, not read a shard as the vector.
  const float* params_for_model() const { return layout_.dp_shard == 1 ? params_.data() : nullptr; }
  std::vector<ParamGroup> groups_;  // OLMo-core's param groups (core/optim.h)
  std::vector<GroupPiece> pieces_;  // what I hold of my range [lo, hi), cut into tensors, with their groups
  SkipStepState skip_;              // SkipStepAdamW's windows (only used by optim.kind = "skip_step_adamw")
  int64_t adam_step_offset_ = 0;    // plain AdamW: steps taken before this run's first (init_from_checkpoint)
  GradientTree tree_;  // one process: the step's instance tree, at most ceil(log2 N) + 1 full-length partial gradients
  std::unique_ptr<dist::OwnerReduction> owners_;  // several ranks: the tree at the owners, one unit at a time
  std::vector<std::vector<int32_t>> routing_choices_;  // MoE: see last_routing()
  bool capture_choices_ = false;                        // set by compute_gradient only
  std::vector<uint64_t> routing_;  // MoE: each global instance's routing digest of this step (this rank's range)
  // MoE: the step's expert load [L, E] over every rank, and the step routing digest (hex) of every instance's.
  void moe_step_record(TraceRecord& r, const std::vector<uint64_t>& routing);
  void keep_routing(int64_t first, int64_t last);  // instances [first, last) of the model's last forward
  // Where each step's batch came from (the manifest's data_history): extended before every draw; unknown after a
  // resume from a checkpoint that did not record it, or with a batch source that is not the data loader.
  ckpt::DataHistory history_;
  bool history_known_ = true;
  void note_data_position();
  int64_t step_ = 0;
  int64_t tokens_ = 0;
  std::string optim_dump_dir_;  // dump_optimizer_to
};

// TEST ONLY (tests/dist, tests/cli): a rank that dies or hangs just before a step, for the rank-failure tests.
struct FaultInjection {
  int rank = -1;       // -1: none
  int64_t step = -1;   // the step it would have computed
  std::string kind;    // "die" or "hang"
  // "rank:step:die|hang" (cli/ reads it from OLMOREF_TEST_FAULT); throws naming the variable on a malformed spec.
  static FaultInjection parse(const std::string& spec);
};

struct RunOptions {
  std::string out_dir;
  int threads = 0;
  bool quiet = false;
  int64_t stop_after = -1;     // stop (with a checkpoint) after this step; the schedule still spans train.steps
  bool resume = false;         // continue from the newest complete checkpoint in out_dir/checkpoints
  std::string resume_from;     // or from this checkpoint directory
  Trainer::ResumeOptions resume_opts;
  Parallelism parallel;        // dp_shard x dp_replicate; the world comes from mpirun (dist::world)
  double comm_timeout_s = 300; // a rank that does not reach a collective within this aborts the job
  // A resume whose records (trace, audit logs) lack steps before the checkpoint continues anyway, the records
  // beginning again after it (the trace's next record says "records_begin"); without it such a resume is refused.
  bool new_records = false;
  bool report_comm = false;    // print bytes sent per rank per step at the end
  bool no_checkpoint = false;  // benchmarks: write no checkpoint, not even at the end
  // After a resume, print this rank's peak resident memory so far and the bytes it has read (the resume's peak and
  // reads: nothing of the steps has run yet); `--report-memory`.
  bool report_memory = false;
  // Executor cuda: ranks of a node that would drive one GPU are refused unless this is set (`--allow-shared-gpu`,
  // for checks on one card); dist/gpu_map.h.
  bool allow_shared_gpu = false;
  // TEST ONLY controls, set by cli/ alone (from OLMOREF_TEST_FAULT and OLMOREF_TEST_OPTIM_DUMP), never read
  // from the environment below it.
  FaultInjection fault;
  std::string optim_dump_dir;  // Trainer::dump_optimizer_to
  // OLMOREF_TEST_FAKE_GPUS: this many stand-in GPUs per node (identities "fake-gpu-N"), so that the ranks' choice of a
  // device, the sharing check and the manifest's record run under executor cuda-host on a machine without one.
  int fake_gpus = 0;
};

// `olmoref train`: runs to cfg.train.steps writing out_dir/trace.jsonl (one record per step),
// out_dir/manifest.json and checkpoints under out_dir/checkpoints (every checkpoint.interval steps and
// at the end), with progress on stderr. On resume the trace keeps the records up to the checkpoint's
// step and continues after it. Returns the records written by this process.
std::vector<TraceRecord> run_training(const TrainConfig& cfg, const RunOptions& opts);

// Throws, saying how much memory the run needs and what is available, when it cannot fit on `ex`.
// `threads`: the run's worker threads per rank (0 = this machine's cores), which size the checkpoint's frame buffers.
// The host is checked per node: every rank on it (dist::ranks_on_this_node) at the fullest rank's largest phase.
void check_run_fits(const TrainConfig& cfg, const Parallelism& par, const Executor& ex, int threads);

}  // namespace olmoref
