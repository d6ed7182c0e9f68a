// train_gpu.h — training on one GPU: the CPU trainer's model (train.h) with its forward, backward,
// clipping and AdamW run by CUDA kernels and cuBLAS.
// defines: TrainGpu, TrainGpuMath, train_gpu_check_config, train_gpu_new, train_gpu_free,
//          train_gpu_upload, train_gpu_download, train_gpu_upload_adamw, train_gpu_download_adamw,
//          train_gpu_forward_backward, train_gpu_forward_backward_hooked, train_gpu_grads, train_gpu_clip,
//          train_gpu_adamw_step, train_gpu_math_name
//
// What lives where: the device holds a copy of TrainModel's flat fp32 buffers (params, grads, the
// AdamW moments m and v: the same layout and offsets as on the host, so a download feeds the CPU's
// checkpoint and export code unchanged) and the activations of one batch (B, T) (as TrainActs).
// The host keeps the data, the schedule and the logging. One training step is
//   train_gpu_forward_backward (zeroes the grads, forward, loss, backward) -> train_gpu_clip ->
//   train_gpu_adamw_step;
// nothing is copied between host and device inside it but the batch's ids (up) and the loss and
// the gradient norm (down).
//
// Matmuls: cuBLAS GEMMs on the fp32 buffers. TRAIN_GPU_BF16 lets cuBLAS round the inputs to bf16
// for the tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF: fp32 accumulation, fp32 outputs; the master
// weights, gradients and optimizer state stay fp32, as mixed-precision training does);
// TRAIN_GPU_FP32 computes in plain fp32 (CUBLAS_COMPUTE_32F), which matches the CPU to rounding.
// On sm_75 (no bf16 tensor cores) the mode allows bf16 but does not force it: cuBLAS may compute in fp32.
// Attention is the unfused textbook one: scores and P per (sequence, head) with strided-batched
// GEMMs, a causal row softmax kernel, P v; the backward keeps P from the forward (memory B H T^2
// per layer, as the CPU's TrainActs).
//
// Supported: the CPU trainer's configs (Llama, Mistral, MHA / GQA / MQA, any rope theta and llama3
// scaling, tied or untied embeddings) except these, refused by train_gpu_check_config with an
// error: q/k/v or o_proj biases (Qwen2), q/k RMSNorm (Qwen3). Data parallelism over GPUs (one
// rank per GPU, NCCL) is ddp_nccl.h's, through the hook and the grad pointer below.
#pragma once
#include <stddef.h>

#include "step08_ddp/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TRAIN_GPU_BF16 = 0, TRAIN_GPU_FP32 = 1 } TrainGpuMath;
const char *train_gpu_math_name(TrainGpuMath math);  // "bf16 tensor cores, fp32 master" / "fp32"

typedef struct TrainGpu TrainGpu;

// 0 when the GPU trainer runs config c, else -1 + err (what it refuses, see above).
int train_gpu_check_config(const ModelConfig *c, char *err, int errlen);
// A device copy of m (params uploaded, grads and AdamW moments zeroed) with the activations for
// batches of (B, T) tokens. NULL + err when the config is refused, there is no CUDA device, or the
// build has no CUDA; a device name and memory use for the log go into *desc when desc is not NULL.
TrainGpu *train_gpu_new(const TrainModel *m, int B, int T, TrainGpuMath math, char *desc, int desclen, char *err,
                        int errlen);
void train_gpu_free(TrainGpu *g);
// Host -> device: m's params (and its grads when with_grads, e.g. to feed the optimizer a known
// gradient). Device -> host: params and grads into m (same layout).
void train_gpu_upload(TrainGpu *g, const TrainModel *m, int with_grads);
void train_gpu_download(TrainGpu *g, TrainModel *m);
// The optimizer state (moments and step count) both ways, for checkpoints and resume.
void train_gpu_upload_adamw(TrainGpu *g, const AdamW *o);
void train_gpu_download_adamw(TrainGpu *g, AdamW *o);
// A checkpoint's state straight from the device: params, AdamW m and v into params / m / v (n_params
// floats each; pinned memory from train_gpu_host_alloc makes this a fast DMA) and the AdamW step
// count into *adam_t. Host memory allocated with cudaMallocHost (NULL when that fails), and its free.
void train_gpu_snapshot(TrainGpu *g, float *params, float *m, float *v, long *adam_t);
void *train_gpu_host_alloc(size_t bytes);
void train_gpu_host_free(void *p);
// Zero the device grads, run the forward over ids (B, T) with targets (B, T) (TRAIN_IGNORE: not
// counted), the loss (mean over the counted targets, as cross_entropy_cpu) and the backward into
// the device grads. Returns the loss, or -1 for an id or target outside the vocabulary. *n_counted
// (may be NULL) gets the number of counted targets.
double train_gpu_forward_backward(TrainGpu *g, const int *ids, const int *targets, int *n_counted);
// train_gpu_forward_backward, calling ready(ctx, off, n) (may be NULL) as each range of the device
// grads is final, in train_backward_hooked's order (head, layers last -> first, embedding): the
// call comes when the range's backward is enqueued on the compute stream (the legacy default
// stream), so the range is final once the work enqueued so far has run (ddp_nccl.h records an
// event there). The offsets are those of the host's buffer.
double train_gpu_forward_backward_hooked(TrainGpu *g, const int *ids, const int *targets, int *n_counted,
                                         TrainGradReady ready, void *ctx);
// The device gradient buffer (n_params floats, the host's layout), for the all-reduce.
float *train_gpu_grads(TrainGpu *g);
// Global L2 norm of the device grads (accumulated in double); when max_norm > 0 and it exceeds
// max_norm the grads are scaled by max_norm / (norm + 1e-6), as grad_global_norm_clip. Returns the
// norm before clipping.
double train_gpu_clip(TrainGpu *g, double max_norm);
// One AdamW step on the device (adamw_update_cpu's formula, per tensor with its decay flag).
void train_gpu_adamw_step(TrainGpu *g, const AdamWConfig *c, float lr);

#ifdef __cplusplus
}
#endif
