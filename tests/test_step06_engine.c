// test_step06_engine.c — step06's quantized projections inside the engine, on the CPU (suite
// step06_engine): step06_quant/qmodel.h's loaders and step02-04's forwards running CpuLayer.q.
//
// The quantized forward (linear_q_cpu for the seven projections) against the fp32 forward on the
// dequantized weights (the same numbers as a dense matrix; only the order of the sums differs, so
// fp32 tolerance), through step02's forward, step03's cached decode and step04's batched runner,
// for RTN at load (INT8 per channel, INT4 per row since the test models' widths are not multiples
// of 128; every scale an fp16 value, as quantize writes them), on checkpoints written by build/bin/quantize, and on the whole GPTQ model (4-bit, group
// 32, asymmetric, act-order) that tools/quant_pack.py writes with its dequantized fp32 twin: the
// packer's W and the loaded QWeights dequantized agree exactly, and both generate the same greedy
// tokens. Also: the step04 runner's quantized rows do not depend on their batch mates (bit for
// bit), the dense loaders refuse a quantized directory by name, and qweight_stack_rows.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "fs_util.h"
#include "model.h"
#include "rng.h"
#include "step03_kvcache/kvcache.h"
#include "step04_batching/batch.h"
#include "step06_quant/qmodel.h"

#define QDATA "tests/data/quant"
#define TOL_SAME 1e-5  // max|diff| / max|logit|: the same weights, sums in another order (fp32)

// Where projection p's fp32 matrix lives in L.
static float **proj_w(CpuLayer *L, int p) {
    float **s[N_PROJ] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return s[p];
}

// twin = the dense fp32 model of w with every projection replaced by q's QWeight dequantized.
static void dequant_twin(const ModelWeights *w, const CpuModel *q, CpuModel *twin) {
    char err[512];
    if (w->quantized) cr_assert_eq(cpu_model_load_base(w, twin, err, sizeof err), 0, "%s", err);
    else cr_assert_eq(cpu_model_load(w, twin, err, sizeof err), 0, "%s", err);
    for (int l = 0; l < w->cfg.n_layers; l++)
        for (int p = 0; p < N_PROJ; p++) {
            const QWeight *qw = q->layers[l].q[p];
            cr_assert(qw, "layer %d projection %d is not quantized", l, p);
            cr_assert(*proj_w(&((CpuModel *)q)->layers[l], p) == NULL, "layer %d: the quantized model kept an fp32 matrix", l);
            float **W = proj_w(&twin->layers[l], p);
            free(*W);
            *W = malloc((size_t)qw->rows * qw->cols * sizeof(float));
            qweight_dequant(qw, *W);
        }
    if (q->q_lm_head) {  // the lm_head quantized too (tied or not: the embedding stays dense)
        cr_assert_null(q->lm_head, "the quantized lm_head left a dense one in the model");
        cr_assert(q->embed, "the embedding went with the lm_head");
        float *W = malloc((size_t)w->cfg.vocab * w->cfg.hidden * sizeof(float));
        qweight_dequant(q->q_lm_head, W);
        if (twin->lm_head != twin->embed) free(twin->lm_head);
        twin->lm_head = W;
    }
}

static void random_ids(int *ids, int n, int vocab, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) ids[i] = (int)(rng_u32(&r) % (uint32_t)vocab);
}

// One prefill sequence in slot `slot` of a runner with max_len positions per slot.
static void batch_one(Batch *b, const int *ids, int n, int slot, int max_len, int seq, int pos0) {
    const int r0 = b->n_tokens;
    for (int j = 0; j < n; j++)
        b->token_ids[r0 + j] = ids[j], b->positions[r0 + j] = pos0 + j, b->slot_mapping[r0 + j] = slot * max_len + pos0 + j;
    b->n_tokens += n;
    b->seq_lens_k[seq] = pos0 + n;
    b->seq_slot[seq] = slot;
    b->cu_seqlens_q[seq + 1] = b->n_tokens;
    b->n_seqs = seq + 1;
    b->logit_rows[b->n_logits++] = b->n_tokens - 1;
    b->cu_seqlens_q[0] = 0;
}

// The checks of one (model, quantized model, twin): step02 forward, step03 cached decode, step04 runner.
static void check_forwards(const char *what, const CpuModel *qm, const CpuModel *twin, const CpuModel *dense) {
    const ModelConfig *c = &qm->cfg;
    const int V = c->vocab, T = 17;
    int ids[T + 4];
    random_ids(ids, T + 4, V, 11);
    float *a = malloc((size_t)T * V * 4), *b = malloc((size_t)T * V * 4);
    // step02: every position of a prompt
    cr_assert_eq(forward_cpu(qm, ids, T, a, NULL), 0);
    cr_assert_eq(forward_cpu(twin, ids, T, b, NULL), 0);
    ErrStats e = compare_f32(a, b, (size_t)T * V);
    cr_expect(e.n_bad == 0 && e.max_rel < TOL_SAME, "%s: forward_cpu quantized vs dequantized twin: max_rel %.3e", what,
              e.max_rel);
    if (dense) {  // the test can fail: the quantization error is far above TOL_SAME
        float *d = malloc((size_t)T * V * 4);
        cr_assert_eq(forward_cpu(dense, ids, T, d, NULL), 0);
        const double ed = compare_f32(a, d, (size_t)T * V).max_rel;
        cr_expect(ed > 10 * TOL_SAME, "%s: the quantized logits equal the dense model's (%.3e): nothing was quantized?",
                  what, ed);
        fprintf(stderr, "[step06-engine] %s: vs dequantized twin %.2e, vs the dense model %.2e (max|diff|/max|logit|)\n",
                what, e.max_rel, ed);
        free(d);
    }
    // step03: a prefill of T - 1 tokens and 4 decode steps through the cache
    CpuKvCache k1, k2;
    cr_assert_eq(cpu_kv_init(&k1, c, T + 8), 0);
    cr_assert_eq(cpu_kv_init(&k2, c, T + 8), 0);
    cr_assert_eq(forward_cached_cpu(qm, &k1, ids, T - 1, a), 0);
    cr_assert_eq(forward_cached_cpu(twin, &k2, ids, T - 1, b), 0);
    for (int s = 0; s < 5; s++) {
        e = compare_f32(a, b, (size_t)V);
        cr_expect(e.n_bad == 0 && e.max_rel < TOL_SAME, "%s: forward_cached_cpu step %d: max_rel %.3e", what, s, e.max_rel);
        if (s == 4) break;
        cr_assert_eq(forward_cached_cpu(qm, &k1, &ids[T - 1 + s], 1, a), 0);
        cr_assert_eq(forward_cached_cpu(twin, &k2, &ids[T - 1 + s], 1, b), 0);
    }
    cpu_kv_free(&k1), cpu_kv_free(&k2);
    // step04: the prompt in the runner, alone and then with a batch mate before it (bit for bit)
    char err[512];
    const int max_len = 64;
    Runner *r = runner_new_cpu(qm, 3, max_len, 64, err, sizeof err);
    cr_assert(r, "%s", err);
    Batch bt;
    batch_alloc(&bt, 4, 64);
    batch_one(&bt, ids, T, 1, max_len, 0, 0);
    float *alone = malloc((size_t)V * 4), *mates = malloc((size_t)2 * V * 4), *ref = malloc((size_t)T * V * 4);
    cr_assert_eq(runner_forward(r, &bt, alone, NULL), 0);
    cr_assert_eq(forward_cpu(twin, ids, T, ref, NULL), 0);
    e = compare_f32(alone, ref + (size_t)(T - 1) * V, (size_t)V);
    cr_expect(e.n_bad == 0 && e.max_rel < TOL_SAME, "%s: step04 CPU runner vs the twin's forward: max_rel %.3e", what,
              e.max_rel);
    Runner *r2 = runner_new_cpu(qm, 3, max_len, 64, err, sizeof err);
    cr_assert(r2, "%s", err);
    bt.n_seqs = bt.n_tokens = bt.n_logits = 0;
    int mate[9];
    random_ids(mate, 9, V, 99);
    batch_one(&bt, mate, 9, 0, max_len, 0, 0);
    batch_one(&bt, ids, T, 1, max_len, 1, 0);
    cr_assert_eq(runner_forward(r2, &bt, mates, NULL), 0);
    cr_expect(memcmp(alone, mates + V, (size_t)V * 4) == 0, "%s: the quantized runner's row changed with a batch mate", what);
    batch_free(&bt);
    runner_free(r), runner_free(r2);
    free(a), free(b), free(alone), free(mates), free(ref);
}

static void rtn_case(const char *model, const char *method) {
    char err[512], dir[300], what[400];
    snprintf(dir, sizeof dir, "tests/data/models/%s", model);
    snprintf(what, sizeof what, "%s --quant %s", model, method);
    ModelWeights w;
    cr_assert_eq(model_load(dir, &w, err, sizeof err), 0, "%s", err);
    QuantSpec qs;
    cr_assert_eq(quant_spec_parse(method, &qs), 0);
    CpuModel qm, twin, dense;
    char fmt[256];
    cr_assert_eq(qmodel_cpu_load(&w, &qs, &qm, fmt, sizeof fmt, err, sizeof err), 0, "%s: %s", what, err);
    cr_expect(strncmp(fmt, method, 8) == 0, "%s: the format line '%s' does not name the method", what, fmt);
    cr_expect_eq(strstr(fmt, "lm_head too") != NULL, qs.lm_head, "%s: format line '%s'", what, fmt);
    cr_expect_eq(qm.q_lm_head != NULL, qs.lm_head, "%s: lm_head quantized %d, asked %d", what, qm.q_lm_head != NULL,
                 qs.lm_head);
    if (qm.q_lm_head) {
        const QWeight *q = qm.q_lm_head;
        cr_expect(q->rows == w.cfg.vocab && q->cols == w.cfg.hidden && (int)q->kind == (int)qs.method,
                  "%s: lm_head (%d, %d) int%d", what, q->rows, q->cols, (int)q->kind);
    }
    for (int l = 0; l < w.cfg.n_layers; l++)
        for (int p = 0; p < N_PROJ; p++) {
            const QWeight *q = qm.layers[l].q[p];
            cr_assert(q, "%s: layer %d projection %d not quantized", what, l, p);
            cr_expect_eq((int)q->kind, qs.method == QLOAD_RTN_INT8 ? 8 : 4);
            cr_expect(q->sym && !q->zeros, "%s: RTN at load is symmetric", what);
            if (qs.method == QLOAD_RTN_INT8) cr_expect_eq(q->group, q->cols, "%s: INT8 is per channel", what);
            else cr_expect_eq(q->group, q->cols % 128 ? q->cols : 128, "%s: INT4 group", what);
            for (int i = 0; i < q->rows * q->n_groups; i++)  // as `quantize` writes them
                cr_assert_eq(q->scales[i], (float)(_Float16)q->scales[i], "%s: layer %d projection %d scale %d is no fp16 value",
                             what, l, p, i);
        }
    dequant_twin(&w, &qm, &twin);
    cr_assert_eq(cpu_model_load(&w, &dense, err, sizeof err), 0, "%s", err);
    cr_expect(qmodel_cpu_weight_bytes(&qm) < qmodel_cpu_weight_bytes(&dense), "%s: %.0f bytes held quantized, %.0f dense",
              what, qmodel_cpu_weight_bytes(&qm), qmodel_cpu_weight_bytes(&dense));
    check_forwards(what, &qm, &twin, &dense);
    cpu_model_free(&qm), cpu_model_free(&twin), cpu_model_free(&dense);
    model_free(&w);
}

Test(step06_engine, rtn_at_load_forward_equals_the_dequantized_forward, .timeout = 240) {
    rtn_case("llama_mha_f32", "rtn-int8");
    rtn_case("llama_mha_f32", "rtn-int4");
    rtn_case("qwen2_bias_f32", "rtn-int8");  // q/k/v biases with quantized projections
    rtn_case("qwen2_bias_f32", "rtn-int4");
    rtn_case("qwen3_qknorm_f32", "rtn-int8");  // q/k norms; ff 163 is odd: no INT4 (below)
    rtn_case("llama_gqa_hd_f32", "rtn-int8");
    rtn_case("llama_mha_f32", "rtn-int4+lm_head");         // the lm_head quantized too: untied
    rtn_case("llama3_tied_rope_f32", "rtn-int8+lm_head");  // tied: the embedding stays for the lookups
}

Test(step06_engine, rtn_int4_refuses_an_odd_width_by_name) {
    char err[512];
    ModelWeights w;
    cr_assert_eq(model_load("tests/data/models/qwen3_qknorm_f32", &w, err, sizeof err), 0, "%s", err);
    QuantSpec qs;
    quant_spec_parse("rtn-int4", &qs);
    CpuModel m;
    cr_assert_eq(qmodel_cpu_load(&w, &qs, &m, NULL, 0, err, sizeof err), -1);
    cr_expect(strstr(err, "down_proj") && strstr(err, "even"), "message: %s", err);
    cr_expect_eq(quant_spec_parse("rtn-int3", &qs), -1);
    cr_expect_eq(quant_spec_parse("none+lm_head", &qs), -1, "nothing to quantize the lm_head with");
    cr_expect_eq(quant_spec_parse("rtn-int4+lm", &qs), -1);
    cr_expect_eq(quant_spec_parse("rtn-int4+lm_head+x", &qs), -1);
    cr_expect_eq(quant_spec_parse("rtn-int8x", &qs), -1);
    cr_assert_eq(quant_spec_parse("rtn-int4+lm_head", &qs), 0);
    cr_expect(qs.method == QLOAD_RTN_INT4 && qs.lm_head && qs.group == 128);
    cr_assert_eq(quant_spec_parse("rtn-int8", &qs), 0);
    cr_expect(qs.method == QLOAD_RTN_INT8 && !qs.lm_head);
    model_free(&w);
}

// kv_bench's bytes per token with the lm_head quantized: a tied model's embedding is then read one
// row a token (as an untied one's), not whole as the lm_head; without +lm_head it is the lm_head.
static double kv_bench_weights_read(const char *dir, const char *quant) {
    char out[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/kv_bench --device cpu --model %s --positions 1 --window 0 --reps 1 --quant %s --csv 2>&1",
             BUILD_BIN_DIR, dir, quant);
    cr_assert_eq(test_run_cmd(cmd, out, sizeof out), 0, "%s:\n%s", cmd, out);
    const char *at = strstr(out, "# weights_read_per_token: ");
    cr_assert(at, "%s: no weights_read_per_token line", cmd);
    return atof(at + strlen("# weights_read_per_token: "));
}

Test(step06_engine, kv_bench_counts_a_tied_embedding_one_row_once_the_lm_head_is_quantized, .timeout = 120) {
    const char *dir = "tests/data/models/llama3_tied_rope_f32";
    char err[512];
    ModelWeights w;
    cr_assert_eq(model_load(dir, &w, err, sizeof err), 0, "%s", err);
    cr_assert(w.cfg.tie_embeddings, "the case needs a tied model");
    const double row_less = ((double)w.cfg.vocab - 1) * w.cfg.hidden * 4;  // fp32 on the CPU
    const char *qn[2] = {"rtn-int8", "rtn-int8+lm_head"};
    for (int lm = 0; lm < 2; lm++) {
        QuantSpec qs;
        cr_assert_eq(quant_spec_parse(qn[lm], &qs), 0);
        CpuModel m;
        cr_assert_eq(qmodel_cpu_load(&w, &qs, &m, NULL, 0, err, sizeof err), 0, "%s", err);
        const double want = qmodel_cpu_weight_bytes(&m) - (lm ? row_less : 0), got = kv_bench_weights_read(dir, qn[lm]);
        cr_expect(fabs(got - want) <= 1e-3 * want, "--quant %s: kv_bench counts %.6g bytes a token, want %.6g", qn[lm], got,
                  want);
        cpu_model_free(&m);
    }
    model_free(&w);
}

// build/bin/quantize's output directory loads as a quantized checkpoint and runs quantized.
// lm: with --lm-head (the lm_head quantized too, "lm_head": true), from src.
static void quantize_case(const char *method, double max_vs_source, int lm, const char *src) {
    char tmp[64], cmd[1024], err[512], what[160];
    test_mkdtemp(tmp, sizeof tmp, "step06_engine");
    snprintf(cmd, sizeof cmd, "%s/quantize --model %s --out %s --method %s --group -1 --calib-tokens 256 --seq-len 32%s "
             ">/dev/null 2>&1", BUILD_BIN_DIR, src, tmp, method, lm ? " --lm-head" : "");
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    snprintf(what, sizeof what, "quantize --method %s%s (%s)", method, lm ? " --lm-head" : "", src);
    ModelWeights w, ws;
    cr_assert_eq(model_load(tmp, &w, err, sizeof err), 0, "%s", err);
    cr_assert(w.quantized, "%s: model_load did not see the quantization_config", what);
    cr_assert_null(w.layers[0].wq, "a quantized checkpoint has no dense q_proj");
    CpuModel qm, twin, dense;
    QuantSpec none;
    quant_spec_parse("none", &none);
    char fmt[256];
    cr_assert_eq(qmodel_cpu_load(&w, &none, &qm, fmt, sizeof fmt, err, sizeof err), 0, "%s: %s", what, err);
    cr_expect(strstr(fmt, "gptq") && strstr(fmt, "checkpoint"), "%s: format line '%s'", what, fmt);
    cr_expect_eq(strstr(fmt, "lm_head too") != NULL, lm, "%s: format line '%s'", what, fmt);
    cr_expect_eq(qm.q_lm_head != NULL, lm, "%s: lm_head quantized %d", what, qm.q_lm_head != NULL);
    StSet st;
    cr_assert_eq(st_open(tmp, &st, err, sizeof err), 0, "%s", err);
    cr_expect_eq(st_get(&st, "lm_head.qweight") != NULL, lm, "%s: lm_head.qweight in the file", what);
    cr_expect(!lm || !st_get(&st, "lm_head.weight"), "%s: a dense lm_head.weight next to the quantized one", what);
    cr_expect(st_get(&st, "model.embed_tokens.weight"), "%s: the embedding is kept", what);
    st_close(&st);
    dequant_twin(&w, &qm, &twin);
    cr_assert_eq(model_load(src, &ws, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cpu_model_load(&ws, &dense, err, sizeof err), 0, "%s", err);
    check_forwards(what, &qm, &twin, &dense);
    // and the loaded weights are the source's, quantized: logits close to the fp32 source's
    const int T = 16, V = w.cfg.vocab;
    int ids[16];
    random_ids(ids, T, V, 5);
    float *a = malloc((size_t)T * V * 4), *b = malloc((size_t)T * V * 4);
    cr_assert_eq(forward_cpu(&qm, ids, T, a, NULL), 0);
    cr_assert_eq(forward_cpu(&dense, ids, T, b, NULL), 0);
    const double e = compare_f32(a, b, (size_t)T * V).max_rel;
    cr_expect(e < max_vs_source, "%s: logits vs the fp32 source max_rel %.3e (expected < %.2g)", what, e, max_vs_source);
    free(a), free(b);
    cpu_model_free(&qm), cpu_model_free(&twin), cpu_model_free(&dense);
    model_free(&w), model_free(&ws);
    test_rmtree(tmp);
}

Test(step06_engine, quantize_output_loads_and_runs_quantized, .timeout = 240) {
    const char *tied = "tests/data/models/llama3_tied_rope_f32", *untied = "tests/data/models/llama_mha_f32";
    quantize_case("rtn-int8", 0.05, 0, tied);
    quantize_case("gptq-int4", 0.7, 0, tied);  // per-row INT4 on a 64-wide model: coarse; garbage weights give ~1 or more
    quantize_case("rtn-int8", 0.05, 1, untied);  // the lm_head too: lm_head.weight replaced by lm_head.qweight ...
    quantize_case("gptq-int4", 0.8, 1, tied);    // tied: lm_head.qweight from the embedding, which stays
}

// The packer's whole GPTQ model (act-order: each projection its own permutation, asymmetric,
// group 32) against its dequantized fp32 twin, written by the packer, not by the engine.
Test(step06_engine, packer_gptq_model_generates_its_twins_tokens, .timeout = 120) {
    char err[512];
    ModelWeights wq, wd;
    cr_assert_eq(model_load(QDATA "/gptq4_act_model", &wq, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_load(QDATA "/gptq4_act_model_dense", &wd, err, sizeof err), 0, "%s", err);
    cr_assert(wq.quantized && !wd.quantized);
    QuantSpec none;
    quant_spec_parse("none", &none);
    CpuModel qm, dm;
    char fmt[256];
    cr_assert_eq(qmodel_cpu_load(&wq, &none, &qm, fmt, sizeof fmt, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(fmt, "gptq int4 g32 asym act-order (checkpoint)");
    cr_assert_eq(cpu_model_load(&wd, &dm, err, sizeof err), 0, "%s", err);
    // the integers and scales dequantize to the packer's W exactly
    int mismatched = 0;
    for (int l = 0; l < wq.cfg.n_layers; l++)
        for (int p = 0; p < N_PROJ; p++) {
            const QWeight *q = qm.layers[l].q[p];
            cr_assert(q && q->g_idx && q->zeros, "layer %d projection %d: act-order and zero points expected", l, p);
            float *W = malloc((size_t)q->rows * q->cols * 4);
            qweight_dequant(q, W);
            mismatched += memcmp(W, *proj_w(&dm.layers[l], p), (size_t)q->rows * q->cols * 4) != 0;
            free(W);
        }
    cr_expect_eq(mismatched, 0, "%d projections do not dequantize to the packer's W", mismatched);
    // greedy tokens: the quantized model and the twin, through step03's cache
    const int prompts[3][4] = {{10, 20, 30, 40}, {72, 41, 3, 9}, {5, 6, 7, 8}};
    const int V = wq.cfg.vocab, n = 24;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    double worst = 0;
    for (int pi = 0; pi < 3; pi++) {
        CpuKvCache ka, kb;
        cr_assert_eq(cpu_kv_init(&ka, &wq.cfg, 4 + n), 0);
        cr_assert_eq(cpu_kv_init(&kb, &wq.cfg, 4 + n), 0);
        cr_assert_eq(forward_cached_cpu(&qm, &ka, prompts[pi], 4, la), 0);
        cr_assert_eq(forward_cached_cpu(&dm, &kb, prompts[pi], 4, lb), 0);
        for (int s = 0; s < n; s++) {
            const double e = compare_f32(la, lb, (size_t)V).max_rel;
            worst = e > worst ? e : worst;
            const int ta = argmax_f32(la, V), tb = argmax_f32(lb, V);
            cr_assert_eq(ta, tb, "prompt %d step %d: quantized model %d, dense twin %d", pi, s, ta, tb);
            if (s + 1 < n) {
                cr_assert_eq(forward_cached_cpu(&qm, &ka, &ta, 1, la), 0);
                cr_assert_eq(forward_cached_cpu(&dm, &kb, &tb, 1, lb), 0);
            }
        }
        cpu_kv_free(&ka), cpu_kv_free(&kb);
    }
    cr_expect(worst < TOL_SAME, "logits quantized vs twin: max_rel %.3e", worst);
    fprintf(stderr, "[step06-engine] packer GPTQ model: 3 x %d greedy tokens equal to the dense twin's, logits within %.2e\n",
            n, worst);
    free(la), free(lb);
    cpu_model_free(&qm), cpu_model_free(&dm);
    model_free(&wq), model_free(&wd);
}

Test(step06_engine, dense_loaders_refuse_a_quantized_directory) {
    char err[512];
    ModelWeights w;
    cr_assert_eq(model_load(QDATA "/gptq4_act_model", &w, err, sizeof err), 0, "%s", err);
    CpuModel m;
    cr_expect_eq(cpu_model_load(&w, &m, err, sizeof err), -1);
    cr_expect(strstr(err, "quantized checkpoint") && strstr(err, "gptq4_act_model"), "message: %s", err);
    cr_expect_null(gpu_model_load(&w, err, sizeof err));
    model_free(&w);
}

Test(step06_engine, stack_rows_is_the_parts_one_above_the_other) {
    const int cols = 64, rows[3] = {5, 8, 3};
    QWeight part[3], st;
    float *W[3];
    Rng r;
    rng_seed(&r, 3);
    for (int i = 0; i < 3; i++) {
        W[i] = rng_new_normal(&r, (size_t)rows[i] * cols, 0, 1);
        cr_assert_eq(quant_rtn(W[i], rows[i], cols, QK_INT4, 32, 0, &part[i]), 0);
    }
    const QWeight *pp[3] = {&part[0], &part[1], &part[2]};
    cr_assert_eq(qweight_stack_rows(pp, 3, &st), 0);
    cr_expect_eq(st.rows, 16);
    float *a = malloc((size_t)16 * cols * 4), *b = malloc((size_t)16 * cols * 4);
    qweight_dequant(&st, a);
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        qweight_dequant(&part[i], b + off);
        off += (size_t)rows[i] * cols;
    }
    cr_expect(memcmp(a, b, (size_t)16 * cols * 4) == 0, "the stacked weight is not the parts stacked");
    qweight_free(&st);
    // a part with another group (or symmetry, or g_idx) cannot be stacked
    QWeight other;
    cr_assert_eq(quant_rtn(W[1], rows[1], cols, QK_INT4, 16, 0, &other), 0);
    const QWeight *pq[2] = {&part[0], &other};
    cr_expect_eq(qweight_stack_rows(pq, 2, &st), 1);
    qweight_free(&other);
    cr_assert_eq(quant_rtn(W[1], rows[1], cols, QK_INT4, 32, 0, &other), 0);
    other.g_idx = malloc(cols * sizeof(int));
    for (int c = 0; c < cols; c++) other.g_idx[c] = (cols - 1 - c) / 32;
    cr_expect_eq(qweight_stack_rows(pq, 2, &st), 1);
    qweight_free(&other);
    for (int i = 0; i < 3; i++) qweight_free(&part[i]), free(W[i]);
    free(a), free(b);
}
