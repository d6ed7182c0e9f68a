// qlinear_gpu.cu — step06's quantized linear layer on CUDA (contract: qlinear_gpu.h).
// First version: the QWeight is uploaded as it is (quant.h's layout, g_idx too) and both
// products dequantize each weight with the one formula (q - z) * s in a plain kernel:
//   k_gemv_naive  one warp per output row, lanes stride over the columns, a shuffle reduction;
//   k_gemm_naive  one thread per output element (t, r).
// Correct on every arch and every QWeight; not fast (the fast kernels replace them).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "step06_quant/qlinear_gpu.h"

struct QLinearGpu {
    QuantKind kind;
    int rows, cols, group, n_groups, sym;
    uint8_t *q;      // device: quant.h's layout
    float *scales;   // (rows, n_groups)
    uint8_t *zeros;  // (rows, n_groups) or NULL
    int *g_idx;      // (cols) or NULL
    size_t bytes;
    char desc[96];
};

template <class T> static cudaError_t upload(T **dst, const T *src, size_t n) {
    *dst = NULL;
    if (!src || n == 0) return cudaSuccess;
    cudaError_t e = cudaMalloc((void **)dst, n * sizeof(T));
    if (e != cudaSuccess) return e;
    return cudaMemcpy(*dst, src, n * sizeof(T), cudaMemcpyHostToDevice);
}

extern "C" QLinearGpu *qlinear_gpu_new(const QWeight *w, char *err, int errlen) {
    if (!w || (w->kind != QK_INT8 && w->kind != QK_INT4) || w->rows < 1 || w->cols < 1 || w->n_groups < 1 || !w->q ||
        !w->scales || (!w->sym && !w->zeros)) {
        snprintf(err, errlen, "qlinear_gpu_new: not a valid QWeight");
        return NULL;
    }
    QLinearGpu *q = (QLinearGpu *)calloc(1, sizeof *q);
    if (!q) {
        snprintf(err, errlen, "qlinear_gpu_new: out of host memory");
        return NULL;
    }
    q->kind = w->kind, q->rows = w->rows, q->cols = w->cols, q->group = w->group, q->n_groups = w->n_groups;
    q->sym = w->sym;
    const size_t qb = w->kind == QK_INT8 ? (size_t)w->rows * w->cols : (size_t)w->rows * (w->cols / 2);
    const size_t ng = (size_t)w->rows * w->n_groups;
    cudaError_t e = upload(&q->q, w->q, qb);
    if (e == cudaSuccess) e = upload(&q->scales, w->scales, ng);
    if (e == cudaSuccess && !w->sym) e = upload(&q->zeros, w->zeros, ng);
    if (e == cudaSuccess && w->g_idx) e = upload(&q->g_idx, w->g_idx, (size_t)w->cols);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "qlinear_gpu_new: %s (%d x %d)", cudaGetErrorString(e), w->rows, w->cols);
        cudaGetLastError();
        qlinear_gpu_free(q);
        return NULL;
    }
    q->bytes = qb + ng * sizeof(float) + (w->sym ? 0 : ng) + (w->g_idx ? (size_t)w->cols * sizeof(int) : 0);
    snprintf(q->desc, sizeof q->desc, "%s g%d %s%s, naive kernels", quant_kind_name(w->kind),
             w->group == w->cols ? -1 : w->group, w->sym ? "sym" : "asym", w->g_idx ? " act-order" : "");
    return q;
}

extern "C" void qlinear_gpu_free(QLinearGpu *q) {
    if (!q) return;
    cudaFree(q->q), cudaFree(q->scales), cudaFree(q->zeros), cudaFree(q->g_idx);
    free(q);
}
extern "C" size_t qlinear_gpu_bytes(const QLinearGpu *q) { return q ? q->bytes : 0; }
extern "C" int qlinear_gpu_rows(const QLinearGpu *q) { return q ? q->rows : 0; }
extern "C" int qlinear_gpu_cols(const QLinearGpu *q) { return q ? q->cols : 0; }
extern "C" const char *qlinear_gpu_describe(const QLinearGpu *q) { return q ? q->desc : "(null)"; }

// The weight (r, c) dequantized, as quant.c's dequant_row.
struct QView {
    int kind, rows, cols, group, n_groups, sym;
    const uint8_t *q;
    const float *scales;
    const uint8_t *zeros;
    const int *g_idx;
};
__device__ __forceinline__ float dq(const QView &v, int r, int c) {
    const int g = v.g_idx ? v.g_idx[c] : c / v.group;
    int qi;
    if (v.kind == QK_INT8) qi = v.q[(size_t)r * v.cols + c];
    else {
        const uint8_t b = v.q[(size_t)r * (v.cols / 2) + c / 2];
        qi = c % 2 == 0 ? (b & 0x0F) : (b >> 4);
    }
    const size_t sg = (size_t)r * v.n_groups + g;
    const float z = v.sym ? (float)(1 << (v.kind - 1)) : (float)v.zeros[sg];
    return ((float)qi - z) * v.scales[sg];
}

__global__ void k_gemv_naive(QView v, const float *__restrict__ x, const float *__restrict__ b, float *y, int acc) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= v.rows) return;
    float s = 0.0f;
    for (int c = lane; c < v.cols; c += 32) s = fmaf(dq(v, row, c), x[c], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[row] = s + (b ? b[row] : 0.0f) + (acc ? y[row] : 0.0f);
}

__device__ __forceinline__ float tof(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float tof(__half v) { return __half2float(v); }

template <class X>
__global__ void k_gemm_naive(QView v, int T, const X *__restrict__ Xm, int ldx, float *Y, int ldy, float beta) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= v.rows || t >= T) return;
    const X *x = Xm + (size_t)t * ldx;
    float s = 0.0f;
    for (int c = 0; c < v.cols; c++) s = fmaf(dq(v, r, c), tof(x[c]), s);
    float *yo = Y + (size_t)t * ldy + r;
    *yo = beta == 0.0f ? s : s + beta * *yo;
}

static QView view(const QLinearGpu *q) {
    QView v = {(int)q->kind, q->rows, q->cols, q->group, q->n_groups, q->sym, q->q, q->scales, q->zeros, q->g_idx};
    return v;
}

static int launch_ok(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s: launch failed: %s\n", what, cudaGetErrorString(e));
    return -1;
}

extern "C" int qlinear_gpu_gemv(const QLinearGpu *q, const float *x, const float *bias, float *y, int acc,
                                void *stream) {
    if (!q || !x || !y) return -1;
    const int warps = 8;
    k_gemv_naive<<<(q->rows + warps - 1) / warps, warps * 32, 0, (cudaStream_t)stream>>>(view(q), x, bias, y, acc);
    return launch_ok("qlinear_gpu_gemv");
}

extern "C" int qlinear_gpu_gemm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy,
                                float beta, void *stream) {
    if (!q || !X || !Y || T < 0 || ldx < q->cols || ldy < q->rows) return -1;
    if (xdt != ST_BF16 && xdt != ST_F16) {
        fprintf(stderr, "qlinear_gpu_gemm: X must be bf16 or fp16\n");
        return -1;
    }
    if (T == 0) return 0;
    const dim3 grid((q->rows + 127) / 128, T);
    if (xdt == ST_BF16)
        k_gemm_naive<<<grid, 128, 0, (cudaStream_t)stream>>>(view(q), T, (const __nv_bfloat16 *)X, ldx, Y, ldy, beta);
    else
        k_gemm_naive<<<grid, 128, 0, (cudaStream_t)stream>>>(view(q), T, (const __half *)X, ldx, Y, ldy, beta);
    return launch_ok("qlinear_gpu_gemm");
}
