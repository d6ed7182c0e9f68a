// runner.c — batch.h's Runner: one flat batch (every new token of every scheduled sequence) in,
// logits of the sampling rows out. CPU: the fp32 reference below; CUDA: runner_gpu.cu behind
// the same three calls.
//
// The CPU forward is step02's layer with three changes, all about the batch:
//   - the projections run once over all rows with linear_rows_cpu, whose per-row result does not
//     depend on the batch (step02's OpenBLAS linear_cpu does: see linear_rows.h);
//   - RoPE uses each row's own position, and the new K/V rows are written into the cache at
//     slot_mapping (slot * max_len + position), n_slots * max_len rows per layer;
//   - attention runs per sequence, its queries over its slot's cached rows 0 .. seq_lens_k-1:
//     step02's attention_at_cpu with pos0 = seq_lens_k - rows (the cached prefix, plus causal
//     inside the chunk), the function step03's cache already uses.
// step05's paged layout (runner_new_cpu_paged): the cache is a pool of num_blocks blocks of B rows
// per layer, new rows still go to slot_mapping (now block_table[p / B] * B + p % B), and a
// sequence's context is first gathered through its block table into a contiguous scratch of
// seq_lens_k rows, then the same attention_at_cpu runs on it: the arithmetic is the slot runner's
// to the bit, whatever the block size (the gather is the only cost the block table adds here).
// Every other op (embedding, RMSNorm, q/k norm, SwiGLU, residual add) is step02's, row by row.
// So a sequence's logits are bit-identical whatever it is batched with and however its prompt
// was chunked: every row's arithmetic is fixed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step04_batching/batch.h"
#include "step04_batching/linear_rows.h"
#include "step04_batching/runner_gpu.h"

struct Runner {
    int cuda;
    GpuRunner *gpu;
    const CpuModel *m;
    int n_slots, max_len, max_tokens;  // paged: n_slots = num_blocks, max_len = block_size
    int paged, max_model_len;          // paged: positions per sequence at most
    float *kc, *vc;  // (n_layers, n_slots * max_len, KV*hd) each
    float *kg, *vg;  // paged: (max_model_len, KV*hd) one sequence's context, gathered
    float *x, *xn, *tmp, *q, *k, *v, *att, *gate, *up, *cos_t, *sin_t;  // (max_tokens, ...) workspaces
    float *lx, *logits;  // (cap_logits, d), (cap_logits, vocab): the sampling rows
    int cap_logits;
    // runner_launch on the CPU: the last launch's tokens (fix-ups read them), each slot's tokens
    int *prev_tok, n_prev, prev_valid;
    int *slot_tok[2], slot_n[2], slot_pend[2];
    int *fixed;  // (max_tokens) a launch's token ids after its fix-ups
    char desc[160];
};

// The CPU runner over a cache of rows_a * rows_b rows per layer (slots x max_len, or blocks x B).
static Runner *cpu_runner_alloc(const CpuModel *m, int n_slots, int max_len, int max_tokens_per_step, const char *what,
                                char *err, int errlen) {
    const ModelConfig *c = &m->cfg;
    const size_t T = (size_t)max_tokens_per_step, d = (size_t)c->hidden, qd = (size_t)c->n_heads * c->head_dim;
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim, ff = (size_t)c->intermediate, half = (size_t)c->head_dim / 2;
    const size_t kv = (size_t)c->n_layers * n_slots * max_len * kd;
    Runner *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->n_slots = n_slots, r->max_len = max_len, r->max_tokens = max_tokens_per_step;
    r->kc = calloc(kv, sizeof(float));
    r->vc = calloc(kv, sizeof(float));
    if (!r->kc || !r->vc) {
        errf(err, errlen, "%s: cannot allocate the KV cache (2 x %.3g GB for %d x %d positions)", what, kv * 4.0 / 1e9,
             n_slots, max_len);
        free(r->kc), free(r->vc), free(r);
        return NULL;
    }
    r->x = xmalloc(T * d * 4), r->xn = xmalloc(T * d * 4), r->tmp = xmalloc(T * d * 4);
    r->q = xmalloc(T * qd * 4), r->att = xmalloc(T * qd * 4);
    r->k = xmalloc(T * kd * 4), r->v = xmalloc(T * kd * 4);
    r->gate = xmalloc(T * ff * 4), r->up = xmalloc(T * ff * 4);
    r->cos_t = xmalloc(T * half * 4), r->sin_t = xmalloc(T * half * 4);
    return r;
}

Runner *runner_new_cpu(const CpuModel *m, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen) {
    if (n_slots < 1 || max_len < 1 || max_tokens_per_step < 1) {
        errf(err, errlen, "runner_new_cpu: n_slots %d, max_len %d, max_tokens_per_step %d: each must be >= 1", n_slots,
             max_len, max_tokens_per_step);
        return NULL;
    }
    Runner *r = cpu_runner_alloc(m, n_slots, max_len, max_tokens_per_step, "runner_new_cpu", err, errlen);
    if (r) snprintf(r->desc, sizeof r->desc, "cpu fp32 (row-deterministic GEMM), fp32 KV");
    return r;
}

// The Runner around a CUDA runner (NULL stays NULL: gr's constructor wrote err).
static Runner *wrap_gpu(GpuRunner *gr, int n_slots, int max_len, int max_tokens_per_step) {
    if (!gr) return NULL;
    Runner *r = xcalloc(1, sizeof *r);
    r->cuda = 1;
    r->gpu = gr;
    r->n_slots = n_slots, r->max_len = max_len, r->max_tokens = max_tokens_per_step;
    return r;
}

Runner *runner_new_cuda(GpuModel *g, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen) {
    return wrap_gpu(gpu_runner_new(g, n_slots, max_len, max_tokens_per_step, err, errlen), n_slots, max_len,
                    max_tokens_per_step);
}

Runner *runner_new_cpu_paged(const CpuModel *m, int num_blocks, int block_size, int max_model_len,
                             int max_tokens_per_step, char *err, int errlen) {
    if (num_blocks < 2 || block_size < 1 || max_model_len < 1 || max_tokens_per_step < 1) {
        errf(err, errlen,
             "runner_new_cpu_paged: num_blocks %d (>= 2: block 0 is the null block), block_size %d, max_model_len %d, "
             "max_tokens_per_step %d (each >= 1)",
             num_blocks, block_size, max_model_len, max_tokens_per_step);
        return NULL;
    }
    Runner *r = cpu_runner_alloc(m, num_blocks, block_size, max_tokens_per_step, "runner_new_cpu_paged", err, errlen);
    if (!r) return NULL;
    r->paged = 1, r->max_model_len = max_model_len;
    const size_t kd = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    r->kg = xmalloc((size_t)max_model_len * kd * sizeof(float));
    r->vg = xmalloc((size_t)max_model_len * kd * sizeof(float));
    snprintf(r->desc, sizeof r->desc, "cpu fp32 (row-deterministic GEMM), fp32 paged KV (%d blocks of %d)", num_blocks,
             block_size);
    return r;
}

Runner *runner_new_cuda_paged(GpuModel *g, int num_blocks, int block_size, int max_model_len,
                              int max_tokens_per_step, char *err, int errlen) {
    return wrap_gpu(gpu_runner_new_paged(g, num_blocks, block_size, max_model_len, max_tokens_per_step, err, errlen),
                    num_blocks, block_size, max_tokens_per_step);
}

void runner_free(Runner *r) {
    if (!r) return;
    if (r->gpu) gpu_runner_free(r->gpu);
    float *bufs[] = {r->kc, r->vc, r->kg, r->vg, r->x, r->xn, r->tmp, r->q, r->k, r->v, r->att,
                     r->gate, r->up, r->cos_t, r->sin_t, r->lx, r->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(r->prev_tok), free(r->slot_tok[0]), free(r->slot_tok[1]), free(r->fixed);
    free(r);
}

const char *runner_describe(const Runner *r) { return r->cuda ? gpu_runner_describe(r->gpu) : r->desc; }

int runner_set_prefill_attn(Runner *r, int mode) { return r->cuda ? gpu_runner_set_prefill_attn(r->gpu, mode) : PREFILL_GEMM; }
int runner_set_batch_invariant(Runner *r, int on) {
    if (!r->cuda) return 0;  // the CPU runner has no such mode (its BLAS picks blocking by shape too)
    return gpu_runner_set_batch_invariant(r->gpu, on);
}

double runner_kv_bytes(const Runner *r) {
    if (r->cuda) return gpu_runner_kv_bytes(r->gpu);
    const ModelConfig *c = &r->m->cfg;
    return 2.0 * c->n_layers * (double)r->n_slots * r->max_len * c->n_kv_heads * c->head_dim * sizeof(float);
}

static int forward_cpu_batch(Runner *r, const Batch *b, float *logits_out, int *argmax) {
    const CpuModel *m = r->m;
    const ModelConfig *c = &m->cfg;
    if (r->paged) {
        if (b->block_size != r->max_len) {
            fprintf(stderr, "runner_forward: a batch of block size %d, the runner's blocks hold %d\n", b->block_size, r->max_len);
            return -1;
        }
        if (batch_check_paged(b, r->n_slots, r->max_model_len, c->vocab) != 0) return -1;
    } else if (batch_check(b, r->n_slots, r->max_len, c->vocab) != 0) return -1;
    if (b->n_tokens > r->max_tokens) {
        fprintf(stderr, "runner_forward: %d rows, the runner was made for %d per step\n", b->n_tokens, r->max_tokens);
        return -1;
    }
    const int T = b->n_tokens, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const int qd = H * hd, kd = KV * hd, half = hd / 2, V = c->vocab;
    const size_t layer_rows = (size_t)r->n_slots * r->max_len;
    if (T == 0) return 0;

    // RoPE angles of every row's own position (a sequence's rows are contiguous positions)
    for (int i = 0; i < b->n_seqs; i++) {
        const int r0 = b->cu_seqlens_q[i], n = b->cu_seqlens_q[i + 1] - r0;
        if (n == 0) continue;
        if (b->seq_lens_k[i] == 0) {  // padding: rotate by nothing
            for (size_t e = (size_t)r0 * half; e < (size_t)(r0 + n) * half; e++) r->cos_t[e] = 1, r->sin_t[e] = 0;
            continue;
        }
        rope_table_cpu(c, b->positions[r0], n, r->cos_t + (size_t)r0 * half, r->sin_t + (size_t)r0 * half);
    }
    embed_cpu(m->embed, b->token_ids, T, d, r->x);
    for (int l = 0; l < c->n_layers; l++) {
        const CpuLayer *L = &m->layers[l];
        float *kc = r->kc + (size_t)l * layer_rows * kd, *vc = r->vc + (size_t)l * layer_rows * kd;
        rmsnorm_cpu(r->x, L->attn_norm, T, d, c->rms_eps, r->xn);
        proj_cpu(L, PROJ_Q, linear_rows_cpu, r->xn, T, d, qd, r->q);
        proj_cpu(L, PROJ_K, linear_rows_cpu, r->xn, T, d, kd, r->k);
        proj_cpu(L, PROJ_V, linear_rows_cpu, r->xn, T, d, kd, r->v);
        if (L->q_norm) rmsnorm_cpu(r->q, L->q_norm, T * H, hd, c->rms_eps, r->q);
        if (L->k_norm) rmsnorm_cpu(r->k, L->k_norm, T * KV, hd, c->rms_eps, r->k);
        rope_apply_cpu(r->q, T, H, hd, qd, r->cos_t, r->sin_t);
        rope_apply_cpu(r->k, T, KV, hd, kd, r->cos_t, r->sin_t);
        for (int t = 0; t < T; t++) {  // the new K/V rows into their slots (after RoPE, as step03)
            const int s = b->slot_mapping[t];
            if (s < 0) continue;
            memcpy(kc + (size_t)s * kd, r->k + (size_t)t * kd, (size_t)kd * sizeof(float));
            memcpy(vc + (size_t)s * kd, r->v + (size_t)t * kd, (size_t)kd * sizeof(float));
        }
        for (int i = 0; i < b->n_seqs; i++) {
            const int r0 = b->cu_seqlens_q[i], n = b->cu_seqlens_q[i + 1] - r0, len = b->seq_lens_k[i];
            float *out = r->att + (size_t)r0 * qd;
            if (len == 0) {
                memset(out, 0, (size_t)n * qd * sizeof(float));
                continue;
            }
            if (r->paged) {  // gather the context through the block table, a block's rows at a time
                const int B = r->max_len, *bt = b->block_tables + (size_t)i * b->bt_stride;
                for (int p = 0; p < len; p += B) {
                    const size_t rows = (size_t)(len - p < B ? len - p : B), src = (size_t)bt[p / B] * B * kd;
                    memcpy(r->kg + (size_t)p * kd, kc + src, rows * kd * sizeof(float));
                    memcpy(r->vg + (size_t)p * kd, vc + src, rows * kd * sizeof(float));
                }
                attention_at_cpu(r->q + (size_t)r0 * qd, r->kg, r->vg, len - n, n, H, KV, hd, out);
                continue;
            }
            const size_t base = (size_t)b->seq_slot[i] * r->max_len * kd;  // the slot's position 0
            attention_at_cpu(r->q + (size_t)r0 * qd, kc + base, vc + base, len - n, n, H, KV, hd, out);
        }
        proj_cpu(L, PROJ_O, linear_rows_cpu, r->att, T, qd, d, r->tmp);
        add_cpu(r->x, r->tmp, (long)T * d);
        // the MLP block of step02, with the row-deterministic projection
        mlp_block_lin_cpu(L, c, linear_rows_cpu, r->x, T, r->xn, r->gate, r->up, r->tmp);
    }
    // final norm and lm_head only for the rows that sample
    const int nl = b->n_logits;
    if (nl == 0) return 0;
    if (nl > r->cap_logits) {
        free(r->lx), free(r->logits);
        r->cap_logits = nl;
        r->lx = xmalloc((size_t)nl * d * sizeof(float));
        r->logits = xmalloc((size_t)nl * V * sizeof(float));
    }
    for (int i = 0; i < nl; i++) memcpy(r->lx + (size_t)i * d, r->x + (size_t)b->logit_rows[i] * d, (size_t)d * sizeof(float));
    rmsnorm_cpu(r->lx, m->final_norm, nl, d, c->rms_eps, r->lx);
    float *lg = logits_out ? logits_out : r->logits;
    lm_head_cpu(m, linear_rows_cpu, r->lx, nl, lg);
    if (argmax)
        for (int i = 0; i < nl; i++) argmax[i] = argmax_f32(lg + (size_t)i * V, V);
    return 0;
}

int runner_forward(Runner *r, const Batch *b, float *logits, int *argmax) {
    if (r->cuda) return gpu_runner_forward(r->gpu, b, logits, argmax);
    r->prev_valid = 0;
    return forward_cpu_batch(r, b, logits, argmax);
}

int runner_forward_sampled(Runner *r, const Batch *b, const float *temperature, const uint64_t *keys, int *tokens) {
    if (r->cuda) return gpu_runner_forward_sampled(r->gpu, b, temperature, keys, tokens);
    r->prev_valid = 0;
    if (forward_cpu_batch(r, b, NULL, NULL) != 0) return -1;  // the logits in r->logits
    const int V = r->m->cfg.vocab;
    for (int k = 0; k < b->n_logits; k++) {
        const float *row = r->logits + (size_t)k * V;
        tokens[k] = temperature && temperature[k] > 0 ? sample_gumbel(row, V, temperature[k], keys[k]) : argmax_f32(row, V);
    }
    return 0;
}

// The CPU runner's launch: the fix-ups from the previous launch's tokens (kept here as the GPU
// keeps them in device memory), the forward at once, the tokens held in the slot until collected.
int runner_launch(Runner *r, const Batch *b, const float *temperature, const uint64_t *keys, const int *fix_rows,
                  const int *fix_src, int n_fix, int slot) {
    if (r->cuda) return gpu_runner_launch(r->gpu, b, temperature, keys, fix_rows, fix_src, n_fix, slot);
    if (runner_launch_check("runner_launch", b, temperature, keys, fix_rows, fix_src, n_fix, slot,
                            r->slot_pend, r->prev_valid, r->n_prev) != 0)
        return -1;
    if (b->n_tokens > r->max_tokens) {
        fprintf(stderr, "runner_launch: %d rows, the runner was made for %d per step\n", b->n_tokens, r->max_tokens);
        return -1;
    }
    if (!r->fixed) {
        r->fixed = xmalloc((size_t)r->max_tokens * sizeof(int));
        for (int k = 0; k < 2; k++) r->slot_tok[k] = xmalloc((size_t)r->max_tokens * sizeof(int));
        r->prev_tok = xmalloc((size_t)r->max_tokens * sizeof(int));
    }
    memcpy(r->fixed, b->token_ids, (size_t)b->n_tokens * sizeof(int));
    for (int j = 0; j < n_fix; j++) r->fixed[fix_rows[j]] = r->prev_tok[fix_src[j]];
    Batch fb = *b;
    fb.token_ids = r->fixed;
    if (runner_forward_sampled(r, &fb, temperature, keys, r->slot_tok[slot]) != 0) return -1;
    memcpy(r->prev_tok, r->slot_tok[slot], (size_t)b->n_logits * sizeof(int));
    r->n_prev = b->n_logits, r->prev_valid = 1;
    r->slot_n[slot] = b->n_logits, r->slot_pend[slot] = 1;
    return 0;
}

int runner_collect(Runner *r, int slot, int *tokens) {
    if (r->cuda) return gpu_runner_collect(r->gpu, slot, tokens);
    if (slot < 0 || slot > 1 || !r->slot_pend[slot]) {
        fprintf(stderr, "runner_collect: slot %d holds no launch\n", slot);
        return -1;
    }
    memcpy(tokens, r->slot_tok[slot], (size_t)r->slot_n[slot] * sizeof(int));
    r->slot_pend[slot] = 0;
    return 0;
}

double runner_last_device_ms(const Runner *r) { return r->cuda ? gpu_runner_last_ms(r->gpu) : 0; }

int runner_set_graphs(Runner *r, int on) { return r->cuda ? gpu_runner_set_graphs(r->gpu, on) : 0; }

int runner_capture_graphs(Runner *r) { return r->cuda ? gpu_runner_capture_graphs(r->gpu) : 0; }

void runner_graph_stats(const Runner *r, long *replays, long *captures) {
    *replays = *captures = 0;
    if (r->cuda) gpu_runner_graph_stats(r->gpu, replays, captures);
}
