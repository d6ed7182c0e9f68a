// linear_rows.c — the row-deterministic GEMM of the batched CPU runner (see linear_rows.h).
//
// Each tile keeps RB x CB accumulators of LANES floats (GCC vector extensions: one AVX register
// each); the k-loop adds x[k..k+7] * w[k..k+7] lane by lane; a tail shorter than LANES is loaded
// zero-padded, so it runs the same instructions. Multiply and add stay separate operations
// (fp-contract off for this file's kernel): every lane is IEEE-rounded the same way whether the
// compiler keeps a tile in registers, which tile slot a row lands in, or the machine has FMA.
#include "linear_rows.h"

#include <stddef.h>
#include <string.h>

enum { LANES = 8, RB = 4, CB = 2, COL_BLOCK = 32 };
typedef float v8 __attribute__((vector_size(LANES * sizeof(float))));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v8 load_tail(const float *p, int n) {  // n < LANES floats, zero-padded
    v8 v = {0};
    for (int i = 0; i < n; i++) v[i] = p[i];
    return v;
}

// acc[r][c] += x_r[k..k+7] * w_c[k..k+7], lane by lane (multiply, then add: two roundings)
__attribute__((optimize("fp-contract=off"))) static inline void step(v8 acc[RB][CB], const v8 xv[RB], const v8 wv[CB]) {
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < CB; c++) acc[r][c] += xv[r] * wv[c];
}

// out[r][c] = dot(x_r, w_c) over n, in the fixed lane order of the header.
static void tile(const float *const xr[RB], const float *const wc[CB], int n, float out[RB][CB]) {
    v8 acc[RB][CB];
    memset(acc, 0, sizeof acc);
    v8 xv[RB], wv[CB];
    int k = 0;
    for (; k + LANES <= n; k += LANES) {
        for (int r = 0; r < RB; r++) xv[r] = load8(xr[r] + k);
        for (int c = 0; c < CB; c++) wv[c] = load8(wc[c] + k);
        step(acc, xv, wv);
    }
    if (k < n) {
        for (int r = 0; r < RB; r++) xv[r] = load_tail(xr[r] + k, n - k);
        for (int c = 0; c < CB; c++) wv[c] = load_tail(wc[c] + k, n - k);
        step(acc, xv, wv);
    }
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < CB; c++) {
            const v8 a = acc[r][c];
            out[r][c] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        }
}

void linear_rows_cpu(const float *x, const float *W, const float *b, int T, int n_in, int n_out, float *y) {
    const int n_blocks = (n_out + COL_BLOCK - 1) / COL_BLOCK;
    // Threads split the output columns; an element's arithmetic does not depend on the split.
#pragma omp parallel for schedule(static) if ((double)T * n_in * n_out >= 2e6)
    for (int jb = 0; jb < n_blocks; jb++) {
        const int j_end = (jb + 1) * COL_BLOCK < n_out ? (jb + 1) * COL_BLOCK : n_out;
        for (int t0 = 0; t0 < T; t0 += RB) {
            const float *xr[RB];
            for (int r = 0; r < RB; r++) xr[r] = x + (size_t)(t0 + r < T ? t0 + r : T - 1) * n_in;
            for (int j0 = jb * COL_BLOCK; j0 < j_end; j0 += CB) {
                const float *wc[CB];
                for (int c = 0; c < CB; c++) wc[c] = W + (size_t)(j0 + c < n_out ? j0 + c : n_out - 1) * n_in;
                float out[RB][CB];
                tile(xr, wc, n_in, out);
                for (int r = 0; r < RB && t0 + r < T; r++)
                    for (int c = 0; c < CB && j0 + c < n_out; c++)
                        y[(size_t)(t0 + r) * n_out + j0 + c] = out[r][c] + (b ? b[j0 + c] : 0.0f);
            }
        }
    }
}
