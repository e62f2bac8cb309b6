// Mutation fuzzing of every reader a user's files reach: run configs (TOML), traces (olmoref, JSON Lines, Megatron
// golden values, step-loss text), compare rules, checkpoint manifests, loader states and mix files. Each reader gets
// the same deterministic stream of mutated inputs (bit flips, byte edits, insertions and deletions of ranges,
// truncation, and tokens that break parsers: brackets, quotes, huge and non-finite numbers). Every input must be
// either read or refused with an exception whose message names the file; a crash or a hang fails the test (meson's
// timeout bounds it); each refusal's message is checked for the file name.
#include <doctest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "ckpt/checkpoint.h"
#include "data/leakcheck.h"
#include "data/loader.h"
#include "data/mix.h"
#include "golden/compare.h"
#include "golden/trace.h"
#include "interop/megatron_data.h"
#include "train/config.h"

using namespace olmoref;
namespace fs = std::filesystem;

namespace {

const int kMutationsPerReader = 1500;

std::string source_root() {
  const char* s = std::getenv("OLMOREF_SOURCE_ROOT");
  REQUIRE(s != nullptr);
  return s;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string mutate(std::string s, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {"{", "}", "[", "]", "\"", ",", ":", "=", "\n", "-1", "1e999",
                                                  "nan", "inf", "null", "0x", "9223372036854775808", "\\", "#",
                                                  "\"step\":", "[[", "\xff\xfe", std::string(1, '\0')};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t n = s.size();
    const size_t at = n ? rng() % n : 0;
    switch (rng() % 7) {
      case 0: if (n) s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
      case 1: if (n) s[at] = static_cast<char>(rng() % 256); break;
      case 2: s.insert(at, 1, static_cast<char>(rng() % 256)); break;
      case 3: if (n) s.erase(at, 1 + rng() % std::min<size_t>(n - at, 16)); break;
      case 4: if (n) s.insert(at, s.substr(rng() % n, 1 + rng() % 32)); break;
      case 5: s.resize(n ? rng() % n : 0); break;
      default: s.insert(at, tokens[rng() % tokens.size()]); break;
    }
  }
  return s;
}

struct Outcome {
  int read = 0, refused = 0, unnamed = 0;
  double slowest_ms = 0;
  std::string first_unnamed;
};

// read(path) must return or throw std::exception naming `name_in_message`.
Outcome fuzz(const std::string& label, const std::string& seed, const std::string& path,
             const std::string& name_in_message, const std::function<void(const std::string&)>& read) {
  std::mt19937_64 rng(std::hash<std::string>{}(label));
  Outcome o;
  spit(path, seed);
  read(path);  // the seed itself is valid
  for (int i = 0; i < kMutationsPerReader; ++i) {
    spit(path, mutate(seed, rng));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      read(path);
      ++o.read;
    } catch (const std::exception& e) {
      ++o.refused;
      if (std::string(e.what()).find(name_in_message) == std::string::npos) {
        if (o.unnamed++ == 0) o.first_unnamed = e.what();
      }
    }
    o.slowest_ms = std::max(o.slowest_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("fuzz %-16s %d inputs: %d read, %d refused (%d without the file name), 0 crashes, slowest %.1f ms\n",
              label.c_str(), kMutationsPerReader, o.read, o.refused, o.unnamed, o.slowest_ms);
  return o;
}

std::string work_dir() {
  const fs::path d = fs::temp_directory_path() / ("olmoref-fuzz-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d.string();
}

void expect_named(const Outcome& o) {
  CAPTURE(o.first_unnamed);
  CHECK(o.unnamed == 0);
  CHECK(o.slowest_ms < 2000);
}

}  // namespace

TEST_CASE("fuzz: run configs, traces of every format, compare rules") {
  const std::string w = work_dir(), src = source_root();
  expect_named(fuzz("config-toml", slurp(src + "/configs/tiny.toml"), w + "/fuzz.toml", "fuzz.toml",
                    [](const std::string& p) { parse_config_text(slurp(p), p); }));
  std::string trace;
  {
    std::ifstream in(src + "/golden/traces/tiny-fp32.jsonl");
    std::string line;
    for (int i = 0; i < 4 && std::getline(in, line); ++i) trace += line + "\n";
  }
  expect_named(fuzz("trace-olmoref", trace, w + "/trace.jsonl", "trace.jsonl", [](const std::string& p) {
    read_trace(p);
    load_trace_any(p);
  }));
  expect_named(fuzz("trace-jsonl", "{\"step\": 1, \"loss\": 10.5}\n{\"step\": 2, \"loss\": 10.25, \"lr\": 0.001}\n",
                    w + "/other.jsonl", "other.jsonl", [](const std::string& p) { load_trace_any(p); }));
  expect_named(fuzz("trace-megatron",
                    "{\"lm loss\": {\"start_step\": 1, \"end_step\": 3, \"step_interval\": 1, \"values\": "
                    "{\"1\": 10.5, \"2\": 10.25, \"3\": 10.0}}, \"iteration-time\": {\"values\": [1.5, 1.4]}}\n",
                    w + "/golden_values.json", "golden_values.json", [](const std::string& p) { load_trace_any(p); }));
  expect_named(fuzz("trace-steploss", "step loss\n1 10.5\n2 10.25\n3 1e-3\n", w + "/loss.txt", "loss.txt",
                    [](const std::string& p) { load_trace_any(p); }));
  expect_named(fuzz("compare-rules", "[loss]\ncheck = \"close\"\nrtol = 1e-5\n[grad_norm]\ncheck = \"exact\"\n",
                    w + "/rules.toml", "rules.toml", [](const std::string& p) { load_rules(p); }));
  fs::remove_all(w);
}

TEST_CASE("fuzz: checkpoint manifests, loader states, mix files, Megatron indices, accept files") {
  const std::string w = work_dir();
  // A real checkpoint of a 70-element state, whose manifest is then mutated.
  std::vector<float> p(70), m(70), v(70);
  for (size_t i = 0; i < p.size(); ++i) p[i] = 0.01f * static_cast<float>(i), m[i] = -p[i], v[i] = p[i] * p[i];
  ckpt::CheckpointMeta meta;
  meta.step = 3;
  meta.tokens = 300;
  meta.loader_state = {{"format", "olmoref-loader/1"}};
  meta.data_layout = nlohmann::json::object();
  meta.precision = "fp32", meta.executor = "cpu";
  const std::string dir = ckpt::save(w + "/ckpt", meta, {70, p.data(), m.data(), v.data()}, {{"w", 0, 70}}, {});
  const std::string manifest = slurp(dir + "/manifest.json");
  expect_named(fuzz("ckpt-manifest", manifest, dir + "/manifest.json", "manifest.json", [&](const std::string&) {
    const auto problems = ckpt::verify(dir);
    if (!problems.empty()) throw std::runtime_error(problems.front());
    ckpt::inspect(dir, true);
  }));
  nlohmann::json state_json;
  data::to_json(state_json, data::LoaderState{});  // the writer's own form, as a manifest holds it
  const std::string state = state_json.dump(1);
  const Outcome loader = fuzz("loader-state", state, w + "/loader.json", "loader.json", [](const std::string& path) {
    try {
      nlohmann::json::parse(slurp(path)).get<data::LoaderState>();
    } catch (const std::exception& e) {  // the loader state is read from a manifest; the caller names the file
      throw std::runtime_error(path + ": " + e.what());
    }
  });
  CHECK(loader.slowest_ms < 2000);
  spit(w + "/a.u16", std::string(64, '\x01'));
  spit(w + "/b.u16", std::string(64, '\x02'));
  // Every mix read is also compared against a fixed one, as `olmoref train` compares holdout and training mixes.
  const data::Mix fixed = data::Mix::from_paths({w + "/b.u16", w + "/a.u16"});
  expect_named(fuzz("mix-file", "# a mix\nweb,a.u16\ncode,b.u16\n" + w + "/a.u16\n", w + "/train.mix", "train.mix",
                    [&](const std::string& path) { data::shared_files(data::Mix::parse_file(path), fixed); }));
  {
    // A Megatron index (.idx, 2 sequences of uint16) and a .npy of int64, as megatron-core writes them.
    std::string idx("MMIDIDX\0\0", 9);
    auto put = [&](uint64_t v, int bytes) {
      for (int i = 0; i < bytes; ++i) idx.push_back(static_cast<char>(v >> (8 * i)));
    };
    put(1, 8), put(8, 1), put(2, 8), put(3, 8), put(3, 4), put(2, 4), put(0, 8), put(6, 8), put(0, 8), put(1, 8), put(2, 8);
    spit(w + "/m.bin", std::string(10, '\x01'));
    expect_named(fuzz("megatron-idx", idx, w + "/m.idx", "m.", [&](const std::string&) {
      const interop::MegatronIndexedDataset d(w + "/m");
      std::vector<uint32_t> t(2);
      d.read(1, 0, t);
    }));
    std::string npy("\x93NUMPY\x01\x00", 8);
    std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }";
    header.resize(118 - 1, ' ');
    header += '\n';
    npy.push_back(static_cast<char>(header.size())), npy.push_back(0);
    npy += header + std::string(48, '\x02');
    expect_named(fuzz("npy-integers", npy, w + "/idx.npy", "idx.npy",
                      [](const std::string& path) { interop::read_npy_integers(path); }));
  }
  expect_named(fuzz("leak-accept", "# known overlaps\n/data/holdout/part-0.npy 1049\nholdout b.u16\t77\n", w + "/accept.txt",
                    "accept.txt", [](const std::string& path) { data::read_leak_accept_file(path); }));
  fs::remove_all(w);
}
