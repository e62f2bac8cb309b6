#include "ckpt/sharded_save.h"

namespace olmoref::ckpt {

std::string save_sharded(const std::string& root, const CheckpointMeta& meta, const std::vector<Segment>& segments,
                         const SaveOptions& opts, const dist::ShardedState& state, const ShardBuffers& buffers,
                         StateDigest& digest, uint64_t& pieces_sent) {
  const dist::Layout& layout = state.layout;
  // Rank 0 writes the manifest and renames the directory only after every shard is in place (the barrier), so a
  // checkpoint is never marked complete while a shard is missing.
  const bool rank0 = state.world.rank() == 0;
  const std::string tmp = begin_save(root, meta.step, rank0);
  state.world.barrier("checkpoint: temporary directory created");
  // Every rank writes what it holds: the moments of its optimizer range (the distributed optimizer keeps them there,
  // whole, at any layout), and replicate group 0 the parameters of its shard's range. Only expert-resident state
  // leaves a writer without some of its parameters; it receives them first (dist::collect_pieces), so a file never
  // depends on --ep.
  const int64_t lo = layout.lo(), hi = layout.hi(), olo = layout.optimizer_lo(), ohi = layout.optimizer_hi();
  const bool writes_params = layout.replicate_index() == 0;
  std::vector<float> collected;
  const bool params_collected = !dist::holds_whole_shards(state, dist::Span::shard);
  if (params_collected) {
    std::vector<dist::Ranges> want(static_cast<size_t>(layout.world()));
    for (int s = 0; s < layout.dp_shard; ++s) want[static_cast<size_t>(s)] = {{layout.begin(s), layout.end(s)}};
    collected = dist::collect_pieces(state, buffers.params, dist::Span::shard, want, pieces_sent);
  }
  ShardContents contents;
  contents.ranges = {{{lo, writes_params ? hi : lo}, {olo, ohi}, {olo, ohi}}};
  const bool host = state.ex.host_memory();
  // Frame by frame from the live state: in host memory where it lies, else through the writer's frame buffer.
  contents.read = [&](int v, int64_t a, int64_t b, float* scratch) -> const float* {
    if (v == 0 && params_collected) return collected.data() + (a - lo);
    const Buffer<float>& buf = v == 0 ? buffers.params : v == 1 ? buffers.adam_m : buffers.adam_v;
    const int64_t base = v == 0 ? lo : olo;
    if (host) return buf.data() + (a - base);
    buf.download(scratch, b - a, a - base);
    return scratch;
  };
  const ShardRecord mine = write_shard(tmp, layout.rank, contents, segments, opts, meta.step);
  std::vector<float>().swap(collected);
  const StateDigests digests{digest(buffers.params, dist::Span::shard, pieces_sent),
                             digest(buffers.adam_m, dist::Span::optimizer, pieces_sent),
                             digest(buffers.adam_v, dist::Span::optimizer, pieces_sent)};
  // Rank 0 learns every file's size and header checksum from its writer: it reads nothing back.
  std::vector<ShardRecord> records(static_cast<size_t>(layout.world()));
  state.world.allgather(&mine, sizeof mine, records.data(), "checkpoint: every shard's size and header checksum");
  std::string dir = root + "/" + step_dir_name(meta.step);
  if (rank0) dir = finish_save(root, tmp, meta, layout.total, digests, opts, std::move(records));
  state.world.barrier("checkpoint: manifest written");
  return dir;
}

}  // namespace olmoref::ckpt
