#include "train/batch_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

namespace olmoref {

namespace {

// Interim source until the OLMo-core-compatible loader lands (data/): the files' instances in file
// order (each file cut into whole seq_len chunks, tail dropped), global batch b = instances
// [b·G, (b+1)·G), wrapping into the next epoch when the instances run out.
class SequentialTokenSource : public BatchSource {
 public:
  explicit SequentialTokenSource(const TrainConfig& cfg) : T_(cfg.train.seq_len), G_(cfg.train.global_batch_instances) {
    const int64_t V = cfg.model.vocab_size;
    const std::string dtype = cfg.data.dtype == "auto" ? (V - 1 <= 0xffff ? "u16" : "u32") : cfg.data.dtype;
    const int64_t width = dtype == "u16" ? 2 : 4;
    if (cfg.data.train_files.empty())
      throw std::invalid_argument("config key 'data.train_files': no training data given");
    for (const std::string& path : cfg.data.train_files) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0) throw std::runtime_error(path + ": cannot open token file (check data.train_files)");
      struct stat st{};
      ::fstat(fd, &st);
      const int64_t bytes = st.st_size;
      if (bytes % width != 0)
        throw std::runtime_error(path + ": size " + std::to_string(bytes) + " is not a multiple of the token width (" +
                                 std::to_string(width) + " bytes for " + dtype + "); is data.dtype right?");
      const int64_t n = bytes / width;
      if (n < T_) {
        ::close(fd);
        throw std::runtime_error(path + ": holds " + std::to_string(n) + " tokens, fewer than train.seq_len = " +
                                 std::to_string(T_));
      }
      void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) throw std::runtime_error(path + ": mmap failed");
      files_.push_back({path, p, bytes, width});
      for (int64_t i = 0; i + T_ <= n; i += T_) {
        instances_.push_back({files_.size() - 1, i});
      }
    }
    if (static_cast<int64_t>(instances_.size()) < G_)
      throw std::runtime_error("training data holds " + std::to_string(instances_.size()) +
                               " instances, fewer than one global batch (" + std::to_string(G_) + ")");
    // Validate token ids once, so a bad file fails before step 1 rather than mid-run.
    for (const auto& f : files_) {
      const int64_t n = f.bytes / f.width;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t t = f.width == 2 ? static_cast<const uint16_t*>(f.map)[i] : static_cast<const uint32_t*>(f.map)[i];
        if (t >= static_cast<uint64_t>(V))
          throw std::runtime_error(f.path + ": token " + std::to_string(t) + " at index " + std::to_string(i) +
                                   " >= model.vocab_size " + std::to_string(V));
      }
    }
    batches_per_epoch_ = static_cast<int64_t>(instances_.size()) / G_;
  }
  ~SequentialTokenSource() override {
    for (auto& f : files_) ::munmap(f.map, static_cast<size_t>(f.bytes));
  }

  StepBatch next() override {
    StepBatch b;
    b.epoch = 1 + next_ / batches_per_epoch_;
    const int64_t row = next_ % batches_per_epoch_;
    b.tokens.resize(static_cast<size_t>(G_ * T_));
    for (int64_t i = 0; i < G_; ++i) {
      const int64_t id = row * G_ + i;
      b.instance_ids.push_back(id);
      const Instance& inst = instances_[static_cast<size_t>(id)];
      const File& f = files_[inst.file];
      for (int64_t t = 0; t < T_; ++t)
        b.tokens[i * T_ + t] = f.width == 2 ? static_cast<const uint16_t*>(f.map)[inst.start + t]
                                            : static_cast<const uint32_t*>(f.map)[inst.start + t];
    }
    ++next_;
    return b;
  }

  nlohmann::json state() const override { return {{"kind", "sequential"}, {"next_batch", next_}}; }
  void restore(const nlohmann::json& state, bool) override { next_ = state.at("next_batch").get<int64_t>(); }
  std::string fingerprint() const override {
    std::string f = "sequential;T=" + std::to_string(T_);
    for (const auto& file : files_) f += ";" + file.path + ":" + std::to_string(file.bytes);
    return f;
  }

  std::string describe() const override {
    return "sequential: " + std::to_string(files_.size()) + " file(s), " + std::to_string(instances_.size()) +
           " instances of " + std::to_string(T_) + " tokens, " + std::to_string(batches_per_epoch_) + " batches/epoch";
  }

 private:
  struct File {
    std::string path;
    void* map;
    int64_t bytes, width;
  };
  struct Instance {
    size_t file;
    int64_t start;
  };
  int64_t T_, G_;
  std::vector<File> files_;
  std::vector<Instance> instances_;
  int64_t batches_per_epoch_ = 0;
  int64_t next_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg) {
  return std::make_unique<SequentialTokenSource>(cfg);
}

}  // namespace olmoref
