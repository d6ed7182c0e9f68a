// hf_config.c — see hf_config.h. JSON through jansson.
#define _GNU_SOURCE
#include "hf_config.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

const char *model_arch_name(ModelArch a) {
    switch (a) {
    case ARCH_LLAMA: return "LlamaForCausalLM";
    case ARCH_MISTRAL: return "MistralForCausalLM";
    case ARCH_QWEN2: return "Qwen2ForCausalLM";
    case ARCH_QWEN3: return "Qwen3ForCausalLM";
    }
    return "?";
}

static int fail(char *err, int errlen, const char *src, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, (size_t)errlen, "%s: %s", src, msg);
    return -1;
}

// Integer field: required (def < -1 means required) or default.
static int get_int(json_t *o, const char *key, long long def, long long *out, const char *src, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < -1) return fail(err, errlen, src, "missing required field \"%s\"", key);
        *out = def;
        return 0;
    }
    if (json_is_integer(v)) *out = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v)) *out = (long long)json_real_value(v);
    else return fail(err, errlen, src, "field \"%s\" must be an integer", key);
    return 0;
}

static int get_num(json_t *o, const char *key, double def, double *out, const char *src, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return fail(err, errlen, src, "field \"%s\" must be a number", key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *key, int def) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return def;
    return json_is_true(v);
}

#define REQ_INT(field, key)                                                         \
    do {                                                                            \
        long long v_;                                                               \
        if (get_int(root, key, -2, &v_, src, err, errlen)) goto bad;                \
        if (v_ <= 0 || v_ > (1LL << 30)) {                                          \
            fail(err, errlen, src, "field \"%s\" = %lld is out of range", key, v_); \
            goto bad;                                                               \
        }                                                                           \
        cfg->field = (int)v_;                                                       \
    } while (0)

static int parse(const char *json_text, const char *src, ModelConfig *cfg, int lenient, char *err, int errlen) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root) return fail(err, errlen, src, "invalid JSON at line %d: %s", je.line, je.text);
    if (!json_is_object(root)) {
        fail(err, errlen, src, "top level is not a JSON object");
        goto bad;
    }
    // Architecture: "architectures": ["LlamaForCausalLM"], else "model_type".
    const char *arch = NULL;
    json_t *archs = json_object_get(root, "architectures");
    if (json_is_array(archs) && json_array_size(archs) > 0) arch = json_string_value(json_array_get(archs, 0));
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!arch && mt) {
        if (!strcmp(mt, "llama")) arch = "LlamaForCausalLM";
        else if (!strcmp(mt, "mistral")) arch = "MistralForCausalLM";
        else if (!strcmp(mt, "qwen2")) arch = "Qwen2ForCausalLM";
        else if (!strcmp(mt, "qwen3")) arch = "Qwen3ForCausalLM";
    }
    if (!arch) {
        fail(err, errlen, src, "no \"architectures\" or known \"model_type\"%s%s", mt ? " (model_type is " : "", mt ? mt : "");
        goto bad;
    }
    if (!strcmp(arch, "LlamaForCausalLM")) cfg->arch = ARCH_LLAMA;
    else if (!strcmp(arch, "MistralForCausalLM")) cfg->arch = ARCH_MISTRAL;
    else if (!strcmp(arch, "Qwen2ForCausalLM")) cfg->arch = ARCH_QWEN2;
    else if (!strcmp(arch, "Qwen3ForCausalLM")) cfg->arch = ARCH_QWEN3;
    else {
        fail(err, errlen, src, "architecture \"%s\" is not supported (supported: LlamaForCausalLM, "
             "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)", arch);
        goto bad;
    }

    REQ_INT(hidden, "hidden_size");
    REQ_INT(intermediate, "intermediate_size");
    REQ_INT(n_layers, "num_hidden_layers");
    REQ_INT(n_heads, "num_attention_heads");
    REQ_INT(vocab, "vocab_size");
    long long v = 0;
    if (get_int(root, "num_key_value_heads", cfg->n_heads, &v, src, err, errlen)) goto bad;
    cfg->n_kv_heads = (int)v;
    if (v <= 0 || v > cfg->n_heads || cfg->n_heads % v) {
        fail(err, errlen, src, "num_key_value_heads = %lld must divide num_attention_heads = %d", v, cfg->n_heads);
        goto bad;
    }
    if (get_int(root, "head_dim", 0, &v, src, err, errlen)) goto bad;
    if (v > 0) {
        cfg->head_dim = (int)v;
    } else {
        if (cfg->hidden % cfg->n_heads) {
            fail(err, errlen, src, "hidden_size %d is not divisible by num_attention_heads %d and no head_dim is given",
                 cfg->hidden, cfg->n_heads);
            goto bad;
        }
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    }
    if (cfg->head_dim % 2) {
        fail(err, errlen, src, "head_dim %d must be even for RoPE", cfg->head_dim);
        goto bad;
    }
    if (get_int(root, "max_position_embeddings", 2048, &v, src, err, errlen)) goto bad;
    cfg->max_pos = (int)v;
    double d = 0;
    if (get_num(root, "rms_norm_eps", 1e-6, &d, src, err, errlen)) goto bad;
    cfg->rms_eps = (float)d;
    // Qwen2 and Qwen3 default to tied embeddings in their config classes only when small;
    // the field is almost always explicit. Default false as in LlamaConfig.
    cfg->tie_embeddings = get_bool(root, "tie_word_embeddings", 0);

    // Biases and norms per architecture.
    int attention_bias = get_bool(root, "attention_bias", 0);
    cfg->mlp_bias = get_bool(root, "mlp_bias", 0);
    switch (cfg->arch) {
    case ARCH_QWEN2:
        cfg->qkv_bias = 1;  // Qwen2 always has q/k/v bias, never o_proj bias
        break;
    case ARCH_QWEN3:
        cfg->qk_norm = 1;
        cfg->qkv_bias = cfg->o_bias = attention_bias;
        break;
    default:
        cfg->qkv_bias = cfg->o_bias = attention_bias;
    }

    // Sliding window: Mistral v0.1 sets 4096; an active window changes attention, refuse it
    // unless it covers every position the model can see.
    json_t *sw = json_object_get(root, "sliding_window");
    if (sw && json_is_integer(sw) && json_integer_value(sw) > 0) {
        int use_sw = get_bool(root, "use_sliding_window", cfg->arch == ARCH_MISTRAL);
        if (use_sw && json_integer_value(sw) < cfg->max_pos) {
            fail(lenient ? cfg->unsupported : err, lenient ? (int)sizeof cfg->unsupported : errlen, src,
                 "sliding_window = %lld (< max_position_embeddings %d) is not implemented",
                 (long long)json_integer_value(sw), cfg->max_pos);
            if (!lenient) goto bad;
        }
    }

    // RoPE: transformers 5 "rope_parameters", else top-level "rope_theta" + "rope_scaling".
    json_t *rp = json_object_get(root, "rope_parameters");
    json_t *rs = json_object_get(root, "rope_scaling");
    if (get_num(root, "rope_theta", 10000.0, &cfg->rope_theta, src, err, errlen)) goto bad;
    json_t *scal = NULL;
    if (json_is_object(rp)) {
        if (get_num(rp, "rope_theta", cfg->rope_theta, &cfg->rope_theta, src, err, errlen)) goto bad;
        scal = rp;
    } else if (rp && !json_is_null(rp)) {
        fail(err, errlen, src, "\"rope_parameters\" must be an object");
        goto bad;
    }
    if (json_is_object(rs)) scal = rs;
    cfg->rope_type = ROPE_DEFAULT;
    if (scal) {
        const char *rt = json_string_value(json_object_get(scal, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(scal, "type"));
        if (!rt || !strcmp(rt, "default")) {
            cfg->rope_type = ROPE_DEFAULT;
        } else if (!strcmp(rt, "llama3")) {
            cfg->rope_type = ROPE_LLAMA3;
            if (get_num(scal, "factor", 8.0, &cfg->rope_factor, src, err, errlen) ||
                get_num(scal, "low_freq_factor", 1.0, &cfg->rope_low_freq_factor, src, err, errlen) ||
                get_num(scal, "high_freq_factor", 4.0, &cfg->rope_high_freq_factor, src, err, errlen) ||
                get_int(scal, "original_max_position_embeddings", 8192, &v, src, err, errlen))
                goto bad;
            cfg->rope_original_max_pos = (int)v;
            if (cfg->rope_factor <= 0 || cfg->rope_low_freq_factor <= 0 ||
                cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor) {
                fail(err, errlen, src, "llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0");
                goto bad;
            }
        } else {
            fail(lenient ? cfg->unsupported : err, lenient ? (int)sizeof cfg->unsupported : errlen, src,
                 "rope type \"%s\" is not implemented (only default and llama3)", rt);
            if (!lenient) goto bad;
        }
    }
    if (cfg->rope_theta <= 0) {
        fail(err, errlen, src, "rope_theta must be > 0");
        goto bad;
    }

    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));
    if (!dt) dt = json_string_value(json_object_get(root, "dtype"));  // transformers 5
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", dt ? dt : "");
    if (get_int(root, "bos_token_id", -1, &v, src, err, errlen)) goto bad;
    cfg->bos_token_id = (int)v;
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(eos)) {
        cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *e;
        json_array_foreach(eos, i, e) if (json_is_integer(e) && cfg->n_eos < 8) cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(e);
    }
    json_decref(root);
    return 0;
bad:
    json_decref(root);
    return -1;
}

int hf_config_parse(const char *json_text, const char *src, ModelConfig *cfg, char *err, int errlen) {
    return parse(json_text, src, cfg, 0, err, errlen);
}

int hf_config_parse_lenient(const char *json_text, const char *src, ModelConfig *cfg, char *err, int errlen) {
    return parse(json_text, src, cfg, 1, err, errlen);
}

static int load(const char *path, ModelConfig *cfg, int lenient, char *err, int errlen) {
    char full[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(full, sizeof full, "%s/config.json", path);
    else snprintf(full, sizeof full, "%s", path);
    FILE *f = fopen(full, "rb");
    if (!f) return fail(err, errlen, full, "cannot open (does the file exist?)");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (16 << 20)) {
        fclose(f);
        return fail(err, errlen, full, "unexpected size %ld bytes for a config.json", n);
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return fail(err, errlen, full, "read failed");
    }
    buf[n] = 0;
    fclose(f);
    int rc = parse(buf, full, cfg, lenient, err, errlen);
    free(buf);
    return rc;
}

int hf_config_load(const char *path, ModelConfig *cfg, char *err, int errlen) { return load(path, cfg, 0, err, errlen); }

int hf_config_load_lenient(const char *path, ModelConfig *cfg, char *err, int errlen) {
    return load(path, cfg, 1, err, errlen);
}
