// ddp_mpi.c — ddp.h's communication: bucketed nonblocking all-reduce of the gradients, and every
// collective waited for under the watchdog's deadline. With HAVE_MPI=0 (MPI not found at build
// time) the one-rank versions at the end: nothing to send.
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "step08_ddp/ddp.h"
#include "timer.h"

// Launched by mpirun (OpenMPI sets OMPI_COMM_WORLD_SIZE; MPICH's hydra and PMIx launchers set
// PMI_SIZE / PMIX_RANK)?
static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

#if HAVE_MPI
#include <mpi.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

static double wall_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define REQ(d) ((MPI_Request *)(d)->req)

// The job ends here: the message first (with a wall-clock time the launcher's timeline can use),
// then MPI_Abort, which makes mpirun kill every rank, the stuck one too.
void ddp_abort(const Ddp *d, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: rank %d of %d at %.6f (unix time): %s\n", d->rank, d->world, wall_clock(), msg);
    fflush(stderr);
    if (d->mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static const char *mpi_error(int rc, char *buf) {
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return buf;
}

// Poll n requests until all complete, or the deadline passes: then say which are still open and end the job.
static void wait_watchdog(Ddp *d, int n, MPI_Request *r, const char *what) {
    const double t0 = now_sec();
    for (;;) {
        int done = 0;
        const int rc = MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char e[MPI_MAX_ERROR_STRING];
            ddp_abort(d, 3, "step %d: %s failed: %s", d->step, what, mpi_error(rc, e));
        }
        if (done) return;
        if (now_sec() - t0 > d->timeout_s) {
            char left[512] = "";
            size_t k = 0;
            for (int i = 0; i < n && k + 64 < sizeof left; i++)
                if (r[i] != MPI_REQUEST_NULL)
                    k += (size_t)snprintf(left + k, sizeof left - k, "%s%d", k ? "," : "", i);
            ddp_abort(d, 3,
                      "watchdog: step %d: %s not complete after %.1f s (--collective-timeout; request%s %s of %d still "
                      "open): a peer rank is dead or stuck; ending the job",
                      d->step, what, d->timeout_s, strchr(left, ',') ? "s" : "", left, n);
        }
        ddp_nap(now_sec() - t0);
    }
}

void ddp_init(Ddp *d, int *argc, char ***argv, double timeout_s, size_t bucket_floats) {
    memset(d, 0, sizeof *d);
    d->world = 1, d->timeout_s = timeout_s, d->bucket_floats = bucket_floats;
    d->req = xcalloc(DDP_MAX_BUCKETS, sizeof(MPI_Request));
    if (!launched_by_mpirun()) return;
    int provided = 0;
    // FUNNELED: OpenMP threads and the checkpoint writer thread never call MPI
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) die("MPI_Init_thread failed");
    d->mpi = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->world);
}

static void start_pending(Ddp *d) {
    if (!d->pend_n) return;
    if (d->n_buckets == DDP_MAX_BUCKETS) die("ddp: more than %d buckets (raise --bucket-kb)", DDP_MAX_BUCKETS);
    const int b = d->n_buckets++;
    d->b_off[b] = d->pend_off, d->b_n[b] = d->pend_n;
    d->b_start[b] = now_sec();
    d->pend_n = 0;
    if (d->world == 1) {
        REQ(d)[b] = MPI_REQUEST_NULL;
        return;
    }
    // MPI counts are int: a bucket is at most 2^31 - 1 floats (8 GB), far above any --bucket-kb
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, d->grads + d->b_off[b], (int)d->b_n[b], MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD, &REQ(d)[b]);
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        ddp_abort(d, 3, "step %d: MPI_Iallreduce of bucket %d failed: %s", d->step, b, mpi_error(rc, e));
    }
}

void ddp_grads_begin(Ddp *d, float *grads, size_t n, int step) {
    d->grads = grads, d->n_grads = n, d->step = step;
    d->pend_n = 0, d->n_buckets = 0;
}

void ddp_grad_ready(void *ctx, size_t off, size_t n) {
    Ddp *d = ctx;
    if (d->world == 1) return;
    const double t0 = now_sec();
    // ranges arrive from the end of the buffer to its start: each one ends where the pending one begins
    if (d->pend_n && off + n != d->pend_off) die("ddp_grad_ready: range %zu+%zu is not next to %zu", off, n, d->pend_off);
    d->pend_off = off, d->pend_n += n;
    if (d->bucket_floats && d->pend_n >= d->bucket_floats) start_pending(d);
    if (d->n_buckets) {  // let MPI move the buckets in flight forward
        int done = 0;
        const int rc = MPI_Testall(d->n_buckets, REQ(d), &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char e[MPI_MAX_ERROR_STRING];
            ddp_abort(d, 3, "step %d: gradient all-reduce failed: %s", d->step, mpi_error(rc, e));
        }
    }
    d->poll_s += now_sec() - t0;
}

void ddp_grads_finish(Ddp *d) {
    if (d->world == 1) return;
    const double t0 = now_sec();
    start_pending(d);
    char what[96];
    snprintf(what, sizeof what, "the gradient all-reduce (%d buckets)", d->n_buckets);
    wait_watchdog(d, d->n_buckets, REQ(d), what);
    const float s = 1.0f / (float)d->world;
    for (size_t i = 0; i < d->n_grads; i++) d->grads[i] *= s;
    d->n_allreduce += d->n_buckets;
    d->exposed_s += now_sec() - t0;
}

void ddp_allreduce_sum_f64(Ddp *d, double *x, int n, const char *what) {
    if (d->world == 1) return;
    MPI_Request r;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        ddp_abort(d, 3, "step %d: MPI_Iallreduce (%s) failed: %s", d->step, what, mpi_error(rc, e));
    }
    wait_watchdog(d, 1, &r, what);
}

void ddp_check_same(Ddp *d, uint64_t h, const char *what) {
    if (d->world == 1) return;
    uint64_t *all = xcalloc((size_t)d->world, sizeof *all);
    MPI_Request r;
    const int rc = MPI_Iallgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        ddp_abort(d, 3, "step %d: MPI_Iallgather (%s) failed: %s", d->step, what, mpi_error(rc, e));
    }
    char w[128];
    snprintf(w, sizeof w, "the hash comparison of %s", what);
    wait_watchdog(d, 1, &r, w);
    int same = 1;
    for (int i = 1; i < d->world; i++) same &= all[i] == all[0];
    if (!same) {
        char list[1024] = "";
        size_t k = 0;
        for (int i = 0; i < d->world && k + 40 < sizeof list; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%srank %d %016llx", i ? ", " : "", i, (unsigned long long)all[i]);
        free(all);
        ddp_abort(d, 4, "step %d: the ranks' %s differ (xxHash64: %s): the replicas diverged", d->step, what, list);
    }
    free(all);
}

void ddp_barrier(Ddp *d, const char *what) {
    if (d->world == 1) return;
    MPI_Request r;
    const int rc = MPI_Ibarrier(MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        ddp_abort(d, 3, "step %d: MPI_Ibarrier (%s) failed: %s", d->step, what, mpi_error(rc, e));
    }
    wait_watchdog(d, 1, &r, what);
}

void ddp_bcast_bytes(Ddp *d, void *buf, size_t n, int root, const char *what) {
    if (d->world == 1) return;
    if (n > (size_t)0x7fffffff) die("ddp_bcast_bytes: %zu bytes is more than one MPI count holds", n);
    MPI_Request r;
    const int rc = MPI_Ibcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        ddp_abort(d, 3, "step %d: MPI_Ibcast (%s) failed: %s", d->step, what, mpi_error(rc, e));
    }
    wait_watchdog(d, 1, &r, what);
}

void ddp_finalize(Ddp *d) {
#ifdef __SANITIZE_ADDRESS__
    // MPI_Finalize unloads OpenMPI's components, and what they kept then shows as leaks from an
    // unknown module that no suppression can name: check for leaks now, while they are loaded
    // (their allocations are still reachable, or named by tests/lsan_mpi.supp); LeakSanitizer
    // checks once, so the exit check is skipped.
    if (d->mpi) __lsan_do_leak_check();
#endif
    if (d->mpi) MPI_Finalize();
    free(d->req);
    d->req = NULL, d->mpi = 0;
}

#else  // one rank: no MPI in this build

void ddp_init(Ddp *d, int *argc, char ***argv, double timeout_s, size_t bucket_floats) {
    (void)argc, (void)argv;
    memset(d, 0, sizeof *d);
    d->world = 1, d->timeout_s = timeout_s, d->bucket_floats = bucket_floats;
    const char *n = getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : getenv("PMI_SIZE");
    if (launched_by_mpirun() && (!n || atoi(n) != 1))
        die("started by mpirun, but this build has no MPI (HAVE_MPI=0): install libopenmpi-dev openmpi-bin and "
            "rebuild (make step08)");
}
void ddp_grads_begin(Ddp *d, float *grads, size_t n, int step) { d->grads = grads, d->n_grads = n, d->step = step; }
void ddp_grad_ready(void *ctx, size_t off, size_t n) { (void)ctx, (void)off, (void)n; }
void ddp_grads_finish(Ddp *d) { (void)d; }
void ddp_allreduce_sum_f64(Ddp *d, double *x, int n, const char *what) { (void)d, (void)x, (void)n, (void)what; }
void ddp_check_same(Ddp *d, uint64_t h, const char *what) { (void)d, (void)h, (void)what; }
void ddp_barrier(Ddp *d, const char *what) { (void)d, (void)what; }
void ddp_bcast_bytes(Ddp *d, void *buf, size_t n, int root, const char *what) { (void)d, (void)buf, (void)n, (void)root, (void)what; }
void ddp_abort(const Ddp *d, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: rank %d of %d: %s\n", d->rank, d->world, msg);
    exit(code);
}
void ddp_finalize(Ddp *d) { (void)d; }
#endif
