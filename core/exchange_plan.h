// core/exchange_plan.h — one exchange of floats among the ranks of a group, as the pieces each rank sends and receives:
// what a device-resident transport (dist/nccl_comm.h) moves between buffers in executor memory, one NCCL group per
// plan. The model builds the expert exchange's plans (model/ep_exchange.cpp), dist/ the FSDP gathers', the owners'
// exchange's and the parameter all-gather's, each from the layout alone, so both ends of every pair agree.
#pragma once

#include <cstdint>
#include <vector>

namespace olmoref {

// `n` floats at `at` floats into buffer `buffer` of the exchange's list (of sources for a send, of destinations for
// a receive).
struct Piece {
  int64_t at = 0, n = 0;
  int buffer = 0;
};

// send[q]: the pieces this rank sends group rank q, in order; recv[q]: the pieces it fills from q, in order. Rank q's
// pieces to me match my pieces from q one for one, in length (NCCL pairs the i-th send with the i-th receive).
struct ExchangePlan {
  std::vector<std::vector<Piece>> send, recv;
  explicit ExchangePlan(int ranks) : send(static_cast<size_t>(ranks)), recv(static_cast<size_t>(ranks)) {}
};

}  // namespace olmoref
