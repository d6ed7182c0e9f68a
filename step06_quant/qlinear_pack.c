// qlinear_pack.c — a QWeight repacked into the GPU kernels' layout (contract and layout:
// qlinear_pack.h). Host code, run once per layer at load.
#include "qlinear_pack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int qpack_supported(const QWeight *w, char *err, int errlen) {
    if (!w->g_idx) {
        if (w->n_groups == 1 || w->group % 32 == 0) return 1;
        snprintf(err, (size_t)errlen, "group size %d is not a multiple of 32 (nor one group per row)", w->group);
        return 0;
    }
    if (w->n_groups < 1 || w->cols % w->n_groups != 0) {
        snprintf(err, (size_t)errlen, "g_idx: %d groups do not divide %d columns", w->n_groups, w->cols);
        return 0;
    }
    const int gs = w->cols / w->n_groups;
    if (w->n_groups > 1 && gs % 32 != 0) {
        snprintf(err, (size_t)errlen, "g_idx: group size %d is not a multiple of 32", gs);
        return 0;
    }
    int *count = calloc((size_t)w->n_groups, sizeof(int));
    if (!count) {
        snprintf(err, (size_t)errlen, "out of host memory");
        return 0;
    }
    int ok = 1;
    for (int c = 0; c < w->cols && ok; c++) {
        const int g = w->g_idx[c];
        if (g < 0 || g >= w->n_groups) ok = 0;
        else count[g]++;
    }
    for (int g = 0; g < w->n_groups && ok; g++) ok = count[g] == gs;
    free(count);
    if (!ok) snprintf(err, (size_t)errlen, "g_idx: the groups do not all hold %d columns", gs);
    return ok;
}

size_t qpack_word_index(const QPacked *p, int r, int j) {
    if (p->kind == QK_INT8) return (size_t)r * (p->kp / 4) + (size_t)(j / 4);
    const int nb = r / 16, rr = r % 16, kc = j / 64, jj = j % 64, i = jj / 16, kk = jj % 16;
    const int lane = (rr % 8) * 4 + (kk % 8) / 2;
    return (((size_t)nb * (p->kp / 64) + kc) * 32 + lane) * 4 + i;
}

int qpack_nibble(const QPacked *p, int r, int j) {
    if (p->kind == QK_INT8) return j % 4;
    const int rr = r % 16, kk = j % 16;
    return (rr / 8) * 2 + (kk / 8) + 4 * (kk % 2);
}

int qpack_get(const QPacked *p, int r, int j) {
    const uint32_t w = p->qw[qpack_word_index(p, r, j)];
    const int bits = (int)p->kind;
    return (int)((w >> (bits * qpack_nibble(p, r, j))) & ((1u << bits) - 1));
}

static void put(QPacked *p, int r, int j, int q) {
    const int bits = (int)p->kind, sh = bits * qpack_nibble(p, r, j);
    uint32_t *w = &p->qw[qpack_word_index(p, r, j)];
    *w = (*w & ~(((1u << bits) - 1) << sh)) | ((uint32_t)q << sh);
}

// Stable: columns of the same group keep their order.
static int *sort_by_group(const QWeight *w) {
    int *perm = malloc((size_t)w->cols * sizeof(int)), *start = calloc((size_t)w->n_groups + 1, sizeof(int));
    if (!perm || !start) {
        free(perm), free(start);
        return NULL;
    }
    for (int c = 0; c < w->cols; c++) start[w->g_idx[c] + 1]++;
    for (int g = 0; g < w->n_groups; g++) start[g + 1] += start[g];
    for (int c = 0; c < w->cols; c++) perm[start[w->g_idx[c]]++] = c;
    free(start);
    return perm;
}

int qpack(const QWeight *w, QPacked *p, char *err, int errlen) {
    memset(p, 0, sizeof *p);
    if (!qpack_supported(w, err, errlen)) return -1;
    p->kind = w->kind, p->rows = w->rows, p->cols = w->cols, p->sym = w->sym, p->ng = w->n_groups;
    p->np = (w->rows + 15) / 16 * 16, p->kp = (w->cols + 63) / 64 * 64;
    p->gs = w->g_idx ? w->cols / w->n_groups : w->group;
    p->n_words = w->kind == QK_INT8 ? (size_t)p->np * p->kp / 4 : (size_t)p->np * p->kp / 8;
    const size_t ngp = (size_t)p->ng * p->np;
    p->qw = calloc(p->n_words, sizeof(uint32_t));
    p->scales = calloc(ngp, sizeof(float));
    if (!w->sym) p->zeros = calloc(ngp, 1);
    if (w->g_idx) p->perm = sort_by_group(w);
    if (!p->qw || !p->scales || (!w->sym && !p->zeros) || (w->g_idx && !p->perm)) {
        snprintf(err, (size_t)errlen, "out of host memory (%d x %d)", w->rows, w->cols);
        qpack_free(p);
        return -1;
    }
    for (int r = 0; r < w->rows; r++)
        for (int g = 0; g < p->ng; g++) {
            p->scales[(size_t)g * p->np + r] = qweight_scale(w, r, g);
            if (p->zeros) p->zeros[(size_t)g * p->np + r] = w->zeros[(size_t)r * w->n_groups + g];
        }
    const int zsym = 1 << ((int)w->kind - 1);
    // in 16-row strips: a word never spans two strips, so the strips can be filled in parallel
#pragma omp parallel for schedule(static)
    for (int strip = 0; strip < p->np / 16; strip++)
        for (int r = strip * 16; r < strip * 16 + 16; r++)
            for (int j = 0; j < p->kp; j++) {
                int q;
                if (r < w->rows && j < w->cols) q = qweight_get(w, r, p->perm ? p->perm[j] : j);
                else {  // padding: its group's zero point, so it dequantizes to exactly 0
                    const int g = j / p->gs < p->ng ? j / p->gs : p->ng - 1;
                    q = r < w->rows && p->zeros ? p->zeros[(size_t)g * p->np + r] : zsym;
                }
                put(p, r, j, q);
            }
    return 0;
}

void qpack_free(QPacked *p) {
    free(p->perm), free(p->qw), free(p->scales), free(p->zeros);
    memset(p, 0, sizeof *p);
}
