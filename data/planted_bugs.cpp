// data/planted_bugs.cpp — TEST-ONLY: the loader bug classes of data/planted_bugs.h.
#include "data/planted_bugs.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "data/loader.h"

namespace olmoref::data {

namespace {

struct BugName {
  PlantedBug bug;
  const char* name;
};

constexpr BugName kNames[] = {
    {PlantedBug::none, "none"},
    {PlantedBug::per_rank_shuffle_seed, "per-rank-shuffle-seed"},
    {PlantedBug::same_stream_per_rank, "same-stream-per-rank"},
    {PlantedBug::epoch_misaligned_ranks, "epoch-misaligned-ranks"},
    {PlantedBug::tail_padding_duplicates, "tail-padding-duplicates"},
    {PlantedBug::off_by_one_peek, "off-by-one-peek"},
    {PlantedBug::resume_replays_first_epoch, "resume-replays-first-epoch"},
    {PlantedBug::fast_forward_ignores_accumulation, "fast-forward-ignores-accumulation"},
    {PlantedBug::fast_forward_twice, "fast-forward-twice"},
    {PlantedBug::resume_at_epoch_boundary_skips_epoch, "resume-at-epoch-boundary-skips-epoch"},
    {PlantedBug::holdout_file_in_train_mix, "holdout-file-in-train-mix"},
    {PlantedBug::holdout_carveout_overlap, "holdout-carveout-overlap"},
    {PlantedBug::oversample_before_split, "oversample-before-split"},
};

const Mix& holdout_mix_or_throw(const Loader& l, PlantedBug b) {
  if (l.config().holdout.kind == HoldoutKind::none || l.config().holdout.mix.empty()) {
    throw std::invalid_argument(std::string("planted bug ") + planted_bug_name(b) + " needs a holdout mix");
  }
  return l.config().holdout.mix;
}

std::shared_ptr<const FslDataset> dataset_over(const FslDataset& like, const Mix& mix) {
  DatasetOptions o;
  o.sequence_length = like.sequence_length();
  o.vocab_size = like.vocab_size();
  o.dtype = like.dtype();
  o.eos_id = like.eos_id();
  o.allow_short_files = true;
  return std::make_shared<FslDataset>(mix, o);
}

void append(Mix& to, const Mix& from) { to.entries.insert(to.entries.end(), from.entries.begin(), from.entries.end()); }

// Instances contributed by the files of `mix` (a prefix of the served dataset's mix).
int64_t instances_of_first_files(const FslDataset& ds, size_t n_files) {
  return n_files >= ds.n_files() ? ds.size() : ds.file_first_instance(n_files);
}

}  // namespace

const char* planted_bug_name(PlantedBug b) {
  for (const auto& n : kNames)
    if (n.bug == b) return n.name;
  return "?";
}

PlantedBug parse_planted_bug(std::string_view name) {
  std::string all;
  for (const auto& n : kNames) {
    if (name == n.name) return n.bug;
    all += std::string(all.empty() ? "" : ", ") + n.name;
  }
  throw std::invalid_argument("unknown planted bug '" + std::string(name) + "'; known: " + all);
}

std::vector<PlantedBug> all_planted_bugs() {
  std::vector<PlantedBug> v;
  for (const auto& n : kNames)
    if (n.bug != PlantedBug::none) v.push_back(n.bug);
  return v;
}

void PlantedBugHooks::after_construct(Loader& l) {
  LoaderConfig& c = l.config_;
  c.prefetch = false;  // the hooks change rows; announcing the clean rows would only waste reads
  const FslDataset& clean = *c.dataset;
  const int64_t G = c.global_batch_instances;
  PlantedBugState& d = l.debug_;
  switch (c.debug_bug) {
    case PlantedBug::holdout_file_in_train_mix: {
      Mix m = clean.mix();
      m.entries.push_back(holdout_mix_or_throw(l, c.debug_bug).entries.front());
      c.dataset = dataset_over(clean, m);
      break;
    }
    case PlantedBug::holdout_carveout_overlap: {
      const Mix& h = holdout_mix_or_throw(l, c.debug_bug);
      Mix m = h;  // the corpus: the carve-out (holdout files) first, then the training files
      append(m, clean.mix());
      c.dataset = dataset_over(clean, m);
      const int64_t carve = instances_of_first_files(*c.dataset, h.size());
      d.id_offset = carve / 5;  // should be `carve`: the training side starts inside the carve-out
      d.id_count = c.dataset->size() - d.id_offset;
      break;
    }
    case PlantedBug::oversample_before_split: {
      const Mix& h = holdout_mix_or_throw(l, c.debug_bug);
      Mix once = clean.mix();
      append(once, h);
      Mix m = once;
      append(m, once);  // oversampled 2x
      c.dataset = dataset_over(clean, m);
      // The split by position: the holdout is the last copy of the holdout files, training is
      // everything before it, which still holds the first copy.
      d.id_count = instances_of_first_files(*c.dataset, m.size() - h.size());
      break;
    }
    default:
      break;
  }
  const int64_t n = d.id_count >= 0 ? d.id_count : c.dataset->size();
  l.batches_per_epoch_ = n / G;
  if (c.debug_bug == PlantedBug::tail_padding_duplicates && n % G != 0) l.batches_per_epoch_ = n / G + 1;
  d.clean_batches_per_epoch = n / G;
  l.order_.reset();
  l.ensure_order();
  if (c.debug_bug == PlantedBug::off_by_one_peek) {
    // The stray peek: one batch consumed (and not audited) before the trainer asks for its first.
    ++l.batches_processed_;
  }
}

void PlantedBugHooks::order_key(const Loader& l, uint64_t& seed, int64_t& epoch, int64_t& n_instances) {
  const LoaderConfig& c = l.config_;
  const PlantedBugState& d = l.debug_;
  if (d.id_count >= 0) n_instances = d.id_count;
  if (d.order_epoch_override > 0) epoch = d.order_epoch_override;
  switch (c.debug_bug) {
    case PlantedBug::per_rank_shuffle_seed:
      if (c.rank > 0) seed += static_cast<uint64_t>(c.rank);
      break;
    case PlantedBug::epoch_misaligned_ranks:
      if (c.rank > 0) epoch = 1;
      break;
    default:
      break;
  }
}

void PlantedBugHooks::fill_row(Loader& l, std::vector<int64_t>& ids) {
  const LoaderConfig& c = l.config_;
  const PlantedBugState& d = l.debug_;
  const int64_t G = c.global_batch_instances, b = l.batches_processed_;
  ids.resize(static_cast<size_t>(G));
  if (c.debug_bug == PlantedBug::tail_padding_duplicates && b >= d.clean_batches_per_epoch) {
    // The padded batch: the epoch's remaining instances, then its first ones again.
    uint64_t seed = l.seed_;
    int64_t epoch = l.epoch_, n = c.dataset->size();
    order_key(l, seed, epoch, n);
    const std::vector<uint32_t> perm = numpy_permutation(seed + static_cast<uint64_t>(epoch), n);
    const int64_t start = d.clean_batches_per_epoch * G;
    for (int64_t i = 0; i < G; ++i) {
      const int64_t j = start + i < n ? start + i : start + i - n;
      ids[static_cast<size_t>(i)] = perm[static_cast<size_t>(j)];
    }
    return;
  }
  const std::span<const uint32_t> row = l.order_->batch(b);
  for (int64_t i = 0; i < G; ++i) ids[static_cast<size_t>(i)] = d.id_offset + row[static_cast<size_t>(i)];
  if (c.debug_bug == PlantedBug::same_stream_per_rank && c.world_size > 1) {
    // Every rank's micro-batches hold what rank 0's hold: rank r's k-th micro-batch (m = r + k·W, Loader::
    // microbatches_of_rank) is a copy of rank 0's k-th (m = k·W).
    const int64_t mb = c.microbatch_instances, M = (G + mb - 1) / mb;
    for (int r = 1; r < c.world_size; ++r) {
      if (c.rank >= 0 && r != c.rank) continue;
      for (int64_t m = r; m < M; m += c.world_size) {
        const int64_t from = (m - r) * mb, to = m * mb, len = std::min(mb, G - to);
        if (from + len > G) continue;
        std::copy(ids.begin() + from, ids.begin() + from + len, ids.begin() + to);
      }
    }
  }
}

void PlantedBugHooks::after_restore(Loader& l, const LoaderState& s) {
  const LoaderConfig& c = l.config_;
  switch (c.debug_bug) {
    case PlantedBug::resume_replays_first_epoch:
      l.debug_.order_epoch_override = 1;
      break;
    case PlantedBug::fast_forward_ignores_accumulation:
      // Steps counted as micro-batches: fast-forwards mb/G of the way.
      l.batches_processed_ = s.batches_processed * c.microbatch_instances / c.global_batch_instances;
      break;
    case PlantedBug::fast_forward_twice:
      l.batches_processed_ = std::min(2 * s.batches_processed, l.batches_per_epoch_);
      break;
    case PlantedBug::resume_at_epoch_boundary_skips_epoch:
      if (s.batches_processed == l.batches_per_epoch_) ++l.epoch_;  // next_batch moves on once more
      break;
    default:
      break;
  }
  l.ensure_order();
}

}  // namespace olmoref::data
