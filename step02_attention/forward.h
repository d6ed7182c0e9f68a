// forward.h — the Llama-family forward pass (prefill, no KV cache), on the CPU and on CUDA.
// defines: CpuLayer, CpuModel, cpu_model_load, cpu_model_random, cpu_model_free,
//          embed_cpu, rmsnorm_cpu, rope_inv_freq, rope_table_cpu, rope_apply_cpu, linear_cpu,
//          attention_row_cpu, attention_cpu, attention_at_cpu, swiglu_cpu, add_cpu, LinearFn, mlp_block_cpu,
//          mlp_block_lin_cpu, forward_cpu,
//          Proj, cpu_model_load_base, proj_cpu, lm_head_cpu,
//          ForwardTimes, GpuModel, gpu_model_load, gpu_model_random, gpu_model_load_q, gpu_model_random_q,
//          gpu_model_quantize_lm_head, gpu_model_lm_head_quantized, gpu_model_free,
//          gpu_model_describe, gpu_model_weight_bytes, gpu_mem_used_bytes, forward_cuda, attention_gpu_check,
//          forward_topk
//
// One decoder layer, for T tokens (shapes row-major; H query heads, KV key/value heads,
// hd = head_dim, d = hidden, ff = intermediate, g = H / KV query heads per KV head):
//
//   x (T, d)                      residual stream (fp32)
//   xn = rmsnorm(x) * w           (T, d)
//   q = xn Wq^T (+bq)             (T, H*hd)     k, v = xn Wk^T, xn Wv^T (+b)   (T, KV*hd)
//   q, k = rmsnorm per head       (Qwen3 only, over hd, before RoPE)
//   q, k = rope(q, k, positions)  rotate-half convention, cos/sin (T, hd/2)
//   S = q_h k_{h/g}^T / sqrt(hd)  (H, T, T)     the quadratic term: T*T scores per head
//   P = softmax(S + causal mask)  (H, T, T)     fp32, key j > query i masked out
//   o_h = P_h v_{h/g}             (T, H*hd)
//   x = x + o Wo^T                (T, d)
//   xn = rmsnorm(x) * w2
//   x = x + (silu(xn Wgate^T) * (xn Wup^T)) Wdown^T     (T, ff) inside
// then logits = rmsnorm(x) * wf  lm_head^T  (T, vocab), lm_head = embedding when tied.
//
// The ops are separate functions with shape comments so that later steps (KV cache, batching,
// paging) call them one by one; step07 replaces the unfused GPU attention with a fused one.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "model.h"
#include "step06_quant/quant.h"  // QWeight: a projection may be quantized (step06 fills it; see Proj)

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- CPU model: fp32 everywhere
// The seven projections of a layer, in the order of step06's hfq_linear_names.
typedef enum { PROJ_Q, PROJ_K, PROJ_V, PROJ_O, PROJ_GATE, PROJ_UP, PROJ_DOWN, N_PROJ } Proj;

typedef struct {
    float *attn_norm;                   // (d)
    float *wq, *wk, *wv, *wo;           // (H*hd, d) (KV*hd, d) (KV*hd, d) (d, H*hd)
    float *bq, *bk, *bv, *bo;           // (H*hd) (KV*hd) (KV*hd) (d) or NULL
    float *q_norm, *k_norm;             // (hd) Qwen3, else NULL
    float *mlp_norm;                    // (d)
    float *w_gate, *w_up, *w_down;      // (ff, d) (ff, d) (d, ff)
    // step06's weight-only quantization: q[p] set means projection p runs quantized (linear_q_cpu)
    // and its fp32 matrix above is NULL. Owned by the model (cpu_model_free frees them). All NULL
    // unless step06's loader (step06_quant/qmodel.h) made the model.
    QWeight *q[N_PROJ];
} CpuLayer;

typedef struct {
    ModelConfig cfg;
    float *embed;       // (vocab, d)
    float *final_norm;  // (d)
    float *lm_head;     // (vocab, d); == embed when tied; NULL when q_lm_head replaces it
    CpuLayer *layers;   // [n_layers]
    // step06: the lm_head quantized too (QuantSpec.lm_head), owned by the model; NULL: lm_head above
    QWeight *q_lm_head;
} CpuModel;

// Every tensor converted to fp32 (bf16/f16 upcast exactly). 0, or -1 + err (also for a quantized
// checkpoint: step06's qmodel_cpu_load runs those).
int cpu_model_load(const ModelWeights *w, CpuModel *m, char *err, int errlen);
// The same, leaving the projections a quantized checkpoint does not hold densely NULL (for
// step06's loader, which then fills CpuLayer.q).
int cpu_model_load_base(const ModelWeights *w, CpuModel *m, char *err, int errlen);
// Random weights of a config's shape (N(0, 0.02) matrices, norms ~1, biases ~0.02), for benchmarks.
void cpu_model_random(const ModelConfig *c, uint64_t seed, CpuModel *m);
void cpu_model_free(CpuModel *m);

// ---------------------------------------------------------------- CPU ops (fp32 reference)
// out (T, d) = table[ids[t]]                                 table (vocab, d)
void embed_cpu(const float *table, const int *ids, int T, int d, float *out);
// y (rows, n) = x / sqrt(mean(x^2) + eps) * w                x (rows, n), w (n); y may be x
void rmsnorm_cpu(const float *x, const float *w, int rows, int n, float eps, float *y);
// inv_freq (hd/2): 1 / theta^(2i/hd), with llama3 scaling when cfg->rope_type == ROPE_LLAMA3
// (as transformers' _compute_llama3_parameters), rounded to fp32 like torch computes it.
void rope_inv_freq(const ModelConfig *cfg, float *inv_freq);
// cos, sin (T, hd/2) for positions pos0 .. pos0+T-1: angle = fp32(pos * inv_freq).
void rope_table_cpu(const ModelConfig *cfg, int pos0, int T, float *cos_t, float *sin_t);
// In place on x (T, n_heads, hd) with row stride ld floats (>= n_heads*hd), rotate-half:
//   x1 = x[:hd/2], x2 = x[hd/2:];  x1' = x1 cos - x2 sin;  x2' = x2 cos + x1 sin
void rope_apply_cpu(float *x, int T, int n_heads, int hd, int ld, const float *cos_t, const float *sin_t);
// y (T, n_out) = x (T, n_in) W^T + b, W (n_out, n_in) (Hugging Face Linear layout), b (n_out) or NULL
void linear_cpu(const float *x, const float *W, const float *b, int T, int n_in, int n_out, float *y);
// One query row over keys 0 .. n-1: s (n) = softmax(qi . k_j * scale) (the probabilities, fp32),
// oi (hd) = sum_j s[j] v_j; k and v point at the row's kv head in row 0, rows ldk floats apart.
void attention_row_cpu(const float *qi, const float *k, const float *v, int n, size_t ldk, int hd, float scale,
                       float *s, float *oi);
// Causal GQA attention over the whole sequence (no cache):
//   q (T, H*hd), k, v (T, KV*hd), out (T, H*hd); query head h reads kv head h / (H/KV).
//   scores for one row are kept in fp32; softmax in fp32; scale 1/sqrt(hd).
void attention_cpu(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, float *out);
// The same for T queries at positions pos0 .. pos0+T-1 over keys/values 0 .. pos0+T-1 (causal):
//   q (T, H*hd), k, v (>= pos0+T rows, KV*hd), out (T, H*hd). attention_cpu is pos0 = 0; step03
// calls it with its KV cache as k and v (T = 1: one decode step).
void attention_at_cpu(const float *q, const float *k, const float *v, int pos0, int T, int H, int KV, int hd,
                      float *out);
// out (n) = silu(gate) * up,  silu(z) = z / (1 + exp(-z))
void swiglu_cpu(const float *gate, const float *up, long n, float *out);
// x (n) += y (n)
void add_cpu(float *x, const float *y, long n);
// The second half of a layer, the same with or without a KV cache:
//   x += down( silu(gate(rmsnorm(x))) * up(rmsnorm(x)) )
// x (T, hidden) is updated in place; xn, tmp (T, hidden) and gate, up (T, intermediate) are scratch.
void mlp_block_cpu(const CpuLayer *L, const ModelConfig *c, float *x, int T, float *xn, float *gate, float *up,
                   float *tmp);
// A projection with linear_cpu's contract (step04 passes its row-deterministic linear_rows_cpu).
typedef void (*LinearFn)(const float *x, const float *W, const float *b, int T, int n_in, int n_out, float *y);
// Projection p of layer L: y (T, n_out) = x (T, n_in) W^T + b with L's weight and bias for p; a
// quantized one (L->q[p]) runs linear_q_cpu, a dense one lin (linear_cpu, or step04's linear_rows_cpu).
void proj_cpu(const CpuLayer *L, Proj p, LinearFn lin, const float *x, int T, int n_in, int n_out, float *y);
// logits (T, vocab) = xn (T, d) lm_head^T: dense through lin, or the quantized lm_head (q_lm_head).
void lm_head_cpu(const CpuModel *m, LinearFn lin, const float *xn, int T, float *logits);
// mlp_block_cpu with the projection lin instead of linear_cpu.
void mlp_block_lin_cpu(const CpuLayer *L, const ModelConfig *c, LinearFn lin, float *x, int T, float *xn, float *gate,
                       float *up, float *tmp);

// Where the time went (CPU: wall clock; GPU: CUDA events), filled when a pointer is passed.
typedef struct {
    double total_ms;       // the whole forward, embedding to logits
    double attn_ms;        // QK^T + masked softmax + PV, summed over layers
    double scores_bytes;   // the (H, T, T) fp32 score matrix of one layer
    double workspace_bytes;  // activations + scores allocated for this T (GPU), or used (CPU)
} ForwardTimes;

// logits (T, vocab) for ids[T] (positions 0..T-1). Returns 0, or -1 with a message on stderr
// (an id outside the vocabulary, T < 1).
int forward_cpu(const CpuModel *m, const int *ids, int T, float *logits, ForwardTimes *times);

// ---------------------------------------------------------------- CUDA model
// Weights live on the device as stored (bf16 / f16; f32 checkpoints stay fp32 and use fp32
// SGEMM, no TF32); bf16 on a GPU without bf16 tensor cores (sm_75) is converted to fp32 at load.
// Quantized projections (gpu_model_load_q): step06's QLinearGpu (step06_quant/qlinear_gpu.h),
// q/k/v stacked into one and gate/up into one when their groups, symmetry and g_idx agree, else
// run one after the other; everything else in bf16 (fp16 on sm_75), since the quantized GEMM
// takes bf16 / fp16 activations.
// Norm weights and biases are fp32. q/k/v and gate/up are concatenated at load, so each layer
// runs 4 weight GEMMs: qkv, o, gate_up, down (cuBLAS, fp32 accumulation).
typedef struct GpuModel GpuModel;

GpuModel *gpu_model_load(const ModelWeights *w, char *err, int errlen);  // NULL + err on failure
// Random weights of a config's shape, generated on the device in `dtype` (no file needed).
GpuModel *gpu_model_random(const ModelConfig *c, StDtype dtype, uint64_t seed, char *err, int errlen);
// With quantized projections: qlin (n_layers * N_PROJ, host, Proj order) each uploaded with
// qlinear_gpu_new (the caller keeps qlin); the dense ones (all of w's in a dense checkpoint) stay
// as gpu_model_load has them. w may be a quantized checkpoint (model.h) when qlin is given.
GpuModel *gpu_model_load_q(const ModelWeights *w, const QWeight *qlin, char *err, int errlen);
GpuModel *gpu_model_random_q(const ModelConfig *c, uint64_t seed, const QWeight *qlin, char *err, int errlen);
// The lm_head quantized too (step06's QuantSpec.lm_head): q (vocab, hidden, host) uploaded with
// qlinear_gpu_new (the caller keeps q); an untied dense lm_head is freed. 0, or -1 + err.
int gpu_model_quantize_lm_head(GpuModel *g, const QWeight *q, char *err, int errlen);
int gpu_model_lm_head_quantized(const GpuModel *g);  // 1 when the lm_head is quantized (qlm), else 0
void gpu_model_free(GpuModel *g);
const char *gpu_model_describe(const GpuModel *g);  // "bf16 weights, bf16 GEMMs ..."
double gpu_model_weight_bytes(const GpuModel *g);
// Device memory in use now (total - free, cudaMemGetInfo), bytes; -1 without CUDA.
double gpu_mem_used_bytes(void);
// logits (T, vocab) copied to the host when logits != NULL (skip it when timing). No host round
// trip and no synchronization inside; with times != NULL it waits for the end to read events.
int forward_cuda(GpuModel *g, const int *ids, int T, float *logits, ForwardTimes *times);
// The GPU attention path alone (QK^T GEMM, causal softmax, PV GEMM) on host inputs in the
// layout of attention_cpu, inputs rounded to `dtype` on the device: for the tests.
int attention_gpu_check(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, StDtype dtype,
                        float *out);

// ---------------------------------------------------------------- shared helpers
// Indices of the k largest values of x (n), largest first (ties: lower index first).
void forward_topk(const float *x, int n, int k, int *idx);

#ifdef __cplusplus
}
#endif
