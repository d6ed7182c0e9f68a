// ddp_nccl.h — data parallelism over GPUs: one rank per GPU, the gradients of the GPU trainer
// (train_gpu.h) all-reduced by NCCL in buckets while the backward still runs.
// defines: DdpNccl, ddp_nccl_available, ddp_nccl_init, ddp_nccl_grads_begin, ddp_nccl_grad_ready,
//          ddp_nccl_grads_finish, ddp_nccl_free
//
// The ranks are still MPI's (ddp.h): mpirun starts them, MPI carries the loss, the weights' hashes
// and the barrier. NCCL carries the gradients, GPU to GPU (NVLink or PCIe), without staging them
// through host memory.
//
// Setup (ddp_nccl_init). Rank r uses the GPU of its local rank on its node (OpenMPI's
// OMPI_COMM_WORLD_LOCAL_RANK): NCCL cannot put two ranks of one communicator on one GPU, so more
// ranks on a node than GPUs is refused with a message, on every rank, before anything waits. Rank 0
// asks NCCL for a unique id (the address where the ranks meet), MPI broadcasts it
// (ddp_bcast_bytes), and every rank joins the communicator with a nonblocking config: the init is
// polled under the watchdog's deadline like every collective.
//
// Streams and events. The trainer computes on the legacy default stream. NCCL runs on a stream of
// its own (non-blocking: the legacy stream does not implicitly wait for it, which would serialize
// the two). When the backward has written a bucket's gradients, an event recorded on the compute
// stream marks that point, the comm stream waits for the event (on the device: the host goes on),
// and ncclAllReduce (in place, sum) is enqueued on the comm stream; so layer l's all-reduce runs
// while layer l-1's backward computes. ddp_nccl_grads_finish enqueues the last bucket and a kernel
// that divides by the number of ranks, records an event on the comm stream and makes the compute
// stream wait for it: the clipping and AdamW that follow see the mean gradient.
//
// The watchdog. The host then waits for that event by polling cudaEventQuery with the deadline
// (--collective-timeout), asking NCCL meanwhile for an asynchronous error (ncclCommGetAsyncError: a
// peer's connection lost). On timeout or error it prints what it waited for (step, the first bucket
// not done, seconds), aborts the communicator (ncclCommAbort: NCCL's kernels stop spinning) and ends
// the job with exit code 3, as the CPU watchdog does; launch.sh restarts it from the last
// checkpoint. Nothing here blocks without a deadline.
//
// One rank (mpirun -np 1, or a test) runs the same path on a communicator of one: the all-reduce
// of one GPU is the buffer itself, and the division by 1 changes no bit.
#pragma once
#include <stddef.h>

#include "step08_ddp/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Ddp *dp;          // rank, world, the bucket size and the watchdog's deadline; MPI for the id
    int device;       // the CUDA device of this rank
    void *comm;       // ncclComm_t
    void *stream;     // cudaStream_t: the comm stream
    void *ev_ready;   // cudaEvent_t recorded on the compute stream when a bucket is final
    void *ev_done[DDP_MAX_BUCKETS];  // cudaEvent_t: bucket b's all-reduce done (comm stream)
    void *ev_bwd_end, *ev_comm_end;  // timed: the compute stream reached finish / the comm stream done
    // the current step's gradient buffer (device) and buckets
    float *grads;
    size_t n_grads;
    int step;
    size_t pend_off, pend_n;  // ready ranges not yet in a bucket (contiguous)
    int n_buckets;
    size_t b_off[DDP_MAX_BUCKETS], b_n[DDP_MAX_BUCKETS];
    // totals over the run
    long n_allreduce;   // buckets all-reduced
    double exposed_s;   // device time from the end of the backward to the end of the last all-reduce
                        // (+ the 1/world scaling): the communication the backward did not hide
    double wait_s;      // host time blocked in ddp_nccl_grads_finish (the watchdog's polling)
    double enqueue_s;   // host time in ddp_nccl_grad_ready (events, enqueueing the all-reduces)
} DdpNccl;

// 1 when this build has NCCL (HAVE_NCCL=1, the Makefile's), else 0 (ddp_nccl_init then ends the
// program with a message that says so). Inline: asking links nothing.
#ifndef HAVE_NCCL
#define HAVE_NCCL 0
#endif
static inline int ddp_nccl_available(void) { return HAVE_NCCL; }
// Choose this rank's GPU (cudaSetDevice: call it before the GPU trainer allocates anything) and
// join the NCCL communicator of dp's ranks. Ends the job with a message when there are more ranks on
// this node than GPUs, no GPU, or NCCL fails (or its init passes the deadline).
void ddp_nccl_init(DdpNccl *n, Ddp *dp);
// A new backward: its gradients are the device buffer grads (count floats).
void ddp_nccl_grads_begin(DdpNccl *n, float *grads, size_t count, int step);
// The TrainGradReady hook (ctx = the DdpNccl): [off, off + count) of the device gradients is final
// once the work enqueued so far on the compute stream has run.
void ddp_nccl_grad_ready(void *ctx, size_t off, size_t count);
// Enqueue what is left and the division by the number of ranks; make the compute stream wait for
// it; wait for it on the host under the watchdog.
void ddp_nccl_grads_finish(DdpNccl *n);
// ncclCommFinalize (polled under the deadline) and ncclCommDestroy; streams and events freed.
void ddp_nccl_free(DdpNccl *n);

#ifdef __cplusplus
}
#endif
