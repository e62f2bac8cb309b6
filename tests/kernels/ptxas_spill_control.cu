// tests/kernels/ptxas_spill_control.cu — the control of ptxas_budget.sh: a kernel that must spill. 64 values live
// across a loop, under a bound of 32 registers a thread (1024 threads, two blocks an SM).
__global__ void __launch_bounds__(1024, 2) planted_spill_kernel(const float* in, float* out, int n) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = in[threadIdx.x + i * 1024];
  for (int r = 0; r < n; ++r)
#pragma unroll
    for (int i = 0; i < 64; ++i) v[i] = v[i] * v[(i + 1) % 64] + v[(i + 7) % 64];
#pragma unroll
  for (int i = 0; i < 64; ++i) out[threadIdx.x + i * 1024] = v[i];
}
