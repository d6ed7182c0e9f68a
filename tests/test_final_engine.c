// test_final_engine.c — final/engine.h on the CPU runner: requests submitted from other threads
// while the engine runs give exactly the tokens of step04's offline loop over the same requests
// (the CPU path is exact and a token depends only on its request), and the streams, cancels,
// releases and metrics behave as engine.h says; `llm generate` through it follows the
// transformers goldens.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "final/engine.h"
#include "fs_util.h"
#include "golden_util.h"
#include "model.h"
#include "prompt.h"
#include "rng.h"
#include "step02_attention/forward.h"
#include "step04_batching/batch.h"
#include "step04_batching/offline.h"
#include "step04_batching/scheduler.h"

enum { N = 10, MAXP = 40, MAXT = 12, BS = 4, NB = 64, MAXLEN = 64 };

typedef struct {
    int np, mt, ignore_eos;
    int ids[MAXP];
    SamplerParams sp;
} Spec;

static void load_cpu(const char *dir, ModelWeights *w, CpuModel *m) {
    char err[512];
    cr_assert_eq(model_load(dir, w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cpu_model_load(w, m, err, sizeof err), 0, "%s", err);
}

// The paged pool of every run here: NB blocks of BS, 4 sequences, a small token budget so that
// prompts are chunked and decodes share steps with prefills.
static SchedConfig config(const CpuModel *m, long budget) {
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 4, .max_num_batched_tokens = budget, .max_len = MAXLEN,
                     .block_size = BS, .num_blocks = NB, .prefix_cache = 1};
    c.n_eos = 1, c.eos[0] = m->cfg.vocab - 1;
    return c;
}

static Runner *runner_for(const CpuModel *m, const SchedConfig *c) {
    char err[256];
    long rows = c->max_num_batched_tokens < (long)c->max_num_seqs * c->max_len ? c->max_num_batched_tokens
                                                                               : (long)c->max_num_seqs * c->max_len;
    Runner *r = runner_new_cpu_paged(m, c->num_blocks, c->block_size, c->max_len, (int)rows, err, sizeof err);
    cr_assert(r, "%s", err);
    return r;
}

static void make_specs(const CpuModel *m, Spec *spec) {
    Rng g;
    rng_seed(&g, 2024);
    const int V = m->cfg.vocab;
    for (int i = 0; i < N; i++) {
        Spec *s = &spec[i];
        s->np = i == 0 ? 20 : 1 + (int)(rng_u32(&g) % MAXP), s->mt = 1 + (int)(rng_u32(&g) % MAXT);
        s->ignore_eos = i % 3 != 0;  // some may stop early at the EOS id
        for (int j = 0; j < s->np; j++) s->ids[j] = (int)(rng_u32(&g) % (unsigned)(V - 1));
        if (i >= 2 && i % 2 == 0 && s->np > 9)  // a shared prefix of 9 tokens with request 0 (prefix cache hits)
            memcpy(s->ids, spec[0].ids, 9 * sizeof(int));
        const int sampled = i % 2 == 1;
        s->sp = (SamplerParams){.greedy = !sampled, .temperature = sampled ? 0.8f : 0, .top_k = sampled ? 30 : 0,
                                .top_p = sampled ? 0.9f : 1, .seed = 7 + (uint64_t)i};
    }
}

// The offline loop's outputs under scheduler config c: out[i] (mt ids, -1 past the end), fin[i];
// its preemptions into *preempted when not NULL.
static void offline_outputs_cfg(const CpuModel *m, const Spec *spec, SchedConfig c, int out[N][MAXT], FinishReason *fin,
                                long *preempted) {
    Request r[N];
    for (int i = 0; i < N; i++) request_init(&r[i], i, spec[i].ids, spec[i].np, spec[i].mt, &spec[i].sp, spec[i].ignore_eos, 0);
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, &c, r, N, err, sizeof err), 0, "%s", err);
    Runner *run = runner_for(m, &c);
    OfflineOpts o = {0};
    OfflineStats st;
    cr_assert_eq(offline_run(run, m->cfg.vocab, &s, &o, &st), 0);
    free(st.itl_ms);
    if (preempted) *preempted = s.st.preemptions;
    for (int i = 0; i < N; i++) {
        const int gen = r[i].num_tokens - r[i].num_prompt;
        for (int t = 0; t < MAXT; t++) out[i][t] = t < gen ? r[i].tokens[r[i].num_prompt + t] : -1;
        fin[i] = r[i].finish;
        request_free(&r[i]);
    }
    runner_free(run);
    sched_free(&s);
}

static void offline_outputs(const CpuModel *m, const Spec *spec, long budget, int out[N][MAXT], FinishReason *fin) {
    offline_outputs_cfg(m, spec, config(m, budget), out, fin, NULL);
}

typedef struct {
    Engine *e;
    long id;
    int got[MAXT + 1], n, reads;
    FinishReason fin;
} Reader;

static void *read_stream(void *arg) {  // small reads with a timeout: the stream arrives in pieces
    Reader *rd = arg;
    int seen = 0;
    rd->n = 0, rd->reads = 0, rd->fin = FINISH_NONE;
    while (rd->fin == FINISH_NONE) {
        int buf[2];
        const int k = engine_read(rd->e, rd->id, &seen, buf, 2, &rd->fin, 0.05);
        cr_assert_geq(k, 0);
        cr_assert_leq(rd->n + k, MAXT);
        memcpy(rd->got + rd->n, buf, (size_t)k * sizeof(int));
        rd->n += k, rd->reads++;
    }
    return NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

// Submits the N requests (ids in submission order), each read by its own thread; spread: a pause
// after every third, so that later ones join running batches.
static void submit_all(Engine *e, const Spec *spec, Reader *rd, pthread_t *th, int spread) {
    for (int i = 0; i < N; i++) {
        long id;
        while ((id = engine_submit(e, -1, spec[i].ids, spec[i].np, spec[i].mt, &spec[i].sp, spec[i].ignore_eos)) == -1)
            sleep_ms(1);  // the queue is full: the engine takes it in at its next step
        cr_assert_eq(id, i, "ids are given in submission order");
        rd[i].e = e, rd[i].id = id;
        cr_assert_eq(pthread_create(&th[i], NULL, read_stream, &rd[i]), 0);
        if (spread && i % 3 == 2) sleep_ms(5);
    }
}

// Joins the readers; every stream must be the offline loop's (want, want_fin). Returns the tokens read.
static long expect_offline_streams(Reader *rd, pthread_t *th, int want[N][MAXT], const FinishReason *want_fin, long budget) {
    long gen = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        int nwant = 0;
        while (nwant < MAXT && want[i][nwant] >= 0) nwant++;
        cr_expect_eq(rd[i].n, nwant, "budget %ld request %d: %d tokens streamed, the offline loop made %d", budget, i, rd[i].n,
                     nwant);
        for (int t = 0; t < rd[i].n && t < nwant; t++)
            cr_expect_eq(rd[i].got[t], want[i][t], "budget %ld request %d token %d: engine %d, offline %d", budget, i, t,
                         rd[i].got[t], want[i][t]);
        cr_expect_eq(rd[i].fin, want_fin[i], "budget %ld request %d: finish %s, offline %s", budget, i,
                     finish_reason_name(rd[i].fin), finish_reason_name(want_fin[i]));
        gen += rd[i].n;
    }
    return gen;
}

Test(final_engine, streams_equal_the_offline_loop, .timeout = 300) {
    ModelWeights w;
    CpuModel m;
    load_cpu(MODELS_DIR "/qwen3_qknorm_f32", &w, &m);
    Spec spec[N];
    make_specs(&m, spec);
    const long budgets[] = {7, 64, 7, 64};
    for (int bi = 0; bi < 4; bi++) {  // without, then with asynchronous scheduling (its steps with top-k rows run in order)
        int want[N][MAXT];
        FinishReason want_fin[N];
        offline_outputs(&m, spec, budgets[bi], want, want_fin);
        EngineConfig ec = {.sched = config(&m, budgets[bi]), .queue_cap = 4, .overlap = bi >= 2};
        Runner *run = runner_for(&m, &ec.sched);
        char err[256];
        Engine *e = engine_new(run, m.cfg.vocab, &ec, err, sizeof err);
        cr_assert(e, "%s", err);
        Reader rd[N];
        pthread_t th[N];
        submit_all(e, spec, rd, th, 1);  // arrivals spread out: later ones join running batches
        const long gen = expect_offline_streams(rd, th, want, want_fin, budgets[bi]);
        EngineMetrics mt;
        engine_metrics(e, &mt);
        long prompt = 0, by_reason = 0;
        for (int i = 0; i < N; i++) prompt += spec[i].np;
        for (int f = 0; f < 4; f++) by_reason += mt.finished[f];
        cr_expect_eq(mt.prompt_tokens, prompt);
        cr_expect_eq(mt.generation_tokens, gen);
        cr_expect_eq(by_reason, N);
        cr_expect_eq(mt.running, 0);
        cr_expect_eq(mt.waiting, 0);
        cr_expect_eq(mt.queued, 0);
        cr_expect(mt.kv_usage == 0.0, "KV in use with nothing running: %g", mt.kv_usage);
        cr_expect_gt(mt.prefix_hit_tokens, 0, "the shared prefixes were never found in the cache");
        for (int i = 0; i < N; i++) engine_release(e, i);
        int seen = 0, buf[1];
        FinishReason f;
        cr_expect_eq(engine_read(e, 0, &seen, buf, 1, &f, 0), -1, "a released id reads as unknown");
        engine_free(e);
        runner_free(run);
    }
    cpu_model_free(&m);
    model_free(&w);
}

Test(final_engine, cancel_refusals_and_unfit_requests, .timeout = 120) {
    ModelWeights w;
    CpuModel m;
    load_cpu(MODELS_DIR "/qwen3_qknorm_f32", &w, &m);
    for (int overlap = 0; overlap < 2; overlap++) {
    EngineConfig ec = {.sched = config(&m, 16), .overlap = overlap};
    Runner *run = runner_for(&m, &ec.sched);
    char err[256];
    Engine *e = engine_new(run, m.cfg.vocab, &ec, err, sizeof err);
    cr_assert(e, "%s", err);
    const SamplerParams greedy = {.greedy = 1, .top_p = 1};
    int prompt[MAXLEN];
    for (int i = 0; i < MAXLEN; i++) prompt[i] = i % (m.cfg.vocab - 1);
    // refused at once: bad arguments
    cr_expect_eq(engine_submit(e, -1, prompt, 0, 4, &greedy, 1), -3);
    cr_expect_eq(engine_submit(e, -1, prompt, 4, 0, &greedy, 1), -3);
    const int bad = m.cfg.vocab;
    cr_expect_eq(engine_submit(e, -1, &bad, 1, 4, &greedy, 1), -3);
    // never runnable: a prompt of max_len ids ends at once with an error, no tokens
    const long unfit = engine_submit(e, -1, prompt, MAXLEN, 4, &greedy, 1);
    cr_assert_geq(unfit, 0);
    int seen = 0, buf[64];
    FinishReason f;
    cr_expect_eq(engine_read(e, unfit, &seen, buf, 64, &f, -1), 0);
    cr_expect_eq(f, FINISH_ERROR);
    // a long request cancelled after its first tokens: it ends with an error and its blocks come back
    const long id = engine_submit(e, -1, prompt, 8, MAXLEN - 8, &greedy, 1);
    cr_assert_geq(id, 0);
    seen = 0;
    int n = 0;
    while (n < 2) {
        const int k = engine_read(e, id, &seen, buf + n, 64 - n, &f, -1);
        cr_assert_geq(k, 0);
        n += k;
    }
    EngineMetrics mt;
    engine_metrics(e, &mt);
    cr_expect_gt(mt.kv_usage, 0.0, "a running request holds blocks");
    engine_cancel(e, id);
    for (f = FINISH_NONE; f == FINISH_NONE;) cr_assert_geq(engine_read(e, id, &seen, buf, 64, &f, -1), 0);
    cr_expect_eq(f, FINISH_ERROR);
    cr_expect_lt(seen, MAXLEN - 8, "cancelled before its end");
    engine_metrics(e, &mt);
    cr_expect(mt.kv_usage == 0.0, "the cancelled request's blocks are still in use: %g", mt.kv_usage);
    cr_expect_eq(mt.finished[FINISH_ERROR], 2);
    cr_expect_eq(mt.running, 0);
    // unknown ids
    seen = 0;
    cr_expect_eq(engine_read(e, 1000, &seen, buf, 1, &f, 0), -1);
    engine_cancel(e, 1000);  // nothing happens
    // a request still running at engine_free runs to its end first (nothing is lost)
    const long last = engine_submit(e, -1, prompt + 3, 5, 6, &greedy, 1);
    cr_assert_geq(last, 0);
    engine_free(e);  // drains
    runner_free(run);
    }
    cpu_model_free(&m);
    model_free(&w);
}

// Asynchronous scheduling where it does the most: every row drawn on the device (greedy and
// temperature-only), EOS stops that land while the next step is already launched, a pool small
// enough to preempt, prompts chunked beside decodes, shared prefixes. The streams must be the
// offline loop's token for token (the CPU path is exact), and most steps must have overlapped.
Test(final_engine, async_scheduling_equals_the_offline_loop, .timeout = 300) {
    ModelWeights w;
    CpuModel m;
    load_cpu(MODELS_DIR "/qwen3_qknorm_f32", &w, &m);
    Spec spec[N];
    make_specs(&m, spec);
    for (int i = 0; i < N; i++) {  // no host-side sampling: top-k rows become temperature-only
        spec[i].sp.top_k = 0, spec[i].sp.top_p = 1;
        spec[i].ignore_eos = i % 2 == 0;  // greedy ones run to their length, the drawn ones may stop
    }
    // an EOS id the drawn requests actually produce after their first token: the run without EOS
    // ids says which
    SchedConfig c0 = config(&m, 64);
    c0.n_eos = 0;
    int free_run[N][MAXT];
    FinishReason fin0[N];
    offline_outputs_cfg(&m, spec, c0, free_run, fin0, NULL);
    int eos[4], n_eos = 0;  // ids the drawn requests make past their first token, one per request
    for (int i = 1; i < N && n_eos < 4; i += 2) {
        int t = 1 + i % 3;
        if (free_run[i][t + 1] < 0) t = 1;
        if (free_run[i][t + 1] < 0) continue;
        int dup = 0;
        for (int k = 0; k < n_eos; k++) dup |= eos[k] == free_run[i][t];
        if (!dup) eos[n_eos++] = free_run[i][t];
    }
    cr_assert_geq(n_eos, 2, "fewer than two drawn requests made 3 tokens");
    const long budgets[] = {7, 64};
    long engine_preempted = 0;
    for (int bi = 0; bi < 2; bi++) {
        SchedConfig c = config(&m, budgets[bi]);
        c.n_eos = n_eos;
        for (int k = 0; k < n_eos; k++) c.eos[k] = eos[k];
        c.num_blocks = 16;  // 15 blocks of 4 for 4 sequences of up to 52 positions: preemptions
        int want[N][MAXT];
        FinishReason want_fin[N];
        long preempted = 0;
        offline_outputs_cfg(&m, spec, c, want, want_fin, &preempted);
        int stops = 0;
        for (int i = 0; i < N; i++) stops += want_fin[i] == FINISH_STOP;
        cr_assert_gt(stops, 1, "budget %ld: %d requests stopped at the EOS ids", budgets[bi], stops);
        cr_assert_gt(preempted, 0, "budget %ld: the small pool preempted nobody", budgets[bi]);
        EngineConfig ec = {.sched = c, .queue_cap = N, .overlap = 1};  // all submitted at once: the offline loop's pressure
        Runner *run = runner_for(&m, &ec.sched);
        char err[256];
        Engine *e = engine_new(run, m.cfg.vocab, &ec, err, sizeof err);
        cr_assert(e, "%s", err);
        Reader rd[N];
        pthread_t th[N];
        submit_all(e, spec, rd, th, 0);
        const long gen = expect_offline_streams(rd, th, want, want_fin, budgets[bi]);
        for (int i = 0; i < N; i++) {
            double arr, sch, first, end;
            cr_assert_eq(engine_times(e, i, &arr, &sch, &first, &end), 0);
            if (rd[i].n > 0) cr_expect(first >= sch && end >= first, "request %d: times %g %g %g", i, sch, first, end);
        }
        EngineMetrics mt;
        engine_metrics(e, &mt);
        cr_expect_eq(mt.generation_tokens, gen);
        cr_expect_eq(mt.finished[FINISH_STOP], stops);
        cr_expect_eq(mt.running, 0);
        cr_expect(mt.kv_usage == 0.0, "KV in use with nothing running: %g", mt.kv_usage);
        engine_preempted += mt.preemptions;  // (how many depends on when each request was taken in)
        cr_expect_gt(2 * mt.overlapped_steps, mt.steps, "budget %ld: %ld of %ld steps overlapped", budgets[bi],
                     mt.overlapped_steps, mt.steps);
        fprintf(stderr, "[async] budget %ld: %ld of %ld steps launched before the previous one's tokens were back, "
                "%d EOS stops, %ld preemptions\n", budgets[bi], mt.overlapped_steps, mt.steps, stops, mt.preemptions);
        for (int i = 0; i < N; i++) engine_release(e, i);
        engine_free(e);
        runner_free(run);
    }
    cr_expect_gt(engine_preempted, 0, "no preemption through the engine at either budget");
    cpu_model_free(&m);
    model_free(&w);
}

// ---------------------------------------------------------------- llm generate

static int run_cmd(const char *cmd, char **out) {  // exit code, stdout (1 MiB at most) malloc'ed into *out
    *out = malloc(1 << 20);
    cr_assert(*out);
    return test_run_cmd(cmd, *out, 1 << 20);
}

typedef struct {
    int n, *top5;
} Top5;

static void record_top5(void *ctx, const Request *r, const float *logits, int vocab) {
    (void)r;
    Top5 *t = ctx;
    forward_topk(logits, vocab, 5, t->top5 + 5 * t->n++);
}

// json_array of ints -> ids (cap); returns the count
static int json_ids(const json_t *a, int *ids, int cap) {
    cr_assert(json_is_array(a));
    const int n = (int)json_array_size(a);
    cr_assert_leq(n, cap);
    for (int i = 0; i < n; i++) ids[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

// Every checkpoint with transformers goldens: `llm generate --ids <its golden prompt>` on the CPU
// gives exactly the tokens of step04's offline loop on the same request, and those follow
// transformers' by vLLM's rule (identical until a first difference where each side's token is in
// the other's top-5).
Test(final_engine, llm_generate_follows_the_goldens, .timeout = 300) {
    Ckpt ck[64];
    const int nck = ckpt_list(ck, 64, "goldens/greedy.json");
    cr_assert(nck > 0, "no checkpoints with goldens under %s", MODELS_DIR);
    for (int c = 0; c < nck; c++) {
        Golden gold;
        golden_load(ck[c].dir, &gold);
        const int np = gold.np, ng = gold.ng;
        char cmd[4096], *out;
        int o = snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/llm generate --model %s --device cpu --json --ignore-eos --max-tokens %d --ids ",
                         BUILD_BIN_DIR, ck[c].dir, ng);
        for (int i = 0; i < np; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, "%s%d", i ? "," : "", gold.prompt[i]);
        snprintf(cmd + o, sizeof cmd - (size_t)o, " 2>/dev/null");
        cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed", cmd);
        json_error_t je;
        json_t *j = json_loads(out, 0, &je);
        cr_assert(j, "%s: not JSON: %s", cmd, out);
        int got[256];
        const int n = json_ids(json_object_get(j, "output_ids"), got, 256);
        cr_expect_eq(n, ng);
        cr_expect_str_eq(json_string_value(json_object_get(j, "finish_reason")), "length");
        // the offline loop, its top-5 per step recorded
        ModelWeights w;
        CpuModel m;
        load_cpu(ck[c].dir, &w, &m);
        const SamplerParams greedy = {.greedy = 1, .top_p = 1};
        Request r;
        request_init(&r, 0, gold.prompt, np, ng, &greedy, 1, 0);
        SchedConfig sc = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 1, .max_num_batched_tokens = 2048, .max_len = np + ng,
                          .block_size = 16, .prefix_cache = 1};
        sc.num_blocks = (np + ng + 15) / 16 + 1;
        Scheduler s;
        char err[256];
        cr_assert_eq(sched_init(&s, &sc, &r, 1, err, sizeof err), 0, "%s", err);
        Runner *run = runner_for(&m, &sc);
        Top5 t5 = {0, malloc((size_t)ng * 5 * sizeof(int))};
        OfflineOpts oo = {.on_logits = record_top5, .ctx = &t5};
        OfflineStats st;
        cr_assert_eq(offline_run(run, m.cfg.vocab, &s, &oo, &st), 0);
        free(st.itl_ms);
        cr_assert_eq(r.num_tokens - np, ng);
        for (int i = 0; i < ng && i < n; i++)
            cr_expect_eq(got[i], r.tokens[np + i], "%s step %d: llm %d, offline loop %d", ck[c].name, i, got[i], r.tokens[np + i]);
        char what[400];
        snprintf(what, sizeof what, "%s llm generate (cpu) vs transformers", ck[c].name);
        const int agreed = vllm_expect(what, r.tokens + np, t5.top5, gold.gen, gold.top5, ng);
        fprintf(stderr, "[final goldens] %s llm generate: %d of %d tokens identical to transformers\n", ck[c].name, agreed, ng);
        free(t5.top5);
        runner_free(run);
        sched_free(&s);
        request_free(&r);
        cpu_model_free(&m);
        model_free(&w);
        json_decref(j);
        free(out);
        golden_free(&gold);
    }
}

// --prompt goes through the model's tokenizer; bad command lines are refused with a message.
Test(final_engine, llm_generate_prompt_and_bad_options, .timeout = 120) {
    const char *dir = MODELS_DIR "/llama_mha_bf16";  // has a tokenizer.json
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --json --max-tokens 5 --prompt 'The quick brown fox' 2>/dev/null",
             BUILD_BIN_DIR, dir);
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed", cmd);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "not JSON: %s", out);
    char path[1100];
    Tokenizer *tok = tokenizer_for_model(dir, 1, path, sizeof path);
    int nw = 0, *want = prompt_to_ids(tok, path, "The quick brown fox", &nw), got[64];
    const int n = json_ids(json_object_get(j, "prompt_ids"), got, 64);
    cr_expect_eq(n, nw);
    for (int i = 0; i < n && i < nw; i++) cr_expect_eq(got[i], want[i], "prompt id %d", i);
    int gen[16];
    const int ng = json_ids(json_object_get(j, "output_ids"), gen, 16);
    cr_expect(ng >= 1 && ng <= 5);
    char *text = tokenizer_decode(tok, gen, (size_t)ng, 1, NULL);
    cr_expect_str_eq(json_string_value(json_object_get(j, "text")), text, "text is the decoded output");
    free(text), free(want), free(out);
    tokenizer_free(tok);
    json_decref(j);
    // the streamed text is the same as the decoded ids (greedy: the same tokens)
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --ignore-eos --max-tokens 12 --prompt 'The quick brown fox' 2>/dev/null",
             BUILD_BIN_DIR, dir);
    char *streamed;
    cr_assert_eq(run_cmd(cmd, &streamed), 0);
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --ignore-eos --max-tokens 12 --json --prompt 'The quick brown fox' 2>/dev/null",
             BUILD_BIN_DIR, dir);
    cr_assert_eq(run_cmd(cmd, &out), 0);
    j = json_loads(out, 0, &je);
    cr_assert(j);
    char printable[4096];
    const char *t = json_string_value(json_object_get(j, "text"));
    text_printable(printable, sizeof printable, t, strlen(t));
    const size_t ls = strlen(streamed);
    cr_expect(ls >= 1 && streamed[ls - 1] == '\n');
    streamed[ls - 1] = 0;
    cr_expect_str_eq(streamed, printable, "streamed text vs the decoded output");
    json_decref(j);
    free(out), free(streamed);
    static const struct {
        const char *args, *msg;
    } bad[] = {
        {"", "usage: llm"},
        {"nosuch", "is not a command"},
        {"generate --model " MODELS_DIR "/llama_mha_f32", "need --model and one of --ids or --prompt"},
        {"generate --model " MODELS_DIR "/llama_mha_f32 --ids 1,2 --prompt hi", "need --model and one of"},
        {"generate --model " MODELS_DIR "/llama_mha_f32 --ids 1,2,3 --max-model-len 3", "no room to generate"},
        {"generate --model " MODELS_DIR "/llama_mha_f32 --ids 1,2 --greedy --temperature 0.5", "exclude each other"},
        {"generate --model " MODELS_DIR "/llama_mha_f32 --ids 1,2 --prefix-cache maybe", "is not on or off"},
        {"generate --model " MODELS_DIR "/llama_mha_f32 --ids 1,999999", "--ids"},
        {"generate --model /nonexistent --ids 1", "/nonexistent"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s/llm %s --device cpu 2>&1", BUILD_BIN_DIR, bad[i].args);
        if (!bad[i].args[0]) snprintf(cmd, sizeof cmd, "%s/llm 2>&1", BUILD_BIN_DIR);
        const int rc = run_cmd(cmd, &out);
        cr_expect_neq(rc, 0, "%s: exit 0", cmd);
        cr_expect(strstr(out, bad[i].msg) != NULL, "%s: message \"%s\"", cmd, out);
        free(out);
    }
}

// ---------------------------------------------------------------- llm bench

// The same JSONL workload through `llm bench` (the engine) and `batch_bench --kv paged` (step04's
// offline loop), on the CPU: every request's output ids and finish reason identical (greedy and
// sampled, staggered arrivals, EOS allowed, one request that can never fit), and the report's
// token counts equal.
Test(final_engine, llm_bench_equals_batch_bench, .timeout = 300) {
    char dir[64], path[128];
    test_mkdtemp(dir, sizeof dir, "final_bench");
    snprintf(path, sizeof path, "%s/reqs.jsonl", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    Rng g;
    rng_seed(&g, 31);
    enum { NR = 14 };
    for (int i = 0; i < NR; i++) {
        const int np = i == 5 ? 80 : 2 + (int)(rng_u32(&g) % 30), mt = 1 + (int)(rng_u32(&g) % 16);  // 5: longer than --max-model-len
        fprintf(f, "{\"prompt_ids\": [");
        for (int j = 0; j < np; j++) fprintf(f, "%s%u", j ? ", " : "", rng_u32(&g) % 400);
        fprintf(f, "], \"max_tokens\": %d, \"arrival_s\": %.3f, \"ignore_eos\": %s", mt, 0.004 * (i % 5), i % 3 ? "true" : "false");
        if (i % 2) fprintf(f, ", \"temperature\": 0.9, \"top_k\": 40, \"top_p\": 0.95, \"seed\": %d", 100 + i);
        fprintf(f, "}\n");
    }
    fclose(f);
    const char *common = "--model " MODELS_DIR "/qwen3_qknorm_f32 --device cpu --json --max-num-seqs 4 --max-num-batched-tokens 9 "
                         "--max-model-len 64 --block-size 4";
    char cmd[1024], *a, *b;
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/llm bench %s --requests %s 2>/dev/null", BUILD_BIN_DIR, common, path);
    cr_assert_eq(run_cmd(cmd, &a), 0, "%s failed", cmd);
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/batch_bench %s --kv paged --requests %s 2>/dev/null", BUILD_BIN_DIR, common, path);
    cr_assert_eq(run_cmd(cmd, &b), 0, "%s failed", cmd);
    json_error_t je;
    json_t *ja = json_loads(a, 0, &je), *jb = json_loads(b, 0, &je);
    cr_assert(ja && jb, "not JSON");
    const json_t *ra = json_object_get(ja, "requests"), *rb = json_object_get(jb, "requests");
    cr_assert_eq(json_array_size(ra), NR);
    cr_assert_eq(json_array_size(rb), NR);
    int errors = 0;
    for (size_t i = 0; i < NR; i++) {
        const json_t *x = json_array_get(ra, i), *y = json_array_get(rb, i);
        cr_expect(json_equal(json_object_get(x, "output_ids"), json_object_get(y, "output_ids")), "request %zu: output ids differ", i);
        const char *fx = json_string_value(json_object_get(x, "finish_reason")), *fy = json_string_value(json_object_get(y, "finish_reason"));
        cr_expect_str_eq(fx, fy, "request %zu: finish reason", i);
        errors += !strcmp(fx, "error");
    }
    cr_expect_eq(errors, 1, "request 5 cannot fit 64 positions");
    const json_t *sa = json_object_get(ja, "summary"), *sb = json_object_get(jb, "summary");
    cr_expect(json_equal(json_object_get(sa, "output_tokens"), json_object_get(sb, "output_tokens")));
    cr_expect(json_equal(json_object_get(sa, "prompt_tokens"), json_object_get(sb, "prompt_tokens")));
    cr_expect_str_eq(json_string_value(json_object_get(sa, "kv_layout")), "paged");
    // the same run without asynchronous scheduling (on by default): the same tokens, no step overlapped
    char *c;
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/llm bench %s --requests %s --async-scheduling off 2>/dev/null", BUILD_BIN_DIR, common,
             path);
    cr_assert_eq(run_cmd(cmd, &c), 0, "%s failed", cmd);
    json_t *jc = json_loads(c, 0, &je);
    cr_assert(jc, "not JSON");
    const json_t *rc_ = json_object_get(jc, "requests");
    cr_assert_eq(json_array_size(rc_), NR);
    for (size_t i = 0; i < NR; i++)
        cr_expect(json_equal(json_object_get(json_array_get(ra, i), "output_ids"), json_object_get(json_array_get(rc_, i), "output_ids")),
                  "request %zu: output ids differ with --async-scheduling off", i);
    const json_t *sc = json_object_get(jc, "summary");
    cr_expect_eq(json_integer_value(json_object_get(sc, "overlapped_steps")), 0);
    cr_expect_gt(json_integer_value(json_object_get(sa, "overlapped_steps")), 0, "no step overlapped by default");
    cr_expect_eq(json_integer_value(json_object_get(sb, "overlapped_steps")), 0, "batch_bench's loop overlapped");
    json_decref(ja), json_decref(jb), json_decref(jc);
    free(a), free(b), free(c);
    // the engine's loop refuses what only batch_bench's has
    static const char *bad[][2] = {{"--policy static", "--policy static is batch_bench's"},
                                   {"--steps-csv /tmp/x.csv", "--steps-csv is batch_bench's"},
                                   {"--async-scheduling maybe", "is not on or off"}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s/llm bench --preset tiny --trace nano --num-requests 2 --input-len 4:4 --output-len 2:2 --device cpu %s 2>&1",
                 BUILD_BIN_DIR, bad[i][0]);
        const int rc = run_cmd(cmd, &a);
        cr_expect_neq(rc, 0, "%s: exit 0", cmd);
        cr_expect(strstr(a, bad[i][1]) != NULL, "%s: %s", cmd, a);
        free(a);
    }
    test_rmtree(dir);
}

// ---------------------------------------------------------------- the prefill measurement

// A prompt-only run (max_tokens 1): `llm bench` reports no decode step and the prompt steps' time,
// and final/bench/prefill_flops.py counts the FLOPs the checkpoint's own tensors imply (2 per
// weight of the layers' seven projections per prompt token, the causal attention's pairs, the
// lm_head once a request); a run with decode steps is refused by it. workloads.py's `prefill`
// file is 1000 requests of 1024 ids and 1 token out.
Test(final_engine, prefill_run_and_its_flops, .timeout = 240) {
    char dir[64], reqs[128], out[128], reqs2[128], out2[128], cmd[2048], *o;
    test_mkdtemp(dir, sizeof dir, "final_prefill");
    snprintf(reqs, sizeof reqs, "%s/prefill.jsonl", dir), snprintf(out, sizeof out, "%s/bench.json", dir);
    snprintf(reqs2, sizeof reqs2, "%s/decode.jsonl", dir), snprintf(out2, sizeof out2, "%s/bench2.json", dir);
    static const int lens[] = {3, 17, 40, 9, 30, 25};
    enum { NQ = sizeof lens / sizeof lens[0] };
    Rng g;
    rng_seed(&g, 77);
    FILE *f = fopen(reqs, "w"), *f2 = fopen(reqs2, "w");
    cr_assert(f && f2);
    long tokens = 0;
    for (int i = 0; i < NQ; i++) {
        for (int k = 0; k < 2; k++) {
            FILE *ff = k ? f2 : f;
            fprintf(ff, "{\"prompt_ids\": [");
            for (int j = 0; j < lens[i]; j++) fprintf(ff, "%s%u", j ? ", " : "", rng_u32(&g) % 400);
            fprintf(ff, "], \"max_tokens\": %d, \"ignore_eos\": true}\n", k ? 3 : 1);
        }
        tokens += lens[i];
    }
    fclose(f), fclose(f2);
    const char *model = MODELS_DIR "/qwen3_qknorm_f32";
    const char *opts = "--device cpu --json --max-num-seqs 4 --max-num-batched-tokens 32 --max-model-len 64 --block-size 4";
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/llm bench --model %s %s --requests %s > %s 2>/dev/null", BUILD_BIN_DIR, model,
             opts, reqs, out);
    cr_assert_eq(run_cmd(cmd, &o), 0, "%s failed", cmd);
    free(o);
    json_error_t je;
    json_t *jb = json_load_file(out, 0, &je);
    cr_assert(jb, "%s: %s", out, je.text);
    const json_t *sum = json_object_get(jb, "summary");
    cr_expect_eq(json_integer_value(json_object_get(sum, "decode_steps")), 0, "a prompt-only run has no decode step");
    cr_expect_eq(json_integer_value(json_object_get(sum, "prompt_tokens")), tokens);
    cr_expect_eq(json_integer_value(json_object_get(sum, "output_tokens")), NQ);
    cr_expect_geq(json_integer_value(json_object_get(sum, "steps")), (tokens + 31) / 32, "32 tokens a step at most");
    const double pf = json_number_value(json_object_get(sum, "prefill_forward_s"));
    cr_expect_gt(pf, 0.0);
    cr_expect_leq(pf, json_number_value(json_object_get(sum, "duration_s")) * 1.001);
    json_decref(jb);

    // the FLOPs from the checkpoint's tensors, independently of the script's config.json arithmetic
    ModelWeights w;
    char err[512];
    cr_assert_eq(model_load(model, &w, err, sizeof err), 0, "%s", err);
    const ModelConfig *c = &w.cfg;
    double layer_w = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerTensors *t = &w.layers[l];
        const StTensor *p[] = {t->wq, t->wk, t->wv, t->wo, t->w_gate, t->w_up, t->w_down};
        for (int k = 0; k < 7; k++) layer_w += (double)p[k]->numel;
    }
    double attn = 0;
    for (int i = 0; i < NQ; i++) attn += 2.0 * c->n_layers * c->n_heads * c->head_dim * lens[i] * (lens[i] + 1.0);
    const double want = 2.0 * layer_w * tokens + attn + 2.0 * (double)w.lm_head->numel * NQ;
    model_free(&w);
    snprintf(cmd, sizeof cmd, "python3 final/bench/prefill_flops.py --config %s/config.json --requests %s --bench %s", model, reqs, out);
    cr_assert_eq(run_cmd(cmd, &o), 0, "%s failed: %s", cmd, o);
    json_t *jf = json_loads(o, 0, &je);
    cr_assert(jf, "not JSON: %s", o);
    free(o);
    const double total = json_number_value(json_object_get(jf, "flop_total"));
    cr_expect(fabs(total - want) <= 1e-9 * want, "prefill_flops.py counts %.0f FLOP, the tensors say %.0f", total, want);
    cr_expect_eq(json_integer_value(json_object_get(jf, "prompt_tokens")), tokens);
    cr_expect(json_is_null(json_object_get(jf, "tflops_device")), "no device time on the CPU");
    const double tf = json_number_value(json_object_get(jf, "tflops_forward"));
    cr_expect(fabs(tf - want / pf / 1e12) <= 1e-6 * tf, "tflops_forward %g, want %g", tf, want / pf / 1e12);
    json_decref(jf);

    // a run with decode steps is not a prefill measurement
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/llm bench --model %s %s --requests %s > %s 2>/dev/null && "
             "python3 final/bench/prefill_flops.py --config %s/config.json --requests %s --bench %s 2>&1",
             BUILD_BIN_DIR, model, opts, reqs2, out2, model, reqs2, out2);
    const int rc = run_cmd(cmd, &o);
    cr_expect_neq(rc, 0, "prefill_flops.py took a run with decode steps");
    cr_expect(strstr(o, "decode-only steps") != NULL, "%s", o);
    free(o);

    // workloads.py prefill: 1000 x (1024 ids, max_tokens 1)
    snprintf(cmd, sizeof cmd, "python3 final/bench/workloads.py prefill %s/pf.jsonl 2>&1 && python3 -c \"import json, sys; "
             "r = [json.loads(l) for l in open(sys.argv[1])]; "
             "print(len(r), min(len(x['prompt_ids']) for x in r), max(len(x['prompt_ids']) for x in r), "
             "sorted(set(x['max_tokens'] for x in r)))\" %s/pf.jsonl", dir, dir);
    cr_assert_eq(run_cmd(cmd, &o), 0, "%s", o);
    cr_expect(strstr(o, "1000 1024 1024 [1]") != NULL, "%s", o);
    free(o);
    test_rmtree(dir);
}

// One seat (--max-num-seqs 1) and a length that is not a whole number of blocks (20 + 43 = 63 positions
// in blocks of 16): the default pool holds that one request (it once had 3 usable blocks: an error).
Test(final_engine, one_seat_default_pool_fits_its_request, .timeout = 120) {
    char dir[64], reqs[128], out[128], cmd[1024], *o;
    test_mkdtemp(dir, sizeof dir, "final_seat");
    snprintf(reqs, sizeof reqs, "%s/one.jsonl", dir), snprintf(out, sizeof out, "%s/bench.json", dir);
    const char *model = MODELS_DIR "/qwen3_qknorm_f32";
    FILE *f = fopen(reqs, "w");
    cr_assert(f);
    fprintf(f, "{\"prompt_ids\": [");
    for (int j = 0; j < 20; j++) fprintf(f, "%s%d", j ? ", " : "", 5 + 7 * j);
    fprintf(f, "], \"max_tokens\": 43, \"ignore_eos\": true}\n");
    fclose(f);
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/%s --model %s --device cpu --json --max-num-seqs 1 --block-size 16 --requests %s 2>&1 > %s",
                 BUILD_BIN_DIR, k ? "batch_bench --kv paged" : "llm bench", model, reqs, out);
        cr_assert_eq(run_cmd(cmd, &o), 0, "%s: %s", cmd, o);
        cr_expect(strstr(o, "could not run") == NULL, "%s: %s", cmd, o);
        free(o);
        json_error_t je;
        json_t *jb = json_load_file(out, 0, &je);
        cr_assert(jb, "%s: %s", out, je.text);
        const json_t *r0 = json_array_get(json_object_get(jb, "requests"), 0);
        cr_expect_str_eq(json_string_value(json_object_get(r0, "finish_reason")), "length", "%s", cmd);
        cr_expect_eq(json_array_size(json_object_get(r0, "output_ids")), 43, "%s", cmd);
        json_decref(jb);
    }
    test_rmtree(dir);
}

// The benchmark scripts' own logic on the CPU: serve_table.py's table and ratios from two servers'
// result files; peer_bench.py and offline_pair.sh refusing what they do not take.
Test(final_engine, bench_scripts_table_and_refusals, .timeout = 60) {
    char dir[64], path[160], cmd[1024], *o;
    test_mkdtemp(dir, sizeof dir, "final_scripts");
    static const struct {
        const char *srv;
        int c;
        double tok_s, ttft99;
    } runs[] = {{"llm", 4, 300.0, 20.5}, {"vllm", 4, 200.0, 40.25}, {"llm", 1, 90.0, 5.0}};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s_serve_c%d.json", dir, runs[i].srv, runs[i].c);
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fprintf(f, "{\"num_prompts\": 8, \"completed\": 8, \"failed\": 0, \"output_throughput\": %g, \"median_ttft_ms\": 1.5, "
                   "\"p99_ttft_ms\": %g, \"p50_e2el_ms\": 7.25, \"p99_e2el_ms\": 9.0}\n", runs[i].tok_s, runs[i].ttft99);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "python3 final/bench/serve_table.py %s 2>&1", dir);
    cr_assert_eq(run_cmd(cmd, &o), 0, "%s: %s", cmd, o);
    cr_expect(strstr(o, "| 4 | 8 | llm | 300 | 1.50 / 20.50 | - / - | - / - | 7.25 / 9.00 | 8 | 0 |") != NULL, "%s", o);
    cr_expect(strstr(o, "| 4 | 8 | vllm | 200 | 1.50 / 40.25 |") != NULL, "%s", o);
    cr_expect(strstr(o, "output tok/s against vllm: C=4: llm 1.50x") != NULL, "%s", o);
    cr_expect(strstr(o, "C=1:") == NULL, "C=1 has no vllm run to divide by: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "python3 final/bench/serve_table.py %s/none 2>&1", dir);
    cr_expect_neq(run_cmd(cmd, &o), 0, "an empty directory gave a table: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "python3 final/bench/peer_bench.py --engine hf --model-dir %s --requests x.jsonl --out %s/o.json "
                              "--repeat 2 2>&1", dir, dir);
    cr_expect_neq(run_cmd(cmd, &o), 0, "peer_bench took --repeat with hf");
    cr_expect(strstr(o, "--repeat goes with --engine vllm --requests") != NULL, "%s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "python3 final/bench/peer_bench.py --engine hf --model-dir %s --requests x.jsonl --out %s/o.json "
                              "--keep-prefix-cache 2>&1", dir, dir);
    cr_expect_neq(run_cmd(cmd, &o), 0, "peer_bench took --keep-prefix-cache with hf");
    cr_expect(strstr(o, "--keep-prefix-cache goes with --engine vllm --requests") != NULL, "%s", o);
    free(o);
    // vLLM's timed calls: the prefix cache emptied before every call (none of a call's prompts cached
    // by the call before it), or kept: a stand-in for vLLM's LLM logs the order of the calls
    snprintf(path, sizeof path, "%s/timed.py", dir);
    FILE *py = fopen(path, "w");
    cr_assert(py);
    fputs("import sys, types\n"
          "sys.path.insert(0, 'final/bench')\n"
          "import peer_bench as p\n"
          "class LLM:\n"
          "    def __init__(self): self.log, self.cached = [], set()\n"
          "    def reset_prefix_cache(self): self.log.append('reset'); self.cached.clear(); return True\n"
          "    def generate(self, prompts, params, use_tqdm=False):\n"
          "        hits = sum(tuple(q['prompt_token_ids']) in self.cached for q in prompts)\n"
          "        self.cached |= {tuple(q['prompt_token_ids']) for q in prompts}\n"
          "        self.log.append('gen%d' % hits)\n"
          "        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[0] * 3)]) for _ in prompts]\n"
          "for reset in (True, False):\n"
          "    llm = LLM()\n"
          "    runs, resets = p.vllm_timed_calls(llm, [{'prompt_token_ids': [1, 2]}, {'prompt_token_ids': [3]}], None, 3, reset)\n"
          "    print(' '.join(llm.log), [n for _, n in runs], resets)\n", py);
    fclose(py);
    snprintf(cmd, sizeof cmd, "python3 %s 2>&1", path);
    cr_assert_eq(run_cmd(cmd, &o), 0, "%s: %s", cmd, o);
    cr_expect(strstr(o, "reset gen0 reset gen0 reset gen0 [6, 6, 6] [True, True, True]\n") != NULL, "with the reset: %s", o);
    cr_expect(strstr(o, "gen0 gen2 gen2 [6, 6, 6] []\n") != NULL, "kept: %s", o);
    free(o);
    // the transformers baseline's latency percentiles: linear interpolation between sorted values,
    // as llm bench's pctl (numpy's default): [1..4] at 0.5 is 2.5; 1..100 at 0.99 is 99.01
    snprintf(cmd, sizeof cmd, "python3 -c \"import sys; sys.path.insert(0, 'final/bench'); import peer_bench as p; "
                              "print('%%g %%g %%g' %% (p.percentile([4, 1, 3, 2], 0.5), p.percentile([10], 0.99), "
                              "p.percentile(list(range(100, 0, -1)), 0.99)))\" 2>&1");
    cr_assert_eq(run_cmd(cmd, &o), 0, "%s: %s", cmd, o);
    cr_expect(strncmp(o, "2.5 10 99.01", 12) == 0, "peer_bench.percentile: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "bash final/bench/offline_pair.sh %s %s/nofile.jsonl %s/op 0 2>&1", dir, dir, dir);
    cr_expect_eq(run_cmd(cmd, &o), 2, "offline_pair.sh with N = 0: %s", o);
    cr_expect(strstr(o, "N must be a positive integer") != NULL, "%s", o);
    free(o);
    test_rmtree(dir);
}
