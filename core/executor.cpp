#include "core/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
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

namespace {
int64_t g_peak_before_reset = -1;  // the largest VmHWM seen by reset_peak_resident
}  // namespace

ProcessStats process_stats() {
  ProcessStats out;
  {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
      const auto kib = [&] { return std::stoll(line.substr(line.find(':') + 1)) * 1024; };
      if (line.rfind("VmHWM:", 0) == 0) out.peak_since_reset = kib();
      if (line.rfind("VmRSS:", 0) == 0) out.resident = kib();
    }
  }
  out.peak_resident = std::max(out.peak_since_reset, g_peak_before_reset);
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") out.read_chars = value;
    if (key == "read_bytes:") out.read_bytes = value;
    if (key == "wchar:") out.write_chars = value;
  }
  return out;
}

bool reset_peak_resident() {
  g_peak_before_reset = std::max(g_peak_before_reset, process_stats().peak_since_reset);
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
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

void* Executor::allocate_staging(size_t bytes, const char* what) {
  void* p = staging_allocate(bytes, what);
  ++staging_.allocations;
  staging_.live_bytes += static_cast<int64_t>(bytes);
  staging_.peak_bytes = std::max(staging_.peak_bytes, staging_.live_bytes);
  return p;
}
void Executor::free_staging(void* p, size_t bytes) {
  staging_free(p, bytes);
  staging_.live_bytes -= static_cast<int64_t>(bytes);
}

void* Executor::staging_allocate(size_t bytes, const char* what) {
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  if (!p)
    throw std::runtime_error(std::string("out of host memory allocating ") + what + " (" + std::to_string(bytes >> 20) +
                             " MiB of exchange staging); try a smaller train.micro_batch_instances or more ranks");
  return p;
}
void Executor::staging_free(void* p, size_t) { std::free(p); }

}  // namespace olmoref
