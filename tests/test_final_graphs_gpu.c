// test_final_graphs_gpu.c — the engine's two GPU paths of a decode step against their references:
//   - the device sampler (k_pick_rows, Gumbel-max) against sample_gumbel, the C reference, on
//     the same logits, and its argmax against argmax_f32 (ties and NaN included);
//   - decode steps replayed from CUDA graphs (padded to a batch-size bucket) against the same
//     steps launched eagerly, by vLLM's top-5 rule per sequence, while the batch shrinks through
//     several buckets and both paged decode kernels (v1, and v2 for a context past 1024);
//   - in graph steps, the sampled tokens equal the C reference's draw on that step's logits (the
//     padded upload gives every row its own temperature and key).
//   - steps launched ahead (gpu_runner_launch: the next step queued before this one's tokens are
//     back, its input tokens taken from the previous launch on the device) give exactly the tokens
//     of the same steps run one by one.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_util.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step04_batching/batch.h"
#include "step04_batching/gumbel.h"
#include "step04_batching/runner_gpu.h"

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

static double gumbel_score(const float *l, int i, float t, uint64_t key) {
    return (double)(l[i] / t) - log(-log((double)gumbel_uniform(key, i)));
}

Test(final_graphs_gpu, device_sampler_matches_the_c_reference, .timeout = 120) {
    NEED_GPU();
    const int vocabs[2] = {1000, 151937};  // small, and Qwen's size + 1 (not a multiple of the block)
    const float temps[6] = {0, 0.25f, 0.6f, 1.0f, 1.7f, 4.0f};
    for (int vi = 0; vi < 2; vi++) {
        const int V = vocabs[vi], R = 37;
        Rng g;
        rng_seed(&g, 1234 + vi);
        float *lg = malloc((size_t)R * V * 4), t[37];
        uint64_t keys[37];
        int dev[37];
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < V; i++) lg[(size_t)r * V + i] = 6.0f * rng_uniform(&g) - 3.0f;
            t[r] = temps[r % 6];
            keys[r] = sample_key(42, r, 1000 + r);
        }
        cr_assert_eq(gumbel_sample_gpu_check(lg, R, V, t, keys, dev), 0);
        int exact = 0;
        for (int r = 0; r < R; r++) {
            const float *row = lg + (size_t)r * V;
            const int want = t[r] > 0 ? sample_gumbel(row, V, t[r], keys[r]) : argmax_f32(row, V);
            if (dev[r] == want) {
                exact++;
                continue;
            }
            cr_assert(dev[r] >= 0 && dev[r] < V, "row %d: token %d outside the vocabulary", r, dev[r]);
            // only a near-tie may differ (logf's last bit on the two sides)
            const double a = t[r] > 0 ? gumbel_score(row, dev[r], t[r], keys[r]) : row[dev[r]];
            const double b = t[r] > 0 ? gumbel_score(row, want, t[r], keys[r]) : row[want];
            cr_expect(fabs(a - b) <= 1e-5 * (1 + fabs(b)), "V=%d row %d (T=%g): device %d (score %.7f), C %d (score %.7f)", V,
                      r, t[r], dev[r], a, want, b);
        }
        cr_expect_geq(exact, R - 1, "V=%d: %d of %d rows drew the C reference's token", V, exact, R);
        free(lg);
    }
}

// The greedy steps' argmax: the first index of the maximum of every row, as argmax_f32, whatever
// slice of the row holds it (rows 1 .. 70 split into 1 .. 16 slices), with the maximum planted
// twice (the first one must win), in the first and the last column (past the last multiple of 4
// when V % 4 != 0), near a slice's edge beside a NaN (skipped, as argmax_f32 skips one that is not
// in column 0), and in a row of NaN only (both give 0).
Test(final_graphs_gpu, device_argmax_matches_the_c_reference, .timeout = 120) {
    NEED_GPU();
    const int vocabs[3] = {1000, 128256, 151937};
    const int nrows[3] = {1, 16, 70};
    for (int vi = 0; vi < 3; vi++)
        for (int ri = 0; ri < 3; ri++) {
            const int V = vocabs[vi], R = nrows[ri];
            Rng g;
            rng_seed(&g, 99 + 7 * vi + ri);
            float *lg = malloc((size_t)R * V * 4);
            int *dev = malloc((size_t)R * 4);
            for (int r = 0; r < R; r++) {
                float *row = lg + (size_t)r * V;
                for (int i = 0; i < V; i++) row[i] = 6.0f * rng_uniform(&g) - 3.0f;
                const int a = (int)(rng_uniform(&g) * V) % V, b = (int)(rng_uniform(&g) * V) % V;
                switch (r % 5) {
                case 0: row[a] = row[b] = 9.0f; break;                 // a tie: the lower index
                case 1: row[V - 1] = 9.0f; break;                      // the last column (past V & ~3 when V % 4)
                case 2: row[(V / 2 + 3) & ~3] = 9.0f, row[1 + a % (V - 1)] = NAN; break;  // near a slice edge, a NaN
                case 3: row[b] = 9.0f, row[0] = 9.0f; break;           // the first column ties
                default: break;                                        // random
                }
            }
            if (R == 70) for (int i = 0; i < V; i++) lg[(size_t)69 * V + i] = NAN;  // all NaN
            cr_assert_eq(argmax_rows_gpu_check(lg, R, V, dev), 0);
            for (int r = 0; r < R; r++) {
                const int want = argmax_f32(lg + (size_t)r * V, V);
                cr_assert_eq(dev[r], want, "V=%d rows=%d row %d: device %d, C %d", V, R, r, dev[r], want);
            }
            free(lg), free(dev);
        }
}

// ---------------------------------------------------------------- graphs vs eager

#define GS 13     // sequences
#define GMAXG 40  // tokens generated at most per sequence
#define GLEN 1280 // max_model_len: the longest sequence passes 1024 keys (paged decode v2)
#define GB 16     // block size

typedef struct {
    int tok[GS][GMAXG], top5[GS][GMAXG * 5], n[GS];
    long replays, captures;
    long pre_replays, pre_captures;  // graphs 2: what gpu_runner_capture_graphs left before the first step
    int decode_steps, sampled_checked, sampled_same;
} GRun;

// Prompts of plen[s] random ids in one prefill step (eager: many rows per sequence), then decode
// steps of every sequence not yet at ngen[s] tokens, one row each: 13 rows, then fewer as they end
// (buckets 16, 8, 4, 2, 1). sampled 1: temperature 0.8 rows (keyed) instead of greedy; 2: sampled
// and greedy steps alternate on one runner (a graph ends in the sampler or in the argmax).
// graphs: 0 eager, 1 graphs captured as buckets come, 2 every graph captured before the first step.
static void graph_run(GpuModel *gm, int V, int glen, int graphs, int sampled, GRun *out) {
    static const int plen0[GS] = {5, 1100, 17, 33, 2, 64, 9, 120, 48, 3, 77, 15, 250};
    static const int ngen[GS] = {40, 24, 3, 7, 12, 40, 1, 18, 30, 5, 9, 36, 2};
    int plen[GS];  // a model of fewer positions: the prompts cut to leave room for the tokens
    for (int s = 0; s < GS; s++) plen[s] = plen0[s] < glen - GMAXG ? plen0[s] : glen - GMAXG;
    const int per = (glen + GB - 1) / GB, nblk = 1 + GS * per;
    char err[512];
    GpuRunner *g = gpu_runner_new_paged(gm, nblk, GB, glen, 2048, err, sizeof err);
    cr_assert(g, "%s", err);
    cr_assert_eq(gpu_runner_set_graphs(g, graphs != 0), graphs != 0);
    out->pre_replays = out->pre_captures = 0;
    if (graphs == 2) {
        const int made = gpu_runner_capture_graphs(g);
        gpu_runner_graph_stats(g, &out->pre_replays, &out->pre_captures);
        cr_assert(made > 0 && made == out->pre_captures, "capture_graphs made %d graphs, the runner counts %ld", made,
                  out->pre_captures);
    }
    Batch b;
    batch_alloc_paged(&b, GS, 2048, GB, per);
    Rng r;
    rng_seed(&r, 555);
    static int seq[GS][GLEN];
    int len[GS];
    for (int s = 0; s < GS; s++) {
        len[s] = plen[s], out->n[s] = 0;
        for (int j = 0; j < plen[s]; j++) seq[s][j] = (int)(rng_u32(&r) % (unsigned)V);
    }
    float *row = malloc((size_t)V * 4);
    int owner[GS], am[GS];
    float temps[GS];
    uint64_t keys[GS];
    out->sampled_checked = out->sampled_same = out->decode_steps = 0;
    for (int step = 0;; step++) {
        const int samp = sampled == 2 ? step % 2 : sampled;
        b.n_seqs = 0, b.n_tokens = 0, b.n_logits = 0, b.cu_seqlens_q[0] = 0;
        for (int s = 0; s < GS; s++) {
            if (out->n[s] >= ngen[s]) continue;
            const int p0 = step == 0 ? 0 : len[s] - 1, n = step == 0 ? plen[s] : 1, i = b.n_seqs;
            for (int j = 0; j < n; j++) {
                const int t = b.n_tokens++, pos = p0 + j;
                b.token_ids[t] = seq[s][pos], b.positions[t] = pos;
                b.slot_mapping[t] = (1 + s * per + pos / GB) * GB + pos % GB;
            }
            for (int k = 0; k < per; k++) b.block_tables[(size_t)i * b.bt_stride + k] = 1 + s * per + k;
            b.seq_lens_k[i] = len[s], b.seq_slot[i] = 0;
            b.cu_seqlens_q[++b.n_seqs] = b.n_tokens;
            owner[b.n_logits] = s, b.logit_rows[b.n_logits] = b.n_tokens - 1;
            temps[b.n_logits] = samp ? 0.8f : 0, keys[b.n_logits] = sample_key(9, s, len[s]);
            b.n_logits++;
        }
        if (b.n_seqs == 0) break;
        out->decode_steps += step > 0;
        if (samp) cr_assert_eq(gpu_runner_forward_sampled(g, &b, temps, keys, am), 0, "step %d", step);
        else cr_assert_eq(gpu_runner_forward(g, &b, NULL, am), 0, "step %d", step);
        for (int k = 0; k < b.n_logits; k++) {
            const int s = owner[k];
            cr_assert_eq(gpu_runner_last_logits(g, k, row), 0, "step %d row %d: no logits", step, k);
            forward_topk(row, V, 5, out->top5[s] + 5 * out->n[s]);
            if (sampled) {  // the draw (or, in a greedy step of mode 2, the argmax) of this step's logits
                out->sampled_checked++;
                out->sampled_same += am[k] == (samp ? sample_gumbel(row, V, temps[k], keys[k]) : argmax_f32(row, V));
            }
            out->tok[s][out->n[s]++] = am[k];
            seq[s][len[s]++] = am[k];
        }
    }
    gpu_runner_graph_stats(g, &out->replays, &out->captures);
    free(row);
    batch_free(&b);
    gpu_runner_free(g);
}

static void graphs_vs_eager(GpuModel *gm, int V, int glen, const char *name) {
    static GRun eager, graph, pre;
    for (int sampled = 0; sampled < 3; sampled++) {
        graph_run(gm, V, glen, 0, sampled, &eager);
        graph_run(gm, V, glen, 1, sampled, &graph);
        graph_run(gm, V, glen, 2, sampled, &pre);
        // captured up front: no step of the run captures, every decode step replays, and the
        // tokens agree with the lazily captured run's by the top-5 rule (there, each bucket's
        // first step ran eagerly at its own row count, which can change cuBLAS's kernel)
        cr_expect_eq(pre.captures, pre.pre_captures, "%s: %ld graphs captured during the run after %ld up front", name,
                     pre.captures - pre.pre_captures, pre.pre_captures);
        cr_expect_eq(pre.replays - pre.pre_replays, pre.decode_steps, "%s: %ld of %d decode steps replayed a pre-captured graph",
                     name, pre.replays - pre.pre_replays, pre.decode_steps);
        for (int s = 0; s < GS && !sampled; s++) {
            char what[200];
            snprintf(what, sizeof what, "%s sequence %d: graphs captured up front vs as buckets come", name, s);
            cr_assert_eq(pre.n[s], graph.n[s]);
            vllm_expect(what, pre.tok[s], pre.top5[s], graph.tok[s], graph.top5[s], graph.n[s]);
        }
        if (sampled)
            cr_expect_eq(pre.sampled_same, pre.sampled_checked, "%s up front: %d of %d graph-step draws are the C reference's",
                         name, pre.sampled_same, pre.sampled_checked);
        cr_expect_eq(eager.replays + eager.captures, 0, "%s: the eager runner used graphs", name);
        // every decode step is a graph's: its bucket's first runs eagerly, the second is captured and
        // replayed, the others replay
        cr_expect_geq(graph.captures, sampled == 2 ? 6 : 3, "%s: %ld graphs captured (the batch shrinks through 5 buckets)",
                      name, graph.captures);
        cr_expect_eq(graph.replays, graph.decode_steps - 2 * graph.captures,
                     "%s: %ld of %d decode steps replayed a graph (%ld captures, each after one eager step)", name,
                     graph.replays, graph.decode_steps, graph.captures);
        if (sampled) {
            cr_expect_eq(graph.sampled_same, graph.sampled_checked, "%s: %d of %d graph-step draws are the C reference's",
                         name, graph.sampled_same, graph.sampled_checked);
            cr_expect_eq(eager.sampled_same, eager.sampled_checked, "%s eager: %d of %d draws are the C reference's", name,
                         eager.sampled_same, eager.sampled_checked);
            continue;
        }
        int all = 0, same = 0;
        for (int s = 0; s < GS; s++) {
            char what[200];
            snprintf(what, sizeof what, "%s sequence %d: graphs vs eager", name, s);
            cr_assert_eq(graph.n[s], eager.n[s]);
            same += vllm_expect(what, graph.tok[s], graph.top5[s], eager.tok[s], eager.top5[s], graph.n[s]);
            all += graph.n[s];
        }
        fprintf(stderr, "[graphs] %s: %d of %d greedy tokens identical with CUDA graphs and eager (%ld replays, %ld captures)\n",
                name, same, all, graph.replays, graph.captures);
    }
}

// A random bf16 Qwen3-style model of head_dim 128 (the tensor-core decode loop).
static GpuModel *random_qwen3_hd128(ModelConfig *cfg) {
    static const char *json =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":512,\"intermediate_size\":1024,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":128,\"vocab_size\":1024,"
        "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,\"tie_word_embeddings\":true}";
    char err[512];
    cr_assert_eq(hf_config_parse(json, "test model", cfg, err, sizeof err), 0, "%s", err);
    GpuModel *gm = gpu_model_random(cfg, ST_BF16, 21, err, sizeof err);
    cr_assert(gm, "%s", err);
    return gm;
}

// launch_run's slot collected: its nl tokens appended to their sequences (owner[k]: row k's)
static void collect_into(GpuRunner *g, int slot, int nl, const int *owner, const int *plen, int tok[GS][GMAXG], int *n,
                         int seq[GS][GLEN]) {
    int am[GS];
    cr_assert_eq(gpu_runner_collect(g, slot, am), 0, "slot %d", slot);
    for (int k = 0; k < nl; k++) {
        const int s = owner[k];
        tok[s][n[s]] = am[k], seq[s][plen[s] + n[s]] = am[k], n[s]++;
    }
}

// The steps of graph_run (graphs captured up front), run two ways: each step by
// gpu_runner_forward(_sampled) with its input tokens from the host (async 0), or by
// gpu_runner_launch with the next step launched before this one's tokens are collected, its decode
// rows taking their tokens from the previous launch on the device (async 1: the engine's
// asynchronous scheduling). The same kernels and graphs run on the same inputs: the tokens must be
// identical, bit for bit.
static void launch_run(GpuModel *gm, int V, int glen, int async, int sampled, int tok[GS][GMAXG], int n[GS]) {
    static const int plen0[GS] = {5, 1100, 17, 33, 2, 64, 9, 120, 48, 3, 77, 15, 250};
    static const int ngen[GS] = {40, 24, 3, 7, 12, 40, 1, 18, 30, 5, 9, 36, 2};
    int plen[GS];
    for (int s = 0; s < GS; s++) plen[s] = plen0[s] < glen - GMAXG ? plen0[s] : glen - GMAXG;
    const int per = (glen + GB - 1) / GB, nblk = 1 + GS * per;
    char err[512];
    GpuRunner *g = gpu_runner_new_paged(gm, nblk, GB, glen, 2048, err, sizeof err);
    cr_assert(g, "%s", err);
    cr_assert_geq(gpu_runner_capture_graphs(g), 0);
    Batch b;
    batch_alloc_paged(&b, GS, 2048, GB, per);
    Rng r;
    rng_seed(&r, 555);
    static int seq[GS][GLEN];
    int len[GS], sched[GS], src[GS];  // len: positions so far (the pending token included); sched: tokens asked for
    for (int s = 0; s < GS; s++) {
        len[s] = plen[s], sched[s] = 0, n[s] = 0, src[s] = -1;
        for (int j = 0; j < plen[s]; j++) seq[s][j] = (int)(rng_u32(&r) % (unsigned)V);
    }
    int owner[2][GS], nl[2] = {0, 0}, am[GS], fix_rows[GS], fix_src[GS];
    float temps[GS];
    uint64_t keys[GS];
    int pend = -1;  // the slot launched and not collected yet
    for (int step = 0;; step++) {
        const int slot = step % 2;
        int n_fix = 0;
        b.n_seqs = 0, b.n_tokens = 0, b.n_logits = 0, b.cu_seqlens_q[0] = 0;
        for (int s = 0; s < GS; s++) {
            if (sched[s] >= ngen[s]) continue;
            const int p0 = step == 0 ? 0 : len[s] - 1, nr = step == 0 ? plen[s] : 1, i = b.n_seqs;
            for (int j = 0; j < nr; j++) {
                const int t = b.n_tokens++, pos = p0 + j;
                b.token_ids[t] = seq[s][pos], b.positions[t] = pos;
                b.slot_mapping[t] = (1 + s * per + pos / GB) * GB + pos % GB;
            }
            if (step > 0 && async) b.token_ids[b.n_tokens - 1] = 0, fix_rows[n_fix] = b.n_tokens - 1, fix_src[n_fix++] = src[s];
            for (int k = 0; k < per; k++) b.block_tables[(size_t)i * b.bt_stride + k] = 1 + s * per + k;
            b.seq_lens_k[i] = len[s], b.seq_slot[i] = 0;
            b.cu_seqlens_q[++b.n_seqs] = b.n_tokens;
            owner[slot][b.n_logits] = s, b.logit_rows[b.n_logits] = b.n_tokens - 1;
            temps[b.n_logits] = sampled ? 0.8f : 0, keys[b.n_logits] = sample_key(9, s, len[s]);
            src[s] = b.n_logits++;
            sched[s]++;
        }
        if (b.n_seqs == 0) break;
        nl[slot] = b.n_logits;
        if (!async) {
            if (sampled) cr_assert_eq(gpu_runner_forward_sampled(g, &b, temps, keys, am), 0, "step %d", step);
            else cr_assert_eq(gpu_runner_forward(g, &b, NULL, am), 0, "step %d", step);
            for (int k = 0; k < nl[slot]; k++) {
                const int s = owner[slot][k];
                tok[s][n[s]++] = am[k], seq[s][len[s]++] = am[k];
            }
            continue;
        }
        cr_assert_eq(gpu_runner_launch(g, &b, sampled ? temps : NULL, sampled ? keys : NULL, fix_rows, fix_src, n_fix, slot), 0,
                     "step %d", step);
        for (int k = 0; k < nl[slot]; k++) len[owner[slot][k]]++;  // the token it draws: known later
        if (pend >= 0) collect_into(g, pend, nl[pend], owner[pend], plen, tok, n, seq);
        pend = slot;
    }
    if (pend >= 0) collect_into(g, pend, nl[pend], owner[pend], plen, tok, n, seq);
    batch_free(&b);
    gpu_runner_free(g);
}

static void launches_vs_forwards(GpuModel *gm, int V, int glen, const char *name) {
    static int t0[GS][GMAXG], t1[GS][GMAXG];
    int n0[GS], n1[GS];
    for (int sampled = 0; sampled < 2; sampled++) {
        launch_run(gm, V, glen, 0, sampled, t0, n0);
        launch_run(gm, V, glen, 1, sampled, t1, n1);
        int all = 0;
        for (int s = 0; s < GS; s++) {
            cr_assert_eq(n1[s], n0[s], "%s sequence %d: %d tokens launched ahead, %d step by step", name, s, n1[s], n0[s]);
            for (int t = 0; t < n0[s]; t++)
                cr_expect_eq(t1[s][t], t0[s][t], "%s %s sequence %d token %d: launched ahead %d, step by step %d", name,
                             sampled ? "sampled" : "greedy", s, t, t1[s][t], t0[s][t]);
            all += n0[s];
        }
        fprintf(stderr, "[async] %s %s: %d tokens, each step launched before the previous one's tokens were back, equal to "
                "the step-by-step run\n", name, sampled ? "sampled" : "greedy", all);
    }
}

Test(final_graphs_gpu, launches_ahead_equal_step_by_step, .timeout = 600) {
    NEED_GPU();
    ModelConfig cfg;
    GpuModel *gm = random_qwen3_hd128(&cfg);
    launches_vs_forwards(gm, cfg.vocab, GLEN, "random qwen3 hd128");
    gpu_model_free(gm);
}

// A random bf16 Qwen3-style model of head_dim 128 (the tensor-core decode loop) and every test
// checkpoint's shape (the SIMT loops), as the runner loads them.
Test(final_graphs_gpu, decode_graphs_equal_eager_steps, .timeout = 600) {
    NEED_GPU();
    ModelConfig cfg;
    GpuModel *gm = random_qwen3_hd128(&cfg);
    graphs_vs_eager(gm, cfg.vocab, GLEN, "random qwen3 hd128");
    gpu_model_free(gm);
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    int tested = 0;
    for (int i = 0; i < n && tested < 3; i++) {
        CkptModels L;
        ckpt_models_load(&ck[i], &L);
        const int glen = L.cm.cfg.max_pos < GLEN ? L.cm.cfg.max_pos : GLEN;
        if (glen > 2 * GMAXG) graphs_vs_eager(L.gm, L.cm.cfg.vocab, glen, ck[i].name), tested++;
        ckpt_models_free(&L);
    }
}
