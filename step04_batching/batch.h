// batch.h — the shapes step04 shares with step05, step06, step07 and final/: the request, the
// flat batch of one engine step, and the runner that turns a batch into logits.
// defines: ReqStatus, FinishReason, Request, Batch, batch_alloc, batch_free, batch_check,
//          batch_alloc_paged, batch_check_paged, runner_new_cpu_paged, runner_new_cuda_paged,
//          Runner, runner_new_cpu, runner_new_cuda, runner_free, runner_forward, runner_describe,
//          runner_kv_bytes, runner_set_prefill_attn, runner_set_batch_invariant, runner_launch, runner_collect,
//          sample_keyed
//
// One engine step (vLLM v1's rule, no "prefill phase" and "decode phase"):
//   plan   = scheduler_schedule(...)     who runs and how many new tokens each (scheduler.h)
//   batch  = the plan flattened           every new token of every scheduled sequence, one row each
//   logits = runner_forward(batch)        linear layers once over all rows; attention per sequence
//   tokens = sample_keyed(...)            only rows whose sequence is then fully computed sample
//   scheduler_update(plan, tokens)        append, finish, free
//
// KV in step04: one contiguous region of max_len positions per sequence ("slot" s holds
// positions 0..max_len-1 of one sequence). The K/V of a new token at position p of a sequence in
// slot s is written at row s * max_len + p of every layer's cache: step05 generalizes this to
// block_table[p / B] * B + p % B (here B = max_len and every sequence has one block).
#pragma once
#include <stdint.h>

#include "hf_config.h"
#include "step02_attention/forward.h"
#include "step03_kvcache/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- request
typedef enum { REQ_WAITING = 0, REQ_RUNNING, REQ_FINISHED } ReqStatus;
typedef enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_ERROR } FinishReason;

typedef struct {
    int index;            // position in the input (requests are reported in input order)
    int *tokens;          // (cap) prompt ids, then generated ids
    int cap;              // num_prompt + max_tokens
    int num_prompt;       // prompt length
    int num_tokens;       // prompt + generated so far
    int num_computed;     // tokens whose K/V exist (0 <= num_computed <= num_tokens)
    int max_tokens;       // generated tokens at most
    int ignore_eos;
    SamplerParams sp;     // temperature / top-k / top-p / min-p / seed (step03's)
    ReqStatus status;
    FinishReason finish;
    int slot;             // KV slot while running, -1 otherwise
    int cancel;           // set by a client; the engine aborts at the next step boundary
    double arrival_s, first_sched_s, first_token_s, finish_s;  // -1 until it happens
    int pending;          // final/'s overlapped loop: 1 while its last token (tokens[num_tokens - 1]) was drawn
                          // on the device and is not known on the host yet (the scheduler keys no block holding it)
} Request;

// ---------------------------------------------------------------- the flat batch of one step
// All new tokens of the step concatenated: n_tokens rows, sequence i owns rows
// cu_seqlens_q[i] .. cu_seqlens_q[i+1]-1, at positions seq_lens_k[i] - (its row count) ..
// seq_lens_k[i] - 1 (its context after this step is seq_lens_k[i] tokens).
typedef struct {
    int n_seqs, n_tokens;
    int cap_seqs, cap_tokens;  // allocated sizes
    int *token_ids;     // (n_tokens)
    int *positions;     // (n_tokens)
    int *slot_mapping;  // (n_tokens) where its K/V row goes: seq_slot * max_len + position; -1 = padding, skipped
    int *cu_seqlens_q;  // (n_seqs + 1)
    int *seq_lens_k;    // (n_seqs) context length after this step, 0 = padding sequence
    int *seq_slot;      // (n_seqs) the sequence's KV slot (step05: its block table)
    int n_logits;
    int *logit_rows;    // (n_logits) rows whose logits are computed, in order (a sequence's last row)
    // step05's paged KV (block_size > 0): position p of sequence i lives at cache row
    //   block_tables[i * bt_stride + p / block_size] * block_size + p % block_size
    // and slot_mapping holds exactly that for the new rows; seq_slot is then unused. block_size 0
    // (batch_alloc) = step04's slots: row seq_slot[i] * max_len + p.
    int block_size, bt_stride;
    int *block_tables;  // (cap_seqs, bt_stride), by batch_alloc_paged; NULL in a step04 batch
} Batch;

void batch_alloc(Batch *b, int cap_seqs, int cap_tokens);
void batch_free(Batch *b);
// 0 if the batch is consistent for a cache of n_slots slots of max_len positions (cu_seqlens_q
// increasing, positions contiguous and ending at seq_lens_k - 1, slots in range, slot_mapping
// equal to the formula); else -1 with a message naming the first bad field.
int batch_check(const Batch *b, int n_slots, int max_len, int vocab);
// step05: a batch with block tables of bt_stride entries per sequence (bt_stride * block_size
// positions at most per sequence).
void batch_alloc_paged(Batch *b, int cap_seqs, int cap_tokens, int block_size, int bt_stride);
// As batch_check for a paged batch over a pool of num_blocks blocks (block 0, the null block,
// in no table): positions below max_model_len, every table entry a sequence's context covers in
// 1 .. num_blocks-1, slot_mapping equal to the block-table formula.
int batch_check_paged(const Batch *b, int num_blocks, int max_model_len, int vocab);

// ---------------------------------------------------------------- runner
// Owns the weights (borrowed), the KV memory of n_slots * max_len positions and the workspaces;
// runs one flat batch. CPU: the fp32 reference (step02/03 ops). CUDA: step02's GpuModel
// weights, GEMMs over all n_tokens rows, attention per sequence over its cached prefix plus
// causal inside its chunk, K/V written through slot_mapping.
typedef struct Runner Runner;

Runner *runner_new_cpu(const CpuModel *m, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen);
Runner *runner_new_cuda(GpuModel *g, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen);
// step05: the KV memory as a pool of num_blocks blocks of block_size positions (num_blocks *
// block_size rows per layer, block 0 the null block); batches carry block tables (batch_alloc_paged)
// and positions stay below max_model_len. The CPU one gathers a sequence's context through its
// block table and runs the same attention_at_cpu (so outputs do not depend on the block size);
// the CUDA one runs step05's paged attention kernels.
Runner *runner_new_cpu_paged(const CpuModel *m, int num_blocks, int block_size, int max_model_len,
                             int max_tokens_per_step, char *err, int errlen);
Runner *runner_new_cuda_paged(GpuModel *g, int num_blocks, int block_size, int max_model_len,
                              int max_tokens_per_step, char *err, int errlen);
void runner_free(Runner *r);
const char *runner_describe(const Runner *r);  // "cpu fp32" / "cuda bf16 weights, bf16 KV, cuBLAS GEMMs"
double runner_kv_bytes(const Runner *r);       // bytes of K/V memory allocated
// The CUDA runners' attention for prompt chunks of more than one row (gpu_runner_set_prefill_attn):
#define PREFILL_GEMM 0   // step02's GEMM-softmax-GEMM per sequence (paged: after a block-table gather)
#define PREFILL_PAGED 1  // step05's fused paged prefill, one launch per layer (paged KV only)
#define PREFILL_FLASH 2  // step07's flash attention, one launch per layer (both layouts; the default
                         // where one of its tensor-core versions takes the model's shape)
// Returns the path in effect: the one asked for, or the next one that takes the shape (flash ->
// paged -> GEMM); the CPU runners: PREFILL_GEMM (they have one path).
int runner_set_prefill_attn(Runner *r, int mode);
// CUDA, paged KV: gpu_runner_set_batch_invariant (greedy outputs independent of the batching).
// Returns 1 when the runner is in that mode now (0 on the CPU, which has no such mode).
int runner_set_batch_invariant(Runner *r, int on);
// logits (n_logits, vocab) on the host for the batch's logit_rows when logits != NULL;
// argmax (n_logits) of each of those rows when argmax != NULL (on the GPU without copying the
// logits). 0, or -1 with a message on stderr.
int runner_forward(Runner *r, const Batch *b, float *logits, int *argmax);
// One token per logit row, drawn where the logits are: row k greedy (its argmax) when
// temperature[k] <= 0, else sample_gumbel(row, temperature[k], keys[k]) (on the GPU by one
// kernel over the device logits: nothing but the tokens comes back). 0, or -1 as runner_forward.
int runner_forward_sampled(Runner *r, const Batch *b, const float *temperature, const uint64_t *keys, int *tokens);
// Overlapped steps (final/'s engine loop): runner_launch queues a forward whose tokens are drawn
// where the logits are (as runner_forward_sampled; temperature and keys NULL: the argmax of every
// row) into slot 0 or 1 and returns without waiting for it; runner_collect(slot) waits and copies
// its n_logits tokens out. Two launches may be outstanding, one per slot; the device runs them in
// launch order. Rows fix_rows[j] (n_fix of them) take as their input token the one that logit row
// fix_src[j] of the previous launch drew: a token the host has not seen yet (their token_ids are
// ignored); the previous forward must then have been a launch. So the host prepares step N+1
// while the device runs step N. The CPU runners compute at launch (nothing overlaps; the same
// calls and results, so the engine's loop is tested without a GPU). 0, or -1 with a message.
int runner_launch(Runner *r, const Batch *b, const float *temperature, const uint64_t *keys, const int *fix_rows,
                  const int *fix_src, int n_fix, int slot);
// runner_launch's arguments against the runner's state, for both runners: pend (each slot holds a
// launch not collected yet), prev_launch (the last forward was a launch) and n_prev (its logit
// rows, the fix-ups' sources). 0, or -1 with a message on stderr naming who.
int runner_launch_check(const char *who, const Batch *b, const float *temperature, const uint64_t *keys,
                        const int *fix_rows, const int *fix_src, int n_fix, int slot, const int pend[2], int prev_launch,
                        int n_prev);
int runner_collect(Runner *r, int slot, int *tokens);
// CUDA runners: decode steps (every sequence one new row, paged KV, not batch-invariant) replayed
// from CUDA graphs captured per batch-size bucket (on: the default; off = eager, every kernel
// launched by the host each step). Returns the state now (0 on the CPU).
int runner_set_graphs(Runner *r, int on);
// The last forward's device time in ms (CUDA events around its upload and kernels; 0 on the CPU).
double runner_last_device_ms(const Runner *r);
// Graph replays and captures since the runner was made (0 on the CPU).
void runner_graph_stats(const Runner *r, long *replays, long *captures);
// CUDA runners: capture every decode-step graph now (each batch-size bucket, each decode kernel,
// argmax and sampler), as vLLM does at startup, so that no step of a run pays for a capture.
// Before the first real step only (its dummy steps write into KV block 1). Returns the graphs made
// (0 on the CPU, with graphs off, or with LLM_GRAPHS_UPFRONT=0 in the environment: the graphs are
// then captured as each bucket's steps come), -1 on failure.
int runner_capture_graphs(Runner *r);

// ---------------------------------------------------------------- sampling, keyed
// One token from logits (vocab) with step03's filters; the uniform draw comes from a PCG32
// seeded by a hash of (sp->seed, request index, position), so a sampled token depends only on
// the request and where it is, never on its batch mates or on the step it ran in.
// Temperature-only parameters (sample_is_plain: no top-k, top-p, min-p) draw by Gumbel-max
// (gumbel.h), the draw runner_forward_sampled makes on the device; the others re-seed step03's
// sampler from the key. greedy / temperature <= 0: the argmax.
int sample_keyed(Sampler *s, const SamplerParams *sp, int request_index, int position, const float *logits);
int sample_is_plain(const SamplerParams *sp);
// argmax_i (logits[i] / temperature + Gumbel noise of (key, i)): a draw from softmax(logits / T).
int sample_gumbel(const float *logits, int vocab, float temperature, uint64_t key);

#ifdef __cplusplus
}
#endif
