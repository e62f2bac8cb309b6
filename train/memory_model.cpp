// train/memory_model.cpp — the per-rank peak, part by part, from the shapes alone (no buffer is allocated). Each
// part names the code that allocates it; docs/memory.md says how each grows. The parts coexist at the peak (the
// last backward of a step: the state, the tree's slots and a unit's exchange blocks, the model's buffers and one FSDP
// unit), except the two transients, which never overlap: an FSDP unit's gather (during forward and backward) and the
// updated parameters' all-gather among replicas (after the update); the peak takes the larger.
#include "train/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

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

// The FSDP units [begin, end) of the flat vector (Olmo3::unit_range): embedding, each block, the head.
std::vector<std::pair<int64_t, int64_t>> fsdp_units(const ModelConfig& m, const ParamLayout& layout) {
  const int64_t d = m.d_model, V = m.vocab_size;
  std::vector<std::pair<int64_t, int64_t>> units = {{layout.embeddings, layout.embeddings + V * d}};
  for (const BlockOffsets& o : layout.blocks) units.push_back({o.w_q, o.ffn_norm + d});
  units.push_back({layout.final_norm, layout.lm_head + V * d});
  return units;
}

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
  int64_t gradient_floats() const { return local_floats + owner_floats + send_floats + recv_floats; }
  // The send and receive blocks grow at the first unit exchange (the head's, in the first round's backward) and
  // are freed after the step: with one round no forward gather meets them, and backward's first gather (the head's)
  // comes before them.
  bool gathers_meet_exchange = false;
  int64_t unit_floats = 0, gather_floats = 0;   // FSDP: the largest unit's pages; its gather's vectors
  int64_t param_gather_floats = 0;              // the updated parameters' all-gather among replicas
};

RankParts rank_parts(const TrainConfig& cfg, const dist::Layout& L, const dist::StatePlacement& P, bool host_state,
                     const std::vector<std::pair<int64_t, int64_t>>& units, bool ep, int64_t exchange_chunks) {
  RankParts p;
  const BatchSplit split{cfg.train.global_batch_instances, cfg.train.micro_batch_instances, L.world()};
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
    p.gathers_meet_exchange = split.n_rounds() > 1;
    p.local_floats = p.local_slots * widest_unit;
    p.owner_floats = p.owner_slots * p.optimizer_floats;
    p.send_floats = most_sent * widest_unit;
    // dist::OwnerReduction exchanges a unit in chunks of every owner's piece, one all-to-all each.
    p.recv_floats = most_received * ((std::max<int64_t>(0, widest_piece) + exchange_chunks - 1) / exchange_chunks);
  }
  if (S > 1)
    for (const auto& [a, b] : units) {
      // dist::UnitGather::acquire: my part of the unit once (under expert parallelism at most once for each of the S
      // ranks, which read different experts) and the whole unit received, then copied into the unit buffer.
      const int64_t mine = std::max<int64_t>(0, std::min(b, L.hi()) - std::max(a, L.lo()));
      p.unit_floats = std::max(p.unit_floats, b - a);
      p.gather_floats = std::max(p.gather_floats, (ep ? S : 1) * mine + (b - a));
    }
  return p;
}

int64_t transient_gather_floats(const RankParts& p) {
  if (p.gathers_meet_exchange) return p.gather_floats;
  return std::max<int64_t>(0, p.gather_floats - p.send_floats - p.recv_floats);
}

// The rank whose parts that differ between ranks (state held, slots, exchange blocks, FSDP gathers) weigh most; the
// first of them. `rank` receives its index.
RankParts fullest_rank(const TrainConfig& cfg, dist::Layout L, const dist::StatePlacement& P, bool host_state,
                       const std::vector<std::pair<int64_t, int64_t>>& units, bool ep, int& rank) {
  RankParts fullest;
  int64_t fullest_floats = -1;
  const int64_t chunks = dist::exchange_chunks(L, units);
  for (int r = 0; r < L.world(); ++r) {
    L.rank = r;
    const RankParts p = rank_parts(cfg, L, P, host_state, units, ep, chunks);
    const int64_t floats = p.state_floats + 3 * p.optimizer_floats + p.gradient_floats() +
                           std::max(transient_gather_floats(p), p.param_gather_floats) + p.unit_floats;
    if (floats > fullest_floats) fullest_floats = floats, fullest = p, rank = r;
  }
  return fullest;
}

// The step's transients never coexist, so the larger counts: an FSDP unit's gather vectors (host) or the updated
// parameters' all-gather blocks (host). A gather that never meets the exchange blocks counts only beyond them.
MemoryPart largest_transient(const RankParts& p, bool gpu) {
  const int64_t gather_bytes = gpu ? 0 : kF32 * transient_gather_floats(p);
  const int64_t param_gather_bytes = kF32 * p.param_gather_floats;
  if (gather_bytes >= param_gather_bytes)
    return {"FSDP gather buffers", gather_bytes, "transient: my part of a unit (sent once) and the unit received"};
  return {"parameter all-gather", param_gather_bytes, "transient: the updated parameters' blocks from every replica"};
}

}  // namespace

RankMemory predict_rank_memory(const TrainConfig& cfg, const MemoryPlacement& where) {
  cfg.validate();
  const std::string exec = where.executor.empty() ? cfg.train.executor : where.executor;
  if (exec != "cpu" && exec != "cuda" && exec != "cuda-host")
    throw std::invalid_argument("--executor '" + exec + "': must be cpu, cuda or cuda-host");
  if (where.dp_shard < 1 || where.dp_replicate < 1 || where.ep < 1)
    throw std::invalid_argument("--layout and --ep: every factor must be >= 1");
  const ModelConfig& m = cfg.model;
  const bool gpu = exec == "cuda", device_paths = exec != "cpu";
  const ParamLayout layout(m);
  const int64_t n = layout.total, T = cfg.train.seq_len;
  const int64_t B = cfg.train.micro_batch_instances, R = B * T;
  dist::Layout L;
  L.dp_shard = where.dp_shard, L.dp_replicate = where.dp_replicate, L.total = n;
  const int W = L.world();
  // An EP group the trainer would refuse (it says why) is taken as none here.
  const bool ep = where.ep > 1 && m.moe.enabled() && W % where.ep == 0 && where.ep <= m.moe.n_experts;
  const dist::StatePlacement P(L, ep ? where.ep : 1, m.moe.enabled() ? m.moe.n_experts : 0, expert_spans(layout, m));
  const auto units = fsdp_units(m, layout);

  RankMemory out;
  out.device = gpu;
  const RankParts fullest = fullest_rank(cfg, L, P, !device_paths, units, ep, out.rank);
  const ActivationCheckpointing ac = parse_activation_checkpointing(cfg.train.activation_checkpointing);
  const ModelMemory mm = olmo3_memory(m, B, T, parse_precision(cfg.train.precision), device_paths, ac);
  const std::string recompute = ac == ActivationCheckpointing::full ? "each block's input x [R, d] plus one block's set"
                                                                    : "every block's set (recompute off)";
  auto add = [&](const std::string& name, int64_t bytes, const std::string& why) {
    if (bytes > 0) out.parts.push_back({name, bytes, why});
  };
  const RankParts& p = fullest;
  const std::string held = ep && !device_paths ? " (of the experts, those its group runs or its optimizer range holds)" : "";
  add("parameters", kF32 * p.state_floats, "fp32 master shard: params / dp_shard" + held);
  add("AdamW moments", 2 * kF32 * p.optimizer_floats,
      "m and v of the optimizer range: params / (dp_shard x dp_replicate)");
  add("gradient shard", kF32 * p.optimizer_floats,
      "the reduced gradient of the optimizer range: params / (dp_shard x dp_replicate)");
  if (W == 1) {
    add("gradient stack", kF32 * p.local_floats,
        std::to_string(p.local_slots) + " full-length instance-tree slots (<= ceil(log2 N) + 1)");
  } else {
    add("gradient stack", kF32 * p.local_floats,
        std::to_string(p.local_slots) + " slots of the largest unit (<= ceil(log2 micro-batch) + 1)");
    add("owner tree slots", kF32 * p.owner_floats,
        std::to_string(p.owner_slots) + " slots of the optimizer range (<= ceil(log2 N) + 1): params / W each");
    if (!gpu) {
      add("unit send blocks", kF32 * p.send_floats, "a unit's finished subtrees, cut by owner: k x largest unit");
      add("unit receive blocks", kF32 * p.recv_floats, "every rank's subtrees on a chunk of my slice of a unit");
    }
  }
  if (L.dp_shard > 1)
    add("FSDP unit buffer", kF32 * p.unit_floats,
        gpu ? "the unit in use on the device (largest unit)" : "the unit in use (largest unit)");
  add("activations", mm.activations, "kept for backward: " + recompute + "; x micro-batch x seq");
  add("backward temporaries", mm.backward, "one block's gradients [R, d|qd|kd|F]; x micro-batch x seq");
  add("logits", mm.logits,
      "one run of " + std::to_string(head_chunk_rows(m.vocab_size, T)) +
          " rows' logits [rows, V] (<= 256 MiB), the final norm's [R, d]");
  // bf16 under FSDP: the working copy is made unit by unit into one unit-sized buffer (Olmo3::use_unit).
  const bool bf16 = cfg.train.precision == "bf16";
  const int64_t working = mm.working - (bf16 && L.dp_shard > 1 ? kF32 * (n - p.unit_floats) : 0);
  add("working copies", working,
      "RoPE tables, tokens, loss rows" +
          std::string(bf16 ? (L.dp_shard > 1 ? ", the bf16 copy of the unit in use" : ", the bf16 weights") : ""));
  add("kernel scratch", mm.kernel_scratch, "attention rows [blocks in flight, seq], D, per-head dk/dv: linear in seq");
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
  const MemoryPart transient = largest_transient(p, gpu);
  add(transient.name, transient.bytes, transient.why);
  // StateDigest: the optimizer range reaches the host in blocks, one downloading while the other is hashed.
  if (device_paths && !gpu)
    add("digest staging", kF32 * std::min(p.optimizer_floats, 2 * StateDigest::kStreamChunks * kDigestChunk),
        "two blocks of the range being hashed (64 MiB each at most)");
  // After the step (its transients gone; a sharded run also frees the slots, Trainer::release_transients) a checkpoint
  // is written: each writer (replicate group 0) holds zstd's output for its shard's params, m and v (each sized
  // ZSTD_compressBound and zero-filled; on a device executor also the state's host copies), then rank 0 reads every
  // shard file back whole, one at a time (ckpt::finish_save: read_file's growing buffer and its copy, two files' worth
  // of at most 3 x the shard each). What exceeds the step's own transients raises the peak.
  // With the moments split over the replicas a writer also receives its shard's m and v (dist::collect_pieces).
  if (!gpu) {
    const int64_t step_extra =
        kF32 * (p.gradient_floats() + p.unit_floats + std::max(transient_gather_floats(p), p.param_gather_floats));
    const int64_t copies = device_paths ? 3 : (L.dp_replicate > 1 ? 2 : 0);
    const int64_t write = kF32 * std::max<int64_t>((3 + copies) * p.shard_floats, 6 * L.shard_stride());
    add("checkpoint write", write + (L.dp_shard == 1 ? kF32 * p.gradient_floats() : 0) - step_extra,
        "zstd buffers of the shard's params, m, v; rank 0 reads each shard file back (6 x params / dp_shard)");
  }
  if (!gpu) add("process baseline", kProcessBaselineBytes, "binary, libraries, MPI, threads (measured)");
  return out;
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
                cfg.train.activation_checkpointing.c_str(), m.rank);
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
      BatchSplit{c.train.global_batch_instances, c.train.micro_batch_instances, w.dp_shard * w.dp_replicate}.validate();
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
  TrainConfig full = cfg;
  full.train.activation_checkpointing = "full";
  if (cfg.train.activation_checkpointing != "full")
    if (const int64_t peak = peak_of(full, where); peak >= 0 && peak <= available)
      note("train.activation_checkpointing=\"full\"", peak);
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
