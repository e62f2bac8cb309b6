#include "data/mix.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace olmoref::data {

namespace fs = std::filesystem;

static std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Temp file + rename, so a reader never sees half a mix.
static void write_mix_atomically(const std::string& mix_path, const std::string& text) {
  const std::string tmp = mix_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error("mix file '" + mix_path + "': cannot write '" + tmp + "'");
    out << text;
    if (!out.flush()) throw std::runtime_error("mix file '" + mix_path + "': write failed");
  }
  fs::rename(tmp, mix_path);
}

// A mix line is text. A NUL would end the path where the file is opened (so "a.u16\0.bak" would read a.u16 without a
// word), and an escape, a carriage return inside the line or DEL means a corrupted or binary file, never a path
// anyone meant. Tabs are whitespace around the fields; a CR that ends the line is a Windows line ending.
static void refuse_control_characters(const std::string& mix_path, int64_t line_no, const std::string& line) {
  size_t n = line.size();
  if (n > 0 && line[n - 1] == '\r') --n;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if ((c >= 0x20 && c != 0x7f) || c == '\t') continue;
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", c);
    const std::string name = c == 0 ? "NUL (0x00)" : c == '\r' ? "CR (0x0d)" : c == 0x7f ? "DEL (0x7f)" : code;
    const bool binary = line_no == 1 && line.find('\0') != std::string::npos;
    throw std::runtime_error(
        "mix file '" + mix_path + "' line " + std::to_string(line_no) + ": control character " + name + " at column " +
        std::to_string(i + 1) + "; a mix line holds only text (a token file path, or label,path): " +
        (binary ? "this looks like binary data: was a token file given where a mix belongs? (data.train_mix and "
                  "data.holdout_mix name mix files; data.train_files and data.holdout_files name token files)"
                : "remove the character from the line"));
  }
}

Mix Mix::parse_file(const std::string& mix_path, const MixResolve& resolve) {
  std::ifstream in(mix_path);
  if (!in) {
    throw std::runtime_error("mix file '" + mix_path + "': cannot open; check the path (a mix lists one token "
                             "file per line, optionally as label,path)");
  }
  Mix mix;
  mix.source = mix_path;
  const fs::path dir = resolve.base_dir.empty() ? fs::path(mix_path).parent_path() : fs::path(resolve.base_dir);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    refuse_control_characters(mix_path, line_no, line);
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    MixEntry e;
    e.line = line_no;
    std::string path = t;
    if (const size_t comma = t.find(','); comma != std::string::npos) {
      e.label = trim(t.substr(0, comma));
      path = trim(t.substr(comma + 1));
      if (path.empty()) {
        throw std::runtime_error("mix file '" + mix_path + "' line " + std::to_string(line_no) +
                                 ": label '" + e.label + "' has no path after the comma");
      }
    }
    if (const size_t at = path.find("{TOKENIZER}"); at != std::string::npos) {
      if (resolve.tokenizer.empty())
        throw std::runtime_error("mix file '" + mix_path + "' line " + std::to_string(line_no) +
                                 ": the path holds OLMo-core's {TOKENIZER} placeholder; set data.mix_tokenizer (the "
                                 "tokenizer's directory name in the corpus, e.g. \"allenai/dolma3-tokenizer\") and "
                                 "data.mix_base_dir");
      for (size_t p = at; p != std::string::npos; p = path.find("{TOKENIZER}", p + resolve.tokenizer.size()))
        path.replace(p, std::string("{TOKENIZER}").size(), resolve.tokenizer);
    }
    const fs::path p(path);
    e.path = p.is_absolute() || dir.empty() ? p.string() : (dir / p).string();
    mix.entries.push_back(std::move(e));
  }
  if (mix.entries.empty()) {
    throw std::runtime_error("mix file '" + mix_path + "' lists no token files (only blank or # lines); "
                             "add one path per line");
  }
  return mix;
}

// Same file: equal canonical paths. Same bytes: equal size, then XXH3 of the first MiB, then of the whole file, each
// read at most once per file. Indexed by path and by size, so mixes of many thousand files compare in one pass.
namespace {
struct FileId {
  std::string path, canonical;
  int64_t bytes = -1;  // -1: cannot be read (compared by path alone)
  bool head_done = false, whole_done = false;
  std::optional<uint64_t> head, whole;  // nullopt: unreadable
};

std::optional<uint64_t> xxh3_of_file(const std::string& path, int64_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(size_t{1} << 20);
  int64_t left = limit;
  while (left > 0 && in) {
    in.read(buf.data(), static_cast<std::streamsize>(std::min<int64_t>(left, static_cast<int64_t>(buf.size()))));
    const std::streamsize got = in.gcount();
    if (got <= 0) break;
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(got));
    left -= got;
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (left > 0) return std::nullopt;  // shorter than its size said: changed while read
  return h;
}

FileId identify(const std::string& path) {
  FileId id;
  id.path = path;
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(path, ec);
  if (ec) {
    std::error_code ec2;
    id.canonical = fs::absolute(path, ec2).lexically_normal().string();
  } else {
    id.canonical = c.string();
  }
  const auto n = fs::file_size(path, ec);
  if (!ec) id.bytes = static_cast<int64_t>(n);
  return id;
}

constexpr int64_t kHeadBytes = int64_t{1} << 20;

const std::optional<uint64_t>& head_of(FileId& f) {
  if (!f.head_done) f.head = xxh3_of_file(f.path, std::min(f.bytes, kHeadBytes));
  f.head_done = true;
  return f.head;
}

const std::optional<uint64_t>& whole_of(FileId& f) {
  if (!f.whole_done) f.whole = f.bytes <= kHeadBytes ? head_of(f) : xxh3_of_file(f.path, f.bytes);
  f.whole_done = true;
  return f.whole;
}
}  // namespace

std::vector<SharedFile> shared_files(const Mix& a, const Mix& b) {
  std::vector<FileId> ia, ib;
  for (const auto& e : a.entries) ia.push_back(identify(e.path));
  for (const auto& e : b.entries) ib.push_back(identify(e.path));
  std::unordered_map<std::string, std::vector<size_t>> b_by_path;
  std::unordered_map<int64_t, std::vector<size_t>> b_by_size;
  for (size_t j = 0; j < ib.size(); ++j) {
    b_by_path[ib[j].canonical].push_back(j);
    if (ib[j].bytes >= 0) b_by_size[ib[j].bytes].push_back(j);
  }
  std::vector<SharedFile> out;
  for (size_t i = 0; i < ia.size(); ++i) {
    std::vector<SharedFile> found;
    if (const auto it = b_by_path.find(ia[i].canonical); it != b_by_path.end())
      for (const size_t j : it->second) {
        SharedFile s;
        s.a = i, s.b = j, s.same_path = true, s.canonical = ia[i].canonical;
        found.push_back(s);
      }
    if (const auto it = ia[i].bytes >= 0 ? b_by_size.find(ia[i].bytes) : b_by_size.end(); it != b_by_size.end())
      for (const size_t j : it->second) {
        if (ib[j].canonical == ia[i].canonical) continue;  // found above
        const auto& ha = head_of(ia[i]);
        const auto& hb = head_of(ib[j]);
        if (!ha || !hb || *ha != *hb) continue;
        const auto& wa = whole_of(ia[i]);
        const auto& wb = whole_of(ib[j]);
        if (!wa || !wb || *wa != *wb) continue;
        SharedFile s;
        s.a = i, s.b = j, s.bytes = ia[i].bytes, s.xxh3 = *wa;
        found.push_back(s);
      }
    std::sort(found.begin(), found.end(), [](const SharedFile& x, const SharedFile& y) { return x.b < y.b; });
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

Mix Mix::from_paths(const std::vector<std::string>& paths, const std::string& label) {
  if (paths.empty()) throw std::runtime_error("empty list of token files: give at least one path or a mix file");
  Mix mix;
  mix.source = "<list>";
  for (const auto& p : paths) mix.entries.push_back({p, label});
  return mix;
}

void Mix::write_file(const std::string& mix_path) const {
  const fs::path dir = fs::absolute(fs::path(mix_path)).parent_path();
  std::string text;
  for (const auto& e : entries) {
    fs::path p = fs::absolute(e.path).lexically_normal();
    const fs::path rel = p.lexically_relative(dir);
    // Relative only when the file lies beneath the mix's directory; "../" paths would break
    // the moment the mix is copied without its neighbours.
    std::string written = (!rel.empty() && *rel.begin() != "..") ? rel.string() : p.string();
    if (!e.label.empty()) written = e.label + "," + written;
    text += written + "\n";
  }
  write_mix_atomically(mix_path, text);
}

void Mix::write_olmo_core_file(const std::string& mix_path, const MixResolve& resolve) const {
  if (resolve.base_dir.empty() || resolve.tokenizer.empty())
    throw std::invalid_argument("mix file '" + mix_path + "': OLMo-core's format needs a base directory and a tokenizer "
                                "name (`olmoref data mix`: --mix-base-dir and --mix-tokenizer)");
  const fs::path base = fs::absolute(resolve.base_dir).lexically_normal();
  std::string text;
  for (const auto& e : entries) {
    const fs::path rel = fs::absolute(e.path).lexically_normal().lexically_relative(base);
    if (rel.empty() || *rel.begin() == "..")
      throw std::invalid_argument("mix file '" + mix_path + "': token file '" + e.path + "' is not beneath the base " +
                                  "directory '" + base.string() + "' (OLMo-core joins base_dir and each path)");
    std::string path = rel.generic_string();
    const size_t at = path.find(resolve.tokenizer);
    if (at == std::string::npos)
      throw std::invalid_argument("mix file '" + mix_path + "': token file '" + e.path + "' has no '" + resolve.tokenizer +
                                  "' in its path, and OLMo-core requires the {TOKENIZER} placeholder in every line");
    path.replace(at, resolve.tokenizer.size(), "{TOKENIZER}");
    const std::string label = e.label.empty() ? fs::path(e.path).stem().string() : e.label;
    if (path.find(',') != std::string::npos || label.find(',') != std::string::npos)
      throw std::invalid_argument("mix file '" + mix_path + "': '" + label + "," + path + "' holds a second comma, which "
                                  "OLMo-core's parser (one split on ',') cannot read");
    text += label + "," + path + "\n";
  }
  write_mix_atomically(mix_path, text);
}

}  // namespace olmoref::data
