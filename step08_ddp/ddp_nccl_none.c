// ddp_nccl_none.c — ddp_nccl.h in a build without NCCL (no CUDA, or nccl.h / libnccl not found at
// build time, or NO_NCCL=1): ddp_nccl_init ends the job with a message that says so; the other
// entry points are never reached.
#include "step08_ddp/ddp_nccl.h"

#if !HAVE_NCCL
#include "check.h"

void ddp_nccl_init(DdpNccl *n, Ddp *dp) {
    (void)n;
    ddp_abort(dp, 1, "data parallelism over GPUs: NCCL is not available in this build (%s); rebuild with NCCL (nccl.h "
              "and libnccl, e.g. Debian's libnccl-dev) to train --device cuda under mpirun",
              HAVE_CUDA ? "nccl.h or libnccl was not found at build time, or NO_NCCL=1" : "it has no CUDA");
}
// unreachable: ddp_nccl_init does not return
void ddp_nccl_grads_begin(DdpNccl *n, float *grads, size_t count, int step) {
    (void)n, (void)grads, (void)count, (void)step;
    die("ddp_nccl_grads_begin: built without NCCL");
}
void ddp_nccl_grad_ready(void *ctx, size_t off, size_t count) {
    (void)ctx, (void)off, (void)count;
    die("ddp_nccl_grad_ready: built without NCCL");
}
void ddp_nccl_grads_finish(DdpNccl *n) { (void)n, die("ddp_nccl_grads_finish: built without NCCL"); }
void ddp_nccl_free(DdpNccl *n) { (void)n; }
#else
typedef int ddp_nccl_none_is_empty_with_nccl;  // ISO C forbids an empty translation unit
#endif
