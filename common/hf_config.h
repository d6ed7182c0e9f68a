// hf_config.h — a Hugging Face config.json for the Llama family, parsed into one struct.
// defines: ModelArch, RopeType, ModelConfig, hf_config_parse, hf_config_load, hf_config_parse_lenient,
//          hf_config_load_lenient, model_arch_name
//
// Accepts LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (and the
// matching model_type when "architectures" is absent). Both rope spellings are read:
//   transformers <= 4.x:  "rope_theta": 500000, "rope_scaling": {"rope_type"|"type": "llama3", ...}
//   transformers 5.x:     "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000, ...}
// head_dim is explicit when the file gives it (Qwen3, some Llamas), else hidden / heads.
// What this engine does not implement (other rope types, an active sliding window, an
// unknown architecture) is refused with a message naming the field.
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ARCH_LLAMA = 0, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3 } ModelArch;
typedef enum { ROPE_DEFAULT = 0, ROPE_LLAMA3 } RopeType;

typedef struct {
    ModelArch arch;
    int hidden;              // hidden_size (d_model)
    int intermediate;        // intermediate_size (SwiGLU inner width)
    int n_layers;            // num_hidden_layers
    int n_heads;             // num_attention_heads
    int n_kv_heads;          // num_key_value_heads (== n_heads: MHA, 1: MQA, else GQA)
    int head_dim;            // explicit or hidden / n_heads
    int vocab;               // vocab_size
    int max_pos;             // max_position_embeddings
    float rms_eps;           // rms_norm_eps
    int tie_embeddings;      // tie_word_embeddings: lm_head shares the embedding matrix
    int qkv_bias;            // q/k/v projections have a bias (Qwen2; Llama attention_bias)
    int o_bias;              // o_proj has a bias (Llama attention_bias)
    int mlp_bias;            // gate/up/down have biases (Llama mlp_bias)
    int qk_norm;             // per-head RMSNorm on q and k (Qwen3)
    double rope_theta;
    RopeType rope_type;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;  // llama3 scaling
    int rope_original_max_pos;
    char torch_dtype[16];    // "bfloat16", "float16", "float32" or "" if absent
    int bos_token_id;        // -1 if absent
    int eos_token_ids[8];    // from eos_token_id (int or list)
    int n_eos;
    char unsupported[512];   // lenient parsing only: what the engine could not run, or ""
} ModelConfig;

// Parse config.json text. Returns 0, or -1 with a one-line reason in err (naming the field).
// `src` names the source in messages (a path, or "preset llama-2-7b").
int hf_config_parse(const char *json_text, const char *src, ModelConfig *cfg, char *err, int errlen);
// Read and parse a file, or a directory holding config.json.
int hf_config_load(const char *path, ModelConfig *cfg, char *err, int errlen);
// For tools that only count (step01's account): a feature the engine cannot run (another rope
// type, an active sliding window) does not fail; it is described in cfg->unsupported instead.
// Sizes, heads and everything else are checked exactly as above.
int hf_config_parse_lenient(const char *json_text, const char *src, ModelConfig *cfg, char *err, int errlen);
int hf_config_load_lenient(const char *path, ModelConfig *cfg, char *err, int errlen);
const char *model_arch_name(ModelArch a);

#ifdef __cplusplus
}
#endif
