// ceilings.h — the measured ceilings of this machine, written by build/bin/roofline and read
// by matmul and account, so every "% of peak" is a percent of a MEASURED peak.
// defines: Ceilings, ceilings_path, ceilings_load, ceilings_save
// File: build/ceilings.json by default ($LLM_CEILINGS overrides), one flat JSON object:
//   {"cpu_name":..., "cpu_threads":2, "cpu_copy_gbps":..., "cpu_read_gbps":..., "cpu_write_gbps":...,
//    "cpu_fp32_gflops":...,  "gpu_name":..., "gpu_copy_gbps":..., "gpu_read_gbps":...,
//    "gpu_write_gbps":..., "gpu_fp32_tflops":..., "gpu_fp16_tflops":..., "gpu_bf16_tflops":...,
//    "date":..., "commit":...}
// Missing numbers are 0 (for example no GPU section on a machine without one).
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char cpu_name[128];
    int cpu_threads;
    double cpu_copy_gbps, cpu_read_gbps, cpu_write_gbps, cpu_fp32_gflops, cpu_sgemm_gflops;
    char gpu_name[128];
    double gpu_copy_gbps, gpu_read_gbps, gpu_write_gbps;
    double gpu_fp32_tflops;                   // FMA kernel peak (SIMT)
    double gpu_sgemm_tflops;                  // cuBLAS SGEMM at the largest size
    double gpu_fp16_tflops, gpu_bf16_tflops;  // cuBLAS tensor-core GEMM at the largest size
} Ceilings;

const char *ceilings_path(void);
// 0 if the file exists and parsed, -1 otherwise (c zeroed).
int ceilings_load(Ceilings *c);
int ceilings_save(const Ceilings *c);

#ifdef __cplusplus
}
#endif
