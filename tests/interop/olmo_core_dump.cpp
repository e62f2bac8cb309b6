// tests/interop/olmo_core_dump.cpp — writes the batches olmoref reconstructs from an OLMo-core data loader's work
// directory, for olmo_core_check.py to compare with OLMo-core's own NumpyFSLDataLoader:
//   olmo_core_dump WORK_DIR SEQ_LEN GLOBAL_BATCH SEED STEPS OUT FILE...   (OUT: STEPS x G x SEQ_LEN uint32)
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "interop/olmo_core_data.h"

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: olmo_core_dump WORK_DIR SEQ_LEN GLOBAL_BATCH SEED STEPS OUT FILE...\n");
    return 2;
  }
  try {
    std::vector<std::string> files(argv + 7, argv + argc);
    olmoref::data::DatasetOptions o;
    o.sequence_length = std::stoll(argv[2]);
    o.vocab_size = 65536;
    o.dtype = olmoref::data::Dtype::u16;
    const olmoref::data::FslDataset ds(olmoref::data::Mix::from_paths(files), o);
    const long long G = std::stoll(argv[3]), steps = std::stoll(argv[5]);
    const olmoref::interop::OlmoCoreOrder order(argv[1], ds.size(), G, std::stoll(argv[4]));
    std::vector<uint32_t> buf(static_cast<size_t>(o.sequence_length));
    std::FILE* out = std::fopen(argv[6], "wb");
    if (!out) throw std::runtime_error(std::string(argv[6]) + ": cannot write");
    for (long long s = 1; s <= steps; ++s)
      for (long long k = 0; k < G; ++k) {
        ds.read_instance(order.instance(s, k), buf);
        std::fwrite(buf.data(), sizeof(uint32_t), buf.size(), out);
      }
    std::fclose(out);
    std::printf("%lld steps of %lld instances (%lld epochs saved, %lld batches each)\n", steps, G,
                static_cast<long long>(order.epochs()), static_cast<long long>(order.batches_per_epoch()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
