// qmodel.h — step06's quantized projections in the engine: a model whose seven projections per
// layer (q/k/v/o, gate/up/down) are QWeights (quant.h), on the CPU (CpuLayer.q: linear_q_cpu) and
// on the GPU (GpuModel's QLinearGpu projections: qlinear_gpu_gemv for one row, qlinear_gpu_gemm for
// more), everything else (embeddings, norms, biases, and the lm_head unless it is quantized too:
// QuantSpec.lm_head, or a checkpoint that holds it so) as the dense loaders have it.
// defines: QuantAtLoad, QuantSpec, quant_spec_parse, qmodel_linears, qmodel_random_linears,
//          qmodel_linears_free, qmodel_quantize_cpu, qmodel_cpu_load, qmodel_gpu_load,
//          qmodel_gpu_random, qmodel_cpu_weight_bytes, qmodel_load
//
// Where the QWeights come from:
//   - a quantized checkpoint (config.json has a quantization_config, model.h's `quantized`): GPTQ
//     or AWQ tensors read by hf_quant.h (what build/bin/quantize writes is GPTQ v1);
//   - a dense checkpoint with --quant rtn-int8 | rtn-int4: round-to-nearest at load (quant_rtn),
//     INT8 per output channel, INT4 symmetric in groups of 128 inputs (a projection whose inputs
//     128 does not divide gets one group per row: the tiny test models are 64 and 172 wide), the
//     scales rounded to fp16 as `quantize` writes them (qweight_scales_fp16);
//   - a random preset (no checkpoint) on the GPU: random integers and scales of the same shapes
//     (weights of std ~0.02, as the dense random presets), made on the host without an fp32 copy.
// The programs' --quant none (the default) keeps a dense checkpoint dense; a quantized checkpoint
// runs quantized whatever --quant says (it has no dense weights).
#pragma once
#include <stdint.h>

#include "model.h"
#include "step02_attention/forward.h"
#include "step06_quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { QLOAD_NONE = 0, QLOAD_RTN_INT8 = 8, QLOAD_RTN_INT4 = 4 } QuantAtLoad;

typedef struct {
    QuantAtLoad method;
    int group;    // INT4 inputs per group (default 128; -1: one group per row); INT8 is per row
    int lm_head;  // 1: the lm_head quantized the same way too (a dense checkpoint or a random preset)
} QuantSpec;

// "none", "rtn-int8", "rtn-int4" (group 128), and "rtn-int8+lm_head", "rtn-int4+lm_head": the
// lm_head quantized too (as GPTQModel's "lm_head": true; it is otherwise left in bf16, the largest
// single matrix of a small-vocabulary-to-hidden ratio model: 1.05 GB of Llama-3.1-8B's 16 GB).
// 0, or -1 (unknown name).
int quant_spec_parse(const char *s, QuantSpec *q);

// The projections of w as QWeights, (n_layers * N_PROJ) in Proj order and one slot more for the
// lm_head (all zero, q == NULL, unless it is quantized: a checkpoint whose config says "lm_head":
// true, or q->lm_head on a dense one), or NULL with *err = 0 when the model stays dense (a dense
// checkpoint and q->method none). NULL with err set on failure.
// fmt (if not NULL) gets one line saying what they are, e.g. "gptq int4 g128 sym (checkpoint)" or
// "rtn-int4 g128 sym (quantized at load)".
QWeight *qmodel_linears(const ModelWeights *w, const QuantSpec *q, char *fmt, int fmtlen, char *err, int errlen);
// Random quantized projections of c's shapes (method int8 or int4, as q), laid out as
// qmodel_linears' (the lm_head's slot filled when q->lm_head).
QWeight *qmodel_random_linears(const ModelConfig *c, const QuantSpec *q, uint64_t seed, char *fmt, int fmtlen);
void qmodel_linears_free(QWeight *ql, int n_layers);

// Quantize a dense CpuModel's projections in place (RTN, as above; the fp32 matrices are freed),
// and its lm_head (CpuModel.q_lm_head) when q->lm_head. 0, or -1 + err.
int qmodel_quantize_cpu(CpuModel *m, const QuantSpec *q, char *fmt, int fmtlen, char *err, int errlen);
// cpu_model_load for any checkpoint: dense as cpu_model_load, or with the projections of
// qmodel_linears. 0, or -1 + err.
int qmodel_cpu_load(const ModelWeights *w, const QuantSpec *q, CpuModel *m, char *fmt, int fmtlen, char *err, int errlen);
// gpu_model_load for any checkpoint (gpu_model_load_q with qmodel_linears), and the random preset
// (gpu_model_random_q with qmodel_random_linears; bf16 and dense when q->method is none); with
// q->lm_head the lm_head quantized too (gpu_model_quantize_lm_head) unless the checkpoint is a
// quantized one (its lm_head stays as it has it).
GpuModel *qmodel_gpu_load(const ModelWeights *w, const QuantSpec *q, char *fmt, int fmtlen, char *err, int errlen);
GpuModel *qmodel_gpu_random(const ModelConfig *c, const QuantSpec *q, uint64_t seed, char *fmt, int fmtlen, char *err,
                            int errlen);
// Bytes the CPU model's weights take as held: fp32 tensors + each QWeight's qweight_bytes.
double qmodel_cpu_weight_bytes(const CpuModel *m);
// What the programs do: the model on the GPU (*gm) or the CPU (*cm) from a checkpoint w, or (w
// NULL) random weights of c with seed 1, with the projections q asks for; *weight_bytes as held
// there. 0, or -1 + err.
int qmodel_load(const ModelWeights *w, const ModelConfig *c, const QuantSpec *q, int use_cuda, GpuModel **gm,
                CpuModel *cm, double *weight_bytes, char *fmt, int fmtlen, char *err, int errlen);

#ifdef __cplusplus
}
#endif
