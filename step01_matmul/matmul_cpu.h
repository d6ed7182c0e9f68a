// matmul_cpu.h — the CPU matmul ladder: C = A·B in fp32, row-major, any shape.
// defines: MatmulCpuFn, MatmulCpuVersion, matmul_cpu_versions, matmul_cpu_nversions,
//          matmul_ref_f64
//   A (M, K) row-major, lda = K;  B (K, N) row-major, ldb = N;  C (M, N) row-major, ldc = N.
// The table below is the ONLY list of CPU versions: the matmul program, the tests and the
// notebook all read it. Version 0 is OpenBLAS sgemm (the library the ladder is measured against).
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

typedef void (*MatmulCpuFn)(int M, int N, int K, const float *A, const float *B, float *C);

typedef struct {
    int id;            // 0 = library reference, then 1, 2, ... in ladder order
    const char *name;  // "openblas", "v1_naive", "v2_reordered", ...
    MatmulCpuFn fn;
    const char *what;  // one line: the idea this version adds
} MatmulCpuVersion;

extern const MatmulCpuVersion matmul_cpu_versions[];
extern const int matmul_cpu_nversions;

// The float64 reference every version is checked against: C64 = A·B with A, B widened to
// double and accumulated in double (OpenBLAS dgemm).
void matmul_ref_f64(int M, int N, int K, const float *A, const float *B, double *C64);

#ifdef __cplusplus
}
#endif
