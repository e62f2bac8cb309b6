#include "train/trainer.h"

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include <xxhash.h>

#include "ckpt/sharded_save.h"
#include "core/executor.h"
#include "core/loss_tree.h"
#include "core/optim.h"
#include "golden/digest.h"
#include "model/executors.h"
#include "model/init.h"
#include "model/profiled_executor.h"
#include "train/manifest.h"
#include "train/memory_model.h"

namespace olmoref {

// The fullest rank's peak by the one memory model (train/memory_model.h), before any buffer is allocated: a run
// that does not fit is refused naming its largest part and what would fit.
void check_run_fits(const TrainConfig& cfg, const Parallelism& par, const Executor& ex, int threads) {
  // Every rank assembles the whole global batch's tokens on the host (G x seq_len x 4 bytes) whatever the executor;
  // checked first and in O(1), because the memory model below walks the step's instance tree, O(G): an absurd
  // train.global_batch_instances must be one clear line, not a silent minute or the OOM killer.
  const int64_t G = cfg.train.global_batch_instances, T = cfg.train.seq_len, host = host_memory_available();
  const double batch_bytes = 4.0 * static_cast<double>(G) * static_cast<double>(T);
  if (host >= 0 && batch_bytes > static_cast<double>(host))
    throw std::runtime_error(cfg.in_file(
        "train.global_batch_instances = " + std::to_string(G) + ": one global batch of " + std::to_string(G) + " x " +
        std::to_string(T) + " tokens needs " + gib_text(batch_bytes) + " of host memory on every rank (4 bytes a " +
        "token), but " + gib_text(static_cast<double>(host)) + " is available; at most " +
        std::to_string(static_cast<long long>(static_cast<double>(host) / (4.0 * static_cast<double>(T)))) +
        " instances of seq_len " + std::to_string(T) + " fit. Lower train.global_batch_instances"));
  MemoryPlacement where{par.dp_shard, par.dp_replicate, par.ep, cfg.train.executor};
  where.transport = dist::transport_name(par.transport);
  where.prefetch = par.prefetch_units;
  where.threads = threads;
  // The host, per node: every rank on it at the fullest rank's largest phase (the step, the checkpoint write after
  // it, a resume), whatever the executor.
  const int local = dist::ranks_on_this_node();
  const HostMemory host_need = predict_host_memory(cfg, where);
  const HostPhase& phase = par.no_steps ? host_need.phases[2] : host_need.fullest();
  if (host >= 0 && static_cast<double>(phase.peak()) * local > static_cast<double>(host)) {
    const MemoryPart& big = *std::max_element(phase.parts.begin(), phase.parts.end(),
                                              [](const MemoryPart& a, const MemoryPart& b) { return a.bytes < b.bytes; });
    const int64_t fit = phase.peak() > 0 ? host / phase.peak() : 0;
    throw std::runtime_error(
        "this run needs about " + gib_text(static_cast<double>(phase.peak()) * local) + " of host memory on this node " +
        "at its " + phase.name + " (" + std::to_string(local) + " rank(s) x " +
        gib_text(static_cast<double>(phase.peak())) + ") but " + gib_text(static_cast<double>(host)) +
        " is available; the largest part is the " + big.name + " (" + gib_text(static_cast<double>(big.bytes)) + ": " +
        big.why + "). " +
        (fit >= 1 ? "At most " + std::to_string(fit) + " rank(s) of this run fit on this node: start fewer per node, or "
                    "shard further (--dp-shard)"
                  : "Not one rank fits: shard further (--dp-shard), or use a node with more memory") +
        ". Every part: olmoref config --config FILE --layout " + std::to_string(par.dp_shard) + "x" +
        std::to_string(par.dp_replicate) + " --ranks-per-node " + std::to_string(local) + " --executor " +
        cfg.train.executor);
  }
  if (par.no_steps) return;  // the device holds the state on a resume; its step's buffers are never allocated
  const RankMemory need = predict_rank_memory(cfg, where);
  // On a host executor the per-rank table is the host's, checked above for the node.
  const int64_t have = need.device ? ex.memory_available() : -1;
  if (have < 0 || need.peak() <= have) return;
  const MemoryPart& big = need.largest();
  const std::string fits = memory_alternatives(cfg, where, have);
  throw std::runtime_error(
      "this run needs about " + gib_text(static_cast<double>(need.peak())) + " of " + (need.device ? "GPU" : "host") +
      " memory per rank but " + gib_text(static_cast<double>(have)) + " is available; the largest part is the " +
      big.name + " (" + gib_text(static_cast<double>(big.bytes)) + ": " + big.why + "). " +
      (fits.empty() ? "No smaller micro-batch, recompute or larger dp_shard fits: use a smaller model or a larger device"
                    : "These would fit: " + fits) +
      ". Every part: olmoref config --config FILE --layout " + std::to_string(par.dp_shard) + "x" +
      std::to_string(par.dp_replicate) + (par.ep > 1 ? " --ep " + std::to_string(par.ep) : "") + " --executor " +
      cfg.train.executor);
}

namespace {

std::unique_ptr<Executor> make_fitting_executor(const TrainConfig& cfg, const Parallelism& par, ThreadPool* pool) {
  std::unique_ptr<Executor> ex = make_executor(cfg.train.executor, pool);
  check_run_fits(cfg, par, *ex, pool ? pool->size() : 0);
  if (par.profile_ops) ex = std::make_unique<ProfiledExecutor>(std::move(ex));
  return ex;
}

}  // namespace

Trainer::~Trainer() = default;

Trainer::Trainer(const TrainConfig& cfg, int threads, std::unique_ptr<BatchSource> source, Parallelism par)
    : cfg_(cfg),
      pool_(threads),
      ex_(make_fitting_executor(cfg, par, &pool_)),
      model_(cfg.model, cfg.train.micro_batch_instances, cfg.train.seq_len, parse_precision(cfg.train.precision),
             ex_.get(),
             parse_activation_checkpointing(cfg.train.activation_checkpointing,
                                            cfg.train.activation_checkpointing_block_interval),
             cfg.train.cp_degree),
      source_(std::move(source)),
      par_(par),
      comm_(par.comm ? par.comm : &dist::world()),
      tree_(cfg.train.global_batch_instances, model_.layout().total, *ex_, par.debug_tree_shape,
            cfg.train.micro_batch_instances) {
  cfg_.validate();
  model_.set_z_loss(cfg_.train.z_loss);
  if (cfg_.data.document_masking) model_.set_document_masking(cfg_.data.eos_id);
  model_.set_debug_unordered_combine(par.debug_moe_unordered_combine);
  layout_.dp_shard = par.dp_shard;
  layout_.dp_replicate = par.dp_replicate;
  layout_.rank = comm_->rank();
  layout_.total = model_.layout().total;
  if (layout_.world() != comm_->size())
    throw std::invalid_argument("dp_shard x dp_replicate = " + std::to_string(layout_.world()) + " but " +
                                std::to_string(comm_->size()) + " process(es) were started (mpirun -np must match)");
  layout_.validate();
  batch_split().validate();
  if (par.debug_tree_shape != TreeShape::balanced && layout_.world() != 1)
    throw std::invalid_argument("--debug-tree-shape is a single-process negative control");
  if (!ex_->host_memory() && par.debug_float_allreduce)
    throw std::invalid_argument("--debug-float-allreduce is a negative control for host-memory executors only");
  // Ranks of one replicate group split the vector; the group is ordered by shard index.
  shard_comm_ = comm_->split(layout_.replicate_index(), layout_.shard_index());
  if (par.ep < 1) throw std::invalid_argument("--ep must be >= 1");
  if (par.ep > 1) {
    if (!cfg_.model.moe.enabled())
      throw std::invalid_argument("--ep " + std::to_string(par.ep) + ": expert parallelism needs a mixture-of-experts "
                                  "model (model.moe_experts > 0); drop --ep for a dense model");
    if (layout_.world() % par.ep != 0)
      throw std::invalid_argument("--ep " + std::to_string(par.ep) + " does not divide the " +
                                  std::to_string(layout_.world()) + " ranks (dp_shard x dp_replicate): choose an EP "
                                  "group size that divides the world size");
    if (par.ep > cfg_.model.moe.n_experts)
      throw std::invalid_argument("--ep " + std::to_string(par.ep) + " exceeds model.moe_experts = " +
                                  std::to_string(cfg_.model.moe.n_experts) +
                                  ": every rank of an EP group must own at least one expert");
    // EP groups: consecutive world ranks, ordered by rank.
    ep_comm_ = comm_->split(layout_.rank / par.ep, layout_.rank % par.ep);
    if (par.transport == dist::Transport::nccl) nccl_ep_ = make_nccl(*ep_comm_);
    ep_exchange_ = std::make_unique<dist::CommExpertExchange>(*ep_comm_, nccl_ep_.get());
    model_.set_expert_exchange(ep_exchange_.get());
  }
  if (cp() > 1) {
    if (par.debug_float_allreduce)
      throw std::invalid_argument("--debug-float-allreduce is a negative control of data parallelism alone: run it "
                                  "with train.cp_degree = 1");
    // CP groups: consecutive world ranks, ordered by rank (BatchSplit).
    cp_comm_ = comm_->split(layout_.rank / cp(), layout_.rank % cp());
    if (par.transport == dist::Transport::nccl) nccl_cp_ = make_nccl(*cp_comm_);
    cp_exchange_ = std::make_unique<dist::CommContextExchange>(*cp_comm_, nccl_cp_.get());
    model_.set_context_exchange(cp_exchange_.get());
    model_.set_debug_cp_partial_sums(par.debug_cp_partial_sums);
  } else if (par.debug_cp_partial_sums) {
    throw std::invalid_argument("--debug-cp-partial-sums is a negative control of context parallelism: set --cp > 1");
  }
  if (par.transport == dist::Transport::nccl && layout_.world() > 1) {
    // Collective, in the same order on every rank.
    nccl_world_ = make_nccl(*comm_);
    if (layout_.dp_shard > 1) nccl_shard_ = make_nccl(*shard_comm_);
  }
  if (layout_.world() > 1 && !par.debug_float_allreduce) {
    std::vector<std::pair<int64_t, int64_t>> units;
    for (int u = 0; u < model_.n_units(); ++u) units.push_back(model_.unit_range(u));
    // The overlapped exchange pays where the host mostly waits for a device. Over MPI its thread drives the executor
    // beside the main thread, which only the kernel executors allow (on cpu the step's threads share a pool, and the
    // all-to-all would take a core from them); over NCCL its groups run on a side stream of a kernel executor.
    // --profile-ops's timing wrapper counts one thread's ops and times each op to its end.
    const bool kernel_executor = ex_->name() == "cuda" || ex_->name() == "cuda-host";
    const bool overlap = par.prefetch_units && !par.profile_ops && kernel_executor &&
                         (par.transport == dist::Transport::nccl || dist::concurrent_collectives());
    const bool staging_control = par.debug_exchange_no_staging_wait || par.debug_exchange_no_refill_wait;
    if ((par.debug_exchange_no_wait || par.debug_exchange_no_stream_wait || staging_control) && !overlap)
      throw std::invalid_argument("the --debug-exchange-no-*-wait flags are controls of the owners' overlapped "
                                  "exchange, which runs with several ranks, --executor cuda or cuda-host, without "
                                  "--no-prefetch or --profile-ops");
    if (staging_control && par.transport != dist::Transport::mpi)
      throw std::invalid_argument("--debug-exchange-no-staging-wait and --debug-exchange-no-refill-wait are controls "
                                  "of the MPI transport's copies to the host (NCCL's exchange has none): drop "
                                  "--transport nccl");
    owners_ = std::make_unique<dist::OwnerReduction>(
        *ex_, *comm_, layout_, batch_split(), std::move(units), par.debug_exchange_chunks, nccl_world_.get(),
        !overlap                              ? dist::ExchangeOverlap::off
        : par.debug_exchange_no_wait        ? dist::ExchangeOverlap::no_wait
        : par.debug_exchange_no_stream_wait ? dist::ExchangeOverlap::no_stream_wait
        : par.debug_exchange_no_staging_wait ? dist::ExchangeOverlap::no_staging_wait
        : par.debug_exchange_no_refill_wait ? dist::ExchangeOverlap::no_refill_wait
                                              : dist::ExchangeOverlap::on);
  }
  placement_ = dist::StatePlacement(layout_, par.ep, cfg_.model.moe.enabled() ? cfg_.model.moe.n_experts : 0,
                                    expert_spans(model_.layout(), cfg_.model));
  // The distributed optimizer: the replicas of a shard split its update (dist/layout.h), so the moments cover only
  // this rank's optimizer range, all of it (under expert-resident state too: dist/expert_placement.h).
  const int64_t n = layout_.hi() - layout_.lo(), n_opt = layout_.optimizer_hi() - layout_.optimizer_lo();
  if (placement_.drops_any())
    params_.reset_untouched(*ex_, n, "fp32 master parameters");
  else
    params_.reset(*ex_, n, "fp32 master parameters");
  m_.reset(*ex_, n_opt, "AdamW first moments");
  v_.reset(*ex_, n_opt, "AdamW second moments");
  // The replicas of my shard, ordered by replicate index: they all-gather the parameters each one updated.
  if (layout_.dp_replicate > 1) replica_comm_ = comm_->split(layout_.shard_index(), layout_.replicate_index());
  if (replica_comm_ && par.transport == dist::Transport::nccl)
    nccl_replica_ = make_nccl(*replica_comm_);
  if (!par.weights_from_checkpoint) {
    // The init in blocks of kInitBlock floats, so its host transient is 4 MiB whatever the shard (a whole 7B shard at
    // 8x1 would be 3.6 GiB on every rank).
    constexpr int64_t kInitBlock = int64_t{1} << 20;
    std::vector<float> block(static_cast<size_t>(std::min(n, kInitBlock)));
    const dist::Ranges held = placement_.held_parameters(layout_.rank);
    for (int64_t a = layout_.lo(); a < layout_.hi(); a += kInitBlock) {
      const int64_t b = std::min(layout_.hi(), a + kInitBlock);
      init_params_range(cfg_.model, model_.layout(), a, b, block.data());
      for (const auto& [x, y] : held) {
        const int64_t c = std::max(a, x), d = std::min(b, y);
        if (c < d) params_.upload(block.data() + (c - a), d - c, c - layout_.lo());
      }
    }
  }
  groups_ = param_groups(cfg_.optim, model_.layout());
  pieces_ = group_pieces(model_.layout(), groups_, layout_.optimizer_lo(), layout_.optimizer_hi());
  state_digest_ = std::make_unique<StateDigest>(sharded_state(), &pool_);  // its leaves hashed on the step's threads
  if (layout_.dp_shard > 1) {
    dist::Prefetch prefetch = dist::Prefetch::on;
    if (!par.prefetch_units || (par.transport == dist::Transport::mpi && !dist::concurrent_collectives()))
      prefetch = dist::Prefetch::off;
    else if (par.debug_prefetch_other_unit)
      prefetch = dist::Prefetch::other_unit;
    else if (par.debug_prefetch_no_stream_wait)
      prefetch = dist::Prefetch::no_stream_wait;
    unit_gather_ = std::make_unique<dist::UnitGather>(model_, layout_, par.ep, *ex_, params_, *shard_comm_, prefetch,
                                                      nccl_shard_.get());
    model_.set_param_gate(unit_gather_.get());
  }
}

std::unique_ptr<dist::NcclComm> Trainer::make_nccl(dist::Comm& group) {
  auto c = std::make_unique<dist::NcclComm>(group, *ex_);
  if (par_.debug_nccl_group_ops > 0) c->set_max_group_ops(par_.debug_nccl_group_ops);
  return c;
}

std::string Trainer::op_profile() const {
  const auto* p = dynamic_cast<const ProfiledExecutor*>(ex_.get());
  return p ? p->report() : "";
}

int64_t Trainer::state_bytes() const {
  // Device executors allocate the parameters' whole range (the parts not held are never written, but they are
  // allocated).
  const int64_t params =
      ex_->host_memory() ? dist::floats_in(placement_.held_parameters(layout_.rank)) : params_.size();
  return static_cast<int64_t>((params + m_.size() + v_.size() + grad_shard_.size()) *
                              static_cast<int64_t>(sizeof(float)));
}

int64_t Trainer::state_resident_bytes() const {
  int64_t n = 0;
  for (const Buffer<float>* b : {&params_, &m_, &v_, &grad_shard_}) {
    const int64_t r = b->resident_bytes();
    if (r < 0) return -1;
    n += r;
  }
  return n;
}

dist::Span Trainer::span_of(const Buffer<float>& b) const {
  return &b == &params_ ? dist::Span::shard : dist::Span::optimizer;
}

void Trainer::upload_held(Buffer<float>& b, const float* range) {
  const dist::Span span = span_of(b);
  const int64_t lo = dist::span_begin(layout_, span, layout_.rank), hi = dist::span_end(layout_, span, layout_.rank);
  if (span == dist::Span::optimizer) {
    b.upload(range, hi - lo);
    return;
  }
  for (const auto& [x, y] : placement_.held_parameters(layout_.rank)) b.upload(range + (x - lo), y - x, x - lo);
}

dist::ShardedState Trainer::sharded_state() { return {*ex_, layout_, placement_, *comm_}; }

std::vector<float> Trainer::params_on_rank0() {
  if (layout_.dp_shard != 1) throw std::logic_error("params_on_rank0: dp_shard 1 only");
  std::vector<dist::Ranges> want(static_cast<size_t>(layout_.world()));
  want[0] = {{0, layout_.total}};
  return dist::collect_pieces(sharded_state(), params_, dist::Span::shard, want, checkpoint_pieces_sent_);
}

const float* Trainer::host_params() {
  if (!holds_whole_shard(layout_.rank))
    throw std::logic_error("host_params: under expert parallelism this rank holds only the experts its replicate group "
                           "runs, not the whole parameter vector");
  return dist::host_view(params_, *ex_, host_staging_);
}


void Trainer::release_transients() {
  if (layout_.dp_shard == 1) return;
  // FSDP: outside the step a rank keeps only its shards (parameter units were released as used).
  tree_.release();
  if (owners_) owners_->release();  // the unit gathers' staging went before the optimizer (Trainer::optimizer)
}

BatchSplit Trainer::batch_split() const {
  return {cfg_.train.global_batch_instances, cfg_.train.micro_batch_instances, layout_.world(), cp()};
}

// This rank's micro-batches, each fed to the instance tree as its instances' leaves (docs/canonical/step.md).
// Whatever the micro-batch size, the tree's adds are the same; only how many leaves one forward/backward produces
// changes. Several ranks go round by round (micro-batch m on rank m mod W): every rank makes the same number of
// passes, a rank without a micro-batch in the last round joins its collectives without instances.
void Trainer::compute_local_tree(const StepBatch& batch, std::vector<LossSums>& per_instance, float* logits_out) {
  const BatchSplit split = batch_split();
  const int64_t T = cfg_.train.seq_len, V = cfg_.model.vocab_size;
  per_instance.assign(static_cast<size_t>(split.global_instances), LossSums{});
  routing_.assign(static_cast<size_t>(split.global_instances), 0);
  const float* p = params_for_model();
  if (!owners_) {
    tree_.reset();
    for (int64_t m = 0; m < split.n_microbatches(); ++m) {
      const auto [a, b] = split.instances_of_microbatch(m);
      tree_.begin_microbatch(a, b - a);
      model_.forward_backward(p, batch.tokens.data() + a * T, b - a, cfg_.targets_per_step(), tree_,
                              per_instance.data() + a, &pool_, logits_out ? logits_out + a * T * V : nullptr);
      keep_routing(a, b);
    }
    return;
  }
  owners_->begin_step();
  model_.set_unit_gradient_sink(owners_.get());
  struct SinkScope {
    Olmo3& model;
    ~SinkScope() { model.set_unit_gradient_sink(nullptr); }
  } scope{model_};
  // A context-parallel group's ranks before the last compute their parts of the micro-batch and pass every chain on
  // (Olmo3::leaf_begin): they write no leaf, and the owners see them as idle in the round.
  struct NoLeaves final : GradientLeaves {
    float* leaf(int64_t, int64_t, int64_t) override { throw std::logic_error("a rank without leaves wrote one"); }
    void commit(int64_t, int64_t, int64_t) override { throw std::logic_error("a rank without leaves wrote one"); }
  } no_leaves;
  for (int64_t t = 0; t < split.n_rounds(); ++t) {
    GradientLeaves* leaves = owners_->begin_round(t);
    const int64_t m = split.group_microbatch_of(layout_.rank, t);
    if (m < 0) {
      model_.idle_pass(p);
      continue;
    }
    const auto [a, b] = split.instances_of_microbatch(m);
    model_.forward_backward(p, batch.tokens.data() + a * T, b - a, cfg_.targets_per_step(),
                            leaves ? *leaves : no_leaves, per_instance.data() + a, &pool_,
                            logits_out ? logits_out + a * T * V : nullptr);
    keep_routing(a, b);
  }
}

void Trainer::keep_routing(int64_t first, int64_t last) {
  if (!cfg_.model.moe.enabled()) return;
  const std::vector<MoEInstance>& mi = model_.moe_instances();
  for (int64_t i = first; i < last; ++i) routing_[static_cast<size_t>(i)] = mi[static_cast<size_t>(i - first)].routing;
  if (capture_choices_) {
    routing_choices_.resize(static_cast<size_t>(cfg_.model.n_layers));
    for (int64_t l = 0; l < cfg_.model.n_layers; ++l) {
      const std::vector<int32_t>& top = model_.routing(l);
      routing_choices_[static_cast<size_t>(l)].insert(routing_choices_[static_cast<size_t>(l)].end(), top.begin(),
                                                      top.end());
    }
  }
}

void Trainer::moe_step_record(TraceRecord& r, const std::vector<uint64_t>& routing) {
  const int64_t L = cfg_.model.n_layers, E = cfg_.model.moe.n_experts;
  std::vector<int64_t> load = model_.take_expert_load();
  const int W = layout_.world();
  if (W > 1) {  // integers: summed in rank order, exactly
    std::vector<int64_t> all(static_cast<size_t>(L * E * W));
    comm_->allgather(load.data(), load.size() * sizeof(int64_t), all.data(), "all-gather expert load");
    std::fill(load.begin(), load.end(), 0);
    for (int j = 0; j < W; ++j)
      for (size_t i = 0; i < load.size(); ++i) load[i] += all[static_cast<size_t>(j) * load.size() + i];
  }
  r.expert_load.assign(static_cast<size_t>(L), {});
  for (int64_t l = 0; l < L; ++l)
    r.expert_load[static_cast<size_t>(l)].assign(load.begin() + l * E, load.begin() + (l + 1) * E);
  r.routing_digest = hex64(XXH3_64bits(routing.data(), routing.size() * sizeof(uint64_t)));
}

LossSums Trainer::compute_gradient(const StepBatch& batch, float* grad, float* logits_out) {
  if (layout_.world() != 1) throw std::logic_error("compute_gradient is single-process only");
  std::vector<LossSums> per;
  routing_choices_.clear();
  capture_choices_ = cfg_.model.moe.enabled() && layout_.world() == 1;
  compute_local_tree(batch, per, logits_out);
  capture_choices_ = false;
  // This gradient is not a step: its tokens stay out of the next step's expert load.
  if (cfg_.model.moe.enabled()) model_.take_expert_load();
  if (grad) ex_->to_host(grad, tree_.slot(0), static_cast<size_t>(layout_.total) * sizeof(float));
  return loss_tree_sums(per);
}

void Trainer::reduce_gradient_to_shard(float* shard_out) {
  if (owners_) {
    owners_->finish(shard_out);
    return;
  }
  // One process: the root is in slot 0.
  const int64_t lo = layout_.optimizer_lo(), len = layout_.optimizer_hi() - lo;
  ex_->copy(shard_out, tree_.slot(0) + lo, static_cast<size_t>(len) * sizeof(float));
}

// ---- The step ----------------------------------------------------------------------------------------------------

// What the step's parts hand on to the next.
struct Trainer::StepLoss {
  LossSums sums;                  // the whole global batch's fp64 totals, by the instance tree
  std::vector<uint64_t> routing;  // MoE: every instance's routing digest [N], in instance order
};

struct Trainer::ClippedGradient {
  double norm = 0.0;      // the global norm before clipping (fp64, chunks in order)
  float clip = 1.0f;      // the coefficient grad_shard_ was scaled by
  int64_t num_zeros = 0;  // Megatron's num-zeros of the clipped gradient, whole vector
};

struct Trainer::OptimizerOutcome {
  int64_t step = 0;  // the 1-based step just taken
  SchedulePosition pos;
  double lr = 0.0;               // the schedule's lr (optim.lr's) at pos
  std::vector<double> group_lr;  // each parameter group's
  int skipped = -1;              // SkipStepAdamW: 1 skipped, 0 taken; -1 under plain AdamW
};

// One optimizer step on the next global batch (docs/canonical/step.md), as the loop reads: each part is a function
// below, in this order, and they meet only in the state they hand on.
StepResult Trainer::train_step() {
  if (!source_) throw std::logic_error("Trainer has no batch source");
  const auto t0 = std::chrono::steady_clock::now();
  note_data_position();
  const StepBatch batch = source_->next();
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  if (grad_shard_.size() != len) grad_shard_.reset(*ex_, len, "gradient shard");
  std::vector<LossSums> mine;
  if (par_.debug_float_allreduce) {
    mine = float_allreduce_gradient(batch);  // TEST ONLY: gradients and reduce the usual, layout-dependent way
  } else {
    mine = gradients(batch);
    reduce_gradient_to_shard(grad_shard_.data());
  }
  const StepLoss step_loss = loss(mine);
  const ClippedGradient g = clip();
  const float ce_loss = static_cast<float>(step_loss.sums.ce / static_cast<double>(cfg_.targets_per_step()));
  const OptimizerOutcome opt = optimizer(static_cast<int64_t>(batch.tokens.size()), ce_loss, g);
  StepResult out = fingerprint(batch, step_loss, g, opt);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// Gradients: this rank's micro-batches forward and backward, each instance a leaf of the instance tree, so that
// how the batch is cut into micro-batches and ranks never changes a bit. Returns the loss totals of this rank's
// instances, indexed by global instance.
std::vector<LossSums> Trainer::gradients(const StepBatch& batch) {
  std::vector<LossSums> per;
  compute_local_tree(batch, per, nullptr);
  return per;
}

// TEST ONLY negative control (--debug-float-allreduce): what data-parallel trainers usually do. A per-rank fp32
// running sum over micro-batches (sequential, not the tree) and a float all-reduce in the library's order, into
// grad_shard_. It must break layout invariance (tests/dist).
std::vector<LossSums> Trainer::float_allreduce_gradient(const StepBatch& batch) {
  const BatchSplit split = batch_split();
  const int64_t n = model_.layout().total, T = cfg_.train.seq_len;
  std::vector<float> acc(static_cast<size_t>(n), 0.0f);
  std::vector<LossSums> per(static_cast<size_t>(split.global_instances));
  routing_.assign(static_cast<size_t>(split.global_instances), 0);
  const float* p = params_for_model();
  for (int64_t t = 0; t < split.n_rounds(); ++t) {
    const int64_t m = split.microbatch_of(layout_.rank, t);
    if (m < 0) {  // the round's collectives (FSDP gathers, expert exchanges) without instances
      model_.idle_pass(p);
      continue;
    }
    const auto [a, b] = split.instances_of_microbatch(m);
    GradientTree mtree(b - a, n, *ex_);
    mtree.begin_microbatch(0, b - a);
    model_.forward_backward(p, batch.tokens.data() + a * T, b - a, cfg_.targets_per_step(), mtree, per.data() + a,
                            &pool_);
    keep_routing(a, b);
    for (int64_t i = 0; i < n; ++i) acc[i] += mtree.slot(0)[i];
  }
  comm_->float_allreduce_sum_unordered(acc.data(), static_cast<size_t>(n), "negative-control allreduce");
  std::copy(acc.begin() + layout_.optimizer_lo(), acc.begin() + layout_.optimizer_hi(), grad_shard_.data());
  return per;
}

namespace {
// One instance's loss totals and routing digest as they travel between ranks: raw bytes of one layout on every
// rank. A dense model's records stop before the MoE fields (they are zero there), so they carry ce and z only.
struct InstanceRecord {
  double ce = 0.0, z = 0.0;
  double moe_lb = 0.0, moe_z = 0.0;
  uint64_t routing = 0;
};
static_assert(sizeof(InstanceRecord) == 5 * sizeof(double), "records are sent as raw bytes: no padding");
constexpr size_t kDenseRecordBytes = offsetof(InstanceRecord, moe_lb);
}  // namespace

// Loss: every instance's exact fp64 totals (and MoE routing digest) reach every rank by one all-gather of records,
// each rank's instances in its order, padded to the most any rank has; then every rank adds them by the instance tree (core/loss_tree.h).
Trainer::StepLoss Trainer::loss(const std::vector<LossSums>& mine) {
  StepLoss out{{}, routing_};
  std::vector<LossSums> every = mine;
  const int W = layout_.world();
  if (W > 1) {
    const BatchSplit split = batch_split();
    std::vector<std::vector<int64_t>> of_rank(static_cast<size_t>(W));
    size_t widest = 0;
    for (int j = 0; j < W; ++j) {
      of_rank[static_cast<size_t>(j)] = split.instances_of_rank(j);
      widest = std::max(widest, of_rank[static_cast<size_t>(j)].size());
    }
    const size_t bytes = cfg_.model.moe.enabled() ? sizeof(InstanceRecord) : kDenseRecordBytes;
    std::vector<unsigned char> send(bytes * widest, 0), all(send.size() * static_cast<size_t>(W));
    const std::vector<int64_t>& own = of_rank[static_cast<size_t>(layout_.rank)];
    for (size_t k = 0; k < own.size(); ++k) {
      const size_t i = static_cast<size_t>(own[k]);
      const LossSums& s = mine[i];
      const InstanceRecord rec{s.ce, s.z, s.moe_lb, s.moe_z, routing_[i]};
      std::memcpy(send.data() + bytes * k, &rec, bytes);
    }
    comm_->allgather(send.data(), send.size(), all.data(), "all-gather per-instance loss totals");
    for (int j = 0; j < W; ++j) {
      const std::vector<int64_t>& theirs = of_rank[static_cast<size_t>(j)];
      for (size_t k = 0; k < theirs.size(); ++k) {
        InstanceRecord rec;
        std::memcpy(&rec, all.data() + bytes * (static_cast<size_t>(j) * widest + k), bytes);
        const size_t i = static_cast<size_t>(theirs[k]);
        LossSums& s = every[i];
        s.ce = rec.ce, s.z = rec.z, s.moe_lb = rec.moe_lb, s.moe_z = rec.moe_z;
        out.routing[i] = rec.routing;
      }
    }
  }
  out.sums = loss_tree_sums(every);
  out.sums.n_targets = cfg_.targets_per_step();  // other ranks' counts do not travel; the step's is the config's
  return out;
}

// Clip: the global norm from every optimizer range's per-chunk Σg², added in chunk order (the single-process formula,
// so any layout gives its bits), then the coefficient that scales the gradient down to optim.max_grad_norm.
Trainer::ClippedGradient Trainer::clip() {
  const int W = layout_.world();
  const int64_t lo = layout_.optimizer_lo(), len = layout_.optimizer_hi() - lo;
  const int64_t chunks = (layout_.total + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  // Optimizer ranges start on chunk boundaries (their stride is a whole number of chunks; an empty range owns no
  // chunk), so the range's own chunks are chunks of the flat vector.
  const int64_t per = layout_.optimizer_stride() / kNormChunk;
  if (len > 0 && (lo % kNormChunk != 0 || (len + kNormChunk - 1) / kNormChunk > per))
    throw std::logic_error("gradient norm: the optimizer range is not a whole run of norm chunks");
  std::vector<double> mine(static_cast<size_t>(per), 0.0);
  ex_->grad_norm_chunks(grad_shard_.data(), len, mine.data());
  std::vector<double> all(static_cast<size_t>(per * W));
  comm_->allgather(mine.data(), mine.size() * sizeof(double), all.data(), "all-gather norm partials");
  for (int r = 0; r < W; ++r)
    for (int64_t c = 0; c < per; ++c) {
      const int64_t at = layout_.optimizer_begin(r) + c * kNormChunk;
      if (at < layout_.optimizer_end(r))
        part[static_cast<size_t>(at / kNormChunk)] = all[static_cast<size_t>(r * per + c)];
    }
  double total = 0.0;
  for (double x : part) total += x;
  ClippedGradient g;
  g.norm = std::sqrt(total);
  g.clip = clip_coefficient(g.norm, cfg_.optim.max_grad_norm);
  if (g.clip != 1.0f) ex_->scale(grad_shard_.data(), g.clip, len);
  // Megatron's num-zeros: zero elements of the clipped gradient, every optimizer range's count summed over the
  // world. Integers: the layout cannot change the sum.
  g.num_zeros = ex_->count_zeros(grad_shard_.data(), len);
  if (W > 1) {
    std::vector<int64_t> every(static_cast<size_t>(W));
    comm_->allgather(&g.num_zeros, sizeof g.num_zeros, every.data(), "all-gather zero counts");
    g.num_zeros = 0;
    for (int64_t z : every) g.num_zeros += z;
  }
  return g;
}

// Optimizer: OLMo-core's Scheduler.set_lr on every group before the update (steps, or tokens including this
// batch's), then AdamW or SkipStepAdamW over the pieces of the state this rank holds. The step is then complete.
Trainer::OptimizerOutcome Trainer::optimizer(int64_t batch_tokens, float ce_loss, const ClippedGradient& g) {
  OptimizerOutcome o;
  o.step = step_ + 1;
  o.pos = schedule_position(cfg_.schedule, o.step, cfg_.train.steps, tokens_ + batch_tokens, batch_tokens);
  o.lr = schedule_get_lr(cfg_.schedule, cfg_.optim.lr, o.pos.current, o.pos.t_max);
  for (const ParamGroup& group : groups_)
    o.group_lr.push_back(schedule_get_lr(cfg_.schedule, group.lr, o.pos.current, o.pos.t_max));
  const bool dump = !optim_dump_dir_.empty();
  if (dump && o.step == 1) dump_optim_state("params0.f32", params_);
  // The step's unit gathers are over: their staging goes before the optimizer's transients come (the memory model
  // counts the larger of the two, never both).
  if (unit_gather_) unit_gather_->release_staging();
  if (!cfg_.optim.skip_step())
    adamw_update(o.step + adam_step_offset_, o.group_lr);
  else
    o.skipped = skip_step_update(ce_loss, static_cast<float>(g.norm), o.group_lr) == 0.0f ? 1 : 0;
  gather_updated_params();
  if (dump) dump_optim_step(o, ce_loss, g);
  step_ = o.step;
  tokens_ += batch_tokens;
  release_transients();
  return o;
}

void Trainer::adamw_update(int64_t step, const std::vector<double>& group_lr) {
  std::vector<elem::AdamWScalars> adam;
  std::vector<float> decay;
  for (size_t g = 0; g < groups_.size(); ++g) {
    adam.push_back(adamw_scalars(cfg_.optim, step, group_lr[g]));
    decay.push_back(adamw_group_decay(group_lr[g], groups_[g].weight_decay));
  }
  float* params = optimizer_params();
  for (const GroupPiece& q : pieces_)
    ex_->adamw(adam[q.group], decay[q.group], grad_shard_.data() + q.begin, params + q.begin, m_.data() + q.begin,
               v_.data() + q.begin, q.n);
}

std::map<std::string, uint64_t> Trainer::bytes_sent_by_what() const {
  std::map<std::string, uint64_t> all;
  for (const dist::Comm* c : {comm_, shard_comm_.get(), replica_comm_.get(), ep_comm_.get(), cp_comm_.get()})
    if (c)
      for (const auto& [what, bytes] : c->bytes_sent_by_what()) all[what] += bytes;
  if (const auto* prefetched = unit_gather_ ? unit_gather_->prefetch_bytes_by_what() : nullptr)
    for (const auto& [what, bytes] : *prefetched) all[what] += bytes;
  if (const dist::Comm* c = owners_ ? owners_->overlap_comm() : nullptr)
    for (const auto& [what, bytes] : c->bytes_sent_by_what()) all[what] += bytes;
  for (const dist::NcclComm* c :
       {nccl_world_.get(), nccl_shard_.get(), nccl_replica_.get(), nccl_ep_.get(), nccl_cp_.get()})
    if (c)
      for (const auto& [what, bytes] : c->bytes_sent_by_what()) all[what] += bytes;
  return all;
}

float* Trainer::optimizer_params() { return params_.data() + (layout_.optimizer_lo() - layout_.lo()); }

// The replicas of a shard each updated their optimizer range of its parameters; they all-gather the ranges back, so
// that every replica holds its shard again for the forward (or FSDP's gathers); under expert-resident state each
// keeps only what it holds. Data movement only. By blocks, so the transient stays (dp_replicate + 1) blocks
// whatever the model's size.
void Trainer::gather_updated_params() {
  if (!replica_comm_) return;
  const int R = layout_.dp_replicate, s = layout_.shard_index(), me = layout_.replicate_index();
  const int64_t lo = layout_.lo(), stride = layout_.optimizer_stride();
  const dist::Ranges held = placement_.held_parameters(layout_.rank);
  const int64_t block = std::min(stride, dist::kParamGatherBlock);
  // My block [block] and every replica's [R][n]: on the host for MPI, in executor memory for NCCL (the same blocks,
  // the same all-gather plan: my block to every replica, myself included).
  StagingVector<float> host_mine(StagingAllocator<float>(*ex_, "updated parameters: my block (sent)"));
  StagingVector<float> host_all(StagingAllocator<float>(*ex_, "updated parameters: every replica's block (received)"));
  Buffer<float> dev_mine, dev_all;
  if (nccl_replica_) {
    dev_mine.reset(*ex_, block, "updated parameters: my block (sent)");
    dev_all.reset(*ex_, block * R, "updated parameters: every replica's block (received)");
  } else {
    host_mine.resize(static_cast<size_t>(block)), host_all.resize(static_cast<size_t>(block * R));
  }
  float* mine = nccl_replica_ ? dev_mine.data() : host_mine.data();
  const float* all = nccl_replica_ ? dev_all.data() : host_all.data();
  dist::ExchangePlan plan(R);
  for (int64_t at = 0; at < stride; at += block) {
    const int64_t n = std::min(block, stride - at);
    const int64_t x0 = layout_.optimizer_lo() + at, x1 = std::min(layout_.optimizer_hi(), x0 + n);
    const size_t bytes = static_cast<size_t>(x1 - x0) * sizeof(float);
    if (nccl_replica_) {
      if (x0 < x1) ex_->copy(mine, params_.data() + (x0 - lo), bytes);
      for (int g = 0; g < R; ++g) {
        plan.send[static_cast<size_t>(g)] = {{0, n}};
        plan.recv[static_cast<size_t>(g)] = {{g * n, n}};
      }
      nccl_replica_->exchange(mine, dev_all.data(), plan, dist::kParamAllGather);
    } else {
      if (x0 < x1) params_.download(mine, x1 - x0, x0 - lo);
      replica_comm_->allgather(mine, static_cast<size_t>(n) * sizeof(float), host_all.data(), dist::kParamAllGather);
    }
    for (int g = 0; g < R; ++g) {
      const int r = layout_.rank_of(s, g);
      const int64_t y0 = layout_.optimizer_begin(r) + at, y1 = std::min(layout_.optimizer_end(r), y0 + n);
      if (g == me) continue;
      for (const auto& [a, b] : held) {
        const int64_t x = std::max(a, y0), y = std::min(b, y1);
        if (x >= y) continue;
        const float* from = all + g * n + (x - y0);
        if (nccl_replica_)
          ex_->copy(params_.data() + (x - lo), from, static_cast<size_t>(y - x) * sizeof(float));
        else
          params_.upload(from, y - x, x - lo);
      }
    }
  }
}

// SkipStepAdamW: the decision from the global CE and the pre-clip norm (the same on every rank), then OLMo-core's
// foreach update with the step factor in its scalars, as the executor's op on the state where it lives (core/skip_step.h
// holds the scalars; the element update is the op's). Returns the step factor (0: skipped).
float Trainer::skip_step_update(float ce_loss, float norm, const std::vector<double>& group_lr) {
  const float sf = skip_step_observe(cfg_.optim, skip_, ce_loss, norm);
  std::vector<elem::SkipStepScalars> sc;
  for (size_t g = 0; g < groups_.size(); ++g)
    sc.push_back(skip_step_scalars(cfg_.optim, group_lr[g], groups_[g].weight_decay, skip_.step, sf));
  float* params = optimizer_params();
  for (const GroupPiece& q : pieces_)
    ex_->skip_step_adamw(sc[q.group], grad_shard_.data() + q.begin, params + q.begin, m_.data() + q.begin,
                         v_.data() + q.begin, q.n);
  skip_.step = skip_step_next_count(cfg_.optim, skip_.step, sf);
  return sf;
}

// Fingerprint: the step's trace record (docs/formats/trace.md), its data digest and the Merkle digest of the
// parameters it left.
StepResult Trainer::fingerprint(const StepBatch& batch, const StepLoss& loss, const ClippedGradient& g,
                                const OptimizerOutcome& opt) {
  const double n_targets = static_cast<double>(cfg_.targets_per_step());
  const LossSums& sums = loss.sums;
  StepResult out;
  TraceRecord& r = out.record;
  r.step = opt.step;
  r.epoch = batch.epoch;
  // MoE: the auxiliary losses are part of the loss that was differentiated (OLMo-core attaches them to the
  // activations); dense models have zero there, and (ce + z) + 0 + 0 keeps their loss bits.
  r.loss = static_cast<float>((sums.ce + sums.z + sums.moe_lb + sums.moe_z) / n_targets);
  if (cfg_.model.moe.enabled()) {
    r.moe_lb = static_cast<float>(sums.moe_lb / n_targets);
    r.moe_z = static_cast<float>(sums.moe_z / n_targets);
    moe_step_record(r, loss.routing);
  }
  r.ce = static_cast<float>(sums.ce / n_targets);
  r.z = static_cast<float>(sums.z / n_targets);
  r.grad_norm = static_cast<float>(g.norm);
  r.clip = g.clip;
  r.lr = opt.lr;
  r.tokens = tokens_;
  r.num_zeros = g.num_zeros;
  r.skipped = opt.skipped;
  r.data_digest = hex64(data_digest(batch.tokens.data(), static_cast<int64_t>(batch.tokens.size())));
  const auto digest_t0 = std::chrono::steady_clock::now();
  r.param_digest = (*state_digest_)(params_, dist::Span::shard, digest_pieces_sent_);
  out.digest_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - digest_t0).count();
  return out;
}

namespace {
template <typename T>
std::string bits_hex(T x) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  uint64_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  char b[17];
  std::snprintf(b, sizeof b, sizeof(T) == 4 ? "%08llx" : "%016llx", static_cast<unsigned long long>(u));
  return b;
}
}  // namespace

// TEST ONLY: appends the whole (single-process) vector to the dump directory's `name` as raw little-endian fp32.
void Trainer::dump_optim_state(const std::string& name, const Buffer<float>& b) const {
  if (layout_.world() != 1) throw std::runtime_error("OLMOREF_TEST_OPTIM_DUMP is for single-process runs");
  std::vector<float> h = dist::host_copy(b);
  std::filesystem::create_directories(optim_dump_dir_);
  std::ofstream out(optim_dump_dir_ + "/" + name, std::ios::binary | std::ios::app);
  out.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size() * sizeof(float)));
  if (!out) throw std::runtime_error(optim_dump_dir_ + "/" + name + ": cannot write the optimizer dump");
}

// TEST ONLY (tests/core): what the optimizer was fed and gave back this step, for OLMo-core's own optimizer.
void Trainer::dump_optim_step(const OptimizerOutcome& opt, float ce_loss, const ClippedGradient& g) const {
  dump_optim_state("grads.f32", grad_shard_);
  dump_optim_state("params.f32", params_);
  nlohmann::json rec = {{"step", opt.step}, {"ce_hex", bits_hex(ce_loss)},
                        {"grad_norm_hex", bits_hex(static_cast<float>(g.norm))}, {"clip_hex", bits_hex(g.clip)},
                        {"skipped", opt.skipped}, {"current", opt.pos.current}, {"t_max", opt.pos.t_max},
                        {"skip_step_count_hex", bits_hex(skip_.step)}};
  for (double x : opt.group_lr) rec["group_lr_hex"].push_back(bits_hex(x));
  std::ofstream(optim_dump_dir_ + "/steps.jsonl", std::ios::app) << rec.dump() << "\n";
}

// ---- Checkpoints ---------------------------------------------------------------------------------------------------

std::string Trainer::save_checkpoint(const std::string& root) {
  // The step's transients were freed (release_transients), but the allocator keeps freed heap pages resident; handed
  // back here, a node's ranks do not hold them through the write (the memory model's write phase counts without them).
  ::malloc_trim(0);
  ckpt::CheckpointMeta meta;
  meta.step = step_;
  meta.tokens = tokens_;
  meta.loader_state = source_ ? source_->state() : nlohmann::json();
  meta.dataset_fingerprint = source_ ? source_->fingerprint() : "";
  meta.config_toml = cfg_.to_toml();
  meta.resume_hash = cfg_.resume_hash();
  meta.model_hash = cfg_.model_hash();
  meta.data_layout = {{"seq_len", cfg_.train.seq_len},
                      {"micro_batch_instances", cfg_.train.micro_batch_instances},
                      {"global_batch_instances", cfg_.train.global_batch_instances},
                      {"dp_shard", layout_.dp_shard},
                      {"dp_replicate", layout_.dp_replicate},
                      {"ep", par_.ep}};
  if (cp() > 1) meta.data_layout["cp"] = cp();
  meta.precision = cfg_.train.precision;
  meta.executor = cfg_.train.executor;
  meta.extra = {{"build", build_facts()}};
  if (cfg_.optim.skip_step()) meta.optimizer_state = skip_.to_json();
  // Plain AdamW's step count is the run's step unless it started from another run's optimizer state; only then is
  // it written, so every other manifest stays as it was.
  else if (adam_step_offset_ != 0) meta.optimizer_state = {{"adamw_step", adam_step_offset_ + step_}};
  if (history_known_ && !history_.segments.empty()) meta.data_history = history_.to_json();
  std::vector<ckpt::Segment> segments;
  for (const ParamInfo& p : model_.layout().params) segments.push_back({p.name, p.offset, p.numel});
  ckpt::SaveOptions opts;
  opts.zstd_level = static_cast<int>(cfg_.checkpoint.zstd_level);
  opts.zstd_threads = cfg_.checkpoint.zstd_threads > 0 ? static_cast<int>(cfg_.checkpoint.zstd_threads) : pool_.size();
  opts.keep_last = static_cast<int>(cfg_.checkpoint.keep_last);
  return ckpt::save_sharded(root, meta, segments, opts, sharded_state(), {params_, m_, v_}, *state_digest_,
                            checkpoint_pieces_sent_);
}

}  // namespace olmoref
