// qmodel.c — see qmodel.h: where a model's quantized projections come from (a GPTQ / AWQ checkpoint,
// round-to-nearest at load, random), and the CPU / GPU models built with them.
#include "qmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step06_quant/hf_quant.h"

int quant_spec_parse(const char *s, QuantSpec *q) {
    memset(q, 0, sizeof *q);
    q->group = 128;
    const char *plus = strchr(s, '+');
    const size_t n = plus ? (size_t)(plus - s) : strlen(s);
    if (plus) {
        if (strcmp(plus, "+lm_head")) return -1;
        q->lm_head = 1;
    }
    if (n == 4 && !strncmp(s, "none", n) && !plus) q->method = QLOAD_NONE;
    else if (n == 8 && !strncmp(s, "rtn-int8", n)) q->method = QLOAD_RTN_INT8;
    else if (n == 8 && !strncmp(s, "rtn-int4", n)) q->method = QLOAD_RTN_INT4;
    else return -1;
    return 0;
}

// The shapes of projection p: rows (out_features), cols (in_features).
static void proj_shape(const ModelConfig *c, int p, int *rows, int *cols) {
    const int d = c->hidden, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim, ff = c->intermediate;
    const int r[N_PROJ] = {qd, kd, kd, d, ff, ff, d}, k[N_PROJ] = {d, d, d, qd, d, d, ff};
    *rows = r[p], *cols = k[p];
}

// RTN's group for a projection with `cols` inputs; *per_row set when the INT4 group had to be one row.
static int rtn_group(const QuantSpec *q, int cols, int *per_row) {
    if (q->method == QLOAD_RTN_INT8 || q->group == -1) return cols;
    if (cols % q->group == 0) return q->group;
    *per_row = 1;
    return cols;
}

static void rtn_fmt(const QuantSpec *q, int per_row, char *fmt, int fmtlen) {
    if (!fmt) return;
    const char *lm = q->lm_head ? ", lm_head too" : "";
    if (q->method == QLOAD_RTN_INT8) snprintf(fmt, (size_t)fmtlen, "rtn-int8 per-channel sym%s (quantized at load)", lm);
    else if (q->group == -1) snprintf(fmt, (size_t)fmtlen, "rtn-int4 per-row sym%s (quantized at load)", lm);
    else
        snprintf(fmt, (size_t)fmtlen, "rtn-int4 g%d sym%s%s (quantized at load)", q->group,
                 per_row ? ", one group per row where the group does not divide the inputs" : "", lm);
}

static int rtn_one(const float *W, int rows, int cols, const QuantSpec *q, int *per_row, QWeight *out, const char *what,
                   char *err, int errlen) {
    const int g = rtn_group(q, cols, per_row);
    if (quant_rtn(W, rows, cols, (QuantKind)q->method, g, 1, out) != 0)
        return errf(err, errlen, "%s: cannot quantize a (%d, %d) weight to %s with group %d%s", what, rows, cols,
                    quant_kind_name((QuantKind)q->method), g,
                    q->method == QLOAD_RTN_INT4 && cols % 2 ? " (INT4 needs an even number of inputs)" : "");
    qweight_scales_fp16(out);  // as `quantize` writes them: the same model either way
    return 0;
}

void qmodel_linears_free(QWeight *ql, int n_layers) {
    if (!ql) return;
    for (int i = 0; i <= n_layers * N_PROJ; i++) qweight_free(&ql[i]);  // the layers', then the lm_head's slot
    free(ql);
}

static const StTensor *layer_tensor(const LayerTensors *L, int p) {
    const StTensor *t[N_PROJ] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    return t[p];
}

QWeight *qmodel_linears(const ModelWeights *w, const QuantSpec *q, char *fmt, int fmtlen, char *err, int errlen) {
    if (err && errlen > 0) err[0] = 0;
    const ModelConfig *c = &w->cfg;
    if (!w->quantized && q->method == QLOAD_NONE) {
        if (fmt) snprintf(fmt, (size_t)fmtlen, "none (dense weights)");
        return NULL;
    }
    QWeight *ql = xcalloc((size_t)c->n_layers * N_PROJ + 1, sizeof *ql);
    QWeight *lm = &ql[(size_t)c->n_layers * N_PROJ];
    char name[256];
    if (w->quantized) {
        HfQuantConfig hc;
        if (hfq_config_load(w->dir, &hc, err, errlen) != 0) goto bad;
        if (hc.method == HFQ_NONE) {
            errf(err, errlen, "%s/config.json: quantization_config has no quant_method", w->dir);
            goto bad;
        }
        for (int l = 0; l < c->n_layers; l++)
            for (int p = 0; p < N_PROJ; p++) {
                int rows, cols;
                proj_shape(c, p, &rows, &cols);
                snprintf(name, sizeof name, "model.layers.%d.%s", l, hfq_linear_names[p]);
                if (hfq_read_linear(&w->st, name, &hc, rows, cols, &ql[l * N_PROJ + p], err, errlen) != 0) goto bad;
            }
        if (hc.lm_head && hfq_read_linear(&w->st, "lm_head", &hc, c->vocab, c->hidden, lm, err, errlen) != 0) goto bad;
        if (fmt) {
            char g[32];
            if (hc.group_size == -1) snprintf(g, sizeof g, "per-row");
            else snprintf(g, sizeof g, "g%d", hc.group_size);
            snprintf(fmt, (size_t)fmtlen, "%s int%d %s %s%s%s (checkpoint%s)", hc.method == HFQ_GPTQ ? "gptq" : "awq",
                     hc.bits, g, hc.sym ? "sym" : "asym", hc.desc_act ? " act-order" : "", hc.lm_head ? ", lm_head too" : "",
                     q->method != QLOAD_NONE ? "; --quant ignored: it is quantized already" : "");
        }
        return ql;
    }
    int per_row = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int p = 0; p < N_PROJ; p++) {
            const StTensor *t = layer_tensor(&w->layers[l], p);
            float *W = xmalloc((size_t)t->numel * sizeof(float));
            st_to_f32(t, W);
            snprintf(name, sizeof name, "model.layers.%d.%s", l, hfq_linear_names[p]);
            const int rc = rtn_one(W, (int)t->shape[0], (int)t->shape[1], q, &per_row, &ql[l * N_PROJ + p], name, err, errlen);
            free(W);
            if (rc) goto bad;
        }
    if (q->lm_head) {
        const StTensor *t = w->lm_head ? w->lm_head : w->embed;  // tied: the embedding matrix
        float *W = xmalloc((size_t)t->numel * sizeof(float));
        st_to_f32(t, W);
        const int rc = rtn_one(W, c->vocab, c->hidden, q, &per_row, lm, "lm_head", err, errlen);
        free(W);
        if (rc) goto bad;
    }
    rtn_fmt(q, per_row, fmt, fmtlen);
    return ql;
bad:
    qmodel_linears_free(ql, c->n_layers);
    return NULL;
}

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A random symmetric (rows, cols) weight of q's kind: uniform integers, one scale s; `key` seeds it.
static void random_qweight(QWeight *w, const QuantSpec *q, int rows, int cols, uint64_t key, int *per_row) {
    // uniform q over 0 .. 2^b - 1 with z = 2^(b-1): E[(q - z)^2] = (4^b - 1) / 12 + 1/4
    const double levels = (double)(1 << (int)q->method);
    const float s = (float)(0.02 / sqrt((levels * levels - 1) / 12 + 0.25));
    if (qweight_alloc(w, (QuantKind)q->method, rows, cols, rtn_group(q, cols, per_row), 1) != 0)
        die("qmodel: cannot make a random (%d, %d) %s weight", rows, cols, quant_kind_name((QuantKind)q->method));
    const size_t nb = q->method == QLOAD_RTN_INT8 ? (size_t)rows * cols : (size_t)rows * (cols / 2);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nb / 8; i++) {
        const uint64_t r = mix64(key ^ (i * 0xD1B54A32D192ED03ull));
        memcpy(w->q + i * 8, &r, 8);
    }
    for (size_t i = nb / 8 * 8; i < nb; i++) w->q[i] = (uint8_t)mix64(key + i);
    for (size_t i = 0; i < (size_t)rows * w->n_groups; i++) w->scales[i] = s;
    qweight_scales_fp16(w);
}

QWeight *qmodel_random_linears(const ModelConfig *c, const QuantSpec *q, uint64_t seed, char *fmt, int fmtlen) {
    if (q->method == QLOAD_NONE) return NULL;
    QWeight *ql = xcalloc((size_t)c->n_layers * N_PROJ + 1, sizeof *ql);
    int per_row = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int p = 0; p < N_PROJ; p++) {
            int rows, cols;
            proj_shape(c, p, &rows, &cols);
            random_qweight(&ql[l * N_PROJ + p], q, rows, cols, mix64(seed * 1000003ull + (uint64_t)(l * N_PROJ + p)),
                           &per_row);
        }
    if (q->lm_head)
        random_qweight(&ql[(size_t)c->n_layers * N_PROJ], q, c->vocab, c->hidden,
                       mix64(seed * 1000003ull + (uint64_t)c->n_layers * N_PROJ), &per_row);
    if (fmt) {
        rtn_fmt(q, per_row, fmt, fmtlen);
        char *at = strstr(fmt, "(quantized at load)");
        if (at) snprintf(at, (size_t)(fmtlen - (at - fmt)), "(random integers and scales)");
    }
    return ql;
}

int qmodel_quantize_cpu(CpuModel *m, const QuantSpec *q, char *fmt, int fmtlen, char *err, int errlen) {
    const ModelConfig *c = &m->cfg;
    if (q->method == QLOAD_NONE) {
        if (fmt) snprintf(fmt, (size_t)fmtlen, "none (dense weights)");
        return 0;
    }
    int per_row = 0;
    char name[256];
    for (int l = 0; l < c->n_layers; l++) {
        CpuLayer *L = &m->layers[l];
        float **W[N_PROJ] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int p = 0; p < N_PROJ; p++) {
            if (!*W[p]) continue;  // already quantized
            int rows, cols;
            proj_shape(c, p, &rows, &cols);
            QWeight *qw = xcalloc(1, sizeof *qw);
            snprintf(name, sizeof name, "model.layers.%d.%s", l, hfq_linear_names[p]);
            if (rtn_one(*W[p], rows, cols, q, &per_row, qw, name, err, errlen) != 0) {
                free(qw);
                return -1;
            }
            free(*W[p]);
            *W[p] = NULL;
            L->q[p] = qw;
        }
    }
    if (q->lm_head && !m->q_lm_head) {
        QWeight *qw = xcalloc(1, sizeof *qw);
        if (rtn_one(m->lm_head, c->vocab, c->hidden, q, &per_row, qw, "lm_head", err, errlen) != 0) {
            free(qw);
            return -1;
        }
        if (m->lm_head != m->embed) free(m->lm_head);  // tied: the embedding stays for the lookups
        m->lm_head = NULL;
        m->q_lm_head = qw;
    }
    rtn_fmt(q, per_row, fmt, fmtlen);
    return 0;
}

int qmodel_cpu_load(const ModelWeights *w, const QuantSpec *q, CpuModel *m, char *fmt, int fmtlen, char *err, int errlen) {
    if (!w->quantized) {
        if (cpu_model_load(w, m, err, errlen) != 0) return -1;
        if (qmodel_quantize_cpu(m, q, fmt, fmtlen, err, errlen) != 0) {
            cpu_model_free(m);
            return -1;
        }
        return 0;
    }
    QWeight *ql = qmodel_linears(w, q, fmt, fmtlen, err, errlen);
    if (!ql) return -1;
    if (cpu_model_load_base(w, m, err, errlen) != 0) {
        qmodel_linears_free(ql, w->cfg.n_layers);
        return -1;
    }
    for (int l = 0; l < w->cfg.n_layers; l++)
        for (int p = 0; p < N_PROJ; p++) {
            QWeight *qw = xmalloc(sizeof *qw);
            *qw = ql[l * N_PROJ + p];  // moved: the model owns it now
            m->layers[l].q[p] = qw;
        }
    const QWeight *lm = &ql[(size_t)w->cfg.n_layers * N_PROJ];
    if (lm->q) {  // the checkpoint's lm_head is quantized too
        m->q_lm_head = xmalloc(sizeof *m->q_lm_head);
        *m->q_lm_head = *lm;
        if (m->lm_head != m->embed) free(m->lm_head);
        m->lm_head = NULL;
    }
    free(ql);
    return 0;
}

// g with the lm_head of ql's last slot (n_layers * N_PROJ) when it holds one; g freed on failure.
static GpuModel *with_q_lm_head(GpuModel *g, const QWeight *ql, int n_layers, char *err, int errlen) {
    const QWeight *lm = ql ? &ql[(size_t)n_layers * N_PROJ] : NULL;
    if (g && lm && lm->q && gpu_model_quantize_lm_head(g, lm, err, errlen) != 0) {
        gpu_model_free(g);
        g = NULL;
    }
    return g;
}

GpuModel *qmodel_gpu_load(const ModelWeights *w, const QuantSpec *q, char *fmt, int fmtlen, char *err, int errlen) {
    QWeight *ql = qmodel_linears(w, q, fmt, fmtlen, err, errlen);
    if (!ql && err && err[0]) return NULL;
    GpuModel *g = with_q_lm_head(gpu_model_load_q(w, ql, err, errlen), ql, w->cfg.n_layers, err, errlen);
    qmodel_linears_free(ql, w->cfg.n_layers);
    return g;
}

GpuModel *qmodel_gpu_random(const ModelConfig *c, const QuantSpec *q, uint64_t seed, char *fmt, int fmtlen, char *err,
                            int errlen) {
    if (q->method == QLOAD_NONE && fmt) snprintf(fmt, (size_t)fmtlen, "none (dense weights)");
    QWeight *ql = qmodel_random_linears(c, q, seed, fmt, fmtlen);
    GpuModel *g = with_q_lm_head(gpu_model_random_q(c, seed, ql, err, errlen), ql, c->n_layers, err, errlen);
    qmodel_linears_free(ql, c->n_layers);
    return g;
}

double qmodel_cpu_weight_bytes(const CpuModel *m) {
    const ModelConfig *c = &m->cfg;
    double b = (double)c->vocab * c->hidden * 4 * (m->lm_head && m->lm_head != m->embed ? 2 : 1) + c->hidden * 4.0;
    if (m->q_lm_head) b += (double)qweight_bytes(m->q_lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        const CpuLayer *L = &m->layers[l];
        const float *W[N_PROJ] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        const float *bias[N_PROJ] = {L->bq, L->bk, L->bv, L->bo, NULL, NULL, NULL};
        for (int p = 0; p < N_PROJ; p++) {
            int rows, cols;
            proj_shape(c, p, &rows, &cols);
            if (L->q[p]) b += (double)qweight_bytes(L->q[p]);
            else if (W[p]) b += (double)rows * cols * 4;
            if (bias[p]) b += rows * 4.0;
        }
        b += 2.0 * c->hidden * 4 + (L->q_norm ? 2.0 * c->head_dim * 4 : 0);
    }
    return b;
}

int qmodel_load(const ModelWeights *w, const ModelConfig *c, const QuantSpec *q, int use_cuda, GpuModel **gm,
                CpuModel *cm, double *weight_bytes, char *fmt, int fmtlen, char *err, int errlen) {
    if (use_cuda) {
        *gm = w ? qmodel_gpu_load(w, q, fmt, fmtlen, err, errlen) : qmodel_gpu_random(c, q, 1, fmt, fmtlen, err, errlen);
        if (!*gm) return -1;
        *weight_bytes = gpu_model_weight_bytes(*gm);
        return 0;
    }
    if (w) {
        if (qmodel_cpu_load(w, q, cm, fmt, fmtlen, err, errlen) != 0) return -1;
    } else {
        cpu_model_random(c, 1, cm);
        if (qmodel_quantize_cpu(cm, q, fmt, fmtlen, err, errlen) != 0) return -1;
    }
    *weight_bytes = qmodel_cpu_weight_bytes(cm);
    return 0;
}
