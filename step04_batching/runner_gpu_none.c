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
GpuRunner *gpu_runner_new_paged(GpuModel *g, int num_blocks, int block_size, int max_model_len,
                                int max_tokens_per_step, char *err, int errlen) {
    (void)g, (void)num_blocks, (void)block_size, (void)max_model_len, (void)max_tokens_per_step;
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
int gpu_runner_forward_sampled(GpuRunner *r, const Batch *b, const float *temperature, const uint64_t *keys,
                               int *tokens) {
    (void)r, (void)b, (void)temperature, (void)keys, (void)tokens;
    fprintf(stderr, "gpu_runner_forward_sampled: built without CUDA (nvcc was not found at build time)\n");
    return -1;
}
int gpu_runner_launch(GpuRunner *r, const Batch *b, const float *temperature, const uint64_t *keys, const int *fix_rows,
                      const int *fix_src, int n_fix, int slot) {
    (void)r, (void)b, (void)temperature, (void)keys, (void)fix_rows, (void)fix_src, (void)n_fix, (void)slot;
    fprintf(stderr, "gpu_runner_launch: built without CUDA (nvcc was not found at build time)\n");
    return -1;
}
int gpu_runner_collect(GpuRunner *r, int slot, int *tokens) {
    (void)r, (void)slot, (void)tokens;
    fprintf(stderr, "gpu_runner_collect: built without CUDA (nvcc was not found at build time)\n");
    return -1;
}
int gpu_runner_set_graphs(GpuRunner *r, int on) {
    (void)r, (void)on;
    return 0;
}
int gpu_runner_set_lone_decode(GpuRunner *r, int mode) {
    (void)r, (void)mode;
    return 0;
}
void gpu_runner_graph_stats(const GpuRunner *r, long *replays, long *captures) {
    (void)r;
    *replays = *captures = 0;
}
int gpu_runner_capture_graphs(GpuRunner *r) {
    (void)r;
    return 0;
}
int gpu_runner_last_logits(const GpuRunner *r, int k, float *out) {
    (void)r, (void)k, (void)out;
    return -1;
}
int gumbel_sample_gpu_check(const float *logits, int rows, int vocab, const float *temperature, const uint64_t *keys,
                            int *tokens) {
    (void)logits, (void)rows, (void)vocab, (void)temperature, (void)keys, (void)tokens;
    return -1;
}
int argmax_rows_gpu_check(const float *logits, int rows, int vocab, int *tokens) {
    (void)logits, (void)rows, (void)vocab, (void)tokens;
    return -1;
}
double gpu_runner_last_ms(const GpuRunner *r) {
    (void)r;
    return -1;
}
int gpu_runner_launches(const GpuRunner *r) {
    (void)r;
    return 0;
}
void gpu_runner_set_small_chunk(GpuRunner *r, int rows) { (void)r, (void)rows; }
int gpu_runner_set_prefill_attn(GpuRunner *r, int mode) {
    (void)r, (void)mode;
    return 0;
}
int gpu_runner_set_batch_invariant(GpuRunner *r, int on) {
    (void)r, (void)on;
    return 0;
}
int gpu_runner_read_kv(const GpuRunner *r, int layer, int row, float *k, float *v) {
    (void)r, (void)layer, (void)row, (void)k, (void)v;
    return -1;
}
int batch_attention_gpu_check(const float *q, const float *kc, const float *vc, int cache_rows, int n_seqs,
                              const int *cu_q, const int *seq_lens_k, const int *base, int H, int KV, int hd,
                              StDtype dtype, int small_chunk, float *out) {
    (void)q, (void)kc, (void)vc, (void)cache_rows, (void)n_seqs, (void)cu_q, (void)seq_lens_k, (void)base;
    (void)H, (void)KV, (void)hd, (void)dtype, (void)small_chunk, (void)out;
    return -1;
}
int batch_attention_gpu_check_paged(const float *q, const float *kc, const float *vc, int cache_rows, int n_seqs,
                                    const int *cu_q, const int *seq_lens_k, const int *block_tables, int bt_stride,
                                    int block_size, int H, int KV, int hd, StDtype dtype, int small_chunk, float *out) {
    (void)q, (void)kc, (void)vc, (void)cache_rows, (void)n_seqs, (void)cu_q, (void)seq_lens_k, (void)block_tables;
    (void)bt_stride, (void)block_size, (void)H, (void)KV, (void)hd, (void)dtype, (void)small_chunk, (void)out;
    return -1;
}
int step04_decode_attention_dev(StDtype dtype, const float *q, int ldq, const void *kc, const void *vc, const int *rows,
                                const int *lens, const int *bases, int n, int max_len, int H, int KV, int hd, void *out,
                                float *part_o, float *part_ml, size_t part_cap) {
    (void)dtype, (void)q, (void)ldq, (void)kc, (void)vc, (void)rows, (void)lens, (void)bases, (void)n, (void)max_len;
    (void)H, (void)KV, (void)hd, (void)out, (void)part_o, (void)part_ml, (void)part_cap;
    return -1;
}
LongAttnBench *long_attn_bench_new(StDtype dtype, int H, int KV, int hd, const float *q, int ldq, const void *kc,
                                   const void *vc, const int *d_bt, int bt_stride, int block_size,
                                   const PrefillChunk *chunks, int nchunks, void *out) {
    (void)dtype, (void)H, (void)KV, (void)hd, (void)q, (void)ldq, (void)kc, (void)vc, (void)d_bt, (void)bt_stride;
    (void)block_size, (void)chunks, (void)nchunks, (void)out;
    return NULL;
}
int long_attn_bench_run(LongAttnBench *b, int fused) {
    (void)b, (void)fused;
    return -1;
}
void long_attn_bench_free(LongAttnBench *b) { (void)b; }
#else
typedef int runner_gpu_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
