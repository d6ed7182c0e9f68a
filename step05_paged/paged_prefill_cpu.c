// paged_prefill_cpu.c — the host half of step05's fused prefill attention (paged_prefill.h):
// the tiling plan the launch reads (plain host code, checked by the CPU tests), and the fp32 CPU
// reference: plain loops over each chunk's context (its pool rows looked up once per chunk),
// sums in double. A CPU test holds it equal to the per-row decode reference (paged_decode_cpu),
// which pins the causal indexing; the GPU tests hold the kernel to it.
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "step05_paged/paged_prefill.h"

int paged_prefill_tile_rows(int H, int KV) {
    if (KV < 1 || H < KV || H % KV || H / KV > PP_TILE_M) return 0;
    return PP_TILE_M / (H / KV);
}

static int chunk_ok(const PrefillChunk *c) { return c->n >= 1 && c->L >= c->n && c->seq >= 0 && c->row0 >= 0; }

int paged_prefill_num_tiles(const PrefillChunk *chunks, int nchunks, int H, int KV) {
    const int rpt = paged_prefill_tile_rows(H, KV);
    if (!rpt || nchunks < 0) return -1;
    long n = 0;
    for (int i = 0; i < nchunks; i++) {
        if (!chunk_ok(&chunks[i])) return -1;
        n += (chunks[i].n + rpt - 1) / rpt;
    }
    return n > 0x7fffffff ? -1 : (int)n;
}

// Sort key: the keys a tile's last row sees (its work), descending; then the plan order.
typedef struct {
    int work, order;
} TileKey;
static int tile_key_cmp(const void *a, const void *b) {
    const TileKey *x = a, *y = b;
    if (x->work != y->work) return x->work > y->work ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

int paged_prefill_plan(const PrefillChunk *chunks, int nchunks, int H, int KV, int *tiles, int cap) {
    const int nt = paged_prefill_num_tiles(chunks, nchunks, H, KV);
    if (nt < 0 || nt > cap) return -1;
    if (nt == 0) return 0;
    const int rpt = paged_prefill_tile_rows(H, KV);
    int *raw = xmalloc((size_t)nt * PP_TILE_INTS * sizeof(int));
    TileKey *key = xmalloc((size_t)nt * sizeof(TileKey));
    int t = 0;
    for (int i = 0; i < nchunks; i++) {
        const PrefillChunk *c = &chunks[i];
        for (int i0 = 0; i0 < c->n; i0 += rpt, t++) {
            const int rows = c->n - i0 < rpt ? c->n - i0 : rpt, kmax0 = c->L - c->n + i0;
            int *d = raw + (size_t)t * PP_TILE_INTS;
            d[0] = c->row0 + i0, d[1] = rows, d[2] = c->seq, d[3] = kmax0;
            key[t].work = kmax0 + rows, key[t].order = t;
        }
    }
    qsort(key, (size_t)nt, sizeof(TileKey), tile_key_cmp);
    for (int i = 0; i < nt; i++)
        for (int k = 0; k < PP_TILE_INTS; k++) tiles[(size_t)i * PP_TILE_INTS + k] = raw[(size_t)key[i].order * PP_TILE_INTS + k];
    free(raw), free(key);
    return nt;
}

void paged_prefill_cpu(const float *q, int ldq, const float *kc, const float *vc, const int *block_tables,
                       int bt_stride, int block_size, const PrefillChunk *chunks, int nchunks, int H, int KV, int hd,
                       float scale, float *out, int ldo) {
    const int g = H / KV;
    const size_t kd = (size_t)KV * hd;
    int lmax = 1;
    for (int i = 0; i < nchunks; i++) lmax = chunks[i].L > lmax ? chunks[i].L : lmax;
    size_t *prow = xmalloc((size_t)lmax * sizeof(size_t));
    double *s = xmalloc((size_t)lmax * sizeof(double)), *acc = xmalloc((size_t)hd * sizeof(double));
    for (int i = 0; i < nchunks; i++) {
        const PrefillChunk *c = &chunks[i];
        const int *tab = block_tables + (size_t)c->seq * bt_stride;
        for (int p = 0; p < c->L; p++) prow[p] = (size_t)tab[p / block_size] * block_size + p % block_size;
        for (int j = 0; j < c->n; j++) {
            const int nk = c->L - c->n + j + 1;  // keys 0 .. L - n + j
            for (int h = 0; h < H; h++) {
                const float *qh = q + (size_t)(c->row0 + j) * ldq + (size_t)h * hd;
                const size_t ko = (size_t)(h / g) * hd;
                double m = -INFINITY, l = 0;
                for (int k = 0; k < nk; k++) {
                    const float *kr = kc + prow[k] * kd + ko;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)qh[e] * kr[e];
                    s[k] = d * scale;
                    m = s[k] > m ? s[k] : m;
                }
                for (int e = 0; e < hd; e++) acc[e] = 0;
                for (int k = 0; k < nk; k++) {
                    const double p = exp(s[k] - m);
                    const float *vr = vc + prow[k] * kd + ko;
                    l += p;
                    for (int e = 0; e < hd; e++) acc[e] += p * vr[e];
                }
                float *o = out + (size_t)(c->row0 + j) * ldo + (size_t)h * hd;
                for (int e = 0; e < hd; e++) o[e] = (float)(acc[e] / l);
            }
        }
    }
    free(prow), free(s), free(acc);
}
