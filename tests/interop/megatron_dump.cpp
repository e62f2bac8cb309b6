// tests/interop/megatron_dump.cpp — writes the samples olmoref reconstructs from a Megatron index cache, for
// megatron_check.py to compare with megatron-core's own GPTDataset:
//   megatron_dump CACHE PREFIX COUNT OUT [--no-extra-token]   (OUT: COUNT x sample_tokens little-endian uint32)
// Exit 0, or 2 with the reader's message on stderr (the refusals are part of what the check tests).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "interop/megatron_data.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: megatron_dump CACHE PREFIX COUNT OUT [--no-extra-token]\n");
    return 2;
  }
  try {
    const bool extra = !(argc > 5 && std::strcmp(argv[5], "--no-extra-token") == 0);
    const olmoref::interop::MegatronGptSamples s(argv[1], argv[2], "train", extra);
    const long long count = std::stoll(argv[3]);
    if (count > s.samples()) throw std::runtime_error("only " + std::to_string(s.samples()) + " samples");
    std::vector<uint32_t> buf(static_cast<size_t>(s.sample_tokens()));
    std::FILE* out = std::fopen(argv[4], "wb");
    if (!out) throw std::runtime_error(std::string(argv[4]) + ": cannot write");
    for (long long k = 0; k < count; ++k) {
      s.read(k, buf);
      std::fwrite(buf.data(), sizeof(uint32_t), buf.size(), out);
    }
    std::fclose(out);
    std::printf("%lld samples of %lld tokens (%s)\n", count, static_cast<long long>(s.sample_tokens()), s.base().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
