// kvcache.h — autoregressive decode with a KV cache (CPU reference and CUDA), and sampling.
// defines: CpuKvCache, cpu_kv_init, cpu_kv_free, cpu_kv_bytes,
//          forward_cached_cpu, forward_last_cpu,
//          SamplerParams, Sampler, sampler_option, sampler_init, sampler_free, sampler_sample, sampler_candidates,
//          sampler_candidates_full_sort,
//          logprobs_topk, argmax_f32,
//          GpuDecoder, gpu_decoder_new, gpu_decoder_free, gpu_decoder_reset, gpu_decoder_len,
//          gpu_decoder_step, gpu_decoder_greedy, gpu_decoder_kv_bytes, gpu_decoder_kv_elem_bytes,
//          forward_last_cuda, gemv_gpu_check, gemv_gpu_bench_gbps,
//          gemv_n_versions, gemv_version_name, gemv_set_version, decode_attention_gpu_check
//
// Prefill runs the prompt's T tokens through the model once and keeps every layer's K and V
// rows; each decode step then runs ONE token: its q attends over the cached K, V of all earlier
// positions plus its own, and its k, v are appended. Without the cache, step t recomputes the
// whole prefix (step02's forward over t tokens): O(t) work per token instead of O(1) for the
// weights, O(t^2) instead of O(t) for attention.
//
// The cache of one sequence (CPU and GPU, the same layout):
//   k, v  (n_layers, max_seq, n_kv_heads * head_dim)   row p = the key / value of position p
// so one layer's cache has exactly step02's (T, KV*hd) k / v layout. q is not cached: only the
// newest token's query is ever used again (earlier queries have produced their outputs).
// Bytes per token of context: 2 (K and V) * layers * kv_heads * head_dim * bytes per element.
#pragma once
#include <stdint.h>

#include "hf_config.h"
#include "rng.h"
#include "safetensors.h"
#include "step01_matmul/accounting.h"  // kv_bytes_per_token: the formula the cache is checked against
#include "step02_attention/forward.h"

#ifdef __cplusplus
extern "C" {
#endif


// ---------------------------------------------------------------- CPU cache (fp32)
typedef struct {
    int n_layers, kv_dim, max_seq;  // kv_dim = n_kv_heads * head_dim
    int len;                        // positions filled (the next token goes to position len)
    float *k, *v;                   // (n_layers, max_seq, kv_dim) each
} CpuKvCache;

// 0, or -1 with a message on stderr (max_seq < 1).
int cpu_kv_init(CpuKvCache *kv, const ModelConfig *c, int max_seq);
void cpu_kv_free(CpuKvCache *kv);
double cpu_kv_bytes(const CpuKvCache *kv);  // bytes allocated for K and V

// Run ids[T] at positions kv->len .. kv->len+T-1, append their K, V, advance kv->len; logits
// (vocab) of the LAST token. Prefill: T = prompt length; decode: T = 1. 0, or -1 (bad id, full).
int forward_cached_cpu(const CpuModel *m, CpuKvCache *kv, const int *ids, int T, float *logits);
// No cache: step02's forward_cpu over all T tokens, logits (vocab) of the last one.
int forward_last_cpu(const CpuModel *m, const int *ids, int T, float *logits);

// ---------------------------------------------------------------- sampling
// Applied in this order to the logits of one step (as transformers' logits processors):
//   temperature -> top-k -> top-p -> min-p, then one draw from the renormalized distribution.
// greedy (or temperature <= 0): the argmax, no randomness. top_k 0 = off; top_p 1 = off;
// min_p 0 = off. The draw uses one rng_uniform per token from a PCG32 seeded with `seed`, so a
// seed gives the same tokens on every machine.
typedef struct {
    int greedy;
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint64_t seed;
} SamplerParams;

typedef struct {
    SamplerParams p;
    int vocab;
    Rng rng;
    int *idx;     // (vocab) candidate ids, most probable first
    float *prob;  // (vocab) their probabilities
    float *pr;    // (vocab) work: softmax(logits / T) of every id
} Sampler;

// The command-line sampling options shared by the programs that generate: argv[*i] one of
// --temperature T, --top-k K (0 off), --top-p P (1 off), --min-p M (0 off), --seed S, its value
// argv[*i + 1] checked (common/args.h) into p (*i advanced past it). Returns 1 when argv[*i] was
// one of them (the caller then samples: p->greedy = 0 once the options are read), else 0.
int sampler_option(int argc, char **argv, int *i, SamplerParams *p);
void sampler_init(Sampler *s, const SamplerParams *p, int vocab);
void sampler_free(Sampler *s);
int sampler_sample(Sampler *s, const float *logits);
// The set a draw may pick from (after the filters), most probable first: writes ids to s->idx
// and probabilities (renormalized) to s->prob, returns its size. sampler_sample draws from it.
int sampler_candidates(Sampler *s, const float *logits);
// The same set by sorting the whole vocabulary first (O(V log V)): the reference sample_bench
// times sampler_candidates against.
int sampler_candidates_full_sort(Sampler *s, const float *logits);
// The k most probable ids and their log-probabilities (log_softmax of the raw logits).
void logprobs_topk(const float *logits, int vocab, int k, int *ids, float *logprobs);
int argmax_f32(const float *x, int n);  // first index of the maximum

// ---------------------------------------------------------------- CUDA decode
// One sequence on the GPU, on step02's GpuModel weights. The decode step (one token) is a
// fixed list of kernels that reads the token id and its position from device memory, so it is
// captured once in a CUDA graph and replayed for every token: no host synchronization inside,
// one launch per token. The cache is in the weight dtype (bf16 for a bf16 model).
typedef struct GpuDecoder GpuDecoder;

GpuDecoder *gpu_decoder_new(GpuModel *g, int max_seq, char *err, int errlen);
void gpu_decoder_free(GpuDecoder *d);
void gpu_decoder_reset(GpuDecoder *d);  // empty the cache (position 0)
int gpu_decoder_len(const GpuDecoder *d);
// Which step the next gpu_decoder_new captures: 0 step03's own (10 kernels a layer: RMSNorm, GEMV,
// RoPE + cache write, attention split, combine, GEMV, RMSNorm, GEMV, SwiGLU, GEMV), 1 step07's
// fusions (5 a layer: step07_kernels/decode_fused.cuh), 2 (the default) the same with programmatic
// dependent launch on sm_90 (1 elsewhere). Names: "unfused", "fused", "fused_pdl".
void gpu_decoder_set_fused(int mode);
const char *gpu_decoder_fused_name(int mode);
// The fused step's attention kernel the next gpu_decoder_new captures: 1 (k_attn_fused: 4 warps on
// each block of 128 keys), 2 (k_attn_fused2: 8-16 warps, only the rounds holding keys; version 1
// where head_dim is not a whole number of 16-byte vectors or its shared memory would pass 48 KB) or
// 4 (k_attn_mma, the default: scores and P V on the tensor cores, for a bf16 cache of head_dim 64 or
// 128 on sm_80+; version 2 elsewhere). Other values are ignored.
void gpu_decoder_set_attn(int version);
int gpu_decoder_get_attn(void);
// The fused step's dense GEMVs (k_gemv_fused): 0 (the default) splits each row over 2 warps where
// 8-row blocks would be fewer than two per SM, 1, 2 or 4 forces that many warps per row (1 where a
// row is too short for it). Other values are ignored.
void gpu_decoder_set_gemv_split(int ks);
// The fused step's row loop for dense GEMVs of many short rows (k_gemv_rows: a grid that fills the
// GPU once, x in registers, each warp walking rows): 0 (the default) where a warp a row would make
// more than 8 grids' worth of blocks (the lm_heads: rows of up to 8 16-byte chunks a lane with x in
// registers, of 9-16 with x in shared memory, as the 8B's), 1 never, 2 wherever the rows fit (no
// SwiGLU), 3 as 0 without the rows of 9-16 chunks a lane. Other values are ignored.
void gpu_decoder_set_gemv_rows(int mode);
// The fused step's dense GEMVs whose rows are at most 4 16-byte chunks a lane (after the split):
// 1 (the default) runs them with 4 chunks a lane in flight instead of 8 (half the registers for
// the weights, more blocks an SM), 0 with 8 (the loads past the row's end predicated off).
void gpu_decoder_set_gemv_short(int on);
int gpu_decoder_kernels(const GpuDecoder *d);  // kernel nodes in its graph: launches per token
// 1 where the fused step's lm_head GEMV also does the argmax (the row loop: one kernel less), else 0
int gpu_decoder_lm_argmax(const GpuDecoder *d);
// The argmax of the logits of positions p0 .. p0+n-1 (what each step's graph wrote), to out_ids (n).
// 0, or -1 when the range is not yet decoded.
int gpu_decoder_argmax_ids(GpuDecoder *d, int p0, int n, int *out_ids);
// Feed one token at position len (appending its K, V); logits (vocab) copied to the host when
// logits != NULL. A prompt is fed token by token through the same graph (this step has no
// batched GPU prefill that writes the cache). 0, or -1 (bad id, cache full).
int gpu_decoder_step(GpuDecoder *d, int id, float *logits);
// n greedy steps entirely on the device: each step's argmax is the next step's token. out_ids
// (n) gets the argmax of each step; step_ms (n) the time of each step (CUDA events) if not NULL.
int gpu_decoder_greedy(GpuDecoder *d, int first_id, int n, int *out_ids, float *step_ms);
// Device memory the K/V cache took (cudaMemGetInfo before/after its allocation), and its
// element size in bytes.
double gpu_decoder_kv_bytes(const GpuDecoder *d);
double gpu_decoder_kv_elem_bytes(const GpuDecoder *d);
// No cache on the GPU: step02's forward_cuda over all T tokens, logits (vocab) of the last one;
// *ms = its time (CUDA events) if not NULL.
int forward_last_cuda(GpuModel *g, const int *ids, int T, float *logits, double *ms);
// The kernels alone on host inputs (rounded to dtype on the device), for the tests:
//   y (rows) = W (rows, n_in) x (n_in) + b (rows or NULL)
int gemv_gpu_check(int version, const float *W, const float *x, const float *b, int rows, int n_in, StDtype dtype, float *y);
// bytes of W (+ x, y) / median time of one GEMV on a cold W (rotating copies > L2), GB/s.
double gemv_gpu_bench_gbps(int version, int rows, int n_in, StDtype dtype);
// The GEMV ladder (decode_gpu.cu's version table): how many, their names, which one decode uses.
int gemv_n_versions(void);
const char *gemv_version_name(int version);
void gemv_set_version(int version);
//   one decode query per head: q (H*hd) over kc, vc (len, KV*hd) -> out (H*hd)
int decode_attention_gpu_check(const float *q, const float *kc, const float *vc, int len, int H, int KV, int hd,
                               StDtype dtype, float *out);

#ifdef __cplusplus
}
#endif
