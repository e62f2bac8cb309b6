#include "dist/nccl_comm.h"

#include <dlfcn.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

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

std::vector<std::vector<NcclOp>> nccl_rounds(const ExchangePlan& plan, int rank, int max_ops) {
  if (max_ops < 2) throw std::invalid_argument("nccl_rounds: a group must take at least a send and a receive");
  const int64_t n = static_cast<int64_t>(plan.send.size());
  const int64_t classes = std::max<int64_t>(1, (2 * n + max_ops - 1) / max_ops);
  const int64_t peers_per_class = (n + classes - 1) / classes;
  const int64_t per_peer = std::max<int64_t>(1, max_ops / (2 * peers_per_class));
  std::vector<std::vector<NcclOp>> rounds;
  for (int q = 0; q < n; ++q)
    for (const bool send : {true, false}) {
      const std::vector<Piece>& pieces = (send ? plan.send : plan.recv)[static_cast<size_t>(q)];
      for (int64_t i = 0; i < static_cast<int64_t>(pieces.size()); ++i) {
        if (pieces[static_cast<size_t>(i)].n == 0) continue;
        const auto r = static_cast<size_t>((i / per_peer) * classes + (rank + q) % classes);
        if (rounds.size() <= r) rounds.resize(r + 1);
        rounds[r].push_back({send, q, i});
      }
    }
  return rounds;
}

#if OLMOREF_HAVE_NCCL

namespace {

// NCCL's entry points, loaded at run time: libnccl is over 200 MB, so olmoref does not link it (a device call
// carries the binaries and their libraries, 64 MiB in all: tools/gpu_carry.sh); a run asks for it with --transport
// nccl, from the loader's path (the soname, as the NCCL packages and PyTorch's wheels install it) or else the
// toolkit this build was compiled against.
struct NcclApi {
  void* library = nullptr;
  bool standin = false;  // the tests' stand-in (tests/dist/nccl_standin.cpp), which moves host memory
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  const char* (*last_error)(ncclComm_t) = nullptr;  // NCCL 2.13 and later; may be absent
  // The stand-in's host streams (standin_stream_create).
  void* (*stream_create)() = nullptr;
  void (*stream_synchronize)(void*) = nullptr;
  void (*stream_destroy)(void*) = nullptr;
  void (*stream_queue)(void*, void (*)(void*), void*) = nullptr;
};

const NcclApi& nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    std::string tried = "libnccl.so.2";
    a.library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef OLMOREF_NCCL_BUILD_LIBRARY
    if (!a.library) {
      a.library = dlopen(OLMOREF_NCCL_BUILD_LIBRARY, RTLD_NOW | RTLD_LOCAL);
      tried += " (the loader's path), " OLMOREF_NCCL_BUILD_LIBRARY;
    }
#endif
    if (!a.library)
      throw std::runtime_error("--transport nccl: NCCL's library was not found (tried " + tried + "): install NCCL, "
                               "or add the directory that holds libnccl.so.2 to LD_LIBRARY_PATH; or use --transport mpi");
    const auto load = [&a](auto& fn, const char* name, bool required = true) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(a.library, name));
      if (!fn && required)
        throw std::runtime_error(std::string("--transport nccl: the NCCL library found lacks ") + name +
                                 " (NCCL 2.7 or later is needed)");
    };
    load(a.get_unique_id, "ncclGetUniqueId");
    load(a.comm_init_rank, "ncclCommInitRank");
    load(a.comm_destroy, "ncclCommDestroy");
    load(a.group_start, "ncclGroupStart");
    load(a.group_end, "ncclGroupEnd");
    load(a.send, "ncclSend");
    load(a.recv, "ncclRecv");
    load(a.error_string, "ncclGetErrorString");
    load(a.last_error, "ncclGetLastError", false);
    a.standin = dlsym(a.library, "olmoref_nccl_standin") != nullptr;
    if (a.standin) {
      load(a.stream_create, "olmoref_nccl_standin_stream_create");
      load(a.stream_synchronize, "olmoref_nccl_standin_stream_synchronize");
      load(a.stream_destroy, "olmoref_nccl_standin_stream_destroy");
      load(a.stream_queue, "olmoref_nccl_standin_stream_queue");
    }
    return a;
  }();
  return api;
}

// The executor's memory is what NCCL moves: a device's, or, under the tests' stand-in NCCL, the host memory that
// cuda-host stands in for the device with.
void check_memory(const Executor& ex) {
  if (ex.name() == "cuda") return;
  if (ex.name() == "cuda-host" && nccl_api().standin) return;
  throw std::invalid_argument("--transport nccl moves device memory, and executor " + ex.name() +
                              " keeps its tensors in host memory: run it with --executor cuda, or use --transport mpi");
}

void check(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess) return;
  const NcclApi& api = nccl_api();
  std::string detail = api.error_string(r);
  if (comm && api.last_error)
    if (const char* last = api.last_error(comm); last && *last) detail += ": " + std::string(last);
  throw std::runtime_error("NCCL: " + what + ": " + detail);
}

}  // namespace

void* standin_stream_create() { return nccl_api().standin ? nccl_api().stream_create() : nullptr; }
void standin_stream_synchronize(void* stream) { nccl_api().stream_synchronize(stream); }
void standin_stream_destroy(void* stream) { nccl_api().stream_destroy(stream); }
void standin_stream_queue(void* stream, void (*task)(void*), void* arg) { nccl_api().stream_queue(stream, task, arg); }

struct NcclComm::Handle {
  ncclComm_t comm = nullptr;
};

NcclComm::NcclComm(Comm& group, Executor& ex) : handle_(std::make_unique<Handle>()) {
  check_memory(ex);
  const NcclApi& api = nccl_api();
  rank_ = group.rank(), size_ = group.size();
  ncclUniqueId id{};
  if (rank_ == 0) check(api.get_unique_id(&id), nullptr, "making the group's unique id");
  group.broadcast(&id, sizeof id, 0, "NCCL: the group's unique id");
  check(api.comm_init_rank(&handle_->comm, size_, id, rank_), nullptr,
        "joining a group of " + std::to_string(size_) + " ranks as rank " + std::to_string(rank_));
}

NcclComm::~NcclComm() {
  if (handle_->comm) nccl_api().comm_destroy(handle_->comm);
}

void NcclComm::exchange(const std::vector<const float*>& src, const std::vector<float*>& dst, const ExchangePlan& plan,
                        const char* what, void* stream) {
  if (static_cast<int>(plan.send.size()) != size_ || static_cast<int>(plan.recv.size()) != size_)
    throw std::logic_error(std::string(what) + ": an exchange plan for " + std::to_string(plan.send.size()) +
                           " ranks on a group of " + std::to_string(size_));
  const NcclApi& api = nccl_api();
  ncclComm_t c = handle_->comm;
  // The default stream (cudaStreamLegacy) unless the caller names another: the executor's kernels and copies run
  // there, so the groups are ordered after the writes of their sources and before the reads of their destinations.
  const auto s = static_cast<cudaStream_t>(stream);
  // Counted as dist::Comm counts: an exchange that sends another rank anything, even nothing, names its collective.
  for (int q = 0; q < size_; ++q)
    if (q != rank_ && !plan.send[static_cast<size_t>(q)].empty()) bytes_sent_by_what_[what] += 0;
  for (const std::vector<NcclOp>& round : nccl_rounds(plan, rank_, max_group_ops_)) {
    if (round.empty()) continue;
    check(api.group_start(), c, what);
    for (const NcclOp& op : round) {
      const Piece& p = (op.send ? plan.send : plan.recv)[static_cast<size_t>(op.peer)][static_cast<size_t>(op.index)];
      const auto n = static_cast<size_t>(p.n);
      if (op.send) {
        check(api.send(src.at(static_cast<size_t>(p.buffer)) + p.at, n, ncclFloat32, op.peer, c, s), c, what);
        if (op.peer != rank_) {
          bytes_sent_ += n * sizeof(float);
          bytes_sent_by_what_[what] += n * sizeof(float);
        }
      } else {
        check(api.recv(dst.at(static_cast<size_t>(p.buffer)) + p.at, n, ncclFloat32, op.peer, c, s), c, what);
      }
    }
    check(api.group_end(), c, what);
  }
}

#else

void* standin_stream_create() { return nullptr; }
void standin_stream_synchronize(void*) {}
void standin_stream_destroy(void*) {}
void standin_stream_queue(void*, void (*)(void*), void*) {}

struct NcclComm::Handle {};

NcclComm::NcclComm(Comm&, Executor&) {
  throw std::invalid_argument("--transport nccl: this olmoref was built without CUDA's NCCL (tools/build.sh builds "
                              "with it); use --transport mpi");
}
NcclComm::~NcclComm() = default;
void NcclComm::exchange(const std::vector<const float*>&, const std::vector<float*>&, const ExchangePlan&, const char*,
                        void*) {
  throw std::logic_error("NcclComm without NCCL");
}

#endif

}  // namespace olmoref::dist
