// interop/olmo_core_data.h — what an OLMo-core run trained on, from the global instance order OLMo-core saved in its
// data loader's work directory (docs/formats/frameworks.md, section OLMo-core):
//
//   WORK_DIR/global_indices_[chunkC_]dataset_sizeN_epochE_seedS_v1.npy
//       NumpyFSLDataLoader's order of epoch E: N little-endian uint32 instance ids, written with np.memmap (no .npy
//       header despite the name; fields in the name sorted by key, `chunk` only for chunked shuffling)
//
// The instances are the NumpyFSLDataset's: each token file, in the dataset's order, cut into whole sequence_length
// chunks (olmoref's FslDataset, data/dataset.h, is the same dataset). Step s of the run (1-based, the trainer's
// global step) is batch b = (s - 1) mod B of epoch e = (s - 1) div B + 1, B = N div I batches of I = global batch
// tokens / sequence_length instances: ids order_e[b I, (b + 1) I). A work directory whose files are for another
// dataset size than the token files give, hold another size than their name says, are not a permutation, or lack an
// epoch the steps need is refused naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/loader.h"

namespace olmoref::interop {

struct OlmoCoreIndicesFile {
  std::string path;
  int64_t epoch = 0, seed = -1, dataset_size = 0, chunk = 1;
};

class OlmoCoreOrder {
 public:
  // Reads every global_indices file of `work_dir` for a dataset of `dataset_size` instances (and `seed`, when >= 0),
  // shuffled in chunks of `chunk` instances (max_target_sequence_length / sequence_length; 1 without it).
  OlmoCoreOrder(const std::string& work_dir, int64_t dataset_size, int64_t instances_per_batch, int64_t seed = -1,
                int64_t chunk = 1);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t epochs() const { return static_cast<int64_t>(orders_.size()); }  // consecutive from epoch 1
  int64_t steps() const { return epochs() * batches_per_epoch_; }
  int64_t seed() const { return seed_; }
  const std::vector<OlmoCoreIndicesFile>& files() const { return files_; }
  // The instance id at position k of step s's batch (s >= 1, 0 <= k < instances_per_batch).
  int64_t instance(int64_t step, int64_t k) const;

 private:
  int64_t instances_per_batch_, batches_per_epoch_ = 0, seed_ = -1;
  std::vector<OlmoCoreIndicesFile> files_;
  std::vector<std::vector<uint32_t>> orders_;  // per epoch, from 1
};

// Parses a global_indices file name; false when `name` is not one.
bool parse_olmo_core_indices_name(const std::string& name, OlmoCoreIndicesFile& out);

// NumpyFSLDataset.fingerprint, version "v2.0" (ai2-olmo-core 3.0): the SHA-256 hex of "class=NumpyFSLDataset", then
// "vocab_size=V,pad_token_id=P,eos_token_id=E,dtype=<class 'numpy.uint16'>,max_target_sequence_length=M,
// bos_token_id=B," (None where unset), then "path=<base name>,size=<bytes>," per token file in order.
struct OlmoCoreFingerprintInput {
  std::vector<std::pair<std::string, int64_t>> files;  // base name, size in bytes
  int64_t vocab_size = 0, eos_token_id = 0;
  int64_t pad_token_id = -1, bos_token_id = -1, max_target_sequence_length = -1;  // -1: None
  std::string dtype = "uint16";
};
std::string olmo_core_fsl_fingerprint(const OlmoCoreFingerprintInput& in);
// The fingerprint OLMo-core computes for the configured dataset `ds` (needs its eos id) with these pad and bos
// (-1: none) ids: what an OLMo-core run over the same token files records in its checkpoints.
std::string olmo_core_fingerprint_of(const data::FslDataset& ds, int64_t pad_token_id, int64_t bos_token_id);

// The trainer state OLMo-core's checkpointer writes (torch.save of the trainer's state_dict at
// <dir>/train/rank0.pt): `dir` is one step directory, or the save folder (its highest stepN holding one).
struct OlmoCoreCheckpoint {
  std::string state_path;
  int64_t global_step = 0;
  nlohmann::json data_loader;  // dataset_type, dataset_fingerprint(_version), batches/tokens_processed, seed, epoch, ...
};
OlmoCoreCheckpoint read_olmo_core_checkpoint(const std::string& dir);

// Checks that the checkpoint's data loader read `ds` (the configured token files): an FSL dataset, fingerprint
// version v2.0, the same sequence length, and the fingerprint OLMo-core computes for these files with the run's pad
// (and bos, -1: none) ids. Returns that fingerprint; throws naming the state file.
std::string check_olmo_core_checkpoint(const OlmoCoreCheckpoint& c, const data::FslDataset& ds, int64_t pad_token_id,
                                       int64_t bos_token_id);

// Where an olmoref loader over `ds` continues OLMo-core's data order after checkpoint `c` (checked as above): its
// seed and epoch, and batches_processed = tokens_processed // (G · L) in this run's global batches of G instances,
// which is how OLMo-core's NumpyFSLDataLoader.load_state_dict resumes, also after a change of batch size (a
// position between two of the new batches rounds down: those instances are seen again). Also refuses a
// checkpoint whose max_target_sequence_length differs from the dataset's, as OLMo-core does.
data::LoaderState olmo_core_loader_state(const OlmoCoreCheckpoint& c, const data::FslDataset& ds,
                                         int64_t global_batch_instances, int64_t pad_token_id, int64_t bos_token_id);

}  // namespace olmoref::interop
