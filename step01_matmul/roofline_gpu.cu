// roofline_gpu.cu — measuring the GPU's two ceilings: bytes per second and FLOPs per second.
// See roofline_gpu.h. Bandwidth kernels move 16 bytes per thread per access, grid-stride, so
// every access is coalesced and wide; the FMA kernel keeps 8 independent chains per thread
// so the pipelines never wait on a previous FMA's result.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_check.h"
#include "gpu.h"
#include "roofline_gpu.h"

static int g_blocks(void) {
    int dev, sms;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms * 8;
}

__global__ void copy_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// Reads everything; writes one word only if an impossible value shows up (keeps the loads live).
__global__ void read_kernel(const int4 *__restrict__ src, size_t n, int *flag) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fffabcd) *flag = acc;
}

__global__ void write_kernel(int4 *__restrict__ dst, size_t n, int v) {
    int4 x = make_int4(v, v + 1, v + 2, v + 3);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = x;
}

__global__ void fill_random_u32(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
        p[i] = x;
    }
}

typedef struct {
    int kind;  // 0 copy, 1 read, 2 write
    int4 *a, *b;
    size_t n;
    int *flag;
    int blocks;
} BwCtx;

static void bw_run(void *p) {
    BwCtx *c = (BwCtx *)p;
    if (c->kind == 0) copy_kernel<<<c->blocks, 256>>>(c->a, c->b, c->n);
    else if (c->kind == 1) read_kernel<<<c->blocks, 256>>>(c->a, c->n, c->flag);
    else write_kernel<<<c->blocks, 256>>>(c->b, c->n, 7);
    CUDA_CHECK_LAST();
}

extern "C" int roofline_gpu_bandwidth(size_t bytes, int reps, double *copy, double *rd, double *wr) {
    GpuInfo g;
    if (gpu_info(&g)) return -1;
    BwCtx c;
    c.n = bytes / sizeof(int4);
    c.blocks = g_blocks();
    CUDA_CHECK(cudaMalloc(&c.a, c.n * sizeof(int4)));
    CUDA_CHECK(cudaMalloc(&c.b, c.n * sizeof(int4)));
    CUDA_CHECK(cudaMalloc(&c.flag, sizeof(int)));
    fill_random_u32<<<c.blocks, 256>>>((uint32_t *)c.a, c.n * 4, 1234u);
    CUDA_CHECK_LAST();
    // Validate before timing: one copy, then compare a sample of words on the host.
    c.kind = 0;
    bw_run(&c);
    CUDA_CHECK(cudaDeviceSynchronize());
    {
        const size_t S = 4096;
        static int4 ha[4096], hb[4096];
        size_t off = c.n > S ? c.n - S : 0, cnt = c.n > S ? S : c.n;
        CUDA_CHECK(cudaMemcpy(ha, c.a + off, cnt * sizeof(int4), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hb, c.b + off, cnt * sizeof(int4), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < cnt; i++)
            if (ha[i].x != hb[i].x || ha[i].w != hb[i].w) {
                fprintf(stderr, "error: copy kernel produced wrong data at %zu\n", off + i);
                return -1;
            }
    }
    double ms;
    c.kind = 0;
    ms = gpu_bench(bw_run, &c, 3, reps, 1);
    *copy = 2.0 * (double)(c.n * sizeof(int4)) / (ms * 1e-3) / 1e9;
    c.kind = 1;
    ms = gpu_bench(bw_run, &c, 3, reps, 1);
    *rd = (double)(c.n * sizeof(int4)) / (ms * 1e-3) / 1e9;
    c.kind = 2;
    ms = gpu_bench(bw_run, &c, 3, reps, 1);
    *wr = (double)(c.n * sizeof(int4)) / (ms * 1e-3) / 1e9;
    CUDA_CHECK(cudaFree(c.a));
    CUDA_CHECK(cudaFree(c.b));
    CUDA_CHECK(cudaFree(c.flag));
    return 0;
}

#define FMA_ITERS 4096
#define FMA_CHAINS 8
__global__ void fma_kernel(float *out, float m, float a) {
    float x[FMA_CHAINS];
#pragma unroll
    for (int j = 0; j < FMA_CHAINS; j++) x[j] = (float)(threadIdx.x + j) * 1e-3f;
    for (int i = 0; i < FMA_ITERS; i++) {
#pragma unroll
        for (int j = 0; j < FMA_CHAINS; j++) x[j] = fmaf(x[j], m, a);
    }
    float s = 0;
#pragma unroll
    for (int j = 0; j < FMA_CHAINS; j++) s += x[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

typedef struct {
    float *out;
    int blocks;
} FmaCtx;

static void fma_run(void *p) {
    FmaCtx *c = (FmaCtx *)p;
    fma_kernel<<<c->blocks, 256>>>(c->out, 0.999f, 1e-4f);
    CUDA_CHECK_LAST();
}

extern "C" double roofline_gpu_fma_tflops(int reps) {
    GpuInfo g;
    if (gpu_info(&g)) return -1;
    FmaCtx c;
    c.blocks = g.sms * 16;
    CUDA_CHECK(cudaMalloc(&c.out, (size_t)c.blocks * 256 * sizeof(float)));
    double ms = gpu_bench(fma_run, &c, 3, reps, 1);
    CUDA_CHECK(cudaFree(c.out));
    double flops = 2.0 * FMA_CHAINS * FMA_ITERS * (double)c.blocks * 256;
    return flops / (ms * 1e-3) / 1e12;
}

__global__ void fill_f32(float *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15;
        p[i] = (float)(x & 0xffff) / 65536.0f - 0.5f;
    }
}
__global__ void f32_to_f16(const float *s, __half *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2half(s[i]);
}
__global__ void f32_to_bf16(const float *s, __nv_bfloat16 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16(s[i]);
}

#define MAX_SETS 16
typedef struct {
    cublasHandle_t h;
    int dtype, M, N, K;
    void *A, *C;
    void *B[MAX_SETS];  // copies of B rotated call by call, so repeated runs are not served by L2
    int nsets, next;
} GemmCtx;

// Row-major C = A B is column-major C^T = B^T A^T: pass B first, with the dims swapped.
static void gemm_run(void *p) {
    GemmCtx *c = (GemmCtx *)p;
    const float one = 1.0f, zero = 0.0f;
    const void *B = c->B[c->next];
    c->next = (c->next + 1) % c->nsets;
    if (c->dtype == 0) {
        CUBLAS_CHECK(cublasSgemm(c->h, CUBLAS_OP_N, CUBLAS_OP_N, c->N, c->M, c->K, &one, (const float *)B, c->N,
                                 (const float *)c->A, c->K, &zero, (float *)c->C, c->N));
    } else {
        cudaDataType t = c->dtype == 1 ? CUDA_R_16F : CUDA_R_16BF;
        CUBLAS_CHECK(cublasGemmEx(c->h, CUBLAS_OP_N, CUBLAS_OP_N, c->N, c->M, c->K, &one, B, t, c->N, c->A, t, c->K,
                                  &zero, c->C, t, c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

extern "C" double roofline_gpu_gemm_ms(int dtype, int M, int N, int K, int reps) {
    GpuInfo g;
    if (gpu_info(&g)) return -1;
    if (dtype == 2 && g.cc_major < 8) return -1;  // no bf16 tensor cores before sm_80
    GemmCtx c;
    c.dtype = dtype, c.M = M, c.N = N, c.K = K;
    CUBLAS_CHECK(cublasCreate(&c.h));
    // Plain fp32 SIMT: forbid TF32 tensor-core shortcuts in SGEMM.
    CUBLAS_CHECK(cublasSetMathMode(c.h, CUBLAS_PEDANTIC_MATH));
    size_t es = dtype == 0 ? 4 : 2, na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *tmp;
    CUDA_CHECK(cudaMalloc(&tmp, (na > nb ? na : nb) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&c.A, na * es));
    CUDA_CHECK(cudaMalloc(&c.C, nc * es));
    // Enough copies of B (the "weights") that the set is >= 4x the L2 cache.
    c.nsets = (int)((4.0 * g.l2_bytes) / (double)(nb * es)) + 1;
    if (c.nsets > MAX_SETS) c.nsets = MAX_SETS;
    c.next = 0;
    for (int s = 0; s < c.nsets; s++) CUDA_CHECK(cudaMalloc(&c.B[s], nb * es));
    // Random data, never zeros (zeros run faster than real data on tensor cores).
    for (int w = 0; w <= c.nsets; w++) {
        size_t n = w ? nb : na;
        void *dst = w ? c.B[w - 1] : c.A;
        fill_f32<<<1024, 256>>>(tmp, n, 77u + (uint32_t)w);
        CUDA_CHECK_LAST();
        if (dtype == 0) CUDA_CHECK(cudaMemcpy(dst, tmp, n * 4, cudaMemcpyDeviceToDevice));
        else if (dtype == 1) f32_to_f16<<<1024, 256>>>(tmp, (__half *)dst, n);
        else f32_to_bf16<<<1024, 256>>>(tmp, (__nv_bfloat16 *)dst, n);
        CUDA_CHECK_LAST();
    }
    double ms = gpu_bench(gemm_run, &c, 5, reps, 1);
    CUDA_CHECK(cudaFree(tmp));
    CUDA_CHECK(cudaFree(c.A));
    for (int s = 0; s < c.nsets; s++) CUDA_CHECK(cudaFree(c.B[s]));
    CUDA_CHECK(cudaFree(c.C));
    CUBLAS_CHECK(cublasDestroy(c.h));
    return ms;
}
