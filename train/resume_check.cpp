#include "train/resume_check.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstring>
#include <stdexcept>

#include "ckpt/checkpoint.h"
#include "golden/resume_compare.h"
#include "golden/trace.h"

namespace fs = std::filesystem;

namespace olmoref {

namespace {

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

// Runs this binary with args in a fresh process (under mpirun when the layout has more than one rank),
// output to log; returns its exit status.
int run_self(const std::vector<std::string>& args, const std::string& log, int dp_shard = 1, int dp_replicate = 1,
             int ep = 1) {
  std::vector<std::string> full;
  const int world = dp_shard * dp_replicate;
  if (world > 1) {
    full = {"mpirun", "-np", std::to_string(world), "--oversubscribe", "--bind-to", "none"};
    if (::geteuid() == 0) full.insert(full.begin() + 1, "--allow-run-as-root");
  }
  full.push_back(self_exe());
  full.insert(full.end(), args.begin(), args.end());
  if (world > 1)
    for (const std::string& a : {std::string("--dp-shard"), std::to_string(dp_shard), std::string("--dp-replicate"),
                                 std::to_string(dp_replicate), std::string("--ep"), std::to_string(ep)})
      full.push_back(a);
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    if (world > 1) ::execvp(argv[0], argv.data());
    else ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The newest checkpoint's whole-state digests: parameters, and the optimizer's moments (m then v).
StateDigests state_digests(const std::string& run_dir) {
  const auto newest = ckpt::newest_complete(run_dir + "/checkpoints");
  if (!newest) return {};
  std::ifstream in(*newest + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  const auto& d = m.at("state_digests");
  return {{"step", std::to_string(m.at("step").get<int64_t>())},
          {"params", d.at("params").get<std::string>()},
          {"optimizer", "m " + d.at("adam_m").get<std::string>() + " v " + d.at("adam_v").get<std::string>()}};
}

}  // namespace

constexpr const char* kResumeCheckMarker = ".olmoref-resume-check";

int resume_check(const ResumeCheckOptions& o) {
  const bool own_dir = o.work_dir.empty();
  const std::string work = own_dir ? (fs::temp_directory_path() / ("olmoref-resume-check-" + std::to_string(::getpid()))).string()
                                   : o.work_dir;
  // The work directory is emptied first: never one that holds anything but an earlier resume-check's runs (a user's
  // run given by mistake would be lost), which the marker file names.
  const fs::path marker = fs::path(work) / kResumeCheckMarker;
  if (!own_dir && fs::exists(work)) {
    if (!fs::is_directory(work))
      throw std::invalid_argument("--work " + work + " is a file: give a new or empty directory");
    if (!fs::is_empty(work) && !fs::exists(marker))
      throw std::invalid_argument("--work " + work + " is not empty and holds no earlier resume-check's runs (no " +
                                  std::string(kResumeCheckMarker) + "): resume-check empties its work directory, so "
                                  "give a new or empty one");
  }
  fs::remove_all(work);
  fs::create_directories(work);
  std::ofstream(marker) << "olmoref resume-check work directory: emptied by the next resume-check given it\n";
  std::vector<std::string> base = {"train", "--config", o.config_path, "--steps", std::to_string(o.steps), "--quiet",
                                   "--threads", std::to_string(o.threads)};
  for (const auto& ov : o.overrides) {
    base.push_back("--set");
    base.push_back(ov);
  }
  if (o.allow_shared_gpu) base.push_back("--allow-shared-gpu");
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto could_not_verify = [&](const std::string& why, const std::string& log) {
    std::fprintf(stderr, "resume-check: could not verify: %s (log: %s)\n", why.c_str(), log.c_str());
    if (fs::exists(log)) {
      std::ifstream in(log);
      std::string line;
      while (std::getline(in, line)) std::fprintf(stderr, "  | %s\n", line.c_str());
    }
    return 2;
  };

  const int S = o.dp_shard, R = o.dp_replicate, EP = o.ep;
  const int rS = o.resume_dp_shard > 0 ? o.resume_dp_shard : S, rR = o.resume_dp_replicate > 0 ? o.resume_dp_replicate : R;
  const int rEP = o.resume_ep > 0 ? o.resume_ep : EP;
  if ((S * R) % EP != 0 || (rS * rR) % rEP != 0) {
    std::fprintf(stderr, "resume-check: --ep %d / --resume-ep %d must divide the world size of --layout %dx%d / "
                         "--resume-layout %dx%d\n", EP, rEP, S, R, rS, rR);
    return 2;
  }
  const std::string ref_dir = work + "/uninterrupted";
  if (!o.quiet) {
    std::printf("resume-check: %lld steps uninterrupted at %dx%d (ep %d) ...\n", static_cast<long long>(o.steps), S, R, EP);
    if (rS != S || rR != R || rEP != EP || !o.resume_overrides.empty()) {
      std::printf("resume-check: the resumed part runs at %dx%d (ep %d)", rS, rR, rEP);
      for (const auto& ov : o.resume_overrides) std::printf(" --set %s", ov.c_str());
      std::printf("\n");
    }
  }
  if (run_self(with({"--out", ref_dir}), work + "/uninterrupted.log", S, R, EP) != 0)
    return could_not_verify("the uninterrupted run failed", work + "/uninterrupted.log");
  std::vector<TraceRecord> ref;
  try {
    ref = read_trace(ref_dir + "/trace.jsonl");
  } catch (const std::exception& e) {
    return could_not_verify(e.what(), work + "/uninterrupted.log");
  }
  if (static_cast<int64_t>(ref.size()) != o.steps) return could_not_verify("the uninterrupted trace is incomplete", "");
  const StateDigests ref_state = state_digests(ref_dir);

  bool all_same = true;
  for (int64_t k : o.at) {
    if (k <= 0 || k >= o.steps) {
      std::fprintf(stderr, "resume-check: --at %lld must be in [1, %lld)\n", static_cast<long long>(k),
                   static_cast<long long>(o.steps - 1));
      return 2;
    }
    const std::string dir = work + "/resumed-at-" + std::to_string(k);
    if (run_self(with({"--out", dir, "--stop-after", std::to_string(k)}), dir + "-first.log", S, R, EP) != 0)
      return could_not_verify("the run to step " + std::to_string(k) + " failed", dir + "-first.log");
    std::vector<std::string> resume_args = {"--out", dir, "--resume"};
    resume_args.insert(resume_args.end(), o.extra_resume_args.begin(), o.extra_resume_args.end());
    for (const auto& ov : o.resume_overrides) {
      resume_args.push_back("--set");
      resume_args.push_back(ov);
    }
    if (run_self(with(resume_args), dir + "-resume.log", rS, rR, rEP) != 0)
      return could_not_verify("the resumed run from step " + std::to_string(k) + " failed", dir + "-resume.log");
    std::vector<TraceRecord> got;
    ResumeAuditInput audit;
    try {
      got = read_trace(dir + "/trace.jsonl");
      audit.straight = load_trace_any(ref_dir + "/trace.jsonl");
    } catch (const std::exception& e) {
      return could_not_verify(e.what(), dir + "-resume.log");
    }
    try {
      audit.resumed = load_trace_any(dir + "/trace.jsonl");
    } catch (const std::exception& e) {
      // Records olmoref itself wrote that do not form one run (a step twice: the step count was not restored).
      std::printf("\nresumed at step %lld: DIFFERENT: the resumed trace is not one run: %s\n",
                  static_cast<long long>(k), e.what());
      all_same = false;
      continue;
    }
    audit.stop_after = k;
    // olmoref's resume checks what it loads against the checkpoint's digests itself (it refuses otherwise), so the
    // loaded state is not compared here; the final states are the last checkpoints'.
    audit.final_straight = ref_state;
    audit.final_resumed = state_digests(dir);
    if (ref_state.empty()) return could_not_verify("the uninterrupted run wrote no checkpoint", "");
    ResumeFinding finding = compare_resume(audit);
    // The comparison's metrics are the step's essentials; a trace record holds more (tokens, epoch, clip,
    // num-zeros, routing), all of which must agree too.
    if (finding.identical)
      for (size_t s = 0; s < ref.size() && s < got.size(); ++s)
        if (ref[s].to_json() != got[s].to_json()) {
          finding.identical = false;
          finding.first_step = ref[s].step;
          finding.first_what = "trace record";
          finding.diagnosis = "the step's loss, grad norm, lr, batch and parameters agree but another field of its "
                              "record does not:\n  " + ref[s].to_json() + "\n  " + got[s].to_json();
          break;
        }
    std::printf("\n%s", format_resume_report(audit, finding, "olmoref resume-check").c_str());
    all_same = all_same && finding.identical;
  }
  std::printf("\nresume-check: %s\n", all_same ? "IDENTICAL: resuming changed nothing (every step bit for bit)"
                                               : "DIFFERENT: resuming changed the run");
  if (own_dir && all_same) fs::remove_all(work);
  else if (!all_same) std::printf("work directory kept for inspection: %s\n", work.c_str());
  return all_same ? 0 : 1;
}

}  // namespace olmoref
