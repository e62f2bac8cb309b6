// Checkpoints: round trip, exact continuation, and every way a checkpoint can be wrong is refused
// with a message naming the file and the problem.
#include <doctest.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "tests/common/test_util.h"
#include "tests/model/synthetic.h"
#include "train/trainer.h"

using namespace olmoref;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  std::string dir, data;
  Fixture() {
    dir = testing::temp_dir("ckpt");
    data = testing::write_tokens(dir + "/tokens.u16", testing::progression_tokens(3000, 7));
  }
  TrainConfig config(const std::vector<std::string>& extra = {}) const {
    return testing::tiny_config_with_data(data, extra);
  }
  std::unique_ptr<Trainer> trainer(const TrainConfig& c) const {
    return std::make_unique<Trainer>(c, 2, make_batch_source(c));
  }
};

const Fixture& fx() {
  static Fixture f;
  return f;
}

using testing::error_of;

// Trains 3 steps and checkpoints into a fresh root; returns the checkpoint directory.
std::string make_checkpoint(const std::string& root, const TrainConfig& c) {
  fs::remove_all(root);
  auto t = fx().trainer(c);
  for (int i = 0; i < 3; ++i) t->train_step();
  return t->save_checkpoint(root);
}

void flip_byte(const std::string& path, int64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x10));
}

}  // namespace

TEST_CASE("checkpoint round trip: state restored exactly and the run continues bit for bit") {
  const TrainConfig c = fx().config();
  auto a = fx().trainer(c);
  for (int i = 0; i < 3; ++i) a->train_step();
  const std::string root = fx().dir + "/roundtrip";
  const std::string dir = a->save_checkpoint(root);
  CHECK(fs::path(dir).filename() == "step00000003");
  CHECK(ckpt::verify(dir).empty());
  auto b = fx().trainer(c);
  b->resume(dir, {});
  CHECK(b->step() == 3);
  CHECK(b->tokens() == a->tokens());
  CHECK(std::equal(a->params(), a->params() + a->n_params(), b->params()));
  CHECK(a->adam_m() == b->adam_m());
  CHECK(a->adam_v() == b->adam_v());
  CHECK(a->source().state() == b->source().state());
  for (int i = 0; i < 3; ++i) CHECK(a->train_step().record.to_json() == b->train_step().record.to_json());
  const std::string text = ckpt::inspect(dir, true);
  CHECK(text.find("step         3") != std::string::npos);
  CHECK(text.find("lm_head.w_out.weight") != std::string::npos);
}

TEST_CASE("a corrupted byte, a truncated shard and a deleted shard are each detected on load") {
  const TrainConfig c = fx().config();
  const std::string root = fx().dir + "/damage";
  auto load = [&](const std::string& d) { fx().trainer(c)->resume(d, {}); };
  SUBCASE("corrupted byte") {
    const std::string d = make_checkpoint(root, c);
    flip_byte(d + "/shard-00000.bin", 100);
    const std::string e = error_of([&] { load(d); });
    CHECK(e.find("shard-00000.bin") != std::string::npos);
    CHECK(e.find("checksum") != std::string::npos);
    CHECK(!ckpt::verify(d).empty());
  }
  SUBCASE("truncated shard") {
    const std::string d = make_checkpoint(root, c);
    fs::resize_file(d + "/shard-00000.bin", fs::file_size(d + "/shard-00000.bin") - 9);
    const std::string e = error_of([&] { load(d); });
    CHECK(e.find("shard-00000.bin") != std::string::npos);
    CHECK(e.find("truncated") != std::string::npos);
  }
  SUBCASE("deleted shard") {
    const std::string d = make_checkpoint(root, c);
    fs::remove(d + "/shard-00000.bin");
    const std::string e = error_of([&] { load(d); });
    CHECK(e.find("shard-00000.bin") != std::string::npos);
    CHECK(e.find("missing") != std::string::npos);
  }
  SUBCASE("corrupted manifest") {
    const std::string d = make_checkpoint(root, c);
    std::ofstream(d + "/manifest.json") << "{ not json";
    CHECK(error_of([&] { load(d); }).find("manifest.json") != std::string::npos);
  }
  SUBCASE("an edited manifest value (step, loader position, tokens) is caught by the manifest checksum") {
    for (const char* key : {"step", "tokens"}) {
      const std::string d = make_checkpoint(root, c);
      nlohmann::json m = nlohmann::json::parse(std::ifstream(d + "/manifest.json"));
      m[key] = m[key].get<int64_t>() + 1;
      std::ofstream(d + "/manifest.json") << m.dump(2);
      const std::string e = error_of([&] { load(d); });
      CHECK(e.find("manifest.json") != std::string::npos);
      CHECK(e.find("manifest checksum mismatch") != std::string::npos);
      CHECK(!ckpt::verify(d).empty());
    }
    const std::string d = make_checkpoint(root, c);
    nlohmann::json m = nlohmann::json::parse(std::ifstream(d + "/manifest.json"));
    m["loader_state"]["batches_processed"] = 1000;
    std::ofstream(d + "/manifest.json") << m.dump(2);
    CHECK(error_of([&] { load(d); }).find("manifest checksum mismatch") != std::string::npos);
  }
  SUBCASE("a missing or mistyped key is named, with the file (even when the checksum was recomputed)") {
    const std::string d = make_checkpoint(root, c);
    const nlohmann::json orig = nlohmann::json::parse(std::ifstream(d + "/manifest.json"));
    auto rewrite = [&](nlohmann::json m) {  // what a buggy writer would produce: consistent checksum, bad content
      m.erase("manifest_xxh3");
      const std::string text = m.dump();
      char h[17];
      std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
      m["manifest_xxh3"] = h;
      std::ofstream(d + "/manifest.json") << m.dump(2);
    };
    nlohmann::json m = orig;
    m.erase("tokens");
    rewrite(m);
    std::string e = error_of([&] { load(d); });
    CHECK(e.find("manifest.json: key 'tokens' is missing (expected an integer)") != std::string::npos);
    m = orig;
    m["state_digests"]["adam_v"] = 7;
    rewrite(m);
    e = error_of([&] { load(d); });
    CHECK(e.find("key 'state_digests.adam_v' must be a string, is number") != std::string::npos);
    CHECK(ckpt::verify(d).front().find("state_digests.adam_v") != std::string::npos);
    m = orig;
    m.erase("manifest_xxh3");
    std::ofstream(d + "/manifest.json") << m.dump(2);
    CHECK(error_of([&] { load(d); }).find("'manifest_xxh3'") != std::string::npos);
  }
  SUBCASE("incompatible format version") {
    const std::string d = make_checkpoint(root, c);
    nlohmann::json m = nlohmann::json::parse(std::ifstream(d + "/manifest.json"));
    m["format_version"] = 99;
    std::ofstream(d + "/manifest.json") << m.dump();
    const std::string e = error_of([&] { load(d); });
    CHECK(e.find("format version 99") != std::string::npos);
  }
}

TEST_CASE("resuming with a different model, run configuration or dataset is refused (and overridable where sane)") {
  const std::string root = fx().dir + "/mismatch";
  const std::string d = make_checkpoint(root, fx().config());
  const std::string model = error_of([&] { fx().trainer(fx().config({"model.ffn_hidden=128"}))->resume(d, {}); });
  CHECK(model.find("different model config") != std::string::npos);
  CHECK(model.find("manifest.json") != std::string::npos);
  const std::string run = error_of([&] { fx().trainer(fx().config({"optim.lr=1e-2"}))->resume(d, {}); });
  CHECK(run.find("--allow-config-change") != std::string::npos);
  Trainer::ResumeOptions allow;
  allow.allow_config_change = true;
  CHECK(error_of([&] { fx().trainer(fx().config({"optim.lr=1e-2"}))->resume(d, allow); }).empty());

  const std::string other = testing::write_tokens(fx().dir + "/other.u16", testing::progression_tokens(3100, 8));
  const TrainConfig moved = testing::tiny_config_with_data(other);
  const std::string data = error_of([&] { fx().trainer(moved)->resume(d, {}); });
  CHECK(data.find("fingerprint") != std::string::npos);
  Trainer::ResumeOptions ignore;
  ignore.ignore_fingerprint_mismatch = true;
  CHECK(error_of([&] { fx().trainer(moved)->resume(d, ignore); }).empty());
}

TEST_CASE("retention keeps the newest N, never deletes the newest, ignores and clears incomplete saves") {
  const TrainConfig c = fx().config({"checkpoint.keep_last=2"});
  const std::string root = fx().dir + "/retention";
  fs::remove_all(root);
  fs::create_directories(root + "/.tmp-step00000099");  // a crashed save
  auto t = fx().trainer(c);
  for (int s = 1; s <= 4; ++s) {
    t->train_step();
    t->save_checkpoint(root);
  }
  auto all = ckpt::list_complete(root);
  REQUIRE(all.size() == 2);
  CHECK(fs::path(all[0]).filename() == "step00000003");
  CHECK(fs::path(all[1]).filename() == "step00000004");
  CHECK(!fs::exists(root + "/.tmp-step00000099"));
  // An incomplete directory (no manifest) with a higher step is not "complete".
  fs::create_directories(root + "/step00000009");
  CHECK(fs::path(*ckpt::newest_complete(root)).filename() == "step00000004");
}

TEST_CASE("data_history: loader positions across an epoch end and a changed global batch; each edited value is named") {
  ckpt::DataSegment s;
  s.steps = 6, s.global_batch_instances = 8, s.sequence_length = 64, s.batches_per_epoch = 5;
  using P = std::pair<int64_t, int64_t>;
  CHECK(s.after(5) == P{1, 5});  // the loader opens the next epoch only when it draws again
  CHECK(s.end() == P{2, 1});
  CHECK(s.batch_of(4) == P{1, 4});
  CHECK(s.batch_of(5) == P{2, 0});

  // A small corpus of a few batches per epoch, trained 2 steps into its second epoch.
  const std::string small = testing::write_tokens(fx().dir + "/small.u16", testing::progression_tokens(70, 7));
  const TrainConfig c = testing::tiny_config_with_data(small);
  const std::string root = fx().dir + "/history";
  fs::remove_all(root);
  auto a = std::make_unique<Trainer>(c, 2, make_batch_source(c));
  const int64_t B = make_batch_source(c)->batches_per_epoch(), K = B + 2;
  REQUIRE(B >= 3);
  for (int64_t i = 0; i < K; ++i) a->train_step();
  const std::string d = a->save_checkpoint(root);
  CHECK(ckpt::record_problems(d).empty());
  const nlohmann::json orig = nlohmann::json::parse(std::ifstream(d + "/manifest.json"));
  REQUIRE(orig["data_history"]["segments"].size() == 1);
  CHECK(orig["data_history"]["segments"][0]["batches_per_epoch"] == B);
  CHECK(orig["loader_state"]["epoch"] == 2);
  CHECK(orig["loader_state"]["batches_processed"] == 2);

  // Resumed at a global batch of 4: a second segment, at tokens seen in epoch 2 // the new batch (16 // 4).
  Trainer::ResumeOptions allow;
  allow.allow_config_change = true;
  const TrainConfig c4 = testing::tiny_config_with_data(small, {"train.global_batch_instances=4"});
  auto b = std::make_unique<Trainer>(c4, 2, make_batch_source(c4));
  b->resume(d, allow);
  for (int i = 0; i < 2; ++i) b->train_step();
  const std::string d2 = b->save_checkpoint(fx().dir + "/history-g4");
  CHECK(ckpt::record_problems(d2).empty());
  const nlohmann::json m2 = nlohmann::json::parse(std::ifstream(d2 + "/manifest.json"));
  REQUIRE(m2["data_history"]["segments"].size() == 2);
  CHECK(m2["data_history"]["segments"][1]["epoch"] == 2);
  CHECK(m2["data_history"]["segments"][1]["batches_processed"] == 4);
  CHECK(m2["tokens"] == K * 8 * 64 + 2 * 4 * 64);

  // A value changed and the checksum recomputed: named by record_problems, verify and a resume.
  const std::string k = std::to_string(K);
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"/step", "key 'step' is " + std::to_string(K + 1)},
      {"/tokens", "key 'tokens' is " + std::to_string(K * 8 * 64 + 1)},
      {"/loader_state/batches_processed", "key 'loader_state.batches_processed' is 3"},
      {"/loader_state/epoch", "key 'loader_state.epoch' is 3"},
      {"/loader_state/seed", "key 'loader_state.seed' is 34522"},
      {"/data_history/segments/0/steps", "key 'step' is " + k + " but the steps of 'data_history.segments' add up to " +
                                             std::to_string(K + 1)}};
  for (const auto& [pointer, named] : edits) {
    CAPTURE(pointer);
    nlohmann::json m = orig;
    const nlohmann::json::json_pointer p(pointer);
    m[p] = m[p].get<int64_t>() + 1;
    m["manifest_xxh3"] = ckpt::manifest_checksum(m);
    std::ofstream(d + "/manifest.json", std::ios::trunc) << m.dump(2);
    const std::vector<std::string> problems = ckpt::record_problems(d);
    REQUIRE(!problems.empty());
    CHECK(problems.front().find(d + "/manifest.json: " + named) != std::string::npos);
    CHECK(ckpt::verify(d).front().find(named) != std::string::npos);
    CHECK(error_of([&] { std::make_unique<Trainer>(c, 2, make_batch_source(c))->resume(d, {}); }).find(named) !=
          std::string::npos);
  }
  std::ofstream(d + "/manifest.json", std::ios::trunc) << orig.dump(2);
  CHECK(ckpt::verify(d).empty());
}

TEST_CASE("data_history: a run continuing another run's loader (data.olmo_core_state) records that order's seed") {
  const TrainConfig c = fx().config();
  auto t = fx().trainer(c);
  nlohmann::json start = t->source().state();
  start["seed"] = 99, start["batches_processed"] = 3;
  start["tokens_processed"] = 3 * c.train.global_batch_instances * c.train.seq_len;
  t->start_data_at(start);
  for (int i = 0; i < 2; ++i) t->train_step();
  const std::string root = fx().dir + "/olmo-core-start";
  fs::remove_all(root);
  const std::string d = t->save_checkpoint(root);
  CHECK(ckpt::record_problems(d).empty());  // the config's data.seed (34521) is not this order's, and need not be
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(d + "/manifest.json"));
  CHECK(m["data_history"]["seed_from"] == "data.olmo_core_state");
  CHECK(m["data_history"]["seed"] == 99);
  CHECK(m["data_history"]["segments"][0]["batches_processed"] == 3);
  CHECK(m["loader_state"]["batches_processed"] == 5);
  auto r = fx().trainer(c);
  r->resume(d, {});
  CHECK(r->train_step().record.to_json() == t->train_step().record.to_json());
}

TEST_CASE("frames: a tensor larger than kFrameFloats is cut into frames; ranged reads and VectorReader take only "
          "what they need, each frame verified") {
  const int64_t n = ckpt::kFrameFloats + 1000003;  // one tensor: one whole frame and a short one
  std::vector<float> p(static_cast<size_t>(n)), m(p.size()), v(p.size());
  for (int64_t i = 0; i < n; ++i) {
    p[static_cast<size_t>(i)] = static_cast<float>(i % 9973) * 0.5f - 7.0f;
    m[static_cast<size_t>(i)] = static_cast<float>(i % 101) * 1e-3f;
    v[static_cast<size_t>(i)] = static_cast<float>(i % 17) * 1e-6f;
  }
  ckpt::CheckpointMeta meta;
  meta.loader_state = nlohmann::json::object();
  meta.data_layout = nlohmann::json::object();
  const std::string root = fx().dir + "/frames";
  fs::remove_all(root);
  const std::string d = ckpt::save(root, meta, {n, p.data(), m.data(), v.data()}, {{"w", 0, n}}, {});
  const std::string text = ckpt::inspect(d, true);
  CHECK(text.find("w[0:4194304]") != std::string::npos);
  CHECK(text.find("w[4194304:" + std::to_string(n) + "]") != std::string::npos);
  CHECK(ckpt::verify(d).empty());
  // A range across the frame boundary, of params only: exactly those floats, handed over piece by piece.
  const int64_t a = ckpt::kFrameFloats - 5, b = ckpt::kFrameFloats + 7;
  std::vector<float> got(static_cast<size_t>(b - a), -1.0f);
  int64_t pieces = 0;
  ckpt::load_ranges(d, {{{a, b}, {0, 0}, {0, 0}}},
                    [&](int vec, int64_t x, int64_t y, const float* data) {
                      CHECK(vec == 0);
                      std::copy(data, data + (y - x), got.begin() + (x - a));
                      ++pieces;
                    },
                    n, {}, {});
  CHECK(pieces == 2);
  CHECK(std::equal(got.begin(), got.end(), p.begin() + a));
  // VectorReader: odd-sized pieces in order, then the digest.
  ckpt::VectorReader r(d, "adam_m");
  std::vector<float> all(static_cast<size_t>(n));
  for (int64_t x = 0; x < n; x += 999983) r.read(x, std::min(n, x + 999983), all.data() + x);
  r.finish();
  CHECK(all == m);
  CHECK(error_of([&] { ckpt::VectorReader(d, "params").read(10, 20, all.data()); }).find("in order") != std::string::npos);
  // A flipped byte in the last frame (adam_v's short one, just before the header): a reader of the first frame
  // never reads it, verify and a reader of it name it.
  const nlohmann::json header = [&] {
    std::ifstream f(d + "/shard-00000.bin", std::ios::binary);
    f.seekg(-32, std::ios::end);
    char tail[16];
    f.read(tail, 16);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(tail[i]);
    f.seekg(-32 - static_cast<int64_t>(len), std::ios::end);
    std::string h(len, '\0');
    f.read(h.data(), static_cast<std::streamsize>(len));
    return nlohmann::json::parse(h);
  }();
  const int64_t header_bytes = static_cast<int64_t>(header.dump().size()) + 32;
  flip_byte(d + "/shard-00000.bin", header_bytes + 10);
  ckpt::load_ranges(d, {{{0, 16}, {0, 16}, {0, 16}}}, [&](int, int64_t, int64_t, const float*) {}, n, {}, {});
  const std::string e = error_of([&] {
    ckpt::load_ranges(d, {{{0, 0}, {0, 0}, {n - 16, n}}}, [](int, int64_t, int64_t, const float*) {}, n, {}, {});
  });
  CHECK(e.find("adam_v w[4194304:") != std::string::npos);
  CHECK(e.find("checksum mismatch") != std::string::npos);
  CHECK(ckpt::verify(d).front().find("adam_v w[4194304:") != std::string::npos);
}
