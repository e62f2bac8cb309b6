// kernels/device_memory.h — device allocations and copies for the CUDA executor (kernels/device_memory.cu; CUDA
// builds only). Errors are exceptions that name the tensor and the CUDA error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace olmoref::kernels {

// Out of memory: names `what`, its size, the device's free and total memory, and suggests a smaller micro-batch.
void* device_allocate(size_t bytes, const std::string& what);
void device_free(void* p);
// Page-locked host memory (cudaHostAlloc): the MPI transport's exchange staging, copied to and from at the link's
// full rate. The error names `what`, its size and the ways out. is_pinned: whether p is such memory (checks).
void* pinned_allocate(size_t bytes, const char* what);
void pinned_free(void* p);
bool is_pinned(const void* p);
void device_to_device(void* dst, const void* src, size_t bytes);
void host_to_device(void* dst, const void* src, size_t bytes);
void device_to_host(void* dst, const void* src, size_t bytes);
void device_zero(void* dst, size_t bytes);
void device_synchronize(const char* after);
int64_t device_free_bytes();
// A stream beside the default one, where the executor's kernels and copies run (the legacy default stream), for work
// that overlaps them (the next FSDP unit's NCCL gather: dist::UnitGather). Non-blocking, so nothing orders it against
// the default stream but the two calls below.
class SideStream {
 public:
  SideStream();
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void* stream() const { return stream_; }  // a cudaStream_t
  // Work queued on the side stream from now on waits for everything queued on the default stream so far.
  void wait_for_default();
  // Work queued on the default stream from now on waits for everything queued on the side stream so far.
  void default_waits();
  // A copy queued on the side stream (either direction; host memory page-locked, or the copy is not asynchronous), and
  // a host wait for everything queued on it. Callable from any thread that has made this device current (use_device).
  void copy(void* dst, const void* src, size_t bytes);
  void synchronize();

 private:
  void* stream_ = nullptr;
  void* default_done_ = nullptr;  // cudaEvent_t
  void* side_done_ = nullptr;
};

// While it lives, the calling thread's kernels, device-to-device copies and zeroing go to `stream` (a cudaStream_t)
// instead of the default stream, and its copies to and from the host wait for that stream: how executor ops are
// queued on a side stream (dist::SideStream::run). Scopes nest; each thread has its own.
class StreamScope {
 public:
  static void* current();  // this thread's innermost scope's stream; nullptr outside any (the default stream)
  explicit StreamScope(void* stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* previous_;
};

// This thread's device, and making a device current on another thread (a new thread starts on device 0: without
// this, its first CUDA call would make a context there).
int current_device();
void use_device(int d);
// The SMs of this thread's device (what the GEMM's tiling and the attention forward's grid are sized to).
int current_device_sms();
// The CUDA devices this process sees (0 without a driver or a device; CUDA_VISIBLE_DEVICES applies).
int visible_device_count();
// Makes device d this process's (cudaSetDevice: before anything is allocated, so no context lands on device 0) and
// returns its identity as nvidia-smi prints it ("GPU-xxxxxxxx-...") and its name.
void select_device(int d, std::string* uuid, std::string* name);
// "" when the current device can run this build's kernels; else one line: no driver, no device, driver older than the
// toolkit, or an architecture the build has no code for.
std::string device_unavailable_reason();

}  // namespace olmoref::kernels
