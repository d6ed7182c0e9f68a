// test_step06_quant.c — step06's quantized layout and quantizers (step06_quant/quant.h), on the CPU.
//
// Pack/unpack: random integers written with qweight_set in a random order read back with
// qweight_get and checked byte by byte against the documented layout (INT8 one byte, INT4 two a
// byte with the even column low), odd row counts, sym and asym, with a g_idx; qweight_dequant
// against (q - z) * s computed here. qweight_scales_fp16 against fp16 values worked out by hand
// (rounding, ties, subnormals, the clamp at 65504), and qweight_random's scales are fp16 values. RTN: scales and zeros against the documented formulas, and
// every element's error no larger than the best integer's (brute force over 0 .. 2^bits - 1 given
// the same s, z). linear_q_cpu equals linear_cpu on qweight_dequant's matrix (and a double sum
// here) on odd shapes. GPTQ: the Hessian accumulator against 2/N X^T X summed here; a diagonal
// Hessian (no correlation to exploit) gives exactly RTN's integers; on correlated calibration data
// X = Z A (random mixing A, uneven input scales) and W with outliers, the layer output error
// ||X W^T - X Wq^T|| is clearly below RTN's for INT4 sym/asym (with and without act-order) and
// INT8; act-order sets a g_idx with `group` columns per group; a Hessian that is not positive
// definite is refused with a message. The quantize program's --json summary: stdout is one JSON
// object; its quantized-weight bytes equal the GPTQ v1 tensor sizes computed here from the
// model's shapes; its KL, p99 and top-1 are the numbers of the text table of the same run without
// --json; INT8's KL is below INT4's.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_util.h"
#include "model.h"
#include "rng.h"
#include "step02_attention/forward.h"
#include "step06_quant/quant.h"

static int rand_int(Rng *r, int n) { return (int)(rng_u32(r) % (uint32_t)n); }

// ---------------------------------------------------------------- pack / unpack
static void check_pack(QuantKind kind, int rows, int cols, int group, int sym, int with_gidx, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    QWeight w;
    cr_assert_eq(qweight_alloc(&w, kind, rows, cols, group, sym), 0);
    cr_assert_eq(w.n_groups, cols / group);
    cr_assert_eq(sym ? w.zeros == NULL : w.zeros != NULL, 1);
    int maxq = (1 << (int)kind) - 1;
    int *shadow = malloc((size_t)rows * cols * sizeof(int));
    int *order = malloc((size_t)rows * cols * sizeof(int));
    for (int i = 0; i < rows * cols; i++) order[i] = i;
    for (int i = rows * cols - 1; i > 0; i--) {  // a random order, so a write clobbering a neighbour shows
        int j = rand_int(&rng, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < rows * cols; i++) {
        int q = rand_int(&rng, maxq + 1);
        if (i < 4) q = i % 2 ? maxq : 0;  // the extremes too
        shadow[order[i]] = q;
        qweight_set(&w, order[i] / cols, order[i] % cols, q);
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) cr_assert_eq(qweight_get(&w, r, c), shadow[r * cols + c], "(%d, %d)", r, c);
    // The bytes themselves, as quant.h documents them.
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            if (kind == QK_INT8)
                cr_assert_eq(w.q[(size_t)r * cols + c], shadow[r * cols + c]);
            else if (c % 2 == 0)
                cr_assert_eq(w.q[(size_t)r * (cols / 2) + c / 2],
                             shadow[r * cols + c] | (shadow[r * cols + c + 1] << 4), "byte of (%d, %d)", r, c);
        }
    if (with_gidx) {
        w.g_idx = malloc((size_t)cols * sizeof(int));
        for (int c = 0; c < cols; c++) w.g_idx[c] = rand_int(&rng, w.n_groups);
    }
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < w.n_groups; g++) {
            w.scales[(size_t)r * w.n_groups + g] = 0.01f + rng_uniform(&rng);
            if (!sym) w.zeros[(size_t)r * w.n_groups + g] = (uint8_t)rand_int(&rng, maxq + 1);
        }
    float *W = malloc((size_t)rows * cols * sizeof(float));
    qweight_dequant(&w, W);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            int g = with_gidx ? w.g_idx[c] : c / group;
            cr_assert_eq(qweight_group_of(&w, c), g);
            float z = sym ? (float)(1 << ((int)kind - 1)) : (float)w.zeros[(size_t)r * w.n_groups + g];
            cr_assert_float_eq(qweight_zero(&w, r, g), z, 0.0f);
            float want = ((float)shadow[r * cols + c] - z) * w.scales[(size_t)r * w.n_groups + g];
            cr_assert_eq(W[(size_t)r * cols + c], want, "dequant (%d, %d): %g vs %g", r, c, W[(size_t)r * cols + c],
                         want);
        }
    size_t qb = kind == QK_INT8 ? (size_t)rows * cols : (size_t)rows * cols / 2;
    size_t ng = (size_t)rows * w.n_groups;
    cr_assert_eq(qweight_bytes(&w), qb + 4 * ng + (sym ? 0 : ng) + (with_gidx ? 4 * (size_t)cols : 0));
    free(W);
    free(shadow);
    free(order);
    qweight_free(&w);
    cr_assert_null(w.q);
}

Test(step06, pack_unpack_round_trip) {
    int shapes[][3] = {{1, 2, 2}, {7, 256, 128}, {13, 96, 32}, {3, 10, 10}, {31, 384, 128}};
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int sym = 0; sym <= 1; sym++)
            for (int gi = 0; gi <= 1; gi++) {
                int rows = shapes[i][0], cols = shapes[i][1], group = shapes[i][2];
                check_pack(QK_INT4, rows, cols, group, sym, gi, seed++);
                check_pack(QK_INT8, rows, cols, group, sym, gi, seed++);
                check_pack(QK_INT8, rows, cols + 1, cols + 1, sym, gi, seed++);  // odd cols, per channel
            }
}

Test(step06, alloc_refuses_bad_sizes) {
    QWeight w;
    cr_assert_eq(qweight_alloc(&w, QK_INT4, 4, 129, 129, 1), -1, "INT4 needs an even cols");
    cr_assert_eq(qweight_alloc(&w, QK_INT4, 4, 256, 96, 1), -1, "group must divide cols");
    cr_assert_eq(qweight_alloc(&w, QK_INT8, 0, 256, 256, 1), -1);
    cr_assert_eq(qweight_alloc(&w, (QuantKind)3, 4, 256, 128, 1), -1);
    cr_assert_str_eq(quant_kind_name(QK_INT4), "int4");
    cr_assert_str_eq(quant_kind_name(QK_INT8), "int8");
}

// qweight_scales_fp16: each scale becomes the nearest fp16 value (ties to even), clamped to the
// largest finite one; the random layers' scales are fp16 values already.
Test(step06, scales_fp16_rounds_to_the_nearest_half_and_clamps) {
    QWeight w;
    cr_assert_eq(qweight_alloc(&w, QK_INT4, 1, 256, 32, 1), 0);  // 8 scales
    const float in[8] = {0.5f, 1.0f + 0x1p-12f, 1.0f + 0x1.8p-11f, 3.0f * 0x1p-7f + 0x1p-20f, 70000.0f, 65519.0f, 1e-9f, 1e-7f};
    // fp16 has 10 fraction bits: ulp(1) = 2^-10; 1 + 1.5 * 2^-11 is nearer 1 + 2^-10; the largest finite value
    // is 65504 (and 65519 still rounds to it); 1e-9 is below half the smallest subnormal 2^-24; 1e-7 ~ 1.68 * 2^-24
    const float want[8] = {0.5f, 1.0f, 1.0f + 0x1p-10f, 3.0f * 0x1p-7f, 65504.0f, 65504.0f, 0.0f, 0x1p-23f};
    memcpy(w.scales, in, sizeof in);
    qweight_scales_fp16(&w);
    for (int i = 0; i < 8; i++) cr_expect_eq(w.scales[i], want[i], "scale %d: %a -> %a, want %a", i, in[i], w.scales[i], want[i]);
    qweight_scales_fp16(&w);
    for (int i = 0; i < 8; i++) cr_expect_eq(w.scales[i], want[i], "scale %d: not a fixed point", i);
    qweight_free(&w);
    Rng r;
    rng_seed(&r, 11);
    cr_assert_eq(qweight_random(&w, &r, QK_INT4, 33, 256, 64, 0, 1), 0);
    for (int i = 0; i < 33 * 4; i++) cr_expect_eq(w.scales[i], (float)(_Float16)w.scales[i], "random scale %d is no fp16 value", i);
    qweight_free(&w);
}

// ---------------------------------------------------------------- RTN
// W (rows, cols) N(0, 1) with a few large outliers and one all-zero group.
static float *weights_with_outliers(Rng *rng, int rows, int cols) {
    float *W = rng_new_normal(rng, (size_t)rows * cols, 0.0f, 1.0f);
    for (int i = 0; i < rows * cols / 50 + 1; i++) W[rand_int(rng, rows * cols)] *= 8.0f;
    for (int r = 0; r < rows; r++) W[(size_t)r * cols + rand_int(rng, cols)] += 3.0f;  // skew some rows
    return W;
}

static void check_rtn(QuantKind kind, int rows, int cols, int group, int sym, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    float *W = weights_with_outliers(&rng, rows, cols);
    for (int c = 0; c < group; c++) W[c] = 0.0f;  // row 0, group 0: all zero
    QWeight w;
    cr_assert_eq(quant_rtn(W, rows, cols, kind, group, sym, &w), 0);
    float *D = malloc((size_t)rows * cols * sizeof(float));
    qweight_dequant(&w, D);
    int bits = (int)kind, maxq = (1 << bits) - 1;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < cols / group; g++) {
            const float *x = W + (size_t)r * cols + (size_t)g * group;
            float amax = 0, lo = 0, hi = 0;
            for (int c = 0; c < group; c++) {
                amax = fmaxf(amax, fabsf(x[c]));
                lo = fminf(lo, x[c]);
                hi = fmaxf(hi, x[c]);
            }
            float s = qweight_scale(&w, r, g), z = qweight_zero(&w, r, g);
            if (sym) {
                cr_assert_float_eq(z, (float)(1 << (bits - 1)), 0.0f);
                if (amax > 0) cr_assert_float_eq(s, amax / (float)((1 << (bits - 1)) - 1), 1e-6f * amax);
            } else if (hi > lo) {
                float se = (hi - lo) / (float)maxq;
                cr_assert_float_eq(s, se, 1e-6f * (hi - lo));
                cr_assert(fabsf(z - roundf(-lo / se)) <= 1.0f && z >= 0 && z <= maxq);
            }
            for (int c = 0; c < group; c++) {
                int col = g * group + c, q = qweight_get(&w, r, col);
                if (sym) cr_assert(q >= 1 && q <= maxq, "sym q %d outside 1..%d", q, maxq);
                float best = INFINITY;
                for (int t = 0; t <= maxq; t++) best = fminf(best, fabsf(((float)t - z) * s - x[c]));
                float got = fabsf(D[(size_t)r * cols + col] - x[c]);
                cr_assert(got <= best + 1e-5f * s + 1e-6f * fabsf(x[c]), "(%d, %d): error %g, best integer's %g (s %g z %g)", r, col, got,
                          best, s, z);
                if (amax == 0) cr_assert_eq(D[(size_t)r * cols + col], 0.0f);
            }
        }
    free(D);
    free(W);
    qweight_free(&w);
}

Test(step06, rtn_matches_brute_force) {
    uint64_t seed = 100;
    for (int sym = 0; sym <= 1; sym++) {
        check_rtn(QK_INT4, 5, 256, 128, sym, seed++);
        check_rtn(QK_INT4, 9, 96, 32, sym, seed++);
        check_rtn(QK_INT4, 1, 2, 2, sym, seed++);
        check_rtn(QK_INT8, 7, 200, 200, sym, seed++);
        check_rtn(QK_INT8, 3, 129, 129, sym, seed++);
    }
}

// ---------------------------------------------------------------- the reference linear
Test(step06, linear_q_equals_linear_on_dequant) {
    int shapes[][4] = {{1, 7, 64, 32}, {3, 33, 96, 96}, {17, 5, 256, 128}, {2, 65, 130, 130}};  // T, rows, cols, group
    uint64_t seed = 7;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int k = 0; k < 2; k++)
            for (int gi = 0; gi <= 1; gi++) {
                int T = shapes[i][0], rows = shapes[i][1], cols = shapes[i][2], group = shapes[i][3];
                QuantKind kind = k ? QK_INT8 : QK_INT4;
                Rng rng;
                rng_seed(&rng, seed++);
                float *W = weights_with_outliers(&rng, rows, cols);
                float *X = rng_new_normal(&rng, (size_t)T * cols, 0.0f, 1.0f);
                float *b = rng_new_normal(&rng, (size_t)rows, 0.0f, 0.1f);
                QWeight w;
                cr_assert_eq(quant_rtn(W, rows, cols, kind, group, gi, &w), 0);
                if (gi) {  // a g_idx: groups of columns in a shuffled order
                    w.g_idx = malloc((size_t)cols * sizeof(int));
                    for (int c = 0; c < cols; c++) w.g_idx[c] = rand_int(&rng, w.n_groups);
                }
                float *D = malloc((size_t)rows * cols * sizeof(float));
                float *Y = malloc((size_t)T * rows * sizeof(float)), *Yr = malloc((size_t)T * rows * sizeof(float));
                qweight_dequant(&w, D);
                linear_q_cpu(X, &w, gi ? NULL : b, T, Y);
                linear_cpu(X, D, gi ? NULL : b, T, cols, rows, Yr);
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < rows; r++) {
                        double acc = gi ? 0.0 : b[r], mag = gi ? 0.0 : fabs(b[r]);
                        for (int c = 0; c < cols; c++) {
                            acc += (double)X[(size_t)t * cols + c] * D[(size_t)r * cols + c];
                            mag += fabs((double)X[(size_t)t * cols + c] * D[(size_t)r * cols + c]);
                        }
                        float y = Y[(size_t)t * rows + r];
                        cr_assert(fabs(y - acc) <= 1e-6 * mag + 1e-7, "(%d, %d) vs double: %g vs %g", t, r, y, acc);
                        cr_assert(fabs(y - Yr[(size_t)t * rows + r]) <= 2e-6 * mag + 1e-7,
                                  "(%d, %d) vs linear_cpu: %g vs %g", t, r, y, Yr[(size_t)t * rows + r]);
                    }
                free(D);
                free(Y);
                free(Yr);
                free(W);
                free(X);
                free(b);
                qweight_free(&w);
            }
}

// ---------------------------------------------------------------- GPTQ
Test(step06, gptq_hessian_is_2_over_n_xtx) {
    Rng rng;
    rng_seed(&rng, 3);
    int cols = 11, n1 = 5, n2 = 8;
    float *X = rng_new_normal(&rng, (size_t)(n1 + n2) * cols, 0.0f, 1.0f);
    double *H = calloc((size_t)cols * cols, sizeof(double));
    long n = 0;
    gptq_hessian_add(H, &n, X, n1, cols);
    gptq_hessian_add(H, &n, X + (size_t)n1 * cols, n2, cols);
    cr_assert_eq(n, n1 + n2);
    for (int a = 0; a < cols; a++)
        for (int b = 0; b < cols; b++) {
            double s = 0;
            for (int i = 0; i < n1 + n2; i++) s += (double)X[(size_t)i * cols + a] * X[(size_t)i * cols + b];
            s *= 2.0 / (n1 + n2);
            cr_assert(fabs(H[(size_t)a * cols + b] - s) <= 1e-12 * (1 + fabs(s)), "H[%d][%d] %g vs %g", a, b,
                      H[(size_t)a * cols + b], s);
        }
    free(X);
    free(H);
}

Test(step06, gptq_with_diagonal_hessian_is_rtn) {
    // Nothing correlated: the inverse Hessian's factor is diagonal, no error is fed forward.
    Rng rng;
    rng_seed(&rng, 5);
    int rows = 9, cols = 256;
    float *W = weights_with_outliers(&rng, rows, cols);
    double *H = calloc((size_t)cols * cols, sizeof(double));
    for (int i = 0; i < cols; i++) H[(size_t)i * cols + i] = 0.5 + rng_uniform(&rng);
    for (int k = 0; k < 2; k++)
        for (int sym = 0; sym <= 1; sym++) {
            QuantKind kind = k ? QK_INT8 : QK_INT4;
            int group = k ? cols : 128;
            QWeight a, b;
            char err[256];
            GptqOpts o = {0.01f, 64, 0};
            cr_assert_eq(quant_gptq(W, rows, cols, H, 100, kind, group, sym, &o, &a, err, sizeof err), 0, "%s", err);
            cr_assert_eq(quant_rtn(W, rows, cols, kind, group, sym, &b), 0);
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) cr_assert_eq(qweight_get(&a, r, c), qweight_get(&b, r, c));
            qweight_free(&a);
            qweight_free(&b);
        }
    free(W);
    free(H);
}

// ||X W^T - X D^T||_F, D (rows, cols) a dequantized W.
static double layer_error(const float *X, int N, const float *W, const float *D, int rows, int cols) {
    float *E = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) E[i] = W[i] - D[i];
    float *Y = malloc((size_t)N * rows * sizeof(float));
    linear_cpu(X, E, NULL, N, cols, rows, Y);
    double s = 0;
    for (size_t i = 0; i < (size_t)N * rows; i++) s += (double)Y[i] * Y[i];
    free(E);
    free(Y);
    return sqrt(s);
}

Test(step06, gptq_layer_error_below_rtn) {
    Rng rng;
    rng_seed(&rng, 11);
    int rows = 48, cols = 256, N = 1024;
    float *W = weights_with_outliers(&rng, rows, cols);
    // Correlated inputs with uneven channel scales: X = Z A, A a random mixing matrix whose columns
    // are scaled by 0.1 .. 3 (a few input channels much louder than the rest, as in LLMs).
    float *Z = rng_new_normal(&rng, (size_t)N * cols, 0.0f, 1.0f);
    float *A = rng_new_normal(&rng, (size_t)cols * cols, 0.0f, 1.0f / sqrtf((float)cols));
    for (int j = 0; j < cols; j++) {
        float sc = j % 17 == 0 ? 3.0f : 0.1f + rng_uniform(&rng);
        for (int i = 0; i < cols; i++) A[(size_t)i * cols + j] *= sc;
    }
    for (int i = 0; i < cols; i++) A[(size_t)i * cols + i] += 0.3f;
    float *X = malloc((size_t)N * cols * sizeof(float));
    float *At = malloc((size_t)cols * cols * sizeof(float));
    for (int i = 0; i < cols; i++)
        for (int j = 0; j < cols; j++) At[(size_t)j * cols + i] = A[(size_t)i * cols + j];
    linear_cpu(Z, At, NULL, N, cols, cols, X);  // X = Z A
    double *H = calloc((size_t)cols * cols, sizeof(double));
    long n = 0;
    for (int i = 0; i < N; i += 300) gptq_hessian_add(H, &n, X + (size_t)i * cols, i + 300 <= N ? 300 : N - i, cols);
    float *D = malloc((size_t)rows * cols * sizeof(float));
    struct {
        QuantKind kind;
        int group, sym, act, block;
    } cases[] = {{QK_INT4, 128, 1, 0, 128}, {QK_INT4, 128, 0, 0, 128}, {QK_INT4, 128, 1, 1, 128},
                 {QK_INT4, 128, 0, 1, 32},  {QK_INT4, 64, 1, 0, 48},   {QK_INT8, 256, 1, 0, 128},
                 {QK_INT8, 256, 1, 1, 100}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        QWeight r, g;
        char err[256];
        GptqOpts o = {0.01f, cases[i].block, cases[i].act};
        cr_assert_eq(quant_rtn(W, rows, cols, cases[i].kind, cases[i].group, cases[i].sym, &r), 0);
        cr_assert_eq(quant_gptq(W, rows, cols, H, n, cases[i].kind, cases[i].group, cases[i].sym, &o, &g, err,
                                sizeof err),
                     0, "%s", err);
        qweight_dequant(&r, D);
        double e_rtn = layer_error(X, N, W, D, rows, cols);
        qweight_dequant(&g, D);
        double e_gptq = layer_error(X, N, W, D, rows, cols);
        cr_log_info("%s group %d %s act-order %d block %d: ||XW^T - XWq^T|| RTN %.4g GPTQ %.4g (ratio %.3f)",
                    quant_kind_name(cases[i].kind), cases[i].group, cases[i].sym ? "sym" : "asym", cases[i].act,
                    cases[i].block, e_rtn, e_gptq, e_gptq / e_rtn);
        cr_assert(e_gptq < 0.8 * e_rtn, "case %zu: GPTQ's error %g not clearly below RTN's %g", i, e_gptq, e_rtn);
        if (cases[i].act) {  // g_idx: every group holds exactly `group` columns
            cr_assert_not_null(g.g_idx);
            int *cnt = calloc((size_t)g.n_groups, sizeof(int));
            for (int c = 0; c < cols; c++) {
                cr_assert(g.g_idx[c] >= 0 && g.g_idx[c] < g.n_groups);
                cnt[g.g_idx[c]]++;
            }
            for (int k = 0; k < g.n_groups; k++) cr_assert_eq(cnt[k], cases[i].group);
            free(cnt);
        } else {
            cr_assert_null(g.g_idx);
        }
        qweight_free(&r);
        qweight_free(&g);
    }
    free(W);
    free(Z);
    free(A);
    free(At);
    free(X);
    free(H);
    free(D);
}

Test(step06, gptq_refuses_non_positive_definite) {
    int cols = 8, rows = 3;
    float W[3 * 8];
    for (int i = 0; i < rows * cols; i++) W[i] = (float)(i % 5) - 2.0f;
    double H[8 * 8] = {0};
    for (int i = 0; i < cols; i++) H[i * cols + i] = 1.0;
    H[0 * cols + 1] = H[1 * cols + 0] = 3.0;  // [[1, 3], [3, 1]]: eigenvalue -2, damping 0.01 cannot fix it
    QWeight q;
    char err[256] = "";
    GptqOpts o = {0.01f, 4, 0};
    cr_assert_eq(quant_gptq(W, rows, cols, H, 10, QK_INT4, 8, 1, &o, &q, err, sizeof err), -1);
    cr_assert(strstr(err, "not positive definite") != NULL, "message: %s", err);
    cr_assert_null(q.q);
    err[0] = 0;
    cr_assert_eq(quant_gptq(W, rows, cols, H, 0, QK_INT4, 8, 1, &o, &q, err, sizeof err), -1);
    cr_assert(strstr(err, "calibration") != NULL, "message: %s", err);
    err[0] = 0;
    H[1] = H[8] = 0.0;  // now positive definite, but a bad group
    cr_assert_eq(quant_gptq(W, rows, cols, H, 10, QK_INT4, 3, 1, &o, &q, err, sizeof err), -1);
    cr_assert(strstr(err, "bad sizes") != NULL, "message: %s", err);
    cr_assert_eq(quant_gptq(W, rows, cols, H, 10, QK_INT4, 8, 1, &o, &q, err, sizeof err), 0, "%s", err);
    qweight_free(&q);
}

// ---------------------------------------------------------------- quantize --json
// Runs a shell command; its exit code, and (up to 1 MiB of) its stdout in *out (caller frees).
static int run_cmd(const char *cmd, char **out) {
    *out = calloc(1, 1 << 20);
    return test_run_cmd(cmd, *out, 1 << 20);
}

static double jnum(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "\"%s\" missing or not a number", key);
    return json_number_value(v);
}

#define Q_MODEL "tests/data/models/llama3_tied_rope_f32"
#define Q_ARGS "--model " Q_MODEL " --group -1 --calib-tokens 256 --seq-len 64 --eval-tokens 256"

// quantize's --json for one method; the same run's text table (without --json) gives kl/p99/top1.
static json_t *quantize_json(const char *dir, const char *method, const char *extra, double table[3]) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/quantize " Q_ARGS " --method %s %s --out %s/q --json 2>/dev/null",
             BUILD_BIN_DIR, method, extra, dir);
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed", cmd);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);  // the whole of stdout: nothing but the JSON object
    cr_assert(json_is_object(j), "%s: stdout is not one JSON object: %s\n%s", method, je.text, out);
    free(out);
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/quantize " Q_ARGS " --method %s %s --out %s/t 2>/dev/null | tail -n 1",
             BUILD_BIN_DIR, method, extra, dir);
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed", cmd);
    // "| method | group | sym | KL mean | KL p99 | top-1 agreement |"
    char *cell = out;
    for (int k = 0; k < 3; k++) {  // to the bar before KL mean
        cell = strchr(cell + 1, '|');
        cr_assert(cell, "%s: no table row in: %s", method, out);
    }
    cr_assert_eq(sscanf(cell, "| %lf | %lf | %lf |", &table[0], &table[1], &table[2]), 3, "%s: table row: %s", method,
                 out);
    free(out);
    return j;
}

Test(step06, quantize_json_summary, .timeout = 300) {
    ModelWeights mw;
    char err[512], dir[64];
    cr_assert_eq(model_load(Q_MODEL, &mw, err, sizeof err), 0, "%s", err);
    const ModelConfig *c = &mw.cfg;
    const int qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    const int shape[7][2] = {{qd, c->hidden}, {kd, c->hidden}, {kd, c->hidden}, {c->hidden, qd},
                             {c->intermediate, c->hidden}, {c->intermediate, c->hidden}, {c->hidden, c->intermediate}};
    test_mkdtemp(dir, sizeof dir, "step06_qjson");
    struct {
        const char *method, *extra;
        int bits, sym, gptq;
    } runs[] = {{"rtn-int8", "", 8, 1, 0}, {"rtn-int4", "", 4, 1, 0}, {"gptq-int4", "--asym", 4, 0, 1}};
    double kl[3];
    for (int r = 0; r < 3; r++) {
        double table[3];
        json_t *j = quantize_json(dir, runs[r].method, runs[r].extra, table);
        cr_expect_str_eq(json_string_value(json_object_get(j, "method")), runs[r].method);
        cr_expect_eq(jnum(j, "bits"), runs[r].bits);
        cr_expect_eq(jnum(j, "group"), -1);
        cr_expect_eq(json_is_true(json_object_get(j, "sym")), runs[r].sym, "%s: sym", runs[r].method);
        // GPTQ v1 per linear (R out x C in, one group per row): qweight C*R*bits/8, qzeros R*bits/8,
        // fp16 scales 2R, int32 g_idx 4C
        long n = 0, ck = 0;
        for (int i = 0; i < 7; i++) {
            const long R = shape[i][0], C = shape[i][1];
            n += R * C;
            ck += C * R * runs[r].bits / 8 + R * runs[r].bits / 8 + 2 * R + 4 * C;
        }
        n *= c->n_layers, ck *= c->n_layers;
        const json_t *w = json_object_get(j, "weights");
        cr_assert(json_is_object(w));
        cr_expect_eq((long)jnum(w, "n_weights"), n, "%s: n_weights", runs[r].method);
        cr_expect_eq((long)jnum(w, "fp32_bytes"), 4 * n);
        cr_expect_eq((long)jnum(w, "bf16_bytes"), 2 * n);
        cr_expect_eq((long)jnum(w, "checkpoint_bytes"), ck, "%s: checkpoint bytes %ld, want %ld", runs[r].method,
                     (long)jnum(w, "checkpoint_bytes"), ck);
        cr_expect(fabs(jnum(w, "checkpoint_bytes_per_weight") - (double)ck / n) < 1e-9);
        const double bpw = jnum(w, "engine_bytes_per_weight");
        cr_expect(bpw > runs[r].bits / 8.0 && bpw < runs[r].bits / 8.0 + 0.2, "%s: engine bytes/weight %g",
                  runs[r].method, bpw);
        const json_t *lin = json_object_get(j, "linears");
        cr_assert(json_is_array(lin));
        cr_expect_eq((int)json_array_size(lin), 7 * c->n_layers);
        for (size_t i = 0; i < json_array_size(lin); i++) {
            const json_t *l = json_array_get(lin, i);
            cr_expect_eq(jnum(l, "rows"), shape[i % 7][0]);
            cr_expect_eq(jnum(l, "cols"), shape[i % 7][1]);
            if (runs[r].gptq) {
                const double g = jnum(l, "gptq_rel_err"), t = jnum(l, "rtn_rel_err");
                cr_expect(g > 0 && g < 1 && t > 0 && t < 1, "linear %zu: errors %g %g", i, g, t);
            } else {
                cr_expect(json_is_null(json_object_get(l, "gptq_rel_err")), "RTN: no GPTQ error");
            }
        }
        const json_t *ev = json_object_get(j, "eval");
        cr_assert(json_is_object(ev));
        cr_expect_eq(jnum(ev, "tokens"), 256);
        // the table prints 3 / 3 / 4 significant digits
        cr_expect(fabs(jnum(ev, "kl_mean") - table[0]) <= 5e-3 * table[0], "%s: KL %g vs table %g", runs[r].method,
                  jnum(ev, "kl_mean"), table[0]);
        cr_expect(fabs(jnum(ev, "kl_p99") - table[1]) <= 5e-3 * table[1]);
        cr_expect(fabs(jnum(ev, "top1_agreement") - table[2]) <= 5e-5);
        cr_expect(jnum(ev, "kl_mean") > 0 && jnum(ev, "kl_p99") >= jnum(ev, "kl_mean"));
        kl[r] = jnum(ev, "kl_mean");
        json_decref(j);
    }
    cr_expect(kl[0] < 0.1 * kl[1], "INT8 KL %g should be far below INT4's %g", kl[0], kl[1]);
    test_rmtree(dir);
    model_free(&mw);
}
