// quantize.c — write a GPTQ-format (v1) quantized copy of a Hugging Face Llama-family checkpoint:
// round-to-nearest INT8 / INT4, or GPTQ INT4 with calibration on the fp32 CPU model.
//
//   build/bin/quantize --model DIR --out DIR --method rtn-int8|rtn-int4|gptq-int4
//                      [--group 128|-1] [--sym|--asym] [--act-order] [--lm-head] [--calib FILE]
//                      [--calib-tokens N] [--seq-len T] [--damp F] [--block B] [--seed S]
//                      [--eval-tokens N] [--json]
//
// GPTQ's calibration runs layer by layer, as in the paper's code: the calibration sequences'
// hidden states enter layer l after the already-quantized layers 0..l-1; layer l runs once with
// its own fp32 weights to collect the Hessian 2/N X^T X of each linear's input (q/k/v share one,
// gate/up share one), its seven linears are quantized, and then it runs again with the quantized
// (dequantized fp32) weights to produce the hidden states for layer l + 1.
// --lm-head: the lm_head is quantized too, last, in the same format (quantization_config
// "lm_head": true, as GPTQModel's option writes it); GPTQ's Hessian for it is that of the final
// RMSNorm's outputs on the calibration sequences after every quantized layer.
// --eval-tokens N: afterwards, the logits of the quantized model (its dequantized weights, with
// the scales rounded to fp16 exactly as written) against the fp32 model on N random tokens:
// KL(fp32 || quantized) mean and p99 over tokens, and top-1 agreement.
// --json: one JSON object on stdout (the progress lines go to stderr): the method, the weight
// bytes of the quantized linears (as written, in the engine's layout, and as fp32 / bf16), each
// linear's relative output errors (GPTQ), and the evaluation (null without --eval-tokens).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "args.h"
#include "model.h"
#include "safetensors.h"
#include "rng.h"
#include "step02_attention/forward.h"
#include "step06_quant/hf_quant.h"
#include "step06_quant/quant.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: quantize --model DIR --out DIR --method rtn-int8|rtn-int4|gptq-int4 [options]\n"
            "  --group G         inputs per group for INT4 (default 128; -1: one group per row); INT8 is per row\n"
            "  --sym | --asym    symmetric (default) or with zero points\n"
            "  --act-order       GPTQ: columns by decreasing Hessian diagonal (desc_act, writes g_idx)\n"
            "  --lm-head         quantize the lm_head too (quantization_config \"lm_head\": true); default: it stays dense\n"
            "  --calib FILE      GPTQ calibration text (tokenized with DIR/tokenizer.json); default random ids\n"
            "  --calib-tokens N  calibration tokens (default 2048)\n"
            "  --seq-len T       calibration sequence length (default 128, at most max_position_embeddings)\n"
            "  --damp F          GPTQ damping, fraction of mean(diag H) (default 0.01)\n"
            "  --block B         GPTQ lazy block size (default 128)\n"
            "  --seed S          random calibration / evaluation ids (default 1)\n"
            "  --eval-tokens N   then compare logits with the fp32 model on N random tokens (default 0: off)\n"
            "  --json            one JSON summary on stdout (method, weight bytes, layer errors, KL, top-1); log on stderr\n");
}

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n, sz);
    if (!p) {
        fprintf(stderr, "quantize: out of memory\n");
        exit(1);
    }
    return p;
}

typedef struct {
    CpuModel m;       // the model being quantized: layer weights replaced by their dequantized copy
    int gptq, kind, group, sym;
    GptqOpts go;
    int n_seq, T;     // calibration sequences of T tokens
    float *x;         // (n_seq * T, hidden) hidden states entering the current layer
    int ready;        // the layer whose Hessians are collected (-1: none)
    double *H[4];     // input Hessians: q/k/v (d, d), o (qd, qd), gate/up (d, d), down (ff, ff)
    long nH[4];
    FILE *log;        // progress lines: stdout, or stderr with --json
    json_t *linears;  // --json: one record per quantized linear (NULL without)
    long n_weights;   // weights of the quantized linears
    size_t engine_bytes;  // their QWeight bytes in memory (qweight_bytes)
} Ctx;

static float **layer_weight(CpuLayer *L, int which) {
    float **w[HFQ_N_LINEARS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return w[which];
}
static const int hslot[HFQ_N_LINEARS] = {0, 0, 0, 1, 2, 2, 3};

// One decoder layer (step02's ops, one sequence at a time) on x (n_seq * T, d) in place; with
// collect, each linear's input rows go into the Hessians first.
static void layer_run(Ctx *cx, const CpuLayer *L, float *x, int collect) {
    const ModelConfig *c = &cx->m.cfg;
    const int T = cx->T, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd;
    float *xn = xcalloc((size_t)T * d, 4), *tmp = xcalloc((size_t)T * d, 4), *q = xcalloc((size_t)T * qd, 4);
    float *att = xcalloc((size_t)T * qd, 4), *k = xcalloc((size_t)T * kd, 4), *v = xcalloc((size_t)T * kd, 4);
    float *gate = xcalloc((size_t)T * ff, 4), *up = xcalloc((size_t)T * ff, 4);
    float *cs = xcalloc((size_t)T * (hd / 2), 4), *sn = xcalloc((size_t)T * (hd / 2), 4);
    rope_table_cpu(c, 0, T, cs, sn);
    for (int s = 0; s < cx->n_seq; s++) {
        float *xs = x + (size_t)s * T * d;
        rmsnorm_cpu(xs, L->attn_norm, T, d, c->rms_eps, xn);
        if (collect) gptq_hessian_add(cx->H[0], &cx->nH[0], xn, T, d);
        linear_cpu(xn, L->wq, L->bq, T, d, qd, q);
        linear_cpu(xn, L->wk, L->bk, T, d, kd, k);
        linear_cpu(xn, L->wv, L->bv, T, d, kd, v);
        if (L->q_norm) rmsnorm_cpu(q, L->q_norm, T * H, hd, c->rms_eps, q);
        if (L->k_norm) rmsnorm_cpu(k, L->k_norm, T * KV, hd, c->rms_eps, k);
        rope_apply_cpu(q, T, H, hd, qd, cs, sn);
        rope_apply_cpu(k, T, KV, hd, kd, cs, sn);
        attention_cpu(q, k, v, T, H, KV, hd, att);
        if (collect) gptq_hessian_add(cx->H[1], &cx->nH[1], att, T, qd);
        linear_cpu(att, L->wo, L->bo, T, qd, d, tmp);
        add_cpu(xs, tmp, (long)T * d);
        rmsnorm_cpu(xs, L->mlp_norm, T, d, c->rms_eps, xn);
        if (collect) gptq_hessian_add(cx->H[2], &cx->nH[2], xn, T, d);
        linear_cpu(xn, L->w_gate, NULL, T, d, ff, gate);
        linear_cpu(xn, L->w_up, NULL, T, d, ff, up);
        swiglu_cpu(gate, up, (long)T * ff, gate);
        if (collect) gptq_hessian_add(cx->H[3], &cx->nH[3], gate, T, ff);
        linear_cpu(gate, L->w_down, NULL, T, ff, d, tmp);
        add_cpu(xs, tmp, (long)T * d);
    }
    float *bufs[] = {xn, tmp, q, att, k, v, gate, up, cs, sn};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
}

// sqrt(sum_r e_r^T H e_r / sum_r w_r^T H w_r), e = W - D: the layer's relative output error on
// the calibration inputs.
static double rel_out_err(const float *W, const float *D, int rows, int cols, const double *H) {
    double num = 0, den = 0;
    double *e = xcalloc((size_t)cols, 8), *w = xcalloc((size_t)cols, 8);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            w[c] = W[(size_t)r * cols + c];
            e[c] = w[c] - D[(size_t)r * cols + c];
        }
        for (int a = 0; a < cols; a++) {
            double he = 0, hw = 0;
            for (int b = 0; b < cols; b++) {
                he += H[(size_t)a * cols + b] * e[b];
                hw += H[(size_t)a * cols + b] * w[b];
            }
            num += e[a] * he;
            den += w[a] * hw;
        }
    }
    free(e);
    free(w);
    return den > 0 ? sqrt(num / den) : 0.0;
}

// The lm_head's GPTQ Hessian: the final RMSNorm of the hidden states after the last layer (cx->x).
static void lm_head_hessian(Ctx *cx) {
    const ModelConfig *c = &cx->m.cfg;
    const int T = cx->T, d = c->hidden;
    float *xn = xcalloc((size_t)T * d, 4);
    free(cx->H[0]);
    cx->H[0] = xcalloc((size_t)d * d, 8);
    cx->nH[0] = 0;
    for (int s = 0; s < cx->n_seq; s++) {
        rmsnorm_cpu(cx->x + (size_t)s * T * d, cx->m.final_norm, T, d, c->rms_eps, xn);
        gptq_hessian_add(cx->H[0], &cx->nH[0], xn, T, d);
    }
    free(xn);
}

static int on_linear(void *ctx, int layer, int which, const char *name, const float *W, int rows, int cols,
                     QWeight *out, char *err, int errlen) {
    Ctx *cx = ctx;
    const int lm = which == HFQ_LM_HEAD;
    CpuLayer *L = lm ? NULL : &cx->m.layers[layer];
    const char *short_name = lm ? "lm_head" : hfq_linear_names[which];
    int group = cx->group < 0 ? cols : cx->group;
    if (cols % group != 0) {
        snprintf(err, errlen, "%s: --group %d does not divide in_features %d", name, group, cols);
        return -1;
    }
    double rtn_err = -1, q_err = -1;
    float *D = xcalloc((size_t)rows * cols, 4);
    if (cx->gptq) {
        if (lm && cx->ready != layer) {
            lm_head_hessian(cx);
            cx->ready = layer;
        } else if (cx->ready != layer) {  // this layer's Hessians, on inputs from the quantized layers before it
            float *xc = xcalloc((size_t)cx->n_seq * cx->T * cx->m.cfg.hidden, 4);
            memcpy(xc, cx->x, (size_t)cx->n_seq * cx->T * cx->m.cfg.hidden * 4);
            for (int i = 0; i < 4; i++) {
                int n = i == 1 ? cx->m.cfg.n_heads * cx->m.cfg.head_dim : i == 3 ? cx->m.cfg.intermediate : cx->m.cfg.hidden;
                free(cx->H[i]);
                cx->H[i] = xcalloc((size_t)n * n, 8);
                cx->nH[i] = 0;
            }
            layer_run(cx, L, xc, 1);
            free(xc);
            cx->ready = layer;
        }
        const int hs = lm ? 0 : hslot[which];
        const double *H = cx->H[hs];
        if (quant_gptq(W, rows, cols, H, cx->nH[hs], (QuantKind)cx->kind, group, cx->sym, &cx->go, out, err,
                       errlen) != 0) {
            free(D);
            return -1;
        }
        QWeight r;
        if (quant_rtn(W, rows, cols, (QuantKind)cx->kind, group, cx->sym, &r) == 0) {
            qweight_dequant(&r, D);
            rtn_err = rel_out_err(W, D, rows, cols, H);
            qweight_free(&r);
        }
    } else if (quant_rtn(W, rows, cols, (QuantKind)cx->kind, group, cx->sym, out) != 0) {
        snprintf(err, errlen, "%s: cannot quantize (%d x %d, group %d)", name, rows, cols, group);
        free(D);
        return -1;
    }
    // The file stores fp16 scales: round here so that the model kept in memory is the one written.
    qweight_scales_fp16(out);
    qweight_dequant(out, D);
    if (cx->gptq) q_err = rel_out_err(W, D, rows, cols, cx->H[lm ? 0 : hslot[which]]);
    if (lm) {  // the model's output projection becomes D (a tied one leaves the embedding as it is)
        if (cx->m.lm_head != cx->m.embed) free(cx->m.lm_head);
        cx->m.lm_head = D;
    } else {
        memcpy(*layer_weight(L, which), D, (size_t)rows * cols * 4);
        free(D);
    }
    cx->n_weights += (long)rows * cols;
    cx->engine_bytes += qweight_bytes(out);
    if (cx->linears) {
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(layer));
        json_object_set_new(o, "name", json_string(short_name));
        json_object_set_new(o, "rows", json_integer(rows));
        json_object_set_new(o, "cols", json_integer(cols));
        json_object_set_new(o, "gptq_rel_err", cx->gptq ? json_real(q_err) : json_null());
        json_object_set_new(o, "rtn_rel_err", cx->gptq && rtn_err >= 0 ? json_real(rtn_err) : json_null());
        json_array_append_new(cx->linears, o);
    }
    if (cx->gptq)
        fprintf(cx->log, "layer %d %-17s (%5d x %5d): relative output error on calibration inputs: GPTQ %.4f, RTN %.4f\n",
                layer, short_name, rows, cols, q_err, rtn_err);
    else
        fprintf(cx->log, "layer %d %-17s (%5d x %5d): %s round-to-nearest, group %d\n", layer, short_name, rows, cols,
                quant_kind_name((QuantKind)cx->kind), group);
    fflush(cx->log);
    if (cx->gptq && which == HFQ_N_LINEARS - 1) layer_run(cx, L, cx->x, 0);  // inputs of the next layer (or the lm_head)
    return 0;
}

// The bytes of the tensors of dir/model.safetensors: all of them (*total), and those of the
// quantized linears (P.qweight, P.qzeros, P.scales, P.g_idx), as written. 0, or -1 + err.
static int checkpoint_bytes(const char *dir, size_t *total, size_t *quant, char *err, int errlen) {
    static const char *const sfx[] = {".qweight", ".qzeros", ".scales", ".g_idx"};
    StSet st;
    if (st_open(dir, &st, err, errlen) != 0) return -1;
    *total = *quant = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        const size_t n = strlen(t->name);
        *total += t->nbytes;
        for (int k = 0; k < 4; k++) {
            const size_t m = strlen(sfx[k]);
            if (n > m && !strcmp(t->name + n - m, sfx[k])) *quant += t->nbytes;
        }
    }
    st_close(&st);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *model = NULL, *outdir = NULL, *method = NULL, *calib = NULL;
    int group = 128, sym = 1, act = 0, calib_tokens = 2048, seq_len = 128, block = 128, eval_tokens = 0;
    int group_set = 0, json = 0, lm_head = 0;
    double damp = 0.01;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) model = argv[++i];
        else if (!strcmp(a, "--out") && v) outdir = argv[++i];
        else if (!strcmp(a, "--method") && v) method = argv[++i];
        else if (!strcmp(a, "--group") && v) group = (int)arg_int(a, argv[++i], -1, 1 << 20), group_set = 1;
        else if (!strcmp(a, "--sym")) sym = 1;
        else if (!strcmp(a, "--asym")) sym = 0;
        else if (!strcmp(a, "--act-order")) act = 1;
        else if (!strcmp(a, "--lm-head")) lm_head = 1;
        else if (!strcmp(a, "--calib") && v) calib = argv[++i];
        else if (!strcmp(a, "--calib-tokens") && v) calib_tokens = (int)arg_int(a, argv[++i], 1, 1 << 24);
        else if (!strcmp(a, "--seq-len") && v) seq_len = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--damp") && v) damp = arg_float(a, argv[++i], 0, 1, 0);
        else if (!strcmp(a, "--block") && v) block = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--seed") && v) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--eval-tokens") && v) eval_tokens = (int)arg_int(a, argv[++i], 0, 1 << 24);
        else if (!strcmp(a, "--json")) json = 1;
        else arg_help_or_unknown(a, usage);
    }
    if (!model || !outdir || !method) {
        usage(stderr);
        arg_die("--model, --out and --method are required");
    }
    Ctx cx = {0};
    cx.ready = -1;
    cx.log = json ? stderr : stdout;
    if (json) cx.linears = json_array();
    if (!strcmp(method, "rtn-int8")) cx.kind = QK_INT8;
    else if (!strcmp(method, "rtn-int4")) cx.kind = QK_INT4;
    else if (!strcmp(method, "gptq-int4")) cx.kind = QK_INT4, cx.gptq = 1;
    else arg_die("--method: '%s' is not one of rtn-int8, rtn-int4, gptq-int4", method);
    if (group == 0) arg_die("--group: 0 is not allowed (allowed: -1 or 1..)");
    if (cx.kind == QK_INT8) {
        if (group_set && group != -1) arg_die("--group: INT8 is per output row (only -1 is allowed)");
        group = -1;
    }
    if (act && !cx.gptq) arg_die("--act-order needs --method gptq-int4");
    cx.group = group;
    cx.sym = sym;
    cx.go = (GptqOpts){(float)damp, block, act};

    char err[512];
    ModelWeights mw;
    if (model_load(model, &mw, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (cpu_model_load(&mw, &cx.m, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    const ModelConfig *c = &cx.m.cfg;
    fprintf(cx.log, "quantize: %s -> %s, %s, group %d, %s%s%s; %d layers, hidden %d, intermediate %d\n", model, outdir,
            method, group, sym ? "sym" : "asym", act ? ", act-order" : "", lm_head ? ", lm_head too" : "", c->n_layers,
            c->hidden, c->intermediate);
    Rng rng;
    rng_seed(&rng, seed);
    if (cx.gptq) {
        int *ids = NULL, n_ids = 0;
        if (calib) {
            char tp[4096];
            snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
            Tokenizer *tk = tokenizer_load(tp, err, sizeof err);
            if (!tk) {
                fprintf(stderr, "error: --calib needs the model's tokenizer: %s\n", err);
                return 1;
            }
            FILE *f = fopen(calib, "rb");
            if (!f) {
                fprintf(stderr, "error: --calib: cannot open %s\n", calib);
                return 1;
            }
            fseek(f, 0, SEEK_END);
            long len = ftell(f);
            fseek(f, 0, SEEK_SET);
            char *text = xcalloc((size_t)len + 1, 1);
            if (fread(text, 1, (size_t)len, f) != (size_t)len) {
                fprintf(stderr, "error: --calib: cannot read %s\n", calib);
                return 1;
            }
            fclose(f);
            TokIds t = {0};
            if (tokenizer_encode(tk, text, (size_t)len, 0, &t) != 0) {
                fprintf(stderr, "error: --calib: %s\n", tokenizer_error(tk));
                return 1;
            }
            n_ids = (int)(t.n < (size_t)calib_tokens ? t.n : (size_t)calib_tokens);
            ids = xcalloc((size_t)n_ids, sizeof(int));
            for (int i = 0; i < n_ids; i++) ids[i] = t.ids[i];
            tokids_free(&t);
            tokenizer_free(tk);
            free(text);
            fprintf(cx.log, "calibration: %d tokens of %s\n", n_ids, calib);
        } else {
            n_ids = calib_tokens;
            ids = xcalloc((size_t)n_ids, sizeof(int));
            for (int i = 0; i < n_ids; i++) ids[i] = (int)(rng_u32(&rng) % (uint32_t)c->vocab);
            fprintf(cx.log, "calibration: %d random token ids (no --calib: the Hessians see random inputs, not text)\n",
                   n_ids);
        }
        if (c->max_pos > 0 && seq_len > c->max_pos) seq_len = c->max_pos;
        if (seq_len > n_ids) seq_len = n_ids;
        cx.T = seq_len;
        cx.n_seq = n_ids / seq_len;
        fprintf(cx.log, "calibration: %d sequences of %d tokens\n", cx.n_seq, cx.T);
        cx.x = xcalloc((size_t)cx.n_seq * cx.T * c->hidden, 4);
        embed_cpu(cx.m.embed, ids, cx.n_seq * cx.T, c->hidden, cx.x);
        free(ids);
    }
    HfQuantConfig qc = {HFQ_GPTQ, (int)cx.kind, group, sym, act, lm_head};
    if (hfq_write_model(model, outdir, &qc, on_linear, &cx, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    fprintf(cx.log, "wrote %s\n", outdir);
    json_t *root = NULL;
    if (json) {
        size_t src_total, src_q, out_total, out_q;
        if (checkpoint_bytes(model, &src_total, &src_q, err, sizeof err) != 0 ||
            checkpoint_bytes(outdir, &out_total, &out_q, err, sizeof err) != 0) {
            fprintf(stderr, "error: %s\n", err);
            return 1;
        }
        root = json_object();
        json_object_set_new(root, "model", json_string(model));
        json_object_set_new(root, "out", json_string(outdir));
        json_object_set_new(root, "method", json_string(method));
        json_object_set_new(root, "bits", json_integer(cx.kind));
        json_object_set_new(root, "group", json_integer(group));
        json_object_set_new(root, "sym", json_boolean(sym));
        json_object_set_new(root, "act_order", json_boolean(act));
        json_object_set_new(root, "lm_head", json_boolean(lm_head));
        json_object_set_new(root, "layers", json_integer(c->n_layers));
        json_object_set_new(root, "calib_tokens", json_integer(cx.gptq ? (json_int_t)cx.n_seq * cx.T : 0));
        json_t *wb = json_object();  // the quantized linears' weights, in bytes
        json_object_set_new(wb, "n_weights", json_integer(cx.n_weights));
        json_object_set_new(wb, "fp32_bytes", json_integer((json_int_t)cx.n_weights * 4));
        json_object_set_new(wb, "bf16_bytes", json_integer((json_int_t)cx.n_weights * 2));
        json_object_set_new(wb, "checkpoint_bytes", json_integer((json_int_t)out_q));
        json_object_set_new(wb, "engine_bytes", json_integer((json_int_t)cx.engine_bytes));
        json_object_set_new(wb, "checkpoint_bytes_per_weight", json_real((double)out_q / (double)cx.n_weights));
        json_object_set_new(wb, "engine_bytes_per_weight", json_real((double)cx.engine_bytes / (double)cx.n_weights));
        json_object_set_new(wb, "src_file_tensor_bytes", json_integer((json_int_t)src_total));
        json_object_set_new(wb, "out_file_tensor_bytes", json_integer((json_int_t)out_total));
        json_object_set_new(root, "weights", wb);
        json_object_set_new(root, "linears", cx.linears);
        cx.linears = NULL;
        json_object_set_new(root, "eval", json_null());
    }

    if (eval_tokens > 0) {
        CpuModel fp;
        if (cpu_model_load(&mw, &fp, err, sizeof err) != 0) {
            fprintf(stderr, "error: %s\n", err);
            return 1;
        }
        int T = c->max_pos > 0 && c->max_pos < 128 ? c->max_pos : 128, V = c->vocab;
        int n_seq = (eval_tokens + T - 1) / T, n = 0, agree = 0;
        Rng er;
        rng_seed(&er, seed + 1000);
        double *kl = xcalloc((size_t)n_seq * T, 8);
        float *la = xcalloc((size_t)T * V, 4), *lb = xcalloc((size_t)T * V, 4);
        int *ids = xcalloc((size_t)T, sizeof(int));
        for (int s = 0; s < n_seq; s++) {
            for (int t = 0; t < T; t++) ids[t] = (int)(rng_u32(&er) % (uint32_t)V);
            if (forward_cpu(&fp, ids, T, la, NULL) != 0 || forward_cpu(&cx.m, ids, T, lb, NULL) != 0) return 1;
            for (int t = 0; t < T; t++) {
                const float *a = la + (size_t)t * V, *b = lb + (size_t)t * V;
                double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, k = 0;
                int ia = 0, ib = 0;
                for (int j = 0; j < V; j++) {
                    if (a[j] > ma) ma = a[j], ia = j;
                    if (b[j] > mb) mb = b[j], ib = j;
                }
                for (int j = 0; j < V; j++) za += exp(a[j] - ma), zb += exp(b[j] - mb);
                for (int j = 0; j < V; j++) {
                    double lpa = a[j] - ma - log(za), lpb = b[j] - mb - log(zb);
                    k += exp(lpa) * (lpa - lpb);
                }
                kl[n++] = k;
                agree += ia == ib;
            }
        }
        double mean = 0;
        for (int i = 0; i < n; i++) mean += kl[i];
        mean /= n;
        qsort(kl, n, sizeof *kl, cmp_double);
        double p99 = kl[(int)floor(0.99 * (n - 1))];
        fprintf(cx.log, "\neval: %d random tokens (%d sequences of %d), logits of the quantized model vs fp32\n", n, n_seq, T);
        fprintf(cx.log, "| method | group | sym | KL mean | KL p99 | top-1 agreement |\n|---|---|---|---|---|---|\n");
        fprintf(cx.log, "| %s%s%s | %d | %s | %.3g | %.3g | %.4f |\n", method, act ? " act-order" : "",
                lm_head ? " +lm_head" : "", group,
               sym ? "sym" : "asym", mean, p99, (double)agree / n);
        if (root) {
            json_t *ev = json_object();
            json_object_set_new(ev, "tokens", json_integer(n));
            json_object_set_new(ev, "seq_len", json_integer(T));
            json_object_set_new(ev, "kl_mean", json_real(mean));
            json_object_set_new(ev, "kl_p99", json_real(p99));
            json_object_set_new(ev, "top1_agreement", json_real((double)agree / n));
            json_object_set(root, "eval", ev);
            json_decref(ev);
        }
        free(kl);
        free(la);
        free(lb);
        free(ids);
        cpu_model_free(&fp);
    }
    if (root) {
        char *txt = json_dumps(root, JSON_INDENT(1));
        puts(txt);
        free(txt);
        json_decref(root);
    }
    for (int i = 0; i < 4; i++) free(cx.H[i]);
    free(cx.x);
    cpu_model_free(&cx.m);
    model_free(&mw);
    return 0;
}
