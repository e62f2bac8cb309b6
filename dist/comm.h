// dist/comm.h — the small communication interface the data-parallel trainer uses.
//
// Only data-moving collectives (all-gather, all-to-all, broadcast) and exact reductions are offered:
// the cross-rank gradient sum is done by the caller, in the canonical tree order, on data these
// collectives delivered (docs/canonical/step.md). A floating-point all-reduce whose order the library
// picks exists only as a test-only negative control.
//
// Backends: LocalComm (one process, no MPI at all) and MpiComm (OpenMPI; processes started by mpirun).
// Every blocking call is guarded by a watchdog: if some rank does not arrive within the timeout, the
// job aborts with a message naming the ranks that are missing, instead of hanging forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace olmoref::dist {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // `what` names the operation in timeout messages.
  virtual void barrier(const char* what) = 0;
  virtual void broadcast(void* data, size_t bytes, int root, const char* what) = 0;
  // recv holds size() blocks of `bytes`, block i from rank i.
  virtual void allgather(const void* send, size_t bytes, void* recv, const char* what) = 0;
  // send holds size() blocks of `bytes` (block j goes to rank j); recv gets block i from rank i.
  virtual void alltoall(const void* send, size_t bytes, void* recv, const char* what) = 0;
  // Blocks of different lengths: send_counts[j] floats go to rank j (blocks back to back in rank order, or from
  // send + send_at[j] when send_at is given: blocks may then overlap, so one copy serves several ranks),
  // recv_counts[i] floats arrive from rank i (back to back). Data movement only.
  virtual void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts, const char* what,
                         const std::vector<int64_t>* send_at = nullptr) = 0;
  // Point to point, for chains that run from rank to rank (context parallelism, model/olmo3.h ContextExchange):
  // `bytes` to rank `dest`; from rank `src` into `data`, the messages of one pair arriving in the order sent. Data
  // movement only; a send returns once the receiver has the data or the library holds a copy.
  virtual void send(const void* data, size_t bytes, int dest, const char* what) = 0;
  virtual void recv(void* data, size_t bytes, int src, const char* what) = 0;
  // A sub-communicator of the ranks with the same color, ordered by key.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
  // The ranks of this communicator that share this node's memory (MPI_COMM_TYPE_SHARED), in rank order: its rank()
  // is the local rank the launcher would give, whatever launcher started the job.
  virtual std::unique_ptr<Comm> split_node() = 0;
  // TEST ONLY: MPI_Allreduce(SUM) on floats, the order left to the library (negative control).
  virtual void float_allreduce_sum_unordered(float* data, size_t n, const char* what) = 0;
  // Aborts every rank of the job with a message (never returns).
  [[noreturn]] virtual void abort(const std::string& message) = 0;

  // Bytes this rank has sent through collectives (for the communication-volume figures), in all and by operation
  // (the `what` each call names): what `train --report-comm` prints and the step-time model predicts
  // (train/time_model.h).
  uint64_t bytes_sent() const { return bytes_sent_; }
  const std::map<std::string, uint64_t>& bytes_sent_by_what() const { return bytes_sent_by_what_; }

 protected:
  void count_sent(const char* what, uint64_t bytes) {
    bytes_sent_ += bytes;
    bytes_sent_by_what_[what] += bytes;
  }

 private:
  uint64_t bytes_sent_ = 0;
  std::map<std::string, uint64_t> bytes_sent_by_what_;
};

// The process's world: MPI when started by mpirun (OMPI_COMM_WORLD_SIZE is set), else LocalComm.
// timeout_s bounds how long any rank waits for the others in one collective.
Comm& world(double timeout_s = 300.0);
bool launched_by_mpirun();
// Whether two threads may each run collectives at once (on different communicators): MPI initialized with
// MPI_THREAD_MULTIPLE by world(). False before world() and for LocalComm (one rank: nothing to overlap).
bool concurrent_collectives();
// The job's ranks on this node, as the launcher says (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's
// MPI_LOCALNRANKS); 1 when started without one.
int ranks_on_this_node();
void finalize();  // call once before exit (no-op for LocalComm)

// A failure every rank of the job reaches from the same facts (a refusal judged on gathered data), so each reports it
// and leaves on its own: main prints it on every rank and finalizes, where aborting on the first rank's word could
// kill the others before they said why.
struct AgreedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Exact sums of per-rank values, added in the canonical rank tree (balanced halving, docs/canonical/step.md).
double tree_sum(const std::vector<double>& per_rank);

}  // namespace olmoref::dist
