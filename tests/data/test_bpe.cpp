// tests/data/test_bpe.cpp — pre-tokenizer, BPE training/encode/decode, the tokenize and data CLI.
#include <doctest.h>

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/bpe.h"
#include "cli/data_commands.h"
#include "data/holdout.h"
#include "data/mix.h"
#include "data/token_file.h"
#include "data_test_util.h"

using namespace olmoref::data;
using olmoref::data::testing::TempDir;
using olmoref::data::testing::write_bytes;

namespace {

std::vector<std::string> chunks_of(std::string_view text) {
  std::vector<std::string> out;
  pretokenize(text, [&](std::string_view c) { out.emplace_back(c); });
  return out;
}

const char* kCorpus[] = {
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
    "In the beginning God created the heaven and the earth. And the earth was without form, and void.",
    "The the the THE then there these those 1234 5678 -- ... !!! ??",
    "Unicode: na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xce\xbb\xcf\x8c\xce\xb3\xce\xbf\xcf\x82",
};

int run_cli(std::vector<std::string> args) {
  CLI::App app{"olmoref"};
  register_data_commands(app);
  std::vector<const char*> argv{"olmoref"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Error& e) {
    return app.exit(e);
  }
  return 0;
}

// run_cli, and what the command printed on stderr (its "error: ..." line).
std::pair<int, std::string> run_cli_stderr(const std::vector<std::string>& args) {
  std::fflush(stderr);
  std::cerr.flush();
  char path[] = "/tmp/olmoref-cli-stderr-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  const int rc = run_cli(args);
  std::fflush(stderr);
  std::cerr.flush();
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(path);
  return {rc, text};
}

}  // namespace

TEST_CASE("data mix --olmo-core without a base directory or tokenizer names the flags that exist") {
  TempDir tmp;
  olmoref::data::testing::write_tokens(tmp.file("a.u16"), {1, 2, 3}, Dtype::u16);
  const auto [rc, err] = run_cli_stderr({"data", "mix", tmp.file("a.u16"), "--out", tmp.file("oc.txt"), "--olmo-core"});
  CHECK(rc == 1);
  CHECK(err.find("--mix-base-dir") != std::string::npos);
  CHECK(err.find("--mix-tokenizer") != std::string::npos);
  CHECK(err.find("--base-dir,") == std::string::npos);
  CHECK(err.find("--tokenizer-dir") == std::string::npos);
  const auto [rc2, err2] = run_cli_stderr({"data", "mix", tmp.file("a.u16"), "--out", tmp.file("oc.txt"), "--olmo-core",
                                           "--mix-base-dir", tmp.path.string()});
  CHECK(rc2 == 1);
  CHECK(err2.find("--mix-tokenizer") != std::string::npos);
  CHECK(err2.find("--mix-base-dir") == std::string::npos);  // given: only the missing flag is named
  CHECK_FALSE(std::filesystem::exists(tmp.file("oc.txt")));
}

TEST_CASE("pre-tokenizer: GPT-2-like chunks that cover every byte") {
  CHECK(chunks_of("Hello  world\n\n 42!?") ==
        std::vector<std::string>{"Hello", " ", " world", "\n\n", " 42", "!?"});
  CHECK(chunks_of("a\tb  ") == std::vector<std::string>{"a", "\t", "b", "  "});
  CHECK(chunks_of(" caf\xc3\xa9.") == std::vector<std::string>{" caf\xc3\xa9", "."});
  CHECK(chunks_of("").empty());
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  all += "  x \n y";
  std::string joined;
  for (const auto& c : chunks_of(all)) joined += c;
  CHECK(joined == all);
}

TEST_CASE("BPE training is deterministic, respects the vocabulary, breaks ties by smallest pair") {
  std::vector<std::string_view> docs(std::begin(kCorpus), std::end(kCorpus));
  BpeTokenizer::TrainOptions o;
  o.vocab_size = 300;
  const BpeTokenizer a = BpeTokenizer::train(docs, o);
  const BpeTokenizer b = BpeTokenizer::train(docs, o);
  CHECK(a.merges() == b.merges());
  CHECK(a.vocab_size() == 300);
  CHECK(a.n_merges() <= 300 - 258);
  CHECK(a.n_merges() > 10);

  // "ab" and " cd" once each: all three pairs tie at count 1; (' ', 'c') = (32, 99) is smallest.
  const std::vector<std::string_view> tie{"ab cd"};
  o.min_pair_count = 1;
  o.vocab_size = 259;
  const BpeTokenizer t = BpeTokenizer::train(tie, o);
  REQUIRE(t.n_merges() == 1);
  CHECK(t.merges()[0] == std::pair<uint32_t, uint32_t>{32, 99});

  // Counts decide first: ("t","h") and ("h","e") both occur 6 times, (" ","t") 5 times; of the
  // two tied leaders ("h","e") = (104, 101) is the smaller pair.
  o.vocab_size = 259;
  o.min_pair_count = 2;
  const std::vector<std::string_view> en{"the then these there the the"};
  const BpeTokenizer e = BpeTokenizer::train(en, o);
  REQUIRE(e.n_merges() == 1);
  CHECK(e.token_bytes(258) == "he");
}

TEST_CASE("encode/decode round-trip, save/load round-trip") {
  std::vector<std::string_view> docs(std::begin(kCorpus), std::end(kCorpus));
  BpeTokenizer::TrainOptions o;
  o.vocab_size = 400;
  const BpeTokenizer tok = BpeTokenizer::train(docs, o);
  for (const char* d : kCorpus) {
    const std::vector<uint32_t> ids = tok.encode(d);
    CHECK(ids.size() < std::string_view(d).size());  // it compresses
    for (uint32_t id : ids) CHECK(id < 400);
    for (uint32_t id : ids) CHECK(id != tok.eos_id());
    CHECK(tok.decode(ids) == d);
  }
  std::string bytes;
  uint32_t x = 1;
  for (int i = 0; i < 5000; ++i) bytes += static_cast<char>((x = x * 1103515245u + 12345u) >> 24);
  CHECK(tok.decode(tok.encode(bytes)) == bytes);
  CHECK(tok.decode(std::vector<uint32_t>{tok.eos_id()}) == "<|endoftext|>");

  TempDir tmp;
  tok.save(tmp.file("tok.json"));
  const BpeTokenizer back = BpeTokenizer::load(tmp.file("tok.json"));
  CHECK(back.merges() == tok.merges());
  CHECK(back.vocab_size() == tok.vocab_size());
  for (const char* d : kCorpus) CHECK(back.encode(d) == tok.encode(d));

  write_bytes(tmp.file("bad.json"), "{\"format\": \"something-else\"}");
  CHECK_THROWS_WITH(BpeTokenizer::load(tmp.file("bad.json")), doctest::Contains(tmp.file("bad.json").c_str()));
  CHECK_THROWS_WITH(BpeTokenizer::load(tmp.file("missing.json")), doctest::Contains(tmp.file("missing.json").c_str()));
}

TEST_CASE("olmoref tokenize: BPE on the train side, EOS-terminated token files, mixes, split manifest") {
  TempDir tmp;
  std::string text;
  for (int i = 0; i < 300; ++i) {
    text += "Fortune number " + std::to_string(i) + ": " + kCorpus[i % 6] + "\n";
    if (i % 3 == 0) text += "  -- indented attribution\n";
    text += "%\n";
  }
  write_bytes(tmp.file("fortunes.txt"), text);
  const std::string out = tmp.file("corpus");
  REQUIRE(run_cli({"tokenize", "--input", tmp.file("fortunes.txt"), "--tokenizer", out + "/tokenizer.json",
                   "--vocab-size", "512", "--out-dir", out, "--holdout-fraction", "0.1", "--seed", "5",
                   "--tokens-per-file", "3000"}) == 0);
  const BpeTokenizer tok = BpeTokenizer::load(out + "/tokenizer.json");
  const Mix train = Mix::parse_file(out + "/train.mix");
  const Mix hold = Mix::parse_file(out + "/holdout.mix");
  CHECK(train.size() > 1);
  const HoldoutSpec spec = HoldoutSpec::from_manifest(out + "/split.json");
  CHECK(spec.kind == HoldoutKind::document_split);

  // Decode every document and check it is an input document on the side the rule says.
  std::set<std::string> seen;
  auto check_side = [&](const Mix& mix, bool holdout) {
    int64_t n = 0;
    for (const auto& e : mix.entries) {
      const TokenFile f(e.path, Dtype::u16);
      REQUIRE(f.n_tokens() > 0);
      CHECK(f.token(f.n_tokens() - 1) == BpeTokenizer::kEos);
      std::vector<uint32_t> doc;
      for (int64_t i = 0; i < f.n_tokens(); ++i) {
        if (f.token(i) != BpeTokenizer::kEos) {
          doc.push_back(f.token(i));
          continue;
        }
        const std::string s = tok.decode(doc);
        CHECK(s.rfind("Fortune number ", 0) == 0);
        CHECK(is_holdout_document(s.data(), s.size(), 5, 0.1) == holdout);
        CHECK(seen.insert(s).second);
        doc.clear();
        ++n;
      }
    }
    return n;
  };
  const int64_t n_train = check_side(train, false), n_hold = check_side(hold, true);
  CHECK(n_train + n_hold == 300);
  CHECK(n_hold > 10);

  // data inspect and data order run on the result; a bad path is an error exit.
  CHECK(run_cli({"data", "inspect", out + "/train.mix", "--tokenizer", out + "/tokenizer.json", "--seq-len", "64"}) == 0);
  CHECK(run_cli({"data", "order", "--n", "10"}) == 0);
  CHECK(run_cli({"data", "inspect", tmp.file("nope.npy"), "--vocab-size", "512"}) == 1);
}
