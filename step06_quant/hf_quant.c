// hf_quant.c — see hf_quant.h: quantization_config parsing (jansson), GPTQ v1 / AWQ gemm
// tensors unpacked into QWeight, GPTQ v1 packing, and the whole-model writer.
#define _GNU_SOURCE
#include "hf_quant.h"

#include "check.h"
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

const char *const hfq_linear_names[HFQ_N_LINEARS] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                     "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                     "mlp.down_proj"};

// AWQ gemm: nibble k of a word holds output column 8j + AWQ_ORDER[k].
static const int AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// ------------------------------------------------------------------------------ config

// "field = value is not supported (allowed)": value as its JSON text.
static int bad_field(char *err, int errlen, const char *src, const char *field, json_t *v, const char *allowed) {
    char *txt = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    errf(err, errlen, "%s: quantization_config.%s = %s is not supported (%s)", src, field, txt ? txt : "(missing)",
         allowed);
    free(txt);
    return -1;
}

static int get_int(json_t *q, const char *k, int *out) {
    json_t *v = json_object_get(q, k);
    if (!json_is_integer(v) || json_integer_value(v) < -1000000 || json_integer_value(v) > 1000000) return -1;
    *out = (int)json_integer_value(v);
    return 0;
}

// A boolean field: absent gives def; present must be true or false.
static int get_bool(json_t *q, const char *k, int def, int *out) {
    json_t *v = json_object_get(q, k);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return -1;
    *out = json_is_true(v);
    return 0;
}

static int parse_qc(json_t *q, const char *src, HfQuantConfig *c, char *err, int errlen) {
    json_t *m = json_object_get(q, "quant_method");
    const char *ms = json_string_value(m);
    if (!ms || (strcasecmp(ms, "gptq") && strcasecmp(ms, "awq")))
        return bad_field(err, errlen, src, "quant_method", m, "\"gptq\" or \"awq\"");
    const int gptq = !strcasecmp(ms, "gptq");
    if (get_int(q, "bits", &c->bits) || (gptq ? c->bits != 4 && c->bits != 8 : c->bits != 4))
        return bad_field(err, errlen, src, "bits", json_object_get(q, "bits"), gptq ? "gptq: 4 or 8" : "awq: 4");
    if (get_int(q, "group_size", &c->group_size) ||
        (gptq ? c->group_size != 128 && c->group_size != 64 && c->group_size != 32 && c->group_size != -1
              : c->group_size != 128))
        return bad_field(err, errlen, src, "group_size", json_object_get(q, "group_size"),
                         gptq ? "gptq: 128, 64, 32 or -1" : "awq: 128");
    if (gptq) {
        c->method = HFQ_GPTQ;
        if (get_bool(q, "sym", 1, &c->sym)) return bad_field(err, errlen, src, "sym", json_object_get(q, "sym"), "true or false");
        if (get_bool(q, "desc_act", 0, &c->desc_act))
            return bad_field(err, errlen, src, "desc_act", json_object_get(q, "desc_act"), "true or false");
        const char *fk[] = {"checkpoint_format", "format"};
        for (int i = 0; i < 2; i++) {
            json_t *f = json_object_get(q, fk[i]);
            if (f && (!json_is_string(f) || strcmp(json_string_value(f), "gptq")))
                return bad_field(err, errlen, src, fk[i], f, "\"gptq\": the v1 layout with zero points stored minus one");
        }
        int b;
        if (get_bool(q, "lm_head", 0, &c->lm_head))
            return bad_field(err, errlen, src, "lm_head", json_object_get(q, "lm_head"), "true or false");
        if (get_bool(q, "is_marlin_format", 0, &b) || b)
            return bad_field(err, errlen, src, "is_marlin_format", json_object_get(q, "is_marlin_format"), "false");
        json_t *pd = json_object_get(q, "pack_dtype");
        if (pd && (!json_is_string(pd) || strcmp(json_string_value(pd), "int32")))
            return bad_field(err, errlen, src, "pack_dtype", pd, "\"int32\"");
    } else {
        c->method = HFQ_AWQ;
        c->desc_act = 0;
        json_t *v = json_object_get(q, "version");
        if (!json_is_string(v) || strcasecmp(json_string_value(v), "gemm"))
            return bad_field(err, errlen, src, "version", v, "\"gemm\"");
        int zp;
        if (get_bool(q, "zero_point", 1, &zp) || !zp)
            return bad_field(err, errlen, src, "zero_point", json_object_get(q, "zero_point"), "true");
        c->sym = 0;
        json_t *mn = json_object_get(q, "modules_to_not_convert");
        if (mn && !json_is_null(mn) && !(json_is_array(mn) && json_array_size(mn) == 0))
            return bad_field(err, errlen, src, "modules_to_not_convert", mn, "null or []: every linear quantized");
    }
    return 0;
}

int hfq_config_parse(const char *json_text, const char *src, HfQuantConfig *c, char *err, int errlen) {
    memset(c, 0, sizeof *c);
    if (!src) src = "config.json";
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root) return errf(err, errlen, "%s: not valid JSON (line %d: %s)", src, je.line, je.text);
    int rc = 0;
    json_t *q = json_object_get(root, "quantization_config");
    if (!json_is_object(root)) rc = errf(err, errlen, "%s: not a JSON object", src);
    else if (q && !json_is_null(q)) {
        if (!json_is_object(q)) rc = errf(err, errlen, "%s: quantization_config is not a JSON object", src);
        else rc = parse_qc(q, src, c, err, errlen);
    }
    json_decref(root);
    if (rc) memset(c, 0, sizeof *c);
    return rc;
}

static char *read_file(const char *path, size_t *n_out, char *err, int errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = (n + 65536 + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        free(buf);
        errf(err, errlen, "%s: read failed", path);
        return NULL;
    }
    buf[n] = 0;
    if (n_out) *n_out = n;
    return buf;
}

int hfq_config_load(const char *dir, HfQuantConfig *c, char *err, int errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = read_file(path, NULL, err, errlen);
    if (!txt) {
        memset(c, 0, sizeof *c);
        return -1;
    }
    int rc = hfq_config_parse(txt, path, c, err, errlen);
    free(txt);
    return rc;
}

static json_t *qc_object(const HfQuantConfig *c) {
    if (c->method != HFQ_GPTQ || (c->bits != 4 && c->bits != 8)) return NULL;
    json_t *o = json_pack("{s:i, s:s, s:b, s:i, s:s, s:b}", "bits", c->bits, "checkpoint_format", "gptq", "desc_act",
                          c->desc_act, "group_size", c->group_size, "quant_method", "gptq", "sym", c->sym);
    if (o && c->lm_head) json_object_set_new(o, "lm_head", json_true());
    return o;
}

char *hfq_config_json(const HfQuantConfig *c) {
    json_t *o = qc_object(c);
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return s;
}

// ------------------------------------------------------------------------------ QWeight access
// Direct access to quant.h's documented layout (INT4: two per byte, even column low).

static int qw_get(const QWeight *w, int r, int c) {
    if (w->kind == QK_INT8) return w->q[(size_t)r * w->cols + c];
    uint8_t b = w->q[(size_t)r * (w->cols / 2) + c / 2];
    return c & 1 ? b >> 4 : b & 15;
}

static void qw_set(QWeight *w, int r, int c, int q) {
    if (w->kind == QK_INT8) {
        w->q[(size_t)r * w->cols + c] = (uint8_t)q;
        return;
    }
    uint8_t *b = &w->q[(size_t)r * (w->cols / 2) + c / 2];
    *b = c & 1 ? (uint8_t)((*b & 0x0f) | q << 4) : (uint8_t)((*b & 0xf0) | q);
}

static int qw_group(const QWeight *w, int c) { return w->g_idx ? w->g_idx[c] : c / w->group; }

// A QWeight allocated here (calloc), so this file does not depend on qweight_alloc's checks.
static int qw_make(QWeight *w, int bits, int rows, int cols, int group, int n_groups, int sym) {
    memset(w, 0, sizeof *w);
    w->kind = bits == 8 ? QK_INT8 : QK_INT4;
    w->rows = rows, w->cols = cols, w->group = group, w->n_groups = n_groups, w->sym = sym;
    size_t qn = bits == 8 ? (size_t)rows * cols : (size_t)rows * (cols / 2);
    w->q = calloc(qn ? qn : 1, 1);
    w->scales = calloc((size_t)rows * n_groups + 1, sizeof *w->scales);
    if (!sym) w->zeros = calloc((size_t)rows * n_groups + 1, 1);
    return w->q && w->scales && (sym || w->zeros) ? 0 : -1;
}

static void qw_release(QWeight *w) {
    free(w->q);
    free(w->scales);
    free(w->zeros);
    free(w->g_idx);
    memset(w, 0, sizeof *w);
}

// ------------------------------------------------------------------------------ reading

static const StTensor *need(const StSet *st, const char *prefix, const char *suffix, int ndim, int is_int,
                            char *err, int errlen) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const StTensor *t = st_get(st, name);
    if (!t) {
        errf(err, errlen, "tensor '%s' not found (a quantized linear needs .qweight, .qzeros, .scales)", name);
        return NULL;
    }
    int ok_dt = is_int ? t->dtype == ST_I32 : t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F32;
    if (!ok_dt) {
        errf(err, errlen, "tensor '%s': dtype %s, expected %s", name, st_dtype_name(t->dtype), is_int ? "I32" : "F16");
        return NULL;
    }
    if (t->ndim != ndim) {
        char sb[96];
        errf(err, errlen, "tensor '%s': shape %s, expected %d dimensions", name, st_shape_str(t->shape, t->ndim, sb, sizeof sb),
             ndim);
        return NULL;
    }
    return t;
}

static int shape_err(char *err, int errlen, const char *prefix, const char *suffix, const StTensor *t, const char *want) {
    char sb[96];
    return errf(err, errlen, "tensor '%s.%s': shape %s, expected %s", prefix, suffix,
                st_shape_str(t->shape, t->ndim, sb, sizeof sb), want);
}

int hfq_read_linear(const StSet *st, const char *prefix, const HfQuantConfig *c, int rows, int cols, QWeight *w,
                    char *err, int errlen) {
    memset(w, 0, sizeof *w);
    if (c->method != HFQ_GPTQ && c->method != HFQ_AWQ)
        return errf(err, errlen, "%s: the config has no gptq / awq quantization_config", prefix);
    const int gptq = c->method == HFQ_GPTQ, bits = c->bits, per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    const StTensor *tq = need(st, prefix, "qweight", 2, 1, err, errlen);
    const StTensor *tz = tq ? need(st, prefix, "qzeros", 2, 1, err, errlen) : NULL;
    const StTensor *ts = tz ? need(st, prefix, "scales", 2, 0, err, errlen) : NULL;
    if (!ts) return -1;
    // in / out from qweight
    const int64_t in = gptq ? tq->shape[0] * per : tq->shape[0];
    const int64_t out = gptq ? tq->shape[1] : tq->shape[1] * per;
    char want[128];
    if (in <= 0 || out <= 0 || in > (1 << 20) || out > (1 << 20) || (rows && out != rows) || (cols && in != cols)) {
        if (rows && cols)
            snprintf(want, sizeof want, gptq ? "[%d, %d] (in * %d / 32, out)" : "[%d, %d] (in, out * %d / 32)",
                     gptq ? cols / per : cols, gptq ? rows : rows / per, bits);
        else snprintf(want, sizeof want, "non-empty, at most 2^20 inputs and outputs");
        return shape_err(err, errlen, prefix, "qweight", tq, want);
    }
    const int group = c->group_size == -1 ? (int)in : c->group_size;
    if (in % group || (int64_t)out * bits % 32) {
        snprintf(want, sizeof want, "in_features a multiple of group_size %d, out_features of %d", group, per);
        return shape_err(err, errlen, prefix, "qweight", tq, want);
    }
    const int G = (int)(in / group);
    if (ts->shape[0] != G || ts->shape[1] != out) {
        snprintf(want, sizeof want, "[%d, %lld] (groups, out)", G, (long long)out);
        return shape_err(err, errlen, prefix, "scales", ts, want);
    }
    if (tz->shape[0] != G || tz->shape[1] != out / per) {
        snprintf(want, sizeof want, "[%d, %lld] (groups, out * %d / 32)", G, (long long)out / per, bits);
        return shape_err(err, errlen, prefix, "qzeros", tz, want);
    }
    char gname[512];
    snprintf(gname, sizeof gname, "%s.g_idx", prefix);
    const StTensor *tg = gptq ? st_get(st, gname) : NULL;
    if (gptq && c->desc_act && !tg) return errf(err, errlen, "tensor '%s' not found (desc_act is true)", gname);
    if (tg && (tg->dtype != ST_I32 || tg->ndim != 1 || tg->shape[0] != in)) {
        snprintf(want, sizeof want, "I32 [%lld]", (long long)in);
        return shape_err(err, errlen, prefix, "g_idx", tg, want);
    }

    if (qw_make(w, bits, (int)out, (int)in, group, G, c->sym))
        return errf(err, errlen, "%s: out of memory for a %lld x %lld weight", prefix, (long long)out, (long long)in);
    int32_t *buf = malloc((size_t)(tq->numel > tz->numel ? tq->numel : tz->numel) * sizeof *buf + 4);
    float *sf = malloc((size_t)ts->numel * sizeof *sf + 4);
    int rc = -1;
    if (!buf || !sf) {
        errf(err, errlen, "%s: out of memory", prefix);
        goto done;
    }
    // qweight
    st_to_i32(tq, buf);
    for (int64_t i = 0; i < tq->shape[0]; i++)
        for (int64_t j = 0; j < tq->shape[1]; j++) {
            uint32_t word = (uint32_t)buf[i * tq->shape[1] + j];
            for (int k = 0; k < per; k++) {
                int q = (int)(word >> (bits * k) & mask);
                if (gptq) qw_set(w, (int)j, (int)(i * per + k), q);           // along the input
                else qw_set(w, (int)(j * per + AWQ_ORDER[k]), (int)i, q);     // along the output
            }
        }
    // scales (groups, out) -> (out, groups)
    st_to_f32(ts, sf);
    for (int g = 0; g < G; g++)
        for (int64_t o = 0; o < out; o++) w->scales[o * G + g] = sf[g * out + o];
    // zeros
    st_to_i32(tz, buf);
    const int zsym = 1 << (bits - 1);
    for (int g = 0; g < G; g++)
        for (int64_t j = 0; j < tz->shape[1]; j++) {
            uint32_t word = (uint32_t)buf[g * tz->shape[1] + j];
            for (int k = 0; k < per; k++) {
                const int64_t o = gptq ? j * per + k : j * per + AWQ_ORDER[k];
                int stored = (int)(word >> (bits * k) & mask);
                int z = gptq ? stored + 1 : stored;
                if (z > (int)mask) {
                    errf(err, errlen,
                         "tensor '%s.qzeros': group %d, output %lld stores %d: zero point %d is outside 0..%u (GPTQ v1 "
                         "stores z - 1 and cannot hold z = 0)",
                         prefix, g, (long long)o, stored, z, mask);
                    goto done;
                }
                if (c->sym && z != zsym) {
                    errf(err, errlen,
                         "tensor '%s.qzeros': group %d, output %lld has zero point %d, but sym is true (expected %d, "
                         "stored as %d)",
                         prefix, g, (long long)o, z, zsym, zsym - 1);
                    goto done;
                }
                if (!c->sym) w->zeros[o * G + g] = (uint8_t)z;
            }
        }
    // g_idx: kept only when it is not c / group
    if (tg) {
        st_to_i32(tg, buf);
        int trivial = 1;
        for (int64_t i = 0; i < in; i++) {
            if (buf[i] < 0 || buf[i] >= G) {
                errf(err, errlen, "tensor '%s': entry %lld is %d, outside 0..%d", gname, (long long)i, buf[i], G - 1);
                goto done;
            }
            trivial &= buf[i] == i / group;
        }
        if (!trivial && !c->desc_act) {
            errf(err, errlen, "tensor '%s' is not input / group_size, but quantization_config.desc_act is false", gname);
            goto done;
        }
        if (!trivial) {
            w->g_idx = malloc((size_t)in * sizeof *w->g_idx);
            if (!w->g_idx) {
                errf(err, errlen, "%s: out of memory", prefix);
                goto done;
            }
            for (int64_t i = 0; i < in; i++) w->g_idx[i] = buf[i];
        }
    }
    rc = 0;
done:
    free(buf);
    free(sf);
    if (rc) qw_release(w);
    return rc;
}

// ------------------------------------------------------------------------------ GPTQ packing

// float -> IEEE binary16, round to nearest even; overflow to inf, NaN stays NaN.
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff;
    uint32_t m = x & 0x7fffff;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 | (m >> 13) : 0));
    const int32_t he = (int32_t)e - 112;  // the half's exponent field
    if (he >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (he <= 0) {             // a half subnormal (or zero): value / 2^-24 = (1.m << 23) >> (14 - he)
        if (he < -10) return (uint16_t)sign;
        m |= 0x800000;
        const int shift = 14 - he;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (uint32_t)he << 10 | m >> 13, rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // a carry into the exponent is right (up to inf)
    return (uint16_t)(sign | h);
}

void hfq_gptq_tensors_free(HfqGptqTensors *t) {
    free(t->qweight);
    free(t->qzeros);
    free(t->scales);
    free(t->g_idx);
    memset(t, 0, sizeof *t);
}

int hfq_gptq_pack(const QWeight *w, StDtype scale_dtype, HfqGptqTensors *t, char *err, int errlen) {
    memset(t, 0, sizeof *t);
    const int bits = (int)w->kind;
    if (bits != 4 && bits != 8) return errf(err, errlen, "gptq pack: kind %d is not 4 or 8 bits", (int)w->kind);
    if (scale_dtype != ST_F16 && scale_dtype != ST_F32) return errf(err, errlen, "gptq pack: scales must be F16 or F32");
    const int per = 32 / bits, in = w->cols, out = w->rows, G = w->n_groups;
    if (in <= 0 || out <= 0 || G <= 0 || in % per || out % per)
        return errf(err, errlen, "gptq pack: %d x %d weight: in and out must be multiples of %d (32 / bits)", out, in, per);
    t->in = in, t->out = out, t->n_groups = G, t->bits = bits, t->scale_dtype = scale_dtype;
    t->qweight = calloc((size_t)in / per * out, sizeof *t->qweight);
    t->qzeros = calloc((size_t)G * (out / per), sizeof *t->qzeros);
    t->scales = calloc((size_t)G * out, scale_dtype == ST_F16 ? 2 : 4);
    t->g_idx = malloc((size_t)in * sizeof *t->g_idx);
    if (!t->qweight || !t->qzeros || !t->scales || !t->g_idx) {
        hfq_gptq_tensors_free(t);
        return errf(err, errlen, "gptq pack: out of memory");
    }
    for (int c = 0; c < in; c++) {
        int g = qw_group(w, c);
        if (g < 0 || g >= G) {
            hfq_gptq_tensors_free(t);
            return errf(err, errlen, "gptq pack: column %d is in group %d, outside 0..%d", c, g, G - 1);
        }
        t->g_idx[c] = g;
    }
    for (int i = 0; i < in / per; i++)
        for (int o = 0; o < out; o++) {
            uint32_t word = 0;
            for (int k = 0; k < per; k++) word |= (uint32_t)qw_get(w, o, i * per + k) << (bits * k);
            t->qweight[(size_t)i * out + o] = (int32_t)word;
        }
    for (int g = 0; g < G; g++)
        for (int j = 0; j < out / per; j++) {
            uint32_t word = 0;
            for (int k = 0; k < per; k++) {
                const int o = j * per + k;
                const int z = w->sym || !w->zeros ? 1 << (bits - 1) : w->zeros[(size_t)o * G + g];
                if (z < 1 || z > (1 << bits) - 1) {
                    hfq_gptq_tensors_free(t);
                    return errf(err, errlen,
                                "gptq pack: row %d group %d has zero point %d: GPTQ v1 stores z - 1, so z must be in "
                                "1..%d",
                                o, g, z, (1 << bits) - 1);
                }
                word |= (uint32_t)(z - 1) << (bits * k);
            }
            t->qzeros[(size_t)g * (out / per) + j] = (int32_t)word;
        }
    for (int g = 0; g < G; g++)
        for (int o = 0; o < out; o++) {
            float s = w->scales[(size_t)o * G + g];
            if (scale_dtype == ST_F16) ((uint16_t *)t->scales)[(size_t)g * out + o] = f32_to_f16(s);
            else ((float *)t->scales)[(size_t)g * out + o] = s;
        }
    return 0;
}

// ------------------------------------------------------------------------------ whole model

typedef struct {
    char *names[4];
    HfqGptqTensors t;
} Packed;

static int copy_file(const char *from, const char *to, char *err, int errlen) {
    size_t n;
    char *buf = read_file(from, &n, err, errlen);
    if (!buf) return -1;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f)) ok = 0;
    free(buf);
    return ok ? 0 : errf(err, errlen, "%s: write failed: %s", to, strerror(errno));
}

static int check_against(const QWeight *w, const HfQuantConfig *c, const char *name, int rows, int cols, char *err,
                         int errlen) {
    const int group = c->group_size == -1 ? cols : c->group_size;
    if ((int)w->kind != c->bits || w->rows != rows || w->cols != cols || w->group != group || !w->sym != !c->sym ||
        (w->g_idx && !c->desc_act) || !w->q || !w->scales || (!w->sym && !w->zeros))
        return errf(err, errlen,
                    "%s: the quantized weight (%d bits, %d x %d, group %d, sym %d, g_idx %s) does not match the config "
                    "(%d bits, %d x %d, group %d, sym %d, desc_act %d)",
                    name, (int)w->kind, w->rows, w->cols, w->group, w->sym, w->g_idx ? "yes" : "no", c->bits, rows, cols,
                    group, c->sym, c->desc_act);
    return 0;
}

int hfq_write_model(const char *src_dir, const char *out_dir, const HfQuantConfig *c, HfqLinearFn fn, void *ctx,
                    const HfqWriteOpts *opts, char *err, int errlen) {
    if (!c || c->method != HFQ_GPTQ || (c->bits != 4 && c->bits != 8))
        return errf(err, errlen, "hfq_write_model: the config must be gptq with 4 or 8 bits");
    const StDtype sdt = opts && opts->fp32_scales ? ST_F32 : ST_F16;
    ModelWeights m;
    if (model_load(src_dir, &m, err, errlen)) return -1;
    if (m.quantized) {
        model_free(&m);
        return errf(err, errlen, "%s is already a quantized checkpoint (config.json has a quantization_config)", src_dir);
    }
    const int nl = m.cfg.n_layers, nq = nl * HFQ_N_LINEARS + (c->lm_head ? 1 : 0);
    Packed *pk = calloc((size_t)nq + 1, sizeof *pk);
    StWriteTensor *wt = calloc((size_t)m.st.n_tensors + 4 * (size_t)nq + 1, sizeof *wt);
    char path[4096];
    json_t *cfg = NULL, *qo = NULL;
    int rc = -1, nw = 0;
    if (!pk || !wt) {
        errf(err, errlen, "out of memory");
        goto done;
    }
    for (int l = 0; l <= nl; l++)
        for (int k = 0; k < HFQ_N_LINEARS; k++) {
            const int lm = l == nl;  // the lm_head, after the layers, when the config quantizes it
            if (lm && (!c->lm_head || k > 0)) break;
            Packed *p = &pk[l * HFQ_N_LINEARS + k];
            char prefix[256], wname[300];
            if (lm) snprintf(prefix, sizeof prefix, "lm_head");
            else snprintf(prefix, sizeof prefix, "model.layers.%d.%s", l, hfq_linear_names[k]);
            snprintf(wname, sizeof wname, "%s.weight", prefix);
            const StTensor *src = lm ? m.lm_head : st_get(&m.st, wname);
            if (!src || src->ndim != 2) {
                errf(err, errlen, "%s: tensor '%s' not found or not 2-D", src_dir, wname);
                goto done;
            }
            const int rows = (int)src->shape[0], cols = (int)src->shape[1];
            float *W = malloc((size_t)src->numel * sizeof *W);
            if (!W) {
                errf(err, errlen, "%s: out of memory", wname);
                goto done;
            }
            st_to_f32(src, W);
            QWeight q;
            memset(&q, 0, sizeof q);
            int frc = fn(ctx, l, lm ? HFQ_LM_HEAD : k, prefix, W, rows, cols, &q, err, errlen);
            free(W);
            if (frc) {
                qweight_free(&q);
                goto done;
            }
            frc = check_against(&q, c, prefix, rows, cols, err, errlen) ||
                  hfq_gptq_pack(&q, sdt, &p->t, err, errlen);
            qweight_free(&q);
            if (frc) goto done;
            static const char *const sfx[4] = {"qweight", "qzeros", "scales", "g_idx"};
            for (int s = 0; s < 4; s++) {
                if (asprintf(&p->names[s], "%s.%s", prefix, sfx[s]) < 0) {
                    p->names[s] = NULL;
                    errf(err, errlen, "out of memory");
                    goto done;
                }
            }
            const int per = 32 / c->bits, G = p->t.n_groups;
            wt[nw++] = (StWriteTensor){p->names[0], ST_I32, 2, {cols / per, rows}, p->t.qweight};
            wt[nw++] = (StWriteTensor){p->names[1], ST_I32, 2, {G, rows / per}, p->t.qzeros};
            wt[nw++] = (StWriteTensor){p->names[2], sdt, 2, {G, rows}, p->t.scales};
            wt[nw++] = (StWriteTensor){p->names[3], ST_I32, 1, {cols}, p->t.g_idx};
        }
    // every other tensor as it is
    for (int i = 0; i < m.st.n_tensors; i++) {
        const StTensor *t = &m.st.tensors[i];
        int l = -1, used = 0;
        char rest[256];
        if (sscanf(t->name, "model.layers.%d.%255s", &l, rest) == 2 && l >= 0 && l < nl)
            for (int k = 0; k < HFQ_N_LINEARS; k++) {
                char wn[300];
                snprintf(wn, sizeof wn, "%s.weight", hfq_linear_names[k]);
                used |= !strcmp(rest, wn);
            }
        if (used || (c->lm_head && !strcmp(t->name, "lm_head.weight"))) continue;
        StWriteTensor *w = &wt[nw++];
        w->name = t->name, w->dtype = t->dtype, w->ndim = t->ndim, w->data = t->data;
        for (int d = 0; d < t->ndim; d++) w->shape[d] = t->shape[d];
    }
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        errf(err, errlen, "%s: cannot create: %s", out_dir, strerror(errno));
        goto done;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (st_write(path, wt, nw, err, errlen)) goto done;
    // config.json: the source's + quantization_config
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    json_error_t je;
    cfg = json_load_file(path, 0, &je);
    qo = qc_object(c);
    if (!cfg || !json_is_object(cfg) || !qo) {
        errf(err, errlen, "%s: cannot read as a JSON object", path);
        goto done;
    }
    json_object_set(cfg, "quantization_config", qo);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (json_dump_file(cfg, path, JSON_INDENT(2))) {
        errf(err, errlen, "%s: write failed", path);
        goto done;
    }
    static const char *const tok_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                            "generation_config.json", "tokenizer.model"};
    for (size_t i = 0; i < sizeof tok_files / sizeof tok_files[0]; i++) {
        char from[4096];
        struct stat sb;
        snprintf(from, sizeof from, "%s/%s", src_dir, tok_files[i]);
        if (stat(from, &sb) || !S_ISREG(sb.st_mode)) continue;
        snprintf(path, sizeof path, "%s/%s", out_dir, tok_files[i]);
        if (copy_file(from, path, err, errlen)) goto done;
    }
    rc = 0;
done:
    json_decref(cfg);
    json_decref(qo);
    if (pk)
        for (int i = 0; i < nq; i++) {
            for (int s = 0; s < 4; s++) free(pk[i].names[s]);
            hfq_gptq_tensors_free(&pk[i].t);
        }
    free(pk);
    free(wt);
    model_free(&m);
    return rc;
}
