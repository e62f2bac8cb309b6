#include "train/run_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "dist/comm.h"

namespace olmoref {

namespace {

// POSIX record locks (fcntl), not flock: they belong to the process, so a child a library forks inside a rank
// (without exec) never inherits the lock and keeps it past the run.
bool try_lock(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return ::fcntl(fd, F_SETLK, &fl) == 0;
}
// Asks without taking the lock, so ranks of one run checking at the same time never see each other.
bool held_by_other(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return ::fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

std::string read_holder(int fd) {
  char buf[512] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "an unknown process";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& dir, dist::Comm& comm) {
  namespace fs = std::filesystem;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".lock-rank", 0) != 0) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // removed meanwhile
    if (held_by_other(fd)) {
      const std::string holder = read_holder(fd);
      ::close(fd);
      throw std::runtime_error(dir + " is in use by another run (" + holder + ", lock " + name +
                               "): wait for it to finish or stop it, then run again");
    }
    ::close(fd);
  }
  comm.barrier("run directory: no other writer");
  char name[32];
  std::snprintf(name, sizeof name, ".lock-rank%05d", comm.rank());
  const std::string path = dir + "/" + name;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot create the run lock (" + std::strerror(errno) + ")");
  if (!try_lock(fd_)) {
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(dir + " is in use by another run (" + holder + "): wait for it to finish or stop it");
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  char info[512];
  const int n = std::snprintf(info, sizeof info, "olmoref train pid %d on %s, rank %d, since %s\n",
                              static_cast<int>(::getpid()), host, comm.rank(), when);
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, info, static_cast<size_t>(n), 0) != n)
    throw std::runtime_error(path + ": cannot write the run lock");
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock; the file stays (meaningless once unlocked)
}

}  // namespace olmoref
