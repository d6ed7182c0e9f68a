// runner_gpu.h — the CUDA half of the step04 runner (runner_gpu.cu; runner_gpu_none.c when built
// without nvcc). runner.c wraps it behind batch.h's Runner; programs and tests use Runner.
// defines: GpuRunner, gpu_runner_new, gpu_runner_free, gpu_runner_describe, gpu_runner_kv_bytes,
//          gpu_runner_forward
//
// KV memory: per layer K and V of (n_slots * max_len, n_kv_heads * head_dim) in the weight
// dtype; the new tokens' K/V rows are written at batch->slot_mapping[t] (-1: skipped).
#pragma once
#include "step04_batching/batch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct GpuRunner GpuRunner;

// NULL + err on failure (no CUDA, out of device memory, bad sizes).
GpuRunner *gpu_runner_new(GpuModel *g, int n_slots, int max_len, int max_tokens_per_step, char *err, int errlen);
void gpu_runner_free(GpuRunner *r);
const char *gpu_runner_describe(const GpuRunner *r);
double gpu_runner_kv_bytes(const GpuRunner *r);
// As runner_forward (batch.h): logits (n_logits, vocab) to the host when logits != NULL; argmax
// (n_logits) computed on the device when argmax != NULL. 0, or -1 with a message on stderr.
int gpu_runner_forward(GpuRunner *r, const Batch *b, float *logits, int *argmax);

#ifdef __cplusplus
}
#endif
