// tma_host.cuh — host side of TMA (the Hopper copy engine) for step01's v9 GEMM and step07's
// flash attention v10: encoding a 2D tensor map. cuTensorMapEncodeTiled lives in the driver
// (libcuda); its address is asked of the runtime, so nothing links -lcuda.
// defines: tma_map_2d
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only
#include <cuda_runtime.h>
#include <stdio.h>

typedef CUresult (*TmaEncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static inline TmaEncodeTiledFn tma_encode_fn(void) {
    static TmaEncodeTiledFn fn = NULL;
    if (!fn) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
        cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || !p || q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        fn = (TmaEncodeTiledFn)p;
    }
    return fn;
}

// A 2D row-major 16-bit matrix (rows, cols; row_bytes apart, a multiple of 16) read in boxes of
// box_rows x 64 columns (128 bytes: the 128-byte swizzle's span, the layout wgmma reads); elements
// outside (rows, cols) read as zeros. 0, or -1 with a message.
static inline int tma_map_2d(CUtensorMap *m, CUtensorMapDataType dt, const void *ptr, unsigned long long rows,
                             unsigned long long cols, unsigned long long row_bytes, int box_rows) {
    const TmaEncodeTiledFn fn = tma_encode_fn();
    if (!fn) {
        fprintf(stderr, "cuTensorMapEncodeTiled not found in the driver\n");
        return -1;
    }
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    cuuint32_t estr[2] = {1, 1};
    const CUresult r = fn(m, dt, 2, (void *)ptr, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled failed (%d) for a %llux%llu matrix, rows %llu bytes apart\n", (int)r, rows,
                cols, row_bytes);
        return -1;
    }
    return 0;
}
