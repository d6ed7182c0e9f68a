// test_step03_kvcache.c — decode with a KV cache, on the CPU and CUDA, and sampling.
//
// Ops: the cached attention against step02's attention (the same function at pos0 = 0; the last
// row of a full causal attention equals one decode query over the cache); the GPU GEMV and the
// decode-attention kernel against the CPU on odd shapes (rows, n_in, head_dim, lengths that are
// not multiples of any tile), fresh random inputs, poisoned outputs.
// Model: for every checkpoint under tests/data/models/, the greedy continuation of prompt_T7 with
// the cache equals transformers' (goldens/greedy.json) by vLLM's rule — identical, or at the
// first difference each side's token is in the other's top-5 — on the CPU and on the GPU; cached
// and uncached generation give the same tokens (CPU: identical; GPU: the same rule, since the
// cached GEMV and the uncached cuBLAS GEMM round differently); the device-side greedy loop
// (CUDA graph replays) gives the tokens of the host-side loop.
// Sampling: a seed reproduces its draws; draws never leave the top-k / top-p / min-p set
// (computed here independently); temperature -> 0 and greedy give the argmax; the sampler, which
// sorts only what the filters keep, gives the candidates, probabilities and draws of a sort of the
// whole vocabulary on thousands of random cases (peaked, flat, tied logits).
// KV bytes: the cache holds exactly the formula 2 * layers * kv_heads * head_dim * bytes per token.
// generate: stops right after an EOS id of generation_config.json, and not with --ignore-eos.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "golden_util.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step01_matmul/accounting.h"
#include "step01_matmul/matmul_gpu.h"  // matmul_round_to_dtype
#include "step03_kvcache/kvcache.h"


// ---------------------------------------------------------------- KV bytes

Test(step03, kv_bytes_equal_the_formula) {
    char err[256];
    ModelConfig c;
    cr_assert_eq(hf_config_parse(preset_config_json("llama-3.1-8b"), "llama-3.1-8b", &c, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kv_bytes_per_token(&c, 2), 131072.0, "8B bf16: 2*32*8*128*2 = 128 KiB per token");
    ModelConfig mha = c;
    mha.n_kv_heads = mha.n_heads;
    cr_expect_eq(kv_bytes_per_token(&mha, 2) / kv_bytes_per_token(&c, 2), 4.0, "GQA 32/8 heads stores 4x less");
    CpuKvCache kv;
    cr_assert_eq(cpu_kv_init(&kv, &c, 3), 0);
    cr_expect_eq(cpu_kv_bytes(&kv), 3 * kv_bytes_per_token(&c, 4), "fp32 cache of 3 positions");
    cpu_kv_free(&kv);
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return;
    // on the GPU: device memory actually taken, for a small model with a long cache
    ModelWeights w;
    cr_assert_eq(model_load(MODELS_DIR "/llama_gqa_hd_bf16", &w, err, sizeof err), 0, "%s", err);
    GpuModel *g = gpu_model_load(&w, err, sizeof err);
    cr_assert(g, "%s", err);
    const int max_seq = 65536;  // ~38 MB: the 2 MiB allocation granularity is small beside it
    GpuDecoder *d = gpu_decoder_new(g, max_seq, err, sizeof err);
    cr_assert(d, "%s", err);
    const double want = kv_bytes_per_token(&w.cfg, gpu_decoder_kv_elem_bytes(d)) * max_seq;
    const double got = gpu_decoder_kv_bytes(d);
    cr_expect(got >= want && got <= want + 4.0 * (1 << 21), "GPU cache took %.0f bytes, formula %.0f", got, want);
    gpu_decoder_free(d);
    gpu_model_free(g);
    model_free(&w);
}

// ---------------------------------------------------------------- cached attention (CPU)

static const int attn_shapes[][4] = {  // T, H, KV, hd
    {1, 4, 4, 16}, {7, 4, 2, 24}, {33, 2, 1, 32}, {70, 8, 2, 20}};

// Attention over a cache (step02's attention_at_cpu with pos0 > 0) must give the same rows as
// recomputing the whole sequence: the queries after a split, and one decode query at the end.
Test(step03, cached_attention_is_step02_attention) {
    Rng r;
    rng_seed(&r, 31);
    for (size_t s = 0; s < sizeof attn_shapes / sizeof attn_shapes[0]; s++) {
        const int T = attn_shapes[s][0], H = attn_shapes[s][1], KV = attn_shapes[s][2], hd = attn_shapes[s][3];
        const size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd, row = (size_t)H * hd;
        float *q = rng_new_uniform(&r, nq, -1.0f, 1.0f), *k = rng_new_uniform(&r, nk, -1.0f, 1.0f), *v = rng_new_uniform(&r, nk, -1.0f, 1.0f);
        float *a = malloc(nq * 4), *b = malloc(nq * 4), *last = malloc(row * 4);
        attention_cpu(q, k, v, T, H, KV, hd, a);
        // a prefill of the first T/2 positions, then the rest attending over the cache
        const int p0 = T / 2;
        for (size_t i = 0; i < nq; i++) b[i] = NAN;
        attention_at_cpu(q + p0 * row, k, v, p0, T - p0, H, KV, hd, b + p0 * row);
        ErrStats e = compare_f32(b + p0 * row, a + p0 * row, (size_t)(T - p0) * row);
        cr_expect(e.n_bad == 0 && e.max_rel < 1e-6, "T=%d H=%d KV=%d hd=%d after the split: %.3e", T, H, KV, hd,
                  e.max_rel);
        // one decode query at position T-1 over the cache = the last row of the full attention
        attention_at_cpu(q + (size_t)(T - 1) * row, k, v, T - 1, 1, H, KV, hd, last);
        e = compare_f32(last, a + (size_t)(T - 1) * H * hd, (size_t)H * hd);
        cr_expect(e.n_bad == 0 && e.max_rel < 1e-6, "T=%d H=%d KV=%d hd=%d decode row: %.3e", T, H, KV, hd, e.max_rel);
        free(q), free(k), free(v), free(a), free(b), free(last);
    }
}

// ---------------------------------------------------------------- GPU kernels vs CPU

Test(step03, gpu_gemv_matches_cpu_on_odd_shapes) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    static const int shapes[][2] = {{1, 64}, {37, 151}, {33, 1000}, {4099, 4096}, {17, 8}, {5, 2056}, {3000, 24}};
    const StDtype dts[] = {ST_F32, ST_BF16, ST_F16};
    Rng r;
    rng_seed(&r, 5);
    for (int ver = 0; ver < gemv_n_versions(); ver++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 3; di++) {
            const int rows = shapes[s][0], n = shapes[s][1];
            float *W = rng_new_uniform(&r, (size_t)rows * n, -1.0f, 1.0f), *x = rng_new_uniform(&r, (size_t)n, -1.0f, 1.0f), *b = rng_new_uniform(&r, (size_t)rows, -1.0f, 1.0f);
            float *y = malloc((size_t)rows * 4);
            double *ref = malloc((size_t)rows * 8);
            cr_assert_eq(gemv_gpu_check(ver, W, x, b, rows, n, dts[di], y), 0);
            // the reference uses W rounded as the GPU stores it (step01's rounding), in float64
            if (dts[di] != ST_F32) matmul_round_to_dtype(dts[di] == ST_BF16 ? MM_BF16 : MM_F16, W, (long)rows * n);
            for (int i = 0; i < rows; i++) {
                double acc = b[i];
                for (int j = 0; j < n; j++) acc += (double)W[(size_t)i * n + j] * x[j];
                ref[i] = acc;
            }
            ErrStats e = compare_f32_f64(y, ref, (size_t)rows);
            cr_expect(e.n_bad == 0 && e.max_rel < 1e-4, "gemv %s %s rows=%d n_in=%d: max_rel %.3e, %zu bad",
                      gemv_version_name(ver), st_dtype_name(dts[di]), rows, n, e.max_rel, e.n_bad);
            free(W), free(x), free(b), free(y), free(ref);
        }
}

Test(step03, gpu_decode_attention_matches_cpu) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    static const int shapes[][4] = {  // len, H, KV, hd
        {1, 4, 4, 16}, {5, 4, 2, 24}, {129, 2, 1, 32}, {300, 8, 2, 20}, {1000, 32, 8, 128}, {257, 14, 2, 64}};
    const StDtype dts[] = {ST_F32, ST_BF16};
    Rng r;
    rng_seed(&r, 9);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            const int len = shapes[s][0], H = shapes[s][1], KV = shapes[s][2], hd = shapes[s][3];
            const size_t nq = (size_t)H * hd, nk = (size_t)len * KV * hd;
            float *q = rng_new_uniform(&r, nq, -1.0f, 1.0f), *k = rng_new_uniform(&r, nk, -1.0f, 1.0f), *v = rng_new_uniform(&r, nk, -1.0f, 1.0f), *o = malloc(nq * 4), *ref = malloc(nq * 4);
            cr_assert_eq(decode_attention_gpu_check(q, k, v, len, H, KV, hd, dts[di], o), 0);
            attention_at_cpu(q, k, v, len - 1, 1, H, KV, hd, ref);
            ErrStats e = compare_f32(o, ref, nq);
            const double tol = dts[di] == ST_F32 ? 1e-4 : ERR_TOL_HALF * 2;
            cr_expect(e.n_bad == 0 && e.max_rel < tol, "decode attention %s len=%d H=%d KV=%d hd=%d: %.3e (tol %.0e)",
                      st_dtype_name(dts[di]), len, H, KV, hd, e.max_rel, tol);
            free(q), free(k), free(v), free(o), free(ref);
        }
}

// ---------------------------------------------------------------- greedy generation vs goldens

// Greedy generation of n tokens after prompt; ours (n) ids, ours5 (n, 5) our top-5 per step.
// mode 0: CPU cached, 1: CPU uncached, 2: GPU cached (decoder), 3: GPU uncached (step02 forward).
static void run_greedy(int mode, const CpuModel *cm, GpuModel *gm, const int *prompt, int np, int n, int *ours,
                       int *ours5) {
    const int V = mode < 2 ? cm->cfg.vocab : cm->cfg.vocab;
    float *logits = malloc((size_t)V * 4);
    int *seq = malloc((size_t)(np + n) * sizeof(int));
    memcpy(seq, prompt, (size_t)np * sizeof(int));
    CpuKvCache kv = {0};
    GpuDecoder *d = NULL;
    char err[256];
    if (mode == 0) cr_assert_eq(cpu_kv_init(&kv, &cm->cfg, np + n), 0);
    if (mode == 2) {
        d = gpu_decoder_new(gm, np + n, err, sizeof err);
        cr_assert(d, "%s", err);
    }
    for (int i = 0; i < np + n - 1; i++) {
        for (int j = 0; j < V; j++) logits[j] = NAN;
        int rc;
        const int T = i + 1;  // tokens known so far
        if (mode == 0) rc = i < np - 1 ? 0 : forward_cached_cpu(cm, &kv, seq + kv.len, T - kv.len, logits);
        else if (mode == 1) rc = i < np - 1 ? 0 : forward_last_cpu(cm, seq, T, logits);
        else if (mode == 2) rc = gpu_decoder_step(d, seq[i], i >= np - 1 ? logits : NULL);
        else rc = i < np - 1 ? 0 : forward_last_cuda(gm, seq, T, logits, NULL);
        cr_assert_eq(rc, 0, "mode %d step %d", mode, i);
        if (i < np - 1) continue;
        const int s = i - (np - 1);
        forward_topk(logits, V, 5, ours5 + 5 * s);
        ours[s] = ours5[5 * s];
        cr_assert(!isnan(logits[ours[s]]), "mode %d step %d: NaN logits", mode, s);
        seq[i + 1] = ours[s];
    }
    if (mode == 0) cpu_kv_free(&kv);
    if (d) gpu_decoder_free(d);
    free(seq);
    free(logits);
}

static void check_generation(int use_cuda) {
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "goldens/greedy.json");
    if (n == 0) cr_skip_test("no checkpoints with goldens/greedy.json under %s", MODELS_DIR);
    for (int i = 0; i < n; i++) {
        char err[512], what[400];
        ModelWeights w;
        cr_assert_eq(model_load(ck[i].dir, &w, err, sizeof err), 0, "%s", err);
        CpuModel cm;
        cr_assert_eq(cpu_model_load(&w, &cm, err, sizeof err), 0, "%s", err);
        GpuModel *gm = NULL;
        if (use_cuda) {
            gm = gpu_model_load(&w, err, sizeof err);
            cr_assert(gm, "%s", err);
        }
        Golden g;
        golden_load(ck[i].dir, &g);
        int *c_ids = malloc((size_t)g.ng * sizeof(int)), *c5 = malloc((size_t)g.ng * 5 * sizeof(int));
        int *u_ids = malloc((size_t)g.ng * sizeof(int)), *u5 = malloc((size_t)g.ng * 5 * sizeof(int));
        run_greedy(use_cuda ? 2 : 0, &cm, gm, g.prompt, g.np, g.ng, c_ids, c5);
        run_greedy(use_cuda ? 3 : 1, &cm, gm, g.prompt, g.np, g.ng, u_ids, u5);
        const char *dev = use_cuda ? "gpu" : "cpu";
        snprintf(what, sizeof what, "%s %s cached vs transformers", ck[i].name, dev);
        const int agreed = vllm_expect(what, c_ids, c5, g.gen, g.top5, g.ng);
        if (use_cuda) {
            snprintf(what, sizeof what, "%s gpu cached vs uncached", ck[i].name);
            vllm_expect(what, c_ids, c5, u_ids, u5, g.ng);
            // the device-side greedy loop (graph replays, argmax on the device) = the host loop
            GpuDecoder *d = gpu_decoder_new(gm, g.np + g.ng, err, sizeof err);
            cr_assert(d, "%s", err);
            for (int t = 0; t < g.np - 1; t++) cr_assert_eq(gpu_decoder_step(d, g.prompt[t], NULL), 0);
            int *dev_ids = malloc((size_t)g.ng * sizeof(int));
            cr_assert_eq(gpu_decoder_greedy(d, g.prompt[g.np - 1], g.ng, dev_ids, NULL), 0);
            for (int t = 0; t < g.ng; t++)
                cr_expect_eq(dev_ids[t], c_ids[t], "%s: device greedy step %d: %d vs host %d", ck[i].name, t, dev_ids[t],
                             c_ids[t]);
            free(dev_ids);
            gpu_decoder_free(d);
        } else {
            for (int t = 0; t < g.ng; t++)
                cr_expect_eq(c_ids[t], u_ids[t], "%s cpu: cached %d vs uncached %d at step %d", ck[i].name, c_ids[t],
                             u_ids[t], t);
        }
        fprintf(stderr, "[greedy-cache] %s %s: %d of %d tokens identical to transformers\n", ck[i].name, dev, agreed,
                g.ng);
        free(c_ids), free(c5), free(u_ids), free(u5);
        golden_free(&g);
        if (gm) gpu_model_free(gm);
        cpu_model_free(&cm);
        model_free(&w);
    }
}

Test(step03, cpu_cached_greedy_matches_goldens_and_uncached, .timeout = 300) { check_generation(0); }

Test(step03, gpu_cached_greedy_matches_goldens_and_uncached, .timeout = 300) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    check_generation(1);
}

// ---------------------------------------------------------------- the fused decode step (step07)

// The three decode modes (unfused, fused, fused + PDL) on one GPU model over np positions of the
// same random ids, all three with the defaults (attention v4 where it runs, else v2; the automatic
// GEMV split: 2 warps a row where rows are few, 4 chunks a lane on short rows, the row loop on many
// short rows), and three more of fused + PDL: (4) the fused step as it was before those (attention
// v1, no split, 8 chunks a lane everywhere), (5) every dense GEMV row split over 4 warps, with
// attention v2, (6) the row loop (k_gemv_rows) on every GEMV whose rows fit it. Each vs unfused within tol, PDL bit-identical, the kernel counts.
static void fused_modes_check(GpuModel *gm, const ModelConfig *c, const char *name, int f32, int dense, int np) {
    const int V = c->vocab, L = c->n_layers;
    float *lg[6];
    int kern[6], lmarg[6], *ids = malloc((size_t)np * sizeof(int));
    Rng r;
    for (int f = 0; f < 6; f++) {
        rng_seed(&r, 99);  // the same ids for every mode
        lg[f] = malloc((size_t)np * V * sizeof(float));
        gpu_decoder_set_fused(f < 3 ? f : 2);
        gpu_decoder_set_attn(f == 3 ? 1 : f == 4 ? 2 : 4);
        gpu_decoder_set_gemv_split(f == 3 ? 1 : f == 4 ? 4 : 0);
        gpu_decoder_set_gemv_rows(f == 5 ? 2 : 0);
        gpu_decoder_set_gemv_short(f != 3);
        char err[256];
        GpuDecoder *d = gpu_decoder_new(gm, np, err, sizeof err);
        cr_assert(d, "%s", err);
        kern[f] = gpu_decoder_kernels(d);
        lmarg[f] = gpu_decoder_lm_argmax(d);
        for (int p = 0; p < np; p++)
            cr_assert_eq(gpu_decoder_step(d, (int)(rng_u32(&r) % (unsigned)V), lg[f] + (size_t)p * V), 0);
        // each step's argmax on the device (k_argmax_*, or inside the lm_head) = the host's of its logits
        cr_assert_eq(gpu_decoder_argmax_ids(d, 0, np, ids), 0);
        int nbad = 0, first = -1;
        for (int p = 0; p < np; p++) {
            const float *l = lg[f] + (size_t)p * V;
            int best = 0;
            for (int v = 1; v < V; v++) best = l[v] > l[best] ? v : best;  // ties: the lowest index
            if (ids[p] != best && nbad++ == 0) first = p;
        }
        cr_expect_eq(nbad, 0, "%s mode %d: %d of %d device argmaxes differ from the host's (first at position %d)", name, f,
                     nbad, np, first);
        gpu_decoder_free(d);
    }
    gpu_decoder_set_fused(2);
    gpu_decoder_set_attn(4);
    gpu_decoder_set_gemv_split(0);
    gpu_decoder_set_gemv_rows(0);
    gpu_decoder_set_gemv_short(1);
    if (dense) {  // a quantized projection may be several GEMVs, its norm a kernel of its own
        cr_expect_eq(kern[0], 10 * L + 4, "%s: unfused step %d kernels, want 10 L + 4", name, kern[0]);
        cr_expect_eq(kern[1], 5 * L + 3 - lmarg[1], "%s: fused step %d kernels, want 5 L + %d", name, kern[1], 3 - lmarg[1]);
    }
    cr_expect_eq(lmarg[0], 0, "%s: the unfused step has its own argmax kernel", name);
    for (int f = 2; f < 6; f++)  // the argmax inside the lm_head: one kernel less, nothing else changes the count
        cr_expect_eq(kern[f] + lmarg[f], kern[1] + lmarg[1], "%s mode %d: %d kernels (argmax in the lm_head: %d), fused %d (%d)",
                     name, f, kern[f], lmarg[f], kern[1], lmarg[1]);
    const double tol = f32 ? 1e-4 : ERR_TOL_HALF * 2;
    double worst = 0, worst1 = 0, worst4 = 0, worst5 = 0;
    for (int p = 0; p < np; p++) {
        const ErrStats e = compare_f32(lg[1] + (size_t)p * V, lg[0] + (size_t)p * V, (size_t)V);
        cr_expect(e.n_bad == 0 && e.max_rel < tol, "%s position %d: fused vs unfused logits max_rel %.3e (tol %.0e)", name,
                  p, e.max_rel, tol);
        worst = e.max_rel > worst ? e.max_rel : worst;
        const ErrStats e1 = compare_f32(lg[3] + (size_t)p * V, lg[0] + (size_t)p * V, (size_t)V);
        cr_expect(e1.n_bad == 0 && e1.max_rel < tol,
                  "%s position %d: fused (attention v1, no GEMV split, 8 chunks a lane) vs unfused logits max_rel %.3e (tol %.0e)", name, p, e1.max_rel, tol);
        worst1 = e1.max_rel > worst1 ? e1.max_rel : worst1;
        const ErrStats e4 = compare_f32(lg[4] + (size_t)p * V, lg[0] + (size_t)p * V, (size_t)V);
        cr_expect(e4.n_bad == 0 && e4.max_rel < tol,
                  "%s position %d: fused (GEMV split 4) vs unfused logits max_rel %.3e (tol %.0e)", name, p, e4.max_rel, tol);
        worst4 = e4.max_rel > worst4 ? e4.max_rel : worst4;
        const ErrStats e5 = compare_f32(lg[5] + (size_t)p * V, lg[0] + (size_t)p * V, (size_t)V);
        cr_expect(e5.n_bad == 0 && e5.max_rel < tol,
                  "%s position %d: fused (row loop on every GEMV it fits) vs unfused logits max_rel %.3e (tol %.0e)", name, p, e5.max_rel, tol);
        worst5 = e5.max_rel > worst5 ? e5.max_rel : worst5;
    }
    size_t diff = 0;
    for (size_t k = 0; k < (size_t)np * V; k++) diff += memcmp(&lg[1][k], &lg[2][k], sizeof(float)) != 0;
    cr_expect_eq(diff, 0, "%s: %zu of %d logits differ between the fused step with and without PDL", name, diff, np * V);
    fprintf(stderr,
            "[fused-decode] %s: kernels %d -> %d; fused vs unfused max_rel %.2e (attention v1 + no split + 8 chunks a lane: %.2e, GEMV split 4 + attention v2: "
            "%.2e, row loop: %.2e, its argmax in the lm_head: %d) over %d positions\n",
            name, kern[0], kern[1], worst, worst1, worst4, worst5, lmarg[5], np);
    for (int f = 0; f < 6; f++) free(lg[f]);
    free(ids);
}

// Every checkpoint, 300 positions fed through a decoder of each mode (0 step03's unfused step, 1
// step07's fusions, 2 the same with programmatic dependent launch): the logits of every position.
// Past 128 positions the attention has 2 and then 3 splits, so the fused combine (the last block of
// a kv head merges) runs. Fused vs unfused: the same function up to fp32 reassociation (the RMSNorm's
// sum of squares is reduced in another order), so within the half-precision tolerance for 16-bit
// models and 1e-4 for fp32 ones. PDL vs no PDL: the same kernels, only launched to overlap, so the
// logits must be bit-identical: a kernel that read its input before the previous one finished
// would show here.
Test(step03, gpu_fused_decode_matches_unfused_and_pdl_is_exact, .timeout = 300) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    cr_assert_gt(n, 0, "no checkpoints under %s", MODELS_DIR);
    for (int i = 0; i < n; i++) {
        CkptModels m;
        ckpt_models_load(&ck[i], &m);
        fused_modes_check(m.gm, &m.w.cfg, ck[i].name, m.f32, !m.w.quantized, 300);
        ckpt_models_free(&m);
    }
}

// The checkpoints above are narrow (hidden 64): every GEMV row is shorter than one round of the
// fused GEMV's loads. Random models of wider shapes reach its other paths: rows of whole rounds
// (bf16 hidden 2048 = 256 16-byte chunks = 1 round), rows that end in a partial
// round (bf16 ff 3080: 1.5 rounds, the TAIL kernel; fp32 hidden 1032: 1 round + 2 chunks), rows not
// a multiple of 16 bytes (ff 1001: the scalar loop), head_dim 64, 128 and 256, GQA 1, 2, 3, 4 and 8
// (the bf16 ones of head_dim 64 and 128 through attention v4 by default, v2 in mode 5).
Test(step03, gpu_fused_decode_wide_rows_match_unfused, .timeout = 300) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    static const struct {
        const char *name, *json;
        StDtype dt;
    } M[] = {
        {"wide_bf16_h2048_ff3080_gqa4",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":3080,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":64,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0}",
         ST_BF16},
        // rows of 16 chunks a lane: the row loop with x in shared memory (mode 6) on qkv, o and lm_head
        {"wide_bf16_h4096_ff1024_gqa8",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":1024,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":32,\"num_key_value_heads\":4,\"head_dim\":128,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0}",
         ST_BF16},
        {"wide_f32_h1032_ff1001_mha",
         "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":1032,\"intermediate_size\":1001,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":4,\"head_dim\":128,"
         "\"vocab_size\":777,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0}",
         ST_F32},
        // the attention's shapes: Qwen3-0.6B's heads (q/k norm, GQA 2, head_dim 128), GQA 3 (a group
        // padded to 4), GQA 8 with head_dim 256 (v2's shared memory would pass 48 KB: v1 runs) and
        // an fp32 cache with GQA 8, head_dim 64
        {"qwen_bf16_h1024_gqa2_hd128",
         "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":1024,\"intermediate_size\":3072,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":128,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0}",
         ST_BF16},
        {"bf16_h768_gqa3_hd128",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":768,\"intermediate_size\":2048,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":6,\"num_key_value_heads\":2,\"head_dim\":128,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0}",
         ST_BF16},
        {"qwen_bf16_h512_gqa8_hd256",
         "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":512,\"intermediate_size\":1024,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":1,\"head_dim\":256,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0}",
         ST_BF16},
        // attention v4 (bf16, head_dim 64 / 128) with one query head a kv head
        {"bf16_h1024_mha_hd64",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":1024,\"intermediate_size\":2048,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":16,\"num_key_value_heads\":16,\"head_dim\":64,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0}",
         ST_BF16},
        {"f32_h512_gqa8_hd64",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":512,\"intermediate_size\":1024,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":1,\"head_dim\":64,"
         "\"vocab_size\":1000,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0}",
         ST_F32},
    };
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++) {
        ModelConfig c;
        char err[256];
        cr_assert_eq(hf_config_parse(M[i].json, M[i].name, &c, err, sizeof err), 0, "%s", err);
        GpuModel *gm = gpu_model_random(&c, M[i].dt, 7 + i, err, sizeof err);
        cr_assert(gm, "%s", err);
        fused_modes_check(gm, &c, M[i].name, M[i].dt == ST_F32, 1, 300);
        gpu_model_free(gm);
    }
}

// ---------------------------------------------------------------- sampling

static float *rand_logits(Rng *r, int V) {
    float *l = malloc((size_t)V * 4);
    for (int i = 0; i < V; i++) l[i] = 3.0f * rng_normal(r);
    return l;
}

// probabilities softmax(l / T) in double, and ids sorted by them (desc, ties by id)
static double *probs(const float *l, int V, float T) {
    double *p = malloc((size_t)V * 8), mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i] / T);
    for (int i = 0; i < V; i++) s += p[i] = exp(l[i] / T - mx);
    for (int i = 0; i < V; i++) p[i] /= s;
    return p;
}

Test(step03, sampling_is_reproducible_with_a_seed) {
    Rng r;
    rng_seed(&r, 77);
    const int V = 500;
    float *l = rand_logits(&r, V);
    SamplerParams p = {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .min_p = 0.0f, .seed = 1234};
    Sampler a, b, c;
    sampler_init(&a, &p, V), sampler_init(&b, &p, V);
    p.seed = 1235;
    sampler_init(&c, &p, V);
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        const int x = sampler_sample(&a, l), y = sampler_sample(&b, l), z = sampler_sample(&c, l);
        cr_assert_eq(x, y, "draw %d: same seed gave %d and %d", i, x, y);
        differ += x != z;
    }
    cr_expect(differ > 20, "another seed should give other draws (%d of 200 differ)", differ);
    sampler_free(&a), sampler_free(&b), sampler_free(&c);
    free(l);
}

Test(step03, sampling_never_leaves_the_topk_topp_minp_set) {
    Rng r;
    rng_seed(&r, 78);
    const int V = 300;
    const struct {
        float T;
        int k;
        float p, m;
    } cases[] = {{1.0f, 10, 1.0f, 0}, {0.7f, 0, 0.5f, 0}, {1.3f, 40, 0.8f, 0}, {1.0f, 0, 1.0f, 0.2f}, {2.0f, 25, 0.9f, 0.05f}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        float *l = rand_logits(&r, V);
        double *pr = probs(l, V, cases[ci].T);
        // the allowed set, computed here: rank by probability, cut at k, then the smallest
        // prefix reaching mass p (of the kept mass), then p_i >= m * p_max
        int *ord = malloc((size_t)V * sizeof(int));
        for (int i = 0; i < V; i++) ord[i] = i;
        for (int i = 1; i < V; i++)
            for (int j = i; j > 0 && (pr[ord[j]] > pr[ord[j - 1]]); j--) {
                int t = ord[j];
                ord[j] = ord[j - 1], ord[j - 1] = t;
            }
        int n = cases[ci].k ? cases[ci].k : V;
        double tot = 0, acc = 0;
        for (int i = 0; i < n; i++) tot += pr[ord[i]];
        if (cases[ci].p < 1) {
            int m = 0;
            while (m < n) {
                acc += pr[ord[m++]];
                if (acc >= cases[ci].p * tot - 1e-7) break;
            }
            n = m;
        }
        if (cases[ci].m > 0) {
            int m = 1;
            while (m < n && pr[ord[m]] >= cases[ci].m * pr[ord[0]]) m++;
            n = m;
        }
        char *allowed = calloc((size_t)V, 1);
        for (int i = 0; i < n; i++) allowed[ord[i]] = 1;
        SamplerParams sp = {.temperature = cases[ci].T, .top_k = cases[ci].k, .top_p = cases[ci].p, .min_p = cases[ci].m,
                            .seed = 9 + ci};
        Sampler s;
        sampler_init(&s, &sp, V);
        const int ns = sampler_candidates(&s, l);
        cr_expect(ns >= n - 1 && ns <= n + 1, "case %zu: sampler keeps %d candidates, expected %d", ci, ns, n);
        int *seen = calloc((size_t)V, sizeof(int));
        for (int i = 0; i < 3000; i++) {
            const int x = sampler_sample(&s, l);
            cr_assert(x >= 0 && x < V && allowed[x], "case %zu: drew %d outside the allowed set", ci, x);
            seen[x]++;
        }
        // and it is a draw, not a constant: the best token's frequency is near its renormalized mass
        double kept = 0;
        for (int i = 0; i < n; i++) kept += pr[ord[i]];
        const double want = pr[ord[0]] / kept, got = seen[ord[0]] / 3000.0;
        cr_expect(fabs(got - want) < 0.05, "case %zu: top token drawn %.3f of the time, its mass is %.3f", ci, got, want);
        sampler_free(&s);
        free(seen), free(allowed), free(ord), free(pr), free(l);
    }
}

// The straightforward sampler the partial selection must agree with: sort the whole vocabulary
// (qsort, probability descending, ties lower id first), cut top-k, top-p, min-p on the sorted
// list, renormalize, draw. Same float/double arithmetic as step03's sampler, written here.
static const float *g_ref_key;
static int ref_by_prob(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = g_ref_key[i], y = g_ref_key[j];
    if (x != y) return x > y ? -1 : 1;
    return i - j;
}
static int ref_candidates(const SamplerParams *p, const float *logits, int V, int *idx, float *prob) {
    float *pr = malloc((size_t)V * sizeof(float));
    const float inv_t = 1.0f / p->temperature;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, logits[i] * inv_t);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += pr[i] = expf(logits[i] * inv_t - mx);
    for (int i = 0; i < V; i++) pr[i] = (float)(pr[i] / sum);
    for (int i = 0; i < V; i++) idx[i] = i;
    g_ref_key = pr;
    qsort(idx, (size_t)V, sizeof(int), ref_by_prob);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (p->top_p > 0 && p->top_p < 1) {
        double kept = 0, tot = 0;
        for (int i = 0; i < n; i++) tot += pr[idx[i]];
        int m = 0;
        while (m < n) {
            kept += pr[idx[m++]];
            if (kept >= p->top_p * tot) break;
        }
        n = m;
    }
    if (p->min_p > 0) {
        const float cut = p->min_p * pr[idx[0]];
        int m = 1;
        while (m < n && pr[idx[m]] >= cut) m++;
        n = m;
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += pr[idx[i]];
    for (int i = 0; i < n; i++) prob[i] = (float)(pr[idx[i]] / tot);
    free(pr);
    return n;
}
static int ref_draw(const int *idx, const float *prob, int n, Rng *r) {
    if (n == 1) return idx[0];
    const double u = rng_uniform(r);
    double c = 0;
    for (int i = 0; i < n; i++) {
        c += prob[i];
        if (u < c) return idx[i];
    }
    return idx[n - 1];
}

Test(step03, partial_selection_samples_what_a_full_sort_samples) {
    Rng r;
    rng_seed(&r, 80);
    const int Vs[] = {1, 2, 17, 300, 4096, 50000};
    const float Ts[] = {0.6f, 1.0f, 1.7f};
    const int Ks[] = {0, 1, 7, 50, 1000};
    const float Ps[] = {1.0f, 0.3f, 0.9f, 0.999f};
    const float Ms[] = {0.0f, 0.02f, 0.3f};
    int cases = 0, draws = 0, sizes_differ = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int V = Vs[vi];
        float *l = malloc((size_t)V * sizeof(float));
        int *ridx = malloc((size_t)V * sizeof(int));
        float *rprob = malloc((size_t)V * sizeof(float));
        for (int shape = 0; shape < 3; shape++) {
            // peaked (std 4), flat (std 0.3), and many exact ties (logits on a coarse grid)
            for (int i = 0; i < V; i++) {
                const float z = rng_normal(&r);
                l[i] = shape == 0 ? 4.0f * z : shape == 1 ? 0.3f * z : floorf(2.0f * z);
            }
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t ki = 0; ki < 5; ki++)
                    for (size_t pi = 0; pi < 4; pi++)
                        for (size_t mi = 0; mi < 3; mi++) {
                            if (V > 1000 && (ti != 1 || (ki + pi + mi) % 3)) continue;  // keep the big vocabularies quick
                            SamplerParams sp = {.temperature = Ts[ti], .top_k = Ks[ki], .top_p = Ps[pi], .min_p = Ms[mi],
                                                .seed = 1000u + (unsigned)cases};
                            Sampler s;
                            sampler_init(&s, &sp, V);
                            const int n = sampler_candidates(&s, l);
                            const int rn = ref_candidates(&sp, l, V, ridx, rprob);
                            sizes_differ += n != rn;
                            cr_assert_eq(n, rn, "V=%d shape %d T=%g k=%d p=%g m=%g: %d candidates, the full sort %d", V,
                                         shape, sp.temperature, sp.top_k, sp.top_p, sp.min_p, n, rn);
                            for (int i = 0; i < n; i++) {
                                cr_assert_eq(s.idx[i], ridx[i], "V=%d T=%g k=%d p=%g m=%g: candidate %d is id %d, full sort %d",
                                             V, sp.temperature, sp.top_k, sp.top_p, sp.min_p, i, s.idx[i], ridx[i]);
                                cr_assert(s.prob[i] == rprob[i], "candidate %d: probability %.9g vs %.9g", i, s.prob[i], rprob[i]);
                            }
                            Rng rr;
                            rng_seed(&rr, sp.seed);
                            for (int d = 0; d < 4; d++, draws++) {
                                const int want = ref_draw(ridx, rprob, rn, &rr), got = sampler_sample(&s, l);
                                cr_assert_eq(got, want, "V=%d T=%g k=%d p=%g m=%g draw %d: %d, the full sort draws %d", V,
                                             sp.temperature, sp.top_k, sp.top_p, sp.min_p, d, got, want);
                            }
                            sampler_free(&s);
                            cases++;
                        }
        }
        free(l), free(ridx), free(rprob);
    }
    cr_expect(cases > 500 && draws == 4 * cases && sizes_differ == 0, "%d cases, %d draws", cases, draws);
}

Test(step03, greedy_and_zero_temperature_give_the_argmax) {
    Rng r;
    rng_seed(&r, 79);
    const int V = 1000;
    for (int it = 0; it < 20; it++) {
        float *l = rand_logits(&r, V);
        SamplerParams g = {.greedy = 1, .seed = 1}, z = {.temperature = 0.0f, .top_p = 1.0f, .seed = 2};
        Sampler a, b;
        sampler_init(&a, &g, V), sampler_init(&b, &z, V);
        const int want = argmax_f32(l, V);
        cr_expect_eq(sampler_sample(&a, l), want);
        cr_expect_eq(sampler_sample(&b, l), want);
        sampler_free(&a), sampler_free(&b);
        free(l);
    }
}

Test(step03, seeded_generation_is_reproducible) {
    char err[256];
    ModelWeights w;
    cr_assert_eq(model_load(MODELS_DIR "/qwen3_qknorm_f32", &w, err, sizeof err), 0, "%s", err);
    CpuModel cm;
    cr_assert_eq(cpu_model_load(&w, &cm, err, sizeof err), 0, "%s", err);
    const int prompt[] = {3, 14, 15, 92}, n = 24, V = w.cfg.vocab;
    int out[2][24];
    float *logits = malloc((size_t)V * 4);
    for (int run = 0; run < 2; run++) {
        SamplerParams sp = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.01f, .seed = 42};
        Sampler s;
        sampler_init(&s, &sp, V);
        CpuKvCache kv;
        cr_assert_eq(cpu_kv_init(&kv, &w.cfg, 4 + n), 0);
        cr_assert_eq(forward_cached_cpu(&cm, &kv, prompt, 4, logits), 0);
        for (int i = 0; i < n; i++) {
            out[run][i] = sampler_sample(&s, logits);
            if (i < n - 1) cr_assert_eq(forward_cached_cpu(&cm, &kv, &out[run][i], 1, logits), 0);
        }
        cpu_kv_free(&kv);
        sampler_free(&s);
    }
    for (int i = 0; i < n; i++) cr_expect_eq(out[0][i], out[1][i], "token %d: %d vs %d", i, out[0][i], out[1][i]);
    free(logits);
    cpu_model_free(&cm);
    model_free(&w);
}

// ---------------------------------------------------------------- generate: EOS and --json

// Runs build/bin/generate and parses its --json object (NULL if it failed).
static json_t *run_generate(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/generate %s --device cpu --json 2>/dev/null", BUILD_BIN_DIR, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, p);
    (void)n;
    const int rc = pclose(p);
    json_error_t je;
    json_t *j = rc == 0 ? json_loads(buf, 0, &je) : NULL;
    free(buf);
    return j;
}

// A copy of llama_mha_f32 whose generation_config.json names a greedy golden token as EOS:
// generate must stop right after producing it (the EOS token is the last id), and --ignore-eos
// must run to --max-new-tokens.
Test(step03, generate_stops_at_generation_config_eos) {
    const char *src = MODELS_DIR "/llama_mha_f32";
    char dir[] = "/tmp/step03_eos_XXXXXX", cmd[1024], path[600];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/model.safetensors %s/", src, src, dir);
    cr_assert_eq(system(cmd), 0);
    Golden g;
    golden_load(src, &g);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    int k = 4;  // the first golden token from index 4 on that does not occur before it
    for (;; k++) {
        cr_assert(k < g.ng, "no suitable token");
        int seen = 0;
        for (int i = 0; i < k; i++) seen |= g.gen[i] == g.gen[k];
        if (!seen) break;
    }
    int other = 0;  // a second EOS id (the list form) that the greedy run does not produce before k
    for (;; other++) {
        int seen = 0;
        for (int i = 0; i <= k; i++) seen |= g.gen[i] == other;
        if (!seen) break;
    }
    fprintf(f, "{\"eos_token_id\": [%d, %d]}\n", g.gen[k], other);
    fclose(f);
    char ids[256] = "", args[1024];
    for (int i = 0; i < g.np; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", g.prompt[i]);
    for (int ignore = 0; ignore < 2; ignore++) {
        snprintf(args, sizeof args, "--model %s --ids %s --max-new-tokens 32%s", dir, ids, ignore ? " --ignore-eos" : "");
        json_t *j = run_generate(args);
        cr_assert(j, "generate %s failed", args);
        const json_t *out = json_object_get(j, "ids");
        const int n = (int)json_array_size(out), want = ignore ? 32 : k + 1;
        cr_expect_eq(n, want, "%s: %d ids, expected %d", ignore ? "--ignore-eos" : "eos", n, want);
        for (int i = 0; i < n && i < g.ng; i++)
            cr_expect_eq((int)json_integer_value(json_array_get(out, i)), g.gen[i], "id %d", i);
        cr_expect_str_eq(json_string_value(json_object_get(j, "finish_reason")), ignore ? "length" : "eos");
        json_decref(j);
    }
    golden_free(&g);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
