// offline.c — see offline.h.
#include "offline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "timer.h"

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int offline_run(Runner *r, int vocab, Scheduler *s, const OfflineOpts *o, OfflineStats *st) {
    memset(st, 0, sizeof *st);
    const int cap_seqs = s->cfg.max_num_seqs;
    long cap_rows = s->cfg.max_num_batched_tokens;
    if (cap_rows > (long)cap_seqs * s->cfg.max_len) cap_rows = (long)cap_seqs * s->cfg.max_len;
    Batch b;
    if (s->paged) {  // step05: block tables of the blocks of max_len positions
        const int B = s->cfg.block_size;
        batch_alloc_paged(&b, cap_seqs + 1, (int)cap_rows, B, (s->cfg.max_len + B - 1) / B);
    } else batch_alloc(&b, cap_seqs + 1, (int)cap_rows);  // + the padding sequence of a static batch
    SchedPlan plan = {0};
    float *logits = NULL;  // (cap_seqs, vocab), allocated when a row samples
    int *argmax = xmalloc((size_t)cap_seqs * sizeof(int)), *tokens = xmalloc((size_t)2 * cap_seqs * sizeof(int));  // plan entries: static padding too
    Sampler sampler;
    const SamplerParams sp0 = {.greedy = 1, .temperature = 0, .top_p = 1};
    sampler_init(&sampler, &sp0, vocab);
    const double t0 = now_sec();
    double sim = 0, last_progress = t0, first = -1, last = 0;
    int rc = 0;
    double *last_tok = xmalloc((size_t)(s->n_reqs > 0 ? s->n_reqs : 1) * sizeof(double));
    long cap_itl = 1024;
    st->itl_ms = xmalloc((size_t)cap_itl * sizeof(double));
    while (!sched_done(s)) {
        const double now = o->real_clock ? now_sec() - t0 : sim;
        sched_schedule(s, now, &plan);
        if (plan.n == 0) {  // nothing runnable: wait for the next arrival
            const double next = sched_next_arrival(s);
            if (next < 0) {
                fprintf(stderr, "offline_run: requests left but none can ever run (scheduler stuck)\n");
                rc = -1;
                break;
            }
            if (o->real_clock) sleep_s(next - now);
            else sim = next > sim ? next : sim + (o->step_s > 0 ? o->step_s : 1e-3);
            continue;
        }
        if (first < 0) first = now;
        if (s->paged) batch_from_plan_paged(&b, &plan, s->reqs, &s->blocks);
        else batch_from_plan(&b, &plan, s->reqs, s->cfg.max_len);
        int need_logits = o->on_logits != NULL;
        for (int i = 0; i < plan.n && !need_logits; i++) {
            const Request *q = &s->reqs[plan.req[i]];
            need_logits = plan.samples[i] && !(q->sp.greedy || q->sp.temperature <= 0);
        }
        if (need_logits && !logits) logits = xmalloc((size_t)cap_seqs * vocab * sizeof(float));
        const double f0 = now_sec();
        if (runner_forward(r, &b, need_logits ? logits : NULL, argmax) != 0) {
            rc = -1;
            break;
        }
        const double fwd = now_sec() - f0, dev = runner_last_device_ms(r) / 1e3;
        st->forward_s += fwd, st->device_s += dev;
        if (b.n_tokens == b.n_seqs) st->decode_steps++, st->decode_forward_s += fwd, st->decode_device_s += dev;
        st->logit_copies += need_logits;
        for (int i = 0, k = 0; i < plan.n; i++) {
            if (!plan.samples[i]) continue;
            const Request *q = &s->reqs[plan.req[i]];
            const float *row = need_logits ? logits + (size_t)k * vocab : NULL;
            if (row && o->on_logits) o->on_logits(o->ctx, q, row, vocab);
            if (q->sp.greedy || q->sp.temperature <= 0) tokens[i] = argmax[k];
            else tokens[i] = sample_keyed(&sampler, &q->sp, q->index, q->num_tokens, row);
            k++;
        }
        st->steps++;
        sim += o->step_s > 0 ? o->step_s : 1e-3;
        const double end = o->real_clock ? now_sec() - t0 : sim;
        sched_update(s, &plan, tokens, end);
        last = end;
        if (o->on_step) o->on_step(o->ctx, s, &plan, end);
        for (int i = 0; i < plan.n; i++) {  // inter-token latency: the gap since the request's previous token
            if (!plan.samples[i]) continue;
            const Request *q = &s->reqs[plan.req[i]];
            if (q->num_tokens - q->num_prompt >= 2) {
                if (st->n_itl == cap_itl) {
                    st->itl_ms = realloc(st->itl_ms, (size_t)(cap_itl *= 2) * sizeof(double));
                    if (!st->itl_ms) die("out of memory");
                }
                st->itl_ms[st->n_itl++] = (end - last_tok[plan.req[i]]) * 1e3;
            }
            last_tok[plan.req[i]] = end;
        }
        if (o->progress && now_sec() - last_progress > 2.0) {
            last_progress = now_sec();
            fprintf(stderr, "[batch] step %ld, %d/%d requests finished, %d running, t = %.1f s\n", st->steps,
                    s->n_finished, s->n_reqs, s->n_running, end);
        }
    }
    st->wall_s = first < 0 ? 0 : last;  // from the engine start (time 0 of arrival_s)
    sampler_free(&sampler);
    free(last_tok);
    free(logits), free(argmax), free(tokens);
    plan_free(&plan);
    batch_free(&b);
    return rc;
}
