// qlinear_gpu.h — step06's quantized linear layer on the GPU: a QWeight (quant.h) repacked at
// load into the kernels' own layout, and the two products the engine needs from it:
//   qlinear_gpu_gemv   batch 1 (a lone decode row): y = W x, weights dequantized in registers as
//                      they stream in (INT8 and INT4); fp32 x and y, as step03's GEMV.
//   qlinear_gpu_gemm   batch T (2..64 rows, more work too): Y = X W^T with bf16/fp16 X and INT4
//                      weights on the tensor cores (sm_80+), INT8 and pre-sm_80 by a dequantizing
//                      fallback that still runs on sm_75; fp32 Y, as step02's gemm_xwt.
// Implemented in qlinear_gpu.cu (qlinear_gpu_none.c when built without nvcc: every call fails).
// All pointers are device pointers; launches go on `stream` (NULL: the default stream).
// defines: QLinearGpu, qlinear_gpu_new, qlinear_gpu_free, qlinear_gpu_bytes, qlinear_gpu_rows,
//          qlinear_gpu_cols, qlinear_gpu_gemv, qlinear_gpu_gemv_fused, qlinear_gpu_gemv_chain, qlinear_gpu_gemv_chain_ok,
//          QChainPhase,
//          qlinear_gpu_gemm, qlinear_gpu_gemm_swiglu, qlinear_gpu_gemm_norm, qlinear_gpu_gemm_swiglu_norm,
//          qlinear_gpu_norm_finish, QGemmNorm, qlinear_gpu_describe,
//          qlinear_gpu_set_gemm_path, QLINEAR_GEMM_AUTO, QLINEAR_GEMM_SIMT
#pragma once
#include <stddef.h>

#include "safetensors.h"  // StDtype
#include "step06_quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct QLinearGpu QLinearGpu;

// Repack w (host, quant.h layout; g_idx allowed: the columns are permuted so that groups are
// contiguous and x is permuted the same way at run time) and upload it. NULL + err on failure
// (unsupported group / shape, out of device memory). The Hopper kernels (sm_90a: the GEMV and the
// GEMM of up to 16 rows) hold the scales in fp16, as checkpoints store them: exact for every model
// the engine runs (qweight_scales_fp16), rounded to the nearest fp16 value for any other QWeight;
// the other kernels read them in fp32.
QLinearGpu *qlinear_gpu_new(const QWeight *w, char *err, int errlen);
void qlinear_gpu_free(QLinearGpu *q);
// The bytes one batch-1 product reads: packed weights, scales (fp16 where the Hopper GEMV runs the
// layer, else fp32), zeros and the column permutation.
size_t qlinear_gpu_bytes(const QLinearGpu *q);
int qlinear_gpu_rows(const QLinearGpu *q);      // out_features
int qlinear_gpu_cols(const QLinearGpu *q);      // in_features
const char *qlinear_gpu_describe(const QLinearGpu *q);  // "int4 g128 sym, tensor-core GEMM" etc.

// y (rows) fp32 = W x (+ bias) (+ y when acc); x (cols) fp32. 0, or -1 on a launch error.
int qlinear_gpu_gemv(const QLinearGpu *q, const float *x, const float *bias, float *y, int acc, void *stream);
// The same product with its neighbours of a decode step folded in, as one kernel: x' = x, or
// with nw (hidden) the RMSNorm x * inv * nw, inv = 1 / sqrt(mean(x^2) + eps), computed from x
// itself; swiglu > 0 (a stacked gate|up layer of 2 * swiglu rows): y (swiglu) = silu(gate x') *
// (up x'), no bias, no acc. pdl: launched to overlap the previous kernel on the stream (sm_90).
// 1 done; 0 this layer, device or the GEMV rung chosen (qlinear_gemv_set_version) has no such
// kernel (only v12+ on sm_90a does), nothing was launched: run the steps apart; -1 launch error.
int qlinear_gpu_gemv_fused(const QLinearGpu *q, const float *x, const float *nw, float eps, const float *bias, float *y,
                           int acc, int swiglu, int pdl, void *stream);
// A chain of such products as one kernel (k_qtmc, INT4 on sm_90a): phase i is what
// qlinear_gpu_gemv_fused(q, x, nw, eps, bias, y, acc, swiglu) computes, bit for bit, and phase i
// reads only what phases before it (or kernels before it) wrote. The weights of all phases stream
// back to back through one ring while the blocks wait for each other between phases (a grid
// barrier on *bar, a device counter that is 0 before the first launch and left 0 after each).
// 1 done; 0 the chain cannot run here (off, another kind or rung, groups or zero points that
// differ between the layers, a gathered x, more than 4 phases): nothing was launched, run the
// phases one by one; -1 bad arguments or a launch error.
typedef struct {
    const QLinearGpu *q;
    const float *x, *nw, *bias;  // nw: RMSNorm weight or NULL; bias or NULL
    float *y;
    int acc;     // y += ...
    int swiglu;  // > 0: q is gate|up stacked, y (swiglu) = silu(gate x') * (up x')
} QChainPhase;
int qlinear_gpu_gemv_chain(const QChainPhase *ph, int n, float eps, unsigned int *bar, int pdl, void *stream);
// 1 when qlinear_gpu_gemv_chain would run these phases (then it also runs any contiguous part of
// them), else 0. Launches nothing.
int qlinear_gpu_gemv_chain_ok(const QChainPhase *ph, int n);
// Y (T, rows) fp32, row stride ldy, = X (T, cols) [row stride ldx] W^T + beta * Y; X in xdt
// (ST_BF16 or ST_F16). 0, or -1 (bad dtype, launch error). When X must be gathered (act-order,
// in_features not a multiple of 64, X not 16-byte aligned, INT8, pre-sm_80) it goes through a
// scratch the layer grows on first need: make the largest such call once before capturing a
// CUDA graph (growing synchronizes the stream). The GEMV never allocates. A layer must not be
// used from two streams at once.
int qlinear_gpu_gemm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy, float beta,
                     void *stream);

// H (T, ldh) in xdt = silu(X gate^T) * (X up^T) for a stacked gate|up layer q (rows = 2 ff): the
// GEMM with the SwiGLU in its epilogue, one kernel (k_qtmat: INT4 on sm_90a, 5..16 rows, x in one
// column chunk). The gate and up sums are qlinear_gpu_gemm's, bit for bit; h is rounded once to
// xdt. 1 done; 0 not this layer, shape or T (nothing launched: run qlinear_gpu_gemm and the SwiGLU);
// -1 bad arguments or a launch error.
int qlinear_gpu_gemm_swiglu(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, void *H, int ldh, int ff,
                            void *stream);
// The RMSNorm between two projections folded into them (batch 1..16: INT4 through k_qtmat, sm_90a).
// A projection that adds into the residual stream (Y = X W^T + beta Y, as o and down do) also
// writes what the next RMSNorm needs apart from the row's RMS: xn (T, ldxn) in xdt = Y * nw (the
// norm's weight) and partial sums of Y's squares, ss_out[t * nss_out + p] for p < nss_out, each a
// strip of 16 outputs or a block of 256 (no atomics: the same sums in the same order every run).
// The next projection reads xn as its X with ss_in / nss_in set to them: its sums are scaled by
// r_t = 1 / sqrt(sum_p ss_in[t * nss_in + p] / cols + eps) before beta Y is added (the norm's
// output is r_t * xn: the same product, rounded to xdt before r_t is applied instead of after).
typedef struct {
    const float *nw;  // output side: the next RMSNorm's weight (rows floats), or NULL
    void *xn;         // output side: (T, ldxn) in xdt
    int ldxn;
    float *ss_out;    // output side: at least T * ((rows + 15) / 16) floats
    int nss_out;      // output side: set by the call
    const float *ss_in;  // input side: partials as an output side wrote them, or NULL
    int nss_in;          // input side: their count per token
    int cols;            // input side: the norm's width (the mean of the squares divides by it)
    float eps;           // input side: the norm's epsilon
} QGemmNorm;
// qlinear_gpu_gemm with either or both sides of QGemmNorm. 1 done; 0 not this layer, T or shape
// (nothing launched but perhaps a gather of X: run qlinear_gpu_gemm and the RMSNorm instead; the
// input side needs x in one column chunk); -1 bad arguments or a launch error.
int qlinear_gpu_gemm_norm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy,
                          float beta, QGemmNorm *nm, void *stream);
// The input side finished in xn itself, for a consumer the call above refused (0): row t of xn
// (T, ldxn; nm->cols columns, xdt) *= r_t from nm->ss_in / nss_in / cols / eps. 0, or -1.
int qlinear_gpu_norm_finish(StDtype xdt, int T, void *xn, int ldxn, const QGemmNorm *nm, void *stream);
// qlinear_gpu_gemm_swiglu with QGemmNorm's input side (nm->nw must be NULL); the same returns.
int qlinear_gpu_gemm_swiglu_norm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, void *H, int ldh,
                                 int ff, const QGemmNorm *nm, void *stream);
// Which kernel qlinear_gpu_gemm runs: AUTO (the default: the tensor-core GEMM for INT4 on sm_80+)
// or SIMT (the fallback that INT8 and pre-sm_80 GPUs run), for the tests and the benchmark.
// 0, or -1 (unknown path).
enum { QLINEAR_GEMM_AUTO = 0, QLINEAR_GEMM_SIMT = 1 };
int qlinear_gpu_set_gemm_path(QLinearGpu *q, int path);

#ifdef __cplusplus
}
#endif
