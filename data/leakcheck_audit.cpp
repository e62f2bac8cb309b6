// The leak check's audit of the loader (data/leakcheck_stages.h audit_loader): a leak the overlap levels cannot
// see is a loader that delivers an instance twice, skips one, or delivers another stream after a resume or on
// another layout. Each check compares audit logs the loader wrote (data/audit_check.h).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "data/leakcheck_stages.h"

namespace olmoref::data::leak {

namespace {

// The stream a correct loader delivers over the checked steps, scanned at world size W.
StreamExpectation stream_expectation(const LeakRun& run) {
  StreamExpectation expect;
  expect.global_batch_instances = run.G;
  expect.microbatch_instances = run.mb;
  expect.world_size = run.W;
  expect.dataset = run.base.dataset;
  expect.seed = run.base.seed;
  expect.check_content = run.o.content_check;
  expect.document_eos = run.base.document_eos;
  expect.first_step = 1;
  expect.last_step = run.steps;
  return expect;
}

// W = 2, 4, 8 ranks (each rank its own loader and audit log) must give the W = 1 stream; each layout's logs are
// also checked for partition and exactly-once (merged into those checks).
CheckResult audit_layouts(const LeakRun& run, const StreamExpectation& expect, const std::vector<AuditRecord>& main,
                          const std::vector<DeliveredBatch>& single_by_label, CheckResult& partition, CheckResult& once) {
  const int W = run.W;
  const int64_t M = run.M;
  CheckResult layout("audit_layout");
  std::vector<int> layouts = run.o.layouts;
  if (layouts.empty())
    for (int w : {2, 4, 8})
      if (w <= M) layouts.push_back(w);
  if (W != 1 && std::find(layouts.begin(), layouts.end(), W) == layouts.end()) layouts.push_back(W);
  std::vector<int> layouts_done;
  for (const int w : layouts) {
    if (w < 2) continue;
    if (w > M) throw std::invalid_argument("leakcheck: layout W=" + std::to_string(w) + " is more than the " +
                                           std::to_string(M) + " micro-batches of a step (every rank computes at least one)");
    const std::vector<AuditRecord> recs =
        w == W ? main : audit_stream(run.base, w, run.steps, run.work.path, "layout.w" + std::to_string(w));
    if (w != W) {
      StreamExpectation ew = expect;
      ew.world_size = w;
      ew.check_content = false;  // the content was checked on the scanned stream
      CheckResult p = check_partition(recs, ew);
      if (p.first) p.first->world_size = w;
      partition.merge(p);
      CheckResult e1 = check_exactly_once(recs, ew);
      if (e1.first) e1.first->world_size = w;
      once.merge(e1);
    }
    layout.merge(compare_streams(single_by_label, batches_by_label(recs), "audit_layout", 1, -1, w));
    layouts_done.push_back(w);
  }
  if (layouts_done.empty()) layout.skip("a step has " + std::to_string(M) + " micro-batch(es): no layout other than W=1 fits");
  layout.details["layouts"] = layouts_done;
  layout.details["reference"] = "W=1";
  return layout;
}

// Stopping after step k (the loader state through its JSON form, as a checkpoint stores it) and continuing in a
// fresh loader must give the uninterrupted stream; by default at mid-run and around epoch ends, where a loader's
// position is most easily lost.
CheckResult audit_resumes(const LeakRun& run, const std::vector<DeliveredBatch>& single_delivered) {
  const int64_t steps = run.steps, bpe = run.bpe;
  CheckResult resume("audit_resume");
  std::vector<int64_t> points = run.o.resume_at;
  if (points.empty()) {
    points.push_back(steps / 2);
    for (int64_t e = 1; e * bpe < steps && points.size() < 8; ++e) {
      points.push_back(e * bpe);
      if (e * bpe + std::max<int64_t>(1, bpe / 2) < steps) points.push_back(e * bpe + std::max<int64_t>(1, bpe / 2));
    }
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  nlohmann::json done_points = nlohmann::json::array();
  int64_t resume_points_done = 0;
  for (const int64_t k : points) {
    if (k < 1 || k >= steps) continue;
    CheckResult one("audit_resume");
    try {
      LoaderConfig c = run.base;
      c.world_size = 1;
      c.rank = -1;
      LoaderState state;
      {
        Loader before(c);
        GlobalBatch b;
        for (int64_t s = 0; s < k; ++s) before.next_batch(b);
        const nlohmann::json j = before.state();  // through its JSON form, as a checkpoint stores it
        state = j.get<LoaderState>();
      }
      const std::string path = run.work.path + "/resume.k" + std::to_string(k) + ".jsonl";
      c.audit = std::make_shared<AuditLog>(path);
      {
        Loader after(c);
        after.restore(state);
        GlobalBatch b;
        for (int64_t s = k; s < steps; ++s) after.next_batch(b);
        c.audit->flush();
      }
      const std::vector<AuditRecord> recs = read_audit_log(path);
      one = compare_streams(single_delivered, batches_in_delivery_order(recs, k + 1, run.G), "audit_resume", k + 1, steps);
    } catch (const std::exception& e) {
      StreamPosition p;
      p.step = k + 1;
      one.fail(p, std::string("resuming after step ") + std::to_string(k) + " failed: " + e.what());
    }
    done_points.push_back({{"after_step", k}, {"status", one.status}, {"failures", one.failures}});
    resume.merge(one);
    ++resume_points_done;
  }
  if (resume_points_done == 0) resume.skip("no resume point inside the checked steps");
  resume.details["resume_points"] = done_points;
  return resume;
}

// With the layout read from each step's records, a record must also be in its own rank's file (the trainer writes
// audit.jsonl alone, or audit-rankNNNNN.jsonl per rank): a rank's records relabelled as another's cannot pass as a
// smaller layout.
CheckResult audit_rank_files(const std::vector<std::string>& audit_logs) {
  CheckResult files("external_rank_files");
  for (const std::string& path : audit_logs) {
    const std::string name = std::filesystem::path(path).filename().string();
    int64_t file_rank = -1;
    if (name == "audit.jsonl") file_rank = 0;
    else if (name.rfind("audit-rank", 0) == 0 && name.size() == std::string("audit-rank00000.jsonl").size())
      file_rank = std::strtoll(name.substr(10, 5).c_str(), nullptr, 10);
    if (file_rank < 0) continue;
    for (const AuditRecord& r : read_audit_log(path)) {
      ++files.checked;
      if (r.rank == file_rank) continue;
      files.fail(position_of(r), path + " is rank " + std::to_string(file_rank) + "'s log but holds a record of rank " +
                                     std::to_string(r.rank));
    }
  }
  return files;
}

// A real run's logs (--audit, any mix of layouts and resumes): the same audit checks, equality with the configured
// stream, and their instances' XXH3s against the holdout instances.
nlohmann::json audit_external_logs(const LeakRun& run, const Holdout& hold, const StreamScan& reference,
                                   const StreamExpectation& expect, const std::vector<DeliveredBatch>& single_by_label) {
  const LeakCheckOptions& o = run.o;
  const std::vector<AuditRecord>& external = run.external;
  CheckResult ext("external_audit");
  int64_t first_step = external.front().step, last_step = external.front().step;
  for (const AuditRecord& r : external) {
    first_step = std::min(first_step, r.step);
    last_step = std::max(last_step, r.step);
  }
  StreamExpectation ee = expect;
  // A run's logs may span layouts (a resume at another world size): each step is checked against the ranks
  // that logged it.
  ee.world_size = 0;
  ee.first_step = first_step;
  ee.last_step = -1;
  ee.check_content = o.content_check;
  const CheckResult p = check_partition(external, ee);
  const CheckResult e1 = check_exactly_once(external, ee);
  const CheckResult eq = compare_streams(single_by_label, batches_by_label(external), "external_audit", first_step, last_step);
  const CheckResult files = audit_rank_files(o.audit_logs);
  CheckResult overlap("external_holdout");
  for (const AuditRecord& r : external) {
    ++overlap.checked;
    const auto it = hold.instance_hash.find(r.xxh3);
    if (it == hold.instance_hash.end()) continue;
    // The configured data itself delivers that holdout instance, and the user accepted data overlaps.
    if (o.allow_data_overlap && o.attribute && reference.hits.instances.count(it->second)) continue;
    overlap.fail(position_of(r), "the log's instance has the XXH3 of holdout instance " + std::to_string(it->second));
  }
  ext.merge(p);
  ext.merge(files);
  ext.merge(e1);
  ext.merge(eq);
  ext.merge(overlap);
  ext.checked = static_cast<int64_t>(external.size());
  ext.details["files"] = o.audit_logs;
  ext.details["records"] = static_cast<int64_t>(external.size());
  ext.details["partition"] = p.to_json();
  ext.details["rank_files"] = files.to_json();
  ext.details["exactly_once"] = e1.to_json();
  ext.details["equals_configured_stream"] = eq.to_json();
  ext.details["holdout_instances"] = overlap.to_json();
  return ext.to_json();
}

}  // namespace

void audit_loader(const LeakRun& run, const Holdout& hold, const StreamScan& reference, nlohmann::json& checks) {
  if (!run.o.audit_checks || run.ext) {
    for (const char* name : {"audit_partition", "audit_exactly_once", "audit_resume", "audit_layout"}) {
      CheckResult s(name);
      s.skip(run.ext ? "another framework's run: olmoref's loader audit does not apply" : "audit checks turned off");
      checks[name] = s.to_json();
    }
    return;
  }
  const int W = run.W;
  const StreamExpectation expect = stream_expectation(run);
  // The scanned stream's own logs (stream_training_instances wrote them).
  std::vector<std::string> paths;
  for (int r = 0; r < W; ++r)
    paths.push_back(run.work.path + "/stream.w" + std::to_string(W) + ".r" + std::to_string(r) + ".jsonl");
  const std::vector<AuditRecord> main = read_audit_logs(paths);
  CheckResult partition = check_partition(main, expect);
  CheckResult once = check_exactly_once(main, expect);
  if (partition.first) partition.first->world_size = W;
  if (once.first) once.first->world_size = W;

  // The single-loader stream: the reference for layouts and resumes.
  std::vector<AuditRecord> single_owned;
  if (W != 1) single_owned = audit_stream(run.base, 1, run.steps, run.work.path, "stream.w1");
  const std::vector<AuditRecord>& single = W == 1 ? main : single_owned;
  const std::vector<DeliveredBatch> single_by_label = batches_by_label(single);
  const std::vector<DeliveredBatch> single_delivered = batches_in_delivery_order(single, 1, run.G);

  const CheckResult layout = audit_layouts(run, expect, main, single_by_label, partition, once);
  const CheckResult resume = audit_resumes(run, single_delivered);
  checks["audit_partition"] = partition.to_json();
  checks["audit_exactly_once"] = once.to_json();
  checks["audit_resume"] = resume.to_json();
  checks["audit_layout"] = layout.to_json();
  if (!run.external.empty()) checks["external_audit"] = audit_external_logs(run, hold, reference, expect, single_by_label);
}

}  // namespace olmoref::data::leak
