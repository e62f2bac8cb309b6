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
  std::vector<float> hp, hm, hv;  // device executors: the state comes to the host once, for the write
  const float *p_host = nullptr, *m_host = nullptr, *v_host = nullptr;
  if (state.placement.drops_any()) {
    // Expert-resident state: the writers (replicate group 0) receive the experts their group does not hold.
    std::vector<dist::Ranges> whole(static_cast<size_t>(layout.world()));
    for (int s = 0; s < layout.dp_shard; ++s) whole[static_cast<size_t>(s)] = {{layout.begin(s), layout.end(s)}};
    hp = dist::collect_pieces(state, buffers.params, whole, pieces_sent);
    hm = dist::collect_pieces(state, buffers.adam_m, whole, pieces_sent);
    hv = dist::collect_pieces(state, buffers.adam_v, whole, pieces_sent);
    p_host = hp.data(), m_host = hm.data(), v_host = hv.data();
  } else {
    p_host = dist::host_view(buffers.params, state.ex, hp), m_host = dist::host_view(buffers.adam_m, state.ex, hm);
    v_host = dist::host_view(buffers.adam_v, state.ex, hv);
  }
  // write_shard only reads them; StateVectors is the format's type for reading and writing alike.
  const StateVectors local{layout.hi() - layout.lo(), const_cast<float*>(p_host), const_cast<float*>(m_host),
                           const_cast<float*>(v_host)};
  if (layout.replicate_index() == 0)
    write_shard(tmp, layout.shard_index(), local, layout.lo(), layout.hi(), segments, opts, meta.step);
  std::vector<float>().swap(hp), std::vector<float>().swap(hm), std::vector<float>().swap(hv);
  const StateDigests digests{digest(buffers.params, pieces_sent), digest(buffers.adam_m, pieces_sent),
                             digest(buffers.adam_v, pieces_sent)};
  state.world.barrier("checkpoint: every shard written");
  std::string dir = root + "/" + step_dir_name(meta.step);
  if (rank0) dir = finish_save(root, tmp, meta, layout.total, digests, opts);
  state.world.barrier("checkpoint: manifest written");
  return dir;
}

}  // namespace olmoref::ckpt
