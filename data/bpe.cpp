#include "data/bpe.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "data/json_file.h"

namespace olmoref::data {

static uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

BpeTokenizer::BpeTokenizer(int64_t vocab_size, std::vector<std::pair<uint32_t, uint32_t>> merges)
    : BpeTokenizer([&] {
        Spec s;
        s.vocab_size = vocab_size;
        for (uint32_t b = 0; b < 256; ++b) s.byte_ids[b] = b;
        for (size_t i = 0; i < merges.size(); ++i) {
          const auto [a, b] = merges[i];
          const uint32_t id = kFirstMerge + static_cast<uint32_t>(i);
          // olmoref-bpe-v1 builds merges in creation order; a forward reference means a damaged file.
          if (a >= id || b >= id || a == kEos || a == kPad || b == kEos || b == kPad)
            throw std::runtime_error("BPE merge " + std::to_string(i) + " = [" + std::to_string(a) + ", " +
                                     std::to_string(b) + "] refers to a special token or a later merge");
          s.merge_ids.push_back(id);
        }
        s.merges = std::move(merges);
        s.eos = kEos;
        s.pad = kPad;
        s.specials = {{kEos, "<|endoftext|>"}, {kPad, "<|pad|>"}};
        if (vocab_size < static_cast<int64_t>(kFirstMerge + s.merges.size()))
          throw std::runtime_error("BPE vocab_size " + std::to_string(vocab_size) + " is smaller than 258 + " +
                                   std::to_string(s.merges.size()) + " merges");
        return s;
      }()) {}

BpeTokenizer::BpeTokenizer(const Spec& spec)
    : vocab_size_(spec.vocab_size), merges_(spec.merges), merge_ids_(spec.merge_ids), byte_ids_(spec.byte_ids),
      eos_(spec.eos), pad_(spec.pad) {
  if (merge_ids_.size() != merges_.size())
    throw std::runtime_error("BPE spec: " + std::to_string(merges_.size()) + " merges but " +
                             std::to_string(merge_ids_.size()) + " merge ids");
  auto in_vocab = [&](uint32_t id, const std::string& what) {
    if (static_cast<int64_t>(id) >= vocab_size_)
      throw std::runtime_error(what + " has id " + std::to_string(id) + ", outside vocab_size " +
                               std::to_string(vocab_size_));
  };
  const size_t n = static_cast<size_t>(vocab_size_);
  bytes_.assign(n, std::string());
  defined_.assign(n, 0);
  special_.assign(n, 0);
  auto define = [&](uint32_t id, std::string bytes, const std::string& what) {
    in_vocab(id, what);
    if (defined_[id]) throw std::runtime_error(what + ": id " + std::to_string(id) + " is already taken");
    defined_[id] = 1;
    bytes_[id] = std::move(bytes);
  };
  for (uint32_t b = 0; b < 256; ++b) define(byte_ids_[b], std::string(1, static_cast<char>(b)), "byte " + std::to_string(b));
  for (const auto& [id, text] : spec.specials) {
    define(id, text, "special token '" + text + "'");
    special_[id] = 1;
  }
  in_vocab(eos_, "EOS");
  if (!special_[eos_]) throw std::runtime_error("EOS id " + std::to_string(eos_) + " is not a special token");
  if (pad_) {
    in_vocab(*pad_, "PAD");
    if (!special_[*pad_]) throw std::runtime_error("PAD id " + std::to_string(*pad_) + " is not a special token");
  }
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [a, b] = merges_[i];
    const std::string what = "BPE merge " + std::to_string(i) + " = [" + std::to_string(a) + ", " + std::to_string(b) + "]";
    in_vocab(a, what);
    in_vocab(b, what);
    // Encoding applies the lowest rank first; that equals the rank-ordered heap of Hugging Face's BPE only when
    // every merge joins tokens that exist before it (as training makes them), so anything else is refused.
    if (!defined_[a] || !defined_[b] || special_[a] || special_[b])
      throw std::runtime_error(what + " refers to a special token or a later merge");
    define(merge_ids_[i], bytes_[a] + bytes_[b], what);
    if (!rank_.emplace(pair_key(a, b), static_cast<uint32_t>(i)).second)
      throw std::runtime_error(what + " repeats an earlier merge");
  }
}

BpeTokenizer::Spec BpeTokenizer::spec() const {
  Spec s;
  s.vocab_size = vocab_size_;
  s.byte_ids = byte_ids_;
  s.merges = merges_;
  s.merge_ids = merge_ids_;
  s.eos = eos_;
  s.pad = pad_;
  for (size_t id = 0; id < special_.size(); ++id)
    if (special_[id]) s.specials.emplace_back(static_cast<uint32_t>(id), bytes_[id]);
  return s;
}

bool BpeTokenizer::has_olmoref_layout() const {
  for (uint32_t b = 0; b < 256; ++b)
    if (byte_ids_[b] != b) return false;
  for (size_t i = 0; i < merge_ids_.size(); ++i)
    if (merge_ids_[i] != kFirstMerge + i) return false;
  if (eos_ != kEos || pad_ != std::optional<uint32_t>(kPad)) return false;
  for (size_t id = 0; id < special_.size(); ++id)
    if (special_[id] && id != kEos && id != kPad) return false;
  return bytes_[kEos] == "<|endoftext|>" && bytes_[kPad] == "<|pad|>";
}

bool BpeTokenizer::is_special(uint32_t id) const { return id < special_.size() && special_[id]; }

BpeTokenizer::BpeTokenizer(const BpeTokenizer& o)
    : vocab_size_(o.vocab_size_), merges_(o.merges_), merge_ids_(o.merge_ids_), byte_ids_(o.byte_ids_),
      eos_(o.eos_), pad_(o.pad_), rank_(o.rank_), bytes_(o.bytes_), defined_(o.defined_), special_(o.special_) {}

BpeTokenizer& BpeTokenizer::operator=(const BpeTokenizer& o) {
  if (this != &o) {
    vocab_size_ = o.vocab_size_;
    merges_ = o.merges_;
    merge_ids_ = o.merge_ids_;
    byte_ids_ = o.byte_ids_;
    eos_ = o.eos_;
    pad_ = o.pad_;
    rank_ = o.rank_;
    bytes_ = o.bytes_;
    defined_ = o.defined_;
    special_ = o.special_;
    std::lock_guard<std::mutex> lock(cache_mutex_);
    cache_.clear();
  }
  return *this;
}

BpeTokenizer BpeTokenizer::train(std::span<const std::string_view> documents, const TrainOptions& options) {
  if (options.vocab_size < kFirstMerge) {
    throw std::invalid_argument("BPE vocab_size must be at least 258 (256 bytes + EOS + PAD)");
  }
  const int64_t target_merges = options.vocab_size - kFirstMerge;

  // The multiset of chunks; sorting the distinct ones makes every later container order-stable.
  std::unordered_map<std::string_view, int64_t> chunk_counts;
  for (std::string_view d : documents) pretokenize(d, [&](std::string_view c) { ++chunk_counts[c]; });
  std::vector<std::pair<std::string_view, int64_t>> distinct(chunk_counts.begin(), chunk_counts.end());
  std::sort(distinct.begin(), distinct.end());

  struct Word {
    std::vector<uint32_t> syms;
    int64_t freq;
  };
  std::vector<Word> words;
  words.reserve(distinct.size());
  for (const auto& [c, f] : distinct) {
    Word w{{}, f};
    for (unsigned char ch : c) w.syms.push_back(ch);
    words.push_back(std::move(w));
  }

  std::unordered_map<uint64_t, int64_t> count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // may hold stale/duplicate word ids
  for (uint32_t wi = 0; wi < words.size(); ++wi) {
    const Word& w = words[wi];
    for (size_t k = 0; k + 1 < w.syms.size(); ++k) {
      const uint64_t key = pair_key(w.syms[k], w.syms[k + 1]);
      count[key] += w.freq;
      where[key].push_back(wi);
    }
  }

  // Max-heap on (count, then smallest pair). Entries go stale when a count changes; a popped
  // entry is used only if it still matches the live count.
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [k, c] : count) heap.push({c, k});

  std::vector<std::pair<uint32_t, uint32_t>> merges;
  std::unordered_map<uint64_t, int64_t> delta;
  std::vector<uint32_t> merged;
  while (static_cast<int64_t>(merges.size()) < target_merges && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const auto it = count.find(top.key);
    if (it == count.end() || it->second != top.count) continue;  // stale
    if (top.count < options.min_pair_count) break;

    const uint32_t a = static_cast<uint32_t>(top.key >> 32), b = static_cast<uint32_t>(top.key & 0xffffffffu);
    const uint32_t c = kFirstMerge + static_cast<uint32_t>(merges.size());
    merges.emplace_back(a, b);

    std::vector<uint32_t> ws = std::move(where[top.key]);
    where.erase(top.key);
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    delta.clear();
    for (uint32_t wi : ws) {
      Word& w = words[wi];
      bool has = false;
      for (size_t k = 0; k + 1 < w.syms.size() && !has; ++k) has = (w.syms[k] == a && w.syms[k + 1] == b);
      if (!has) continue;
      for (size_t k = 0; k + 1 < w.syms.size(); ++k) delta[pair_key(w.syms[k], w.syms[k + 1])] -= w.freq;
      merged.clear();
      for (size_t k = 0; k < w.syms.size();) {
        if (k + 1 < w.syms.size() && w.syms[k] == a && w.syms[k + 1] == b) {
          merged.push_back(c);
          k += 2;
        } else {
          merged.push_back(w.syms[k]);
          k += 1;
        }
      }
      w.syms.swap(merged);
      for (size_t k = 0; k + 1 < w.syms.size(); ++k) {
        const uint64_t key = pair_key(w.syms[k], w.syms[k + 1]);
        delta[key] += w.freq;
        if (w.syms[k] == c || w.syms[k + 1] == c) where[key].push_back(wi);
      }
    }
    for (const auto& [key, d] : delta) {
      if (d == 0) continue;
      int64_t& cnt = count[key];
      cnt += d;
      if (cnt <= 0) {
        count.erase(key);
      } else {
        heap.push({cnt, key});
      }
    }
  }
  return BpeTokenizer(options.vocab_size, std::move(merges));
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto it = cache_.find(std::string(chunk)); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<uint32_t> syms;
  syms.reserve(chunk.size());
  for (const char c : chunk) syms.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  std::vector<uint32_t> next;
  while (syms.size() >= 2) {
    uint32_t best = UINT32_MAX;
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      const auto it = rank_.find(pair_key(syms[k], syms[k + 1]));
      if (it != rank_.end() && it->second < best) best = it->second;
    }
    if (best == UINT32_MAX) break;
    const auto [a, b] = merges_[best];
    next.clear();
    for (size_t k = 0; k < syms.size();) {
      if (k + 1 < syms.size() && syms[k] == a && syms[k + 1] == b) {
        next.push_back(merge_ids_[best]);
        k += 2;
      } else {
        next.push_back(syms[k++]);
      }
    }
    syms.swap(next);
  }
  out.insert(out.end(), syms.begin(), syms.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < (1u << 20)) cache_.emplace(std::string(chunk), std::move(syms));
}

void BpeTokenizer::encode_append(std::string_view text, std::vector<uint32_t>& out) const {
  pretokenize(text, [&](std::string_view c) { encode_chunk(c, out); });
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  encode_append(text, out);
  return out;
}

const std::string& BpeTokenizer::token_bytes(uint32_t id) const {
  if (id >= bytes_.size() || !defined_[id]) {
    throw std::out_of_range("token id " + std::to_string(id) + " is not in this tokenizer (" +
                            std::to_string(bytes_.size()) + " ids defined, vocab_size " +
                            std::to_string(vocab_size_) + ")");
  }
  return bytes_[id];
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string s;
  for (uint32_t id : ids) s += token_bytes(id);
  return s;
}

void BpeTokenizer::save(const std::string& path) const {
  if (!has_olmoref_layout())
    throw std::runtime_error("tokenizer '" + path + "': this tokenizer's ids (read from a Hugging Face tokenizer.json) "
                             "do not follow the olmoref-bpe-v1 layout (bytes 0-255, EOS 256, PAD 257, merges from 258), "
                             "so it cannot be saved in that format; keep using its tokenizer.json");
  nlohmann::json j;
  j["format"] = "olmoref-bpe-v1";
  j["vocab_size"] = vocab_size_;
  j["eos_id"] = kEos;
  j["pad_id"] = kPad;
  j["pretokenizer"] = "olmoref-bytes-v1";
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges_) m.push_back({a, b});
  j["merges"] = std::move(m);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error("tokenizer '" + path + "': cannot write (does the directory exist?)");
    // One merge per line: diffable, and still plain JSON.
    out << "{\n";
    for (const char* k : {"format", "vocab_size", "eos_id", "pad_id", "pretokenizer"}) {
      out << "  \"" << k << "\": " << j[k].dump() << ",\n";
    }
    out << "  \"merges\": [";
    for (size_t i = 0; i < merges_.size(); ++i) {
      out << (i ? ",\n    " : "\n    ") << "[" << merges_[i].first << ", " << merges_[i].second << "]";
    }
    out << (merges_.empty() ? "]\n}\n" : "\n  ]\n}\n");
    if (!out.flush()) throw std::runtime_error("tokenizer '" + path + "': write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("tokenizer '" + path + "': rename failed");
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  return from_json(read_json_file(path, "tokenizer", "; train one with `olmoref tokenize --vocab-size N`"), path);
}

BpeTokenizer BpeTokenizer::from_json(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object() || j.value("format", "") != "olmoref-bpe-v1" || j.value("pretokenizer", "") != "olmoref-bytes-v1") {
    throw std::runtime_error("tokenizer '" + path + "': expected format olmoref-bpe-v1 with pretokenizer "
                             "olmoref-bytes-v1; it was written by something else");
  }
  if (j.value("eos_id", 0u) != kEos || j.value("pad_id", 0u) != kPad) {
    throw std::runtime_error("tokenizer '" + path + "': eos_id/pad_id must be 256/257 in format olmoref-bpe-v1");
  }
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  for (const auto& m : j.at("merges")) merges.emplace_back(m.at(0).get<uint32_t>(), m.at(1).get<uint32_t>());
  try {
    return BpeTokenizer(j.at("vocab_size").get<int64_t>(), std::move(merges));
  } catch (const std::exception& e) {
    throw std::runtime_error("tokenizer '" + path + "': " + e.what());
  }
}

}  // namespace olmoref::data
