// dist/nccl_comm.h — the device-resident transport: the FSDP unit gathers, the gradient exchange to the owners, the
// parameter all-gather after the optimizer, the expert rows and context parallelism's gathers and chains moved by NCCL
// between executor buffers, so no byte of them crosses the host.
//
// Data movement only: NCCL's point-to-point sends and receives, in one group per exchange, never its reductions
// (olmoref's own tree does every sum, docs/canonical/step.md). Each exchange is an ExchangePlan that the caller
// builds from the layout alone; the MPI transport stages the same blocks through the host (dist::Comm), so the
// transport a run picks (`train --transport mpi|nccl`) never changes a byte that lands.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/exchange_plan.h"
#include "core/executor.h"
#include "dist/comm.h"

namespace olmoref::dist {

enum class Transport {
  mpi,   // every exchange staged through host memory and moved by MPI (the CPU's transport, and the fallback)
  nccl,  // the FSDP gathers, the owners' exchange and the parameter all-gather on the device by NCCL
};
const char* transport_name(Transport t);
// "mpi" or "nccl"; anything else throws naming the choices.
Transport parse_transport(const std::string& name);

using olmoref::ExchangePlan;  // core/exchange_plan.h
using olmoref::Piece;

// The exchanges --transport nccl moves, by the name each collective reports (`train --report-comm`); the rest (the
// step's scalars, the expert row counts, context parallelism's host-side gathers of routing rows and loss terms, the
// checkpoint's pieces) stay on MPI through the host.
inline constexpr const char* kUnitGather = "gather parameters of a unit";
inline constexpr const char* kOwnerExchange = "all-to-all gradient subtrees of a unit";
inline constexpr const char* kParamAllGather = "all-gather updated parameters";
inline constexpr const char* kExpertRows = "all-to-all of expert rows";
inline constexpr const char* kContextGather = "context parallelism: all-gather positions";
inline constexpr const char* kContextChain = "context parallelism: a gradient chain to the next rank";
inline constexpr const char* kNcclExchanges[] = {kUnitGather, kOwnerExchange, kParamAllGather, kExpertRows,
                                                 kContextGather, kContextChain};

// NCCL takes at most 2048 operations between ncclGroupStart and ncclGroupEnd (its user guide, "Group Calls").
inline constexpr int kNcclMaxGroupOps = 2048;

// One send or receive of an exchange: piece `index` of the plan's list for `peer`.
struct NcclOp {
  bool send = false;
  int peer = 0;
  int64_t index = 0;
};
// The plan's sends and receives of `rank` in rounds of at most max_ops operations (>= 2), one NCCL group each, issued
// in order. Piece i to or from peer q falls in round (i / M) · R + (rank + q) mod R, with R = ceil(2·ranks / max_ops)
// classes of peers and M pieces per peer a round: the same round at both ends of the pair, so a round's operations
// meet their matches in the same round and no round waits on a later one. Empty pieces get no operation (both ends
// skip them alike); a round may be empty (no group is issued for it), so that round k is the same round everywhere.
std::vector<std::vector<NcclOp>> nccl_rounds(const ExchangePlan& plan, int rank, int max_ops = kNcclMaxGroupOps);

// Whether this build can move data by NCCL (a CUDA build with the toolkit's NCCL).
bool nccl_built();

// The host execution's side stream under the tests' stand-in NCCL (tests/dist/nccl_standin.cpp): groups queued on it
// run later, in order, on a worker thread, so that a wait the device needs and the code lacks shows in cuda-host's
// bits. create: nullptr unless the NCCL loaded is the stand-in; synchronize: the host waits for what is queued;
// destroy: after running it; queue: task(arg) runs there in order with the groups (the executor's ops on the side
// stream: dist::SideStream::run).
void* standin_stream_create();
void standin_stream_synchronize(void* stream);
void standin_stream_destroy(void* stream);
void standin_stream_queue(void* stream, void (*task)(void*), void* arg);

class NcclComm {
 public:
  // Collective over `group`: its rank 0 makes NCCL's unique id and the group's MPI communicator hands it out. Every
  // exchange reads and writes `ex`'s memory, which must be a device's (executor "cuda"); the host execution
  // (cuda-host) is accepted only under the tests' stand-in NCCL (tests/dist/nccl_standin.cpp), which moves host
  // memory over MPI.
  NcclComm(Comm& group, Executor& ex);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // TEST ONLY: fewer operations per NCCL group than NCCL's limit, so that small runs take the split path.
  void set_max_group_ops(int n) { max_group_ops_ = n; }
  // The plan as NCCL groups of sends and receives (a piece to or from oneself included; one group unless the plan
  // has more operations than a group takes: nccl_rounds), queued on the stream the executor's kernels run on (the
  // default stream), so they run after the kernels that wrote the sources and before those that read the
  // destinations, with no wait on the host. A piece's `buffer` indexes src (sends) or dst (receives).
  // stream: a cudaStream_t other than the default (the prefetch's side stream, kernels::SideStream), whose ordering
  // against the executor's work the caller then keeps.
  void exchange(const std::vector<const float*>& src, const std::vector<float*>& dst, const ExchangePlan& plan,
                const char* what, void* stream = nullptr);
  void exchange(const float* src, float* dst, const ExchangePlan& plan, const char* what, void* stream = nullptr) {
    exchange(std::vector<const float*>{src}, std::vector<float*>{dst}, plan, what, stream);
  }

  // Bytes sent to other ranks, in all and by `what` (merged into `train --report-comm`, like dist::Comm's).
  uint64_t bytes_sent() const { return bytes_sent_; }
  const std::map<std::string, uint64_t>& bytes_sent_by_what() const { return bytes_sent_by_what_; }

 private:
  struct Handle;
  std::unique_ptr<Handle> handle_;
  int rank_ = 0, size_ = 1;
  int max_group_ops_ = kNcclMaxGroupOps;
  uint64_t bytes_sent_ = 0;
  std::map<std::string, uint64_t> bytes_sent_by_what_;
};

}  // namespace olmoref::dist
