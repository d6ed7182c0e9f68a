// matmul_gpu.cu — the GPU matmul ladder: the version table, cuBLAS baselines, the fp32 SIMT
// kernels v1..v6, and matmul_gpu_run (copies, rounding, padding, timing).
//
//   build/bin/matmul --device cuda --size 4096      (validates each version, then times it)
//
// Ladder (fp32 on the CUDA cores, no TF32):
//   cublas_sgemm     the library (kernel "0", what every fp32 row is compared with)
//   v1_naive         one thread per C element; consecutive threads walk down a COLUMN of C, so
//                    their A and C accesses are K or N floats apart (uncoalesced)
//   v2_coalesced     the same, but consecutive threads walk along a ROW: B and C accesses coalesce
//   v3_smem_tiled    32x32 tiles of A and B staged in shared memory: each global load reused 32x
//   v4_2d_regblock   128x128 block tile, each thread computes 8x8 outputs from registers
//   v5_vectorized    + float4 global loads and a transposed A tile, so fragments load as float4
//   v6_warptiled     + warp tiling (conflict-free fragment loads), double-buffered shared memory
//                    with register prefetch of the next tile: one barrier per k-tile
// Tensor cores (matmul_gpu_tc.cu, matmul_gpu_wgmma.cu): cublas_hgemm, v7_wmma_f16, v8_mma_f16,
// v9_wgmma_f16, cublas_bf16, v8_mma_bf16, v9_wgmma_bf16.
// Shapes: every kernel is correct for any M, N, K >= 1. Edge tiles are guarded; the float4
// paths run only when the shape is a multiple of the tile (else the guarded scalar path runs).
// The mma/wgmma versions need K and N multiples of 8 (16-byte rows); for other shapes the
// inputs are copied into zero-padded buffers and C out of one, INSIDE the timed region.
//
// Measured on an NVIDIA H200 (sm_90, 132 SMs) on 2026-11-30, commit 62b9e1d, with
// `build/bin/matmul --device cuda --size 4096 --reps 30` (4096^3, median of 30 runs, CUDA events;
// three runs that day agreed within 3%):
//   version              ms  TFLOP/s  % of cuBLAS of the same dtype
//   cublas_sgemm      2.709   50.739  100.0
//   v1_naive        275.854    0.498    1.0   uncoalesced: every warp load touches 32 rows
//   v2_coalesced     23.378    5.879   11.6   coalesced, but no reuse: 2 global loads per FMA
//   v3_smem_tiled    15.801    8.698   17.1   2 shared-memory loads per FMA
//   v4_2d_regblock    6.580   20.886   41.2   64 FMAs per 16 shared-memory loads
//   v5_vectorized     3.801   36.162   71.3   float4 loads, fewer instructions per FMA
//   v6_warptiled      3.109   44.209   87.1   no bank conflicts, loads overlapped with math
//   cublas_hgemm      0.190  723.363  100.0
//   v7_wmma_f16       1.160  118.434   16.4   tensor cores; in a block, loads and math alternate
//   v8_mma_f16        0.445  309.068   42.7   pipelined, yet mma.sync is not Hopper's fast path
//   v9_wgmma_f16      0.207  664.907   91.9   TMA + wgmma: the Hopper way
//   cublas_bf16       0.186  740.065  100.0
//   v8_mma_bf16       0.443  310.128   41.9
//   v9_wgmma_bf16     0.200  686.097   92.7
// Every version also passed the float64 check at 1000x999x1001 and the tests' odd shapes, and
// compute-sanitizer memcheck and racecheck found nothing at small odd shapes. At 4096^3 each
// version's C was bit-identical to cuBLAS's (err_vs_lib 0): consistent with all of them
// accumulating each output over k in the same order (fp32 FMAs on the SIMT cores; k-steps of
// 16 on the tensor cores) and cuBLAS not splitting K at that size.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "cuda_check.h"
#include "gpu.h"
#include "matmul_gpu.h"
#include "matmul_gpu_kernels.cuh"

static inline int cdiv(int a, int b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------ cuBLAS baselines
// cuBLAS is column-major. A row-major (M,N) matrix is a column-major (N,M) one, so
// C = A.B (row-major) is C^T = B^T.A^T (column-major): pass B first, with m = N, n = M.
// The handle lives for one matmul_gpu_run of a library version (created and destroyed there), so
// nothing cuBLAS allocates outlives the call: compute-sanitizer's leak check stays at 0.
static cublasHandle_t g_cublas = NULL;
static cublasHandle_t cublas(void) { return g_cublas; }

static void mm_cublas_sgemm(const MmArgs *a) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, a->N, a->M, a->K, &one,
                             (const float *)a->B, a->N, (const float *)a->A, a->K, &zero,
                             (float *)a->C, a->N));
}

static void gemm_ex(const MmArgs *a, cudaDataType t) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, a->N, a->M, a->K, &one, a->B, t,
                              a->N, a->A, t, a->K, &zero, a->C, t, a->N, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}
static void mm_cublas_hgemm(const MmArgs *a) { gemm_ex(a, CUDA_R_16F); }
static void mm_cublas_bf16(const MmArgs *a) { gemm_ex(a, CUDA_R_16BF); }

// ------------------------------------------------------------------ v1, v2: one thread per output
// v1: threadIdx.x runs along M. A warp reads 32 different rows of A (K floats apart) and writes
// 32 different rows of C: every access is its own memory transaction.
__global__ void k_v1_naive(int M, int N, int K, const float *A, const float *B, float *C) {
    int row = blockIdx.x * 32 + threadIdx.x;
    int col = blockIdx.y * 32 + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
    C[(size_t)row * N + col] = acc;
}

// v2: threadIdx.x runs along N. A warp reads one A element (broadcast) and 32 consecutive B and
// C elements: one 128-byte transaction each.
__global__ void k_v2_coalesced(int M, int N, int K, const float *A, const float *B, float *C) {
    int row = blockIdx.y * 32 + threadIdx.y;
    int col = blockIdx.x * 32 + threadIdx.x;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
    C[(size_t)row * N + col] = acc;
}

static void mm_v1_naive(const MmArgs *a) {
    dim3 grid(cdiv(a->M, 32), cdiv(a->N, 32)), block(32, 32);
    k_v1_naive<<<grid, block>>>(a->M, a->N, a->K, (const float *)a->A, (const float *)a->B, (float *)a->C);
    CUDA_CHECK_LAST();
}
static void mm_v2_coalesced(const MmArgs *a) {
    dim3 grid(cdiv(a->N, 32), cdiv(a->M, 32)), block(32, 32);
    k_v2_coalesced<<<grid, block>>>(a->M, a->N, a->K, (const float *)a->A, (const float *)a->B, (float *)a->C);
    CUDA_CHECK_LAST();
}

// ------------------------------------------------------------------ v3: shared-memory tiles
// Each 32x32 block stages a 32x32 tile of A and of B in shared memory per step of K, so every
// element fetched from global memory is used 32 times. Out-of-range elements load as 0.
#define T3 32
__global__ void k_v3_smem_tiled(int M, int N, int K, const float *A, const float *B, float *C) {
    __shared__ float As[T3][T3];      // (rows of C, k)
    __shared__ float Bs[T3][T3 + 1];  // (k, cols of C); +1 is not needed for this access, kept simple
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * T3 + ty, col = blockIdx.x * T3 + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += T3) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[(size_t)row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(size_t)(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < T3; k++) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
static void mm_v3_smem_tiled(const MmArgs *a) {
    dim3 grid(cdiv(a->N, T3), cdiv(a->M, T3)), block(T3, T3);
    k_v3_smem_tiled<<<grid, block>>>(a->M, a->N, a->K, (const float *)a->A, (const float *)a->B, (float *)a->C);
    CUDA_CHECK_LAST();
}

// The heart of register blocking (v4-v6): 8 values of A's column and 8 of B's row, all in
// registers, give 64 FMAs into the thread's 8x8 block of C — 64 FMAs for 16 loads.
__device__ __forceinline__ void outer_product_8x8(float (&acc)[8][8], const float (&a)[8], const float (&b)[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
}

// ------------------------------------------------------------------ v4: 2D register blocking
// Block tile 128x128, k-step 8, 256 threads; thread (ty, tx) of a 16x16 grid computes the 8x8
// outputs rows ty*8.., cols tx*8.. . Per k it loads 8 A + 8 B values into registers and does
// 64 FMAs: 4 FMAs per shared-memory load instead of 1 in v3.
#define BM4 128
#define BN4 128
#define BK4 8
__global__ void __launch_bounds__(256) k_v4_2d_regblock(int M, int N, int K, const float *A, const float *B, float *C) {
    __shared__ float As[BM4][BK4];  // (m, k)
    __shared__ float Bs[BK4][BN4];  // (k, n)
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int bm = blockIdx.y * BM4, bn = blockIdx.x * BN4;
    float acc[8][8] = {};
    for (int k0 = 0; k0 < K; k0 += BK4) {
#pragma unroll
        for (int i = 0; i < 4; i++) {  // 1024 elements of each tile, 4 per thread
            int idx = tid + i * 256;
            int ar = idx / BK4, ac = idx % BK4;
            int gr = bm + ar, gk = k0 + ac;
            As[ar][ac] = (gr < M && gk < K) ? A[(size_t)gr * K + gk] : 0.0f;
            int br = idx / BN4, bc = idx % BN4;
            int gk2 = k0 + br, gc = bn + bc;
            Bs[br][bc] = (gk2 < K && gc < N) ? B[(size_t)gk2 * N + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK4; k++) {
            float a[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = As[ty * 8 + i][k];
#pragma unroll
            for (int j = 0; j < 8; j++) b[j] = Bs[k][tx * 8 + j];
            outer_product_8x8(acc, a, b);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = bm + ty * 8 + i;
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int c = bn + tx * 8 + j;
            if (c < N) C[(size_t)r * N + c] = acc[i][j];
        }
    }
}
static void mm_v4_2d_regblock(const MmArgs *a) {
    dim3 grid(cdiv(a->N, BN4), cdiv(a->M, BM4));
    k_v4_2d_regblock<<<grid, 256>>>(a->M, a->N, a->K, (const float *)a->A, (const float *)a->B, (float *)a->C);
    CUDA_CHECK_LAST();
}

// ------------------------------------------------------------------ tile loaders for v5, v6
// A 128 x BK tile of A goes to shared memory TRANSPOSED (As[k][m]) so a thread's 4 consecutive
// rows are one float4; a BK x 128 tile of B goes as it is (Bs[k][n]). FULL: the tile is entirely
// inside the matrix and rows are float4-aligned, so 16-byte loads need no checks; otherwise each
// element is loaded on its own with bounds checks (0 outside).
template <int BK, bool FULL>
__device__ __forceinline__ void load_a_regs(const float *A, int M, int K, int bm, int k0, int tid, float4 (&ra)[BK / 8]) {
#pragma unroll
    for (int i = 0; i < BK / 8; i++) {
        int idx = tid + i * 256;             // BK*128/4 float4s, 256 threads
        int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
        int gr = bm + r, gk = k0 + c;
        if (FULL) {
            ra[i] = *reinterpret_cast<const float4 *>(A + (size_t)gr * K + gk);
        } else {
            const float *p = A + (size_t)gr * K + gk;
            bool okr = gr < M;
            ra[i].x = (okr && gk + 0 < K) ? p[0] : 0.0f;
            ra[i].y = (okr && gk + 1 < K) ? p[1] : 0.0f;
            ra[i].z = (okr && gk + 2 < K) ? p[2] : 0.0f;
            ra[i].w = (okr && gk + 3 < K) ? p[3] : 0.0f;
        }
    }
}
template <int BK, int LDA>
__device__ __forceinline__ void store_a_smem(float (*As)[LDA], int tid, const float4 (&ra)[BK / 8]) {
#pragma unroll
    for (int i = 0; i < BK / 8; i++) {
        int idx = tid + i * 256;
        int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
        As[c + 0][r] = ra[i].x;
        As[c + 1][r] = ra[i].y;
        As[c + 2][r] = ra[i].z;
        As[c + 3][r] = ra[i].w;
    }
}
template <int BK, bool FULL>
__device__ __forceinline__ void load_b_regs(const float *B, int N, int K, int bn, int k0, int tid, float4 (&rb)[BK / 8]) {
#pragma unroll
    for (int i = 0; i < BK / 8; i++) {
        int idx = tid + i * 256;             // BK rows of 32 float4s
        int r = idx / 32, c = (idx % 32) * 4;
        int gk = k0 + r, gc = bn + c;
        if (FULL) {
            rb[i] = *reinterpret_cast<const float4 *>(B + (size_t)gk * N + gc);
        } else {
            const float *p = B + (size_t)gk * N + gc;
            bool okk = gk < K;
            rb[i].x = (okk && gc + 0 < N) ? p[0] : 0.0f;
            rb[i].y = (okk && gc + 1 < N) ? p[1] : 0.0f;
            rb[i].z = (okk && gc + 2 < N) ? p[2] : 0.0f;
            rb[i].w = (okk && gc + 3 < N) ? p[3] : 0.0f;
        }
    }
}
template <int BK>
__device__ __forceinline__ void store_b_smem(float (*Bs)[128], int tid, const float4 (&rb)[BK / 8]) {
#pragma unroll
    for (int i = 0; i < BK / 8; i++) {
        int idx = tid + i * 256;
        int r = idx / 32, c = (idx % 32) * 4;
        *reinterpret_cast<float4 *>(&Bs[r][c]) = rb[i];
    }
}
// Whether a version may take the unchecked float4 path for this shape.
static bool full_tiles(const MmArgs *a, int BK) { return a->M % 128 == 0 && a->N % 128 == 0 && a->K % BK == 0; }

// ------------------------------------------------------------------ v5: float4 + transposed A
// v4's tiling, with 16-byte global loads and A stored transposed, so the 8 A values and the
// 8 B values a thread needs per k are two float4 shared-memory loads each (v4: 8 + 8 scalar).
template <bool FULL>
__global__ void __launch_bounds__(256) k_v5_vectorized(int M, int N, int K, const float *A, const float *B, float *C) {
    constexpr int BK = 8;
    __shared__ __align__(16) float As[BK][128];  // (k, m): transposed
    __shared__ __align__(16) float Bs[BK][128];  // (k, n)
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int bm = blockIdx.y * 128, bn = blockIdx.x * 128;
    float acc[8][8] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 ra[1], rb[1];
        load_a_regs<BK, FULL>(A, M, K, bm, k0, tid, ra);
        load_b_regs<BK, FULL>(B, N, K, bn, k0, tid, rb);
        store_a_smem<BK, 128>(As, tid, ra);
        store_b_smem<BK>(Bs, tid, rb);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[8], b[8];
            *reinterpret_cast<float4 *>(&a[0]) = *reinterpret_cast<const float4 *>(&As[k][ty * 8]);
            *reinterpret_cast<float4 *>(&a[4]) = *reinterpret_cast<const float4 *>(&As[k][ty * 8 + 4]);
            *reinterpret_cast<float4 *>(&b[0]) = *reinterpret_cast<const float4 *>(&Bs[k][tx * 8]);
            *reinterpret_cast<float4 *>(&b[4]) = *reinterpret_cast<const float4 *>(&Bs[k][tx * 8 + 4]);
            outer_product_8x8(acc, a, b);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = bm + ty * 8 + i;
        int c = bn + tx * 8;
        if (FULL) {
            *reinterpret_cast<float4 *>(&C[(size_t)r * N + c]) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            *reinterpret_cast<float4 *>(&C[(size_t)r * N + c + 4]) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
        } else if (r < M) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c + j < N) C[(size_t)r * N + c + j] = acc[i][j];
        }
    }
}
static void mm_v5_vectorized(const MmArgs *a) {
    dim3 grid(cdiv(a->N, 128), cdiv(a->M, 128));
    const float *A = (const float *)a->A, *B = (const float *)a->B;
    float *C = (float *)a->C;
    if (full_tiles(a, 8)) k_v5_vectorized<true><<<grid, 256>>>(a->M, a->N, a->K, A, B, C);
    else k_v5_vectorized<false><<<grid, 256>>>(a->M, a->N, a->K, A, B, C);
    CUDA_CHECK_LAST();
}

// ------------------------------------------------------------------ v6: warp tiling + double buffer
// 8 warps as 2 (M) x 4 (N), warp tile 64x32. Within a warp, lane = ty*4 + tx (ty 0..7, tx 0..3)
// computes 2x2 sub-blocks of 4x4: rows ty*4 + {0, 32} (+0..3), cols tx*4 + {0, 16} (+0..3).
// A quarter-warp then reads at most 2 distinct A float4s and 4 consecutive B float4s per k:
// no shared-memory bank conflicts (v5's layout has 4-way conflicts on A). As rows are padded by
// 4 floats so the transposed stores are conflict-free too. Two shared-memory buffers: while the
// block computes on one, the next k-tile travels from global memory into registers and is
// stored into the other after the math, so there is one __syncthreads per k-tile.
#define BK6 8
#define LDA6 (128 + 4)
template <bool FULL>
__global__ void __launch_bounds__(256, 2) k_v6_warptiled(int M, int N, int K, const float *A, const float *B, float *C) {
    __shared__ __align__(16) float As[2][BK6][LDA6];  // (buffer, k, m): transposed, padded
    __shared__ __align__(16) float Bs[2][BK6][128];   // (buffer, k, n)
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int wm = (warp / 4) * 64, wn = (warp % 4) * 32;   // warp tile origin in the block tile
    int ty = lane / 4, tx = lane % 4;
    int bm = blockIdx.y * 128, bn = blockIdx.x * 128;
    float acc[8][8] = {};
    float4 ra[BK6 / 8], rb[BK6 / 8];
    load_a_regs<BK6, FULL>(A, M, K, bm, 0, tid, ra);
    load_b_regs<BK6, FULL>(B, N, K, bn, 0, tid, rb);
    store_a_smem<BK6, LDA6>(As[0], tid, ra);
    store_b_smem<BK6>(Bs[0], tid, rb);
    __syncthreads();
    int nk = (K + BK6 - 1) / BK6;
    for (int kt = 0; kt < nk; kt++) {
        int cur = kt & 1;
        bool more = kt + 1 < nk;
        if (more) {  // prefetch the next tile into registers; its latency hides behind the math
            load_a_regs<BK6, FULL>(A, M, K, bm, (kt + 1) * BK6, tid, ra);
            load_b_regs<BK6, FULL>(B, N, K, bn, (kt + 1) * BK6, tid, rb);
        }
#pragma unroll
        for (int k = 0; k < BK6; k++) {
            float a[8], b[8];
            *reinterpret_cast<float4 *>(&a[0]) = *reinterpret_cast<const float4 *>(&As[cur][k][wm + ty * 4]);
            *reinterpret_cast<float4 *>(&a[4]) = *reinterpret_cast<const float4 *>(&As[cur][k][wm + 32 + ty * 4]);
            *reinterpret_cast<float4 *>(&b[0]) = *reinterpret_cast<const float4 *>(&Bs[cur][k][wn + tx * 4]);
            *reinterpret_cast<float4 *>(&b[4]) = *reinterpret_cast<const float4 *>(&Bs[cur][k][wn + 16 + tx * 4]);
            outer_product_8x8(acc, a, b);
        }
        if (more) {  // the other buffer was last read in iteration kt-1, before the last barrier
            store_a_smem<BK6, LDA6>(As[cur ^ 1], tid, ra);
            store_b_smem<BK6>(Bs[cur ^ 1], tid, rb);
        }
        __syncthreads();
    }
    // acc[i][j]: row wm + (i/4)*32 + ty*4 + i%4, col wn + (j/4)*16 + tx*4 + j%4
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = bm + wm + (i / 4) * 32 + ty * 4 + i % 4;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int c = bn + wn + h * 16 + tx * 4;
            if (FULL) {
                *reinterpret_cast<float4 *>(&C[(size_t)r * N + c]) =
                    make_float4(acc[i][h * 4], acc[i][h * 4 + 1], acc[i][h * 4 + 2], acc[i][h * 4 + 3]);
            } else if (r < M) {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (c + j < N) C[(size_t)r * N + c + j] = acc[i][h * 4 + j];
            }
        }
    }
}
static void mm_v6_warptiled(const MmArgs *a) {
    dim3 grid(cdiv(a->N, 128), cdiv(a->M, 128));
    const float *A = (const float *)a->A, *B = (const float *)a->B;
    float *C = (float *)a->C;
    if (full_tiles(a, BK6)) k_v6_warptiled<true><<<grid, 256>>>(a->M, a->N, a->K, A, B, C);
    else k_v6_warptiled<false><<<grid, 256>>>(a->M, a->N, a->K, A, B, C);
    CUDA_CHECK_LAST();
}

// ------------------------------------------------------------------ the table
// The ONLY list of GPU versions. pad8: needs K % 8 == 0 and N % 8 == 0 (else run on padded copies).
struct VersionImpl {
    MatmulGpuVersion v;
    MmLaunch fn;
    int pad8;
};

static const VersionImpl versions[] = {
    {{0, "cublas_sgemm", MM_F32, 1, 0, 0, "cuBLAS SGEMM, full fp32 (no TF32): the fp32 baseline"}, mm_cublas_sgemm, 0},
    {{1, "v1_naive", MM_F32, 0, 0, 0, "one thread per output, threads along M: uncoalesced"}, mm_v1_naive, 0},
    {{2, "v2_coalesced", MM_F32, 0, 0, 0, "threads along N: B and C accesses coalesce"}, mm_v2_coalesced, 0},
    {{3, "v3_smem_tiled", MM_F32, 0, 0, 0, "32x32 tiles in shared memory, each load reused 32x"}, mm_v3_smem_tiled, 0},
    {{4, "v4_2d_regblock", MM_F32, 0, 0, 0, "128x128 block tile, 8x8 outputs per thread in registers"}, mm_v4_2d_regblock, 0},
    {{5, "v5_vectorized", MM_F32, 0, 0, 0, "float4 global loads, transposed A tile, float4 fragments"}, mm_v5_vectorized, 0},
    {{6, "v6_warptiled", MM_F32, 0, 0, 0, "warp tiling (no bank conflicts), double buffer + register prefetch"}, mm_v6_warptiled, 0},
    {{7, "cublas_hgemm", MM_F16, 1, 0, 0, "cuBLAS GemmEx fp16 in/out, fp32 compute: the fp16 baseline"}, mm_cublas_hgemm, 0},
    {{8, "v7_wmma_f16", MM_F16, 0, 70, 0, "tensor cores through WMMA 16x16x16 fragments"}, mm_v7_wmma_f16, 0},
    {{9, "v8_mma_f16", MM_F16, 0, 80, 0, "mma.sync m16n8k16 + ldmatrix + 4-stage cp.async pipeline"}, mm_v8_mma_f16, 1},
    {{10, "v9_wgmma_f16", MM_F16, 0, 90, 90, "Hopper: TMA + mbarrier pipeline, producer/consumer warpgroups, wgmma"}, mm_v9_wgmma_f16, 1},
    {{11, "cublas_bf16", MM_BF16, 1, 80, 0, "cuBLAS GemmEx bf16 in/out, fp32 compute: the bf16 baseline"}, mm_cublas_bf16, 0},
    {{12, "v8_mma_bf16", MM_BF16, 0, 80, 0, "v8 with bf16 inputs (same kernel template)"}, mm_v8_mma_bf16, 1},
    {{13, "v9_wgmma_bf16", MM_BF16, 0, 90, 90, "v9 with bf16 inputs (same kernel template)"}, mm_v9_wgmma_bf16, 1},
};
static const int nversions = (int)(sizeof versions / sizeof versions[0]);

extern "C" int matmul_gpu_nversions(void) { return nversions; }

extern "C" const MatmulGpuVersion *matmul_gpu_version(int i) {
    return (i >= 0 && i < nversions) ? &versions[i].v : NULL;
}

extern "C" int matmul_gpu_supported(int i, char *why, int why_len) {
    char dummy[8];
    if (!why || why_len <= 0) why = dummy, why_len = sizeof dummy;
    if (i < 0 || i >= nversions) {
        snprintf(why, (size_t)why_len, "no version %d", i);
        return 0;
    }
    GpuInfo g;
    if (gpu_info(&g) != 0) {
        snprintf(why, (size_t)why_len, "%s", g.reason);
        return 0;
    }
    const MatmulGpuVersion *v = &versions[i].v;
    int cc = g.cc_major * 10 + g.cc_minor;
    if (v->exact_cc && cc != v->exact_cc) {
        snprintf(why, (size_t)why_len, "needs compute capability %d.%d exactly (this GPU: %d.%d)",
                 v->exact_cc / 10, v->exact_cc % 10, g.cc_major, g.cc_minor);
        return 0;
    }
    if (cc < v->min_cc) {
        snprintf(why, (size_t)why_len, "needs compute capability >= %d.%d (this GPU: %d.%d)", v->min_cc / 10,
                 v->min_cc % 10, g.cc_major, g.cc_minor);
        return 0;
    }
    if (!v->is_library && v->min_cc >= 70 && v->exact_cc == 0 && mm_tc_compiled_arch() < v->min_cc) {
        snprintf(why, (size_t)why_len, "this build has no sm_%d+ code for this GPU (CUDA_ARCHS)", v->min_cc);
        return 0;
    }
    if (v->exact_cc == 90 && !mm_wgmma_available()) {
        snprintf(why, (size_t)why_len, "this build has no sm_90a code (build with CUDA_ARCHS including 90)");
        return 0;
    }
    return 1;
}

// ------------------------------------------------------------------ matmul_gpu_run
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__global__ void k_from_f32(const float *x, T *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(x[i]);
}
template <typename T>
__global__ void k_to_f32(const T *x, float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = to_f32(x[i]);
}
// dst (rows, dcols) <- src (rows, scols), zero in the extra columns; 2-byte elements.
__global__ void k_pad_cols(const unsigned short *src, int rows, int scols, unsigned short *dst, int dcols) {
    size_t n = (size_t)rows * dcols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / dcols), c = (int)(i % dcols);
        dst[i] = c < scols ? src[(size_t)r * scols + c] : (unsigned short)0;
    }
}
static void pad_cols(const void *src, int rows, int scols, void *dst, int dcols) {
    k_pad_cols<<<1024, 256>>>((const unsigned short *)src, rows, scols, (unsigned short *)dst, dcols);
    CUDA_CHECK_LAST();
}

static size_t dtype_size(MmDtype d) { return d == MM_F32 ? 4 : 2; }

static void convert_in(MmDtype d, const float *x, void *y, size_t n) {
    if (d == MM_F16) k_from_f32<__half><<<1024, 256>>>(x, (__half *)y, n);
    else if (d == MM_BF16) k_from_f32<__nv_bfloat16><<<1024, 256>>>(x, (__nv_bfloat16 *)y, n);
    else k_from_f32<float><<<1024, 256>>>(x, (float *)y, n);
    CUDA_CHECK_LAST();
}
static void convert_out(MmDtype d, const void *x, float *y, size_t n) {
    if (d == MM_F16) k_to_f32<__half><<<1024, 256>>>((const __half *)x, y, n);
    else if (d == MM_BF16) k_to_f32<__nv_bfloat16><<<1024, 256>>>((const __nv_bfloat16 *)x, y, n);
    else k_to_f32<float><<<1024, 256>>>((const float *)x, y, n);
    CUDA_CHECK_LAST();
}

// What one timed call does: for pad8 versions on unaligned shapes, pad A and B, run on the
// padded shape, and copy C out of the padded result (all of it timed).
struct RunCtx {
    const VersionImpl *impl;
    MmArgs args;         // the user's shape and device buffers
    int Kp, Np, padded;  // padded K, N (multiples of 8) when padded
    void *Ap, *Bp, *Cp;  // (M, Kp), (Kp, Np), (M, Np)
};

static void run_once(void *p) {
    RunCtx *c = (RunCtx *)p;
    if (!c->padded) {
        c->impl->fn(&c->args);
        return;
    }
    const MmArgs *a = &c->args;
    pad_cols(a->A, a->M, a->K, c->Ap, c->Kp);
    pad_cols(a->B, a->K, a->N, c->Bp, c->Np);
    if (c->Kp > a->K)  // rows K..Kp-1 of the padded B must be zero
        CUDA_CHECK(cudaMemsetAsync((char *)c->Bp + (size_t)a->K * c->Np * 2, 0, (size_t)(c->Kp - a->K) * c->Np * 2));
    MmArgs pa = {a->M, c->Np, c->Kp, c->Ap, c->Bp, c->Cp};
    c->impl->fn(&pa);
    // C (M, N) <- the first N columns of Cp (M, Np): a strided 2D copy
    CUDA_CHECK(cudaMemcpy2DAsync(a->C, (size_t)a->N * 2, c->Cp, (size_t)c->Np * 2, (size_t)a->N * 2, a->M,
                                 cudaMemcpyDeviceToDevice));
}

extern "C" int matmul_gpu_run(int i, int M, int N, int K, const float *A, const float *B, float *C,
                              double *ms, int reps) {
    char why[256];
    if (!matmul_gpu_supported(i, why, sizeof why)) {
        fprintf(stderr, "matmul_gpu_run: version %d (%s) cannot run here: %s\n", i,
                (i >= 0 && i < nversions) ? versions[i].v.name : "?", why);
        return -1;
    }
    if (M < 1 || N < 1 || K < 1) {
        fprintf(stderr, "matmul_gpu_run: bad shape %dx%dx%d\n", M, N, K);
        return -1;
    }
    const VersionImpl *impl = &versions[i];
    MmDtype dt = impl->v.dtype;
    size_t es = dtype_size(dt);
    size_t nA = (size_t)M * K, nB = (size_t)K * N, nC = (size_t)M * N;
    float *f32 = NULL;  // staging for the fp32 host data (inputs, then the output)
    void *dA, *dB, *dC;
    size_t nmax = nA > nB ? nA : nB;
    if (nC > nmax) nmax = nC;
    CUDA_CHECK(cudaMalloc(&f32, nmax * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dA, nA * es));
    CUDA_CHECK(cudaMalloc(&dB, nB * es));
    CUDA_CHECK(cudaMalloc(&dC, nC * es));
    CUDA_CHECK(cudaMemcpy(f32, A, nA * sizeof(float), cudaMemcpyHostToDevice));
    convert_in(dt, f32, dA, nA);
    CUDA_CHECK(cudaMemcpy(f32, B, nB * sizeof(float), cudaMemcpyHostToDevice));
    convert_in(dt, f32, dB, nB);
    CUDA_CHECK(cudaMemset(dC, 0xFF, nC * es));  // poison: all-ones bits are NaN in every dtype

    if (impl->v.is_library) {
        CUBLAS_CHECK(cublasCreate(&g_cublas));
        // Default math: fp32 SGEMM stays full fp32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH);
        // the check at the odd shape would catch TF32 (~3e-4 error against a 1e-5 bound).
        CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
    }
    RunCtx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.impl = impl;
    ctx.args = MmArgs{M, N, K, dA, dB, dC};
    ctx.padded = impl->pad8 && (K % 8 != 0 || N % 8 != 0);
    if (ctx.padded) {
        ctx.Kp = (K + 7) / 8 * 8;
        ctx.Np = (N + 7) / 8 * 8;
        CUDA_CHECK(cudaMalloc(&ctx.Ap, (size_t)M * ctx.Kp * es));
        CUDA_CHECK(cudaMalloc(&ctx.Bp, (size_t)ctx.Kp * ctx.Np * es));
        CUDA_CHECK(cudaMalloc(&ctx.Cp, (size_t)M * ctx.Np * es));
    }
    run_once(&ctx);
    CUDA_CHECK(cudaDeviceSynchronize());
    convert_out(dt, dC, f32, nC);
    CUDA_CHECK(cudaMemcpy(C, f32, nC * sizeof(float), cudaMemcpyDeviceToHost));
    if (ms) *ms = gpu_bench(run_once, &ctx, 2, reps, 1);

    if (ctx.padded) {
        CUDA_CHECK(cudaFree(ctx.Ap));
        CUDA_CHECK(cudaFree(ctx.Bp));
        CUDA_CHECK(cudaFree(ctx.Cp));
    }
    CUDA_CHECK(cudaFree(f32));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC));
    if (g_cublas) {
        CUBLAS_CHECK(cublasDestroy(g_cublas));
        g_cublas = NULL;
    }
    return 0;
}
