// task_cpu.c — the copy / reverse task of task.h: batches for training, greedy evaluation.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step03_kvcache/kvcache.h"
#include "task.h"
#include "train.h"

int task_parse(const char *s, TaskKind *k) {
    if (!strcmp(s, "copy")) return *k = TASK_COPY, 0;
    if (!strcmp(s, "reverse")) return *k = TASK_REVERSE, 0;
    return -1;
}

const char *task_name(TaskKind k) { return k == TASK_COPY ? "copy" : "reverse"; }

static void make_one(TaskKind k, Rng *r, int L, int n_sym, int *ids) {
    ids[0] = TASK_BOS;
    for (int i = 0; i < L; i++) ids[1 + i] = TASK_SYM0 + (int)(rng_u32(r) % (uint32_t)n_sym);
    ids[L + 1] = TASK_SEP;
    for (int i = 0; i < L; i++) ids[L + 2 + i] = k == TASK_COPY ? ids[1 + i] : ids[L - i];
}

void task_make_batch(TaskKind k, Rng *r, int B, int L, int n_sym, int *ids, int *targets) {
    const int T = task_seq_len(L);
    for (int b = 0; b < B; b++) {
        int *x = ids + (size_t)b * T, *y = targets + (size_t)b * T;
        make_one(k, r, L, n_sym, x);
        // position t predicts x[t+1]; the answer o1..oL is predicted from positions L+1 .. 2L
        for (int t = 0; t < T; t++) y[t] = (t >= L + 1 && t < T - 1) ? x[t + 1] : TRAIN_IGNORE;
    }
}

double task_eval(const CpuModel *cm, TaskKind k, uint64_t seed, int n, int L, int n_sym, double *tok_acc) {
    const int T = task_seq_len(L), V = cm->cfg.vocab;
    int *want = xmalloc((size_t)T * sizeof(int)), *seq = xmalloc((size_t)T * sizeof(int));
    float *logits = xmalloc((size_t)V * sizeof(float));
    CpuKvCache kv;  // step03's cache: the prompt once, then one token per step (not T forwards of t tokens)
    if (cpu_kv_init(&kv, &cm->cfg, T)) die("task_eval: cpu_kv_init failed");
    Rng r;
    rng_seed(&r, seed);
    long exact = 0, tok = 0;
    for (int e = 0; e < n; e++) {
        make_one(k, &r, L, n_sym, want);
        memcpy(seq, want, (size_t)(L + 2) * sizeof(int));
        kv.len = 0;
        if (forward_cached_cpu(cm, &kv, seq, L + 2, logits)) die("task_eval: forward_cached_cpu failed");
        int ok = 1;
        for (int t = L + 2; t < T; t++) {  // logits predict position t
            int best = 0;
            for (int j = 1; j < V; j++)
                if (logits[j] > logits[best]) best = j;
            seq[t] = best;  // greedy: the model's own token is fed back
            tok += best == want[t];
            ok &= best == want[t];
            if (t + 1 < T && forward_cached_cpu(cm, &kv, &seq[t], 1, logits)) die("task_eval: forward_cached_cpu failed");
        }
        exact += ok;
    }
    cpu_kv_free(&kv);
    free(want), free(seq), free(logits);
    if (tok_acc) *tok_acc = n ? (double)tok / ((double)n * L) : 0;
    return n ? (double)exact / n : 0;
}
