// train.h — training a Llama-family model on the CPU in fp32: forward, backward, AdamW.
// defines: TrainTensor, TrainLayer, TrainModel, train_model_new, train_model_init_random,
//          train_model_from_weights, train_model_free, train_tensor_find, train_grad_of,
//          train_zero_grad, train_cpu_view, train_cpu_view_free,
//          TrainActs, train_acts_new, train_acts_free, TRAIN_IGNORE, train_forward, train_backward,
//          TrainGradReady, train_backward_hooked,
//          rmsnorm_backward_cpu, linear_backward_cpu, rope_backward_cpu, attention_train_cpu,
//          attention_backward_cpu, swiglu_backward_cpu, cross_entropy_cpu,
//          AdamWConfig, AdamW, adamw_new, adamw_free, adamw_update_cpu, train_adamw_step,
//          grad_global_norm_clip, lr_schedule
//
// The model is the engine's (step02_attention/forward.h): the same ops, the same HF tensor names.
// What this trainer adds is the reverse pass. For one layer, with the forward
//   xn = rmsnorm(x) w;  q,k,v = xn W^T (+b);  [q,k = rmsnorm per head];  q,k = rope(q,k)
//   P = softmax(q k^T / sqrt(hd) + causal);  o = P v;  x += o Wo^T (+bo)
//   xn = rmsnorm(x) w2;  x += (silu(xn Wg^T) * (xn Wu^T)) Wd^T
// backward walks it from the end: every op gets dL/d(output) and returns dL/d(input) and adds
// dL/d(weights) into the gradient buffer (one function per op below).
//
// Supported: Llama, Mistral (no sliding window), Qwen2 (q/k/v biases), Qwen3 (q/k norm); MHA,
// GQA, MQA; any rope theta, llama3 rope scaling; tied embeddings; o_proj bias. Refused with an
// error: mlp biases (mlp_bias=true, which the engine does not run either), an odd head_dim, query
// heads that are not a multiple of the kv heads.
//
// Memory: ALL parameters are one contiguous fp32 buffer `params`, each tensor a view at an
// offset, listed in `tensors` under its Hugging Face name (so data parallelism can all-reduce
// one buffer, and a checkpoint writer can walk the list); `grads` has the same layout.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "model.h"
#include "step02_attention/forward.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_NAME_MAX 80

typedef struct {
    char name[TRAIN_NAME_MAX];  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
    size_t off, numel;          // view params + off, numel floats
    int rows, cols;             // (rows, cols) row-major; a vector has rows = 1
    int decay;                  // AdamW weight decay applies (matrices: yes; norms, biases: no)
} TrainTensor;

typedef struct {                       // views into TrainModel.params (shapes as step02's CpuLayer)
    float *attn_norm;                  // (d)
    float *wq, *wk, *wv, *wo;          // (H*hd, d) (KV*hd, d) (KV*hd, d) (d, H*hd)
    float *bq, *bk, *bv, *bo;          // (H*hd) (KV*hd) (KV*hd) (d), NULL when the config has none
    float *q_norm, *k_norm;            // (hd), NULL unless qk_norm
    float *mlp_norm;                   // (d)
    float *w_gate, *w_up, *w_down;     // (ff, d) (ff, d) (d, ff)
} TrainLayer;

typedef struct {
    ModelConfig cfg;
    size_t n_params;
    float *params;      // (n_params) every parameter, in the order of `tensors`
    float *grads;       // (n_params) same layout
    TrainTensor *tensors;
    int n_tensors;
    float *embed, *final_norm, *lm_head;  // (vocab, d) (d) (vocab, d); lm_head == embed when tied
    TrainLayer *layers;                   // [n_layers]
} TrainModel;

// Lay out the buffers for cfg (parameters and gradients zeroed). 0, or -1 + err for a config
// this trainer does not support (see above).
int train_model_new(const ModelConfig *cfg, TrainModel *m, char *err, int errlen);
// Random init, seeded (common/rng.h): every matrix N(0, 1/fan_in) (fan_in = its cols), o_proj and
// down_proj further divided by sqrt(2 n_layers) (each layer adds two of them to the residual);
// untied embedding N(0, 1); lm_head, and a tied embedding, N(0, 1/d); norms 1; biases 0.
void train_model_init_random(TrainModel *m, uint64_t seed);
// train_model_new with w's config, then every tensor copied from the checkpoint (bf16/f16 upcast).
int train_model_from_weights(const ModelWeights *w, TrainModel *m, char *err, int errlen);
void train_model_free(TrainModel *m);
// The tensor of that HF name, or NULL.
const TrainTensor *train_tensor_find(const TrainModel *m, const char *name);
// The gradient view of a parameter view p (same offset in grads).
static inline float *train_grad_of(const TrainModel *m, const float *p) { return p ? m->grads + (p - m->params) : 0; }
void train_zero_grad(TrainModel *m);
// step02's CpuModel whose weights are views of m->params (no copy), so the engine's forward_cpu
// runs the trained model as it stands. Free with train_cpu_view_free (never cpu_model_free).
void train_cpu_view(const TrainModel *m, CpuModel *cm);
void train_cpu_view_free(CpuModel *cm);

// ---------------------------------------------------------------- activations
// What the forward keeps for the backward, for B sequences of T tokens (N = B*T rows).
typedef struct {
    int B, T, N;
    int *ids, *targets;     // (N) copies of the last forward's inputs
    float *cos_t, *sin_t;   // (T, hd/2)
    // per layer l, each (n_layers, N, width) flattened:
    float *x_in;     // (L, N, d)    residual stream entering layer l
    float *xn1;      // (L, N, d)    rmsnorm(x_in) * attn_norm
    float *q_raw, *k_raw;  // (L, N, H*hd) (L, N, KV*hd)  projections before q/k norm (qk_norm only)
    float *q, *k, *v;      // (L, N, H*hd) (L, N, KV*hd) (L, N, KV*hd)  after norm + rope
    float *probs;    // (L, B, H, T, T)  softmax of the scores (upper triangle 0)
    float *att;      // (L, N, H*hd) attention output, input of o_proj
    float *x_mid;    // (L, N, d)    residual after the attention block
    float *xn2;      // (L, N, d)
    float *gate, *up, *hmid;  // (L, N, ff)  gate, up projections and silu(gate) * up
    float *x_out;    // (N, d)       residual after the last layer
    float *xn_f;     // (N, d)       final rmsnorm
    float *logits;   // (N, vocab)
    float *dlogits;  // (N, vocab)   dL/dlogits, filled by train_forward when targets given
    // scratch for the backward
    float *dx, *dxn, *dtmp, *dq, *dk, *dv, *datt, *dgate, *dup, *dh;
    double loss;
    int n_counted;
} TrainActs;

void train_acts_new(const ModelConfig *c, int B, int T, TrainActs *a);
void train_acts_free(TrainActs *a);

// A target that does not count in the loss (a prompt position, padding).
#define TRAIN_IGNORE (-1)
// Forward over ids (B, T): each row is its own causal sequence at positions 0..T-1; logits into
// a->logits. With targets (B, T) (TRAIN_IGNORE = not counted): loss = mean over the counted
// positions of -log softmax(logits)[target], and a->dlogits = its gradient. Returns the loss (0
// when no target counts or targets is NULL), or -1 for an id or target outside the vocabulary.
double train_forward(const TrainModel *m, TrainActs *a, const int *ids, const int *targets, int B, int T);
// Backward of the last train_forward (with targets): ADDS dL/dparams into m->grads (call
// train_zero_grad first; two calls accumulate, as gradient accumulation wants).
void train_backward(TrainModel *m, TrainActs *a);
// Told by train_backward_hooked each time a contiguous range [off, off + n) of m->grads is final
// for this backward (nothing later in it adds there): data parallelism starts all-reducing it
// while the backward goes on (ddp.h). The ranges come in backward order, each once, and cover
// the whole buffer: [final_norm, lm_head] (final_norm alone when tied), layer n_layers-1, ...,
// layer 0, then the embedding (last: with tied embeddings the lm_head's gradient lands there too).
typedef void (*TrainGradReady)(void *ctx, size_t off, size_t n);
// train_backward, calling ready(ctx, ...) as each range completes (ready may be NULL).
void train_backward_hooked(TrainModel *m, TrainActs *a, TrainGradReady ready, void *ctx);

// ---------------------------------------------------------------- the backward ops
// rmsnorm y = x r w, r = 1/sqrt(mean(x^2) + eps), rows of n:
//   dx = r (dy w) - x r^3/n sum(dy w x);   dw += sum_rows dy x r.   dx may alias dy; dw may be NULL.
void rmsnorm_backward_cpu(const float *x, const float *w, const float *dy, int rows, int n, float eps, float *dx,
                          float *dw);
// y (T, n_out) = x W^T + b:  dx = dy W (accumulate = add into dx instead of overwriting);
//   dW (n_out, n_in) += dy^T x;  db (n_out) += sum_rows dy (db may be NULL).
void linear_backward_cpu(const float *x, const float *W, const float *dy, int T, int n_in, int n_out, float *dx,
                         int accumulate, float *dW, float *db);
// rope is a rotation by +angle per pair (x1, x2); its backward rotates dy by -angle, in place.
void rope_backward_cpu(float *dx, int T, int n_heads, int hd, int ld, const float *cos_t, const float *sin_t);
// Causal GQA attention of one sequence as attention_cpu, keeping P (H, T, T) for the backward.
void attention_train_cpu(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, float *P,
                         float *out);
// Its backward: dP = do v^T, dS = P (dP - rowsum(P dP)), dq = dS k / sqrt(hd), dk = dS^T q /
// sqrt(hd), dv = P^T do (dk, dv summed over the query heads that share a kv head; overwritten).
void attention_backward_cpu(const float *q, const float *k, const float *v, const float *P, const float *dout, int T,
                            int H, int KV, int hd, float *dq, float *dk, float *dv);
// h = silu(g) u:  dg = dh u silu'(g), silu'(g) = s (1 + g (1 - s)), s = sigmoid(g);  du = dh silu(g).
void swiglu_backward_cpu(const float *gate, const float *up, const float *dh, long n, float *dgate, float *dup);
// Mean cross-entropy over the rows whose target != TRAIN_IGNORE; dlogits (N, V) = (softmax -
// onehot) / n_counted on those rows, 0 on the others (dlogits may be NULL). Returns the loss.
double cross_entropy_cpu(const float *logits, const int *targets, int N, int V, float *dlogits, int *n_counted);

// ---------------------------------------------------------------- optimizer and schedule
typedef struct {
    float beta1, beta2, eps;  // 0.9, 0.95, 1e-8 typical
    float weight_decay;       // decoupled, on tensors with decay = 1 only
} AdamWConfig;

typedef struct {
    size_t n;
    float *m, *v;  // (n) first and second moments, same layout as params
    long t;        // steps taken
} AdamW;

void adamw_new(AdamW *o, size_t n);
void adamw_free(AdamW *o);
// One AdamW step over a range (PyTorch's torch.optim.AdamW), t = the step number (1-based):
//   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
void adamw_update_cpu(float *p, const float *g, float *m, float *v, size_t n, long t, float lr, float b1, float b2,
                      float eps, float wd);
// The step over every tensor of the model, with weight decay where the tensor's decay flag says.
void train_adamw_step(TrainModel *model, AdamW *o, const AdamWConfig *c, float lr);
// Global L2 norm of g (n), computed in double; when max_norm > 0 and the norm exceeds it, g is
// scaled by max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_). Returns the norm before.
double grad_global_norm_clip(float *g, size_t n, double max_norm);
// Learning rate at step s (0-based) of `total`: linear warmup lr_max (s+1)/warmup for s < warmup,
// then cosine from lr_max down to lr_min at s = total - 1.
float lr_schedule(long s, long warmup, long total, float lr_max, float lr_min);

#ifdef __cplusplus
}
#endif
