// hf_quant.h — quantized Hugging Face checkpoints: GPTQ and AWQ read into the engine's QWeight
// (quant.h), and GPTQ written out (one linear, or a whole model directory for `quantize`).
// defines: HfQuantMethod, HfQuantConfig, hfq_config_parse, hfq_config_load, hfq_config_json,
//          hfq_read_linear, HfqGptqTensors, hfq_gptq_pack, hfq_gptq_tensors_free,
//          HfqLinearFn, HfqWriteOpts, hfq_write_model, hfq_linear_names
//
// config.json's "quantization_config" decides the format. What is accepted (anything else is an
// error naming the field and its value):
//   {"quant_method": "gptq", "bits": 4 | 8, "group_size": 128 | 64 | 32 | -1 (-1: one group per
//    row), "sym": true | false, "desc_act": true | false, "checkpoint_format": "gptq" (v1; absent
//    means v1 too)}; "lm_head" false or absent (lm_head.weight dense), or true (lm_head.qweight
//    etc. as the layers' linears, the format GPTQModel writes with that option); "pack_dtype"
//    "int32" or absent.
//   {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128, "zero_point": true};
//    "modules_to_not_convert" null or empty.
// Other keys (damp_percent, true_sequential, model_name_or_path, ...) do not change the layout
// and are ignored.
//
// The tensors of one quantized linear `P` (e.g. "model.layers.0.self_attn.q_proj"), with
// in = in_features, out = out_features, G = number of groups, all int32 words little endian:
//   GPTQ v1: P.qweight (in * bits / 32, out): word [i][o] holds the 32 / bits inputs
//              i * 32 / bits + k (k = 0, 1, ...) of output o, input k in bits k * bits ...
//            P.qzeros  (G, out * bits / 32): word [g][j] holds outputs j * 32 / bits + k the
//              same way; the value stored is z - 1 (v1's convention, undone at load)
//            P.scales  (G, out) fp16 (F32 / BF16 accepted too)
//            P.g_idx   (in) int32, the group of each input (c / group unless desc_act)
//   AWQ gemm: P.qweight (in, out / 8): word [i][j] holds outputs j * 8 + ORDER[k] in nibble k
//              (bits 4k .. 4k + 3), ORDER = {0, 2, 4, 6, 1, 3, 5, 7}
//            P.qzeros  (G, out / 8) the same packing; the value stored is z itself
//            P.scales  (G, out) fp16; no g_idx
// In both, W[o][i] = (q - z) * s. Loaded into QWeight: q and zeros unpacked to quant.h's layout
// (rows = out, cols = in), scales to fp32 exactly, g_idx kept only when it is not c / group.
// A symmetric GPTQ checkpoint (sym true) must store z = 2^(bits-1) everywhere (checked; the
// QWeight then has zeros == NULL).
#pragma once
#include "quant.h"
#include "safetensors.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { HFQ_NONE = 0, HFQ_GPTQ = 1, HFQ_AWQ = 2 } HfQuantMethod;

typedef struct {
    HfQuantMethod method;  // HFQ_NONE: config.json has no quantization_config
    int bits;              // 4 or 8 (AWQ: 4)
    int group_size;        // inputs per group, or -1: one group per output row (per channel)
    int sym;               // GPTQ "sym"; AWQ: 0 (zero_point true)
    int desc_act;          // GPTQ "desc_act" (act-order: g_idx is a permutation's groups)
    int lm_head;           // GPTQ "lm_head": the lm_head is quantized too (tensors lm_head.qweight ...)
} HfQuantConfig;

// Parse a whole config.json text (src names it in messages). No "quantization_config": 0 with
// method HFQ_NONE. An unsupported one: -1 and err like
//   "config.json: quantization_config.bits = 3 is not supported (gptq: 4 or 8)".
int hfq_config_parse(const char *json_text, const char *src, HfQuantConfig *c, char *err, int errlen);
// Reads DIR/config.json and parses it as above.
int hfq_config_load(const char *dir, HfQuantConfig *c, char *err, int errlen);
// The quantization_config object for `c` (GPTQ only) as compact JSON text (malloc'd; NULL on bad c):
//   {"bits":4,"checkpoint_format":"gptq","desc_act":false,"group_size":128,"quant_method":"gptq","sym":true}
// (with "lm_head":true after "group_size" when c->lm_head).
char *hfq_config_json(const HfQuantConfig *c);

// Read the quantized linear `prefix` (no trailing dot) from st into *w (allocated here; free
// with qweight_free). rows / cols: the expected out_features / in_features, or 0 to take them
// from the tensors. Every shape, dtype, packed value (sym zero points, g_idx range) is checked;
// an error names the tensor. 0, or -1 + err.
int hfq_read_linear(const StSet *st, const char *prefix, const HfQuantConfig *c, int rows, int cols, QWeight *w,
                    char *err, int errlen);

// One QWeight as the four GPTQ v1 tensors (bits 4 or 8, as w->kind), in memory:
typedef struct {
    int in, out, n_groups, bits;
    int32_t *qweight;   // (in * bits / 32, out)
    int32_t *qzeros;    // (n_groups, out * bits / 32), z - 1 stored (sym: 2^(bits-1) - 1)
    void *scales;       // (n_groups, out): uint16_t fp16 bits (scale_dtype ST_F16) or float (ST_F32)
    StDtype scale_dtype;
    int32_t *g_idx;     // (in): w->g_idx, or c / group when w has none
} HfqGptqTensors;
// Pack w. scale_dtype ST_F16 (the format's own; fp32 scales rounded to nearest even, so a
// scale that is not an fp16 value comes back rounded) or ST_F32 (exact). in must be a multiple
// (in * bits % 32 == 0, out * bits % 32 == 0); a zero point of 0 cannot be stored in
// v1 (z - 1 = -1) and is an error. 0, or -1 + err.
int hfq_gptq_pack(const QWeight *w, StDtype scale_dtype, HfqGptqTensors *t, char *err, int errlen);
void hfq_gptq_tensors_free(HfqGptqTensors *t);

// ---------------------------------------------------------------- whole model (for `quantize`)
// The linears of layer i that are quantized, in this order (the suffix after
// "model.layers.{i}."): self_attn.q_proj, k_proj, v_proj, o_proj, mlp.gate_proj, up_proj, down_proj.
// Embeddings, norms and biases stay as in the source, and the lm_head unless the config's lm_head
// is set (then it is quantized last: layer = n_layers, which = HFQ_LM_HEAD, name "lm_head"; a tied
// source's embedding matrix is its weight, and the embedding stays too).
#define HFQ_N_LINEARS 7
#define HFQ_LM_HEAD HFQ_N_LINEARS
extern const char *const hfq_linear_names[HFQ_N_LINEARS];  // "self_attn.q_proj", ..., "mlp.down_proj"

// Called once per quantized linear, in layer order then hfq_linear_names order: fill *out from
// the source weight `W` (rows, cols fp32, the source tensor converted; W is freed after the call)
// e.g. with quant_rtn or quant_gptq. `name` is the full prefix ("model.layers.3.mlp.up_proj").
// The writer packs *out and then frees it with qweight_free. Return 0, or -1 with err set
// (the writer stops and returns -1 with that message).
typedef int (*HfqLinearFn)(void *ctx, int layer, int which, const char *name, const float *W, int rows, int cols,
                           QWeight *out, char *err, int errlen);

typedef struct {
    int fp32_scales;  // 0 (default): scales stored fp16, as the format has them; 1: fp32 (exact)
} HfqWriteOpts;

// Write a quantized copy of the model in src_dir (common/model.h) to out_dir (created if missing):
//   out_dir/model.safetensors: for each quantized linear P the four GPTQ tensors (P.qweight,
//     P.qzeros, P.scales, P.g_idx) in place of P.weight; every other tensor byte for byte;
//   out_dir/config.json: the source's, with "quantization_config" = hfq_config_json(c);
//   the tokenizer files present in src_dir (tokenizer.json, tokenizer_config.json,
//     special_tokens_map.json, generation_config.json, tokenizer.model) copied.
// c: method HFQ_GPTQ, bits matching the QWeights, group_size, sym, desc_act as the callback
// produces them (each QWeight is checked against c: kind, group, sym; g_idx only if desc_act).
// opts may be NULL (fp16 scales). The whole output is held in memory until it is written.
// 0, or -1 + err.
int hfq_write_model(const char *src_dir, const char *out_dir, const HfQuantConfig *c, HfqLinearFn fn, void *ctx,
                    const HfqWriteOpts *opts, char *err, int errlen);

#ifdef __cplusplus
}
#endif
