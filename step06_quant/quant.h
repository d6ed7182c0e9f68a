// quant.h — step06's weight-only quantized linear layer: the engine's own layout, the quantizers
// (round-to-nearest INT8 / INT4, GPTQ), and the fp32 CPU reference. Plain C.
// defines: QuantKind, QWeight, qweight_alloc, qweight_free, qweight_group_of, qweight_zero, qweight_scale,
//          qweight_get, qweight_set, qweight_dequant, quant_rtn, GptqOpts, gptq_hessian_add,
//          quant_gptq, linear_q_cpu, qweight_bytes, quant_kind_name, qweight_random, qweight_stack_rows,
//          qweight_scales_fp16
//
// A Linear weight W is (rows = out_features, cols = in_features), y = x W^T + b, as in a Hugging
// Face checkpoint. Quantized, element (r, c) is an unsigned integer q in 0 .. 2^bits - 1 and
//     W[r][c] ~= (q - z[r][g]) * s[r][g],   g = g_idx ? g_idx[c] : c / group
// with one scale s (and zero point z) per output row and group of `group` input columns:
//   INT8 per output channel: bits 8, group = cols (one group), symmetric: z = 128
//   INT4 group-wise:         bits 4, group 128 (cols % group == 0), symmetric (z = 8) or with
//                            stored zero points (asymmetric, z in 0..15)
// Storage in this layout (what the CPU reference reads; GPU kernels repack it at load):
//   q: row-major (rows, cols) for INT8 (one byte each); for INT4 two per byte, (rows, cols / 2),
//      the even column in the low nibble.
//   scales: (rows, n_groups) fp32; zeros: (rows, n_groups) one byte each, or NULL when symmetric.
//   g_idx: NULL, or (cols) the group of each input column (GPTQ's act-order / desc_act checkpoints).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { QK_INT8 = 8, QK_INT4 = 4 } QuantKind;  // the value is the bit width

typedef struct {
    QuantKind kind;
    int rows, cols;      // out_features, in_features
    int group;           // input columns per group (cols for per-channel INT8)
    int n_groups;        // cols / group (with g_idx: max(g_idx) + 1)
    int sym;             // 1: z = 2^(bits-1) for every group, zeros == NULL
    uint8_t *q;          // see above
    float *scales;       // (rows, n_groups)
    uint8_t *zeros;      // (rows, n_groups) or NULL
    int *g_idx;          // (cols) or NULL
} QWeight;

// Allocates q, scales (and zeros when !sym) zeroed; g_idx stays NULL. 0, or -1 (bad sizes:
// group must divide cols; INT4 needs an even cols).
int qweight_alloc(QWeight *w, QuantKind kind, int rows, int cols, int group, int sym);
void qweight_free(QWeight *w);
int qweight_group_of(const QWeight *w, int c);
int qweight_get(const QWeight *w, int r, int c);             // the integer q of (r, c)
void qweight_set(QWeight *w, int r, int c, int q);           // q in 0 .. 2^bits - 1
float qweight_zero(const QWeight *w, int r, int g);          // z of row r, group g
float qweight_scale(const QWeight *w, int r, int g);
void qweight_dequant(const QWeight *w, float *W);            // W (rows, cols) fp32
size_t qweight_bytes(const QWeight *w);                      // q + scales (+ zeros, g_idx) as stored here
const char *quant_kind_name(QuantKind k);                    // "int8", "int4"
// Rounds every scale to the nearest fp16 value (kept in fp32): what a checkpoint stores (GPTQ and AWQ
// hold fp16 scales), and what the Hopper GPU kernels hold (qlinear_gpu.h). quantize rounds the scales
// it writes, the engine those it quantizes at load, so every model the engine runs has fp16 scales.
// A scale beyond fp16's largest finite value (65504) becomes that value.
void qweight_scales_fp16(QWeight *w);
// A random layer for the tests and benchmarks: every integer equally likely, scales in
// [0.5, 1.5) / 64 (fp16 values), random zero points when !sym, and with act_order a random GPTQ desc_act
// g_idx (column perm[k] of a random permutation is the k-th quantized, in group k / group).
// 0, or -1 (as qweight_alloc).
int qweight_random(QWeight *w, Rng *r, QuantKind kind, int rows, int cols, int group, int sym, int act_order);
// out = the n weights one above the other (rows r_0 + r_1 + ..., the same cols): the layout of a
// fused q|k|v or gate|up projection. Only when kind, cols, group, n_groups, sym and g_idx (both
// NULL or equal) agree: 1 (and *out untouched) when they do not, 0 on success, -1 (no memory).
int qweight_stack_rows(const QWeight *const *parts, int n, QWeight *out);

// Round to nearest: per row and group, symmetric s = max|w| / (2^(bits-1) - 1), z = 2^(bits-1)
// (INT4: q in 1..15; INT8: 1..255); asymmetric over the range widened to hold 0, min' = min(min, 0),
// max' = max(max, 0): s = (max' - min') / (2^bits - 1), z = round(-min' / s) clamped to 0..2^bits-1.
// An all-zero group gets s = 1 (it dequantizes to exactly 0). q = clamp(round(w / s) + z), the
// nearest integer given s and z. W (rows, cols) fp32. 0, or -1 (as qweight_alloc).
int quant_rtn(const float *W, int rows, int cols, QuantKind kind, int group, int sym, QWeight *out);

// GPTQ (Frantar et al. 2022): quantize the columns in order (act-order: by decreasing Hessian
// diagonal), each column's rounding error spread onto the columns not yet quantized through the
// inverse Hessian's upper Cholesky factor, in lazy blocks of `block` columns. The Hessian is
// H = 2/N * sum_i x_i x_i^T over N calibration rows x_i of the layer's input (cols wide).
typedef struct {
    float damp;      // damping: H += damp * mean(diag H) * I (default 0.01)
    int block;       // lazy batch size (default 128)
    int act_order;   // 1: columns by decreasing diag(H) (then g_idx is set), 0: in order
} GptqOpts;
// Accumulate X (n, cols) into H (cols, cols, double) and the row count *n_seen (start both at 0).
void gptq_hessian_add(double *H, long *n_seen, const float *X, int n, int cols);
// W (rows, cols) fp32 is not changed. 0, or -1 + err (bad sizes, H not positive definite even
// after damping).
int quant_gptq(const float *W, int rows, int cols, const double *H, long n_seen, QuantKind kind, int group, int sym,
               const GptqOpts *o, QWeight *out, char *err, int errlen);

// The fp32 reference: Y (T, rows) = X (T, cols) W^T (+ bias), W dequantized on the fly from w;
// each output element summed over c in order (the same arithmetic as on the dequantized matrix).
void linear_q_cpu(const float *X, const QWeight *w, const float *bias, int T, float *Y);

#ifdef __cplusplus
}
#endif
