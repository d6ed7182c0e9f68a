// test_step08_export.c — train -> serve (step08_ddp/export.h): a trained model written as a
// Hugging Face directory and read back by the engine's own loaders and programs.
//
//   round trip  config.json read back by hf_config_load gives every field of the trained config;
//               model.safetensors holds exactly train.h's tensors under their HF names (a tied
//               lm_head not at all), fp32 bit for bit, bf16 each value the nearest bf16;
//               model_load + cpu_model_load + forward_cpu give the logits of the training forward
//               (fp32: the very same numbers as forward_cpu on the in-memory model; bf16: within
//               the bf16 bound), on Llama / Mistral / Qwen2 / Qwen3 variants;
//   tokenizer   tokenizer.json loads with common/tokenizer.c; every id's text, encode, decode;
//   serve       a copy-task model trained here, exported, answers through build/bin/generate
//               (--ids and --prompt) with the copied symbols;
//   refusals    a non-empty target, an unsupported dtype, a vocabulary too small, a config its
//               architecture cannot express: an error, and nothing written.
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fs_util.h"
#include "hf_config.h"
#include "model.h"
#include "rng.h"
#include "safetensors.h"
#include "step02_attention/forward.h"
#include "step08_ddp/export.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"
#include "tokenizer.h"
#include "train_util.h"

// ---------------------------------------------------------------- models

static ModelConfig variant(int v) {
    ModelConfig c = {0};
    c.hidden = 24, c.n_layers = 2, c.n_heads = 4, c.head_dim = 6, c.n_kv_heads = 2, c.intermediate = 40;
    c.vocab = 37, c.max_pos = 64, c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    switch (v) {
    case 0: c.arch = ARCH_LLAMA; break;  // GQA 4/2, untied
    case 1:  // Qwen3: q/k norm, attention_bias (q/k/v and o), MQA, tied, head_dim 8 != 24 / 4
        c.arch = ARCH_QWEN3, c.qk_norm = 1, c.qkv_bias = c.o_bias = 1, c.n_kv_heads = 1, c.tie_embeddings = 1;
        c.head_dim = 8, c.rms_eps = 1e-6f, c.rope_theta = 1000000.0;
        break;
    case 2: c.arch = ARCH_QWEN2, c.qkv_bias = 1, c.vocab = 41; break;  // q/k/v biases
    case 3:  // Llama with attention_bias, MHA, tied, llama3 rope scaling
        c.arch = ARCH_LLAMA, c.qkv_bias = c.o_bias = 1, c.n_kv_heads = 4, c.tie_embeddings = 1;
        c.rope_theta = 500000.0, c.rope_type = ROPE_LLAMA3, c.rope_factor = 8, c.rope_low_freq_factor = 1;
        c.rope_high_freq_factor = 4, c.rope_original_max_pos = 16;
        break;
    default: c.arch = ARCH_MISTRAL, c.bos_token_id = 1, c.eos_token_ids[0] = 2, c.eos_token_ids[1] = 5, c.n_eos = 2;
    }
    return c;
}
#define N_VARIANTS 5

// Random init, then the norms and biases moved off 1 and 0 so that they count in the logits.
static void make_model(const ModelConfig *c, uint64_t seed, TrainModel *m) {
    char err[256];
    cr_assert(train_model_new(c, m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(m, seed);
    Rng r;
    rng_seed(&r, seed + 1000);
    for (int i = 0; i < m->n_tensors; i++) {
        const TrainTensor *t = &m->tensors[i];
        if (t->rows > 1) continue;
        float *p = m->params + t->off;
        for (size_t j = 0; j < t->numel; j++) p[j] += 0.3f * rng_normal(&r);
    }
}

static void export_ok(const TrainModel *m, const char *dir, StDtype dt, int n_sym) {
    char err[512];
    cr_assert(train_export_hf(m, dir, dt, n_sym, err, sizeof err) == 0, "export to %s: %s", dir, err);
}

// ---------------------------------------------------------------- config

static void expect_config(const ModelConfig *a, const ModelConfig *b, const char *what) {
#define EQ(f) cr_expect_eq(a->f, b->f, "%s: " #f " %g read back, %g trained", what, (double)a->f, (double)b->f)
    EQ(arch); EQ(hidden); EQ(intermediate); EQ(n_layers); EQ(n_heads); EQ(n_kv_heads); EQ(head_dim); EQ(vocab);
    EQ(max_pos); EQ(rms_eps); EQ(tie_embeddings); EQ(qkv_bias); EQ(o_bias); EQ(mlp_bias); EQ(qk_norm); EQ(rope_theta);
    EQ(rope_type);
    if (b->rope_type == ROPE_LLAMA3) {
        EQ(rope_factor); EQ(rope_low_freq_factor); EQ(rope_high_freq_factor); EQ(rope_original_max_pos);
    }
#undef EQ
}

// ---------------------------------------------------------------- logits

// forward_cpu of the exported directory, loaded as generate loads it, against (a) forward_cpu on
// the in-memory model (exact when fp32) and (b) the training forward; returns max |(b)| / max |logit|.
static double compare_logits(const TrainModel *m, const char *dir, int exact, double *max_diff_view) {
    char err[512];
    ModelWeights w;
    cr_assert(model_load(dir, &w, err, sizeof err) == 0, "%s", err);
    CpuModel cm, view;
    cr_assert(cpu_model_load(&w, &cm, err, sizeof err) == 0, "%s", err);
    train_cpu_view(m, &view);
    const int B = 2, T = 9, V = m->cfg.vocab;
    int ids[18];
    Rng r;
    rng_seed(&r, 77);
    for (int i = 0; i < B * T; i++) ids[i] = (int)(rng_u32(&r) % (uint32_t)V);
    TrainActs a;
    train_acts_new(&m->cfg, B, T, &a);
    cr_assert(train_forward(m, &a, ids, NULL, B, T) >= 0);
    float *z = malloc((size_t)T * V * sizeof(float)), *zv = malloc((size_t)T * V * sizeof(float));
    double worst = 0, maxabs = 0, worst_view = 0;
    for (int b = 0; b < B; b++) {
        cr_assert(forward_cpu(&cm, ids + b * T, T, z, NULL) == 0);
        cr_assert(forward_cpu(&view, ids + b * T, T, zv, NULL) == 0);
        for (int j = 0; j < T * V; j++) {
            const double e = fabs((double)z[j] - a.logits[(size_t)b * T * V + j]), ev = fabs((double)z[j] - zv[j]);
            if (!(e <= worst)) worst = e;
            if (!(ev <= worst_view)) worst_view = ev;
            if (fabs(zv[j]) > maxabs) maxabs = fabs(zv[j]);
        }
        if (exact) cr_expect(memcmp(z, zv, (size_t)T * V * sizeof(float)) == 0, "%s: logits not bit-identical", dir);
    }
    *max_diff_view = worst_view / maxabs;
    cr_expect(maxabs > 0.5, "%s: logits too small (%g) to say anything", dir, maxabs);
    free(z), free(zv);
    train_acts_free(&a);
    train_cpu_view_free(&view);
    cpu_model_free(&cm);
    model_free(&w);
    return worst / maxabs;
}

Test(step08_export, fp32_round_trips_config_tensors_and_logits) {
    for (int v = 0; v < N_VARIANTS; v++) {
        const ModelConfig c = variant(v);
        TrainModel m;
        make_model(&c, 10 + v, &m);
        char tmp[64], dir[128], err[512];
        test_mkdtemp(tmp, sizeof tmp, "step08_export");
        snprintf(dir, sizeof dir, "%s/hf", tmp);
        const int n_sym = v == 4 ? 0 : 10;  // Mistral: no task vocabulary, its own bos/eos ids
        export_ok(&m, dir, ST_F32, n_sym);
        const char *what = model_arch_name(c.arch);
        ModelConfig rc;
        cr_assert(hf_config_load(dir, &rc, err, sizeof err) == 0, "%s", err);
        expect_config(&rc, &c, what);
        cr_expect_str_eq(rc.torch_dtype, "float32");
        if (n_sym) {
            cr_expect(rc.bos_token_id == TASK_BOS && rc.n_eos == 0, "%s: bos %d, %d eos ids", what, rc.bos_token_id, rc.n_eos);
        } else {
            cr_expect(rc.bos_token_id == 1 && rc.n_eos == 2 && rc.eos_token_ids[0] == 2 && rc.eos_token_ids[1] == 5,
                      "%s: bos %d, eos %d ids", what, rc.bos_token_id, rc.n_eos);
        }
        // the tensors: train.h's list, names and shapes, the values bit for bit
        StSet st;
        cr_assert(st_open(dir, &st, err, sizeof err) == 0, "%s", err);
        cr_expect_eq(st.n_tensors, m.n_tensors, "%s: %d tensors written, %d trained", what, st.n_tensors, m.n_tensors);
        for (int i = 0; i < m.n_tensors; i++) {
            const TrainTensor *t = &m.tensors[i];
            const StTensor *s = st_get(&st, t->name);
            cr_assert(s, "%s: %s not written", what, t->name);
            const int ndim = t->rows == 1 ? 1 : 2;
            cr_expect(s->dtype == ST_F32 && s->ndim == ndim && s->shape[0] == (ndim == 1 ? t->cols : t->rows) &&
                          (ndim == 1 || s->shape[1] == t->cols),
                      "%s: %s written as %s with %d dims", what, t->name, st_dtype_name(s->dtype), s->ndim);
            cr_expect(memcmp(s->data, m.params + t->off, t->numel * sizeof(float)) == 0, "%s: %s values differ", what,
                      t->name);
        }
        cr_expect_eq(!st_get(&st, "lm_head.weight"), c.tie_embeddings, "%s: lm_head.weight %s with tie %d", what,
                     st_get(&st, "lm_head.weight") ? "written" : "absent", c.tie_embeddings);
        st_close(&st);
        double view = 0;
        const double rel = compare_logits(&m, dir, 1, &view);
        cr_expect(rel <= 1e-5, "%s: fp32 export vs the training forward: max |diff| %.3g x max |logit|", what, rel);
        cr_log_info("%s fp32: vs training forward %.3g x max|logit|, vs forward_cpu in memory %.3g", what, rel, view);
        // nothing but the export in the parent: the temporary directory was renamed
        int n = 0;
        DIR *d = opendir(tmp);
        for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
        closedir(d);
        cr_expect_eq(n, 1, "%s: %d entries beside the export", tmp, n);
        test_rmtree(tmp);
        train_model_free(&m);
    }
}

// bf16 of x, as the top 16 bits of a float
static float bf16_bits(uint32_t b16) {
    const uint32_t u = b16 << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Test(step08_export, bf16_values_are_nearest_and_logits_within_bound) {
    for (int v = 0; v < N_VARIANTS; v++) {
        const ModelConfig c = variant(v);
        TrainModel m;
        make_model(&c, 20 + v, &m);
        char tmp[64], dir[128], err[512];
        test_mkdtemp(tmp, sizeof tmp, "step08_export_bf16");
        snprintf(dir, sizeof dir, "%s/hf", tmp);
        export_ok(&m, dir, ST_BF16, 0);
        const char *what = model_arch_name(c.arch);
        ModelConfig rc;
        cr_assert(hf_config_load(dir, &rc, err, sizeof err) == 0, "%s", err);
        cr_expect_str_eq(rc.torch_dtype, "bfloat16");
        StSet st;
        cr_assert(st_open(dir, &st, err, sizeof err) == 0, "%s", err);
        long not_nearest = 0, changed = 0;
        for (int i = 0; i < m.n_tensors; i++) {
            const TrainTensor *t = &m.tensors[i];
            const StTensor *s = st_get(&st, t->name);
            cr_assert(s && s->dtype == ST_BF16 && (size_t)s->numel == t->numel, "%s: %s", what, t->name);
            const uint8_t *p = s->data;
            for (size_t j = 0; j < t->numel; j++) {
                const uint32_t b = (uint32_t)p[2 * j] | (uint32_t)p[2 * j + 1] << 8;
                const double x = m.params[t->off + j], y = bf16_bits(b);
                // both neighbours of the stored value are at least as far from x
                const double lo = bf16_bits(b - 1), hi = bf16_bits(b + 1);
                not_nearest += fabs(y - x) > fabs(lo - x) || fabs(y - x) > fabs(hi - x);
                changed += y != x;
            }
        }
        st_close(&st);
        cr_expect_eq(not_nearest, 0, "%s: %ld values not rounded to the nearest bf16", what, not_nearest);
        cr_expect(changed > (long)m.n_params / 2, "%s: only %ld of %zu values changed: not bf16?", what, changed, m.n_params);
        double view = 0;
        const double rel = compare_logits(&m, dir, 0, &view);
        cr_expect(rel <= 1e-2 && view <= 1e-2 && view > 0, "%s: bf16 export: max |diff| %.3g (training forward), %.3g "
                  "(forward_cpu) x max |logit|", what, rel, view);
        cr_log_info("%s bf16: vs training forward %.3g x max|logit|", what, rel);
        test_rmtree(tmp);
        train_model_free(&m);
    }
}

// ---------------------------------------------------------------- tokenizer

Test(step08_export, tokenizer_covers_the_task_vocabulary) {
    const int n_sym = 100;  // beyond the 62 ASCII letters and digits: CJK characters
    ModelConfig c = variant(0);
    c.vocab = TASK_SYM0 + n_sym + 5;  // a vocabulary larger than the task's is allowed
    TrainModel m;
    make_model(&c, 3, &m);
    char tmp[64], dir[128], path[200], err[512];
    test_mkdtemp(tmp, sizeof tmp, "step08_export_tok");
    snprintf(dir, sizeof dir, "%s/hf", tmp);
    export_ok(&m, dir, ST_F32, n_sym);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    cr_assert(t, "%s", err);
    cr_expect_eq(tokenizer_vocab_size(t), TASK_SYM0 + n_sym);
    cr_expect_eq(tokenizer_bos_id(t), TASK_BOS, "bos from tokenizer_config.json: %d", tokenizer_bos_id(t));
    cr_expect(tokenizer_is_special(t, TASK_BOS) && tokenizer_is_special(t, TASK_SEP) && !tokenizer_is_special(t, TASK_SYM0));
    // every symbol once, between BOS and SEP, twice over: ids in, text out, and back
    char text[4096] = EXPORT_BOS_TEXT, s[8];
    int want[2 * 100 + 4], nw = 0;
    want[nw++] = TASK_BOS;
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < n_sym; i++) {
            const int k = rep ? n_sym - 1 - i : i;
            strcat(text, export_symbol_text(k, s, sizeof s));
            want[nw++] = TASK_SYM0 + k;
            cr_expect_str_eq(tokenizer_piece(t, TASK_SYM0 + k), s);
        }
        strcat(text, EXPORT_SEP_TEXT);
        want[nw++] = TASK_SEP;
    }
    cr_expect_str_eq(export_symbol_text(0, s, sizeof s), "a");
    cr_expect_str_eq(export_symbol_text(62, s, sizeof s), "\xe4\xb8\x80");  // U+4E00
    cr_expect_null(export_symbol_text(EXPORT_MAX_SYMBOLS, s, sizeof s));
    TokIds ids = {0};
    cr_assert(tokenizer_encode(t, text, strlen(text), 1, &ids) == 0, "%s", tokenizer_error(t));
    cr_assert_eq((int)ids.n, nw, "%zu ids for %d tokens", ids.n, nw);
    for (int i = 0; i < nw; i++) cr_expect_eq(ids.ids[i], want[i], "id %d: %d, expected %d", i, ids.ids[i], want[i]);
    char *back = tokenizer_decode(t, ids.ids, ids.n, 0, NULL);
    cr_expect_str_eq(back, text);
    free(back);
    back = tokenizer_decode(t, ids.ids, ids.n, 1, NULL);  // without the special tokens: the symbols only
    cr_expect(strlen(back) == strlen(text) - 2 * strlen(EXPORT_SEP_TEXT) - strlen(EXPORT_BOS_TEXT) && !strchr(back, '<'),
              "decoded without specials: %s", back);
    free(back);
    tokids_free(&ids);
    tokenizer_free(t);
    test_rmtree(tmp);
    train_model_free(&m);
}

// ---------------------------------------------------------------- refusals

Test(step08_export, refuses_and_leaves_nothing) {
    ModelConfig c = variant(0);
    TrainModel m;
    make_model(&c, 4, &m);
    char tmp[64], dir[128], err[512] = "";
    test_mkdtemp(tmp, sizeof tmp, "step08_export_bad");
    snprintf(dir, sizeof dir, "%s/hf", tmp);
    cr_expect(train_export_hf(&m, dir, ST_F16, 0, err, sizeof err) == -1 && strstr(err, "F16"), "f16: '%s'", err);
    cr_expect(train_export_hf(&m, dir, ST_F32, c.vocab, err, sizeof err) == -1 && strstr(err, "vocabulary of 37"),
              "vocab: '%s'", err);
    cr_expect(train_export_hf(&m, "/nonexistent_dir_x/hf", ST_F32, 0, err, sizeof err) == -1 && strstr(err, "/nonexistent_dir_x"),
              "no parent: '%s'", err);
    // a non-empty directory is not touched
    cr_assert(mkdir(dir, 0755) == 0);
    char keep[200];
    snprintf(keep, sizeof keep, "%s/mine.txt", dir);
    FILE *f = fopen(keep, "w");
    cr_assert(f);
    fputs("keep me", f);
    fclose(f);
    cr_expect(train_export_hf(&m, dir, ST_F32, 0, err, sizeof err) == -1 && strstr(err, "not empty"), "non-empty: '%s'", err);
    struct stat sb;
    char cfgp[200];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    cr_expect(stat(cfgp, &sb) != 0 && stat(keep, &sb) == 0, "the non-empty directory was changed");
    // an empty one is filled
    cr_assert(remove(keep) == 0);
    export_ok(&m, dir, ST_F32, 0);
    cr_expect(stat(cfgp, &sb) == 0);
    train_model_free(&m);
    // configs the architecture's config class cannot say
    ModelConfig q2 = variant(2);
    q2.qkv_bias = 0;
    TrainModel m2;
    make_model(&q2, 5, &m2);
    snprintf(dir, sizeof dir, "%s/q2", tmp);
    cr_expect(train_export_hf(&m2, dir, ST_F32, 0, err, sizeof err) == -1 && strstr(err, "Qwen2"), "qwen2: '%s'", err);
    train_model_free(&m2);
    ModelConfig l = variant(0);
    l.qkv_bias = 1;  // q/k/v biases without an o_proj bias: Llama's attention_bias cannot say it
    make_model(&l, 6, &m2);
    cr_expect(train_export_hf(&m2, dir, ST_F32, 0, err, sizeof err) == -1 && strstr(err, "attention_bias"), "llama: '%s'", err);
    train_model_free(&m2);
    // nothing left over but the one export
    int n = 0;
    DIR *d = opendir(tmp);
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    cr_expect_eq(n, 1, "%d entries in %s after the refusals (temporary directories left?)", n, tmp);
    test_rmtree(tmp);
}

// ---------------------------------------------------------------- serve: generate runs the trained model

// BUILD_BIN_DIR/prog args: exit code, stdout + stderr into out.
static int run_prog(const char *prog, const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/%s %s 2>&1", BUILD_BIN_DIR, prog, args);
    return test_run_cmd(cmd, out, cap);
}

// generate --json: the generated ids and text of one run (fails the test when it fails).
static int generate_ids(const char *dir, const char *prompt_args, int L, int *ids, char *text, size_t tcap) {
    static char out[1 << 16];
    char args[1024];
    snprintf(args, sizeof args, "--model %s %s --max-new-tokens %d --greedy --device cpu --json", dir, prompt_args, L);
    const int rc = run_prog("generate", args, out, sizeof out);
    cr_assert_eq(rc, 0, "generate %s: exit %d:\n%s", args, rc, out);
    cr_expect(!strstr(out, "runtime error") && !strstr(out, "Sanitizer"), "generate %s: sanitizer report:\n%s", args, out);
    const char *brace = strchr(out, '{');
    json_error_t je;
    json_t *o = brace ? json_loads(brace, JSON_DISABLE_EOF_CHECK, &je) : NULL;
    cr_assert(o, "generate %s: no JSON in:\n%s", args, out);
    json_t *a = json_object_get(o, "ids");
    const int n = (int)json_array_size(a);
    for (int i = 0; i < n && i < L; i++) ids[i] = (int)json_integer_value(json_array_get(a, i));
    snprintf(text, tcap, "%s", json_string_value(json_object_get(o, "text")) ? json_string_value(json_object_get(o, "text")) : "");
    json_decref(o);
    return n;
}

#define SERVE_STEPS 200

Test(step08_export, trained_copy_model_answers_through_generate, .timeout = 120) {
    // the learning test's recipe (train_util.h), shorter
    TrainModel m;
    double loss = 0;
    test_train_copy(&m, SERVE_STEPS, NULL, &loss);
    const int L = TCOPY_L, T = task_seq_len(L), n_sym = TCOPY_NSYM;
    char err[256];
    int *ids = malloc((size_t)T * sizeof(int)), *tg = malloc((size_t)T * sizeof(int));
    cr_expect(loss < 0.05, "copy loss after %d steps (mean of the last 10): %.4f", SERVE_STEPS, loss);
    char tmp[64], dir[128];
    test_mkdtemp(tmp, sizeof tmp, "step08_export_serve");
    snprintf(dir, sizeof dir, "%s/copy", tmp);
    cr_assert(train_export_hf(&m, dir, ST_F32, n_sym, err, sizeof err) == 0, "%s", err);
    // held-out prompts (a stream training never drew from), as ids: the answer is the copy
    Rng h;
    rng_seed(&h, 4242);
    int right = 0;
    const int n_prompts = 4;
    for (int e = 0; e < n_prompts; e++) {
        task_make_batch(TASK_COPY, &h, 1, L, n_sym, ids, tg);
        char pa[256] = "--ids ";
        for (int i = 0; i < L + 2; i++) snprintf(pa + strlen(pa), sizeof pa - strlen(pa), "%s%d", i ? "," : "", ids[i]);
        int got[16] = {0};
        char text[256];
        const int n = generate_ids(dir, pa, L, got, text, sizeof text);
        int ok = n == L;
        for (int i = 0; i < L && ok; i++) ok = got[i] == ids[L + 2 + i];
        right += ok;
        cr_expect(ok, "generate %s: %d ids, first %d %d .. (expected the copy %d %d ..)", pa, n, got[0], got[1],
                  ids[L + 2], ids[L + 3]);
    }
    // as text through the exported tokenizer.json
    char prompt[128] = "--prompt '" EXPORT_BOS_TEXT, want[64] = "", s[8];
    const int syms[6] = {3, 3, 9, 0, 7, 1};
    for (int i = 0; i < L; i++) strcat(want, export_symbol_text(syms[i], s, sizeof s));
    strcat(prompt, want);
    strcat(prompt, EXPORT_SEP_TEXT "'");
    int got[16];
    char text[256];
    cr_expect_eq(generate_ids(dir, prompt, L, got, text, sizeof text), L);
    cr_expect_str_eq(text, want, "generate %s: '%s', expected '%s'", prompt, text, want);
    cr_log_info("copy model (loss %.4f after %d steps) through generate: %d / %d id prompts right, text '%s' -> '%s'",
                loss, SERVE_STEPS, right, n_prompts, want, text);
    test_rmtree(tmp);
    train_model_free(&m);
    free(ids), free(tg);
}

Test(step08_export, train_program_saves, .timeout = 120) {
    static char out[1 << 16];
    char tmp[64], args[512], dir[128], p[200];
    test_mkdtemp(tmp, sizeof tmp, "step08_export_prog");
    snprintf(dir, sizeof dir, "%s/run", tmp);
    snprintf(args, sizeof args, "--preset tiny --steps 3 --warmup 1 --eval 1 --save-dtype fp16 --save %s", dir);
    cr_expect_eq(run_prog("train", args, out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "--save-dtype: 'fp16' is not a dtype (allowed: fp32, bf16)"), "%s", out);
    snprintf(args, sizeof args, "--preset tiny --steps 3 --warmup 1 --symbols %d --save %s", EXPORT_MAX_SYMBOLS + 1, dir);
    cr_expect_eq(run_prog("train", args, out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "text for at most 21054 symbols"), "%s", out);
    snprintf(args, sizeof args, "--preset tiny --steps 3 --warmup 1 --eval 1 --save-dtype bf16 --save %s", dir);
    cr_expect_eq(run_prog("train", args, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "# saved: ") && strstr(out, "--prompt '<bos>abcdef<sep>' --max-new-tokens 6"), "%s", out);
    ModelConfig c;
    char err[512];
    cr_assert(hf_config_load(dir, &c, err, sizeof err) == 0, "%s", err);
    cr_expect(c.vocab == TASK_SYM0 + 10 && c.hidden == 64 && !strcmp(c.torch_dtype, "bfloat16"));
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    struct stat sb;
    cr_expect(stat(p, &sb) == 0, "no %s", p);
    // a second run into the same directory is refused before it trains
    cr_expect_eq(run_prog("train", args, out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "not empty") && !strstr(out, "step |"), "%s", out);
    cr_expect(!strstr(out, "runtime error") && !strstr(out, "Sanitizer"), "sanitizer report:\n%s", out);
    test_rmtree(tmp);
}
