// decode_gpu_none.c — the CUDA half of kvcache.h for builds without CUDA (no nvcc): every entry
// point says so and fails, so programs and tests can report why the GPU path is skipped.
#include "kvcache.h"

#if !HAVE_CUDA
#include <stdio.h>

GpuDecoder *gpu_decoder_new(GpuModel *g, int max_seq, char *err, int errlen) {
    (void)g, (void)max_seq;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return NULL;
}
void gpu_decoder_free(GpuDecoder *d) { (void)d; }
void gpu_decoder_reset(GpuDecoder *d) { (void)d; }
int gpu_decoder_len(const GpuDecoder *d) {
    (void)d;
    return 0;
}
void gpu_decoder_set_fused(int mode) { (void)mode; }
void gpu_decoder_set_attn(int version) { (void)version; }
int gpu_decoder_get_attn(void) { return 2; }
void gpu_decoder_set_gemv_split(int ks) { (void)ks; }
void gpu_decoder_set_gemv_rows(int mode) { (void)mode; }
void gpu_decoder_set_gemv_short(int on) { (void)on; }
int gpu_decoder_lm_argmax(const GpuDecoder *d) {
    (void)d;
    return 0;
}
int gpu_decoder_argmax_ids(GpuDecoder *d, int p0, int n, int *out_ids) {
    (void)d, (void)p0, (void)n, (void)out_ids;
    return -1;
}
const char *gpu_decoder_fused_name(int mode) {
    static const char *const names[] = {"unfused", "fused", "fused_pdl"};
    return mode >= 0 && mode <= 2 ? names[mode] : "?";
}
int gpu_decoder_kernels(const GpuDecoder *d) {
    (void)d;
    return 0;
}
int gpu_decoder_step(GpuDecoder *d, int id, float *logits) {
    (void)d, (void)id, (void)logits;
    return -1;
}
int gpu_decoder_greedy(GpuDecoder *d, int first_id, int n, int *out_ids, float *step_ms) {
    (void)d, (void)first_id, (void)n, (void)out_ids, (void)step_ms;
    return -1;
}
double gpu_decoder_kv_bytes(const GpuDecoder *d) {
    (void)d;
    return 0;
}
double gpu_decoder_kv_elem_bytes(const GpuDecoder *d) {
    (void)d;
    return 0;
}
int forward_last_cuda(GpuModel *g, const int *ids, int T, float *logits, double *ms) {
    (void)g, (void)ids, (void)T, (void)logits, (void)ms;
    return -1;
}
int gemv_gpu_check(int version, const float *W, const float *x, const float *b, int rows, int n_in, StDtype dtype, float *y) {
    (void)version, (void)W, (void)x, (void)b, (void)rows, (void)n_in, (void)dtype, (void)y;
    return -1;
}
double gemv_gpu_bench_gbps(int version, int rows, int n_in, StDtype dtype) {
    (void)version, (void)rows, (void)n_in, (void)dtype;
    return -1;
}
int gemv_n_versions(void) { return 0; }
const char *gemv_version_name(int version) {
    (void)version;
    return "none";
}
void gemv_set_version(int version) { (void)version; }
int decode_attention_gpu_check(const float *q, const float *kc, const float *vc, int len, int H, int KV, int hd,
                               StDtype dtype, float *out) {
    (void)q, (void)kc, (void)vc, (void)len, (void)H, (void)KV, (void)hd, (void)dtype, (void)out;
    return -1;
}
#else
typedef int decode_gpu_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
