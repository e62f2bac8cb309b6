// model/idle_pass.cpp — the collectives of a pass without instances. A data-parallel rank with fewer micro-batches
// than others in its groups still joins every parameter gather (FSDP) and, under expert parallelism, every MoE
// layer's exchange, serving as an expert owner, so every communicator sees the same sequence of collectives on
// every rank (docs/canonical/moe.md "Lockstep").
#include "model/olmo3.h"

namespace olmoref {

void Olmo3::idle_pass(const float* params) {
  const bool ep = ep_ != nullptr && cfg_.moe.enabled();
  if (!gate_ && !ep) return;
  ep_now_ = ep ? ep_ : nullptr;
  auto unit = [&](int u, auto&& body) {
    if (gate_) gate_->acquire(u);
    body();
    if (gate_) gate_->release(u);
  };
  // forward: embedding, blocks 0..L-1, head; backward: head, blocks L-1..0 (the embedding's backward reads
  // no parameter). Must match Olmo3::forward and forward_backward (model/olmo3.cpp), collective for collective.
  const int head = n_units() - 1;
  unit(0, [] {});
  for (int64_t l = 0; l < cfg_.n_layers; ++l)
    unit(static_cast<int>(l) + 1, [&] {
      if (ep) ep_forward(params, layout_.blocks[static_cast<size_t>(l)], l, nullptr, nullptr, nullptr, nullptr);
    });
  unit(head, [] {});
  unit(head, [] {});
  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l)
    unit(static_cast<int>(l) + 1, [&] {
      if (!ep) return;
      const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
      // Full activation checkpointing: the block's recomputed forward exchanges its rows again before backward.
      if (checkpointing_ == ActivationCheckpointing::full) ep_forward(params, o, l, nullptr, nullptr, nullptr, nullptr);
      ep_backward(params, o, l, nullptr, nullptr, nullptr, nullptr, nullptr);
    });
  ep_now_ = nullptr;
}

}  // namespace olmoref
