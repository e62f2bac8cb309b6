#include "dist/nccl_comm.h"

#include <dlfcn.h>

#include <stdexcept>

#if OLMOREF_HAVE_NCCL
#include <nccl.h>
#endif

namespace olmoref::dist {

const char* transport_name(Transport t) { return t == Transport::nccl ? "nccl" : "mpi"; }

Transport parse_transport(const std::string& name) {
  if (name == "mpi") return Transport::mpi;
  if (name == "nccl") return Transport::nccl;
  throw std::invalid_argument("--transport " + name + ": not a transport (mpi: staged through the host, the CPU's; "
                              "nccl: on the device, with --executor cuda)");
}

bool nccl_built() { return OLMOREF_HAVE_NCCL != 0; }

namespace {
// The executor's memory is what NCCL moves: a device's, or, under the tests' stand-in NCCL (which exports this
// symbol), the host memory that cuda-host stands in for the device with.
void check_memory(const Executor& ex) {
  if (ex.name() == "cuda") return;
  if (ex.name() == "cuda-host" && dlsym(RTLD_DEFAULT, "olmoref_nccl_standin") != nullptr) return;
  throw std::invalid_argument("--transport nccl moves device memory, and executor " + ex.name() +
                              " keeps its tensors in host memory: run it with --executor cuda, or use --transport mpi");
}
}  // namespace

#if OLMOREF_HAVE_NCCL

struct NcclComm::Handle {
  ncclComm_t comm = nullptr;
};

namespace {
void check(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess) return;
  std::string detail = ncclGetErrorString(r);
  if (comm)
    if (const char* last = ncclGetLastError(comm); last && *last) detail += ": " + std::string(last);
  throw std::runtime_error("NCCL: " + what + ": " + detail);
}
}  // namespace

NcclComm::NcclComm(Comm& group, Executor& ex) : handle_(std::make_unique<Handle>()) {
  check_memory(ex);
  rank_ = group.rank(), size_ = group.size();
  ncclUniqueId id{};
  if (rank_ == 0) check(ncclGetUniqueId(&id), nullptr, "making the group's unique id");
  group.broadcast(&id, sizeof id, 0, "NCCL: the group's unique id");
  check(ncclCommInitRank(&handle_->comm, size_, id, rank_), nullptr,
        "joining a group of " + std::to_string(size_) + " ranks as rank " + std::to_string(rank_));
}

NcclComm::~NcclComm() {
  if (handle_->comm) ncclCommDestroy(handle_->comm);
}

void NcclComm::exchange(const float* src, float* dst, const ExchangePlan& plan, const char* what) {
  if (static_cast<int>(plan.send.size()) != size_ || static_cast<int>(plan.recv.size()) != size_)
    throw std::logic_error(std::string(what) + ": an exchange plan for " + std::to_string(plan.send.size()) +
                           " ranks on a group of " + std::to_string(size_));
  ncclComm_t c = handle_->comm;
  // The default stream (cudaStreamLegacy): the executor's kernels and copies run there, so the group is ordered
  // after the writes of its sources and before the reads of its destinations.
  check(ncclGroupStart(), c, what);
  for (int q = 0; q < size_; ++q) {
    for (const Piece& p : plan.send[static_cast<size_t>(q)]) {
      if (p.n == 0) continue;
      check(ncclSend(src + p.at, static_cast<size_t>(p.n), ncclFloat32, q, c, nullptr), c, what);
      if (q != rank_) {
        bytes_sent_ += static_cast<uint64_t>(p.n) * sizeof(float);
        bytes_sent_by_what_[what] += static_cast<uint64_t>(p.n) * sizeof(float);
      }
    }
    for (const Piece& p : plan.recv[static_cast<size_t>(q)])
      if (p.n > 0) check(ncclRecv(dst + p.at, static_cast<size_t>(p.n), ncclFloat32, q, c, nullptr), c, what);
  }
  check(ncclGroupEnd(), c, what);
}

#else

struct NcclComm::Handle {};

NcclComm::NcclComm(Comm&, Executor& ex) {
  check_memory(ex);
  throw std::invalid_argument("--transport nccl: this olmoref was built without CUDA's NCCL (tools/build.sh builds "
                              "with it); use --transport mpi");
}
NcclComm::~NcclComm() = default;
void NcclComm::exchange(const float*, float*, const ExchangePlan&, const char*) {
  throw std::logic_error("NcclComm without NCCL");
}

#endif

}  // namespace olmoref::dist
