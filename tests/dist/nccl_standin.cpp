// tests/dist/nccl_standin.cpp — a stand-in for the part of NCCL that olmoref calls (dist/nccl_comm.cpp), over MPI,
// loaded with LD_PRELOAD into `olmoref train --executor cuda-host --transport nccl` (tests/dist/nccl_transport.sh).
//
// NCCL needs a GPU per rank, and CI has none; cuda-host keeps the executor's tensors in host memory standing in for
// the device's, so a library that moves host memory by MPI runs olmoref's NCCL path whole: its plans, its groups,
// its bootstrap over the group's MPI communicator, its sends and receives into the executor's buffers. olmoref
// accepts cuda-host with --transport nccl only when this library is loaded (the symbol olmoref_nccl_standin).
//
// It also records, per process, every exchange in the order issued: each NCCL group's bytes per peer, and each
// MPI all-to-all(v) and all-gather olmoref starts (interposed through MPI's profiling interface), as one kind of
// line, "ranks R me M send b0 b1 .. recv b0 b1 ..". An MPI-transport run and an NCCL-transport run of the same
// configuration must then write the same lines: the NCCL groups stand exactly where the MPI collectives they replace
// stood, with the same bytes to and from every peer. OLMOREF_NCCL_STANDIN_LOG=DIR: DIR/rank<world rank>.log.
//
// Streams: cuda-host runs the executor's work on the calling thread as it is queued, so a group on the default stream
// moves its data before ncclGroupEnd returns. A group on a stream made by olmoref_nccl_standin_stream_create (the
// prefetch's side stream in the host execution, dist/unit_gather.cpp) runs later, in order, on that stream's worker
// thread, each group after a pause of OLMOREF_TEST_HOST_STREAM_DELAY_US, until olmoref_nccl_standin_stream_synchronize:
// as on a device, a wait the code lacks then shows in the bits. A communicator's groups still run in the order issued,
// whatever their streams (NCCL serializes the operations of a communicator): a group on the default stream first waits
// for the communicator's groups queued on a worker.
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/delayed_worker.h"

extern "C" int olmoref_nccl_standin() { return 1; }

namespace {

constexpr char kMagic[] = "olmoref-standin";
constexpr int kTagBase = 1 << 20;  // above the tags olmoref's MpiComm uses on the world communicator

struct Op {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  cudaStream_t stream;
};

// A stream of the host execution: groups queued on it run in order on its worker thread, each after a pause.
using HostStream = olmoref::DelayedWorker;

std::mutex streams_m;
std::set<cudaStream_t> host_streams;  // the streams made by olmoref_nccl_standin_stream_create
bool is_host_stream(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(streams_m);
  return host_streams.count(s) > 0;
}

int world_rank() {
  int r = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "nccl stand-in: %s\n", what.c_str());
  std::abort();
}

FILE* open_log(const char* suffix) {
  const char* dir = std::getenv("OLMOREF_NCCL_STANDIN_LOG");
  if (!dir) return nullptr;
  const std::string path = std::string(dir) + "/rank" + std::to_string(world_rank()) + suffix;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail("cannot write " + path);
  return f;
}

// Every exchange into DIR/rank<r>.log; NCCL's groups also into DIR/rank<r>.nccl (which shows the path was taken),
// there after "comm K " (K: the communicators this process had joined before this one, so 0 is its first) and
// followed by " stream side" (a stream of olmoref_nccl_standin_stream_create: the prefetch's, the owners' exchange's)
// or " stream default", then " ops N" (the group's sends and receives).
void log_line(int ranks, int me, const std::vector<uint64_t>& sent, const std::vector<uint64_t>& received,
              int nccl_comm = -1, size_t nccl_ops = 0, bool on_side = false) {
  const bool nccl = nccl_comm >= 0;
  static std::mutex log_m;  // groups on a host stream log from its worker thread
  std::lock_guard<std::mutex> lock(log_m);
  static FILE* log = open_log(".log");
  static FILE* nccl_log = nccl ? open_log(".nccl") : nullptr;
  if (nccl && !nccl_log) nccl_log = open_log(".nccl");
  if (!log) return;
  bool any = false;
  for (size_t i = 0; i < sent.size(); ++i) any |= sent[i] > 0 || received[i] > 0;
  if (!any) return;  // an exchange with nothing to move issues no NCCL call, so it is left out on both sides
  std::string line;
  const auto put = [&line](const char* word, uint64_t n) { line.append(word).append(std::to_string(n)); };
  put("ranks ", static_cast<uint64_t>(ranks)), put(" me ", static_cast<uint64_t>(me));
  line.append(" send");
  for (uint64_t n : sent) put(" ", n);
  line.append(" recv");
  for (uint64_t n : received) put(" ", n);
  for (FILE* f : {log, nccl ? nccl_log : nullptr})
    if (f) {
      if (f == nccl_log)
        std::fprintf(f, "comm %d %s stream %s ops %zu\n", nccl_comm, line.c_str(), on_side ? "side" : "default",
                     nccl_ops);
      else
        std::fprintf(f, "%s\n", line.c_str());
      std::fflush(f);
    }
}

int type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: case ncclInt32: case ncclUint32: return 4;
    case ncclFloat64: case ncclInt64: case ncclUint64: return 8;
    case ncclFloat16: case ncclBfloat16: return 2;
    default: return 1;
  }
}

int group_depth = 0;
std::vector<ncclComm_t> pending;  // comms with ops queued in the open group, in first-use order

}  // namespace

struct ncclComm {
  int rank = 0, size = 1, tag = 0, joined = 0;
  std::vector<int> world;  // group rank -> world rank
  std::vector<Op> ops;
  // Groups queued on host streams and not yet run (NCCL runs a communicator's operations in the order issued).
  std::mutex m;
  std::condition_variable idle;
  int queued = 0;
};

namespace {
void move_data(ncclComm_t c, const std::vector<Op>& ops, bool on_side) {
  std::vector<MPI_Request> reqs;
  std::vector<uint64_t> sent(static_cast<size_t>(c->size), 0), received(sent.size(), 0);
  // Receives first, so that every send finds its match posted; a pair's messages keep their order (one tag).
  for (int pass = 0; pass < 2; ++pass)
    for (const Op& op : ops) {
      if (op.send != (pass == 1)) continue;
      if (op.bytes > static_cast<size_t>(INT32_MAX)) fail("a message over 2 GiB");
      MPI_Request r;
      const int n = static_cast<int>(op.bytes), peer = c->world[static_cast<size_t>(op.peer)];
      if (op.send) {
        PMPI_Isend(op.buf, n, MPI_BYTE, peer, c->tag, MPI_COMM_WORLD, &r);
        sent[static_cast<size_t>(op.peer)] += op.bytes;
      } else {
        PMPI_Irecv(op.buf, n, MPI_BYTE, peer, c->tag, MPI_COMM_WORLD, &r);
        received[static_cast<size_t>(op.peer)] += op.bytes;
      }
      reqs.push_back(r);
    }
  PMPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  log_line(c->size, c->rank, sent, received, c->joined, ops.size(), on_side);
}

// The group's operations, now or on their stream's worker (olmoref issues a group on one stream).
void run_ops(ncclComm_t c) {
  std::vector<Op> ops;
  ops.swap(c->ops);
  const cudaStream_t stream = ops.empty() ? nullptr : ops.front().stream;
  for (const Op& op : ops)
    if (op.stream != stream) fail("a group spans two streams");
  if (!is_host_stream(stream)) {
    std::unique_lock<std::mutex> lock(c->m);
    c->idle.wait(lock, [c] { return c->queued == 0; });
    lock.unlock();
    move_data(c, ops, false);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(c->m);
    ++c->queued;
  }
  reinterpret_cast<HostStream*>(stream)->queue([c, ops = std::move(ops)] {
    move_data(c, ops, true);
    std::lock_guard<std::mutex> lock(c->m);
    if (--c->queued == 0) c->idle.notify_all();
  });
}

ncclResult_t enqueue(ncclComm_t c, Op op) {
  if (op.peer < 0 || op.peer >= c->size) return ncclInvalidArgument;
  c->ops.push_back(op);
  if (group_depth == 0) {
    run_ops(c);
  } else {
    bool listed = false;
    for (ncclComm_t p : pending) listed |= p == c;
    if (!listed) pending.push_back(c);
  }
  return ncclSuccess;
}
}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int made = 0;
  std::memset(id, 0, sizeof *id);
  const int creator = world_rank(), serial = made++;
  std::memcpy(id->internal, kMagic, sizeof kMagic);
  std::memcpy(id->internal + 32, &creator, sizeof creator);
  std::memcpy(id->internal + 36, &serial, sizeof serial);
  return ncclSuccess;
}

// Every member tells the id's maker its world rank; the maker sends the table back.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (std::memcmp(id.internal, kMagic, sizeof kMagic) != 0) return ncclInvalidArgument;
  int creator = 0, serial = 0;
  std::memcpy(&creator, id.internal + 32, sizeof creator);
  std::memcpy(&serial, id.internal + 36, sizeof serial);
  static int joined = 0;
  auto* c = new ncclComm;
  c->joined = joined++;
  c->rank = rank, c->size = nranks;
  c->tag = kTagBase + (creator * 4096 + serial) * 2;
  c->world.assign(static_cast<size_t>(nranks), -1);
  const int me = world_rank();
  if (me == creator) {
    c->world[static_cast<size_t>(rank)] = me;
    for (int i = 1; i < nranks; ++i) {
      int pair[2];
      PMPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, c->tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      c->world[static_cast<size_t>(pair[0])] = pair[1];
    }
    for (int i = 0; i < nranks; ++i)
      if (i != rank) PMPI_Send(c->world.data(), nranks, MPI_INT, c->world[static_cast<size_t>(i)], c->tag + 1, MPI_COMM_WORLD);
  } else {
    const int pair[2] = {rank, me};
    PMPI_Send(pair, 2, MPI_INT, creator, c->tag + 1, MPI_COMM_WORLD);
    PMPI_Recv(c->world.data(), nranks, MPI_INT, creator, c->tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  {
    std::unique_lock<std::mutex> lock(comm->m);
    comm->idle.wait(lock, [comm] { return comm->queued == 0; });
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "stand-in NCCL error"; }
const char* ncclGetLastError(ncclComm_t) { return ""; }

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  for (ncclComm_t c : pending) run_ops(c);
  pending.clear();
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueue(comm, {true, const_cast<void*>(buf), count * static_cast<size_t>(type_size(type)), peer, stream});
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {false, buf, count * static_cast<size_t>(type_size(type)), peer, stream});
}

// The host execution's side streams (dist/nccl_comm.cpp finds these by name in the NCCL library it loaded).
void* olmoref_nccl_standin_stream_create() {
  auto* s = new HostStream;
  std::lock_guard<std::mutex> lock(streams_m);
  host_streams.insert(reinterpret_cast<cudaStream_t>(s));
  return s;
}
void olmoref_nccl_standin_stream_synchronize(void* s) { static_cast<HostStream*>(s)->synchronize(); }
// Host work in order with the stream's groups (olmoref's executor ops queued on its side stream).
void olmoref_nccl_standin_stream_queue(void* s, void (*task)(void*), void* arg) {
  static_cast<HostStream*>(s)->queue([task, arg] { task(arg); });
}
void olmoref_nccl_standin_stream_destroy(void* s) {
  {
    std::lock_guard<std::mutex> lock(streams_m);
    host_streams.erase(reinterpret_cast<cudaStream_t>(s));
  }
  delete static_cast<HostStream*>(s);  // runs what is queued first
}

// The MPI transport's exchanges, recorded like the groups above (olmoref's MpiComm starts them non-blocking).
int MPI_Ialltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                   void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                   MPI_Request* request) {
  int size = 0, rank = 0, ss = 0, rs = 0;
  PMPI_Comm_size(comm, &size);
  PMPI_Comm_rank(comm, &rank);
  PMPI_Type_size(sendtype, &ss);
  PMPI_Type_size(recvtype, &rs);
  std::vector<uint64_t> sent(static_cast<size_t>(size)), received(sent.size());
  for (int i = 0; i < size; ++i) {
    sent[static_cast<size_t>(i)] = static_cast<uint64_t>(sendcounts[i]) * static_cast<uint64_t>(ss);
    received[static_cast<size_t>(i)] = static_cast<uint64_t>(recvcounts[i]) * static_cast<uint64_t>(rs);
  }
  log_line(size, rank, sent, received);
  return PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm,
                         request);
}

// olmoref's point-to-point messages (MpiComm::send and recv: context parallelism's chains), one line each.
static void log_message(MPI_Comm comm, MPI_Datatype type, int count, int peer, bool send) {
  int size = 0, rank = 0, ts = 0;
  PMPI_Comm_size(comm, &size);
  PMPI_Comm_rank(comm, &rank);
  PMPI_Type_size(type, &ts);
  std::vector<uint64_t> sent(static_cast<size_t>(size), 0), received(sent.size(), 0);
  (send ? sent : received)[static_cast<size_t>(peer)] = static_cast<uint64_t>(count) * static_cast<uint64_t>(ts);
  log_line(size, rank, sent, received);
}

int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  log_message(comm, type, count, dest, true);
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request* request) {
  log_message(comm, type, count, source, false);
  return PMPI_Irecv(buf, count, type, source, tag, comm, request);
}

int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                   MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  int size = 0, rank = 0, ss = 0, rs = 0;
  PMPI_Comm_size(comm, &size);
  PMPI_Comm_rank(comm, &rank);
  PMPI_Type_size(sendtype, &ss);
  PMPI_Type_size(recvtype, &rs);
  const std::vector<uint64_t> sent(static_cast<size_t>(size), static_cast<uint64_t>(sendcount) * static_cast<uint64_t>(ss));
  const std::vector<uint64_t> received(sent.size(), static_cast<uint64_t>(recvcount) * static_cast<uint64_t>(rs));
  log_line(size, rank, sent, received);
  return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}

}  // extern "C"
