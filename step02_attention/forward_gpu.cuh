// forward_gpu.cuh — what step02's CUDA forward shares with later steps' CUDA code (CUDA C++ only):
// the element conversions, DISPATCH over the weight dtype, the per-op kernels that do not depend
// on T being the whole sequence (embedding, RMSNorm, SwiGLU), and the GpuModel layout, so that
// step03's decode step runs on the same weights (q/k/v and gate/up concatenated) without a copy.
// defines: tof, fromf, DISPATCH, cuda_type, dt_name, esize, block_sum, block_max, k_embed,
//          k_rmsnorm, k_swiglu, GpuQProj, GpuLayer, GpuModel; declares (forward_gpu.cu): k_add_bias,
//          grid_for, gemm_xwt, proj_gemm, attention_gpu
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "forward.h"
#include "pdl.cuh"  // pdl_trigger, pdl_wait (no-ops unless a kernel is launched with PDL)
#include "step06_quant/qlinear_gpu.h"  // QLinearGpu: step06's quantized projections (optional)

// ---------------------------------------------------------------- element conversions
__host__ __device__ inline float tof(float x) { return x; }
__host__ __device__ inline float tof(__half x) { return __half2float(x); }
__host__ __device__ inline float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __host__ __device__ inline T fromf(float x);
template <> __host__ __device__ inline float fromf<float>(float x) { return x; }
template <> __host__ __device__ inline __half fromf<__half>(float x) { return __float2half_rn(x); }
template <> __host__ __device__ inline __nv_bfloat16 fromf<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Runs the statement with `A` typedef'd to the element type of dtype dt (a float dtype: the
// integer ones, I32 / I8 / U8, hold quantized checkpoints' packed words and never get here).
#define DISPATCH(dt, A, ...)                                  \
    switch (dt) {                                             \
    case ST_F32: { typedef float A; __VA_ARGS__; } break;     \
    case ST_F16: { typedef __half A; __VA_ARGS__; } break;    \
    case ST_BF16: { typedef __nv_bfloat16 A; __VA_ARGS__; } break; \
    default: break;                                           \
    }

static inline cudaDataType_t cuda_type(StDtype d) {
    return d == ST_F32 ? CUDA_R_32F : d == ST_F16 ? CUDA_R_16F : CUDA_R_16BF;
}
static inline const char *dt_name(StDtype d) { return d == ST_F32 ? "fp32" : d == ST_F16 ? "fp16" : "bf16"; }

// ---------------------------------------------------------------- kernels shared with later steps

// Sum over the block; every thread gets the result. blockDim.x a multiple of 32, <= 1024.
static __device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // part[] may still be read by a previous call
    if (lane == 0) part[w] = v;
    __syncthreads();
    float s = 0;
    for (int i = 0; i < (int)(blockDim.x / 32); i++) s += part[i];
    return s;
}
static __device__ float block_max(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x / 32); i++) m = fmaxf(m, part[i]);
    return m;
}

// x (T, d) fp32 = table[ids[t]]; table (vocab, d) in the weight dtype. Grid (T).
template <class W> __global__ void k_embed(const W *table, const int *ids, int d, float *x) {
    const size_t t = blockIdx.x;
    const W *row = table + (size_t)ids[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[t * d + i] = tof(row[i]);
}

// RMSNorm over rows of length n. Row r starts at (r / per) * ld + (r % per) * n, in x and y:
// per = 1, ld = n for the hidden norm (T, d); per = heads, ld = row width for the per-head
// q/k norm (Qwen3) inside the (T, (H+2KV)*hd) qkv buffer. y may alias x. Grid (rows).
// Launched with PDL (step04's graph steps) it waits for the kernel before it first thing.
// A row of at most 16 floats a thread (n % 4 == 0, x's row and w 16-byte aligned) is read once into
// registers, x and w together as float4, so every load of the row is in flight at once: a decode
// step's rows (16 of 4096) are few, one block each, and the loop below pays a memory round trip
// per pass and per unrolled batch (Llama-3.1-8B at 16 rows on an H100: 10.8 -> 3.7 us a launch;
// step06 README "The small kernels of a 16-row step"). Launch bounds of 1024 threads: the batch-1
// paths launch it with 1024, and 8 float4 of x and of w a thread did not fit their registers.
#define RMS_VEC 4  // float4 a thread held in registers
template <class O>
__global__ void __launch_bounds__(1024) k_rmsnorm(const float *x, const float *w, int n, int per, size_t ld, float eps, O *y) {
    pdl_trigger();
    pdl_wait();
    const size_t off = (size_t)(blockIdx.x / per) * ld + (size_t)(blockIdx.x % per) * n;
    const int nv = n / 4;
    if ((n & 3) == 0 && nv <= RMS_VEC * (int)blockDim.x && !(((uintptr_t)(x + off) | (uintptr_t)w) & 15)) {
        const float4 *x4 = (const float4 *)(x + off), *w4 = (const float4 *)w;
        float4 v[RMS_VEC], g[RMS_VEC];
        float ss = 0;
#pragma unroll
        for (int u = 0; u < RMS_VEC; u++) {
            const int i = threadIdx.x + u * blockDim.x;
            v[u] = g[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < nv) v[u] = x4[i], g[u] = __ldg(w4 + i);
        }
#pragma unroll
        for (int u = 0; u < RMS_VEC; u++) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        const float inv = rsqrtf(block_sum(ss) / n + eps);
#pragma unroll
        for (int u = 0; u < RMS_VEC; u++) {
            const int i = threadIdx.x + u * blockDim.x;
            if (i >= nv) continue;
            O *yo = y + off + 4 * (size_t)i;
            yo[0] = fromf<O>(v[u].x * inv * g[u].x), yo[1] = fromf<O>(v[u].y * inv * g[u].y);
            yo[2] = fromf<O>(v[u].z * inv * g[u].z), yo[3] = fromf<O>(v[u].w * inv * g[u].w);
        }
        return;
    }
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[off + i] * x[off + i];
    const float inv = rsqrtf(block_sum(ss) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[off + i] = fromf<O>(x[off + i] * inv * w[i]);
}

// h (T, ff) = silu(gate) * up, gate and up side by side in gu (T, 2*ff).
template <class O> __global__ void k_swiglu(const float *gu, O *h, int T, int ff) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * ff; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / ff, j = i % ff;
        const float g = gu[t * 2 * ff + j], u = gu[t * 2 * ff + ff + j];
        h[i] = fromf<O>(g / (1.0f + expf(-g)) * u);
    }
}

// ---------------------------------------------------------------- the model on the device

// A quantized projection on the device (step06): n parts whose outputs lie side by side, part i
// giving rows[i] outputs. n = 1 for a single or a stacked q|k|v / gate|up weight; 2 or 3 when the
// parts' groups, symmetry or g_idx differ and they cannot be stacked (run one after the other into
// the same output row). n = 0: the projection is dense (the void * weight of GpuLayer).
struct GpuQProj {
    QLinearGpu *part[3];
    int rows[3];
    int n;
};

struct GpuLayer {
    float *attn_norm, *mlp_norm;  // (d)
    float *q_norm, *k_norm;       // (hd) or NULL
    float *bqkv;                  // (H*hd + 2*KV*hd) or NULL
    float *bo;                    // (d) or NULL
    void *wqkv;                   // (H*hd + 2*KV*hd, d): q, k, v rows stacked
    void *wo;                     // (d, H*hd)
    void *wgu;                    // (2*ff, d): gate rows then up rows
    void *wdown;                  // (d, ff)
    GpuQProj qqkv, qo, qgu, qdown;  // quantized (n > 0): then the dense pointer above is NULL
};

struct GpuModel {
    ModelConfig cfg;
    StDtype wdt;  // dtype of the GEMM weights and of every GEMM input on the device
    char desc[480];
    int quantized;  // the layers' projections are GpuQProj (step06)
    double weight_bytes;
    void *embed, *lm_head;  // (vocab, d); lm_head == embed when tied; NULL when qlm replaces it
    GpuQProj qlm;           // step06: the lm_head quantized (n > 0; gpu_model_quantize_lm_head), else n = 0
    float *final_norm;
    GpuLayer *layers;
    cublasHandle_t blas;
    cudaEvent_t ev0, ev1, *ea, *eb;  // whole forward; attention of each layer
    // workspace for ws_T tokens (reallocated when T changes)
    int ws_T;
    double ws_bytes;
    int *ids;        // (T)
    float *x;        // (T, d) residual stream
    void *xn;        // (T, d) normed, GEMM dtype
    float *qkv;      // (T, H*hd + 2*KV*hd) fp32 GEMM output
    void *qkv16;     // same, GEMM dtype (== qkv for fp32)
    float *S;        // (H, T, T) scores, fp32
    void *P;         // (H, T, T) probabilities, GEMM dtype (== S for fp32)
    void *att;       // (T, H*hd) attention output, GEMM dtype
    float *gu;       // (T, 2*ff)
    void *h;         // (T, ff) swiglu output, GEMM dtype
    float *logits;   // (T, vocab)
    float *cos_t, *sin_t;  // (T, hd/2)
};

static inline size_t esize(StDtype d) { return d == ST_F32 ? 4 : 2; }


// ---------------------------------------------------------------- defined in forward_gpu.cu
// y (T, n) with row stride ld: y[t, j] += b[j]
__global__ void k_add_bias(float *y, const float *b, int T, int n, size_t ld);
// blocks for a grid-stride loop over n elements
int grid_for(size_t n, int block);
// Y (T, n_out) fp32 [ld ldy] = X (T, n_in) [ld ldx] W^T + beta * Y; W (n_out, n_in) row-major;
// X and W in dtype dt, fp32 accumulation (cuBLAS GemmEx on the handle's stream).
void gemm_xwt(cublasHandle_t h, StDtype dt, int T, int n_out, int n_in, const void *X, int ldx, const void *W,
              float *Y, int ldy, float beta);
// The same for one of a layer's projections: W dense (n_out, n_in) in dt when q->n == 0, else
// step06's qlinear_gpu_gemm over q's parts (X in dt, bf16 or fp16) on stream s (cuBLAS: on the
// handle's stream, which the caller sets to s when s is not the default stream).
void proj_gemm(cublasHandle_t h, StDtype dt, const GpuQProj *q, int T, int n_out, int n_in, const void *X, int ldx,
               const void *W, float *Y, int ldy, float beta, cudaStream_t s);
// Causal GQA attention of nq queries that are the last nq of nk positions (QK^T GEMM, causal
// softmax, PV GEMM): q (nq, H*hd) [ld ldq], k, v (nk, KV*hd) [ld ldk, ldv] in dtype dt;
// S (H, nq, nk) fp32 scratch, P (H, nq, nk) dtype dt scratch (may be S for fp32); out (nq, H*hd).
void attention_gpu(cublasHandle_t hb, StDtype dt, int nq, int nk, int H, int KV, int hd, const void *q, int ldq,
                   const void *k, int ldk, const void *v, int ldv, float *S, void *P, void *out);
