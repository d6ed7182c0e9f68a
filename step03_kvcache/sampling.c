// sampling.c — turning one step's logits into the next token (see kvcache.h for the order).
//
//   greedy       argmax: deterministic, what the goldens use
//   temperature  p = softmax(logits / T): T < 1 sharpens, T > 1 flattens
//   top-k        keep the k most probable tokens
//   top-p        keep the smallest most-probable prefix whose probability reaches p (nucleus)
//   min-p        keep tokens with p >= min_p * p_max (a cut relative to the best token)
// The survivors are renormalized and one uniform draw u in [0, 1) picks the token whose
// cumulative probability first exceeds u. Only the survivors are sorted (see below): the tokens
// are exactly those a sort of the whole vocabulary gives (tests/test_step03_kvcache.c checks it).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
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
    s->pr = xmalloc((size_t)vocab * sizeof(float));
}

void sampler_free(Sampler *s) {
    free(s->idx);
    free(s->prob);
    free(s->pr);
    memset(s, 0, sizeof *s);
}

// ---- candidate order: probability descending, ties lower id first (a total order, the same
// everywhere). The filters only ever keep a prefix of this order, so only that prefix is sorted:
// select_best moves the m best ids to the front (quickselect, O(n) on average), sort_ids sorts
// them (O(m log m)). Sampling costs O(V) for the softmax plus O(m log m) for what survives,
// instead of O(V log V) for sorting the whole vocabulary.
static inline int before(const float *pr, int i, int j) { return pr[i] > pr[j] || (pr[i] == pr[j] && i < j); }

static inline void swap_int(int *a, int *b) {
    const int t = *a;
    *a = *b, *b = t;
}

// Hoare partition of a[0..n) (n > 2) around the median of three: returns j such that every id
// of a[0..j] comes before-or-is the pivot and every id of a[j+1..n) comes after-or-is it.
static int partition(const float *pr, int *a, int n) {
    const int mid = (n - 1) / 2;
    if (before(pr, a[mid], a[0])) swap_int(&a[mid], &a[0]);
    if (before(pr, a[n - 1], a[0])) swap_int(&a[n - 1], &a[0]);
    if (before(pr, a[n - 1], a[mid])) swap_int(&a[n - 1], &a[mid]);
    const int pivot = a[mid];
    int i = -1, j = n;
    for (;;) {
        do i++;
        while (before(pr, a[i], pivot));
        do j--;
        while (before(pr, pivot, a[j]));
        if (i >= j) return j;
        swap_int(&a[i], &a[j]);
    }
}

static void sort_ids(const float *pr, int *a, int n) {
    while (n > 16) {
        const int j = partition(pr, a, n) + 1;  // [0, j) and [j, n)
        if (j < n - j) sort_ids(pr, a, j), a += j, n -= j;  // recurse on the smaller side
        else sort_ids(pr, a + j, n - j), n = j;
    }
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && before(pr, a[k], a[k - 1]); k--) swap_int(&a[k], &a[k - 1]);
}

// Afterwards a[0..m) holds the m best ids of a[0..n), in no particular order.
static void select_best(const float *pr, int *a, int n, int m) {
    int lo = 0, hi = n;  // every id left of lo beats every id in [lo, n); every id from hi on loses
    while (hi - lo > 16 && lo < m && m < hi) {
        const int j = lo + partition(pr, a + lo, hi - lo) + 1;
        if (m <= j) hi = j;
        else lo = j;
    }
    if (lo < m && m < hi) sort_ids(pr, a + lo, hi - lo);
}

// a[0..done) is sorted and beats all of a[done..n): extend the sorted prefix to `want` ids.
static int grow(const float *pr, int *a, int n, int done, int want) {
    if (want > n) want = n;
    if (want <= done) return done;
    select_best(pr, a + done, n - done, want - done);
    sort_ids(pr, a + done, want - done);
    return want;
}

// Float exponent of a probability: ids in a higher bucket always come first in the order.
static inline int pr_bucket(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (int)(bits >> 23);
}

// Keep in a[0..cnt) only the ids of the highest exponent buckets that together hold >= k ids:
// the k best are all among them. One counting pass and one compacting pass; returns the count.
static int keep_top_buckets(const float *pr, int *a, int cnt, int k) {
    int count[256] = {0}, ecut = 0, acc = 0;
    for (int i = 0; i < cnt; i++) count[pr_bucket(pr[a[i]])]++;
    for (int e = 255; e >= 0; e--)
        if ((acc += count[e]) >= k) {
            ecut = e;
            break;
        }
    int m = 0;
    for (int i = 0; i < cnt; i++)
        if (pr_bucket(pr[a[i]]) >= ecut) a[m++] = a[i];
    return m;
}

// top-p over the first n ids of the sorted order (all of them sorted): the smallest prefix
// whose mass reaches top_p of their total.
static int top_p_prefix(const float *pr, const int *a, int n, float top_p) {
    double kept = 0, tot = 0;
    for (int i = 0; i < n; i++) tot += pr[a[i]];
    int m = 0;
    while (m < n) {
        kept += pr[a[m++]];
        if (kept >= top_p * tot) break;
    }
    return m;
}

// Greedy, or temperature 0: the argmax alone, with probability 1.
static int only_argmax(Sampler *s, const float *logits) {
    s->idx[0] = argmax_f32(logits, s->vocab);
    s->prob[0] = 1;
    return 1;
}

int sampler_candidates(Sampler *s, const float *logits) {
    const int V = s->vocab;
    const SamplerParams *p = &s->p;
    if (p->greedy || p->temperature <= 0) return only_argmax(s, logits);
    // softmax(logits / T) in double for the sum, stored as float
    float *pr = s->pr;
    int *a = s->idx;
    const float inv_t = 1.0f / p->temperature;
    // (max by comparison, not fmaxf: the same value for every input, NaN included, and no libm call per id)
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        const float x = logits[i] * inv_t;
        mx = x > mx ? x : mx;
    }
    double sum = 0;
    for (int i = 0; i < V; i++) sum += pr[i] = expf(logits[i] * inv_t - mx);
    float pmax = 0;
    for (int i = 0; i < V; i++) {
        pr[i] = (float)(pr[i] / sum);
        pmax = pr[i] > pmax ? pr[i] : pmax;
    }
    const int top_p_on = p->top_p > 0 && p->top_p < 1;
    // min-p keeps p >= min_p * p_max: when it is the last filter that changes the set (no top-p
    // after top-k in between), only those ids ever need ordering.
    int cnt = 0;
    if (p->min_p > 0 && !top_p_on) {
        const float cut = p->min_p * pmax;
        for (int i = 0; i < V; i++)
            if (pr[i] >= cut) a[cnt++] = i;
    } else {
        for (int i = 0; i < V; i++) a[i] = i;
        cnt = V;
    }
    const int K = p->top_k > 0 && p->top_k < cnt ? p->top_k : cnt;
    if (K < cnt / 8) cnt = keep_top_buckets(pr, a, cnt, K);  // top-k: order only the top buckets
    int n;
    if (!top_p_on) {
        n = grow(pr, a, cnt, 0, K);  // top-k, or the min-p set, or (no filter) everything
    } else if (p->top_k > 0) {
        grow(pr, a, cnt, 0, K);
        n = top_p_prefix(pr, a, K, p->top_p);
    } else {
        // top-p over the whole vocabulary: walk the order, sorting more of it only when the walk
        // gets there. The total the cut is relative to is summed here in id order; summed in the
        // sorted order (as a full sort does) it can differ by at most 2 * V * 2^-53 of itself, so
        // a step is decided here only when it is decided for either total, else the vocabulary
        // is sorted after all and the cut made exactly as the full sort makes it.
        //   Which ids can be in the prefix at all: bucket every probability by its float exponent
        // (one pass: the mass per power of two); walking the buckets from the top, the
        // first ones whose mass passes the cut hold the whole prefix, and only their ids are
        // ordered. (If the walk runs past them after all, the full sort below decides.)
        double tot = 0, bmass[256] = {0};
        for (int i = 0; i < V; i++) {
            tot += pr[i];
            bmass[pr_bucket(pr[i])] += pr[i];
        }
        const double eps = (2.0 * (V + 2) + 8.0) * 0x1p-53, thr = p->top_p * tot;
        const double lo = thr * (1 - eps), hi = thr * (1 + eps);
        int ecut = 0;
        double acc = 0;
        for (int e = 255; e > 0; e--) {
            acc += bmass[e];
            if (acc >= hi * (1 + 4 * eps)) {
                ecut = e;
                break;
            }
        }
        cnt = 0;
        for (int i = 0; i < V; i++)
            if (pr_bucket(pr[i]) >= ecut) a[cnt++] = i;
        double kept = 0;
        int m = 0, done = 0, decided = 0;
        while (m < cnt) {
            if (m == done) done = grow(pr, a, cnt, done, done < 64 ? 64 : 4 * done);
            kept += pr[a[m++]];
            if (kept >= hi) {
                decided = 1;
                break;
            }
            if (kept >= lo) break;  // too close to call
        }
        if (!decided) {  // the exact way: every id, sorted, cut as a full sort cuts
            for (int i = 0; i < V; i++) a[i] = i;
            grow(pr, a, V, 0, V);
            m = top_p_prefix(pr, a, V, p->top_p);
        }
        n = m;
    }
    if (p->min_p > 0 && top_p_on) {
        const float cut = p->min_p * pr[a[0]];
        int m = 1;  // the best token always survives
        while (m < n && pr[a[m]] >= cut) m++;
        n = m;
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += pr[a[i]];
    for (int i = 0; i < n; i++) s->prob[i] = (float)(pr[a[i]] / tot);
    return n;
}

// ---- the reference: sort the whole vocabulary, then cut (what this step did before it sorted
// only the survivors). Same candidates, probabilities and draws; O(V log V) per token.
// sample_bench times both; the tests compare against their own copy of it.
static const float *g_sort_key;  // qsort has no context argument; the reference is single-threaded
static int by_prob_desc(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = g_sort_key[i], y = g_sort_key[j];
    if (x != y) return x > y ? -1 : 1;
    return i - j;
}

int sampler_candidates_full_sort(Sampler *s, const float *logits) {
    const int V = s->vocab;
    const SamplerParams *p = &s->p;
    if (p->greedy || p->temperature <= 0) return only_argmax(s, logits);
    float *pr = s->pr;
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
    if (p->top_p > 0 && p->top_p < 1) n = top_p_prefix(pr, s->idx, n, p->top_p);
    if (p->min_p > 0) {
        const float cut = p->min_p * pr[s->idx[0]];
        int m = 1;
        while (m < n && pr[s->idx[m]] >= cut) m++;
        n = m;
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += pr[s->idx[i]];
    for (int i = 0; i < n; i++) s->prob[i] = (float)(pr[s->idx[i]] / tot);
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
    for (int i = 0; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    forward_topk(logits, vocab, k, ids);
    for (int r = 0; r < k; r++) logprobs[r] = (float)(logits[ids[r]] - lse);
}

int sampler_option(int argc, char **argv, int *i, SamplerParams *p) {
    const char *a = argv[*i];
    if (*i + 1 >= argc) return 0;
    const char *v = argv[*i + 1];
    if (!strcmp(a, "--temperature")) p->temperature = (float)arg_float(a, v, 0, 100, 0);
    else if (!strcmp(a, "--top-k")) p->top_k = (int)arg_int(a, v, 0, 1 << 30);
    else if (!strcmp(a, "--top-p")) p->top_p = (float)arg_float(a, v, 0, 1, ARG_LO_OPEN);
    else if (!strcmp(a, "--min-p")) p->min_p = (float)arg_float(a, v, 0, 1, ARG_HI_OPEN);
    else if (!strcmp(a, "--seed")) p->seed = arg_u64(a, v);
    else return 0;
    (*i)++;
    return 1;
}
