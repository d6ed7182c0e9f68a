// model.h — a Llama-family checkpoint: config.json + safetensors, every tensor checked.
// defines: LayerTensors, ModelWeights, model_load, model_free
//
// model_load reads DIR/config.json (hf_config.h) and the weights (safetensors.h), then looks up
// every tensor the architecture needs by its Hugging Face name and checks dtype and shape:
//   model.embed_tokens.weight                     (vocab, hidden)
//   model.layers.{i}.input_layernorm.weight       (hidden)
//   model.layers.{i}.self_attn.q_proj.weight      (n_heads * head_dim, hidden)      (+ .bias Qwen2)
//   model.layers.{i}.self_attn.k_proj.weight      (n_kv_heads * head_dim, hidden)   (+ .bias Qwen2)
//   model.layers.{i}.self_attn.v_proj.weight      (n_kv_heads * head_dim, hidden)   (+ .bias Qwen2)
//   model.layers.{i}.self_attn.o_proj.weight      (hidden, n_heads * head_dim)
//   model.layers.{i}.self_attn.q_norm.weight      (head_dim)                        (Qwen3)
//   model.layers.{i}.self_attn.k_norm.weight      (head_dim)                        (Qwen3)
//   model.layers.{i}.post_attention_layernorm.weight (hidden)
//   model.layers.{i}.mlp.gate_proj.weight         (intermediate, hidden)
//   model.layers.{i}.mlp.up_proj.weight           (intermediate, hidden)
//   model.layers.{i}.mlp.down_proj.weight         (hidden, intermediate)
//   model.norm.weight                             (hidden)
//   lm_head.weight                                (vocab, hidden)   absent when tied
// A missing tensor, a wrong shape or dtype is an error naming the tensor, expected vs actual.
//
// A quantized checkpoint (config.json has a "quantization_config": GPTQ, AWQ) stores the seven
// projections of each layer (q/k/v/o, gate/up/down) as packed integer tensors instead of
// P.weight. model_load then sets `quantized`, checks everything else as above and leaves those
// seven pointers NULL (and q/k/v's biases still loaded): reading and checking the packed tensors
// is step06's (step06_quant/qmodel.h), which knows the formats. Loaders that only run dense
// weights (cpu_model_load, gpu_model_load) refuse such a model by name.
#pragma once
#include "hf_config.h"
#include "safetensors.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const StTensor *attn_norm;           // (hidden)
    const StTensor *wq, *wk, *wv, *wo;   // HF Linear layout (out, in), see above
    const StTensor *bq, *bk, *bv, *bo;   // NULL when the model has no such bias
    const StTensor *q_norm, *k_norm;     // (head_dim), Qwen3 only, else NULL
    const StTensor *mlp_norm;            // (hidden) post_attention_layernorm
    const StTensor *w_gate, *w_up, *w_down;  // NULL in a quantized checkpoint (as wq .. wo)
} LayerTensors;

typedef struct {
    ModelConfig cfg;
    StSet st;
    const StTensor *embed;       // (vocab, hidden)
    const StTensor *final_norm;  // (hidden)
    const StTensor *lm_head;     // (vocab, hidden); the embedding when tied; NULL in a quantized
                                 // checkpoint that holds it quantized (lm_head.qweight, step06)
    LayerTensors *layers;        // [cfg.n_layers]
    int quantized;               // config.json has a quantization_config (see above)
    char dir[1024];              // the directory it was loaded from
} ModelWeights;

// Returns 0, or -1 with a one-line reason in err (file, tensor, expected vs actual).
int model_load(const char *dir, ModelWeights *m, char *err, int errlen);
void model_free(ModelWeights *m);

#ifdef __cplusplus
}
#endif
