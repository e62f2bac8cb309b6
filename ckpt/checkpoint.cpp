#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "data/loader.h"
#include "golden/digest.h"

namespace fs = std::filesystem;

namespace olmoref::ckpt {

// The manifest's own checksum: XXH3-64 of its compact JSON without the "manifest_xxh3" key (nlohmann keeps object
// keys sorted and writes numbers in shortest round-trip form, so parse -> dump reproduces the written text).
std::string manifest_checksum(nlohmann::json m) {
  m.erase("manifest_xxh3");
  const std::string text = m.dump();
  return hex64(XXH3_64bits(text.data(), text.size()));
}

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

std::string hex(uint64_t x) { return hex64(x); }

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail(path, "cannot open for fsync");
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail(path, "fsync failed");
  }
  ::close(fd);
}

// Writes bytes to path via path.tmp + fsync + rename.
void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail(tmp, "cannot create (is the checkpoint directory writable?)");
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0 &&
                    ::fsync(::fileno(f)) == 0;
    std::fclose(f);
    if (!ok) fail(tmp, "write failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "rename from .tmp failed");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "missing or unreadable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char* kVectorNames[3] = {"params", "adam_m", "adam_v"};

float* vector_ptr(const StateVectors& s, const std::string& name) {
  if (name == "params") return s.params;
  if (name == "adam_m") return s.adam_m;
  if (name == "adam_v") return s.adam_v;
  return nullptr;
}

void put_u64(std::string& out, uint64_t x) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
}
uint64_t get_u64(const std::string& in, size_t pos) {
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= static_cast<uint64_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  return x;
}

struct ParsedShard {
  nlohmann::json header;
  std::string bytes;
  size_t data_begin = 0;
};

// Reads a shard and checks its framing (magic, sizes, header checksum), not yet the tensors.
ParsedShard read_shard(const std::string& path, uint64_t expected_bytes, const std::string& expected_header_xxh3) {
  ParsedShard s;
  if (!fs::exists(path)) fail(path, "shard file is missing (the checkpoint is incomplete or was damaged)");
  s.bytes = read_file(path);
  if (expected_bytes && s.bytes.size() != expected_bytes)
    fail(path, "shard is " + std::to_string(s.bytes.size()) + " bytes, manifest says " + std::to_string(expected_bytes) +
                   " (truncated or overwritten)");
  if (s.bytes.size() < 32 || std::memcmp(s.bytes.data(), kShardMagic, 16) != 0)
    fail(path, "not an olmoref shard (bad magic)");
  const uint64_t header_len = get_u64(s.bytes, 16);
  if (24 + header_len + 8 > s.bytes.size()) fail(path, "header length runs past the end of the file (truncated?)");
  const std::string header_text = s.bytes.substr(24, header_len);
  const uint64_t header_sum = get_u64(s.bytes, 24 + header_len);
  if (XXH3_64bits(header_text.data(), header_text.size()) != header_sum) fail(path, "header checksum mismatch");
  if (!expected_header_xxh3.empty() && hex(header_sum) != expected_header_xxh3)
    fail(path, "header differs from the one the manifest recorded (shard from another checkpoint?)");
  s.header = nlohmann::json::parse(header_text);
  s.data_begin = 24 + header_len + 8;
  return s;
}

// Decompresses and verifies one entry into dst (entry.numel floats).
void read_entry(const std::string& path, const ParsedShard& s, const nlohmann::json& e, float* dst) {
  const std::string what = e.at("vector").get<std::string>() + " " + e.at("name").get<std::string>();
  const uint64_t off = e.at("data_offset").get<uint64_t>(), len = e.at("zstd_bytes").get<uint64_t>();
  const int64_t numel = e.at("numel").get<int64_t>();
  if (s.data_begin + off + len > s.bytes.size()) fail(path, what + ": data runs past the end of the file (truncated)");
  const char* src = s.bytes.data() + s.data_begin + off;
  if (hex(XXH3_64bits(src, len)) != e.at("zstd_xxh3").get<std::string>())
    fail(path, what + ": compressed data checksum mismatch (corrupted)");
  const size_t want = static_cast<size_t>(numel) * sizeof(float);
  const size_t got = ZSTD_decompress(dst, want, src, len);
  if (ZSTD_isError(got) || got != want) fail(path, what + ": zstd decompression failed or wrong size (corrupted)");
  if (hex(XXH3_64bits(dst, want)) != e.at("raw_xxh3").get<std::string>())
    fail(path, what + ": tensor checksum mismatch after decompression (corrupted)");
}

// Every key a resume, verify or inspect reads, with the JSON type it must have: checked once, so a missing or
// mistyped key is reported with the file and the key, never as a JSON library message.
void check_manifest_keys(const std::string& path, const nlohmann::json& m) {
  using T = nlohmann::json::value_t;
  auto type_name = [](T t) -> std::string {
    switch (t) {
      case T::string: return "a string";
      case T::object: return "an object";
      case T::array: return "an array";
      default: return "an integer";
    }
  };
  auto need = [&](const nlohmann::json& j, const std::string& where, const std::string& key, T t) {
    if (!j.contains(key)) fail(path, "key '" + where + key + "' is missing (expected " + type_name(t) + ")");
    const nlohmann::json& v = j.at(key);
    const bool ok = t == T::number_integer ? v.is_number_integer() : v.type() == t;
    if (!ok) fail(path, "key '" + where + key + "' must be " + type_name(t) + ", is " + v.type_name());
  };
  for (const char* k : {"step", "tokens", "total_params", "raw_bytes"}) need(m, "", k, T::number_integer);
  for (const char* k : {"dataset_fingerprint", "config_toml", "resume_hash", "model_hash", "precision", "executor"})
    need(m, "", k, T::string);
  for (const char* k : {"loader_state", "data_layout", "state_digests"}) need(m, "", k, T::object);
  need(m, "", "shards", T::array);
  for (const char* k : {"params", "adam_m", "adam_v"}) need(m.at("state_digests"), "state_digests.", k, T::string);
  for (size_t i = 0; i < m.at("shards").size(); ++i) {
    const nlohmann::json& sh = m.at("shards")[i];
    const std::string where = "shards[" + std::to_string(i) + "].";
    if (!sh.is_object()) fail(path, "key 'shards[" + std::to_string(i) + "]' must be an object");
    need(sh, where, "file", T::string);
    need(sh, where, "header_xxh3", T::string);
    need(sh, where, "rank", T::number_integer);
    need(sh, where, "bytes", T::number_integer);
  }
  if (m.at("step").get<int64_t>() < 0 || m.at("tokens").get<int64_t>() < 0 || m.at("total_params").get<int64_t>() < 0)
    fail(path, "'step', 'tokens' and 'total_params' must be >= 0");
}

nlohmann::json read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!fs::exists(path)) fail(path, "missing: " + dir + " is not a complete checkpoint");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!m.is_object() || !m.contains("format") || !m.at("format").is_string() || m.at("format") != kFormat)
    fail(path, "not an olmoref checkpoint manifest");
  const int version = m.contains("format_version") && m.at("format_version").is_number_integer()
                          ? m.at("format_version").get<int>() : -1;
  if (version != kFormatVersion)
    fail(path, "checkpoint format version " + std::to_string(version) + ", this build reads version " +
                   std::to_string(kFormatVersion) + " (use the olmoref release that wrote it, or convert)" +
                   (version == 1 ? "; version 1 manifests carry no checksum of their own" : ""));
  // Every byte a resume reads is covered: the shards by their checksums, the manifest by this one.
  if (!m.contains("manifest_xxh3") || !m.at("manifest_xxh3").is_string())
    fail(path, "key 'manifest_xxh3' (the manifest's checksum) is missing");
  if (m.at("manifest_xxh3").get<std::string>() != manifest_checksum(m))
    fail(path, "manifest checksum mismatch: the file was changed after it was written (step, loader state, "
               "config or digests may differ from what was saved); restore it or resume from another checkpoint");
  check_manifest_keys(path, m);
  return m;
}

int64_t step_of(const std::string& name) {
  if (name.size() != 12 || name.rfind("step", 0) != 0) return -1;
  for (size_t i = 4; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(4));
}

}  // namespace

std::pair<int64_t, int64_t> DataSegment::after(int64_t n) const {
  if (n <= 0) return {epoch, batches_processed};
  const int64_t drawn = batches_processed + n;  // counted from the start of `epoch`
  return {epoch + (drawn - 1) / batches_per_epoch, (drawn - 1) % batches_per_epoch + 1};
}

std::pair<int64_t, int64_t> DataSegment::batch_of(int64_t j) const {
  const auto [e, b] = after(j);
  if (b >= batches_per_epoch) return {e + 1, 0};
  return {e, b};
}

int64_t DataHistory::steps() const {
  int64_t n = 0;
  for (const DataSegment& s : segments) n += s.steps;
  return n;
}

nlohmann::json DataHistory::to_json() const {
  nlohmann::json seg = nlohmann::json::array();
  for (const DataSegment& s : segments)
    seg.push_back({{"steps", s.steps},
                   {"global_batch_instances", s.global_batch_instances},
                   {"sequence_length", s.sequence_length},
                   {"batches_per_epoch", s.batches_per_epoch},
                   {"epoch", s.epoch},
                   {"batches_processed", s.batches_processed}});
  return {{"seed", seed}, {"seed_from", seed_from}, {"segments", seg}};
}

DataHistory DataHistory::from_json(const nlohmann::json& j) {
  auto bad = [](const std::string& key, const std::string& what) {
    throw std::runtime_error("key 'data_history" + key + "' must be " + what);
  };
  if (!j.is_object()) bad("", "an object");
  DataHistory h;
  if (!j.contains("seed") || !j.at("seed").is_number_integer() || j.at("seed").get<int64_t>() < 0)
    bad(".seed", "an integer >= 0");
  h.seed = j.at("seed").get<uint64_t>();
  if (!j.contains("seed_from") || !j.at("seed_from").is_string() ||
      (j.at("seed_from") != "data.seed" && j.at("seed_from") != "data.olmo_core_state"))
    bad(".seed_from", "\"data.seed\" or \"data.olmo_core_state\"");
  h.seed_from = j.at("seed_from").get<std::string>();
  if (!j.contains("segments") || !j.at("segments").is_array()) bad(".segments", "an array");
  const nlohmann::json& segs = j.at("segments");
  for (size_t i = 0; i < segs.size(); ++i) {
    const std::string where = ".segments[" + std::to_string(i) + "]";
    if (!segs[i].is_object()) bad(where, "an object");
    auto get = [&](const char* key, int64_t least) {
      const nlohmann::json& v = segs[i].contains(key) ? segs[i].at(key) : nlohmann::json();
      if (!v.is_number_integer() || v.get<int64_t>() < least)
        bad(where + "." + key, "an integer >= " + std::to_string(least));
      return v.get<int64_t>();
    };
    DataSegment s;
    s.steps = get("steps", 0);
    s.global_batch_instances = get("global_batch_instances", 1);
    s.sequence_length = get("sequence_length", 1);
    s.batches_per_epoch = get("batches_per_epoch", 1);
    s.epoch = get("epoch", 1);
    s.batches_processed = get("batches_processed", 0);
    if (s.batches_processed > s.batches_per_epoch)
      bad(where + ".batches_processed", "<= batches_per_epoch (" + std::to_string(s.batches_per_epoch) + ")");
    h.segments.push_back(s);
  }
  return h;
}

namespace {

std::string batches(int64_t n) { return std::to_string(n) + (n == 1 ? " batch" : " batches"); }

std::string position(std::pair<int64_t, int64_t> p) {
  if (p.second == 0) return "the start of epoch " + std::to_string(p.first);
  return "epoch " + std::to_string(p.first) + " after " + batches(p.second);
}

constexpr const char* kContradiction =
    " (the manifest contradicts itself: it was changed after it was written, its manifest_xxh3 recomputed; restore "
    "the checkpoint as written, or resume from another one)";

// The shard list, and the loader state against data_history and the recorded config.
std::vector<std::string> manifest_history_problems(const std::string& path, const nlohmann::json& m) {
  std::vector<std::string> out;
  const std::string fix = kContradiction;
  auto say = [&](const std::string& what) { out.push_back(path + ": " + what + fix); };
  auto str = [](int64_t x) { return std::to_string(x); };
  const int64_t step = m.at("step").get<int64_t>(), tokens = m.at("tokens").get<int64_t>();

  // The shard list: each shard file is named after the rank recorded for it, once.
  std::map<int64_t, int> ranks;
  for (size_t i = 0; i < m.at("shards").size(); ++i) {
    const nlohmann::json& sh = m.at("shards")[i];
    const int64_t r = sh.at("rank").get<int64_t>();
    char want[32];
    std::snprintf(want, sizeof want, "shard-%05lld.bin", static_cast<long long>(r));
    if (sh.at("file").get<std::string>() != want)
      say("key 'shards[" + str(static_cast<int64_t>(i)) + "].file' is '" + sh.at("file").get<std::string>() +
          "' but its rank " + str(r) + " writes '" + want + "'");
    if (++ranks[r] == 2) say("key 'shards[" + str(static_cast<int64_t>(i)) + "].rank' is " + str(r) + ", a rank listed twice");
  }

  // Only the data loader's own state can be checked (other batch sources record what they like).
  const nlohmann::json& ls = m.at("loader_state");
  const bool loader = ls.is_object() && ls.contains("format") && ls.at("format") == "olmoref-loader-state-v1";
  const bool has_history = m.contains("data_history") && !m.at("data_history").is_null();
  if (!loader) {
    if (has_history) say("key 'data_history' is present but 'loader_state' is not the data loader's state");
    return out;
  }
  auto int_key = [&](const nlohmann::json& j, const std::string& prefix, const char* key) -> std::optional<int64_t> {
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_number_integer()) {
      out.push_back(path + ": key '" + prefix + key + "' is missing or not an integer");
      return std::nullopt;
    }
    return j.at(key).get<int64_t>();
  };
  const auto epoch = int_key(ls, "loader_state.", "epoch"), bp = int_key(ls, "loader_state.", "batches_processed");
  const auto G = int_key(ls, "loader_state.", "global_batch_instances"), L = int_key(ls, "loader_state.", "sequence_length");
  if (!ls.contains("seed") || !ls.at("seed").is_number_integer() || ls.at("seed").get<int64_t>() < 0) {
    out.push_back(path + ": key 'loader_state.seed' is missing or not an integer >= 0");
    return out;
  }
  const uint64_t seed = ls.at("seed").get<uint64_t>();
  if (!epoch || !bp || !G || !L) return out;
  if (!ls.contains("fingerprint") || ls.at("fingerprint") != m.at("dataset_fingerprint"))
    say("key 'loader_state.fingerprint' is " + (ls.contains("fingerprint") ? ls.at("fingerprint").dump() : "missing") +
        " but 'dataset_fingerprint' is " + m.at("dataset_fingerprint").dump());
  const nlohmann::json& dl = m.at("data_layout");
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"global_batch_instances", *G}, {"seq_len", *L}})
    if (dl.contains(key) && dl.at(key).is_number_integer() && dl.at(key).get<int64_t>() != v)
      say("key 'data_layout." + std::string(key) + "' is " + str(dl.at(key).get<int64_t>()) + " but the loader state's is " +
          str(v) + " ('loader_state." + (std::string(key) == "seq_len" ? "sequence_length" : key) + "')");

  // The configuration the writing run had: its batch shape is the loader's, and (unless the data order came from an
  // OLMo-core run) its data.seed is the order's seed.
  std::optional<int64_t> config_seed;
  try {
    const toml::table cfg = toml::parse(m.at("config_toml").get<std::string>());
    config_seed = cfg["data"]["seed"].value<int64_t>();
    for (const auto& [key, v] : {std::pair<const char*, int64_t>{"global_batch_instances", *G}, {"seq_len", *L}})
      if (const auto c = cfg["train"][key].value<int64_t>(); c && *c != v)
        say("key 'config_toml' sets train." + std::string(key) + " = " + str(*c) + " but the loader state's is " + str(v));
  } catch (const toml::parse_error& e) {
    out.push_back(path + ": key 'config_toml' is not valid TOML (" + std::string(e.description()) + ")");
  }

  if (!has_history) {
    // Written before data_history was recorded: only the checks above apply (whether the config's seed was the
    // order's is not known). A resume still compares the step, tokens and batch with the run's trace.
    return out;
  }
  DataHistory h;
  try {
    h = DataHistory::from_json(m.at("data_history"));
  } catch (const std::exception& e) {
    out.push_back(path + ": " + e.what());
    return out;
  }
  if (h.seed != seed)
    say("key 'loader_state.seed' is " + std::to_string(seed) + " but 'data_history.seed' (the data order's seed since "
        "step 1) is " + std::to_string(h.seed));
  if (h.seed_from == "data.seed" && config_seed && static_cast<uint64_t>(*config_seed) != seed)
    say("key 'loader_state.seed' is " + std::to_string(seed) + " but the config it records ('config_toml') has "
        "data.seed = " + str(*config_seed) + ", where the data order's seed came from");
  if (h.segments.empty()) {
    say("key 'data_history.segments' is empty but 'step' is " + str(step));
    return out;
  }
  if (h.steps() != step)
    say("key 'step' is " + str(step) + " but the steps of 'data_history.segments' add up to " + str(h.steps()));
  int64_t consumed = 0;
  std::string how;
  for (const DataSegment& s : h.segments) {
    consumed += s.steps * s.global_batch_instances * s.sequence_length;
    how += (how.empty() ? "" : " + ") + str(s.steps) + " x " + str(s.global_batch_instances) + " x " + str(s.sequence_length);
  }
  if (consumed != tokens)
    say("key 'tokens' is " + str(tokens) + " but the batches 'data_history' records hold " + how + " = " +
        str(consumed) + " tokens (steps x instances x tokens)");
  for (size_t i = 1; i < h.segments.size(); ++i) {
    const DataSegment &a = h.segments[i - 1], &b = h.segments[i];
    // A new segment continues where the last stopped; a changed global batch continues at tokens seen // the new
    // batch, as the loader's own rebatched_state does.
    data::LoaderState end;
    std::tie(end.epoch, end.batches_processed) = a.end();
    end.global_batch_instances = a.global_batch_instances;
    end.sequence_length = a.sequence_length;
    const data::LoaderState want = a.global_batch_instances == b.global_batch_instances
                                       ? end : data::rebatched_state(end, b.global_batch_instances);
    if (want.epoch != b.epoch || want.batches_processed != b.batches_processed)
      say("key 'data_history.segments[" + str(static_cast<int64_t>(i)) + "]' starts at " +
          position({b.epoch, b.batches_processed}) + " but segment " + str(static_cast<int64_t>(i - 1)) + " ends at " +
          position(a.end()) + (a.global_batch_instances == b.global_batch_instances ? ""
                               : ", which in batches of " + str(b.global_batch_instances) + " is " +
                                 position({want.epoch, want.batches_processed})));
  }
  const DataSegment& last = h.segments.back();
  const auto [end_epoch, end_bp] = last.end();
  const std::string from = " (its last segment: " + str(last.steps) + " step(s) of " + str(last.global_batch_instances) +
                           " instances from " + position({last.epoch, last.batches_processed}) + ", " +
                           str(last.batches_per_epoch) + " batches per epoch)";
  if (*epoch != end_epoch)
    say("key 'loader_state.epoch' is " + str(*epoch) + " but 'data_history' ends in epoch " + str(end_epoch) + from);
  if (*bp != end_bp)
    say("key 'loader_state.batches_processed' is " + str(*bp) + " but 'data_history' ends after " + batches(end_bp) +
        " of epoch " + str(end_epoch) + from);
  if (*G != last.global_batch_instances)
    say("key 'loader_state.global_batch_instances' is " + str(*G) + " but the last segment of 'data_history' has " +
        str(last.global_batch_instances));
  if (*L != last.sequence_length)
    say("key 'loader_state.sequence_length' is " + str(*L) + " but the last segment of 'data_history' has " +
        str(last.sequence_length));
  return out;
}

// record_problems on a parsed manifest (`path` names it in every problem). The loader state is compared with
// data_history before its own fields with each other, so the key a change was made to is the one named first.
std::vector<std::string> manifest_record_problems(const std::string& path, const nlohmann::json& m) {
  std::vector<std::string> out = manifest_history_problems(path, m);
  const nlohmann::json& ls = m.at("loader_state");
  if (ls.is_object() && ls.value("format", "") == "olmoref-loader-state-v1" && ls.contains("tokens_processed")) {
    const nlohmann::json &tp = ls.at("tokens_processed"), &bp = ls.value("batches_processed", nlohmann::json()),
                         &G = ls.value("global_batch_instances", nlohmann::json()), &L = ls.value("sequence_length", nlohmann::json());
    if (tp.is_number_integer() && bp.is_number_integer() && G.is_number_integer() && L.is_number_integer() &&
        tp.get<int64_t>() != bp.get<int64_t>() * G.get<int64_t>() * L.get<int64_t>())
      out.push_back(path + ": key 'loader_state.tokens_processed' is " + tp.dump() + " but loader_state."
                    "batches_processed x global_batch_instances x sequence_length is " + bp.dump() + " x " + G.dump() +
                    " x " + L.dump() + " = " + std::to_string(bp.get<int64_t>() * G.get<int64_t>() * L.get<int64_t>()) +
                    kContradiction);
  }
  return out;
}

}  // namespace

std::vector<std::string> record_problems(const std::string& dir) {
  return manifest_record_problems(dir + "/manifest.json", read_manifest(dir));
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step%08lld", static_cast<long long>(step));
  return buf;
}

int64_t manifest_step(const std::string& dir) { return read_manifest(dir).at("step").get<int64_t>(); }

std::vector<std::string> list_complete(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (!fs::is_directory(root)) return {};
  for (const auto& entry : fs::directory_iterator(root)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && entry.is_directory() && fs::exists(entry.path() / "manifest.json"))
      found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::optional<std::string> newest_complete(const std::string& root) {
  auto all = list_complete(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string begin_save(const std::string& root, int64_t step, bool create) {
  const std::string tmp_dir = root + "/.tmp-" + step_dir_name(step);
  if (create) {
    fs::create_directories(root);
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
  }
  return tmp_dir;
}

void write_shard(const std::string& tmp_dir, int shard_index, const StateVectors& local, int64_t lo, int64_t hi,
                 const std::vector<Segment>& segments, const SaveOptions& opts, int64_t step_for_fault_injection) {
  struct Job {
    const char* vec;
    std::string name;
    int64_t a, b;
    const float* src;
    std::vector<char> out;
    size_t z = 0;
  };
  std::vector<Job> jobs;
  for (const char* vec : kVectorNames) {
    const float* base = vector_ptr(local, vec);
    for (const Segment& seg : segments) {
      // The part of this segment inside [lo, hi): a shard boundary may cut a tensor.
      const int64_t a = std::max(lo, seg.offset), b = std::min(hi, seg.offset + seg.numel);
      if (a >= b) continue;
      std::string name = seg.name;
      if (a != seg.offset || b != seg.offset + seg.numel) {
        char part[64];  // a tensor cut by a shard boundary: name[begin:end] within the tensor
        std::snprintf(part, sizeof part, "[%lld:%lld]", static_cast<long long>(a - seg.offset),
                      static_cast<long long>(b - seg.offset));
        name.append(part);
      }
      jobs.push_back({vec, std::move(name), a, b, base + (a - lo), {}, 0});
    }
  }
  // Large tensors use zstd's own workers inside one frame; small ones are compressed side by side,
  // one frame each, by `zstd_threads` threads. The bytes do not depend on the thread count.
  constexpr size_t kBig = size_t{8} << 20;
  auto compress = [&](Job& j, ZSTD_CCtx* cctx) {
    const size_t n = static_cast<size_t>(j.b - j.a) * sizeof(float);
    j.out.resize(ZSTD_compressBound(n));
    j.z = ZSTD_compress2(cctx, j.out.data(), j.out.size(), j.src, n);
  };
  auto make_cctx = [&](int workers) {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, opts.zstd_level);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
    if (workers > 1) ZSTD_CCtx_setParameter(c, ZSTD_c_nbWorkers, workers);
    return c;
  };
  {
    ZSTD_CCtx* big = make_cctx(opts.zstd_threads);
    for (Job& j : jobs)
      if (static_cast<size_t>(j.b - j.a) * sizeof(float) >= kBig) compress(j, big);
    ZSTD_freeCCtx(big);
    std::atomic<size_t> next{0};
    auto worker = [&] {
      ZSTD_CCtx* c = make_cctx(1);
      for (size_t i; (i = next++) < jobs.size();)
        if (static_cast<size_t>(jobs[i].b - jobs[i].a) * sizeof(float) < kBig) compress(jobs[i], c);
      ZSTD_freeCCtx(c);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::max(1, opts.zstd_threads); ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
  }
  nlohmann::json entries = nlohmann::json::array();
  uint64_t data_size = 0;
  for (const Job& j : jobs) {
    if (ZSTD_isError(j.z)) fail(tmp_dir, std::string("zstd compression failed: ") + ZSTD_getErrorName(j.z));
    entries.push_back({{"vector", j.vec},
                       {"name", j.name},
                       {"offset", j.a},
                       {"numel", j.b - j.a},
                       {"raw_xxh3", hex(XXH3_64bits(j.src, static_cast<size_t>(j.b - j.a) * sizeof(float)))},
                       {"zstd_bytes", j.z},
                       {"zstd_xxh3", hex(XXH3_64bits(j.out.data(), j.z))},
                       {"data_offset", data_size}});
    data_size += j.z;
  }
  const std::string header = nlohmann::json{{"rank", shard_index}, {"range", {lo, hi}}, {"entries", entries}}.dump();
  std::string head(kShardMagic, 16);
  put_u64(head, header.size());
  head += header;
  put_u64(head, XXH3_64bits(header.data(), header.size()));
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05d.bin", shard_index);
  const std::string path = tmp_dir + "/" + name, tmp = path + ".tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail(tmp, "cannot create (is the checkpoint directory writable?)");
    bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
    for (const Job& j : jobs) ok = ok && std::fwrite(j.out.data(), 1, j.z, f) == j.z;
    ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    std::fclose(f);
    if (!ok) fail(tmp, "write failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "rename from .tmp failed");
  // Fault injection for the kill tests: die between the shard and the manifest, the worst moment.
  // OLMOREF_TEST_CRASH_SHARD limits it to one shard's writer (a rank dying mid-checkpoint).
  if (const char* crash = std::getenv("OLMOREF_TEST_CRASH_IN_SAVE"); crash && std::stoll(crash) == step_for_fault_injection) {
    const char* only = std::getenv("OLMOREF_TEST_CRASH_SHARD");
    if (!only || std::stoi(only) == shard_index) ::raise(SIGKILL);
  }
}

namespace {
// Deleting a directory file by file is not atomic: a kill half-way would leave a "stepN" with its
// manifest but not all its shards. So it is first renamed out of the stepN namespace (atomic), then
// removed; leftovers are .tmp-* directories, which nothing loads and the next save clears.
void discard(const std::string& root, const std::string& dir) {
  const std::string doomed = root + "/.tmp-delete-" + fs::path(dir).filename().string();
  fs::remove_all(doomed);
  fs::rename(dir, doomed);
  fsync_path(root, true);
  fs::remove_all(doomed);
}
}  // namespace

std::string finish_save(const std::string& root, const std::string& tmp_dir, const CheckpointMeta& meta,
                        int64_t total, const StateDigests& digests, const SaveOptions& opts) {
  // Shards are found on disk (each rank wrote its own); the manifest records their exact sizes and
  // header checksums so a truncated or swapped file is caught before it is parsed.
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(tmp_dir)) {
    const std::string f = entry.path().filename().string();
    if (f.rfind("shard-", 0) == 0 && f.size() > 4 && f.substr(f.size() - 4) == ".bin") files.push_back(f);
  }
  std::sort(files.begin(), files.end());
  nlohmann::json shards = nlohmann::json::array();
  int64_t raw_bytes = 0;
  for (const auto& f : files) {
    const ParsedShard ps = read_shard(tmp_dir + "/" + f, 0, "");
    const uint64_t header_len = get_u64(ps.bytes, 16);
    for (const auto& e : ps.header.at("entries")) raw_bytes += e.at("numel").get<int64_t>() * 4;
    shards.push_back({{"file", f},
                      {"rank", ps.header.at("rank")},
                      {"bytes", ps.bytes.size()},
                      {"header_xxh3", hex(get_u64(ps.bytes, 24 + header_len))}});
  }
  nlohmann::json m;
  m["format"] = kFormat;
  m["format_version"] = kFormatVersion;
  m["step"] = meta.step;
  m["tokens"] = meta.tokens;
  m["total_params"] = total;
  m["loader_state"] = meta.loader_state;
  m["dataset_fingerprint"] = meta.dataset_fingerprint;
  m["config_toml"] = meta.config_toml;
  m["resume_hash"] = meta.resume_hash;
  m["model_hash"] = meta.model_hash;
  m["data_layout"] = meta.data_layout;
  m["precision"] = meta.precision;
  m["executor"] = meta.executor;
  m["extra"] = meta.extra;
  if (!meta.optimizer_state.is_null()) m["optimizer_state"] = meta.optimizer_state;  // covered by manifest_xxh3
  if (!meta.data_history.is_null()) m["data_history"] = meta.data_history;
  m["libraries"] = {{"zstd", ZSTD_versionString()}, {"xxhash", std::to_string(XXH_versionNumber())}};
  m["compression"] = {{"codec", "zstd"}, {"level", opts.zstd_level}, {"threads", opts.zstd_threads}};
  m["raw_bytes"] = raw_bytes;
  m["shards"] = shards;
  m["state_digests"] = {{"params", digests.params}, {"adam_m", digests.adam_m}, {"adam_v", digests.adam_v}};
  m["manifest_xxh3"] = manifest_checksum(m);
  write_file_atomic(tmp_dir + "/manifest.json", m.dump(2) + "\n");
  fsync_path(tmp_dir, true);
  const std::string final_dir = root + "/" + step_dir_name(meta.step);
  if (fs::exists(final_dir)) discard(root, final_dir);  // a checkpoint of the same step (a rerun) is replaced whole
  fs::rename(tmp_dir, final_dir);
  fsync_path(root, true);

  // Retention: keep the newest keep_last complete checkpoints; clear crash leftovers.
  auto all = list_complete(root);
  const size_t keep = static_cast<size_t>(std::max(1, opts.keep_last));
  for (size_t i = 0; i + keep < all.size(); ++i)
    if (all[i] != final_dir) discard(root, all[i]);
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path());
  return final_dir;
}

std::string save(const std::string& root, const CheckpointMeta& meta, const StateVectors& state,
                 const std::vector<Segment>& segments, const SaveOptions& opts) {
  const std::string tmp = begin_save(root, meta.step, true);
  write_shard(tmp, 0, state, 0, state.total, segments, opts, meta.step);
  const StateDigests d{merkle_digest(state.params, state.total).hex(), merkle_digest(state.adam_m, state.total).hex(),
                       merkle_digest(state.adam_v, state.total).hex()};
  return finish_save(root, tmp, meta, state.total, d, opts);
}

namespace {

// Reads the part [lo, hi) of every flat vector into `local` (pointers to hi-lo floats each), verifying
// every entry it touches, and checks from the shard headers that each vector is covered exactly once.
void read_range(const std::string& dir, const nlohmann::json& m, const StateVectors& local, int64_t lo, int64_t hi,
                int64_t total) {
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> coverage;
  for (const auto& sh : m.at("shards")) {
    const std::string path = dir + "/" + sh.at("file").get<std::string>();
    const ParsedShard s = read_shard(path, sh.at("bytes").get<uint64_t>(), sh.at("header_xxh3").get<std::string>());
    if (!s.header.contains("rank") || s.header.at("rank") != sh.at("rank"))
      fail(path, "the shard's header says rank " + s.header.value("rank", nlohmann::json()).dump() + " but the manifest's "
                 "shards entry for it says " + sh.at("rank").dump() + " (a shard from another checkpoint or layout?)");
    std::vector<const nlohmann::json*> mine;
    for (const auto& e : s.header.at("entries")) {
      const std::string vec = e.at("vector").get<std::string>();
      if (vec != "params" && vec != "adam_m" && vec != "adam_v") fail(path, "unknown vector '" + vec + "'");
      const int64_t off = e.at("offset").get<int64_t>(), n = e.at("numel").get<int64_t>();
      if (off < 0 || n < 0 || off + n > total) fail(path, vec + " range out of bounds");
      coverage[vec].emplace_back(off, off + n);
      if (std::max(lo, off) < std::min(hi, off + n)) mine.push_back(&e);  // in this reader's range
    }
    // Entries are independent frames: decompress and verify them side by side.
    std::atomic<size_t> next{0};
    std::string first_error;
    std::mutex error_mutex;
    auto worker = [&] {
      std::vector<float> part;
      for (size_t i; (i = next++) < mine.size();) {
        const nlohmann::json& e = *mine[i];
        const int64_t off = e.at("offset").get<int64_t>(), n = e.at("numel").get<int64_t>();
        const int64_t a = std::max(lo, off), b = std::min(hi, off + n);
        float* base = vector_ptr(local, e.at("vector").get<std::string>());
        try {
          if (a == off && b == off + n) {
            read_entry(path, s, e, base + (off - lo));
          } else {
            part.resize(static_cast<size_t>(n));
            read_entry(path, s, e, part.data());
            std::copy(part.begin() + (a - off), part.begin() + (b - off), base + (a - lo));
          }
        } catch (const std::exception& ex) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (first_error.empty()) first_error = ex.what();
        }
      }
    };
    const unsigned n_threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < n_threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (!first_error.empty()) throw std::runtime_error(first_error);
  }
  for (const char* vec : kVectorNames) {
    auto& r = coverage[vec];
    std::sort(r.begin(), r.end());
    int64_t at = 0;
    for (auto& [a, b] : r) {
      if (a != at) fail(dir, std::string(vec) + ": shards leave a gap or overlap at element " + std::to_string(at) + " (missing shard?)");
      at = b;
    }
    if (at != total) fail(dir, std::string(vec) + ": shards cover " + std::to_string(at) + " of " + std::to_string(total) + " elements (missing shard?)");
  }
}

void read_all(const std::string& dir, const nlohmann::json& m, const StateVectors& state) {
  read_range(dir, m, state, 0, state.total, state.total);
  const auto& d = m.at("state_digests");
  if (merkle_digest(state.params, state.total).hex() != d.at("params").get<std::string>() ||
      merkle_digest(state.adam_m, state.total).hex() != d.at("adam_m").get<std::string>() ||
      merkle_digest(state.adam_v, state.total).hex() != d.at("adam_v").get<std::string>())
    fail(dir, "loaded state does not match the manifest's whole-state digests");
}

CheckpointMeta check_meta(const std::string& dir, const nlohmann::json& m, int64_t total, const CheckpointMeta& expect,
                          const LoadOptions& opts) {
  const std::string mpath = dir + "/manifest.json";
  CheckpointMeta meta;
  meta.step = m.at("step").get<int64_t>();
  meta.tokens = m.at("tokens").get<int64_t>();
  meta.loader_state = m.at("loader_state");
  meta.dataset_fingerprint = m.at("dataset_fingerprint").get<std::string>();
  meta.config_toml = m.at("config_toml").get<std::string>();
  meta.resume_hash = m.at("resume_hash").get<std::string>();
  meta.model_hash = m.at("model_hash").get<std::string>();
  meta.data_layout = m.at("data_layout");
  meta.precision = m.at("precision").get<std::string>();
  meta.executor = m.at("executor").get<std::string>();
  meta.extra = m.value("extra", nlohmann::json::object());
  meta.optimizer_state = m.value("optimizer_state", nlohmann::json());
  meta.data_history = m.value("data_history", nlohmann::json());
  if (const std::vector<std::string> problems = manifest_record_problems(mpath, m); !problems.empty()) {
    std::string all = problems.front();
    for (size_t i = 1; i < problems.size(); ++i) all += "\n" + problems[i];
    throw std::runtime_error(all);
  }
  if (!expect.model_hash.empty() && expect.model_hash != meta.model_hash)
    fail(mpath, "the checkpoint was written for a different model config ([model] differs); resume with the "
                "config it records (olmoref ckpt inspect " + dir + ")");
  if (m.at("total_params").get<int64_t>() != total)
    fail(mpath, "holds " + std::to_string(m.at("total_params").get<int64_t>()) + " parameters, this model has " +
                    std::to_string(total));
  if (!expect.resume_hash.empty() && expect.resume_hash != meta.resume_hash && !opts.allow_config_change)
    fail(mpath, "the run configuration differs from the checkpoint's (training, optimizer, schedule or data "
                "settings); resuming would not continue the same run. Use the recorded config, or pass "
                "--allow-config-change to resume anyway");
  if (!expect.dataset_fingerprint.empty() && expect.dataset_fingerprint != meta.dataset_fingerprint &&
      !opts.ignore_fingerprint_mismatch)
    fail(mpath, "dataset fingerprint differs (checkpoint " + meta.dataset_fingerprint + ", now " +
                    expect.dataset_fingerprint + "): the data files changed. Point the config at the original data, "
                    "or pass --ignore-fingerprint-mismatch to continue on the new data");
  const auto& d = m.at("state_digests");
  meta.digests = {d.at("params").get<std::string>(), d.at("adam_m").get<std::string>(), d.at("adam_v").get<std::string>()};
  return meta;
}

}  // namespace

CheckpointMeta load_range(const std::string& dir, const StateVectors& local, int64_t lo, int64_t hi, int64_t total,
                          const CheckpointMeta& expect, const LoadOptions& opts) {
  const nlohmann::json m = read_manifest(dir);
  CheckpointMeta meta = check_meta(dir, m, total, expect, opts);
  read_range(dir, m, local, lo, hi, total);
  return meta;
}

CheckpointMeta check_resumable(const std::string& dir, int64_t total, const CheckpointMeta& expect,
                               const LoadOptions& opts) {
  return check_meta(dir, read_manifest(dir), total, expect, opts);
}

CheckpointMeta load(const std::string& dir, const StateVectors& state, const CheckpointMeta& expect,
                    const LoadOptions& opts) {
  const nlohmann::json m = read_manifest(dir);
  CheckpointMeta meta = check_meta(dir, m, state.total, expect, opts);
  read_all(dir, m, state);
  return meta;
}

std::vector<std::string> verify(const std::string& dir) {
  std::vector<std::string> problems;
  try {
    const nlohmann::json m = read_manifest(dir);
    problems = manifest_record_problems(dir + "/manifest.json", m);
    const int64_t total = m.at("total_params").get<int64_t>();
    std::vector<float> p(static_cast<size_t>(total)), a(static_cast<size_t>(total)), b(static_cast<size_t>(total));
    read_all(dir, m, {total, p.data(), a.data(), b.data()});
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
  return problems;
}

std::string inspect(const std::string& dir, bool per_tensor) {
  const nlohmann::json m = read_manifest(dir);
  std::ostringstream out;
  const int64_t raw = m.value("raw_bytes", int64_t{0});
  int64_t stored = 0;
  for (const auto& sh : m.at("shards")) stored += sh.at("bytes").get<int64_t>();
  out << "checkpoint   " << dir << "\n";
  out << "format       " << m.at("format").get<std::string>() << " v" << m.at("format_version").get<int>() << "\n";
  out << "step         " << m.at("step").get<int64_t>() << "  (tokens " << m.at("tokens").get<int64_t>() << ")\n";
  out << "parameters   " << m.at("total_params").get<int64_t>() << "  (params + Adam m + v, fp32)\n";
  out << "precision    " << m.at("precision").get<std::string>() << ", executor " << m.at("executor").get<std::string>() << "\n";
  out << "data         fingerprint " << m.at("dataset_fingerprint").get<std::string>() << ", loader "
      << m.at("loader_state").dump() << "\n";
  out << "layout       " << m.at("data_layout").dump() << "\n";
  if (m.contains("data_history")) out << "history      " << m.at("data_history").dump() << "\n";
  if (m.contains("optimizer_state") && m.at("optimizer_state").is_object()) {
    const auto& o = m.at("optimizer_state");
    out << "optimizer    " << o.value("kind", std::string("?")) << ": " << o.value("losses_hex", nlohmann::json::array()).size()
        << " losses, " << o.value("grad_norms_hex", nlohmann::json::array()).size() << " grad norms in the windows\n";
  }
  char ratio[64];
  std::snprintf(ratio, sizeof ratio, "%.3f", raw ? static_cast<double>(stored) / raw : 0.0);
  out << "size         " << stored << " bytes stored, " << raw << " raw (ratio " << ratio << "), "
      << m.at("compression").dump() << "\n";
  out << "digests      params " << m.at("state_digests").at("params").get<std::string>() << "\n"
      << "             adam_m " << m.at("state_digests").at("adam_m").get<std::string>() << "\n"
      << "             adam_v " << m.at("state_digests").at("adam_v").get<std::string>() << "\n";
  for (const auto& sh : m.at("shards")) {
    out << "shard        " << sh.at("file").get<std::string>() << " rank " << sh.at("rank").get<int>() << ", "
        << sh.at("bytes").get<int64_t>() << " bytes\n";
    if (!per_tensor) continue;
    const std::string path = dir + "/" + sh.at("file").get<std::string>();
    const ParsedShard s = read_shard(path, 0, "");
    for (const auto& e : s.header.at("entries")) {
      char line[512];
      std::snprintf(line, sizeof line, "  %-7s %-45s offset %12lld numel %10lld zstd %10llu xxh3 %s\n",
                    e.at("vector").get<std::string>().c_str(), e.at("name").get<std::string>().c_str(),
                    static_cast<long long>(e.at("offset").get<int64_t>()),
                    static_cast<long long>(e.at("numel").get<int64_t>()),
                    static_cast<unsigned long long>(e.at("zstd_bytes").get<uint64_t>()),
                    e.at("raw_xxh3").get<std::string>().c_str());
      out << line;
    }
  }
  return out.str();
}

}  // namespace olmoref::ckpt
