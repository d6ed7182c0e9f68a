// test_step06_hf.c — step06's Hugging Face quantized checkpoints (step06_quant/hf_quant.h):
//   - GPTQ (4-bit sym, 4-bit asym, 4-bit desc_act, 8-bit, per-channel) and AWQ gemm 4-bit files
//     written by tools/quant_pack.py (numpy, from the published formats, not from this engine's
//     code; committed under tests/data/quant/, regenerate with `tools/quant_pack.py tests/data/quant`)
//     load to exactly the integers, zero points, scales, groups and dequantized weights the
//     packer holds;
//   - the GPTQ writer reproduces the packer's words bit for bit, and a write / read round trip
//     gives back the same QWeight;
//   - the whole-model writer's output reads back (every linear, every other tensor unchanged,
//     config.json with its quantization_config, tokenizer files);
//   - unsupported quantization_configs and inconsistent tensors are refused, naming the field.
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "npy.h"
#include "fs_util.h"
#include "safetensors.h"
#include "step06_quant/hf_quant.h"
#include "step06_quant/quant.h"

#define QDATA "tests/data/quant"
#define MODEL "tests/data/models/llama_mha_f32"

static const char *const PREFIXES[2] = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"};

static char tmp[64];
static void mk_tmp(void) { test_mkdtemp(tmp, sizeof tmp, "hfq_test"); }
static void rm_tmp(void) { test_rmtree(tmp); }

static void load_npy(const char *variant, const char *prefix, const char *what, NpyArray *a) {
    char path[512];
    snprintf(path, sizeof path, QDATA "/%s/expected/%s.%s.npy", variant, prefix, what);
    cr_assert_eq(npy_load(path, a), 0, "cannot load %s", path);
}

// Load `prefix` of `variant` and compare every field with the packer's arrays.
static void check_variant(const char *variant, int bits, int group, int sym, int desc_act, int method) {
    char err[512];
    HfQuantConfig c;
    cr_assert_eq(hfq_config_load(QDATA "/no-such-dir", &c, err, sizeof err), -1, "a missing config.json is an error");
    char dir[256];
    snprintf(dir, sizeof dir, QDATA "/%s", variant);
    cr_assert_eq(hfq_config_load(dir, &c, err, sizeof err), 0, "%s: %s", variant, err);
    cr_assert_eq((int)c.method, method, "%s method", variant);
    cr_assert_eq(c.bits, bits, "%s bits", variant);
    cr_assert_eq(c.group_size, group, "%s group_size", variant);
    cr_assert_eq(c.sym, sym, "%s sym", variant);
    cr_assert_eq(c.desc_act, desc_act, "%s desc_act", variant);
    StSet st;
    cr_assert_eq(st_open(dir, &st, err, sizeof err), 0, "%s", err);
    for (int p = 0; p < 2; p++) {
        NpyArray q, z, s, g, W;
        load_npy(variant, PREFIXES[p], "q", &q);
        load_npy(variant, PREFIXES[p], "z", &z);
        load_npy(variant, PREFIXES[p], "s", &s);
        load_npy(variant, PREFIXES[p], "g", &g);
        load_npy(variant, PREFIXES[p], "W", &W);
        const int rows = (int)q.shape[0], cols = (int)q.shape[1], G = (int)z.shape[1];
        QWeight w;
        cr_assert_eq(hfq_read_linear(&st, PREFIXES[p], &c, rows, cols, &w, err, sizeof err), 0, "%s %s: %s", variant,
                     PREFIXES[p], err);
        cr_assert(w.rows == rows && w.cols == cols && w.n_groups == G && (int)w.kind == bits && w.sym == sym,
                  "%s %s: %d x %d, %d groups, kind %d, sym %d", variant, PREFIXES[p], w.rows, w.cols, w.n_groups,
                  (int)w.kind, w.sym);
        cr_assert_eq(w.group, group == -1 ? cols : group);
        cr_assert_eq(w.g_idx != NULL, desc_act, "%s: g_idx kept only with desc_act", variant);
        const int *qi = q.data, *zi = z.data, *gi = g.data;
        const float *si = s.data, *Wi = W.data;
        long bad_q = 0, bad_z = 0, bad_s = 0, bad_g = 0, bad_w = 0;
        for (int c2 = 0; c2 < cols; c2++) bad_g += qweight_group_of(&w, c2) != gi[c2];
        for (int r = 0; r < rows; r++) {
            for (int c2 = 0; c2 < cols; c2++) bad_q += qweight_get(&w, r, c2) != qi[(size_t)r * cols + c2];
            for (int k = 0; k < G; k++) {
                bad_z += qweight_zero(&w, r, k) != (float)zi[(size_t)r * G + k];
                bad_s += qweight_scale(&w, r, k) != si[(size_t)r * G + k];
            }
        }
        float *D = malloc((size_t)rows * cols * sizeof *D);
        qweight_dequant(&w, D);
        for (size_t i = 0; i < (size_t)rows * cols; i++) bad_w += D[i] != Wi[i];
        cr_expect(!bad_q && !bad_z && !bad_s && !bad_g && !bad_w,
                  "%s %s: %ld q, %ld zeros, %ld scales, %ld groups, %ld dequantized weights differ from the packer's",
                  variant, PREFIXES[p], bad_q, bad_z, bad_s, bad_g, bad_w);
        free(D);
        qweight_free(&w);
        npy_free(&q), npy_free(&z), npy_free(&s), npy_free(&g), npy_free(&W);
    }
    st_close(&st);
}

Test(step06_hf, gptq_4bit_sym_loads_as_packed) { check_variant("gptq4_sym", 4, 128, 1, 0, HFQ_GPTQ); }
Test(step06_hf, gptq_4bit_asym_zero_minus_one_loads_as_packed) { check_variant("gptq4_asym", 4, 128, 0, 0, HFQ_GPTQ); }
Test(step06_hf, gptq_4bit_desc_act_loads_as_packed) { check_variant("gptq4_act", 4, 128, 1, 1, HFQ_GPTQ); }
Test(step06_hf, gptq_8bit_loads_as_packed) { check_variant("gptq8_sym", 8, 128, 1, 0, HFQ_GPTQ); }
Test(step06_hf, gptq_per_channel_loads_as_packed) { check_variant("gptq4_perchannel", 4, -1, 0, 0, HFQ_GPTQ); }
Test(step06_hf, awq_gemm_4bit_loads_as_packed) { check_variant("awq4", 4, 128, 0, 0, HFQ_AWQ); }

// ---------------------------------------------------------------- the writer

static int same_qweight(const QWeight *a, const QWeight *b) {
    if (a->kind != b->kind || a->rows != b->rows || a->cols != b->cols || a->n_groups != b->n_groups ||
        a->sym != b->sym)
        return 0;
    for (int r = 0; r < a->rows; r++) {
        for (int c = 0; c < a->cols; c++)
            if (qweight_get(a, r, c) != qweight_get(b, r, c)) return 0;
        for (int g = 0; g < a->n_groups; g++)
            if (qweight_zero(a, r, g) != qweight_zero(b, r, g) || qweight_scale(a, r, g) != qweight_scale(b, r, g))
                return 0;
    }
    for (int c = 0; c < a->cols; c++)
        if (qweight_group_of(a, c) != qweight_group_of(b, c)) return 0;
    return 1;
}

// Packing what was loaded from a packer's GPTQ file gives the packer's words, byte for byte.
Test(step06_hf, gptq_writer_reproduces_the_packers_words) {
    const char *vs[] = {"gptq4_sym", "gptq4_asym", "gptq4_act", "gptq8_sym", "gptq4_perchannel"};
    char err[512], dir[256], name[320];
    for (int v = 0; v < 5; v++) {
        snprintf(dir, sizeof dir, QDATA "/%s", vs[v]);
        HfQuantConfig c;
        StSet st;
        cr_assert_eq(hfq_config_load(dir, &c, err, sizeof err), 0, "%s", err);
        cr_assert_eq(st_open(dir, &st, err, sizeof err), 0, "%s", err);
        for (int p = 0; p < 2; p++) {
            QWeight w;
            cr_assert_eq(hfq_read_linear(&st, PREFIXES[p], &c, 0, 0, &w, err, sizeof err), 0, "%s", err);
            HfqGptqTensors t;
            cr_assert_eq(hfq_gptq_pack(&w, ST_F16, &t, err, sizeof err), 0, "%s", err);
            const void *mine[4] = {t.qweight, t.qzeros, t.scales, t.g_idx};
            const char *sfx[4] = {"qweight", "qzeros", "scales", "g_idx"};
            for (int k = 0; k < 4; k++) {
                snprintf(name, sizeof name, "%s.%s", PREFIXES[p], sfx[k]);
                const StTensor *ref = st_get(&st, name);
                cr_assert_not_null(ref, "%s", name);
                cr_expect_eq(memcmp(ref->data, mine[k], ref->nbytes), 0, "%s %s: packed bytes differ from the packer's",
                             vs[v], name);
            }
            hfq_gptq_tensors_free(&t);
            qweight_free(&w);
        }
        st_close(&st);
    }
}

// Write (st_write + hfq_gptq_pack), read back (hfq_read_linear): the same QWeight. fp32 scales
// come back exactly even when they are not fp16 values; fp16 ones round to nearest even.
Test(step06_hf, gptq_write_read_roundtrip, .init = mk_tmp, .fini = rm_tmp) {
    const int rows = 24, cols = 256;
    float *W = malloc((size_t)rows * cols * sizeof *W);
    uint32_t x = 12345;
    for (int i = 0; i < rows * cols; i++) {
        x = x * 1664525u + 1013904223u;
        W[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (1.0f + (float)(i % 7));
    }
    const struct {
        QuantKind k;
        int group, sym, act, fp32;
    } cs[] = {{QK_INT4, 128, 1, 0, 1}, {QK_INT4, 128, 0, 0, 1}, {QK_INT8, 256, 1, 0, 1}, {QK_INT4, 128, 1, 1, 1},
              {QK_INT4, 128, 0, 0, 0}};
    char err[512], path[256];
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        QWeight w;
        cr_assert_eq(quant_rtn(W, rows, cols, cs[i].k, cs[i].group, cs[i].sym, &w), 0);
        if (!cs[i].sym)  // v1 cannot store z = 0: keep zero points in 1..15
            for (int r = 0; r < rows * w.n_groups; r++)
                if (w.zeros[r] == 0) w.zeros[r] = 1;
        if (cs[i].act) {  // a non-trivial grouping, as act-order leaves it
            w.g_idx = malloc((size_t)cols * sizeof *w.g_idx);
            for (int c = 0; c < cols; c++) w.g_idx[c] = (c * 7 + 3) % cols / w.group;
        }
        HfqGptqTensors t;
        cr_assert_eq(hfq_gptq_pack(&w, cs[i].fp32 ? ST_F32 : ST_F16, &t, err, sizeof err), 0, "%s", err);
        const int per = 32 / (int)w.kind, G = w.n_groups;
        const char *pre = "model.layers.0.mlp.up_proj";
        char n0[128], n1[128], n2[128], n3[128];
        snprintf(n0, sizeof n0, "%s.qweight", pre), snprintf(n1, sizeof n1, "%s.qzeros", pre);
        snprintf(n2, sizeof n2, "%s.scales", pre), snprintf(n3, sizeof n3, "%s.g_idx", pre);
        const StWriteTensor wt[4] = {{n0, ST_I32, 2, {cols / per, rows}, t.qweight},
                                     {n1, ST_I32, 2, {G, rows / per}, t.qzeros},
                                     {n2, t.scale_dtype, 2, {G, rows}, t.scales},
                                     {n3, ST_I32, 1, {cols}, t.g_idx}};
        snprintf(path, sizeof path, "%s/m%zu.safetensors", tmp, i);
        cr_assert_eq(st_write(path, wt, 4, err, sizeof err), 0, "%s", err);
        StSet st;
        cr_assert_eq(st_open(path, &st, err, sizeof err), 0, "%s", err);
        HfQuantConfig c = {HFQ_GPTQ, (int)cs[i].k, cs[i].group == cols ? -1 : cs[i].group, cs[i].sym, cs[i].act, 0};
        QWeight b;
        cr_assert_eq(hfq_read_linear(&st, pre, &c, rows, cols, &b, err, sizeof err), 0, "case %zu: %s", i, err);
        if (cs[i].fp32) {
            cr_expect(same_qweight(&w, &b), "case %zu: the QWeight read back differs from the one written", i);
        } else {  // integers identical; scales within fp16 rounding (relative 2^-11)
            long bad = 0;
            for (int r = 0; r < rows; r++) {
                for (int c2 = 0; c2 < cols; c2++) bad += qweight_get(&w, r, c2) != qweight_get(&b, r, c2);
                for (int g = 0; g < G; g++) {
                    float a = qweight_scale(&w, r, g), d = qweight_scale(&b, r, g);
                    bad += qweight_zero(&w, r, g) != qweight_zero(&b, r, g) || fabsf(a - d) > fabsf(a) * 0x1p-11f;
                }
            }
            cr_expect_eq(bad, 0, "case %zu (fp16 scales): %ld mismatches", i, bad);
        }
        qweight_free(&b);
        st_close(&st);
        hfq_gptq_tensors_free(&t);
        qweight_free(&w);
    }
    free(W);
}

// A zero point of 0 has no v1 encoding: refused, not wrapped.
Test(step06_hf, gptq_pack_refuses_zero_point_zero) {
    QWeight w;
    cr_assert_eq(qweight_alloc(&w, QK_INT4, 8, 128, 128, 0), 0);
    for (int r = 0; r < 8; r++) w.zeros[r] = 8, w.scales[r] = 1;
    w.zeros[5] = 0;
    HfqGptqTensors t;
    char err[512];
    cr_assert_eq(hfq_gptq_pack(&w, ST_F16, &t, err, sizeof err), -1);
    cr_assert(strstr(err, "zero point 0") && strstr(err, "row 5"), "%s", err);
    qweight_free(&w);
}

// ---------------------------------------------------------------- the whole-model writer

static int rtn8_cb(void *ctx, int layer, int which, const char *name, const float *W, int rows, int cols, QWeight *out,
                   char *err, int errlen) {
    (void)layer, (void)which, (void)name, (void)err, (void)errlen;
    ++*(int *)ctx;
    return quant_rtn(W, rows, cols, QK_INT8, cols, 1, out);
}

Test(step06_hf, write_model_reads_back, .init = mk_tmp, .fini = rm_tmp) {
    char err[512], out[128];
    snprintf(out, sizeof out, "%s/q", tmp);
    const HfQuantConfig c = {HFQ_GPTQ, 8, -1, 1, 0, 0};
    int calls = 0;
    cr_assert_eq(hfq_write_model(MODEL, out, &c, rtn8_cb, &calls, NULL, err, sizeof err), 0, "%s", err);
    ModelWeights m;
    cr_assert_eq(model_load(MODEL, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(calls, m.cfg.n_layers * HFQ_N_LINEARS);
    HfQuantConfig rc;
    cr_assert_eq(hfq_config_load(out, &rc, err, sizeof err), 0, "%s", err);
    cr_assert(rc.method == HFQ_GPTQ && rc.bits == 8 && rc.group_size == -1 && rc.sym == 1 && rc.desc_act == 0);
    ModelConfig mc;
    char cpath[256];
    snprintf(cpath, sizeof cpath, "%s/config.json", out);
    cr_assert_eq(hf_config_load(cpath, &mc, err, sizeof err), 0, "the config is still the model's: %s", err);
    cr_assert(mc.hidden == m.cfg.hidden && mc.n_layers == m.cfg.n_layers && mc.vocab == m.cfg.vocab);
    StSet st;
    cr_assert_eq(st_open(out, &st, err, sizeof err), 0, "%s", err);
    int n_quant = 0, n_same = 0;
    for (int i = 0; i < m.st.n_tensors; i++) {
        const StTensor *s = &m.st.tensors[i];
        const StTensor *o = st_get(&st, s->name);
        int lin = 0;
        for (int k = 0; k < HFQ_N_LINEARS; k++) {
            char nm[160];
            for (int l = 0; l < m.cfg.n_layers; l++) {
                snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, hfq_linear_names[k]);
                lin |= !strcmp(nm, s->name);
            }
        }
        if (!lin) {
            cr_assert(o && o->dtype == s->dtype && o->nbytes == s->nbytes && !memcmp(o->data, s->data, s->nbytes),
                      "%s is copied unchanged", s->name);
            n_same++;
            continue;
        }
        cr_assert_null(o, "%s is replaced by its GPTQ tensors", s->name);
        char pre[160];
        snprintf(pre, sizeof pre, "%.*s", (int)(strlen(s->name) - strlen(".weight")), s->name);
        float *W = malloc((size_t)s->numel * sizeof *W);
        st_to_f32(s, W);
        QWeight want, got;
        cr_assert_eq(quant_rtn(W, (int)s->shape[0], (int)s->shape[1], QK_INT8, (int)s->shape[1], 1, &want), 0);
        // fp16 scales in the file: compare with the reference's scales rounded the same way
        cr_assert_eq(hfq_read_linear(&st, pre, &rc, (int)s->shape[0], (int)s->shape[1], &got, err, sizeof err), 0, "%s",
                     err);
        long bad = 0;
        for (int r = 0; r < want.rows; r++) {
            for (int cc = 0; cc < want.cols; cc++) bad += qweight_get(&want, r, cc) != qweight_get(&got, r, cc);
            float a = qweight_scale(&want, r, 0), d = qweight_scale(&got, r, 0);
            bad += fabsf(a - d) > fabsf(a) * 0x1p-11f;
        }
        cr_expect_eq(bad, 0, "%s: %ld mismatches", pre, bad);
        qweight_free(&want), qweight_free(&got);
        free(W);
        n_quant++;
    }
    cr_assert_eq(n_quant, m.cfg.n_layers * HFQ_N_LINEARS);
    cr_assert_eq(st.n_tensors, n_same + 4 * n_quant, "nothing else in the file");
    char tp[256];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", out);
    cr_assert_eq(access(tp, R_OK), 0, "tokenizer.json copied");
    st_close(&st);
    model_free(&m);
}

// ---------------------------------------------------------------- refusals

Test(step06_hf, unsupported_quantization_configs_are_refused_naming_the_field) {
    const struct {
        const char *json, *want1, *want2;
    } cs[] = {
        {"{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"bits\": 4}}", "quant_method", "\"bitsandbytes\""},
        {"{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 3, \"group_size\": 128}}", "bits", "3"},
        {"{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 100}}", "group_size", "100"},
        {"{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": "
         "\"gptq_v2\"}}",
         "checkpoint_format", "\"gptq_v2\""},
        {"{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"sym\": \"yes\"}}", "sym",
         "\"yes\""},
        {"{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"lm_head\": 1}}",
         "lm_head", "1"},
        {"{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemv\"}}",
         "version", "\"gemv\""},
        {"{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemm\", "
         "\"zero_point\": false}}",
         "zero_point", "false"},
        {"{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 8, \"group_size\": 128, \"version\": \"gemm\"}}",
         "bits", "8"},
        {"{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 64, \"version\": \"gemm\"}}",
         "group_size", "64"},
        {"{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemm\", "
         "\"modules_to_not_convert\": [\"lm_head\"]}}",
         "modules_to_not_convert", "lm_head"},
        {"{\"quantization_config\": {\"bits\": 4}}", "quant_method", "(missing)"},
        {"{\"quantization_config\": 4}", "quantization_config", "not a JSON object"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        HfQuantConfig c;
        cr_expect_eq(hfq_config_parse(cs[i].json, "cfg.json", &c, err, sizeof err), -1, "case %zu accepted: %s", i,
                     cs[i].json);
        cr_expect(strstr(err, cs[i].want1) && strstr(err, cs[i].want2) && strstr(err, "cfg.json"),
                  "case %zu: \"%s\" should name %s and %s", i, err, cs[i].want1, cs[i].want2);
    }
    HfQuantConfig c;
    cr_assert_eq(hfq_config_parse("{\"hidden_size\": 64}", NULL, &c, err, sizeof err), 0);
    cr_assert_eq(c.method, HFQ_NONE, "no quantization_config: not quantized");
    char *j = hfq_config_json(&(HfQuantConfig){HFQ_GPTQ, 4, 128, 1, 1, 0});
    cr_assert_not_null(j);
    char *wrapped;
    cr_assert(asprintf(&wrapped, "{\"quantization_config\": %s}", j) > 0);
    cr_assert_eq(hfq_config_parse(wrapped, NULL, &c, err, sizeof err), 0, "%s", err);
    cr_assert(c.method == HFQ_GPTQ && c.bits == 4 && c.group_size == 128 && c.sym == 1 && c.desc_act == 1 && !c.lm_head,
              "%s", j);
    cr_expect(!strstr(j, "lm_head"), "%s", j);
    free(wrapped);
    free(j);
    j = hfq_config_json(&(HfQuantConfig){HFQ_GPTQ, 8, -1, 1, 0, 1});  // the lm_head quantized too
    cr_assert_not_null(j);
    cr_assert(asprintf(&wrapped, "{\"quantization_config\": %s}", j) > 0);
    cr_assert_eq(hfq_config_parse(wrapped, NULL, &c, err, sizeof err), 0, "%s", err);
    cr_assert(c.method == HFQ_GPTQ && c.bits == 8 && c.group_size == -1 && c.lm_head == 1, "%s", j);
    free(wrapped);
    free(j);
}

// Tensors that contradict the config or each other are refused, naming the tensor.
Test(step06_hf, inconsistent_tensors_are_refused, .init = mk_tmp, .fini = rm_tmp) {
    char err[512];
    StSet st;
    cr_assert_eq(st_open(QDATA "/gptq4_asym", &st, err, sizeof err), 0, "%s", err);
    QWeight w;
    // asym zero points read as sym: the sym check catches them
    HfQuantConfig c = {HFQ_GPTQ, 4, 128, 1, 0, 0};
    cr_assert_eq(hfq_read_linear(&st, PREFIXES[0], &c, 0, 0, &w, err, sizeof err), -1);
    cr_assert(strstr(err, PREFIXES[0]) && strstr(err, "qzeros") && strstr(err, "sym"), "%s", err);
    // wrong expected shape
    c.sym = 0;
    cr_assert_eq(hfq_read_linear(&st, PREFIXES[0], &c, 16, 512, &w, err, sizeof err), -1);
    cr_assert(strstr(err, "qweight") && strstr(err, "shape"), "%s", err);
    // per-channel config on a group-128 file: scales have the wrong number of groups
    c.group_size = -1;
    cr_assert_eq(hfq_read_linear(&st, PREFIXES[0], &c, 0, 0, &w, err, sizeof err), -1);
    cr_assert(strstr(err, "scales"), "%s", err);
    // a missing linear
    c.group_size = 128;
    cr_assert_eq(hfq_read_linear(&st, "model.layers.9.mlp.up_proj", &c, 0, 0, &w, err, sizeof err), -1);
    cr_assert(strstr(err, "model.layers.9.mlp.up_proj.qweight") && strstr(err, "not found"), "%s", err);
    st_close(&st);
    // a desc_act file read with desc_act false: its g_idx is not c / group
    cr_assert_eq(st_open(QDATA "/gptq4_act", &st, err, sizeof err), 0, "%s", err);
    c = (HfQuantConfig){HFQ_GPTQ, 4, 128, 1, 0, 0};
    cr_assert_eq(hfq_read_linear(&st, PREFIXES[0], &c, 0, 0, &w, err, sizeof err), -1);
    cr_assert(strstr(err, "g_idx") && strstr(err, "desc_act"), "%s", err);
    st_close(&st);
    // g_idx out of range
    int32_t qw[32 * 8] = {0}, qz[2] = {0x77777777, 0x77777777}, gi[256];
    uint16_t sc[2 * 8];
    for (int i = 0; i < 16; i++) sc[i] = 0x3c00;
    for (int i = 0; i < 256; i++) gi[i] = i / 128;
    gi[77] = 2;
    const StWriteTensor wt[4] = {{"p.qweight", ST_I32, 2, {32, 8}, qw},
                                 {"p.qzeros", ST_I32, 2, {2, 1}, qz},
                                 {"p.scales", ST_F16, 2, {2, 8}, sc},
                                 {"p.g_idx", ST_I32, 1, {256}, gi}};
    char path[128];
    snprintf(path, sizeof path, "%s/g.safetensors", tmp);
    cr_assert_eq(st_write(path, wt, 4, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_open(path, &st, err, sizeof err), 0, "%s", err);
    c.desc_act = 1;
    cr_assert_eq(hfq_read_linear(&st, "p", &c, 0, 0, &w, err, sizeof err), -1);
    cr_assert(strstr(err, "p.g_idx") && strstr(err, "entry 77"), "%s", err);
    gi[77] = 0;
    st_close(&st);
    // qzeros as F32 instead of I32
    const StWriteTensor wt2[3] = {{"p.qweight", ST_I32, 2, {32, 8}, qw},
                                  {"p.qzeros", ST_F32, 2, {2, 1}, qz},
                                  {"p.scales", ST_F16, 2, {2, 8}, sc}};
    cr_assert_eq(st_write(path, wt2, 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_open(path, &st, err, sizeof err), 0, "%s", err);
    c.desc_act = 0;
    cr_assert_eq(hfq_read_linear(&st, "p", &c, 0, 0, &w, err, sizeof err), -1);
    cr_assert(strstr(err, "p.qzeros") && strstr(err, "F32"), "%s", err);
    st_close(&st);
}

// The writer's fp32 -> fp16 scale conversion: every finite fp16 value comes back as the same 16
// bits, and values between two fp16s round to nearest, ties to even, overflow to inf.
Test(step06_hf, gptq_pack_fp16_scales_round_to_nearest_even) {
    const int rows = 65536;
    QWeight w;
    cr_assert_eq(qweight_alloc(&w, QK_INT4, rows, 8, 8, 1), 0);
    int n = 0;
    for (int h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads: not a scale
        uint16_t bits = (uint16_t)h;
        StTensor t = {.dtype = ST_F16, .numel = 1, .data = &bits};
        st_to_f32(&t, &w.scales[n++]);
    }
    const struct {
        float f;
        uint16_t h;
    } cases[] = {{1.0f + 0x1p-11f, 0x3c00},        {1.0f + 3 * 0x1p-11f, 0x3c02}, {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},
                 {65519.0f, 0x7bff},               {65520.0f, 0x7c00},            {1e30f, 0x7c00},
                 {-1e30f, 0xfc00},                 {0x1p-25f, 0x0000},            {1.5f * 0x1p-25f, 0x0001},
                 {2.5f * 0x1p-24f, 0x0002},        {3.5f * 0x1p-24f, 0x0004},     {-0.0f, 0x8000},
                 {0x1p-14f - 0x1p-25f, 0x0400}};
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < nc; i++) w.scales[n + i] = cases[i].f;
    HfqGptqTensors t;
    char err[512];
    cr_assert_eq(hfq_gptq_pack(&w, ST_F16, &t, err, sizeof err), 0, "%s", err);
    const uint16_t *s = t.scales;
    long bad = 0;
    n = 0;
    for (int h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        bad += s[n++] != h;
    }
    cr_expect_eq(bad, 0, "%ld fp16 values do not survive fp32 -> fp16", bad);
    for (int i = 0; i < nc; i++)
        cr_expect_eq(s[n + i], cases[i].h, "%a -> 0x%04x, expected 0x%04x", (double)cases[i].f, s[n + i], cases[i].h);
    hfq_gptq_tensors_free(&t);
    qweight_free(&w);
}
