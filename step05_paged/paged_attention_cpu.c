// paged_attention_cpu.c — the fp32 references of step05's paged kernels (paged_attention.h):
// the K/V write through the slot mapping, decode attention through a block table, and the
// gather of a context. Plain loops, sums in double: the tests and paged_attn_bench compare the
// CUDA kernels against these.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step05_paged/paged_attention.h"

void paged_kv_write_cpu(const float *k, const float *v, int ld, const int *slots, int T, int kd, float *kc, float *vc) {
    for (int t = 0; t < T; t++) {
        if (slots[t] < 0) continue;  // padding row
        memcpy(kc + (size_t)slots[t] * kd, k + (size_t)t * ld, (size_t)kd * sizeof(float));
        memcpy(vc + (size_t)slots[t] * kd, v + (size_t)t * ld, (size_t)kd * sizeof(float));
    }
}

// A work item while paged_decode_order sorts them.
typedef struct {
    int len, row, seq;
} OrderItem;
static int order_cmp(const void *a, const void *b) {
    const OrderItem *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

int paged_decode_order(int *rows, int *seqs, int *lens, int n, int *tmp) {
    OrderItem *it = (OrderItem *)tmp;  // 3 ints each
    int sorted = 1;
    for (int i = 0; i < n; i++) {
        it[i] = (OrderItem){lens[i], rows[i], seqs[i]};
        if (i && order_cmp(&it[i - 1], &it[i]) > 0) sorted = 0;
    }
    if (sorted) return 0;
    qsort(it, (size_t)n, sizeof *it, order_cmp);
    for (int i = 0; i < n; i++) lens[i] = it[i].len, rows[i] = it[i].row, seqs[i] = it[i].seq;
    return 1;
}

// The pool row of position p of sequence seq.
static size_t pool_row(const int *bt, int bt_stride, int B, int seq, int p) {
    return (size_t)bt[(size_t)seq * bt_stride + p / B] * B + p % B;
}

void paged_decode_cpu(const float *q, int ldq, const float *kc, const float *vc, const int *block_tables,
                      int bt_stride, int block_size, const int *rows, const int *seqs, const int *lens, int n, int H,
                      int KV, int hd, float scale, float *out, int ldo) {
    const int g = H / KV;
    const size_t kd = (size_t)KV * hd;
    int maxlen = 1;
    for (int w = 0; w < n; w++) maxlen = lens[w] > maxlen ? lens[w] : maxlen;
    double *s = xmalloc((size_t)maxlen * sizeof(double)), *acc = xmalloc((size_t)hd * sizeof(double));
    for (int w = 0; w < n; w++) {
        const int len = lens[w];
        for (int h = 0; h < H; h++) {
            const float *qh = q + (size_t)rows[w] * ldq + (size_t)h * hd;
            float *o = out + (size_t)rows[w] * ldo + (size_t)h * hd;
            if (len <= 0) {
                memset(o, 0, (size_t)hd * sizeof(float));
                continue;
            }
            const size_t ko = (size_t)(h / g) * hd;
            double m = -INFINITY;
            for (int j = 0; j < len; j++) {
                const float *kr = kc + pool_row(block_tables, bt_stride, block_size, seqs[w], j) * kd + ko;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qh[e] * kr[e];
                s[j] = d * scale;
                m = s[j] > m ? s[j] : m;
            }
            double l = 0;
            for (int e = 0; e < hd; e++) acc[e] = 0;
            for (int j = 0; j < len; j++) {
                const double p = exp(s[j] - m);
                const float *vr = vc + pool_row(block_tables, bt_stride, block_size, seqs[w], j) * kd + ko;
                l += p;
                for (int e = 0; e < hd; e++) acc[e] += p * vr[e];
            }
            for (int e = 0; e < hd; e++) o[e] = (float)(acc[e] / l);
        }
    }
    free(s), free(acc);
}

void paged_gather_cpu(const float *kc, const float *vc, const int *block_tables, int bt_stride, int block_size, int seq,
                      int L, int kd, float *dk, float *dv) {
    for (int p = 0; p < L; p++) {
        const size_t r = pool_row(block_tables, bt_stride, block_size, seq, p);
        memcpy(dk + (size_t)p * kd, kc + r * kd, (size_t)kd * sizeof(float));
        memcpy(dv + (size_t)p * kd, vc + r * kd, (size_t)kd * sizeof(float));
    }
}
