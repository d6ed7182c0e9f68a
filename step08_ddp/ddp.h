// ddp.h — data parallelism on CPU ranks: every rank trains the same model on its shard of the
// global batch; the gradients are averaged over the ranks (all-reduce) before the optimizer step,
// so every rank takes the same step and the weights stay identical.
// defines: ddp_shard, ddp_hash_floats, Ddp, ddp_init, ddp_grads_begin, ddp_grad_ready,
//          ddp_grads_finish, ddp_allreduce_sum_f64, ddp_check_same, ddp_barrier, ddp_bcast_bytes,
//          ddp_abort, ddp_nap, ddp_finalize
//
// Buckets and overlap. train_backward_hooked (train.h) says when a contiguous range of the
// gradient buffer is final: the head first, then the layers from the last to the first, then the
// embedding. ddp_grad_ready joins those ranges into buckets of at least `bucket_floats` and starts
// a nonblocking all-reduce (MPI_Iallreduce, in place, sum) on each bucket as soon as it is full,
// while the backward of the earlier layers goes on. ddp_grads_finish starts the last bucket, waits
// for all of them and divides by the number of ranks. The communication that is left to wait for
// at the end (`exposed_s`) is what the overlap did not hide. MPI moves a nonblocking collective
// forward only inside MPI calls, so ddp_grad_ready also tests every bucket in flight (one
// MPI_Testall per layer of backward).
//
// The watchdog. Every collective here is nonblocking and waited for by polling with a deadline
// (timeout_s): a rank whose peer died or hangs prints what it was waiting for (which collective,
// which bucket, for how long) and ends the whole job (MPI_Abort, exit code 3) instead of blocking
// forever; the launcher (step08_ddp/launch.sh) then restarts every rank from the last complete
// checkpoint.
//
// Without mpirun (or in a build without MPI: HAVE_MPI=0) there is one rank, nothing is sent and
// every call below returns at once.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Rank r's rows of a global batch of B rows, [*first, *first + *count): B / world rows each.
// 0, or -1 when world does not divide B.
int ddp_shard(int B, int world, int rank, int *first, int *count);
// xxHash64 of n floats (the bits): equal hashes on every rank <=> identical weights (up to a
// 2^-64 accident).
uint64_t ddp_hash_floats(const float *p, size_t n);

#define DDP_MAX_BUCKETS 256

typedef struct {
    int rank, world;
    int mpi;              // MPI_Init was called (launched by mpirun)
    double timeout_s;     // the watchdog's deadline for one collective
    size_t bucket_floats; // a bucket starts once it holds at least this many floats (0: one bucket, at the end)
    // the current step's gradient buffer and buckets
    float *grads;
    size_t n_grads;
    size_t pend_off, pend_n;    // ranges made ready but not yet started (contiguous: pend_off..+pend_n)
    int n_buckets;
    size_t b_off[DDP_MAX_BUCKETS], b_n[DDP_MAX_BUCKETS];
    double b_start[DDP_MAX_BUCKETS];  // when each bucket's all-reduce started (now_sec)
    void *req;                        // MPI_Request[DDP_MAX_BUCKETS] (ddp_mpi.c)
    int step;                         // for the watchdog's message
    // totals over the run
    double exposed_s;  // time blocked in ddp_grads_finish: communication the backward did not hide
    double poll_s;     // time inside ddp_grad_ready (starting buckets, testing them)
    long n_allreduce;  // buckets all-reduced
} Ddp;

// MPI_Init when started by mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment), else one
// rank. Errors on MPI_COMM_WORLD return to the caller (the watchdog reports them). Exits with a
// message when launched by mpirun but built without MPI.
void ddp_init(Ddp *d, int *argc, char ***argv, double timeout_s, size_t bucket_floats);
// A new backward: its gradients are grads (n floats).
void ddp_grads_begin(Ddp *d, float *grads, size_t n, int step);
// The TrainGradReady hook (ctx = the Ddp): [off, off + n) of the gradients is final.
void ddp_grad_ready(void *ctx, size_t off, size_t n);
// Start what is left, wait for every bucket (watchdog), divide by the number of ranks.
void ddp_grads_finish(Ddp *d);
// x[0..n) summed over the ranks, in place (watchdog); `what` names it in the watchdog's message.
void ddp_allreduce_sum_f64(Ddp *d, double *x, int n, const char *what);
// Every rank's h compared: when they differ, rank 0 prints all of them and the job ends (exit 4).
void ddp_check_same(Ddp *d, uint64_t h, const char *what);
void ddp_barrier(Ddp *d, const char *what);
// buf[0..n) of rank `root` copied to every rank (watchdog); ddp_nccl.h sends NCCL's unique id with it.
void ddp_bcast_bytes(Ddp *d, void *buf, size_t n, int root, const char *what);
// One pause of a watchdog's polling loop that has waited waited_s so far: the first 100 us yield
// (a peer a moment behind is the common case), then 50 us naps, so that a rank waiting for a
// slower one does not take the core it needs (ranks may share cores). ddp_mpi.c and ddp_nccl.cu.
void ddp_nap(double waited_s);
// The job ends: "error: rank r of w at T (unix time): <message>" on stderr, then MPI_Abort (mpirun
// ends every rank) or, with one rank, exit(code). For code outside this file that must end the
// whole job (ddp_nccl.cu's watchdog).
__attribute__((noreturn, format(printf, 3, 4))) void ddp_abort(const Ddp *d, int code, const char *fmt, ...);
// MPI_Finalize (when ddp_init called MPI_Init). Under AddressSanitizer it first runs the leak
// check, while OpenMPI's components are still loaded: call it last, after every free.
void ddp_finalize(Ddp *d);

#ifdef __cplusplus
}
#endif
