// gpu_none.c — gpu.h for builds without CUDA: there is never a device.
#include "gpu.h"

#if !HAVE_CUDA
#include <stdio.h>
#include <string.h>

int gpu_info(GpuInfo *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->reason, sizeof out->reason, "built without CUDA (nvcc was not found at build time)");
    return -1;
}

double gpu_bench(void (*fn)(void *ctx), void *ctx, int warmup, int reps, int inner) {
    (void)fn, (void)ctx, (void)warmup, (void)reps, (void)inner;
    return -1.0;
}
int gpu_mem_info(double *free_bytes, double *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return -1;
}
#else
typedef int gpu_none_is_empty_with_cuda;  // keeps ISO C happy: no empty translation unit
#endif
