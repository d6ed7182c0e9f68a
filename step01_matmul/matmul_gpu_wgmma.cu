// matmul_gpu_wgmma.cu — step01's Hopper GEMM (v9_wgmma_f16): what it takes to get near the
// library on an H100/H200, where mma.sync (v8) cannot feed the tensor cores fast enough.
//   * TMA (cp.async.bulk.tensor): one thread asks the copy engine for a whole 2D tile; it lands
//     in shared memory already in the 128-byte swizzled layout the tensor cores read without
//     bank conflicts, and out-of-range rows/columns arrive as zeros (no edge code in the loop).
//   * mbarrier pipeline, 4 stages: "full[s]" completes when the copy engine has written stage s
//     (transaction bytes), "empty[s]" when both consumer warpgroups have finished reading it.
//   * warp specialization: warpgroup 0 is the producer (one thread issues TMA, the rest idle and
//     give their registers away with setmaxnreg); warpgroups 1 and 2 are consumers that issue
//     wgmma.mma_async m64n256k16 reading A and B straight from shared memory, accumulating a
//     64x256 fp32 tile each in registers (128 per thread).
// Block tile 128 (M) x 256 (N), k-tile 64. A (M,K) row-major is "K-major"; B (K,N) row-major is
// "N-major" for wgmma (imm-trans-b = 1), stored as four 64-column swizzled slabs per stage.
// Built only into the sm_90a code (arch 90 is compiled as sm_90a by the Makefile); everywhere
// else the kernel body is empty and mm_wgmma_available() says 0. K and N must be multiples of
// 8 (TMA row strides are multiples of 16 bytes): matmul_gpu.cu pads other shapes.
#include <cuda.h>  // CUtensorMap and its enums only: the driver function is fetched at run time (tma_host.cuh)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_check.h"
#include "matmul_gpu_kernels.cuh"
#include "tma_host.cuh"  // tma_map_2d
#include "wgmma.cuh"     // mbar_*, tma_load_2d, smem_desc, WG_ACC128

#define BM9 128
#define BN9 256
#define BK9 64
#define ST9 4
#define A_BYTES9 (BM9 * BK9 * 2)               // 16 KB: 128 rows of 128 bytes
#define B_SLAB9 (BK9 * 64 * 2)                 // 8 KB: 64 k-rows of 64 columns (128 bytes)
#define B_BYTES9 (4 * B_SLAB9)                 // 32 KB
#define STAGE9 (A_BYTES9 + B_BYTES9)
#define SMEM9 (ST9 * STAGE9 + 1024 + 2 * ST9 * 8)  // stages, alignment slack, barriers

#ifdef WGMMA_ARCH  // wgmma.cuh: device code for sm_90a
#define WGMMA_OK 1
#else
#define WGMMA_OK 0
#endif

__global__ void k_wgmma_probe(int *out) {
#if WGMMA_OK
    *out = 1;
#endif
}

#if WGMMA_OK
// wgmma m64n256k16: d (64x256 fp32 per warpgroup, 128 registers per thread) += A (64x16,
// K-major) . B (16x256, N-major), both from shared memory through their descriptors.
// TYPE is the PTX input type (f16 or bf16); the 128 accumulator operands are spelled out once.
#define WGMMA_D_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WGMMA_D_OPERANDS WG_ACC128
#define WGMMA_M64N256K16(TYPE)                                                                  \
    asm volatile("{\n"                                                                          \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " WGMMA_D_REGS ", " \
                 "%128, %129, 1, 1, 1, 0, 1;\n"                                                 \
                 "}\n"                                                                          \
                 : WGMMA_D_OPERANDS                                                             \
                 : "l"(da), "l"(db))
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db, const __half *) {
    WGMMA_M64N256K16("f16");
}
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db, const __nv_bfloat16 *) {
    WGMMA_M64N256K16("bf16");
}
__device__ __forceinline__ __half2 pack2(float x, float y, const __half *) { return __floats2half2_rn(x, y); }
__device__ __forceinline__ __nv_bfloat162 pack2(float x, float y, const __nv_bfloat16 *) { return __floats2bfloat162_rn(x, y); }
#endif

template <typename T>
__global__ void __launch_bounds__(384, 1)
    k_v9_wgmma(int M, int N, int K, const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
               T *C) {
#if WGMMA_OK
    extern __shared__ unsigned char smem9_raw[];
    // the 128-byte swizzle pattern repeats every 1024 bytes: stage buffers start 1024-aligned
    uint32_t base = (uint32_t)__cvta_generic_to_shared(smem9_raw);
    uint32_t tiles = (base + 1023) & ~1023u;
    uint32_t bars = tiles + ST9 * STAGE9;  // full[ST9], then empty[ST9], 8 bytes each
    int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    int bm = blockIdx.y * BM9, bn = blockIdx.x * BN9;
    int nk = (K + BK9 - 1) / BK9;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST9; s++) {
            mbar_init(bars + 8 * s, 1);               // full: the producer's expect_tx arrival
            mbar_init(bars + 8 * (ST9 + s), 8);       // empty: one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ---- producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            for (int kt = 0; kt < nk; kt++) {
                int s = kt % ST9;
                uint32_t ph = (kt / ST9) & 1;
                mbar_wait(bars + 8 * (ST9 + s), ph ^ 1);  // stage free (first round passes at once)
                uint32_t full = bars + 8 * s, a = tiles + s * STAGE9, b = a + A_BYTES9;
                mbar_expect_tx(full, STAGE9);  // the whole boxes count, zero-filled parts included
                tma_load_2d(a, &tmA, kt * BK9, bm, full);
#pragma unroll
                for (int c = 0; c < 4; c++) tma_load_2d(b + c * B_SLAB9, &tmB, bn + c * 64, kt * BK9, full);
            }
        }
    } else {  // ---- consumers: warpgroup 1 -> rows 0..63 of the tile, 2 -> rows 64..127
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        int cw = wg - 1, warp = tid / 32, lane = tid % 32;
        float d[128];
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.0f;
        for (int kt = 0; kt < nk; kt++) {
            int s = kt % ST9;
            mbar_wait(bars + 8 * s, (kt / ST9) & 1);
            uint32_t a = tiles + s * STAGE9 + cw * (64 * 128), b = tiles + s * STAGE9 + A_BYTES9;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < BK9 / 16; kk++) {
                // A: 16 more k = 32 bytes further along each swizzled 128-byte row; 8-row groups 1024 B apart.
                // B: 16 more k = 16 rows of 128 bytes; 64-column slabs B_SLAB9 apart (LBO), 8-row groups 1024 B (SBO).
                uint64_t da = smem_desc(a + kk * 32, 16, 1024);
                uint64_t db = smem_desc(b + kk * 16 * 128, B_SLAB9, 1024);
                wgmma_m64n256k16(d, da, db, (const T *)0);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // keep this k-tile's group in flight; the previous one is done -> release its stage
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (ST9 + (kt - 1) % ST9));
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // d[4j + {0,1}]: row 16*warp + lane/4, cols 8j + 2*(lane%4) + {0,1}; d[4j + {2,3}]: row + 8
        int r0 = bm + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            int c = bn + 8 * j + 2 * (lane % 4);
            if (c < N) {  // N is a multiple of 8 here, so c + 1 < N as well
                if (r0 < M) *reinterpret_cast<decltype(pack2(0, 0, C)) *>(C + (size_t)r0 * N + c) = pack2(d[4 * j], d[4 * j + 1], C);
                if (r0 + 8 < M)
                    *reinterpret_cast<decltype(pack2(0, 0, C)) *>(C + (size_t)(r0 + 8) * N + c) = pack2(d[4 * j + 2], d[4 * j + 3], C);
            }
        }
    }
#endif
}

// ------------------------------------------------------------------ host side
// A 2D row-major 16-bit matrix (rows, cols) read in boxes of box_rows x 64 columns; out-of-range
// elements read as zero (tma_host.cuh).
static void make_map(CUtensorMap *m, CUtensorMapDataType dt, const void *ptr, int rows, int cols, int box_rows) {
    if (tma_map_2d(m, dt, ptr, (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)cols * 2, box_rows)) exit(1);
}

int mm_wgmma_available(void) {
    static int avail = -1;
    if (avail < 0) {
        int *d, h = 0;
        CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
        CUDA_CHECK(cudaMemset(d, 0, sizeof(int)));
        k_wgmma_probe<<<1, 1>>>(d);
        CUDA_CHECK_LAST();
        CUDA_CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(d));
        avail = h;
    }
    return avail;
}

template <typename T>
static void launch_v9(const MmArgs *a, CUtensorMapDataType dt, const char *name) {
    // Tensor maps are encoded on the host; keep the last pair so timed repeats do not redo it.
    static CUtensorMap mA, mB;
    static MmArgs last = {0, 0, 0, NULL, NULL, NULL};
    static bool attr = false;
    if (a->K % 8 || a->N % 8) {
        fprintf(stderr, "%s: K and N must be multiples of 8 (got K=%d N=%d)\n", name, a->K, a->N);
        exit(1);
    }
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(k_v9_wgmma<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM9));
        attr = true;
    }
    if (a->A != last.A || a->B != last.B || a->M != last.M || a->N != last.N || a->K != last.K) {
        make_map(&mA, dt, a->A, a->M, a->K, BM9);  // A (M, K): boxes of 128 rows x 64 k
        make_map(&mB, dt, a->B, a->K, a->N, BK9);  // B (K, N): boxes of 64 k-rows x 64 columns
        last = *a;
    }
    dim3 grid((a->N + BN9 - 1) / BN9, (a->M + BM9 - 1) / BM9);
    k_v9_wgmma<T><<<grid, 384, SMEM9>>>(a->M, a->N, a->K, mA, mB, (T *)a->C);
    CUDA_CHECK_LAST();
}
void mm_v9_wgmma_f16(const MmArgs *a) { launch_v9<__half>(a, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "v9_wgmma_f16"); }
void mm_v9_wgmma_bf16(const MmArgs *a) { launch_v9<__nv_bfloat16>(a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, "v9_wgmma_bf16"); }
