// hf_config.c — see hf_config.h. JSON through jansson.
#define _GNU_SOURCE
#include "hf_config.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

// The value as written in the file, for messages ("4294967312", "-16", "\"8\"", "true").
static const char *val_text(json_t *v, char *buf, size_t n) {
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(12));
    snprintf(buf, n, "%.60s%s", t ? t : "?", t && strlen(t) > 60 ? "..." : "");
    free(t);
    return buf;
}

// Integer field in lo..hi. def_or_required: REQUIRED, or the value when the field is absent or
// null. A real with an integral value (2048.0) counts as an integer; anything else, or a value
// out of range, is an error naming the field and the value.
#define REQUIRED (-(1LL << 62))
static int get_int(json_t *o, const char *key, long long def_or_required, long long lo, long long hi, long long *out,
                   const char *src, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    char b[96];
    if (!v || json_is_null(v)) {
        if (def_or_required == REQUIRED) return fail(err, errlen, src, "missing required field \"%s\"", key);
        *out = def_or_required;
        return 0;
    }
    long long x;
    const double r = json_is_real(v) ? json_real_value(v) : 0.5;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (r == floor(r) && fabs(r) < 9e18) x = (long long)r;
    else if (r == floor(r)) x = r < 0 ? LLONG_MIN : LLONG_MAX;  // integral but beyond 64 bits: out of range
    else return fail(err, errlen, src, "field \"%s\" = %s is not an integer", key, val_text(v, b, sizeof b));
    if (x < lo || x > hi)
        return fail(err, errlen, src, "field \"%s\" = %s is out of range (allowed: %lld..%lld)", key,
                    val_text(v, b, sizeof b), lo, hi);
    *out = x;
    return 0;
}

// Number field: finite and in [lo, hi] (lo_open: (lo, hi]); def when absent or null.
static int get_num(json_t *o, const char *key, double def, double lo, double hi, int lo_open, double *out,
                   const char *src, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    char b[96];
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return fail(err, errlen, src, "field \"%s\" = %s is not a number", key, val_text(v, b, sizeof b));
    const double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return fail(err, errlen, src, "field \"%s\" = %s is out of range (allowed: %c%g, %g])", key,
                    val_text(v, b, sizeof b), lo_open ? '(' : '[', lo, hi);
    *out = x;
    return 0;
}

// Boolean field: true, false, or absent / null (def).
static int get_bool(json_t *o, const char *key, int def, int *out, const char *src, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    char b[96];
    if (!v || json_is_null(v)) *out = def;
    else if (json_is_boolean(v)) *out = json_is_true(v);
    else return fail(err, errlen, src, "field \"%s\" = %s is not true or false", key, val_text(v, b, sizeof b));
    return 0;
}

// String field (or absent / null: NULL).
static int get_str(json_t *o, const char *key, const char **out, const char *src, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    char b[96];
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return fail(err, errlen, src, "field \"%s\" = %s is not a string", key, val_text(v, b, sizeof b));
    *out = json_string_value(v);
    return 0;
}

// Sizes: each in 1..2^30 (products such as heads x head_dim are checked where they are formed).
#define MAX_SIZE (1LL << 30)
#define REQ_INT(field, key)                                                                 \
    do {                                                                                    \
        long long v_;                                                                       \
        if (get_int(root, key, REQUIRED, 1, MAX_SIZE, &v_, src, err, errlen)) goto bad;     \
        cfg->field = (int)v_;                                                               \
    } while (0)

static int parse(const char *json_text, const char *src, ModelConfig *cfg, int lenient, char *err, int errlen) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root) return fail(err, errlen, src, "invalid JSON at line %d: %s", je.line, je.text);
    char b[96];
    if (!json_is_object(root)) {
        fail(err, errlen, src, "top level is not a JSON object");
        goto bad;
    }
    // Architecture: "architectures": ["LlamaForCausalLM"], else "model_type".
    const char *arch = NULL, *mt = NULL;
    json_t *archs = json_object_get(root, "architectures");
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || json_array_size(archs) == 0 || !json_is_string(json_array_get(archs, 0))) {
            fail(err, errlen, src, "field \"architectures\" = %s is not a list of class names", val_text(archs, b, sizeof b));
            goto bad;
        }
        arch = json_string_value(json_array_get(archs, 0));
    }
    if (get_str(root, "model_type", &mt, src, err, errlen)) goto bad;
    if (!arch && mt) {
        if (!strcmp(mt, "llama")) arch = "LlamaForCausalLM";
        else if (!strcmp(mt, "mistral")) arch = "MistralForCausalLM";
        else if (!strcmp(mt, "qwen2")) arch = "Qwen2ForCausalLM";
        else if (!strcmp(mt, "qwen3")) arch = "Qwen3ForCausalLM";
    }
    if (!arch) {
        fail(err, errlen, src, "no \"architectures\" or known \"model_type\"%s%s%s", mt ? " (model_type is " : "",
             mt ? mt : "", mt ? ")" : "");
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
    if (get_int(root, "num_key_value_heads", cfg->n_heads, 1, cfg->n_heads, &v, src, err, errlen)) goto bad;
    cfg->n_kv_heads = (int)v;
    if (cfg->n_heads % cfg->n_kv_heads) {
        fail(err, errlen, src, "num_key_value_heads = %d must divide num_attention_heads = %d", cfg->n_kv_heads, cfg->n_heads);
        goto bad;
    }
    // head_dim: explicit (Qwen3, some Llamas) or hidden / heads; 0 here means "not given".
    if (get_int(root, "head_dim", 0, 1, 1 << 16, &v, src, err, errlen)) goto bad;
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
    if ((long long)cfg->n_heads * cfg->head_dim > MAX_SIZE) {
        fail(err, errlen, src, "num_attention_heads %d x head_dim %d is out of range (at most %lld)", cfg->n_heads,
             cfg->head_dim, MAX_SIZE);
        goto bad;
    }
    if (get_int(root, "max_position_embeddings", 2048, 1, MAX_SIZE, &v, src, err, errlen)) goto bad;
    cfg->max_pos = (int)v;
    double d = 0;
    if (get_num(root, "rms_norm_eps", 1e-6, 0, 1, 1, &d, src, err, errlen)) goto bad;
    cfg->rms_eps = (float)d;
    // Qwen2 and Qwen3 default to tied embeddings in their config classes only when small;
    // the field is almost always explicit. Default false as in LlamaConfig.
    if (get_bool(root, "tie_word_embeddings", 0, &cfg->tie_embeddings, src, err, errlen)) goto bad;

    // Biases and norms per architecture.
    int attention_bias = 0;
    if (get_bool(root, "attention_bias", 0, &attention_bias, src, err, errlen) ||
        get_bool(root, "mlp_bias", 0, &cfg->mlp_bias, src, err, errlen))
        goto bad;
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
    long long sw = 0;
    int use_sw = 0;
    if (get_int(root, "sliding_window", 0, 0, MAX_SIZE, &sw, src, err, errlen) ||
        get_bool(root, "use_sliding_window", cfg->arch == ARCH_MISTRAL, &use_sw, src, err, errlen))
        goto bad;
    if (sw > 0 && use_sw && sw < cfg->max_pos) {
        fail(lenient ? cfg->unsupported : err, lenient ? (int)sizeof cfg->unsupported : errlen, src,
             "sliding_window = %lld (< max_position_embeddings %d) is not implemented", sw, cfg->max_pos);
        if (!lenient) goto bad;
    }

    // RoPE: transformers 5 "rope_parameters", else top-level "rope_theta" + "rope_scaling".
    json_t *rp = json_object_get(root, "rope_parameters");
    json_t *rs = json_object_get(root, "rope_scaling");
    const char *rkey[2] = {"rope_parameters", "rope_scaling"};
    json_t *rv[2] = {rp, rs};
    for (int i = 0; i < 2; i++)
        if (rv[i] && !json_is_null(rv[i]) && !json_is_object(rv[i])) {
            fail(err, errlen, src, "field \"%s\" = %s is not an object", rkey[i], val_text(rv[i], b, sizeof b));
            goto bad;
        }
    if (get_num(root, "rope_theta", 10000.0, 0, 1e15, 1, &cfg->rope_theta, src, err, errlen)) goto bad;
    json_t *scal = NULL;
    if (json_is_object(rp)) {
        if (get_num(rp, "rope_theta", cfg->rope_theta, 0, 1e15, 1, &cfg->rope_theta, src, err, errlen)) goto bad;
        scal = rp;
    }
    if (json_is_object(rs)) scal = rs;
    cfg->rope_type = ROPE_DEFAULT;
    if (scal) {
        const char *rt = NULL;
        if (get_str(scal, "rope_type", &rt, src, err, errlen)) goto bad;
        if (!rt && get_str(scal, "type", &rt, src, err, errlen)) goto bad;
        if (!rt || !strcmp(rt, "default")) {
            cfg->rope_type = ROPE_DEFAULT;
        } else if (!strcmp(rt, "llama3")) {
            cfg->rope_type = ROPE_LLAMA3;
            if (get_num(scal, "factor", 8.0, 0, 1e6, 1, &cfg->rope_factor, src, err, errlen) ||
                get_num(scal, "low_freq_factor", 1.0, 0, 1e6, 1, &cfg->rope_low_freq_factor, src, err, errlen) ||
                get_num(scal, "high_freq_factor", 4.0, 0, 1e6, 1, &cfg->rope_high_freq_factor, src, err, errlen) ||
                get_int(scal, "original_max_position_embeddings", 8192, 1, MAX_SIZE, &v, src, err, errlen))
                goto bad;
            cfg->rope_original_max_pos = (int)v;
            if (cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor) {
                fail(err, errlen, src, "llama3 rope scaling needs high_freq_factor (%g) > low_freq_factor (%g)",
                     cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
                goto bad;
            }
        } else {
            fail(lenient ? cfg->unsupported : err, lenient ? (int)sizeof cfg->unsupported : errlen, src,
                 "rope type \"%s\" is not implemented (only default and llama3)", rt);
            if (!lenient) goto bad;
        }
    }

    const char *dt = NULL;
    if (get_str(root, "torch_dtype", &dt, src, err, errlen)) goto bad;
    if (!dt && get_str(root, "dtype", &dt, src, err, errlen)) goto bad;  // transformers 5
    if (dt && strlen(dt) >= sizeof cfg->torch_dtype) {
        fail(err, errlen, src, "dtype \"%.40s\" is not a torch dtype name", dt);
        goto bad;
    }
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", dt ? dt : "");
    // Special token ids: ids of this vocabulary (bos -1 when absent).
    if (get_int(root, "bos_token_id", -1, 0, cfg->vocab - 1, &v, src, err, errlen)) goto bad;
    cfg->bos_token_id = (int)v;
    json_t *eos = json_object_get(root, "eos_token_id");
    if (eos && !json_is_null(eos)) {
        const int is_list = json_is_array(eos);
        const size_t ne = is_list ? json_array_size(eos) : 1;
        if (ne > sizeof cfg->eos_token_ids / sizeof cfg->eos_token_ids[0]) {
            fail(err, errlen, src, "field \"eos_token_id\" has %zu ids (at most %zu)", ne,
                 sizeof cfg->eos_token_ids / sizeof cfg->eos_token_ids[0]);
            goto bad;
        }
        for (size_t i = 0; i < ne; i++) {
            json_t *e = is_list ? json_array_get(eos, i) : eos;
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->vocab) {
                fail(err, errlen, src, "field \"eos_token_id\": %s is not a token id (allowed: 0..%d)",
                     val_text(e, b, sizeof b), cfg->vocab - 1);
                goto bad;
            }
            cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(e);
        }
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
