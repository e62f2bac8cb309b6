#include "cli/commands.h"

#include <array>
#include <chrono>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "ref/gemm.h"
#include "core/parallel.h"
#include "train/batch_source.h"
#include "train/config.h"
#include "train/parity_dump.h"
#include "train/resume_check.h"
#include "train/step_list.h"
#include "ckpt/checkpoint.h"
#include "golden/plot.h"
#include <fstream>
#include "data/bpe.h"
#include "interop/hf_export.h"
#include "interop/hf_tokenizer.h"
#include <nlohmann/json.hpp>
#include <optional>
#include "model/init.h"
#include "core/params.h"
#include "train/memory_model.h"
#include "train/time_model.h"
#include "train/trainer.h"
#include "dist/comm.h"
#include "train/weights.h"

namespace olmoref {

namespace {
// --cpu-isa: one switch for the GEMM and the other ops' SIMD paths (ref/gemm.h, ref/simd_ops.h).
void select_cpu_isa(const std::string& name) {
  const GemmIsa isa = name == "scalar" ? GemmIsa::scalar
                      : name == "avx2" ? GemmIsa::avx2
                      : name == "avx512" ? GemmIsa::avx512
                                         : GemmIsa::best;
  if (!gemm_isa_supported(isa))
    throw std::runtime_error("--cpu-isa " + name + ": this CPU (or this build) has no " + name +
                             " path; use --cpu-isa best, or one of the paths it has (scalar always exists)");
  set_gemm_isa(isa);
}
}  // namespace

namespace {

int g_exit_code = 0;

// --layout SxR (dp_shard x dp_replicate), as resume-check and config read it.
void parse_layout(const std::string& s, const char* flag, int& shard, int& rep) {
  const auto x = s.find('x');
  try {
    if (x == std::string::npos) throw std::invalid_argument(s);
    shard = std::stoi(s.substr(0, x));
    rep = std::stoi(s.substr(x + 1));
  } catch (const std::exception&) {
    throw std::invalid_argument(std::string(flag) + " '" + s + "': expected SHARDxREPLICATE, e.g. 3x1");
  }
  if (shard < 1 || rep < 1) throw std::invalid_argument(std::string(flag) + " '" + s + "': both factors must be >= 1");
}

// A TOML basic string holding `s` (for a path handed to load_config as an override).
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  void add(CLI::App* cmd) {
    cmd->add_option("--config", path, "Run configuration (TOML), e.g. configs/tiny.toml")->required();
    cmd->add_option("--set", overrides, "Override a config key: --set section.key=value (repeatable)");
  }
  TrainConfig load() const { return load_config(path, overrides); }
};

void print_config_summary(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  std::printf("model            %s\n", m.name.c_str());
  if (!m.moe.enabled()) {
    std::printf("shape            d_model %lld, %lld layers, %lld heads (%lld kv, head_dim %lld), ffn %lld, vocab %lld\n",
                (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads, (long long)m.n_kv_heads,
                (long long)m.head_dim, (long long)m.ffn_hidden, (long long)m.vocab_size);
  } else {
    const MoEConfig& e = m.moe;
    std::printf("shape            d_model %lld, %lld layers, %lld heads (%lld kv, head_dim %lld), vocab %lld\n",
                (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads, (long long)m.n_kv_heads,
                (long long)m.head_dim, (long long)m.vocab_size);
    std::printf("experts          %lld routed (hidden %lld), top-%lld%s, shared expert %s; dropless, softmax router\n",
                (long long)e.n_experts, (long long)e.hidden, (long long)e.top_k,
                e.normalize_expert_weights == 1   ? " (weights / their sum)"
                : e.normalize_expert_weights == 2 ? " (weights / their L2 norm)"
                                                  : "",
                e.shared_hidden > 0 ? ("hidden " + std::to_string(e.shared_hidden)).c_str() : "none");
    std::printf("aux losses       load balancing %g, router z %g%s; granularity %s\n", e.lb_loss_weight, e.z_loss_weight,
                e.scale_loss_by_num_layers ? " (each / n_layers)" : "",
                e.lb_granularity == MoELbGranularity::instance ? "instance (layout-free)"
                                                               : "local_batch (OLMo-core's; depends on the layout)");
  }
  std::string windows;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const int64_t w = m.window(l);
    if (l) windows += ',';
    windows += w > 0 ? std::to_string(w) : std::string("full");
    if (l >= 11 && l + 1 < m.n_layers) {
      windows += ",...";
      break;
    }
  }
  std::printf("attention        [%s]\n", windows.c_str());
  if (m.rope_scaling.on()) {
    const RopeScaling& rs = m.rope_scaling;
    std::printf("rope scaling     YaRN factor %g from %lld tokens (beta_fast %lld, beta_slow %lld, attention factor %.6f) "
                "on %s\n", rs.factor, (long long)rs.old_context_len, (long long)rs.beta_fast, (long long)rs.beta_slow,
                rs.attention_factor(), rs.full_attention_only ? "the full-attention layers" : "every layer");
  }
  std::printf("parameters       %lld (%.3f B); non-embedding %lld\n", (long long)m.n_params(), m.n_params() / 1e9,
              (long long)m.n_params_non_embedding());
  if (m.moe.enabled())
    std::printf("active/token     %lld (%.3f B) of them: top-%lld of %lld experts per layer\n", (long long)m.n_params_active(),
                m.n_params_active() / 1e9, (long long)m.moe.top_k, (long long)m.moe.n_experts);
  std::printf("FLOPs/token      %.0f at seq_len %lld (ai2-olmo-core 3.0.0's num_flops_per_token)\n", m.flops_per_token(c.train.seq_len),
              (long long)c.train.seq_len);
  std::printf("batch            %lld instances x %lld tokens = %lld micro-batches of %lld\n",
              (long long)c.train.global_batch_instances, (long long)c.train.seq_len,
              (long long)c.micro_batches_per_step(), (long long)c.train.micro_batch_instances);
  std::printf("state (fp32)     params+grad+adam %.3f GiB\n", 4.0 * 4.0 * m.n_params() / (1024.0 * 1024 * 1024));
}

}  // namespace

int command_exit_code() { return g_exit_code; }
void set_command_exit_code(int code) { g_exit_code = code; }

void register_commands(CLI::App& app) {
  // ---- train ----
  {
    auto* cmd = app.add_subcommand("train", "Train a model: trace.jsonl, manifest.json, checkpoints/");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto o = std::make_shared<RunOptions>();
    auto steps = std::make_shared<int64_t>(-1);
    auto executor = std::make_shared<std::string>();
    cmd->add_option("--out", o->out_dir, "Run directory (created)")->required();
    cmd->add_option("--executor", *executor,
                    "cpu, cuda (the GPU) or cuda-host (the CUDA kernels run on the host: a slow check); overrides "
                    "train.executor. Every executor gives the same bits, and checkpoints move between them")
        ->check(CLI::IsMember({"cpu", "cuda", "cuda-host"}));
    cmd->add_option("--threads", o->threads, "Worker threads (0 = all cores); results do not depend on it")->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
    auto cpu_isa = std::make_shared<std::string>("best");
    cmd->add_option("--cpu-isa", *cpu_isa,
                    "The CPU executor's instruction-set path: best (the widest this CPU has), scalar, avx2 or avx512; "
                    "results do not depend on it (tier T4), only speed")
        ->check(CLI::IsMember({"best", "scalar", "avx2", "avx512"}));
    cmd->add_option("--steps", *steps, "Total steps of the run (overrides train.steps; sets the schedule length)")->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
    cmd->add_option("--stop-after", o->stop_after, "Stop after this step (checkpointing it), as if interrupted")->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
    cmd->add_flag("--resume", o->resume, "Continue from the newest complete checkpoint in OUT/checkpoints");
    cmd->add_option("--resume-from", o->resume_from, "Continue from this checkpoint directory")->excludes("--resume");
    cmd->add_flag("--ignore-fingerprint-mismatch", o->resume_opts.ignore_fingerprint_mismatch,
                  "Resume even though the data files differ from the checkpoint's");
    cmd->add_flag("--allow-config-change", o->resume_opts.allow_config_change,
                  "Resume even though the run configuration differs from the checkpoint's");
    cmd->add_flag("--allow-shared-gpu", o->allow_shared_gpu,
                  "Executor cuda: let ranks of one node drive the same GPU (checks on one card; refused otherwise)");
    cmd->add_flag("--new-records", o->new_records,
                  "Resume even though OUT's trace or audit logs lack steps up to the checkpoint's (deleted, cut "
                  "short, or a checkpoint copied into a new directory): the records begin again after the checkpoint, "
                  "and the trace's first new record says so (\"records_begin\")");
    auto skip = std::make_shared<std::vector<std::string>>();
    cmd->add_option("--debug-skip-restore", *skip,
                    "TEST ONLY: leave part of the state unrestored on resume (moments, loader, step); resume-check must fail")
        ->check(CLI::IsMember({"moments", "loader", "step"}));
    auto init_hf = std::make_shared<std::string>();
    cmd->add_option("--init-from-hf", *init_hf,
                    "Start from the weights of this Hugging Face Olmo 3 checkpoint directory instead of the init "
                    "(sets init.hf_dir; the weights' SHA-256 becomes init.hf_sha256, part of resume_hash)");
    cmd->add_flag("--quiet", o->quiet, "No progress output");
    cmd->add_option("--dp-shard", o->parallel.dp_shard,
                    "HSDP: ranks that split parameters, gradients and AdamW state (FSDP); start with mpirun")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--dp-replicate", o->parallel.dp_replicate, "HSDP: replicate groups (DDP across groups)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--ep", o->parallel.ep,
                    "Expert parallelism (MoE): groups of N consecutive ranks exchange tokens so each rank runs only its "
                    "share of the experts; N divides the world size; the trace is the same for every N")
        ->check(CLI::Range(1, 65536));
    auto cp = std::make_shared<int>(0);
    cmd->add_option("--cp", *cp,
                    "Context parallelism (sets train.cp_degree): groups of N consecutive ranks each compute 1/N of "
                    "every instance's positions; N divides the world size and train.seq_len; the trace is the same "
                    "for every N")
        ->check(CLI::Range(1, 65536));
    cmd->add_option("--comm-timeout", o->comm_timeout_s,
                    "Seconds a rank waits for the others in one collective before aborting the job (naming the missing ranks)");
    auto no_prefetch = std::make_shared<bool>(false);
    cmd->add_flag("--no-prefetch", *no_prefetch,
                  "FSDP (dp_shard > 1): gather each unit only when the model reaches it, instead of gathering the "
                  "next one while the model works on this one (the default; over MPI on a thread of its own, over "
                  "NCCL into a second unit buffer on a stream of its own); and over MPI on cuda or cuda-host, "
                  "exchange each unit's gradient to its owners when its backward ends, instead of on a thread under "
                  "the next unit's backward (the default); the values do not change");
    auto transport = std::make_shared<std::string>("mpi");
    cmd->add_option("--transport", *transport,
                    "Several ranks: how the FSDP gathers, the gradient exchange to the owners, the parameter "
                    "all-gather, the expert rows and context parallelism's exchanges move: mpi (staged through host memory; the CPU's, and the default) or nccl (between "
                    "device buffers, no byte through the host; --executor cuda); the values do not change")
        ->check(CLI::IsMember({"mpi", "nccl"}));
    cmd->add_flag("--report-comm", o->report_comm, "Print bytes sent per rank per step and per-rank state size at the end");
    auto report_memory = std::make_shared<bool>(false);
    cmd->add_flag("--report-memory", *report_memory,
                  "Print this rank's peak resident memory (VmHWM) on stderr at the end, and after a resume also the peak "
                  "so far and the bytes read (tests/train/memory.sh)");
    cmd->add_flag("--no-checkpoint", o->no_checkpoint,
                  "Write no checkpoint, not even at the end (benchmarks); the run cannot be resumed");
    cmd->add_flag("--profile-ops", o->parallel.profile_ops,
                  "Time every executor op (synchronizing around each) and print calls, seconds, share and GFLOP/s at "
                  "the end; the values computed do not change");
    cmd->add_flag("--debug-float-allreduce", o->parallel.debug_float_allreduce,
                  "TEST ONLY: per-rank fp32 running sum + MPI float all-reduce; must break layout invariance");
    cmd->add_option("--debug-nccl-group-ops", o->parallel.debug_nccl_group_ops,
                    "TEST ONLY: --transport nccl in NCCL groups of at most N operations instead of NCCL's 2048, so "
                    "small runs cut their exchanges into rounds (the values do not change)")
        ->check(CLI::Range(2, 2048));
    cmd->add_option("--debug-exchange-chunks", o->parallel.debug_exchange_chunks,
                    "TEST ONLY: exchange each unit's gradient subtrees in N chunks (default: by size, "
                    "dist::exchange_chunks); the trace must not change")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--debug-moe-unordered-combine", o->parallel.debug_moe_unordered_combine,
                  "TEST ONLY: add each token's experts in arrival order, as an atomic scatter does, not in rank order "
                  "(mixture-of-experts models); must change the trace");
    cmd->add_flag("--debug-prefetch-other-unit", o->parallel.debug_prefetch_other_unit,
                  "TEST ONLY: every FSDP prefetch gathers a unit other than the one the model asks for next (each "
                  "unit is then gathered again on the spot); must not change the trace");
    cmd->add_flag("--debug-prefetch-no-stream-wait", o->parallel.debug_prefetch_no_stream_wait,
                  "TEST ONLY: the prefetch's acquire on cuda or cuda-host does not wait for its side stream (the MPI "
                  "transport's copies, NCCL's groups), so the model may read the next unit before it lands; must "
                  "change the trace on cuda-host with OLMOREF_TEST_HOST_STREAM_DELAY_US set");
    cmd->add_flag("--debug-exchange-no-wait", o->parallel.debug_exchange_no_wait,
                  "TEST ONLY: on cuda or cuda-host (several ranks) the step's reduced gradient is read before the "
                  "last unit's overlapped exchange to its owners and their adds (MPI: its thread; NCCL: its side "
                  "stream) are waited for; must change the trace");
    cmd->add_flag("--debug-exchange-no-stream-wait", o->parallel.debug_exchange_no_stream_wait,
                  "TEST ONLY: on cuda or cuda-host (several ranks) nothing waits for the side stream of the owners' "
                  "overlapped exchange (NCCL: its groups and adds; MPI: the adds before the next all-to-all refills "
                  "their receive block); must change the trace on cuda-host with OLMOREF_TEST_HOST_STREAM_DELAY_US "
                  "set");
    cmd->add_flag("--debug-exchange-no-staging-wait", o->parallel.debug_exchange_no_staging_wait,
                  "TEST ONLY: on cuda or cuda-host (several ranks, MPI transport) the owners' exchange thread sends a "
                  "unit's subtrees before their copy from the device block to the host has landed; must change the "
                  "trace on cuda-host with OLMOREF_TEST_HOST_STREAM_DELAY_US set");
    cmd->add_flag("--debug-exchange-no-refill-wait", o->parallel.debug_exchange_no_refill_wait,
                  "TEST ONLY: on cuda or cuda-host (several ranks, MPI transport) the next unit's backward refills "
                  "the subtrees' device send block before its copy to the host has read it; must change the trace on "
                  "cuda-host with OLMOREF_TEST_HOST_STREAM_DELAY_US set");
    cmd->add_flag("--debug-cp-partial-sums", o->parallel.debug_cp_partial_sums,
                  "TEST ONLY: under context parallelism, each rank's weight-gradient partials over its own positions "
                  "added rank after rank (a CP all-reduce), not one chain over the instance; must change the trace");
    auto tree_shape = std::make_shared<std::string>("balanced");
    cmd->add_option("--debug-tree-shape", *tree_shape,
                    "TEST ONLY: 'microbatch-chain' sums each micro-batch as a chain and the micro-batches by the tree "
                    "(the old order, single process); must break micro-batch invariance (T6)")
        ->check(CLI::IsMember({"balanced", "microbatch-chain"}));
    cmd->callback([=] {
      select_cpu_isa(*cpu_isa);
      std::vector<std::string> ov = cfg->overrides;
      if (*steps >= 0) ov.push_back("train.steps=" + std::to_string(*steps));
      if (!executor->empty()) ov.push_back("train.executor=\"" + *executor + "\"");
      if (*cp > 0) ov.push_back("train.cp_degree=" + std::to_string(*cp));
      if (!init_hf->empty()) ov.push_back("init.hf_dir=" + toml_string(*init_hf));
      TrainConfig c = load_config(cfg->path, ov);
      check_evaluation_data_separate(c);  // before the run directory is touched
      // The weights' SHA-256 reads every byte of them: under mpirun rank 0 alone computes it and the others take it,
      // so a rank reads only its slices of the files (Trainer::set_initial_params).
      if (!c.init.hf_dir.empty() && dist::launched_by_mpirun()) {
        dist::Comm& w = dist::world(o->comm_timeout_s);
        std::array<char, 80> sha{};  // [0]: 1 when rank 0 resolved it, then the hex digest
        std::exception_ptr failed;
        if (w.rank() == 0) {
          try {
            resolve_hf_init(c);
            sha[0] = 1;
            std::snprintf(sha.data() + 1, sha.size() - 1, "%s", c.init.hf_sha256.c_str());
          } catch (...) {
            failed = std::current_exception();
          }
        }
        w.broadcast(sha.data(), sha.size(), 0, "init.hf_dir: the weights' SHA-256 from rank 0");
        if (failed) std::rethrow_exception(failed);
        if (sha[0] != 1)
          throw std::runtime_error("init.hf_dir " + c.init.hf_dir + ": rank 0 could not take these weights (its "
                                   "message says why)");
        c.init.hf_sha256 = std::string(sha.data() + 1);
      } else {
        resolve_hf_init(c);
      }
      // A resume of a run that started from a checkpoint takes its own checkpoint; the source need not exist then.
      if (!o->resume && o->resume_from.empty()) resolve_checkpoint_init(c);
      if (c.init.hf_sha256.empty() && (o->resume || !o->resume_from.empty())) {
        // A run that started from Hugging Face weights keeps recording them when resumed without naming them again
        // (its weights come from the checkpoint either way).
        std::string dir = o->resume_from;
        if (dir.empty()) dir = ckpt::newest_complete(o->out_dir + "/checkpoints").value_or("");
        if (!dir.empty()) c.init.hf_sha256 = load_checkpoint_config(dir).init.hf_sha256;
      }
      if (c.init.checkpoint_xxh3.empty() && (o->resume || !o->resume_from.empty())) {
        // Likewise a run that started from another run's checkpoint keeps recording which one.
        std::string dir = o->resume_from;
        if (dir.empty()) dir = ckpt::newest_complete(o->out_dir + "/checkpoints").value_or("");
        if (!dir.empty()) c.init.checkpoint_xxh3 = load_checkpoint_config(dir).init.checkpoint_xxh3;
      }
      RunOptions run = *o;
      run.parallel.prefetch_units = !*no_prefetch;
      run.parallel.transport = dist::parse_transport(*transport);
      run.parallel.debug_tree_shape = *tree_shape == "microbatch-chain" ? TreeShape::microbatch_chain : TreeShape::balanced;
      for (const auto& what : *skip) {
        run.resume_opts.skip_moments |= what == "moments";
        run.resume_opts.skip_loader |= what == "loader";
        run.resume_opts.skip_step |= what == "step";
      }
      // TEST ONLY controls: the tests set them in the environment of the processes they start (resume-check's runs
      // too); read here and carried in the options, nothing below cli/ reads the environment for them.
      if (const char* fault = std::getenv("OLMOREF_TEST_FAULT")) run.fault = FaultInjection::parse(fault);
      if (const char* dump = std::getenv("OLMOREF_TEST_OPTIM_DUMP")) run.optim_dump_dir = dump;
      if (const char* drop = std::getenv("OLMOREF_TEST_DROP_SKIP_WINDOWS"); drop && std::string(drop) == "1")
        run.resume_opts.drop_skip_windows = true;
      if (const char* fake = std::getenv("OLMOREF_TEST_FAKE_GPUS")) run.fake_gpus = std::atoi(fake);
      run.report_memory = *report_memory;
      run_training(c, run);
      if (*report_memory) {
        const ProcessStats p = process_stats();
        std::fprintf(stderr, "memory: rank %d peak resident (VmHWM) %lld bytes, resident at the end %lld bytes\n",
                     dist::world().rank(), static_cast<long long>(p.peak_resident), static_cast<long long>(p.resident));
      }
    });
  }
  // ---- resume-check ----
  {
    auto* cmd = app.add_subcommand("resume-check",
                                   "Run N steps straight and with stop+resume at each K (fresh processes); compare every step");
    auto o = std::make_shared<ResumeCheckOptions>();
    auto at = std::make_shared<std::string>();
    auto skip = std::make_shared<std::vector<std::string>>();
    cmd->add_option("--config", o->config_path, "Run configuration (TOML)")->required();
    cmd->add_option("--set", o->overrides, "Override a config key (repeatable)");
    cmd->add_option("--steps", o->steps, "Steps of the run (>= 2: a resume needs a step after it)")
        ->required()
        ->check(CLI::Range(int64_t{2}, std::numeric_limits<int64_t>::max()));
    cmd->add_flag("--allow-shared-gpu", o->allow_shared_gpu,
                  "Executor cuda: the runs' ranks may share a GPU (train --allow-shared-gpu)");
    cmd->add_option("--at", *at, "Steps to stop and resume at, comma separated (e.g. 3,7)")->required();
    cmd->add_option("--threads", o->threads, "Worker threads per run")->check(CLI::Range(0, 65536));
    cmd->add_option("--work", o->work_dir, "Keep the runs here (default: a temporary directory, removed when identical)");
    cmd->add_option("--debug-skip-restore", *skip, "TEST ONLY: negative control passed to the resumed runs")
        ->check(CLI::IsMember({"moments", "loader", "step"}));
    cmd->add_option("--resume-set", o->resume_overrides,
                    "Override a config key in the resumed runs only (repeatable), e.g. train.micro_batch_instances=2");
    auto layout = std::make_shared<std::string>("1x1"), resume_layout = std::make_shared<std::string>();
    cmd->add_option("--layout", *layout, "dp_shard x dp_replicate of the uninterrupted run and the runs up to K (mpirun)");
    cmd->add_option("--resume-layout", *resume_layout, "dp_shard x dp_replicate of the resumed runs (default: --layout)");
    cmd->add_option("--ep", o->ep, "Expert parallelism (train --ep) of the uninterrupted run and the runs up to K")
        ->check(CLI::Range(1, 65536));
    cmd->add_option("--resume-ep", o->resume_ep, "Expert parallelism of the resumed runs (default: --ep)")
        ->check(CLI::Range(1, 65536));
    cmd->callback([=] {
      ResumeCheckOptions opts = *o;
      parse_layout(*layout, "--layout", opts.dp_shard, opts.dp_replicate);
      if (!resume_layout->empty()) parse_layout(*resume_layout, "--resume-layout", opts.resume_dp_shard, opts.resume_dp_replicate);
      opts.at = parse_step_list(*at, "--at");
      // Before any run: a stop at K needs a step K + 1 to resume into.
      for (const int64_t k : opts.at)
        if (k < 1 || k >= opts.steps)
          throw std::invalid_argument("--at " + *at + ": step " + std::to_string(k) + " is outside 1.." +
                                      std::to_string(opts.steps - 1) + " (a resume at K runs steps K + 1.." +
                                      std::to_string(opts.steps) + " of --steps " + std::to_string(opts.steps) + ")");
      for (const auto& s : *skip) {
        opts.extra_resume_args.push_back("--debug-skip-restore");
        opts.extra_resume_args.push_back(s);
      }
      g_exit_code = resume_check(opts);
    });
  }
  // ---- trace (compare, plot, convert) and golden: cli/golden_commands.cpp ----
  // ---- ckpt ----
  {
    auto* cmd = app.add_subcommand("ckpt", "Inspect or verify checkpoints");
    cmd->require_subcommand(1);
    auto* ins = cmd->add_subcommand("inspect", "What is inside a checkpoint: step, config, shards, sizes, digests");
    auto dir = std::make_shared<std::string>();
    auto tensors = std::make_shared<bool>(false);
    ins->add_option("DIR", *dir, "Checkpoint directory (stepNNNNNNNN) or a run's checkpoints/ folder")->required();
    ins->add_flag("--tensors", *tensors, "List every tensor with its size and checksum");
    ins->callback([=] {
      std::string d = *dir;
      if (!std::filesystem::exists(d + "/manifest.json"))
        if (auto newest = ckpt::newest_complete(d)) d = *newest;
      std::printf("%s", ckpt::inspect(d, *tensors).c_str());
    });
    auto* ver = cmd->add_subcommand("verify", "Check every byte of a checkpoint; exit 0 only if intact");
    auto vdir = std::make_shared<std::string>();
    ver->add_option("DIR", *vdir, "Checkpoint directory")->required();
    ver->callback([=] {
      // A long verify says how far it is, every 10 s, on stderr.
      const auto start = std::chrono::steady_clock::now();
      auto last = start;
      const auto problems = ckpt::verify(*vdir, [&](uint64_t done, uint64_t total) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last < std::chrono::seconds(10)) return;
        last = now;
        std::fprintf(stderr, "verify: %.2f of %.2f GB read (%.0f s)\n", static_cast<double>(done) / 1e9,
                     static_cast<double>(total) / 1e9, std::chrono::duration<double>(now - start).count());
      });
      for (const auto& p : problems) std::printf("FAILED: %s\n", p.c_str());
      if (problems.empty()) std::printf("OK: %s is intact\n", vdir->c_str());
      g_exit_code = problems.empty() ? 0 : 1;
    });
  }
  // ---- parity-dump ----
  {
    auto* cmd = app.add_subcommand("parity-dump", "Write a parity bundle for golden/parity/hf_parity.py");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto out = std::make_shared<std::string>();
    auto steps = std::make_shared<int64_t>(10);
    auto threads = std::make_shared<int>(0);
    cmd->add_option("--out", *out, "Bundle directory (created)")->required();
    cmd->add_option("--steps", *steps, "AdamW steps to record (>= 1)")->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
    cmd->add_option("--threads", *threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 65536));
    cmd->callback([=] { write_parity_bundle(cfg->load(), *out, *steps, *threads); });
  }
  // ---- export-hf ----
  {
    auto* cmd = app.add_subcommand(
        "export-hf", "Write a checkpoint's weights (or step-0 weights) as a Hugging Face Olmo3 checkpoint directory");
    auto config = std::make_shared<std::string>(), checkpoint = std::make_shared<std::string>();
    auto overrides = std::make_shared<std::vector<std::string>>();
    auto out = std::make_shared<std::string>(), tokenizer = std::make_shared<std::string>();
    auto max_pos = std::make_shared<int64_t>(0);
    cmd->add_option("--config", *config, "Run configuration (TOML): export its step-0 weights");
    cmd->add_option("--checkpoint", *checkpoint,
                    "Checkpoint directory written by olmoref train (stepNNNNNNNN, or a checkpoints/ folder: its newest "
                    "complete one): export its weights, with the config it records");
    cmd->add_option("--set", *overrides, "Override a config key: --set section.key=value (repeatable)");
    cmd->add_option("--out", *out,
                    "Directory for model.safetensors, config.json, generation_config.json (+ the tokenizer files)")
        ->required();
    cmd->add_option("--tokenizer", *tokenizer,
                    "The run's tokenizer (olmoref BPE JSON, or a tokenizer.json): also write tokenizer.json, "
                    "tokenizer_config.json and special_tokens_map.json, and take eos/pad/bos ids from it");
    cmd->add_option("--max-position-embeddings", *max_pos,
                    "config.json's max_position_embeddings (default: the run's train.seq_len)")
        ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
    cmd->callback([=] {
      if (config->empty() == checkpoint->empty())
        throw std::invalid_argument("export-hf: give exactly one of --config FILE (step-0 weights) and --checkpoint DIR");
      std::string ckpt_dir = *checkpoint;
      if (!ckpt_dir.empty() && !std::filesystem::exists(ckpt_dir + "/manifest.json")) {
        auto newest = ckpt::newest_complete(ckpt_dir);
        if (!newest) newest = ckpt::newest_complete(ckpt_dir + "/checkpoints");  // a run directory
        if (!newest)
          throw std::runtime_error(ckpt_dir + ": neither a checkpoint (no manifest.json) nor a folder holding "
                                   "complete checkpoints; pass a stepNNNNNNNN directory of `olmoref train`");
        ckpt_dir = *newest;
      }
      // A model Hugging Face cannot hold is refused from its config, naming the file, before weights are read. The
      // weights stream into the file tensor by tensor (a frame or a slice at a time), never held whole.
      WeightStream w;
      if (!ckpt_dir.empty()) {
        require_hf_form(load_checkpoint_config(ckpt_dir, *overrides), "Hugging Face export");
        w = checkpoint_weight_stream(ckpt_dir, *overrides);
      } else {
        const TrainConfig c0 = load_config(*config, *overrides);
        require_hf_form(c0, "Hugging Face export");
        w = initial_weight_stream(c0);
      }
      const TrainConfig& c = w.config;
      const ParamLayout layout(c.model);
      std::optional<data::BpeTokenizer> tok;
      if (!tokenizer->empty()) tok = interop::load_tokenizer(*tokenizer);
      HfExportOptions opts;
      opts.max_position_embeddings = *max_pos > 0 ? *max_pos : c.train.seq_len;
      std::string ids_from;
      if (tok) {
        // The token files of the run end every document in data.eos_id: a tokenizer with another EOS is not the one
        // the run was trained on.
        if (c.data.eos_id >= 0 && c.data.eos_id != tok->eos_id())
          throw std::invalid_argument("--tokenizer " + *tokenizer + " has EOS " + std::to_string(tok->eos_id()) +
                                      " but the run's data.eos_id is " + std::to_string(c.data.eos_id) +
                                      "; pass the tokenizer the run's token files were made with");
        opts.tokenizer = &*tok;
        ids_from = "the tokenizer";
      } else if (c.data.eos_id == data::BpeTokenizer::kEos && c.model.vocab_size > data::BpeTokenizer::kPad) {
        // EOS 256 is olmoref's BPE (data/bpe.h), whose PAD is 257 and which has no BOS.
        opts.eos_token_id = data::BpeTokenizer::kEos;
        opts.pad_token_id = data::BpeTokenizer::kPad;
        ids_from = "olmoref's BPE (data.eos_id 256)";
      } else if (c.data.eos_id >= 0) {
        opts.eos_token_id = c.data.eos_id;
        ids_from = "data.eos_id";
      } else {
        ids_from = "the dolma2 defaults";
      }
      opts.metadata["olmoref.step"] = std::to_string(w.step);
      opts.metadata["olmoref.weights"] = ckpt_dir.empty() ? "step-0 of " + *config : ckpt_dir;
      export_hf_checkpoint(*out, c.model, layout, w.read, opts);
      w.finish();
      const auto cfg_json = nlohmann::json::parse(hf_config_json(c.model, opts));
      std::printf("wrote %s: model.safetensors (%lld parameters, step %lld), config.json (max_position_embeddings %lld; "
                  "eos %s, pad %s, bos %s from %s), generation_config.json%s\n",
                  out->c_str(), static_cast<long long>(layout.total), static_cast<long long>(w.step),
                  static_cast<long long>(opts.max_position_embeddings), cfg_json["eos_token_id"].dump().c_str(),
                  cfg_json["pad_token_id"].dump().c_str(), cfg_json["bos_token_id"].dump().c_str(), ids_from.c_str(),
                  tok ? ", tokenizer.json, tokenizer_config.json, special_tokens_map.json" : "");
    });
  }
  // ---- config ----
  {
    auto* cmd = app.add_subcommand("config", "Validate a config and report parameters and FLOPs/token");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto resolved = std::make_shared<bool>(false);
    cmd->add_flag("--resolved", *resolved, "Also print the fully resolved TOML");
    auto layout = std::make_shared<std::string>();
    auto where = std::make_shared<MemoryPlacement>();
    cmd->add_option("--layout", *layout,
                    "Print the per-rank peak memory by part at dp_shard x dp_replicate SxR (docs/memory.md)");
    cmd->add_option("--ep", where->ep, "With --layout: expert parallelism (train --ep)")->check(CLI::Range(1, 65536));
    auto cp = std::make_shared<int>(0);
    cmd->add_option("--cp", *cp, "With --layout: context parallelism (train --cp, train.cp_degree)")
        ->check(CLI::Range(1, 65536));
    cmd->add_option("--executor", where->executor, "With --layout: the executor (default: train.executor)")
        ->check(CLI::IsMember({"cpu", "cuda", "cuda-host"}));
    auto ranks_per_node = std::make_shared<int>(0);
    cmd->add_option("--transport", where->transport,
                    "With --layout: how the ranks' exchanges move (train --transport: mpi or nccl)")
        ->check(CLI::IsMember({"mpi", "nccl"}));
    cmd->add_option("--ranks-per-node", *ranks_per_node,
                    "With --layout: ranks sharing one node's host memory (default: the world, at most 8)")
        ->check(CLI::Range(1, 65536));
    cmd->add_option("--threads", where->threads, "With --layout: worker threads per rank (train --threads; 0 = this "
                    "machine's cores)")->check(CLI::Range(0, 65536));
    auto dataset_tokens = std::make_shared<int64_t>(-1);
    cmd->add_option("--dataset-tokens", *dataset_tokens,
                    "With --layout: tokens in the training data, for the data order's memory (default: counted from "
                    "the config's data files when they can be read)")->check(CLI::NonNegativeNumber);
    auto time = std::make_shared<bool>(false);
    auto gpu = std::make_shared<std::string>("h100");
    auto rates = std::make_shared<std::vector<std::string>>();
    auto bench = std::make_shared<std::string>();
    auto rank = std::make_shared<int>(-1);
    cmd->add_flag("--time", *time, "With --layout: the step's work per rank (FLOPs, bytes per collective) and its "
                  "time over MPI and NCCL (docs/memory.md, \"Step time\")");
    cmd->add_option("--gpu", *gpu, "With --time: data-sheet rates of h100 or h200 (default h100)")
        ->check(CLI::IsMember({"h100", "h200"}));
    cmd->add_option("--rate", *rates, "With --time: override a rate, KEY=VALUE (gemm_tflops, attention_tflops, "
                    "hbm_gbps, nvlink_gbps, pcie_gbps, host_copy_gbps, network_gbps; repeatable)");
    cmd->add_option("--bench", *bench, "With --time: the exact GEMM's and attention's rates from a device run's bench.json (gemm_bench, gpu_bench.sh)");
    cmd->add_option("--rank", *rank, "With --time: this rank's work instead of the slowest rank's")
        ->check(CLI::NonNegativeNumber);
    cmd->callback([=] {
      std::vector<std::string> ov = cfg->overrides;
      if (*cp > 0) ov.push_back("train.cp_degree=" + std::to_string(*cp));
      const TrainConfig c = load_config(cfg->path, ov);
      const bool time_options = *gpu != "h100" || !rates->empty() || !bench->empty() || *rank >= 0;
      if (time_options && !*time)
        throw std::invalid_argument("--gpu, --rate, --bench and --rank describe a step time: add --time");
      if (*time && layout->empty())
        throw std::invalid_argument("--time predicts a step at a layout: add --layout SxR (e.g. --layout 8x1)");
      DeviceRates device;
      if (*time) {  // every rate checked before anything prints
        device = device_rates(*gpu);
        if (!bench->empty()) rates_from_bench(device, *bench, &c.model, c.train.seq_len);
        for (const std::string& r : *rates) set_rate(device, r);
      }
      print_config_summary(c);
      if (!layout->empty()) {
        MemoryPlacement w = *where;
        parse_layout(*layout, "--layout", w.dp_shard, w.dp_replicate);
        BatchSplit{c.train.global_batch_instances, c.train.micro_batch_instances, w.dp_shard * w.dp_replicate,
                   static_cast<int>(c.train.cp_degree)}.validate();
        if (*dataset_tokens >= 0) w.dataset_instances = *dataset_tokens / c.train.seq_len;
        std::printf("%s", memory_table(c, w, predict_rank_memory(c, w)).c_str());
        const int per_node = *ranks_per_node > 0 ? *ranks_per_node : std::min(8, w.dp_shard * w.dp_replicate);
        std::printf("%s", host_memory_table(c, w, predict_host_memory(c, w), per_node).c_str());
        if (*time) {
          std::printf("%s", time_table(c, w, per_node, device, *rank).c_str());
          std::printf("%s", recompute_table(c, w, per_node, device).c_str());
        }
      } else if (where->ep > 1 || *cp > 0 || !where->executor.empty() || *ranks_per_node > 0 || *dataset_tokens >= 0 ||
                 where->transport != "mpi") {
        throw std::invalid_argument("--ep, --cp, --executor, --transport, --ranks-per-node and --dataset-tokens describe a --layout: add "
                                    "--layout SxR (e.g. --layout 8x1)");
      }
      if (*resolved) std::printf("\n%s\n", c.to_toml().c_str());
    });
  }
}

}  // namespace olmoref
