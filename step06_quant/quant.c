// quant.c — step06's quantized linear layer on the CPU: the layout's accessors, round-to-nearest
// INT8 / INT4, GPTQ, and the fp32 reference linear_q_cpu. The contract is quant.h.
//
// GPTQ, as implemented here (Frantar et al. 2022), for one Linear W (rows, cols) and the Hessian
// H = 2/N X^T X of its input rows:
//   1. columns whose diag(H) is 0 (an input that never fires) get H_ii = 1 and W[:, i] = 0;
//   2. act-order: permute the columns (of W and both sides of H) by decreasing diag(H);
//   3. H += damp * mean(diag H) * I; U = the upper Cholesky factor of H^-1 (H^-1 = U^T U);
//   4. for each block of `block` columns, for each column j in it: at a group start, the group's
//      scale (and zero) per row from the current, error-updated weights; q = round(w / s) + z;
//      err = (w - dequant(q)) / U_jj; the later columns of the block get w_k -= err * U_jk now;
//   5. after the block, the columns right of it get W -= Err U[block, right] in one GEMM (the lazy
//      update: the same arithmetic, done once per block instead of once per column).
#include "quant.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// LAPACK from OpenBLAS (column-major; a symmetric matrix reads the same either way).
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info);
extern void dpotri_(const char *uplo, const int *n, double *a, const int *lda, int *info);

const char *quant_kind_name(QuantKind k) { return k == QK_INT8 ? "int8" : k == QK_INT4 ? "int4" : "?"; }

static int kind_ok(QuantKind k) { return k == QK_INT8 || k == QK_INT4; }

int qweight_alloc(QWeight *w, QuantKind kind, int rows, int cols, int group, int sym) {
    memset(w, 0, sizeof *w);
    if (!kind_ok(kind) || rows < 1 || cols < 1 || group < 1 || cols % group != 0) return -1;
    if (kind == QK_INT4 && cols % 2 != 0) return -1;
    w->kind = kind;
    w->rows = rows;
    w->cols = cols;
    w->group = group;
    w->n_groups = cols / group;
    w->sym = sym ? 1 : 0;
    size_t qbytes = kind == QK_INT8 ? (size_t)rows * cols : (size_t)rows * (cols / 2);
    w->q = calloc(qbytes, 1);
    w->scales = calloc((size_t)rows * w->n_groups, sizeof(float));
    if (!sym) w->zeros = calloc((size_t)rows * w->n_groups, 1);
    if (!w->q || !w->scales || (!sym && !w->zeros)) {
        qweight_free(w);
        return -1;
    }
    return 0;
}

void qweight_free(QWeight *w) {
    free(w->q);
    free(w->scales);
    free(w->zeros);
    free(w->g_idx);
    memset(w, 0, sizeof *w);
}

int qweight_stack_rows(const QWeight *const *parts, int n, QWeight *out) {
    if (n < 1) return 1;
    const QWeight *a = parts[0];
    int rows = 0;
    for (int i = 0; i < n; i++) {
        const QWeight *b = parts[i];
        if (b->kind != a->kind || b->cols != a->cols || b->group != a->group || b->n_groups != a->n_groups ||
            b->sym != a->sym || !b->g_idx != !a->g_idx ||
            (a->g_idx && memcmp(a->g_idx, b->g_idx, (size_t)a->cols * sizeof(int)) != 0))
            return 1;
        rows += b->rows;
    }
    QWeight w = *a;
    w.rows = rows;
    const size_t row_q = a->kind == QK_INT8 ? (size_t)a->cols : (size_t)a->cols / 2, ng = (size_t)a->n_groups;
    w.q = malloc((size_t)rows * row_q);
    w.scales = malloc((size_t)rows * ng * sizeof(float));
    w.zeros = a->sym ? NULL : malloc((size_t)rows * ng);
    w.g_idx = a->g_idx ? malloc((size_t)a->cols * sizeof(int)) : NULL;
    if (!w.q || !w.scales || (!a->sym && !w.zeros) || (a->g_idx && !w.g_idx)) {
        qweight_free(&w);
        return -1;
    }
    if (a->g_idx) memcpy(w.g_idx, a->g_idx, (size_t)a->cols * sizeof(int));
    size_t r0 = 0;
    for (int i = 0; i < n; i++) {
        const QWeight *b = parts[i];
        memcpy(w.q + r0 * row_q, b->q, (size_t)b->rows * row_q);
        memcpy(w.scales + r0 * ng, b->scales, (size_t)b->rows * ng * sizeof(float));
        if (w.zeros) memcpy(w.zeros + r0 * ng, b->zeros, (size_t)b->rows * ng);
        r0 += (size_t)b->rows;
    }
    *out = w;
    return 0;
}

int qweight_group_of(const QWeight *w, int c) { return w->g_idx ? w->g_idx[c] : c / w->group; }

int qweight_get(const QWeight *w, int r, int c) {
    if (w->kind == QK_INT8) return w->q[(size_t)r * w->cols + c];
    uint8_t b = w->q[(size_t)r * (w->cols / 2) + c / 2];
    return c % 2 == 0 ? (b & 0x0F) : (b >> 4);
}

void qweight_set(QWeight *w, int r, int c, int q) {
    if (w->kind == QK_INT8) {
        w->q[(size_t)r * w->cols + c] = (uint8_t)q;
        return;
    }
    uint8_t *b = &w->q[(size_t)r * (w->cols / 2) + c / 2];
    if (c % 2 == 0)
        *b = (uint8_t)((*b & 0xF0) | (q & 0x0F));
    else
        *b = (uint8_t)((*b & 0x0F) | ((q & 0x0F) << 4));
}

float qweight_zero(const QWeight *w, int r, int g) {
    if (w->sym || !w->zeros) return (float)(1 << ((int)w->kind - 1));
    return (float)w->zeros[(size_t)r * w->n_groups + g];
}

float qweight_scale(const QWeight *w, int r, int g) { return w->scales[(size_t)r * w->n_groups + g]; }

// One row dequantized: Wr (cols) = (q - z) * s, the one formula every path uses.
static void dequant_row(const QWeight *w, int r, float *Wr) {
    for (int c = 0; c < w->cols; c++) {
        int g = qweight_group_of(w, c);
        Wr[c] = ((float)qweight_get(w, r, c) - qweight_zero(w, r, g)) * qweight_scale(w, r, g);
    }
}

void qweight_dequant(const QWeight *w, float *W) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < w->rows; r++) dequant_row(w, r, W + (size_t)r * w->cols);
}

size_t qweight_bytes(const QWeight *w) {
    size_t qb = w->kind == QK_INT8 ? (size_t)w->rows * w->cols : (size_t)w->rows * (w->cols / 2);
    size_t ng = (size_t)w->rows * w->n_groups;
    return qb + ng * sizeof(float) + (w->zeros ? ng : 0) + (w->g_idx ? (size_t)w->cols * sizeof(int) : 0);
}

// ---------------------------------------------------------------- shared by RTN and GPTQ
// Scale and zero of one row's group from its n values x[0], x[stride], ... (sym: s = max|x| / (2^(b-1) - 1),
// z = 2^(b-1); asym: the range [min(x, 0), max(x, 0)] over 2^b - 1 steps, z = round(-min / s)).
// An all-zero group gets s = 1 (any q = z then dequantizes to exactly 0).
static void find_params(const float *x, int n, long stride, int bits, int sym, float *s, int *z) {
    int maxq = (1 << bits) - 1;
    if (sym) {
        float m = 0.0f;
        for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i * stride]));
        *z = 1 << (bits - 1);
        *s = m > 0.0f ? m / (float)((1 << (bits - 1)) - 1) : 1.0f;
        return;
    }
    float lo = 0.0f, hi = 0.0f;
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i * stride]);
        hi = fmaxf(hi, x[i * stride]);
    }
    if (hi - lo <= 0.0f) {
        *s = 1.0f;
        *z = 0;
        return;
    }
    *s = (hi - lo) / (float)maxq;
    int zz = (int)lrintf(-lo / *s);
    *z = zz < 0 ? 0 : zz > maxq ? maxq : zz;
}

static int quantize_one(float x, float s, int z, int maxq) {
    int q = (int)lrintf(x / s) + z;
    return q < 0 ? 0 : q > maxq ? maxq : q;
}

static void set_params(QWeight *out, int r, int g, float s, int z) {
    out->scales[(size_t)r * out->n_groups + g] = s;
    if (out->zeros) out->zeros[(size_t)r * out->n_groups + g] = (uint8_t)z;
}

int quant_rtn(const float *W, int rows, int cols, QuantKind kind, int group, int sym, QWeight *out) {
    if (qweight_alloc(out, kind, rows, cols, group, sym) != 0) return -1;
    int bits = (int)kind, maxq = (1 << bits) - 1;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        for (int g = 0; g < out->n_groups; g++) {
            const float *x = W + (size_t)r * cols + (size_t)g * group;
            float s;
            int z;
            find_params(x, group, 1, bits, sym, &s, &z);
            set_params(out, r, g, s, z);
            for (int c = 0; c < group; c++) qweight_set(out, r, g * group + c, quantize_one(x[c], s, z, maxq));
        }
    }
    return 0;
}

// ---------------------------------------------------------------- GPTQ
void gptq_hessian_add(double *H, long *n_seen, const float *X, int n, int cols) {
    if (n <= 0) return;
    // Kept as 2/N X^T X at every step: the old sum is rescaled by N_old / N_new.
    long n_new = *n_seen + n;
    double keep = (double)*n_seen / (double)n_new;
    if (*n_seen > 0)
        for (size_t i = 0; i < (size_t)cols * cols; i++) H[i] *= keep;
    double *Xd = malloc((size_t)n * cols * sizeof(double));
    if (!Xd) {
        fprintf(stderr, "gptq_hessian_add: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)n * cols; i++) Xd[i] = X[i];
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, cols, n, 2.0 / (double)n_new, Xd, cols, 1.0, H, cols);
    for (int i = 0; i < cols; i++)
        for (int j = 0; j < i; j++) H[(size_t)i * cols + j] = H[(size_t)j * cols + i];
    free(Xd);
    *n_seen = n_new;
}

typedef struct {
    double d;
    int i;
} DiagIdx;

static int by_diag_desc(const void *a, const void *b) {
    const DiagIdx *x = a, *y = b;
    if (x->d != y->d) return x->d < y->d ? 1 : -1;
    return x->i - y->i;  // ties: lower column first, so the order is deterministic
}

int quant_gptq(const float *W, int rows, int cols, const double *H, long n_seen, QuantKind kind, int group, int sym,
               const GptqOpts *o, QWeight *out, char *err, int errlen) {
    GptqOpts def = {0.01f, 128, 0};
    if (!o) o = &def;
    memset(out, 0, sizeof *out);
    if (n_seen <= 0) {
        snprintf(err, errlen, "gptq: no calibration rows (the Hessian is empty)");
        return -1;
    }
    if (o->block < 1 || !(o->damp >= 0.0f)) {
        snprintf(err, errlen, "gptq: bad options (block %d, damp %g)", o->block, (double)o->damp);
        return -1;
    }
    if (qweight_alloc(out, kind, rows, cols, group, sym) != 0) {
        snprintf(err, errlen, "gptq: bad sizes (%s, %d x %d, group %d)", quant_kind_name(kind), rows, cols, group);
        return -1;
    }
    int n = cols, bits = (int)kind, maxq = (1 << bits) - 1;
    size_t nn = (size_t)n * n;
    double *Hp = malloc(nn * sizeof(double));
    float *Wp = malloc((size_t)rows * n * sizeof(float));  // (rows, cols) permuted, updated in place
    float *U = malloc(nn * sizeof(float));                 // upper Cholesky factor of H^-1, fp32
    float *Err = malloc((size_t)rows * o->block * sizeof(float));  // (rows, block) scaled errors
    int *perm = malloc((size_t)n * sizeof(int));
    DiagIdx *di = malloc((size_t)n * sizeof(DiagIdx));
    int rc = -1;
    if (!Hp || !Wp || !U || !Err || !perm || !di) {
        snprintf(err, errlen, "gptq: out of memory (%d x %d)", rows, cols);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        di[i].d = H[(size_t)i * n + i];
        di[i].i = i;
    }
    if (o->act_order) qsort(di, n, sizeof *di, by_diag_desc);
    for (int j = 0; j < n; j++) perm[j] = di[j].i;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) Hp[(size_t)a * n + b] = H[(size_t)perm[a] * n + perm[b]];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) Wp[(size_t)r * n + j] = W[(size_t)r * cols + perm[j]];
    // Dead inputs: a column that never sees a nonzero input cannot matter; quantize it as 0.
    for (int j = 0; j < n; j++)
        if (Hp[(size_t)j * n + j] == 0.0) {
            Hp[(size_t)j * n + j] = 1.0;
            for (int r = 0; r < rows; r++) Wp[(size_t)r * n + j] = 0.0f;
        }
    double mean_diag = 0.0;
    for (int j = 0; j < n; j++) mean_diag += Hp[(size_t)j * n + j];
    mean_diag /= n;
    for (int j = 0; j < n; j++) Hp[(size_t)j * n + j] += o->damp * mean_diag;
    // H^-1 = (L L^T)^-1, then its Cholesky factor. LAPACK is column-major: its lower factor L of
    // H^-1 = L L^T read row-major is L^T = U, upper, with H^-1 = U^T U.
    int info = 0;
    dpotrf_("L", &n, Hp, &n, &info);
    if (info == 0) dpotri_("L", &n, Hp, &n, &info);
    if (info == 0) {
        for (int a = 0; a < n; a++)  // dpotri fills one triangle: mirror it (column-major lower = row-major upper)
            for (int b = 0; b < a; b++) Hp[(size_t)a * n + b] = Hp[(size_t)b * n + a];
        dpotrf_("L", &n, Hp, &n, &info);
    }
    if (info != 0) {
        snprintf(err, errlen,
                 "gptq: the Hessian (%d x %d) is not positive definite even after damping %g * mean(diag) "
                 "(LAPACK info %d): too few or degenerate calibration rows?",
                 n, n, (double)o->damp, info);
        goto done;
    }
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) U[(size_t)a * n + b] = b >= a ? (float)Hp[(size_t)a * n + b] : 0.0f;

    for (int i1 = 0; i1 < n; i1 += o->block) {
        int i2 = i1 + o->block < n ? i1 + o->block : n, cnt = i2 - i1;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++) {
            float *w = Wp + (size_t)r * n;
            float s = 1.0f;
            int z = 0;
            if (i1 % group != 0) {  // a group begun in an earlier block: its parameters are stored
                int g = i1 / group;
                s = out->scales[(size_t)r * out->n_groups + g];
                z = (int)qweight_zero(out, r, g);
            }
            for (int j = i1; j < i2; j++) {
                if (j % group == 0) {
                    // The group's parameters from the weights as they are now: columns of this block
                    // are fully updated; those right of it lack only this block's pending update.
                    find_params(w + j, group, 1, bits, sym, &s, &z);
                    set_params(out, r, j / group, s, z);
                }
                int q = quantize_one(w[j], s, z, maxq);
                qweight_set(out, r, perm[j], q);
                float e = (w[j] - (float)(q - z) * s) / U[(size_t)j * n + j];
                Err[(size_t)r * o->block + (j - i1)] = e;
                const float *u = U + (size_t)j * n;
                for (int k = j + 1; k < i2; k++) w[k] -= e * u[k];
            }
        }
        if (i2 < n)  // W[:, i2:] -= Err (rows, cnt) U[i1:i2, i2:] (cnt, n - i2)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n - i2, cnt, -1.0f, Err, o->block,
                        U + (size_t)i1 * n + i2, n, 1.0f, Wp + i2, n);
    }
    if (o->act_order) {
        out->g_idx = malloc((size_t)n * sizeof(int));
        if (!out->g_idx) {
            snprintf(err, errlen, "gptq: out of memory");
            goto done;
        }
        for (int j = 0; j < n; j++) out->g_idx[perm[j]] = j / group;
    }
    rc = 0;
done:
    if (rc != 0) qweight_free(out);
    free(Hp);
    free(Wp);
    free(U);
    free(Err);
    free(perm);
    free(di);
    return rc;
}

// ---------------------------------------------------------------- the reference
void linear_q_cpu(const float *X, const QWeight *w, const float *bias, int T, float *Y) {
    int rows = w->rows, cols = w->cols;
#pragma omp parallel
    {
        float *Wr = malloc((size_t)cols * sizeof(float));
        if (!Wr) {
            fprintf(stderr, "linear_q_cpu: out of memory\n");
            exit(1);
        }
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            dequant_row(w, r, Wr);
            for (int t = 0; t < T; t++) {
                const float *x = X + (size_t)t * cols;
                float acc = 0.0f;
                for (int c = 0; c < cols; c++) acc += x[c] * Wr[c];
                Y[(size_t)t * rows + r] = acc + (bias ? bias[r] : 0.0f);
            }
        }
        free(Wr);
    }
}

void qweight_scales_fp16(QWeight *w) {
    const size_t ng = (size_t)w->rows * w->n_groups;
    for (size_t i = 0; i < ng; i++) {
        const float s = w->scales[i];
        w->scales[i] = s > 65504.0f ? 65504.0f : s < -65504.0f ? -65504.0f : (float)(_Float16)s;
    }
}

int qweight_random(QWeight *w, Rng *r, QuantKind kind, int rows, int cols, int group, int sym, int act_order) {
    if (qweight_alloc(w, kind, rows, cols, group, sym)) return -1;
    const size_t qb = kind == QK_INT8 ? (size_t)rows * cols : (size_t)rows * cols / 2;
    for (size_t i = 0; i < qb; i++) w->q[i] = (uint8_t)rng_u32(r);  // any byte holds valid integers
    const size_t ng = (size_t)rows * w->n_groups;
    for (size_t i = 0; i < ng; i++) w->scales[i] = (0.5f + rng_uniform(r)) / 64.0f;
    qweight_scales_fp16(w);
    if (!sym)
        for (size_t i = 0; i < ng; i++) w->zeros[i] = (uint8_t)(rng_u32(r) % (1u << (int)kind));
    if (act_order) {
        int *perm = malloc((size_t)cols * sizeof(int));
        w->g_idx = malloc((size_t)cols * sizeof(int));
        if (!perm || !w->g_idx) {
            free(perm);
            qweight_free(w);
            return -1;
        }
        for (int j = 0; j < cols; j++) perm[j] = j;
        for (int j = cols - 1; j > 0; j--) {
            const int k = (int)(rng_u32(r) % (unsigned)(j + 1)), t = perm[j];
            perm[j] = perm[k], perm[k] = t;
        }
        for (int k = 0; k < cols; k++) w->g_idx[perm[k]] = k / group;
        free(perm);
    }
    return 0;
}
