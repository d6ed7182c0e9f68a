// matmul_gpu_kernels.cuh — internal to step01's GPU ladder: the launchers each .cu file provides
// to the version table in matmul_gpu.cu. Not part of the C API (see matmul_gpu.h for that).
// Every launcher takes DEVICE pointers, row-major A (M,K), B (K,N), C (M,N) in the version's
// dtype, launches on the default stream, and checks the launch.
#pragma once
#include <cuda_runtime.h>

struct MmArgs {
    int M, N, K;
    const void *A;  // (M, K)
    const void *B;  // (K, N)
    void *C;        // (M, N)
};

typedef void (*MmLaunch)(const MmArgs *a);

// matmul_gpu_tc.cu: tensor cores through WMMA (sm_70+) and mma.sync + ldmatrix + cp.async (sm_80+).
// The mma versions need K % 8 == 0 and N % 8 == 0 (16-byte rows for cp.async); matmul_gpu.cu pads.
void mm_v7_wmma_f16(const MmArgs *a);
void mm_v8_mma_f16(const MmArgs *a);
void mm_v8_mma_bf16(const MmArgs *a);
// Which architecture the tensor-core code was compiled for on this device (0 = none usable).
int mm_tc_compiled_arch(void);

// matmul_gpu_wgmma.cu: Hopper wgmma + TMA; K % 8 == 0 and N % 8 == 0 (TMA strides), padded by caller.
void mm_v9_wgmma_f16(const MmArgs *a);
void mm_v9_wgmma_bf16(const MmArgs *a);
// 1 if this binary carries sm_90a code for the wgmma kernel and it runs on this device.
int mm_wgmma_available(void);
