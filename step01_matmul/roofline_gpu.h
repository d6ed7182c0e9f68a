// roofline_gpu.h — the GPU half of build/bin/roofline: measured bandwidth and compute ceilings.
// defines: roofline_gpu_bandwidth, roofline_copy_gbps, roofline_gpu_fma_tflops, roofline_gpu_gemm_ms
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

// The copy bandwidth a benchmark's "% of copy" divides by: `given` when > 0 (its --copy-gbps),
// else measured now (2 GiB copy, median of 20; 0 when that fails); *src says which, for the
// table's metadata; *read_gbps (may be NULL) the read-only rate of the same measurement, or 0.
static inline double roofline_copy_gbps(double given, const char **src, double *read_gbps) {
    double copy = given, rd = 0, wr = 0;
    *src = "given (--copy-gbps)";
    if (given <= 0) {
        if (roofline_gpu_bandwidth((size_t)1 << 31, 20, &copy, &rd, &wr) != 0) copy = 0, rd = 0;
        *src = "measured now: device copy of 2 GiB, read + write counted, median of 20 (step01 roofline_gpu_bandwidth)";
    }
    if (read_gbps) *read_gbps = rd;
    return copy;
}

// Peak fp32 FMA rate of the SIMT cores (independent FMA chains, no memory traffic), TFLOP/s.
double roofline_gpu_fma_tflops(int reps);

// cuBLAS GEMM C(M,N) = A(M,K) B(K,N), row-major, random inputs. dtype 0: fp32 SGEMM (no TF32),
// 1: fp16 in/out, fp32 accumulate, 2: bf16 in/out, fp32 accumulate. Median ms, or -1.
double roofline_gpu_gemm_ms(int dtype, int M, int N, int K, int reps);

#ifdef __cplusplus
}
#endif
