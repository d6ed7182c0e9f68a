// export_cpu.c — train_export_hf (export.h): the trained parameter buffer as a Hugging Face
// directory. JSON through jansson, the weights through st_write (common/safetensors.h).
//
// What makes a directory "Hugging Face": the config keys of the architecture's config class
// (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config), the tensor names of its modules (the
// ones train.h already lays the buffer out under), and a tokenizer.json of the `tokenizers`
// library. Each combination of features this trainer supports is checked to be expressible in
// the architecture's config (Qwen2 always has q/k/v biases and no o_proj bias; Mistral has no
// biases; only Qwen3 has q/k norm), since a config that says otherwise would load other modules.
#define _GNU_SOURCE
#include "export.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "step08_ddp/task.h"

// The files written, for the clean-up of a failed export.
static const char *const FILES[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                    "tokenizer_config.json", "batch.json", "c_grads.safetensors", "c_loss.json"};

const char *export_symbol_text(int i, char *buf, size_t n) {
    if (i < 0 || i >= EXPORT_MAX_SYMBOLS || n < 5) return NULL;
    if (i < 62) {
        const char *alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        buf[0] = alpha[i], buf[1] = 0;
        return buf;
    }
    const unsigned cp = 0x4E00u + (unsigned)(i - 62);  // three UTF-8 bytes: 1110xxxx 10xxxxxx 10xxxxxx
    buf[0] = (char)(0xE0 | (cp >> 12)), buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), buf[2] = (char)(0x80 | (cp & 0x3F));
    buf[3] = 0;
    return buf;
}

// Round to nearest bf16, ties to even (the top 16 bits of the float after rounding); NaN stays NaN.
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// The shortest decimal that reads back as this float (1e-05, not 9.99999975e-06), as a double.
static double float_as_written(float x) {
    char b[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)x);
        if (strtof(b, NULL) == x) break;
    }
    return strtod(b, NULL);
}

// A token id, or null when there is none (-1): HF's config classes default bos/eos to ids of
// their own vocabularies (LlamaConfig: 1 and 2), so "none" must be written, not left out.
static json_t *id_or_null(int id) { return id >= 0 ? json_integer(id) : json_null(); }

static const char *model_type(ModelArch a) {
    switch (a) {
    case ARCH_LLAMA: return "llama";
    case ARCH_MISTRAL: return "mistral";
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    }
    return "?";
}

// Whether the config class of c->arch can say what c has (see the file header).
static int check_expressible(const ModelConfig *c, char *err, int errlen) {
    const char *an = model_arch_name(c->arch);
    if (c->mlp_bias) return errf(err, errlen, "export: mlp biases are not supported");
    if (c->qk_norm && c->arch != ARCH_QWEN3) return errf(err, errlen, "export: %s has no q/k norm (Qwen3 has)", an);
    if (c->arch == ARCH_QWEN3 && !c->qk_norm) return errf(err, errlen, "export: Qwen3ForCausalLM always has q/k norm");
    if (c->arch == ARCH_QWEN2 && (!c->qkv_bias || c->o_bias))
        return errf(err, errlen, "export: Qwen2ForCausalLM has q/k/v biases and no o_proj bias (this model: q/k/v %s, "
                    "o_proj %s)", c->qkv_bias ? "yes" : "no", c->o_bias ? "yes" : "no");
    if (c->arch == ARCH_MISTRAL && (c->qkv_bias || c->o_bias))
        return errf(err, errlen, "export: MistralForCausalLM has no attention biases");
    if ((c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3) && c->qkv_bias != c->o_bias)
        return errf(err, errlen, "export: %s's attention_bias puts a bias on all of q/k/v/o or on none (this model: "
                    "q/k/v %s, o_proj %s)", an, c->qkv_bias ? "yes" : "no", c->o_bias ? "yes" : "no");
    return 0;
}

static json_t *config_json(const ModelConfig *c, StDtype dtype, int n_sym) {
    json_t *o = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(model_arch_name(c->arch)));
    json_object_set_new(o, "architectures", archs);
    json_object_set_new(o, "model_type", json_string(model_type(c->arch)));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_pos));
    json_object_set_new(o, "rms_norm_eps", json_real(float_as_written(c->rms_eps)));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    if (c->rope_type == ROPE_LLAMA3) {
        json_t *rs = json_object();
        json_object_set_new(rs, "rope_type", json_string("llama3"));
        json_object_set_new(rs, "factor", json_real(c->rope_factor));
        json_object_set_new(rs, "low_freq_factor", json_real(c->rope_low_freq_factor));
        json_object_set_new(rs, "high_freq_factor", json_real(c->rope_high_freq_factor));
        json_object_set_new(rs, "original_max_position_embeddings", json_integer(c->rope_original_max_pos));
        json_object_set_new(o, "rope_scaling", rs);
    } else {
        json_object_set_new(o, "rope_scaling", json_null());
    }
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_embeddings));
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3) json_object_set_new(o, "attention_bias", json_boolean(c->o_bias));
    if (c->arch == ARCH_LLAMA) json_object_set_new(o, "mlp_bias", json_false());
    if (c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3) {
        json_object_set_new(o, "use_sliding_window", json_false());
        json_object_set_new(o, "max_window_layers", json_integer(c->n_layers));
    }
    if (c->arch != ARCH_LLAMA) json_object_set_new(o, "sliding_window", json_null());
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "torch_dtype", json_string(dtype == ST_BF16 ? "bfloat16" : "float32"));
    if (n_sym > 0) {  // the task's BOS; it has no EOS
        json_object_set_new(o, "bos_token_id", json_integer(TASK_BOS));
        json_object_set_new(o, "eos_token_id", json_null());
    } else {
        json_object_set_new(o, "bos_token_id", id_or_null(c->bos_token_id));
        if (c->n_eos == 1) {
            json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_ids[0]));
        } else if (c->n_eos > 1) {
            json_t *e = json_array();
            for (int i = 0; i < c->n_eos; i++) json_array_append_new(e, json_integer(c->eos_token_ids[i]));
            json_object_set_new(o, "eos_token_id", e);
        } else {
            json_object_set_new(o, "eos_token_id", json_null());
        }
    }
    json_object_set_new(o, "pad_token_id", json_null());
    return o;
}

static json_t *generation_json(const json_t *cfg) {
    json_t *g = json_object();
    json_t *bos = json_object_get(cfg, "bos_token_id"), *eos = json_object_get(cfg, "eos_token_id");
    if (!json_is_null(bos)) json_object_set(g, "bos_token_id", bos);
    if (!json_is_null(eos)) json_object_set(g, "eos_token_id", eos);
    json_object_set_new(g, "do_sample", json_false());
    return g;
}

static json_t *added_token(int id, const char *text) {
    json_t *a = json_object();
    json_object_set_new(a, "id", json_integer(id));
    json_object_set_new(a, "content", json_string(text));
    json_object_set_new(a, "single_word", json_false());
    json_object_set_new(a, "lstrip", json_false());
    json_object_set_new(a, "rstrip", json_false());
    json_object_set_new(a, "normalized", json_false());
    json_object_set_new(a, "special", json_true());
    return a;
}

// The simplest tokenizer.json that both common/tokenizer.c and HF `tokenizers` read: a BPE model
// whose vocabulary is single characters and has no merges (so each character of the text is one
// token), no normalizer, no pre-tokenizer (the whole text is one word), BOS and SEP as special
// added tokens (cut out of the text first, so "<bos>" is one id), and the Fuse decoder, which
// joins the tokens' strings (with no decoder HF would join them with spaces).
static json_t *tokenizer_json(int n_sym) {
    json_t *t = json_object(), *added = json_array(), *vocab = json_object(), *model = json_object();
    json_object_set_new(t, "version", json_string("1.0"));
    json_object_set_new(t, "truncation", json_null());
    json_object_set_new(t, "padding", json_null());
    json_array_append_new(added, added_token(TASK_BOS, EXPORT_BOS_TEXT));
    json_array_append_new(added, added_token(TASK_SEP, EXPORT_SEP_TEXT));
    json_object_set_new(t, "added_tokens", added);
    json_object_set_new(t, "normalizer", json_null());
    json_object_set_new(t, "pre_tokenizer", json_null());
    json_object_set_new(t, "post_processor", json_null());
    json_t *dec = json_object();
    json_object_set_new(dec, "type", json_string("Fuse"));
    json_object_set_new(t, "decoder", dec);
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(vocab, EXPORT_BOS_TEXT, json_integer(TASK_BOS));
    json_object_set_new(vocab, EXPORT_SEP_TEXT, json_integer(TASK_SEP));
    for (int i = 0; i < n_sym; i++) {
        char s[8];
        json_object_set_new(vocab, export_symbol_text(i, s, sizeof s), json_integer(TASK_SYM0 + i));
    }
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(t, "model", model);
    return t;
}

static json_t *tokenizer_config_json(int max_pos) {
    json_t *o = json_object();
    json_object_set_new(o, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    json_object_set_new(o, "bos_token", json_string(EXPORT_BOS_TEXT));
    json_object_set_new(o, "sep_token", json_string(EXPORT_SEP_TEXT));
    json_object_set_new(o, "add_bos_token", json_false());
    json_object_set_new(o, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(o, "model_max_length", json_integer(max_pos));
    return o;
}

// Reals with 15 significant digits: every value a config holds (1e-05, 500000.0) reads back
// exactly, without the 17th-digit noise (1.0000000000000001e-05).
static int dump(json_t *o, const char *tmp, const char *name, char *err, int errlen) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", tmp, name);
    const int rc = !o || json_dump_file(o, p, JSON_INDENT(2) | JSON_REAL_PRECISION(15) | JSON_PRESERVE_ORDER);
    return rc ? errf(err, errlen, "%s: write failed: %s", p, strerror(errno)) : 0;
}

// One safetensors file of a buffer laid out as m->params (the weights, or the gradients).
static int write_weights(const TrainModel *m, const float *buf, const char *tmp, const char *file, StDtype dtype,
                         char *err, int errlen) {
    StWriteTensor *wt = xcalloc((size_t)m->n_tensors, sizeof *wt);
    uint16_t *half = NULL;
    if (dtype == ST_BF16) {
        half = xmalloc(m->n_params * sizeof *half);
        for (size_t i = 0; i < m->n_params; i++) half[i] = f32_to_bf16(buf[i]);
    }
    for (int i = 0; i < m->n_tensors; i++) {  // train.h's list: a tied lm_head is not in it
        const TrainTensor *t = &m->tensors[i];
        StWriteTensor *w = &wt[i];
        w->name = t->name, w->dtype = dtype;
        if (t->rows == 1) w->ndim = 1, w->shape[0] = t->cols;  // norms and biases are 1-D in HF
        else w->ndim = 2, w->shape[0] = t->rows, w->shape[1] = t->cols;
        w->data = half ? (const void *)(half + t->off) : (const void *)(buf + t->off);
    }
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", tmp, file);
    const int rc = st_write(p, wt, m->n_tensors, err, errlen);
    free(wt), free(half);
    return rc;
}

static void remove_tmp(const char *tmp) {
    char p[8192];
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", tmp, FILES[i]);
        unlink(p);
    }
    rmdir(tmp);
}

// 1 when path is an empty directory, 0 when it has entries, -1 when it cannot be read.
static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

int train_export_check_dir(const char *dir, char *err, int errlen) {
    struct stat st;
    if (stat(dir, &st)) return 0;
    if (!S_ISDIR(st.st_mode)) return errf(err, errlen, "%s: exists and is not a directory", dir);
    const int e = dir_is_empty(dir);
    if (e < 0) return errf(err, errlen, "%s: cannot read: %s", dir, strerror(errno));
    if (!e) return errf(err, errlen, "%s: exists and is not empty (an export never overwrites: remove it or pick another)", dir);
    return 0;
}

// The batch as (B, T) arrays of ints.
static json_t *int_rows(const int *x, int B, int T) {
    json_t *a = json_array();
    for (int b = 0; b < B; b++) {
        json_t *r = json_array();
        for (int t = 0; t < T; t++) json_array_append_new(r, json_integer(x[(size_t)b * T + t]));
        json_array_append_new(a, r);
    }
    return a;
}

static int write_grad_dump(const TrainModel *m, const TrainGradDump *g, const char *tmp, char *err, int errlen) {
    json_t *b = json_object();
    json_object_set_new(b, "batch", json_integer(g->B));
    json_object_set_new(b, "seq_len", json_integer(g->T));
    json_object_set_new(b, "ignore_index", json_integer(TRAIN_IGNORE));
    json_object_set_new(b, "input_ids", int_rows(g->ids, g->B, g->T));
    json_object_set_new(b, "targets", int_rows(g->targets, g->B, g->T));
    json_object_set_new(b, "loss", json_string("mean over the positions whose target != ignore_index (all B*T "
                                               "positions together) of -log softmax(logits)[target]; targets are "
                                               "already the next tokens (no shift)"));
    json_t *l = json_object();
    json_object_set_new(l, "loss", json_real(g->loss));
    char hex[40];
    snprintf(hex, sizeof hex, "%a", g->loss);  // the double exactly (the JSON real has 15 digits)
    json_object_set_new(l, "loss_hex", json_string(hex));
    json_object_set_new(l, "n_counted", json_integer(g->n_counted));
    const int rc = dump(b, tmp, "batch.json", err, errlen) || dump(l, tmp, "c_loss.json", err, errlen) ||
                   write_weights(m, m->grads, tmp, "c_grads.safetensors", ST_F32, err, errlen);
    json_decref(b), json_decref(l);
    return rc;
}

static int export_dir(const TrainModel *m, const char *dir_in, StDtype dtype, int n_sym, const TrainGradDump *g,
                      char *err, int errlen) {
    const ModelConfig *c = &m->cfg;
    if (dtype != ST_F32 && dtype != ST_BF16)
        return errf(err, errlen, "export: dtype %s is not supported (F32 or BF16)", st_dtype_name(dtype));
    if (n_sym < 0 || n_sym > EXPORT_MAX_SYMBOLS)
        return errf(err, errlen, "export: %d task symbols (the tokenizer has text for 0..%d)", n_sym, EXPORT_MAX_SYMBOLS);
    if (n_sym > 0 && TASK_SYM0 + n_sym > c->vocab)
        return errf(err, errlen, "export: the task's %d ids exceed the model's vocabulary of %d", TASK_SYM0 + n_sym,
                    c->vocab);
    if (check_expressible(c, err, errlen)) return -1;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", dir_in);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = 0;
    if (!dir[0] || strlen(dir) + 16 >= sizeof dir) return errf(err, errlen, "export: bad directory name '%s'", dir_in);
    if (train_export_check_dir(dir, err, errlen)) return -1;
    char tmp[4096 + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", dir);
    if (!mkdtemp(tmp)) return errf(err, errlen, "%s: cannot create a directory beside it: %s", tmp, strerror(errno));
    chmod(tmp, 0755);
    json_t *cfg = config_json(c, dtype, n_sym);
    json_t *gen = generation_json(cfg);
    int rc = write_weights(m, m->params, tmp, "model.safetensors", dtype, err, errlen) ||
             dump(cfg, tmp, "config.json", err, errlen) ||
             dump(gen, tmp, "generation_config.json", err, errlen);
    if (!rc && n_sym > 0) {
        json_t *tok = tokenizer_json(n_sym), *tcfg = tokenizer_config_json(c->max_pos);
        rc = dump(tok, tmp, "tokenizer.json", err, errlen) || dump(tcfg, tmp, "tokenizer_config.json", err, errlen);
        json_decref(tok), json_decref(tcfg);
    }
    json_decref(cfg), json_decref(gen);
    if (!rc && g) rc = write_grad_dump(m, g, tmp, err, errlen);
    // rename onto a missing or empty directory replaces it in one step
    if (!rc && rename(tmp, dir)) rc = errf(err, errlen, "%s: cannot rename %s to it: %s", dir, tmp, strerror(errno));
    if (rc) remove_tmp(tmp);
    return rc ? -1 : 0;
}

int train_export_hf(const TrainModel *m, const char *dir, StDtype dtype, int n_sym, char *err, int errlen) {
    return export_dir(m, dir, dtype, n_sym, NULL, err, errlen);
}

int train_export_grad_dump(const TrainModel *m, const char *dir, int n_sym, const TrainGradDump *g, char *err,
                           int errlen) {
    if (!g || !g->ids || !g->targets || g->B < 1 || g->T < 1)
        return errf(err, errlen, "export: a gradient dump needs the batch (ids, targets, B, T)");
    return export_dir(m, dir, ST_F32, n_sym, g, err, errlen);
}
