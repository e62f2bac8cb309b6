// train/run_lock.h — one writer per run directory.
//
// Every rank process of a run holds an exclusive lock (fcntl) on OUT/.lock-rankNNNNN for as long as it runs. Before any
// rank takes its own, every rank checks that no lock file in the directory is held: a holder is a live process of
// another run (an orphan rank of a killed mpirun, a second job on the same directory), and the run is refused
// naming it. The kernel drops the lock when its holder dies, so a kill never leaves the directory locked.
#pragma once

#include <string>

namespace olmoref {

namespace dist {
class Comm;
}

class RunDirLock {
 public:
  // Collective over comm: check everywhere, barrier, then each rank locks its own file.
  RunDirLock(const std::string& dir, dist::Comm& comm);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace olmoref
