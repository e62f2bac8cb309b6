// tests/interop/hf_unit.cpp — the Hugging Face tokenizer files and the [init] provenance without Python: the
// ByteLevel alphabet, tokenizer.json written and read back (also with ids in another layout), every refusal naming
// the unsupported part and the file, the eos/pad/bos ids of config.json and generation_config.json, and how
// init.hf_dir / init.hf_sha256 enter resume_hash. hf_roundtrip.sh checks the same files against HF's own code.
#include <doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "data/bpe.h"
#include "interop/hf_export.h"
#include "interop/hf_tokenizer.h"
#include "tests/common/test_util.h"
#include "train/config.h"

using namespace olmoref;
using data::BpeTokenizer;
using nlohmann::json;

namespace {

struct Dir : testing::TempDir {
  Dir() : TempDir("hf-unit") {}
};

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

const char* kDocs[] = {
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "In the beginning God created the heaven and the earth.\n\n  And the earth was without form, and void.",
    "Numbers 1234 5678 -- ... !!! ?? (parens) [brackets] tabs\there  two  spaces\n",
    "Unicode: na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xce\xbb\xcf\x8c\xce\xb3\xce\xbf\xcf\x82 the the the",
};

BpeTokenizer trained() {
  std::vector<std::string_view> docs;
  for (int r = 0; r < 20; ++r)
    for (const char* d : kDocs) docs.push_back(d);
  BpeTokenizer::TrainOptions o;
  o.vocab_size = 400;
  return BpeTokenizer::train(docs, o);
}

std::vector<std::string> random_texts() {
  std::mt19937 rng(7);
  const std::string alpha = std::string(" \t\n\r\v\fabthe9Z.-,!\x01\x7f", 22) + "\xc3\xa9";
  std::vector<std::string> out(kDocs, kDocs + 4);
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) s += alpha[rng() % alpha.size()];
    out.push_back(s);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);  // every byte, invalid UTF-8 included
  out.push_back(all);
  return out;
}

using testing::error_of;

}  // namespace

TEST_CASE("ByteLevel alphabet: GPT-2's bytes_to_unicode") {
  const auto& c = interop::byte_level_chars();
  std::set<std::string> distinct(c.begin(), c.end());
  CHECK(distinct.size() == 256);
  CHECK(c['a'] == "a");
  CHECK(c['!'] == "!");
  CHECK(c[' '] == "\xc4\xa0");    // U+0120 'Ġ'
  CHECK(c['\n'] == "\xc4\x8a");   // U+010A 'Ċ'
  CHECK(c[0] == "\xc4\x80");      // U+0100
  CHECK(c[0xAD] == "\xc5\x83");   // U+0143, the last stand-in
  CHECK(c[0xE9] == "\xc3\xa9");   // printable Latin-1 stands for itself
}

TEST_CASE("tokenizer.json: written, read back by olmoref, same ids on any bytes") {
  const BpeTokenizer tok = trained();
  Dir d;
  interop::write_hf_tokenizer(d.path.string(), tok, 256);
  const json j = json::parse(std::ifstream(d.file("tokenizer.json")));
  CHECK(j["model"]["type"] == "BPE");
  CHECK(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == interop::kOlmorefBytesV1Regex);
  CHECK(j["model"]["merges"].size() == tok.n_merges());
  CHECK(j["added_tokens"].size() == 2);
  const json cfg = json::parse(std::ifstream(d.file("tokenizer_config.json")));
  CHECK(cfg["eos_token"] == "<|endoftext|>");
  CHECK(cfg["pad_token"] == "<|pad|>");
  CHECK(cfg["bos_token"].is_null());
  CHECK(cfg["model_max_length"] == 256);

  const BpeTokenizer back = interop::load_tokenizer(d.file("tokenizer.json"));
  CHECK(back.eos_id() == 256);
  CHECK(back.pad_id() == std::optional<uint32_t>(257));
  CHECK(back.n_merges() == tok.n_merges());
  CHECK(back.has_olmoref_layout());
  for (const auto& t : random_texts()) {
    REQUIRE(back.encode(t) == tok.encode(t));
    CHECK(back.decode(back.encode(t)) == t);
  }

  SUBCASE("negative control: one merge fewer gives other ids") {
    json k = j;
    k["model"]["merges"].erase(k["model"]["merges"].end() - 1);
    write(d.file("fewer.json"), k.dump());
    const BpeTokenizer fewer = interop::load_tokenizer(d.file("fewer.json"));
    int differ = 0;
    for (int r = 0; r < 20; ++r)
      for (const char* t : kDocs) differ += fewer.encode(t) != tok.encode(t);
    CHECK(differ > 0);
  }
}

TEST_CASE("tokenizer.json with ids in another layout (EOS first, bytes after)") {
  const BpeTokenizer tok = trained();
  Dir d;
  interop::write_hf_tokenizer(d.path.string(), tok, 64);
  json j = json::parse(std::ifstream(d.file("tokenizer.json")));
  // New id = old id + 3 for every token, EOS moved to 0, PAD to 1: nothing left in olmoref's positions.
  auto remap = [](uint32_t id) -> uint32_t { return id == 256 ? 0 : id == 257 ? 1 : id + 3; };
  for (auto& [k, v] : j["model"]["vocab"].items()) v = remap(v.get<uint32_t>());
  for (auto& t : j["added_tokens"]) t["id"] = remap(t["id"].get<uint32_t>());
  write(d.file("tokenizer.json"), j.dump());
  std::filesystem::remove(d.file("tokenizer_config.json"));  // EOS/PAD from the usual added-token names
  const BpeTokenizer back = interop::load_tokenizer(d.file("tokenizer.json"));
  CHECK(back.eos_id() == 0);
  CHECK(back.pad_id() == std::optional<uint32_t>(1));
  CHECK_FALSE(back.has_olmoref_layout());
  for (const auto& t : random_texts()) {
    std::vector<uint32_t> want = tok.encode(t);
    for (auto& id : want) id = remap(id);
    REQUIRE(back.encode(t) == want);
  }
  CHECK(error_of([&] { back.save(d.file("x.json")); }).find("olmoref-bpe-v1 layout") != std::string::npos);
  // And it exports again to the same vocabulary.
  Dir d2;
  interop::write_hf_tokenizer(d2.path.string(), back, 64);
  CHECK(json::parse(std::ifstream(d2.file("tokenizer.json")))["model"]["vocab"] == j["model"]["vocab"]);
}

TEST_CASE("tokenizer.json refusals name the unsupported part and the file") {
  const BpeTokenizer tok = trained();
  Dir d;
  interop::write_hf_tokenizer(d.path.string(), tok, 64);
  const json base = json::parse(std::ifstream(d.file("tokenizer.json")));
  auto refusal = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    const std::string p = d.file("edited.json");
    write(p, j.dump());
    const std::string m = error_of([&] { interop::load_tokenizer(p); });
    CHECK(m.find(p) != std::string::npos);
    return m;
  };
  CHECK(refusal([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}}; })
            .find("pre_tokenizer type 'Metaspace' is not supported (supported: Sequence[Split(") != std::string::npos);
  CHECK(refusal([](json& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}}; })
            .find("pre_tokenizer type 'ByteLevel' alone") != std::string::npos);
  CHECK(refusal([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; })
            .find("pre_tokenizer Split regex \"\\\\s+\" is not supported") != std::string::npos);
  CHECK(refusal([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; })
            .find("pre_tokenizer ByteLevel with add_prefix_space false, use_regex true") != std::string::npos);
  CHECK(refusal([](json& j) { j["pre_tokenizer"] = nullptr; }).find("pre_tokenizer is null") != std::string::npos);
  CHECK(refusal([](json& j) { j["normalizer"] = {{"type", "NFC"}}; })
            .find("normalizer type 'NFC' is not supported") != std::string::npos);
  CHECK(refusal([](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; })
            .find("post_processor type 'TemplateProcessing' is not supported") != std::string::npos);
  CHECK(refusal([](json& j) { j["model"]["type"] = "WordPiece"; }).find("model type 'WordPiece'") != std::string::npos);
  CHECK(refusal([](json& j) { j["model"]["ignore_merges"] = true; }).find("model.ignore_merges") != std::string::npos);
  CHECK(refusal([](json& j) { j["added_tokens"][0]["special"] = false; })
            .find("added token '<|endoftext|>' (id 256) is not special") != std::string::npos);
  CHECK(refusal([](json& j) { j["model"]["vocab"].erase("A"); }).find("no token for byte 0x41") != std::string::npos);
  CHECK(refusal([](json& j) { j["added_tokens"] = json::array(); j["model"]["vocab"].erase("<|endoftext|>"); })
            .find("eos_token '<|endoftext|>' is not a special added token of") != std::string::npos);
  std::filesystem::remove(d.file("tokenizer_config.json"));  // then nothing names an EOS at all
  CHECK(refusal([](json& j) { j["added_tokens"] = json::array(); j["model"]["vocab"].erase("<|endoftext|>"); })
            .find("no EOS token") != std::string::npos);
  // A merge whose part a later merge creates (HF allows it; olmoref's rank-ordered encoding would differ).
  CHECK(refusal([](json& j) {
          auto& m = j["model"]["merges"];
          const json first = m[0];
          m.erase(m.begin());
          m.push_back(first);
        }).find("refers to a special token or a later merge") != std::string::npos);
}

TEST_CASE("export refuses a tokenizer whose two ids stand for the same bytes") {
  Dir d;
  // "ab"+"c" and "a"+"bc" both make "abc": a Hugging Face vocabulary cannot hold both ids.
  write(d.file("dup.json"), R"({"format": "olmoref-bpe-v1", "vocab_size": 300, "eos_id": 256, "pad_id": 257,
    "pretokenizer": "olmoref-bytes-v1", "merges": [[97, 98], [98, 99], [258, 99], [97, 259]]})");
  const BpeTokenizer tok = interop::load_tokenizer(d.file("dup.json"));
  const std::string m = error_of([&] { interop::hf_tokenizer_json(tok); });
  CHECK(m.find("ids 260 and 261 both stand for 'abc'") != std::string::npos);
}

TEST_CASE("config.json and generation_config.json: ids of the tokenizer, else of dolma2") {
  ModelConfig m{.name = "t", .vocab_size = 512, .d_model = 16, .n_layers = 2, .n_heads = 2, .n_kv_heads = 2,
                .head_dim = 8, .ffn_hidden = 32, .swa_pattern = {-1}, .moe = {}};
  const BpeTokenizer tok = trained();
  HfExportOptions o;
  o.tokenizer = &tok;
  for (const std::string& text : {hf_config_json(m, o), hf_generation_config_json(m, o)}) {
    const json c = json::parse(text);
    CHECK(c["eos_token_id"] == 256);
    CHECK(c["pad_token_id"] == 257);
    CHECK(c["bos_token_id"].is_null());
  }
  const json plain = json::parse(hf_generation_config_json(m, {}));  // dolma2's 100257 does not fit: null
  CHECK(plain["eos_token_id"].is_null());
  const int64_t top = 257 + static_cast<int64_t>(tok.n_merges());  // the last merge's id
  REQUIRE(top > 300);
  m.vocab_size = top;  // one row short
  CHECK(error_of([&] { hf_config_json(m, o); }).find("uses id " + std::to_string(top) + " but model.vocab_size is " +
                                                       std::to_string(top)) != std::string::npos);
}

TEST_CASE("[init]: absent changes nothing; the SHA-256 is part of resume_hash, the directory is not") {
  const std::string base = R"([model]
vocab_size = 512
d_model = 16
n_layers = 2
n_heads = 2
[train]
seq_len = 16
)";
  const TrainConfig plain = parse_config_text(base, "t.toml");
  CHECK(plain.to_toml().find("[init]") == std::string::npos);
  const std::string sha(64, 'a');
  const TrainConfig a = parse_config_text(base, "t.toml", {"init.hf_dir=\"/x\"", "init.hf_sha256=\"" + sha + "\""});
  const TrainConfig b = parse_config_text(base, "t.toml", {"init.hf_dir=\"/elsewhere\"", "init.hf_sha256=\"" + sha + "\""});
  const TrainConfig c = parse_config_text(base, "t.toml", {"init.hf_sha256=\"" + std::string(64, 'b') + "\""});
  CHECK(a.resume_hash() != plain.resume_hash());
  CHECK(a.resume_hash() == b.resume_hash());
  CHECK(a.resume_hash() != c.resume_hash());
  CHECK(a.model_hash() == plain.model_hash());
  const TrainConfig again = parse_config_text(a.to_toml(), "resolved.toml");
  CHECK(again.init.hf_sha256 == sha);
  CHECK(again.resume_hash() == a.resume_hash());
  CHECK(error_of([&] { parse_config_text(base, "t.toml", {"init.hf_sha256=\"xyz\""}); })
            .find("init.hf_sha256") != std::string::npos);
  CHECK(error_of([&] { parse_config_text(base, "t.toml", {"init.typo=1"}); }).find("init.typo") != std::string::npos);
}
