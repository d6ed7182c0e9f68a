// test_step06_gpu.c — step06's quantized linear layer on CUDA (qlinear_gpu.h) against the fp32
// CPU reference linear_q_cpu, on fresh random QWeights (every integer in 0 .. 2^bits - 1, random
// scales and zero points):
//   - INT8 and INT4; groups 32, 64, 128, 96 and per channel; symmetric and asymmetric; with and
//     without act-order (a GPTQ-style g_idx: the groups of a random column permutation);
//   - row counts that are not multiples of any tile (1, 77, 300, 1037), column counts that are
//     multiples of the group but not all of 128 (per channel: 200, 520);
//   - the GEMV with and without bias and accumulate (y += ...), every version of its ladder,
//     tolerance 1e-4 of max|ref| (both fp32, summed in a different order);
//   - the GEMM for T = 1, 2, 7, 11, 16, 33, 64, 100, bf16 and fp16 X (the reference runs on X rounded
//     the same way), beta 0 and 1, X and Y with row strides wider than the matrix (an odd X
//     stride too; the columns past `rows` in each Y row must come back untouched), the default
//     kernel (on sm_80+ it must be the tensor-core one for INT4) and the SIMT fallback forced;
//     tolerance ERR_TOL_HALF of max|ref|, since the tensor-core path rounds the dequantized
//     weights to 16 bits;
//   - the GEMM's path for many rows (the weights expanded to X's type, then cuBLAS), forced from one
//     row on over every case and T above (by default it starts at 512 rows for INT4, 64 for INT8, so
//     INT8's T = 64 and 100 take it in the default pass too);
//   - the GEMM's T <= 16 kernel on sm_90 (k_qtmat, qlinear_gemm_set_qtmat), 16 and 32 tiles a stage (one or two strips a unit), on every case
//     above, and with k_qgemm4 over layers wide enough that k_qtmat cuts x into column chunks
//     (summed by a second kernel): groups of 32 asymmetric, per channel, act-order, a last chunk and
//     stage shorter than the others, T = 3, 9, 16;
//   - the GEMV on an x that is not 16-byte aligned; groups of 16 and 48 (the naive kernels);
//   - qlinear_gpu_gemv_fused (the k_qtma rungs): the RMSNorm and SwiGLU folded in, against
//     linear_q_cpu on the CPU-normalized x (tolerance of x in fp16), and refusing (0) what it cannot
//     fold (act-order with the norm, ff not a multiple of 16);
//   - qlinear_gpu_gemm_swiglu (the SwiGLU in k_qtmat's epilogue) against the GEMM's own sums put
//     through silu(gate) * up on the CPU, and refusing (0) what it cannot fuse;
//   - qlinear_gpu_gemm_norm / _swiglu_norm (the RMSNorm folded into the layers around it) against
//     qlinear_gpu_gemm's own sums, the norm's parts computed on the CPU;
//   - bad arguments refused (dtype, T < 0) and T = 0 a no-op.
// Every test skips (and says why) without a CUDA device.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "gpu.h"
#include "rng.h"
#include "step01_matmul/matmul_gpu.h"  // matmul_round_to_dtype
#include "step05_paged/paged_attention.h"  // pa_dev_alloc, pa_upload(_as), pa_download, pa_sync
#include "step06_quant/qlinear_bench_gpu.h"  // the GEMV ladder: qlinear_gemv_set_version
#include "step06_quant/qlinear_gpu.h"
#include "step06_quant/quant.h"

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

#define TOL_GEMV 1e-4
#define TOL_GEMM ERR_TOL_HALF

typedef struct {
    QuantKind kind;
    int rows, cols, group;  // group -1: per channel
    int sym, act_order;
} QCase;

// A random QWeight of case c (quant.h's qweight_random): every integer equally likely, scales in
// [0.5, 1.5) * 2^-6 (so outputs are O(1) for uniform(-1, 1) inputs), zero points anywhere in range
// when asymmetric, GPTQ's desc_act g_idx when act_order.
static void make_qweight(Rng *r, const QCase *c, QWeight *w) {
    const int group = c->group < 0 ? c->cols : c->group;
    cr_assert_eq(qweight_random(w, r, c->kind, c->rows, c->cols, group, c->sym, c->act_order), 0);
}

static const char *case_str(const QCase *c, char *buf, size_t n) {
    snprintf(buf, n, "%s %dx%d g%d %s%s", c->kind == QK_INT8 ? "int8" : "int4", c->rows, c->cols, c->group,
             c->sym ? "sym" : "asym", c->act_order ? " act-order" : "");
    return buf;
}

// The cases: each kind x {per channel, groups} x sym/asym x act-order, odd row counts.
static int all_cases(QCase *out, int max) {
    static const int shapes[][2] = {{77, 256}, {300, 384}, {1037, 512}, {1, 128}};
    static const int groups[] = {32, 64, 128, -1};
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (int gi = 0; gi < 4; gi++)
            for (int sym = 0; sym < 2; sym++)
                for (int ao = 0; ao < 2; ao++) {
                    if (ao && groups[gi] < 0) continue;  // act-order needs groups
                    const int s = (k * 7 + gi * 3 + sym * 2 + ao) % 4;
                    QCase c = {k ? QK_INT4 : QK_INT8, shapes[s][0], shapes[s][1], groups[gi], sym, ao};
                    if (n < max) out[n++] = c;
                }
    // per channel on column counts that are not multiples of 128
    // and groups of 48 and 16 columns, which the packed kernels refuse: the naive kernels run them
    const QCase extra[] = {{QK_INT8, 129, 200, -1, 1, 0}, {QK_INT4, 65, 520, -1, 0, 0}, {QK_INT4, 33, 200, -1, 1, 0},
                           {QK_INT4, 40, 192, 48, 0, 0},  {QK_INT8, 23, 96, 16, 1, 1},
                           // groups of 96: a multiple of 32 but not a power of two, so a 64-column
                           // tile straddles two groups
                           {QK_INT4, 50, 384, 96, 0, 0},  {QK_INT8, 31, 288, 96, 1, 1}, {QK_INT4, 18, 480, 96, 1, 1}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (n < max) out[n++] = extra[i];
    return n;
}

static QLinearGpu *make_layer(const QWeight *w, const char *what) {
    char err[256] = "";
    QLinearGpu *q = qlinear_gpu_new(w, err, sizeof err);
    cr_assert_not_null(q, "%s: qlinear_gpu_new: %s", what, err);
    cr_assert_eq(qlinear_gpu_rows(q), w->rows, "%s", what);
    cr_assert_eq(qlinear_gpu_cols(q), w->cols, "%s", what);
    cr_assert_gt(qlinear_gpu_bytes(q), 0, "%s", what);
    return q;
}

// Case c's random QWeight (into w), its name (into what) and its layer on the GPU.
static QLinearGpu *case_layer(Rng *r, const QCase *c, QWeight *w, char *what, size_t n) {
    case_str(c, what, n);
    make_qweight(r, c, w);
    return make_layer(w, what);
}

// One GEMV check of layer q (holding w): x, bias and y random; every mode: with and without bias,
// with and without accumulation, x at an odd float offset (not 16-byte aligned), and the other
// GEMV versions of the ladder.
static void check_gemv(Rng *r, const QWeight *w, QLinearGpu *q, const char *what) {
    const int rows = w->rows, cols = w->cols;
    float *x = rng_new_uniform(r, (size_t)cols, -1, 1), *b = rng_new_uniform(r, (size_t)rows, -1, 1);
    float *y0 = rng_new_uniform(r, (size_t)rows, -1, 1);
    float *ref = malloc((size_t)rows * sizeof(float)), *y = malloc((size_t)rows * sizeof(float));
    float *dx = pa_dev_alloc((size_t)cols * 4), *db = pa_dev_alloc((size_t)rows * 4);
    float *dy = pa_dev_alloc((size_t)rows * 4);
    pa_upload(dx, x, (size_t)cols * 4), pa_upload(db, b, (size_t)rows * 4);
    float *dx1 = pa_dev_alloc((size_t)(cols + 1) * 4);  // x at an odd float offset: not 16-byte aligned
    pa_upload(dx1 + 1, x, (size_t)cols * 4);
    for (int mode = 0; mode < 5 + qlinear_gemv_n_versions(); mode++) {
        // bit 0: bias, bit 1: accumulate; mode 4: misaligned x (0..4: the default version); 5..: every version
        const int use_b = mode & 1, acc = (mode >> 1) & 1;
        qlinear_gemv_set_version(mode >= 5 ? mode - 5 : -1);
        qlinear_gemv_set_pdl(mode & 1);  // the tensor-core rungs with and without dependent launch (sm_90)
        qlinear_gemv_set_grid((mode >> 1) & 1);  // the TMA rungs' grid: fewest rounds, balanced over the SMs
        linear_q_cpu(x, w, use_b ? b : NULL, 1, ref);
        if (acc)
            for (int i = 0; i < rows; i++) ref[i] += y0[i];
        pa_upload(dy, y0, (size_t)rows * 4);  // y0 also poisons the non-accumulating case
        cr_assert_eq(qlinear_gpu_gemv(q, mode == 4 ? dx1 + 1 : dx, use_b ? db : NULL, dy, acc, NULL), 0, "%s", what);
        cr_assert_eq(pa_sync(), 0, "%s", what);
        pa_download(y, dy, (size_t)rows * 4);
        const ErrStats e = compare_f32(y, ref, (size_t)rows);
        const double tol = qlinear_gemv_version_fp16(qlinear_gpu_gemv_version(q)) ? TOL_GEMM : TOL_GEMV;  // x in fp16
        cr_expect(e.max_rel < tol, "gemv %s mode %d: max_rel %.3g (row %zu: %g vs %g) [%s]", what, mode,
                  e.max_rel, e.worst, y[e.worst], ref[e.worst], qlinear_gpu_describe(q));
    }
    qlinear_gemv_set_version(-1);
    qlinear_gemv_set_pdl(0);
    qlinear_gemv_set_grid(0);
    pa_dev_free(dx), pa_dev_free(dx1), pa_dev_free(db), pa_dev_free(dy);
    free(x), free(b), free(y0), free(ref), free(y);
}

Test(step06_gpu, gemv_matches_cpu_reference) {
    NEED_GPU();
    QCase cases[64];
    const int nc = all_cases(cases, 64);
    Rng r;
    rng_seed(&r, 611);
    for (int ci = 0; ci < nc; ci++) {
        const QCase *c = &cases[ci];
        char what[160];
        QWeight w;
        QLinearGpu *q = case_layer(&r, c, &w, what, sizeof what);
        check_gemv(&r, &w, q, what);
        qlinear_gpu_free(q);
        qweight_free(&w);
    }
}

// One GEMM check: T rows of X (dtype dt, row stride cols + 8), Y (row stride rows + 3) preset to
// random values, beta 0 or 1; the 3 pad columns of each Y row must be untouched.
static void check_gemm(Rng *r, const QWeight *w, QLinearGpu *q, StDtype dt, int T, float beta, int ldx,
                       const char *what) {
    const int rows = w->rows, cols = w->cols, ldy = rows + 3;
    float *X = rng_new_uniform(r, (size_t)T * ldx, -1, 1);
    matmul_round_to_dtype(dt == ST_BF16 ? MM_BF16 : MM_F16, X, (long)T * ldx);
    float *Xc = malloc((size_t)T * cols * sizeof(float));  // the reference's contiguous copy
    for (int t = 0; t < T; t++) memcpy(Xc + (size_t)t * cols, X + (size_t)t * ldx, (size_t)cols * sizeof(float));
    float *Y0 = rng_new_uniform(r, (size_t)T * ldy, -1, 1);
    float *ref = malloc((size_t)T * rows * sizeof(float)), *Y = malloc((size_t)T * ldy * sizeof(float));
    float *Yc = malloc((size_t)T * rows * sizeof(float));
    linear_q_cpu(Xc, w, NULL, T, ref);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < rows; i++) ref[(size_t)t * rows + i] += beta * Y0[(size_t)t * ldy + i];
    void *dX = pa_dev_alloc((size_t)T * ldx * 2);
    float *dY = pa_dev_alloc((size_t)T * ldy * 4);
    pa_upload_as(dt, dX, X, (size_t)T * ldx);
    pa_upload(dY, Y0, (size_t)T * ldy * 4);
    cr_assert_eq(qlinear_gpu_gemm(q, dt, T, dX, ldx, dY, ldy, beta, NULL), 0, "%s", what);
    cr_assert_eq(pa_sync(), 0, "%s", what);
    pa_download(Y, dY, (size_t)T * ldy * 4);
    int pad_ok = 1;
    for (int t = 0; t < T; t++) {
        memcpy(Yc + (size_t)t * rows, Y + (size_t)t * ldy, (size_t)rows * sizeof(float));
        for (int i = rows; i < ldy; i++) pad_ok &= Y[(size_t)t * ldy + i] == Y0[(size_t)t * ldy + i];
    }
    const ErrStats e = compare_f32(Yc, ref, (size_t)T * rows);
    // An output passes within TOL_GEMM of max|ref|, or, where its sum cancels (a near-zero output of
    // a layer with one row, say, where max|ref| is that output itself), within the rounding the
    // kernels do: each weight (q - z) s rounded to X's type, so 2 unit roundoffs of that type times
    // sum_j |x_j w_j| (bf16 2^-8, fp16 2^-11).
    float *Wd = malloc((size_t)rows * cols * sizeof(float));
    qweight_dequant(w, Wd);
    const double u2 = dt == ST_BF16 ? 0x1p-8 : 0x1p-11;
    double worst = 0, ref_max = 0;
    size_t worst_at = 0;
    for (size_t k = 0; k < (size_t)T * rows; k++) ref_max = fmax(ref_max, fabs((double)ref[k]));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < rows; i++) {
            double mag = 0;
            for (int j = 0; j < cols; j++) mag += fabs((double)Xc[(size_t)t * cols + j] * Wd[(size_t)i * cols + j]);
            const size_t at = (size_t)t * rows + i;
            const double err = fabs((double)Yc[at] - ref[at]);
            const double lim = fmax(TOL_GEMM * ref_max, u2 * mag + 1e-30);
            if (!isfinite(Yc[at]) || err / lim > worst) worst = isfinite(Yc[at]) ? err / lim : INFINITY, worst_at = at;
        }
    free(Wd);
    cr_expect(worst <= 1.0, "gemm %s %s T %d beta %g ldx %d: error %.3g of its limit (t %zu row %zu: %g vs %g; max_rel %.3g) [%s]",
              what, dt == ST_BF16 ? "bf16" : "fp16", T, beta, ldx, worst, worst_at / rows, worst_at % rows, Yc[worst_at],
              ref[worst_at], e.max_rel, qlinear_gpu_describe(q));
    cr_expect(pad_ok, "gemm %s T %d: wrote past `rows` in a Y row", what, T);
    pa_dev_free(dX), pa_dev_free(dY);
    free(X), free(Xc), free(Y0), free(ref), free(Y), free(Yc);
}

Test(step06_gpu, gemm_matches_cpu_reference, .timeout = 600) {
    NEED_GPU();
    QCase cases[64];
    const int nc = all_cases(cases, 64);
    static const int Ts[] = {1, 2, 7, 11, 16, 33, 64, 100};
    const int nT = (int)(sizeof Ts / sizeof Ts[0]);
    Rng r;
    rng_seed(&r, 612);
    for (int ci = 0; ci < nc; ci++) {
        const QCase *c = &cases[ci];
        char what[160];
        QWeight w;
        QLinearGpu *q = case_layer(&r, c, &w, what, sizeof what);
        // the default kernel, the SIMT fallback forced, k_qtmat on (16 tiles a stage), dequantize + cuBLAS
        // from one row on, k_qtmat with 32 tiles a stage of one strip, then of two strips (an odd strip
        // count's last unit holds one), these two with each warp's tiles of a stage adjacent
        for (int path = 0; path < 6; path++) {
            cr_assert_eq(qlinear_gpu_set_gemm_path(q, path == 1 ? QLINEAR_GEMM_SIMT : QLINEAR_GEMM_AUTO), 0);
            qlinear_gemm_set_qtmat(path == 2 || path >= 4);
            qlinear_gemm_set_qtmat_adj(path >= 4 ? 1 : -1);
            qlinear_gemm_set_qtmat_ts(path >= 4 ? 32 : 16);
            qlinear_gemm_set_qtmat_sp(path == 5 ? 2 : 1);
            qlinear_gemm_set_deq_rows(path == 3 ? 1 : path == 2 || path >= 4 ? 0 : -1);
            const char *desc = qlinear_gpu_describe(q);
            // INT8 takes the tensor cores when its groups are whole 64-column tiles (or one per row)
            const int tc = c->kind == QK_INT4 || c->group < 0 || c->group % 64 == 0;
            if (path != 1 && tc && gi_.cc_major >= 8 && !strstr(desc, "naive"))  // else nothing tests it
                cr_expect(strstr(desc, "tensor-core") != NULL, "%s on sm_%d%d: not the tensor-core GEMM (%s)", what,
                          gi_.cc_major, gi_.cc_minor, desc);
            if (path == 3 && !strstr(desc, "naive"))  // every T below goes through the expanded weights
                cr_expect(strstr(desc, ">= 1 rows: dequantized + cuBLAS") != NULL, "%s: %s", what, desc);
            for (int ti = 0; ti < nT; ti++) {  // dtype, beta and the X row stride vary so every pair meets every T
                const int ldx = c->cols + ((ti + path) % 3 == 2 ? 3 : 8);  // an odd stride takes the gather
                check_gemm(&r, &w, q, (ti + ci + path) % 2 ? ST_F16 : ST_BF16, Ts[ti], (float)((ti / 2 + ci) % 2), ldx,
                           what);
            }
        }
        qlinear_gemm_set_qtmat(0);
        qlinear_gemm_set_qtmat_ts(0);
        qlinear_gemm_set_qtmat_sp(0);
        qlinear_gemm_set_qtmat_adj(-1);
        qlinear_gemm_set_deq_rows(-1);
        qlinear_gpu_free(q);
        qweight_free(&w);
    }
}

// qlinear_gpu_gemv_fused (the GEMV rungs v12+ on sm_90a): the RMSNorm folded in (x' = x * inv *
// nw computed on the CPU in fp32), with and without bias / accumulate, and gate|up with SwiGLU
// (silu(gate) * up), against linear_q_cpu on x'; both INT4 and INT8, sym and asym, groups 32 / 128
// / per channel, act-order (the norm must refuse: its x would need the permutation), odd row
// counts (SwiGLU: ff a multiple of 16, as the fused kernel needs; others fall back with 0).
Test(step06_gpu, gemv_fused_norm_and_swiglu) {
    NEED_GPU();
    static const QCase cases[] = {{QK_INT4, 2 * 48, 256, 128, 1, 0}, {QK_INT4, 2 * 80, 384, 32, 0, 0},
                                  {QK_INT8, 2 * 32, 512, -1, 1, 0},  {QK_INT8, 2 * 64, 320, 64, 0, 0},
                                  {QK_INT4, 77, 512, 64, 1, 0},      {QK_INT4, 2 * 48, 256, 128, 1, 1},
                                  {QK_INT4, 2 * 40, 128, -1, 0, 0},  {QK_INT4, 2 * 896, 4096, 128, 1, 0},
                                  // INT8 with whole stages (16, 32 and 64 tiles: 1024 - 4096 columns)
                                  {QK_INT8, 2 * 48, 4096, -1, 1, 0}, {QK_INT8, 2 * 64, 2048, 128, 0, 0},
                                  {QK_INT8, 2 * 16, 8192, 64, 1, 0}};
    Rng r;
    rng_seed(&r, 614);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const QCase *c = &cases[ci];
        char what[160];
        QWeight w;
        QLinearGpu *q = case_layer(&r, c, &w, what, sizeof what);
        const int rows = c->rows, cols = c->cols, ff = rows / 2;
        float *x = rng_new_uniform(&r, (size_t)cols, -3, 3), *nw = rng_new_uniform(&r, (size_t)cols, 0.5f, 1.5f);
        float *b = rng_new_uniform(&r, (size_t)rows, -1, 1), *y0 = rng_new_uniform(&r, (size_t)rows, -1, 1);
        float *xn = malloc((size_t)cols * sizeof(float)), *ref = malloc((size_t)rows * sizeof(float));
        float *y = malloc((size_t)rows * sizeof(float)), *h = malloc((size_t)ff * sizeof(float));
        const float eps = 1e-5f;
        double ss = 0;
        for (int i = 0; i < cols; i++) ss += (double)x[i] * x[i];
        const float inv = 1.0f / sqrtf((float)(ss / cols) + eps);
        for (int i = 0; i < cols; i++) xn[i] = x[i] * inv * nw[i];
        float *dx = pa_dev_alloc((size_t)cols * 4), *dnw = pa_dev_alloc((size_t)cols * 4);
        float *db = pa_dev_alloc((size_t)rows * 4), *dy = pa_dev_alloc((size_t)rows * 4);
        pa_upload(dx, x, (size_t)cols * 4), pa_upload(dnw, nw, (size_t)cols * 4), pa_upload(db, b, (size_t)rows * 4);
        for (int v = 11; v < qlinear_gemv_n_versions(); v++)
            for (int mode = 0; mode < 6; mode++) {  // 0-3: norm, bit 0 bias, bit 1 acc; 4: SwiGLU; 5: neither (plain x)
                qlinear_gemv_set_version(v);
                qlinear_gemv_set_grid((v + mode) & 1);  // the TMA rungs' two grids, alternating
                const int use_b = mode < 4 && (mode & 1), acc = mode < 4 && (mode & 2), swiglu = mode == 4 ? ff : 0;
                const int norm = mode < 5;
                linear_q_cpu(norm ? xn : x, &w, use_b ? b : NULL, 1, ref);
                int n = rows;
                if (swiglu) {
                    for (int i = 0; i < ff; i++) h[i] = ref[i] / (1.0f + expf(-ref[i])) * ref[ff + i];
                    memcpy(ref, h, (size_t)ff * sizeof(float));
                    n = ff;
                } else if (acc) {
                    for (int i = 0; i < rows; i++) ref[i] += y0[i];
                }
                pa_upload(dy, y0, (size_t)rows * 4);
                const int rc = qlinear_gpu_gemv_fused(q, dx, norm ? dnw : NULL, eps, use_b ? db : NULL, dy, acc, swiglu,
                                                      mode & 1, NULL);
                cr_assert_eq(pa_sync(), 0, "%s", what);
                const int can = gi_.cc_major == 9 && !(norm && c->act_order) && !(swiglu && ff % 16);
                cr_expect_eq(rc, can ? 1 : 0, "gemv_fused %s v%d mode %d: returned %d", what, v + 1, mode, rc);
                if (rc != 1) continue;
                pa_download(y, dy, (size_t)rows * 4);
                const ErrStats e = compare_f32(y, ref, (size_t)n);
                cr_expect(e.max_rel < TOL_GEMM, "gemv_fused %s v%d mode %d: max_rel %.3g (row %zu: %g vs %g)", what, v + 1,
                          mode, e.max_rel, e.worst, y[e.worst], ref[e.worst]);
                if (swiglu) {  // the rows past ff are untouched
                    float *tail = malloc((size_t)rows * sizeof(float));
                    pa_download(tail, dy, (size_t)rows * 4);
                    int same = 1;
                    for (int i = ff; i < rows; i++) same &= tail[i] == y0[i];
                    cr_expect(same, "gemv_fused %s swiglu wrote past ff", what);
                    free(tail);
                }
            }
        qlinear_gemv_set_version(-1);
        qlinear_gemv_set_grid(0);
        pa_dev_free(dx), pa_dev_free(dnw), pa_dev_free(db), pa_dev_free(dy);
        free(x), free(nw), free(b), free(y0), free(xn), free(ref), free(y), free(h);
        qlinear_gpu_free(q);
        qweight_free(&w);
    }
}

// qlinear_gpu_gemv_chain (k_qtmc): the layers between two attentions of a decode step (o, gate|up
// with the norm and SwiGLU, down, the next q|k|v with the norm and a bias) as one kernel must give
// bit for bit what the same layers give one kernel each (qlinear_gpu_gemv_fused, v12), which the
// test above checks against the CPU: groups of 128, 64 and 32 and per channel, with and without
// zero points, row counts that are not multiples of 16, a down_proj whose last stage is partial;
// chains of 1 to 4 phases, launched twice (the barrier's counter is back at 0 after each), with
// and without programmatic dependent launch; layers whose group modes differ (128 and 32: one
// scale a 64-column tile against two) are refused (0).
Test(step06_gpu, gemv_chain_equals_the_layers_one_by_one, .timeout = 300) {
    NEED_GPU();
    typedef struct {
        int d, att, ff, nqkv, group, sym;
    } ChainCase;
    static const ChainCase cases[] = {{384, 256, 640, 400, 128, 1}, {320, 192, 448, 304, 64, 0},
                                      {320, 256, 448, 400, 32, 1},  {256, 256, 704, 200, -1, 0},
                                      {1024, 1024, 2816, 1536, 128, 1}};
    qlinear_gemv_set_chain(1);
    Rng r;
    rng_seed(&r, 615);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const ChainCase *c = &cases[ci];
        const QCase lc[4] = {{QK_INT4, c->d, c->att, c->group, c->sym, 0},
                             {QK_INT4, 2 * c->ff, c->d, c->group, c->sym, 0},
                             {QK_INT4, c->d, c->ff, c->group, c->sym, 0},
                             {QK_INT4, c->nqkv, c->d, c->group, c->sym, 0}};
        QWeight w[4];
        QLinearGpu *q[4];
        char what[200];
        snprintf(what, sizeof what, "chain d %d att %d ff %d qkv %d g%d %s", c->d, c->att, c->ff, c->nqkv, c->group,
                 c->sym ? "sym" : "asym");
        for (int i = 0; i < 4; i++) make_qweight(&r, &lc[i], &w[i]), q[i] = make_layer(&w[i], what);
        // buffers: att (x of o), res (the residual: o and down add to it, gate|up and q|k|v read it), h, qkv
        const size_t n_att = (size_t)c->att, n_res = (size_t)c->d, n_h = (size_t)c->ff, n_qkv = (size_t)c->nqkv;
        float *att = rng_new_uniform(&r, n_att, -2, 2), *res = rng_new_uniform(&r, n_res, -2, 2);
        float *nw1 = rng_new_uniform(&r, n_res, 0.5f, 1.5f), *nw2 = rng_new_uniform(&r, n_res, 0.5f, 1.5f);
        float *bo = rng_new_uniform(&r, n_res, -1, 1), *bqkv = rng_new_uniform(&r, n_qkv, -1, 1);
        float *dat = pa_dev_alloc(n_att * 4), *dres = pa_dev_alloc(n_res * 4), *dh = pa_dev_alloc(n_h * 4);
        float *dqkv = pa_dev_alloc(n_qkv * 4), *dnw1 = pa_dev_alloc(n_res * 4), *dnw2 = pa_dev_alloc(n_res * 4);
        float *dbo = pa_dev_alloc(n_res * 4), *dbqkv = pa_dev_alloc(n_qkv * 4);
        unsigned int *bar = pa_dev_alloc(4);
        pa_upload(dat, att, n_att * 4), pa_upload(dnw1, nw1, n_res * 4), pa_upload(dnw2, nw2, n_res * 4);
        pa_upload(dbo, bo, n_res * 4), pa_upload(dbqkv, bqkv, n_qkv * 4);
        const unsigned int zero = 0;
        pa_upload(bar, &zero, 4);
        float *zeros = calloc(n_h > n_qkv ? n_h : n_qkv, 4);
        const QChainPhase ph[4] = {{q[0], dat, NULL, dbo, dres, 1, 0},
                                   {q[1], dres, dnw1, NULL, dh, 0, c->ff},
                                   {q[2], dh, NULL, NULL, dres, 1, 0},
                                   {q[3], dres, dnw2, dbqkv, dqkv, 0, 0}};
        float *want[3], *got[3];
        const size_t nb[3] = {n_res, n_h, n_qkv};
        float *dbuf[3] = {dres, dh, dqkv};
        for (int k = 0; k < 3; k++) want[k] = malloc(nb[k] * 4), got[k] = malloc(nb[k] * 4);
        for (int n = 1; n <= 4; n++)
            for (int pdl = 0; pdl < 2; pdl++) {
                // the layers one by one
                pa_upload(dres, res, n_res * 4);
                pa_upload(dh, zeros, n_h * 4), pa_upload(dqkv, zeros, n_qkv * 4);
                for (int i = 0; i < n; i++)
                    cr_assert_eq(qlinear_gpu_gemv_fused(ph[i].q, ph[i].x, ph[i].nw, 1e-5f, ph[i].bias, ph[i].y, ph[i].acc,
                                                        ph[i].swiglu, 0, NULL),
                                 1, "%s: phase %d one by one", what, i);
                cr_assert_eq(pa_sync(), 0, "%s", what);
                for (int k = 0; k < 3; k++) pa_download(want[k], dbuf[k], nb[k] * 4);
                for (int rep = 0; rep < 2; rep++) {  // twice: the second launch finds the counter reset
                    pa_upload(dres, res, n_res * 4);
                    pa_upload(dh, zeros, n_h * 4), pa_upload(dqkv, zeros, n_qkv * 4);
                    const int rc = qlinear_gpu_gemv_chain(ph, n, 1e-5f, bar, pdl, NULL);
                    cr_assert_eq(pa_sync(), 0, "%s", what);
                    cr_assert_eq(rc, gi_.cc_major == 9 ? 1 : 0, "%s: %d phases: returned %d", what, n, rc);
                    if (rc != 1) continue;
                    unsigned int hb = 1;
                    pa_download(&hb, bar, 4);
                    cr_expect_eq(hb, 0u, "%s: the barrier's counter is %u after the launch", what, hb);
                    for (int k = 0; k < 3; k++) {
                        pa_download(got[k], dbuf[k], nb[k] * 4);
                        size_t bad = nb[k];
                        for (size_t i = 0; i < nb[k] && bad == nb[k]; i++)
                            if (memcmp(&got[k][i], &want[k][i], 4)) bad = i;
                        cr_expect_eq(bad, nb[k], "%s: %d phases, pdl %d, launch %d: buffer %d differs at %zu: %.9g vs %.9g",
                                     what, n, pdl, rep, k, bad, bad < nb[k] ? got[k][bad] : 0.0,
                                     bad < nb[k] ? want[k][bad] : 0.0);
                    }
                }
            }
        // off: nothing launched
        qlinear_gemv_set_chain(0);
        cr_expect_eq(qlinear_gpu_gemv_chain(ph, 4, 1e-5f, bar, 0, NULL), 0, "%s: chain off", what);
        qlinear_gemv_set_chain(1);
        fprintf(stderr, "[step06 gemv chain] %s: 1-4 phases bit-identical to the layers one by one\n", what);
        for (int k = 0; k < 3; k++) free(want[k]), free(got[k]);
        pa_dev_free(dat), pa_dev_free(dres), pa_dev_free(dh), pa_dev_free(dqkv), pa_dev_free(dnw1), pa_dev_free(dnw2);
        pa_dev_free(dbo), pa_dev_free(dbqkv), pa_dev_free(bar);
        free(zeros), free(att), free(res), free(nw1), free(nw2), free(bo), free(bqkv);
        for (int i = 0; i < 4; i++) qlinear_gpu_free(q[i]), qweight_free(&w[i]);
    }
    // layers whose groups differ: refused, nothing launched
    const QCase a = {QK_INT4, 256, 256, 128, 1, 0}, b = {QK_INT4, 256, 256, 32, 1, 0};
    QWeight wa, wb;
    make_qweight(&r, &a, &wa), make_qweight(&r, &b, &wb);
    QLinearGpu *qa = make_layer(&wa, "g128"), *qb = make_layer(&wb, "g32");
    float *dx = pa_dev_alloc(256 * 4), *dy = pa_dev_alloc(256 * 4);
    unsigned int *bar = pa_dev_alloc(4);
    const QChainPhase mixed[2] = {{qa, dx, NULL, NULL, dy, 0, 0}, {qb, dy, NULL, NULL, dx, 0, 0}};
    cr_expect_eq(qlinear_gpu_gemv_chain_ok(mixed, 2), 0, "groups 128 and 32: chain_ok");
    cr_expect_eq(qlinear_gpu_gemv_chain_ok(mixed, 1), gi_.cc_major == 9, "one layer: chain_ok");
    cr_expect_eq(qlinear_gpu_gemv_chain(mixed, 2, 1e-5f, bar, 0, NULL), 0, "groups 128 and 32 chained");
    cr_expect_eq(qlinear_gpu_gemv_chain(mixed, 0, 1e-5f, bar, 0, NULL), -1, "an empty chain");
    pa_dev_free(dx), pa_dev_free(dy), pa_dev_free(bar);
    qlinear_gpu_free(qa), qlinear_gpu_free(qb), qweight_free(&wa), qweight_free(&wb);
    qlinear_gemv_set_chain(-1);
}

// The Llama-3.1-8B down_proj shape (4096 x 14336, INT4 g128), the GEMM's main tile path at
// T = 16 and 9 (x in column chunks, their sums by k_qtmat_sum) and 64, and the GEMV, both dtypes.
Test(step06_gpu, llama_down_proj_shape) {
    NEED_GPU();
    Rng r;
    rng_seed(&r, 613);
    const QCase c = {QK_INT4, 4096, 14336, 128, 1, 0};
    QWeight w;
    make_qweight(&r, &c, &w);
    QLinearGpu *q = make_layer(&w, "down_proj");
    check_gemm(&r, &w, q, ST_BF16, 16, 0.0f, c.cols, "down_proj int4");
    check_gemm(&r, &w, q, ST_BF16, 16, 1.0f, c.cols, "down_proj int4");
    check_gemm(&r, &w, q, ST_F16, 9, 0.0f, c.cols, "down_proj int4");
    check_gemm(&r, &w, q, ST_F16, 64, 1.0f, c.cols, "down_proj int4");
    check_gemv(&r, &w, q, "down_proj int4");
    qlinear_gpu_free(q);
    qweight_free(&w);
}

// Layers so wide that 16 tokens of x do not fit one block's shared memory: k_qtmat (the optional
// T <= 16 kernel on sm_90a; k_qgemm4 first) cuts the columns into chunks (9536 = 149 tiles of 64: chunks of 50, 50 and 49 tiles at 16
// tokens, 2 chunks at 8), each chunk's sums added by a second kernel; x copied in the three orders
// (qlinear_gemm_set_qtmat_xorder) and into clusters of blocks (qlinear_gemm_set_qtmat_cl), the chunk
// sums added by atomic adds (qlinear_gemm_set_qtmat_red: at beta 1; at beta 0 k_qtmat_sum still), a
// larger ring with the partial sums in one buffer (qlinear_gemm_set_qtmat_ring, _rb1), a ring of
// two stages, and each warp's tiles adjacent (qlinear_gemm_set_qtmat_adj 1); beta 0 and 1.
Test(step06_gpu, gemm_wide_layers_column_chunks, .timeout = 300) {
    NEED_GPU();
    const QCase cases[] = {{QK_INT4, 77, 9536, 32, 0, 0}, {QK_INT4, 300, 9536, -1, 1, 0}, {QK_INT4, 150, 9472, 128, 1, 1},
                           {QK_INT4, 33, 9600, 96, 0, 0}};
    static const int Ts[] = {16, 9, 3};
    Rng r;
    rng_seed(&r, 614);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char what[160];
        QWeight w;
        QLinearGpu *q = case_layer(&r, &cases[ci], &w, what, sizeof what);
        // k_qgemm4, then k_qtmat with 16 and 32 tiles a stage, 32 of two strips, then x copied in the
        // two other orders (all of it before any weights; a ring of weights first, then all of x),
        // then clusters of 2 and 4 blocks sharing x (some blocks without a unit, some without a row
        // at T = 3), then the chunk sums by atomic adds, then in pairs a ring of up to 160 KB (as many
        // stages as fit beside x) with the partial sums in one buffer (the default where x is in
        // chunks; the others here fix two buffers and the 64 KB ring), then a ring of 2 stages with
        // the buffers as the default has them, then the default with each warp's tiles of a stage
        // adjacent instead of W apart
        for (int on = 0; on < 12; on++) {
            qlinear_gemm_set_qtmat(on > 0);
            qlinear_gemm_set_qtmat_ts(on == 1 ? 16 : 32);
            qlinear_gemm_set_qtmat_sp(on == 3 || on == 5 || on == 7 ? 2 : 1);
            qlinear_gemm_set_qtmat_xorder(on == 4 ? 0 : on == 5 ? 64 : -1, on == 4 || on == 5);
            qlinear_gemm_set_qtmat_cl(on == 6 || on >= 9 ? 2 : on == 7 ? 4 : 1);
            qlinear_gemm_set_qtmat_red(on == 8);
            qlinear_gemm_set_qtmat_ring(on == 9 ? 160 * 1024 : on == 10 ? 1024 : 0);
            qlinear_gemm_set_qtmat_rb1(on == 9 ? 1 : on == 10 || on == 11 ? -1 : 0);
            qlinear_gemm_set_qtmat_adj(on == 11 ? 1 : -1);
            if (on && gi_.cc_major == 9)
                cr_expect(strstr(qlinear_gpu_describe(q), "k_qtmat") != NULL, "%s on sm_90: not k_qtmat (%s)", what,
                          qlinear_gpu_describe(q));
            for (int ti = 0; ti < 3; ti++)
                check_gemm(&r, &w, q, (ti + ci + on) % 2 ? ST_F16 : ST_BF16, Ts[ti], (float)((ti + ci) % 2),
                           cases[ci].cols + 8, what);
        }
        qlinear_gemm_set_qtmat_ts(0);
        qlinear_gemm_set_qtmat_sp(0);
        qlinear_gemm_set_qtmat_xorder(-1, 0);
        qlinear_gemm_set_qtmat_cl(-1);
        qlinear_gemm_set_qtmat_red(-1);
        qlinear_gemm_set_qtmat_ring(0);
        qlinear_gemm_set_qtmat_rb1(-1);
        qlinear_gemm_set_qtmat_adj(-1);
        qlinear_gemm_set_qtmat(0);
        qlinear_gpu_free(q);
        qweight_free(&w);
    }
}

// qlinear_gpu_gemm_swiglu (k_qtmat with the SwiGLU in its epilogue, sm_90a) on stacked gate|up
// INT4 layers: h equals silu(gate) * up computed on the CPU from qlinear_gpu_gemm's fp32 sums of the
// same layer (the same kernel and order: any difference is silu's exp and h's one rounding, at
// most one unit in the last place of X's type), padding columns of H untouched; groups of 32
// asymmetric, 128, per channel and act-order (x gathered), an odd gate strip count, bf16 and fp16,
// T = 5, 9, 16; T = 3 (16 tiles a stage) and ff not a multiple of 16 are refused (0). The odd cases
// with a ring of up to 160 KB and the partial sums in one buffer (qlinear_gemm_set_qtmat_ring, _rb1),
// the even ones with each warp's tiles of a stage adjacent (qlinear_gemm_set_qtmat_adj).
Test(step06_gpu, gemm_swiglu_matches_the_gemm_then_swiglu, .timeout = 300) {
    NEED_GPU();
    const int want = gi_.cc_major == 9;  // k_qtmat is sm_90a's
    const QCase cases[] = {{QK_INT4, 2 * 48, 512, 128, 1, 0}, {QK_INT4, 2 * 160, 384, 32, 0, 0}, {QK_INT4, 2 * 64, 640, -1, 1, 0},
                           {QK_INT4, 2 * 96, 512, 128, 1, 1}, {QK_INT4, 2 * 592, 4096, 128, 1, 0}};
    static const int Ts[] = {5, 9, 16, 3};
    Rng r;
    rng_seed(&r, 615);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char what[160];
        QWeight w;
        QLinearGpu *q = case_layer(&r, &cases[ci], &w, what, sizeof what);
        const int ff = cases[ci].rows / 2, cols = cases[ci].cols, ldh = ff + 5;
        qlinear_gemm_set_qtmat_ring(ci % 2 ? 160 * 1024 : 0);
        qlinear_gemm_set_qtmat_rb1(ci % 2 ? 1 : -1);
        qlinear_gemm_set_qtmat_adj(ci % 2 ? -1 : 1);
        for (int ti = 0; ti < 4; ti++) {
            const int T = Ts[ti], ldx = cols + (ti % 2 ? 3 : 8);  // an odd stride: x gathered first
            const StDtype dt = (ti + (int)ci) % 2 ? ST_F16 : ST_BF16;
            float *X = rng_new_uniform(&r, (size_t)T * ldx, -1, 1);
            float *H0 = rng_new_uniform(&r, (size_t)T * ldh, -1, 1), *H = malloc((size_t)T * ldh * 4);
            float *Y = malloc((size_t)T * 2 * ff * 4);
            void *dX = pa_dev_alloc((size_t)T * ldx * 2), *dH = pa_dev_alloc((size_t)T * ldh * 2);
            float *dY = pa_dev_alloc((size_t)T * 2 * ff * 4);
            pa_upload_as(dt, dX, X, (size_t)T * ldx);
            pa_upload_as(dt, dH, H0, (size_t)T * ldh);
            pa_download_f32(dt, H0, dH, (size_t)T * ldh);  // H0 as stored (rounded to dt)
            const int rc = qlinear_gpu_gemm_swiglu(q, dt, T, dX, ldx, dH, ldh, ff, NULL);
            cr_assert_eq(pa_sync(), 0, "%s", what);
            if (T <= 4 || !want) {
                cr_expect_eq(rc, 0, "%s T %d: %d, want 0 (not fused here)", what, T, rc);
            } else {
                cr_assert_eq(rc, 1, "%s T %d %s: not fused (%d)", what, T, dt == ST_BF16 ? "bf16" : "fp16", rc);
                cr_assert_eq(qlinear_gpu_gemm(q, dt, T, dX, ldx, dY, 2 * ff, 0.0f, NULL), 0, "%s", what);
                cr_assert_eq(pa_sync(), 0, "%s", what);
                pa_download(Y, dY, (size_t)T * 2 * ff * 4);
                pa_download_f32(dt, H, dH, (size_t)T * ldh);
                const double ulp = dt == ST_BF16 ? 0x1p-7 : 0x1p-10;
                float *one = malloc(4);
                int bad = 0, exact = 0, pad_ok = 1;
                for (int t = 0; t < T; t++) {
                    for (int j = 0; j < ff; j++) {
                        const float g = Y[(size_t)t * 2 * ff + j], u = Y[(size_t)t * 2 * ff + ff + j];
                        one[0] = g / (1.0f + expf(-g)) * u;
                        matmul_round_to_dtype(dt == ST_BF16 ? MM_BF16 : MM_F16, one, 1);
                        const float h = H[(size_t)t * ldh + j];
                        exact += h == one[0];
                        if (!(fabs((double)h - one[0]) <= ulp * fabs((double)one[0]) + 1e-30)) {
                            if (bad++ < 3)
                                cr_expect(0, "%s T %d (t %d, j %d): h %.8g, silu(%.8g) * %.8g = %.8g", what, T, t, j, h, g, u, one[0]);
                        }
                    }
                    for (int j = ff; j < ldh; j++) pad_ok &= H[(size_t)t * ldh + j] == H0[(size_t)t * ldh + j];
                }
                free(one);
                cr_expect_eq(bad, 0, "%s T %d: %d of %d outputs off by more than one unit", what, T, bad, T * ff);
                cr_expect_geq(exact, T * ff * 9 / 10, "%s T %d: only %d of %d outputs exact", what, T, exact, T * ff);
                cr_expect(pad_ok, "%s T %d: wrote past ff in an H row", what, T);
            }
            pa_dev_free(dX), pa_dev_free(dH), pa_dev_free(dY);
            free(X), free(H0), free(H), free(Y);
        }
        qlinear_gemm_set_qtmat_ring(0);
        qlinear_gemm_set_qtmat_rb1(-1);
        qlinear_gemm_set_qtmat_adj(-1);
        qlinear_gpu_free(q);
        qweight_free(&w);
    }
    // not a gate|up of 16-row strips: refused before anything runs
    QWeight w;
    char what[160];
    const QCase odd = {QK_INT4, 2 * 40, 256, 128, 1, 0};
    QLinearGpu *q = case_layer(&r, &odd, &w, what, sizeof what);
    void *dX = pa_dev_alloc(16 * 256 * 2), *dH = pa_dev_alloc(16 * 40 * 2);
    cr_expect_eq(qlinear_gpu_gemm_swiglu(q, ST_BF16, 16, dX, 256, dH, 40, 40, NULL), 0, "ff = 40 fused");
    cr_expect_eq(qlinear_gpu_gemm_swiglu(q, ST_F32, 16, dX, 256, dH, 40, 40, NULL), -1, "fp32 X taken");
    pa_dev_free(dX), pa_dev_free(dH);
    qlinear_gpu_free(q);
    qweight_free(&w);
}

// qlinear_gpu_gemm_norm / qlinear_gpu_gemm_swiglu_norm, the RMSNorm folded into the INT4 layers
// around it. The output side (a layer adding into a residual Y): Y bit for bit qlinear_gpu_gemm's,
// xn exactly Y * nw rounded to X's type, the partial sums of squares adding up to each row's sum of
// Y^2; one chunk of x (a partial a strip, an odd strip count) and x in column chunks (9,536 columns:
// k_qtmat_sum_norm, a partial a 256 columns, a last block short). The input side, reading that xn
// (528 columns: gathered to 576 first; per channel, groups of 64 and 128): a layer's sums are
// qlinear_gpu_gemm's on xn times r_t = 1 / sqrt(mean of squares + eps), and a gate|up's h is
// silu(r g) * (r u) of its sums within one unit of X's type, and qlinear_gpu_norm_finish gives xn *
// r_t within one unit; refused (0) where x is in chunks and at 2 rows for the SwiGLU (16 tiles a
// stage); bad arguments refused (-1). bf16 and fp16, T = 2, 9, 16.
Test(step06_gpu, gemm_norm_matches_the_gemm_and_the_rmsnorm, .timeout = 300) {
    NEED_GPU();
    const int want = gi_.cc_major == 9;  // k_qtmat is sm_90a's
    // A: d outputs (the producer); B and C (a gate|up of 2 ff rows): d inputs
    const struct {
        QCase a, b, c;
    } shapes[] = {{{QK_INT4, 528, 768, 128, 1, 0}, {QK_INT4, 336, 528, -1, 0, 0}, {QK_INT4, 2 * 96, 528, -1, 1, 0}},
                  {{QK_INT4, 1088, 9536, 32, 0, 0}, {QK_INT4, 200, 1088, 64, 1, 0}, {QK_INT4, 2 * 64, 1088, 64, 0, 0}}};
    static const int Ts[] = {2, 9, 16};
    const float eps = 1e-5f;
    Rng r;
    rng_seed(&r, 616);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        char wa[160], wb[160], wc[160];
        QWeight w[3];
        QLinearGpu *qa = case_layer(&r, &shapes[si].a, &w[0], wa, sizeof wa);
        QLinearGpu *qb = case_layer(&r, &shapes[si].b, &w[1], wb, sizeof wb);
        QLinearGpu *qc = case_layer(&r, &shapes[si].c, &w[2], wc, sizeof wc);
        const int d = shapes[si].a.rows, cols = shapes[si].a.cols, rb = shapes[si].b.rows, ff = shapes[si].c.rows / 2;
        const int ldxn = d + 8, nss_cap = d / 16 + 1;
        float *nw = rng_new_uniform(&r, (size_t)d, 0.5f, 1.5f);
        float *dnw = pa_dev_alloc((size_t)d * 4);
        pa_upload(dnw, nw, (size_t)d * 4);
        for (int ti = 0; ti < 3; ti++) {
            const int T = Ts[ti];
            const StDtype dt = (ti + (int)si) % 2 ? ST_F16 : ST_BF16;
            const char *dn = dt == ST_BF16 ? "bf16" : "fp16";
            float *X = rng_new_uniform(&r, (size_t)T * cols, -1, 1), *Y0 = rng_new_uniform(&r, (size_t)T * d, -1, 1);
            float *Y = malloc((size_t)T * d * 4), *Yr = malloc((size_t)T * d * 4), *XN = malloc((size_t)T * ldxn * 4);
            float *SS = malloc((size_t)T * nss_cap * 4), *Z = malloc((size_t)T * rb * 4), *Zr = malloc((size_t)T * rb * 4);
            float *H = malloc((size_t)T * ff * 4), *G = malloc((size_t)T * 2 * ff * 4);
            void *dX = pa_dev_alloc((size_t)T * cols * 2), *dXN = pa_dev_alloc((size_t)T * ldxn * 2), *dH = pa_dev_alloc((size_t)T * ff * 2);
            float *dY = pa_dev_alloc((size_t)T * d * 4), *dYr = pa_dev_alloc((size_t)T * d * 4), *dSS = pa_dev_alloc((size_t)T * nss_cap * 4);
            float *dZ = pa_dev_alloc((size_t)T * rb * 4), *dZr = pa_dev_alloc((size_t)T * rb * 4), *dG = pa_dev_alloc((size_t)T * 2 * ff * 4);
            pa_upload_as(dt, dX, X, (size_t)T * cols);
            pa_upload(dY, Y0, (size_t)T * d * 4), pa_upload(dYr, Y0, (size_t)T * d * 4);
            QGemmNorm out = {dnw, dXN, ldxn, dSS, 0, NULL, 0, 0, 0.0f};
            const int rc = qlinear_gpu_gemm_norm(qa, dt, T, dX, cols, dY, d, 1.0f, &out, NULL);
            cr_assert_eq(pa_sync(), 0, "%s", wa);
            if (!want) {
                cr_expect_eq(rc, 0, "%s T %d: %d, want 0 (no k_qtmat here)", wa, T, rc);
            } else {
                cr_assert_eq(rc, 1, "%s T %d %s: output side not taken (%d)", wa, T, dn, rc);
                const int nss = out.nss_out;
                cr_assert(nss == (d + 15) / 16 || nss == (d + 255) / 256, "%s T %d: %d partials", wa, T, nss);
                cr_assert_eq(qlinear_gpu_gemm(qa, dt, T, dX, cols, dYr, d, 1.0f, NULL), 0, "%s", wa);
                cr_assert_eq(pa_sync(), 0, "%s", wa);
                pa_download(Y, dY, (size_t)T * d * 4), pa_download(Yr, dYr, (size_t)T * d * 4);
                pa_download_f32(dt, XN, dXN, (size_t)T * ldxn), pa_download(SS, dSS, (size_t)T * nss * 4);
                int ydiff = 0, xbad = 0, sbad = 0;
                for (int t = 0; t < T; t++) {
                    double sq = 0, got = 0;
                    for (int c = 0; c < d; c++) {
                        const float y = Y[(size_t)t * d + c];
                        float e = y * nw[c];
                        matmul_round_to_dtype(dt == ST_BF16 ? MM_BF16 : MM_F16, &e, 1);
                        ydiff += y != Yr[(size_t)t * d + c], xbad += XN[(size_t)t * ldxn + c] != e, sq += (double)y * y;
                    }
                    for (int p = 0; p < nss; p++) got += SS[(size_t)t * nss + p];
                    sbad += !(fabs(got - sq) <= 1e-5 * sq);
                }
                cr_expect_eq(ydiff, 0, "%s T %d %s: %d of Y's %d values differ from qlinear_gpu_gemm's", wa, T, dn, ydiff, T * d);
                cr_expect_eq(xbad, 0, "%s T %d %s: %d values of xn are not Y * nw rounded", wa, T, dn, xbad);
                cr_expect_eq(sbad, 0, "%s T %d %s: %d rows' partial sums of squares do not add up", wa, T, dn, sbad);
                // the input side: B's sums on xn scaled by r_t, C's SwiGLU of the scaled sums
                QGemmNorm in = {NULL, NULL, 0, NULL, 0, dSS, nss, d, eps};
                cr_assert_eq(qlinear_gpu_gemm_norm(qb, dt, T, dXN, ldxn, dZ, rb, 0.0f, &in, NULL), 1, "%s T %d: input side", wb, T);
                cr_assert_eq(qlinear_gpu_gemm(qb, dt, T, dXN, ldxn, dZr, rb, 0.0f, NULL), 0, "%s", wb);
                const int rcc = qlinear_gpu_gemm_swiglu_norm(qc, dt, T, dXN, ldxn, dH, ff, ff, &in, NULL);
                cr_assert_eq(qlinear_gpu_gemm(qc, dt, T, dXN, ldxn, dG, 2 * ff, 0.0f, NULL), 0, "%s", wc);
                cr_assert_eq(pa_sync(), 0, "%s", wb);
                pa_download(Z, dZ, (size_t)T * rb * 4), pa_download(Zr, dZr, (size_t)T * rb * 4);
                pa_download(G, dG, (size_t)T * 2 * ff * 4);
                int zbad = 0, hbad = 0;
                for (int t = 0; t < T; t++) {
                    double sq = 0, zmax = 0;
                    for (int p = 0; p < nss; p++) sq += SS[(size_t)t * nss + p];
                    const double rt = 1.0 / sqrt(sq / d + eps);
                    for (int j = 0; j < rb; j++) zmax = fmax(zmax, fabs(rt * Zr[(size_t)t * rb + j]));
                    for (int j = 0; j < rb; j++) zbad += !(fabs(Z[(size_t)t * rb + j] - rt * Zr[(size_t)t * rb + j]) <= 1e-5 * zmax + 1e-30);
                }
                if (T <= 4) {
                    cr_expect_eq(rcc, 0, "%s T %d: SwiGLU with the norm taken (%d), want 0", wc, T, rcc);
                } else {
                    cr_expect_eq(rcc, 1, "%s T %d: SwiGLU with the norm not taken (%d)", wc, T, rcc);
                    pa_download_f32(dt, H, dH, (size_t)T * ff);
                    const double ulp = dt == ST_BF16 ? 0x1p-7 : 0x1p-10;
                    for (int t = 0; t < T; t++) {
                        double sq = 0;
                        for (int p = 0; p < nss; p++) sq += SS[(size_t)t * nss + p];
                        const float rt = (float)(1.0 / sqrt(sq / d + eps));
                        for (int j = 0; j < ff; j++) {
                            const float g = rt * G[(size_t)t * 2 * ff + j], u = rt * G[(size_t)t * 2 * ff + ff + j];
                            float e = g / (1.0f + expf(-g)) * u;
                            matmul_round_to_dtype(dt == ST_BF16 ? MM_BF16 : MM_F16, &e, 1);
                            hbad += !(fabs((double)H[(size_t)t * ff + j] - e) <= 2 * ulp * fabs((double)e) + 1e-6);
                        }
                    }
                }
                // finished by hand, for a consumer that refuses: xn * r_t in place
                void *dXF = pa_dev_alloc((size_t)T * ldxn * 2);
                float *XF = malloc((size_t)T * ldxn * 4);
                pa_upload_as(dt, dXF, XN, (size_t)T * ldxn);
                cr_assert_eq(qlinear_gpu_norm_finish(dt, T, dXF, ldxn, &in, NULL), 0, "%s T %d: norm_finish", wa, T);
                cr_assert_eq(pa_sync(), 0, "%s", wa);
                pa_download_f32(dt, XF, dXF, (size_t)T * ldxn);
                int fbad = 0;
                const double fulp = dt == ST_BF16 ? 0x1p-7 : 0x1p-10;
                for (int t = 0; t < T; t++) {
                    double sq = 0;
                    for (int p = 0; p < nss; p++) sq += SS[(size_t)t * nss + p];
                    const double rt = 1.0 / sqrt(sq / d + eps);
                    for (int c = 0; c < d; c++) {
                        const double e = rt * XN[(size_t)t * ldxn + c];
                        fbad += !(fabs(XF[(size_t)t * ldxn + c] - e) <= fulp * fabs(e) + 1e-30);
                    }
                }
                cr_expect_eq(fbad, 0, "%s T %d %s: %d values of xn finished by hand off xn * r_t", wa, T, dn, fbad);
                pa_dev_free(dXF), free(XF);
                cr_expect_eq(zbad, 0, "%s T %d %s: %d sums not r_t times qlinear_gpu_gemm's", wb, T, dn, zbad);
                cr_expect_eq(hbad, 0, "%s T %d %s: %d of h off silu(r g) * (r u)", wc, T, dn, hbad);
                // the input side where x is in column chunks (A's 9,536 columns at 16 rows): refused
                if (cols > 8192 && T == 16) {
                    QGemmNorm in2 = {NULL, NULL, 0, NULL, 0, dSS, nss, cols, eps};
                    cr_expect_eq(qlinear_gpu_gemm_norm(qa, dt, T, dX, cols, dY, d, 0.0f, &in2, NULL), 0,
                                 "%s: input side taken with x in chunks", wa);
                }
            }
            void *ps[] = {dX, dXN, dH, dY, dYr, dSS, dZ, dZr, dG};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) pa_dev_free(ps[i]);
            free(X), free(Y0), free(Y), free(Yr), free(XN), free(SS), free(Z), free(Zr), free(H), free(G);
        }
        // bad arguments
        void *dX = pa_dev_alloc((size_t)2 * cols * 2), *dXN = pa_dev_alloc((size_t)2 * ldxn * 2);
        float *dY = pa_dev_alloc((size_t)2 * d * 4), *dSS = pa_dev_alloc((size_t)2 * nss_cap * 4);
        QGemmNorm none = {0}, noxn = {dnw, NULL, ldxn, dSS, 0, NULL, 0, 0, 0.0f}, nocnt = {NULL, NULL, 0, NULL, 0, dSS, 0, d, eps};
        QGemmNorm both = {dnw, dXN, ldxn, dSS, 0, dSS, 1, d, eps};
        cr_expect_eq(qlinear_gpu_gemm_norm(qa, ST_BF16, 2, dX, cols, dY, d, 1.0f, NULL, NULL), -1, "no QGemmNorm");
        cr_expect_eq(qlinear_gpu_gemm_norm(qa, ST_BF16, 2, dX, cols, dY, d, 1.0f, &none, NULL), -1, "neither side");
        cr_expect_eq(qlinear_gpu_gemm_norm(qa, ST_BF16, 2, dX, cols, dY, d, 1.0f, &noxn, NULL), -1, "output side without xn");
        cr_expect_eq(qlinear_gpu_gemm_norm(qa, ST_BF16, 2, dX, cols, dY, d, 1.0f, &nocnt, NULL), -1, "input side without partials");
        cr_expect_eq(qlinear_gpu_gemm_norm(qa, ST_F32, 2, dX, cols, dY, d, 1.0f, &none, NULL), -1, "fp32 X");
        cr_expect_eq(qlinear_gpu_gemm_swiglu_norm(qc, ST_BF16, 9, dXN, ldxn, dY, ff, ff, &both, NULL), -1, "SwiGLU with an output side");
        cr_expect_eq(qlinear_gpu_norm_finish(ST_BF16, 2, dXN, ldxn, NULL, NULL), -1, "norm_finish without QGemmNorm");
        cr_expect_eq(qlinear_gpu_norm_finish(ST_BF16, 2, dXN, ldxn, &nocnt, NULL), -1, "norm_finish without partials");
        cr_expect_eq(qlinear_gpu_norm_finish(ST_F32, 2, dXN, ldxn, &both, NULL), -1, "norm_finish on fp32");
        cr_expect_eq(qlinear_gpu_gemm_norm(qa, ST_BF16, 17, dX, cols, dY, d, 1.0f, &both, NULL) < 1, 1, "17 rows taken");
        cr_expect_eq(pa_sync(), 0);
        pa_dev_free(dX), pa_dev_free(dXN), pa_dev_free(dY), pa_dev_free(dSS), pa_dev_free(dnw);
        free(nw);
        qlinear_gpu_free(qa), qlinear_gpu_free(qb), qlinear_gpu_free(qc);
        for (int i = 0; i < 3; i++) qweight_free(&w[i]);
    }
}

Test(step06_gpu, bad_arguments_refused) {
    NEED_GPU();
    Rng r;
    rng_seed(&r, 614);
    const QCase c = {QK_INT4, 64, 256, 128, 1, 0};
    QWeight w;
    make_qweight(&r, &c, &w);
    QLinearGpu *q = make_layer(&w, "small");
    void *dX = pa_dev_alloc(4 * 256 * 2);
    float *dY = pa_dev_alloc(4 * 64 * 4);
    cr_expect_eq(qlinear_gpu_gemm(q, ST_F32, 4, dX, 256, dY, 64, 0.0f, NULL), -1, "fp32 X must be refused");
    cr_expect_eq(qlinear_gpu_gemm(q, ST_BF16, -1, dX, 256, dY, 64, 0.0f, NULL), -1, "T < 0 must be refused");
    cr_expect_eq(qlinear_gpu_gemm(q, ST_BF16, 0, dX, 256, dY, 64, 0.0f, NULL), 0, "T = 0 is a no-op");
    cr_expect_eq(pa_sync(), 0);
    pa_dev_free(dX), pa_dev_free(dY);
    qlinear_gpu_free(q);
    QWeight bad = w;
    bad.scales = NULL;
    char err[256] = "";
    cr_expect_null(qlinear_gpu_new(&bad, err, sizeof err), "a QWeight without scales must be refused");
    cr_expect(strlen(err) > 0, "the refusal must say why");
    qweight_free(&w);
}
