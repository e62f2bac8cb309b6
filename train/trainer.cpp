#include "train/trainer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include <xxhash.h>

#include "golden/digest.h"
#include "ref/gemm.h"
#include "model/init.h"
#include "core/optim.h"
#include "core/executor.h"
#include "model/executors.h"
#include "model/profiled_executor.h"
#include "ckpt/checkpoint.h"
#include "train/eval.h"
#include "train/manifest.h"
#include "interop/olmo_core_data.h"
#include "train/records.h"
#include "train/run_lock.h"
#include "train/weights.h"

namespace olmoref {

class Trainer::UnitGather : public ParamGate {
 public:
  UnitGather(Trainer& t) : t_(t) {
    bytes_ = static_cast<size_t>(t.layout_.total) * sizeof(float);
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cannot reserve address space for the parameter view");
    base_ = static_cast<float*>(p);
    // A device executor reads the units from device memory: they are gathered on the host, then copied into a
    // device view of the whole vector (the state, gradients and moments stay sharded).
    if (!t.ex_->host_memory())
      device_view_.reset(*t.ex_, t.layout_.total, "FSDP parameter view (the units are gathered into it)");
  }
  ~UnitGather() override { ::munmap(base_, bytes_); }
  // What the model reads: the device view, or the host view itself.
  float* base() { return device_view_.size() > 0 ? device_view_.data() : base_; }

  // The unit's range [a, b) gathered within the replicate group by one all-to-all: shard s sends rank q the pieces
  // of its part that q reads (Olmo3::unit_reads: the whole unit, except that under expert parallelism a rank
  // reads only its own experts). Exact pieces, no padding; the pages of experts a rank never reads are never
  // written, so they take no memory.
  void acquire(int unit) override {
    using Ranges = std::vector<std::pair<int64_t, int64_t>>;
    const auto [a, b] = t_.model_.unit_range(unit);
    const dist::Layout& L = t_.layout_;
    const int S = L.dp_shard, me = L.shard_index();
    std::vector<Ranges> reads(static_cast<size_t>(S));
    for (int q = 0; q < S; ++q) {
      const int world_rank = L.replicate_index() * S + q;
      reads[static_cast<size_t>(q)] = t_.model_.unit_reads(unit, t_.par_.ep, world_rank % t_.par_.ep);
    }
    // The pieces of shard s's part of the unit that rank q reads, in order.
    auto pieces = [&](int s, int q) {
      const int64_t lo = std::max(a, L.begin(s)), hi = std::min(b, L.end(s));
      Ranges out;
      for (const auto& [r0, r1] : reads[static_cast<size_t>(q)])
        if (std::max(lo, r0) < std::min(hi, r1)) out.push_back({std::max(lo, r0), std::min(hi, r1)});
      return out;
    };
    std::vector<int64_t> send_counts(static_cast<size_t>(S), 0), recv_counts(static_cast<size_t>(S), 0);
    std::vector<float> send;
    for (int q = 0; q < S; ++q)
      for (const auto& [p0, p1] : pieces(me, q)) {
        const size_t at = send.size();
        send.resize(at + static_cast<size_t>(p1 - p0));
        t_.ex_->to_host(send.data() + at, t_.params_.data() + (p0 - L.lo()), static_cast<size_t>(p1 - p0) * sizeof(float));
        send_counts[static_cast<size_t>(q)] += p1 - p0;
      }
    int64_t total = 0;
    for (int s = 0; s < S; ++s) {
      for (const auto& [p0, p1] : pieces(s, me)) recv_counts[static_cast<size_t>(s)] += p1 - p0;
      total += recv_counts[static_cast<size_t>(s)];
    }
    std::vector<float> recv(static_cast<size_t>(total));
    const float none = 0.0f;
    t_.shard_comm_->alltoallv(send.empty() ? &none : send.data(), send_counts, recv.data(), recv_counts,
                              "gather parameters of a unit");
    const float* next = recv.data();
    for (int s = 0; s < S; ++s)
      for (const auto& [p0, p1] : pieces(s, me)) {
        std::copy(next, next + (p1 - p0), base_ + p0);
        next += p1 - p0;
      }
    if (device_view_.size() > 0)
      for (const auto& [r0, r1] : reads[static_cast<size_t>(me)]) device_view_.upload(base_ + r0, r1 - r0, r0);
  }

  // Returns the unit's whole pages to the OS (pages shared with a neighbouring unit stay).
  void release(int unit) override {
    const auto [a, b] = t_.model_.unit_range(unit);
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t first = (reinterpret_cast<uintptr_t>(base_ + a) + page - 1) / page * page;
    const uintptr_t last = reinterpret_cast<uintptr_t>(base_ + b) / page * page;
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }

 private:
  Trainer& t_;
  float* base_ = nullptr;
  size_t bytes_ = 0;
  Buffer<float> device_view_;
};

// The model's expert exchange over the EP group's communicator.
class Trainer::EpExchange : public ExpertExchange {
 public:
  explicit EpExchange(dist::Comm& c) : c_(c) {}
  int size() const override { return c_.size(); }
  int index() const override { return c_.rank(); }
  void allgather(const int64_t* mine, int64_t n, int64_t* all) override {
    c_.allgather(mine, static_cast<size_t>(n) * sizeof(int64_t), all, "all-gather expert row counts");
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                 const std::vector<int64_t>& recv_counts) override {
    c_.alltoallv(send, send_counts, recv, recv_counts, "all-to-all of expert rows");
  }

 private:
  dist::Comm& c_;
};

namespace {

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return b;
}

// Every expert's rows of each MoE weight tensor (w1, w2, w3: [E·h, d] per layer).
std::vector<dist::ExpertSpan> expert_spans(const ParamLayout& layout, const ModelConfig& m) {
  std::vector<dist::ExpertSpan> out;
  if (!m.moe.enabled()) return out;
  const int64_t per = m.moe.hidden * m.d_model;
  for (const BlockOffsets& o : layout.blocks)
    for (const int64_t w : {o.moe_w1, o.moe_w2, o.moe_w3})
      if (w >= 0)
        for (int64_t e = 0; e < m.moe.n_experts; ++e) out.push_back({w + e * per, w + (e + 1) * per, e});
  return out;
}

}  // namespace

// The state, the instance tree's slots and the model's buffers, estimated before any of them is allocated: a run
// that does not fit is refused saying how much it needs.
void check_run_fits(const TrainConfig& cfg, const Parallelism& par, const Executor& ex) {
  cfg.validate();  // the estimate below assumes a valid shape
  const double n = static_cast<double>(cfg.model.n_params()), shard = std::ceil(n / std::max(1, par.dp_shard));
  const double N = static_cast<double>(cfg.train.global_batch_instances);
  const double slots = std::ceil(std::log2(std::max(1.0, N))) + 1;
  // Parameters and moments: under expert-resident state (host memory) only what the fullest rank holds.
  double held = shard;
  const int world = par.dp_shard * par.dp_replicate;
  if (par.ep > 1 && cfg.model.moe.enabled() && ex.host_memory() && world % par.ep == 0 &&
      par.ep <= cfg.model.moe.n_experts) {
    dist::Layout L;
    L.dp_shard = par.dp_shard, L.dp_replicate = par.dp_replicate, L.total = cfg.model.n_params();
    const dist::StatePlacement P(L, par.ep, cfg.model.moe.n_experts, expert_spans(ParamLayout(cfg.model), cfg.model));
    held = 0;
    for (int r = 0; r < world; ++r) held = std::max(held, static_cast<double>(P.held_floats(r)));
  }
  const double state = 4.0 * (3 * held + shard), tree = slots * n * 4;
  const double view = par.dp_shard > 1 ? n * 4 : 0;  // the gathered units
  const double model = static_cast<double>(olmo3_memory_bytes(cfg.model, cfg.train.micro_batch_instances,
                                                               cfg.train.seq_len, parse_precision(cfg.train.precision),
                                                               cfg.train.executor != "cpu"));
  const double need = state + tree + view + model;
  const int64_t have = ex.memory_available();
  if (have >= 0 && need > static_cast<double>(have))
    throw std::runtime_error(
        "this run needs about " + gib(need) + " of " + (cfg.train.executor == "cuda" ? "GPU" : "host") + " memory (" +
        gib(state) + " parameters, gradient shard and AdamW moments; " + gib(tree) + " instance tree, " +
        std::to_string(static_cast<int>(slots)) + " full gradients; " + gib(model) + " activations and logits" +
        (view > 0 ? "; " + gib(view) + " FSDP parameter view" : "") + ") but " + gib(static_cast<double>(have)) +
        " is available; use a smaller model or train.micro_batch_instances, or more ranks (dp_shard)");
}

namespace {

// The update's pieces (begin relative to lo) cut to the held ranges (absolute): AdamW is elementwise, so cutting a
// tensor into parts changes no bit.
std::vector<GroupPiece> held_pieces(const std::vector<GroupPiece>& pieces, const dist::Ranges& held, int64_t lo) {
  std::vector<GroupPiece> out;
  for (const GroupPiece& q : pieces)
    for (const auto& [a, b] : held) {
      const int64_t x = std::max(q.begin, a - lo), y = std::min(q.begin + q.n, b - lo);
      if (x < y) out.push_back({x, y - x, q.group});
    }
  return out;
}

std::unique_ptr<Executor> make_fitting_executor(const TrainConfig& cfg, const Parallelism& par, ThreadPool* pool) {
  std::unique_ptr<Executor> ex = make_executor(cfg.train.executor, pool);
  check_run_fits(cfg, par, *ex);
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
             ex_.get()),
      source_(std::move(source)),
      par_(par),
      comm_(par.comm ? par.comm : &dist::world()),
      tree_(cfg.train.global_batch_instances, model_.layout().total, *ex_, par.debug_tree_shape,
            cfg.train.micro_batch_instances) {
  cfg_.validate();
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
    ep_exchange_ = std::make_unique<EpExchange>(*ep_comm_);
    model_.set_expert_exchange(ep_exchange_.get());
  }
  placement_ = dist::StatePlacement(layout_, par.ep, cfg_.model.moe.enabled() ? cfg_.model.moe.n_experts : 0,
                                    expert_spans(model_.layout(), cfg_.model));
  const int64_t n = layout_.hi() - layout_.lo();
  if (placement_.drops_any()) {
    params_.reset_untouched(*ex_, n, "fp32 master parameters");
    m_.reset_untouched(*ex_, n, "AdamW first moments");
    v_.reset_untouched(*ex_, n, "AdamW second moments");
  } else {
    params_.reset(*ex_, n, "fp32 master parameters");
    m_.reset(*ex_, n, "AdamW first moments");
    v_.reset(*ex_, n, "AdamW second moments");
  }
  {
    std::vector<float> init(static_cast<size_t>(n));
    init_params_range(cfg_.model, model_.layout(), layout_.lo(), layout_.hi(), init.data());
    upload_held(params_, init.data());
  }
  groups_ = param_groups(cfg_.optim, model_.layout());
  pieces_ = held_pieces(group_pieces(model_.layout(), groups_, layout_.lo(), layout_.hi()),
                        placement_.held(layout_.rank), layout_.lo());
  if (layout_.dp_shard > 1) {
    unit_gather_ = std::make_unique<UnitGather>(*this);
    full_view_ = unit_gather_->base();
    model_.set_param_gate(unit_gather_.get());
  }
}

std::string Trainer::op_profile() const {
  const auto* p = dynamic_cast<const ProfiledExecutor*>(ex_.get());
  return p ? p->report() : "";
}

int64_t Trainer::state_bytes() const {
  // Device executors allocate the whole range (the parts not held are never written, but they are allocated).
  const int64_t held = ex_->host_memory() ? placement_.held_floats(layout_.rank) : params_.size();
  return static_cast<int64_t>((3 * held + grad_shard_.size()) * static_cast<int64_t>(sizeof(float)));
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

void Trainer::upload_held(Buffer<float>& b, const float* shard) {
  const int64_t lo = layout_.lo();
  for (const auto& [x, y] : placement_.held(layout_.rank)) b.upload(shard + (x - lo), y - x, x - lo);
}

std::vector<float> Trainer::host_copy(const Buffer<float>& b) {
  std::vector<float> out(static_cast<size_t>(b.size()));
  if (b.size() > 0) b.download(out.data(), b.size());
  return out;
}

const float* Trainer::host_view(const Buffer<float>& b, std::vector<float>& staging) const {
  if (ex_->host_memory()) return b.data();
  staging = host_copy(b);
  return staging.data();
}

std::vector<float> Trainer::params_on_rank0() {
  if (layout_.dp_shard != 1) throw std::logic_error("params_on_rank0: dp_shard 1 only");
  std::vector<dist::Ranges> want(static_cast<size_t>(layout_.world()));
  want[0] = {{0, layout_.total}};
  return collect(params_, want, checkpoint_pieces_sent_);
}

const float* Trainer::host_params() {
  if (!holds_whole_shard(layout_.rank))
    throw std::logic_error("host_params: under expert parallelism this rank holds only the experts its replicate group "
                           "runs, not the whole parameter vector");
  return host_view(params_, host_staging_);
}


void Trainer::release_transients() {
  if (layout_.dp_shard == 1) return;
  // FSDP: outside the step a rank keeps only its shards (parameter units were released as used).
  tree_.release();
}

BatchSplit Trainer::batch_split() const {
  return {cfg_.train.global_batch_instances, cfg_.train.micro_batch_instances, layout_.world()};
}

// This rank's contiguous run of micro-batches, each fed to the instance tree as its instances' leaves
// (docs/canonical/step.md). Whatever the micro-batch size, the tree's adds are the same; only how many
// leaves one forward/backward produces changes.
void Trainer::compute_local_tree(const StepBatch& batch, std::vector<LossSums>& per_instance, float* logits_out) {
  const BatchSplit split = batch_split();
  const int64_t T = cfg_.train.seq_len, V = cfg_.model.vocab_size;
  per_instance.assign(static_cast<size_t>(split.global_instances), LossSums{});
  routing_.assign(static_cast<size_t>(split.global_instances), 0);
  if (layout_.world() == 1 || par_.debug_tree_shape != TreeShape::balanced) {
    tree_.reset();
  } else {
    // Each finished maximal subtree goes straight into the all-to-all's send blocks (block (j, q): subtree q
    // on rank j's shard range, padded to the stride), so the stack never holds more than ceil(log2 N) + 1.
    const auto [i0, i1] = split.instances_of_rank(layout_.rank);
    const int64_t k = static_cast<int64_t>(maximal_subtrees(split.global_instances, i0, i1).size());
    const int64_t stride = layout_.shard_stride();
    const int W = layout_.world();
    send_.assign(static_cast<size_t>(k * stride * W), 0.0f);
    tree_.reset_emitting(i0, i1, [this, k, stride, W](int q, const float* src, int64_t off, int64_t n) {
      for (int j = 0; j < W; ++j) {
        const int s = j % layout_.dp_shard;
        const int64_t a = std::max(off, layout_.begin(s)), b = std::min(off + n, layout_.end(s));
        if (a < b)
          ex_->to_host(send_.data() + (j * k + q) * stride + (a - layout_.begin(s)), src + (a - off),
                       static_cast<size_t>(b - a) * sizeof(float));
      }
    });
  }
  const auto [m0, m1] = split.microbatches_of_rank(layout_.rank);
  const float* p = layout_.dp_shard == 1 ? params_.data() : full_view_;
  for (int64_t m = m0; m < m1; ++m) {
    const auto [a, b] = split.instances_of_microbatch(m);
    tree_.begin_microbatch(a, b - a);
    model_.forward_backward(p, batch.tokens.data() + a * T, b - a, cfg_.targets_per_step(), tree_,
                            per_instance.data() + a, &pool_, logits_out ? logits_out + a * T * V : nullptr);
    keep_routing(a, b);
  }
  join_longer_runs(m1 - m0, p);
}

// Ranks of a shard group gather parameter units together once per forward and once per backward, and the ranks
// of an EP group exchange expert rows once per MoE layer in each. When the runs of micro-batches differ in length,
// the shorter runs join the remaining passes without instances (still serving their experts). With expert
// parallelism every rank of the world makes the longest run's passes, so the two kinds of group never wait on
// each other in a different order.
void Trainer::join_longer_runs(int64_t my_runs, const float* params) {
  const bool ep = par_.ep > 1;
  if (layout_.dp_shard == 1 && !ep) return;
  const BatchSplit split = batch_split();
  int64_t longest = 0;
  for (int j = 0; j < layout_.world(); ++j) {
    const bool peer = ep || j / layout_.dp_shard == layout_.replicate_index();
    const auto [m0, m1] = split.microbatches_of_rank(j);
    if (peer) longest = std::max(longest, m1 - m0);
  }
  for (int64_t i = my_runs; i < longest; ++i) model_.idle_pass(params);
}

// fp64 loss totals of instances [0, N) by the instance tree; lb, rz: the MoE auxiliary sums (empty when dense).
static LossSums tree_loss_sums(const std::vector<double>& ce, const std::vector<double>& z, int64_t n_targets,
                               const std::vector<double>& lb = {}, const std::vector<double>& rz = {}) {
  const int64_t N = static_cast<int64_t>(ce.size());
  LossSums s{tree_sum_range(ce.data(), 0, N), tree_sum_range(z.data(), 0, N), n_targets};
  if (!lb.empty()) s.moe_lb = tree_sum_range(lb.data(), 0, N), s.moe_z = tree_sum_range(rz.data(), 0, N);
  return s;
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

void Trainer::moe_step_record(TraceRecord& r, std::vector<uint64_t> routing) {
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
  std::vector<double> ce(per.size()), z(per.size()), lb(per.size()), rz(per.size());
  int64_t n = 0;
  for (size_t i = 0; i < per.size(); ++i)
    ce[i] = per[i].ce, z[i] = per[i].z, lb[i] = per[i].moe_lb, rz[i] = per[i].moe_z, n += per[i].n_targets;
  return tree_loss_sums(ce, z, n, lb, rz);
}

void Trainer::reduce_gradient_to_shard(float* shard_out) {
  const int W = layout_.world();
  const int64_t lo = layout_.lo(), len = layout_.hi() - lo;
  const BatchSplit split = batch_split();
  const int64_t N = split.global_instances;
  if (W == 1 || par_.debug_tree_shape != TreeShape::balanced) {  // the root is in slot 0
    ex_->copy(shard_out, tree_.slot(0) + lo, static_cast<size_t>(len) * sizeof(float));
    return;
  }
  // Every rank's maximal subtrees are known to all from the layout alone, so block sizes need no exchange.
  std::vector<std::vector<TreeNode>> nodes_of(static_cast<size_t>(W));
  for (int j = 0; j < W; ++j) {
    const auto [a, b] = split.instances_of_rank(j);
    nodes_of[static_cast<size_t>(j)] = maximal_subtrees(N, a, b);
  }
  const std::vector<TreeNode>& mine = nodes_of[static_cast<size_t>(layout_.rank)];
  if (mine != tree_.nodes()) throw std::logic_error("instance tree: this rank's subtrees differ from the layout's");
  // All-to-all: to rank j, my k nodes restricted to j's shard range (each padded to the shard stride, so an
  // aligned layout with one node per rank sends exactly what the rank tree of whole subtrees sent).
  const int64_t stride = layout_.shard_stride();
  const int64_t k = static_cast<int64_t>(mine.size());
  std::vector<int64_t> send_counts(static_cast<size_t>(W)), recv_counts(static_cast<size_t>(W));
  int64_t recv_total = 0;
  for (int j = 0; j < W; ++j) {
    send_counts[static_cast<size_t>(j)] = k * stride;
    recv_counts[static_cast<size_t>(j)] = static_cast<int64_t>(nodes_of[static_cast<size_t>(j)].size()) * stride;
    recv_total += recv_counts[static_cast<size_t>(j)];
  }
  std::vector<float> recv(static_cast<size_t>(recv_total));
  // send_ was filled while the subtrees finished (compute_local_tree).
  comm_->alltoallv(send_.data(), send_counts, recv.data(), recv_counts, "all-to-all gradient subtrees");
  std::vector<float>().swap(send_);
  // The owner finishes the tree on the executor: the same left-to-right plan, fed whole subtrees in rank
  // (= index) order.
  Buffer<float> recv_dev;
  float* received = recv.data();
  if (!ex_->host_memory()) {
    recv_dev.reset(*ex_, recv_total, "received gradient subtrees");
    recv_dev.upload(recv.data(), recv_total);
    received = recv_dev.data();
  }
  TreePlan plan(N);
  std::vector<float*> slot(static_cast<size_t>(plan.max_slots()), nullptr);
  float* next = received;
  for (int j = 0; j < W; ++j)
    for (const TreeNode& node : nodes_of[static_cast<size_t>(j)]) {
      const TreePlan::Step st = plan.feed(node);
      slot[static_cast<size_t>(st.slot)] = next;
      next += stride;
      for (const TreePlan::Merge& mg : st.merges)
        ex_->tree_add(slot[static_cast<size_t>(mg.dst)], slot[static_cast<size_t>(mg.src)], len);
    }
  ex_->copy(shard_out, slot[0], static_cast<size_t>(len) * sizeof(float));
}

std::string Trainer::sharded_digest(const Buffer<float>& state) {
  std::vector<float> staging;
  const float* shard = host_view(state, staging);  // the digest is hashed on the host, chunk by chunk
  const int64_t lo = layout_.lo(), hi = layout_.hi();
  if (layout_.dp_shard == 1) return merkle_digest(shard - lo, hi).hex();  // shard == whole vector
  const int64_t per = layout_.shard_stride() / kDigestChunk;               // chunks per shard
  std::vector<Digest128> mine(static_cast<size_t>(per));
  // An empty shard (more ranks than chunks) owns no chunk.
  const int64_t c0 = lo / kDigestChunk, c1 = hi > lo ? (hi + kDigestChunk - 1) / kDigestChunk : c0;
  // merkle_leaves indexes chunks of the whole vector; give it a pointer as if at element 0.
  const auto leaves = merkle_leaves(shard - lo, hi, c0, c1);
  std::copy(leaves.begin(), leaves.end(), mine.begin());
  std::vector<Digest128> all(static_cast<size_t>(per * layout_.dp_shard));
  shard_comm_->allgather(mine.data(), mine.size() * sizeof(Digest128), all.data(), "all-gather digest leaves");
  const int64_t chunks = (layout_.total + kDigestChunk - 1) / kDigestChunk;
  std::vector<Digest128> ordered;
  for (int s = 0; s < layout_.dp_shard; ++s) {
    const int64_t first = layout_.begin(s) / kDigestChunk;
    for (int64_t c = 0; c < per && first + c < chunks && layout_.begin(s) + c * kDigestChunk < layout_.end(s); ++c)
      ordered.push_back(all[static_cast<size_t>(s * per + c)]);
  }
  return merkle_root(ordered).hex();
}

std::vector<float> Trainer::collect(const Buffer<float>& state, const std::vector<dist::Ranges>& want,
                                   uint64_t& pieces_sent) {
  const int W = layout_.world(), me = layout_.rank;
  const int64_t lo = layout_.lo();
  // Every rank's wanted pieces with who serves each (the rank itself when it holds it): known to all from the layout.
  struct Served {
    dist::StatePlacement::Piece piece;
    int from;
  };
  auto served = [&](int q) {
    std::vector<Served> out;
    const int s = layout_.shard_index_of(q);
    for (const auto& [a, b] : want[static_cast<size_t>(q)])
      for (const dist::StatePlacement::Piece& p : placement_.pieces(a, b))
        out.push_back({p, placement_.holds(q, p.expert) ? q : placement_.source(s, p.expert)});
    return out;
  };
  std::vector<int64_t> send_counts(static_cast<size_t>(W), 0), recv_counts(static_cast<size_t>(W), 0);
  std::vector<float> send;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    for (const Served& x : served(q)) {
      if (x.from != me) continue;
      const int64_t n = x.piece.end - x.piece.begin;
      const size_t at = send.size();
      send.resize(at + static_cast<size_t>(n));
      state.download(send.data() + at, n, x.piece.begin - lo);
      send_counts[static_cast<size_t>(q)] += n;
    }
  }
  const std::vector<Served> mine = served(me);
  for (const Served& x : mine)
    if (x.from != me) recv_counts[static_cast<size_t>(x.from)] += x.piece.end - x.piece.begin;
  std::vector<int64_t> recv_at(static_cast<size_t>(W), 0);
  int64_t recv_total = 0;
  for (int j = 0; j < W; ++j) recv_at[static_cast<size_t>(j)] = recv_total, recv_total += recv_counts[static_cast<size_t>(j)];
  std::vector<float> recv(static_cast<size_t>(recv_total));
  const float none = 0.0f;
  comm_->alltoallv(send.empty() ? &none : send.data(), send_counts, recv.empty() ? nullptr : recv.data(), recv_counts,
                   "all-to-all of state pieces for a digest or checkpoint");
  pieces_sent += send.size() * sizeof(float);
  std::vector<float> out;
  for (const Served& x : mine) {
    const int64_t n = x.piece.end - x.piece.begin;
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n));
    if (x.from == me) {
      state.download(out.data() + at, n, x.piece.begin - lo);
    } else {
      int64_t& next = recv_at[static_cast<size_t>(x.from)];
      std::copy(recv.begin() + next, recv.begin() + next + n, out.begin() + static_cast<std::ptrdiff_t>(at));
      next += n;
    }
  }
  return out;
}

std::string Trainer::state_digest(const Buffer<float>& state, uint64_t& pieces_sent) {
  if (!placement_.drops_any()) return sharded_digest(state);
  static_assert(kDigestChunk == dist::kShardAlign, "digest chunks are the shards' alignment");
  const int W = layout_.world();
  if (digest_chunks_.empty())
    for (int q = 0; q < W; ++q) digest_chunks_.push_back(placement_.hashed_chunks(q));
  const std::vector<std::vector<int64_t>>& chunks_of = digest_chunks_;
  std::vector<dist::Ranges> want(static_cast<size_t>(W));
  size_t widest = 0;
  for (int q = 0; q < W; ++q) {
    for (int64_t c : chunks_of[static_cast<size_t>(q)])
      want[static_cast<size_t>(q)].push_back({c * kDigestChunk, std::min(layout_.total, (c + 1) * kDigestChunk)});
    widest = std::max(widest, chunks_of[static_cast<size_t>(q)].size());
  }
  const std::vector<float> mine = collect(state, want, pieces_sent);
  std::vector<Digest128> leaves(widest);
  const float* next = mine.data();
  const std::vector<int64_t>& my_chunks = chunks_of[static_cast<size_t>(layout_.rank)];
  for (size_t i = 0; i < my_chunks.size(); ++i) {
    const int64_t c = my_chunks[i], n = std::min(layout_.total, (c + 1) * kDigestChunk) - c * kDigestChunk;
    // merkle_leaves indexes chunks of the whole vector; give it a pointer as if at element 0.
    leaves[i] = merkle_leaves(next - c * kDigestChunk, c * kDigestChunk + n, c, c + 1)[0];
    next += n;
  }
  std::vector<Digest128> all(widest * static_cast<size_t>(W));
  comm_->allgather(leaves.data(), leaves.size() * sizeof(Digest128), all.data(), "all-gather digest leaves");
  const int64_t chunks = (layout_.total + kDigestChunk - 1) / kDigestChunk;
  // hashed_chunks gives every chunk to exactly one rank (ref-moe-ep checks it), so this fills every leaf once.
  std::vector<Digest128> ordered(static_cast<size_t>(chunks));
  for (int q = 0; q < W; ++q)
    for (size_t i = 0; i < chunks_of[static_cast<size_t>(q)].size(); ++i)
      ordered[static_cast<size_t>(chunks_of[static_cast<size_t>(q)][i])] = all[static_cast<size_t>(q) * widest + i];
  return merkle_root(ordered).hex();
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

// TEST ONLY: appends the whole (single-process) vector to DIR/name as raw little-endian fp32.
void Trainer::dump_optim_state(const std::string& dir, const std::string& name, const Buffer<float>& b) const {
  if (layout_.world() != 1) throw std::runtime_error("OLMOREF_TEST_OPTIM_DUMP is for single-process runs");
  std::vector<float> h = host_copy(b);
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::app);
  out.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size() * sizeof(float)));
  if (!out) throw std::runtime_error(dir + "/" + name + ": cannot write the optimizer dump");
}

StepResult Trainer::train_step() {
  if (!source_) throw std::logic_error("Trainer has no batch source");
  const auto t0 = std::chrono::steady_clock::now();
  note_data_position();
  const StepBatch batch = source_->next();
  const int W = layout_.world();
  const BatchSplit split = batch_split();
  const int64_t N = split.global_instances;
  const int64_t len = layout_.hi() - layout_.lo();
  if (grad_shard_.size() != len) grad_shard_.reset(*ex_, len, "gradient shard");
  std::vector<LossSums> per;
  if (par_.debug_float_allreduce) {
    // TEST ONLY negative control: what data-parallel trainers usually do. A per-rank fp32 running sum
    // over micro-batches (sequential, not the tree) and a float all-reduce in the library's order.
    // It must break layout invariance (tests/dist).
    const int64_t n = model_.layout().total, T = cfg_.train.seq_len;
    std::vector<float> acc(static_cast<size_t>(n), 0.0f);
    per.assign(static_cast<size_t>(N), LossSums{});
    const auto [m0, m1] = split.microbatches_of_rank(layout_.rank);
    const float* p = layout_.dp_shard == 1 ? params_.data() : full_view_;
    for (int64_t m = m0; m < m1; ++m) {
      const auto [a, b] = split.instances_of_microbatch(m);
      GradientTree mtree(b - a, n, *ex_);
      mtree.begin_microbatch(0, b - a);
      model_.forward_backward(p, batch.tokens.data() + a * T, b - a, cfg_.targets_per_step(), mtree, per.data() + a,
                              &pool_);
      keep_routing(a, b);
      for (int64_t i = 0; i < n; ++i) acc[i] += mtree.slot(0)[i];
    }
    join_longer_runs(m1 - m0, p);
    comm_->float_allreduce_sum_unordered(acc.data(), static_cast<size_t>(n), "negative-control allreduce");
    std::copy(acc.begin() + layout_.lo(), acc.begin() + layout_.hi(), grad_shard_.data());
  } else {
    compute_local_tree(batch, per, nullptr);
    reduce_gradient_to_shard(grad_shard_.data());
  }
  // Loss totals: every instance's exact fp64 values reach every rank, then the instance tree adds them.
  // MoE adds the two auxiliary sums and the routing digest (its 64 bits carried in a double's storage).
  const bool moe = cfg_.model.moe.enabled();
  const int fields = moe ? 5 : 2;
  std::vector<double> ce(static_cast<size_t>(N)), z(static_cast<size_t>(N)), lb, rz;
  if (moe) lb.resize(static_cast<size_t>(N)), rz.resize(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    ce[i] = per[i].ce, z[i] = per[i].z;
    if (moe) lb[i] = per[i].moe_lb, rz[i] = per[i].moe_z;
  }
  std::vector<uint64_t> routing = routing_;
  if (W > 1) {
    int64_t widest = 0;
    for (int j = 0; j < W; ++j) {
      const auto [a, b] = split.instances_of_rank(j);
      widest = std::max(widest, b - a);
    }
    const auto [i0, i1] = split.instances_of_rank(layout_.rank);
    std::vector<double> mine(static_cast<size_t>(fields * widest), 0.0), all(static_cast<size_t>(fields * widest * W));
    for (int64_t i = i0; i < i1; ++i) {
      double* m = mine.data() + fields * (i - i0);
      m[0] = ce[i], m[1] = z[i];
      if (moe) m[2] = lb[i], m[3] = rz[i], std::memcpy(&m[4], &routing[static_cast<size_t>(i)], sizeof(uint64_t));
    }
    comm_->allgather(mine.data(), mine.size() * sizeof(double), all.data(), "all-gather per-instance loss totals");
    for (int j = 0; j < W; ++j) {
      const auto [a, b] = split.instances_of_rank(j);
      for (int64_t i = a; i < b; ++i) {
        const double* m = all.data() + fields * (j * widest + i - a);
        ce[i] = m[0], z[i] = m[1];
        if (moe) lb[i] = m[2], rz[i] = m[3], std::memcpy(&routing[static_cast<size_t>(i)], &m[4], sizeof(uint64_t));
      }
    }
  }
  const LossSums sums = tree_loss_sums(ce, z, cfg_.targets_per_step(), lb, rz);
  // Gradient norm: per-chunk Σg² of my range, exchanged within the shard group, added in chunk order.
  const int64_t chunks = (layout_.total + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  {
    // Shards start on chunk boundaries (the stride is a whole number of chunks; an empty shard owns no chunk), so
    // the shard's own chunks are chunks of the flat vector.
    const int64_t per = layout_.shard_stride() / kNormChunk;
    if (len > 0 && (layout_.lo() % kNormChunk != 0 || (len + kNormChunk - 1) / kNormChunk > per))
      throw std::logic_error("gradient norm: the shard is not a whole run of norm chunks");
    std::vector<double> mine(static_cast<size_t>(per), 0.0);
    ex_->grad_norm_chunks(grad_shard_.data(), len, mine.data());
    std::vector<double> all(static_cast<size_t>(per * layout_.dp_shard));
    shard_comm_->allgather(mine.data(), mine.size() * sizeof(double), all.data(), "all-gather norm partials");
    for (int s = 0; s < layout_.dp_shard; ++s)
      for (int64_t c = 0; c < per; ++c) {
        const int64_t global = layout_.begin(s) / kNormChunk + c;
        if (global < chunks && layout_.begin(s) + c * kNormChunk < layout_.end(s)) part[global] = all[s * per + c];
      }
  }
  double total = 0.0;
  for (double x : part) total += x;
  const double norm = std::sqrt(total);
  const float clip = clip_coefficient(norm, cfg_.optim.max_grad_norm);
  if (clip != 1.0f) ex_->scale(grad_shard_.data(), clip, len);
  // Megatron's num-zeros: zero elements of the clipped gradient, my shard's count summed over the shard group
  // (replicas hold the same shard, so they are not counted twice). Integers: the layout cannot change the sum.
  int64_t num_zeros = ex_->count_zeros(grad_shard_.data(), len);
  if (layout_.dp_shard > 1) {
    std::vector<int64_t> every(static_cast<size_t>(layout_.dp_shard));
    shard_comm_->allgather(&num_zeros, sizeof num_zeros, every.data(), "all-gather zero counts");
    num_zeros = 0;
    for (int64_t z : every) num_zeros += z;
  }
  const int64_t step = step_ + 1;
  const double n_targets = static_cast<double>(cfg_.targets_per_step());
  const float ce_loss = static_cast<float>(sums.ce / n_targets);
  // OLMo-core's Scheduler.set_lr on every group before the update: steps, or tokens including this batch's.
  const int64_t batch_tokens = static_cast<int64_t>(batch.tokens.size());
  const SchedulePosition pos = schedule_position(cfg_.schedule, step, cfg_.train.steps, tokens_ + batch_tokens, batch_tokens);
  const double lr = schedule_get_lr(cfg_.schedule, cfg_.optim.lr, pos.current, pos.t_max);
  std::vector<double> group_lr(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g)
    group_lr[g] = schedule_get_lr(cfg_.schedule, groups_[g].lr, pos.current, pos.t_max);
  // TEST ONLY (tests/optim): OLMOREF_TEST_OPTIM_DUMP=DIR records what the optimizer is fed, for OLMo-core's own
  // optimizer to be driven with it. Nothing else reads it.
  const char* dump_dir = std::getenv("OLMOREF_TEST_OPTIM_DUMP");
  if (dump_dir && step == 1) dump_optim_state(dump_dir, "params0.f32", params_);
  int skipped = -1;
  if (!cfg_.optim.skip_step()) {
    std::vector<elem::AdamWScalars> adam;
    std::vector<float> decay;
    for (size_t g = 0; g < groups_.size(); ++g) {
      adam.push_back(adamw_scalars(cfg_.optim, step, group_lr[g]));
      decay.push_back(adamw_group_decay(group_lr[g], groups_[g].weight_decay));
    }
    for (const GroupPiece& q : pieces_)
      ex_->adamw(adam[q.group], decay[q.group], grad_shard_.data() + q.begin, params_.data() + q.begin,
                 m_.data() + q.begin, v_.data() + q.begin, q.n);
  } else {
    // SkipStepAdamW: the decision from the global CE and the pre-clip norm (the same on every rank), then OLMo-core's
    // foreach update with the step factor in its scalars. The arithmetic runs on the host (core/skip_step.h); a device
    // executor's state makes the round trip until the executor has the op.
    const float sf = skip_step_observe(cfg_.optim, skip_, ce_loss, static_cast<float>(norm));
    std::vector<elem::SkipStepScalars> sc;
    for (size_t g = 0; g < groups_.size(); ++g)
      sc.push_back(skip_step_scalars(cfg_.optim, group_lr[g], groups_[g].weight_decay, skip_.step, sf));
    std::vector<float> hg, hp, hm, hv;
    float* g_host = const_cast<float*>(host_view(grad_shard_, hg));
    float* p_host = const_cast<float*>(host_view(params_, hp));
    float* m_host = const_cast<float*>(host_view(m_, hm));
    float* v_host = const_cast<float*>(host_view(v_, hv));
    for (const GroupPiece& q : pieces_)
      skip_step_elements(sc[q.group], g_host + q.begin, p_host + q.begin, m_host + q.begin, v_host + q.begin, q.n, &pool_);
    if (!ex_->host_memory()) {
      params_.upload(p_host, len);
      m_.upload(m_host, len);
      v_.upload(v_host, len);
    }
    skip_.step = skip_step_next_count(cfg_.optim, skip_.step, sf);
    skipped = sf == 0.0f ? 1 : 0;
  }
  if (dump_dir) {
    dump_optim_state(dump_dir, "grads.f32", grad_shard_);
    dump_optim_state(dump_dir, "params.f32", params_);
    nlohmann::json rec = {{"step", step}, {"ce_hex", bits_hex(ce_loss)}, {"grad_norm_hex", bits_hex(static_cast<float>(norm))},
                          {"clip_hex", bits_hex(clip)}, {"skipped", skipped}, {"current", pos.current}, {"t_max", pos.t_max},
                          {"skip_step_count_hex", bits_hex(skip_.step)}};
    for (double x : group_lr) rec["group_lr_hex"].push_back(bits_hex(x));
    std::ofstream(std::string(dump_dir) + "/steps.jsonl", std::ios::app) << rec.dump() << "\n";
  }
  step_ = step;
  tokens_ += batch_tokens;
  release_transients();

  StepResult out;
  TraceRecord& r = out.record;
  r.step = step;
  r.epoch = batch.epoch;
  // MoE: the auxiliary losses are part of the loss that was differentiated (OLMo-core attaches them to the
  // activations); dense models have zero there, and (ce + z) + 0 + 0 keeps their loss bits.
  r.loss = static_cast<float>((sums.ce + sums.z + sums.moe_lb + sums.moe_z) / n_targets);
  if (moe) {
    r.moe_lb = static_cast<float>(sums.moe_lb / n_targets);
    r.moe_z = static_cast<float>(sums.moe_z / n_targets);
    moe_step_record(r, std::move(routing));
  }
  r.ce = static_cast<float>(sums.ce / n_targets);
  r.z = static_cast<float>(sums.z / n_targets);
  r.grad_norm = static_cast<float>(norm);
  r.clip = clip;
  r.lr = lr;
  r.tokens = tokens_;
  r.num_zeros = num_zeros;
  r.skipped = skipped;
  r.data_digest = hex64(data_digest(batch.tokens.data(), static_cast<int64_t>(batch.tokens.size())));
  r.param_digest = state_digest(params_, digest_pieces_sent_);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string Trainer::save_checkpoint(const std::string& root) {
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
  meta.precision = cfg_.train.precision;
  meta.executor = cfg_.train.executor;
  meta.extra = {{"build", build_facts()}};
  if (cfg_.optim.skip_step()) meta.optimizer_state = skip_.to_json();
  if (history_known_ && !history_.segments.empty()) meta.data_history = history_.to_json();
  std::vector<ckpt::Segment> segments;
  for (const ParamInfo& p : model_.layout().params) segments.push_back({p.name, p.offset, p.numel});
  ckpt::SaveOptions opts;
  opts.zstd_level = static_cast<int>(cfg_.checkpoint.zstd_level);
  opts.zstd_threads = cfg_.checkpoint.zstd_threads > 0 ? static_cast<int>(cfg_.checkpoint.zstd_threads) : pool_.size();
  opts.keep_last = static_cast<int>(cfg_.checkpoint.keep_last);
  // Ranks of replicate group 0 each write their shard in parallel; rank 0 writes the manifest and
  // renames the directory only after every shard is in place (the barrier), so a checkpoint is never
  // marked complete while a shard is missing.
  const bool rank0 = comm_->rank() == 0;
  const std::string tmp = ckpt::begin_save(root, step_, rank0);
  comm_->barrier("checkpoint: temporary directory created");
  std::vector<float> hp, hm, hv;  // device executors: the state comes to the host once, for the write
  const float *p_host = nullptr, *m_host = nullptr, *v_host = nullptr;
  if (placement_.drops_any()) {
    // Expert-resident state: the writers (replicate group 0) receive the experts their group does not hold.
    std::vector<dist::Ranges> whole(static_cast<size_t>(layout_.world()));
    for (int s = 0; s < layout_.dp_shard; ++s) whole[static_cast<size_t>(s)] = {{layout_.begin(s), layout_.end(s)}};
    hp = collect(params_, whole, checkpoint_pieces_sent_), hm = collect(m_, whole, checkpoint_pieces_sent_);
    hv = collect(v_, whole, checkpoint_pieces_sent_);
    p_host = hp.data(), m_host = hm.data(), v_host = hv.data();
  } else {
    p_host = host_view(params_, hp), m_host = host_view(m_, hm), v_host = host_view(v_, hv);
  }
  const ckpt::StateVectors local{layout_.hi() - layout_.lo(), const_cast<float*>(p_host), const_cast<float*>(m_host),
                                 const_cast<float*>(v_host)};
  if (layout_.replicate_index() == 0)
    ckpt::write_shard(tmp, layout_.shard_index(), local, layout_.lo(), layout_.hi(), segments, opts, step_);
  std::vector<float>().swap(hp), std::vector<float>().swap(hm), std::vector<float>().swap(hv);
  const ckpt::StateDigests digests{state_digest(params_, checkpoint_pieces_sent_), state_digest(m_, checkpoint_pieces_sent_),
                                   state_digest(v_, checkpoint_pieces_sent_)};
  comm_->barrier("checkpoint: every shard written");
  std::string dir = root + "/" + ckpt::step_dir_name(step_);
  if (rank0) dir = ckpt::finish_save(root, tmp, meta, layout_.total, digests, opts);
  comm_->barrier("checkpoint: manifest written");
  return dir;
}

void Trainer::start_data_at(const nlohmann::json& loader_state) {
  if (step_ != 0) throw std::logic_error("Trainer::start_data_at after step " + std::to_string(step_));
  if (!source_) throw std::logic_error("Trainer::start_data_at without a batch source");
  source_->restore(loader_state, false);
  history_.seed_from = "data.olmo_core_state";  // the order's seed is that run's, not necessarily data.seed
}

void Trainer::note_data_position() {
  if (!history_known_) return;
  const int64_t B = source_->batches_per_epoch();
  const nlohmann::json st = B > 0 ? source_->state() : nlohmann::json();
  if (B <= 0 || !st.is_object() || !st.contains("epoch")) {
    history_known_ = false;
    return;
  }
  const int64_t e = st.at("epoch").get<int64_t>(), bp = st.at("batches_processed").get<int64_t>();
  const int64_t G = st.at("global_batch_instances").get<int64_t>(), L = st.at("sequence_length").get<int64_t>();
  const uint64_t seed = st.at("seed").get<uint64_t>();
  if (history_.segments.empty()) {
    history_.seed = seed;
    if (history_.seed_from.empty()) history_.seed_from = "data.seed";
  } else if (seed != history_.seed) {
    throw std::logic_error("the data loader's seed changed from " + std::to_string(history_.seed) + " to " +
                           std::to_string(seed) + " during the run");
  }
  if (!history_.segments.empty()) {
    ckpt::DataSegment& last = history_.segments.back();
    if (last.global_batch_instances == G && last.sequence_length == L && last.batches_per_epoch == B &&
        last.end() == std::pair<int64_t, int64_t>{e, bp}) {
      ++last.steps;
      return;
    }
  }
  // A resume that changed the global batch (or the data) continues from here: a new segment.
  ckpt::DataSegment seg;
  seg.steps = 1, seg.global_batch_instances = G, seg.sequence_length = L, seg.batches_per_epoch = B;
  seg.epoch = e, seg.batches_processed = bp;
  history_.segments.push_back(seg);
}

void Trainer::set_initial_params(const float* full) {
  if (step_ != 0) throw std::logic_error("Trainer::set_initial_params after step " + std::to_string(step_));
  upload_held(params_, full + layout_.lo());
}

namespace {
// A resume with --allow-config-change may change the global batch size, as OLMo-core allows: the loader continues
// at tokens_processed // the new batch (data/loader.h rebatched_state). Other sources' states pass unchanged.
nlohmann::json loader_state_for_resume(const nlohmann::json& saved, const TrainConfig& cfg, bool allow_config_change) {
  if (!allow_config_change || !saved.is_object() || !saved.contains("global_batch_instances")) return saved;
  const data::LoaderState s = saved.get<data::LoaderState>();
  if (s.global_batch_instances == cfg.train.global_batch_instances) return saved;
  return nlohmann::json(data::rebatched_state(s, cfg.train.global_batch_instances));
}
}  // namespace

void Trainer::resume(const std::string& dir, const ResumeOptions& opts) {
  ckpt::CheckpointMeta expect;
  expect.model_hash = cfg_.model_hash();
  expect.resume_hash = cfg_.resume_hash();
  expect.dataset_fingerprint = source_ ? source_->fingerprint() : "";
  ckpt::LoadOptions lo;
  lo.ignore_fingerprint_mismatch = opts.ignore_fingerprint_mismatch;
  lo.allow_config_change = opts.allow_config_change;
  const std::vector<float> m_fresh = host_copy(m_), v_fresh = host_copy(v_);
  // Each rank reads only its range, whatever layout (or executor) wrote the checkpoint (resharding).
  const int64_t n = layout_.hi() - layout_.lo();
  std::vector<float> hp(static_cast<size_t>(n)), hm(hp.size()), hv(hp.size());
  const ckpt::StateVectors local{n, hp.data(), hm.data(), hv.data()};
  const ckpt::CheckpointMeta meta = ckpt::load_range(dir, local, layout_.lo(), layout_.hi(), layout_.total, expect, lo);
  upload_held(params_, hp.data());
  upload_held(m_, hm.data());
  upload_held(v_, hv.data());
  std::vector<float>().swap(hp), std::vector<float>().swap(hm), std::vector<float>().swap(hv);
  // The whole-state digests, recomputed from the shards every rank now holds, must match the manifest. Each is a
  // collective, so every rank computes all three before any throws.
  const bool same_p = state_digest(params_, checkpoint_pieces_sent_) == meta.digests.params,
             same_m = state_digest(m_, checkpoint_pieces_sent_) == meta.digests.adam_m,
             same_v = state_digest(v_, checkpoint_pieces_sent_) == meta.digests.adam_v;
  if (!same_p || !same_m || !same_v)
    throw std::runtime_error(dir + "/manifest.json: loaded state does not match the whole-state digests");
  if (opts.skip_moments) {
    upload_held(m_, m_fresh.data());
    upload_held(v_, v_fresh.data());
  }
  if (!opts.skip_step) step_ = meta.step;
  // load_range refused a data_history that contradicts the manifest; a checkpoint without one leaves the steps
  // before it unknown, so this run's checkpoints record none either.
  history_ = meta.data_history.is_object() ? ckpt::DataHistory::from_json(meta.data_history) : ckpt::DataHistory{};
  history_known_ = meta.data_history.is_object() || meta.step == 0;
  if (cfg_.optim.skip_step()) {
    // A checkpoint of a plain AdamW run (a resume with --allow-config-change) took every step and has no windows.
    if (meta.optimizer_state.is_object()) {
      try {
        skip_ = SkipStepState::from_json(meta.optimizer_state);
      } catch (const std::exception& e) {
        throw std::runtime_error(dir + "/manifest.json: " + e.what());
      }
    } else {
      skip_ = SkipStepState{};
      skip_.step = static_cast<float>(meta.step);
    }
    // TEST ONLY negative control (tests/optim): OLMOREF_TEST_DROP_SKIP_WINDOWS=1 forgets the windows, as OLMo-core's
    // own resume does; resume-check must then report the steps that follow as different.
    if (const char* drop = std::getenv("OLMOREF_TEST_DROP_SKIP_WINDOWS"); drop && std::string(drop) == "1") {
      skip_.losses.clear();
      skip_.grad_norms.clear();
    }
  }
  tokens_ = meta.tokens;
  if (source_ && !opts.skip_loader)
    source_->restore(loader_state_for_resume(meta.loader_state, cfg_, opts.allow_config_change),
                     opts.ignore_fingerprint_mismatch);
}


std::vector<TraceRecord> run_training(const TrainConfig& cfg, const RunOptions& opts) {
  namespace fs = std::filesystem;
  const std::string& out_dir = opts.out_dir;
  // Before anything is created or cut: an executor that cannot run here is one line, never a crash mid-run.
  if (const std::string why = executor_unavailable(cfg.train.executor); !why.empty())
    throw std::runtime_error("--executor " + cfg.train.executor + ": " + why);
  check_run_fits(cfg, opts.parallel, *make_executor(cfg.train.executor, nullptr));
  fs::create_directories(out_dir);
  const std::string ckpt_root = out_dir + "/checkpoints";
  const int64_t total = cfg.train.steps;
  const int64_t stop = opts.stop_after >= 0 ? std::min(opts.stop_after, total) : total;
  std::string resume_dir = opts.resume_from;
  // A fresh run into a directory that holds a resumable run would overwrite its trace and, by retention, its
  // checkpoints: refused before anything is touched.
  if (!opts.resume && resume_dir.empty())
    if (const auto newest = ckpt::newest_complete(ckpt_root))
      throw std::runtime_error(out_dir + " already holds a run (checkpoint " + *newest +
                               "): pass --resume to continue it, or choose another --out; to start over, delete " +
                               out_dir + " first");
  if (opts.resume && resume_dir.empty()) {
    const auto newest = ckpt::newest_complete(ckpt_root);
    if (!newest)
      throw std::runtime_error(ckpt_root + ": no complete checkpoint to resume from (run without --resume to start fresh)");
    resume_dir = *newest;
  }
  dist::Comm& comm = opts.parallel.comm ? *opts.parallel.comm : dist::world(opts.comm_timeout_s);
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;  // rank 0 writes the trace and manifest and reports progress
  const RunDirLock run_lock(out_dir, comm);  // one writer per run directory, before anything in it is touched
  const bool quiet = opts.quiet || !lead;
  // One audit log per rank process: each holds the micro-batches that rank computed.
  char audit_name[64];
  std::snprintf(audit_name, sizeof audit_name, world == 1 ? "audit.jsonl" : "audit-rank%05d.jsonl", rank);
  const std::string audit_path = cfg.data.audit ? out_dir + "/" + audit_name : "";
  int64_t records_begin = 0;  // > 0: --new-records, written on the first trace record (docs/formats/trace.md)
  if (!resume_dir.empty()) {
    // Everything the resume will check is checked first (the manifest against this run's config and data, the
    // loader state against the data): a refused resume leaves the run directory as it was.
    std::unique_ptr<BatchSource> probe = make_batch_source(cfg, "", false, world, rank);
    ckpt::CheckpointMeta expect;
    expect.model_hash = cfg.model_hash();
    expect.resume_hash = cfg.resume_hash();
    expect.dataset_fingerprint = probe->fingerprint();
    ckpt::LoadOptions lo;
    lo.ignore_fingerprint_mismatch = opts.resume_opts.ignore_fingerprint_mismatch;
    lo.allow_config_change = opts.resume_opts.allow_config_change;
    const ckpt::CheckpointMeta meta = ckpt::check_resumable(resume_dir, cfg.model.n_params(), expect, lo);
    // The loader keeps the checkpoint's seed (as OLMo-core does): another data.seed, allowed as a config change, would
    // change nothing, and every later manifest would record a config whose seed is not its data order's.
    if (const nlohmann::json& h = meta.data_history;
        h.is_object() && h.value("seed_from", "") == "data.seed" && h.value("seed", cfg.data.seed) != cfg.data.seed)
      throw std::runtime_error("config key 'data.seed' is " + std::to_string(cfg.data.seed) + " but " + resume_dir +
                               "/manifest.json has 'loader_state.seed' " + h.at("seed").dump() + ", the seed of the "
                               "data order a resume continues (the checkpoint's wins): set data.seed = " +
                               h.at("seed").dump() + ", or start a new run for another order");
    if (!opts.resume_opts.skip_loader) {
      try {
        const nlohmann::json st = loader_state_for_resume(meta.loader_state, cfg, opts.resume_opts.allow_config_change);
        probe->restore(st, opts.resume_opts.ignore_fingerprint_mismatch);
        if (lead && !quiet && st != meta.loader_state)
          std::fprintf(stderr, "resume: global batch %lld -> %lld instances: the data order continues at batch %lld of "
                               "epoch %lld (tokens seen // the new batch, as OLMo-core resumes)\n",
                       static_cast<long long>(meta.loader_state.value("global_batch_instances", int64_t{0})),
                       static_cast<long long>(cfg.train.global_batch_instances),
                       static_cast<long long>(st.value("batches_processed", int64_t{0})),
                       static_cast<long long>(st.value("epoch", int64_t{0})));
      } catch (const std::exception& e) {
        throw std::runtime_error(resume_dir + "/manifest.json: loader_state: " + e.what());
      }
    }
    // The records must hold every step up to the checkpoint's, and their step K must be the checkpoint's (records
    // past K, from a run killed after it, are cut below): a resume would otherwise append to records with steps
    // missing, or to another run's, and nothing would say so.
    if (lead) {
      const std::string digest =
          opts.resume_opts.skip_loader ? "" : checkpoint_batch_digest(cfg, meta, opts.resume_opts.ignore_fingerprint_mismatch);
      const RecordsCheck rc = check_run_records(out_dir, resume_dir, meta, cfg.data.audit, digest);
      if (!rc.missing.empty()) {
        std::string what;
        for (const std::string& m : rc.missing) what += "\n  " + m;
        const std::string next = std::to_string(meta.step + 1);
        if (!opts.new_records)
          throw std::runtime_error("cannot resume from " + resume_dir + " into " + out_dir + ": its records lack steps" +
                                   what + "\nrestore them, or pass --new-records to continue with records that begin at "
                                   "step " + next + " (the trace's record of step " + next + " then says so: "
                                   "\"records_begin\":" + next + ")");
        records_begin = meta.step + 1;
        std::fprintf(stderr, "olmoref train: --new-records: the records lack steps%s\nolmoref train: --new-records: the "
                             "records begin again at step %s (trace.jsonl's record of step %s carries "
                             "\"records_begin\":%s)\n", what.c_str(), next.c_str(), next.c_str(), next.c_str());
      }
      if (!cfg.data.audit && !audit_logs(out_dir).empty())
        std::fprintf(stderr, "olmoref train: note: data.audit is off in this run: the audit logs of %s get no records "
                             "after step %lld\n", out_dir.c_str(), static_cast<long long>(meta.step));
    }
    // Records past the checkpoint are rewritten by this run; cut them before any log is reopened.
    if (lead) {
      truncate_step_records(out_dir + "/trace.jsonl", meta.step);
      // Every audit log of the directory, also those of ranks the new layout does not have (a resume at fewer
      // ranks): records past the checkpoint belong to steps this run computes again.
      cut_audit_logs(out_dir, meta);
    }
    comm.barrier("resume: logs cut to the checkpoint");  // before any rank reopens its audit log
  }
  Parallelism par = opts.parallel;
  par.comm = &comm;
  Trainer trainer(cfg, opts.threads, make_batch_source(cfg, audit_path, !resume_dir.empty(), world, rank), par);
  // [init] hf_dir: the run starts from those weights (their SHA-256 is in the config, so in every manifest and in
  // resume_hash); a resume takes the checkpoint's weights instead.
  if (resume_dir.empty() && !cfg.init.hf_dir.empty()) trainer.set_initial_params(initial_weights(cfg).params.data());
  // data.olmo_core_state: the data order continues where that OLMo-core run's loader stopped (seed, epoch and
  // tokens_processed from its checkpoint, checked against OLMo-core's fingerprint of the configured files). The trace
  // still counts this run's steps from 1. A resume takes the checkpoint's loader state instead.
  if (resume_dir.empty() && !cfg.data.olmo_core_state.empty()) {
    const data::FslDataset ds(train_mix(cfg.data), dataset_options(cfg));
    const data::LoaderState s = interop::olmo_core_loader_state(interop::read_olmo_core_checkpoint(cfg.data.olmo_core_state),
                                                                ds, cfg.train.global_batch_instances, cfg.data.pad_id,
                                                                cfg.data.bos_id);
    trainer.start_data_at(nlohmann::json(s));
    if (!quiet)
      std::fprintf(stderr, "data: continuing OLMo-core's order from %s: epoch %lld after %lld batches (%lld tokens)\n",
                   cfg.data.olmo_core_state.c_str(), static_cast<long long>(s.epoch),
                   static_cast<long long>(s.batches_processed), static_cast<long long>(s.tokens_processed));
  }
  if (!resume_dir.empty()) {
    trainer.resume(resume_dir, opts.resume_opts);
    if (!quiet)
      std::fprintf(stderr, "olmoref train: resumed from %s at step %lld\n", resume_dir.c_str(),
                   static_cast<long long>(trainer.step()));
  }
  TraceWriter trace;
  if (lead) {
    write_run_manifest(out_dir + "/manifest.json", cfg, trainer.pool().size(), trainer.layout().dp_shard,
                       trainer.layout().dp_replicate, trainer.ep());
    trace.open(out_dir + "/trace.jsonl", !resume_dir.empty());
  }
  // The memorization backstop (train/eval.h, [eval]): OUT/eval.jsonl, never the trace. It reads the
  // parameters only, so training is the same with or without it; run by rank 0 when it holds them all.
  // Under expert parallelism rank 0 may hold only its own experts: every rank then sends it the rest when due.
  std::unique_ptr<EvalBackstop> backstop;
  const bool eval_gathers = cfg.eval.interval > 0 && trainer.layout().dp_shard == 1 && !trainer.holds_whole_shard(0);
  if (lead && cfg.eval.interval > 0 && trainer.layout().dp_shard == 1)
    backstop = make_eval_backstop(cfg, out_dir, resume_dir.empty() ? -1 : trainer.step(), quiet);
  else if (lead && cfg.eval.interval > 0 && !quiet)
    std::fprintf(stderr, "olmoref train: [eval] backstop not run: it needs the whole parameters on rank 0 (dp_shard 1)\n");
  if (!quiet) {
    std::fprintf(stderr, "olmoref train: %s, %.3fM params, executor %s, steps %lld..%lld of %lld (%lld tokens each), %d thread(s), data %s, out %s\n",
                 cfg.model.name.c_str(), static_cast<double>(trainer.n_params()) / 1e6, cfg.train.executor.c_str(),
                 static_cast<long long>(trainer.step() + 1), static_cast<long long>(stop), static_cast<long long>(total),
                 static_cast<long long>(cfg.train.global_batch_instances * cfg.train.seq_len), trainer.pool().size(),
                 trainer.source().describe().c_str(), out_dir.c_str());
    if (world > 1)
      std::fprintf(stderr, "olmoref train: HSDP dp_shard %d x dp_replicate %d over %s; state per rank %.2f MiB\n",
                   trainer.layout().dp_shard, trainer.layout().dp_replicate, comm.backend().c_str(),
                   static_cast<double>(trainer.state_bytes()) / (1 << 20));
    if (trainer.ep() > 1) {
      const auto [e0, e1] = moe::ep_experts(cfg.model.moe.n_experts, trainer.ep(), rank % trainer.ep());
      std::fprintf(stderr, "olmoref train: expert parallelism over groups of %d ranks; rank 0 runs experts %lld..%lld\n",
                   trainer.ep(), static_cast<long long>(e0), static_cast<long long>(e1 - 1));
    }
  }
  std::vector<TraceRecord> records;
  double elapsed = 0.0;
  int64_t done = 0;
  // Fault injection for the rank-failure tests: OLMOREF_TEST_FAULT="rank:step:die|hang".
  int fault_rank = -1;
  int64_t fault_step = -1;
  std::string fault_kind;
  if (const char* f = std::getenv("OLMOREF_TEST_FAULT")) {
    const std::string spec(f);
    const auto a = spec.find(':'), b = spec.find(':', a + 1);
    fault_rank = std::stoi(spec.substr(0, a));
    fault_step = std::stoll(spec.substr(a + 1, b - a - 1));
    fault_kind = spec.substr(b + 1);
  }
  while (trainer.step() < stop) {
    if (rank == fault_rank && trainer.step() + 1 == fault_step) {
      std::fprintf(stderr, "rank %d: test fault '%s' at step %lld\n", rank, fault_kind.c_str(),
                   static_cast<long long>(fault_step));
      if (fault_kind == "die") ::raise(SIGKILL);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // hang
    }
    const StepResult res = trainer.train_step();
    if (lead && records_begin > 0) {
      TraceRecord first = res.record;
      first.records_begin = records_begin;
      trace.write(first);
      records_begin = 0;
    } else if (lead) {
      trace.write(res.record);
    }
    records.push_back(res.record);
    elapsed += res.seconds;
    ++done;
    const int64_t s = res.record.step;
    if (!quiet && (s % cfg.train.log_every == 0 || s == stop)) {
      const double tps = static_cast<double>(cfg.train.global_batch_instances * cfg.train.seq_len) / res.seconds;
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f  grad_norm %.4f  lr %.3e  %.0f tok/s  %s\n",
                   static_cast<long long>(s), static_cast<long long>(total), res.record.loss, res.record.grad_norm,
                   res.record.lr, tps, res.record.param_digest.substr(0, 12).c_str());
    }
    if (eval_gathers && eval_due(cfg.eval, s)) {
      const std::vector<float> whole = trainer.params_on_rank0();
      if (backstop) backstop->after_step(whole.data(), trainer.pool(), s);
    } else if (backstop && backstop->due(s)) {
      backstop->after_step(trainer.host_params(), trainer.pool(), s);
    }
    const bool periodic = cfg.checkpoint.interval > 0 && s % cfg.checkpoint.interval == 0;
    if ((periodic || s == stop) && !opts.no_checkpoint) {
      trainer.source_mut().flush_audit();
      if (lead) trace.sync();
      const std::string dir = trainer.save_checkpoint(ckpt_root);
      if (!quiet) std::fprintf(stderr, "checkpoint %s\n", dir.c_str());
    }
  }
  if (!quiet && done > 0)
    std::fprintf(stderr, "done: %lld steps in %.1f s (%.0f tok/s); trace %s/trace.jsonl\n", static_cast<long long>(done),
                 elapsed, static_cast<double>(done * cfg.train.global_batch_instances * cfg.train.seq_len) / elapsed,
                 out_dir.c_str());
  if (opts.parallel.profile_ops && lead)
    std::fprintf(stderr, "per-op time over %lld steps (each op timed between device synchronizations):\n%s",
                 static_cast<long long>(done), trainer.op_profile().c_str());
  if (opts.report_comm) {
    // Communication volume per rank per step against a ring all-reduce of the same fp32 gradients.
    const double n = static_cast<double>(trainer.n_params()) * 4.0;
    const double ring = world > 1 ? 2.0 * n * (world - 1) / world : 0.0;
    const double steps = static_cast<double>(std::max<int64_t>(done, 1));
    char ep_part[200] = "", resident[48] = "";  // one write per rank, so the ranks' lines do not interleave
    if (trainer.ep() > 1)
      std::snprintf(ep_part, sizeof ep_part,
                    "; state pieces for step digests %.3f MiB/step, for checkpoints and evals %.3f MiB/step; "
                    "expert all-to-all %.3f MiB/step",
                    static_cast<double>(trainer.digest_pieces_sent()) / steps / (1 << 20),
                    static_cast<double>(trainer.checkpoint_pieces_sent()) / steps / (1 << 20),
                    static_cast<double>(trainer.ep_bytes_sent()) / steps / (1 << 20));
    if (const int64_t r = trainer.state_resident_bytes(); r >= 0)
      std::snprintf(resident, sizeof resident, " (%.2f MiB resident)", static_cast<double>(r) / (1 << 20));
    std::fprintf(stderr, "rank %d: sent %.3f MiB/step (ring all-reduce of the gradients: %.3f MiB), state %.2f MiB%s%s\n",
                 rank, static_cast<double>(trainer.bytes_sent()) / steps / (1 << 20), ring / (1 << 20),
                 static_cast<double>(trainer.state_bytes()) / (1 << 20), resident, ep_part);
  }
  return records;
}

}  // namespace olmoref
