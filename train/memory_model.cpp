// train/memory_model.cpp — the per-rank peak, part by part, from the shapes alone (no buffer is allocated). Each
// part names the code that allocates it; docs/memory.md says how each grows. The parts coexist at the peak (the
// last backward of a step: the state, the tree's slots and a unit's exchange blocks, the model's buffers and one FSDP
// unit), except the two transients, which never overlap: an FSDP unit's gather (during forward and backward) and the
// updated parameters' all-gather among replicas (after the update); the peak takes the larger.
#include "train/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "ckpt/checkpoint.h"
#include "data/mix.h"
#include "data/token_file.h"
#include "train/batch_source.h"

#include "core/bf16.h"
#include "core/instance_tree.h"
#include "core/params.h"
#include "dist/expert_placement.h"
#include "dist/gradient_owners.h"
#include "dist/layout.h"
#include "golden/state_digest.h"
#include "model/olmo3.h"

namespace olmoref {

std::string gib_text(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return b;
}

// GiB, or MiB below one GiB (a small model's parts would all read 0.00 GiB).
std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return gib_text(static_cast<double>(bytes));
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024));
  return b;
}

int64_t RankMemory::peak() const {
  int64_t n = 0;
  for (const MemoryPart& p : parts) n += p.bytes;
  return n;
}

const MemoryPart& RankMemory::largest() const {
  return *std::max_element(parts.begin(), parts.end(),
                           [](const MemoryPart& a, const MemoryPart& b) { return a.bytes < b.bytes; });
}

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

namespace {

constexpr int64_t kF32 = sizeof(float);

// What one rank holds at its peak; the fullest rank is the table's.
struct RankParts {
  int64_t shard_floats = 0, state_floats = 0;  // the parameters' shard range; of it, what is held
  int64_t optimizer_floats = 0;  // the optimizer range: the reduced gradient and each moment
  // The instance tree. One process: `local_slots` full-length slots (GradientTree). Several ranks
  // (dist::OwnerReduction): `local_slots` slots one unit wide, `owner_slots` slots of the optimizer range, and one
  // unit's send and receive blocks.
  int local_slots = 0, owner_slots = 0;
  int64_t local_floats = 0, owner_floats = 0;
  int64_t send_floats = 0, recv_floats = 0;     // the largest unit's all-to-all blocks (host)
  // Of send_floats, under overlap the block the backward fills in the executor's memory (over MPI on a device the
  // other is the host's, which a side stream copies it to: dist::ExchangeOverlap::on).
  int64_t send_device_floats = 0;
  int64_t gradient_floats() const { return local_floats + owner_floats + send_floats + recv_floats; }
  // FSDP: the largest unit's pages; its gather's vectors. These count whole beside the gradient exchange's send and
  // receive blocks (which grow at the first unit exchange and are freed after the step): gathering on the spot, with
  // one round no gather would meet them, but the prefetch (train's default, dist::UnitGather) holds the next unit's
  // gather through this unit's work, its exchange included.
  int64_t unit_floats = 0, gather_floats = 0;
  int64_t param_gather_floats = 0;              // the updated parameters' all-gather among replicas
};

// overlap: the owners' exchange under the next unit's backward (dist::ExchangeOverlap::on: the prefetch on a device
// executor), whose unit keeps its send blocks while the next unit's subtrees fill a second set.
RankParts rank_parts(const TrainConfig& cfg, const dist::Layout& L, const dist::StatePlacement& P, bool host_state,
                     const std::vector<std::pair<int64_t, int64_t>>& units, bool ep, int64_t exchange_chunks,
                     bool overlap) {
  RankParts p;
  const BatchSplit split{cfg.train.global_batch_instances, cfg.train.micro_batch_instances, L.world(),
                         static_cast<int>(cfg.train.cp_degree)};
  split.validate();  // what the trainer refuses, refused here first (check_run_fits runs before it)
  const int64_t N = split.global_instances, stride = L.optimizer_stride();
  const int W = L.world(), S = L.dp_shard;
  p.shard_floats = L.hi() - L.lo();
  p.optimizer_floats = L.optimizer_hi() - L.optimizer_lo();
  // Device executors allocate the whole range; host memory takes pages only for what the rank holds.
  p.state_floats = host_state ? dist::floats_in(P.held_parameters(L.rank)) : p.shard_floats;
  if (L.dp_replicate > 1)
    p.param_gather_floats = (L.dp_replicate + 1) * std::min(stride, dist::kParamGatherBlock);
  if (W == 1) {
    TreePlan plan(N);
    for (int64_t i = 0; i < N; ++i) plan.feed_leaf(i);
    p.local_slots = plan.peak_slots();
    p.local_floats = p.local_slots * L.total;
  } else {
    // dist::OwnerReduction, round by round: my micro-batch's emitting plan (one unit wide), every rank's subtrees
    // fed to the owner plan, and the largest unit's blocks.
    int64_t widest_unit = 0, widest_piece = 0;
    for (const auto& [a, b] : units) {
      widest_unit = std::max(widest_unit, b - a);
      widest_piece = std::max(widest_piece, std::min(b, L.optimizer_hi()) - std::max(a, L.optimizer_lo()));
    }
    TreePlan owner(N);
    int64_t most_sent = 0, most_received = 0;
    for (int64_t t = 0; t < split.n_rounds(); ++t) {
      int64_t received = 0;
      for (int r = 0; r < W; ++r) {
        const int64_t m = split.microbatch_of(r, t);
        if (m < 0) continue;
        const auto [a, b] = split.instances_of_microbatch(m);
        const std::vector<TreeNode> nodes = maximal_subtrees(N, a, b);
        received += static_cast<int64_t>(nodes.size());
        for (const TreeNode& node : nodes) p.owner_slots = std::max(p.owner_slots, owner.feed(node).slot + 1);
        if (r != L.rank) continue;
        most_sent = std::max(most_sent, static_cast<int64_t>(nodes.size()));
        TreePlan local(N, a, b);
        for (int64_t i = a; i < b; ++i) local.feed_leaf(i);
        p.local_slots = std::max(p.local_slots, local.peak_slots());
      }
      most_received = std::max(most_received, received);
    }
    p.local_floats = p.local_slots * widest_unit;
    p.owner_floats = p.owner_slots * p.optimizer_floats;
    p.send_floats = (overlap ? 2 : 1) * most_sent * widest_unit;
    if (overlap) p.send_device_floats = most_sent * widest_unit;
    // dist::OwnerReduction exchanges a unit in chunks of every owner's piece, one all-to-all each.
    p.recv_floats = most_received * ((std::max<int64_t>(0, widest_piece) + exchange_chunks - 1) / exchange_chunks);
  }
  if (S > 1) {
    // dist::UnitGather::acquire: my part of the unit once (under expert parallelism at most once for each of the S
    // ranks, which read different experts) and the whole unit received, then copied into the unit buffer. The staging
    // is made once a step as long as the most sent and the most received over the units (which may be two units).
    int64_t most_mine = 0;
    for (const auto& [a, b] : units) {
      most_mine = std::max(most_mine, std::max<int64_t>(0, std::min(b, L.hi()) - std::max(a, L.lo())));
      p.unit_floats = std::max(p.unit_floats, b - a);
    }
    p.gather_floats = (ep ? S : 1) * most_mine + p.unit_floats;
  }
  return p;
}


std::string send_blocks_why(bool overlap) {
  return overlap ? "a unit's finished subtrees, cut by owner, and the unit's before in flight: 2 x k x largest unit"
                 : "a unit's finished subtrees, cut by owner: k x largest unit";
}
std::string recv_blocks_why() { return "every rank's subtrees on a chunk of my slice of a unit"; }

// The rank whose parts that differ between ranks (state held, slots, exchange blocks, FSDP gathers) weigh most; the
// first of them. `rank` receives its index.
RankParts fullest_rank(const TrainConfig& cfg, dist::Layout L, const dist::StatePlacement& P, bool host_state,
                       const std::vector<std::pair<int64_t, int64_t>>& units, bool ep, bool overlap, int& rank) {
  RankParts fullest;
  int64_t fullest_floats = -1;
  const int64_t chunks = dist::exchange_chunks(L, units);
  for (int r = 0; r < L.world(); ++r) {
    L.rank = r;
    const RankParts p = rank_parts(cfg, L, P, host_state, units, ep, chunks, overlap);
    const int64_t floats = p.state_floats + 3 * p.optimizer_floats + p.gradient_floats() +
                           std::max(p.gather_floats, p.param_gather_floats) + p.unit_floats;
    if (floats > fullest_floats) fullest_floats = floats, fullest = p, rank = r;
  }
  return fullest;
}

// The step's transients never coexist, so the larger counts: an FSDP unit's gather vectors (host) or the updated
// parameters' all-gather blocks (host).
MemoryPart largest_transient(const RankParts& p, bool gpu) {
  const int64_t gather_bytes = gpu ? 0 : kF32 * p.gather_floats;
  const int64_t param_gather_bytes = kF32 * p.param_gather_floats;
  if (gather_bytes >= param_gather_bytes)
    return {"FSDP gather buffers", gather_bytes, "transient: my part of a unit (sent once) and the unit received"};
  return {"parameter all-gather", param_gather_bytes, "transient: the updated parameters' blocks from every replica"};
}

}  // namespace

namespace {

// Everything the tables are computed from, for the fullest rank.
struct Shapes {
  explicit Shapes(const ModelConfig& m) : layout(m) {}
  std::string exec;
  bool gpu = false, device_paths = false, ep = false;
  bool nccl = false;  // MemoryPlacement::transport
  bool prefetch = true;
  bool overlap = false;  // the owners' exchange under the next unit's backward (rank_parts)
  ParamLayout layout;
  dist::Layout L;
  RankParts p;
  int rank = 0;
  ModelMemory mm;
  ActivationCheckpointing ac;
  bool drops_any = false;  // expert-resident state: a writer receives the experts it lacks
  int64_t largest_tensor = 0;
};

Shapes shapes_of(const TrainConfig& cfg, const MemoryPlacement& where) {
  cfg.validate();
  Shapes x(cfg.model);
  x.exec = where.executor.empty() ? cfg.train.executor : where.executor;
  if (x.exec != "cpu" && x.exec != "cuda" && x.exec != "cuda-host")
    throw std::invalid_argument("--executor '" + x.exec + "': must be cpu, cuda or cuda-host");
  if (where.dp_shard < 1 || where.dp_replicate < 1 || where.ep < 1)
    throw std::invalid_argument("--layout and --ep: every factor must be >= 1");
  const ModelConfig& m = cfg.model;
  x.gpu = x.exec == "cuda", x.device_paths = x.exec != "cpu";
  if (where.transport != "mpi" && where.transport != "nccl")
    throw std::invalid_argument("--transport '" + where.transport + "': must be mpi or nccl");
  if (where.transport == "nccl" && !x.device_paths)
    throw std::invalid_argument("--transport nccl moves device memory, and executor " + x.exec +
                                " keeps its tensors in host memory: run it with --executor cuda, or use --transport mpi");
  x.nccl = where.transport == "nccl";
  x.prefetch = where.prefetch;
  x.L.dp_shard = where.dp_shard, x.L.dp_replicate = where.dp_replicate, x.L.total = x.layout.total;
  const int W = x.L.world();
  // An EP group the trainer would refuse (it says why) is taken as none here.
  x.ep = where.ep > 1 && m.moe.enabled() && W % where.ep == 0 && where.ep <= m.moe.n_experts;
  const dist::StatePlacement P(x.L, x.ep ? where.ep : 1, m.moe.enabled() ? m.moe.n_experts : 0,
                               expert_spans(x.layout, m));
  x.drops_any = P.drops_any();
  const auto units = fsdp_unit_ranges(m, x.layout);
  x.overlap = x.prefetch && x.device_paths && W > 1;
  x.p = fullest_rank(cfg, x.L, P, !x.device_paths, units, x.ep, x.overlap, x.rank);
  x.L.rank = x.rank;
  x.ac = parse_activation_checkpointing(cfg.train.activation_checkpointing,
                                       cfg.train.activation_checkpointing_block_interval);
  x.mm = olmo3_memory(m, cfg.train.micro_batch_instances, cfg.train.seq_len, parse_precision(cfg.train.precision),
                      x.device_paths, x.ac, cfg.train.cp_degree);
  for (const ParamInfo& info : x.layout.params) x.largest_tensor = std::max(x.largest_tensor, info.numel);
  return x;
}

int threads_of(const MemoryPlacement& where) {
  return where.threads > 0 ? where.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The step's parts in the executor's memory: the GPU's on cuda (host buffers left out), else the process's.
std::vector<MemoryPart> executor_step_parts(const TrainConfig& cfg, const Shapes& x) {
  const ModelConfig& m = cfg.model;
  const RankParts& p = x.p;
  const dist::Layout& L = x.L;
  const int64_t n = x.layout.total, T = cfg.train.seq_len, R = cfg.train.micro_batch_instances * T;
  const bool gpu = x.gpu, device_paths = x.device_paths, ep = x.ep;
  std::vector<MemoryPart> out;
  auto add = [&](const std::string& name, int64_t bytes, const std::string& why) {
    if (bytes > 0) out.push_back({name, bytes, why});
  };
  const int64_t recomputed = x.ac.recomputed_blocks(m.n_layers);
  std::string recompute = "every block's set (recompute off)";
  if (recomputed == m.n_layers) {
    recompute = "each block's input x [R, d] plus one block's set";
  } else if (recomputed > 0) {
    recompute = "the sets of the " + std::to_string(m.n_layers - recomputed) + " blocks not recomputed, the " +
                std::to_string(recomputed) + " recomputed blocks' inputs x [R, d] and one set they share";
  }
  const std::string held = ep && !device_paths ? " (of the experts, those its group runs or its optimizer range holds)" : "";
  add("parameters", kF32 * p.state_floats, "fp32 master shard: params / dp_shard" + held);
  add("AdamW moments", 2 * kF32 * p.optimizer_floats,
      "m and v of the optimizer range: params / (dp_shard x dp_replicate)");
  add("gradient shard", kF32 * p.optimizer_floats,
      "the reduced gradient of the optimizer range: params / (dp_shard x dp_replicate)");
  if (L.world() == 1) {
    add("gradient stack", kF32 * p.local_floats,
        std::to_string(p.local_slots) + " full-length instance-tree slots (<= ceil(log2 N) + 1)");
  } else {
    add("gradient stack", kF32 * p.local_floats,
        std::to_string(p.local_slots) + " slots of the largest unit (<= ceil(log2 micro-batch) + 1)");
    add("owner tree slots", kF32 * p.owner_floats,
        std::to_string(p.owner_slots) + " slots of the optimizer range (<= ceil(log2 N) + 1): params / W each");
    if (!gpu || x.nccl) {  // in the executor's memory: the host's, or under nccl the device's
      add("unit send blocks", kF32 * p.send_floats, send_blocks_why(x.overlap));
      add("unit receive blocks", kF32 * p.recv_floats, recv_blocks_why());
    } else if (x.overlap) {  // over MPI the block the backward fills; the host holds the rest
      add("unit send blocks", kF32 * p.send_device_floats,
          "a unit's finished subtrees, cut by owner, copied to the host's block under the next unit's backward: k x "
          "largest unit");
    }
  }
  if (L.dp_shard > 1)
    add("FSDP unit buffer", kF32 * p.unit_floats,
        gpu ? "the unit in use on the device (largest unit)" : "the unit in use (largest unit)");
  if (L.dp_shard > 1 && x.prefetch && (x.nccl || device_paths))
    add("FSDP next-unit buffer", kF32 * p.unit_floats,
        std::string(x.nccl ? "nccl's" : "the staged") + " prefetch: the next unit gathered beside (largest unit)");
  if (gpu && x.nccl) {
    // NCCL's own device buffers, one set per communicator the trainer makes (world, replicate group, a shard's
    // replicas, EP and CP groups: train/trainer.cpp), at an estimate no run here has measured.
    const int comms = (L.world() > 1) + (L.dp_shard > 1) + (L.dp_replicate > 1) + (ep ? 1 : 0) +
                      (cfg.train.cp_degree > 1);
    add("NCCL communicators", comms * kNcclCommEstimateBytes,
        std::to_string(comms) + " x 0.5 GiB, an estimate (0.5-0.7 GB each reported on 4-GPU NVLink nodes, NCCL issue "
        "964; test_gpu_smoke --nccl measures one)");
  }
  add("activations", x.mm.activations, "kept for backward: " + recompute + "; x micro-batch x seq");
  add("backward temporaries", x.mm.backward, "one block's gradients [R, d|qd|kd|F]; x micro-batch x seq");
  add("logits", x.mm.logits,
      "one run of " + std::to_string(head_chunk_rows(m.vocab_size, T)) +
          " rows' logits [rows, V] (<= 256 MiB), the final norm's [R, d]");
  // bf16 under FSDP: the working copy is made unit by unit into one unit-sized buffer (Olmo3::use_unit).
  const bool bf16 = cfg.train.precision == "bf16";
  const int64_t working = x.mm.working - (bf16 && L.dp_shard > 1 ? kF32 * (n - p.unit_floats) : 0);
  add("working copies", working,
      "RoPE tables, tokens, loss rows" +
          std::string(bf16 ? (L.dp_shard > 1 ? ", the bf16 copy of the unit in use" : ", the bf16 weights") : ""));
  add("kernel scratch", x.mm.kernel_scratch, "attention rows [blocks in flight, seq], D, per-head dk/dv: linear in seq");
  if (gpu && cfg.data.document_masking)
    add("document boundaries", 3 * 4 * R, "intra-document masking: start, end, RoPE position [R] int32 each, uploaded");
  if (cfg.train.cp_degree > 1) {
    add("context parallelism", x.mm.context_parallel,
        "one layer's whole-instance q, out, dout, dq [micro-batch x seq, qd] and k, v, dk, dv [.., kd], a gradient "
        "chain's partial [V, d]");
    // On the host too, the all-gather's receive [micro-batch x seq, qd] (host memory is the executor's here).
    if (!gpu) add("context parallelism gathers", kF32 * cfg.train.micro_batch_instances * T * m.q_dim(),
                  "every rank's rows of one attention tensor [micro-batch x seq, qd]");
  }
  if (m.moe.enabled()) {
    const int64_t E = m.moe.n_experts, k = m.moe.top_k, S = R * k;
    // LayerActs' host routing of every layer (scores [R, E], lse [R], top and weight [R, k], the plan [S] x 2).
    if (!gpu)
      add("MoE routing (host)", m.n_layers * (kF32 * R * (E + 1 + 2 * k) + 16 * S), "per layer: scores, choices, plan");
    // Olmo3::OwnedExperts: the owned experts' gate and up for every layer, for balanced routing (S rows per rank).
    if (ep)
      add("expert owner buffers", m.n_layers * 2 * kF32 * S * m.moe.hidden,
          "per layer: the owned experts' gate and up (balanced routing)");
  }
  if (!gpu && cfg.eval.interval > 0)
    add("evaluation model",
        olmo3_memory_bytes(m, 1, T, parse_precision(cfg.train.precision), false) + kF32 * (n + T * m.vocab_size),
        "train/eval.h: its own model (micro-batch 1), a full gradient and logits");
  // Under nccl an FSDP gather moves straight into the unit buffer: nothing staged.
  const MemoryPart transient = largest_transient(p, gpu || x.nccl);
  add(transient.name, transient.bytes, transient.why);
  // StateDigest: the optimizer range reaches the host in blocks, one downloading while the other is hashed.
  if (device_paths && !gpu)
    add("digest staging", kF32 * std::min(p.optimizer_floats, 2 * StateDigest::kStreamChunks * kDigestChunk),
        "two blocks of the range being hashed (64 MiB each at most)");
  return out;
}

// What every rank keeps on the host whatever the executor: the data order and the global batch.
void add_data_parts(std::vector<MemoryPart>& out, const TrainConfig& cfg, int64_t dataset_instances) {
  const int64_t G = cfg.train.global_batch_instances, T = cfg.train.seq_len;
  if (dataset_instances > 0)
    out.push_back({"data order", 4 * dataset_instances,
                   "the epoch's instance order, 4 bytes per instance of the dataset (" +
                       std::to_string(dataset_instances) + "), on every rank"});
  out.push_back({"global batch", 4 * G * T + 8 * G, "the step's tokens [G, seq] and instance ids, on every rank"});
  // Olmo3::documents_of: each position's document start, end and RoPE position, int32, for the micro-batch in
  // use (and the evaluation model's one instance), cut on the host.
  if (cfg.data.document_masking) {
    const int64_t rows = cfg.train.micro_batch_instances * T + (cfg.eval.interval > 0 ? T : 0);
    out.push_back({"document boundaries", 3 * 4 * rows,
                   "intra-document masking: start, end, RoPE position [micro-batch x seq] int32 each"});
  }
}

// The frames a checkpoint's writer or reader handles: at most kFrameFloats, no more than the largest tensor.
int64_t frame_bytes(const Shapes& x) { return kF32 * std::min(ckpt::kFrameFloats, x.largest_tensor); }

}  // namespace

int64_t dataset_instances_of(const TrainConfig& cfg) {
  try {
    const data::Mix mix = train_mix(cfg.data);
    const int64_t token_bytes = data::dtype_size(
        cfg.data.dtype == "auto" ? data::dtype_for_vocab(cfg.model.vocab_size) : data::parse_dtype(cfg.data.dtype));
    int64_t n = 0;
    for (const data::MixEntry& e : mix.entries) {
      std::error_code ec;
      const auto bytes = std::filesystem::file_size(e.path, ec);
      if (ec) return -1;
      n += static_cast<int64_t>(bytes) / token_bytes / cfg.train.seq_len;
    }
    return n;
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t HostPhase::peak() const {
  int64_t n = 0;
  for (const MemoryPart& p : parts) n += p.bytes;
  return n;
}

const HostPhase& HostMemory::fullest() const {
  return *std::max_element(phases.begin(), phases.end(),
                           [](const HostPhase& a, const HostPhase& b) { return a.peak() < b.peak(); });
}

HostMemory predict_host_memory(const TrainConfig& cfg, const MemoryPlacement& where) {
  const Shapes x = shapes_of(cfg, where);
  const RankParts& p = x.p;
  const dist::Layout& L = x.L;
  const int threads = threads_of(where);
  const int64_t instances = where.dataset_instances >= 0 ? where.dataset_instances : dataset_instances_of(cfg);
  const int64_t frame = frame_bytes(x);
  HostMemory out;
  out.rank = x.rank;
  auto without = [](std::vector<MemoryPart> parts, std::initializer_list<const char*> names) {
    for (const char* name : names)
      parts.erase(std::remove_if(parts.begin(), parts.end(), [&](const MemoryPart& q) { return q.name == name; }),
                  parts.end());
    return parts;
  };
  const MemoryPart baseline{"process baseline", kProcessBaselineBytes, "binary, libraries, MPI, threads (measured)"};

  // The step. On cuda the host holds the exchange's staging (send and receive blocks, a unit's gather, the
  // parameters' all-gather: dist/ moves every byte through the host; page-locked, Executor::allocate_staging) and the
  // digest's blocks.
  HostPhase step{"step", {}};
  if (!x.gpu) {
    step.parts = executor_step_parts(cfg, x);
  } else {
    auto add = [&](const std::string& name, int64_t bytes, const std::string& why) {
      if (bytes > 0) step.parts.push_back({name, bytes, why});
    };
    // Under nccl none of it: the exchanges move between device buffers.
    if (L.world() > 1 && !x.nccl) {
      if (x.overlap)  // the device's block (the executor's parts) copied here, where it stays while it is in flight
        add("unit send blocks", kF32 * (p.send_floats - p.send_device_floats),
            "the unit's in flight, copied from the device's block: k x largest unit (page-locked)");
      else
        add("unit send blocks", kF32 * p.send_floats, send_blocks_why(false) + " (page-locked)");
      add("unit receive blocks", kF32 * p.recv_floats, recv_blocks_why() + " (page-locked)");
    }
    const MemoryPart transient = largest_transient(p, false);
    if (!x.nccl) add(transient.name, transient.bytes, transient.why + " (host staging, page-locked)");
    // Olmo3::ContextBuffers' host side: attention's gathers staged through the host (this rank's rows, every rank's,
    // the whole tensor to upload) and a chain's partial on its way; under nccl they move on the device.
    if (cfg.train.cp_degree > 1 && !x.nccl) {
      const int64_t B = cfg.train.micro_batch_instances, T = cfg.train.seq_len, qd = cfg.model.q_dim();
      add("context parallelism staging",
          kF32 * (B * (T / cfg.train.cp_degree) * qd + 2 * B * T * qd + cfg.model.vocab_size * cfg.model.d_model),
          "attention's gathers through the host: my rows, every rank's, the whole tensor [micro-batch x seq, qd]; a "
          "gradient chain's partial [V, d]");
    }
    add("digest staging", kF32 * std::min(p.optimizer_floats, 2 * StateDigest::kStreamChunks * kDigestChunk),
        "two blocks of the range being hashed (64 MiB each at most)");
  }
  add_data_parts(step.parts, cfg, instances);
  step.parts.push_back(baseline);

  // The checkpoint write, after the step: its transients gone (a sharded run also frees its slots,
  // Trainer::release_transients), each compression thread holds one frame's zstd output (and on a device executor
  // the frame's download); under expert-resident state a writer also receives the experts it lacks.
  HostPhase write{"checkpoint write", {}};
  const int zstd_threads = cfg.checkpoint.zstd_threads > 0 ? static_cast<int>(cfg.checkpoint.zstd_threads) : threads;
  if (!x.gpu) {
    write.parts = without(step.parts, {"FSDP gather buffers", "parameter all-gather"});
    if (L.dp_shard > 1)
      write.parts = without(write.parts, {"gradient stack", "owner tree slots", "unit send blocks", "unit receive blocks"});
  } else {
    write.parts = without(step.parts, {"unit send blocks", "unit receive blocks", "FSDP gather buffers",
                                       "parameter all-gather", "digest staging"});
  }
  write.parts.push_back({"checkpoint frames", zstd_threads * frame * (x.device_paths ? 2 : 1),
                         std::to_string(zstd_threads) + " compression thread(s) x one frame's zstd output" +
                             std::string(x.device_paths ? " and its download" : "") + " (<= 16 MiB each)"});
  if (x.drops_any && L.replicate_index() == 0)
    write.parts.push_back({"experts received", kF32 * p.shard_floats,
                           "expert-resident state: the shard's parameters gathered for the write"});
  // Resume: the state and the model's buffers as the trainer allocates them, then one frame (and its compressed
  // bytes) per reading thread; a device executor reads on one thread into the device.
  HostPhase resume{"resume", {}};
  const int read_threads = x.device_paths ? 1 : threads;
  if (!x.gpu) {
    // The gradient shard, the slots and the FSDP unit buffer are allocated by the first step, not by the trainer's
    // constructor.
    resume.parts = without(step.parts, {"gradient shard", "gradient stack", "owner tree slots", "unit send blocks",
                                        "unit receive blocks", "FSDP unit buffer",
                                        "FSDP gather buffers", "parameter all-gather", "digest staging",
                                        "evaluation model", "context parallelism gathers"});
  } else {
    resume.parts = without(step.parts, {"unit send blocks", "unit receive blocks", "FSDP gather buffers",
                                        "parameter all-gather", "context parallelism staging"});
  }
  resume.parts.push_back({"checkpoint frames", read_threads * 2 * frame,
                          std::to_string(read_threads) + " reading thread(s) x one frame and its compressed bytes"});
  out.phases = {std::move(step), std::move(write), std::move(resume)};
  return out;
}

RankMemory predict_rank_memory(const TrainConfig& cfg, const MemoryPlacement& where) {
  const Shapes x = shapes_of(cfg, where);
  RankMemory out;
  out.device = x.gpu;
  out.rank = x.rank;
  out.parts = executor_step_parts(cfg, x);
  if (x.gpu) return out;
  // On the host the peak is the largest phase: the step, the checkpoint write after it, or a resume.
  const HostMemory host = predict_host_memory(cfg, where);
  out.parts = host.phases[0].parts;
  const int64_t step = host.phases[0].peak(), other = std::max(host.phases[1].peak(), host.phases[2].peak());
  if (other > step)
    out.parts.push_back(host.phases[1].peak() >= host.phases[2].peak()
                            ? MemoryPart{"checkpoint write", other - step,
                                         "beyond the step: each thread's zstd frame, after the step's transients"}
                            : MemoryPart{"resume", other - step, "beyond the step: each reading thread's frame"});
  return out;
}

std::string host_memory_table(const TrainConfig& cfg, const MemoryPlacement& where, const HostMemory& h,
                              int ranks_per_node) {
  std::vector<std::string> names;
  for (const HostPhase& ph : h.phases)
    for (const MemoryPart& p : ph.parts)
      if (std::find(names.begin(), names.end(), p.name) == names.end()) names.push_back(p.name);
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "host memory per rank  %s, layout %dx%d, %d thread(s) per rank, %d rank(s) per node; the fullest "
                "rank is %d\n",
                (where.executor.empty() ? cfg.train.executor : where.executor).c_str(), where.dp_shard,
                where.dp_replicate, threads_of(where), ranks_per_node, h.rank);
  s += line;
  std::snprintf(line, sizeof line, "  %-22s %12s %17s %12s\n", "", "step", "checkpoint write", "resume");
  s += line;
  auto cell = [](const HostPhase& ph, const std::string& name) -> std::string {
    for (const MemoryPart& p : ph.parts)
      if (p.name == name) return size_text(p.bytes);
    return "-";
  };
  for (const std::string& name : names) {
    std::snprintf(line, sizeof line, "  %-22s %12s %17s %12s\n", name.c_str(), cell(h.phases[0], name).c_str(),
                  cell(h.phases[1], name).c_str(), cell(h.phases[2], name).c_str());
    s += line;
  }
  std::snprintf(line, sizeof line, "  %-22s %12s %17s %12s  (bytes: step %lld, write %lld, resume %lld)\n",
                "peak per rank", size_text(h.phases[0].peak()).c_str(), size_text(h.phases[1].peak()).c_str(),
                size_text(h.phases[2].peak()).c_str(), static_cast<long long>(h.phases[0].peak()),
                static_cast<long long>(h.phases[1].peak()), static_cast<long long>(h.phases[2].peak()));
  s += line;
  std::snprintf(line, sizeof line, "  %-22s %12s %17s %12s  (%d ranks x the fullest)\n", "peak per node",
                size_text(h.phases[0].peak() * ranks_per_node).c_str(),
                size_text(h.phases[1].peak() * ranks_per_node).c_str(),
                size_text(h.phases[2].peak() * ranks_per_node).c_str(), ranks_per_node);
  return s + line;
}

std::string memory_table(const TrainConfig& cfg, const MemoryPlacement& where, const RankMemory& m) {
  const std::string exec = where.executor.empty() ? cfg.train.executor : where.executor;
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "memory per rank  %s memory, %s, layout %dx%d (dp_shard x dp_replicate), ep %d, micro-batch %lld x %lld "
                "tokens, activation_checkpointing %s; the fullest rank is %d\n",
                m.device ? "GPU" : "host", exec.c_str(), where.dp_shard, where.dp_replicate, where.ep,
                static_cast<long long>(cfg.train.micro_batch_instances), static_cast<long long>(cfg.train.seq_len),
                (cfg.train.activation_checkpointing +
                 (cfg.train.activation_checkpointing_block_interval > 0
                      ? " (block_interval " + std::to_string(cfg.train.activation_checkpointing_block_interval) + ")"
                      : std::string()))
                    .c_str(),
                m.rank);
  s += line;
  for (const MemoryPart& p : m.parts) {
    std::snprintf(line, sizeof line, "  %-22s %12s  %s\n", p.name.c_str(), gib_text(static_cast<double>(p.bytes)).c_str(),
                  p.why.c_str());
    s += line;
  }
  std::snprintf(line, sizeof line, "  %-22s %12s  (%lld bytes)\n", "peak", gib_text(static_cast<double>(m.peak())).c_str(),
                static_cast<long long>(m.peak()));
  return s + line;
}

std::string memory_alternatives(const TrainConfig& cfg, const MemoryPlacement& where, int64_t available) {
  std::vector<std::string> fits;
  auto peak_of = [&](const TrainConfig& c, const MemoryPlacement& w) -> int64_t {
    try {
      BatchSplit{c.train.global_batch_instances, c.train.micro_batch_instances, w.dp_shard * w.dp_replicate,
                 static_cast<int>(c.train.cp_degree)}.validate();
      return predict_rank_memory(c, w).peak();
    } catch (const std::invalid_argument&) {
      return -1;  // a layout the trainer would refuse
    }
  };
  auto note = [&](const std::string& what, int64_t peak) { fits.push_back(what + " (" + gib_text(static_cast<double>(peak)) + ")"); };
  for (int64_t mb = cfg.train.micro_batch_instances / 2; mb >= 1; mb /= 2) {
    TrainConfig c = cfg;
    c.train.micro_batch_instances = mb;
    if (const int64_t peak = peak_of(c, where); peak >= 0 && peak <= available) {
      note("train.micro_batch_instances=" + std::to_string(mb), peak);
      break;
    }
  }
  // Recompute: the fewest blocks recomputed that fit (selected_blocks at the largest interval, OLMo-core's
  // block_interval), else every block; fewer than the run recomputes now would not fit either.
  const int64_t L = cfg.model.n_layers;
  const int64_t now = parse_activation_checkpointing(cfg.train.activation_checkpointing,
                                                     cfg.train.activation_checkpointing_block_interval)
                          .recomputed_blocks(L);
  bool recompute_noted = false;
  for (int64_t n = L; n >= 2 && !recompute_noted; --n) {
    const int64_t recomputed = ActivationCheckpointing::selected_blocks(n).recomputed_blocks(L);
    const bool same_as_larger = n < L && recomputed == ActivationCheckpointing::selected_blocks(n + 1).recomputed_blocks(L);
    if (recomputed <= now || same_as_larger) continue;  // tried already at the larger n
    TrainConfig c = cfg;
    c.train.activation_checkpointing = "selected_blocks";
    c.train.activation_checkpointing_block_interval = n;
    if (const int64_t peak = peak_of(c, where); peak >= 0 && peak <= available) {
      note("train.activation_checkpointing=\"selected_blocks\" with train.activation_checkpointing_block_interval=" +
               std::to_string(n) + " (recomputes " + std::to_string(recomputed) + " of " + std::to_string(L) + " blocks)",
           peak);
      recompute_noted = true;
    }
  }
  TrainConfig full = cfg;
  full.train.activation_checkpointing = "full";
  full.train.activation_checkpointing_block_interval = 0;
  if (!recompute_noted && now < L)
    if (const int64_t peak = peak_of(full, where); peak >= 0 && peak <= available)
      note("train.activation_checkpointing=\"full\"", peak);
  // Without the prefetch: no second FSDP unit buffer, no second set of the exchange's send blocks; the gathers and the
  // owners' exchange then wait for the compute (config --time's mpi and nccl columns).
  if (where.prefetch) {
    MemoryPlacement w = where;
    w.prefetch = false;
    if (const int64_t peak = peak_of(cfg, w); peak >= 0 && peak <= available && peak < peak_of(cfg, where))
      note("train --no-prefetch (slower: the FSDP gathers and the owners' exchange no longer run under the compute)",
           peak);
  }
  // Context parallelism splits the activations, which no dp_shard does (docs/memory.md).
  for (int64_t n = cfg.train.cp_degree * 2; n <= where.dp_shard * where.dp_replicate; n *= 2) {
    TrainConfig c = cfg;
    c.train.cp_degree = n;
    if (cfg.train.seq_len % n != 0) break;
    if (const int64_t peak = peak_of(c, where); peak >= 0 && peak <= available) {
      note("train.cp_degree=" + std::to_string(n), peak);
      break;
    }
  }
  for (int s = where.dp_shard * 2; s <= 65536; s *= 2) {
    MemoryPlacement w = where;
    w.dp_shard = s;
    const int64_t peak = peak_of(cfg, w);
    if (peak < 0) break;  // fewer micro-batches than ranks from here on
    if (peak <= available) {
      note("--dp-shard " + std::to_string(s), peak);
      break;
    }
  }
  std::string out;
  for (const std::string& f : fits) out += (out.empty() ? "" : "; ") + f;
  return out;
}

}  // namespace olmoref
