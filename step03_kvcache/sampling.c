// sampling.c — turning one step's logits into the next token (see kvcache.h for the order).
//
//   greedy       argmax: deterministic, what the goldens use
//   temperature  p = softmax(logits / T): T < 1 sharpens, T > 1 flattens
//   top-k        keep the k most probable tokens
//   top-p        keep the smallest most-probable prefix whose probability reaches p (nucleus)
//   min-p        keep tokens with p >= min_p * p_max (a cut relative to the best token)
// The survivors are renormalized and one uniform draw u in [0, 1) picks the token whose
// cumulative probability first exceeds u.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvcache.h"

int argmax_f32(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

void sampler_init(Sampler *s, const SamplerParams *p, int vocab) {
    memset(s, 0, sizeof *s);
    s->p = *p;
    s->vocab = vocab;
    rng_seed(&s->rng, p->seed);
    s->idx = xmalloc((size_t)vocab * sizeof(int));
    s->prob = xmalloc((size_t)vocab * sizeof(float));
}

void sampler_free(Sampler *s) {
    free(s->idx);
    free(s->prob);
    memset(s, 0, sizeof *s);
}

static const float *g_sort_key;  // qsort has no context argument; sampling is single-threaded
static int by_prob_desc(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = g_sort_key[i], y = g_sort_key[j];
    if (x != y) return x > y ? -1 : 1;
    return i - j;  // ties: lower id first, so the order is total and the same everywhere
}

int sampler_candidates(Sampler *s, const float *logits) {
    const int V = s->vocab;
    const SamplerParams *p = &s->p;
    if (p->greedy || p->temperature <= 0) {
        s->idx[0] = argmax_f32(logits, V);
        s->prob[0] = 1;
        return 1;
    }
    // softmax(logits / T) in double for the sum, stored as float
    float *pr = xmalloc((size_t)V * sizeof(float));
    const float inv_t = 1.0f / p->temperature;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, logits[i] * inv_t);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += pr[i] = expf(logits[i] * inv_t - mx);
    for (int i = 0; i < V; i++) pr[i] = (float)(pr[i] / sum);
    for (int i = 0; i < V; i++) s->idx[i] = i;
    g_sort_key = pr;
    qsort(s->idx, (size_t)V, sizeof(int), by_prob_desc);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (p->top_p > 0 && p->top_p < 1) {
        // the smallest prefix (of the top-k survivors, renormalized) whose mass reaches top_p
        double kept = 0, tot = 0;
        for (int i = 0; i < n; i++) tot += pr[s->idx[i]];
        int m = 0;
        while (m < n) {
            kept += pr[s->idx[m++]];
            if (kept >= p->top_p * tot) break;
        }
        n = m;
    }
    if (p->min_p > 0) {
        const float cut = p->min_p * pr[s->idx[0]];
        int m = 1;  // the best token always survives
        while (m < n && pr[s->idx[m]] >= cut) m++;
        n = m;
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += pr[s->idx[i]];
    for (int i = 0; i < n; i++) s->prob[i] = (float)(pr[s->idx[i]] / tot);
    free(pr);
    return n;
}

int sampler_sample(Sampler *s, const float *logits) {
    const int n = sampler_candidates(s, logits);
    if (n == 1) return s->idx[0];
    const double u = rng_uniform(&s->rng);
    double c = 0;
    for (int i = 0; i < n; i++) {
        c += s->prob[i];
        if (u < c) return s->idx[i];
    }
    return s->idx[n - 1];  // rounding left u just above the last cumulative sum
}

void logprobs_topk(const float *logits, int vocab, int k, int *ids, float *logprobs) {
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++) mx = fmaxf(mx, logits[i]);
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    forward_topk(logits, vocab, k, ids);
    for (int r = 0; r < k; r++) logprobs[r] = (float)(logits[ids[r]] - lse);
}
