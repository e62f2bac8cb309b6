#include "train/records.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "data/audit.h"
#include "golden/digest.h"
#include "golden/trace.h"
#include "train/batch_source.h"

namespace olmoref {

namespace fs = std::filesystem;

namespace {

// "3", "3..5", "1..2, 7": steps in ascending order as runs.
std::string step_runs(const std::vector<int64_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(steps[i]) + (j > i ? ".." + std::to_string(steps[j]) : "");
    i = j + 1;
  }
  return out;
}

std::string steps_phrase(const std::vector<int64_t>& steps) {
  return (steps.size() == 1 ? "step " : "steps ") + step_runs(steps);
}

// The batch step t (1-based) drew: its (epoch, row) and its instances, from the checkpoint's data_history. Without
// one (older manifests) epoch is -1 and an audit record belongs to step t when its own "step" is t, which holds
// unless the global batch changed or the run began from data.olmo_core_state.
struct Draw {
  int64_t epoch = -1, batch = 0, instances = 0;  // instances 0: not known
};

std::vector<Draw> draws_of(const ckpt::CheckpointMeta& meta) {
  std::vector<Draw> out;
  if (meta.data_history.is_object()) {
    try {
      const ckpt::DataHistory h = ckpt::DataHistory::from_json(meta.data_history);
      if (h.steps() == meta.step) {
        for (const ckpt::DataSegment& s : h.segments)
          for (int64_t j = 0; j < s.steps; ++j) {
            const auto [e, b] = s.batch_of(j);
            out.push_back({e, b, s.global_batch_instances});
          }
        return out;
      }
    } catch (const std::exception&) {
      // load refused such a manifest already; fall back to the records' own step numbers
    }
  }
  out.clear();
  for (int64_t t = 1; t <= meta.step; ++t) out.push_back({-1, t, 0});
  return out;
}

bool belongs(const Draw& d, const data::AuditRecord& r, int64_t t) {
  return d.epoch < 0 ? r.step == t : (r.epoch == d.epoch && r.batch == d.batch);
}

// One audit log read in order against steps 1..K: how many of its records each step has, and how many bytes of it
// hold steps <= K (the rest: records of steps past the checkpoint, or a torn last line).
struct AuditWalk {
  std::vector<int64_t> count;  // [K + 1], index = step
  size_t kept_bytes = 0, size = 0;
};

AuditWalk walk_audit(const std::string& path, const std::vector<Draw>& draws) {
  const int64_t K = static_cast<int64_t>(draws.size());
  AuditWalk w;
  w.count.assign(static_cast<size_t>(K + 1), 0);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read the audit log");
  std::string line;
  size_t at = 0;
  int64_t p = 0;  // the step of the last record matched
  while (std::getline(in, line)) {
    const size_t next = at + line.size() + (in.eof() ? 0 : 1);
    if (!line.empty()) {
      data::AuditRecord r;
      try {
        r = data::parse_audit_record(line);
      } catch (const std::exception&) {
        break;  // torn by a kill: it and what follows are past the checkpoint's records
      }
      if (p == 0 || !belongs(draws[static_cast<size_t>(p - 1)], r, p)) {
        int64_t t = p + 1;
        while (t <= K && !belongs(draws[static_cast<size_t>(t - 1)], r, t)) ++t;
        if (t > K) break;  // a step past the checkpoint (the log is in step order)
        p = t;
      }
      ++w.count[static_cast<size_t>(p)];
    }
    at = next;
    w.kept_bytes = at;
  }
  w.size = static_cast<size_t>(fs::file_size(path));
  return w;
}

struct TraceScan {
  bool exists = false;
  int64_t begin = 1;
  std::vector<int64_t> missing;
  std::optional<TraceRecord> at_k;
  int64_t line_k = 0;
};

TraceScan scan_trace(const std::string& path, int64_t K) {
  TraceScan s;
  s.exists = fs::exists(path);
  std::vector<bool> seen(static_cast<size_t>(K + 1), false);
  if (s.exists) {
    std::ifstream in(path);
    std::string line;
    int64_t expect = 1, lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.empty()) continue;
      TraceRecord r;
      try {
        r = TraceRecord::from_json(line);
      } catch (const TraceChecksumError& e) {
        throw std::runtime_error(path + ":" + std::to_string(lineno) + ": " + e.what() + "; restore the trace, or "
                                 "move it away and pass --new-records");
      } catch (const std::exception&) {
        break;  // a torn last record: what follows counts as missing
      }
      if (r.step > K) break;
      if (r.step < expect)
        throw std::runtime_error(path + ":" + std::to_string(lineno) + ": step " + std::to_string(r.step) +
                                 " where step " + std::to_string(expect) + " belongs (a step repeated or out of "
                                 "order); the trace does not match the checkpoint at step " + std::to_string(K) +
                                 " (restore the trace, or resume from an earlier checkpoint)");
      if (r.records_begin > 0) {
        if (r.records_begin != r.step)
          throw std::runtime_error(path + ":" + std::to_string(lineno) + ": records_begin " +
                                   std::to_string(r.records_begin) + " on the record of step " + std::to_string(r.step) +
                                   " (it marks the step it is written on); restore the trace as it was written");
        s.begin = r.step;  // the records begin again here: earlier steps may be missing
      }
      seen[static_cast<size_t>(r.step)] = true;
      expect = r.step + 1;
      if (r.step == K) s.at_k = r, s.line_k = lineno;
    }
  }
  for (int64_t t = s.begin; t <= K; ++t)
    if (!seen[static_cast<size_t>(t)]) s.missing.push_back(t);
  return s;
}

}  // namespace

bool is_audit_log_name(const std::string& name) {
  return name == "audit.jsonl" || (name.rfind("audit-rank", 0) == 0 && fs::path(name).extension() == ".jsonl");
}

bool is_run_record_name(const std::string& name) {
  return name == "trace.jsonl" || name == "eval.jsonl" || is_audit_log_name(name);
}

std::vector<std::string> audit_logs(const std::string& run_dir) {
  std::vector<std::string> out;
  if (!fs::is_directory(run_dir)) return out;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (is_audit_log_name(entry.path().filename().string())) out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

RecordsCheck check_run_records(const std::string& run_dir, const std::string& ckpt_dir, const ckpt::CheckpointMeta& meta,
                               bool audit, const std::string& batch_digest) {
  RecordsCheck rc;
  const int64_t K = meta.step;
  if (K == 0) return rc;
  const std::string manifest = ckpt_dir + "/manifest.json";
  const std::string trace_path = run_dir + "/trace.jsonl";
  const TraceScan ts = scan_trace(trace_path, K);
  rc.begin = ts.begin;
  if (!ts.exists)
    rc.missing.push_back(trace_path + ": missing (the checkpoint at step " + std::to_string(K) + " needs the records of " +
                         steps_phrase(ts.missing) + ")");
  else if (!ts.missing.empty())
    rc.missing.push_back(trace_path + ": no record of " + steps_phrase(ts.missing) + " (the checkpoint is at step " +
                         std::to_string(K) + ")");
  if (ts.at_k) {
    // The record of step K is the step the checkpoint holds: a record of another run (or a manifest edited to
    // another position) would continue as a wrong trace.
    const TraceRecord& r = *ts.at_k;
    const std::string where = trace_path + ":" + std::to_string(ts.line_k) + ": step " + std::to_string(K) + " ";
    const std::string fix = ": the trace and the checkpoint are not of one run; resume from a checkpoint of the run "
                            "this trace records, or move the trace away and pass --new-records";
    if (r.tokens != meta.tokens)
      throw std::runtime_error(where + "has tokens " + std::to_string(r.tokens) + " but " + manifest + " has 'tokens' " +
                               std::to_string(meta.tokens) + fix);
    const nlohmann::json& ls = meta.loader_state;
    if (ls.is_object() && ls.contains("epoch") && ls.at("epoch").is_number_integer() &&
        r.epoch != ls.at("epoch").get<int64_t>())
      throw std::runtime_error(where + "drew its batch in epoch " + std::to_string(r.epoch) + " but " + manifest +
                               " has 'loader_state.epoch' " + ls.at("epoch").dump() + fix);
    if (!batch_digest.empty() && r.data_digest != batch_digest)
      throw std::runtime_error(where + "has data_digest " + r.data_digest + " but the batch " + manifest +
                               "'s loader_state puts at step " + std::to_string(K) + " (epoch " + ls.at("epoch").dump() +
                               ", batches_processed " + ls.at("batches_processed").dump() + ", seed " +
                               ls.at("seed").dump() + ") has " + batch_digest + fix);
    // Two runs over the same data agree on every count above; only the parameters tell them apart (a run's trace
    // records the digest its checkpoint of that step holds).
    if (!r.param_digest.empty() && !meta.digests.params.empty() && r.param_digest != meta.digests.params)
      throw std::runtime_error(where + "has param_digest " + r.param_digest + " but " + manifest +
                               " has 'state_digests.params' " + meta.digests.params + fix);
  }
  if (!audit) return rc;

  const std::vector<Draw> draws = draws_of(meta);
  const std::vector<std::string> logs = audit_logs(run_dir);
  std::vector<int64_t> total(static_cast<size_t>(K + 1), 0);
  std::vector<AuditWalk> walks;
  for (const std::string& f : logs) {
    walks.push_back(walk_audit(f, draws));
    for (int64_t t = 1; t <= K; ++t) total[static_cast<size_t>(t)] += walks.back().count[static_cast<size_t>(t)];
  }
  std::vector<int64_t> short_steps;
  for (int64_t t = rc.begin; t <= K; ++t) {
    const int64_t want = draws[static_cast<size_t>(t - 1)].instances, have = total[static_cast<size_t>(t)];
    if (want > 0 && have > want) {
      std::string holders;
      for (size_t i = 0; i < logs.size(); ++i)
        if (walks[i].count[static_cast<size_t>(t)] > 0)
          holders += (holders.empty() ? "" : ", ") + logs[i] + " (" + std::to_string(walks[i].count[static_cast<size_t>(t)]) + ")";
      throw std::runtime_error(run_dir + ": the audit logs hold " + std::to_string(have) + " records of step " +
                               std::to_string(t) + " but its batch has " + std::to_string(want) +
                               " instances (" + holders + "): records appended twice, or logs of another run; restore "
                               "the audit logs as the run wrote them");
    }
    if (have < std::max<int64_t>(want, 1)) short_steps.push_back(t);
  }
  if (short_steps.empty()) return rc;
  // Name the logs that lack those steps: those present without them, and those the checkpoint's layout wrote that
  // are gone.
  auto layout_int = [&](const char* key) {
    const nlohmann::json& dl = meta.data_layout;
    return dl.is_object() && dl.contains(key) && dl.at(key).is_number_integer() ? dl.at(key).get<int64_t>() : int64_t{1};
  };
  // One log per rank, or under context parallelism per group of "cp" ranks (train/run.cpp).
  const int64_t W = std::max<int64_t>(1, layout_int("dp_shard") * layout_int("dp_replicate") / layout_int("cp"));
  std::vector<std::string> expected;
  for (int64_t r = 0; r < W; ++r) {
    char name[64];
    std::snprintf(name, sizeof name, W == 1 ? "audit.jsonl" : "audit-rank%05lld.jsonl", static_cast<long long>(r));
    expected.push_back(run_dir + "/" + name);
  }
  const size_t named = rc.missing.size();
  for (const std::string& f : expected)
    if (std::find(logs.begin(), logs.end(), f) == logs.end())
      rc.missing.push_back(f + ": missing (the checkpoint at step " + std::to_string(K) + " needs the audit records of " +
                           steps_phrase(short_steps) + ")");
  // A step some records of which are in one log only: with a single log, the records it lacks are its own.
  auto part = [&](int64_t t) {
    return std::to_string(total[static_cast<size_t>(t)]) + " of the " +
           std::to_string(draws[static_cast<size_t>(t - 1)].instances) + " instances of step " + std::to_string(t);
  };
  for (size_t i = 0; i < logs.size(); ++i) {
    std::vector<int64_t> lacks, holds;
    std::string partly;
    for (int64_t t : short_steps) {
      if (walks[i].count[static_cast<size_t>(t)] == 0) lacks.push_back(t);
      else if (logs.size() == 1) partly += (partly.empty() ? "" : ", ") + part(t);
    }
    for (int64_t t = 1; t <= K; ++t)
      if (walks[i].count[static_cast<size_t>(t)] > 0) holds.push_back(t);
    if (!lacks.empty() || !partly.empty())
      rc.missing.push_back(logs[i] + ": " + (lacks.empty() ? "" : "no record of " + steps_phrase(lacks)) +
                           (!lacks.empty() && !partly.empty() ? ", " : "") +
                           (partly.empty() ? "" : "only " + partly + " (cut short?)") + " (it holds records of " +
                           (holds.empty() ? std::string("no step") : steps_phrase(holds)) + "; the checkpoint is at step " +
                           std::to_string(K) + ")");
  }
  if (rc.missing.size() == named) {  // several logs hold parts of those steps, none all of its own
    std::string parts;
    for (int64_t t : short_steps) parts += (parts.empty() ? "" : ", ") + part(t);
    rc.missing.push_back(run_dir + ": the audit logs hold only " + parts + " (a log cut short?)");
  }
  return rc;
}

std::string checkpoint_batch_digest(const TrainConfig& cfg, const ckpt::CheckpointMeta& meta,
                                    bool ignore_fingerprint_mismatch) {
  const nlohmann::json& ls = meta.loader_state;
  if (!ls.is_object() || ls.value("format", "") != "olmoref-loader-state-v1" || meta.step == 0) return "";
  for (const char* k : {"epoch", "batches_processed", "global_batch_instances", "sequence_length"})
    if (!ls.contains(k) || !ls.at(k).is_number_integer()) return "";
  const int64_t bp = ls.at("batches_processed").get<int64_t>();
  if (bp < 1 || ls.at("sequence_length").get<int64_t>() != cfg.train.seq_len) return "";
  TrainConfig c = cfg;
  c.train.global_batch_instances = ls.at("global_batch_instances").get<int64_t>();
  c.train.micro_batch_instances = c.train.global_batch_instances;
  std::unique_ptr<BatchSource> src = make_batch_source(c);
  // Other data by request (--ignore-fingerprint-mismatch): its batches are other batches.
  if (src->fingerprint() != ls.value("fingerprint", "") && ignore_fingerprint_mismatch) return "";
  // The loader stands after step K's batch; one batch back, it draws that batch again.
  nlohmann::json before = ls;
  before["batches_processed"] = bp - 1;
  before["tokens_processed"] = (bp - 1) * c.train.global_batch_instances * c.train.seq_len;
  src->restore(before, ignore_fingerprint_mismatch);
  const StepBatch b = src->next();
  return hex64(data_digest(b.tokens.data(), static_cast<int64_t>(b.tokens.size())));
}

void cut_audit_logs(const std::string& run_dir, const ckpt::CheckpointMeta& meta) {
  const std::vector<Draw> draws = draws_of(meta);
  for (const std::string& f : audit_logs(run_dir)) {
    const AuditWalk w = walk_audit(f, draws);
    if (w.kept_bytes >= w.size) continue;
    std::string kept(w.kept_bytes, '\0');
    {
      std::ifstream in(f, std::ios::binary);
      in.read(kept.data(), static_cast<std::streamsize>(kept.size()));
      if (!in) throw std::runtime_error(f + ": cannot read the audit log");
    }
    if (!kept.empty() && kept.back() != '\n') kept += '\n';
    const std::string tmp = f + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << kept;
      if (!out) throw std::runtime_error(tmp + ": cannot rewrite " + f);
    }
    fs::rename(tmp, f);
  }
}

}  // namespace olmoref
