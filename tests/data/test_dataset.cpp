// tests/data/test_dataset.cpp — token files, mixes, fixed-length instances, fingerprints, bad input.
#include <doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "data/dataset.h"
#include "data/mix.h"
#include "data/token_file.h"
#include "data_test_util.h"

using namespace olmoref::data;
using olmoref::data::testing::pattern_tokens;
using olmoref::data::testing::TempDir;
using olmoref::data::testing::write_bytes;
using olmoref::data::testing::write_tokens;

namespace {
DatasetOptions opts(int64_t seq_len, int64_t vocab, std::optional<Dtype> dtype = std::nullopt) {
  DatasetOptions o;
  o.sequence_length = seq_len;
  o.vocab_size = vocab;
  o.dtype = dtype;
  return o;
}
}  // namespace

TEST_CASE("dtype follows the vocabulary size like OLMo-core's get_dtype") {
  CHECK(dtype_for_vocab(2048) == Dtype::u16);
  CHECK(dtype_for_vocab(65536) == Dtype::u16);
  CHECK(dtype_for_vocab(65537) == Dtype::u32);
  CHECK(dtype_for_vocab(100278) == Dtype::u32);  // dolma2 / Olmo 3
  CHECK(parse_dtype("uint16") == Dtype::u16);
  CHECK(parse_dtype("u32") == Dtype::u32);
  CHECK_THROWS_WITH(parse_dtype("int8"), doctest::Contains("uint16 or uint32"));
}

TEST_CASE("token files are read as little-endian uint16 and uint32") {
  TempDir tmp;
  write_bytes(tmp.file("a16"), std::string("\x01\x02\xff\xff\x00\x00", 6));
  write_bytes(tmp.file("a32"), std::string("\x01\x02\x03\x04\xff\xff\xff\x7f", 8));
  const TokenFile a16(tmp.file("a16"), Dtype::u16);
  CHECK(a16.n_tokens() == 3);
  CHECK(a16.token(0) == 0x0201u);
  CHECK(a16.token(1) == 0xffffu);
  CHECK(a16.token(2) == 0u);
  const TokenFile a32(tmp.file("a32"), Dtype::u32);
  CHECK(a32.n_tokens() == 2);
  CHECK(a32.token(0) == 0x04030201u);
  CHECK(a32.token(1) == 0x7fffffffu);

  // The writer produces the same layout, and refuses ids that do not fit.
  write_tokens(tmp.file("w16"), {0x0201, 0xffff, 0}, Dtype::u16);
  std::ifstream in(tmp.file("w16"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(bytes == std::string("\x01\x02\xff\xff\x00\x00", 6));
  TokenFileWriter w(tmp.file("bad16"), Dtype::u16);
  const std::vector<uint32_t> big{70000};
  CHECK_THROWS_WITH(w.write(big), doctest::Contains("does not fit uint16"));
}

TEST_CASE("instances: whole chunks per file, tails dropped, ids concatenate files in mix order") {
  for (Dtype dtype : {Dtype::u16, Dtype::u32}) {
    CAPTURE(dtype_name(dtype));
    TempDir tmp;
    // 3 files of 25, 10 and 33 tokens; L = 8 gives 3 + 1 + 4 instances.
    const std::vector<int64_t> lens{25, 10, 33};
    std::vector<std::string> paths;
    for (size_t f = 0; f < lens.size(); ++f) {
      char name[32];  // not "f" + std::to_string(f): GCC 12 -O3 warns falsely (-Wrestrict) on that
      std::snprintf(name, sizeof name, "f%zu.npy", f);
      paths.push_back(tmp.file(name));
      write_tokens(paths.back(), pattern_tokens(lens[f], static_cast<uint32_t>(f), 60000), dtype);
    }
    const FslDataset ds(Mix::from_paths(paths), opts(8, 60000, dtype));
    CHECK(ds.size() == 8);
    CHECK(ds.n_files() == 3);
    CHECK(ds.file_first_instance(0) == 0);
    CHECK(ds.file_first_instance(1) == 3);
    CHECK(ds.file_first_instance(2) == 4);
    CHECK(ds.file_instances(2) == 4);
    CHECK(ds.n_tokens_total() == 68);
    const std::vector<std::pair<int32_t, int64_t>> expect{{0, 0}, {0, 8}, {0, 16}, {1, 0}, {2, 0}, {2, 8}, {2, 16}, {2, 24}};
    for (int64_t id = 0; id < ds.size(); ++id) {
      const auto loc = ds.locate(id);
      CHECK(loc.file == expect[static_cast<size_t>(id)].first);
      CHECK(loc.token_start == expect[static_cast<size_t>(id)].second);
      const std::vector<uint32_t> want = pattern_tokens(loc.token_start + 8, static_cast<uint32_t>(loc.file), 60000);
      CHECK(ds.instance(id) == std::vector<uint32_t>(want.begin() + loc.token_start, want.end()));
    }
    CHECK_THROWS_AS(ds.locate(8), std::out_of_range);
    CHECK_THROWS_AS(ds.locate(-1), std::out_of_range);
  }
}

TEST_CASE("64-bit token offsets: an instance beyond 2^32 tokens of a sparse uint16 file") {
  TempDir tmp;
  const std::string path = tmp.file("huge.npy");
  const int64_t n_tokens = (int64_t{1} << 32) + (int64_t{1} << 22);  // 8 GiB + 8 MiB, sparse on disk
  {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, n_tokens * 2) == 0);
    const uint16_t marker[4] = {11, 22, 33, 44};
    const int64_t at = n_tokens - 1024;  // first tokens of the last instance
    REQUIRE(::pwrite(fd, marker, sizeof marker, at * 2) == static_cast<ssize_t>(sizeof marker));
    ::close(fd);
  }
  const FslDataset ds(Mix::from_paths({path}), opts(1024, 50000));
  CHECK(ds.size() == n_tokens / 1024);
  const auto loc = ds.locate(ds.size() - 1);
  CHECK(loc.token_start == n_tokens - 1024);
  CHECK(loc.token_start > (int64_t{1} << 32));
  const std::vector<uint32_t> last = ds.instance(ds.size() - 1);
  CHECK(last[0] == 11);
  CHECK(last[3] == 44);
  CHECK(last[4] == 0);
}

TEST_CASE("mix files: labels, comments, blank lines, paths relative to the mix") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.path / "sub");
  write_tokens(tmp.file("sub/a.npy"), pattern_tokens(16, 0, 100), Dtype::u16);
  write_tokens(tmp.file("b.npy"), pattern_tokens(16, 1, 100), Dtype::u16);
  {
    std::ofstream m(tmp.file("corpus.mix"));
    m << "# a comment\n\nweb,sub/a.npy\n  " << tmp.file("b.npy") << "  \n";
  }
  const Mix mix = Mix::parse_file(tmp.file("corpus.mix"));
  REQUIRE(mix.size() == 2);
  CHECK(mix.entries[0].label == "web");
  CHECK(mix.entries[0].path == tmp.file("sub/a.npy"));
  CHECK(mix.entries[1].label.empty());
  CHECK(mix.entries[1].path == tmp.file("b.npy"));

  // write_file keeps paths beneath the mix's directory relative, and reads back the same.
  mix.write_file(tmp.file("copy.mix"));
  std::ifstream in(tmp.file("copy.mix"));
  std::string first;
  std::getline(in, first);
  CHECK(first == "web,sub/a.npy");
  const Mix again = Mix::parse_file(tmp.file("copy.mix"));
  CHECK(again.entries[0].path == mix.entries[0].path);
  CHECK(again.entries[1].path == mix.entries[1].path);
}

TEST_CASE("fingerprint: names, sizes, order, dtype and sequence length; not the directory") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.path / "x");
  std::filesystem::create_directories(tmp.path / "y");
  for (const char* d : {"x", "y"}) {
    write_tokens(tmp.file(std::string(d) + "/a.npy"), pattern_tokens(40, 0, 100), Dtype::u32);
    write_tokens(tmp.file(std::string(d) + "/b.npy"), pattern_tokens(48, 1, 100), Dtype::u32);
  }
  auto fp = [&](std::vector<std::string> names, const char* dir, int64_t L, Dtype dt = Dtype::u32) {
    for (auto& n : names) n = tmp.file(std::string(dir) + "/" + n);
    return FslDataset(Mix::from_paths(names), opts(L, 100, dt)).fingerprint();
  };
  const std::string base = fp({"a.npy", "b.npy"}, "x", 8);
  CHECK(base.rfind("fsl-v1:", 0) == 0);
  CHECK(base.size() == 7 + 32);
  CHECK(fp({"a.npy", "b.npy"}, "y", 8) == base);  // moved corpus: same data
  CHECK(fp({"b.npy", "a.npy"}, "x", 8) != base);  // order decides instance ids
  CHECK(fp({"a.npy", "b.npy"}, "x", 4) != base);  // sequence length
  CHECK(fp({"a.npy", "b.npy"}, "x", 8, Dtype::u16) != base);
  write_tokens(tmp.file("y/b.npy"), pattern_tokens(52, 1, 100), Dtype::u32);
  CHECK(fp({"a.npy", "b.npy"}, "y", 8) != base);  // size
}

TEST_CASE("bad input: every error names the file") {
  TempDir tmp;
  write_tokens(tmp.file("ok.npy"), pattern_tokens(64, 0, 100), Dtype::u16);

  SUBCASE("missing file") {
    const std::string missing = tmp.file("missing.npy");
    CHECK_THROWS_WITH(FslDataset(Mix::from_paths({tmp.file("ok.npy"), missing}), opts(8, 100)),
                      doctest::Contains(missing.c_str()));
  }
  SUBCASE("missing mix file") {
    CHECK_THROWS_WITH(Mix::parse_file(tmp.file("nope.mix")), doctest::Contains(tmp.file("nope.mix").c_str()));
  }
  SUBCASE("size not a multiple of the dtype") {
    write_bytes(tmp.file("odd.npy"), std::string(129, '\0'));
    CHECK_THROWS_WITH(FslDataset(Mix::from_paths({tmp.file("odd.npy")}), opts(8, 100)),
                      doctest::Contains(tmp.file("odd.npy").c_str()));
    write_bytes(tmp.file("six.npy"), std::string(130, '\0'));  // fine as uint16, not as uint32
    CHECK_THROWS_WITH(FslDataset(Mix::from_paths({tmp.file("six.npy")}), opts(8, 100, Dtype::u32)),
                      doctest::Contains("not a multiple of 4"));
  }
  SUBCASE("token id >= vocab size") {
    std::vector<uint32_t> t = pattern_tokens(64, 0, 100);
    t[37] = 100;
    write_tokens(tmp.file("badid.npy"), t, Dtype::u16);
    const FslDataset ds(Mix::from_paths({tmp.file("badid.npy")}), opts(8, 100));
    CHECK(ds.instance(0).size() == 8);  // instances without the bad id read fine
    CHECK_THROWS_WITH(ds.instance(4), doctest::Contains(tmp.file("badid.npy").c_str()));
    CHECK_THROWS_WITH(ds.instance(4), doctest::Contains("token offset 37"));
    CHECK_THROWS_WITH(ds.validate_all_tokens(), doctest::Contains(tmp.file("badid.npy").c_str()));
  }
  SUBCASE("empty mix") {
    {
      std::ofstream m(tmp.file("empty.mix"));
      m << "# nothing here\n\n";
    }
    CHECK_THROWS_WITH(Mix::parse_file(tmp.file("empty.mix")), doctest::Contains(tmp.file("empty.mix").c_str()));
    CHECK_THROWS_WITH(Mix::from_paths({}), doctest::Contains("empty list"));
    Mix none;
    none.source = "none.mix";
    CHECK_THROWS_WITH(FslDataset(none, opts(8, 100)), doctest::Contains("none.mix"));
  }
  SUBCASE("sequence length larger than a file") {
    write_tokens(tmp.file("short.npy"), pattern_tokens(5, 1, 100), Dtype::u16);
    const Mix mix = Mix::from_paths({tmp.file("ok.npy"), tmp.file("short.npy")});
    CHECK_THROWS_WITH(FslDataset(mix, opts(8, 100)), doctest::Contains(tmp.file("short.npy").c_str()));
    // OLMo-core's behaviour on request: the short file contributes no instance.
    DatasetOptions o = opts(8, 100);
    o.allow_short_files = true;
    const FslDataset ds(mix, o);
    CHECK(ds.size() == 8);
    CHECK(ds.locate(7).file == 0);
  }
}

TEST_CASE("mix files: a line holding a NUL or another control character is refused, naming the file and line") {
  // std::ifstream hands the NUL to the path, and open() would stop there: "a.u16\0b" would silently read a.u16.
  TempDir tmp;
  write_tokens(tmp.file("a.u16"), pattern_tokens(64, 0, 100), Dtype::u16);
  const std::string mix = tmp.file("nul.mix");
  write_bytes(mix, std::string("# fine\nweb,a.u16\ncode,a.u16\0.bak\n", 33));
  CHECK_THROWS_WITH_AS(Mix::parse_file(mix), doctest::Contains(("mix file '" + mix + "' line 3: control character").c_str()),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(Mix::parse_file(mix), doctest::Contains("NUL (0x00) at column 11"), std::runtime_error);
  // Other control characters: a stray escape, a carriage return inside the line, DEL.
  for (const std::string& bad : {std::string("a\x1b[0m.u16"), std::string("a.u16\rb.u16"), std::string("a\x7f.u16")}) {
    write_bytes(mix, "web," + bad + "\n");
    CHECK_THROWS_WITH_AS(Mix::parse_file(mix), doctest::Contains("line 1: control character"), std::runtime_error);
  }
  // A token file given where a mix belongs is binary: the same refusal, with the hint.
  write_bytes(mix, std::string("\x01\x00\x02\x00", 4));
  CHECK_THROWS_WITH_AS(Mix::parse_file(mix), doctest::Contains("was a token file given where a mix belongs?"), std::runtime_error);
  // Windows line endings, tabs and spaces around the fields stay fine.
  write_bytes(mix, "web,\ta.u16 \r\n  a.u16\r\n");
  const Mix ok = Mix::parse_file(mix);
  REQUIRE(ok.size() == 2);
  CHECK(ok.entries[0].path == tmp.file("a.u16"));
  CHECK(ok.entries[1].path == tmp.file("a.u16"));
}

TEST_CASE("shared_files: the same file by path, the same bytes by content, past the first MiB") {
  TempDir tmp;
  // Two files of 1.5 MiB that agree on their first MiB: only the whole-file hash tells them apart.
  std::string big(size_t{3} << 19, '\x07');
  write_bytes(tmp.file("big.u16"), big);
  write_bytes(tmp.file("big-copy.u16"), big);
  big.back() = '\x08';
  write_bytes(tmp.file("big-tail.u16"), big);
  write_tokens(tmp.file("small.u16"), pattern_tokens(64, 0, 100), Dtype::u16);
  const Mix a = Mix::from_paths({tmp.file("small.u16"), tmp.file("big.u16")});
  const Mix b = Mix::from_paths({tmp.file("big-tail.u16"), tmp.file("big-copy.u16"), tmp.path.string() + "/./small.u16",
                                 tmp.file("missing.u16")});
  const std::vector<SharedFile> s = shared_files(a, b);
  REQUIRE(s.size() == 2);
  CHECK((s[0].a == 0 && s[0].b == 2 && s[0].same_path));
  CHECK(s[0].canonical == tmp.file("small.u16"));
  CHECK((s[1].a == 1 && s[1].b == 1 && !s[1].same_path));
  CHECK(s[1].bytes == (int64_t{3} << 19));
  // A file that cannot be read is compared by path alone (the loader says why it cannot be opened).
  CHECK(shared_files(Mix::from_paths({tmp.file("missing.u16")}), b).size() == 1);
  CHECK(shared_files(Mix::from_paths({tmp.file("big-tail.u16")}), Mix::from_paths({tmp.file("big.u16")})).empty());
}

TEST_CASE("scan counts documents by EOS and flags a missing final EOS") {
  TempDir tmp;
  write_tokens(tmp.file("d.npy"), {5, 6, 0, 7, 0, 8, 9}, Dtype::u16);
  const TokenFile f(tmp.file("d.npy"), Dtype::u16);
  const TokenFile::Scan s = f.scan(0, 9);
  CHECK(s.n_documents == 3);
  CHECK_FALSE(s.ends_with_eos);
  CHECK(s.max_id == 9);
  CHECK(s.first_bad_offset == 6);
  CHECK(s.first_bad_id == 9);
}

TEST_CASE("max_target_sequence_length: files cut at multiples of it, its instances counted; the fingerprint says so") {
  TempDir tmp;
  // L = 8, M = 32: files of 70 and 40 tokens give 2·4 and 1·4 instances (plain: 8 and 5).
  std::vector<std::string> paths;
  for (const int64_t n : {int64_t{70}, int64_t{40}}) {
    paths.push_back(tmp.file(n == 70 ? "m0.npy" : "m1.npy"));
    write_tokens(paths.back(), pattern_tokens(n, 1, 60000), Dtype::u16);
  }
  DatasetOptions o = opts(8, 60000, Dtype::u16);
  const FslDataset plain(Mix::from_paths(paths), o);
  o.max_target_sequence_length = 32;
  const FslDataset chunked(Mix::from_paths(paths), o);
  CHECK(plain.size() == 13);
  CHECK(chunked.size() == 12);
  CHECK(chunked.chunk_instances() == 4);
  CHECK(chunked.file_first_instance(1) == 8);
  CHECK(chunked.locate(9).token_start == 8);
  CHECK(chunked.fingerprint() != plain.fingerprint());
  o.max_target_sequence_length = 8;  // equal to L: the plain dataset, fingerprint included
  CHECK(FslDataset(Mix::from_paths(paths), o).fingerprint() == plain.fingerprint());
  o.max_target_sequence_length = 20;
  CHECK_THROWS_WITH_AS(FslDataset(Mix::from_paths(paths), o), doctest::Contains("multiple of the sequence length"),
                       std::runtime_error);
  o.max_target_sequence_length = 64;  // the 40-token file holds no chunk
  CHECK_THROWS_WITH_AS(FslDataset(Mix::from_paths(paths), o), doctest::Contains("max_target_sequence_length 64"),
                       std::runtime_error);
}

TEST_CASE("OLMo-core mix files: {TOKENIZER} and a base directory, read and written in its format") {
  TempDir tmp;
  write_bytes(tmp.file("oc.txt"), "# an OLMo-core mix\nweb,preprocessed/{TOKENIZER}/web/000.npy\n"
                                  "code,preprocessed/{TOKENIZER}/code/000.npy\n");
  const Mix m = Mix::parse_file(tmp.file("oc.txt"), {"/data/ai2-llm", "allenai/dolma3-tokenizer"});
  REQUIRE(m.size() == 2);
  CHECK(m.entries[1].path == "/data/ai2-llm/preprocessed/allenai/dolma3-tokenizer/code/000.npy");
  CHECK(m.entries[1].label == "code");
  CHECK_THROWS_WITH_AS(Mix::parse_file(tmp.file("oc.txt")), doctest::Contains("line 2: the path holds"),
                       std::runtime_error);
  // Written back in OLMo-core's form, it reads the same.
  m.write_olmo_core_file(tmp.file("back.txt"), {"/data/ai2-llm", "allenai/dolma3-tokenizer"});
  std::ifstream in(tmp.file("back.txt"));
  std::string first;
  std::getline(in, first);
  CHECK(first == "web,preprocessed/{TOKENIZER}/web/000.npy");
  const Mix again = Mix::parse_file(tmp.file("back.txt"), {"/data/ai2-llm", "allenai/dolma3-tokenizer"});
  CHECK(again.entries[0].path == m.entries[0].path);
  // What OLMo-core's parser could not read is refused: outside the base, no tokenizer in the path, a second comma.
  CHECK_THROWS_WITH_AS(m.write_olmo_core_file(tmp.file("x.txt"), {"/elsewhere", "allenai/dolma3-tokenizer"}),
                       doctest::Contains("not beneath the base"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(m.write_olmo_core_file(tmp.file("x.txt"), {"/data/ai2-llm", "gpt2"}),
                       doctest::Contains("{TOKENIZER}"), std::invalid_argument);
  Mix comma = m;
  comma.entries[0].label = "a,b";
  CHECK_THROWS_WITH_AS(comma.write_olmo_core_file(tmp.file("x.txt"), {"/data/ai2-llm", "allenai/dolma3-tokenizer"}),
                       doctest::Contains("second comma"), std::invalid_argument);
}
