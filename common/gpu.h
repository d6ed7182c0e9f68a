// gpu.h — what GPU (if any) is here, and timing GPU work with CUDA events.
// defines: GpuInfo, gpu_info, gpu_mem_info, gpu_bench, HAVE_CUDA
// Callable from C. When the build has no CUDA (no nvcc) or the machine has no GPU,
// gpu_info() returns -1 and fills `reason`, so programs and tests can say why they skip.
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

#ifndef HAVE_CUDA
#define HAVE_CUDA 0
#endif

typedef struct {
    char name[256];
    int cc_major, cc_minor;
    int sms;
    double mem_gib;
    int l2_bytes;
    int smem_per_block_optin;  // bytes a block may use after cudaFuncSetAttribute
    double mem_clock_khz;
    int mem_bus_bits;
    char reason[256];          // why no GPU is usable, when gpu_info returns -1
} GpuInfo;

// 0 and `out` filled if device 0 is usable; -1 and out->reason otherwise.
int gpu_info(GpuInfo *out);
// Free and total bytes of device 0's memory now (cudaMemGetInfo). 0, or -1 without a GPU.
int gpu_mem_info(double *free_bytes, double *total_bytes);

// Time fn(ctx) on the GPU: `warmup` untimed calls, then `reps` samples, each timed with a
// pair of CUDA events around `inner` back-to-back calls. Returns the median milliseconds
// of ONE call. Needs HAVE_CUDA and a device (returns -1.0 otherwise).
double gpu_bench(void (*fn)(void *ctx), void *ctx, int warmup, int reps, int inner);

#ifdef __cplusplus
}
#endif
