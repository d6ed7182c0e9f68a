// gpu.cu — see gpu.h (the CUDA build of it; gpu_none.c is the build without CUDA).
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "cuda_check.h"
#include "gpu.h"
#include "timer.h"

extern "C" int gpu_info(GpuInfo *out) {
    memset(out, 0, sizeof *out);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(out->reason, sizeof out->reason, "no CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();  // clear the sticky error so later calls are not confused
        return -1;
    }
    if (n == 0) {
        snprintf(out->reason, sizeof out->reason, "no CUDA device (0 devices)");
        return -1;
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sms = p.multiProcessorCount;
    out->mem_gib = (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    out->l2_bytes = p.l2CacheSize;
    out->smem_per_block_optin = (int)p.sharedMemPerBlockOptin;
    int clk = 0, bus = 0;
    cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, 0);
    out->mem_clock_khz = clk;
    out->mem_bus_bits = bus;
    return 0;
}

extern "C" int gpu_mem_info(double *free_bytes, double *total_bytes) {
    size_t f = 0, t = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) return -1;
    *free_bytes = (double)f, *total_bytes = (double)t;
    return 0;
}

extern "C" double gpu_bench(void (*fn)(void *ctx), void *ctx, int warmup, int reps, int inner) {
    if (reps < 1) reps = 1;
    if (reps > 1000) reps = 1000;
    if (inner < 1) inner = 1;
    for (int i = 0; i < warmup; i++) fn(ctx);
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    double t[1000];
    for (int r = 0; r < reps; r++) {
        CUDA_CHECK(cudaEventRecord(a));
        for (int i = 0; i < inner; i++) fn(ctx);
        CUDA_CHECK(cudaEventRecord(b));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t[r] = ms / inner;
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return median_d(t, reps);
}
