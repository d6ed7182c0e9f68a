// forward_gpu_none.c — the CUDA half of forward.h for builds without CUDA (no nvcc): every
// entry point says so and fails, so programs and tests can report why the GPU path is skipped.
#include "forward.h"

#if !HAVE_CUDA
#include <stdio.h>

GpuModel *gpu_model_load(const ModelWeights *w, char *err, int errlen) {
    (void)w;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return NULL;
}

GpuModel *gpu_model_random(const ModelConfig *c, StDtype dtype, uint64_t seed, char *err, int errlen) {
    (void)c, (void)dtype, (void)seed;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return NULL;
}

GpuModel *gpu_model_load_q(const ModelWeights *w, const QWeight *qlin, char *err, int errlen) {
    (void)w, (void)qlin;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return NULL;
}

GpuModel *gpu_model_random_q(const ModelConfig *c, uint64_t seed, const QWeight *qlin, char *err, int errlen) {
    (void)c, (void)seed, (void)qlin;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return NULL;
}

int gpu_model_quantize_lm_head(GpuModel *g, const QWeight *q, char *err, int errlen) {
    (void)g, (void)q;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return -1;
}

int gpu_model_lm_head_quantized(const GpuModel *g) {
    (void)g;
    return 0;
}
void gpu_model_free(GpuModel *g) { (void)g; }
const char *gpu_model_describe(const GpuModel *g) {
    (void)g;
    return "no CUDA";
}
double gpu_model_weight_bytes(const GpuModel *g) {
    (void)g;
    return 0;
}

double gpu_mem_used_bytes(void) { return -1; }

int forward_cuda(GpuModel *g, const int *ids, int T, float *logits, ForwardTimes *times) {
    (void)g, (void)ids, (void)T, (void)logits, (void)times;
    fprintf(stderr, "forward_cuda: built without CUDA\n");
    return -1;
}

int attention_gpu_check(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, StDtype dtype,
                        float *out) {
    (void)q, (void)k, (void)v, (void)T, (void)H, (void)KV, (void)hd, (void)dtype, (void)out;
    fprintf(stderr, "attention_gpu_check: built without CUDA\n");
    return -1;
}
#else
typedef int forward_gpu_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
