// tests/interop/test_readers.cpp — the pieces of interop/ that the framework checks (megatron_check.py,
// olmo_core_check.py) exercise only end to end: SHA-256 on the FIPS 180-4 vectors, OLMo-core order file names, and
// the refusals of the .npy and torch.save readers.
#include <doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "interop/megatron_data.h"
#include "interop/olmo_core_data.h"
#include "interop/torch_state.h"

using namespace olmoref::interop;

namespace {
std::string sha(const std::string& s) {
  Sha256 h;
  h.update(s);
  return h.hex();
}
std::string temp_file(const std::string& name, const std::string& bytes) {
  const auto p = std::filesystem::temp_directory_path() / ("olmoref-interop-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}
}  // namespace

TEST_CASE("SHA-256: the FIPS 180-4 examples, and input fed in pieces") {
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 h;
  for (int i = 0; i < 1000; ++i) h.update(std::string(1000, 'a'));
  CHECK(h.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("OLMo-core order file names: fields in sorted key order, v1 only") {
  OlmoCoreIndicesFile f;
  REQUIRE(parse_olmo_core_indices_name("global_indices_dataset_size801_epoch2_seed34521_v1.npy", f));
  CHECK(f.dataset_size == 801);
  CHECK(f.epoch == 2);
  CHECK(f.seed == 34521);
  CHECK(f.chunk == 1);
  REQUIRE(parse_olmo_core_indices_name("global_indices_chunk4_dataset_size96_epoch1_seed7_v1.npy", f));
  CHECK(f.chunk == 4);
  CHECK(f.dataset_size == 96);
  CHECK_FALSE(parse_olmo_core_indices_name("global_indices_dataset_size801_epoch2_seed34521_v2.npy", f));
  CHECK_FALSE(parse_olmo_core_indices_name("global_indices_epoch2_seed34521_v1.npy", f));  // no size
  CHECK_FALSE(parse_olmo_core_indices_name("tokens.npy", f));
}

TEST_CASE("the .npy and torch.save readers refuse what they cannot read, naming the file") {
  const std::string raw = temp_file("raw.npy", std::string(64, '\x01'));
  CHECK_THROWS_WITH_AS(read_npy_integers(raw), doctest::Contains("raw.npy: not a .npy file"), std::runtime_error);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
  header.resize(117, ' ');
  header += '\n';
  const std::string floats = temp_file("f.npy", std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) +
                                                    std::string(1, '\0') + header + std::string(16, '\0'));
  CHECK_THROWS_WITH_AS(read_npy_integers(floats), doctest::Contains("'<f4' is not a little-endian integer"), std::runtime_error);
  const std::string notzip = temp_file("state.pt", std::string(100, 'x'));
  CHECK_THROWS_WITH_AS(read_torch_state(notzip), doctest::Contains("state.pt: not a torch.save archive"), std::runtime_error);
  CHECK_THROWS_WITH_AS(read_olmo_core_checkpoint(std::filesystem::temp_directory_path().string() + "/no-such-olmoref-ckpt"),
                       doctest::Contains("no OLMo-core checkpoint here"), std::runtime_error);
  CHECK_THROWS_WITH_AS(megatron_checkpoint_iteration(std::filesystem::temp_directory_path().string() + "/no-such-olmoref-ckpt"),
                       doctest::Contains("latest_checkpointed_iteration.txt"), std::runtime_error);
  for (const auto& p : {raw, floats, notzip}) std::filesystem::remove(p);
}
