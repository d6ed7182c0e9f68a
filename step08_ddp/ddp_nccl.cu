// ddp_nccl.cu — ddp_nccl.h: the GPU trainer's gradients all-reduced by NCCL in buckets on a comm
// stream of their own, overlapped with the backward, every wait polled under the watchdog's
// deadline. Compiled only when the build found NCCL (HAVE_NCCL=1); ddp_nccl_none.c otherwise.
#include "step08_ddp/ddp_nccl.h"

#if HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_check.h"
#include "timer.h"

#define COMM(n) ((ncclComm_t)(n)->comm)
#define STREAM(n) ((cudaStream_t)(n)->stream)
#define EV(p) ((cudaEvent_t)(p))

// The job ends: the communicator aborted first (its kernels stop waiting for the dead peer), then
// ddp_abort (the message, MPI_Abort: mpirun ends every rank).
__attribute__((noreturn)) static void fail(DdpNccl *n, int code, const char *msg) {
    if (n->comm) ncclCommAbort(COMM(n));
    n->comm = NULL;
    ddp_abort(n->dp, code, "%s", msg);
}

static const char *nccl_last(const DdpNccl *n) {
    const char *s = n->comm ? ncclGetLastError(COMM(n)) : NULL;
    return s && *s ? s : "no detail from NCCL";
}

// A nonblocking communicator's call may answer ncclInProgress: poll its state until it is
// ncclSuccess (then the next NCCL call may come), an error, or the deadline.
static void nccl_settle(DdpNccl *n, ncclResult_t r, const char *what) {
    const double t0 = now_sec();
    while (r == ncclInProgress) {
        const double waited = now_sec() - t0;
        if (waited > n->dp->timeout_s) {
            char msg[512];
            snprintf(msg, sizeof msg, "watchdog: step %d: %s not complete after %.1f s (--collective-timeout): a peer "
                     "rank is dead or stuck; ending the job", n->step, what, n->dp->timeout_s);
            fail(n, 3, msg);
        }
        ddp_nap(waited);
        if (ncclCommGetAsyncError(COMM(n), &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) {
        char msg[768];
        snprintf(msg, sizeof msg, "step %d: %s failed: %s (%s)", n->step, what, ncclGetErrorString(r), nccl_last(n));
        fail(n, 3, msg);
    }
}

// Which local rank and how many ranks on this node: OpenMPI's variables, MPICH's as a fallback;
// without either, every rank on its own node.
static int env_int(const char *a, const char *b, int dflt) {
    const char *s = getenv(a);
    if (!s) s = getenv(b);
    return s ? atoi(s) : dflt;
}

void ddp_nccl_init(DdpNccl *n, Ddp *dp) {
    memset(n, 0, sizeof *n);
    n->dp = dp;
    const int local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", 0);
    const int local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", 1);
    int ndev = 0;
    const cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1)
        ddp_abort(dp, 1, "training on the GPU: no CUDA device (%s)",
                  e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    // every rank of the node sees the same counts and stops here, before anyone waits for a peer
    if (local_size > ndev || local >= ndev)
        ddp_abort(dp, 1, "data parallelism over GPUs: %d ranks on this node but %d GPU%s: NCCL runs one rank per GPU "
                  "(two ranks cannot share one); start at most %d rank%s per node", local_size > local ? local_size : local + 1,
                  ndev, ndev == 1 ? "" : "s", ndev, ndev == 1 ? "" : "s");
    n->device = local;
    CUDA_CHECK(cudaSetDevice(local));
    // rank 0's unique id: where the others find it (MPI carries the bytes)
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (dp->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    ddp_bcast_bytes(dp, &id, sizeof id, 0, "the broadcast of NCCL's unique id");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // every call returns at once; nccl_settle polls it under the deadline
    ncclComm_t comm = NULL;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, dp->world, id, dp->rank, &cfg);
    n->comm = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
        char msg[768];
        snprintf(msg, sizeof msg, "ncclCommInitRankConfig (rank %d of %d, GPU %d) failed: %s (%s)", dp->rank, dp->world,
                 local, ncclGetErrorString(r), nccl_last(n));
        fail(n, 3, msg);
    }
    nccl_settle(n, r, "NCCL's communicator init");
    // the comm stream: non-blocking (the legacy default stream, where the trainer computes, does
    // not wait for it implicitly) and of the highest priority (an all-reduce's kernel is scheduled
    // ahead of the backward's queued kernels, so it starts when its bucket is ready)
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    n->stream = s;
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    n->ev_ready = ev;
    CUDA_CHECK(cudaEventCreate(&ev));
    n->ev_bwd_end = ev;
    CUDA_CHECK(cudaEventCreate(&ev));
    n->ev_comm_end = ev;
}

void ddp_nccl_grads_begin(DdpNccl *n, float *grads, size_t count, int step) {
    n->grads = grads, n->n_grads = count, n->step = step;
    n->pend_n = 0, n->n_buckets = 0;
}

// The pending ranges become bucket b: the comm stream waits (on the device) for the compute stream
// to get here, then all-reduces them in place.
static void start_pending(DdpNccl *n) {
    if (!n->pend_n) return;
    if (n->n_buckets == DDP_MAX_BUCKETS) die("ddp_nccl: more than %d buckets (raise --bucket-kb)", DDP_MAX_BUCKETS);
    const int b = n->n_buckets++;
    n->b_off[b] = n->pend_off, n->b_n[b] = n->pend_n;
    n->pend_n = 0;
    if (!n->ev_done[b]) {
        cudaEvent_t ev;
        CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        n->ev_done[b] = ev;
    }
    CUDA_CHECK(cudaEventRecord(EV(n->ev_ready), 0));
    CUDA_CHECK(cudaStreamWaitEvent(STREAM(n), EV(n->ev_ready), 0));
    float *p = n->grads + n->b_off[b];
    char what[96];
    snprintf(what, sizeof what, "enqueueing ncclAllReduce of bucket %d", b);
    nccl_settle(n, ncclAllReduce(p, p, n->b_n[b], ncclFloat, ncclSum, COMM(n), STREAM(n)), what);
    CUDA_CHECK(cudaEventRecord(EV(n->ev_done[b]), STREAM(n)));
}

void ddp_nccl_grad_ready(void *ctx, size_t off, size_t count) {
    DdpNccl *n = (DdpNccl *)ctx;
    const double t0 = now_sec();
    // ranges arrive from the end of the buffer to its start: each one ends where the pending one begins
    if (n->pend_n && off + count != n->pend_off)
        die("ddp_nccl_grad_ready: range %zu+%zu is not next to %zu", off, count, n->pend_off);
    n->pend_off = off, n->pend_n += count;
    if (n->dp->bucket_floats && n->pend_n >= n->dp->bucket_floats) start_pending(n);
    n->enqueue_s += now_sec() - t0;
}

__global__ void ddp_scale_k(float *x, size_t count, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

void ddp_nccl_grads_finish(DdpNccl *n) {
    const double t0 = now_sec();
    CUDA_CHECK(cudaEventRecord(EV(n->ev_bwd_end), 0));
    start_pending(n);
    // the mean: after every bucket (they run in order on the comm stream) and after the backward
    CUDA_CHECK(cudaStreamWaitEvent(STREAM(n), EV(n->ev_bwd_end), 0));
    if (n->dp->world > 1 && n->n_grads) {
        size_t blocks = (n->n_grads + 255) / 256;
        if (blocks > 4096) blocks = 4096;
        ddp_scale_k<<<(unsigned)blocks, 256, 0, STREAM(n)>>>(n->grads, n->n_grads, 1.0f / (float)n->dp->world);
        CUDA_CHECK_LAST();
    }
    CUDA_CHECK(cudaEventRecord(EV(n->ev_comm_end), STREAM(n)));
    CUDA_CHECK(cudaStreamWaitEvent(0, EV(n->ev_comm_end), 0));  // clipping and AdamW see the mean
    // the watchdog: the host polls the event under the deadline, and NCCL for an error meanwhile
    for (;;) {
        const cudaError_t q = cudaEventQuery(EV(n->ev_comm_end));
        if (q == cudaSuccess) break;
        char msg[768];
        if (q != cudaErrorNotReady) {
            snprintf(msg, sizeof msg, "step %d: waiting for the gradient all-reduce (%d buckets): CUDA error %s", n->step,
                     n->n_buckets, cudaGetErrorString(q));
            fail(n, 3, msg);
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(COMM(n), &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
            snprintf(msg, sizeof msg, "step %d: the gradient all-reduce (NCCL, %d buckets) failed: %s (%s)", n->step,
                     n->n_buckets, ncclGetErrorString(st), nccl_last(n));
            fail(n, 3, msg);
        }
        const double waited = now_sec() - t0;
        if (waited > n->dp->timeout_s) {
            int b = 0;  // the first bucket not done (they complete in order)
            while (b < n->n_buckets && cudaEventQuery(EV(n->ev_done[b])) == cudaSuccess) b++;
            if (b < n->n_buckets)
                snprintf(msg, sizeof msg, "watchdog: step %d: the gradient all-reduce (NCCL) of bucket %d of %d (%zu floats "
                         "at offset %zu) not complete after %.1f s (--collective-timeout): a peer rank is dead or stuck; "
                         "ending the job", n->step, b, n->n_buckets, n->b_n[b], n->b_off[b], n->dp->timeout_s);
            else
                snprintf(msg, sizeof msg, "watchdog: step %d: the gradient all-reduce (NCCL, %d buckets) and its scaling "
                         "not complete after %.1f s (--collective-timeout); ending the job", n->step, n->n_buckets,
                         n->dp->timeout_s);
            fail(n, 3, msg);
        }
        ddp_nap(waited);
    }
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, EV(n->ev_bwd_end), EV(n->ev_comm_end)));
    n->exposed_s += ms > 0 ? 1e-3 * ms : 0;
    n->n_allreduce += n->n_buckets;
    n->wait_s += now_sec() - t0;
}

void ddp_nccl_free(DdpNccl *n) {
    if (n->comm) {
        n->step = -1;
        nccl_settle(n, ncclCommFinalize(COMM(n)), "ncclCommFinalize");
        const ncclResult_t r = ncclCommDestroy(COMM(n));  // local: frees what finalize left
        if (r != ncclSuccess && r != ncclInProgress) fprintf(stderr, "ncclCommDestroy: %s\n", ncclGetErrorString(r));
        n->comm = NULL;
    }
    for (int b = 0; b < DDP_MAX_BUCKETS; b++)
        if (n->ev_done[b]) CUDA_CHECK(cudaEventDestroy(EV(n->ev_done[b])));
    void *evs[] = {n->ev_ready, n->ev_bwd_end, n->ev_comm_end};
    for (int i = 0; i < 3; i++)
        if (evs[i]) CUDA_CHECK(cudaEventDestroy(EV(evs[i])));
    if (n->stream) CUDA_CHECK(cudaStreamDestroy(STREAM(n)));
    memset(n, 0, sizeof *n);
}
#else
typedef int ddp_nccl_cu_is_empty_without_nccl;  // ddp_nccl_none.c has the stubs
#endif
