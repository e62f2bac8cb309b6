#include "core/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <vector>

namespace olmoref {

int64_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

void* host_map_zeroed(size_t bytes, const std::string& what) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("cannot map " + std::to_string(bytes >> 20) + " MiB of host memory for " + what);
  return p;
}

void host_unmap(void* p, size_t bytes) { ::munmap(p, bytes); }

int64_t host_resident_bytes(const void* p, size_t bytes) {
  if (!p || bytes == 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in((last - first) / page);
  if (::mincore(reinterpret_cast<void*>(first), last - first, in.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n * static_cast<int64_t>(page);
}

int64_t Executor::memory_available() const { return host_memory_available(); }

}  // namespace olmoref
