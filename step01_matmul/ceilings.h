// ceilings.h — the measured ceilings of this machine, written by build/bin/roofline and read
// by matmul and account, so every "% of peak" is a percent of a MEASURED peak.
// defines: Ceilings, ceilings_path, ceilings_load, ceilings_save
// File: $LLM_CEILINGS when set, else ceilings.json in the build directory of the running binary
// (build/bin/account -> build/ceilings.json, found from any working directory), one flat JSON object:
//   {"cpu_name":..., "cpu_threads":2, "cpu_copy_gbps":..., "cpu_read_gbps":..., "cpu_write_gbps":...,
//    "cpu_fp32_gflops":..., "cpu_sgemm_gflops":..., "cpu_blas_core":..., "cpu_blas_warning":...,
//    "gpu_name":..., "gpu_copy_gbps":..., "gpu_read_gbps":...,
//    "gpu_write_gbps":..., "gpu_fp32_tflops":..., "gpu_fp16_tflops":..., "gpu_bf16_tflops":...,
//    "date":..., "commit":...}
// Missing numbers are 0 (for example no GPU section on a machine without one).
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char cpu_name[128];
    int cpu_threads;
    double cpu_copy_gbps, cpu_read_gbps, cpu_write_gbps, cpu_fp32_gflops, cpu_sgemm_gflops;
    char cpu_blas_core[64];      // the OpenBLAS kernels the CPU numbers were measured with
    char cpu_blas_warning[640];  // blas_core_warning's line at that time ("" when the kernels fit the CPU)
    char gpu_name[128];
    double gpu_copy_gbps, gpu_read_gbps, gpu_write_gbps;
    double gpu_fp32_tflops;                   // FMA kernel peak (SIMT)
    double gpu_sgemm_tflops;                  // cuBLAS SGEMM at the largest size
    double gpu_fp16_tflops, gpu_bf16_tflops;  // cuBLAS tensor-core GEMM at the largest size
} Ceilings;

const char *ceilings_path(void);
// The GEMM ceiling (TFLOP/s) for weights of `dtype` ("fp32", "fp16", "bf16", ...) on the GPU, or
// the CPU's OpenBLAS sgemm when gpu is 0. A GPU without bf16 tensor cores (sm_75: T4) has no
// bf16 number: the fp16 one is used and *note says so (note may be NULL; "" when nothing to say).
double ceilings_gemm_tflops(const Ceilings *c, int gpu, const char *dtype, char *note, size_t note_len);
// 0 if the file exists and parsed, -1 otherwise (c zeroed).
int ceilings_load(Ceilings *c);
int ceilings_save(const Ceilings *c);

#ifdef __cplusplus
}
#endif
