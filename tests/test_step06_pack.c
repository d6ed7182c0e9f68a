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

Test(step06_pack, layout_holds_every_weight) {
    uint64_t seed = 70;
    for (int k = 0; k < 2; k++)
        for (int sym = 0; sym < 2; sym++) {
            const QuantKind kind = k ? QK_INT4 : QK_INT8;
            check_case(kind, 37, 256, 32, sym, 0, seed++);
            check_case(kind, 16, 384, 128, sym, 0, seed++);
            check_case(kind, 50, 200, 200, sym, 0, seed++);  // per channel, columns not a multiple of 64
            check_case(kind, 1, 64, 64, sym, 0, seed++);
            check_case(kind, 29, 512, 128, sym, 1, seed++);  // act-order
            check_case(kind, 33, 256, 32, sym, 1, seed++);
            check_case(kind, 21, 480, 96, sym, 1, seed++);  // groups of 96 straddle the 64-column tiles
        }
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
