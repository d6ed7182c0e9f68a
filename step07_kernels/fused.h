// fused.h — step07's fused kernels, callable from C on device pointers (fused.cu; fused_none.c
// when built without nvcc: every call fails), and their fp32 CPU references (fused_cpu.c, always
// built, which CI tests).
// defines: FUSED_ADDNORM_VERSIONS, FUSED_SWIGLU_VERSIONS, FUSED_ROPE_VERSIONS, FusedVersion,
//          fused_addnorm_ladder, fused_swiglu_ladder, fused_rope_ladder, fused_add_rmsnorm,
//          fused_swiglu, fused_swiglu_pdl, fused_rope_kv_write, fused_round, fused_add_rmsnorm_cpu, fused_swiglu_cpu,
//          fused_rope_kv_write_cpu
//
// The three ops of a Llama layer that move bytes and do almost no math, each as a ladder of
// numbered versions: v0 is the engine's unfused way (two launches where the op is two kernels
// today), the later versions fuse and vectorize. Every version computes the same function with
// the same rounding (below); the tables fused_*_ladder are the only list of versions (the
// benchmark and the tests read them).
//
// Precision, and where rounding happens (HF transformers' order, so a bf16 model through these
// kernels rounds where transformers rounds):
//   add + RMSNorm, residual dtype R, output dtype O, weight w fp32 (the engine keeps norm weights
//   in fp32; a bf16 checkpoint's weights are exact in fp32):
//       s      = round_R(x + r)               the residual add, done in fp32 and rounded once,
//                                             exactly what torch does for a bf16 + bf16 add
//       r     := s                            (in place: the residual stream after the add)
//       inv    = 1 / sqrt(mean(s^2) + eps)    over the ROUNDED s, in fp32
//       out    = round_O(w * round_R(s * inv)) transformers' LlamaRMSNorm: normalize in fp32,
//                                             back to the input dtype, then times the weight
//   With R = fp32 (the engine's fp32 residual stream) the inner rounding is the identity and
//   out = round_O(s * inv * w): the engine's k_rmsnorm.
//   SwiGLU over the merged gate|up GEMM output gu (T, 2*ff), input dtype I, output O:
//       h = round_O(round_I(silu(g)) * u)      silu(g) = g / (1 + exp(-g)) in fp32; transformers
//                                             computes act_fn(gate) in the input dtype first
//   RoPE (rotate-half, the HF / neox layout) + K/V write through the slot mapping: the engine's
//   fp32 qkv rows (T, (H + 2*KV) * hd) as its GEMM leaves them, cos / sin tables (T, hd/2)
//   fp32 (step04's k_rope_rows): q heads rotated in place (fp32), k heads rotated and written to
//   cache row slots[t], v heads copied to it, both rounded to the cache dtype C once. A slot < 0
//   is a padding row: its cache rows are not touched.
//
// Every launcher returns the number of kernel launches it queued (>= 1) or -1 on bad arguments
// or a launch error (message on stderr). `stream` is a cudaStream_t (NULL: the default stream);
// the v0 of the RoPE ladder calls step05's paged_kv_write, which runs on the default stream, so
// it takes NULL only.
#pragma once
#include "safetensors.h"  // StDtype

#ifdef __cplusplus
extern "C" {
#endif

#define FUSED_ADDNORM_VERSIONS 5
#define FUSED_SWIGLU_VERSIONS 2
#define FUSED_ROPE_VERSIONS 3

typedef struct {
    int version;       // the number passed to the launcher
    const char *name;  // "v2_vec_warp"
    const char *what;  // one line for the table
} FusedVersion;

extern const FusedVersion fused_addnorm_ladder[FUSED_ADDNORM_VERSIONS];
extern const FusedVersion fused_swiglu_ladder[FUSED_SWIGLU_VERSIONS];
extern const FusedVersion fused_rope_ladder[FUSED_ROPE_VERSIONS];

// residual (T, n) in rdt += x (T, n) in rdt; out (T, n) in odt = rmsnorm(residual) * w (n, fp32).
// rdt, odt: ST_F32, ST_F16, ST_BF16 (rdt 16-bit: odt == rdt). n <= 32768; rows contiguous.
int fused_add_rmsnorm(int version, StDtype rdt, StDtype odt, const void *x, void *residual, const float *w, int T,
                      int n, float eps, void *out, void *stream);
// h (T, ff) in odt = silu(gate) * up; gu (T, 2*ff) in idt: gate columns 0..ff-1, up ff..2ff-1.
int fused_swiglu(int version, StDtype idt, StDtype odt, const void *gu, void *h, int T, int ff, void *stream);
// The same, v1 launched with programmatic dependent launch when pdl (sm_90, a non-default stream: it
// may be scheduled while the kernel before it drains, and waits for it before reading gu).
int fused_swiglu_pdl(int version, StDtype idt, StDtype odt, const void *gu, void *h, int T, int ff, void *stream, int pdl);
// qkv (T, (H + 2*KV) * hd) fp32: q heads rotated in place; k heads rotated into kc row slots[t],
// v heads into vc row slots[t] (kc, vc: (rows, KV*hd) in cdt); cos_t, sin_t (T, hd/2); hd even.
// v0 also leaves the rotated k in qkv (the engine's k_rope rotates q and k in place).
int fused_rope_kv_write(int version, StDtype cdt, float *qkv, int T, int H, int KV, int hd, const float *cos_t,
                        const float *sin_t, const int *slots, void *kc, void *vc, void *stream);

// ---- fp32 CPU references (fused_cpu.c); `dt` says which rounding to emulate.
// x rounded to dt (round to nearest even; fp16 via the compiler's _Float16), as a float.
float fused_round(StDtype dt, float x);
void fused_add_rmsnorm_cpu(StDtype rdt, StDtype odt, const float *x, float *residual, const float *w, int T, int n,
                           float eps, float *out);
void fused_swiglu_cpu(StDtype idt, StDtype odt, const float *gu, float *h, int T, int ff);
void fused_rope_kv_write_cpu(StDtype cdt, float *qkv, int T, int H, int KV, int hd, const float *cos_t,
                             const float *sin_t, const int *slots, float *kc, float *vc);

#ifdef __cplusplus
}
#endif
