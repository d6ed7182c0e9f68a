// runner_gpu.h — the CUDA half of the step04 runner (runner_gpu.cu; runner_gpu_none.c when built
// without nvcc). runner.c wraps it behind batch.h's Runner; programs and tests use Runner.
// defines: GpuRunner, gpu_runner_new, gpu_runner_new_paged, gpu_runner_free, gpu_runner_describe, gpu_runner_kv_bytes,
//          gpu_runner_forward, gpu_runner_forward_sampled, gpu_runner_launch, gpu_runner_collect, gpu_runner_set_graphs, gpu_runner_set_lone_decode,
//          gpu_runner_graph_stats, gpu_runner_capture_graphs,
//          gumbel_sample_gpu_check, argmax_rows_gpu_check, gpu_runner_last_ms, gpu_runner_launches, gpu_runner_set_small_chunk,
//          gpu_runner_set_prefill_attn, gpu_runner_set_batch_invariant, gpu_runner_read_kv, batch_attention_gpu_check, batch_attention_gpu_check_paged,
//          step04_decode_attention_dev, LongAttnBench, long_attn_bench_new, long_attn_bench_run,
//          long_attn_bench_free
//
// KV memory: per layer K and V of (n_slots * max_len, n_kv_heads * head_dim) in the weight
// dtype (step05's paged runner: (num_blocks * block_size, ...)); the new tokens' K/V rows are
// written at batch->slot_mapping[t] (-1: skipped).
#pragma once
#include "step04_batching/batch.h"
#include "step05_paged/paged_prefill.h"  // PrefillChunk

#ifdef __cplusplus
extern "C" {
#endif

typedef struct GpuRunner GpuRunner;

// NULL + err on failure (no CUDA, out of device memory, bad sizes).
GpuRunner *gpu_runner_new(GpuModel *g, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen);
// step05: K/V as a pool of num_blocks blocks of block_size positions; batches carry block
// tables (batch.h) and attention reads the context through them (step05's paged kernels):
// by default every chunk of more than one row through one flash attention launch per layer
// (step07, or step05's fused paged prefill: gpu_runner_set_prefill_attn) and the one-row sequences
// (decodes) through paged decode v1/v2; after gpu_runner_set_prefill_attn(r, PREFILL_GEMM), sequences with <= small_chunk new rows through paged
// decode v1/v2 (one work item per row) and longer chunks each through a block-table gather into
// a contiguous scratch + the GEMM path. Every
// forward checks the batch's block_size, positions < max_model_len and that every table entry a
// context covers is in 1 .. num_blocks-1. gpu_runner_read_kv's row is then block * B + offset.
GpuRunner *gpu_runner_new_paged(GpuModel *g, int num_blocks, int block_size, int max_model_len,
                                int max_tokens_per_step, char *err, int errlen);
void gpu_runner_free(GpuRunner *r);
const char *gpu_runner_describe(const GpuRunner *r);
double gpu_runner_kv_bytes(const GpuRunner *r);
// As runner_forward (batch.h): logits (n_logits, vocab) to the host when logits != NULL; argmax
// (n_logits) computed on the device when argmax != NULL. 0, or -1 with a message on stderr.
int gpu_runner_forward(GpuRunner *r, const Batch *b, float *logits, int *argmax);
// As runner_forward_sampled (batch.h): the tokens (n_logits) drawn on the device, greedy where
// temperature[k] <= 0, else Gumbel-max keyed by keys[k] (gumbel.h).
int gpu_runner_forward_sampled(GpuRunner *r, const Batch *b, const float *temperature, const uint64_t *keys,
                               int *tokens);
// As runner_launch / runner_collect (batch.h): the step queued on the device into slot 0 or 1 and
// its tokens (argmax, or drawn where temperature) copied into the slot's pinned buffer; collect
// waits for that copy. Rows fix_rows[j] take sample fix_src[j] of the previous launch (still in
// d_argmax: a small kernel writes it into the uploaded token ids before the embedding). 0, or -1
// with a message (a slot still held, fix-ups after a synchronous forward, bad rows).
int gpu_runner_launch(GpuRunner *r, const Batch *b, const float *temperature, const uint64_t *keys, const int *fix_rows,
                      const int *fix_src, int n_fix, int slot);
int gpu_runner_collect(GpuRunner *r, int slot, int *tokens);
// CUDA graphs for decode steps (runner_set_graphs): 1 on (the default), 0 eager. Returns the state.
int gpu_runner_set_graphs(GpuRunner *r, int on);
// The lone decode row (a step of one sequence with one new row: batch-1 decode): 0 step02/03's
// kernels one after the other (RMSNorm, GEMV, SwiGLU, argmax apart); 1 step07's fused chain (the
// RMSNorms and the SwiGLU inside the GEMVs, the argmax across many blocks); 2 the chain with
// programmatic dependent launch (sm_90; elsewhere as 1); 3 (the default) as 2 with the RoPE, the K/V
// write and the paged attention in one kernel (step07's attn_fused2_paged, where it takes the shape:
// a 16-bit cache, head_dim 64 or 128; elsewhere the two kernels of 2; 3-4% faster than 2 on an H100
// for the Llama-3.1-8B shape, in two leases). LLM_B1_FUSED=0 / LLM_PDL=0 / LLM_B1_ATTN=0 lower the
// default to 0 / 1 / 2. A change of mode drops the captured decode graphs
// (they hold the old mode's kernels). Returns the mode in effect.
int gpu_runner_set_lone_decode(GpuRunner *r, int mode);
void gpu_runner_graph_stats(const GpuRunner *r, long *replays, long *captures);
// Every decode-step graph captured now, on dummy steps (runner_capture_graphs): the number made, 0
// when graphs are off, LLM_GRAPHS_UPFRONT=0 or the runner makes none, -1 when a step failed. Call it before the first
// real step: its dummy steps write K/V rows into block 1.
int gpu_runner_capture_graphs(GpuRunner *r);
// Row k of the last forward's logits (vocab floats, from the device buffer the lm_head wrote; a
// graph step's too): for the tests, which check graph steps against eager ones by their top-5.
// 0, or -1 when k is not one of the last forward's logit rows (or they took several GEMMs).
int gpu_runner_last_logits(const GpuRunner *r, int k, float *out);
// The device sampler alone on host logits (rows, vocab): tokens as gpu_runner_forward_sampled
// draws them. 0, or -1 without a GPU.
int gumbel_sample_gpu_check(const float *logits, int rows, int vocab, const float *temperature, const uint64_t *keys,
                            int *tokens);
// The device argmax of each row (the greedy steps' kernel) on host logits. 0, or -1 without a GPU.
int argmax_rows_gpu_check(const float *logits, int rows, int vocab, int *tokens);
// Device time of the last forward (CUDA events from the batch upload to the last kernel), ms.
double gpu_runner_last_ms(const GpuRunner *r);
// Kernel launches (cuBLAS calls counted as one each) the last forward enqueued.
int gpu_runner_launches(const GpuRunner *r);
// Attention path: a sequence with at most `rows` new rows (decodes, short chunks) runs the split
// decode kernel, longer chunks the GEMM-softmax-GEMM path (default 16). 0: GEMM path for all;
// a large value: the decode kernel for all. For the tests and the benchmark.
void gpu_runner_set_small_chunk(GpuRunner *r, int rows);
// The prompt-chunk path (batch.h's PREFILL_*): PREFILL_FLASH (the default where a tensor-core
// version of step07's flash attention takes the shape: one flash_attn launch per layer for all of
// a step's chunks of more than one row, every key read from the cache, both layouts),
// PREFILL_PAGED (paged runner, where paged_prefill_supported: one paged_prefill launch per layer,
// the same rows) or PREFILL_GEMM (gather + GEMM path per chunk longer than small_chunk, as
// step04's). Returns the path now in effect: the one asked for, else the next that takes this model
// on this device and layout (flash -> paged -> GEMM).
int gpu_runner_set_prefill_attn(GpuRunner *r, int mode);
// Batch-invariant mode (1 on, 0 off, the default): a row's result does not depend on what else the
// step holds, so greedy outputs are identical however the scheduler batches (prefix cache on or
// off, any token budget): GEMMs always of the same row count (cuBLAS's kernel choice depends on
// the shape), no GEMV for lone rows, the lm_head GEMM always lcap rows.
// Every row's attention through one kernel: the fused prefill kernel for all rows (decode rows
// too) where it takes the shape, else paged decode v2 for all rows. Paged KV only. Slower: the
// last GEMM of a step is padded, a decode step pays for a full GEMM. Returns the mode now (1/0).
int gpu_runner_set_batch_invariant(GpuRunner *r, int on);
// The cached K and V (KV*hd each, as fp32) of cache row `row` (slot * max_len + position) of a
// layer. A row no batch has written reads as NaN (the cache is poisoned when it is allocated).
int gpu_runner_read_kv(const GpuRunner *r, int layer, int row, float *k, float *v);
// The batched attention alone, on host inputs rounded to dtype on the device: sequence i has
// rows cu_q[i] .. cu_q[i+1]-1 of q (n_tokens, H*hd) and attends over rows base[i] ..
// base[i] + seq_lens_k[i] - 1 of kc, vc (cache_rows, KV*hd), causally (row j of an n-row chunk
// sees keys 0 .. seq_lens_k - n + j). small_chunk as gpu_runner_set_small_chunk. out (n_tokens,
// H*hd) fp32. 0, or -1 (no GPU, unsupported shape).
int batch_attention_gpu_check(const float *q, const float *kc, const float *vc, int cache_rows, int n_seqs,
                              const int *cu_q, const int *seq_lens_k, const int *base, int H, int KV, int hd,
                              StDtype dtype, int small_chunk, float *out);

// The same for step05's paged layout: kc, vc the pool (cache_rows = num_blocks * block_size),
// sequence i's position p at row block_tables[i * bt_stride + p / block_size] * block_size +
// p % block_size; short chunks run paged decode v1/v2, long ones the gather + GEMM path.
int batch_attention_gpu_check_paged(const float *q, const float *kc, const float *vc, int cache_rows, int n_seqs,
                                    const int *cu_q, const int *seq_lens_k, const int *block_tables, int bt_stride,
                                    int block_size, int H, int KV, int hd, StDtype dtype, int small_chunk, float *out);
// step04's decode path alone (its vectorized split kernel + combine) on device data, for
// step05's ladder baseline: item w = query row rows[w] of q (fp32, ld ldq) over lens[w] keys at
// cache rows bases[w] ...; out (dtype, ld H*hd). part_o / part_ml: part_cap floats and
// part_cap / hd * 2 floats, at least H * ceil(max_len / 128) * hd. Launches, or -1.
int step04_decode_attention_dev(StDtype dtype, const float *q, int ldq, const void *kc, const void *vc, const int *rows,
                                const int *lens, const int *bases, int n, int max_len, int H, int KV, int hd, void *out,
                                float *part_o, float *part_ml, size_t part_cap);

// The paged runner's long-chunk attention alone, for step05's ladder (paged_attn_bench --op
// prefill): the chunks (host; seq = block-table row) over the pool kc, vc (device, dtype) through
// the block tables d_bt (device); q (device, fp32, ld ldq) as the runner's qkv rows; out (device,
// dtype, ld H*hd). _run queues the same launches as one layer of the runner: fused 1 (one
// paged_prefill, -1 where paged_prefill_supported says no) or 0 (per chunk: gather + GEMM path,
// on a dtype copy of q made by _new). Returns the launches. _new: NULL without a GPU / bad sizes.
typedef struct LongAttnBench LongAttnBench;
LongAttnBench *long_attn_bench_new(StDtype dtype, int H, int KV, int hd, const float *q, int ldq, const void *kc,
                                   const void *vc, const int *d_bt, int bt_stride, int block_size,
                                   const PrefillChunk *chunks, int nchunks, void *out);
int long_attn_bench_run(LongAttnBench *b, int fused);
void long_attn_bench_free(LongAttnBench *b);

#ifdef __cplusplus
}
#endif
