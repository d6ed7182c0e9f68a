// model.c — see model.h. Finds every tensor a Llama-family model needs, by its Hugging Face
// name, and checks its shape against config.json before the forward pass ever sees it.
#define _GNU_SOURCE
#include "model.h"

#include "check.h"

#include <jansson.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



// Look up `name` and check it has exactly the shape (d0) or (d0, d1).
static int want(const ModelWeights *m, const char *dir, const char *name, int ndim, int64_t d0, int64_t d1,
                const StTensor **out, char *err, int errlen) {
    const StTensor *t = st_get(&m->st, name);
    if (!t)
        return errf(err, errlen, "%s: tensor is missing from the checkpoint in %s (%s needs it)", name, dir,
                    model_arch_name(m->cfg.arch));
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return errf(err, errlen, "%s: dtype %s is not supported (in %s)", name, st_dtype_name(t->dtype),
                    m->st.files[t->shard]);
    int64_t exp[2] = {d0, d1};
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == exp[i];
    if (!ok) {
        char a[96], b[96];
        return errf(err, errlen, "%s: expected shape %s, got %s (in %s)", name, st_shape_str(exp, ndim, a, sizeof a),
                    st_shape_str(t->shape, t->ndim, b, sizeof b), m->st.files[t->shard]);
    }
    *out = t;
    return 0;
}

// 1 when DIR/config.json has a "quantization_config" object, 0 when not, -1 (err) when it is not
// an object. (hf_config_load has already read and checked the rest of the file.)
static int has_quant_config(const char *dir, char *err, int errlen) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return errf(err, errlen, "%s: %s (line %d)", path, je.text, je.line);
    const json_t *q = json_object_get(root, "quantization_config");
    const int rc = !q || json_is_null(q) ? 0 : json_is_object(q) ? 1 : -2;
    json_decref(root);
    if (rc == -2) return errf(err, errlen, "%s: quantization_config must be an object", path);
    return rc;
}

int model_load(const char *dir, ModelWeights *m, char *err, int errlen) {
    memset(m, 0, sizeof *m);
    if (hf_config_load(dir, &m->cfg, err, errlen)) return -1;
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    const int quant = has_quant_config(dir, err, errlen);
    if (quant < 0) return -1;
    m->quantized = quant;
    const ModelConfig *c = &m->cfg;
    if (c->mlp_bias)
        return errf(err, errlen, "%s/config.json: mlp_bias is not implemented (gate/up/down projections with biases)",
                    dir);
    if (st_open(dir, &m->st, err, errlen)) return -1;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        errf(err, errlen, "%s: out of memory for %d layers", dir, c->n_layers);
        goto bad;
    }

    const int64_t hidden = c->hidden, inter = c->intermediate, hd = c->head_dim;
    const int64_t q_out = (int64_t)c->n_heads * hd, kv_out = (int64_t)c->n_kv_heads * hd;
#define WANT(name, nd, d0, d1, dst) \
    if (want(m, dir, name, nd, d0, d1, dst, err, errlen)) goto bad
    WANT("model.embed_tokens.weight", 2, c->vocab, hidden, &m->embed);
    WANT("model.norm.weight", 1, hidden, 0, &m->final_norm);
    // Tied: the output projection is the embedding matrix, whatever lm_head.weight the file
    // may also carry (transformers ties them the same way).
    // A quantized checkpoint may hold the lm_head quantized (GPTQ's "lm_head": true: lm_head.qweight
    // and no lm_head.weight): then lm_head is NULL, step06 reads it.
    if (c->tie_embeddings) m->lm_head = m->embed;
    else if (quant && !st_get(&m->st, "lm_head.weight") && st_get(&m->st, "lm_head.qweight")) m->lm_head = NULL;
    else WANT("lm_head.weight", 2, c->vocab, hidden, &m->lm_head);

    char name[256];
    for (int i = 0; i < c->n_layers; i++) {
        LayerTensors *L = &m->layers[i];
#define LW(suffix, nd, d0, d1, dst)                                       \
    do {                                                                  \
        snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix);     \
        WANT(name, nd, d0, d1, dst);                                      \
    } while (0)
        LW("input_layernorm.weight", 1, hidden, 0, &L->attn_norm);
        if (!quant) {  // a quantized checkpoint's projections are step06's to read
            LW("self_attn.q_proj.weight", 2, q_out, hidden, &L->wq);
            LW("self_attn.k_proj.weight", 2, kv_out, hidden, &L->wk);
            LW("self_attn.v_proj.weight", 2, kv_out, hidden, &L->wv);
            LW("self_attn.o_proj.weight", 2, hidden, q_out, &L->wo);
        }
        if (c->qkv_bias) {
            LW("self_attn.q_proj.bias", 1, q_out, 0, &L->bq);
            LW("self_attn.k_proj.bias", 1, kv_out, 0, &L->bk);
            LW("self_attn.v_proj.bias", 1, kv_out, 0, &L->bv);
        }
        if (c->o_bias) LW("self_attn.o_proj.bias", 1, hidden, 0, &L->bo);
        if (c->qk_norm) {
            LW("self_attn.q_norm.weight", 1, hd, 0, &L->q_norm);
            LW("self_attn.k_norm.weight", 1, hd, 0, &L->k_norm);
        }
        LW("post_attention_layernorm.weight", 1, hidden, 0, &L->mlp_norm);
        if (!quant) {
            LW("mlp.gate_proj.weight", 2, inter, hidden, &L->w_gate);
            LW("mlp.up_proj.weight", 2, inter, hidden, &L->w_up);
            LW("mlp.down_proj.weight", 2, hidden, inter, &L->w_down);
        }
#undef LW
    }
#undef WANT
    return 0;
bad:
    model_free(m);
    return -1;
}

void model_free(ModelWeights *m) {
    free(m->layers);
    st_close(&m->st);
    memset(m, 0, sizeof *m);
}
