#include "dist/comm.h"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace olmoref::dist {

namespace {

class LocalComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void barrier(const char*) override {}
  void broadcast(void*, size_t, int, const char*) override {}
  void allgather(const void* send, size_t bytes, void* recv, const char*) override {
    if (send != recv) std::memmove(recv, send, bytes);
  }
  void alltoall(const void* send, size_t bytes, void* recv, const char*) override {
    if (send != recv) std::memmove(recv, send, bytes);
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                 const std::vector<int64_t>&, const char*, const std::vector<int64_t>* send_at) override {
    if (send_at) send += send_at->at(0);
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(send_counts.at(0)) * sizeof(float));
  }
  [[noreturn]] void send(const void*, size_t, int dest, const char* what) override { no_peer(dest, what); }
  [[noreturn]] void recv(void*, size_t, int src, const char* what) override { no_peer(src, what); }
  std::unique_ptr<Comm> split(int, int) override { return std::make_unique<LocalComm>(); }
  std::unique_ptr<Comm> split_node() override { return std::make_unique<LocalComm>(); }
  void float_allreduce_sum_unordered(float*, size_t, const char*) override {}
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "olmoref: fatal: %s\n", message.c_str());
    std::exit(3);
  }

 private:
  [[noreturn]] static void no_peer(int peer, const char* what) {
    throw std::logic_error(std::string(what) + ": rank " + std::to_string(peer) + " of a one-process world");
  }
};

// Collectives are started non-blocking and completed by polling against a deadline, so a rank that
// died or hangs turns into an error naming the ranks that never arrived (found by an arrival probe
// on a side channel), not an eternal wait.
class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm comm, double timeout_s, std::vector<int> world_ranks)
      : comm_(comm), timeout_s_(timeout_s), world_ranks_(std::move(world_ranks)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_dup(comm_, &arrivals_);
  }
  ~MpiComm() override {
    if (arrivals_ != MPI_COMM_NULL) MPI_Comm_free(&arrivals_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void barrier(const char* what) override {
    MPI_Request req;
    MPI_Ibarrier(comm_, &req);
    wait(req, what);
  }
  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    MPI_Request req;
    MPI_Ibcast(data, count(bytes), MPI_BYTE, root, comm_, &req);
    if (rank_ == root) count_sent(what, bytes * static_cast<uint64_t>(size_ - 1));
    wait(req, what);
  }
  void allgather(const void* send, size_t bytes, void* recv, const char* what) override {
    MPI_Request req;
    MPI_Iallgather(send, count(bytes), MPI_BYTE, recv, count(bytes), MPI_BYTE, comm_, &req);
    count_sent(what, bytes * static_cast<uint64_t>(size_ - 1));
    wait(req, what);
  }
  void alltoall(const void* send, size_t bytes, void* recv, const char* what) override {
    MPI_Request req;
    MPI_Ialltoall(send, count(bytes), MPI_BYTE, recv, count(bytes), MPI_BYTE, comm_, &req);
    count_sent(what, bytes * static_cast<uint64_t>(size_ - 1));
    wait(req, what);
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                 const std::vector<int64_t>& recv_counts, const char* what,
                 const std::vector<int64_t>* send_at) override {
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    int64_t so = 0, ro = 0;
    for (int j = 0; j < size_; ++j) {
      const auto J = static_cast<size_t>(j);
      if (send_at) so = (*send_at)[J];
      if (so + send_counts[J] > INT32_MAX || ro + recv_counts[J] > INT32_MAX)
        throw std::runtime_error(std::string(what) + ": more than 2^31 floats in one all-to-all (the MPI count limit); "
                                 "use more dp_shard ranks so each rank's gradient range is smaller");
      sc[J] = static_cast<int>(send_counts[J]);
      sd[J] = static_cast<int>(so);
      rc[J] = static_cast<int>(recv_counts[J]);
      rd[J] = static_cast<int>(ro);
      so += send_counts[J];
      ro += recv_counts[J];
      if (j != rank_) count_sent(what, static_cast<uint64_t>(send_counts[J]) * sizeof(float));
    }
    MPI_Request req;
    MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, comm_, &req);
    wait(req, what);
  }
  // In pieces of at most 1 GiB (MPI counts are int); the pieces of one message keep their order.
  void send(const void* data, size_t bytes, int dest, const char* what) override {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t at = 0; at < bytes || at == 0; at += kPiece) {
      MPI_Request req;
      MPI_Isend(p + at, count(std::min(kPiece, bytes - at)), MPI_BYTE, dest, kPointTag, comm_, &req);
      wait(req, what);
      if (bytes == 0) break;
    }
    count_sent(what, bytes);
  }
  void recv(void* data, size_t bytes, int src, const char* what) override {
    auto* p = static_cast<unsigned char*>(data);
    for (size_t at = 0; at < bytes || at == 0; at += kPiece) {
      MPI_Request req;
      MPI_Irecv(p + at, count(std::min(kPiece, bytes - at)), MPI_BYTE, src, kPointTag, comm_, &req);
      wait(req, what);
      if (bytes == 0) break;
    }
  }
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    return wrap(sub);
  }
  std::unique_ptr<Comm> split_node() override {
    MPI_Comm sub;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub);
    return wrap(sub);
  }
  // A sub-communicator of this one, knowing its members' world ranks (for the timeout messages).
  std::unique_ptr<Comm> wrap(MPI_Comm sub) {
    int n = 0;
    MPI_Comm_size(sub, &n);
    std::vector<int> mine(1, world_ranks_[static_cast<size_t>(rank_)]), all(static_cast<size_t>(n));
    MPI_Allgather(mine.data(), 1, MPI_INT, all.data(), 1, MPI_INT, sub);
    return std::make_unique<MpiComm>(sub, timeout_s_, all);
  }
  void float_allreduce_sum_unordered(float* data, size_t n, const char* what) override {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, comm_, &req);
    count_sent(what, 2 * n * sizeof(float));
    wait(req, what);
  }
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "olmoref: rank %d: fatal: %s\n", world_ranks_[static_cast<size_t>(rank_)], message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::exit(3);
  }

 private:
  static int count(size_t n) {
    if (n > static_cast<size_t>(INT32_MAX)) throw std::runtime_error("collective larger than 2 GiB per rank");
    return static_cast<int>(n);
  }

  // Polls the request; on timeout, finds out who is missing with a second barrier-like probe round
  // (each rank that got here posts an arrival token to rank 0 of this communicator) and aborts.
  void wait(MPI_Request& req, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    int done = 0;
    int spins = 0;
    while (true) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 100000 ? 1000 : 50));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) report_timeout(what, waited);
    }
  }

  [[noreturn]] void report_timeout(const char* what, double waited) {
    // Who has arrived? Every rank stuck in this collective sends a token to local rank 0, which
    // waits a short grace period and names the ranks it did not hear from.
    const int token = rank_;
    MPI_Request s;
    MPI_Isend(&token, 1, MPI_INT, 0, 77, arrivals_, &s);
    std::string missing;
    if (rank_ == 0) {
      std::vector<int> heard(static_cast<size_t>(size_), 0);
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, 77, arrivals_, &flag, &st);
        if (flag) {
          int v;
          MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, 77, arrivals_, MPI_STATUS_IGNORE);
          heard[static_cast<size_t>(st.MPI_SOURCE)] = 1;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      for (int r = 0; r < size_; ++r)
        if (!heard[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(world_ranks_[static_cast<size_t>(r)]);
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "collective '%s' timed out after %.0f s; %s", what, waited,
                  rank_ == 0 ? (missing.empty() ? "every rank arrived late (overloaded machine?)"
                                                : ("rank(s) " + missing + " never arrived (dead or hung)").c_str())
                             : "waiting for other ranks (rank 0 names the missing ones)");
    abort(buf);
  }

  static constexpr size_t kPiece = size_t{1} << 30;
  static constexpr int kPointTag = 21;  // the arrival probe uses 77 on its own communicator
  MPI_Comm comm_;
  MPI_Comm arrivals_ = MPI_COMM_NULL;
  double timeout_s_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
};

std::unique_ptr<Comm>& world_slot() {
  static std::unique_ptr<Comm> w;
  return w;
}

bool& thread_multiple_slot() {
  static bool multiple = false;
  return multiple;
}

}  // namespace

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr; }

int ranks_on_this_node() {
  for (const char* key : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"})
    if (const char* v = std::getenv(key)) {
      const int n = std::atoi(v);
      if (n >= 1) return n;
    }
  return 1;
}

bool concurrent_collectives() { return thread_multiple_slot(); }

Comm& world(double timeout_s) {
  auto& w = world_slot();
  if (!w) {
    if (launched_by_mpirun()) {
      int initialized = 0;
      MPI_Initialized(&initialized);
      // MPI_THREAD_MULTIPLE where the library offers it: dist::UnitGather's prefetch runs its collectives on a thread
      // of its own, beside the main thread's (concurrent_collectives()).
      int provided = 0;
      if (!initialized)
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      else
        MPI_Query_thread(&provided);
      thread_multiple_slot() = provided >= MPI_THREAD_MULTIPLE;
      int n = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &n);
      std::vector<int> ranks(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) ranks[static_cast<size_t>(i)] = i;
      w = std::make_unique<MpiComm>(MPI_COMM_WORLD, timeout_s, ranks);
    } else {
      w = std::make_unique<LocalComm>();
    }
  }
  return *w;
}

void finalize() {
  auto& w = world_slot();
  if (w && w->backend() == "mpi") {
    w.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

double tree_sum(const std::vector<double>& v) {
  struct R {
    static double go(const std::vector<double>& v, size_t lo, size_t hi) {
      if (hi - lo == 1) return v[lo];
      const size_t mid = lo + (hi - lo + 1) / 2;
      return go(v, lo, mid) + go(v, mid, hi);
    }
  };
  return v.empty() ? 0.0 : R::go(v, 0, v.size());
}

}  // namespace olmoref::dist
