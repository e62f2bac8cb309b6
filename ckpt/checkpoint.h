// ckpt/checkpoint.h — checkpoints: a directory per step, versioned manifest, per-rank shard files,
// every tensor zstd-compressed and XXH3-checksummed, written atomically (docs/formats/checkpoint.md).
//
//   <root>/step00000010/manifest.json         what is inside, how it was made, digests of the whole state
//   <root>/step00000010/shard-00000.bin       rank 0's slices of params, Adam m, Adam v
//
// Atomicity: everything is written under <root>/.tmp-step00000010/ (each file written to a temporary
// name, fsynced, renamed), then the directory is fsynced and renamed to step00000010 and the root is
// fsynced. A directory named stepNNNNNNNN therefore always holds a complete checkpoint; anything
// else (a .tmp-* directory left by a crash) is ignored and cleaned up by the next save.
//
// Shards hold ranges of the canonical flat vectors (core/params.h), so a checkpoint written by one
// data-parallel layout can be read by any other: the reader assembles the ranges it needs.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace olmoref::ckpt {

inline constexpr const char* kFormat = "olmoref-checkpoint";
// 2: the manifest carries its own checksum (manifest_xxh3). 3: shard files are written as a stream (their header
// at the end), tensors are cut into frames of at most kFrameFloats, and each rank writes the optimizer range it
// holds. Versions 2 and 3 are read.
inline constexpr int kFormatVersion = 3;
inline constexpr int kOldestReadableVersion = 2;
// The shard magics: v1 (format 2) has its header at the front, v2 (format 3) at the end, after the frames.
inline constexpr char kShardMagicV1[16] = {'O', 'L', 'M', 'O', 'R', 'E', 'F', '-', 'S', 'H', 'A', 'R', 'D', '-', 'v', '1'};
inline constexpr char kShardMagic[16] = {'O', 'L', 'M', 'O', 'R', 'E', 'F', '-', 'S', 'H', 'A', 'R', 'D', '-', 'v', '2'};
// The largest frame (one zstd frame, one entry): 16 MiB of fp32. A writer holds one frame's compressed bytes (and on
// a device executor its raw bytes) per compression thread, and a reader decompresses at most one frame per thread
// beyond what it keeps, whatever the size of the model.
inline constexpr int64_t kFrameFloats = int64_t{1} << 22;

// The flat fp32 vectors a checkpoint holds ("params", "adam_m", "adam_v"), each `total` floats.
struct StateVectors {
  int64_t total = 0;
  float* params = nullptr;
  float* adam_m = nullptr;
  float* adam_v = nullptr;
};

// One named slice of the flat vector (a whole parameter tensor, or part of one when sharded).
struct Segment {
  std::string name;  // parameter name (OLMo-core), for inspection
  int64_t offset = 0, numel = 0;
};

struct SaveOptions {
  int zstd_level = 3;
  int zstd_threads = 1;
  int keep_last = 3;          // complete checkpoints kept after this save (>= 1; the newest is never deleted)
};

struct StateDigests {
  std::string params, adam_m, adam_v;  // XXH3-128 Merkle roots (hex) of the whole flat vectors
};

// Where the data of every step came from (manifest key `data_history`): one segment per stretch of steps drawn in
// global batches of one shape from one starting loader position. A resume that changes the global batch (OLMo-core's
// rule, data/loader.h rebatched_state) or continues on other data starts a new segment. The step count, the tokens
// and the loader state are all functions of it, so a manifest whose values disagree with it was changed after it
// was written (ckpt::record_problems).
struct DataSegment {
  int64_t steps = 0;
  int64_t global_batch_instances = 0, sequence_length = 0, batches_per_epoch = 0;
  int64_t epoch = 1, batches_processed = 0;  // the loader's position before the segment's first batch
  // The loader's (epoch, batches_processed) after the first n batches of the segment. The loader moves to the next
  // epoch only when it draws again, so a finished epoch ends at batches_processed == batches_per_epoch.
  std::pair<int64_t, int64_t> after(int64_t n) const;
  std::pair<int64_t, int64_t> end() const { return after(steps); }
  // The (epoch, row of the epoch's order) the segment's j-th step (0-based) drew.
  std::pair<int64_t, int64_t> batch_of(int64_t j) const;
};

struct DataHistory {
  uint64_t seed = 0;       // the data order's seed, the same for the whole run (a resume keeps the checkpoint's)
  std::string seed_from;   // "data.seed" (the config's) or "data.olmo_core_state" (an OLMo-core run's loader)
  std::vector<DataSegment> segments;

  int64_t steps() const;
  nlohmann::json to_json() const;
  // Throws naming the key ("data_history.segments[1].steps") and the type or range expected.
  static DataHistory from_json(const nlohmann::json& j);
};

// Everything besides the vectors, recorded in the manifest and handed back on load.
struct CheckpointMeta {
  int64_t step = 0;                 // optimizer steps completed
  int64_t tokens = 0;               // tokens consumed
  nlohmann::json loader_state;      // data/loader.h LoaderState
  std::string dataset_fingerprint;
  std::string config_toml;          // resolved configuration of the run that wrote it
  std::string resume_hash;          // hash of the configuration that must match to resume
  std::string model_hash;           // hash of the [model] section alone
  nlohmann::json data_layout;       // seq_len, micro-batch, global batch, world layout
  std::string precision, executor;
  nlohmann::json extra;             // anything else (build facts)
  // Optimizer state besides the flat vectors (SkipStepAdamW's windows and step count, core/skip_step.h); null when
  // the optimizer has none. Written only when not null, so other manifests are as they were; older checkpoints
  // read as null.
  nlohmann::json optimizer_state;
  // DataHistory::to_json(); null when unknown (a manifest written before it was recorded, a checkpoint resumed from
  // one, or a batch source that is not the data loader), and then not written.
  nlohmann::json data_history;
  StateDigests digests;             // filled on load from the manifest
};

// Writes checkpoint `meta.step` under `root` for a single process holding the whole state.
// Returns the final directory.
std::string save(const std::string& root, const CheckpointMeta& meta, const StateVectors& state,
                 const std::vector<Segment>& segments, const SaveOptions& opts);

// The sharded save, in three steps so ranks can write in parallel (dist/ drives it):
//   1. begin_save: rank 0 creates <root>/.tmp-stepN (create=true); every rank learns the path;
//   2. write_shard: each rank writes shard-<rank>.bin holding its ranges of the flat vectors, frame by frame, and
//      returns what the manifest records of the file;
//   3. finish_save: rank 0, after a barrier and a gather of every writer's ShardRecord, writes the manifest with the
//      whole-state digests, and renames the directory: only then is the checkpoint complete.
std::string begin_save(const std::string& root, int64_t step, bool create);

// What one writer holds: for each flat vector (params, adam_m, adam_v) the range [lo, hi) it writes (empty: none),
// and how to get a piece of it: read(v, a, b, scratch) returns b - a floats of vector v from element a, either where
// they lie (host memory) or copied into scratch (room for b - a floats). Called on the calling thread only (a
// device executor's copies stay on the thread that owns its device); the compression runs side by side.
struct ShardContents {
  std::array<std::pair<int64_t, int64_t>, 3> ranges{};
  std::function<const float*(int v, int64_t a, int64_t b, float* scratch)> read;
};

// What the manifest records of a shard file; fixed size, so writers can send it to rank 0 in one gather.
struct ShardRecord {
  int64_t rank = -1;
  uint64_t bytes = 0;       // the file's exact size
  uint64_t header_xxh3 = 0;
  int64_t raw_bytes = 0;    // fp32 bytes of the entries
};

ShardRecord write_shard(const std::string& tmp_dir, int rank, const ShardContents& contents,
                        const std::vector<Segment>& segments, const SaveOptions& opts, int64_t step_for_fault_injection);
std::string finish_save(const std::string& root, const std::string& tmp_dir, const CheckpointMeta& meta,
                        int64_t total, const StateDigests& digests, const SaveOptions& opts,
                        std::vector<ShardRecord> shards);

struct LoadOptions {
  bool ignore_fingerprint_mismatch = false;
  bool allow_config_change = false;
  int threads = 1;  // frames decompressed side by side (each holds one frame)
};

// Newest complete checkpoint under root (empty if none).
std::optional<std::string> newest_complete(const std::string& root);
std::vector<std::string> list_complete(const std::string& root);  // ascending by step

// Reads and verifies a checkpoint directory into `state` (whose total must match) and returns its
// metadata. Throws std::runtime_error naming the file and the problem: missing or truncated shard,
// checksum mismatch, unknown format version, a different model config, a different dataset.
// `expect` supplies what the current run has (model_hash, resume_hash, dataset_fingerprint) to
// compare against; empty strings skip that comparison.
CheckpointMeta load(const std::string& dir, const StateVectors& state, const CheckpointMeta& expect,
                    const LoadOptions& opts);

// Reads, for each flat vector, only the entries that overlap ranges[v] (a rank of any layout) and hands each piece
// inside the range to sink(v, a, b, data) (data: b - a floats; called from opts.threads threads at once, on disjoint
// pieces: a device executor's caller passes 1),
// verifying every entry it reads. Each shard file's header is read (its size and header checksum against the
// manifest) to check that every vector is covered exactly once; no other byte of the shards is. The whole-state
// digests are returned in meta.digests for the caller to check collectively.
using PieceSink = std::function<void(int v, int64_t a, int64_t b, const float* data)>;
CheckpointMeta load_ranges(const std::string& dir, const std::array<std::pair<int64_t, int64_t>, 3>& ranges,
                           const PieceSink& sink, int64_t total, const CheckpointMeta& expect,
                           const LoadOptions& opts);

// The manifest checks of load/load_range alone (no state is read): what a resume will refuse, known before
// anything of the run directory is touched.
CheckpointMeta check_resumable(const std::string& dir, int64_t total, const CheckpointMeta& expect,
                               const LoadOptions& opts);

// Where the manifest contradicts itself: step, tokens and the loader state against data_history, the loader state
// against the config it records (seed, batch shape), the dataset fingerprint and the data layout, the shard list.
// Each problem names the file, the key, both values and the fix; empty = consistent. load, load_range,
// check_resumable and verify refuse a manifest with any.
std::vector<std::string> record_problems(const std::string& dir);

// The manifest's checksum (manifest_xxh3): XXH3-64 of the compact JSON of `m` without that key.
std::string manifest_checksum(nlohmann::json m);

// Verifies every byte of a checkpoint without a model: manifest, shards, every tensor's checksums,
// coverage of each flat vector, and the whole-state digests. Returns problems (empty = intact). Streams: the
// vectors are read in order, one frame at a time, into running digests, so the peak does not grow with the model
// beyond the headers and one frame (an entry, in format 2).
// progress(bytes read, bytes to read) after each frame, for a long verify's progress line.
std::vector<std::string> verify(const std::string& dir,
                                const std::function<void(uint64_t done, uint64_t total)>& progress = {});

// One flat vector of a checkpoint ("params", "adam_m" or "adam_v") read once, in order, frame by frame: each frame
// verified as it is read and the vector's Merkle root checked against the manifest's digest at the end (finish). A
// model's weights for a tool that streams them (export-hf) without holding the vector: its peak is the shard
// headers and one frame (an entry, in format 2).
class VectorReader {
 public:
  VectorReader(const std::string& dir, const std::string& vector);
  ~VectorReader();
  VectorReader(const VectorReader&) = delete;
  VectorReader& operator=(const VectorReader&) = delete;
  int64_t total() const;
  // Floats [a, b) of the vector into out; a is where the previous read ended (0 first).
  void read(int64_t a, int64_t b, float* out);
  // Throws naming the checkpoint unless the whole vector was read and its digest is the manifest's (once; again: no-op).
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Human-readable summary: step, config, shards, tensors, sizes, compression, digests.
std::string inspect(const std::string& dir, bool per_tensor);

std::string step_dir_name(int64_t step);
int64_t manifest_step(const std::string& dir);  // the step a checkpoint holds (reads its manifest)  // "step00000010"

}  // namespace olmoref::ckpt
