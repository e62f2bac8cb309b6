#include "interop/olmo_core_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "interop/torch_state.h"

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

OlmoCoreOrder::OlmoCoreOrder(const std::string& work_dir, int64_t dataset_size, int64_t instances_per_batch, int64_t seed,
                             int64_t chunk)
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
    if (f.chunk != chunk) {
      // The same dataset size with another chunking is another order: refuse rather than read it.
      throw std::runtime_error(f.path + ": an order shuffled in chunks of " + std::to_string(f.chunk) +
                               " instances, but the configured dataset has chunks of " + std::to_string(chunk) +
                               " (data.max_target_sequence_length / train.seq_len): set the run's "
                               "max_target_sequence_length");
    }
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

std::string olmo_core_fsl_fingerprint(const OlmoCoreFingerprintInput& in) {
  auto opt = [](int64_t v) { return v < 0 ? std::string("None") : std::to_string(v); };
  Sha256 h;
  h.update("class=NumpyFSLDataset");
  h.update("vocab_size=" + std::to_string(in.vocab_size) + ",");
  h.update("pad_token_id=" + opt(in.pad_token_id) + ",");
  h.update("eos_token_id=" + std::to_string(in.eos_token_id) + ",");
  h.update("dtype=<class 'numpy." + in.dtype + "'>,");
  h.update("max_target_sequence_length=" + opt(in.max_target_sequence_length) + ",");
  h.update("bos_token_id=" + opt(in.bos_token_id) + ",");
  for (const auto& [name, size] : in.files) h.update("path=" + name + ",size=" + std::to_string(size) + ",");
  return h.hex();
}

OlmoCoreCheckpoint read_olmo_core_checkpoint(const std::string& dir) {
  OlmoCoreCheckpoint c;
  if (fs::is_regular_file(fs::path(dir) / "train" / "rank0.pt")) {
    c.state_path = (fs::path(dir) / "train" / "rank0.pt").string();
  } else {
    int64_t best = -1;
    if (fs::is_directory(dir))
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.size() < 5 || name.compare(0, 4, "step") != 0 ||
            !std::all_of(name.begin() + 4, name.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }))
          continue;
        const int64_t step = std::stoll(name.substr(4));
        if (step > best && fs::is_regular_file(e.path() / "train" / "rank0.pt")) {
          best = step;
          c.state_path = (e.path() / "train" / "rank0.pt").string();
        }
      }
    if (c.state_path.empty())
      throw std::runtime_error(dir + ": no OLMo-core checkpoint here (neither train/rank0.pt nor stepN/train/rank0.pt)");
  }
  const nlohmann::json s = read_torch_state(c.state_path);
  auto need = [&](const nlohmann::json& o, const char* key, const char* where) -> const nlohmann::json& {
    if (!o.is_object() || !o.contains(key))
      throw std::runtime_error(c.state_path + ": no '" + std::string(where) + key + "' in the trainer state (not an OLMo-core checkpoint?)");
    return o[key];
  };
  const nlohmann::json& step = need(s, "global_step", "");
  if (!step.is_number_integer()) throw std::runtime_error(c.state_path + ": global_step is not an integer");
  c.global_step = step.get<int64_t>();
  c.data_loader = need(s, "data_loader", "");
  for (const char* k : {"dataset_type", "dataset_fingerprint_version", "dataset_fingerprint", "batches_processed",
                        "tokens_processed", "seed"})
    need(c.data_loader, k, "data_loader.");
  return c;
}

std::string check_olmo_core_checkpoint(const OlmoCoreCheckpoint& c, const data::FslDataset& ds, int64_t pad_token_id,
                                       int64_t bos_token_id) {
  const nlohmann::json& dl = c.data_loader;
  if (dl["dataset_type"] != "fsl")
    throw std::runtime_error(c.state_path + ": data_loader.dataset_type " + dl["dataset_type"].dump() +
                             " (only fixed-sequence-length runs are read)");
  if (dl["dataset_fingerprint_version"] != "v2.0")
    throw std::runtime_error(c.state_path + ": dataset fingerprint version " + dl["dataset_fingerprint_version"].dump() +
                             " is not one this reader knows (v2.0, ai2-olmo-core 3.0)");
  if (dl.contains("sequence_length") && dl["sequence_length"] != ds.sequence_length())
    throw std::runtime_error(c.state_path + ": the run's sequence_length is " + dl["sequence_length"].dump() +
                             ", the config's train.seq_len " + std::to_string(ds.sequence_length()));
  if (!ds.eos_id()) throw std::invalid_argument("an OLMo-core checkpoint needs data.eos_id (part of OLMo-core's fingerprint)");
  const std::string fp = olmo_core_fingerprint_of(ds, pad_token_id, bos_token_id);
  if (fp != dl["dataset_fingerprint"])
    throw std::runtime_error(c.state_path + ": the run's dataset fingerprint is " + dl["dataset_fingerprint"].dump() +
                             " but the configured token files give " + fp + " (base names, byte sizes, vocab " +
                             std::to_string(ds.vocab_size()) + ", pad " + std::to_string(pad_token_id) + ", eos " +
                             std::to_string(*ds.eos_id()) + ", " + data::dtype_name(ds.dtype()) +
                             "): these are not the run's files, in its order, or they changed since");
  return fp;
}

std::string olmo_core_fingerprint_of(const data::FslDataset& ds, int64_t pad_token_id, int64_t bos_token_id) {
  if (!ds.eos_id()) throw std::invalid_argument("OLMo-core's dataset fingerprint needs the EOS id (data.eos_id)");
  if (pad_token_id < 0) throw std::invalid_argument("OLMo-core's dataset fingerprint needs the pad id (data.pad_id)");
  OlmoCoreFingerprintInput fi;
  for (size_t f = 0; f < ds.n_files(); ++f)
    fi.files.emplace_back(fs::path(ds.file(f).path()).filename().string(), ds.file(f).size_bytes());
  fi.vocab_size = ds.vocab_size();
  fi.eos_token_id = *ds.eos_id();
  fi.pad_token_id = pad_token_id;
  fi.bos_token_id = bos_token_id;
  fi.dtype = ds.dtype() == data::Dtype::u16 ? "uint16" : "uint32";
  if (ds.max_target_sequence_length() > 0) fi.max_target_sequence_length = ds.max_target_sequence_length();
  return olmo_core_fsl_fingerprint(fi);
}

data::LoaderState olmo_core_loader_state(const OlmoCoreCheckpoint& c, const data::FslDataset& ds,
                                         int64_t global_batch_instances, int64_t pad_token_id, int64_t bos_token_id) {
  check_olmo_core_checkpoint(c, ds, pad_token_id, bos_token_id);
  const nlohmann::json& dl = c.data_loader;
  const nlohmann::json mt = dl.value("max_target_sequence_length", nlohmann::json());
  const int64_t theirs = mt.is_number_integer() ? mt.get<int64_t>() : 0;
  if (theirs != ds.max_target_sequence_length() && !(theirs == ds.sequence_length() && ds.max_target_sequence_length() == 0))
    throw std::runtime_error(c.state_path + ": the run's max_target_sequence_length is " + mt.dump() + ", the config's " +
                             std::to_string(ds.max_target_sequence_length()) +
                             " (data.max_target_sequence_length): another instance order, which OLMo-core refuses too");
  for (const char* k : {"tokens_processed", "epoch", "seed"})
    if (!dl.contains(k) || !dl[k].is_number_integer())
      throw std::runtime_error(c.state_path + ": data_loader." + k + " is missing or not an integer");
  // OLMo-core's state knows the tokens seen, not our batch: rebatched_state cuts them into this run's batches.
  data::LoaderState s;
  s.epoch = dl["epoch"].get<int64_t>();
  s.seed = dl["seed"].get<uint64_t>();
  s.tokens_processed = dl["tokens_processed"].get<int64_t>();
  s.fingerprint = ds.fingerprint();
  s.global_batch_instances = 0;
  s.sequence_length = ds.sequence_length();
  if (s.epoch < 1) throw std::runtime_error(c.state_path + ": data_loader.epoch " + std::to_string(s.epoch) + " (1-based)");
  return data::rebatched_state(s, global_batch_instances);
}

}  // namespace olmoref::interop
