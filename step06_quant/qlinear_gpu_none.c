// qlinear_gpu_none.c — qlinear_gpu.h for builds without CUDA (no nvcc): creating a layer fails
// and says why, every product fails, so programs and tests can report why the GPU path is skipped.
#include "step06_quant/qlinear_gpu.h"

#if !HAVE_CUDA
#include <stdio.h>

QLinearGpu *qlinear_gpu_new(const QWeight *w, char *err, int errlen) {
    (void)w;
    snprintf(err, (size_t)errlen, "qlinear_gpu_new: built without CUDA (nvcc was not found at build time)");
    return NULL;
}
void qlinear_gpu_free(QLinearGpu *q) { (void)q; }
size_t qlinear_gpu_bytes(const QLinearGpu *q) {
    (void)q;
    return 0;
}
int qlinear_gpu_rows(const QLinearGpu *q) {
    (void)q;
    return 0;
}
int qlinear_gpu_cols(const QLinearGpu *q) {
    (void)q;
    return 0;
}
const char *qlinear_gpu_describe(const QLinearGpu *q) {
    (void)q;
    return "built without CUDA";
}
int qlinear_gpu_gemv(const QLinearGpu *q, const float *x, const float *bias, float *y, int acc, void *stream) {
    (void)q, (void)x, (void)bias, (void)y, (void)acc, (void)stream;
    fprintf(stderr, "qlinear_gpu_gemv: built without CUDA\n");
    return -1;
}
int qlinear_gpu_gemv_fused(const QLinearGpu *q, const float *x, const float *nw, float eps, const float *bias, float *y,
                           int acc, int swiglu, int pdl, void *stream) {
    (void)q, (void)x, (void)nw, (void)eps, (void)bias, (void)y, (void)acc, (void)swiglu, (void)pdl, (void)stream;
    return 0;
}
int qlinear_gpu_gemm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy, float beta,
                     void *stream) {
    (void)q, (void)xdt, (void)T, (void)X, (void)ldx, (void)Y, (void)ldy, (void)beta, (void)stream;
    fprintf(stderr, "qlinear_gpu_gemm: built without CUDA\n");
    return -1;
}
int qlinear_gpu_gemm_swiglu(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, void *H, int ldh, int ff,
                            void *stream) {
    (void)q, (void)xdt, (void)T, (void)X, (void)ldx, (void)H, (void)ldh, (void)ff, (void)stream;
    return 0;
}
int qlinear_gpu_gemm_norm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy,
                          float beta, QGemmNorm *nm, void *stream) {
    (void)q, (void)xdt, (void)T, (void)X, (void)ldx, (void)Y, (void)ldy, (void)beta, (void)nm, (void)stream;
    return 0;
}
int qlinear_gpu_norm_finish(StDtype xdt, int T, void *xn, int ldxn, const QGemmNorm *nm, void *stream) {
    (void)xdt, (void)T, (void)xn, (void)ldxn, (void)nm, (void)stream;
    fprintf(stderr, "qlinear_gpu_norm_finish: built without CUDA\n");
    return -1;
}
int qlinear_gpu_gemm_swiglu_norm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, void *H, int ldh,
                                 int ff, const QGemmNorm *nm, void *stream) {
    (void)q, (void)xdt, (void)T, (void)X, (void)ldx, (void)H, (void)ldh, (void)ff, (void)nm, (void)stream;
    return 0;
}
int qlinear_gpu_gemv_chain(const QChainPhase *ph, int n, float eps, unsigned int *bar, int pdl, void *stream) {
    (void)ph, (void)n, (void)eps, (void)bar, (void)pdl, (void)stream;
    return 0;
}
int qlinear_gpu_gemv_chain_ok(const QChainPhase *ph, int n) {
    (void)ph, (void)n;
    return 0;
}
int qlinear_gpu_set_gemm_path(QLinearGpu *q, int path) {
    (void)q, (void)path;
    return -1;
}
#endif

#if !HAVE_CUDA
#include "step06_quant/qlinear_bench_gpu.h"
double qbench_bf16_gemm_ms(int T, int rows, int cols, int warmup, int reps) {
    (void)T, (void)rows, (void)cols, (void)warmup, (void)reps;
    return -1.0;
}
int qlinear_gemv_n_versions(void) { return 0; }
const char *qlinear_gemv_version_name(int version) {
    (void)version;
    return "?";
}
void qlinear_gemv_set_version(int version) { (void)version; }
int qlinear_gemv_version_fp16(int version) {
    (void)version;
    return 0;
}
void qlinear_gemv_set_pdl(int on) { (void)on; }
void qlinear_gemv_set_grid(int policy) { (void)policy; }
void qlinear_gemv_set_chain(int on) { (void)on; }
void qlinear_gemm_set_qtmat(int on) { (void)on; }
void qlinear_gemm_set_deq_rows(int t) { (void)t; }
void qlinear_gemm_set_qtmat_ts(int ts) { (void)ts; }
void qlinear_gemm_set_qtmat_sp(int sp) { (void)sp; }
void qlinear_gemm_set_qtmat_xorder(int xpre, int xall) { (void)xpre, (void)xall; }
void qlinear_gemm_set_qtmat_cl(int cl) { (void)cl; }
void qlinear_gemm_set_qtmat_red(int on) { (void)on; }
void qlinear_gemm_set_qtmat_ring(int bytes) { (void)bytes; }
void qlinear_gemm_set_qtmat_rb1(int on) { (void)on; }
void qlinear_gemm_set_qtmat_adj(int on) { (void)on; }
int qlinear_gpu_gemv_version(const struct QLinearGpu *q) {
    (void)q;
    return -1;
}
#endif
