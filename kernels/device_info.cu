#include "kernels/device_info.h"

#include <cuda_runtime.h>

namespace olmoref::cuda {

DeviceInfo query_device() {
  DeviceInfo info;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    info.reason = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    info.reason = "cudaGetDeviceProperties failed";
    return info;
  }
  info.available = true;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  return info;
}

// One thread, one chain: the same order as ref/gemm.h's contract (fma over p in order from 0).
__global__ void fma_chain_kernel(const float* a, const float* b, int n, float* out) {
  float acc = 0.0f;
  for (int p = 0; p < n; ++p) acc = __fmaf_rn(a[p], b[p], acc);
  *out = acc;
}

__global__ void contraction_kernel(float a, float b, float c, float* out) { *out = a * b + c; }

float smoke_contraction(float a, float b, float c) {
  float* dout = nullptr;
  cudaMalloc(&dout, sizeof(float));
  contraction_kernel<<<1, 1>>>(a, b, c, dout);
  float result = 0.0f;
  cudaMemcpy(&result, dout, sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dout);
  return result;
}

float smoke_fma_chain(const float* a, const float* b, int n) {
  float *da = nullptr, *db = nullptr, *dout = nullptr;
  cudaMalloc(&da, n * sizeof(float));
  cudaMalloc(&db, n * sizeof(float));
  cudaMalloc(&dout, sizeof(float));
  cudaMemcpy(da, a, n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(db, b, n * sizeof(float), cudaMemcpyHostToDevice);
  fma_chain_kernel<<<1, 1>>>(da, db, n, dout);
  float result = 0.0f;
  cudaMemcpy(&result, dout, sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  return result;
}

}  // namespace olmoref::cuda
