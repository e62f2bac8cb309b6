// train/time_model.cpp — the step's work from the trainer's own plans, and its time at stated rates (time_model.h).
#include "train/time_model.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/instance_tree.h"
#include "core/params.h"
#include "dist/layout.h"
#include "dist/nccl_comm.h"
#include "model/olmo3.h"
#include "model/profiled_executor.h"

namespace olmoref {

namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

constexpr double kGB = 1e9;

int64_t overlap(int64_t a, int64_t b, int64_t lo, int64_t hi) { return std::max<int64_t>(0, std::min(b, hi) - std::max(a, lo)); }

int64_t overlap(const Ranges& reads, int64_t lo, int64_t hi) {
  int64_t n = 0;
  for (const auto& [a, b] : reads) n += overlap(a, b, lo, hi);
  return n;
}

// The matmuls one token's forward runs, as Σ N·K over the linear layers (ProfiledExecutor counts 2·M·N·K each, M
// the rows): the blocks' and the LM head's separately, since a recompute runs the blocks' again.
struct TokenMatmuls {
  double blocks = 0, head = 0;
};
TokenMatmuls token_matmuls(const ModelConfig& m) {
  const double d = static_cast<double>(m.d_model);
  const double attn = d * static_cast<double>(m.q_dim()) * 2 + 2 * d * static_cast<double>(m.kv_dim());  // q, o; k, v
  double ffn = 3 * d * static_cast<double>(m.ffn_hidden);
  if (m.moe.enabled())  // the router, the top_k experts a token is routed to, the shared expert
    ffn = d * static_cast<double>(m.moe.n_experts) + 3 * d * static_cast<double>(m.moe.hidden * m.moe.top_k) +
          3 * d * static_cast<double>(m.moe.shared_hidden);
  return {static_cast<double>(m.n_layers) * (attn + ffn), d * static_cast<double>(m.vocab_size)};
}

// One rank's attention FLOPs per instance when its part is the positions [index·T/cp, (index+1)·T/cp) (context
// parallelism; cp 1: the whole instance), as ProfiledExecutor counts a call over that part: forward over its queries,
// backward's dq half over its queries and its dk, dv half over its keys; recompute, the forward of the blocks that
// activation checkpointing recomputes.
struct PartAttention {
  double forward = 0, backward = 0, recompute = 0;
};
PartAttention attention_flops_of_part(const ModelConfig& m, int64_t T, int64_t cp, int64_t index,
                                      const ActivationCheckpointing& ac) {
  PartAttention a;
  const int64_t L = T / cp, p0 = index * L;
  const double hd = static_cast<double>(m.head_dim);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const AttentionShape s{1, T, m.n_heads, m.n_kv_heads, m.head_dim, m.window(l), 1.0f};
    const double queries = attention_query_pairs(s, p0, p0 + L), keys = attention_key_pairs(s, p0, p0 + L);
    a.forward += 4.0 * queries * hd;
    a.backward += 4.0 * (queries + keys) * hd;
    if (ac.recomputes(l)) a.recompute += 4.0 * queries * hd;
  }
  return a;
}

struct Peers {
  int ranks_per_node;
  int me;
  bool same_node(int r) const { return r / ranks_per_node == me / ranks_per_node; }
};

void add_sent(CollectiveWork& c, const Peers& p, int to, int64_t bytes) {
  (p.same_node(to) ? c.sent_on_node : c.sent_off_node) += bytes;
}
void add_received(CollectiveWork& c, const Peers& p, int from, int64_t bytes) {
  (p.same_node(from) ? c.received_on_node : c.received_off_node) += bytes;
}

}  // namespace

DeviceRates device_rates(const std::string& gpu) {
  DeviceRates r;
  // Both SXM parts: 67 TFLOP/s fp32 on the CUDA cores, NVLink 4 at 900 GB/s (450 each way), PCIe Gen5 x16 (64 GB/s
  // each way); the exact kernels round each product before the add (no FMA contraction: the GPU smoke test's
  // contraction probe), so a multiply-add is two instructions and their ceiling is half the fp32 figure.
  r.gemm_flops = r.attention_flops = 67e12 / 2;
  r.nvlink_bytes = 450 * kGB;
  r.pcie_bytes = 64 * kGB;
  r.network_bytes = 50 * kGB;  // one 400 Gb/s NIC per GPU (ConnectX-7 NDR, as on DGX H100/H200)
  r.host_copy_bytes = 10 * kGB;
  if (gpu == "h100") {
    r.name = "H100 SXM";
    r.hbm_bytes = 3.35e12;
  } else if (gpu == "h200") {
    r.name = "H200 SXM";
    r.hbm_bytes = 4.8e12;
  } else {
    throw std::invalid_argument("--gpu '" + gpu + "': h100 or h200 (set any rate with --rate KEY=VALUE)");
  }
  r.notes = {"data sheet: fp32 67 TFLOP/s halved for the unfused exact kernels; HBM " +
                 std::string(gpu == "h100" ? "3.35" : "4.8") + " TB/s; NVLink 450 GB/s, PCIe 64 GB/s, network 50 GB/s "
                 "per direction",
             "assumed, not a data-sheet figure: host copies between MPI processes of a node 10 GB/s"};
  return r;
}

void set_rate(DeviceRates& rates, const std::string& key_value) {
  const std::map<std::string, std::pair<double DeviceRates::*, double>> keys = {
      {"gemm_tflops", {&DeviceRates::gemm_flops, 1e12}},     {"attention_tflops", {&DeviceRates::attention_flops, 1e12}},
      {"hbm_gbps", {&DeviceRates::hbm_bytes, kGB}},          {"nvlink_gbps", {&DeviceRates::nvlink_bytes, kGB}},
      {"pcie_gbps", {&DeviceRates::pcie_bytes, kGB}},        {"host_copy_gbps", {&DeviceRates::host_copy_bytes, kGB}},
      {"network_gbps", {&DeviceRates::network_bytes, kGB}}};
  std::string names;
  for (const auto& [k, v] : keys) names += (names.empty() ? "" : ", ") + k;
  const size_t eq = key_value.find('=');
  const auto it = keys.find(key_value.substr(0, eq));
  if (eq == std::string::npos || it == keys.end())
    throw std::invalid_argument("--rate '" + key_value + "': KEY=VALUE with KEY one of " + names);
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(key_value.substr(eq + 1), &used);
    if (used != key_value.size() - eq - 1) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    throw std::invalid_argument("--rate '" + key_value + "': the value is not a number");
  }
  if (!(value > 0)) throw std::invalid_argument("--rate '" + key_value + "': the value must be positive");
  rates.*(it->second.first) = value * it->second.second;
  rates.notes.push_back("--rate " + key_value);
}

void rates_from_bench(DeviceRates& rates, const std::string& bench_json, const ModelConfig* model, int64_t seq_len) {
  std::ifstream in(bench_json);
  if (!in) throw std::runtime_error(bench_json + ": cannot read (gemm_bench --out and bench/gpu_bench.sh write it)");
  nlohmann::json rows;
  try {
    rows = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(bench_json + ": not JSON (" + e.what() + ")");
  }
  // Each rate is FLOPs over seconds summed over its rows, so a row weighs by its time.
  double gemm_flops = 0, gemm_seconds = 0, attention_flops = 0, attention_seconds = 0;
  int profiles = 0;
  // attention_bench's rows at the model's shapes: window -> (layers with it, FLOPs, seconds of one such layer).
  struct WindowRate {
    int64_t layers = 0;
    double flops = 0, seconds = 0;
  };
  std::map<int64_t, WindowRate> windows;
  if (model)
    for (int64_t l = 0; l < model->n_layers; ++l) ++windows[model->window(l)].layers;
  auto number = [](const nlohmann::json& row, const char* key) {
    return row.contains(key) && row[key].is_number() ? row[key].get<double>() : 0.0;
  };
  if (rows.is_array())
    for (const auto& row : rows) {
      if (!row.is_object()) continue;
      if (const double s = number(row, "exact_seconds"); s > 0 && number(row, "exact_tflops") > 0) {
        gemm_flops += number(row, "exact_tflops") * 1e12 * s;  // a gemm_bench row
        gemm_seconds += s;
      }
      if (model && row.value("bench", "") == "attention" && number(row, "T") == static_cast<double>(seq_len) &&
          number(row, "H") == static_cast<double>(model->n_heads) &&
          number(row, "KV") == static_cast<double>(model->n_kv_heads) &&
          number(row, "hd") == static_cast<double>(model->head_dim)) {
        const double seconds = number(row, "forward_seconds") + number(row, "backward_seconds");
        const auto w = windows.find(static_cast<int64_t>(number(row, "window")));
        if (w != windows.end() && seconds > 0) {
          w->second.flops = number(row, "forward_flops") + number(row, "backward_flops");
          w->second.seconds = seconds;
        }
      }
      if (row.value("bench", "") == "profile" && number(row, "attention_seconds") > 0) {
        attention_flops += number(row, "attention_flops");  // a --profile-ops run of bench/gpu_bench.sh
        attention_seconds += number(row, "attention_seconds");
        ++profiles;
      }
    }
  double shaped_flops = 0, shaped_seconds = 0;  // the model's layers at attention_bench's rates
  bool every_window = model != nullptr;
  for (const auto& [window, r] : windows) {
    every_window = every_window && r.seconds > 0 && r.flops > 0;
    shaped_flops += static_cast<double>(r.layers) * r.flops;
    shaped_seconds += static_cast<double>(r.layers) * r.seconds;
  }
  if (!(gemm_seconds > 0) && !(attention_seconds > 0) && !every_window)
    throw std::runtime_error(bench_json + ": no gemm_bench rows (objects with exact_seconds and exact_tflops), no "
                             "attention_bench rows at this model's shapes and no bench/gpu_bench.sh profile rows "
                             "(\"bench\": \"profile\" with attention_seconds)");
  char note[320];
  if (gemm_seconds > 0) {
    rates.gemm_flops = gemm_flops / gemm_seconds;
    std::snprintf(note, sizeof note, "exact GEMM %.2f TFLOP/s measured: %s", rates.gemm_flops / 1e12,
                  bench_json.c_str());
    rates.notes.push_back(note);
  }
  if (every_window) {
    rates.attention_flops = shaped_flops / shaped_seconds;
    std::snprintf(note, sizeof note,
                  "exact attention %.2f TFLOP/s measured (attention_bench at this model's shapes, %zu window(s), "
                  "weighed by its layers): %s",
                  rates.attention_flops / 1e12, windows.size(), bench_json.c_str());
    rates.notes.push_back(note);
  } else if (attention_seconds > 0 && attention_flops > 0) {
    rates.attention_flops = attention_flops / attention_seconds;
    std::snprintf(note, sizeof note, "exact attention %.2f TFLOP/s measured (--profile-ops of %d config(s)): %s",
                  rates.attention_flops / 1e12, profiles, bench_json.c_str());
    rates.notes.push_back(note);
  }
}

std::vector<StepWork> predict_step_work(const TrainConfig& cfg, const MemoryPlacement& where, int ranks_per_node) {
  cfg.validate();
  const ModelConfig& m = cfg.model;
  if (where.dp_shard < 1 || where.dp_replicate < 1 || where.ep < 1 || ranks_per_node < 1)
    throw std::invalid_argument("--layout, --ep and --ranks-per-node: every factor must be >= 1");
  const ParamLayout layout(m);
  dist::Layout L;
  L.dp_shard = where.dp_shard, L.dp_replicate = where.dp_replicate, L.total = layout.total;
  const int W = L.world(), S = L.dp_shard, R = L.dp_replicate;
  // An EP group the trainer would refuse is taken as none, as the memory model does.
  const int ep = where.ep > 1 && m.moe.enabled() && W % where.ep == 0 && where.ep <= m.moe.n_experts ? where.ep : 1;
  const int cp = static_cast<int>(cfg.train.cp_degree);
  const BatchSplit split{cfg.train.global_batch_instances, cfg.train.micro_batch_instances, W, cp};
  split.validate();
  const int64_t N = split.global_instances, T = cfg.train.seq_len;
  const ActivationCheckpointing ac = parse_activation_checkpointing(cfg.train.activation_checkpointing,
                                                                    cfg.train.activation_checkpointing_block_interval);
  // The share of the blocks recomputed: the blocks' GEMMs, their exchanges (context parallelism, experts) are alike.
  const double recompute = static_cast<double>(ac.recomputed_blocks(m.n_layers)) / static_cast<double>(m.n_layers);
  const Ranges units = fsdp_unit_ranges(m, layout);
  const TokenMatmuls mm = token_matmuls(m);

  // Each rank's instances and subtrees over the step's rounds (dist::OwnerReduction sends each micro-batch's maximal
  // subtrees, per unit and owner), and the instances it computes a part of (context parallelism: its group's, of which
  // only the group's last rank holds the leaves; without it the same).
  std::vector<int64_t> instances_of(static_cast<size_t>(W), 0), subtrees_of(static_cast<size_t>(W), 0);
  std::vector<int64_t> computed_of(static_cast<size_t>(W), 0);
  for (int r = 0; r < W; ++r)
    for (int64_t t = 0; t < split.n_rounds(); ++t)
      if (const int64_t mb = split.group_microbatch_of(r, t); mb >= 0) {
        const auto [a, b] = split.instances_of_microbatch(mb);
        computed_of[static_cast<size_t>(r)] += b - a;
        if (!split.holds_microbatches(r)) continue;
        instances_of[static_cast<size_t>(r)] += b - a;
        subtrees_of[static_cast<size_t>(r)] += static_cast<int64_t>(maximal_subtrees(N, a, b).size());
      }
  int64_t all_subtrees = 0;
  for (const int64_t k : subtrees_of) all_subtrees += k;

  std::vector<StepWork> out;
  for (int me = 0; me < W; ++me) {
    L.rank = me;
    const Peers peers{ranks_per_node, me};
    StepWork w;
    w.rank = me;
    // A micro-batch's local tree merges its instances into its maximal subtrees.
    const int64_t instances = instances_of[static_cast<size_t>(me)], computed = computed_of[static_cast<size_t>(me)];
    const int64_t local_merges = instances - subtrees_of[static_cast<size_t>(me)];
    w.tokens = computed * (T / cp);  // the rows it computes: its part of every instance of its group's micro-batches
    const double tokens = static_cast<double>(w.tokens);
    // Forward, then backward's input and weight gradients (two products of the forward's size), then a recompute of
    // the recomputed blocks' forward.
    w.gemm_flops = 2 * tokens * (mm.blocks + mm.head) * 3 + recompute * 2 * tokens * mm.blocks;
    const PartAttention attn = attention_flops_of_part(m, T, cp, me % cp, ac);
    w.attention_flops = static_cast<double>(computed) * (attn.forward + attn.backward + attn.recompute);

    const int64_t n = layout.total, opt = L.optimizer_hi() - L.optimizer_lo(), shard = L.hi() - L.lo();
    // AdamW reads p, g, m, v and writes p, m, v; the norm reads g and the clip rewrites it; each tree add reads two
    // vectors and writes one; the step digest reads the shard's parameters.
    const int64_t merges_at_owner = W > 1 ? all_subtrees - 1 : 0;
    w.hbm_bytes = 4.0 * (7.0 * static_cast<double>(opt) + 3.0 * static_cast<double>(opt) +
                         3.0 * static_cast<double>(W > 1 ? local_merges : N - 1) * static_cast<double>(n) +
                         3.0 * static_cast<double>(merges_at_owner) * static_cast<double>(opt) +
                         static_cast<double>(shard));

    if (S > 1) {  // dist::UnitGather::acquire: each unit in forward, each but the embedding again in backward
      CollectiveWork c{dist::kUnitGather};
      c.gather = true;
      const int g = L.replicate_index(), s_me = L.shard_index();
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        const int64_t acquires = split.n_rounds() * (u == 0 ? 1 : 2);
        const auto [a, b] = units[static_cast<size_t>(u)];
        const Ranges reads_me = fsdp_unit_reads(m, layout, u, ep, me % ep);
        for (int q = 0; q < S; ++q) {
          if (q == s_me) continue;
          const int peer = L.rank_of(q, g);
          const Ranges reads_q = fsdp_unit_reads(m, layout, u, ep, peer % ep);
          const int64_t to = overlap(reads_q, std::max(a, L.begin(s_me)), std::min(b, L.end(s_me)));
          const int64_t from = overlap(reads_me, std::max(a, L.begin(q)), std::min(b, L.end(q)));
          add_sent(c, peers, peer, 4 * acquires * to);
          add_received(c, peers, peer, 4 * acquires * from);
        }
      }
      w.collectives.push_back(c);
    }
    if (W > 1) {  // dist::OwnerReduction: every round, each unit's subtrees to the owners of its pieces
      CollectiveWork c{dist::kOwnerExchange};
      const int64_t k_mine = subtrees_of[static_cast<size_t>(me)];
      for (const auto& [a, b] : units)
        for (int j = 0; j < W; ++j) {
          if (j == me) continue;
          add_sent(c, peers, j, 4 * k_mine * overlap(a, b, L.optimizer_begin(j), L.optimizer_end(j)));
          add_received(c, peers, j,
                       4 * subtrees_of[static_cast<size_t>(j)] * overlap(a, b, L.optimizer_lo(), L.optimizer_hi()));
        }
      w.collectives.push_back(c);
    }
    if (R > 1) {  // Trainer::gather_updated_params: the optimizer stride from every replica
      CollectiveWork c{dist::kParamAllGather};
      for (int g = 0; g < R; ++g) {
        if (g == L.replicate_index()) continue;
        const int peer = L.rank_of(L.shard_index(), g);
        add_sent(c, peers, peer, 4 * L.optimizer_stride());
        add_received(c, peers, peer, 4 * L.optimizer_stride());
      }
      w.collectives.push_back(c);
    }
    if (cp > 1) {
      // model/context_parallel.cpp, per instance: each layer's forward gathers every rank's K, V [L, kd] and the
      // softmax statistics (max, sum) [H, L] (a recompute gathers them again), its backward Q, O, dO [L, qd] and K, V;
      // the head gathers the loss's fp64 row terms (ce, z) [L]. Each rank's part goes to every other rank of the group.
      const int64_t L = T / cp, qd = m.q_dim(), kd = m.kv_dim();
      const int64_t forward = 4 * L * (2 * kd + 2 * m.n_heads), backward = 4 * L * (3 * qd + 2 * kd);
      const int64_t per_instance =
          (m.n_layers + ac.recomputed_blocks(m.n_layers)) * forward + m.n_layers * backward + 16 * L;
      CollectiveWork gathers{"context parallelism: all-gather positions"};
      const int first = me - me % cp;
      for (int peer = first; peer < first + cp; ++peer) {
        if (peer == me) continue;
        add_sent(gathers, peers, peer, computed * per_instance);
        add_received(gathers, peers, peer, computed * per_instance);
      }
      w.collectives.push_back(gathers);
      // Every parameter's leaf of every instance is one chain over the group's ranks: a partial of n floats per
      // instance goes from each rank to the next.
      CollectiveWork chains{"context parallelism: a gradient chain to the next rank"};
      if (me % cp < cp - 1) add_sent(chains, peers, me + 1, 4 * n * computed);
      if (me % cp > 0) add_received(chains, peers, me - 1, 4 * n * computed);
      w.collectives.push_back(chains);
    }
    if (ep > 1) {
      // model/ep_exchange.cpp, each MoE layer: forward sends a row's input x [d] to its expert's owner, which returns
      // [y | a] [d + h]; backward sends ∂y [d] and gets [∂x | ∂g | ∂u] [d + 2h]; a recompute runs forward's again.
      // At balanced routing a rank sends, for each of its rows whose expert lives elsewhere, the source's part, and
      // returns as many rows of others as the owner's part.
      CollectiveWork c{"all-to-all of expert rows"};
      c.exact = false;
      const double d = static_cast<double>(m.d_model), h = static_cast<double>(m.moe.hidden);
      const double per_row = (2 * d + h) * (1 + recompute) + (2 * d + 2 * h);
      const double rows = tokens * static_cast<double>(m.moe.top_k) * static_cast<double>(m.n_layers);
      const int first = me - me % ep;
      for (int peer = first; peer < first + ep; ++peer) {
        if (peer == me) continue;
        const auto bytes = static_cast<int64_t>(4 * per_row * rows / ep);
        add_sent(c, peers, peer, bytes);
        add_received(c, peers, peer, bytes);
      }
      w.collectives.push_back(c);
    }
    out.push_back(std::move(w));
  }
  return out;
}

StepTime predict_step_time(const StepWork& w, const DeviceRates& r, const std::string& transport) {
  if (std::find(std::begin(kTransports), std::end(kTransports), transport) == std::end(kTransports))
    throw std::invalid_argument("transport '" + transport + "': mpi, mpi+prefetch, nccl or nccl+prefetch");
  const bool mpi = transport.rfind("mpi", 0) == 0, prefetch = transport.find("+prefetch") != std::string::npos;
  StepTime t;
  t.transport = transport;
  const double gemm = w.gemm_flops / r.gemm_flops, attention = w.attention_flops / r.attention_flops;
  const double memory = w.hbm_bytes / r.hbm_bytes;
  // Link seconds of the unit gathers and of the other collectives. MPI: every byte sent is copied to page-locked host
  // memory (Executor::allocate_staging: the link's rate) and every byte received back, by blocking copies one after
  // another; the node's ranks exchange through
  // shared memory; the network carries the rest. NCCL: NVLink on the node, the network off it, each way at once, for
  // the exchanges `train --transport nccl` moves (dist::kNcclExchanges); the others stay on MPI under it too.
  // `hideable`: what a prefetch can run under compute, the gathers' links, under MPI their PCIe staging too (the
  // prefetch's thread copies on a side stream of its own: dist::UnitGather::land); and the owners' exchange under the
  // next unit's backward (dist::ExchangeOverlap): under NCCL its links (its groups on a side stream), under MPI all of
  // it: the subtrees' copies to the host (a side stream's, from the device block the backward fills), the copies
  // between the ranks, the network (its thread's all-to-alls) and the copies of what it received back to the device
  // (on the thread's side stream).
  double gathers = 0, hideable = 0, others = 0, pcie = 0, host = 0, nvlink = 0, network = 0, exchange = 0;
  for (const CollectiveWork& c : w.collectives) {
    double link = 0, between_ranks = 0;
    const double off = static_cast<double>(std::max(c.sent_off_node, c.received_off_node)) / r.network_bytes;
    network += off;
    const bool by_nccl = !mpi && std::find_if(std::begin(dist::kNcclExchanges), std::end(dist::kNcclExchanges),
                                              [&c](const char* w) { return c.what == w; }) != std::end(dist::kNcclExchanges);
    if (!by_nccl) {
      const double p = static_cast<double>(c.sent() + c.received()) / r.pcie_bytes;
      const double h = static_cast<double>(c.sent_on_node) / r.host_copy_bytes;
      pcie += p, host += h, link = p + h + off, between_ranks = link;
      if (c.what == dist::kOwnerExchange) {
        exchange += link;
        between_ranks = 0;  // hidden as the exchange thread's share, not the gathers'
      }
    } else {
      const double v = static_cast<double>(std::max(c.sent_on_node, c.received_on_node)) / r.nvlink_bytes;
      nvlink += v, link = v + off, between_ranks = link;
      if (c.what == dist::kOwnerExchange) exchange += link;
    }
    (c.gather ? gathers : others) += link;
    if (c.gather) hideable += between_ranks;
  }
  t.parts = {{"GEMM", gemm}, {"attention", attention}, {"memory-bound ops (HBM)", memory}};
  if (mpi || pcie + host > 0) {
    t.parts.push_back({"PCIe staging (page-locked)", pcie});
    t.parts.push_back({"host copies between ranks", host});
  }
  if (!mpi) t.parts.push_back({"NVLink", nvlink});
  t.parts.push_back({"network", network});
  t.seconds = gemm + attention + memory + gathers + others;
  if (prefetch) {
    // The next unit's gather runs while this unit computes: only what the compute does not cover is waited for.
    const double hidden = std::min(hideable, gemm + attention);
    t.seconds -= hidden;
    t.parts.push_back({"unit gathers under compute", -hidden});
    // Each unit's exchange runs beside the next unit's gather, under the same compute: in what the gathers leave.
    const double under = std::min(exchange, gemm + attention - hidden);
    t.seconds -= under;
    t.parts.push_back({"owners' exchange under compute", -under});
  }
  const auto largest = std::max_element(t.parts.begin(), t.parts.end(),
                                        [](const TimePart& a, const TimePart& b) { return a.seconds < b.seconds; });
  t.dominant = largest->name;
  return t;
}

std::string time_table(const TrainConfig& cfg, const MemoryPlacement& where, int ranks_per_node,
                       const DeviceRates& rates, int rank) {
  const std::vector<StepWork> works = predict_step_work(cfg, where, ranks_per_node);
  if (rank >= static_cast<int>(works.size()))
    throw std::invalid_argument("--rank " + std::to_string(rank) + ": the layout has ranks 0.." +
                                std::to_string(works.size() - 1));
  // The slowest rank under today's transport (the step waits for it), or the one asked for.
  size_t pick = 0;
  if (rank >= 0) {
    pick = static_cast<size_t>(rank);
  } else {
    double slowest = -1;
    for (size_t i = 0; i < works.size(); ++i)
      if (const double s = predict_step_time(works[i], rates, "mpi+prefetch").seconds; s > slowest)
        slowest = s, pick = i;
  }
  const StepWork& w = works[pick];
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line, "\nstep time at %dx%d%s, %d ranks per node, %s (docs/memory.md, \"Step time\"):\n",
                where.dp_shard, where.dp_replicate, where.ep > 1 ? (" ep " + std::to_string(where.ep)).c_str() : "",
                ranks_per_node, rates.name.c_str());
  out += line;
  for (const std::string& note : rates.notes) out += "  rates: " + note + "\n";
  std::snprintf(line, sizeof line, "rank %d (%s): %lld tokens per step\n", w.rank,
                rank >= 0 ? "asked for" : "the slowest", static_cast<long long>(w.tokens));
  out += line;
  std::snprintf(line, sizeof line, "  %-40s %16.0f FLOP\n  %-40s %16.0f FLOP\n  %-40s %16.0f bytes (estimate)\n",
                "GEMM (forward, backward, recompute)", w.gemm_flops, "attention", w.attention_flops,
                "memory-bound ops (AdamW, tree adds, digest)", w.hbm_bytes);
  out += line;
  for (const CollectiveWork& c : w.collectives) {
    std::snprintf(line, sizeof line, "  %-40s %16lld bytes sent (%lld on node), %lld received%s\n", c.what.c_str(),
                  static_cast<long long>(c.sent()), static_cast<long long>(c.sent_on_node),
                  static_cast<long long>(c.received()), c.exact ? "" : " (estimate: balanced routing)");
    out += line;
  }
  std::vector<StepTime> times;
  for (const char* transport : kTransports) times.push_back(predict_step_time(w, rates, transport));
  std::snprintf(line, sizeof line, "  %-40s", "seconds per step");
  out += line;
  for (const StepTime& t : times) {
    std::snprintf(line, sizeof line, " %14s", t.transport == "mpi+prefetch" ? "mpi+pf (today)" : t.transport.c_str());
    out += line;
  }
  out += "\n";
  std::vector<std::string> names;
  for (const StepTime& t : times)
    for (const TimePart& p : t.parts)
      if (std::find(names.begin(), names.end(), p.name) == names.end()) names.push_back(p.name);
  for (const std::string& name : names) {
    std::snprintf(line, sizeof line, "  %-40s", name.c_str());
    out += line;
    for (const StepTime& t : times) {
      const auto it = std::find_if(t.parts.begin(), t.parts.end(), [&](const TimePart& p) { return p.name == name; });
      if (it == t.parts.end())
        std::snprintf(line, sizeof line, " %14s", "-");
      else
        std::snprintf(line, sizeof line, " %14.6g", it->seconds);
      out += line;
    }
    out += "\n";
  }
  std::snprintf(line, sizeof line, "  %-40s", "step");
  out += line;
  for (const StepTime& t : times) {
    std::snprintf(line, sizeof line, " %14.6g", t.seconds);
    out += line;
  }
  out += "\n  dominated by:";
  for (const StepTime& t : times) out += std::string(&t == &times.front() ? " " : "; ") + t.transport + " " + t.dominant;
  out += "\n";
  return out;
}

std::string recompute_table(const TrainConfig& cfg, const MemoryPlacement& where, int ranks_per_node,
                            const DeviceRates& rates) {
  const int64_t L = cfg.model.n_layers;
  struct Row {
    std::string mode;
    int64_t interval = 0;
  };
  std::vector<Row> rows{{"full", 0}};
  int64_t last = L;  // recomputed blocks of the row before
  for (const int64_t n : {2, 3, 4, 6, 8, 16}) {
    const int64_t recomputed = ActivationCheckpointing::selected_blocks(n).recomputed_blocks(L);
    if (n > L || recomputed == last) continue;
    rows.push_back({"selected_blocks", n});
    last = recomputed;
  }
  rows.push_back({"none", 0});
  const std::string column = where.transport == "nccl" ? (where.prefetch ? "nccl+prefetch" : "nccl")
                                                       : (where.prefetch ? "mpi+prefetch" : "mpi");
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line,
                "\nrecompute at %dx%d (train.activation_checkpointing; the same bits in every row): the fullest rank's "
                "%s peak, the step over %s at these rates\n",
                where.dp_shard, where.dp_replicate, predict_rank_memory(cfg, where).device ? "GPU" : "host",
                column.c_str());
  out += line;
  for (const Row& row : rows) {
    TrainConfig c = cfg;
    c.train.activation_checkpointing = row.mode;
    c.train.activation_checkpointing_block_interval = row.interval;
    const int64_t recomputed =
        parse_activation_checkpointing(row.mode, row.interval).recomputed_blocks(L);
    double step = 0;
    for (const StepWork& w : predict_step_work(c, where, ranks_per_node))
      step = std::max(step, predict_step_time(w, rates, column).seconds);
    const bool current = row.mode == cfg.train.activation_checkpointing &&
                         row.interval == cfg.train.activation_checkpointing_block_interval;
    const std::string name = row.interval > 0 ? row.mode + ", block_interval " + std::to_string(row.interval) : row.mode;
    const std::string blocks = std::to_string(recomputed) + " of " + std::to_string(L) + " blocks recomputed";
    std::snprintf(line, sizeof line, "  %-36s %-28s %12s %12.6g s%s\n", name.c_str(), blocks.c_str(),
                  gib_text(static_cast<double>(predict_rank_memory(c, where).peak())).c_str(), step,
                  current ? "  (this config)" : "");
    out += line;
  }
  return out;
}

}  // namespace olmoref
