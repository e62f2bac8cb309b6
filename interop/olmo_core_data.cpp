#include "interop/olmo_core_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace olmoref::interop {

namespace fs = std::filesystem;

bool parse_olmo_core_indices_name(const std::string& name, OlmoCoreIndicesFile& out) {
  const std::string head = "global_indices_", tail = "_v1.npy";
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  OlmoCoreIndicesFile f;
  std::string rest = name.substr(head.size(), name.size() - head.size() - tail.size()) + "_";
  // Fields in sorted key order: chunk, dataset_size, epoch, seed (each optional but dataset_size).
  bool have_size = false;
  while (!rest.empty()) {
    const size_t us = rest.find('_', rest.rfind("dataset_size", 0) == 0 ? std::string("dataset_size").size() : 0);
    const std::string field = rest.substr(0, us);
    rest.erase(0, us + 1);
    size_t digits = field.size();
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(field[digits - 1]))) --digits;
    if (digits == field.size()) return false;
    const std::string key = field.substr(0, digits);
    const int64_t value = std::stoll(field.substr(digits));
    if (key == "chunk") f.chunk = value;
    else if (key == "dataset_size") f.dataset_size = value, have_size = true;
    else if (key == "epoch") f.epoch = value;
    else if (key == "seed") f.seed = value;
    else return false;
  }
  if (!have_size) return false;
  out = f;
  return true;
}

OlmoCoreOrder::OlmoCoreOrder(const std::string& work_dir, int64_t dataset_size, int64_t instances_per_batch, int64_t seed)
    : instances_per_batch_(instances_per_batch), seed_(seed) {
  if (!fs::is_directory(work_dir))
    throw std::runtime_error(work_dir + ": not a directory (--olmo-core-work-dir: the data loader's work directory)");
  if (instances_per_batch < 1 || dataset_size < instances_per_batch)
    throw std::invalid_argument("OLMo-core order: " + std::to_string(dataset_size) + " instances do not make one batch of " +
                                std::to_string(instances_per_batch));
  batches_per_epoch_ = dataset_size / instances_per_batch;
  std::map<int64_t, OlmoCoreIndicesFile> by_epoch;
  std::vector<std::string> other_sizes, other_versions;
  for (const auto& entry : fs::directory_iterator(work_dir)) {
    OlmoCoreIndicesFile f;
    const std::string name = entry.path().filename().string();
    if (!parse_olmo_core_indices_name(name, f)) {
      if (name.rfind("global_indices_", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0)
        other_versions.push_back(name);
      continue;
    }
    f.path = entry.path().string();
    if (f.dataset_size != dataset_size) {
      other_sizes.push_back(entry.path().filename().string());
      continue;
    }
    if (seed_ >= 0 && f.seed >= 0 && f.seed != seed_) continue;
    if (f.epoch < 1)
      throw std::runtime_error(f.path + ": an unshuffled order (no epoch in the name); only shuffled runs are read");
    if (by_epoch.count(f.epoch))
      throw std::runtime_error(work_dir + ": two orders for epoch " + std::to_string(f.epoch) + " (" + by_epoch[f.epoch].path +
                               ", " + f.path + "): different seeds; give the run's seed (--olmo-core-seed)");
    by_epoch[f.epoch] = f;
  }
  if (by_epoch.empty()) {
    std::string found;
    for (const auto& o : other_sizes) found += "\n  " + o;
    throw std::runtime_error(work_dir + ": no global_indices file for a dataset of " + std::to_string(dataset_size) +
                             " instances" +
                             (!other_versions.empty() && other_sizes.empty()
                                  ? "; found " + other_versions.front() + ", a version of OLMo-core's order file this "
                                    "reader does not know (it reads v1, as ai2-olmo-core 3.0 writes)"
                              : other_sizes.empty() ? std::string(" (no global_indices_*_v1.npy at all)")
                                                  : "; the files there are for other sizes, so the token files are not "
                                                    "the run's (or changed since):" + found));
  }
  for (const auto& [epoch, f] : by_epoch) {
    if (epoch != static_cast<int64_t>(orders_.size()) + 1) break;  // consecutive epochs only
    if (seed_ < 0) seed_ = f.seed;
    const int64_t bytes = static_cast<int64_t>(fs::file_size(f.path));
    if (bytes != dataset_size * 4)
      throw std::runtime_error(f.path + ": " + std::to_string(bytes) + " bytes, but its name says " + std::to_string(dataset_size) +
                               " uint32 instance ids (" + std::to_string(dataset_size * 4) + " bytes): truncated or not OLMo-core's");
    std::vector<uint32_t> order(static_cast<size_t>(dataset_size));
    std::ifstream in(f.path, std::ios::binary);
    in.read(reinterpret_cast<char*>(order.data()), bytes);
    if (!in) throw std::runtime_error(f.path + ": cannot read");
    std::vector<uint8_t> seen(static_cast<size_t>(dataset_size), 0);
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i] >= dataset_size || seen[order[i]]++)
        throw std::runtime_error(f.path + ": entry " + std::to_string(i) + " (" + std::to_string(order[i]) +
                                 ") makes it no permutation of the " + std::to_string(dataset_size) + " instances");
    }
    files_.push_back(f);
    orders_.push_back(std::move(order));
  }
}

int64_t OlmoCoreOrder::instance(int64_t step, int64_t k) const {
  const int64_t e = (step - 1) / batches_per_epoch_, b = (step - 1) % batches_per_epoch_;
  if (step < 1 || e >= epochs())
    throw std::runtime_error("OLMo-core order: step " + std::to_string(step) + " needs epoch " + std::to_string(e + 1) +
                             ", but the work directory holds the orders of epochs 1.." + std::to_string(epochs()));
  return orders_[static_cast<size_t>(e)][static_cast<size_t>(b * instances_per_batch_ + k)];
}

}  // namespace olmoref::interop
