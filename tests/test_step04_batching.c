// test_step04_batching.c — the scheduler, the flat batch and the batched CPU runner.
//
// Scheduler (driven by a fake model, as vLLM's tests/v1/core/test_scheduler.py does): after
// every step of random workloads, for both policies, budgets {1, 7, 64, unlimited}, several
// max_num_seqs and tight KV budgets: Σ scheduled <= budget, running <= max_num_seqs,
// 0 <= num_computed <= num_tokens, a plan entry starts at num_computed and samples iff it
// completes the sequence, first-come-first-served admission, nobody admitted before arriving,
// KV reservations within budget and slots unique, static batches closed while running; every
// request finishes with exactly the fake model's tokens and the right finish reason. Hand-made
// cases pin the chunked-prefill plan, static padding counts, and requests that cannot fit, are
// cancelled (running or waiting) or are capped by max_len.
// Runner (CPU, fp32): linear_rows_cpu gives every row bit-identical results for any row count
// (OpenBLAS does not: counted and printed); a sequence's logits are bit-identical alone and in a
// chunked batch with mates; each request's greedy and sampled tokens are identical alone and
// with random batch mates for budgets {1, 7, 64, unlimited} and both policies; every
// transformers golden still matches (vLLM's top-5 rule) through the batched path.
// batch_bench: JSONL in / --json out round trip (input order, tokens = the in-process engine's,
// the --timeline rows), --trace nano through both policies (same tokens, static needs more steps),
// a clear error naming the line and field for bad JSONL, strict numeric options.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "golden_util.h"
#include "model.h"
#include "rng.h"
#include "step02_attention/forward.h"
#include "step04_batching/batch.h"
#include "step04_batching/gumbel.h"
#include "step04_batching/linear_rows.h"
#include "step04_batching/offline.h"
#include "step04_batching/scheduler.h"

#define UNLIMITED 1000000L

// ---------------------------------------------------------------- linear_rows

Test(step04, linear_rows_is_row_deterministic_and_close_to_blas) {
    static const int shapes[][2] = {{64, 172}, {172, 64}, {24, 96}, {61, 5}, {256, 688}, {7, 1}};  // n_in, n_out
    static const int Ts[] = {1, 2, 3, 5, 7, 9, 33, 64};
    Rng r;
    rng_seed(&r, 404);
    long blas_rows = 0, blas_differ = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int K = shapes[s][0], N = shapes[s][1];
        float *W = rng_new_uniform(&r, (size_t)N * K, -1, 1), *x = rng_new_uniform(&r, (size_t)64 * K, -1, 1);
        float *b = rng_new_uniform(&r, (size_t)N, -1, 1);
        float *y = malloc((size_t)64 * N * 4), *y1 = malloc((size_t)N * 4), *yb = malloc((size_t)64 * N * 4);
        float *yb1 = malloc((size_t)N * 4);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            linear_rows_cpu(x, W, b, T, K, N, y);
            linear_cpu(x, W, b, T, K, N, yb);
            for (int t = 0; t < T; t++) {
                linear_rows_cpu(x + (size_t)t * K, W, b, 1, K, N, y1);
                cr_assert(!memcmp(y1, y + (size_t)t * N, (size_t)N * 4), "K=%d N=%d: row %d of %d differs from the same row alone",
                          K, N, t, T);
                linear_cpu(x + (size_t)t * K, W, b, 1, K, N, yb1);
                blas_rows++;
                blas_differ += memcmp(yb1, yb + (size_t)t * N, (size_t)N * 4) != 0;
            }
            for (long i = 0; i < (long)T * N; i++)
                cr_assert(fabsf(y[i] - yb[i]) <= 1e-5f * (1 + fabsf(yb[i])) * sqrtf((float)K), "K=%d N=%d T=%d: %g vs blas %g", K,
                          N, T, y[i], yb[i]);
        }
        free(W), free(x), free(b), free(y), free(y1), free(yb), free(yb1);
    }
    fprintf(stderr, "[step04] OpenBLAS linear_cpu: %ld of %ld rows differ in some bit from the same row computed alone\n",
            blas_differ, blas_rows);
}

// ---------------------------------------------------------------- scheduler with a fake model

static int fake_token(int req, int pos, int V) { return (int)((req * 7919u + pos * 104729u + 17u) % (unsigned)V); }

typedef struct {
    int n;
    Request *r;
} Reqs;

static void reqs_free(Reqs *q) {
    for (int i = 0; i < q->n; i++) request_free(&q->r[i]);
    free(q->r);
}

static Reqs random_requests(Rng *g, int n, int max_prompt, int max_out, int with_arrivals, int V) {
    Reqs q = {n, calloc((size_t)n, sizeof(Request))};
    int *ids = malloc((size_t)max_prompt * sizeof(int));
    SamplerParams sp = {.greedy = 1, .top_p = 1};
    for (int i = 0; i < n; i++) {
        const int np = 1 + (int)(rng_u32(g) % (unsigned)max_prompt), mt = 1 + (int)(rng_u32(g) % (unsigned)max_out);
        for (int j = 0; j < np; j++) ids[j] = (int)(rng_u32(g) % (unsigned)V);
        const double arr = with_arrivals ? (rng_u32(g) % 4 == 0 ? 0.0 : 0.05 * (rng_u32(g) % 40)) : 0.0;
        request_init(&q.r[i], i, ids, np, mt, &sp, (int)(rng_u32(g) % 2), arr);
    }
    free(ids);
    return q;
}

// Runs the scheduler to the end with the fake model, checking the invariants after every step.
static void drive_fake(const SchedConfig *cfg, Reqs *q, int V, const char *what) {
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, cfg, q->r, q->n, err, sizeof err), 0, "%s", err);
    // the order admission must follow: arrival, then input order, among admissible requests
    int *order = malloc((size_t)q->n * sizeof(int)), n_order = 0, n_admitted = 0;
    for (int i = s.w_head; i < q->n; i++) order[n_order++] = s.waiting[i];
    int *seen = calloc((size_t)q->n, sizeof(int));
    SchedPlan p = {0};
    int *tokens = malloc((size_t)2 * cfg->max_num_seqs * sizeof(int));  // static padding entries too
    double now = 0;
    long step = 0;
    while (!sched_done(&s)) {
        cr_assert(step++ < 200000, "%s: no end after %ld steps", what, step);
        int *before = malloc((size_t)q->n * sizeof(int));
        for (int i = 0; i < q->n; i++) before[i] = q->r[i].num_computed;
        const int running_before = s.n_running;
        int nonwaiting_before = 0, nonwaiting_after = 0;
        for (int i = 0; i < q->n; i++) nonwaiting_before += q->r[i].status != REQ_WAITING;
        sched_schedule(&s, now, &p);
        for (int i = 0; i < q->n; i++) nonwaiting_after += q->r[i].status != REQ_WAITING;
        if (cfg->policy == POLICY_STATIC && running_before > 0)
            cr_assert_eq(nonwaiting_after, nonwaiting_before, "%s: static admitted into a running batch", what);
        cr_assert(s.n_batch <= cfg->max_num_seqs);
        if (p.n == 0) {
            const double next = sched_next_arrival(&s);
            cr_assert(next > now, "%s: idle at t=%.2f with the next arrival at %.2f", what, now, next);
            now = next;
            free(before);
            continue;
        }
        cr_assert(p.n_tokens <= cfg->max_num_batched_tokens, "%s: %ld tokens > budget %ld", what, p.n_tokens,
                  cfg->max_num_batched_tokens);
        long sum = 0, pad = 0;
        int in_plan[4096] = {0}, padded[4096] = {0}, n_real = 0;
        for (int i = 0; i < p.n; i++) {
            const Request *r = &q->r[p.req[i]];
            sum += p.n_new[i];
            if (p.pad[i] != PLAN_REAL) {  // static padding rows of a batch member
                cr_assert(cfg->policy == POLICY_STATIC, "%s: padding in a continuous plan", what);
                cr_assert(!padded[p.req[i]]++, "%s: request %d padded twice in one plan", what, p.req[i]);
                int member = 0;
                for (int k = 0; k < s.n_batch; k++) member |= s.batch[k] == p.req[i];
                cr_assert(member && r->slot >= 0 && p.n_new[i] >= 1, "%s: padding of request %d outside the batch", what, p.req[i]);
                if (p.pad[i] == PLAN_PAD_DECODE)
                    cr_assert(r->status == REQ_FINISHED && p.n_new[i] == 1 && !p.samples[i] && p.start[i] >= r->num_computed &&
                                  p.start[i] < cfg->max_len,
                              "%s: padding decode of request %d at %d", what, p.req[i], p.start[i]);
                else
                    cr_assert(r->status == REQ_RUNNING && r->num_computed == 0 && !p.samples[i],
                              "%s: prompt padding of request %d after its prompt started", what, p.req[i]);
                pad += p.n_new[i];
                continue;
            }
            n_real++;
            cr_assert(!in_plan[p.req[i]]++, "%s: request %d twice in one plan", what, p.req[i]);
            cr_assert(r->status == REQ_RUNNING && r->slot >= 0, "%s: request %d planned but not running", what, p.req[i]);
            cr_assert(p.n_new[i] >= 1 && p.start[i] == before[p.req[i]], "%s: plan entry %d starts at %d, computed %d", what,
                      i, p.start[i], before[p.req[i]]);
            cr_assert(p.start[i] + p.n_new[i] <= r->num_tokens, "%s: schedules past num_tokens", what);
            cr_assert_eq(p.samples[i], p.start[i] + p.n_new[i] == r->num_tokens, "%s: samples flag wrong", what);
            cr_assert(r->arrival_s <= now, "%s: request %d scheduled at %.2f before it arrives at %.2f", what, p.req[i], now,
                      r->arrival_s);
        }
        cr_assert_eq(sum, p.n_tokens);
        cr_assert_eq(pad, p.n_pad);
        cr_assert(s.n_running <= cfg->max_num_seqs && n_real <= cfg->max_num_seqs, "%s: %d running, %d in plan > %d", what,
                  s.n_running, n_real, cfg->max_num_seqs);
        // FCFS: requests leave the waiting state exactly in arrival order
        for (int i = 0; i < q->n; i++)
            if (q->r[i].status != REQ_WAITING && !seen[i] && q->r[i].finish != FINISH_ERROR) seen[i] = 1, n_admitted++;
        for (int k = 0; k < n_admitted; k++)
            cr_assert(seen[order[k]], "%s: request %d admitted before %d, which arrived first", what, order[n_admitted - 1],
                      order[k]);
        // KV: reservations within budget, slots unique and held only by admitted unfinished (or batch) requests
        cr_assert(s.kv.reserved <= s.kv.budget, "%s: reserved %ld > budget %ld", what, s.kv.reserved, s.kv.budget);
        int holders = 0;
        char used[4096] = {0};
        for (int i = 0; i < q->n; i++)
            if (q->r[i].slot >= 0) {
                cr_assert(!used[q->r[i].slot]++, "%s: slot %d held twice", what, q->r[i].slot);
                holders++;
            }
        cr_assert_eq(holders + s.kv.n_free, s.kv.n_slots, "%s: slots leak (%d held + %d free != %d)", what, holders, s.kv.n_free,
                     s.kv.n_slots);
        for (int i = 0; i < p.n; i++)
            tokens[i] = p.samples[i] ? fake_token(p.req[i], q->r[p.req[i]].num_tokens, V) : -1;
        now += 0.01;
        const int batch_before = s.n_batch;
        sched_update(&s, &p, tokens, now);
        if (cfg->policy == POLICY_STATIC && s.n_running > 0) cr_assert_eq(s.n_batch, batch_before);
        for (int i = 0; i < q->n; i++)
            cr_assert(q->r[i].num_computed >= 0 && q->r[i].num_computed <= q->r[i].num_tokens, "%s: request %d computed %d of %d",
                      what, i, q->r[i].num_computed, q->r[i].num_tokens);
        free(before);
    }
    // every request finished with the fake model's tokens, stopping where it should
    for (int i = 0; i < q->n; i++) {
        const Request *r = &q->r[i];
        cr_assert_eq(r->status, REQ_FINISHED);
        if (r->finish == FINISH_ERROR) {
            cr_assert(r->num_prompt >= cfg->max_len, "%s: request %d failed though it fits", what, i);
            continue;
        }
        const int cap = r->num_prompt + r->max_tokens < cfg->max_len ? r->num_prompt + r->max_tokens : cfg->max_len;
        int want_end = cap, reason = FINISH_LENGTH;
        for (int pos = r->num_prompt; pos < cap; pos++) {
            const int t = fake_token(i, pos, V);
            int eos = 0;
            for (int e = 0; e < cfg->n_eos; e++) eos |= t == cfg->eos[e];
            if (eos && !r->ignore_eos) {
                want_end = pos + 1, reason = FINISH_STOP;
                break;
            }
        }
        cr_assert_eq(r->num_tokens, want_end, "%s: request %d ended at %d tokens, expected %d", what, i, r->num_tokens, want_end);
        cr_assert_eq((int)r->finish, reason, "%s: request %d finish %s", what, i, finish_reason_name(r->finish));
        for (int pos = r->num_prompt; pos < r->num_tokens; pos++) cr_assert_eq(r->tokens[pos], fake_token(i, pos, V));
        cr_assert(r->first_token_s >= r->first_sched_s && r->first_sched_s >= r->arrival_s && r->finish_s >= r->first_token_s);
    }
    cr_assert_eq(s.kv.n_free, s.kv.n_slots, "%s: slots not all free at the end", what);
    cr_assert_eq(s.kv.reserved, 0);
    if (cfg->policy == POLICY_CONTINUOUS) cr_assert_eq(s.st.idle_slots, 0);
    free(order), free(seen), free(tokens);
    plan_free(&p);
    sched_free(&s);
}

Test(step04, scheduler_invariants_hold_after_every_step, .timeout = 300) {
    const long budgets[] = {1, 7, 64, UNLIMITED};
    const int seqs[] = {1, 3, 8};
    Rng g;
    rng_seed(&g, 2024);
    const int V = 50;
    for (int pol = 0; pol < 2; pol++)
        for (size_t bi = 0; bi < 4; bi++)
            for (size_t si = 0; si < 3; si++)
                for (int variant = 0; variant < 3; variant++) {
                    Reqs q = random_requests(&g, 24, 40, 30, variant != 0, V);
                    SchedConfig c = {.policy = pol, .max_num_seqs = seqs[si], .max_num_batched_tokens = budgets[bi],
                                     .max_len = variant == 2 ? 48 : 128, .n_eos = 2, .eos = {3, 11}};
                    if (variant == 2) c.kv_tokens = 90;  // tight: admission waits for reservations, not seats
                    char what[160];
                    snprintf(what, sizeof what, "%s budget %ld seqs %d variant %d", policy_name(c.policy), budgets[bi], seqs[si],
                             variant);
                    drive_fake(&c, &q, V, what);
                    reqs_free(&q);
                }
}

static Request mk(int idx, int np, int mt, double arr) {
    int ids[64];
    for (int i = 0; i < np; i++) ids[i] = i + 1;
    SamplerParams sp = {.greedy = 1, .top_p = 1};
    Request r;
    request_init(&r, idx, ids, np, mt, &sp, 1, arr);
    return r;
}

// Budget 8, prompts 5 and 6: step 1 = all of A (samples) + 3 of B (a chunk, no sample);
// step 2 = A's decode + the other 3 of B (samples); then decodes of both.
Test(step04, chunked_prefill_plan_by_hand) {
    Request r[2] = {mk(0, 5, 3, 0), mk(1, 6, 3, 0)};
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 4, .max_num_batched_tokens = 8, .max_len = 32};
    Scheduler s;
    char err[128];
    cr_assert_eq(sched_init(&s, &c, r, 2, err, sizeof err), 0);
    SchedPlan p = {0};
    int tok[2] = {7, 7};
    sched_schedule(&s, 0, &p);
    cr_assert_eq(p.n, 2);
    cr_expect(p.req[0] == 0 && p.n_new[0] == 5 && p.samples[0] == 1);
    cr_expect(p.req[1] == 1 && p.n_new[1] == 3 && p.start[1] == 0 && p.samples[1] == 0);
    Batch b;
    batch_alloc(&b, 4, 8);
    batch_from_plan(&b, &p, r, c.max_len);
    cr_expect_eq(batch_check(&b, 4, c.max_len, 100), 0);
    cr_expect(b.n_tokens == 8 && b.cu_seqlens_q[1] == 5 && b.cu_seqlens_q[2] == 8 && b.seq_lens_k[1] == 3);
    cr_expect(b.n_logits == 1 && b.logit_rows[0] == 4, "only A's last row samples");
    cr_expect(b.slot_mapping[5] == r[1].slot * 32 + 0 && b.slot_mapping[7] == r[1].slot * 32 + 2);
    b.positions[6] = 9;  // a corrupted batch is caught, naming the field
    cr_expect_eq(batch_check(&b, 4, c.max_len, 100), -1);
    b.positions[6] = 1;
    b.logit_rows[0] = 3;  // a logit row that is not a sequence's last row
    cr_expect_eq(batch_check(&b, 4, c.max_len, 100), -1);
    b.logit_rows[0] = 4;
    cr_expect_eq(batch_check(&b, 4, c.max_len, 100), 0);
    sched_update(&s, &p, tok, 0.1);
    sched_schedule(&s, 0.1, &p);
    cr_assert_eq(p.n, 2);
    cr_expect(p.req[0] == 0 && p.n_new[0] == 1 && p.start[0] == 5 && p.samples[0]);
    cr_expect(p.req[1] == 1 && p.n_new[1] == 3 && p.start[1] == 3 && p.samples[1]);
    cr_expect_eq(s.kv.reserved, 8 + 9, "reservations: prompt + max_tokens each");
    batch_free(&b);
    plan_free(&p);
    sched_free(&s);
    request_free(&r[0]), request_free(&r[1]);
}

// Static: batches of 3 in arrival order; the 4th request waits for the whole first batch; the
// prompt padding of a batch {3, 5, 9} is 6 + 4 + 0 rows, and finished members run padding rows until
// the longest ends.
Test(step04, static_batches_by_hand) {
    Request r[4] = {mk(0, 3, 1, 0), mk(1, 5, 4, 0), mk(2, 9, 2, 0), mk(3, 2, 1, 0)};
    SchedConfig c = {.policy = POLICY_STATIC, .max_num_seqs = 3, .max_num_batched_tokens = 100, .max_len = 32};
    Scheduler s;
    char err[128];
    cr_assert_eq(sched_init(&s, &c, r, 4, err, sizeof err), 0);
    SchedPlan p = {0};
    int tok[6] = {5, 5, 5, 5, 5, 5}, steps = 0;  // one per plan entry: members and their padding
    while (r[1].status != REQ_FINISHED) {
        sched_schedule(&s, steps, &p);
        cr_assert(p.n > 0);
        for (int i = 0; i < p.n; i++) cr_expect_neq(p.req[i], 3, "request 3 must wait for the batch");
        sched_update(&s, &p, tok, ++steps);
    }
    cr_expect_eq(steps, 4, "request 1's 4 tokens: prefill + 3 decodes");
    cr_expect_eq(s.st.pad_slots, 10);
    // decode steps 2, 3, 4: request 0 finished after step 1 (1 token), request 2 after step 2
    cr_expect_eq(s.st.idle_slots, 10 + 0 + 1 + 2 + 2);
    sched_schedule(&s, steps, &p);
    cr_expect(p.n == 1 && p.req[0] == 3 && s.st.batches == 2);
    plan_free(&p);
    sched_free(&s);
    for (int i = 0; i < 4; i++) request_free(&r[i]);
}

// Static padding is computed: the batch {3, 5, 9} (max_tokens 1, 4, 2) runs its prefill as
// 3 x 9 rows (10 of them a padding sequence: no slot, no logits), then 3 rows per step until
// its longest request ends (finished members decode in their own slot, sampling nothing);
// every request's tokens, finish reason and finish time are those of an unpadded run.
Test(step04, static_batch_computes_its_padding_rows) {
    static const char *cfg_json =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":300,"
        "\"max_position_embeddings\":512,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"tie_word_embeddings\":true}";
    ModelConfig cfg;
    char err[256];
    cr_assert_eq(hf_config_parse(cfg_json, "test", &cfg, err, sizeof err), 0, "%s", err);
    CpuModel m;
    cpu_model_random(&cfg, 5, &m);
    enum { N = 4, L = 32 };
    static const int np[N] = {3, 5, 9, 2}, mt[N] = {1, 4, 2, 1};
    int *want[N];
    double want_finish[N];
    for (int pol = 1; pol >= 0; pol--) {  // static first, then continuous (no padding) with the same requests
        Request r[N];
        for (int i = 0; i < N; i++) {
            r[i] = mk(i, np[i], mt[i], 0);
            for (int j = 0; j < np[i]; j++) r[i].tokens[j] = (7 * i + 3 * j + 1) % cfg.vocab;
        }
        SchedConfig c = {.policy = pol, .max_num_seqs = 3, .max_num_batched_tokens = UNLIMITED, .max_len = L};
        Scheduler s;
        cr_assert_eq(sched_init(&s, &c, r, N, err, sizeof err), 0, "%s", err);
        Runner *run = runner_new_cpu(&m, 3, L, 3 * L, err, sizeof err);
        cr_assert(run, "%s", err);
        Batch b;
        batch_alloc(&b, 4, 3 * L);
        SchedPlan p = {0};
        int argmax[3], tok[8], rows[16], n_steps = 0;
        while (!sched_done(&s)) {
            cr_assert(n_steps < 16);
            sched_schedule(&s, n_steps, &p);
            cr_assert(p.n > 0);
            batch_from_plan(&b, &p, r, L);
            cr_assert_eq(batch_check(&b, 3, L, cfg.vocab), 0);
            cr_assert_eq(b.n_tokens, p.n_tokens);
            cr_assert_eq(runner_forward(run, &b, NULL, argmax), 0);
            for (int i = 0, k = 0; i < p.n; i++)
                if (p.samples[i]) tok[i] = argmax[k++];
            rows[n_steps++] = b.n_tokens;
            sched_update(&s, &p, tok, n_steps);
        }
        if (pol == POLICY_STATIC) {
            static const int want_rows[] = {27, 3, 3, 3, 2};
            cr_assert_eq(n_steps, 5, "static: 4 steps of the first batch, 1 of the second");
            for (int k = 0; k < 5; k++) cr_expect_eq(rows[k], want_rows[k], "static step %d: %d rows", k, rows[k]);
            cr_expect_eq(s.st.pad_slots, 10, "prompt padding 6 + 4 + 0");
            cr_expect_eq(s.st.idle_slots, 10 + 1 + 2 + 2, "+ finished members' rows: 1, 2, 2 in decode steps 2..4");
            cr_expect_eq(s.st.tokens, (3 + 5 + 9 + 2) + (0 + 3 + 1 + 0), "real rows: prompts + decodes");
        } else {
            cr_expect_eq(s.st.idle_slots, 0);
        }
        for (int i = 0; i < N; i++) {
            cr_expect_eq(r[i].finish, FINISH_LENGTH);
            cr_assert_eq(r[i].num_tokens - r[i].num_prompt, mt[i], "%s: request %d produced %d tokens", policy_name(c.policy), i,
                         r[i].num_tokens - r[i].num_prompt);
            if (pol == POLICY_STATIC) {
                want[i] = malloc((size_t)mt[i] * sizeof(int));
                memcpy(want[i], r[i].tokens + np[i], (size_t)mt[i] * sizeof(int));
                want_finish[i] = r[i].finish_s;
            } else {
                cr_expect(!memcmp(want[i], r[i].tokens + np[i], (size_t)mt[i] * sizeof(int)),
                          "request %d: static (padded) and continuous tokens differ", i);
                free(want[i]);
            }
            request_free(&r[i]);
        }
        if (pol == POLICY_STATIC)  // finish times are the real ones: 1 step, 4 steps, 2 steps; the 2nd batch's 1
            cr_expect(want_finish[0] == 1 && want_finish[1] == 4 && want_finish[2] == 2 && want_finish[3] == 5,
                      "finish times %g %g %g %g", want_finish[0], want_finish[1], want_finish[2], want_finish[3]);
        plan_free(&p);
        batch_free(&b);
        runner_free(run);
        sched_free(&s);
    }
    cpu_model_free(&m);
}

// ---------------------------------------------------------------- the batched CPU runner

static void load_cpu(const char *dir, ModelWeights *w, CpuModel *m) {
    char err[512];
    cr_assert_eq(model_load(dir, w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cpu_model_load(w, m, err, sizeof err), 0, "%s", err);
}

// One sequence's logits: its whole prompt alone in one step, vs in chunks of 3 next to mates.
Test(step04, runner_logits_do_not_depend_on_batch_mates) {
    ModelWeights w;
    CpuModel m;
    load_cpu(MODELS_DIR "/qwen3_qknorm_f32", &w, &m);
    const int V = m.cfg.vocab, L = 16, np = 11;
    char err[256];
    Runner *alone = runner_new_cpu(&m, 4, L, 64, err, sizeof err), *mixed = runner_new_cpu(&m, 4, L, 64, err, sizeof err);
    cr_assert(alone && mixed, "%s", err);
    Rng g;
    rng_seed(&g, 5);
    int ids[3][16];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < L; i++) ids[s][i] = (int)(rng_u32(&g) % (unsigned)V);
    float *la = malloc((size_t)V * 4), *lm = malloc((size_t)3 * V * 4);
    Batch b;
    batch_alloc(&b, 4, 64);
    // alone: sequence 0 (slot 2) prompt in one step
    b.n_seqs = 1, b.n_tokens = np, b.cu_seqlens_q[0] = 0, b.cu_seqlens_q[1] = np, b.seq_lens_k[0] = np, b.seq_slot[0] = 2;
    for (int t = 0; t < np; t++) b.token_ids[t] = ids[0][t], b.positions[t] = t, b.slot_mapping[t] = 2 * L + t;
    b.n_logits = 1, b.logit_rows[0] = np - 1;
    cr_assert_eq(runner_forward(alone, &b, la, NULL), 0);
    // mixed: chunks of 3 of sequence 0 (slot 0), with mates in slots 1 and 3 prefilling 5 and 7 tokens
    const int mate_len[2] = {5, 7}, mate_slot[2] = {1, 3};
    int done = 0, got = 0;
    while (done < np) {
        const int n = np - done < 3 ? np - done : 3;
        int row = 0;
        b.n_seqs = 0, b.n_logits = 0;
        for (int s = 0; s < 3; s++) {
            const int slot = s == 0 ? 0 : mate_slot[s - 1];
            const int start = s == 0 ? done : 0, cnt = s == 0 ? n : (done == 0 ? mate_len[s - 1] : 0);
            if (cnt == 0) continue;
            for (int j = 0; j < cnt; j++, row++)
                b.token_ids[row] = ids[s][start + j], b.positions[row] = start + j, b.slot_mapping[row] = slot * L + start + j;
            b.seq_lens_k[b.n_seqs] = start + cnt, b.seq_slot[b.n_seqs] = slot;
            b.cu_seqlens_q[++b.n_seqs] = row;
            if (s == 0 && start + cnt == np) b.logit_rows[b.n_logits++] = row - 1, got = 1;
        }
        b.n_tokens = row;
        cr_assert_eq(runner_forward(mixed, &b, lm, NULL), 0);
        done += n;
    }
    cr_assert(got);
    cr_expect(!memcmp(la, lm, (size_t)V * 4), "logits alone vs chunked with mates differ");
    batch_free(&b);
    free(la), free(lm);
    runner_free(alone), runner_free(mixed);
    cpu_model_free(&m);
    model_free(&w);
}

// Runs n requests (copies of spec) through the engine loop, returns their generated ids.
typedef struct {
    int np, mt;
    int ids[64];
    SamplerParams sp;
    double arrival;
} Spec;

static void run_specs(const CpuModel *m, const Spec *spec, int n, SchedPolicy pol, long budget, int seqs, int **out,
                      OfflineOpts *o) {
    Request *r = calloc((size_t)n, sizeof(Request));
    for (int i = 0; i < n; i++) request_init(&r[i], i, spec[i].ids, spec[i].np, spec[i].mt, &spec[i].sp, 1, spec[i].arrival);
    SchedConfig c = {.policy = pol, .max_num_seqs = seqs, .max_num_batched_tokens = budget, .max_len = 96};
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, &c, r, n, err, sizeof err), 0, "%s", err);
    long rows = budget < (long)seqs * c.max_len ? budget : (long)seqs * c.max_len;
    Runner *run = runner_new_cpu(m, seqs, c.max_len, (int)rows, err, sizeof err);
    cr_assert(run, "%s", err);
    OfflineOpts def = {0};
    OfflineStats st;
    cr_assert_eq(offline_run(run, m->cfg.vocab, &s, o ? o : &def, &st), 0);
    free(st.itl_ms);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(r[i].finish, FINISH_LENGTH);
        out[i] = malloc((size_t)spec[i].mt * sizeof(int));
        memcpy(out[i], r[i].tokens + r[i].num_prompt, (size_t)spec[i].mt * sizeof(int));
        request_free(&r[i]);
    }
    runner_free(run);
    sched_free(&s);
    free(r);
}

static void check_invariance(const char *model, int sampled) {
    ModelWeights w;
    CpuModel m;
    load_cpu(model, &w, &m);
    Rng g;
    rng_seed(&g, sampled ? 77 : 76);
    enum { N = 6 };
    Spec spec[N];
    for (int i = 0; i < N; i++) {
        spec[i].np = 1 + (int)(rng_u32(&g) % 30), spec[i].mt = 1 + (int)(rng_u32(&g) % 12);
        for (int j = 0; j < spec[i].np; j++) spec[i].ids[j] = (int)(rng_u32(&g) % (unsigned)m.cfg.vocab);
        spec[i].sp = (SamplerParams){.greedy = !sampled, .temperature = sampled ? 0.9f : 0, .top_k = sampled ? 20 : 0,
                                     .top_p = sampled ? 0.95f : 1, .seed = 1000 + (uint64_t)(i % 2)};
        spec[i].arrival = i < 3 ? 0 : 0.002 * i;
    }
    int *alone[N], *batched[N];
    for (int i = 0; i < N; i++) {
        const Spec one = spec[i];
        // alone, with the same request index (the sampling key), one seat, an unlimited budget
        Request r;
        request_init(&r, i, one.ids, one.np, one.mt, &one.sp, 1, 0);
        SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 1, .max_num_batched_tokens = UNLIMITED, .max_len = 96};
        Scheduler s;
        char err[128];
        cr_assert_eq(sched_init(&s, &c, &r, 1, err, sizeof err), 0);
        Runner *run = runner_new_cpu(&m, 1, 96, 96, err, sizeof err);
        OfflineOpts def = {0};
        OfflineStats st;
        cr_assert_eq(offline_run(run, m.cfg.vocab, &s, &def, &st), 0);
        free(st.itl_ms);
        alone[i] = malloc((size_t)one.mt * sizeof(int));
        memcpy(alone[i], r.tokens + r.num_prompt, (size_t)one.mt * sizeof(int));
        runner_free(run), sched_free(&s), request_free(&r);
    }
    const long budgets[] = {1, 7, 64, UNLIMITED};
    int differ_seen = 0;
    for (int pol = 0; pol < 2; pol++)
        for (int bi = 0; bi < 4; bi++) {
            run_specs(&m, spec, N, pol, budgets[bi], 4, batched, NULL);
            for (int i = 0; i < N; i++) {
                for (int t = 0; t < spec[i].mt; t++)
                    cr_expect_eq(batched[i][t], alone[i][t], "%s %s %s budget %ld: request %d token %d: batched %d, alone %d",
                                 model, sampled ? "sampled" : "greedy", pol ? "static" : "continuous", budgets[bi], i, t,
                                 batched[i][t], alone[i][t]);
                free(batched[i]);
            }
        }
    if (sampled) {  // the draws are real: two requests with the same prompt but other keys differ
        for (int i = 0; i < N && !differ_seen; i++)
            for (int t = 1; t < spec[i].mt; t++) differ_seen |= alone[i][t] != alone[i][t - 1];
        cr_expect(differ_seen, "sampled outputs look constant");
    }
    for (int i = 0; i < N; i++) free(alone[i]);
    cpu_model_free(&m);
    model_free(&w);
}

Test(step04, greedy_tokens_identical_alone_and_batched, .timeout = 300) {
    check_invariance(MODELS_DIR "/qwen3_qknorm_f32", 0);
    check_invariance(MODELS_DIR "/llama_gqa_hd_f32", 0);
}

Test(step04, sampled_tokens_identical_alone_and_batched, .timeout = 300) {
    check_invariance(MODELS_DIR "/qwen2_bias_f32", 1);
}

// ---------------------------------------------------------------- goldens through the batched path

typedef struct {
    int req, n;
    int *top5;  // (n, 5) of request req
} Top5Rec;

static void record_top5(void *ctx, const Request *r, const float *logits, int vocab) {
    Top5Rec *t = ctx;
    if (r->index != t->req) return;
    forward_topk(logits, vocab, 5, t->top5 + 5 * t->n++);
}

Test(step04, goldens_match_through_the_batched_cpu_path, .timeout = 300) {
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "goldens/greedy.json");
    cr_assert(n > 0, "no checkpoints with goldens under %s", MODELS_DIR);
    for (int c = 0; c < n; c++) {
        ModelWeights w;
        CpuModel m;
        load_cpu(ck[c].dir, &w, &m);
        Golden gold;
        golden_load(ck[c].dir, &gold);
        const int np = gold.np, ng = gold.ng;
        cr_assert(np > 0 && np <= 64 && ng > 0 && ng < 90);
        // the golden prompt as request 1, between two random mates, budget 7 (its prompt is chunked)
        Spec spec[3];
        Rng g;
        rng_seed(&g, 9);
        for (int i = 0; i < 3; i++) {
            spec[i].np = i == 1 ? np : 5 + 4 * i, spec[i].mt = i == 1 ? ng : 9;
            for (int k = 0; k < spec[i].np; k++)
                spec[i].ids[k] = i == 1 ? gold.prompt[k] : (int)(rng_u32(&g) % (unsigned)m.cfg.vocab);
            spec[i].sp = (SamplerParams){.greedy = 1, .top_p = 1};
            spec[i].arrival = 0;
        }
        Top5Rec rec = {.req = 1, .top5 = malloc((size_t)ng * 5 * sizeof(int))};
        OfflineOpts o = {.on_logits = record_top5, .ctx = &rec};
        int *out[3];
        run_specs(&m, spec, 3, POLICY_CONTINUOUS, 7, 3, out, &o);
        cr_assert_eq(rec.n, ng);
        for (int i = 0; i < ng; i++) cr_assert_eq(out[1][i], rec.top5[5 * i], "our token is our argmax");
        char what[400];
        snprintf(what, sizeof what, "%s batched cpu vs transformers", ck[c].name);
        const int agreed = vllm_expect(what, out[1], rec.top5, gold.gen, gold.top5, ng);
        fprintf(stderr, "[step04 goldens] %s batched cpu: %d of %d tokens identical to transformers\n", ck[c].name, agreed, ng);
        for (int i = 0; i < 3; i++) free(out[i]);
        free(rec.top5);
        golden_free(&gold);
        cpu_model_free(&m);
        model_free(&w);
    }
}

// ---------------------------------------------------------------- batch_bench: JSONL in, --json out

// Runs a shell command, returns its exit status and (up to 1 MiB of) its stdout (+stderr when merged).
static int run_cmd(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    char *buf = calloc(1, 1 << 20);
    const size_t n = fread(buf, 1, (1 << 20) - 1, p);
    buf[n] = 0;
    const int rc = pclose(p);
    *out = buf;
    return rc;
}

Test(step04, batch_bench_jsonl_round_trip, .timeout = 300) {
    const char *model = MODELS_DIR "/llama_mha_f32";
    ModelWeights w;
    CpuModel m;
    load_cpu(model, &w, &m);
    enum { N = 5 };
    Spec spec[N];
    Rng g;
    rng_seed(&g, 31);
    char path[] = "/tmp/step04_reqs_XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    for (int i = 0; i < N; i++) {
        spec[i].np = 3 + 5 * i, spec[i].mt = 9 - i;
        spec[i].sp = (SamplerParams){.greedy = i != 2, .temperature = i == 2 ? 0.8f : 0, .top_k = i == 2 ? 20 : 0, .top_p = 1,
                                     .seed = 3};
        spec[i].arrival = 0.01 * (i % 3);
        fprintf(f, "{\"prompt_ids\": [");
        for (int k = 0; k < spec[i].np; k++) {
            spec[i].ids[k] = (int)(rng_u32(&g) % (unsigned)m.cfg.vocab);
            fprintf(f, "%s%d", k ? ", " : "", spec[i].ids[k]);
        }
        fprintf(f, "], \"max_tokens\": %d, \"temperature\": %g, \"top_p\": 1, \"top_k\": %d, \"min_p\": 0, \"seed\": 3, "
                   "\"ignore_eos\": true, \"arrival_s\": %.2f}\n%s",
                spec[i].mt, spec[i].sp.temperature, spec[i].sp.top_k, spec[i].arrival, i == 1 ? "\n" : "");
    }
    fclose(f);
    int *want[N];
    run_specs(&m, spec, N, POLICY_CONTINUOUS, UNLIMITED, 4, want, NULL);
    char cmd[1024], *out;
    char tl[] = "/tmp/step04_tl_XXXXXX";
    const int tfd = mkstemp(tl);
    cr_assert(tfd >= 0);
    close(tfd);
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 %s/batch_bench --model %s --requests %s --json --device cpu --max-num-seqs 2 --max-num-batched-tokens 7 "
             "--timeline %s 2>/dev/null",
             BUILD_BIN_DIR, model, path, tl);
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed", cmd);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "not JSON: %s", je.text);
    const json_t *reqs = json_object_get(j, "requests"), *sum = json_object_get(j, "summary");
    cr_assert(json_is_array(reqs) && json_array_size(reqs) == N && json_is_object(sum));
    for (int i = 0; i < N; i++) {
        const json_t *r = json_array_get(reqs, i), *ids = json_object_get(r, "output_ids");
        cr_expect_eq(json_integer_value(json_object_get(r, "index")), i, "requests in input order");
        cr_expect_str_eq(json_string_value(json_object_get(r, "finish_reason")), "length");
        cr_expect(json_number_value(json_object_get(r, "ttft_ms")) > 0 &&
                  json_number_value(json_object_get(r, "e2e_ms")) >= json_number_value(json_object_get(r, "ttft_ms")));
        cr_assert_eq((int)json_array_size(ids), spec[i].mt);
        for (int t = 0; t < spec[i].mt; t++)
            cr_expect_eq(json_integer_value(json_array_get(ids, t)), want[i][t], "request %d token %d", i, t);
        free(want[i]);
    }
    long total = 0;
    for (int i = 0; i < N; i++) total += spec[i].mt;
    cr_expect_eq(json_integer_value(json_object_get(sum, "output_tokens")), total);
    cr_expect_str_eq(json_string_value(json_object_get(sum, "policy")), "continuous");
    cr_expect(json_number_value(json_object_get(sum, "output_tok_s")) > 0);
    json_decref(j);
    free(out);
    // the timeline: one row per request in input order, arrival <= first scheduled <= first token <= finish
    FILE *tf = fopen(tl, "r");
    cr_assert(tf);
    char line[512];
    cr_assert(fgets(line, sizeof line, tf) && !strncmp(line, "index,arrival_s,first_sched_s,first_token_s,finish_s", 52));
    for (int i = 0; i < N; i++) {
        int idx, np, no;
        double a, fs, ft, fin;
        char why[32];
        cr_assert(fgets(line, sizeof line, tf), "timeline: %d rows, expected %d", i, N);
        cr_assert_eq(sscanf(line, "%d,%lf,%lf,%lf,%lf,%d,%d,%31s", &idx, &a, &fs, &ft, &fin, &np, &no, why), 8, "%s", line);
        cr_expect(idx == i && np == spec[i].np && no == spec[i].mt && !strcmp(why, "length"), "timeline row %d: %s", i, line);
        cr_expect(fabs(a - spec[i].arrival) < 1e-9 && a <= fs && fs <= ft && ft <= fin, "timeline row %d: %s", i, line);
    }
    cr_expect(!fgets(line, sizeof line, tf), "timeline has extra rows");
    fclose(tf);
    remove(tl);
    remove(path);
    cpu_model_free(&m);
    model_free(&w);
}

// --trace nano (scaled down) through both policies: 256 requests, the same tokens, static needs
// more steps and idles slots, continuous none.
Test(step04, batch_bench_nano_trace_both_policies, .timeout = 300) {
    json_t *run[2];
    for (int pol = 0; pol < 2; pol++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd,
                 "OMP_NUM_THREADS=1 %s/batch_bench --preset tiny --trace nano --input-len 4:16 --output-len 4:16 --max-num-seqs 16 --device cpu "
                 "--policy %s --json 2>/dev/null",
                 BUILD_BIN_DIR, pol ? "static" : "continuous");
        cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed", cmd);
        json_error_t je;
        run[pol] = json_loads(out, 0, &je);
        cr_assert(run[pol], "not JSON: %s", je.text);
        free(out);
    }
    const json_t *rq[2] = {json_object_get(run[0], "requests"), json_object_get(run[1], "requests")};
    const json_t *sm[2] = {json_object_get(run[0], "summary"), json_object_get(run[1], "summary")};
    cr_assert(json_array_size(rq[0]) == 256 && json_array_size(rq[1]) == 256);
    for (int i = 0; i < 256; i++) {
        const json_t *a = json_object_get(json_array_get(rq[0], i), "output_ids"), *b = json_object_get(json_array_get(rq[1], i), "output_ids");
        const int n = (int)json_array_size(a);
        cr_expect(n >= 4 && n <= 16, "request %d: %d output tokens, outside 4..16", i, n);
        cr_expect(json_equal(a, b), "request %d: different tokens under the two policies", i);
    }
    const long steps_c = (long)json_integer_value(json_object_get(sm[0], "steps"));
    const long steps_s = (long)json_integer_value(json_object_get(sm[1], "steps"));
    cr_expect(steps_s > steps_c, "static %ld steps, continuous %ld", steps_s, steps_c);
    cr_expect_eq(json_real_value(json_object_get(sm[0], "idle_slot_share")), 0.0);
    cr_expect(json_real_value(json_object_get(sm[1], "idle_slot_share")) > 0.1);
    cr_expect_eq(json_integer_value(json_object_get(sm[1], "static_batches")), 16, "256 requests / 16 seats");
    cr_expect_eq(json_integer_value(json_object_get(sm[0], "output_tokens")), json_integer_value(json_object_get(sm[1], "output_tokens")));
    // rows computed: every token but each request's last (never fed back), + static's padding rows
    const json_int_t real = json_integer_value(json_object_get(sm[0], "prompt_tokens")) +
                            json_integer_value(json_object_get(sm[0], "output_tokens")) - 256;
    cr_expect_eq(json_integer_value(json_object_get(sm[0], "rows_computed")), real);
    cr_expect_eq(json_integer_value(json_object_get(sm[0], "padding_rows")), 0);
    const json_int_t pad_s = json_integer_value(json_object_get(sm[1], "padding_rows"));
    cr_expect(pad_s > 0 && json_integer_value(json_object_get(sm[1], "rows_computed")) == real + pad_s, "static: %lld padding rows",
              (long long)pad_s);
    json_decref(run[0]), json_decref(run[1]);
}

Test(step04, batch_bench_rejects_bad_jsonl_and_options) {
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"{\"prompt_ids\": [1, \"x\"], \"max_tokens\": 4}", "\"prompt_ids\": element 1"},
        {"{\"max_tokens\": 4}", "\"prompt_ids\": missing"},
        {"{\"prompt_ids\": [1, 2]}", "\"max_tokens\": missing"},
        {"{\"prompt_ids\": [1, 2], \"max_tokens\": 0}", "\"max_tokens\""},
        {"{\"prompt_ids\": [1, 2], \"max_tokens\": 2, \"top_p\": 2}", "\"top_p\""},
        {"{\"prompt_ids\": [1, 2], \"max_tokens\": 2, \"temprature\": 1}", "\"temprature\": unknown"},
        {"{\"prompt_ids\": [1, 99999], \"max_tokens\": 2}", "\"prompt_ids\""},
        {"{\"prompt_ids\": [1, 2], \"max_tokens\": 2, \"ignore_eos\": 1}", "\"ignore_eos\""},
        {"{\"prompt_ids\": [1, 2], \"max_tokens\": 2.5}", "\"max_tokens\""},
        {"not json", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[] = "/tmp/step04_bad_XXXXXX";
        const int fd = mkstemp(path);
        cr_assert(fd >= 0);
        FILE *f = fdopen(fd, "w");
        fprintf(f, "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 2}\n%s\n", bad[i].line);
        fclose(f);
        char cmd[1024], *out, want_line[600];
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/batch_bench --model %s/llama_mha_f32 --requests %s --device cpu 2>&1", BUILD_BIN_DIR,
                 MODELS_DIR, path);
        const int rc = run_cmd(cmd, &out);
        snprintf(want_line, sizeof want_line, "%s:2:", path);
        cr_expect_neq(rc, 0, "bad line %zu accepted", i);
        cr_expect(strstr(out, want_line) && strstr(out, bad[i].want), "bad line %zu: message \"%s\" lacks \"%s\" or \"%s\"",
                  i, out, want_line, bad[i].want);
        free(out);
        remove(path);
    }
    static const struct {
        const char *args, *want;
    } opts[] = {
        {"--max-num-seqs 12abc", "--max-num-seqs"},
        {"--max-num-seqs 0", "--max-num-seqs"},
        {"--max-num-batched-tokens -3", "--max-num-batched-tokens"},
        {"--input-len 9:2", "--input-len"},
        {"--output-len 5", "--output-len"},
        {"--max-model-len 1e3", "--max-model-len"},
        {"--policy dynamic", "--policy"},
        {"--num-requests 3x", "--num-requests"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/batch_bench --preset tiny --trace nano --device cpu %s 2>&1", BUILD_BIN_DIR, opts[i].args);
        const int rc = run_cmd(cmd, &out);
        cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "%s: exit status %d, expected 2 (a usage error)", opts[i].args, rc);
        cr_expect(strstr(out, opts[i].want) != NULL, "%s: message \"%s\"", opts[i].args, out);
        free(out);
    }
}

// A request that can never fit (prompt >= max_len, or a reservation beyond the KV budget) ends
// at once with an error and blocks nobody; a cancelled request ends at the next step boundary
// and frees its slot; a reservation capped by max_len ends with "length" at max_len tokens.
Test(step04, unfit_cancelled_and_capped_requests_end) {
    Request r[5] = {mk(0, 40, 4, 0), mk(1, 5, 30, 0), mk(2, 6, 4, 0), mk(3, 3, 3, 0), mk(4, 2, 2, 0)};
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 3, .max_num_batched_tokens = 64, .max_len = 32, .kv_tokens = 44};
    Scheduler s;
    char err[128];
    cr_assert_eq(sched_init(&s, &c, r, 5, err, sizeof err), 0);
    cr_expect(r[0].status == REQ_FINISHED && r[0].finish == FINISH_ERROR, "a 40-token prompt cannot fit 32 positions");
    SchedPlan p = {0};
    int tok[3] = {9, 9, 9}, steps = 0;
    while (!sched_done(&s)) {
        cr_assert(++steps < 100, "no end");
        if (steps == 2) r[4].cancel = 1;  // waiting (behind request 3, which waits for KV)
        if (steps == 3) r[2].cancel = 1;  // running
        sched_schedule(&s, steps, &p);
        cr_assert(p.n > 0, "step %d: nothing runnable", steps);
        for (int i = 0; i < p.n; i++) {
            cr_expect(!(p.req[i] == 2 && steps >= 3), "cancelled request 2 still scheduled");
            cr_expect(p.req[i] != 4, "cancelled request 4 scheduled");
        }
        cr_expect(s.kv.reserved <= c.kv_tokens);
        sched_update(&s, &p, tok, steps);
    }
    cr_expect_eq(r[1].finish, FINISH_LENGTH);
    cr_expect_eq(r[1].num_tokens, 32, "5 + 30 capped at max_len 32");
    cr_expect_eq(r[2].finish, FINISH_ERROR, "cancelled while running");
    cr_expect_eq(r[2].num_tokens - r[2].num_prompt, 2, "request 2 produced 2 tokens before its cancel took effect");
    cr_expect(r[3].finish == FINISH_LENGTH && r[3].num_tokens == 6);
    cr_expect_eq(r[3].first_sched_s, 3, "request 3 waits for KV (32 + 10 + 6 > 44) until request 2 is gone");
    cr_expect(r[4].finish == FINISH_ERROR && r[4].num_tokens == 2 && r[4].first_sched_s < 0, "cancelled while waiting");
    cr_expect_eq(s.kv.n_free, 3);
    cr_expect_eq(s.kv.reserved, 0);
    plan_free(&p);
    sched_free(&s);
    for (int i = 0; i < 5; i++) request_free(&r[i]);
}

// sched_add (requests that arrive while the loop runs): they join the waiting queue in arrival
// order (one with an earlier arrival than the last waiting one goes before it), one that can never
// fit finishes at once without blocking anybody, the table may move between adds, and the plans
// equal those of the same requests given to sched_init.
Test(step04, requests_added_while_running_join_in_arrival_order) {
    const double arr[6] = {0, 0, 1, 3, 2, 5};
    const int np[6] = {5, 40, 6, 3, 4, 2};  // request 1 (40 tokens) cannot fit 32 positions
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 2, .max_num_batched_tokens = 6, .max_len = 32,
                     .block_size = 4, .num_blocks = 20};
    Request all[6];
    for (int i = 0; i < 6; i++) all[i] = mk(i, np[i], 3, arr[i]);
    Scheduler ref, dyn;
    char err[128];
    cr_assert_eq(sched_init(&ref, &c, all, 6, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sched_init(&dyn, &c, NULL, 0, err, sizeof err), 0, "%s", err);
    Request *tab = NULL;
    int added = 0;
    SchedPlan pr = {0}, pd = {0};
    int tok[4] = {7, 7, 7, 7};
    for (int step = 0; step < 100 && !(sched_done(&ref) && added == 6); step++) {
        const double now = step * 0.5;
        // each handed in a second before it arrives, in id order: 4 (arrival 2) right after 3 (arrival 3)
        while (added < 6 && arr[added] - 1 <= now) {
            Request *t = realloc(tab, (size_t)(added + 1) * sizeof *t);  // a table that moves
            cr_assert(t);
            tab = t;
            tab[added] = mk(added, np[added], 3, arr[added]);
            cr_expect_eq(sched_add(&dyn, tab), added);
            if (added == 1) cr_expect(tab[1].status == REQ_FINISHED && tab[1].finish == FINISH_ERROR, "unfit: finished at once");
            added++;
        }
        sched_schedule(&ref, now, &pr);
        sched_schedule(&dyn, now, &pd);
        cr_assert_eq(pd.n, pr.n, "step %d: %d plan entries, sched_init's plan has %d", step, pd.n, pr.n);
        for (int i = 0; i < pr.n; i++)
            cr_expect(pd.req[i] == pr.req[i] && pd.n_new[i] == pr.n_new[i] && pd.start[i] == pr.start[i],
                      "step %d entry %d: request %d (%d new at %d) vs %d (%d at %d)", step, i, pd.req[i], pd.n_new[i],
                      pd.start[i], pr.req[i], pr.n_new[i], pr.start[i]);
        sched_update(&ref, &pr, tok, now);
        sched_update(&dyn, &pd, tok, now);
    }
    cr_expect(sched_done(&dyn) && added == 6);
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(tab[i].finish, all[i].finish, "request %d", i);
        cr_expect_eq(tab[i].num_tokens, all[i].num_tokens, "request %d", i);
        cr_expect_eq(tab[i].first_sched_s, all[i].first_sched_s, "request %d", i);
        request_free(&tab[i]), request_free(&all[i]);
    }
    cr_expect_lt(all[4].first_sched_s, all[3].first_sched_s, "request 4 (arrival 2) runs before request 3 (arrival 3)");
    free(tab);
    plan_free(&pr), plan_free(&pd);
    sched_free(&ref), sched_free(&dyn);
}

// ---------------------------------------------------------------- keyed Gumbel-max sampling

// The draw is exact sampling: the frequencies of 200k keyed draws match softmax(logits / T) within
// 5 standard errors per id, at two temperatures; the keyed sampler takes this path for plain
// temperature sampling and is a function of (seed, request, position) only.
Test(step04, gumbel_draws_follow_the_softmax) {
    static const float lg[9] = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 3.0f, 0.1f, -3.0f};
    const int V = 9, N = 200000;
    const float temps[2] = {0.6f, 1.3f};
    for (int ti = 0; ti < 2; ti++) {
        const float T = temps[ti];
        double p[9], z = 0;
        for (int i = 0; i < V; i++) z += p[i] = exp((double)lg[i] / T - 3.0 / T);
        long cnt[9] = {0};
        for (int n = 0; n < N; n++) cnt[sample_gumbel(lg, V, T, sample_key(7 + ti, n, 0))]++;
        for (int i = 0; i < V; i++) {
            const double q = p[i] / z, f = (double)cnt[i] / N, se = sqrt(q * (1 - q) / N);
            cr_expect(fabs(f - q) <= 5 * se + 1e-4, "T=%g id %d: frequency %.5f, softmax %.5f (se %.5f)", T, i, f, q, se);
        }
    }
    Sampler s;
    const SamplerParams plain = {.temperature = 0.8f, .top_p = 1, .seed = 99};
    sampler_init(&s, &plain, V);
    cr_assert(sample_is_plain(&plain));
    int differ = 0;
    for (int pos = 0; pos < 100; pos++) {
        const int a = sample_keyed(&s, &plain, 3, pos, lg), b = sample_keyed(&s, &plain, 3, pos, lg);
        cr_expect_eq(a, b, "position %d: two draws of one key differ", pos);
        cr_expect_eq(a, sample_gumbel(lg, V, 0.8f, sample_key(99, 3, pos)), "position %d: not the Gumbel-max draw", pos);
        differ += a != sample_keyed(&s, &plain, 4, pos, lg);
    }
    cr_expect_gt(differ, 20, "requests 3 and 4 drew the same token at %d of 100 positions", 100 - differ);
    const SamplerParams topk = {.temperature = 0.8f, .top_k = 3, .top_p = 1, .seed = 99};
    cr_expect(!sample_is_plain(&topk));
    sampler_free(&s);
}

// A prompt step of n sequences on the contiguous cache: sequence s has np[s] random ids at
// positions 0.., in slot s (rows s * L + j), and one logit row, its last.
static void prompt_batch(Batch *b, Rng *g, const int *np, int n, int L, int V) {
    b->n_seqs = n, b->n_tokens = 0, b->n_logits = n, b->cu_seqlens_q[0] = 0;
    for (int s = 0; s < n; s++) {
        for (int j = 0; j < np[s]; j++) {
            const int t = b->n_tokens++;
            b->token_ids[t] = (int)(rng_u32(g) % (unsigned)V), b->positions[t] = j, b->slot_mapping[t] = s * L + j;
        }
        b->cu_seqlens_q[s + 1] = b->n_tokens, b->seq_lens_k[s] = np[s], b->seq_slot[s] = s, b->logit_rows[s] = b->n_tokens - 1;
    }
}

// runner_forward_sampled on the CPU: the tokens are the argmax / Gumbel-max draws of exactly the
// logits runner_forward gives for the same batch.
Test(step04, forward_sampled_draws_from_the_runner_logits) {
    ModelWeights w;
    CpuModel m;
    load_cpu(MODELS_DIR "/qwen3_qknorm_f32", &w, &m);
    const int V = m.cfg.vocab, L = 16;
    char err[256];
    Runner *run = runner_new_cpu(&m, 3, L, 64, err, sizeof err);
    cr_assert(run, "%s", err);
    Batch b;
    batch_alloc(&b, 3, 64);
    Rng g;
    rng_seed(&g, 77);
    const int np[3] = {5, 9, 2};
    prompt_batch(&b, &g, np, 3, L, V);
    float *logits = malloc((size_t)3 * V * 4);
    cr_assert_eq(runner_forward(run, &b, logits, NULL), 0);
    const float temps[3] = {0, 0.7f, 1.5f};
    for (int trial = 0; trial < 20; trial++) {
        uint64_t keys[3];
        for (int s = 0; s < 3; s++) keys[s] = sample_key(5, s, trial);
        int tok[3];
        cr_assert_eq(runner_forward_sampled(run, &b, temps, keys, tok), 0);
        for (int s = 0; s < 3; s++) {
            const float *row = logits + (size_t)s * V;
            const int want = temps[s] > 0 ? sample_gumbel(row, V, temps[s], keys[s]) : argmax_f32(row, V);
            cr_expect_eq(tok[s], want, "trial %d row %d: %d, the draw from runner_forward's logits is %d", trial, s, tok[s], want);
        }
    }
    free(logits);
    batch_free(&b);
    runner_free(run);
    cpu_model_free(&m);
    model_free(&w);
}

// runner_launch on the CPU: what runner_launch_check refuses (bad slot, busy slot, temperature
// without keys, fix-ups after a plain forward, a fix-up row or source out of range), and a decode
// step whose rows take the previous launch's tokens: the same tokens as runner_forward with those
// tokens put in by hand.
Test(step04, runner_launch_refusals_and_fix_ups) {
    ModelWeights w;
    CpuModel m;
    load_cpu(MODELS_DIR "/qwen3_qknorm_f32", &w, &m);
    const int V = m.cfg.vocab, L = 16;
    char err[256];
    Runner *run = runner_new_cpu(&m, 3, L, 64, err, sizeof err);
    cr_assert(run, "%s", err);
    Batch b, d;
    batch_alloc(&b, 3, 64), batch_alloc(&d, 3, 64);
    Rng g;
    rng_seed(&g, 78);
    const int np[3] = {4, 7, 1};
    prompt_batch(&b, &g, np, 3, L, V);
    // the decode step after it: one row a sequence, its token (0 here) fetched by a fix-up
    d.n_seqs = 3, d.n_tokens = 3, d.n_logits = 3, d.cu_seqlens_q[0] = 0;
    for (int s = 0; s < 3; s++) {
        d.token_ids[s] = 0, d.positions[s] = np[s], d.slot_mapping[s] = s * L + np[s];
        d.cu_seqlens_q[s + 1] = s + 1, d.seq_lens_k[s] = np[s] + 1, d.seq_slot[s] = s, d.logit_rows[s] = s;
    }
    const int rows[3] = {0, 1, 2}, src[3] = {2, 0, 1}, bad_src[1] = {3}, bad_row[1] = {3};
    const float temps[3] = {0.8f, 0.8f, 0.8f};
    uint64_t keys[3] = {1, 2, 3};
    int first[3], next[3], want[3], am[3];
    cr_assert_eq(runner_forward(run, &b, NULL, am), 0);
    cr_expect_eq(runner_launch(run, &b, NULL, NULL, NULL, NULL, 0, 2), -1, "slot 2 taken");
    cr_expect_eq(runner_launch(run, &b, NULL, NULL, NULL, NULL, 0, -1), -1, "slot -1 taken");
    cr_expect_eq(runner_launch(run, &b, temps, NULL, NULL, NULL, 0, 0), -1, "temperature without keys taken");
    cr_expect_eq(runner_launch(run, &d, NULL, NULL, rows, src, 3, 0), -1, "fix-ups after a plain forward taken");
    cr_expect_eq(runner_collect(run, 0, first), -1, "an empty slot collected");
    cr_assert_eq(runner_launch(run, &b, temps, keys, NULL, NULL, 0, 0), 0);
    cr_expect_eq(runner_launch(run, &b, temps, keys, NULL, NULL, 0, 0), -1, "a busy slot taken");
    cr_expect_eq(runner_launch(run, &d, NULL, NULL, rows, bad_src, 1, 1), -1, "a source past the 3 drawn tokens taken");
    cr_expect_eq(runner_launch(run, &d, NULL, NULL, bad_row, src, 1, 1), -1, "a row past the batch taken");
    cr_assert_eq(runner_launch(run, &d, NULL, NULL, rows, src, 3, 1), 0);
    cr_assert_eq(runner_collect(run, 0, first), 0);
    cr_assert_eq(runner_collect(run, 1, next), 0);
    for (int s = 0; s < 3; s++) cr_assert(first[s] >= 0 && first[s] < V);
    for (int k = 0; k < 3; k++) d.token_ids[rows[k]] = first[src[k]];
    cr_assert_eq(runner_forward(run, &d, NULL, want), 0);
    for (int s = 0; s < 3; s++)
        cr_expect_eq(next[s], want[s], "row %d: %d after the fix-up, %d with the token put in by hand", s, next[s], want[s]);
    batch_free(&b), batch_free(&d);
    runner_free(run);
    cpu_model_free(&m);
    model_free(&w);
}
