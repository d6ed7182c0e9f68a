// test_step06_pack.c — the GPU weight layout built on the host (step06_quant/qlinear_pack.h), on
// the CPU. Random QWeights (odd row counts, INT8 and INT4, groups 32 / 128 / per channel, sym and
// asym, with and without a GPTQ-style g_idx) are packed, then read back here from the words
// alone, walking the layout the other way round from the packer: for every INT4 word, lane and
// nibble, the (row, column) that mma.sync's m16n8k16 B fragment assigns to that register half
// (lane L holds rows L/4 and L/4 + 8, columns 2(L%4), +1, +8, +9 of a 16-column slice), extracted
// with the same masks the kernels use (w & 0x000F000F, w & 0x00F000F0, then w >> 8). Every value
// must be the QWeight's integer of the original column, and every padded weight its group's zero
// point; the column permutation sorts by group stably; scales and zeros land at (group, row).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "step06_quant/qlinear_pack.h"
#include "step06_quant/quant.h"

static void random_qweight(Rng *r, QuantKind kind, int rows, int cols, int group, int sym, int act, QWeight *w) {
    cr_assert_eq(qweight_random(w, r, kind, rows, cols, group, sym, act), 0);
    for (int i = 0; i < rows * w->n_groups; i++) w->scales[i] = 1.0f + (float)i;  // distinct: a mix-up shows
}

// The integer expected at packed (row, column j): the QWeight's, or the zero point as padding.
static int expect_q(const QWeight *w, const QPacked *p, int row, int j) {
    if (row < w->rows && j < w->cols) return qweight_get(w, row, p->perm ? p->perm[j] : j);
    if (row >= w->rows || w->sym) return 1 << ((int)w->kind - 1);
    const int g = j / p->gs < p->ng ? j / p->gs : p->ng - 1;
    return w->zeros[(size_t)row * w->n_groups + g];
}

static void check_case(QuantKind kind, int rows, int cols, int group, int sym, int act, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    QWeight w;
    random_qweight(&r, kind, rows, cols, group, sym, act, &w);
    QPacked p;
    char err[256] = "";
    cr_assert_eq(qpack(&w, &p, err, sizeof err), 0, "qpack: %s", err);
    cr_assert_eq(p.np % 16, 0);
    cr_assert_eq(p.kp % 64, 0);
    cr_assert(p.np >= rows && p.np < rows + 16 && p.kp >= cols && p.kp < cols + 64);
    const char *what = kind == QK_INT4 ? "int4" : "int8";
    // the permutation: a permutation, sorted by group, stable, and packed column j in group j / gs
    if (act) {
        cr_assert_not_null(p.perm);
        char *seen = calloc((size_t)cols, 1);
        for (int j = 0; j < cols; j++) {
            cr_assert(p.perm[j] >= 0 && p.perm[j] < cols && !seen[p.perm[j]], "perm[%d] = %d", j, p.perm[j]);
            seen[p.perm[j]] = 1;
            cr_assert_eq(w.g_idx[p.perm[j]], j / p.gs, "packed column %d is not in group %d", j, j / p.gs);
            if (j > 0 && j % p.gs != 0) cr_assert_lt(p.perm[j - 1], p.perm[j], "not stable at %d", j);
        }
        free(seen);
    } else {
        cr_assert_null(p.perm);
    }
    size_t bad = 0;
    if (kind == QK_INT4) {
        cr_assert_eq(p.n_words, (size_t)p.np * p.kp / 8);
        for (int nb = 0; nb < p.np / 16; nb++)
            for (int kc = 0; kc < p.kp / 64; kc++)
                for (int lane = 0; lane < 32; lane++)
                    for (int i = 0; i < 4; i++) {
                        const uint32_t wd = p.qw[(((size_t)nb * (p.kp / 64) + kc) * 32 + lane) * 4 + i];
                        const int n = nb * 16 + lane / 4, k = kc * 64 + 16 * i + 2 * (lane % 4);
                        // the four 16-bit pairs the kernels form, and the fragment entries they are
                        const uint32_t pr[4] = {wd & 0x000F000Fu, (wd & 0x00F000F0u) >> 4, (wd >> 8) & 0x000F000Fu,
                                                ((wd >> 8) & 0x00F000F0u) >> 4};
                        const int pn[4] = {n, n, n + 8, n + 8}, pk[4] = {k, k + 8, k, k + 8};
                        for (int e = 0; e < 4; e++) {
                            bad += (int)(pr[e] & 0xF) != expect_q(&w, &p, pn[e], pk[e]);
                            bad += (int)(pr[e] >> 16) != expect_q(&w, &p, pn[e], pk[e] + 1);
                        }
                    }
    } else {
        cr_assert_eq(p.n_words, (size_t)p.np * p.kp / 4);
        const uint8_t *b = (const uint8_t *)p.qw;  // little endian: byte j of row r at r * kp + j
        for (int row = 0; row < p.np; row++)
            for (int j = 0; j < p.kp; j++) bad += b[(size_t)row * p.kp + j] != expect_q(&w, &p, row, j);
    }
    cr_expect_eq(bad, 0, "%s %dx%d g%d sym %d act %d: %zu weights misplaced", what, rows, cols, group, sym, act, bad);
    for (int row = 0; row < rows; row++)
        for (int g = 0; g < w.n_groups; g++) {
            cr_assert_eq(p.scales[(size_t)g * p.np + row], w.scales[(size_t)row * w.n_groups + g]);
            if (!sym) cr_assert_eq(p.zeros[(size_t)g * p.np + row], w.zeros[(size_t)row * w.n_groups + g]);
        }
    for (int row = 0; row < rows; row++)  // qpack_get agrees with the walk above
        for (int j = 0; j < cols; j += 7) cr_assert_eq(qpack_get(&p, row, j), expect_q(&w, &p, row, j));
    qpack_free(&p);
    qweight_free(&w);
}

// The shapes both host walks run, for INT8 and INT4, symmetric and not: per channel with columns
// not a multiple of 64, act-order, groups of 96 (a division, not a shift; they straddle the
// 64-column tiles).
static const struct {
    int rows, cols, group, act;
} PACK_CASES[] = {{37, 256, 32, 0}, {16, 384, 128, 0}, {50, 200, 200, 0}, {1, 64, 64, 0},
                  {29, 512, 128, 1}, {33, 256, 32, 1}, {21, 480, 96, 1},  {24, 192, 64, 1}};
#define N_PACK_CASES ((int)(sizeof PACK_CASES / sizeof PACK_CASES[0]))

Test(step06_pack, layout_holds_every_weight) {
    uint64_t seed = 70;
    for (int k = 0; k < 2; k++)
        for (int sym = 0; sym < 2; sym++)
            for (int i = 0; i < N_PACK_CASES; i++)
                check_case(k ? QK_INT4 : QK_INT8, PACK_CASES[i].rows, PACK_CASES[i].cols, PACK_CASES[i].group, sym,
                           PACK_CASES[i].act, seed++);
}

Test(step06_pack, unsupported_groups_refused) {
    Rng r;
    rng_seed(&r, 5);
    QWeight w;
    random_qweight(&r, QK_INT4, 8, 96, 48, 1, 0, &w);  // 48 is not a multiple of 32
    QPacked p;
    char err[256] = "";
    cr_expect_eq(qpack(&w, &p, err, sizeof err), -1);
    cr_expect(strstr(err, "48") != NULL, "the error names the group size: %s", err);
    qweight_free(&w);
    random_qweight(&r, QK_INT4, 8, 128, 32, 1, 1, &w);
    w.g_idx[0] = 1;  // group 1 now holds 33 columns, group 0 31
    err[0] = 0;
    cr_expect_eq(qpack(&w, &p, err, sizeof err), -1);
    cr_expect(strstr(err, "g_idx") != NULL, "the error names g_idx: %s", err);
    qweight_free(&w);
}

// ---------------------------------------------------------------- the kernels' arithmetic, on the host
// qlinear_gpu.cu's index and dequantization formulas restated in C and applied to the packed
// words: every weight the GEMV (k_qgemv4, k_qgemv8) and the tensor-core GEMM (k_qgemm4's
// dequant4, per the PTX ISA's m16n8k16 B fragment) would use must be the QWeight's (q - z) * s of
// the right (row, original column); the ldmatrix addresses must give the A fragment and the C
// stores the right (token, row). fp16 is gcc's _Float16 (IEEE binary16, round to nearest), bf16
// is rounded here; every operation is exact in fp32 before its one rounding, as on the device.

static float h_of(uint16_t b) {
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}
static uint16_t h_bits(float f) {
    const _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
static float bf_of(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t bf_bits(float f) {  // round to nearest even (no NaN here)
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
// The 16-bit type of X: 0 fp16, 1 bf16.
static float x_of(int bf, uint16_t b) { return bf ? bf_of(b) : h_of(b); }
static uint16_t x_bits(int bf, float f) { return bf ? bf_bits(f) : h_bits(f); }
static float x_round(int bf, float f) { return x_of(bf, x_bits(bf, f)); }

// group_of and glog as qlinear_gpu.cu has them
static int glog_of(const QPacked *p) {
    if (p->ng == 1) return 30;
    for (int b = 0; b < 30; b++)
        if (p->gs == 1 << b) return b;
    return -1;
}
static int group_of(int col, int gs, int glog, int ng) {
    const int g = glog >= 0 ? col >> glog : col / gs;
    return g < ng - 1 ? g : ng - 1;
}
static uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {  // CUDA's __byte_perm
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((v >> (8 * ((sel >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}

// Checks one weight the kernel formed: the value v at packed (n, j) with the scale s it picked;
// want: (q - z) * s of the QWeight at (n, perm[j]) (0 for padding). hit counts each (n, j) once.
typedef struct {
    const QWeight *w;
    const QPacked *p;
    unsigned char *hit;
    size_t bad, twice;
} Sink;
static float want_qz(const Sink *k, int n, int j, float *s) {
    const QWeight *w = k->w;
    if (n >= w->rows || j >= w->cols) return *s = 0.0f;
    const int c = k->p->perm ? k->p->perm[j] : j, g = qweight_group_of(w, c);
    *s = qweight_scale(w, n, g);
    return (float)qweight_get(w, n, c) - qweight_zero(w, n, g);
}
// qz: the kernel's q - z; s: its scale; xprec: -1 for fp32 (exact), else the X type (bf != 0).
static void sink(Sink *k, int n, int j, float qz, float s, float v, int xprec) {
    const size_t at = (size_t)n * k->p->kp + j;
    k->twice += k->hit[at]++ != 0;
    if (n >= k->w->rows) return;  // never stored
    float ws;
    const float wqz = want_qz(k, n, j, &ws);
    if (j >= k->w->cols) {
        k->bad += v != 0.0f;
        return;
    }
    const float want = xprec < 0 ? wqz * ws : x_round(xprec, x_round(xprec, ws) * wqz);
    k->bad += qz != wqz || s != ws || v != want;
}

// k_qgemv4: lane, word, the fp16 pairs and the x indices they multiply.
static void emulate_gemv4(Sink *k) {
    const QPacked *p = k->p;
    const int nk = p->kp / 64, glog = glog_of(p);
    const uint16_t sixteenth = h_bits(1.0f / 16.0f);
    for (int nb = 0; nb < p->np / 16; nb++)
        for (int kc = 0; kc < nk; kc++)
            for (int lane = 0; lane < 32; lane++) {
                const int n_lo = nb * 16 + lane / 4, n_hi = n_lo + 8, kl = 2 * (lane % 4);
                const uint32_t *wv = p->qw + ((size_t)(nb * nk + kc) * 32 + lane) * 4;  // the lane's uint4
                for (int h = 0; h < 2; h++) {
                    const int col = kc * 64 + 32 * h, g = group_of(col, p->gs, glog, p->ng);
                    const int nr[2] = {n_lo, n_hi};
                    float s[2], za[2], zb[2];
                    for (int r = 0; r < 2; r++) {
                        s[r] = p->scales[(size_t)g * p->np + nr[r]];
                        const float z = p->zeros ? (float)p->zeros[(size_t)g * p->np + nr[r]] : 8.0f;
                        za[r] = h_of(h_bits(1024.0f + z)), zb[r] = h_of(h_bits(-64.0f - z));
                    }
                    for (int i2 = 0; i2 < 2; i2++) {
                        const uint32_t wd = wv[2 * h + i2], w2 = wd >> 8;
                        const int kk = col + 16 * i2 + kl;
                        // qa: (lo, kk, kk+1), qb: (lo, kk+8, kk+9), qc, qd: the same of hi
                        const uint32_t pr[4] = {(wd & 0x000F000Fu) | 0x64006400u, (wd & 0x00F000F0u) | 0x64006400u,
                                                (w2 & 0x000F000Fu) | 0x64006400u, (w2 & 0x00F000F0u) | 0x64006400u};
                        for (int e = 0; e < 4; e++)
                            for (int half = 0; half < 2; half++) {
                                const int r = e / 2, n = nr[r], j = kk + 8 * (e % 2) + half;
                                const float v = h_of((uint16_t)(pr[e] >> (16 * half)));
                                const float qz = e % 2 == 0 ? h_of(h_bits(v - za[r]))
                                                            : h_of(h_bits(fmaf(v, h_of(sixteenth), zb[r])));
                                sink(k, n, j, qz, s[r], qz * s[r], -1);
                            }
                    }
                }
            }
}

// k_qgemv8: one row per warp, lane piece c = 16 weights, byte i of the piece by __byte_perm.
static void emulate_gemv8(Sink *k) {
    const QPacked *p = k->p;
    const int nv = p->kp / 16, glog = glog_of(p);
    for (int row = 0; row < p->np; row++)
        for (int c = 0; c < nv; c++) {
            const uint32_t *wv = p->qw + ((size_t)row * nv + c) * 4;
            const int g = group_of(c * 16, p->gs, glog, p->ng);
            const float s = p->scales[(size_t)g * p->np + row];
            const float zoff = 8388608.0f + (p->zeros ? (float)p->zeros[(size_t)g * p->np + row] : 128.0f);
            for (int i = 0; i < 16; i++) {
                const uint32_t u = byte_perm(wv[i / 4], 0x4B000000u, 0x7650u | (uint32_t)(i % 4));
                float f;
                memcpy(&f, &u, 4);
                sink(k, row, c * 16 + i, f - zoff, s, (f - zoff) * s, -1);
            }
        }
}

// k_qgemm4's dequant4 (fp16: the pairs at bits 0..3 and 4..7 of w and w >> 8; bf16: at bits 0..3
// of w, w >> 4, w >> 8, w >> 12), the registers placed by the PTX ISA's m16n8k16 B fragment:
// lane L: b0 = (k 2(L%4), +1; n L/4), b1 = (k + 8, k + 9; n); b2, b3 the same of rows 8..15.
static void emulate_gemm4(Sink *k, int bf) {
    const QPacked *p = k->p;
    const int nk = p->kp / 64, glog = glog_of(p);
    const float lo = bf ? 128.0f : 1024.0f, hi = bf ? 8.0f : 64.0f;
    const uint32_t magic = bf ? 0x43004300u : 0x64006400u;
    for (int nb = 0; nb < p->np / 16; nb++)
        for (int kc = 0; kc < nk; kc++)
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) {
                    const uint32_t wd = p->qw[((size_t)(nb * nk + kc) * 32 + lane) * 4 + i];
                    const int g = group_of(kc * 64 + 32 * (i / 2), p->gs, glog, p->ng);
                    uint32_t pr[4];
                    if (bf)
                        for (int e = 0; e < 4; e++) pr[e] = ((wd >> (4 * e)) & 0x000F000Fu) | magic;
                    else
                        pr[0] = (wd & 0x000F000Fu) | magic, pr[1] = (wd & 0x00F000F0u) | magic,
                        pr[2] = ((wd >> 8) & 0x000F000Fu) | magic, pr[3] = ((wd >> 8) & 0x00F000F0u) | magic;
                    for (int e = 0; e < 4; e++) {  // register b_e
                        const int n = nb * 16 + lane / 4 + 8 * (e / 2), kb = kc * 64 + 16 * i + 2 * (lane % 4) + 8 * (e % 2);
                        const float fs = p->scales[(size_t)g * p->np + n];
                        const float z = p->zeros ? (float)p->zeros[(size_t)g * p->np + n] : 8.0f;
                        const float s = x_round(bf, fs), zo = x_round(bf, lo + z), zh = x_round(bf, -(hi + z));
                        for (int half = 0; half < 2; half++) {  // the low half is the lower k
                            const float v = x_of(bf, (uint16_t)(pr[e] >> (16 * half)));
                            const float qz = e % 2 == 0 || bf ? x_round(bf, v - zo)
                                                              : x_round(bf, fmaf(v, x_round(bf, 1.0f / 16.0f), zh));
                            sink(k, n, kb + half, qz, fs, x_round(bf, qz * s), bf);
                        }
                    }
                }
}

static void check_kernel_math(QuantKind kind, int rows, int cols, int group, int sym, int act, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    QWeight w;
    cr_assert_eq(qweight_random(&w, &r, kind, rows, cols, group, sym, act), 0);
    for (int i = 0; i < rows * w.n_groups; i++) w.scales[i] = 0.01f * (1.0f + rng_uniform(&r));  // realistic scales
    QPacked p;
    char err[256] = "";
    cr_assert_eq(qpack(&w, &p, err, sizeof err), 0, "qpack: %s", err);
    const size_t n = (size_t)p.np * p.kp;
    Sink k = {&w, &p, calloc(n, 1), 0, 0};
    cr_assert_not_null(k.hit);
    const int passes = kind == QK_INT4 ? 3 : 1;
    for (int pass = 0; pass < passes; pass++) {
        memset(k.hit, 0, n);
        k.bad = k.twice = 0;
        if (kind == QK_INT8) emulate_gemv8(&k);
        else if (pass == 0) emulate_gemv4(&k);
        else emulate_gemm4(&k, pass == 2);
        size_t missed = 0;
        for (size_t i = 0; i < n; i++) missed += k.hit[i] == 0;
        cr_expect(k.bad == 0 && k.twice == 0 && missed == 0,
                  "%s %s %dx%d g%d sym %d act %d: %zu wrong weights, %zu twice, %zu never", kind == QK_INT4 ? "int4" : "int8",
                  kind == QK_INT8 ? "gemv" : pass == 0 ? "gemv" : pass == 1 ? "mma fp16" : "mma bf16", rows, cols, group, sym,
                  act, k.bad, k.twice, missed);
    }
    free(k.hit);
    qpack_free(&p);
    qweight_free(&w);
}

Test(step06_pack, kernel_dequant_formulas_rebuild_every_weight) {
    uint64_t seed = 300;
    for (int k = 0; k < 2; k++)
        for (int sym = 0; sym < 2; sym++)
            for (int i = 0; i < N_PACK_CASES; i++)
                check_kernel_math(k ? QK_INT4 : QK_INT8, PACK_CASES[i].rows, PACK_CASES[i].cols, PACK_CASES[i].group,
                                  sym, PACK_CASES[i].act, seed++);
}

// Every q and z: the magic-number forms are exact (q - z), before any scale.
Test(step06_pack, magic_number_dequant_is_exact) {
    for (int q = 0; q < 16; q++)
        for (int z = 0; z < 16; z++) {
            const float want = (float)(q - z);
            // fp16: 1024 + q at bits 0..3, 1024 + 16 q at bits 4..7 (GEMV and GEMM)
            cr_assert_eq(h_of(h_bits(h_of((uint16_t)(0x6400u | (unsigned)q)) - h_of(h_bits(1024.0f + z)))), want);
            cr_assert_eq(h_of(h_bits(fmaf(h_of((uint16_t)(0x6400u | (unsigned)q << 4)), h_of(h_bits(1.0f / 16.0f)),
                                          h_of(h_bits(-64.0f - z))))),
                         want);
            // bf16: 128 + q at bits 0..3
            cr_assert_eq(bf_of(bf_bits(bf_of((uint16_t)(0x4300u | (unsigned)q)) - bf_of(bf_bits(128.0f + z)))), want);
        }
    for (int q = 0; q < 256; q++)
        for (int z = 0; z < 256; z += 5) {
            const uint32_t u = byte_perm((uint32_t)q << 16, 0x4B000000u, 0x7652u);  // byte 2 of the word
            float f;
            memcpy(&f, &u, 4);
            cr_assert_eq(f - (8388608.0f + (float)z), (float)(q - z));
        }
}

// ldmatrix.x4 with k_qgemm4's addresses (lane l: row l % 16, column 8 (l / 16) of the slice)
// gives the PTX ISA's A fragment, and the C stores land at the fragment's (token, row).
Test(step06_pack, mma_a_and_c_fragment_indexing) {
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int reg = 0; reg < 4; reg++) {
            // ldmatrix: matrix reg's row g comes from the address lane 8 reg + g gave; lane gets
            // that row's elements 2t, 2t + 1
            const int src = 8 * reg + g, row = src % 16, col = (src / 16) * 8 + 2 * t;
            // PTX A (16 x 16, row): a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8)
            cr_assert_eq(row, g + 8 * (reg % 2), "lane %d a%d", lane, reg);
            cr_assert_eq(col, 2 * t + 8 * (reg / 2), "lane %d a%d", lane, reg);
        }
        for (int e = 0; e < 4; e++) {  // PTX C (16 x 8): c_e at (g + 8 (e >= 2), 2t + e % 2)
            const int tok = lane / 4 + 8 * (e / 2), row = 2 * (lane % 4) + (e % 2);  // the kernel's store
            cr_assert_eq(tok, g + 8 * (e >= 2));
            cr_assert_eq(row, 2 * t + e % 2);
        }
    }
}
