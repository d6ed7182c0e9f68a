// accounting.h — parameters, FLOPs and memory of a Llama-family model, on paper.
// defines: ParamCount, account_params, Flops, account_flops, MemUsage, account_memory,
//          kv_bytes_per_token, weight_bytes_read, DecodeStep, account_decode_step, dtype_bytes,
//          preset_config_json, preset_names, model_or_preset
//
// Everything here is a formula over ModelConfig (common/hf_config.h); the tests check the
// formulas against published parameter counts and against hand-computed cases.
#pragma once
#include <stdint.h>

#include "hf_config.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t embedding;   // vocab x hidden
    int64_t q, k, v, o;  // all layers, including biases where the model has them
    int64_t mlp;         // gate + up + down, all layers (+ biases)
    int64_t norms;       // 2 RMSNorm weights per layer + final norm + Qwen3 q/k norms
    int64_t lm_head;     // vocab x hidden; 0 when tied (counted once, in embedding)
    int64_t total;
    int64_t per_layer;   // one decoder layer (attention + MLP + its norms)
    int64_t matmul;      // every weight a token multiplies by: all but embedding lookups and norms
} ParamCount;

ParamCount account_params(const ModelConfig *c);

// FLOPs (1 multiply-add = 2 FLOPs). Norms, RoPE, softmax and activations are O(hidden) per
// token and left out (well under 1% of the total); the terms are the GEMMs.
typedef struct {
    double weights_per_token;        // 2 * matmul params: every projection + lm_head
    double attn_per_token_per_ctx;   // QK^T + PV for one query against one cached key: 4*L*H*hd
    double decode_per_token;         // at position `context`: weights + attn * context
    double prefill_total;            // a prompt of `context` tokens, causal: sum over positions
    double prefill_per_token;        // prefill_total / context
} Flops;

Flops account_flops(const ModelConfig *c, int64_t context);

// Bytes per element of a dtype name: fp32/float32 4, fp16/bf16/float16/bfloat16 2,
// int8/fp8 1, int4 0.5. Returns 0 for an unknown name.
double dtype_bytes(const char *name);

// KV cache per token: 2 (K and V) x layers x kv_heads x head_dim x bytes per element.
double kv_bytes_per_token(const ModelConfig *c, double elem_bytes);

typedef struct {
    double weights;              // all parameters at the weight dtype
    double kv_per_token;         // 2 (K and V) * layers * kv_heads * head_dim * kv bytes
    double kv_cache;             // batch * context * kv_per_token
    double activations;          // peak live tensors of one layer at a prefill of `context`
    double workspace;            // naive attention scores (fp32) + last-position logits (fp32)
    double total;
} MemUsage;

MemUsage account_memory(const ModelConfig *c, int64_t batch, int64_t context, double w_bytes, double kv_bytes,
                        double act_bytes);

// Weight bytes one forward pass over `tokens` tokens reads: every multiplied weight and norm
// once, and of the embedding table only the `tokens` rows it looks up (all of it when it is also
// the lm_head, i.e. tied: then it is read whole as the lm_head).
double weight_bytes_read(const ModelConfig *c, double w_bytes, int64_t tokens);

// One decode step of `batch` sequences at `context` tokens each (the new token's position is
// context - 1, so each sequence reads `context` K/V rows, its own included). THE formula for
// decode bytes: account, kv_bench and the READMEs all use it.
typedef struct {
    double weights;  // weight_bytes_read(c, w_bytes, batch): once for the whole batch
    double kv;       // batch * context * kv_bytes_per_token
    double bytes;    // weights + kv
    double flops;    // batch * account_flops(c, context).decode_per_token
} DecodeStep;
DecodeStep account_decode_step(const ModelConfig *c, int64_t batch, int64_t context, double w_bytes, double kv_bytes);

// Built-in presets: config.json text of well-known models (so no download is needed).
const char *preset_config_json(const char *name);  // NULL if unknown
const char *const *preset_names(void);             // NULL-terminated

// The model of a program's --model DIR or --preset NAME (exactly one of them not NULL): DIR's
// weights into *w and their config into *cfg (returns 1), or the preset's config into *cfg
// (returns 0; the caller makes random weights of that shape); NAME "tiny" is tiny_json when that
// is not NULL. Exits 1 when DIR does not load, 2 (a usage error) when NAME is unknown.
int model_or_preset(const char *model_dir, const char *preset, const char *tiny_json, ModelWeights *w, ModelConfig *cfg);

#ifdef __cplusplus
}
#endif
