// runner_gpu_none.c — the CUDA half of the step04 runner for builds without CUDA (no nvcc):
// every entry point says so and fails, so programs and tests can report why the GPU path is
// skipped.
#include "step04_batching/runner_gpu.h"

#if !HAVE_CUDA
#include <stdio.h>

GpuRunner *gpu_runner_new(GpuModel *g, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen) {
    (void)g, (void)n_slots, (void)max_len, (void)max_tokens_per_step;
    snprintf(err, (size_t)errlen, "built without CUDA (nvcc was not found at build time)");
    return NULL;
}
void gpu_runner_free(GpuRunner *r) { (void)r; }
const char *gpu_runner_describe(const GpuRunner *r) {
    (void)r;
    return "cuda (not built)";
}
double gpu_runner_kv_bytes(const GpuRunner *r) {
    (void)r;
    return 0;
}
int gpu_runner_forward(GpuRunner *r, const Batch *b, float *logits, int *argmax) {
    (void)r, (void)b, (void)logits, (void)argmax;
    fprintf(stderr, "gpu_runner_forward: built without CUDA (nvcc was not found at build time)\n");
    return -1;
}
#else
typedef int runner_gpu_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
