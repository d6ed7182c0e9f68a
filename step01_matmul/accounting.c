// accounting.c — see accounting.h. The formulas are the lesson; every term is one GEMM
// or one tensor, named as in the Hugging Face checkpoint.
#include "accounting.h"

#include <string.h>

#include "args.h"
#include "check.h"

ParamCount account_params(const ModelConfig *c) {
    ParamCount p;
    memset(&p, 0, sizeof p);
    const int64_t L = c->n_layers, d = c->hidden, hd = c->head_dim;
    const int64_t qd = (int64_t)c->n_heads * hd;      // width of q (and of o_proj's input)
    const int64_t kvd = (int64_t)c->n_kv_heads * hd;  // width of k and of v
    p.embedding = (int64_t)c->vocab * d;
    p.q = L * (d * qd + (c->qkv_bias ? qd : 0));
    p.k = L * (d * kvd + (c->qkv_bias ? kvd : 0));
    p.v = L * (d * kvd + (c->qkv_bias ? kvd : 0));
    p.o = L * (qd * d + (c->o_bias ? d : 0));
    const int64_t ff = c->intermediate;
    p.mlp = L * (3 * d * ff + (c->mlp_bias ? 2 * ff + d : 0));
    p.norms = L * (2 * d + (c->qk_norm ? 2 * hd : 0)) + d;
    p.lm_head = c->tie_embeddings ? 0 : (int64_t)c->vocab * d;
    p.total = p.embedding + p.q + p.k + p.v + p.o + p.mlp + p.norms + p.lm_head;
    p.per_layer = (p.q + p.k + p.v + p.o + p.mlp + (p.norms - d)) / L;
    // lm_head multiplies every token even when tied (it is the embedding matrix, used twice).
    p.matmul = p.q + p.k + p.v + p.o + p.mlp + (int64_t)c->vocab * d;
    return p;
}

Flops account_flops(const ModelConfig *c, int64_t context) {
    Flops f;
    ParamCount p = account_params(c);
    f.weights_per_token = 2.0 * (double)p.matmul;
    // One query row against one key: q.k is hd MACs, p*v is hd MACs -> 2*hd MACs = 4*hd FLOPs,
    // for every query head of every layer (GQA shares K/V storage, not the arithmetic).
    f.attn_per_token_per_ctx = 4.0 * c->n_layers * (double)c->n_heads * c->head_dim;
    f.decode_per_token = f.weights_per_token + f.attn_per_token_per_ctx * (double)context;
    // Causal prefill of T tokens: token t attends to t keys (1..T): sum = T(T+1)/2.
    double T = (double)context;
    f.prefill_total = f.weights_per_token * T + f.attn_per_token_per_ctx * T * (T + 1) / 2.0;
    f.prefill_per_token = T > 0 ? f.prefill_total / T : 0;
    return f;
}

double dtype_bytes(const char *n) {
    if (!strcmp(n, "fp32") || !strcmp(n, "float32") || !strcmp(n, "f32")) return 4;
    if (!strcmp(n, "fp16") || !strcmp(n, "float16") || !strcmp(n, "f16") || !strcmp(n, "bf16") ||
        !strcmp(n, "bfloat16"))
        return 2;
    if (!strcmp(n, "int8") || !strcmp(n, "fp8") || !strcmp(n, "i8")) return 1;
    if (!strcmp(n, "int4") || !strcmp(n, "i4")) return 0.5;
    return 0;
}

double kv_bytes_per_token(const ModelConfig *c, double elem_bytes) {
    return 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * elem_bytes;
}

MemUsage account_memory(const ModelConfig *c, int64_t batch, int64_t context, double w_bytes, double kv_bytes,
                        double act_bytes) {
    MemUsage m;
    ParamCount p = account_params(c);
    const double hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads;
    const double B = (double)batch, T = (double)context;
    m.weights = (double)p.total * w_bytes;
    m.kv_per_token = kv_bytes_per_token(c, kv_bytes);
    m.kv_cache = B * T * m.kv_per_token;
    // Layers run one after another, so only one layer's tensors are live at a time:
    // residual + normed input (2*hidden), q, k, v, attention output (H*hd), gate and up
    // (2*intermediate) for every token of the prefill.
    m.activations = B * T * (2.0 * c->hidden + (2.0 * H + 2.0 * KV) * hd + 2.0 * c->intermediate) * act_bytes;
    // Unfused attention materialises the (T x T) scores per head in fp32 (flash attention,
    // step07, removes this term); the sampler needs the last position's logits in fp32.
    m.workspace = B * H * T * T * 4.0 + B * (double)c->vocab * 4.0;
    m.total = m.weights + m.kv_cache + m.activations + m.workspace;
    return m;
}

double weight_bytes_read(const ModelConfig *c, double w_bytes, int64_t tokens) {
    const ParamCount p = account_params(c);
    const double rows = (double)(tokens < c->vocab ? tokens : c->vocab);
    const double table = c->tie_embeddings ? 0.0 : (double)p.embedding - rows * c->hidden;  // rows not looked up
    return ((double)p.total - table) * w_bytes;
}

DecodeStep account_decode_step(const ModelConfig *c, int64_t batch, int64_t context, double w_bytes, double kv_bytes) {
    DecodeStep d;
    d.weights = weight_bytes_read(c, w_bytes, batch);
    d.kv = (double)batch * (double)context * kv_bytes_per_token(c, kv_bytes);
    d.bytes = d.weights + d.kv;
    d.flops = (double)batch * account_flops(c, context).decode_per_token;
    return d;
}

// ---- presets: the config.json fields that matter, as published with each model.
typedef struct {
    const char *name;
    const char *json;
} Preset;

static const Preset PRESETS[] = {
    {"llama-2-7b", "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":11008,"
                   "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":32,"
                   "\"vocab_size\":32000,\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,"
                   "\"rope_theta\":10000.0,\"tie_word_embeddings\":false,\"torch_dtype\":\"float16\"}"},
    {"llama-2-13b", "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":5120,\"intermediate_size\":13824,"
                    "\"num_hidden_layers\":40,\"num_attention_heads\":40,\"num_key_value_heads\":40,"
                    "\"vocab_size\":32000,\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,"
                    "\"tie_word_embeddings\":false,\"torch_dtype\":\"float16\"}"},
    {"llama-3.1-8b", "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":14336,"
                     "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
                     "\"vocab_size\":128256,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
                     "\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                     "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
                     "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}"},
    {"llama-3.1-70b", "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8192,\"intermediate_size\":28672,"
                      "\"num_hidden_layers\":80,\"num_attention_heads\":64,\"num_key_value_heads\":8,"
                      "\"vocab_size\":128256,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
                      "\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                      "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
                      "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}"},
    {"llama-3.2-1b", "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":8192,"
                     "\"num_hidden_layers\":16,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":64,"
                     "\"vocab_size\":128256,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
                     "\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":32.0,"
                     "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
                     "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"},
    {"tinyllama-1.1b", "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":5632,"
                       "\"num_hidden_layers\":22,\"num_attention_heads\":32,\"num_key_value_heads\":4,"
                       "\"vocab_size\":32000,\"max_position_embeddings\":2048,\"rms_norm_eps\":1e-5,"
                       "\"rope_theta\":10000.0,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}"},
    {"mistral-7b-v0.3", "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":14336,"
                        "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
                        "\"vocab_size\":32768,\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-5,"
                        "\"rope_theta\":1000000.0,\"sliding_window\":null,\"tie_word_embeddings\":false,"
                        "\"torch_dtype\":\"bfloat16\"}"},
    {"qwen2.5-0.5b", "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":896,\"intermediate_size\":4864,"
                     "\"num_hidden_layers\":24,\"num_attention_heads\":14,\"num_key_value_heads\":2,"
                     "\"vocab_size\":151936,\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-6,"
                     "\"rope_theta\":1000000.0,\"sliding_window\":32768,\"use_sliding_window\":false,"
                     "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"},
    {"qwen3-0.6b", "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":1024,\"intermediate_size\":3072,"
                   "\"num_hidden_layers\":28,\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":128,"
                   "\"vocab_size\":151936,\"max_position_embeddings\":40960,\"rms_norm_eps\":1e-6,"
                   "\"rope_theta\":1000000.0,\"attention_bias\":false,\"use_sliding_window\":false,"
                   "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"},
    {"qwen3-8b", "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":12288,"
                 "\"num_hidden_layers\":36,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":128,"
                 "\"vocab_size\":151936,\"max_position_embeddings\":40960,\"rms_norm_eps\":1e-6,"
                 "\"rope_theta\":1000000.0,\"attention_bias\":false,\"use_sliding_window\":false,"
                 "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}"},
};

const char *preset_config_json(const char *name) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(PRESETS[i].name, name)) return PRESETS[i].json;
    return NULL;
}

const char *const *preset_names(void) {
    static const char *names[sizeof PRESETS / sizeof PRESETS[0] + 1];
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) names[i] = PRESETS[i].name;
    return names;
}

int model_or_preset(const char *model_dir, const char *preset, const char *tiny_json, ModelWeights *w, ModelConfig *cfg) {
    char err[512];
    if (model_dir) {
        if (model_load(model_dir, w, err, sizeof err) != 0) die("%s", err);
        *cfg = w->cfg;
        return 1;
    }
    const char *js = tiny_json && !strcmp(preset, "tiny") ? tiny_json : preset_config_json(preset);
    if (!js) arg_die("--preset: unknown name '%s'", preset);
    if (hf_config_parse(js, preset, cfg, err, sizeof err) != 0) die("%s", err);
    return 0;
}
