// train/config.h — the run configuration, read from TOML (TorchTitan's convention) with
// `--set section.key=value` overrides. Unknown keys and inconsistent values are errors that name the key.
// Every key is one entry of the table in train/config_keys.cpp: reading, validation, the resolved TOML and the
// hashes all come from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/optim.h"

namespace olmoref {

struct TrainLoopConfig {
  int64_t seq_len = 0;
  int64_t micro_batch_instances = 1;   // instances per forward/backward (any; never changes the bits)
  int64_t global_batch_instances = 1;  // a whole number of micro-batches
  int64_t steps = 1;
  double z_loss = 1e-5;
  std::string precision = "fp32";      // fp32, or bf16 (the Olmo 3 recipe: docs/canonical/bf16.md)
  std::string executor = "cpu";        // cpu | cuda | cuda-host (core/executor.h); every one gives the same bits
  // OLMo-core's names: "none", "full" (each block's forward again in its backward; model/olmo3.h
  // ActivationCheckpointing) or "selected_blocks" (blocks 0, n, 2n, ... for activation_checkpointing_block_interval
  // = n, OLMo-core's block_interval). Same bits in every mode, so a resume may change them.
  std::string activation_checkpointing = "none";
  int64_t activation_checkpointing_block_interval = 0;
  // Context parallelism (OLMo-core's TransformerContextParallelConfig.llama3 degree): groups of cp_degree consecutive
  // ranks each compute seq_len / cp_degree positions of every instance of a micro-batch. Same bits at every degree, so
  // a resume may change it.
  int64_t cp_degree = 1;
  int64_t log_every = 1;
};

struct DataConfig {
  std::vector<std::string> train_files;  // token files, in mix order
  std::string train_mix;                 // or a mix file (one path per line, optional label)
  std::vector<std::string> holdout_files;
  std::string holdout_mix;
  std::string dtype = "auto";            // u16, u32, or auto (smallest that holds vocab_size - 1)
  uint64_t seed = 34521;                 // OLMo-core's data seed; the shuffle uses seed + epoch
  int64_t eos_id = -1;                   // counts documents in reports; -1: unknown
  // Intra-document masking (docs/canonical/documents.md): each instance cut into documents at eos_id, attention kept
  // inside a document and RoPE at the position in it, as OLMo-core's generate_doc_lengths (Olmo 3's stage 3).
  bool document_masking = false;
  bool audit = false;                    // write OUT/audit.jsonl (one record per instance per step)
  // OLMo-core's max_target_sequence_length (0: none): files cut at multiples of it, its seq_len-instances kept
  // together by the shuffle (data/dataset.h). The official Olmo 3 scripts set it.
  int64_t max_target_sequence_length = 0;
  // OLMo-core's mix files name paths relative to a base directory, with a {TOKENIZER} placeholder
  // (data/mix.h MixResolve): the base directory and the tokenizer's directory name in the corpus.
  std::string mix_base_dir;
  std::string mix_tokenizer;
  // Only for OLMo-core's dataset fingerprint, which hashes them (reported in the manifest, checked against an
  // OLMo-core checkpoint): the pad and bos ids its run configured; -1: unknown / none.
  int64_t pad_id = -1;
  int64_t bos_id = -1;
  // Start the data order where an OLMo-core run's loader stopped: its checkpoint (save folder or stepN).
  std::string olmo_core_state;
};

struct CheckpointConfig {
  int64_t interval = 0;     // save every N steps (0: only at the end of the run)
  int64_t keep_last = 3;    // complete checkpoints kept; the newest is never deleted
  int64_t zstd_level = 3;
  int64_t zstd_threads = 0; // 0: the run's thread count
};

// The in-loop memorization backstop (train/eval.h): holdout vs a sealed fresh split. Evaluation
// never changes training, so none of this enters resume_hash().
struct EvalConfig {
  int64_t interval = 0;                  // evaluate every N steps (0: off)
  int64_t instances = 32;                // evenly spaced instances of each set (a fixed subset)
  std::vector<std::string> fresh_files;  // the sealed fresh split: token files no training mix names
  std::string fresh_mix;                 // or its mix file
  int64_t bootstrap = 1000;              // resamples for the confidence interval of the gap
  // Flag when the (1 - alpha) interval lies below zero. 0.01, not 0.05: the test runs at every
  // evaluation of a run, and a false alarm at each one adds up.
  double alpha = 0.01;
  uint64_t seed = 0;                     // bootstrap RNG seed (counter-based, RngPurpose::bootstrap)
};

// Where the step-0 weights come from (train/weights.h). Empty: the init (model.init_std, model.init_seed). Written by
// to_toml only when set, so the configs and hashes of runs that start from the init are what they always were.
struct InitConfig {
  std::string hf_dir;     // a Hugging Face Olmo 3 checkpoint (`train --init-from-hf DIR`); a path, not hashed
  std::string hf_sha256;  // its weights' SHA-256 (filled at the start of the run; part of resume_hash)
  // Or another olmoref run's checkpoint (a stepNNNNNNNN directory): a new run from its weights and, with
  // load_optimizer, its optimizer state (Olmo 3's stage 2; docs/formats/checkpoint.md). The path is not hashed;
  // checkpoint_xxh3, the source manifest's own checksum (manifest_xxh3, which covers its state digests), is.
  std::string checkpoint;
  bool load_optimizer = true;
  std::string checkpoint_xxh3;  // filled at the start of the run (resolve_checkpoint_init); may be pinned
};

struct TrainConfig {
  ModelConfig model;
  TrainLoopConfig train;
  AdamWConfig optim;
  ScheduleConfig schedule;
  DataConfig data;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  InitConfig init;
  std::string source_path;   // the TOML file it came from (empty when built in code)
  std::vector<std::string> overrides;

  // The last micro-batch of a step may be shorter (core/instance_tree.h: BatchSplit).
  int64_t micro_batches_per_step() const {
    return (train.global_batch_instances + train.micro_batch_instances - 1) / train.micro_batch_instances;
  }
  int64_t targets_per_step() const { return train.global_batch_instances * (train.seq_len - 1); }
  void validate() const;                // throws std::invalid_argument naming the key
  // "FILE: msg" (FILE: source_path; msg alone for a config built in code): for errors about this config found after
  // it was loaded, so they name the file as load_config's own errors do.
  std::string in_file(const std::string& msg) const { return source_path.empty() ? msg : source_path + ": " + msg; }
  std::string to_toml() const;          // resolved configuration, stable key order
  // Hashes of what must match to resume a run bit for bit: the [model] section alone, and
  // everything that shapes the numbers (model, batch shape, precision, optimizer, schedule, steps,
  // data order settings). Checkpoint, logging and data paths are excluded (data is fingerprinted).
  std::string model_hash() const;
  std::string resume_hash() const;
  // The PyTorch replays (golden/replay/replay.py, golden/parity/hf_parity.py) re-implement plain AdamW with the
  // Olmo 3 default groups (embeddings without weight decay). Empty when this config's optimizer is that one; else
  // what they cannot replay, naming the key, so a bundle for them is refused instead of compared wrongly.
  std::string pytorch_replay_unsupported() const;
};

// Reads and validates FILE, applying overrides of the form "section.key=value" (value in TOML syntax;
// a bare word is taken as a string). Errors name the file and the key.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
TrainConfig parse_config_text(const std::string& toml_text, const std::string& origin,
                              const std::vector<std::string>& overrides = {});

// The keys behind a resume_hash mismatch, each "section.key: RECORDED -> NOW" (values as TOML writes them), in the
// written order; empty when the two agree on every key the hash covers.
std::vector<std::string> resume_key_differences(const TrainConfig& recorded, const TrainConfig& now);

}  // namespace olmoref
