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
  // Each writer (replicate group 0, one per shard) needs its shard's whole range of every vector. A vector whose
  // ranks hold their whole shards is read where it lies (on a device executor its host copy, once, for the write);
  // else (moments split over the replicas, expert-resident state) the writers receive the pieces they lack.
  std::vector<dist::Ranges> whole(static_cast<size_t>(layout.world()));
  for (int s = 0; s < layout.dp_shard; ++s) whole[static_cast<size_t>(s)] = {{layout.begin(s), layout.end(s)}};
  auto writer_copy = [&](const Buffer<float>& b, dist::Span span, std::vector<float>& staging) {
    if (dist::holds_whole_shards(state, span)) return dist::host_view(b, state.ex, staging);
    staging = dist::collect_pieces(state, b, span, whole, pieces_sent);
    return static_cast<const float*>(staging.data());
  };
  std::vector<float> hp, hm, hv;
  const float* p_host = writer_copy(buffers.params, dist::Span::shard, hp);
  const float* m_host = writer_copy(buffers.adam_m, dist::Span::optimizer, hm);
  const float* v_host = writer_copy(buffers.adam_v, dist::Span::optimizer, hv);
  // write_shard only reads them; StateVectors is the format's type for reading and writing alike.
  const StateVectors local{layout.hi() - layout.lo(), const_cast<float*>(p_host), const_cast<float*>(m_host),
                           const_cast<float*>(v_host)};
  if (layout.replicate_index() == 0)
    write_shard(tmp, layout.shard_index(), local, layout.lo(), layout.hi(), segments, opts, meta.step);
  std::vector<float>().swap(hp), std::vector<float>().swap(hm), std::vector<float>().swap(hv);
  const StateDigests digests{digest(buffers.params, dist::Span::shard, pieces_sent),
                             digest(buffers.adam_m, dist::Span::optimizer, pieces_sent),
                             digest(buffers.adam_v, dist::Span::optimizer, pieces_sent)};
  state.world.barrier("checkpoint: every shard written");
  std::string dir = root + "/" + step_dir_name(meta.step);
  if (rank0) dir = finish_save(root, tmp, meta, layout.total, digests, opts);
  state.world.barrier("checkpoint: manifest written");
  return dir;
}

}  // namespace olmoref::ckpt
