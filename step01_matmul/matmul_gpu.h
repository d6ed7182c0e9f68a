// matmul_gpu.h — the GPU matmul ladder, callable from C. Row-major like the CPU ladder:
//   A (M, K), B (K, N), C (M, N), all row-major, any M, N, K >= 1.
// defines: MmDtype, MatmulGpuVersion, matmul_gpu_nversions, matmul_gpu_version,
//          matmul_gpu_supported, matmul_gpu_run
// The table in matmul_gpu.cu is the ONLY list of GPU versions (program, tests, notebook read it).
// fp32 versions: fp32 in, fp32 out, fp32 FMA on the SIMT cores (no TF32).
// fp16 / bf16 versions: A and B stored in half precision, fp32 accumulation, C stored in the
// same half type (as cuBLAS HGEMM with CUBLAS_COMPUTE_32F). The library baselines are cuBLAS
// versions of each dtype (SGEMM, GemmEx fp16, GemmEx bf16): "% of library" compares a version
// with the cuBLAS row of ITS dtype.
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MM_F32 = 0, MM_F16 = 1, MM_BF16 = 2 } MmDtype;

typedef struct {
    int id;             // position in the table
    const char *name;   // "cublas_sgemm", "v1_naive", ..., "cublas_hgemm", "v7_mma_f16", ...
    MmDtype dtype;
    int is_library;     // 1 for the cuBLAS baselines
    int min_cc;         // lowest compute capability (major*10+minor) it runs on, e.g. 80 for bf16
    int exact_cc;       // 0, or the only compute capability it runs on (90 for sm_90a wgmma)
    const char *what;   // one line: the idea this version adds
} MatmulGpuVersion;

// Number of versions; 0 in a build without CUDA.
int matmul_gpu_nversions(void);
const MatmulGpuVersion *matmul_gpu_version(int i);
// 1 if version i can run on device 0; otherwise 0 and a reason in why (may be NULL).
int matmul_gpu_supported(int i, char *why, int why_len);

// Run version i once on host fp32 inputs: A and B are copied to the device (rounded to the
// version's dtype), the product is copied back into C as fp32 (from fp16/bf16 for those).
// If ms != NULL, the version is then timed on the same device buffers (warm-up, then the
// median of `reps` runs with CUDA events) and the median milliseconds stored in *ms.
// Returns 0, or -1 with a message on stderr (unsupported version, no device).
int matmul_gpu_run(int i, int M, int N, int K, const float *A, const float *B, float *C,
                   double *ms, int reps);

// Round x to the version dtype's precision and back (what the device sees as input), so a
// reference can be computed on exactly the same values. No-op for MM_F32.
void matmul_round_to_dtype(MmDtype dt, float *x, long n);

#ifdef __cplusplus
}
#endif
