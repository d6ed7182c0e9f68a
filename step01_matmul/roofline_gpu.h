// roofline_gpu.h — the GPU half of build/bin/roofline: measured bandwidth and compute ceilings.
// defines: roofline_gpu_bandwidth, roofline_gpu_fma_tflops, roofline_gpu_gemm_ms
// All timings: warm-up, then the median of `reps` runs timed with CUDA events (gpu_bench).
// roofline_gpu_none.c is the build without CUDA (every function returns -1).
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

// Device-memory bandwidth on buffers of `bytes` each (choose >> L2). GB/s with bytes read +
// bytes written counted: copy (read n, write n), read-only (n), write-only (n). 0 or -1.
int roofline_gpu_bandwidth(size_t bytes, int reps, double *copy_gbps, double *read_gbps, double *write_gbps);

// Peak fp32 FMA rate of the SIMT cores (independent FMA chains, no memory traffic), TFLOP/s.
double roofline_gpu_fma_tflops(int reps);

// cuBLAS GEMM C(M,N) = A(M,K) B(K,N), row-major, random inputs. dtype 0: fp32 SGEMM (no TF32),
// 1: fp16 in/out, fp32 accumulate, 2: bf16 in/out, fp32 accumulate. Median ms, or -1.
double roofline_gpu_gemm_ms(int dtype, int M, int N, int K, int reps);

#ifdef __cplusplus
}
#endif
