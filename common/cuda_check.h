// cuda_check.h — the one place the CUDA/cuBLAS/NCCL error-check macros live.
// defines: CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK, CUDA_CHECK_LAST
// Use CUDA_CHECK(call) around every runtime call and CUDA_CHECK_LAST() after every
// kernel launch. On failure they print the failing call, the error and file:line, then
// exit(1). Include only from .cu files (or C files that include cuda_runtime_api.h).
#pragma once
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            fprintf(stderr, "CUDA error: %s failed: %s (%s:%d)\n", #call,                  \
                    cudaGetErrorString(err_), __FILE__, __LINE__);                         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

// After a kernel launch: catches bad launch configurations immediately.
#define CUDA_CHECK_LAST() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                 \
    do {                                                                                   \
        cublasStatus_t st_ = (call);                                                       \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "cuBLAS error: %s failed: status %d (%s:%d)\n", #call,         \
                    (int)st_, __FILE__, __LINE__);                                         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define NCCL_CHECK(call)                                                                   \
    do {                                                                                   \
        ncclResult_t r_ = (call);                                                          \
        if (r_ != ncclSuccess) {                                                           \
            fprintf(stderr, "NCCL error: %s failed: %s (%s:%d)\n", #call,                  \
                    ncclGetErrorString(r_), __FILE__, __LINE__);                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
