// data/planted_bugs.h — TEST-ONLY switches that make the real Loader misbehave the way real loaders
// have misbehaved (leakage, duplication or skipping after a resume, a reshard or a bad mix), so the leakage detector (data/leakcheck.h, data/audit_check.h) can be
// shown to catch every class. Set through LoaderConfig::debug_bug; the default (none) leaves every
// code path of the loader as it is. Nothing outside tests and `olmoref leakcheck --debug-plant-bug`
// may set it.
//
// Each switch changes the loader itself (its order, its rows, its restore, the dataset it serves),
// not a copy of it: the detector sees exactly what a trainer would have been fed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace olmoref::data {

class Loader;
struct LoaderState;
struct GlobalBatch;

enum class PlantedBug : uint8_t {
  none = 0,
  // rank r shuffles with seed + r, so the ranks' slices are not a partition of the global batch
  // (sandyresearch/parcae #10, karpathy/llm.c #792, NVlabs/LongLive #71, HF datasets #5696).
  per_rank_shuffle_seed,
  // every rank takes the first block of the row (one shuffle stream per rank/worker): the global
  // batch holds each of those instances W times (dreamzero0/dreamzero #91).
  same_stream_per_rank,
  // ranks > 0 never move to the next epoch's shuffle (a cyclic sampler whose set_epoch is not
  // called everywhere): from epoch 2 on the ranks disagree (NVIDIA-NeMo/Megatron-Bridge PR #5944).
  epoch_misaligned_ranks,
  // instead of cropping the epoch to whole global batches, the last partial batch is padded with the
  // epoch's first instances (pytorch/pytorch #25162, PR #41171).
  tail_padding_duplicates,
  // a stray peek (`next(iter(loader))`) consumes the first batch before training starts
  // (allenai/open-instruct PR #1620).
  off_by_one_peek,
  // a resume rebuilds the epoch-1 order whatever the epoch, replaying seen instances
  // (huggingface/accelerate #2016, PR #4071; modelscope/ms-swift #10050).
  resume_replays_first_epoch,
  // a resume fast-forwards by the number of optimizer steps counted as micro-batches, ignoring
  // gradient accumulation: data is revisited (EleutherAI/gpt-neox PR #308).
  fast_forward_ignores_accumulation,
  // a resume fast-forwards twice: data is skipped (k2-fsa/icefall #473).
  fast_forward_twice,
  // a resume exactly at an epoch boundary skips the whole next epoch (verl-project/verl #7401).
  resume_at_epoch_boundary_skips_epoch,
  // the first holdout file is also listed in the training mix.
  holdout_file_in_train_mix,
  // the holdout is carved out of the head of the corpus (the holdout files come first), but the
  // training side starts at a fifth of the carve-out, so 80% of the holdout is trained on (the
  // --val-docs=10000 vs first-50k-documents bug, openai/parameter-golf #2127).
  holdout_carveout_overlap,
  // the corpus (training + holdout files) is oversampled 2x and only then split by position: the
  // holdout is the last copy of the holdout files, training is everything before it, which
  // includes the first copy (MakazhanAlpamys/Soup #680).
  oversample_before_split,
};

const char* planted_bug_name(PlantedBug b);         // e.g. "per-rank-shuffle-seed"
PlantedBug parse_planted_bug(std::string_view name);  // throws listing the names
std::vector<PlantedBug> all_planted_bugs();           // every class except none

// Loader state that only the switches use (a member of Loader; all zero when debug_bug is none).
struct PlantedBugState {
  int64_t id_offset = 0;              // delivered id = id_offset + the order's id
  int64_t id_count = -1;              // instances the order is built over (-1: the whole dataset)
  int64_t order_epoch_override = 0;   // > 0: build every order with this epoch
  int64_t clean_batches_per_epoch = 0;
};

// The hooks the loader calls when debug_bug is set (a friend of Loader; planted_bugs.cpp).
struct PlantedBugHooks {
  static void after_construct(Loader& l);  // rebuilds the served dataset, pads, peeks
  static void order_key(const Loader& l, uint64_t& seed, int64_t& epoch, int64_t& n_instances);
  static void fill_row(Loader& l, std::vector<int64_t>& ids);  // ids of the next row (batches_processed_)
  static void after_restore(Loader& l, const LoaderState& s);
};

}  // namespace olmoref::data
