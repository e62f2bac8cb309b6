#include "cli/data_commands.h"

#include <limits>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/leakcheck.h"
#include "data/planted_bugs.h"
#include "interop/megatron_data.h"
#include "interop/olmo_core_data.h"
#include "train/batch_source.h"
#include "train/config.h"

namespace olmoref::data {

namespace {

struct LeakArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = -1;
  bool epoch = false;
  LeakCheckOptions opt;
  int64_t eos = -1;
  std::string report;
  bool quiet = false;
  bool no_audit = false, no_content = false, no_attribution = false;
  bool old_strict = false, old_no_static = false;  // flags of olmoref-leakcheck/1, refused with what replaced them
  // Another framework's run (interop/megatron_data.h).
  std::string megatron_cache, megatron_data, megatron_split = "train", megatron_checkpoint;
  int64_t megatron_global_batch = 0, megatron_micro_batch = 0;
  bool megatron_no_extra_token = false;
  std::string olmo_core_work_dir, olmo_core_checkpoint;
  int64_t olmo_core_seed = -1, olmo_core_pad_id = -1, olmo_core_bos_id = -1;
  std::string debug_bug;
};

void write_and_print(const LeakArgs& a, const LeakReport& rep) {
  if (!a.report.empty()) {
    const std::string tmp = a.report + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << rep.json.dump(2) << "\n";
      if (!out) throw std::runtime_error(a.report + ": cannot write the report");
    }
    if (std::rename(tmp.c_str(), a.report.c_str()) != 0) throw std::runtime_error(a.report + ": cannot write the report");
  }
  if (!a.quiet) {
    std::fputs(rep.summary.c_str(), stdout);
    if (!a.report.empty()) std::printf("report: %s\n", a.report.c_str());
  }
  if (rep.exit_code() != 0) throw CLI::RuntimeError(rep.exit_code());
}

// The options every mode shares; the caller adds what its stream needs.
LeakCheckOptions base_options(const LeakArgs& a, const TrainConfig& cfg) {
  LeakCheckOptions o = a.opt;
  o.config_path = a.config;
  if (a.eos >= 0 && a.eos >= cfg.model.vocab_size)
    throw std::invalid_argument("--eos " + std::to_string(a.eos) + " is not an id of the vocabulary (model.vocab_size " +
                                std::to_string(cfg.model.vocab_size) + "): the holdout would be one document");
  if (a.eos >= 0) o.eos_id = static_cast<uint32_t>(a.eos);
  o.attribute = !a.no_attribution;
  o.eval_interval = cfg.eval.interval;
  return o;
}

// A Megatron run: its GPTDataset index cache and token files give the samples of every iteration; the config says
// only how to read the holdout (data.holdout_*, dtype, eos_id, vocabulary, train.seq_len for its instances).
void run_megatron(LeakArgs& a, const TrainConfig& cfg) {
  if (a.megatron_data.empty()) throw std::invalid_argument("--megatron-cache needs --megatron-data PREFIX (the .bin/.idx prefix)");
  if (a.megatron_global_batch <= 0) throw std::invalid_argument("--megatron-cache needs --megatron-global-batch (the run's --global-batch-size)");
  LoaderConfig lc;
  lc.holdout = holdout_spec(cfg.data);
  if (lc.holdout.kind == HoldoutKind::none)
    throw std::invalid_argument("leakcheck: the config has no holdout (set data.holdout_mix or data.holdout_files)");
  DatasetOptions d = dataset_options(cfg);
  d.allow_short_files = true;
  lc.dataset = std::make_shared<FslDataset>(lc.holdout.mix, d);  // only its reading options are used
  lc.global_batch_instances = cfg.train.global_batch_instances;
  lc.microbatch_instances = cfg.train.micro_batch_instances;
  const auto samples = std::make_shared<interop::MegatronGptSamples>(a.megatron_cache, a.megatron_data, a.megatron_split,
                                                                     !a.megatron_no_extra_token);
  ExternalStream ext;
  ext.framework = "megatron";
  ext.source = a.megatron_data + ".bin";
  ext.piece_tokens = samples->sample_tokens();
  ext.pieces_per_step = a.megatron_global_batch;
  ext.pieces_per_microbatch = a.megatron_micro_batch;
  ext.steps = samples->samples() / a.megatron_global_batch;
  ext.read = [samples](int64_t k, std::span<uint32_t> out) { samples->read(k, out); };
  ext.info = {{"cache", a.megatron_cache}, {"indices", samples->base()}, {"description", samples->description()},
              {"data_prefix", a.megatron_data}, {"token_dtype", samples->dataset().dtype_name()},
              {"sequences", samples->dataset().sequences()}, {"samples", samples->samples()},
              {"sequence_length", samples->sequence_length()}, {"add_extra_token_to_sequence", !a.megatron_no_extra_token}};
  LeakCheckOptions o = base_options(a, cfg);
  o.external = &ext;
  o.steps = a.steps >= 0 ? a.steps : 0;  // default: every whole iteration the indices hold
  if (!a.megatron_checkpoint.empty()) {
    if (a.steps >= 0) throw std::invalid_argument("give --steps or --megatron-checkpoint, not both");
    o.steps = interop::megatron_checkpoint_iteration(a.megatron_checkpoint);
    ext.info["checkpoint"] = a.megatron_checkpoint;
    ext.info["checkpoint_iteration"] = o.steps;
    if (o.steps == 0) throw std::invalid_argument(a.megatron_checkpoint + ": the checkpoint is at iteration 0: nothing was trained");
  }
  write_and_print(a, run_leakcheck(lc, o));
}

// An OLMo-core run: the config names its token files (in its dataset's order), sequence length, global batch
// (instances) and seed; the global instance order of each epoch is read from the data loader's work directory.
void run_olmo_core(LeakArgs& a, const TrainConfig& cfg) {
  LoaderConfig lc = loader_config(cfg);  // run_leakcheck refuses a config without a holdout
  const auto ds = lc.dataset;
  const int64_t G = lc.global_batch_instances;
  int64_t seed = a.olmo_core_seed >= 0 ? a.olmo_core_seed : static_cast<int64_t>(cfg.data.seed);
  // The checkpoint (when given) says how far the run went, which seed its loader used, and which data it read.
  nlohmann::json checkpoint_info;
  int64_t checkpoint_step = -1;
  if (!a.olmo_core_checkpoint.empty()) {
    if (a.steps >= 0) throw std::invalid_argument("give --steps or --olmo-core-checkpoint, not both");
    if (a.olmo_core_pad_id < 0)
      throw std::invalid_argument("--olmo-core-checkpoint needs --olmo-core-pad-id (the run's pad_token_id, part of "
                                  "OLMo-core's dataset fingerprint)");
    const interop::OlmoCoreCheckpoint c = interop::read_olmo_core_checkpoint(a.olmo_core_checkpoint);
    const std::string fp = interop::check_olmo_core_checkpoint(c, *ds, a.olmo_core_pad_id, a.olmo_core_bos_id);
    const int64_t ck_seed = c.data_loader["seed"].get<int64_t>();
    if (a.olmo_core_seed >= 0 && a.olmo_core_seed != ck_seed)
      throw std::invalid_argument("--olmo-core-seed " + std::to_string(a.olmo_core_seed) + " but the checkpoint's loader used seed " +
                                  std::to_string(ck_seed));
    seed = ck_seed;
    checkpoint_step = c.global_step;
    checkpoint_info = {{"state", c.state_path}, {"global_step", c.global_step}, {"data_loader", c.data_loader}, {"fingerprint", fp}};
  }
  const auto order =
      std::make_shared<interop::OlmoCoreOrder>(a.olmo_core_work_dir, ds->size(), G, seed, ds->chunk_instances());
  ExternalStream ext;
  ext.framework = "olmo-core";
  ext.source = ds->mix().source;
  ext.piece_tokens = ds->sequence_length();
  ext.pieces_per_step = G;
  ext.pieces_per_microbatch = lc.microbatch_instances;
  ext.steps = order->steps();
  ext.steps_per_epoch = order->batches_per_epoch();
  ext.read = [order, ds, G](int64_t piece, std::span<uint32_t> out) {
    ds->read_instance(order->instance(piece / G + 1, piece % G), out);
  };
  ext.locate = [order, ds, G](int64_t piece) {
    const FslDataset::Location loc = ds->locate(order->instance(piece / G + 1, piece % G));
    return std::make_pair(ds->file(static_cast<size_t>(loc.file)).path(), loc.token_start);
  };
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : order->files()) files.push_back({{"path", f.path}, {"epoch", f.epoch}, {"seed", f.seed}, {"chunk", f.chunk}});
  ext.info = {{"work_dir", a.olmo_core_work_dir}, {"global_indices", files}, {"seed", order->seed()},
              {"dataset_size", ds->size()}, {"batches_per_epoch", order->batches_per_epoch()},
              {"global_batch_tokens", G * ds->sequence_length()}};
  LeakCheckOptions o = base_options(a, cfg);
  o.external = &ext;
  o.steps = a.steps >= 0 ? a.steps : 0;  // default: every step the saved orders cover
  if (checkpoint_step >= 0) {
    if (checkpoint_step == 0) throw std::invalid_argument(a.olmo_core_checkpoint + ": the checkpoint is at step 0: nothing was trained");
    o.steps = checkpoint_step;
    ext.info["checkpoint"] = checkpoint_info;
  }
  write_and_print(a, run_leakcheck(lc, o));
}

void run(LeakArgs& a) {
  if (a.old_strict)
    throw std::invalid_argument("--strict is gone: overlap the training data itself delivers now fails by default; accept "
                                "known overlaps with --allow-data-overlap or --accept FILE (docs/formats/leakcheck.md)");
  if (a.old_no_static)
    throw std::invalid_argument("--no-static is gone: the cause of each contaminated document is found without a static "
                                "scan; --no-attribution skips it (causes are then 'unknown')");
  const TrainConfig cfg = load_config(a.config, a.overrides);
  if (!a.megatron_cache.empty() && !a.olmo_core_work_dir.empty())
    throw std::invalid_argument("give --megatron-cache or --olmo-core-work-dir, not both");
  if (!a.megatron_cache.empty() || !a.olmo_core_work_dir.empty()) {
    if (a.epoch || a.opt.world_size != 1 || !a.opt.layouts.empty() || !a.opt.resume_at.empty())
      throw std::invalid_argument("--epoch, --world-size, --layouts and --resume-at describe olmoref's loader; another "
                                  "framework's run is checked over every step its files hold, or --steps / its checkpoint");
    if (!a.debug_bug.empty())
      throw std::invalid_argument("--debug-plant-bug applies to olmoref's loader, not another framework's run");
  }
  if (!a.megatron_cache.empty()) {
    run_megatron(a, cfg);
    return;
  }
  if (!a.olmo_core_work_dir.empty()) {
    run_olmo_core(a, cfg);
    return;
  }
  LoaderConfig lc = loader_config(cfg);
  if (!a.debug_bug.empty()) lc.debug_bug = parse_planted_bug(a.debug_bug);
  LeakCheckOptions o = base_options(a, cfg);
  o.whole_epoch = a.epoch;
  o.steps = a.steps >= 0 ? a.steps : cfg.train.steps;
  o.audit_checks = !a.no_audit;
  o.content_check = !a.no_content;
  write_and_print(a, run_leakcheck(lc, o));
}

}  // namespace

void register_leak_commands(CLI::App& app) {
  auto a = std::make_shared<LeakArgs>();
  CLI::App* c = app.add_subcommand(
      "leakcheck",
      "Holdout leakage detector: exact/near overlap of the holdout with the training stream as the loader delivers "
      "it, and loader audits (partition, exactly-once, resume, layouts). Exit 0 clean, 1 found, 2 could not check");
  c->add_option("--config", a->config, "Run configuration (TOML), the same file `olmoref train` reads")->required();
  c->add_option("--set", a->overrides, "Override a config key: --set section.key=value (repeatable)");
  auto* steps = c->add_option("--steps", a->steps, "Steps of the stream to check (default: train.steps)")->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  c->add_flag("--epoch", a->epoch, "Check the whole first epoch")->excludes(steps);
  LeakLevels& lv = a->opt.levels;
  c->add_option("--min-span", lv.verbatim_tokens,
                "Level: a delivered verbatim span of this many tokens makes a holdout document contaminated (default 32)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 30));
  c->add_option("--ngram", lv.ngram, "n of the n-gram fraction level (default 13)")->check(CLI::Range(4, 1024));
  c->add_option("--threshold,--ngram-fraction", lv.ngram_fraction,
                "Level: this fraction of a document's n-grams delivered makes it contaminated (default 0.5)")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--seed-ngram", lv.seed_ngram,
                "Shortest verbatim piece the matcher sees (default 8; edits closer than this hide a copy)")
      ->check(CLI::Range(4, 1024));
  c->add_option("--near-dup", lv.near_duplicate,
                "Level: this fraction of a document's tokens delivered in pieces of >= --seed-ngram tokens makes it "
                "contaminated: a copy with small edits (default 0.8)")
      ->check(CLI::Range(0.0, 1.0));
  c->add_flag("--bloom", a->opt.bloom, "Prefilter the seed probe with a Bloom filter (4 B/n-gram; the default)");
  c->add_flag("--exact-set{false}", a->opt.bloom,
              "Prefilter with the exact open-addressing set instead (16 B/n-gram); every hit is verified either way, "
              "so the report is the same");
  c->add_option("--bloom-bits", a->opt.bloom_bits_per_ngram, "Bloom filter bits per n-gram")->check(CLI::Range(4.0, 1024.0));
  c->add_option("--min-doc-tokens", a->opt.min_doc_tokens, "Exact document matches ignore shorter documents")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  c->add_option("--eos", a->eos, "EOS token id (default: data.eos_id); delimits holdout documents")
      ->check(CLI::Range(int64_t{0}, (int64_t{1} << 32) - 1));
  c->add_option("--world-size", a->opt.world_size, "Data-parallel ranks of the scanned stream (ranks in the report)")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--layouts", a->opt.layouts, "World sizes the layout check compares with W=1 (default: 2,4,8 where they divide)")
      ->delimiter(',');
  c->add_option("--resume-at", a->opt.resume_at, "Steps after which the resume check stops and resumes (default: mid-run, epoch ends)")
      ->delimiter(',');
  c->add_flag("--no-attribution", a->no_attribution,
              "Do not find each contaminated document's cause (data vs loader); causes are then 'unknown'");
  c->add_flag("--allow-data-overlap", a->opt.allow_data_overlap,
              "Accept every contaminated document whose cause is the configured data itself (listed, not failed)");
  c->add_option("--accept", a->opt.accept_file,
                "Accept these known data overlaps: a file of 'HOLDOUT_FILE TOKEN_START' lines (as in the report)")
      ->check(CLI::ExistingFile);
  c->add_option("--since", a->opt.since,
                "Count only documents first delivered after this step (the report still lists all) and list the "
                "evaluations after it that contamination affects")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  c->add_flag("--no-audit-checks", a->no_audit, "Only the overlap checks");
  c->add_option("--megatron-cache", a->megatron_cache,
                "Check a Megatron-LM run instead: its GPTDataset index cache directory (*-document/sample/shuffle_index.npy)")
      ->group("Another framework's run");
  c->add_option("--megatron-data", a->megatron_data, "The run's dataset prefix (PREFIX.bin / PREFIX.idx)")->group("Another framework's run");
  c->add_option("--megatron-split", a->megatron_split, "Index split to read (default train)")->group("Another framework's run");
  c->add_option("--megatron-global-batch", a->megatron_global_batch, "The run's --global-batch-size (samples per iteration)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))->group("Another framework's run");
  c->add_option("--megatron-micro-batch", a->megatron_micro_batch, "The run's --micro-batch-size (micro-batches in the report)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))->group("Another framework's run");
  c->add_option("--megatron-checkpoint", a->megatron_checkpoint,
                "Check up to the iteration this Megatron checkpoint directory records (latest_checkpointed_iteration.txt)")
      ->group("Another framework's run");
  c->add_flag("--megatron-no-extra-token", a->megatron_no_extra_token,
              "The run set add_extra_token_to_sequence=False (samples of sequence_length tokens, not + 1)")
      ->group("Another framework's run");
  c->add_option("--olmo-core-work-dir,--olmo-core-run", a->olmo_core_work_dir,
                "Check an OLMo-core run instead: its data loader's work directory (global_indices_*_v1.npy); the config "
                "names the run's token files in order, seq_len, global batch (instances) and seed")
      ->group("Another framework's run");
  c->add_option("--olmo-core-seed", a->olmo_core_seed, "The OLMo-core run's data seed (default data.seed, or the checkpoint's)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()))->group("Another framework's run");
  c->add_option("--olmo-core-checkpoint", a->olmo_core_checkpoint,
                "Check up to the step this OLMo-core checkpoint records (a stepN directory, or the save folder: its "
                "latest), verifying its data loader's seed and dataset fingerprint against the configured files")
      ->group("Another framework's run");
  c->add_option("--olmo-core-pad-id", a->olmo_core_pad_id, "The run's pad_token_id (in OLMo-core's dataset fingerprint)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32))->group("Another framework's run");
  c->add_option("--olmo-core-bos-id", a->olmo_core_bos_id, "The run's bos_token_id, if it set one")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32))->group("Another framework's run");
  c->add_flag("--strict", a->old_strict)->group("");
  c->add_flag("--no-static", a->old_no_static)->group("");
  c->add_flag("--no-content-check", a->no_content, "Do not re-read instances to compare the audit log's XXH3s");
  c->add_option("--audit", a->opt.audit_logs, "Audit log(s) of a run (every rank's file) to check as well")
      ->check(CLI::ExistingFile);
  c->add_option("--report", a->report, "Write the JSON report here");
  c->add_option("--work-dir", a->opt.work_dir, "Keep the generated audit logs here (default: a temporary directory)");
  c->add_option("--threads", a->opt.threads, "Scan threads (default: all cores)")->check(CLI::Range(0, 65536));
  c->add_flag("--quiet", a->quiet, "No summary on stdout");
  c->add_option("--debug-plant-bug", a->debug_bug, "TEST-ONLY: make the loader misbehave (data/planted_bugs.h)")
      ->group("");
  c->callback([a] {
    try {
      run(*a);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::cerr << "olmoref leakcheck: error: " << e.what() << "\n";
      throw CLI::RuntimeError(2);
    }
  });
}

}  // namespace olmoref::data
