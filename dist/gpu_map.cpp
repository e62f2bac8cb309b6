#include "dist/gpu_map.h"

#include <cstring>
#include <map>
#include <stdexcept>

namespace olmoref::dist {

int device_for_local_rank(int local_rank, int device_count) {
  if (device_count < 1)
    throw std::runtime_error("no CUDA device is visible to this rank (check CUDA_VISIBLE_DEVICES and the driver)");
  if (local_rank < 0) throw std::invalid_argument("local rank " + std::to_string(local_rank));
  return local_rank % device_count;
}

void check_gpu_sharing(const std::vector<GpuSlot>& slots, bool allow_shared, bool nccl) {
  if (allow_shared && !nccl) return;
  std::map<std::pair<int, std::string>, std::vector<const GpuSlot*>> by_gpu;
  std::map<int, int> ranks_on_node;
  for (const GpuSlot& s : slots) {
    by_gpu[{s.node, s.id}].push_back(&s);
    ++ranks_on_node[s.node];
  }
  for (const auto& [key, sharing] : by_gpu) {
    if (sharing.size() < 2) continue;
    int gpus_on_node = 0;
    for (const auto& [other, ranks] : by_gpu) gpus_on_node += other.first == key.first;
    std::string ranks;
    for (const GpuSlot* s : sharing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(s->world_rank);
    const GpuSlot& first = *sharing.front();
    if (nccl)
      throw AgreedFailure(
          std::to_string(sharing.size()) + " ranks (" + ranks + ") would drive one GPU on " + first.host +
          " (device " + std::to_string(first.device) + ", " + key.second + ") under --transport nccl, and NCCL " +
          "refuses two ranks of a communicator on one GPU: start at most one rank per GPU, or use --transport mpi " +
          "(with --allow-shared-gpu) for checks on one card");
    throw AgreedFailure(
        std::to_string(sharing.size()) + " ranks (" + ranks + ") would drive one GPU on " + first.host + " (device " +
        std::to_string(first.device) + ", " + first.name + ", " + key.second + "): " +
        std::to_string(ranks_on_node[key.first]) + " ranks on that node, " + std::to_string(gpus_on_node) +
        " GPU(s) among them. Start at most one rank per GPU (Open MPI: mpirun --map-by ppr:N:node, N the node's "
        "GPUs), or pass --allow-shared-gpu to run them on one card anyway (for checks: the card's memory is then "
        "split between them)");
  }
}

namespace {
// One slot as a fixed-size block for allgather: world rank, device, node, then host, id and name, each NUL-terminated
// (cut to what fits; an id is a UUID, far shorter).
constexpr size_t kSlotBytes = 512;

void put(char* block, size_t* at, const std::string& s) {
  if (*at >= kSlotBytes) return;
  const size_t n = std::min(s.size(), kSlotBytes - *at - 1);
  std::memcpy(block + *at, s.data(), n);
  block[*at + n] = '\0';
  *at += n + 1;
}
std::string take(const char* block, size_t* at) {
  if (*at >= kSlotBytes) return "";
  const std::string s(block + *at, strnlen(block + *at, kSlotBytes - *at));
  *at += s.size() + 1;
  return s;
}
}  // namespace

std::vector<GpuSlot> gather_gpu_slots(Comm& comm, const GpuSlot& mine) {
  std::vector<char> send(kSlotBytes, '\0'), recv(kSlotBytes * static_cast<size_t>(comm.size()));
  std::memcpy(send.data(), &mine.world_rank, sizeof(int));
  std::memcpy(send.data() + sizeof(int), &mine.device, sizeof(int));
  std::memcpy(send.data() + 2 * sizeof(int), &mine.node, sizeof(int));
  size_t at = 3 * sizeof(int);
  for (const std::string* s : {&mine.host, &mine.id, &mine.name}) put(send.data(), &at, *s);
  comm.allgather(send.data(), kSlotBytes, recv.data(), "the ranks' GPUs");
  std::vector<GpuSlot> out(static_cast<size_t>(comm.size()));
  for (size_t r = 0; r < out.size(); ++r) {
    const char* block = recv.data() + r * kSlotBytes;
    std::memcpy(&out[r].world_rank, block, sizeof(int));
    std::memcpy(&out[r].device, block + sizeof(int), sizeof(int));
    std::memcpy(&out[r].node, block + 2 * sizeof(int), sizeof(int));
    size_t pos = 3 * sizeof(int);
    out[r].host = take(block, &pos);
    out[r].id = take(block, &pos);
    out[r].name = take(block, &pos);
  }
  return out;
}

}  // namespace olmoref::dist
