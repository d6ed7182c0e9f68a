// train_gpu_none.c — the GPU trainer (train_gpu.h) in a build without CUDA (no nvcc): creating one
// fails with a message that says so; the other entry points are never reached.
#include "step08_ddp/train_gpu.h"

#if !HAVE_CUDA
#include "check.h"

const char *train_gpu_math_name(TrainGpuMath math) {
    return math == TRAIN_GPU_FP32 ? "fp32 (CUBLAS_COMPUTE_32F)"
                                  : "bf16 tensor cores, fp32 master weights (CUBLAS_COMPUTE_32F_FAST_16BF)";
}
int train_gpu_check_config(const ModelConfig *c, char *err, int errlen) {
    (void)c;
    return errf(err, errlen, "training on the GPU: this build has no CUDA (nvcc was not found at build time, or NO_CUDA=1)");
}
TrainGpu *train_gpu_new(const TrainModel *m, int B, int T, TrainGpuMath math, char *desc, int desclen, char *err,
                        int errlen) {
    (void)B, (void)T, (void)math, (void)desc, (void)desclen;
    train_gpu_check_config(&m->cfg, err, errlen);
    return NULL;
}
// unreachable: there is no TrainGpu to pass
void train_gpu_free(TrainGpu *g) { (void)g; }
void train_gpu_upload(TrainGpu *g, const TrainModel *m, int with_grads) { (void)g, (void)m, (void)with_grads; die("train_gpu_upload: built without CUDA"); }
void train_gpu_download(TrainGpu *g, TrainModel *m) { (void)g, (void)m; die("train_gpu_download: built without CUDA"); }
void train_gpu_upload_adamw(TrainGpu *g, const AdamW *o) { (void)g, (void)o; die("train_gpu_upload_adamw: built without CUDA"); }
void train_gpu_download_adamw(TrainGpu *g, AdamW *o) { (void)g, (void)o; die("train_gpu_download_adamw: built without CUDA"); }
void train_gpu_snapshot(TrainGpu *g, float *params, float *m, float *v, long *adam_t) {
    (void)g, (void)params, (void)m, (void)v, (void)adam_t;
    die("train_gpu_snapshot: built without CUDA");
}
void *train_gpu_host_alloc(size_t bytes) { (void)bytes; return NULL; }
void train_gpu_host_free(void *p) { (void)p; }
double train_gpu_forward_backward(TrainGpu *g, const int *ids, const int *targets, int *n_counted) {
    (void)g, (void)ids, (void)targets, (void)n_counted;
    die("train_gpu_forward_backward: built without CUDA");
}
double train_gpu_forward_backward_hooked(TrainGpu *g, const int *ids, const int *targets, int *n_counted,
                                         TrainGradReady ready, void *ctx) {
    (void)g, (void)ids, (void)targets, (void)n_counted, (void)ready, (void)ctx;
    die("train_gpu_forward_backward_hooked: built without CUDA");
}
float *train_gpu_grads(TrainGpu *g) { (void)g, die("train_gpu_grads: built without CUDA"); }
double train_gpu_clip(TrainGpu *g, double max_norm) { (void)g, (void)max_norm; die("train_gpu_clip: built without CUDA"); }
void train_gpu_adamw_step(TrainGpu *g, const AdamWConfig *c, float lr) { (void)g, (void)c, (void)lr; die("train_gpu_adamw_step: built without CUDA"); }
#else
typedef int train_gpu_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
