// scheduler.c — continuous and static batching over one token budget; step04's KV slots.
// See scheduler.h for the rule; step05's paged KV calls step05_paged/sched_paged.h. Plain C, no clock of its own (the caller passes the engine
// time), no randomness: the same requests and limits give the same plans on every machine.
#define _GNU_SOURCE  // qsort_r
#include "scheduler.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step05_paged/sched_paged.h"

const char *policy_name(SchedPolicy p) { return p == POLICY_STATIC ? "static" : "continuous"; }

const char *finish_reason_name(FinishReason f) {
    switch (f) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_ERROR: return "error";
    default: return "none";
    }
}

void request_init(Request *r, int index, const int *prompt, int n_prompt, int max_tokens, const SamplerParams *sp,
                  int ignore_eos, double arrival_s) {
    memset(r, 0, sizeof *r);
    r->index = index;
    r->cap = n_prompt + max_tokens;
    r->tokens = xmalloc((size_t)(r->cap > 0 ? r->cap : 1) * sizeof(int));
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof(int));
    r->num_prompt = r->num_tokens = n_prompt;
    r->max_tokens = max_tokens;
    r->ignore_eos = ignore_eos;
    r->sp = *sp;
    r->status = REQ_WAITING;
    r->slot = -1;
    r->arrival_s = arrival_s;
    r->first_sched_s = r->first_token_s = r->finish_s = -1;
}

void request_free(Request *r) {
    free(r->tokens);
    r->tokens = NULL;
}

// tokens this request may ever hold: prompt + max_tokens, capped by the slot length
static long reservation(const Request *r, int max_len) {
    const long want = (long)r->num_prompt + r->max_tokens;
    return want < max_len ? want : max_len;
}

static int by_arrival(const void *a, const void *b, void *ctx) {
    const Request *reqs = ctx;
    const Request *x = &reqs[*(const int *)a], *y = &reqs[*(const int *)b];
    if (x->arrival_s != y->arrival_s) return x->arrival_s < y->arrival_s ? -1 : 1;
    return x->index - y->index;
}

// Whether r can ever run: a prompt and room for its output within max_len, and (slots) a
// reservation within the KV budget, (paged) blocks for it alone in the pool.
static int admissible(const Scheduler *s, const Request *r) {
    return r->num_prompt >= 1 && r->num_prompt < s->cfg.max_len && r->max_tokens >= 1 &&
           (s->paged ? paged_can_ever_fit(s, r) : reservation(r, s->cfg.max_len) <= s->cfg.kv_tokens);
}

// A request that holds no KV (never admitted, or waiting) ends with an error at time t.
static void end_unadmitted(Scheduler *s, Request *r, double t) {
    r->status = REQ_FINISHED, r->finish = FINISH_ERROR, r->finish_s = t;
    s->n_finished++;
}

int sched_init(Scheduler *s, const SchedConfig *cfg, Request *reqs, int n_reqs, char *err, int errlen) {
    memset(s, 0, sizeof *s);
    if (cfg->max_num_seqs < 1) return errf(err, errlen, "max_num_seqs = %d: need >= 1", cfg->max_num_seqs);
    if (cfg->max_num_batched_tokens < 1)
        return errf(err, errlen, "max_num_batched_tokens = %ld: need >= 1", cfg->max_num_batched_tokens);
    if (cfg->max_len < 2) return errf(err, errlen, "max_len = %d: need >= 2 (a prompt token and one output)", cfg->max_len);
    if (cfg->n_eos < 0 || cfg->n_eos > 8) return errf(err, errlen, "n_eos = %d: 0..8", cfg->n_eos);
    if (cfg->block_size < 0) return errf(err, errlen, "block_size = %d: need >= 1 (paged KV) or 0 (step04's slots)", cfg->block_size);
    s->cfg = *cfg;
    if (s->cfg.kv_tokens <= 0) s->cfg.kv_tokens = (long)cfg->max_num_seqs * cfg->max_len;
    if (cfg->block_size > 0 && paged_init(s, err, errlen) != 0) {
        memset(s, 0, sizeof *s);
        return -1;
    }
    s->reqs = reqs;
    s->n_reqs = n_reqs;
    s->cap_reqs = n_reqs > 0 ? n_reqs : 1;
    s->waiting = xmalloc((size_t)s->cap_reqs * sizeof(int));
    int nw = 0;
    for (int i = 0; i < n_reqs; i++) {
        Request *r = &reqs[i];
        if (!admissible(s, r)) {  // can never run: finished at once, never blocks the queue
            end_unadmitted(s, r, r->arrival_s);
            continue;
        }
        s->waiting[nw++] = i;
    }
    qsort_r(s->waiting, (size_t)nw, sizeof(int), by_arrival, reqs);
    s->w_head = n_reqs - nw;  // waiting[w_head..n_reqs) hold the admissible requests
    memmove(s->waiting + s->w_head, s->waiting, (size_t)nw * sizeof(int));
    s->running = xmalloc((size_t)cfg->max_num_seqs * sizeof(int));
    s->batch = xmalloc((size_t)cfg->max_num_seqs * sizeof(int));
    s->pad_left = xcalloc((size_t)s->cap_reqs, sizeof(int));
    s->pad_pos = xmalloc((size_t)s->cap_reqs * sizeof(int));
    for (int i = 0; i < n_reqs; i++) s->pad_pos[i] = -1;
    KvSlots *kv = &s->kv;
    kv->n_slots = cfg->max_num_seqs;
    kv->max_len = cfg->max_len;
    kv->budget = s->cfg.kv_tokens;
    kv->free_slots = xmalloc((size_t)kv->n_slots * sizeof(int));
    kv->reservation = xcalloc((size_t)kv->n_slots, sizeof(long));
    for (int i = 0; i < kv->n_slots; i++) kv->free_slots[i] = kv->n_slots - 1 - i;  // pops 0, 1, 2, ...
    kv->n_free = kv->n_slots;
    return 0;
}

void sched_free(Scheduler *s) {
    free(s->waiting), free(s->running), free(s->batch), free(s->pad_left), free(s->pad_pos);
    free(s->kv.free_slots), free(s->kv.reservation);
    paged_free(s);
    memset(s, 0, sizeof *s);
}

void plan_free(SchedPlan *p) {
    free(p->req), free(p->n_new), free(p->start), free(p->samples), free(p->pad);
    memset(p, 0, sizeof *p);
}

static void plan_add(SchedPlan *p, int req, int n_new, int start, int samples, int pad) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->req = realloc(p->req, (size_t)p->cap * sizeof(int));
        p->n_new = realloc(p->n_new, (size_t)p->cap * sizeof(int));
        p->start = realloc(p->start, (size_t)p->cap * sizeof(int));
        p->samples = realloc(p->samples, (size_t)p->cap * sizeof(int));
        p->pad = realloc(p->pad, (size_t)p->cap * sizeof(int));
        if (!p->req || !p->n_new || !p->start || !p->samples || !p->pad) die("out of memory");
    }
    p->req[p->n] = req, p->n_new[p->n] = n_new, p->start[p->n] = start, p->samples[p->n] = samples;
    p->pad[p->n] = pad;
    p->n++;
    p->n_tokens += n_new;
    if (pad) p->n_pad += n_new;
    p->n_samples += samples;
}

// KV: a free slot and room for the reservation, or -1
static int kv_admit(KvSlots *kv, const Request *r) {
    const long need = reservation(r, kv->max_len);
    if (kv->n_free == 0 || kv->reserved + need > kv->budget) return -1;
    const int slot = kv->free_slots[--kv->n_free];
    kv->reservation[slot] = need;
    kv->reserved += need;
    return slot;
}

static void kv_release(KvSlots *kv, Request *r) {
    kv->reserved -= kv->reservation[r->slot];
    kv->reservation[r->slot] = 0;
    kv->free_slots[kv->n_free++] = r->slot;
    r->slot = -1;
}

// n = min(num_tokens - num_computed, budget left) for request i; adds it to the plan
static void schedule_one(Scheduler *s, int i, long *budget, double now, SchedPlan *p) {
    Request *r = &s->reqs[i];
    const long rem = r->num_tokens - r->num_computed;
    const long n = rem < *budget ? rem : *budget;
    if (n <= 0) return;
    if (r->first_sched_s < 0) r->first_sched_s = now;
    plan_add(p, i, (int)n, r->num_computed, n == rem, PLAN_REAL);
    *budget -= n;
}

// static: a member's prompt padding rows (left padding: before its real prompt rows), then its
// real tokens
static void schedule_member(Scheduler *s, int i, long *budget, double now, SchedPlan *p) {
    if (s->pad_left[i] > 0) {
        const long n = s->pad_left[i] < *budget ? s->pad_left[i] : *budget;
        if (s->reqs[i].first_sched_s < 0) s->reqs[i].first_sched_s = now;
        plan_add(p, i, (int)n, 0, 0, PLAN_PAD_PROMPT);
        *budget -= n;
    }
    if (*budget > 0) schedule_one(s, i, budget, now, p);
}

// the head of the waiting queue, if it has arrived and a seat and its KV are free (paged: the
// blocks of its first chunk of at most budget tokens)
static int admit(Scheduler *s, double now, long budget) {
    if (s->w_head >= s->n_reqs || s->n_running >= s->cfg.max_num_seqs) return -1;
    const int i = s->waiting[s->w_head];
    Request *r = &s->reqs[i];
    if (r->arrival_s > now) return -1;
    const int slot = s->paged ? (paged_admit(s, i, budget) == 0 ? i : -1) : kv_admit(&s->kv, r);
    if (slot < 0) return -1;
    r->slot = slot;
    r->status = REQ_RUNNING;
    s->running[s->n_running++] = i;
    s->w_head++;
    return i;
}

static void finish(Scheduler *s, Request *r, FinishReason why, double now) {
    r->status = REQ_FINISHED;
    r->finish = why;
    r->finish_s = now;
    s->n_finished++;
    if (s->paged) {
        paged_release(s, r);
    } else if (s->cfg.policy == POLICY_CONTINUOUS) {
        kv_release(&s->kv, r);
    } else {  // static: the slot is freed at the end of the batch; until then the row is padding
        const int i = (int)(r - s->reqs);
        s->pad_left[i] = 0;
        s->pad_pos[i] = r->num_computed;  // its next position (the last token's, after a sampled finish)
    }
}

static void drop_finished_running(Scheduler *s) {
    int m = 0;
    for (int k = 0; k < s->n_running; k++)
        if (s->reqs[s->running[k]].status == REQ_RUNNING) s->running[m++] = s->running[k];
    s->n_running = m;
    if (s->cfg.policy == POLICY_STATIC && m == 0 && s->n_batch > 0) {
        for (int k = 0; k < s->n_batch; k++) {
            kv_release(&s->kv, &s->reqs[s->batch[k]]);
            s->pad_pos[s->batch[k]] = -1;
        }
        s->n_batch = 0;
    }
}

void sched_schedule(Scheduler *s, double now, SchedPlan *p) {
    p->n = 0, p->n_tokens = 0, p->n_pad = 0, p->n_samples = 0;
    // a client's cancel takes effect at the step boundary, running or waiting
    for (int k = 0; k < s->n_running; k++) {
        Request *r = &s->reqs[s->running[k]];
        if (r->cancel) finish(s, r, FINISH_ERROR, now);
    }
    drop_finished_running(s);
    int m = s->n_reqs;
    for (int k = s->n_reqs - 1; k >= s->w_head; k--) {  // compact the waiting list from its end
        Request *r = &s->reqs[s->waiting[k]];
        if (r->cancel) end_unadmitted(s, r, now);
        else s->waiting[--m] = s->waiting[k];
    }
    s->w_head = m;
    long budget = s->cfg.max_num_batched_tokens;
    if (s->cfg.policy == POLICY_STATIC && s->n_running == 0) {
        // a new batch: up to max_num_seqs arrived requests in arrival order, all at once
        int i, longest = 0;
        while ((i = admit(s, now, budget)) >= 0) {
            s->batch[s->n_batch++] = i;
            if (s->reqs[i].num_prompt > longest) longest = s->reqs[i].num_prompt;
        }
        for (int k = 0; k < s->n_batch; k++) s->pad_left[s->batch[k]] = longest - s->reqs[s->batch[k]].num_prompt;
        if (s->n_batch > 0) s->st.batches++;
    }
    if (s->cfg.policy == POLICY_STATIC) {
        for (int k = 0; k < s->n_running && budget > 0; k++) schedule_member(s, s->running[k], &budget, now, p);
        // finished members' rows, while the batch runs: one padding decode each, budget permitting.
        // A row that would pass the slot's end (max_len) stops there: it is not computed.
        for (int k = 0; k < s->n_batch && budget > 0 && s->n_running > 0; k++) {
            const int i = s->batch[k];
            if (s->reqs[i].status != REQ_FINISHED || s->pad_pos[i] < 0 || s->pad_pos[i] >= s->cfg.max_len) continue;
            plan_add(p, i, 1, s->pad_pos[i], 0, PLAN_PAD_DECODE);
            budget--;
        }
    } else {
        int preempted = 0;
        for (int k = 0; k < s->n_running && budget > 0; k++) {
            const int i = s->running[k];
            // Paged: out of blocks, preempt the newest running request until the allocation
            // succeeds. Running requests are processed oldest first, so every victim (the newest,
            // at position >= k) has had no allocation and no kvb_commit in this step: all its
            // hashed blocks were committed in earlier steps, whose forwards wrote their K/V, and
            // they stay valid as cached blocks. (Admissions, whose commits also precede the
            // forward, come after this loop, and never in a step that preempted.)
            while (s->paged && paged_grow(s, i, budget) != 0) {
                if (s->n_running == 1) {  // alone and still no room: it can never fit
                    finish(s, &s->reqs[i], FINISH_ERROR, now);
                    break;
                }
                preempted = 1;
                if (paged_preempt_newest(s) == i) break;  // it was the newest itself
            }
            if (s->reqs[i].status != REQ_RUNNING) break;
            schedule_one(s, i, &budget, now, p);
        }
        drop_finished_running(s);
        int i;
        while (!preempted && budget > 0 && (i = admit(s, now, budget)) >= 0) schedule_one(s, i, &budget, now, p);
    }
    if (s->n_running > s->st.peak_running) s->st.peak_running = s->n_running;
    if (p->n == 0) return;
    s->st.steps++;
    s->st.tokens += p->n_tokens - p->n_pad;
    s->st.idle_slots += p->n_pad;
    for (int i = 0; i < p->n; i++) {
        if (p->pad[i] == PLAN_PAD_PROMPT) s->st.pad_slots += p->n_new[i];
        else s->st.seq_steps++;
    }
}

int sched_stops_at(const SchedConfig *c, const Request *r, int tok) {
    if (r->ignore_eos) return 0;
    for (int e = 0; e < c->n_eos; e++)
        if (tok == c->eos[e]) return 1;
    return 0;
}

void sched_stop(Scheduler *s, int i, FinishReason why, double now) {
    Request *r = &s->reqs[i];
    if (r->status == REQ_FINISHED) return;
    if (r->status == REQ_RUNNING) {
        finish(s, r, why, now);
        drop_finished_running(s);
        return;
    }
    for (int k = s->w_head; k < s->n_reqs; k++)  // waiting (preempted back to the queue): out of it
        if (s->waiting[k] == i) {
            memmove(s->waiting + s->w_head + 1, s->waiting + s->w_head, (size_t)(k - s->w_head) * sizeof(int));
            s->w_head++;
            break;
        }
    r->status = REQ_FINISHED, r->finish = why, r->finish_s = now;
    s->n_finished++;
}

void sched_update(Scheduler *s, const SchedPlan *p, const int *tokens, double now) {
    for (int i = 0; i < p->n; i++) {
        Request *r = &s->reqs[p->req[i]];
        if (p->pad[i] == PLAN_PAD_PROMPT) {  // padding: nothing of the request changes
            s->pad_left[p->req[i]] -= p->n_new[i];
            continue;
        }
        if (p->pad[i] == PLAN_PAD_DECODE) {
            s->pad_pos[p->req[i]]++;
            continue;
        }
        r->num_computed += p->n_new[i];
        if (!p->samples[i]) continue;
        const int tok = tokens[i];
        r->tokens[r->num_tokens++] = tok;
        if (r->first_token_s < 0) r->first_token_s = now;
        if (sched_stops_at(&s->cfg, r, tok)) finish(s, r, FINISH_STOP, now);
        else if (r->num_tokens >= reservation(r, s->cfg.max_len)) finish(s, r, FINISH_LENGTH, now);
    }
    drop_finished_running(s);
    // KV in use after the step: tokens written by the requests that hold a slot (real tokens;
    // a finished static member's padding K/V goes to positions of its slot nothing reads).
    // Paged: rows written and blocks allocated (the unwritten rest is the last blocks' tails).
    long used = 0, reserved = s->kv.reserved;
    if (s->paged) {
        paged_account(s, &used, &reserved);
    } else {
        const int *holders = s->cfg.policy == POLICY_STATIC ? s->batch : s->running;
        const int n_holders = s->cfg.policy == POLICY_STATIC ? s->n_batch : s->n_running;
        for (int k = 0; k < n_holders; k++) used += s->reqs[holders[k]].num_computed;
    }
    if (used > s->st.peak_used) s->st.peak_used = used;
    if (reserved > s->st.peak_reserved) s->st.peak_reserved = reserved;
    s->st.kv_used_now = used, s->st.kv_reserved_now = reserved;
    s->st.used_sum += (double)used;
    s->st.reserved_sum += (double)reserved;
}

static void *resize(void *p, size_t bytes) {
    void *q = realloc(p, bytes);
    if (!q) die("sched_add: out of memory (%zu bytes)", bytes);
    return q;
}

int sched_add(Scheduler *s, Request *reqs) {
    if (s->n_reqs == INT_MAX) die("sched_add: %d requests", s->n_reqs);
    const int i = s->n_reqs;
    if (i == s->cap_reqs) {
        const int cap = s->cap_reqs > INT_MAX / 2 ? INT_MAX : 2 * s->cap_reqs;
        s->waiting = resize(s->waiting, (size_t)cap * sizeof(int));
        s->pad_left = resize(s->pad_left, (size_t)cap * sizeof(int));
        s->pad_pos = resize(s->pad_pos, (size_t)cap * sizeof(int));
        s->cap_reqs = cap;
    }
    s->reqs = reqs;  // the table may have moved; the scheduler keeps indices only
    Request *r = &reqs[i];
    s->pad_left[i] = 0, s->pad_pos[i] = -1;
    s->n_reqs++;
    if (!admissible(s, r)) {  // as at sched_init: finished at once, the queue [w_head, n_reqs) moves up one
        end_unadmitted(s, r, r->arrival_s);
        memmove(s->waiting + s->w_head + 1, s->waiting + s->w_head, (size_t)(i - s->w_head) * sizeof(int));
        s->w_head++;
        return i;
    }
    int k = i;  // into arrival order (ties: the earlier index first)
    while (k > s->w_head && s->reqs[s->waiting[k - 1]].arrival_s > r->arrival_s) {
        s->waiting[k] = s->waiting[k - 1];
        k--;
    }
    s->waiting[k] = i;
    return i;
}

int sched_done(const Scheduler *s) { return s->n_finished == s->n_reqs; }

int sched_num_waiting(const Scheduler *s) { return s->n_reqs - s->w_head; }

double sched_next_arrival(const Scheduler *s) {
    return s->w_head < s->n_reqs ? s->reqs[s->waiting[s->w_head]].arrival_s : -1;
}
