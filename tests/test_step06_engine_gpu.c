// test_step06_engine_gpu.c — step06's quantized projections in the engine's CUDA paths (suite
// step06_egpu): step03's decode graph (qlinear_gpu_gemv at every projection) and step04's GPU
// runner (qlinear_gpu_gemm for steps of several rows, the GEMV for a lone row), each against the
// CPU's quantized forward (linear_q_cpu) on the same QWeights: RTN at load (INT8 per channel,
// INT4 per row: q|k|v and gate|up stacked into one weight) on tiny test checkpoints, and the
// packer's whole GPTQ act-order model (projections with different permutations: not stackable, so
// q, k, v run one after the other). Logits within the bf16 tolerance step02 uses (the dense parts
// and the GEMM inputs are bf16 on the GPU), greedy tokens by vLLM's rule.
// Every test skips (and says why) without a CUDA device.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "golden_util.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step03_kvcache/kvcache.h"
#include "step04_batching/runner_gpu.h"
#include "step06_quant/qlinear_bench_gpu.h"  // qlinear_gemv_set_version: the GEMV rungs
#include "step06_quant/qmodel.h"

#define TOL_BF16 4e-2  // max|diff| / max|logit|, GPU bf16 vs CPU fp32 (as step02)

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

typedef struct {
    const char *dir, *quant;
} Case;
static const Case CASES[] = {
    {"tests/data/models/llama_mha_f32", "rtn-int8"},   {"tests/data/models/llama_mha_f32", "rtn-int4"},
    {"tests/data/models/qwen2_bias_f32", "rtn-int4"},  {"tests/data/models/qwen3_qknorm_f32", "rtn-int8"},
    {"tests/data/models/llama_gqa_hd_bf16", "rtn-int8"}, {"tests/data/quant/gptq4_act_model", "none"},
    // the lm_head quantized too: untied (INT4), tied (INT8: the embedding stays bf16 for the lookups)
    {"tests/data/models/llama_mha_f32", "rtn-int4+lm_head"}, {"tests/data/models/llama3_tied_rope_f32", "rtn-int8+lm_head"},
};
#define N_CASES (int)(sizeof CASES / sizeof CASES[0])

typedef struct {
    ModelWeights w;
    CpuModel cm;
    GpuModel *gm;
    char what[400];
} QModels;

static void qmodels_load(const Case *k, QModels *m) {
    char err[512], f1[256], f2[256];
    QuantSpec qs;
    cr_assert_eq(quant_spec_parse(k->quant, &qs), 0);
    cr_assert_eq(model_load(k->dir, &m->w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(qmodel_cpu_load(&m->w, &qs, &m->cm, f1, sizeof f1, err, sizeof err), 0, "%s: %s", k->dir, err);
    m->gm = qmodel_gpu_load(&m->w, &qs, f2, sizeof f2, err, sizeof err);
    cr_assert(m->gm, "%s: %s", k->dir, err);
    cr_assert_str_eq(f1, f2);
    snprintf(m->what, sizeof m->what, "%s [%s]", k->dir, f1);
    cr_expect(strstr(gpu_model_describe(m->gm), "projections quantized"), "%s: description '%s'", m->what,
              gpu_model_describe(m->gm));
    cr_expect_eq(strstr(gpu_model_describe(m->gm), "lm_head quantized") != NULL, qs.lm_head, "%s: description '%s'",
                 m->what, gpu_model_describe(m->gm));
}

static void qmodels_free(QModels *m) {
    gpu_model_free(m->gm);
    cpu_model_free(&m->cm);
    model_free(&m->w);
}

#define NP 6
#define NG 16

// step03: the prompt token by token through the decode graph, then greedy steps, against the CPU;
// with the default GEMV rung, then with each k_qtma rung (v12+: on sm_90a the fused step's
// projections become one kernel with the RMSNorm / SwiGLU folded in; elsewhere they fall back).
Test(step06_egpu, decode_graph_matches_the_cpu_quantized_forward, .timeout = 600) {
    NEED_GPU();
    // the rungs, and the TMA rungs' grid (qlinear_gemv_set_grid): the default's second run and the
    // odd rungs' with the grid balanced over the SMs
    static const int RUNGS[] = {-1, -1, 11, 12, 13, 14, 15, 16}, GRID[] = {0, 1, 0, 1, 0, 1, 0, 1};
    for (int ri = 0; ri < (int)(sizeof RUNGS / sizeof RUNGS[0]); ri++)
    for (int ci = 0; ci < N_CASES; ci++) {
        if (RUNGS[ri] >= qlinear_gemv_n_versions()) continue;
        qlinear_gemv_set_version(RUNGS[ri]);
        qlinear_gemv_set_grid(GRID[ri]);
        QModels m;
        qmodels_load(&CASES[ci], &m);
        const int V = m.w.cfg.vocab;
        int prompt[NP];
        Rng r;
        rng_seed(&r, 40 + ci);
        for (int i = 0; i < NP; i++) prompt[i] = (int)(rng_u32(&r) % (uint32_t)V);
        float *lc = malloc((size_t)V * 4), *lg = malloc((size_t)V * 4);
        int tc[NG], tg[NG], t5c[NG * 5], t5g[NG * 5];
        char err[512];
        CpuKvCache kv;
        cr_assert_eq(cpu_kv_init(&kv, &m.w.cfg, NP + NG + 1), 0);
        GpuDecoder *d = gpu_decoder_new(m.gm, NP + NG + 1, err, sizeof err);
        cr_assert(d, "%s", err);
        cr_assert_eq(forward_cached_cpu(&m.cm, &kv, prompt, NP, lc), 0);
        for (int i = 0; i < NP; i++) cr_assert_eq(gpu_decoder_step(d, prompt[i], i == NP - 1 ? lg : NULL), 0);
        double worst = 0;
        int tokc = 0;
        for (int s = 0; s < NG; s++) {
            const double e = compare_f32(lg, lc, (size_t)V).max_rel;
            worst = e > worst ? e : worst;
            cr_expect(e <= TOL_BF16, "%s: step %d: logits max_rel %.3e", m.what, s, e);
            forward_topk(lc, V, 5, t5c + 5 * s);
            forward_topk(lg, V, 5, t5g + 5 * s);
            tc[s] = tokc = t5c[5 * s], tg[s] = t5g[5 * s];
            if (s + 1 < NG) {  // both sides continue with the CPU's token, so every step's logits are
                               // comparable (a near tie that flips one greedy token does not end the check)
                cr_assert_eq(forward_cached_cpu(&m.cm, &kv, &tokc, 1, lc), 0);
                cr_assert_eq(gpu_decoder_step(d, tokc, lg), 0);
            }
        }
        const int agreed = vllm_expect(m.what, tc, t5c, tg, t5g, NG);
        fprintf(stderr, "[step06-egpu decode, GEMV %s%s] %s: %d/%d greedy tokens identical, worst logits max_rel %.2e\n",
                qlinear_gemv_version_name(RUNGS[ri]), GRID[ri] ? ", grid balanced" : "", m.what, agreed, NG, worst);
        gpu_decoder_free(d);
        cpu_kv_free(&kv);
        free(lc), free(lg);
        qmodels_free(&m);
    }
    qlinear_gemv_set_version(-1);
    qlinear_gemv_set_grid(0);
}

// step03's decode graph with step06's chain kernel (k_qtmc: o, gate|up, down and the next q|k|v,
// or the lm_head, as one kernel a layer) against the same graph with the layers one kernel each:
// every step's logits bit for bit, on random INT4 models whose widths the chain takes (multiples of
// 64): Llama and Qwen2 (q|k|v biases), groups of 128 and 32 and per channel, the lm_head dense and
// quantized; on sm_90 the chain must also have taken the graph's kernels down.
Test(step06_egpu, decode_chain_is_bit_identical_to_the_layers_one_by_one, .timeout = 300) {
    NEED_GPU();
    static const char *CFG[] = {
        "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":256,\"intermediate_size\":768,"
        "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":1000,"
        "\"max_position_embeddings\":256,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":false}",
        "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":384,\"intermediate_size\":1152,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":6,\"num_key_value_heads\":2,\"vocab_size\":1500,"
        "\"max_position_embeddings\":256,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,\"tie_word_embeddings\":false}"};
    static const struct {
        const char *quant;
        int group;
    } QS[] = {{"rtn-int4", 128}, {"rtn-int4+lm_head", 128}, {"rtn-int4+lm_head", 32}, {"rtn-int4", -1}};
    for (int ci = 0; ci < 2; ci++)
        for (int qi = 0; qi < (int)(sizeof QS / sizeof QS[0]); qi++) {
            char err[512], fmt[256];
            ModelConfig cfg;
            cr_assert_eq(hf_config_parse(CFG[ci], "chain test", &cfg, err, sizeof err), 0, "%s", err);
            QuantSpec qs;
            cr_assert_eq(quant_spec_parse(QS[qi].quant, &qs), 0);
            qs.group = QS[qi].group;
            GpuModel *gm = qmodel_gpu_random(&cfg, &qs, 70 + qi, fmt, sizeof fmt, err, sizeof err);
            cr_assert(gm, "%s", err);
            char what[400];
            snprintf(what, sizeof what, "%s %s g%d", model_arch_name(cfg.arch), QS[qi].quant, QS[qi].group);
            qlinear_gemv_set_chain(0);
            GpuDecoder *d0 = gpu_decoder_new(gm, 40, err, sizeof err);
            cr_assert(d0, "%s", err);
            qlinear_gemv_set_chain(1);
            GpuDecoder *d1 = gpu_decoder_new(gm, 40, err, sizeof err);
            cr_assert(d1, "%s", err);
            const int k0 = gpu_decoder_kernels(d0), k1 = gpu_decoder_kernels(d1);
            if (gi_.cc_major == 9)  // a layer's o, gate|up, down (+ q|k|v) become one kernel
                cr_expect_lt(k1, k0, "%s: %d kernels a step with the chain, %d without", what, k1, k0);
            const int V = cfg.vocab;
            float *l0 = malloc((size_t)V * 4), *l1 = malloc((size_t)V * 4);
            Rng r;
            rng_seed(&r, 90 + qi);
            int same = 1, first_bad = -1;
            for (int st = 0; st < 30; st++) {
                const int tok = (int)(rng_u32(&r) % (uint32_t)V);
                cr_assert_eq(gpu_decoder_step(d0, tok, l0), 0);
                cr_assert_eq(gpu_decoder_step(d1, tok, l1), 0);
                if (memcmp(l0, l1, (size_t)V * 4) && same) same = 0, first_bad = st;
            }
            cr_expect(same, "%s: the logits differ first at step %d", what, first_bad);
            fprintf(stderr, "[step06-egpu chain] %s: 30 steps, logits bit-identical: %s (kernels a step %d -> %d)\n", what,
                    same ? "yes" : "NO", k0, k1);
            gpu_decoder_free(d0), gpu_decoder_free(d1);
            free(l0), free(l1);
            gpu_model_free(gm);
        }
    qlinear_gemv_set_chain(-1);
}

// A slot batch: sequence i has n[i] new rows at positions p0[i] .. in slot i.
typedef struct {
    int tok[64], pos[64], slot[64], cu[5], lens[4], sslot[4], lrows[4];
    Batch b;
} QBatch;

static void qb_make(QBatch *q, int ns, const int *n, const int *p0, int *const *toks, int max_len) {
    memset(&q->b, 0, sizeof q->b);
    q->b.token_ids = q->tok, q->b.positions = q->pos, q->b.slot_mapping = q->slot, q->b.cu_seqlens_q = q->cu;
    q->b.seq_lens_k = q->lens, q->b.seq_slot = q->sslot, q->b.logit_rows = q->lrows;
    q->b.cap_seqs = 4, q->b.cap_tokens = 64;
    q->cu[0] = 0;
    for (int i = 0; i < ns; i++) {
        for (int j = 0; j < n[i]; j++) {
            const int row = q->b.n_tokens + j;
            q->tok[row] = toks[i][p0[i] + j], q->pos[row] = p0[i] + j, q->slot[row] = i * max_len + p0[i] + j;
        }
        q->b.n_tokens += n[i];
        q->lens[i] = p0[i] + n[i], q->sslot[i] = i, q->cu[i + 1] = q->b.n_tokens;
        q->lrows[q->b.n_logits++] = q->b.n_tokens - 1;
    }
    q->b.n_seqs = ns;
}

// step04: steps of 32 rows (two prompts: the GEMM), 2 rows (two decodes: the GEMM) and 1 row (a
// lone decode: the GEMV), GPU runner against the CPU runner on the same quantized weights; the GPU
// runner as it is, then with the RMSNorms folded into the projections at 2..16 rows (LLM_GEMM_NORM=1,
// read when the runner is made).
Test(step06_egpu, batched_runner_matches_the_cpu_quantized_runner, .timeout = 300) {
    NEED_GPU();
    for (int run = 0; run < 2 * N_CASES; run++) {
        const int ci = run / 2, fold = run % 2;
        QModels m;
        qmodels_load(&CASES[ci], &m);
        const int V = m.w.cfg.vocab, max_len = 48;
        char err[512];
        setenv("LLM_GEMM_NORM", fold ? "1" : "0", 1);
        GpuRunner *g = gpu_runner_new(m.gm, 2, max_len, 64, err, sizeof err);
        unsetenv("LLM_GEMM_NORM");
        cr_assert(g, "%s", err);
        Runner *c = runner_new_cpu(&m.cm, 2, max_len, 64, err, sizeof err);
        cr_assert(c, "%s", err);
        int ta[max_len], tb[max_len];
        Rng r;
        rng_seed(&r, 90 + ci);
        for (int i = 0; i < max_len; i++) ta[i] = (int)(rng_u32(&r) % (uint32_t)V), tb[i] = (int)(rng_u32(&r) % (uint32_t)V);
        int *toks[2] = {ta, tb};
        const int steps = 5;
        const int ns[5] = {2, 2, 2, 1, 1};
        const int nn[5][2] = {{23, 9}, {1, 1}, {1, 1}, {1, 0}, {1, 0}};
        int p0[2] = {0, 0};
        float *lg = malloc((size_t)2 * V * 4), *lc = malloc((size_t)2 * V * 4);
        double worst = 0;
        for (int s = 0; s < steps; s++) {
            QBatch q;
            qb_make(&q, ns[s], nn[s], p0, toks, max_len);
            cr_assert_eq(gpu_runner_forward(g, &q.b, lg, NULL), 0, "%s step %d", m.what, s);
            cr_assert_eq(runner_forward(c, &q.b, lc, NULL), 0, "%s step %d", m.what, s);
            for (int i = 0; i < ns[s]; i++) {
                const double e = compare_f32(lg + (size_t)i * V, lc + (size_t)i * V, (size_t)V).max_rel;
                worst = e > worst ? e : worst;
                cr_expect(e <= TOL_BF16, "%s%s: step %d (%d rows) sequence %d: logits max_rel %.3e", m.what,
                          fold ? " (norms folded)" : "", s, q.b.n_tokens, i, e);
                p0[i] += nn[s][i];
                toks[i][p0[i]] = argmax_f32(lc + (size_t)i * V, V);  // both continue with the CPU's token
            }
        }
        fprintf(stderr, "[step06-egpu runner] %s%s: 5 steps (32, 2, 2, 1, 1 rows), worst logits max_rel %.2e\n", m.what,
                fold ? " (norms folded)" : "", worst);
        free(lg), free(lc);
        runner_free(c);
        gpu_runner_free(g);
        qmodels_free(&m);
    }
}

// Quantized weights take fewer device bytes than the dense model, and q|k|v stack when they can.
// The measuring knob LLM_STEP_SKIP (step04's runner, read once a process): with mask 1 the RMSNorms
// inside the layers are left out of steps of 2..64 rows, so a 32-row prompt step's logits must part
// from the CPU runner's (if the knob did nothing they would match, as the test above checks).
Test(step06_egpu, step_skip_knob_leaves_the_norms_out, .timeout = 120) {
    NEED_GPU();
    QModels m;
    qmodels_load(&CASES[0], &m);
    const int V = m.w.cfg.vocab, max_len = 48;
    char err[512];
    setenv("LLM_STEP_SKIP", "1", 1);
    GpuRunner *g = gpu_runner_new(m.gm, 2, max_len, 64, err, sizeof err);
    cr_assert(g, "%s", err);
    Runner *c = runner_new_cpu(&m.cm, 2, max_len, 64, err, sizeof err);
    cr_assert(c, "%s", err);
    int ta[max_len], tb[max_len];
    Rng r;
    rng_seed(&r, 97);
    for (int i = 0; i < max_len; i++) ta[i] = (int)(rng_u32(&r) % (uint32_t)V), tb[i] = (int)(rng_u32(&r) % (uint32_t)V);
    int *toks[2] = {ta, tb}, p0[2] = {0, 0};
    const int nn[2] = {23, 9};
    QBatch q;
    qb_make(&q, 2, nn, p0, toks, max_len);
    float *lg = malloc((size_t)2 * V * 4), *lc = malloc((size_t)2 * V * 4);
    cr_assert_eq(gpu_runner_forward(g, &q.b, lg, NULL), 0, "%s", m.what);
    cr_assert_eq(runner_forward(c, &q.b, lc, NULL), 0, "%s", m.what);
    for (int i = 0; i < 2; i++) {
        const ErrStats e = compare_f32(lg + (size_t)i * V, lc + (size_t)i * V, (size_t)V);  // (stale xn: maybe NaN)
        cr_expect(e.n_bad > 0 || e.max_rel > TOL_BF16,
                  "%s: sequence %d's logits match the CPU's (max_rel %.3e) with the norms left out", m.what, i, e.max_rel);
    }
    unsetenv("LLM_STEP_SKIP");
    free(lg), free(lc);
    runner_free(c);
    gpu_runner_free(g);
    qmodels_free(&m);
}

Test(step06_egpu, weight_bytes_and_description, .timeout = 120) {
    NEED_GPU();
    char err[512];
    ModelWeights w;
    cr_assert_eq(model_load("tests/data/models/llama_mha_bf16", &w, err, sizeof err), 0, "%s", err);
    GpuModel *dense = gpu_model_load(&w, err, sizeof err);
    cr_assert(dense, "%s", err);
    const double db = gpu_model_weight_bytes(dense);
    const ModelConfig *c = &w.cfg;
    const double proj = (double)c->n_layers *
                        ((double)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim * c->hidden +
                         (double)c->hidden * c->n_heads * c->head_dim + 3.0 * c->intermediate * c->hidden);
    for (int k = 0; k < 2; k++) {
        QuantSpec qs;
        quant_spec_parse(k ? "rtn-int4" : "rtn-int8", &qs);
        GpuModel *q = qmodel_gpu_load(&w, &qs, NULL, 0, err, sizeof err);
        cr_assert(q, "%s", err);
        const double qb = gpu_model_weight_bytes(q);
        // the projections: 2 bytes per weight dense, ~1 (INT8) or ~0.5 (INT4) quantized, + scales and any
        // padding of the GPU layout (hence the wide band)
        const double saved = db - qb, expect = proj * (k ? 1.5 : 1.0);
        cr_expect(saved > 0.6 * expect && saved < 1.2 * expect, "%s: dense %.0f B, quantized %.0f B: saved %.0f, ~%.0f expected",
                  qs.method == QLOAD_RTN_INT8 ? "int8" : "int4", db, qb, saved, expect);
        cr_expect(strstr(gpu_model_describe(q), "q|k|v as 1 weight"), "%s", gpu_model_describe(q));
        gpu_model_free(q);
    }
    gpu_model_free(dense);
    model_free(&w);
}
