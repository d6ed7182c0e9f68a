// flash_attn_cpu.c — the host half of step07's flash attention (flash_attn.h): the tile plan the
// launch reads, and the fp32 CPU reference every version is held to. The reference is the plain
// two-pass softmax (all scores of the row, their max, exp, sum, then the weighted sum of V), sums in
// double, keys looked up through the block table one by one: nothing of the kernels' tiling,
// online rescaling or rounding, so it checks them rather than repeats them. A CPU test holds it
// equal to a naive softmax(QK^T)V on dense matrices.
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "step07_kernels/flash_attn.h"

int flash_plan(int tile_m, int H, int KV, const int *cu_seqlens, int nseq, int *cu_tiles) {
    if (KV < 1 || H < KV || H % KV || H / KV > tile_m || nseq < 0 || !cu_seqlens || !cu_tiles) return -1;
    const int rpt = tile_m / (H / KV);
    long n = 0;
    cu_tiles[0] = 0;
    for (int s = 0; s < nseq; s++) {
        const int len = cu_seqlens[s + 1] - cu_seqlens[s];
        if (len < 0 || cu_seqlens[s] < 0) return -1;
        n += (len + rpt - 1) / rpt;
        if (n > 0x7fffffff) return -1;
        cu_tiles[s + 1] = (int)n;
    }
    return (int)n;
}

// Key p of sequence s: its row of keys (kd floats) in the pool or in k; the same for v.
static void key_rows(const FlashHost *a, int s, int ctx, int p, const float **kr, const float **vr) {
    const size_t kd = (size_t)a->KV * a->hd;
    if (p < ctx) {
        const int *tab = a->block_tables + (size_t)s * a->bt_stride;
        const size_t row = (size_t)tab[p / a->block_size] * a->block_size + p % a->block_size;
        *kr = a->kc + row * kd, *vr = a->vc + row * kd;
    } else {
        const size_t row = (size_t)a->cu_seqlens[s] + (size_t)(p - ctx);
        *kr = a->k + row * a->ldk, *vr = a->v + row * a->ldk;
    }
}

void flash_attn_row_cpu(const FlashHost *a, int s, int j, int h, float *out) {
    const int n = a->cu_seqlens[s + 1] - a->cu_seqlens[s], ctx = a->ctx_lens ? a->ctx_lens[s] : 0;
    const int nk = a->causal ? ctx + j + 1 : ctx + n, hd = a->hd;
    const size_t ko = (size_t)(h / (a->H / a->KV)) * hd;
    const float *qr = a->q + ((size_t)a->cu_seqlens[s] + j) * a->ldq + (size_t)h * hd;
    double *sc = xmalloc((size_t)nk * sizeof(double)), *acc = xcalloc((size_t)hd, sizeof(double));
    double m = -INFINITY, l = 0;
    for (int p = 0; p < nk; p++) {
        const float *kr, *vr;
        key_rows(a, s, ctx, p, &kr, &vr);
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)qr[e] * kr[ko + e];
        sc[p] = d * a->scale;
        if (sc[p] > m) m = sc[p];
    }
    for (int p = 0; p < nk; p++) {
        const float *kr, *vr;
        key_rows(a, s, ctx, p, &kr, &vr);
        const double w = exp(sc[p] - m);
        l += w;
        for (int e = 0; e < hd; e++) acc[e] += w * vr[ko + e];
    }
    for (int e = 0; e < hd; e++) out[e] = (float)(acc[e] / l);
    free(sc), free(acc);
}

void flash_attn_cpu(const FlashHost *a, float *out, int ldo) {
    for (int s = 0; s < a->nseq; s++) {
        const int n = a->cu_seqlens[s + 1] - a->cu_seqlens[s];
#pragma omp parallel for schedule(dynamic, 1) collapse(2)
        for (int j = 0; j < n; j++)
            for (int h = 0; h < a->H; h++)
                flash_attn_row_cpu(a, s, j, h, out + ((size_t)a->cu_seqlens[s] + j) * ldo + (size_t)h * a->hd);
    }
}

double flash_visible_pairs(const int *cu_seqlens, const int *ctx_lens, int nseq, int causal) {
    double pairs = 0;
    for (int s = 0; s < nseq; s++) {
        const double n = cu_seqlens[s + 1] - cu_seqlens[s], ctx = ctx_lens ? ctx_lens[s] : 0;
        pairs += causal ? n * ctx + n * (n + 1) / 2 : n * (ctx + n);
    }
    return pairs;
}
