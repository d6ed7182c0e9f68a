// engine.c — see engine.h.
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "step04_batching/gumbel.h"
#include "timer.h"

typedef struct {  // a submission the engine thread has not taken in yet
    int *prompt, n_prompt, max_tokens, ignore_eos, cancel, release, key, logprobs;
    SamplerParams sp;
} Pending;

typedef struct {  // a request's logprobs (engine_submit_lp), by generated token
    int n_top;    // top ids per token
    float *lp;    // (max_tokens) the sampled token's
    int *top_ids; // (max_tokens, n_top)
    float *top_lp;// (max_tokens, n_top)
} Logprobs;

struct Engine {
    Runner *runner;
    int vocab;
    EngineConfig cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;      // the engine thread waits here when idle: a submission, shutdown
    pthread_cond_t progress;  // readers wait here: a step's tokens applied, a request finished
    // the queue: ids next_in .. next_id - 1, a ring of queue_cap
    Pending *queue;
    long next_in, next_id;
    int shutdown;
    // the request table, by id (= scheduler index); grown by the engine thread under mu
    Request *reqs;
    int cap_reqs;
    char *release_when_done;  // (cap_reqs) the caller is done with it: its tokens are freed once it has finished
    char *released;           // (cap_reqs) ... and they have been
    char *counted;            // (cap_reqs) its finish is in the metrics
    double *last_tok;         // (cap_reqs) its last token's step end (for the inter-token gaps)
    int *ph_k;                // (cap_reqs) overlapped loop: while it is pending, the logit row of the step in flight
                              // that draws its token (runner_launch's fix-up source)
    Logprobs **lps;           // (cap_reqs) its logprobs, NULL when it asked for none
    double *itl;              // every inter-token gap (ms)
    long n_itl, cap_itl;
    double forward_s;         // inside runner_forward
    double device_s;          // the forwards' device time (CUDA events)
    long decode_steps;        // steps of one new row per sequence, and their share of the two above
    long overlapped;          // steps launched while the previous one was still on the device
    double decode_forward_s, decode_device_s;
    int *flagged;             // ids whose cancel flag was set since the last plan
    int n_flagged, cap_flagged;
    Scheduler sched;
    double t0;
    EngineMetrics m;
};

static double since(const Engine *e) { return now_sec() - e->t0; }

static void lp_free(Engine *e, int id) {
    Logprobs *l = e->lps[id];
    if (l) free(l->lp), free(l->top_ids), free(l->top_lp), free(l);
    e->lps[id] = NULL;
}

// Request id, if it has finished: counted in the metrics (once), its tokens freed if released (mu held).
static void note_finished(Engine *e, int id) {
    Request *r = &e->reqs[id];
    if (r->status != REQ_FINISHED || r->pending) return;  // (a finish is final once its last token is known)
    if (!e->counted[id]) e->m.finished[r->finish]++, e->counted[id] = 1;
    if (e->release_when_done[id] && !e->released[id]) request_free(r), e->released[id] = 1, lp_free(e, id);
}

// Request id's cancel flag was set (mu held): the next plan ends it, and only the flagged and the
// running requests need a look then (not the whole table, which grows with every request served).
static void flag_cancel(Engine *e, int id) {
    if (e->n_flagged == e->cap_flagged) {
        e->cap_flagged = e->cap_flagged ? 2 * e->cap_flagged : 16;
        e->flagged = realloc(e->flagged, (size_t)e->cap_flagged * sizeof(int));
        if (!e->flagged) die("engine: out of memory");
    }
    e->flagged[e->n_flagged++] = id;
}

// Takes the queue into the scheduler (mu held). Readers are woken: a request that can never run
// has finished already.
static void intake(Engine *e) {
    if (e->next_in < e->next_id) pthread_cond_broadcast(&e->progress);
    while (e->next_in < e->next_id) {
        Pending *p = &e->queue[e->next_in % e->cfg.queue_cap];
        const int id = e->sched.n_reqs;
        if (id >= e->cap_reqs) {
            const int cap = e->cap_reqs ? 2 * e->cap_reqs : 64;
            Request *r = realloc(e->reqs, (size_t)cap * sizeof *r);
            if (!r) die("engine: out of memory for %d requests", cap);
            e->reqs = r;
            char **flags[3] = {&e->release_when_done, &e->released, &e->counted};
            for (int f = 0; f < 3; f++) {
                char *a = realloc(*flags[f], (size_t)cap);
                if (!a) die("engine: out of memory for %d requests", cap);
                memset(a + e->cap_reqs, 0, (size_t)(cap - e->cap_reqs));
                *flags[f] = a;
            }
            double *lt = realloc(e->last_tok, (size_t)cap * sizeof(double));
            if (!lt) die("engine: out of memory for %d requests", cap);
            e->last_tok = lt;
            int *pk = realloc(e->ph_k, (size_t)cap * sizeof(int));
            if (!pk) die("engine: out of memory for %d requests", cap);
            e->ph_k = pk;
            Logprobs **lps = realloc(e->lps, (size_t)cap * sizeof *lps);
            if (!lps) die("engine: out of memory for %d requests", cap);
            memset(lps + e->cap_reqs, 0, (size_t)(cap - e->cap_reqs) * sizeof *lps);
            e->lps = lps;
            e->cap_reqs = cap;
        }
        Request *r = &e->reqs[id];
        request_init(r, p->key >= 0 ? p->key : id, p->prompt, p->n_prompt, p->max_tokens, &p->sp, p->ignore_eos, since(e));
        r->cancel = p->cancel;
        if (r->cancel) flag_cancel(e, id);
        e->release_when_done[id] = (char)p->release;
        if (p->logprobs >= 0) {
            Logprobs *l = xcalloc(1, sizeof *l);
            const size_t mt = (size_t)p->max_tokens, nt = (size_t)(p->logprobs > 0 ? p->logprobs : 1);
            l->n_top = p->logprobs;
            l->lp = xmalloc(mt * sizeof(float)), l->top_ids = xmalloc(mt * nt * sizeof(int)), l->top_lp = xmalloc(mt * nt * sizeof(float));
            e->lps[id] = l;
        }
        free(p->prompt);
        p->prompt = NULL;
        if (sched_add(&e->sched, e->reqs) != id) die("engine: request %d got another scheduler index", id);
        e->m.prompt_tokens += r->num_prompt;
        note_finished(e, id);
        e->next_in++;
    }
}


// log_softmax of one row of logits: token's value into *lp, the n most probable ids and their values
// into ids and lps (most probable first; the lower id first among equals).
static void row_logprobs(const float *x, int vocab, int token, int n, float *lp, int *ids, float *lps) {
    float mx = x[0];
    for (int v = 1; v < vocab; v++) mx = x[v] > mx ? x[v] : mx;
    double sum = 0;
    for (int v = 0; v < vocab; v++) sum += exp((double)(x[v] - mx));
    const double lse = mx + log(sum);
    *lp = (float)(x[token] - lse);
    int m = 0;  // an insertion into the n best so far
    for (int v = 0; v < vocab && n > 0; v++) {
        if (m == n && x[v] <= x[ids[m - 1]]) continue;
        int j = m < n ? m++ : n - 1;
        for (; j > 0 && x[ids[j - 1]] < x[v]; j--) ids[j] = ids[j - 1];
        ids[j] = v;
    }
    for (int j = 0; j < m; j++) lps[j] = (float)(x[ids[j]] - lse);
}

// One step of the loop and, while it is in flight (overlapped), what applying its tokens needs.
typedef struct {
    SchedPlan plan;
    int active;   // launched and applied with placeholders; its tokens not yet in place
    int slot;     // its runner_launch slot
    char *disc;   // (plan.n) dropped: its request ended (an EOS of the step before) after the launch
    int n_disc;   // entries dropped
    char *first;  // (plan.n) the token it samples is its request's first
    int cap;
    double fwd, dev;  // seconds in runner_launch + runner_collect; device seconds
    int decode;       // every sequence one new row
} Step;

static void step_fit(Step *t) {
    if (t->plan.n > t->cap) {
        t->cap = t->plan.cap > t->plan.n ? t->plan.cap : t->plan.n;
        free(t->disc), free(t->first);
        t->disc = xmalloc((size_t)t->cap), t->first = xmalloc((size_t)t->cap);
    }
    memset(t->disc, 0, (size_t)t->plan.n);
    memset(t->first, 0, (size_t)t->plan.n);
    t->n_disc = 0;
}

// dst = src without its dropped entries (dst's arrays grown as needed)
static void plan_keep(SchedPlan *dst, const SchedPlan *src, const char *disc) {
    if (dst->cap < src->n) {
        dst->cap = src->n;
        int **a[5] = {&dst->req, &dst->n_new, &dst->start, &dst->samples, &dst->pad};
        for (int k = 0; k < 5; k++) {
            free(*a[k]);
            *a[k] = xmalloc((size_t)dst->cap * sizeof(int));
        }
    }
    dst->n = 0, dst->n_tokens = 0, dst->n_pad = src->n_pad, dst->n_samples = 0;
    for (int i = 0; i < src->n; i++) {
        if (disc && disc[i]) continue;
        const int m = dst->n++;
        dst->req[m] = src->req[i], dst->n_new[m] = src->n_new[i], dst->start[m] = src->start[i];
        dst->samples[m] = src->samples[i], dst->pad[m] = src->pad[i];
        dst->n_tokens += src->n_new[i], dst->n_samples += src->samples[i];
    }
}

// The step's sampling rows, by logit row: temperature (0 = greedy) and key. Returns 1 when some
// row needs its logits on the host (top-k / top-p / min-p, logprobs); *any_temp: some row draws.
static int sampling_rows(const Engine *e, const SchedPlan *plan, float *temps, uint64_t *keys, int *any_temp) {
    int need_logits = 0;
    *any_temp = 0;
    for (int i = 0, k = 0; i < plan->n; i++) {
        if (!plan->samples[i]) continue;
        const Request *q = &e->sched.reqs[plan->req[i]];
        const int greedy = q->sp.greedy || q->sp.temperature <= 0;
        if (!greedy && !sample_is_plain(&q->sp)) need_logits = 1;
        if (e->lps[plan->req[i]]) need_logits = 1;
        *any_temp |= !greedy;
        temps[k] = greedy ? 0.0f : q->sp.temperature;
        keys[k] = sample_key(q->sp.seed, q->index, q->num_tokens);
        k++;
    }
    return need_logits;
}

static void push_itl(Engine *e, double ms) {
    if (e->n_itl == e->cap_itl) {
        e->cap_itl = e->cap_itl ? 2 * e->cap_itl : 1024;
        e->itl = realloc(e->itl, (size_t)e->cap_itl * sizeof(double));
        if (!e->itl) die("engine: out of memory");
    }
    e->itl[e->n_itl++] = ms;
}

static void sleep_s(double w) {
    if (w <= 0) return;
    struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
    nanosleep(&ts, NULL);
}

// Waits for step t's tokens (no lock held).
static void step_collect(Engine *e, Step *t, int *toks) {
    const double c0 = now_sec();
    if (runner_collect(e->runner, t->slot, toks) != 0) die("engine: the forward failed");
    t->fwd += now_sec() - c0;
    t->dev = runner_last_device_ms(e->runner) / 1e3;
}

// Step t's tokens into place (mu held): every pending token of it becomes known, an EOS ends its
// request (its entries in the next step, nx, already launched, are dropped), the times and metrics
// as the synchronous loop keeps them.
static void step_apply(Engine *e, Step *t, const int *toks, Step *nx) {
    Scheduler *s = &e->sched;
    const double end = since(e);
    e->m.steps++;
    e->forward_s += t->fwd, e->device_s += t->dev;
    if (t->decode) e->decode_steps++, e->decode_forward_s += t->fwd, e->decode_device_s += t->dev;
    for (int i = 0, k = 0; i < t->plan.n; i++) {
        if (!t->plan.samples[i]) continue;
        const int tok = toks[k++], id = t->plan.req[i];
        if (t->disc[i]) continue;
        Request *q = &s->reqs[id];
        q->tokens[q->num_tokens - 1] = tok;
        q->pending = 0;
        e->m.generation_tokens++;
        if (t->first[i]) q->first_token_s = end;
        if (sched_stops_at(&s->cfg, q, tok)) {
            if (q->status == REQ_FINISHED) {  // by length (or a cancel) meanwhile: the EOS came first
                q->finish = FINISH_STOP, q->finish_s = end;
            } else {
                sched_stop(s, id, FINISH_STOP, end);
                for (int j = 0; nx && j < nx->plan.n; j++)
                    if (nx->plan.req[j] == id) nx->disc[j] = 1, nx->n_disc++;
            }
        } else if (q->status == REQ_FINISHED && q->finish == FINISH_LENGTH) {
            q->finish_s = end;
        }
        if (q->num_tokens - q->num_prompt >= 2) push_itl(e, (end - e->last_tok[id]) * 1e3);
        e->last_tok[id] = end;
        note_finished(e, id);
    }
    t->active = 0;
    pthread_cond_broadcast(&e->progress);
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    Scheduler *s = &e->sched;
    const SchedConfig *c = &s->cfg;
    const int cap_seqs = c->max_num_seqs;
    long cap_rows = c->max_num_batched_tokens;
    if (cap_rows > (long)cap_seqs * c->max_len) cap_rows = (long)cap_seqs * c->max_len;
    Batch b;
    if (s->paged) batch_alloc_paged(&b, cap_seqs + 1, (int)cap_rows, c->block_size, (c->max_len + c->block_size - 1) / c->block_size);
    else batch_alloc(&b, cap_seqs + 1, (int)cap_rows);
    Step steps[2] = {{.slot = 0}, {.slot = 1}};
    int cur = 0;  // steps[cur] is planned next; steps[cur ^ 1] may be in flight
    SchedPlan spec = {0};  // a launched step's plan without its dropped entries
    float *logits = NULL;
    int *argmax = xmalloc((size_t)cap_seqs * sizeof(int)), *tokens = xmalloc((size_t)2 * cap_seqs * sizeof(int));
    int *before = xmalloc((size_t)2 * cap_seqs * sizeof(int)), *run0 = xmalloc((size_t)cap_seqs * sizeof(int));
    int *fix_rows = xmalloc((size_t)(cap_seqs + 1) * sizeof(int)), *fix_src = xmalloc((size_t)(cap_seqs + 1) * sizeof(int));
    int *ftoks = xmalloc((size_t)(cap_seqs + 1) * sizeof(int));
    float *temps = xmalloc((size_t)(cap_seqs + 1) * sizeof(float));
    uint64_t *keys = xmalloc((size_t)(cap_seqs + 1) * sizeof(uint64_t));
    float *lp_tok = xmalloc((size_t)cap_seqs * sizeof(float));  // the step's logprobs: (sampled rows), (rows, max)
    int *lp_ids = xmalloc((size_t)cap_seqs * ENGINE_MAX_LOGPROBS * sizeof(int));
    float *lp_top = xmalloc((size_t)cap_seqs * ENGINE_MAX_LOGPROBS * sizeof(float));
    int *ph = xmalloc((size_t)(cap_seqs + 1) * sizeof(int));  // the placeholders of a launched step
    for (int i = 0; i <= cap_seqs; i++) ph[i] = -1;
    Sampler sampler;
    const SamplerParams sp0 = {.greedy = 1, .temperature = 0, .top_p = 1};
    sampler_init(&sampler, &sp0, e->vocab);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        intake(e);
        Step *P = &steps[cur], *F = &steps[cur ^ 1];
        if (e->shutdown && sched_done(s) && !F->active && e->next_in == e->next_id) break;
        // a plan ends the cancelled requests (waiting or running) and a running one that can never
        // get its blocks: those are the ones to look at when it has finished some
        const int finished0 = s->n_finished, nrun0 = s->n_running;
        memcpy(run0, s->running, (size_t)nrun0 * sizeof(int));
        sched_schedule(s, since(e), &P->plan);
        if (s->n_finished != finished0) {
            for (int k = 0; k < nrun0; k++) note_finished(e, run0[k]);
            for (int k = 0; k < e->n_flagged; k++) note_finished(e, e->flagged[k]);
            pthread_cond_broadcast(&e->progress);
        }
        e->n_flagged = 0;
        if (P->plan.n == 0) {
            if (F->active) {  // nothing more to launch now: F's tokens first
                pthread_mutex_unlock(&e->mu);
                step_collect(e, F, ftoks);
                pthread_mutex_lock(&e->mu);
                step_apply(e, F, ftoks, NULL);
                continue;
            }
            // idle: everything taken in has finished (arrival = intake, so a waiting one is admitted)
            if (!sched_done(s))
                die("engine: %d running and %d waiting requests, none scheduled", s->n_running, sched_num_waiting(s));
            if (e->next_in == e->next_id && !e->shutdown) pthread_cond_wait(&e->work, &e->mu);  // a submission or shutdown
            continue;
        }
        step_fit(P);
        // greedy and temperature-only rows are drawn on the device (runner_forward_sampled: only
        // the tokens come back); a row with top-k / top-p / min-p needs the logits on the host
        // (a row that asks for logprobs needs them too: the log_softmax is taken here)
        int any_temp;
        int need_logits = sampling_rows(e, &P->plan, temps, keys, &any_temp);
        const int overlap = e->cfg.overlap && !need_logits;
        if (!overlap && F->active) {  // this step's tokens come to the host: F's must be in place first
            pthread_mutex_unlock(&e->mu);
            step_collect(e, F, ftoks);
            pthread_mutex_lock(&e->mu);
            step_apply(e, F, ftoks, P);
            if (P->n_disc) {  // without the requests F's EOS tokens ended
                plan_keep(&spec, &P->plan, P->disc);
                SchedPlan tmp = P->plan;
                P->plan = spec, spec = tmp;
                if (P->plan.n == 0) continue;
                step_fit(P);
                need_logits = sampling_rows(e, &P->plan, temps, keys, &any_temp);
            }
        }
        pthread_mutex_unlock(&e->mu);
        // ---- the step, without the lock: only this thread writes the request table and the scheduler
        if (s->paged) batch_from_plan_paged(&b, &P->plan, s->reqs, &s->blocks);
        else batch_from_plan(&b, &P->plan, s->reqs, c->max_len);
        if (overlap) {
            // decode rows whose input is F's token, still on the device: the launch fetches it there
            int n_fix = 0;
            for (int i = 0; F->active && i < P->plan.n; i++) {
                const Request *q = &s->reqs[P->plan.req[i]];
                const int ph = q->num_tokens - 1, off = ph - P->plan.start[i];
                if (!q->pending || off < 0 || off >= P->plan.n_new[i]) continue;
                const int row = b.cu_seqlens_q[i] + off;
                b.token_ids[row] = 0;
                fix_rows[n_fix] = row, fix_src[n_fix] = e->ph_k[P->plan.req[i]], n_fix++;
            }
            const double f0 = now_sec();
            if (runner_launch(e->runner, &b, any_temp ? temps : NULL, any_temp ? keys : NULL, fix_rows, fix_src, n_fix, P->slot) != 0)
                die("engine: the forward failed");
            P->fwd = now_sec() - f0, P->dev = 0;
            P->decode = b.n_tokens == b.n_seqs;
            sleep_s(e->cfg.min_step_s - P->fwd);
            const int was_active = F->active;
            if (F->active) step_collect(e, F, ftoks);
            pthread_mutex_lock(&e->mu);
            if (was_active) step_apply(e, F, ftoks, P), e->overlapped++;
            // P applied now with placeholders: its rows computed, one more (pending) token per
            // sampled entry, finishes by length; its tokens are put in place when it is collected
            const double now = since(e);
            for (int i = 0; i < P->plan.n; i++)
                if (P->plan.samples[i] && !P->disc[i]) P->first[i] = s->reqs[P->plan.req[i]].first_token_s < 0;
            if (P->n_disc) plan_keep(&spec, &P->plan, P->disc);  // (a copy only when an entry was dropped)
            sched_update(s, P->n_disc ? &spec : &P->plan, ph, now);
            for (int i = 0, k = 0; i < P->plan.n; i++) {
                if (!P->plan.samples[i]) continue;
                const int id = P->plan.req[i];
                if (!P->disc[i]) s->reqs[id].pending = 1, e->ph_k[id] = k;
                k++;
            }
            P->active = 1;
            cur ^= 1;
            continue;
        }
        const int on_device = any_temp && !need_logits;
        if (need_logits && !logits) logits = xmalloc((size_t)cap_seqs * e->vocab * sizeof(float));
        const double f0 = now_sec();
        const int rc = on_device ? runner_forward_sampled(e->runner, &b, temps, keys, argmax)
                                 : runner_forward(e->runner, &b, need_logits ? logits : NULL, argmax);
        if (rc != 0) die("engine: the forward failed");
        const double fwd = now_sec() - f0;
        sleep_s(e->cfg.min_step_s - fwd);
        const SchedPlan *plan = &P->plan;
        for (int i = 0, k = 0; i < plan->n; i++) {
            before[i] = s->reqs[plan->req[i]].num_tokens;
            if (!plan->samples[i]) continue;
            const Request *q = &s->reqs[plan->req[i]];
            if (on_device || q->sp.greedy || q->sp.temperature <= 0) tokens[i] = argmax[k];
            else tokens[i] = sample_keyed(&sampler, &q->sp, q->index, q->num_tokens, logits + (size_t)k * e->vocab);
            if (e->lps[plan->req[i]])
                row_logprobs(logits + (size_t)k * e->vocab, e->vocab, tokens[i], e->lps[plan->req[i]]->n_top, &lp_tok[k],
                             lp_ids + (size_t)k * ENGINE_MAX_LOGPROBS, lp_top + (size_t)k * ENGINE_MAX_LOGPROBS);
            k++;
        }
        pthread_mutex_lock(&e->mu);
        const double end = since(e);
        sched_update(s, plan, tokens, end);
        e->m.steps++;
        e->forward_s += fwd;
        const double dev = runner_last_device_ms(e->runner) / 1e3;
        e->device_s += dev;
        if (b.n_tokens == b.n_seqs) e->decode_steps++, e->decode_forward_s += fwd, e->decode_device_s += dev;
        for (int i = 0, k = 0; i < plan->n; i++) {
            const int id = plan->req[i];
            const Request *q = &s->reqs[id];
            const int grew = q->num_tokens - before[i];
            e->m.generation_tokens += grew;
            if (plan->samples[i]) {
                Logprobs *l = e->lps[id];
                if (l && grew > 0) {  // the token went to generated position before[i] - num_prompt
                    const int g = before[i] - q->num_prompt;
                    l->lp[g] = lp_tok[k];
                    memcpy(l->top_ids + (size_t)g * l->n_top, lp_ids + (size_t)k * ENGINE_MAX_LOGPROBS, (size_t)l->n_top * sizeof(int));
                    memcpy(l->top_lp + (size_t)g * l->n_top, lp_top + (size_t)k * ENGINE_MAX_LOGPROBS, (size_t)l->n_top * sizeof(float));
                }
                k++;
            }
            if (grew > 0 && q->num_tokens - q->num_prompt >= 2) push_itl(e, (end - e->last_tok[id]) * 1e3);  // the gap since its previous token
            if (grew > 0) e->last_tok[id] = end;
            note_finished(e, id);
        }
        pthread_cond_broadcast(&e->progress);
    }
    pthread_cond_broadcast(&e->progress);
    pthread_mutex_unlock(&e->mu);
    sampler_free(&sampler);
    free(logits), free(argmax), free(tokens), free(before), free(run0), free(temps), free(keys);
    free(fix_rows), free(fix_src), free(ftoks), free(ph);
    free(lp_tok), free(lp_ids), free(lp_top);
    for (int k = 0; k < 2; k++) plan_free(&steps[k].plan), free(steps[k].disc), free(steps[k].first);
    plan_free(&spec);
    batch_free(&b);
    return NULL;
}

Engine *engine_new(Runner *r, int vocab, const EngineConfig *c, char *err, int errlen) {
    if (!r || vocab < 1) {
        errf(err, errlen, "engine: no runner or vocab %d", vocab);
        return NULL;
    }
    if (c->sched.policy != POLICY_CONTINUOUS) {
        errf(err, errlen, "engine: continuous batching only (requests arrive while it runs)");
        return NULL;
    }
    Engine *e = xcalloc(1, sizeof *e);
    e->runner = r, e->vocab = vocab, e->cfg = *c;
    if (e->cfg.queue_cap <= 0) e->cfg.queue_cap = 256;
    if (sched_init(&e->sched, &e->cfg.sched, NULL, 0, err, errlen) != 0) {
        free(e);
        return NULL;
    }
    e->queue = xcalloc((size_t)e->cfg.queue_cap, sizeof(Pending));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->progress, NULL);
    e->t0 = now_sec();
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        errf(err, errlen, "engine: pthread_create: %s", strerror(errno));
        sched_free(&e->sched);
        free(e->queue), free(e);
        return NULL;
    }
    return e;
}

void engine_free(Engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->shutdown = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    for (int i = 0; i < e->sched.n_reqs; i++) {
        if (!e->released[i]) request_free(&e->reqs[i]);
        lp_free(e, i);
    }
    sched_free(&e->sched);
    for (long i = e->next_in; i < e->next_id; i++) free(e->queue[i % e->cfg.queue_cap].prompt);
    free(e->reqs), free(e->released), free(e->release_when_done), free(e->counted), free(e->last_tok), free(e->ph_k), free(e->lps), free(e->itl), free(e->flagged), free(e->queue);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->progress);
    free(e);
}

long engine_submit(Engine *e, int key, const int *prompt, int n_prompt, int max_tokens, const SamplerParams *sp,
                   int ignore_eos) {
    return engine_submit_lp(e, key, prompt, n_prompt, max_tokens, sp, ignore_eos, -1);
}

long engine_submit_lp(Engine *e, int key, const int *prompt, int n_prompt, int max_tokens, const SamplerParams *sp,
                      int ignore_eos, int logprobs) {
    if (!prompt || n_prompt < 1 || max_tokens < 1 || !sp || logprobs > ENGINE_MAX_LOGPROBS) return -3;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->vocab) return -3;
    pthread_mutex_lock(&e->mu);
    long id;
    if (e->shutdown) id = -2;
    else if (e->next_id - e->next_in >= e->cfg.queue_cap) id = -1;
    else {
        id = e->next_id++;
        Pending *p = &e->queue[id % e->cfg.queue_cap];
        p->prompt = xmalloc((size_t)n_prompt * sizeof(int));
        memcpy(p->prompt, prompt, (size_t)n_prompt * sizeof(int));
        p->n_prompt = n_prompt, p->max_tokens = max_tokens, p->ignore_eos = ignore_eos != 0, p->cancel = 0, p->release = 0, p->key = key;
        p->logprobs = logprobs < 0 ? -1 : logprobs;
        p->sp = *sp;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
    return id;
}

int engine_read(Engine *e, long id, int *seen, int *out, int cap, FinishReason *finish, double timeout_s) {
    return engine_read_lp(e, id, seen, out, NULL, NULL, NULL, cap, finish, timeout_s);
}

int engine_read_lp(Engine *e, long id, int *seen, int *out, float *lp, int *top_ids, float *top_lp, int cap,
                   FinishReason *finish, double timeout_s) {
    pthread_mutex_lock(&e->mu);
    if (id < 0 || id >= e->next_id || (id < e->sched.n_reqs && e->release_when_done[id])) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s >= 0) {
        const double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + timeout_s;
        until.tv_sec = (time_t)t, until.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    }
    int n = 0;
    *finish = FINISH_NONE;
    for (;;) {
        if (id < e->sched.n_reqs && e->release_when_done[id]) {  // released (while this reader waited)
            n = -1;
            break;
        }
        if (id < e->sched.n_reqs) {
            const Request *r = &e->reqs[id];
            const int gen = r->num_tokens - r->num_prompt - r->pending;  // a pending token is not known yet
            const int done = r->status == REQ_FINISHED && !r->pending;
            if (gen > *seen || done) {
                n = gen - *seen;
                if (n > cap) n = cap;
                if (n > 0) memcpy(out, r->tokens + r->num_prompt + *seen, (size_t)n * sizeof(int));
                const Logprobs *l = e->lps[id];
                if (n > 0 && l) {
                    const size_t nt = (size_t)l->n_top;
                    if (lp) memcpy(lp, l->lp + *seen, (size_t)n * sizeof(float));
                    if (top_ids) memcpy(top_ids, l->top_ids + (size_t)*seen * nt, (size_t)n * nt * sizeof(int));
                    if (top_lp) memcpy(top_lp, l->top_lp + (size_t)*seen * nt, (size_t)n * nt * sizeof(float));
                }
                *seen += n;
                if (done && *seen == gen) *finish = r->finish;
                break;
            }
        }
        if (timeout_s < 0) pthread_cond_wait(&e->progress, &e->mu);
        else if (pthread_cond_timedwait(&e->progress, &e->mu, &until) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&e->mu);
    return n;
}

void engine_cancel(Engine *e, long id) {
    pthread_mutex_lock(&e->mu);
    if (id >= 0 && id < e->sched.n_reqs) {
        if (e->reqs[id].status != REQ_FINISHED) e->reqs[id].cancel = 1, flag_cancel(e, (int)id);
    } else if (id >= e->next_in && id < e->next_id) {
        e->queue[id % e->cfg.queue_cap].cancel = 1;
    }
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void engine_release(Engine *e, long id) {
    pthread_mutex_lock(&e->mu);
    if (id >= 0 && id < e->sched.n_reqs) {
        e->release_when_done[id] = 1;
        if (e->reqs[id].status != REQ_FINISHED) e->reqs[id].cancel = 1, flag_cancel(e, (int)id);
        note_finished(e, (int)id);
    } else if (id >= e->next_in && id < e->next_id) {  // not taken in yet: cancelled there, released when it ends
        e->queue[id % e->cfg.queue_cap].cancel = 1;
        e->queue[id % e->cfg.queue_cap].release = 1;
    }
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

int engine_times(Engine *e, long id, double *arrival_s, double *first_sched_s, double *first_token_s, double *finish_s) {
    pthread_mutex_lock(&e->mu);
    int rc = -1;
    if (id >= 0 && id < e->sched.n_reqs && !e->release_when_done[id]) {
        const Request *r = &e->reqs[id];
        *arrival_s = r->arrival_s, *first_sched_s = r->first_sched_s, *first_token_s = r->first_token_s, *finish_s = r->finish_s;
        rc = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void engine_metrics(Engine *e, EngineMetrics *m) {
    pthread_mutex_lock(&e->mu);
    const Scheduler *s = &e->sched;
    *m = e->m;
    m->running = s->n_running;
    m->waiting = sched_num_waiting(s);
    m->queued = (int)(e->next_id - e->next_in);
    if (s->paged) {
        const int pool = s->cfg.num_blocks - 1;
        m->kv_usage = pool > 0 ? (double)(pool - kvb_num_free(&s->blocks)) / pool : 0;
    } else {
        m->kv_usage = s->kv.budget > 0 ? (double)s->kv.reserved / (double)s->kv.budget : 0;
    }
    m->preemptions = s->st.preemptions;
    m->prefix_query_tokens = s->st.prefix_query_tokens;
    m->prefix_hit_tokens = s->st.prefix_hit_tokens;
    m->peak_running = s->st.peak_running;
    m->overlapped_steps = e->overlapped;
    pthread_mutex_unlock(&e->mu);
}

void engine_sched_stats(Engine *e, SchedStats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->sched.st;
    pthread_mutex_unlock(&e->mu);
}

void engine_itl(Engine *e, double **itl_ms, long *n, double *forward_s, double *device_s) {
    pthread_mutex_lock(&e->mu);
    *n = e->n_itl;
    *itl_ms = xmalloc((size_t)(e->n_itl > 0 ? e->n_itl : 1) * sizeof(double));
    if (e->n_itl) memcpy(*itl_ms, e->itl, (size_t)e->n_itl * sizeof(double));
    *forward_s = e->forward_s;
    *device_s = e->device_s;
    pthread_mutex_unlock(&e->mu);
}

void engine_decode_split(Engine *e, long *steps, double *forward_s, double *device_s) {
    pthread_mutex_lock(&e->mu);
    *steps = e->decode_steps, *forward_s = e->decode_forward_s, *device_s = e->decode_device_s;
    pthread_mutex_unlock(&e->mu);
}
