// batch.c — the flat batch of one step (batch.h): allocation, the consistency check, and the
// flattening of a scheduler plan (scheduler.h) into rows.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step04_batching/batch.h"
#include "step04_batching/scheduler.h"

void batch_alloc(Batch *b, int cap_seqs, int cap_tokens) {
    memset(b, 0, sizeof *b);
    b->cap_seqs = cap_seqs, b->cap_tokens = cap_tokens;
    b->token_ids = xmalloc((size_t)cap_tokens * sizeof(int));
    b->positions = xmalloc((size_t)cap_tokens * sizeof(int));
    b->slot_mapping = xmalloc((size_t)cap_tokens * sizeof(int));
    b->cu_seqlens_q = xmalloc((size_t)(cap_seqs + 1) * sizeof(int));
    b->seq_lens_k = xmalloc((size_t)cap_seqs * sizeof(int));
    b->seq_slot = xmalloc((size_t)cap_seqs * sizeof(int));
    b->logit_rows = xmalloc((size_t)cap_seqs * sizeof(int));
}

void batch_alloc_paged(Batch *b, int cap_seqs, int cap_tokens, int block_size, int bt_stride) {
    batch_alloc(b, cap_seqs, cap_tokens);
    b->block_size = block_size, b->bt_stride = bt_stride;
    b->block_tables = xcalloc((size_t)cap_seqs * bt_stride, sizeof(int));
}

void batch_free(Batch *b) {
    free(b->token_ids), free(b->positions), free(b->slot_mapping), free(b->cu_seqlens_q);
    free(b->seq_lens_k), free(b->seq_slot), free(b->logit_rows), free(b->block_tables);
    memset(b, 0, sizeof *b);
}

#define BAD(...) (fprintf(stderr, "batch_check: " __VA_ARGS__), fputc('\n', stderr), -1)

// The checks both layouts share: counts within capacity, cu_seqlens_q from 0 to n_tokens.
static int check_shape(const Batch *b) {
    if (b->n_seqs < 0 || b->n_seqs > b->cap_seqs) return BAD("n_seqs = %d outside 0..%d", b->n_seqs, b->cap_seqs);
    if (b->n_tokens < 0 || b->n_tokens > b->cap_tokens)
        return BAD("n_tokens = %d outside 0..%d", b->n_tokens, b->cap_tokens);
    if (b->cu_seqlens_q[0] != 0) return BAD("cu_seqlens_q[0] = %d, not 0", b->cu_seqlens_q[0]);
    if (b->cu_seqlens_q[b->n_seqs] != b->n_tokens)
        return BAD("cu_seqlens_q[%d] = %d, not n_tokens %d", b->n_seqs, b->cu_seqlens_q[b->n_seqs], b->n_tokens);
    return 0;
}

// logit_rows: increasing, each the last row of a real (non-padding) sequence.
static int check_logit_rows(const Batch *b) {
    if (b->n_logits < 0 || b->n_logits > b->n_seqs) return BAD("n_logits = %d outside 0..%d", b->n_logits, b->n_seqs);
    for (int i = 0, seq = 0; i < b->n_logits; i++) {
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return BAD("logit_rows[%d] = %d outside 0..%d", i, b->logit_rows[i], b->n_tokens - 1);
        if (i > 0 && b->logit_rows[i] <= b->logit_rows[i - 1])
            return BAD("logit_rows not increasing at %d (%d after %d)", i, b->logit_rows[i], b->logit_rows[i - 1]);
        // the last row of a real sequence (sequences and logit rows are both in row order)
        while (seq < b->n_seqs && b->cu_seqlens_q[seq + 1] - 1 < b->logit_rows[i]) seq++;
        if (seq == b->n_seqs || b->cu_seqlens_q[seq + 1] - 1 != b->logit_rows[i] || b->seq_lens_k[seq] == 0)
            return BAD("logit_rows[%d] = %d is not the last row of a sequence", i, b->logit_rows[i]);
    }
    return 0;
}

int batch_check(const Batch *b, int n_slots, int max_len, int vocab) {
    if (check_shape(b) != 0) return -1;
    for (int i = 0; i < b->n_seqs; i++) {
        const int r0 = b->cu_seqlens_q[i], r1 = b->cu_seqlens_q[i + 1], len = b->seq_lens_k[i];
        if (r1 < r0) return BAD("cu_seqlens_q decreases at sequence %d (%d -> %d)", i, r0, r1);
        if (len == 0) {  // a padding sequence: its rows write nothing
            for (int t = r0; t < r1; t++)
                if (b->slot_mapping[t] != -1) return BAD("slot_mapping[%d] = %d in padding sequence %d, not -1", t, b->slot_mapping[t], i);
            continue;
        }
        if (r1 == r0) return BAD("sequence %d has no rows", i);
        if (len < r1 - r0 || len > max_len)
            return BAD("seq_lens_k[%d] = %d: fewer than its %d rows or more than max_len %d", i, len, r1 - r0, max_len);
        const int slot = b->seq_slot[i];
        if (slot < 0 || slot >= n_slots) return BAD("seq_slot[%d] = %d outside 0..%d", i, slot, n_slots - 1);
        for (int t = r0; t < r1; t++) {
            const int pos = len - (r1 - t);
            if (b->positions[t] != pos) return BAD("positions[%d] = %d, expected %d (sequence %d)", t, b->positions[t], pos, i);
            if (b->slot_mapping[t] != slot * max_len + pos)
                return BAD("slot_mapping[%d] = %d, expected %d = slot %d * %d + %d", t, b->slot_mapping[t],
                           slot * max_len + pos, slot, max_len, pos);
            if (b->token_ids[t] < 0 || b->token_ids[t] >= vocab)
                return BAD("token_ids[%d] = %d outside the vocabulary [0, %d)", t, b->token_ids[t], vocab);
        }
    }
    return check_logit_rows(b);
}

int batch_check_paged(const Batch *b, int num_blocks, int max_model_len, int vocab) {
    if (b->block_size < 1 || b->bt_stride < 1 || !b->block_tables)
        return BAD("not a paged batch (block_size %d, bt_stride %d, block_tables %s)", b->block_size, b->bt_stride,
                   b->block_tables ? "set" : "NULL");
    if (check_shape(b) != 0) return -1;
    const int B = b->block_size;
    const long max_pos = (long)b->bt_stride * B < max_model_len ? (long)b->bt_stride * B : max_model_len;
    for (int i = 0; i < b->n_seqs; i++) {
        const int r0 = b->cu_seqlens_q[i], r1 = b->cu_seqlens_q[i + 1], len = b->seq_lens_k[i];
        if (r1 < r0) return BAD("cu_seqlens_q decreases at sequence %d (%d -> %d)", i, r0, r1);
        if (len == 0) {
            for (int t = r0; t < r1; t++)
                if (b->slot_mapping[t] != -1) return BAD("slot_mapping[%d] = %d in padding sequence %d, not -1", t, b->slot_mapping[t], i);
            continue;
        }
        if (r1 == r0) return BAD("sequence %d has no rows", i);
        if (len < r1 - r0 || len > max_pos)
            return BAD("seq_lens_k[%d] = %d: fewer than its %d rows or more than %ld positions", i, len, r1 - r0, max_pos);
        const int *bt = b->block_tables + (size_t)i * b->bt_stride;
        for (int j = 0; j < (len + B - 1) / B; j++)
            if (bt[j] < 1 || bt[j] >= num_blocks)
                return BAD("block_tables[%d][%d] = %d outside 1..%d (block 0 is the null block)", i, j, bt[j], num_blocks - 1);
        for (int t = r0; t < r1; t++) {
            const int pos = len - (r1 - t);
            const long slot = (long)bt[pos / B] * B + pos % B;
            if (b->positions[t] != pos) return BAD("positions[%d] = %d, expected %d (sequence %d)", t, b->positions[t], pos, i);
            if (b->slot_mapping[t] != slot)
                return BAD("slot_mapping[%d] = %d, expected %ld = block %d * %d + %d", t, b->slot_mapping[t], slot,
                           bt[pos / B], B, pos % B);
            if (b->token_ids[t] < 0 || b->token_ids[t] >= vocab)
                return BAD("token_ids[%d] = %d outside the vocabulary [0, %d)", t, b->token_ids[t], vocab);
        }
    }
    return check_logit_rows(b);
}

// Both layouts: kv NULL = step04's slots of max_len positions; else step05's block tables.
static void from_plan(Batch *b, const SchedPlan *p, const Request *reqs, int max_len, const KvBlocks *kv) {
    int row = 0, seq = 0, n_pad_prompt = 0;
    b->n_logits = 0;
    b->cu_seqlens_q[0] = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->pad[i] == PLAN_PAD_PROMPT) {  // rows of the padding sequence, added last
            n_pad_prompt += p->n_new[i];
            continue;
        }
        const Request *r = &reqs[p->req[i]];
        const KvTable *t = kv ? kvb_table(kv, p->req[i]) : NULL;
        if (kv) {
            if (!t || t->n > b->bt_stride || (long)t->n * kv->block_size < p->start[i] + p->n_new[i])
                die("batch_from_plan_paged: request %d's block table (%d blocks) does not cover %d positions or exceed "
                    "bt_stride %d", p->req[i], t ? t->n : 0, p->start[i] + p->n_new[i], b->bt_stride);
            memcpy(b->block_tables + (size_t)seq * b->bt_stride, t->blocks, (size_t)t->n * sizeof(int));
        }
        for (int j = 0; j < p->n_new[i]; j++, row++) {
            const int pos = p->start[i] + j;
            // a padding decode (a finished static member) feeds its last token at its next position
            b->token_ids[row] = r->tokens[pos < r->num_tokens ? pos : r->num_tokens - 1];
            b->positions[row] = pos;
            b->slot_mapping[row] = kv ? t->blocks[pos / kv->block_size] * kv->block_size + pos % kv->block_size
                                      : r->slot * max_len + pos;
        }
        b->cu_seqlens_q[seq + 1] = row;
        b->seq_lens_k[seq] = p->start[i] + p->n_new[i];
        b->seq_slot[seq] = r->slot;
        seq++;
        if (p->samples[i]) b->logit_rows[b->n_logits++] = row - 1;
    }
    if (n_pad_prompt > 0) {  // prompt padding: computed rows that touch no KV and give no logits
        for (int j = 0; j < n_pad_prompt; j++, row++) b->token_ids[row] = 0, b->positions[row] = 0, b->slot_mapping[row] = -1;
        b->cu_seqlens_q[seq + 1] = row;
        b->seq_lens_k[seq] = 0;
        b->seq_slot[seq] = -1;
        seq++;
    }
    b->n_seqs = seq;
    b->n_tokens = row;
}

void batch_from_plan(Batch *b, const SchedPlan *p, const Request *reqs, int max_len) { from_plan(b, p, reqs, max_len, NULL); }

void batch_from_plan_paged(Batch *b, const SchedPlan *p, const Request *reqs, const KvBlocks *kv) {
    if (b->block_size != kv->block_size || !b->block_tables)
        die("batch_from_plan_paged: a batch of block size %d for a pool of block size %d", b->block_size, kv->block_size);
    from_plan(b, p, reqs, 0, kv);
}

int runner_launch_check(const char *who, const Batch *b, const float *temperature, const uint64_t *keys,
                        const int *fix_rows, const int *fix_src, int n_fix, int slot, const int pend[2], int prev_launch,
                        int n_prev) {
#define LAUNCH_BAD(...) do { fprintf(stderr, "%s: ", who); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return -1; } while (0)
    if (slot < 0 || slot > 1) LAUNCH_BAD("slot %d: need 0 or 1", slot);
    if (pend[slot]) LAUNCH_BAD("slot %d still holds a launch: collect it first", slot);
    if ((temperature == NULL) != (keys == NULL)) LAUNCH_BAD("temperature and keys go together");
    if (n_fix < 0 || n_fix > b->n_tokens || (n_fix > 0 && (!fix_rows || !fix_src))) LAUNCH_BAD("n_fix %d", n_fix);
    if (n_fix > 0 && !prev_launch) LAUNCH_BAD("rows take the previous launch's tokens, but the last forward was not a launch");
    for (int j = 0; j < n_fix; j++)
        if (fix_rows[j] < 0 || fix_rows[j] >= b->n_tokens || fix_src[j] < 0 || fix_src[j] >= n_prev)
            LAUNCH_BAD("fix-up %d: row %d, source %d (the previous launch drew %d tokens)", j, fix_rows[j], fix_src[j], n_prev);
#undef LAUNCH_BAD
    return 0;
}
