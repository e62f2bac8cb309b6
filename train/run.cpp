// train/run.cpp — one run around the trainer: where its state and data start (a fresh start, Hugging Face weights,
// an OLMo-core loader position, or a checkpoint: Trainer::resume) and the loop of `olmoref train` with its records,
// checkpoints and progress.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "interop/olmo_core_data.h"
#include "model/executors.h"
#include "train/eval.h"
#include "train/manifest.h"
#include "train/records.h"
#include "train/run_lock.h"
#include "train/trainer.h"
#include "train/weights.h"
#include "dist/gpu_map.h"

namespace olmoref {

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

void Trainer::set_initial_params(const FlatReader& read) {
  if (step_ != 0) throw std::logic_error("Trainer::set_initial_params after step " + std::to_string(step_));
  // This rank's range only, in blocks (a 4 MiB transient), the parts it holds uploaded.
  constexpr int64_t kBlock = int64_t{1} << 20;
  const int64_t lo = layout_.lo(), hi = layout_.hi();
  std::vector<float> block(static_cast<size_t>(std::min(hi - lo, kBlock)));
  const dist::Ranges held = placement_.held_parameters(layout_.rank);
  for (int64_t a = lo; a < hi; a += kBlock) {
    const int64_t b = std::min(hi, a + kBlock);
    read(a, b, block.data());
    for (const auto& [x, y] : held) {
      const int64_t c = std::max(a, x), d = std::min(b, y);
      if (c < d) params_.upload(block.data() + (c - a), d - c, c - lo);
    }
  }
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

ckpt::CheckpointMeta Trainer::load_checked_state(const std::string& dir, const ckpt::CheckpointMeta& expect,
                                                 const ckpt::LoadOptions& lo_opts, bool keep_moments,
                                                 const std::string& hint) {
  const std::vector<float> m_fresh = keep_moments ? dist::host_copy(m_) : std::vector<float>{};
  const std::vector<float> v_fresh = keep_moments ? dist::host_copy(v_) : std::vector<float>{};
  // Each rank reads only what it keeps, whatever layout (or executor) wrote the checkpoint (resharding): the
  // parameters of its shard's range and the moments of its optimizer range, piece by piece into its buffers (of the
  // parameters, the parts it holds), one frame per reading thread beyond them.
  const int64_t lo = layout_.lo(), hi = layout_.hi(), olo = layout_.optimizer_lo(), ohi = layout_.optimizer_hi();
  const dist::Ranges held = placement_.held_parameters(layout_.rank);
  auto sink = [&](int v, int64_t a, int64_t b, const float* data) {
    if (v != 0) {
      (v == 1 ? m_ : v_).upload(data, b - a, a - olo);
      return;
    }
    for (const auto& [x, y] : held) {
      const int64_t c = std::max(a, x), d = std::min(b, y);
      if (c < d) params_.upload(data + (c - a), d - c, c - lo);
    }
  };
  ckpt::LoadOptions read_opts = lo_opts;
  // The sink copies into executor memory: a device's copies stay on this thread (the one that owns the device).
  read_opts.threads = ex_->host_memory() ? pool_.size() : 1;
  ckpt::CheckpointMeta meta;
  try {
    meta = ckpt::load_ranges(dir, {{{lo, hi}, {olo, ohi}, {olo, ohi}}}, sink, layout_.total, expect, read_opts);
  } catch (const std::exception& e) {
    if (hint.empty()) throw;
    throw std::runtime_error(std::string(e.what()) + hint);
  }
  StateDigest& digest = *state_digest_;
  const bool same_p = digest(params_, dist::Span::shard, checkpoint_pieces_sent_) == meta.digests.params,
             same_m = digest(m_, dist::Span::optimizer, checkpoint_pieces_sent_) == meta.digests.adam_m,
             same_v = digest(v_, dist::Span::optimizer, checkpoint_pieces_sent_) == meta.digests.adam_v;
  if (!same_p || !same_m || !same_v)
    throw std::runtime_error(dir + "/manifest.json: loaded state does not match the whole-state digests" + hint);
  if (keep_moments) {
    upload_held(m_, m_fresh.data());
    upload_held(v_, v_fresh.data());
  }
  return meta;
}

void Trainer::resume(const std::string& dir, const ResumeOptions& opts) {
  ckpt::CheckpointMeta expect;
  expect.model_hash = cfg_.model_hash();
  expect.resume_hash = cfg_.resume_hash();
  expect.dataset_fingerprint = source_ ? source_->fingerprint() : "";
  ckpt::LoadOptions lo;
  lo.ignore_fingerprint_mismatch = opts.ignore_fingerprint_mismatch;
  lo.allow_config_change = opts.allow_config_change;
  const ckpt::CheckpointMeta meta = load_checked_state(dir, expect, lo, opts.skip_moments, "");
  if (!opts.skip_step) step_ = meta.step;
  // load_ranges refused a data_history that contradicts the manifest; a checkpoint without one leaves the steps
  // before it unknown, so this run's checkpoints record none either.
  history_ = meta.data_history.is_object() ? ckpt::DataHistory::from_json(meta.data_history) : ckpt::DataHistory{};
  history_known_ = meta.data_history.is_object() || meta.step == 0;
  const bool has_adamw_step = meta.optimizer_state.is_object() && meta.optimizer_state.contains("adamw_step");
  if (!cfg_.optim.skip_step())
    adam_step_offset_ = has_adamw_step ? meta.optimizer_state.at("adamw_step").get<int64_t>() - meta.step : 0;
  if (cfg_.optim.skip_step()) {
    // A checkpoint of a plain AdamW run (a resume with --allow-config-change) took every step and has no windows.
    if (meta.optimizer_state.is_object() && !has_adamw_step) {
      try {
        skip_ = SkipStepState::from_json(meta.optimizer_state);
      } catch (const std::exception& e) {
        throw std::runtime_error(dir + "/manifest.json: " + e.what());
      }
    } else {
      skip_ = SkipStepState{};
      skip_.step = static_cast<float>(has_adamw_step ? meta.optimizer_state.at("adamw_step").get<int64_t>() : meta.step);
    }
    // TEST ONLY negative control (tests/train): forgetting the windows, as OLMo-core's own resume does, must make
    // resume-check report the steps that follow as different.
    if (opts.drop_skip_windows) {
      skip_.losses.clear();
      skip_.grad_norms.clear();
    }
  }
  tokens_ = meta.tokens;
  if (source_ && !opts.skip_loader)
    source_->restore(loader_state_for_resume(meta.loader_state, cfg_, opts.allow_config_change),
                     opts.ignore_fingerprint_mismatch);
}

void Trainer::init_from_checkpoint(const std::string& dir, bool load_optimizer) {
  if (step_ != 0) throw std::logic_error("Trainer::init_from_checkpoint after step " + std::to_string(step_));
  // The model was compared key by key before the run began (resolve_checkpoint_init); the hash is the last guard,
  // over every key but the RoPE ones this run may change (the checkpoint's model_hash has its source's).
  ckpt::CheckpointMeta expect;
  TrainConfig as_written = cfg_;
  as_written.model = with_rope_of(cfg_.model, load_checkpoint_config(dir).model);
  expect.model_hash = as_written.model_hash();
  const ckpt::CheckpointMeta meta = load_checked_state(
      dir, expect, ckpt::LoadOptions{}, !load_optimizer,
      "\n(config key 'init.checkpoint' = " + dir + ": restore that checkpoint, or point init.checkpoint at another; "
      "olmoref ckpt verify " + dir + " lists every problem)");
  if (!load_optimizer) return;
  // The source's optimizer step count: SkipStepAdamW's fp32 state["step"] (steps not skipped), a plain AdamW run's
  // recorded count when it too started from a checkpoint, else its step.
  const nlohmann::json& os = meta.optimizer_state;
  float count = static_cast<float>(meta.step);
  try {
    if (os.is_object() && os.contains("adamw_step")) count = static_cast<float>(os.at("adamw_step").get<int64_t>());
    else if (os.is_object()) count = SkipStepState::from_json(os).step;
  } catch (const std::exception& e) {
    throw std::runtime_error(dir + "/manifest.json: optimizer_state: " + e.what());
  }
  if (cfg_.optim.skip_step()) {
    skip_ = SkipStepState{};
    skip_.step = count;
  } else {
    adam_step_offset_ = static_cast<int64_t>(count);
  }
}

FaultInjection FaultInjection::parse(const std::string& spec) {
  const auto a = spec.find(':'), b = a == std::string::npos ? a : spec.find(':', a + 1);
  FaultInjection f;
  try {
    if (b == std::string::npos) throw std::invalid_argument(spec);
    f.rank = std::stoi(spec.substr(0, a));
    f.step = std::stoll(spec.substr(a + 1, b - a - 1));
  } catch (const std::exception&) {
    throw std::invalid_argument("OLMOREF_TEST_FAULT='" + spec + "': expected RANK:STEP:die or RANK:STEP:hang "
                                "(e.g. 1:3:die); unset it to run without a fault");
  }
  f.kind = spec.substr(b + 1);
  return f;
}

namespace {
// The rank dies (SIGKILL, no clean-up, as a crashed node) or hangs (the others' watchdog must abort the job).
[[noreturn]] void inject_fault(const FaultInjection& f) {
  std::fprintf(stderr, "rank %d: test fault '%s' at step %lld\n", f.rank, f.kind.c_str(), static_cast<long long>(f.step));
  if (f.kind == "die") ::raise(SIGKILL);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // hang
}

// The loader's data-parallel world: the groups that take micro-batches (a context-parallel group of cp_degree ranks
// takes one, BatchSplit; rank r is in group r·groups/world). It shapes only the loader's checks and audit, never the
// data order.
int loader_world(const TrainConfig& cfg, int world) {
  return cfg.train.cp_degree > 1 && world % cfg.train.cp_degree == 0 ? world / static_cast<int>(cfg.train.cp_degree)
                                                                      : world;
}

// A resume is checked in full before anything is touched (the manifest against this run's config and data, the
// loader state against the data, the records against the checkpoint), then the records past the checkpoint are cut.
// Returns the step the records begin again at (--new-records), else 0. Collective.
int64_t check_resume(const TrainConfig& cfg, const RunOptions& opts, const std::string& resume_dir, dist::Comm& comm,
                     bool quiet) {
  const std::string& out_dir = opts.out_dir;
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;
  int64_t records_begin = 0;
  // A refused resume leaves the run directory as it was.
  const int groups = loader_world(cfg, world);
  std::unique_ptr<BatchSource> probe = make_batch_source(cfg, "", false, groups, rank * groups / world);
  ckpt::CheckpointMeta expect;
  expect.model_hash = cfg.model_hash();
  expect.resume_hash = cfg.resume_hash();
  expect.dataset_fingerprint = probe->fingerprint();
  ckpt::LoadOptions lo;
  lo.ignore_fingerprint_mismatch = opts.resume_opts.ignore_fingerprint_mismatch;
  lo.allow_config_change = opts.resume_opts.allow_config_change;
  if (!lo.allow_config_change) {
    // The keys that differ, named: the checkpoint's own check (below) can only say that some do. A config it cannot
    // read (another version's) leaves that check to say so.
    std::vector<std::string> differ;
    try {
      const TrainConfig recorded = load_checkpoint_config(resume_dir);
      if (recorded.model_hash() == cfg.model_hash() && recorded.resume_hash() != cfg.resume_hash())
        differ = resume_key_differences(recorded, cfg);
    } catch (const std::exception&) {
    }
    if (!differ.empty()) {
      std::string keys;
      for (const std::string& d : differ) keys += "\n  " + d;
      throw std::runtime_error(resume_dir + "/manifest.json: the run configuration differs from the checkpoint's in (" +
                               "recorded -> now):" + keys + "\nresuming would not continue the same run: set the " +
                               "recorded values (olmoref ckpt inspect " + resume_dir + " prints its config), or pass " +
                               "--allow-config-change to resume anyway");
    }
  }
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
  return records_begin;
}

// Where the run's state and data start: the init, Hugging Face weights, an OLMo-core loader position, or a checkpoint.
void start_state(Trainer& trainer, const TrainConfig& cfg, const RunOptions& opts, const std::string& resume_dir,
                 bool quiet) {
  // [init] hf_dir: the run starts from those weights (their SHA-256 is in the config, so in every manifest and in
  // resume_hash); a resume takes the checkpoint's weights instead.
  // Each rank reads only its slices of the safetensors files; their SHA-256 was resolved (or checked against the
  // pinned one) before the run started (resolve_hf_init).
  if (resume_dir.empty() && !cfg.init.hf_dir.empty()) {
    require_hf_form(cfg, "Hugging Face import");
    const ProcessStats before = process_stats();
    const HfWeights hf(cfg.init.hf_dir, cfg.model, ParamLayout(cfg.model));
    trainer.set_initial_params([&hf](int64_t a, int64_t b, float* out) { hf.read(a, b, out); });
    if (opts.report_memory)
      std::fprintf(stderr, "memory: rank %d after init.hf_dir: read %lld bytes (rchar)\n", trainer.comm().rank(),
                   static_cast<long long>(process_stats().read_chars - before.read_chars));
  }
  // [init] checkpoint: a new run from another run's checkpoint (its manifest checksum is in the config); a resume of
  // this run takes its own checkpoint instead.
  if (resume_dir.empty() && !cfg.init.checkpoint.empty()) {
    trainer.init_from_checkpoint(cfg.init.checkpoint, cfg.init.load_optimizer);
    if (!quiet)
      std::fprintf(stderr, "olmoref train: starting from %s (manifest_xxh3 %s): its weights%s; step, schedule and "
                           "data start fresh\n",
                   cfg.init.checkpoint.c_str(), cfg.init.checkpoint_xxh3.c_str(),
                   cfg.init.load_optimizer ? " and optimizer state" : " only (init.load_optimizer = false)");
  }
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
    const ProcessStats before = process_stats();
    trainer.resume(resume_dir, opts.resume_opts);
    if (opts.report_memory) {
      const ProcessStats after = process_stats();
      std::fprintf(stderr, "memory: rank %d after resume: peak resident (VmHWM) %lld bytes, read %lld bytes (rchar), "
                           "%lld from storage (read_bytes)\n",
                   trainer.comm().rank(), static_cast<long long>(after.peak_resident),
                   static_cast<long long>(after.read_chars - before.read_chars),
                   static_cast<long long>(after.read_bytes - before.read_bytes));
    }
    if (!quiet)
      std::fprintf(stderr, "olmoref train: resumed from %s at step %lld\n", resume_dir.c_str(),
                   static_cast<long long>(trainer.step()));
  }
}

// What this run is and where it starts, on stderr.
void print_run_start(Trainer& trainer, const TrainConfig& cfg, const std::string& out_dir, int64_t stop,
                     dist::Comm& comm) {
  const int64_t total = cfg.train.steps;
  const int world = comm.size(), rank = comm.rank();
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
  if (trainer.cp() > 1)
    std::fprintf(stderr, "olmoref train: context parallelism over groups of %d ranks; each computes %lld positions of "
                 "every instance (rank 0: 0..%lld)\n",
                 trainer.cp(), static_cast<long long>(cfg.train.seq_len / trainer.cp()),
                 static_cast<long long>(cfg.train.seq_len / trainer.cp() - 1));
}

// Communication volume per rank per step against a ring all-reduce of the same fp32 gradients.
void print_comm_report(const Trainer& trainer, dist::Comm& comm, int64_t done) {
  const int world = comm.size(), rank = comm.rank();
  const double n = static_cast<double>(trainer.n_params()) * 4.0;
  const double ring = world > 1 ? 2.0 * n * (world - 1) / world : 0.0;
  const double steps = static_cast<double>(std::max<int64_t>(done, 1));
  char ep_part[200] = "", resident[48] = "", grad_part[220] = "";  // one write per rank: lines do not interleave
  if (trainer.ep() > 1)
    std::snprintf(ep_part, sizeof ep_part,
                  "; state pieces for step digests %.3f MiB/step, for checkpoints and evals %.3f MiB/step; "
                  "expert all-to-all %.3f MiB/step",
                  static_cast<double>(trainer.digest_pieces_sent()) / steps / (1 << 20),
                  static_cast<double>(trainer.checkpoint_pieces_sent()) / steps / (1 << 20),
                  static_cast<double>(trainer.ep_bytes_sent()) / steps / (1 << 20));
  if (trainer.gradient_peak_bytes() >= 0)
    std::snprintf(grad_part, sizeof grad_part,
                  "; gradient buffers peak %.4f MiB, longest %.4f MiB (the flat vector %.4f MiB); gradient exchange "
                  "%.4f s/step",
                  static_cast<double>(trainer.gradient_peak_bytes()) / (1 << 20),
                  static_cast<double>(trainer.gradient_longest_buffer_bytes()) / (1 << 20), n / (1 << 20),
                  trainer.gradient_exchange_seconds() / steps);
  if (const int64_t r = trainer.state_resident_bytes(); r >= 0)
    std::snprintf(resident, sizeof resident, " (%.2f MiB resident)", static_cast<double>(r) / (1 << 20));
  // Then the bytes of each operation in the whole run (`olmoref config --time` predicts the per-step ones), one write
  // per rank so that ranks' lines do not interleave.
  char line[1024];
  std::snprintf(line, sizeof line,
                "rank %d: sent %.3f MiB/step (ring all-reduce of the gradients: %.3f MiB), state %.2f MiB%s%s%s\n", rank,
                static_cast<double>(trainer.bytes_sent()) / steps / (1 << 20), ring / (1 << 20),
                static_cast<double>(trainer.state_bytes()) / (1 << 20), resident, grad_part, ep_part);
  std::string text = line;
  if (const auto [prefetched, on_the_spot] = trainer.unit_gathers(); prefetched + on_the_spot > 0) {
    std::snprintf(line, sizeof line, "rank %d: FSDP unit gathers in %lld steps: %lld prefetched, %lld on the spot\n",
                  rank, static_cast<long long>(done), static_cast<long long>(prefetched),
                  static_cast<long long>(on_the_spot));
    text += line;
  }
  // The MPI transport's host staging of the exchanges (page-locked on a device): made once per step and kept through
  // it, so the count grows with the steps, not with the units.
  if (const Executor::StagingStats& st = trainer.executor().staging_stats(); st.allocations > 0) {
    const char* kind = trainer.executor().staging_pinned() ? "page-locked" : "pageable";
    std::snprintf(line, sizeof line, "rank %d: exchange staging in %lld steps: %lld blocks made, peak %lld bytes (%s)\n",
                  rank, static_cast<long long>(done), static_cast<long long>(st.allocations),
                  static_cast<long long>(st.peak_bytes), kind);
    text += line;
  }
  for (const auto& [what, bytes] : trainer.bytes_sent_by_what()) {
    std::snprintf(line, sizeof line, "rank %d: sent %llu bytes in %lld steps: %s\n", rank,
                  static_cast<unsigned long long>(bytes), static_cast<long long>(done), what.c_str());
    text += line;
  }
  std::fputs(text.c_str(), stderr);
}

// One rank per GPU (dist/gpu_map.h), before the executor is made or anything is allocated, so that no rank's CUDA
// context lands on another rank's device: each rank's local rank picks the device, every rank's choice is gathered,
// and two ranks of a node on one GPU are refused (every rank judges the same slots, so all stop together) unless
// --allow-shared-gpu. Returns every rank's slot, in rank order; empty when the executor drives no device.
std::vector<dist::GpuSlot> place_ranks_on_gpus(const TrainConfig& cfg, const RunOptions& opts) {
  const bool fake = opts.fake_gpus > 0;
  if (cfg.train.executor != "cuda" && !(fake && cfg.train.executor == "cuda-host")) return {};
  const int count = fake ? opts.fake_gpus : cuda_device_count();
  if (count == 0) return {};  // executor_unavailable() says why, next
  dist::Comm& comm = opts.parallel.comm ? *opts.parallel.comm : dist::world(opts.comm_timeout_s);
  const std::unique_ptr<dist::Comm> node = comm.split_node();
  dist::GpuSlot mine;
  mine.world_rank = comm.rank();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  mine.host = host;
  int first = comm.rank();  // the node's first world rank names the node
  std::vector<int> members(static_cast<size_t>(node->size()));
  node->allgather(&first, sizeof first, members.data(), "the node's ranks");
  mine.node = *std::min_element(members.begin(), members.end());
  mine.device = dist::device_for_local_rank(node->rank(), count);
  if (fake) {
    mine.id = "fake-gpu-" + std::to_string(mine.device);
    mine.name = "stand-in (OLMOREF_TEST_FAKE_GPUS)";
  } else {
    use_cuda_device(mine.device, &mine.id, &mine.name);
  }
  std::vector<dist::GpuSlot> slots = dist::gather_gpu_slots(comm, mine);
  dist::check_gpu_sharing(slots, opts.allow_shared_gpu, opts.parallel.transport == dist::Transport::nccl);
  return slots;
}

}  // namespace

std::vector<TraceRecord> run_training(const TrainConfig& cfg, const RunOptions& opts) {
  namespace fs = std::filesystem;
  const std::string& out_dir = opts.out_dir;
  // A run of no steps would exit 0 with an empty trace and no checkpoint: nothing a user asked for.
  if (cfg.train.steps < 1)
    throw std::invalid_argument("train.steps is " + std::to_string(cfg.train.steps) + ": a run trains at least one "
                                "step; set train.steps or --steps");
  const std::vector<dist::GpuSlot> gpus = place_ranks_on_gpus(cfg, opts);
  // Before anything is created or cut: an executor that cannot run here is one line, never a crash mid-run.
  if (const std::string why = executor_unavailable(cfg.train.executor); !why.empty())
    throw std::runtime_error("--executor " + cfg.train.executor + ": " + why);
  // What grows with the global batch is checked against the data, then against memory, before any of it is built.
  check_global_batch_fits_data(cfg);
  Parallelism fit = opts.parallel;
  fit.no_steps = opts.stop_after == 0;
  check_run_fits(cfg, fit, *make_executor(cfg.train.executor, nullptr), static_cast<int>(opts.threads));
  fs::create_directories(out_dir);
  const std::string ckpt_root = out_dir + "/checkpoints";
  const int64_t total = cfg.train.steps;
  const int64_t stop = opts.stop_after >= 0 ? std::min(opts.stop_after, total) : total;
  std::string resume_dir = opts.resume_from;
  // A fresh run into a directory that holds a resumable run would overwrite its trace and, by retention, its
  // checkpoints: refused before anything is touched.
  if (!opts.resume && resume_dir.empty()) {
    if (const auto newest = ckpt::newest_complete(ckpt_root))
      throw std::runtime_error(out_dir + " already holds a run (checkpoint " + *newest +
                               "): pass --resume to continue it, or choose another --out; to start over, delete " +
                               out_dir + " first");
    // So does one that holds only a run's records (a --no-checkpoint run, or one stopped before its first
    // checkpoint): nothing can resume it, but its trace and audit logs are what a comparison or leakcheck reads.
    for (const auto& entry : fs::directory_iterator(out_dir)) {
      const std::string name = entry.path().filename().string();
      if (is_run_record_name(name) && entry.is_regular_file() && entry.file_size() > 0)
        throw std::runtime_error(out_dir + " holds the records of an earlier run (" + name +
                                 ") and no checkpoint to resume it from: choose another --out; to start over, delete " +
                                 out_dir + " first");
    }
  }
  std::string before_newest;  // --resume: the complete checkpoint before the one it takes, if any
  std::vector<std::string> passed_over;  // --resume: later checkpoint directories whose write never finished
  if (opts.resume && resume_dir.empty()) {
    const std::vector<std::string> complete = ckpt::list_complete(ckpt_root);
    if (complete.empty())
      throw std::runtime_error(ckpt_root + ": no complete checkpoint to resume from (run without --resume to start fresh)");
    resume_dir = complete.back();
    if (complete.size() > 1) before_newest = complete[complete.size() - 2];
    // A later write that never completed (no manifest: the run stopped inside it) is passed over; said below.
    const std::string newest_name = fs::path(resume_dir).filename().string();
    for (const auto& entry : fs::directory_iterator(ckpt_root)) {
      const std::string name = entry.path().filename().string();
      const size_t at = name.find("step");
      if (entry.is_directory() && (at == 0 || name.rfind(".tmp-step", 0) == 0) && name.substr(at) > newest_name &&
          !fs::exists(entry.path() / "manifest.json"))
        passed_over.push_back(entry.path().string());
    }
  }
  dist::Comm& comm = opts.parallel.comm ? *opts.parallel.comm : dist::world(opts.comm_timeout_s);
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;  // rank 0 writes the trace and manifest and reports progress
  const RunDirLock run_lock(out_dir, comm);  // one writer per run directory, before anything in it is touched
  const bool quiet = opts.quiet || !lead;
  if (lead)
    for (const std::string& dir : passed_over)
      std::fprintf(stderr, "resume: %s is an incomplete checkpoint (no manifest.json: its write never finished); "
                           "resuming from %s\n", dir.c_str(), resume_dir.c_str());
  // One audit log per rank process: each holds the micro-batches that rank computed. Under context parallelism one per
  // group, written by the rank that holds the group's micro-batches (BatchSplit) and named by the group: the logs of
  // the data-parallel run with one rank per group.
  const int groups = loader_world(cfg, world), group = rank * groups / world;
  const bool holds_microbatches = rank % (world / groups) == world / groups - 1;
  char audit_name[64];
  std::snprintf(audit_name, sizeof audit_name, groups == 1 ? "audit.jsonl" : "audit-rank%05d.jsonl", group);
  const std::string audit_path = cfg.data.audit && holds_microbatches ? out_dir + "/" + audit_name : "";
  // > 0: --new-records, written on the first trace record (docs/formats/trace.md)
  int64_t records_begin = resume_dir.empty() ? 0 : check_resume(cfg, opts, resume_dir, comm, quiet);
  Parallelism par = opts.parallel;
  par.comm = &comm;
  par.no_steps = opts.stop_after == 0;
  // start_state loads the resumed checkpoint, or init.checkpoint's, over every parameter.
  par.weights_from_checkpoint = !resume_dir.empty() || !cfg.init.checkpoint.empty();
  Trainer trainer(cfg, opts.threads, make_batch_source(cfg, audit_path, !resume_dir.empty(), groups, group), par);
  if (!opts.optim_dump_dir.empty()) trainer.dump_optimizer_to(opts.optim_dump_dir);
  try {
    start_state(trainer, cfg, opts, resume_dir, quiet);
  } catch (const std::exception& e) {
    // A checkpoint that cannot be read is damaged; the run need not end with it when an earlier one is whole.
    if (before_newest.empty()) throw;
    throw std::runtime_error(std::string(e.what()) + "\n" + resume_dir + " cannot be loaded (`olmoref ckpt verify " +
                             resume_dir + "` checks it); the checkpoint before it is " + before_newest +
                             ": resume from it with --resume-from " + before_newest);
  }
  TraceWriter trace;
  if (lead) {
    nlohmann::json gpu_record = nullptr;
    if (!gpus.empty()) {
      gpu_record = nlohmann::json::array();
      for (const dist::GpuSlot& g : gpus)
        gpu_record.push_back({{"rank", g.world_rank}, {"host", g.host}, {"device", g.device}, {"id", g.id},
                              {"name", g.name}});
      if (!quiet)
        for (const dist::GpuSlot& g : gpus)
          std::fprintf(stderr, "gpu: rank %d on %s: device %d (%s, %s)\n", g.world_rank, g.host.c_str(), g.device,
                       g.name.c_str(), g.id.c_str());
    }
    write_run_manifest(out_dir + "/manifest.json", cfg, trainer.pool().size(), trainer.layout().dp_shard,
                       trainer.layout().dp_replicate, trainer.ep(), gpu_record, opts.allow_shared_gpu,
                       dist::transport_name(opts.parallel.transport));
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
  if (!quiet) print_run_start(trainer, cfg, opts.out_dir, stop, comm);
  std::vector<TraceRecord> records;
  double elapsed = 0.0;
  int64_t done = 0;
  while (trainer.step() < stop) {
    if (rank == opts.fault.rank && trainer.step() + 1 == opts.fault.step) inject_fault(opts.fault);
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
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f  grad_norm %.4f  lr %.3e  %.0f tok/s  step %.4f s  digest %.4f s  %s\n",
                   static_cast<long long>(s), static_cast<long long>(total), res.record.loss, res.record.grad_norm,
                   res.record.lr, tps, res.seconds, res.digest_seconds, res.record.param_digest.substr(0, 12).c_str());
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
      // --report-memory: the write's own peak, its transients measured apart from the step's (a fresh peak).
      const bool measured = opts.report_memory && reset_peak_resident();
      const ProcessStats before = process_stats();
      const std::string dir = trainer.save_checkpoint(ckpt_root);
      if (!quiet) std::fprintf(stderr, "checkpoint %s\n", dir.c_str());
      if (measured) {
        const ProcessStats after = process_stats();
        std::fprintf(stderr, "memory: rank %d checkpoint write at step %lld: peak resident (VmHWM) %lld bytes, wrote %lld "
                             "bytes (wchar)\n",
                     comm.rank(), static_cast<long long>(s), static_cast<long long>(after.peak_since_reset),
                     static_cast<long long>(after.write_chars - before.write_chars));
      }
    }
  }
  if (!quiet && done > 0)
    std::fprintf(stderr, "done: %lld steps in %.1f s (%.0f tok/s); trace %s/trace.jsonl\n", static_cast<long long>(done),
                 elapsed, static_cast<double>(done * cfg.train.global_batch_instances * cfg.train.seq_len) / elapsed,
                 out_dir.c_str());
  if (opts.parallel.profile_ops && lead)
    std::fprintf(stderr, "per-op time over %lld steps (each op timed between device synchronizations):\n%s",
                 static_cast<long long>(done), trainer.op_profile().c_str());
  if (opts.report_comm) print_comm_report(trainer, comm, done);
  return records;
}

}  // namespace olmoref
