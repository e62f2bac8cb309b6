#include "interop/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

#include "interop/hf_export.h"

namespace olmoref::interop {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// What a token's bytes look like in a ByteLevel vocabulary.
std::string byte_level(const std::string& bytes) {
  const auto& chars = byte_level_chars();
  std::string s;
  for (const char c : bytes) s += chars[static_cast<unsigned char>(c)];
  return s;
}

std::string printable(const std::string& bytes) {
  std::string s;
  for (const unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    }
  }
  return s;
}

ordered_json added_token(uint32_t id, const std::string& content) {
  return {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},  {"normalized", false}, {"special", true}};
}

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw std::runtime_error("tokenizer '" + path + "': " + what);
}

const char* kSupported =
    "supported: Sequence[Split(olmoref-bytes-v1's regex, behavior Isolated), ByteLevel(add_prefix_space=false, "
    "use_regex=false)], as `olmoref export-hf --tokenizer` writes it";

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : j.dump();
}

void check_pre_tokenizer(const json& pre, const std::string& path) {
  if (pre.is_null()) refuse(path, std::string("pre_tokenizer is null: no pre-tokenizer is not supported (") + kSupported + ")");
  const std::string type = type_of(pre);
  if (type == "ByteLevel")
    refuse(path, std::string("pre_tokenizer type 'ByteLevel' alone (GPT-2's \\p{L}/\\p{N} regex when use_regex is true) "
                             "is not supported (") + kSupported + ")");
  if (type != "Sequence") refuse(path, "pre_tokenizer type '" + type + "' is not supported (" + kSupported + ")");
  const json& seq = pre.value("pretokenizers", json());
  if (!seq.is_array() || seq.size() != 2)
    refuse(path, "pre_tokenizer Sequence of " + std::to_string(seq.is_array() ? seq.size() : 0) +
                     " pre-tokenizers is not supported (" + kSupported + ")");
  const json& split = seq[0];
  if (type_of(split) != "Split")
    refuse(path, "pre_tokenizer Sequence[0] type '" + type_of(split) + "' is not supported (" + kSupported + ")");
  const json& pattern = split.value("pattern", json());
  if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
    refuse(path, "pre_tokenizer Split pattern " + pattern.dump() + " is not supported (" + kSupported + ")");
  if (pattern["Regex"].get<std::string>() != kOlmorefBytesV1Regex)
    refuse(path, "pre_tokenizer Split regex " + pattern["Regex"].dump() +
                     " is not supported (olmoref has no general regex engine; " + kSupported + ")");
  if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", true) != false)
    refuse(path, "pre_tokenizer Split behavior '" + split.value("behavior", std::string("?")) +
                     "' / invert " + split.value("invert", json()).dump() + " is not supported (" + kSupported + ")");
  const json& bl = seq[1];
  if (type_of(bl) != "ByteLevel")
    refuse(path, "pre_tokenizer Sequence[1] type '" + type_of(bl) + "' is not supported (" + kSupported + ")");
  if (bl.value("add_prefix_space", false) != false || bl.value("use_regex", true) != false)
    refuse(path, "pre_tokenizer ByteLevel with add_prefix_space " + bl.value("add_prefix_space", json()).dump() +
                     ", use_regex " + bl.value("use_regex", json()).dump() + " is not supported (" + kSupported + ")");
}

// eos_token / pad_token of a tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> token_text(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> table = [] {
    // GPT-2: printable Latin-1 bytes stand for themselves, the others get U+0100 upward in byte order.
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = utf8(keep ? b : next++);
    }
    return t;
  }();
  return table;
}

std::string hf_tokenizer_json(const data::BpeTokenizer& tok) {
  const data::BpeTokenizer::Spec spec = tok.spec();
  // Every id that stands for bytes, in id order: the bytes, then the merges.
  std::map<uint32_t, std::string> by_id;
  for (uint32_t b = 0; b < 256; ++b) by_id[spec.byte_ids[b]] = tok.token_bytes(spec.byte_ids[b]);
  for (const uint32_t id : spec.merge_ids) by_id[id] = tok.token_bytes(id);
  std::map<std::string, uint32_t> seen;
  ordered_json vocab = ordered_json::object();
  std::map<uint32_t, std::string> specials(spec.specials.begin(), spec.specials.end());
  for (const auto& [id, text] : specials) by_id.emplace(id, text);  // listed in the vocabulary too, as GPT-2 does
  for (const auto& [id, bytes] : by_id) {
    const std::string key = specials.count(id) ? bytes : byte_level(bytes);
    if (const auto it = seen.find(key); it != seen.end())
      throw std::invalid_argument("tokenizer: ids " + std::to_string(it->second) + " and " + std::to_string(id) +
                                  " both stand for '" + printable(bytes) +
                                  "'; a Hugging Face vocabulary maps each string to one id, so this tokenizer cannot "
                                  "be exported (retrain it, or drop the later merge)");
    seen.emplace(key, id);
    vocab[key] = id;
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : spec.merges)
    merges.push_back(ordered_json::array({byte_level(tok.token_bytes(a)), byte_level(tok.token_bytes(b))}));
  ordered_json added = ordered_json::array();
  for (const auto& [id, text] : specials) added.push_back(added_token(id, text));
  const ordered_json byte_level_opts = {{"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  ordered_json pre_bl = {{"type", "ByteLevel"}};
  pre_bl.update(byte_level_opts);
  ordered_json decoder = pre_bl;
  ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         ordered_json::array({ordered_json{{"type", "Split"},
                                           {"pattern", {{"Regex", kOlmorefBytesV1Regex}}},
                                           {"behavior", "Isolated"},
                                           {"invert", false}},
                              pre_bl})}}},
      {"post_processor", nullptr},
      {"decoder", decoder},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return j.dump(2) + "\n";
}

void write_hf_tokenizer(const std::string& dir, const data::BpeTokenizer& tok, int64_t model_max_length) {
  const std::string tokenizer = hf_tokenizer_json(tok);  // may refuse: before anything is written
  const uint32_t eos = tok.eos_id();
  const std::optional<uint32_t> pad = tok.pad_id();
  const std::string eos_text = tok.token_bytes(eos);
  ordered_json decoder = ordered_json::object();
  for (const auto& [id, text] : tok.spec().specials) decoder[std::to_string(id)] = added_token(id, text);
  for (auto& [k, v] : decoder.items()) v.erase("id");
  ordered_json cfg = {
      // The generic fast tokenizer: it takes tokenizer.json as it is (a model-specific class would rebuild the
      // pre-tokenizer from its own defaults).
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"model_max_length", model_max_length},
      {"bos_token", nullptr},
      {"eos_token", eos_text},
      {"pad_token", pad ? json(tok.token_bytes(*pad)) : json(nullptr)},
      {"unk_token", nullptr},
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"clean_up_tokenization_spaces", false},
      // A decoder-only model continues the last token of each row: batched prompts are padded on the left.
      {"padding_side", "left"},
      // olmoref never makes a special token from text: the literal "<|endoftext|>" stays bytes.
      {"split_special_tokens", true},
      {"added_tokens_decoder", decoder},
  };
  ordered_json map = {{"eos_token", eos_text}};
  if (pad) map["pad_token"] = tok.token_bytes(*pad);
  const fs::path d(dir);
  write_text_file_atomic((d / "tokenizer.json").string(), tokenizer);
  write_text_file_atomic((d / "tokenizer_config.json").string(), cfg.dump(2) + "\n");
  write_text_file_atomic((d / "special_tokens_map.json").string(), map.dump(2) + "\n");
}

data::BpeTokenizer::Spec hf_tokenizer_spec(const json& j, const std::string& path) {
  try {
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      refuse(path, "normalizer type '" + type_of(j["normalizer"]) + "' is not supported (supported: none, null)");
    check_pre_tokenizer(j.value("pre_tokenizer", json()), path);
    if (j.contains("post_processor") && !j["post_processor"].is_null() && type_of(j["post_processor"]) != "ByteLevel")
      refuse(path, "post_processor type '" + type_of(j["post_processor"]) +
                       "' is not supported (supported: null or ByteLevel; olmoref adds no BOS/EOS inside a document)");
    const json& m = j.at("model");
    if (type_of(m) != "BPE") refuse(path, "model type '" + type_of(m) + "' is not supported (supported: BPE)");
    if (!m.value("dropout", json()).is_null()) refuse(path, "model.dropout is set; BPE dropout is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && m[k] != "")
        refuse(path, std::string("model.") + k + " " + m[k].dump() + " is not supported (byte-level BPE has none)");
    if (m.value("byte_fallback", false)) refuse(path, "model.byte_fallback true is not supported");
    if (m.value("ignore_merges", false))
      refuse(path, "model.ignore_merges true is not supported (olmoref always applies the merges)");

    const json& vocab = m.at("vocab");
    if (!vocab.is_object()) refuse(path, "model.vocab is not an object");
    std::map<std::string, uint32_t> ids;
    int64_t max_id = -1;
    for (const auto& [k, v] : vocab.items()) {
      if (!v.is_number_unsigned()) refuse(path, "model.vocab['" + k + "'] is not a non-negative id");
      ids[k] = v.get<uint32_t>();
      max_id = std::max<int64_t>(max_id, v.get<uint32_t>());
    }
    data::BpeTokenizer::Spec spec;
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      const auto it = ids.find(chars[b]);
      if (it == ids.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", b);
        refuse(path, std::string("model.vocab has no token for byte ") + hex + " ('" + chars[b] +
                         "'): not a complete byte-level BPE");
      }
      spec.byte_ids[b] = it->second;
    }
    auto id_of = [&](const std::string& s, const std::string& where) {
      const auto it = ids.find(s);
      if (it == ids.end()) refuse(path, where + ": '" + s + "' is not in model.vocab");
      return it->second;
    };
    const json& merges = m.at("merges");
    if (!merges.is_array()) refuse(path, "model.merges is not an array");
    for (size_t i = 0; i < merges.size(); ++i) {
      std::string a, b;
      const json& e = merges[i];
      if (e.is_string()) {  // the older "left right" form
        const std::string s = e.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          refuse(path, "model.merges[" + std::to_string(i) + "] '" + s + "' is not two tokens separated by a space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        refuse(path, "model.merges[" + std::to_string(i) + "] is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const std::string where = "model.merges[" + std::to_string(i) + "]";
      spec.merges.emplace_back(id_of(a, where), id_of(b, where));
      spec.merge_ids.push_back(id_of(a + b, where + " result"));
    }

    std::map<std::string, uint32_t> special_ids;
    for (const json& t : j.value("added_tokens", json::array())) {
      const std::string content = t.at("content").get<std::string>();
      const uint32_t id = t.at("id").get<uint32_t>();
      if (!t.value("special", false))
        refuse(path, "added token '" + content + "' (id " + std::to_string(id) +
                         ") is not special: olmoref does not split text on added tokens (supported: special tokens only, "
                         "which never come from text)");
      if (const auto it = ids.find(content); it != ids.end() && it->second != id)
        refuse(path, "added token '" + content + "' has id " + std::to_string(id) + " but model.vocab gives it " +
                         std::to_string(it->second));
      spec.specials.emplace_back(id, content);
      special_ids[content] = id;
      max_id = std::max<int64_t>(max_id, id);
    }
    spec.vocab_size = max_id + 1;

    // EOS / PAD: the tokenizer_config.json beside the file names them for transformers; else the usual names.
    json cfg;
    const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg_path)) {
      std::ifstream in(cfg_path);
      try {
        cfg = json::parse(in);
      } catch (const json::exception& e) {
        throw std::runtime_error(cfg_path.string() + ": not valid JSON (" + e.what() + ")");
      }
    }
    auto special = [&](const char* key, const char* fallback) -> std::optional<uint32_t> {
      const std::optional<std::string> text = token_text(cfg, key);
      const std::string name = text ? *text : fallback;
      const auto it = special_ids.find(name);
      if (it == special_ids.end()) {
        if (text)
          throw std::runtime_error(cfg_path.string() + ": " + key + " '" + name + "' is not a special added token of " +
                                   path);
        return std::nullopt;
      }
      return it->second;
    };
    const std::optional<uint32_t> eos = special("eos_token", "<|endoftext|>");
    if (!eos)
      refuse(path, "no EOS token: none of the special added tokens is <|endoftext|> and no tokenizer_config.json "
                   "beside it names an eos_token (documents must end in EOS)");
    spec.eos = *eos;
    spec.pad = special("pad_token", "<|pad|>");
    return spec;
  } catch (const json::exception& e) {
    refuse(path, std::string("not a Hugging Face tokenizer.json of the expected shape (") + e.what() + ")");
  }
}

data::BpeTokenizer load_tokenizer(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("tokenizer '" + path + "': cannot open; train one with `olmoref tokenize --vocab-size N`");
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error("tokenizer '" + path + "': not valid JSON (" + e.what() + ")");
  }
  if (!(j.is_object() && !j.contains("format") && j.contains("model") && j["model"].is_object()))
    return data::BpeTokenizer::from_json(j, path);
  const data::BpeTokenizer::Spec spec = hf_tokenizer_spec(j, path);
  try {
    return data::BpeTokenizer(spec);
  } catch (const std::exception& e) {
    throw std::runtime_error("tokenizer '" + path + "': " + e.what() +
                             " (olmoref applies merges by rank and needs the parts of every merge to exist before "
                             "it, as BPE training makes them)");
  }
}

}  // namespace olmoref::interop
