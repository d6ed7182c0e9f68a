// test_step04_gpu.c — the CUDA runner of step04 (runner_gpu.cu): one flat batch per step.
//
// Attention: the batched attention (split decode kernel for short chunks, GEMM-softmax-GEMM for
// long ones, and each forced for every sequence) against step02's attention_at_cpu over each
// sequence's slot rows, on odd shapes (head_dim 64, 128, 80, 36; GQA ratios 1, 3, 4, 7, 8; chunks of
// 1, 3, 17, 130 rows; contexts that are no multiple of any tile; a padding sequence), fresh
// random inputs, poisoned outputs, and cache rows outside every context poisoned with NaN (so a
// read past a context shows).
// Runner: a mixed batch (prefill chunks, partial chunks that sample nothing, decodes, padding)
// against step03's CPU cached forward run per sequence, on every checkpoint under
// tests/data/models/, with each attention path; the K/V rows written through slot_mapping equal
// the CPU cache's and every row no token mapped to is still NaN; the device argmax equals the
// argmax of the logits it copies back.
// Goldens: the greedy continuation of every checkpoint's prompt through the batched path (the
// prompt in two chunks, then one decode per step) equals transformers' by vLLM's rule.
// Invariance: each request's greedy tokens alone vs with random batch mates (a token budget of
// 7 and 64 per step, staggered arrivals), by vLLM's rule, the first divergence reported.
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
#include "step01_matmul/matmul_gpu.h"  // matmul_round_to_dtype
#include "step03_kvcache/kvcache.h"
#include "step04_batching/runner_gpu.h"

#define TOL_F32 1e-3   // max|diff| / max|logit|, GPU fp32 vs CPU fp32 (as step02)
#define TOL_BF16 4e-2  // GPU bf16 vs CPU fp32 (as step02)

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

// ---------------------------------------------------------------- batched attention vs CPU

typedef struct {
    int H, KV, hd;
} Shape;

Test(step04_gpu, batched_attention_matches_cpu_on_odd_shapes, .timeout = 300) {
    NEED_GPU();
    const Shape shapes[] = {{4, 4, 64}, {32, 8, 128}, {6, 2, 80}, {14, 2, 64}, {16, 2, 128}, {3, 1, 36}};
    // per sequence: new rows n, context L (0 = padding sequence)
    const int seq_n[] = {1, 1, 3, 17, 130, 130, 2, 3, 1};
    const int seq_L[] = {1, 300, 132, 145, 207, 130, 0, 3, 129};
    const int S = sizeof seq_n / sizeof seq_n[0], MAXL = 320;
    const StDtype dts[] = {ST_F32, ST_BF16};
    const int paths[] = {16, 0, 1000};  // default threshold, GEMM path for all, decode kernel for all
    Rng r;
    rng_seed(&r, 404);
    int cu[16], base[16];
    cu[0] = 0;
    for (int i = 0; i < S; i++) cu[i + 1] = cu[i] + seq_n[i], base[i] = (S - 1 - i) * MAXL;  // slots in reverse order
    const int T = cu[S], rows = S * MAXL;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            const int H = shapes[s].H, KV = shapes[s].KV, hd = shapes[s].hd, qd = H * hd, kd = KV * hd;
            float *q = rng_new_uniform(&r, (size_t)T * qd, -1.0f, 1.0f);
            float *kc = malloc((size_t)rows * kd * 4), *vc = malloc((size_t)rows * kd * 4);
            for (size_t i = 0; i < (size_t)rows * kd; i++) kc[i] = vc[i] = NAN;  // rows outside every context
            for (int i = 0; i < S; i++) {
                rng_fill_uniform(&r, kc + (size_t)base[i] * kd, (size_t)seq_L[i] * kd, -1.0f, 1.0f);
                rng_fill_uniform(&r, vc + (size_t)base[i] * kd, (size_t)seq_L[i] * kd, -1.0f, 1.0f);
            }
            // the reference sees the inputs as the device stores them
            float *qr = malloc((size_t)T * qd * 4), *kr = malloc((size_t)rows * kd * 4), *vr = malloc((size_t)rows * kd * 4);
            memcpy(qr, q, (size_t)T * qd * 4), memcpy(kr, kc, (size_t)rows * kd * 4), memcpy(vr, vc, (size_t)rows * kd * 4);
            if (dts[di] == ST_BF16) {
                matmul_round_to_dtype(MM_BF16, qr, (long)T * qd);
                matmul_round_to_dtype(MM_BF16, kr, (long)rows * kd);
                matmul_round_to_dtype(MM_BF16, vr, (long)rows * kd);
            }
            float *ref = malloc((size_t)T * qd * 4), *out = malloc((size_t)T * qd * 4);
            for (int i = 0; i < S; i++) {
                if (seq_L[i] == 0) {
                    memset(ref + (size_t)cu[i] * qd, 0, (size_t)seq_n[i] * qd * 4);
                    continue;
                }
                attention_at_cpu(qr + (size_t)cu[i] * qd, kr + (size_t)base[i] * kd, vr + (size_t)base[i] * kd,
                                 seq_L[i] - seq_n[i], seq_n[i], H, KV, hd, ref + (size_t)cu[i] * qd);
            }
            for (int pi = 0; pi < 3; pi++) {
                for (size_t i = 0; i < (size_t)T * qd; i++) out[i] = NAN;
                cr_assert_eq(batch_attention_gpu_check(q, kc, vc, rows, S, cu, seq_L, base, H, KV, hd, dts[di], paths[pi], out), 0);
                const double tol = dts[di] == ST_F32 ? 1e-4 : 2 * ERR_TOL_HALF;
                for (int i = 0; i < S; i++) {
                    ErrStats e = compare_f32(out + (size_t)cu[i] * qd, ref + (size_t)cu[i] * qd, (size_t)seq_n[i] * qd);
                    if (seq_L[i] == 0) {
                        int zeros = 1;
                        for (size_t j = 0; j < (size_t)seq_n[i] * qd; j++) zeros &= out[(size_t)cu[i] * qd + j] == 0.0f;
                        cr_expect(zeros, "padding sequence %d: output not zeroed (H=%d KV=%d hd=%d path %d)", i, H, KV, hd, paths[pi]);
                        continue;
                    }
                    cr_expect(e.n_bad == 0 && e.max_rel < tol,
                              "%s H=%d KV=%d hd=%d small_chunk=%d: sequence %d (%d rows over %d keys): max_rel %.3e, "
                              "%zu non-finite (tol %.0e)",
                              st_dtype_name(dts[di]), H, KV, hd, paths[pi], i, seq_n[i], seq_L[i], e.max_rel, e.n_bad, tol);
                }
            }
            free(q), free(kc), free(vc), free(qr), free(kr), free(vr), free(ref), free(out);
        }
}

// ---------------------------------------------------------------- a flat batch, built here

#define TB_TOK 512
#define TB_SEQ 32
typedef struct {
    int tok[TB_TOK], pos[TB_TOK], slot[TB_TOK], cu[TB_SEQ + 1], lens[TB_SEQ], sslot[TB_SEQ], lrows[TB_SEQ];
    int owner[TB_SEQ];  // which caller-side sequence each logit row belongs to
    Batch b;
} TBatch;

static void tb_init(TBatch *t) {
    memset(&t->b, 0, sizeof t->b);
    t->cu[0] = 0;
    t->b.token_ids = t->tok, t->b.positions = t->pos, t->b.slot_mapping = t->slot, t->b.cu_seqlens_q = t->cu;
    t->b.seq_lens_k = t->lens, t->b.seq_slot = t->sslot, t->b.logit_rows = t->lrows;
    t->b.cap_seqs = TB_SEQ, t->b.cap_tokens = TB_TOK;
}
// n new tokens ids[0..n) of the sequence in `slot` at positions pos0 ..; a logit row when want.
static void tb_add(TBatch *t, int owner, int slot, int pos0, int n, const int *ids, int want, int max_len) {
    Batch *b = &t->b;
    cr_assert(b->n_seqs < TB_SEQ && b->n_tokens + n <= TB_TOK);
    for (int j = 0; j < n; j++) {
        const int r = b->n_tokens + j;
        t->tok[r] = ids[j], t->pos[r] = pos0 + j, t->slot[r] = slot * max_len + pos0 + j;
    }
    b->n_tokens += n;
    t->lens[b->n_seqs] = pos0 + n, t->sslot[b->n_seqs] = slot;
    t->cu[++b->n_seqs] = b->n_tokens;
    if (want) t->owner[b->n_logits] = owner, t->lrows[b->n_logits++] = b->n_tokens - 1;
}
// a padding sequence of n rows: no keys, no K/V written
static void tb_pad(TBatch *t, int n) {
    Batch *b = &t->b;
    for (int j = 0; j < n; j++) {
        const int r = b->n_tokens + j;
        t->tok[r] = 0, t->pos[r] = 0, t->slot[r] = -1;
    }
    b->n_tokens += n;
    t->lens[b->n_seqs] = 0, t->sslot[b->n_seqs] = 0;
    t->cu[++b->n_seqs] = b->n_tokens;
}

// ---------------------------------------------------------------- checkpoints


// ---------------------------------------------------------------- a mixed batch vs the CPU

#define MX_SEQ 4
#define MX_LEN 64
// Five steps of four sequences (prompts 40, 9, 20, 1 tokens), run on the GPU runner and, per
// sequence, on step03's CPU cached forward; logits of every logit row compared. check_kv: after
// the steps, every written K/V row against the CPU cache, and every other row still NaN.
static void mixed_batch(const Ckpt *ck, int small_chunk, int check_kv) {
    CkptModels L;
    ckpt_models_load(ck, &L);
    const ModelConfig *c = &L.cm.cfg;
    const int V = c->vocab, kd = c->n_kv_heads * c->head_dim, n_slots = MX_SEQ + 1;  // slot MX_SEQ stays unused
    char err[512];
    GpuRunner *g = gpu_runner_new(L.gm, n_slots, MX_LEN, 128, err, sizeof err);
    cr_assert(g, "%s", err);
    gpu_runner_set_small_chunk(g, small_chunk);
    Rng r;
    rng_seed(&r, 77 + small_chunk);
    const int plen[MX_SEQ] = {40, 9, 20, 1};
    const int slot_of[MX_SEQ] = {2, 0, 3, 1};
    int toks[MX_SEQ][MX_LEN], ntok[MX_SEQ], ncomp[MX_SEQ] = {0};
    CpuKvCache kv[MX_SEQ];
    for (int s = 0; s < MX_SEQ; s++) {
        ntok[s] = plen[s];
        for (int j = 0; j < plen[s]; j++) toks[s][j] = (int)(rng_u32(&r) % (unsigned)V);
        cr_assert_eq(cpu_kv_init(&kv[s], c, MX_LEN), 0);
    }
    // rows scheduled per step for each sequence (0 = not in this step)
    const int sched[5][MX_SEQ] = {{23, 9, 3, 1}, {17, 1, 17, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}};
    float *logits = malloc((size_t)MX_SEQ * V * 4), *ref = malloc((size_t)V * 4);
    int argmax[MX_SEQ];
    double worst = 0;
    for (int step = 0; step < 5; step++) {
        TBatch t;
        tb_init(&t);
        for (int s = 0; s < MX_SEQ; s++) {
            if (s == 2 && step != 1) tb_pad(&t, 2);  // padding between sequences
            const int n = sched[step][s];
            cr_assert(ncomp[s] + n <= ntok[s], "test schedule");
            tb_add(&t, s, slot_of[s], ncomp[s], n, toks[s] + ncomp[s], ncomp[s] + n == ntok[s], MX_LEN);
        }
        for (size_t i = 0; i < (size_t)MX_SEQ * V; i++) logits[i] = NAN;
        cr_assert_eq(gpu_runner_forward(g, &t.b, logits, argmax), 0, "%s step %d", ck->name, step);
        int li = 0;
        for (int s = 0; s < MX_SEQ; s++) {
            const int n = sched[step][s];
            cr_assert_eq(forward_cached_cpu(&L.cm, &kv[s], toks[s] + ncomp[s], n, ref), 0);
            ncomp[s] += n;
            if (ncomp[s] < ntok[s]) continue;  // a partial chunk samples nothing
            cr_assert(li < t.b.n_logits && t.owner[li] == s);
            const float *lg = logits + (size_t)li * V;
            const double e = compare_f32(lg, ref, V).max_rel;
            worst = e > worst ? e : worst;
            cr_expect(e <= (L.f32 ? TOL_F32 : TOL_BF16), "%s small_chunk=%d step %d sequence %d (%d rows, context %d): "
                      "max|diff|/max|logit| %.3e", ck->name, small_chunk, step, s, n, ncomp[s], e);
            cr_expect_eq(argmax[li], argmax_f32(lg, V), "%s step %d sequence %d: device argmax %d, host %d", ck->name,
                         step, s, argmax[li], argmax_f32(lg, V));
            toks[s][ntok[s]++] = argmax_f32(ref, V);  // both sides continue with the CPU's token
            li++;
        }
        cr_expect_eq(li, t.b.n_logits);
    }
    if (check_kv) {
        float *k = malloc((size_t)kd * 4), *v = malloc((size_t)kd * 4);
        int written = 0, poisoned = 0;
        for (int l = 0; l < c->n_layers; l++)
            for (int slot = 0; slot < n_slots; slot++)
                for (int p = 0; p < MX_LEN; p++) {
                    int s = -1;
                    for (int i = 0; i < MX_SEQ; i++)
                        if (slot_of[i] == slot) s = i;
                    cr_assert_eq(gpu_runner_read_kv(g, l, slot * MX_LEN + p, k, v), 0);
                    if (s >= 0 && p < ncomp[s]) {
                        const float *kr = kv[s].k + ((size_t)l * MX_LEN + p) * kd, *vr = kv[s].v + ((size_t)l * MX_LEN + p) * kd;
                        const double ek = compare_f32(k, kr, kd).max_rel, ev = compare_f32(v, vr, kd).max_rel;
                        const double tol = L.f32 ? 1e-4 : 3e-2;
                        cr_expect(ek <= tol && ev <= tol, "%s layer %d slot %d position %d: K %.3e V %.3e vs the CPU cache",
                                  ck->name, l, slot, p, ek, ev);
                        written++;
                    } else {
                        int nan = 1;
                        for (int i = 0; i < kd; i++) nan &= isnan(k[i]) && isnan(v[i]);
                        cr_expect(nan, "%s layer %d slot %d position %d: written, but no token maps there", ck->name, l,
                                  slot, p);
                        poisoned++;
                    }
                }
        fprintf(stderr, "[kv-slots] %s: %d K/V rows match the CPU cache, %d unmapped rows untouched\n", ck->name,
                written, poisoned);
        free(k), free(v);
    }
    fprintf(stderr, "[mixed-batch] %s small_chunk=%d: worst logits max|diff|/max|logit| %.3e over 5 steps, %d launches "
            "in the last step\n", ck->name, small_chunk, worst, gpu_runner_launches(g));
    for (int s = 0; s < MX_SEQ; s++) cpu_kv_free(&kv[s]);
    free(logits), free(ref);
    gpu_runner_free(g);
    ckpt_models_free(&L);
}

Test(step04_gpu, mixed_batch_matches_cpu_reference, .timeout = 300) {
    NEED_GPU();
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    if (n == 0) cr_skip_test("no checkpoints under %s", MODELS_DIR);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < 3; p++) mixed_batch(&ck[i], p == 0 ? 16 : p == 1 ? 0 : 1000, 0);
}

Test(step04_gpu, kv_rows_written_through_slot_mapping, .timeout = 300) {
    NEED_GPU();
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    int done = 0;
    for (int i = 0; i < n; i++)
        if (strstr(ck[i].name, "gqa") || strstr(ck[i].name, "qwen3")) mixed_batch(&ck[i], 16, 1), done++;
    if (!done) cr_skip_test("no gqa / qwen3 checkpoint under %s", MODELS_DIR);
}

// ---------------------------------------------------------------- goldens through the batched path

static void goldens_batched(const Ckpt *ck, const Golden *G, CkptModels *L, void *arg) {
    (void)arg;
    char err[512];
    const int np = G->np, ng = G->ng;
    const int *gold = G->gen, *gold5 = G->top5;
    int *seq = malloc((size_t)(np + ng) * sizeof(int)), *ours = malloc((size_t)ng * sizeof(int));
    int *ours5 = malloc((size_t)ng * 5 * sizeof(int));
    memcpy(seq, G->prompt, (size_t)np * sizeof(int));
    const int V = L->cm.cfg.vocab, max_len = np + ng + 1;
    GpuRunner *g = gpu_runner_new(L->gm, 2, max_len, 64, err, sizeof err);
    cr_assert(g, "%s", err);
    float *logits = malloc((size_t)V * 4);
    int am;
    // the prompt in two chunks (the first samples nothing), in slot 1; then one decode per step
    const int c1 = np / 2;
    int ncomp = 0;
    for (int s = 0; s < ng; s++) {
        TBatch t;
        tb_init(&t);
        if (s == 0) {
            if (c1 > 0) {
                tb_add(&t, 0, 1, 0, c1, seq, 0, max_len);
                cr_assert_eq(gpu_runner_forward(g, &t.b, NULL, NULL), 0);
                tb_init(&t);
            }
            tb_add(&t, 0, 1, c1, np - c1, seq + c1, 1, max_len);
            ncomp = np;
        } else {
            tb_add(&t, 0, 1, ncomp, 1, seq + ncomp, 1, max_len);
            ncomp++;
        }
        for (int v = 0; v < V; v++) logits[v] = NAN;
        cr_assert_eq(gpu_runner_forward(g, &t.b, logits, &am), 0);
        forward_topk(logits, V, 5, ours5 + 5 * s);
        ours[s] = am;
        cr_expect_eq(am, ours5[5 * s], "%s step %d: device argmax %d, host %d", ck->name, s, am, ours5[5 * s]);
        seq[np + s] = am;
    }
    char what[400];
    snprintf(what, sizeof what, "%s: batched GPU vs transformers", ck->name);
    const int first = vllm_expect(what, ours, ours5, gold, gold5, ng);
    fprintf(stderr, "[golden-batched] %s gpu: %d of %d tokens identical to transformers\n", ck->name, first, ng);
    free(logits), free(seq), free(ours), free(ours5);
    gpu_runner_free(g);
}
Test(step04_gpu, goldens_match_through_the_batched_path, .timeout = 300) {
    NEED_GPU();
    if (!each_golden_ckpt(goldens_batched, NULL)) cr_skip_test("no checkpoints with goldens/greedy.json under %s", MODELS_DIR);
}

// ---------------------------------------------------------------- output invariance

#define IV_REQ 8
#define IV_GEN 12
#define IV_LEN 64
typedef struct {
    int toks[IV_LEN], np, ntok, ncomp, ngen;
    int out[IV_GEN], out5[IV_GEN * 5];
} IvReq;

// Run the requests to IV_GEN greedy tokens each: budget = tokens per step (every request in
// order gets min(what it needs, what is left)); request i arrives at step i * stagger.
// solo >= 0: only that request, alone.
static void iv_run(GpuRunner *g, int V, IvReq *rq, int budget, int stagger, int solo) {
    float *logits = malloc((size_t)IV_REQ * V * 4);
    int argmax[IV_REQ];
    for (int i = 0; i < IV_REQ; i++)
        if (solo < 0 || i == solo) rq[i].ntok = rq[i].np, rq[i].ncomp = 0, rq[i].ngen = 0;
    for (int step = 0; step < 10000; step++) {
        TBatch t;
        tb_init(&t);
        int left = budget, active = 0;
        for (int i = 0; i < IV_REQ; i++) {
            IvReq *q = &rq[i];
            if ((solo >= 0 && i != solo) || q->ngen == IV_GEN) continue;
            active = 1;
            if ((solo < 0 && step < i * stagger) || left == 0) continue;
            const int need = q->ntok - q->ncomp, n = need < left ? need : left;
            tb_add(&t, i, i, q->ncomp, n, q->toks + q->ncomp, q->ncomp + n == q->ntok, IV_LEN);
            q->ncomp += n;
            left -= n;
        }
        if (!active) break;
        if (t.b.n_tokens == 0) continue;
        cr_assert_eq(gpu_runner_forward(g, &t.b, logits, argmax), 0);
        for (int k = 0; k < t.b.n_logits; k++) {
            IvReq *q = &rq[t.owner[k]];
            forward_topk(logits + (size_t)k * V, V, 5, q->out5 + 5 * q->ngen);
            q->out[q->ngen++] = argmax[k];
            q->toks[q->ntok++] = argmax[k];
        }
    }
    free(logits);
}

Test(step04_gpu, greedy_tokens_do_not_depend_on_batch_mates, .timeout = 300) {
    NEED_GPU();
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    int tested = 0;
    for (int ci = 0; ci < n; ci++) {
        if (!strstr(ck[ci].name, "bf16") || strstr(ck[ci].name, "v4cfg")) continue;
        CkptModels L;
        ckpt_models_load(&ck[ci], &L);
        const int V = L.cm.cfg.vocab;
        char err[512];
        GpuRunner *g = gpu_runner_new(L.gm, IV_REQ, IV_LEN, 128, err, sizeof err);
        cr_assert(g, "%s", err);
        Rng r;
        rng_seed(&r, 900 + ci);
        IvReq alone[IV_REQ], mixed[IV_REQ];
        for (int i = 0; i < IV_REQ; i++) {
            alone[i].np = 1 + (int)(rng_u32(&r) % 40);
            for (int j = 0; j < alone[i].np; j++) alone[i].toks[j] = (int)(rng_u32(&r) % (unsigned)V);
        }
        for (int i = 0; i < IV_REQ; i++) iv_run(g, V, alone, 1 << 20, 0, i);
        const int budgets[] = {7, 64};
        for (int bi = 0; bi < 2; bi++) {
            memcpy(mixed, alone, sizeof mixed);
            iv_run(g, V, mixed, budgets[bi], 2, -1);
            int identical = 0;
            for (int i = 0; i < IV_REQ; i++) {
                int ok;
                const int first = vllm_first_diff(mixed[i].out, mixed[i].out5, alone[i].out, alone[i].out5, IV_GEN, &ok);
                identical += first == IV_GEN;
                if (first < IV_GEN)
                    fprintf(stderr, "[invariance] %s budget %d: request %d first differs at token %d (%d batched vs %d "
                            "alone)%s\n", ck[ci].name, budgets[bi], i, first, mixed[i].out[first], alone[i].out[first],
                            ok ? ", each in the other's top-5" : "");
                cr_expect(ok, "%s budget %d: request %d, token %d: %d batched vs %d alone, not in each other's top-5",
                          ck[ci].name, budgets[bi], i, first, mixed[i].out[first], alone[i].out[first]);
            }
            fprintf(stderr, "[invariance] %s budget %d: %d of %d requests identical alone and batched\n", ck[ci].name,
                    budgets[bi], identical, IV_REQ);
        }
        gpu_runner_free(g);
        ckpt_models_free(&L);
        tested++;
    }
    if (!tested) cr_skip_test("no bf16 checkpoints under %s", MODELS_DIR);
}
