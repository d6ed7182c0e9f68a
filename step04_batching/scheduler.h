// scheduler.h — who runs each step, and how many new tokens each gets; the KV slots of step04.
// defines: SchedPolicy, SchedConfig, SchedPlan, KvSlots, SchedStats, Scheduler, sched_init, sched_free,
//          sched_schedule, sched_update, sched_stop, sched_stops_at, sched_add, sched_done, sched_next_arrival, sched_num_waiting, batch_from_plan,
//          batch_from_plan_paged, policy_name, finish_reason_name, request_init, request_free
//
// vLLM v1's one rule (continuous batching). Every request has num_tokens (prompt + generated)
// and num_computed (tokens whose K/V exist). Each step:
//   1. running requests, in the order they were admitted, get n = min(num_tokens - num_computed,
//      budget left) new tokens;
//   2. then waiting requests that have arrived, in arrival order, are admitted while a sequence
//      seat (max_num_seqs) and their KV reservation are free, each with the same n; the first
//      one that does not fit stops admission (first come, first served: nobody overtakes it).
// The budget is max_num_batched_tokens per step. A prompt longer than what is left is split
// (chunked prefill); a decode is n = 1; a step mixes both. Only a request whose whole known
// sequence is computed after the step samples a token; a partial chunk samples none.
//
// Static batching (the baseline): the same per-step rule inside a batch, but a batch of up to
// max_num_seqs requests is formed only when the previous batch has completely finished, and it
// runs until its longest request ends. Its padding is computed, as in a padded batch tensor
// (what a model's generate() runs): every member's prompt is left-padded to the batch's
// longest, each padding row going through the model as a row of a padding sequence (slot -1,
// seq_lens_k 0: GEMM rows that touch no KV and give no logits) ahead of the member's real
// prompt rows; a member that has finished keeps its row until the batch ends, decoding its last
// token at its next position in its own slot (its K/V written there, so its attention grows as
// in the padded tensor) without logits: what it would produce is discarded, its output, finish
// reason and times stay as they were at its real finish. Padding rows share the token budget;
// real work is scheduled first, a finished member's row takes what is left. A padding decode
// row stops at max_len (batch_bench sizes slots for the longest prompt + the longest output).
//
// KV in step04 (KvSlots): one contiguous slot of max_len positions per running sequence; a
// request is admitted only if prompt + max_tokens (capped at max_len) fits into the KV token
// budget next to what the running requests reserved, so a running request never runs out of KV
// and nothing is ever preempted. What is reserved but not (yet) written is the waste step05's
// paging removes. A request that can never fit (prompt >= max_len, reservation > the budget)
// ends at once with FINISH_ERROR; a cancel flag ends a request (running or waiting) at the next
// step boundary, also with FINISH_ERROR.
//
// step05's paged KV (SchedConfig.block_size > 0; continuous batching only): no reservations. The
// KV memory is a pool of blocks (step05_paged/kv_blocks.h) and a request holds only the blocks its
// computed tokens need. Admission asks for the blocks of the first chunk alone, after the prefix
// cache's hits (which set num_computed); a running request gets the blocks of its new tokens each
// step, oldest first, and when the pool is out of blocks the newest running request is preempted
// (its blocks freed, num_computed = 0, back to the head of the waiting queue: it is recomputed
// later) until the allocation succeeds; a step that preempted admits nobody. A request that can
// never fit (its prompt + output needs more blocks than the pool holds) ends with FINISH_ERROR at
// once. The paged-only code is step05_paged/sched_paged.c.
#pragma once
#include "step04_batching/batch.h"
#include "step05_paged/kv_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { POLICY_CONTINUOUS = 0, POLICY_STATIC } SchedPolicy;

typedef struct {
    SchedPolicy policy;
    int max_num_seqs;            // running sequences at most (= KV slots)
    long max_num_batched_tokens; // new tokens per step at most (the token budget)
    int max_len;                 // positions per KV slot (max_model_len): prompt + output at most
    long kv_tokens;              // KV token budget for reservations (default max_num_seqs * max_len)
    // step05's paged KV: block_size 0 = step04's slots (the fields below unused)
    int block_size;              // positions per block
    int num_blocks;              // the pool, the null block included (0: kv_tokens / block_size + 1)
    int prefix_cache;            // 1: full blocks are hashed and shared between requests (kv_blocks.h)
    int n_eos;                   // ids that end a request (unless it ignores EOS)
    int eos[8];
} SchedConfig;

// Kinds of plan entries: a real chunk of a request, or (static batching only) padding rows.
enum { PLAN_REAL = 0, PLAN_PAD_PROMPT, PLAN_PAD_DECODE };

// One step's plan: n entries, entry i is request req[i] with n_new[i] new rows starting at
// position start[i]; samples[i] = 1 when it is fully computed after the step. pad[i]:
// PLAN_REAL; PLAN_PAD_PROMPT = n_new[i] rows of prompt padding for batch member req[i] (start
// 0, no KV, flattened into one padding sequence); PLAN_PAD_DECODE = one padding decode row of
// the finished member req[i] at position start[i] in its slot (its output is discarded).
typedef struct {
    int n, cap;
    int *req, *n_new, *start, *samples, *pad;
    long n_tokens;  // Σ n_new: the rows of the step, padding included
    long n_pad;     // of n_tokens, padding rows
    int n_samples;
} SchedPlan;

// The KV manager of step04: which slot each running request holds, and the token reservations.
typedef struct {
    int n_slots, max_len;
    long budget;      // tokens that may be reserved at once
    long reserved;    // Σ reservation of the requests holding a slot
    int *free_slots;  // (n_slots) stack of free slot ids
    int n_free;
    long *reservation;  // (n_slots) tokens reserved by the slot's request, 0 when free
} KvSlots;

typedef struct {
    long steps;           // steps that ran a forward
    long tokens;          // Σ scheduled real tokens = computed rows holding a token of a request
    long idle_slots;      // static: padding rows computed (prompt padding + finished members' rows)
    long pad_slots;       // static: of idle_slots, the prompt padding to the batch's longest prompt
    long seq_steps;       // Σ over steps of sequences with a KV slot in the step (padding decodes too)
    long peak_used;       // max over steps of Σ num_computed of slot holders (KV tokens written)
    long peak_reserved;   // max over steps of Σ reservations
    double used_sum, reserved_sum;  // Σ over steps, for the reserved-but-unused fraction
    long batches;         // static: batches formed
    // the last step's KV (after sched_update): tokens written by the holders (paged: distinct rows,
    // a shared block counted once) and tokens reserved (paged: allocated = blocks in use x B)
    long kv_used_now, kv_reserved_now;
    int peak_running;     // max over steps of the running sequences (KV holders)
    long preemptions;     // paged: requests preempted (recomputed later)
    long peak_blocks_used;  // paged: max over steps of blocks in use
    long prefix_query_tokens, prefix_hit_tokens;  // paged: Σ num_tokens and Σ cached tokens at admissions
} SchedStats;

typedef struct {
    SchedConfig cfg;
    Request *reqs;  // (n_reqs) borrowed
    int n_reqs;
    int *waiting;   // request indices in arrival order (ties: input order); [w_head, n_reqs) not admitted
    int w_head;
    int *running;   // (max_num_seqs) admitted and not finished, in admission order
    int n_running;
    int *batch;     // static: the current batch's members (finished ones stay until the batch ends)
    int n_batch;
    int *pad_left;  // static, per request: prompt padding rows not yet computed
    int *pad_pos;   // static, per request: a finished member's next padding position (-1: none)
    int n_finished;
    int cap_reqs;     // entries of waiting, pad_left, pad_pos (sched_add grows them)
    KvSlots kv;       // step04's slots (block_size 0)
    int paged;        // 1: step05's block pool below instead of kv
    KvBlocks blocks;  // block tables by request index (the request's slot field holds that index while running)
    SchedStats st;
} Scheduler;

const char *policy_name(SchedPolicy p);
const char *finish_reason_name(FinishReason f);  // "stop", "length", "error", "none"

// A request of prompt ids (copied) that may generate max_tokens tokens; status waiting.
void request_init(Request *r, int index, const int *prompt, int n_prompt, int max_tokens, const SamplerParams *sp,
                  int ignore_eos, double arrival_s);
void request_free(Request *r);

// 0, or -1 + err (bad limits; paged KV with static batching). Requests whose prompt cannot fit
// (prompt >= max_len, or reservation > kv_tokens; paged: min(prompt + max_tokens, max_len) - 1
// positions need more blocks than the pool's num_blocks - 1) are finished at once with
// FINISH_ERROR: they never block the queue.
int sched_init(Scheduler *s, const SchedConfig *cfg, Request *reqs, int n_reqs, char *err, int errlen);
void sched_free(Scheduler *s);
// The plan of the next step at engine time now (seconds); plan->n == 0 when nothing can run
// (nothing arrived yet, or everything finished). Sets first_sched_s of newly scheduled requests.
void sched_schedule(Scheduler *s, double now, SchedPlan *plan);
// After the forward: tokens[i] is the token sampled for plan entry i (read only where
// plan->samples[i]; padding entries never sample). Advances num_computed, appends, finishes
// (EOS / max_tokens / max_len), frees slots, records first_token_s and finish_s = now.
void sched_update(Scheduler *s, const SchedPlan *plan, const int *tokens, double now);
// Request i ends now with why, wherever it is: running (its KV freed), waiting (out of the queue),
// finished (nothing). final/'s overlapped loop: a token that comes back as EOS after the next
// step was already planned.
void sched_stop(Scheduler *s, int i, FinishReason why, double now);
// 1 when token tok ends request r (one of the EOS ids, and r does not ignore them).
int sched_stops_at(const SchedConfig *c, const Request *r, int tok);
// A request that arrives while the loop runs (final/'s engine): reqs[s->n_reqs], set up by
// request_init, of a table that may have been reallocated since (reqs is its base now; the
// scheduler keeps indices, never pointers). Joins the waiting queue in arrival order, or, when it
// can never run (as at sched_init), finishes at once with FINISH_ERROR. Returns its index.
int sched_add(Scheduler *s, Request *reqs);
int sched_done(const Scheduler *s);             // every request finished
int sched_num_waiting(const Scheduler *s);      // not admitted (or preempted) and not finished
double sched_next_arrival(const Scheduler *s);  // arrival_s of the first not yet admitted, or -1
void plan_free(SchedPlan *p);

// The flat batch of a plan (batch.h): rows in plan order, slot_mapping = slot * max_len + pos,
// logit_rows = the last row of every sequence that samples; the PLAN_PAD_PROMPT rows of all
// entries go last, as one padding sequence (token 0, position 0, slot -1, seq_lens_k 0). b must
// hold plan->n + 1 seqs and plan->n_tokens rows.
void batch_from_plan(Batch *b, const SchedPlan *plan, const Request *reqs, int max_len);
// The same for a paged batch (batch_alloc_paged, bt_stride >= the blocks of max_len positions):
// every sequence's block table copied from kv, slot_mapping = block_table[pos / B] * B + pos % B.
void batch_from_plan_paged(Batch *b, const SchedPlan *plan, const Request *reqs, const KvBlocks *kv);

#ifdef __cplusplus
}
#endif
