// qlinear_bench_gpu.h — the bf16 baseline that qgemm_bench times beside the quantized kernels
// (in qlinear_gpu.cu; qlinear_gpu_none.c returns -1). The T = 1 baseline is step03's GEMV
// (kvcache.h gemv_gpu_bench_gbps).
// defines: qbench_bf16_gemm_ms
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

// Median milliseconds of one Y (T, rows) fp32 = X (T, cols) W^T with bf16 X and W through step02's
// gemm_xwt (cuBLAS), W rotated over copies totalling >= 512 MB so that it streams from memory (as
// the quantized layers are timed). warmup untimed calls, then reps samples (CUDA events). -1 without
// a GPU.
double qbench_bf16_gemm_ms(int T, int rows, int cols, int warmup, int reps);

#ifdef __cplusplus
}
#endif
