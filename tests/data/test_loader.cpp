// tests/data/test_loader.cpp — global batches = OLMo-core rows, micro-batches/ranks, epochs,
// resume at every step, fingerprint checks, audit log, holdout reporting.
#include <doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/documents.h"
#include "data/audit.h"
#include "data/holdout.h"
#include "data/loader.h"
#include "data_test_util.h"

using namespace olmoref::data;
using olmoref::data::testing::pattern_tokens;
using olmoref::data::testing::TempDir;
using olmoref::data::testing::write_tokens;

namespace {

// Three files with different lengths and tails; instance count depends on L.
std::shared_ptr<FslDataset> make_dataset(const TempDir& tmp, int64_t seq_len, const std::vector<int64_t>& lens,
                                         Dtype dtype = Dtype::u16) {
  std::vector<std::string> paths;
  for (size_t f = 0; f < lens.size(); ++f) {
    paths.push_back(tmp.file("part-" + std::to_string(f) + ".npy"));
    if (!std::filesystem::exists(paths.back())) {
      write_tokens(paths.back(), pattern_tokens(lens[f], static_cast<uint32_t>(f), 50000), dtype);
    }
  }
  DatasetOptions o;
  o.sequence_length = seq_len;
  o.vocab_size = 50000;
  o.dtype = dtype;
  return std::make_shared<FslDataset>(Mix::from_paths(paths), o);
}

LoaderConfig config(std::shared_ptr<FslDataset> ds, int64_t g, int64_t mb, uint64_t seed = kOlmoCoreDefaultSeed) {
  LoaderConfig c;
  c.dataset = std::move(ds);
  c.seed = seed;
  c.global_batch_instances = g;
  c.microbatch_instances = mb;
  return c;
}

struct Step {
  int64_t step, epoch, batch;
  std::vector<int64_t> ids;
  uint64_t digest;
  bool operator==(const Step&) const = default;
};

Step record(const GlobalBatch& b) { return {b.step, b.epoch, b.batch, b.instance_ids, xxh3_tokens(b.tokens)}; }

}  // namespace

TEST_CASE("global batch b is OLMo-core's row b, tokens in row order (spec vector n=2048)") {
  TempDir tmp;
  // 2048 instances of 4 tokens across three files with dropped tails: 3001 + 3003 + 2194 tokens.
  auto ds = make_dataset(tmp, 4, {3001, 3003, 2194});
  REQUIRE(ds->size() == 750 + 750 + 548);
  Loader loader(config(ds, 8, 2));
  const GlobalBatch b0 = loader.next_batch();
  CHECK(b0.step == 1);
  CHECK(b0.epoch == 1);
  CHECK(b0.batch == 0);
  CHECK(b0.instance_ids == std::vector<int64_t>{808, 2001, 1683, 1798, 654, 2034, 369, 1696});
  for (int b = 1; b < 20; ++b) {
    const GlobalBatch gb = loader.next_batch();
    const GlobalOrder order(kOlmoCoreDefaultSeed, 1, ds->size(), 8);
    const auto row = order.batch(b);
    REQUIRE(gb.instance_ids.size() == 8);
    CHECK(std::equal(row.begin(), row.end(), gb.instance_ids.begin()));
    for (size_t i = 0; i < 8; ++i) {
      const std::vector<uint32_t> inst = ds->instance(gb.instance_ids[i]);
      CHECK(std::equal(inst.begin(), inst.end(), gb.tokens.begin() + static_cast<std::ptrdiff_t>(i * 4)));
    }
  }
}

TEST_CASE("micro-batches are contiguous slices of the row; ranks take contiguous runs of micro-batches") {
  TempDir tmp;
  auto ds = make_dataset(tmp, 16, {4000, 1000});
  Loader loader(config(ds, 12, 3));
  const GlobalBatch b = loader.next_batch();
  REQUIRE(b.n_microbatches() == 4);
  for (int64_t m = 0; m < 4; ++m) {
    const auto ids = b.microbatch_ids(m);
    const auto toks = b.microbatch_tokens(m);
    CHECK(ids.size() == 3);
    CHECK(toks.size() == 3 * 16);
    CHECK(ids[0] == b.instance_ids[static_cast<size_t>(3 * m)]);
    const std::vector<uint32_t> first = ds->instance(ids[0]);
    CHECK(std::equal(first.begin(), first.end(), toks.begin()));
  }
  CHECK(Loader::rank_of_microbatch(0, 4, 2) == 0);
  CHECK(Loader::rank_of_microbatch(1, 4, 2) == 1);
  CHECK(Loader::rank_of_microbatch(2, 4, 2) == 0);
  CHECK(Loader::microbatches_of_rank(1, 8, 4) == std::vector<int64_t>{1, 5});
  CHECK(Loader::microbatches_of_rank(0, 4, 3) == std::vector<int64_t>{0, 3});  // 4 over 3 ranks: 2, 1, 1
  CHECK(Loader::microbatches_of_rank(2, 4, 3) == std::vector<int64_t>{2});
  CHECK(Loader::rank_of_microbatch(3, 4, 3) == 0);
  // A micro-batch size that does not divide the global batch: the last micro-batch holds the remainder.
  Loader odd(config(ds, 12, 5));
  const GlobalBatch ob = odd.next_batch();
  REQUIRE(ob.n_microbatches() == 3);
  CHECK(ob.microbatch_ids(2).size() == 2);
  CHECK(ob.microbatch_tokens(2).size() == 2 * 16);
  CHECK(ob.microbatch_ids(2)[1] == ob.instance_ids.back());
  LoaderConfig crowded = config(ds, 12, 5);
  crowded.world_size = 4;  // 3 micro-batches cannot give 4 ranks one each
  CHECK_THROWS_WITH(Loader{crowded}, doctest::Contains("train.micro_batch_instances <= 3"));
}

TEST_CASE("epochs: the tail is cropped, the next epoch reshuffles with seed + epoch") {
  TempDir tmp;
  auto ds = make_dataset(tmp, 8, {420, 380});  // 52 + 47 = 99 instances
  REQUIRE(ds->size() == 99);
  Loader loader(config(ds, 10, 5, 1234));
  CHECK(loader.batches_per_epoch() == 9);  // 99 -> 90 used, 9 cropped
  std::set<int64_t> seen;
  for (int b = 0; b < 9; ++b) {
    const GlobalBatch gb = loader.next_batch();
    for (int64_t id : gb.instance_ids) CHECK(seen.insert(id).second);  // each instance at most once per epoch
  }
  CHECK(seen.size() == 90);
  CHECK(loader.state().epoch == 1);
  CHECK(loader.state().batches_processed == 9);

  const GlobalBatch e2 = loader.next_batch();
  CHECK(e2.epoch == 2);
  CHECK(e2.batch == 0);
  CHECK(e2.step == 10);
  const GlobalOrder order2(1234, 2, 99, 10);  // PCG64(1236)
  CHECK(std::equal(order2.batch(0).begin(), order2.batch(0).end(), e2.instance_ids.begin()));
  const GlobalOrder order1(1234, 1, 99, 10);
  CHECK_FALSE(std::equal(order1.batch(0).begin(), order1.batch(0).end(), e2.instance_ids.begin()));
  CHECK(loader.state().epoch == 2);
  CHECK(loader.state().batches_processed == 1);
}

TEST_CASE("resume at every step, across epoch boundaries, equals the uninterrupted stream") {
  TempDir tmp;
  auto ds = make_dataset(tmp, 8, {260, 170, 90}, Dtype::u32);  // 32 + 21 + 11 = 64 instances
  const int64_t g = 6;                                         // 10 batches/epoch, 4 cropped
  const int64_t total = 25;                                    // 2.5 epochs
  std::vector<Step> straight;
  {
    Loader loader(config(ds, g, 3, 77));
    for (int64_t s = 0; s < total; ++s) straight.push_back(record(loader.next_batch()));
  }
  CHECK(straight[9].epoch == 1);
  CHECK(straight[10].epoch == 2);
  CHECK(straight[20].epoch == 3);
  for (int64_t k = 0; k <= total; ++k) {
    CAPTURE(k);
    Loader first(config(ds, g, 3, 77));
    for (int64_t s = 0; s < k; ++s) first.next_batch();
    // Through JSON, as a checkpoint stores it.
    const std::string saved = nlohmann::json(first.state()).dump();
    const LoaderState restored_state = nlohmann::json::parse(saved).get<LoaderState>();
    CHECK(restored_state == first.state());
    // A fresh loader configured with another seed: the checkpoint's seed must win.
    Loader second(config(ds, g, 3, 999));
    second.restore(restored_state);
    for (int64_t s = k; s < total; ++s) REQUIRE(record(second.next_batch()) == straight[static_cast<size_t>(s)]);
  }
  // The two spellings of an epoch boundary resume identically.
  Loader a(config(ds, g, 3, 77)), b(config(ds, g, 3, 77));
  LoaderState end_of_1 = a.state();
  end_of_1.epoch = 1;
  end_of_1.batches_processed = 10;
  LoaderState start_of_2 = end_of_1;
  start_of_2.epoch = 2;
  start_of_2.batches_processed = 0;
  a.restore(end_of_1);
  b.restore(start_of_2);
  CHECK(record(a.next_batch()) == straight[10]);
  CHECK(record(b.next_batch()) == straight[10]);

  // Negative controls: a resume that loses the cursor or the seed diverges.
  Loader nine(config(ds, g, 3, 77));
  for (int i = 0; i < 9; ++i) nine.next_batch();
  LoaderState lost = nine.state();
  lost.batches_processed = 0;
  Loader no_cursor(config(ds, g, 3, 77));
  no_cursor.restore(lost);
  CHECK_FALSE(record(no_cursor.next_batch()) == straight[9]);
  lost = nine.state();
  lost.seed = kOlmoCoreDefaultSeed;
  Loader no_seed(config(ds, g, 3, 77));
  no_seed.restore(lost);
  CHECK_FALSE(record(no_seed.next_batch()).ids == straight[9].ids);
}

TEST_CASE("restore refuses another dataset unless overridden, and another global batch always") {
  TempDir tmp, tmp2;
  auto ds = make_dataset(tmp, 8, {400, 400});
  auto other = make_dataset(tmp2, 8, {400, 408});  // one file 16 bytes longer
  Loader loader(config(ds, 10, 10));
  loader.next_batch();
  loader.next_batch();
  const LoaderState s = loader.state();
  CHECK(s.fingerprint == ds->fingerprint());

  Loader on_other(config(other, 10, 10));
  CHECK_THROWS_WITH(on_other.restore(s), doctest::Contains("refusing to resume"));
  CHECK_THROWS_WITH(on_other.restore(s), doctest::Contains(other->fingerprint().c_str()));
  CHECK_THROWS_WITH(on_other.restore(s), doctest::Contains("ignore_fingerprint_mismatch"));
  on_other.restore(s, /*ignore_fingerprint_mismatch=*/true);
  CHECK(on_other.state().batches_processed == 2);
  CHECK(on_other.next_batch().batch == 2);

  Loader other_batch(config(ds, 20, 10));
  CHECK_THROWS_WITH(other_batch.restore(s), doctest::Contains("global batches of 10"));

  LoaderState bad_format;
  CHECK_THROWS_WITH(nlohmann::json({{"format", "x"}}).get<LoaderState>(), doctest::Contains("olmoref-loader-state-v1"));
  (void)bad_format;
}

TEST_CASE("audit log: one record per instance of each micro-batch, with rank, file, range and XXH3") {
  TempDir tmp;
  auto ds = make_dataset(tmp, 8, {300, 200});  // 37 + 25 = 62 instances
  const int64_t steps = 9;                     // crosses into epoch 2 (7 batches/epoch)

  auto run = [&](int rank, const std::string& path) {
    LoaderConfig c = config(ds, 8, 2);
    c.world_size = 2;
    c.rank = rank;
    c.audit = std::make_shared<AuditLog>(path);
    Loader loader(c);
    std::vector<GlobalBatch> out;
    for (int64_t s = 0; s < steps; ++s) out.push_back(loader.next_batch());
    c.audit->flush();
    return out;
  };
  const std::vector<GlobalBatch> batches = run(-1, tmp.file("all.jsonl"));
  run(0, tmp.file("rank0.jsonl"));
  run(1, tmp.file("rank1.jsonl"));

  const std::vector<AuditRecord> all = read_audit_log(tmp.file("all.jsonl"));
  REQUIRE(all.size() == static_cast<size_t>(steps * 8));
  for (size_t i = 0; i < all.size(); ++i) {
    const AuditRecord& r = all[i];
    const GlobalBatch& b = batches[i / 8];
    const int64_t k = static_cast<int64_t>(i % 8);
    CHECK(r.step == b.step);
    CHECK(r.epoch == b.epoch);
    CHECK(r.batch == b.batch);
    CHECK(r.microbatch == k / 2);
    CHECK(r.rank == (k / 2) % 2);  // micro-batch m on rank m mod W
    CHECK(r.instance == b.instance_ids[static_cast<size_t>(k)]);
    const auto loc = ds->locate(r.instance);
    CHECK(r.file == ds->file(static_cast<size_t>(loc.file)).path());
    CHECK(r.file_index == loc.file);
    CHECK(r.token_start == loc.token_start);
    CHECK(r.token_end == loc.token_start + 8);
    CHECK(r.xxh3 == xxh3_tokens(ds->instance(r.instance)));
  }
  CHECK(all.back().epoch == 2);

  // Each rank's log is exactly its share (micro-batches 0, 2 on rank 0; 1, 3 on rank 1); together they are the
  // global batch, in order.
  const std::vector<AuditRecord> r0 = read_audit_log(tmp.file("rank0.jsonl"));
  const std::vector<AuditRecord> r1 = read_audit_log(tmp.file("rank1.jsonl"));
  CHECK(r0.size() == all.size() / 2);
  CHECK(r1.size() == all.size() / 2);
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t own = (k / 2) * 4 + k % 2;  // the k-th instance of a rank: micro-batch 2·(k/2) + rank
      CHECK(r0[static_cast<size_t>(s * 4 + k)] == all[static_cast<size_t>(s * 8 + own)]);
      CHECK(r1[static_cast<size_t>(s * 4 + k)] == all[static_cast<size_t>(s * 8 + own + 2)]);
    }
  }

  // The line format is the documented one (key order included).
  std::ifstream in(tmp.file("all.jsonl"));
  std::string line;
  std::getline(in, line);
  CHECK(line.rfind("{\"step\":1,\"epoch\":1,\"batch\":0,\"microbatch\":0,\"rank\":0,\"instance\":", 0) == 0);
  CHECK(line.find("\"xxh3\":\"" + hex64(all[0].xxh3) + "\"}") != std::string::npos);

  // Resume: the audit of k steps + restore + the rest equals the uninterrupted audit.
  {
    LoaderConfig c = config(ds, 8, 2);
    c.world_size = 2;
    c.audit = std::make_shared<AuditLog>(tmp.file("resumed.jsonl"));
    Loader first(c);
    for (int s = 0; s < 4; ++s) first.next_batch();
    c.audit->flush();
    LoaderConfig c2 = config(ds, 8, 2);
    c2.world_size = 2;
    c2.audit = std::make_shared<AuditLog>(tmp.file("resumed.jsonl"), AuditLog::Mode::append);
    Loader second(c2);
    second.restore(first.state());
    for (int64_t s = 4; s < steps; ++s) second.next_batch();
    c2.audit->flush();
  }
  CHECK(read_audit_log(tmp.file("resumed.jsonl")) == all);
}

TEST_CASE("audit log under intra-document masking: each record ends in the instance's document lengths") {
  TempDir tmp;
  auto ds = make_dataset(tmp, 8, {300, 200});
  LoaderConfig c = config(ds, 8, 2);
  c.audit = std::make_shared<AuditLog>(tmp.file("docs.jsonl"));
  // An EOS the first delivered instance holds at position 3, so that it is cut and others may not be.
  const int64_t first_id = Loader(config(ds, 8, 2)).next_batch().instance_ids[0];
  c.document_eos = ds->instance(first_id)[3];
  Loader loader(c);
  loader.next_batch();
  loader.next_batch();
  c.audit->flush();
  const std::vector<AuditRecord> recs = read_audit_log(tmp.file("docs.jsonl"));
  REQUIRE(recs.size() == 16);
  int cut = 0;
  for (const AuditRecord& r : recs) {
    const std::vector<uint32_t> tokens = ds->instance(r.instance);
    CHECK(r.documents == olmoref::document_lengths(tokens.data(), 8, *c.document_eos));
    cut += r.documents.size() > 1;
  }
  CHECK(cut > 0);
  // The documents go last, after the fields a log without masking has, and round-trip.
  AuditRecord r = recs[0];
  r.documents = {3, 1, 4};
  const std::string line = audit_record_json(r);
  CHECK(line.size() > 22);
  CHECK(line.substr(line.size() - 22) == "\",\"documents\":[3,1,4]}");
  CHECK(parse_audit_record(line) == r);
  r.documents.clear();
  CHECK(audit_record_json(r).find("documents") == std::string::npos);
  CHECK(parse_audit_record(audit_record_json(r)) == r);
}

TEST_CASE("the loader reports the holdout kind and opens the holdout data") {
  TempDir tmp;
  auto ds = make_dataset(tmp, 8, {200, 200});
  {
    Loader loader(config(ds, 5, 5));
    CHECK(loader.holdout_kind() == HoldoutKind::none);
    CHECK_THROWS_WITH(loader.holdout_dataset(), doctest::Contains("no holdout"));
  }
  write_tokens(tmp.file("heldout.npy"), pattern_tokens(100, 7, 50000), Dtype::u16);
  {
    std::ofstream m(tmp.file("holdout.mix"));
    m << "heldout.npy\n";
  }
  LoaderConfig c = config(ds, 5, 5);
  c.holdout = HoldoutSpec::separate(Mix::parse_file(tmp.file("holdout.mix")));
  Loader loader(c);
  CHECK(loader.holdout_kind() == HoldoutKind::separate_mix);
  CHECK(std::string(holdout_kind_name(loader.holdout_kind())) == "separate-mix");
  CHECK(loader.holdout().describe().find("holdout.mix") != std::string::npos);
  const auto h = loader.holdout_dataset();
  CHECK(h->size() == 12);
  CHECK(h->sequence_length() == 8);
}
