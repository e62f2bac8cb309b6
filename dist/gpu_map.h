// dist/gpu_map.h — which GPU each rank drives: one rank per GPU on a node, decided by the node's own ranks.
//
// A job started with `mpirun -np 8` on an 8-GPU node gives every process the same view of the devices; unless each
// picks its own, all eight land on device 0 (and the second one out of memory while the rest wait). Each rank's
// local rank (its rank among the processes sharing this node's memory, whatever launcher started them) picks the
// device, and the ranks of a node then compare the devices' identities: a launcher that hands each process its own
// CUDA_VISIBLE_DEVICES shows every rank "device 0", but distinct GPUs, which is fine; two ranks on one GPU are
// refused unless asked for (checks on one card).
#pragma once

#include <string>
#include <vector>

#include "dist/comm.h"

namespace olmoref::dist {

struct GpuSlot {
  int world_rank = 0;
  int node = 0;      // the node's first world rank (the ranks sharing this node's memory): names the node
  std::string host;
  int device = -1;   // the CUDA device index this rank selected (within its visible devices)
  std::string id;    // the device's identity (its UUID), equal on every rank that drives the same GPU
  std::string name;  // e.g. "NVIDIA H200"
};

// The device of local rank `local_rank` among `device_count` visible ones: rank i drives device i, wrapping when
// the node has more ranks than devices (check_gpu_sharing then refuses or allows it). Throws when none is visible.
int device_for_local_rank(int local_rank, int device_count);

// Every rank's slot (any order; nodes told apart by `node`). Throws unless each GPU of each node is driven by one
// rank, or allow_shared; the message names the GPU, the ranks that share it and the fix. nccl (train --transport
// nccl): NCCL refuses two ranks of a communicator on one GPU, so sharing is refused even when allowed. Every rank
// judges the same slots, so every rank throws the same, and none is left waiting in a collective.
void check_gpu_sharing(const std::vector<GpuSlot>& slots, bool allow_shared, bool nccl = false);

// Every rank's slot, in rank order (a collective over comm).
std::vector<GpuSlot> gather_gpu_slots(Comm& comm, const GpuSlot& mine);

}  // namespace olmoref::dist
