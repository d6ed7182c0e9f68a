// test_step07_kernels.c — step07's fused kernels (step07_kernels/fused.h).
//
// step07 (CPU, always run): the fp32 references of fused_cpu.c against naive computations written
// here (rounding by frexp/nearbyint instead of bit tricks, RoPE as a complex product in double,
// sums in long double), on odd shapes (hidden 1, 7, 1000, 2048, 4099; T 1, 3, 65); the rounding
// helper on hand-checked ties; cases where HF's rounding order gives a different answer from a
// single rounding, so the reference is shown to round where transformers rounds; padding slots.
// step07_gpu (skips without a CUDA device): every version of every ladder against the CPU
// reference on the same odd shapes and dtypes, outputs poisoned with NaN before each run, the
// residual exact, unaligned pointers (the scalar path of the vector kernels), rows beyond the
// persistent grid (v3), rows longer than the register tiles (the v1 fallback), padding rows'
// cache rows untouched, bad arguments refused.
#include <complex.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "gpu.h"
#include "rng.h"
#include "step05_paged/paged_attention.h"  // pa_dev_alloc, pa_upload_as, pa_download_f32
#include "step07_kernels/fused.h"

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

// ---------------------------------------------------------------- naive helpers (independent of fused_cpu.c)

// x rounded to `bits` significant bits (bf16 8, fp16 11), ties to even (nearbyint in the default
// rounding mode); fp16's subnormals (below 2^-14) on the fixed 2^-24 grid.
static double naive_round(StDtype dt, double x) {
    if (dt == ST_F32) return (float)x;
    if (x == 0) return x;
    const int bits = dt == ST_BF16 ? 8 : 11;
    int e;
    frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1)
    if (dt == ST_F16 && e < -13) return nearbyint(x * 0x1p24) / 0x1p24;
    const double scale = ldexp(1.0, bits - e);
    return nearbyint(x * scale) / scale;
}
// One unit in the last place of dt at |x| (for "within one rounding step" comparisons).
static double ulp_of(StDtype dt, double x) {
    if (dt == ST_F32) return fabs(x) * 0x1p-23 + 1e-45;
    int e;
    frexp(x == 0 ? 1e-30 : x, &e);
    const int bits = dt == ST_BF16 ? 8 : 11;
    double u = ldexp(1.0, e - bits);
    if (dt == ST_F16 && u < 0x1p-24) u = 0x1p-24;
    return u;
}
static float *randu(Rng *g, size_t n, float lo, float hi, StDtype dt) {
    float *x = rng_new_uniform(g, n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = (float)naive_round(dt, x[i]);
    return x;
}
static const char *dname(StDtype d) { return d == ST_F32 ? "fp32" : d == ST_F16 ? "fp16" : "bf16"; }

static const int HIDDEN[] = {1, 7, 1000, 2048, 4096, 4099};
static const int ROWS[] = {1, 3, 65};
typedef struct {
    StDtype a, b;
} DtPair;  // (residual or input, output)
static const DtPair PAIRS[] = {{ST_BF16, ST_BF16}, {ST_F16, ST_F16}, {ST_F32, ST_F32}, {ST_F32, ST_BF16}};
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

// ---------------------------------------------------------------- step07: the CPU references

Test(step07, round_matches_hand_checked_ties) {
    // bf16 keeps 8 significant bits: the step at 1 is 2^-7
    cr_assert_eq(fused_round(ST_BF16, 1.0f + 0x1p-8f), 1.0f);               // tie -> even (1.0)
    cr_assert_eq(fused_round(ST_BF16, 1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);  // tie -> even (mantissa ..10)
    cr_assert_eq(fused_round(ST_BF16, 1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie
    cr_assert_eq(fused_round(ST_BF16, -3.0f), -3.0f);
    cr_assert(isinf(fused_round(ST_BF16, INFINITY)));
    cr_assert(isnan(fused_round(ST_BF16, NAN)));
    // fp16 keeps 11: the step at 1 is 2^-10; 65520 is past the largest fp16 (65504) -> inf
    cr_assert_eq(fused_round(ST_F16, 1.0f + 0x1p-11f), 1.0f);
    cr_assert_eq(fused_round(ST_F16, 1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
    cr_assert(isinf(fused_round(ST_F16, 65520.0f)));
    cr_assert_eq(fused_round(ST_F16, 0x1p-24f), 0x1p-24f);  // the smallest subnormal
    cr_assert_eq(fused_round(ST_F32, 1.0f + 0x1p-23f), 1.0f + 0x1p-23f);
    Rng g;
    rng_seed(&g, 5);
    for (int i = 0; i < 100000; i++) {
        const float x = (rng_uniform(&g) - 0.5f) * 64.0f;
        cr_assert_eq(fused_round(ST_BF16, x), (float)naive_round(ST_BF16, x), "bf16 of %a", x);
        cr_assert_eq(fused_round(ST_F16, x), (float)naive_round(ST_F16, x), "fp16 of %a", x);
    }
}

// naive add + RMSNorm in HF's order: s = round_R(x + r); inv from the rounded s (long double);
// out = round_O(w * round_R(s * inv)).
static void naive_addnorm(StDtype rdt, StDtype odt, const float *x, const float *r, const float *w, int T, int n,
                          double eps, double *res, double *out) {
    for (int t = 0; t < T; t++) {
        long double ss = 0;
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)t * n + i;
            res[k] = naive_round(rdt, (double)x[k] + (double)r[k]);
            ss += (long double)res[k] * res[k];
        }
        const double inv = (float)(1.0L / sqrtl(ss / n + eps));  // fp32, as fused.h specifies
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)t * n + i;
            out[k] = naive_round(odt, w[i] * naive_round(rdt, res[k] * inv));
        }
    }
}

Test(step07, add_rmsnorm_cpu_matches_naive_on_odd_shapes) {
    Rng g;
    rng_seed(&g, 7);
    for (int p = 0; p < N_OF(PAIRS); p++)
        for (int hi = 0; hi < N_OF(HIDDEN); hi++)
            for (int ti = 0; ti < N_OF(ROWS); ti++) {
                const StDtype rdt = PAIRS[p].a, odt = PAIRS[p].b;
                const int n = HIDDEN[hi], T = ROWS[ti];
                const size_t N = (size_t)T * n;
                float *x = randu(&g, N, -2, 2, rdt), *r = randu(&g, N, -2, 2, rdt), *w = randu(&g, n, 0.5f, 1.5f, ST_F32);
                float *out = malloc(N * 4);
                double *nres = malloc(N * 8), *nout = malloc(N * 8);
                naive_addnorm(rdt, odt, x, r, w, T, n, 1e-6, nres, nout);
                fused_add_rmsnorm_cpu(rdt, odt, x, r, w, T, n, 1e-6f, out);
                for (size_t k = 0; k < N; k++) {
                    cr_assert_eq((double)r[k], nres[k], "residual %s n=%d T=%d at %zu", dname(rdt), n, T, k);
                    // fp32 products here, double there: a value on a rounding boundary may land one step
                    // either side at each of the two roundings
                    cr_assert_leq(fabs(out[k] - nout[k]), ulp_of(odt, nout[k]) * 2.01 + 2 * ulp_of(ST_F32, nout[k]),
                                  "out %s>%s n=%d T=%d at %zu: %a vs %a", dname(rdt), dname(odt), n, T, k, out[k], nout[k]);
                }
                free(x), free(r), free(w), free(out), free(nres), free(nout);
            }
}

// HF rounds the sum to the residual dtype before the norm and the normalized value before the
// weight. With the same rounded sum and the same fp32 inv_rms as the reference (computed here the
// way fused.h specifies), the output must be exactly round(w * round(s * inv)) everywhere, and
// somewhere that must differ from a single rounding round(w * s * inv): so the test fails for a
// reference that rounds once, or adds without rounding.
Test(step07, add_rmsnorm_cpu_rounds_in_hf_order) {
    Rng g;
    rng_seed(&g, 11);
    const int n = 64;
    int found_out = 0, found_sum = 0;
    for (int trial = 0; trial < 50; trial++) {
        float *x = randu(&g, n, -2, 2, ST_BF16), *r = randu(&g, n, -2, 2, ST_BF16), *w = randu(&g, n, 0.5f, 1.5f, ST_BF16);
        float *res = malloc(n * 4), *out = malloc(n * 4), *s = malloc(n * 4);
        memcpy(res, r, n * 4);
        fused_add_rmsnorm_cpu(ST_BF16, ST_BF16, x, res, w, 1, n, 1e-6f, out);
        double ss = 0;
        for (int i = 0; i < n; i++) {
            const float sum = x[i] + r[i];
            s[i] = (float)naive_round(ST_BF16, sum);
            if (s[i] != sum) found_sum = 1;
            cr_assert_eq(res[i], s[i], "the residual holds round(x + r)");
            ss += (double)s[i] * s[i];
        }
        const float inv = (float)(1.0 / sqrt(ss / n + 1e-6f));
        for (int i = 0; i < n; i++) {
            const float y = s[i] * inv;
            const float hf = (float)naive_round(ST_BF16, w[i] * (float)naive_round(ST_BF16, y));
            const float once = (float)naive_round(ST_BF16, w[i] * y);
            cr_assert_eq(out[i], hf, "trial %d elem %d: %a, transformers' order gives %a (single rounding %a)", trial, i,
                         out[i], hf, once);
            if (hf != once) found_out = 1;
        }
        free(x), free(r), free(w), free(res), free(out), free(s);
    }
    cr_assert(found_sum, "no sum needed rounding: the test does not discriminate");
    cr_assert(found_out, "HF's order never differed from a single rounding: the test does not discriminate");
    // and one exact case: 1 + 2^-9 is below half a bf16 step at 1, so the residual stays exactly 1
    float x1[2] = {0x1p-9f, 0}, r1[2] = {1.0f, 1.0f}, w1[2] = {1, 1}, o1[2];
    fused_add_rmsnorm_cpu(ST_BF16, ST_BF16, x1, r1, w1, 1, 2, 0.0f, o1);
    cr_assert_eq(r1[0], 1.0f);
    cr_assert_eq(o1[0], 1.0f);  // s = (1, 1): rms 1, out = w
    cr_assert_eq(o1[1], 1.0f);
    // fp32 residual: no inner rounding (the engine's k_rmsnorm: out = round_O(s * inv * w))
    float x2[1] = {3.0f}, r2[1] = {1.0f}, w2[1] = {0.75f}, o2[1];
    fused_add_rmsnorm_cpu(ST_F32, ST_BF16, x2, r2, w2, 1, 1, 0.0f, o2);
    cr_assert_eq(r2[0], 4.0f);
    cr_assert_eq(o2[0], 0.75f);
}

static double naive_silu(double g) { return g / (1 + exp(-g)); }

Test(step07, swiglu_cpu_matches_naive_and_rounds_silu_first) {
    Rng g;
    rng_seed(&g, 13);
    int differs = 0;
    for (int p = 0; p < N_OF(PAIRS); p++)
        for (int hi = 0; hi < N_OF(HIDDEN); hi++)
            for (int ti = 0; ti < N_OF(ROWS); ti++) {
                const StDtype idt = PAIRS[p].a, odt = PAIRS[p].b;
                const int ff = HIDDEN[hi], T = ROWS[ti];
                float *gu = randu(&g, (size_t)T * 2 * ff, -8, 8, idt), *h = malloc((size_t)T * ff * 4);
                fused_swiglu_cpu(idt, odt, gu, h, T, ff);
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < ff; j++) {
                        const double gv = gu[(size_t)t * 2 * ff + j], uv = gu[(size_t)t * 2 * ff + ff + j];
                        const double want = naive_round(odt, naive_round(idt, naive_silu(gv)) * uv);
                        const double got = h[(size_t)t * ff + j];
                        cr_assert_leq(fabs(got - want), ulp_of(odt, want) * 2.01 + 4 * ulp_of(ST_F32, want),
                                      "%s>%s ff=%d T=%d (%d,%d): %a vs %a", dname(idt), dname(odt), ff, T, t, j, got, want);
                        if (idt == ST_BF16 && naive_round(odt, naive_silu(gv) * uv) != got) differs = 1;
                    }
                free(gu), free(h);
            }
    cr_assert(differs, "rounding silu to bf16 first never mattered: the test does not discriminate");
}

// RoPE as a complex product in double: (x1 + i x2) * e^(i angle).
Test(step07, rope_kv_write_cpu_matches_complex_rotation_and_skips_padding) {
    Rng g;
    rng_seed(&g, 17);
    const int heads[][3] = {{4, 4, 64}, {8, 2, 128}, {3, 1, 2}, {6, 2, 10}};
    const StDtype cdts[] = {ST_F32, ST_BF16, ST_F16};
    for (int hc = 0; hc < N_OF(heads); hc++)
        for (int ci = 0; ci < N_OF(cdts); ci++)
            for (int ti = 0; ti < N_OF(ROWS); ti++) {
                const int H = heads[hc][0], KV = heads[hc][1], hd = heads[hc][2], half = hd / 2, T = ROWS[ti];
                const int ld = (H + 2 * KV) * hd, kd = KV * hd, pool = T + 4;
                const StDtype cdt = cdts[ci];
                float *qkv = rng_new_uniform(&g, (size_t)T * ld, -1, 1), *q0 = malloc((size_t)T * ld * 4);
                memcpy(q0, qkv, (size_t)T * ld * 4);
                float *ct = malloc((size_t)T * half * 4), *st = malloc((size_t)T * half * 4);
                double *ang = malloc((size_t)T * half * 8);
                for (int t = 0; t < T; t++)
                    for (int e = 0; e < half; e++) {
                        ang[(size_t)t * half + e] = (t * 37 % 1000) * pow(10000.0, -2.0 * e / hd);
                        ct[(size_t)t * half + e] = (float)cos(ang[(size_t)t * half + e]);
                        st[(size_t)t * half + e] = (float)sin(ang[(size_t)t * half + e]);
                    }
                int *sl = malloc((size_t)T * sizeof(int));
                for (int t = 0; t < T; t++) sl[t] = t % 3 == 1 ? -1 : (t * 5 + 2) % pool;  // distinct: 5 and pool coprime
                float *kc = malloc((size_t)pool * kd * 4), *vc = malloc((size_t)pool * kd * 4);
                for (size_t i = 0; i < (size_t)pool * kd; i++) kc[i] = vc[i] = -7.0f;
                fused_rope_kv_write_cpu(cdt, qkv, T, H, KV, hd, ct, st, sl, kc, vc);
                char *used = calloc((size_t)pool, 1);
                for (int t = 0; t < T; t++) {
                    if (sl[t] >= 0) used[sl[t]] = 1;
                    for (int h = 0; h < H + KV; h++)
                        for (int e = 0; e < half; e++) {
                            const float *src = q0 + (size_t)t * ld + (size_t)h * hd;
                            const double complex z = (src[e] + I * src[e + half]) * cexp(I * ang[(size_t)t * half + e]);
                            if (h < H) {
                                const float *q = qkv + (size_t)t * ld + (size_t)h * hd;
                                cr_assert_leq(fabs(q[e] - creal(z)) + fabs(q[e + half] - cimag(z)), 1e-6);
                            } else {
                                cr_assert_eq(memcmp(qkv + (size_t)t * ld + (size_t)h * hd, src, (size_t)hd * 4), 0,
                                             "k in qkv is not rewritten");
                                if (sl[t] < 0) continue;
                                const float *k = kc + (size_t)sl[t] * kd + (size_t)(h - H) * hd;
                                cr_assert_leq(fabs(k[e] - creal(z)), ulp_of(cdt, creal(z)) + 1e-6);
                                cr_assert_leq(fabs(k[e + half] - cimag(z)), ulp_of(cdt, cimag(z)) + 1e-6);
                            }
                        }
                    if (sl[t] >= 0)
                        for (int e = 0; e < kd; e++)
                            cr_assert_eq((double)vc[(size_t)sl[t] * kd + e],
                                         naive_round(cdt, q0[(size_t)t * ld + (size_t)(H + KV) * hd + e]));
                }
                for (int p = 0; p < pool; p++)
                    if (!used[p])
                        for (int e = 0; e < kd; e++)
                            cr_assert(kc[(size_t)p * kd + e] == -7.0f && vc[(size_t)p * kd + e] == -7.0f,
                                      "pool row %d (no slot names it) was written", p);
                free(qkv), free(q0), free(ct), free(st), free(ang), free(sl), free(kc), free(vc), free(used);
            }
}

Test(step07, ladders_are_numbered_in_order_with_distinct_names) {
    const FusedVersion *ls[] = {fused_addnorm_ladder, fused_swiglu_ladder, fused_rope_ladder};
    const int ns[] = {FUSED_ADDNORM_VERSIONS, FUSED_SWIGLU_VERSIONS, FUSED_ROPE_VERSIONS};
    for (int l = 0; l < 3; l++) {
        cr_assert_geq(ns[l], 2);
        for (int i = 0; i < ns[l]; i++) {
            cr_assert_eq(ls[l][i].version, i);
            cr_assert(ls[l][i].name && ls[l][i].what && strlen(ls[l][i].what) > 10);
            for (int j = 0; j < i; j++) cr_assert_str_neq(ls[l][i].name, ls[l][j].name);
        }
    }
}

// ---------------------------------------------------------------- step07_gpu: every version vs the reference

static size_t dsz(StDtype d) { return d == ST_F32 ? 4 : 2; }
static double tol(StDtype d) { return d == ST_F32 ? ERR_TOL_FP32 : ERR_TOL_HALF; }

// One add + RMSNorm check: version v at (T, n), pointers offset by `off` elements from the
// allocation (off 1: no 16-byte alignment). Residual exact, out within tolerance.
static void check_addnorm(Rng *g, int v, StDtype rdt, StDtype odt, int T, int n, int off) {
    const size_t N = (size_t)T * n;
    float *x = randu(g, N, -2, 2, rdt), *r = randu(g, N, -2, 2, rdt), *w = randu(g, n, 0.5f, 1.5f, ST_F32);
    float *ref = malloc(N * 4), *rref = malloc(N * 4), *out = malloc(N * 4), *rout = malloc(N * 4);
    memcpy(rref, r, N * 4);
    fused_add_rmsnorm_cpu(rdt, odt, x, rref, w, T, n, 1e-6f, ref);
    char *dx = pa_dev_alloc((N + off) * dsz(rdt)), *dr = pa_dev_alloc((N + off) * dsz(rdt));
    char *dout = pa_dev_alloc((N + off) * dsz(odt)), *dw = pa_dev_alloc(((size_t)n + off) * 4);
    cr_assert(dx && dr && dout && dw);
    void *px = dx + off * dsz(rdt), *pr = dr + off * dsz(rdt), *po = dout + off * dsz(odt);
    float *pw = (float *)dw + off;
    for (size_t i = 0; i < N; i++) out[i] = NAN;
    cr_assert_eq(pa_upload_as(rdt, px, x, N), 0);
    cr_assert_eq(pa_upload_as(rdt, pr, r, N), 0);
    cr_assert_eq(pa_upload_as(odt, po, out, N), 0);  // poisoned
    cr_assert_eq(pa_upload(pw, w, (size_t)n * 4), 0);
    const int launches = fused_add_rmsnorm(v, rdt, odt, px, pr, pw, T, n, 1e-6f, po, NULL);
    cr_assert_eq(launches, v == 0 ? 2 : 1, "v%d launches %d", v, launches);
    cr_assert_eq(pa_sync(), 0);
    cr_assert_eq(pa_download_f32(odt, out, po, N), 0);
    cr_assert_eq(pa_download_f32(rdt, rout, pr, N), 0);
    cr_assert_eq(memcmp(rout, rref, N * 4), 0, "v%d %s>%s T=%d n=%d off=%d: residual not exactly round(x + r)", v,
                 dname(rdt), dname(odt), T, n, off);
    ErrStats e = compare_f32(out, ref, N);
    cr_assert(e.n_bad == 0 && e.max_rel <= tol(odt == ST_F32 && rdt == ST_F32 ? ST_F32 : ST_BF16),
              "v%d %s>%s T=%d n=%d off=%d: max_rel %.3g (%zu non-finite)", v, dname(rdt), dname(odt), T, n, off,
              e.max_rel, e.n_bad);
    pa_dev_free(dx), pa_dev_free(dr), pa_dev_free(dout), pa_dev_free(dw);
    free(x), free(r), free(w), free(ref), free(rref), free(out), free(rout);
}

Test(step07_gpu, add_rmsnorm_every_version_matches_cpu_on_odd_shapes, .timeout = 600) {
    NEED_GPU();
    Rng g;
    rng_seed(&g, 21);
    for (int v = 0; v < FUSED_ADDNORM_VERSIONS; v++)
        for (int p = 0; p < N_OF(PAIRS); p++)
            for (int hi = 0; hi < N_OF(HIDDEN); hi++)
                for (int ti = 0; ti < N_OF(ROWS); ti++) check_addnorm(&g, v, PAIRS[p].a, PAIRS[p].b, ROWS[ti], HIDDEN[hi], 0);
}

Test(step07_gpu, add_rmsnorm_unaligned_long_rows_and_many_rows, .timeout = 600) {
    NEED_GPU();
    Rng g;
    rng_seed(&g, 23);
    for (int v = 0; v < FUSED_ADDNORM_VERSIONS; v++) {
        // unaligned pointers: the vector versions take their scalar path
        check_addnorm(&g, v, ST_BF16, ST_BF16, 65, 2048, 1);
        check_addnorm(&g, v, ST_F32, ST_BF16, 3, 1024, 1);
        // more rows than v3's persistent grid holds (it strides), and short rows packed per block
        check_addnorm(&g, v, ST_BF16, ST_BF16, 4096, 2048, 0);
        check_addnorm(&g, v, ST_F16, ST_F16, 1000, 1024, 0);
        check_addnorm(&g, v, ST_F32, ST_F32, 700, 4096, 0);
        // rows past the 4-vector tile (8 vectors a thread), and past every tile (v1's kernel runs)
        check_addnorm(&g, v, ST_BF16, ST_BF16, 5, 16384, 0);
        check_addnorm(&g, v, ST_F32, ST_F32, 5, 8192, 0);
        check_addnorm(&g, v, ST_BF16, ST_BF16, 3, 20000, 0);
        check_addnorm(&g, v, ST_BF16, ST_BF16, 3, 9001, 0);
    }
}

static void check_swiglu(Rng *g, int v, StDtype idt, StDtype odt, int T, int ff, int off) {
    const size_t N = (size_t)T * ff;
    float *gu = randu(g, 2 * N, -8, 8, idt), *ref = malloc(N * 4), *out = malloc(N * 4);
    fused_swiglu_cpu(idt, odt, gu, ref, T, ff);
    char *dgu = pa_dev_alloc((2 * N + off) * dsz(idt)), *dh = pa_dev_alloc((N + off) * dsz(odt));
    cr_assert(dgu && dh);
    void *pg = dgu + off * dsz(idt), *ph = dh + off * dsz(odt);
    for (size_t i = 0; i < N; i++) out[i] = NAN;
    cr_assert_eq(pa_upload_as(idt, pg, gu, 2 * N), 0);
    cr_assert_eq(pa_upload_as(odt, ph, out, N), 0);
    cr_assert_eq(fused_swiglu(v, idt, odt, pg, ph, T, ff, NULL), 1);
    cr_assert_eq(pa_sync(), 0);
    cr_assert_eq(pa_download_f32(odt, out, ph, N), 0);
    ErrStats e = compare_f32(out, ref, N);
    cr_assert(e.n_bad == 0 && e.max_rel <= tol(odt == ST_F32 && idt == ST_F32 ? ST_F32 : ST_BF16),
              "v%d %s>%s T=%d ff=%d off=%d: max_rel %.3g (%zu non-finite)", v, dname(idt), dname(odt), T, ff, off,
              e.max_rel, e.n_bad);
    pa_dev_free(dgu), pa_dev_free(dh);
    free(gu), free(ref), free(out);
}

Test(step07_gpu, swiglu_every_version_matches_cpu_on_odd_shapes, .timeout = 600) {
    NEED_GPU();
    Rng g;
    rng_seed(&g, 25);
    for (int v = 0; v < FUSED_SWIGLU_VERSIONS; v++) {
        for (int p = 0; p < N_OF(PAIRS); p++)
            for (int hi = 0; hi < N_OF(HIDDEN); hi++)
                for (int ti = 0; ti < N_OF(ROWS); ti++) check_swiglu(&g, v, PAIRS[p].a, PAIRS[p].b, ROWS[ti], HIDDEN[hi], 0);
        check_swiglu(&g, v, ST_BF16, ST_BF16, 65, 2048, 1);  // unaligned: the scalar path
        check_swiglu(&g, v, ST_F16, ST_F32, 3, 1000, 0);
        check_swiglu(&g, v, ST_BF16, ST_BF16, 70000, 8, 0);  // more rows than one grid dimension holds
    }
}

// RoPE + K/V write: pool rows poisoned with NaN, shuffled slots with padding (-1) rows; q heads,
// the written cache rows, and every pool row no slot names (must stay NaN).
static void check_rope(Rng *g, int v, StDtype cdt, int T, int H, int KV, int hd) {
    const int half = hd / 2, ld = (H + 2 * KV) * hd, kd = KV * hd, pool = 2 * T + 3;
    float *qkv = rng_new_uniform(g, (size_t)T * ld, -1, 1), *ref = malloc((size_t)T * ld * 4);
    memcpy(ref, qkv, (size_t)T * ld * 4);
    float *ct = malloc((size_t)T * half * 4), *st = malloc((size_t)T * half * 4);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < half; e++) {
            const double a = (double)(rng_u32(g) % 8192) * pow(500000.0, -2.0 * e / hd);
            ct[(size_t)t * half + e] = (float)cos(a), st[(size_t)t * half + e] = (float)sin(a);
        }
    int *sl = malloc((size_t)T * sizeof(int)), *perm = malloc((size_t)pool * sizeof(int));
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        const int j = (int)(rng_u32(g) % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int t = 0; t < T; t++) sl[t] = t % 4 == 2 ? -1 : perm[t];
    const size_t cn = (size_t)pool * kd;
    float *kc = malloc(cn * 4), *vc = malloc(cn * 4), *dk = malloc(cn * 4), *dv = malloc(cn * 4), *out = malloc((size_t)T * ld * 4);
    for (size_t i = 0; i < cn; i++) kc[i] = vc[i] = NAN;
    fused_rope_kv_write_cpu(cdt, ref, T, H, KV, hd, ct, st, sl, kc, vc);
    float *dq = pa_dev_alloc((size_t)T * ld * 4), *dct = pa_dev_alloc((size_t)T * half * 4), *dst = pa_dev_alloc((size_t)T * half * 4);
    int *dsl = pa_dev_alloc((size_t)T * 4);
    void *dkc = pa_dev_alloc(cn * dsz(cdt)), *dvc = pa_dev_alloc(cn * dsz(cdt));
    cr_assert(dq && dct && dst && dsl && dkc && dvc);
    for (size_t i = 0; i < cn; i++) dk[i] = NAN;
    cr_assert_eq(pa_upload(dq, qkv, (size_t)T * ld * 4), 0);
    cr_assert_eq(pa_upload(dct, ct, (size_t)T * half * 4), 0);
    cr_assert_eq(pa_upload(dst, st, (size_t)T * half * 4), 0);
    cr_assert_eq(pa_upload(dsl, sl, (size_t)T * 4), 0);
    cr_assert_eq(pa_upload_as(cdt, dkc, dk, cn), 0);
    cr_assert_eq(pa_upload_as(cdt, dvc, dk, cn), 0);
    cr_assert_eq(fused_rope_kv_write(v, cdt, dq, T, H, KV, hd, dct, dst, dsl, dkc, dvc, NULL), v == 0 ? 2 : 1);
    cr_assert_eq(pa_sync(), 0);
    cr_assert_eq(pa_download(out, dq, (size_t)T * ld * 4), 0);
    cr_assert_eq(pa_download_f32(cdt, dk, dkc, cn), 0);
    cr_assert_eq(pa_download_f32(cdt, dv, dvc, cn), 0);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H * hd; i++) {
            const double d = fabs(out[(size_t)t * ld + i] - ref[(size_t)t * ld + i]);
            if (!(d <= worst)) worst = d;  // NaN -> NaN
        }
    cr_assert(worst <= 1e-5, "v%d %s T=%d H=%d KV=%d hd=%d: q off by %.3g", v, dname(cdt), T, H, KV, hd, worst);
    char *used = calloc((size_t)pool, 1);
    for (int t = 0; t < T; t++)
        if (sl[t] >= 0) used[sl[t]] = 1;
    for (int p = 0; p < pool; p++)
        for (int e = 0; e < kd; e++) {
            const size_t k = (size_t)p * kd + e;
            if (!used[p]) {
                cr_assert(isnan(dk[k]) && isnan(dv[k]), "v%d: pool row %d (padding / unmapped) was written", v, p);
                continue;
            }
            // relative, with a floor: a k near 0 comes from cancellation, where fp32 products rounded
            // (CPU) or fused (GPU FMA) differ by ~1e-7 absolute
            const double tk = tol(cdt) * (fabs(kc[k]) + 0.1), tv = tol(cdt) * (fabs(vc[k]) + 0.1);
            cr_assert(fabs(dk[k] - kc[k]) <= tk && fabs(dv[k] - vc[k]) <= tv,
                      "v%d %s T=%d H=%d KV=%d hd=%d: cache row %d elem %d: k %g vs %g, v %g vs %g", v, dname(cdt), T, H,
                      KV, hd, p, e, dk[k], kc[k], dv[k], vc[k]);
        }
    pa_dev_free(dq), pa_dev_free(dct), pa_dev_free(dst), pa_dev_free(dsl), pa_dev_free(dkc), pa_dev_free(dvc);
    free(qkv), free(ref), free(ct), free(st), free(sl), free(perm), free(kc), free(vc), free(dk), free(dv), free(out);
    free(used);
}

Test(step07_gpu, rope_kv_write_every_version_matches_cpu, .timeout = 600) {
    NEED_GPU();
    Rng g;
    rng_seed(&g, 27);
    const int heads[][3] = {{4, 4, 64}, {8, 2, 128}, {16, 8, 128}, {32, 8, 64}, {3, 1, 2}, {6, 2, 10}};
    const StDtype cdts[] = {ST_F32, ST_BF16, ST_F16};
    for (int v = 0; v < FUSED_ROPE_VERSIONS; v++)
        for (int hc = 0; hc < N_OF(heads); hc++)
            for (int ci = 0; ci < N_OF(cdts); ci++)
                for (int ti = 0; ti < N_OF(ROWS); ti++)
                    check_rope(&g, v, cdts[ci], ROWS[ti], heads[hc][0], heads[hc][1], heads[hc][2]);
    for (int v = 0; v < FUSED_ROPE_VERSIONS; v++) check_rope(&g, v, ST_BF16, 1000, 32, 8, 128);
}

Test(step07_gpu, launchers_refuse_bad_arguments) {
    NEED_GPU();
    float *d = pa_dev_alloc(4096);
    int *sl = pa_dev_alloc(64);
    cr_assert(d && sl);
    cr_assert_eq(fused_add_rmsnorm(FUSED_ADDNORM_VERSIONS, ST_BF16, ST_BF16, d, d + 256, d + 512, 1, 8, 1e-6f, d + 768, NULL), -1);
    cr_assert_eq(fused_add_rmsnorm(1, ST_BF16, ST_BF16, d, d + 256, d + 512, 1, 0, 1e-6f, d + 768, NULL), -1);
    cr_assert_eq(fused_add_rmsnorm(1, ST_BF16, ST_F32, d, d + 256, d + 512, 1, 8, 1e-6f, d + 768, NULL), -1);
    cr_assert_eq(fused_add_rmsnorm(1, ST_I32, ST_I32, d, d + 256, d + 512, 1, 8, 1e-6f, d + 768, NULL), -1);
    cr_assert_eq(fused_add_rmsnorm(2, ST_BF16, ST_BF16, d, d + 256, d + 512, 0, 8, 1e-6f, d + 768, NULL), 0);  // T = 0
    cr_assert_eq(fused_swiglu(-1, ST_BF16, ST_BF16, d, d + 256, 1, 8, NULL), -1);
    cr_assert_eq(fused_swiglu(1, ST_BF16, ST_BF16, d, d + 256, 1, 0, NULL), -1);
    cr_assert_eq(fused_rope_kv_write(1, ST_BF16, d, 1, 1, 1, 3, d + 256, d + 512, sl, d + 600, d + 700, NULL), -1);  // odd hd
    cr_assert_eq(fused_rope_kv_write(0, ST_BF16, d, 1, 1, 1, 4, d + 256, d + 512, sl, d + 600, d + 700, (void *)1), -1);
    cr_assert_eq(fused_rope_kv_write(FUSED_ROPE_VERSIONS, ST_BF16, d, 1, 1, 1, 4, d + 256, d + 512, sl, d + 600, d + 700, NULL), -1);
    cr_assert_eq(pa_sync(), 0);
    pa_dev_free(d), pa_dev_free(sl);
}
