#include "kernels/device_memory.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>

namespace olmoref::kernels {

namespace {
void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw std::runtime_error("CUDA: " + what + ": " + cudaGetErrorString(err));
}
std::string mib(size_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }
__global__ void probe_kernel() {}  // has code for the device's architecture only if the build targeted it
}  // namespace

void* device_allocate(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw std::runtime_error("out of GPU memory allocating " + what + " (" + mib(bytes) + "; " + mib(free_b) +
                             " free of " + mib(total_b) + "); try a smaller train.micro_batch_instances");
  }
  check(err, "allocating " + what + " (" + mib(bytes) + ")");
  return p;
}
void device_free(void* p) { cudaFree(p); }
void* pinned_allocate(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("out of page-locked host memory allocating ") + what + " (" + mib(bytes) +
                             ", MPI transport's exchange staging: " + cudaGetErrorString(err) +
                             "); the node's memory or its locked-memory limit (ulimit -l) ran out: try more ranks, "
                             "a smaller train.micro_batch_instances, or --transport nccl, which stages nothing");
  }
  return p;
}
void pinned_free(void* p) { cudaFreeHost(p); }
bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}
namespace {
thread_local cudaStream_t this_thread_stream = nullptr;  // StreamScope's; nullptr: the legacy default stream
}  // namespace

cudaStream_t current_stream() { return this_thread_stream; }
void* StreamScope::current() { return this_thread_stream; }
StreamScope::StreamScope(void* stream) : previous_(this_thread_stream) {
  this_thread_stream = static_cast<cudaStream_t>(stream);
}
StreamScope::~StreamScope() { this_thread_stream = static_cast<cudaStream_t>(previous_); }

// On the default stream as before (cudaMemcpy: a copy with the host returns once done); inside a StreamScope on its
// stream, a copy with the host waited for there.
void device_to_device(void* dst, const void* src, size_t bytes) {
  if (!this_thread_stream) return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "device-to-device copy");
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, this_thread_stream), "device-to-device copy");
}
void host_to_device(void* dst, const void* src, size_t bytes) {
  if (!this_thread_stream) return check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "host-to-device copy");
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, this_thread_stream), "host-to-device copy");
  check(cudaStreamSynchronize(this_thread_stream), "host-to-device copy");
}
void device_to_host(void* dst, const void* src, size_t bytes) {
  if (!this_thread_stream) return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "device-to-host copy");
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, this_thread_stream), "device-to-host copy");
  check(cudaStreamSynchronize(this_thread_stream), "device-to-host copy");
}
void device_zero(void* dst, size_t bytes) { check(cudaMemsetAsync(dst, 0, bytes, this_thread_stream), "memset"); }
void device_synchronize(const char* after) { check(cudaDeviceSynchronize(), std::string("after ") + after); }

SideStream::SideStream() {
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a side stream");
  check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "creating an event");
  check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "creating an event");
  stream_ = s, default_done_ = a, side_done_ = b;
}
SideStream::~SideStream() {
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  cudaEventDestroy(static_cast<cudaEvent_t>(default_done_));
  cudaEventDestroy(static_cast<cudaEvent_t>(side_done_));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}
void SideStream::wait_for_default() {
  check(cudaEventRecord(static_cast<cudaEvent_t>(default_done_), cudaStreamLegacy), "recording the default stream");
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(default_done_), 0),
        "the side stream waiting for the default stream");
}
void SideStream::default_waits() {
  check(cudaEventRecord(static_cast<cudaEvent_t>(side_done_), static_cast<cudaStream_t>(stream_)),
        "recording the side stream");
  check(cudaStreamWaitEvent(cudaStreamLegacy, static_cast<cudaEvent_t>(side_done_), 0),
        "the default stream waiting for the side stream");
}

void SideStream::copy(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)),
        "a copy on the side stream");
}
void SideStream::synchronize() {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "waiting for the side stream");
}

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "querying this thread's device");
  return d;
}
void use_device(int d) { check(cudaSetDevice(d), "making device " + std::to_string(d) + " this thread's"); }
int current_device_sms() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()), "querying the device's SMs");
  return sms;
}

int64_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "querying free memory");
  return static_cast<int64_t>(free_b);
}

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void select_device(int d, std::string* uuid, std::string* name) {
  check(cudaSetDevice(d), "selecting device " + std::to_string(d));
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, d), "querying device " + std::to_string(d));
  char text[64];
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  *uuid = text;
  *name = prop.name;
}

std::string device_unavailable_reason() {
  int driver = 0, runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0)
    return "no CUDA driver is installed (libcuda not found)";
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver)
    return "the CUDA driver (" + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) +
           ") is older than this build's toolkit (" + std::to_string(runtime / 1000) + "." +
           std::to_string(runtime % 1000 / 10) + "); update the driver or build with an older toolkit";
  if (err != cudaSuccess) return std::string("cannot query CUDA devices: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES)";
  // A kernel for the device's architecture must exist in the binary (asked without launching anything).
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, probe_kernel) != cudaSuccess) {
    cudaGetLastError();
    cudaDeviceProp prop{};
    int current = 0;
    cudaGetDevice(&current);
    cudaGetDeviceProperties(&prop, current);
    return "this build has no kernels for the device's architecture sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + " (" + prop.name + "); rebuild with -Dgpu_archs=" +
           std::to_string(prop.major) + std::to_string(prop.minor);
  }
  return "";
}

}  // namespace olmoref::kernels

