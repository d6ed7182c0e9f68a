// matmul_gpu_tc.cu — step01's tensor-core GEMMs before Hopper: half-precision inputs, fp32
// accumulation, half-precision C (what cuBLAS HGEMM with CUBLAS_COMPUTE_32F does).
//   v7_wmma_f16   WMMA (the C++ fragment API, sm_70+, runs on a Colab T4): each warp owns a
//                 64x32 piece of a 128x128 block tile and issues 16x16x16 fragment products
//                 out of padded shared-memory tiles. One stage: loads and math do not overlap.
//   v8_mma_{f16,bf16}  (sm_80+) the instructions WMMA hides: mma.sync.m16n8k16 fed by ldmatrix
//                 (ldmatrix.trans for the row-major B), shared memory filled by cp.async in a
//                 4-stage pipeline, so three k-tiles are in flight while one is multiplied.
// Run through build/bin/matmul (the table in matmul_gpu.cu lists them).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

#include "cuda_check.h"
#include "matmul_gpu_kernels.cuh"

static inline __host__ __device__ int cdiv(int a, int b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------ which code is in this binary
__global__ void k_tc_probe(int *out) {
#ifdef __CUDA_ARCH__
    *out = __CUDA_ARCH__ / 10;  // the architecture of the code the driver picked for this GPU
#endif
}

int mm_tc_compiled_arch(void) {
    static int arch = -1;
    if (arch < 0) {
        int *d, h = 0;
        CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
        CUDA_CHECK(cudaMemset(d, 0, sizeof(int)));
        k_tc_probe<<<1, 1>>>(d);
        CUDA_CHECK_LAST();
        CUDA_CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(d));
        arch = h;
    }
    return arch;
}

// ------------------------------------------------------------------ v7: WMMA
#define BK7 32
#define LDA7 (BK7 + 8)   // padded rows: 80 bytes, keeps fragment loads off the same banks
#define LDB7 (128 + 8)
__global__ void __launch_bounds__(256) k_v7_wmma(int M, int N, int K, const __half *A, const __half *B, __half *C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    using namespace nvcuda;
    __shared__ __align__(32) __half As[128][LDA7];  // (m, k)
    __shared__ __align__(32) __half Bs[BK7][LDB7];  // (k, n)
    __shared__ __align__(32) float Cs[8][16 * 16];  // one 16x16 staging tile per warp
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
    int bm = blockIdx.y * 128, bn = blockIdx.x * 128;
    bool vecA = K % 8 == 0, vecB = N % 8 == 0;  // rows are 16-byte aligned: 8 halves per load
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const __half zero = __float2half(0.0f);
    for (int k0 = 0; k0 < K; k0 += BK7) {
#pragma unroll
        for (int i = 0; i < 2; i++) {  // A tile: 128 rows x 4 chunks of 8
            int idx = tid + i * 256, r = idx / 4, c = (idx % 4) * 8;
            int gr = bm + r, gk = k0 + c;
            if (vecA && gr < M && gk + 7 < K) {
                *reinterpret_cast<uint4 *>(&As[r][c]) = *reinterpret_cast<const uint4 *>(A + (size_t)gr * K + gk);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) As[r][c + j] = (gr < M && gk + j < K) ? A[(size_t)gr * K + gk + j] : zero;
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {  // B tile: 32 rows x 16 chunks of 8
            int idx = tid + i * 256, r = idx / 16, c = (idx % 16) * 8;
            int gk = k0 + r, gc = bn + c;
            if (vecB && gk < K && gc + 7 < N) {
                *reinterpret_cast<uint4 *>(&Bs[r][c]) = *reinterpret_cast<const uint4 *>(B + (size_t)gk * N + gc);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) Bs[r][c + j] = (gk < K && gc + j < N) ? B[(size_t)gk * N + gc + j] : zero;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK7; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bf[2];
#pragma unroll
            for (int i = 0; i < 4; i++) wmma::load_matrix_sync(af[i], &As[wm + i * 16][kk], LDA7);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(bf[j], &Bs[kk][wn + j * 16], LDB7);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
        }
        __syncthreads();
    }
    // The fragment's element order is opaque: store it to shared memory, then write out with checks.
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(Cs[warp], acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int r = bm + wm + i * 16 + e / 16, c = bn + wn + j * 16 + e % 16;
                if (r < M && c < N) C[(size_t)r * N + c] = __float2half_rn(Cs[warp][e]);
            }
            __syncwarp();
        }
#endif
}

void mm_v7_wmma_f16(const MmArgs *a) {
    dim3 grid(cdiv(a->N, 128), cdiv(a->M, 128));
    k_v7_wmma<<<grid, 256>>>(a->M, a->N, a->K, (const __half *)a->A, (const __half *)a->B, (__half *)a->C);
    CUDA_CHECK_LAST();
}

// ------------------------------------------------------------------ v8: mma.sync + ldmatrix + cp.async
// Block tile 128x128, k-tile 32, 4 stages; 8 warps as 2 (M) x 4 (N), warp tile 64x32 =
// 4 x 4 mma tiles of 16x8. Needs K % 8 == 0 and N % 8 == 0 (each 16-byte cp.async chunk is then
// entirely inside or outside the matrix; outside chunks are zero-filled by cp.async itself).
#define BK8 32
#define ST8 4
#define LDA8 (BK8 + 8)   // 80-byte rows: the 8 row addresses of an ldmatrix hit 8 different bank groups
#define LDB8 (128 + 8)   // 272-byte rows: same
#define SMEM8 (ST8 * (128 * LDA8 + BK8 * LDB8) * 2)


__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    int bytes = valid ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack2(float x, float y, __half *) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t pack2(float x, float y, __nv_bfloat16 *) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <typename T>
__global__ void __launch_bounds__(256, 2) k_v8_mma(int M, int N, int K, const T *A, const T *B, T *C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char smem8[];
    T *As = reinterpret_cast<T *>(smem8);                // (stage, 128, LDA8)
    T *Bs = As + ST8 * 128 * LDA8;                       // (stage, BK8, LDB8)
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
    int bm = blockIdx.y * 128, bn = blockIdx.x * 128;
    uint32_t sA = (uint32_t)__cvta_generic_to_shared(As), sB = (uint32_t)__cvta_generic_to_shared(Bs);

    auto load_stage = [&](int s, int kt) {
        int k0 = kt * BK8;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int idx = tid + i * 256, r = idx / 4, c = (idx % 4) * 8;  // A: 128 rows x 4 chunks
            int gr = bm + r, gk = k0 + c;
            bool ok = gr < M && gk < K;
            cp_async16(sA + (uint32_t)((s * 128 * LDA8 + r * LDA8 + c) * 2), ok ? A + (size_t)gr * K + gk : A, ok);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int idx = tid + i * 256, r = idx / 16, c = (idx % 16) * 8;  // B: 32 rows x 16 chunks
            int gk = k0 + r, gc = bn + c;
            bool ok = gk < K && gc < N;
            cp_async16(sB + (uint32_t)((s * BK8 * LDB8 + r * LDB8 + c) * 2), ok ? B + (size_t)gk * N + gc : B, ok);
        }
    };

    float acc[4][4][4] = {};  // (m tile, n tile, fragment)
    int nk = cdiv(K, BK8);
#pragma unroll
    for (int s = 0; s < ST8 - 1; s++) {
        if (s < nk) load_stage(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < nk; kt++) {
        // k-tile kt has landed once at most ST8-2 newer groups are still pending
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST8 - 2));
        __syncthreads();
        int nt = kt + ST8 - 1;  // refill the stage computed in iteration kt-1 (all warps are past it)
        if (nt < nk) load_stage(nt % ST8, nt);
        asm volatile("cp.async.commit_group;\n" ::);
        int s = kt % ST8;
#pragma unroll
        for (int kk = 0; kk < BK8; kk += 16) {
            uint32_t af[4][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                int r = wm + mi * 16 + (lane % 16), c = kk + (lane / 16) * 8;
                ldsm_x4(sA + (uint32_t)((s * 128 * LDA8 + r * LDA8 + c) * 2), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                int r = kk + (lane % 8) + ((lane / 8) % 2) * 8, c = wn + nj * 16 + (lane / 16) * 8;
                ldsm_x4_t(sB + (uint32_t)((s * BK8 * LDB8 + r * LDB8 + c) * 2), bfr[2 * nj][0], bfr[2 * nj][1],
                          bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma16816<T>(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    // fragment (mi, ni): rows lane/4 and lane/4 + 8, columns (lane%4)*2 and +1
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            int r = bm + wm + mi * 16 + lane / 4, c = bn + wn + ni * 8 + (lane % 4) * 2;
            if (c < N) {  // N is even here, so c + 1 < N too
                if (r < M) *reinterpret_cast<uint32_t *>(C + (size_t)r * N + c) = pack2(acc[mi][ni][0], acc[mi][ni][1], (T *)0);
                if (r + 8 < M) *reinterpret_cast<uint32_t *>(C + (size_t)(r + 8) * N + c) = pack2(acc[mi][ni][2], acc[mi][ni][3], (T *)0);
            }
        }
#endif
}

template <typename T>
static void launch_v8(const MmArgs *a) {
    static bool attr = false;
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(k_v8_mma<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM8));
        attr = true;
    }
    dim3 grid(cdiv(a->N, 128), cdiv(a->M, 128));
    k_v8_mma<T><<<grid, 256, SMEM8>>>(a->M, a->N, a->K, (const T *)a->A, (const T *)a->B, (T *)a->C);
    CUDA_CHECK_LAST();
}
void mm_v8_mma_f16(const MmArgs *a) { launch_v8<__half>(a); }
void mm_v8_mma_bf16(const MmArgs *a) { launch_v8<__nv_bfloat16>(a); }
