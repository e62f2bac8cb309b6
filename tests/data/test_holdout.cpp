// tests/data/test_holdout.cpp — the deterministic document-level train/holdout split.
#include <doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <fstream>

#include "data/dataset.h"
#include "data/holdout.h"
#include "data_test_util.h"

using namespace olmoref::data;
using olmoref::data::testing::TempDir;
using olmoref::data::testing::write_tokens;

namespace {

constexpr uint32_t kEos = 1;

// Documents of the files in a mix, each with its trailing EOS.
std::vector<std::vector<uint32_t>> documents_of(const Mix& mix, Dtype dtype) {
  std::vector<std::vector<uint32_t>> docs;
  for (const auto& e : mix.entries) {
    const TokenFile f(e.path, dtype);
    std::vector<uint32_t> d;
    for (int64_t i = 0; i < f.n_tokens(); ++i) {
      d.push_back(f.token(i));
      if (f.token(i) == kEos) docs.push_back(std::move(d)), d.clear();
    }
    if (!d.empty()) docs.push_back(d);
  }
  return docs;
}

// 2000 documents of 1..40 tokens over two files; documents 0..9 are repeated at the end, and
// the second file lacks a final EOS.
Mix make_corpus(const TempDir& tmp) {
  std::vector<std::vector<uint32_t>> docs;
  uint64_t x = 12345;
  for (int d = 0; d < 2000; ++d) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::vector<uint32_t> doc(1 + (x >> 33) % 40);
    for (auto& t : doc) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      t = 2 + static_cast<uint32_t>((x >> 33) % 3000);
    }
    doc.push_back(kEos);
    docs.push_back(doc);
  }
  for (int d = 0; d < 10; ++d) docs.push_back(docs[static_cast<size_t>(d)]);
  std::vector<uint32_t> a, b;
  for (size_t d = 0; d < docs.size(); ++d) {
    auto& out = d < 1000 ? a : b;
    out.insert(out.end(), docs[d].begin(), docs[d].end());
  }
  b.pop_back();  // the last document has no EOS
  write_tokens(tmp.file("in-a.npy"), a, Dtype::u16);
  write_tokens(tmp.file("in-b.npy"), b, Dtype::u16);
  return Mix::from_paths({tmp.file("in-a.npy"), tmp.file("in-b.npy")});
}

}  // namespace

TEST_CASE("document split: disjoint, complete, deterministic, duplicates on one side") {
  TempDir tmp;
  const Mix input = make_corpus(tmp);
  SplitOptions o;
  o.fraction = 0.1;
  o.seed = 7;
  o.max_tokens_per_file = 5000;  // several output files per side
  const SplitReport r = split_documents(input, Dtype::u16, kEos, Dtype::u32, tmp.file("out"), o);
  CHECK(r.train.size() > 1);
  CHECK(r.holdout_documents + r.train_documents == 2010);
  CHECK(r.holdout_documents > 150);
  CHECK(r.holdout_documents < 260);

  const auto in_docs = documents_of(input, Dtype::u16);
  const auto train = documents_of(Mix::parse_file(tmp.file("out/train.mix")), Dtype::u32);
  const auto hold = documents_of(Mix::parse_file(tmp.file("out/holdout.mix")), Dtype::u32);
  CHECK(static_cast<int64_t>(train.size()) == r.train_documents);
  CHECK(static_cast<int64_t>(hold.size()) == r.holdout_documents);

  // Disjoint: no holdout document occurs on the training side.
  std::set<std::vector<uint32_t>> hold_set(hold.begin(), hold.end());
  for (const auto& d : train) CHECK(hold_set.count(d) == 0);
  // Complete, as a multiset, and each side keeps the input order.
  std::multiset<std::vector<uint32_t>> all_in(in_docs.begin(), in_docs.end()), all_out(train.begin(), train.end());
  all_out.insert(hold.begin(), hold.end());
  CHECK(all_in == all_out);
  // Every document is where the rule says.
  for (const auto& d : hold) CHECK(is_holdout_document(d, o.seed, o.fraction));
  for (const auto& d : train) CHECK_FALSE(is_holdout_document(d, o.seed, o.fraction));

  // Deterministic: the same split twice gives byte-identical files.
  const SplitReport r2 = split_documents(input, Dtype::u16, kEos, Dtype::u32, tmp.file("out2"), o);
  REQUIRE(r2.train.size() == r.train.size());
  for (size_t i = 0; i < r.train.size(); ++i) {
    std::ifstream f1(r.train.entries[i].path, std::ios::binary), f2(r2.train.entries[i].path, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(f1), {}) == std::string(std::istreambuf_iterator<char>(f2), {}));
  }

  // The manifest reads back as a document-split holdout.
  const HoldoutSpec spec = HoldoutSpec::from_manifest(tmp.file("out/split.json"));
  CHECK(spec.kind == HoldoutKind::document_split);
  CHECK(spec.fraction == doctest::Approx(0.1));
  CHECK(spec.seed == 7);
  CHECK(spec.mix.size() == r.holdout.size());
  CHECK(spec.describe().find("document-split") != std::string::npos);
  std::ifstream mf(tmp.file("out/split.json"));
  const nlohmann::json m = nlohmann::json::parse(mf);
  CHECK(m["hashed_bytes"] == "uint32-le-token-ids");
  CHECK(m["documents"]["holdout"] == r.holdout_documents);

  // The training side is an ordinary mix: instances cut exactly as OLMo-core would.
  DatasetOptions d;
  d.sequence_length = 16;
  d.vocab_size = 3002;
  d.dtype = Dtype::u32;
  const FslDataset train_ds(r.train, d);
  CHECK(train_ds.size() > 0);
}

TEST_CASE("holdout threshold edges") {
  const std::vector<uint32_t> doc{5, 6, 7, 1};
  CHECK_FALSE(is_holdout_document(doc, 1, 0.0));
  CHECK(is_holdout_document(doc, 1, 1.0));
  CHECK(holdout_threshold(0.5) == (uint64_t{1} << 63));
  CHECK_THROWS(holdout_threshold(1.5));
  TempDir tmp;
  const Mix input = make_corpus(tmp);
  SplitOptions o;
  o.fraction = 0.0;
  CHECK_THROWS_WITH(split_documents(input, Dtype::u16, kEos, Dtype::u16, tmp.file("o"), o),
                    doctest::Contains("holdout side empty"));
}
