// TEST ONLY (tests/cli/records.sh): sets one key of a checkpoint manifest and recomputes its manifest_xxh3 with
// olmoref's own ckpt::manifest_checksum, so the checksum passes and only the cross-checks of the values can refuse
// it. Not part of the olmoref binary: a user-facing way to re-hash a manifest would defeat the checksum's purpose.
//
//   rehash_manifest MANIFEST.json /loader_state/batches_processed 5     (a JSON pointer, a JSON value)
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: rehash_manifest MANIFEST JSON_POINTER JSON_VALUE\n");
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json m = nlohmann::json::parse(text.str());
    m[nlohmann::json::json_pointer(argv[2])] = nlohmann::json::parse(argv[3]);
    m["manifest_xxh3"] = olmoref::ckpt::manifest_checksum(m);
    std::ofstream(argv[1], std::ios::trunc) << m.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rehash_manifest: %s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}
