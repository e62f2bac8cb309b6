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
#include <memory>
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

// One shard file, opened: its framing checked and its header read, nothing of its data yet. Reads go through pread,
// so a reader touches only the bytes of the entries it wants (format 3 and format 2 alike).
struct ShardFile {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
  uint64_t data_begin = 0, data_end = 0;  // the frames: entry data_offset counts from data_begin
  uint64_t header_sum = 0;
  nlohmann::json header;
  ShardFile() = default;
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ShardFile(ShardFile&& o) noexcept { *this = std::move(o); }
  ShardFile& operator=(ShardFile&& o) noexcept {
    std::swap(path, o.path), std::swap(fd, o.fd), size = o.size, data_begin = o.data_begin, data_end = o.data_end;
    header_sum = o.header_sum, header = std::move(o.header);
    return *this;
  }
  ~ShardFile() {
    if (fd >= 0) ::close(fd);
  }
  // Exactly n bytes at `at`, or fails naming the file.
  void read_at(void* dst, uint64_t n, uint64_t at, const std::string& what) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(at));
      if (got <= 0) fail(path, what + ": cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(at) +
                                   " (truncated or unreadable)");
      p += got, n -= static_cast<uint64_t>(got), at += static_cast<uint64_t>(got);
    }
  }
};

uint64_t get_u64(const char* in) {
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return x;
}

// Opens a shard and checks its framing (magic, size, header checksum) against the manifest's record of it
// (expected_bytes 0 and an empty checksum: no record to compare with); reads the header alone.
ShardFile open_shard(const std::string& path, uint64_t expected_bytes, const std::string& expected_header_xxh3) {
  ShardFile s;
  s.path = path;
  s.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd < 0) {
    if (!fs::exists(path)) fail(path, "shard file is missing (the checkpoint is incomplete or was damaged)");
    fail(path, "cannot open (permissions?)");
  }
  struct stat st {};
  if (::fstat(s.fd, &st) != 0) fail(path, "cannot stat");
  s.size = static_cast<uint64_t>(st.st_size);
  if (expected_bytes && s.size != expected_bytes)
    fail(path, "shard is " + std::to_string(s.size) + " bytes, manifest says " + std::to_string(expected_bytes) +
                   " (truncated or overwritten)");
  char magic[16];
  if (s.size < 32) fail(path, "not an olmoref shard (" + std::to_string(s.size) + " bytes; truncated?)");
  s.read_at(magic, 16, 0, "magic");
  uint64_t header_at = 0, header_len = 0;
  if (std::memcmp(magic, kShardMagicV1, 16) == 0) {  // format 2: magic, H, header, its checksum, the frames
    char len[8];
    s.read_at(len, 8, 16, "header length");
    header_len = get_u64(len);
    if (header_len > s.size || 24 + header_len + 8 > s.size)
      fail(path, "header length runs past the end of the file (truncated?)");
    header_at = 24;
    char sum[8];
    s.read_at(sum, 8, 24 + header_len, "header checksum");
    s.header_sum = get_u64(sum);
    s.data_begin = 24 + header_len + 8, s.data_end = s.size;
  } else if (std::memcmp(magic, kShardMagic, 16) == 0) {  // format 3: magic, the frames, header, H, checksum, magic
    char tail[32];
    s.read_at(tail, 32, s.size - 32, "trailer");
    if (std::memcmp(tail + 16, kShardMagic, 16) != 0)
      fail(path, "the trailer's magic is missing: the file was cut short or overwritten (truncated?)");
    header_len = get_u64(tail);
    s.header_sum = get_u64(tail + 8);
    if (header_len > s.size || 16 + header_len + 32 > s.size) fail(path, "header length runs past the file (truncated?)");
    header_at = s.size - 32 - header_len;
    s.data_begin = 16, s.data_end = header_at;
  } else {
    fail(path, "not an olmoref shard (bad magic)");
  }
  std::string header_text(header_len, '\0');
  s.read_at(header_text.data(), header_len, header_at, "header");
  if (XXH3_64bits(header_text.data(), header_text.size()) != s.header_sum) fail(path, "header checksum mismatch");
  if (!expected_header_xxh3.empty() && hex(s.header_sum) != expected_header_xxh3)
    fail(path, "header differs from the one the manifest recorded (shard from another checkpoint?)");
  try {
    s.header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  // Every key a reader takes from the entries, checked once (the header checksum holds, so only a faulty writer
  // gets here; named all the same).
  if (!s.header.is_object() || !s.header.contains("entries") || !s.header.at("entries").is_array())
    fail(path, "header has no 'entries' array");
  for (const auto& e : s.header.at("entries")) {
    const bool ok = e.is_object() && e.contains("vector") && e.at("vector").is_string() && e.contains("name") &&
                    e.at("name").is_string() && e.contains("offset") && e.at("offset").is_number_integer() &&
                    e.contains("numel") && e.at("numel").is_number_integer() && e.contains("zstd_bytes") &&
                    e.at("zstd_bytes").is_number_unsigned() && e.contains("data_offset") &&
                    e.at("data_offset").is_number_unsigned() && e.contains("raw_xxh3") && e.at("raw_xxh3").is_string() &&
                    e.contains("zstd_xxh3") && e.at("zstd_xxh3").is_string();
    if (!ok) fail(path, "header entry " + e.dump().substr(0, 200) + " lacks a key or has one of the wrong type");
    const std::string vec = e.at("vector").get<std::string>();
    if (vec != "params" && vec != "adam_m" && vec != "adam_v") fail(path, "unknown vector '" + vec + "'");
    const uint64_t off = e.at("data_offset").get<uint64_t>(), len = e.at("zstd_bytes").get<uint64_t>();
    if (off > s.data_end - s.data_begin || len > s.data_end - s.data_begin - off)
      fail(path, vec + " " + e.at("name").get<std::string>() + ": data runs past the end of the file (truncated)");
  }
  return s;
}

int vector_index(const std::string& name) {
  for (int v = 0; v < 3; ++v)
    if (name == kVectorNames[v]) return v;
  return -1;
}

// Reads, decompresses and verifies one entry into dst (entry.numel floats); `z` is the caller's buffer for the
// compressed bytes (kept between calls).
void read_entry(const ShardFile& s, const nlohmann::json& e, std::vector<char>& z, float* dst) {
  const std::string what = e.at("vector").get<std::string>() + " " + e.at("name").get<std::string>();
  const uint64_t off = e.at("data_offset").get<uint64_t>(), len = e.at("zstd_bytes").get<uint64_t>();
  const int64_t numel = e.at("numel").get<int64_t>();
  if (z.size() < len) z.resize(len);
  s.read_at(z.data(), len, s.data_begin + off, what);
  if (hex(XXH3_64bits(z.data(), len)) != e.at("zstd_xxh3").get<std::string>())
    fail(s.path, what + ": compressed data checksum mismatch (corrupted)");
  const size_t want = static_cast<size_t>(numel) * sizeof(float);
  const size_t got = ZSTD_decompress(dst, want, z.data(), len);
  if (ZSTD_isError(got) || got != want) fail(s.path, what + ": zstd decompression failed or wrong size (corrupted)");
  if (hex(XXH3_64bits(dst, want)) != e.at("raw_xxh3").get<std::string>())
    fail(s.path, what + ": tensor checksum mismatch after decompression (corrupted)");
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
  if (version < kOldestReadableVersion || version > kFormatVersion)
    fail(path, "checkpoint format version " + std::to_string(version) + ", this build reads versions " +
                   std::to_string(kOldestReadableVersion) + " to " + std::to_string(kFormatVersion) +
                   " (use the olmoref release that wrote it, or convert)" +
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

ShardRecord write_shard(const std::string& tmp_dir, int rank, const ShardContents& contents,
                        const std::vector<Segment>& segments, const SaveOptions& opts, int64_t step_for_fault_injection) {
  // The frames in file order: vector by vector, tensor by tensor, the part of each tensor inside the vector's range
  // (a shard boundary may cut it) in pieces of at most kFrameFloats.
  struct Frame {
    int v;
    std::string name;
    int64_t a, b;
  };
  std::vector<Frame> frames;
  for (int v = 0; v < 3; ++v) {
    const auto [lo, hi] = contents.ranges[static_cast<size_t>(v)];
    for (const Segment& seg : segments) {
      const int64_t a0 = std::max(lo, seg.offset), b0 = std::min(hi, seg.offset + seg.numel);
      for (int64_t a = a0; a < b0; a += kFrameFloats) {
        const int64_t b = std::min(b0, a + kFrameFloats);
        std::string name = seg.name;
        if (a != seg.offset || b != seg.offset + seg.numel) {
          char part[64];  // a piece of the tensor: name[begin:end] within it
          std::snprintf(part, sizeof part, "[%lld:%lld]", static_cast<long long>(a - seg.offset),
                        static_cast<long long>(b - seg.offset));
          name.append(part);
        }
        frames.push_back({v, std::move(name), a, b});
      }
    }
  }
  char file_name[32];
  std::snprintf(file_name, sizeof file_name, "shard-%05d.bin", rank);
  const std::string path = tmp_dir + "/" + file_name, tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(tmp, "cannot create (is the checkpoint directory writable?)");
  bool ok = std::fwrite(kShardMagic, 1, 16, f) == 16;

  // Up to `threads` frames at a time, each read and compressed by its own thread into its own slot (one zstd frame,
  // single-threaded: the bytes do not depend on the thread count), then written in order. The slots are the
  // writer's whole memory: per thread, one frame's compressed bytes and, when the state is not in host memory, its
  // raw bytes (pages are taken only as they are written).
  struct Slot {
    std::unique_ptr<float[]> scratch;
    std::unique_ptr<char[]> out;
    const float* src = nullptr;
    size_t z = 0;
    uint64_t raw_sum = 0;
    std::string error;
  };
  const size_t threads = static_cast<size_t>(std::max(1, opts.zstd_threads));
  std::vector<Slot> slots(std::min(threads, std::max<size_t>(1, frames.size())));
  const size_t bound = ZSTD_compressBound(static_cast<size_t>(kFrameFloats) * sizeof(float));
  for (Slot& slot : slots) slot.scratch.reset(new float[kFrameFloats]), slot.out.reset(new char[bound]);
  auto process = [&](Slot& slot, const Frame& fr) {
    try {
      const size_t n = static_cast<size_t>(fr.b - fr.a) * sizeof(float);
      const float* src = slot.src;
      slot.raw_sum = XXH3_64bits(src, n);
      ZSTD_CCtx* c = ZSTD_createCCtx();
      ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, opts.zstd_level);
      ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
      slot.z = ZSTD_compress2(c, slot.out.get(), bound, src, n);
      ZSTD_freeCCtx(c);
      if (ZSTD_isError(slot.z)) slot.error = std::string("zstd compression failed: ") + ZSTD_getErrorName(slot.z);
    } catch (const std::exception& e) {
      slot.error = e.what();
    }
  };
  nlohmann::json entries = nlohmann::json::array();
  uint64_t data_size = 0;
  int64_t raw_bytes = 0;
  for (size_t i0 = 0; i0 < frames.size() && ok; i0 += slots.size()) {
    const size_t n = std::min(slots.size(), frames.size() - i0);
    // The pieces are fetched on this thread (a device executor's copies stay on the thread that owns its device),
    // then compressed side by side.
    for (size_t j = 0; j < n; ++j) {
      const Frame& fr = frames[i0 + j];
      try {
        slots[j].src = contents.read(fr.v, fr.a, fr.b, slots[j].scratch.get());
      } catch (const std::exception& e) {
        std::fclose(f);
        fail(path, kVectorNames[fr.v] + std::string(" ") + fr.name + ": " + e.what());
      }
    }
    std::vector<std::thread> pool;
    for (size_t j = 1; j < n; ++j) pool.emplace_back(process, std::ref(slots[j]), std::cref(frames[i0 + j]));
    process(slots[0], frames[i0]);
    for (auto& t : pool) t.join();
    for (size_t j = 0; j < n; ++j) {
      Slot& slot = slots[j];
      const Frame& fr = frames[i0 + j];
      if (!slot.error.empty()) {
        std::fclose(f);
        fail(path, kVectorNames[fr.v] + std::string(" ") + fr.name + ": " + slot.error);
      }
      ok = ok && std::fwrite(slot.out.get(), 1, slot.z, f) == slot.z;
      entries.push_back({{"vector", kVectorNames[fr.v]},
                         {"name", fr.name},
                         {"offset", fr.a},
                         {"numel", fr.b - fr.a},
                         {"raw_xxh3", hex(slot.raw_sum)},
                         {"zstd_bytes", slot.z},
                         {"zstd_xxh3", hex(XXH3_64bits(slot.out.get(), slot.z))},
                         {"data_offset", data_size}});
      data_size += slot.z;
      raw_bytes += (fr.b - fr.a) * static_cast<int64_t>(sizeof(float));
    }
  }
  nlohmann::json ranges = nlohmann::json::object();
  for (int v = 0; v < 3; ++v)
    ranges[kVectorNames[v]] = {contents.ranges[static_cast<size_t>(v)].first,
                               contents.ranges[static_cast<size_t>(v)].second};
  const std::string header =
      nlohmann::json{{"rank", rank}, {"ranges", ranges}, {"frame_floats", kFrameFloats}, {"entries", entries}}.dump();
  ShardRecord record;
  record.rank = rank;
  record.header_xxh3 = XXH3_64bits(header.data(), header.size());
  record.raw_bytes = raw_bytes;
  std::string trailer = header;
  put_u64(trailer, header.size());
  put_u64(trailer, record.header_xxh3);
  trailer.append(kShardMagic, 16);
  record.bytes = 16 + data_size + trailer.size();
  ok = ok && std::fwrite(trailer.data(), 1, trailer.size(), f) == trailer.size() && std::fflush(f) == 0 &&
       ::fsync(::fileno(f)) == 0;
  std::fclose(f);
  if (!ok) fail(tmp, "write failed (disk full?)");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "rename from .tmp failed");
  // Fault injection for the kill tests: die between the shard and the manifest, the worst moment.
  // OLMOREF_TEST_CRASH_SHARD limits it to one rank's writer (a rank dying mid-checkpoint).
  if (const char* crash = std::getenv("OLMOREF_TEST_CRASH_IN_SAVE"); crash && std::stoll(crash) == step_for_fault_injection) {
    const char* only = std::getenv("OLMOREF_TEST_CRASH_SHARD");
    if (!only || std::stoi(only) == rank) ::raise(SIGKILL);
  }
  return record;
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
                        int64_t total, const StateDigests& digests, const SaveOptions& opts,
                        std::vector<ShardRecord> records) {
  // The writers reported their files (gathered): nothing is read back. The manifest records each file's exact size
  // and header checksum, so a truncated or swapped file is caught before it is parsed; the size is checked here
  // against the directory too (a writer that reported a file it did not write).
  std::sort(records.begin(), records.end(), [](const ShardRecord& x, const ShardRecord& y) { return x.rank < y.rank; });
  nlohmann::json shards = nlohmann::json::array();
  int64_t raw_bytes = 0;
  for (const ShardRecord& r : records) {
    char f[32];
    std::snprintf(f, sizeof f, "shard-%05lld.bin", static_cast<long long>(r.rank));
    std::error_code ec;
    const uint64_t on_disk = fs::file_size(tmp_dir + "/" + f, ec);
    if (ec || on_disk != r.bytes)
      fail(tmp_dir + "/" + f, "rank " + std::to_string(r.rank) + " reported " + std::to_string(r.bytes) +
                                  " bytes written, the directory holds " + (ec ? "no such file" : std::to_string(on_disk)));
    raw_bytes += r.raw_bytes;
    shards.push_back({{"file", f}, {"rank", r.rank}, {"bytes", r.bytes}, {"header_xxh3", hex(r.header_xxh3)}});
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
  ShardContents all;
  all.ranges = {{{0, state.total}, {0, state.total}, {0, state.total}}};
  all.read = [&](int v, int64_t a, int64_t, float*) -> const float* {
    return (v == 0 ? state.params : v == 1 ? state.adam_m : state.adam_v) + a;
  };
  const ShardRecord record = write_shard(tmp, 0, all, segments, opts, meta.step);
  const StateDigests d{merkle_digest(state.params, state.total).hex(), merkle_digest(state.adam_m, state.total).hex(),
                       merkle_digest(state.adam_v, state.total).hex()};
  return finish_save(root, tmp, meta, state.total, d, opts, {record});
}

namespace {

// Opens every shard the manifest lists (their headers alone) and checks that each names its rank and that the
// entries cover each flat vector exactly once.
std::vector<ShardFile> open_shards(const std::string& dir, const nlohmann::json& m, int64_t total) {
  std::vector<ShardFile> files;
  std::array<std::vector<std::pair<int64_t, int64_t>>, 3> coverage;
  for (const auto& sh : m.at("shards")) {
    const std::string path = dir + "/" + sh.at("file").get<std::string>();
    ShardFile s = open_shard(path, sh.at("bytes").get<uint64_t>(), sh.at("header_xxh3").get<std::string>());
    if (!s.header.contains("rank") || s.header.at("rank") != sh.at("rank"))
      fail(path, "the shard's header says rank " + s.header.value("rank", nlohmann::json()).dump() + " but the manifest's "
                 "shards entry for it says " + sh.at("rank").dump() + " (a shard from another checkpoint or layout?)");
    for (const auto& e : s.header.at("entries")) {
      const int v = vector_index(e.at("vector").get<std::string>());
      const int64_t off = e.at("offset").get<int64_t>(), n = e.at("numel").get<int64_t>();
      if (off < 0 || n < 0 || off > total || n > total - off)
        fail(path, std::string(kVectorNames[v]) + " range out of bounds");
      coverage[static_cast<size_t>(v)].emplace_back(off, off + n);
    }
    files.push_back(std::move(s));
  }
  for (int v = 0; v < 3; ++v) {
    auto& r = coverage[static_cast<size_t>(v)];
    std::sort(r.begin(), r.end());
    int64_t at = 0;
    for (auto& [a, b] : r) {
      if (a == b) continue;
      if (a != at)
        fail(dir, std::string(kVectorNames[v]) + ": shards leave a gap or overlap at element " + std::to_string(at) +
                      " (missing shard?)");
      at = b;
    }
    if (at != total)
      fail(dir, std::string(kVectorNames[v]) + ": shards cover " + std::to_string(at) + " of " + std::to_string(total) +
                    " elements (missing shard?)");
  }
  return files;
}

// A reader's buffers for one entry: its compressed bytes and its floats. Allocated without zero-filling, so only
// the pages an entry fills count.
struct EntryBuffers {
  std::vector<char> z;
  std::unique_ptr<float[]> raw;
  int64_t raw_capacity = 0;
  float* floats(int64_t n) {
    if (n > raw_capacity) raw.reset(new float[static_cast<size_t>(n)]), raw_capacity = n;
    return raw.get();
  }
};

// Reads the entries that overlap ranges[v] of each vector v, verifying each, and hands the overlapping pieces to
// sink; `threads` entries at a time.
void read_ranges(const std::vector<ShardFile>& files, const std::array<std::pair<int64_t, int64_t>, 3>& ranges,
                 const PieceSink& sink, int threads) {
  std::vector<std::pair<const ShardFile*, const nlohmann::json*>> mine;
  for (const ShardFile& s : files)
    for (const auto& e : s.header.at("entries")) {
      const auto [lo, hi] = ranges[static_cast<size_t>(vector_index(e.at("vector").get<std::string>()))];
      const int64_t off = e.at("offset").get<int64_t>(), n = e.at("numel").get<int64_t>();
      if (std::max(lo, off) < std::min(hi, off + n)) mine.emplace_back(&s, &e);
    }
  std::atomic<size_t> next{0};
  std::string first_error;
  std::mutex error_mutex;
  auto worker = [&] {
    EntryBuffers buf;
    for (size_t i; (i = next++) < mine.size();) {
      const auto& [s, e] = mine[i];
      const int v = vector_index(e->at("vector").get<std::string>());
      const int64_t off = e->at("offset").get<int64_t>(), n = e->at("numel").get<int64_t>();
      const auto [lo, hi] = ranges[static_cast<size_t>(v)];
      const int64_t a = std::max(lo, off), b = std::min(hi, off + n);
      try {
        float* raw = buf.floats(n);
        read_entry(*s, *e, buf.z, raw);
        sink(v, a, b, raw + (a - off));
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (first_error.empty()) first_error = ex.what();
      }
    }
  };
  const size_t n_threads = std::max<size_t>(1, std::min(static_cast<size_t>(std::max(1, threads)), mine.size()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (!first_error.empty()) throw std::runtime_error(first_error);
}

void read_all(const std::string& dir, const nlohmann::json& m, const StateVectors& state, int threads) {
  const std::vector<ShardFile> files = open_shards(dir, m, state.total);
  const int64_t n = state.total;
  read_ranges(files, {{{0, n}, {0, n}, {0, n}}},
              [&](int v, int64_t a, int64_t b, const float* data) { std::copy(data, data + (b - a), vector_ptr(state, kVectorNames[v]) + a); },
              threads);
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

CheckpointMeta load_ranges(const std::string& dir, const std::array<std::pair<int64_t, int64_t>, 3>& ranges,
                           const PieceSink& sink, int64_t total, const CheckpointMeta& expect,
                           const LoadOptions& opts) {
  const nlohmann::json m = read_manifest(dir);
  CheckpointMeta meta = check_meta(dir, m, total, expect, opts);
  read_ranges(open_shards(dir, m, total), ranges, sink, opts.threads);
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
  read_all(dir, m, state, opts.threads);
  return meta;
}

std::vector<std::string> verify(const std::string& dir, const std::function<void(uint64_t, uint64_t)>& progress) {
  std::vector<std::string> problems;
  try {
    const nlohmann::json m = read_manifest(dir);
    problems = manifest_record_problems(dir + "/manifest.json", m);
    const int64_t total = m.at("total_params").get<int64_t>();
    const std::vector<ShardFile> files = open_shards(dir, m, total);
    // Each vector in order of its elements (the coverage check above made the entries tile it), one entry at a time,
    // into a running Merkle digest: the whole-state digest without the whole state.
    EntryBuffers buf;
    uint64_t to_read = 0, done = 0;
    for (const ShardFile& s : files)
      for (const auto& e : s.header.at("entries")) to_read += e.at("zstd_bytes").get<uint64_t>();
    for (int v = 0; v < 3; ++v) {
      std::vector<std::pair<int64_t, std::pair<const ShardFile*, const nlohmann::json*>>> order;
      for (const ShardFile& s : files)
        for (const auto& e : s.header.at("entries"))
          if (vector_index(e.at("vector").get<std::string>()) == v && e.at("numel").get<int64_t>() > 0)
            order.push_back({e.at("offset").get<int64_t>(), {&s, &e}});
      std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      MerkleStream digest;
      for (const auto& [off, entry] : order) {
        const int64_t n = entry.second->at("numel").get<int64_t>();
        float* raw = buf.floats(n);
        read_entry(*entry.first, *entry.second, buf.z, raw);
        digest.add(raw, n);
        done += entry.second->at("zstd_bytes").get<uint64_t>();
        if (progress) progress(done, to_read);
      }
      if (digest.finish().hex() != m.at("state_digests").at(kVectorNames[v]).get<std::string>())
        fail(dir, "loaded state does not match the manifest's whole-state digests (" + std::string(kVectorNames[v]) + ")");
    }
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
  return problems;
}

struct VectorReader::Impl {
  std::string dir;
  int v = 0;
  nlohmann::json manifest;
  std::vector<ShardFile> files;
  std::vector<std::pair<const ShardFile*, const nlohmann::json*>> entries;  // this vector's, by offset
  size_t next = 0;                  // the entry to decompress next
  int64_t entry_begin = 0, entry_end = 0;  // the decompressed entry's range
  EntryBuffers buf;
  int64_t at = 0;                   // where the next read starts
  MerkleStream digest;
  bool finished = false;
};

VectorReader::VectorReader(const std::string& dir, const std::string& vector) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.v = vector_index(vector);
  if (m.v < 0) throw std::invalid_argument("VectorReader: no vector '" + vector + "'");
  m.manifest = read_manifest(dir);
  if (const std::vector<std::string> problems = manifest_record_problems(dir + "/manifest.json", m.manifest);
      !problems.empty())
    throw std::runtime_error(problems.front());
  m.files = open_shards(dir, m.manifest, m.manifest.at("total_params").get<int64_t>());
  for (const ShardFile& s : m.files)
    for (const auto& e : s.header.at("entries"))
      if (vector_index(e.at("vector").get<std::string>()) == m.v && e.at("numel").get<int64_t>() > 0)
        m.entries.emplace_back(&s, &e);
  std::sort(m.entries.begin(), m.entries.end(), [](const auto& x, const auto& y) {
    return x.second->at("offset").template get<int64_t>() < y.second->at("offset").template get<int64_t>();
  });
}

VectorReader::~VectorReader() = default;

int64_t VectorReader::total() const { return impl_->manifest.at("total_params").get<int64_t>(); }

void VectorReader::read(int64_t a, int64_t b, float* out) {
  Impl& m = *impl_;
  if (a != m.at || b < a || b > total())
    throw std::logic_error("VectorReader::read [" + std::to_string(a) + ", " + std::to_string(b) + ") of " + m.dir +
                           ": reads go in order from " + std::to_string(m.at));
  while (a < b) {
    if (a >= m.entry_end) {  // the next entry (open_shards checked that they tile the vector)
      const auto& [s, e] = m.entries.at(m.next++);
      m.entry_begin = e->at("offset").get<int64_t>();
      m.entry_end = m.entry_begin + e->at("numel").get<int64_t>();
      read_entry(*s, *e, m.buf.z, m.buf.floats(m.entry_end - m.entry_begin));
      m.digest.add(m.buf.raw.get(), m.entry_end - m.entry_begin);
    }
    const int64_t take = std::min(b, m.entry_end) - a;
    std::copy(m.buf.raw.get() + (a - m.entry_begin), m.buf.raw.get() + (a - m.entry_begin) + take, out);
    out += take, a += take;
  }
  m.at = b;
}

void VectorReader::finish() {
  Impl& m = *impl_;
  if (m.finished) return;
  if (m.at != total())
    throw std::logic_error(m.dir + ": VectorReader::finish after " + std::to_string(m.at) + " of " +
                           std::to_string(total()) + " floats");
  if (m.digest.finish().hex() != m.manifest.at("state_digests").at(kVectorNames[m.v]).get<std::string>())
    fail(m.dir, "the " + std::string(kVectorNames[m.v]) + " read do not match the manifest's whole-state digest");
  m.finished = true;
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
    const ShardFile s = open_shard(path, 0, "");
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
