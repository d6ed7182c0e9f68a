// test_step08_ddp.c — data parallelism on CPU ranks (step08_ddp/ddp.h, train under mpirun through
// step08_ddp/launch.sh): the backward's ready ranges, the shards, 2 ranks == 1 rank, identical
// replicas (and a diverged one caught), the watchdog ending a hung job, a killed rank recovered
// with bit-identical losses, a partial checkpoint skipped, another world size refused.
// Run: build/tests/run_tests --filter 'step08_ddp/*'. The multi-rank tests skip when the build
// has no MPI or mpirun is missing; every command runs under `timeout`.
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs_util.h"
#include "rng.h"
#include "step08_ddp/ddp.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"
#include "timer.h"
#include "train_util.h"

// ---------------------------------------------------------------- the pieces without MPI

Test(step08_ddp, shard_splits_the_global_batch) {
    int first, count;
    cr_assert_eq(ddp_shard(16, 2, 0, &first, &count), 0);
    cr_expect(first == 0 && count == 8);
    cr_assert_eq(ddp_shard(16, 2, 1, &first, &count), 0);
    cr_expect(first == 8 && count == 8);
    cr_assert_eq(ddp_shard(12, 4, 3, &first, &count), 0);
    cr_expect(first == 9 && count == 3);
    cr_expect_eq(ddp_shard(15, 2, 0, &first, &count), -1, "15 rows do not split over 2 ranks");
    cr_expect_eq(ddp_shard(16, 2, 2, &first, &count), -1, "rank 2 of 2");
}

typedef struct {
    const TrainModel *m;
    float *seen;  // (n_params) the gradient of each range as it was when the range was called ready
    size_t off[64], n[64];
    int count;
} ReadyLog;

static void record_ready(void *ctx, size_t off, size_t n) {
    ReadyLog *r = ctx;
    cr_assert_lt(r->count, 64);
    r->off[r->count] = off, r->n[r->count] = n, r->count++;
    memcpy(r->seen + off, r->m->grads + off, n * sizeof(float));
}

// The ranges the backward reports: from the end of the buffer to its start, contiguous, each
// once, together the whole buffer; and final: nothing after the call changes them.
static void ready_case(int tied, int qk_norm) {
    ModelConfig c = {0};
    c.arch = qk_norm ? ARCH_QWEN3 : ARCH_LLAMA;
    c.hidden = 16, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 4, c.intermediate = 24;
    c.vocab = 12, c.max_pos = 32, c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    c.tie_embeddings = tied, c.qk_norm = qk_norm;
    TrainModel m;
    char err[256];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 3);
    const int B = 2, L = 3, T = task_seq_len(L);
    int ids[2 * 8], tg[2 * 8];
    Rng r;
    rng_seed(&r, 4);
    task_make_batch(TASK_COPY, &r, B, L, c.vocab - TASK_SYM0, ids, tg);
    TrainActs a;
    train_acts_new(&c, B, T, &a);
    ReadyLog log = {.m = &m, .seen = calloc(m.n_params, sizeof(float))};
    train_zero_grad(&m);
    cr_assert_gt(train_forward(&m, &a, ids, tg, B, T), 0);
    train_backward_hooked(&m, &a, record_ready, &log);
    cr_expect_eq(log.count, c.n_layers + 2, "ranges: the head, %d layers, the embedding; got %d", c.n_layers, log.count);
    size_t end = m.n_params;
    for (int i = 0; i < log.count; i++) {
        cr_expect_eq(log.off[i] + log.n[i], end, "range %d [%zu, +%zu) does not end where range %d began (%zu)", i,
                     log.off[i], log.n[i], i - 1, end);
        cr_expect_gt(log.n[i], 0);
        end = log.off[i];
    }
    cr_expect_eq(end, 0, "the ranges stop at %zu, not at the buffer's start", end);
    cr_expect(!memcmp(log.seen, m.grads, m.n_params * sizeof(float)), "a range changed after it was called ready");
    // and the hooked backward is the plain one
    float *g = malloc(m.n_params * sizeof(float));
    memcpy(g, m.grads, m.n_params * sizeof(float));
    train_zero_grad(&m);
    train_backward(&m, &a);
    cr_expect(!memcmp(g, m.grads, m.n_params * sizeof(float)));
    free(g), free(log.seen);
    train_acts_free(&a);
    train_model_free(&m);
}

Test(step08_ddp, backward_ready_ranges_cover_the_buffer_untied) { ready_case(0, 0); }
Test(step08_ddp, backward_ready_ranges_cover_the_buffer_tied_qk_norm) { ready_case(1, 1); }

// ---------------------------------------------------------------- ranks under mpirun

// Every run: one OpenMP thread per rank (2 ranks on 2 cores), a hard wall-clock limit. Under
// SANITIZE=1, LeakSanitizer skips what OpenMPI's libraries keep until exit (tests/lsan_mpi.supp
// says what and why); everything else is still reported and fails the test.
#define TRAIN BUILD_BIN_DIR "/train --preset tiny --batch 16 --warmup 4 --eval 0 --log-every 1000"
#define LAUNCH                                                                                    \
    "ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0 "                                         \
    "LSAN_OPTIONS=exitcode=0:suppressions=$PWD/tests/lsan_mpi.supp:print_suppressions=0 "       \
    "OMP_NUM_THREADS=1 timeout 60 step08_ddp/launch.sh --np 2"
#define ONE_RANK "OMP_NUM_THREADS=1 timeout 60 "


static char out[1 << 17];

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = test_run_vfmt(out, sizeof out, fmt, ap);
    va_end(ap);
    cr_expect(!strstr(out, "runtime error") && !strstr(out, "Sanitizer"), "sanitizer report from %s:\n%s", fmt, out);
    return rc;
}

// a loss log (step, loss, grad norm as hex floats) into loss[1..n]; returns n
static int read_losses(const char *path, double *loss, int cap, int *first_step) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "no loss log %s", path);
    int s, n = 0;
    double l, g;
    while (n < cap && fscanf(f, "%d %la %la", &s, &l, &g) == 3) {
        if (!n) *first_step = s;
        loss[n++] = l;
    }
    fclose(f);
    return n;
}

// The loss of 2 ranks (8 rows each) equals 1 rank's (16 rows): not to the bit, because the
// gradient sums run in another order (each rank sums its 8 rows, then the all-reduce adds the two
// partial sums; one rank sums 16 rows in one GEMM), which changes the last bits of every step's
// update. Measured over 40 steps: at most 1.2e-6 relative. Allowed: 1e-4 relative per step, and
// 1e-7 at step 1, whose forward runs on identical weights: the loss's mean is taken in another
// order, and the forward's OpenBLAS GEMMs over 8 rows and over 16 need not give a row the same
// last bits (OpenBLAS picks its kernel and blocking by the row count: step04's linear_rows.h; on
// one OpenBLAS build step 1 agreed to 1e-16, on another to 1.1e-9). A wrong shard (two ranks on
// the same rows, a sum not averaged) is off by far more from step 1 or 2 on.
Test(step08_ddp, two_ranks_match_one_rank, .timeout = 60) {
    test_need_mpi();
    char dir[64], p1[128], p2[128];
    test_mkdtemp(dir, sizeof dir, "ddp_match");
    snprintf(p1, sizeof p1, "%s/one.log", dir);
    snprintf(p2, sizeof p2, "%s/two.log", dir);
    cr_assert_eq(run(ONE_RANK TRAIN " --steps 30 --loss-log %s", p1), 0, "%s", out);
    cr_assert_eq(run(LAUNCH " -- " TRAIN " --steps 30 --loss-log %s --check-every 10", p2), 0, "%s", out);
    cr_expect(strstr(out, "# ddp: 2 ranks (MPI), 8 sequences each"), "no ddp line:\n%s", out);
    cr_expect(strstr(out, "# replicas: the weights are identical on all 2 ranks"), "no replicas line:\n%s", out);
    double a[64], b[64];
    int fa, fb;
    const int na = read_losses(p1, a, 64, &fa), nb = read_losses(p2, b, 64, &fb);
    cr_assert(na == 30 && nb == 30 && fa == 1 && fb == 1, "logged %d and %d steps", na, nb);
    cr_expect_lt(fabs(a[0] - b[0]), 1e-7 * a[0], "step 1: %.17g vs %.17g", a[0], b[0]);
    double worst = 0;
    for (int i = 0; i < 30; i++) {
        const double rel = fabs(a[i] - b[i]) / a[i];
        worst = rel > worst ? rel : worst;
        cr_expect_lt(rel, 1e-4, "step %d: 1 rank %.9g, 2 ranks %.9g (relative %.2e)", i + 1, a[i], b[i], rel);
    }
    cr_expect_lt(b[29], 0.5 * b[0], "the 2-rank run did not learn: %g -> %g", b[0], b[29]);
    cr_log_info("2 ranks vs 1 rank, 30 steps: largest relative loss difference %.2e", worst);
    test_rmtree(dir);
}

Test(step08_ddp, diverged_replicas_end_the_job, .timeout = 60) {
    test_need_mpi();
    const int rc = run(LAUNCH " -- " TRAIN " --steps 30 --check-every 5 --flip-rank 1 --flip-at-step 7");
    cr_expect_eq(rc, 4, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "step 10: the ranks' weights differ") && strstr(out, "the replicas diverged"), "%s", out);
}

Test(step08_ddp, batch_must_split_over_the_ranks, .timeout = 60) {
    test_need_mpi();
    cr_expect_neq(run(LAUNCH " -- " TRAIN " --steps 5 --batch 15"), 0, "%s", out);
    cr_expect(strstr(out, "--batch 15: the global batch must split evenly over the 2 ranks"), "%s", out);
}

// A rank that stops answering (alive, never in the collective): the other's watchdog must end
// the job within --collective-timeout, saying what it waited for; nothing hangs.
Test(step08_ddp, watchdog_ends_a_hung_job, .timeout = 60) {
    test_need_mpi();
    const double t0 = now_sec();
    const int rc = run(LAUNCH " -- " TRAIN " --steps 50 --hang-rank 1 --hang-at-step 5 --collective-timeout 1");
    const double dt = now_sec() - t0;
    cr_expect_eq(rc, 3, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "rank 0 of 2") && strstr(out, "watchdog: step 5: the gradient all-reduce") &&
                  strstr(out, "not complete after 1.0 s"),
              "no watchdog message:\n%s", out);
    cr_expect_lt(dt, 15, "the hung job took %.1f s to end", dt);
}

// SIGKILL to rank 1 mid-run; the launcher restarts both ranks from the last complete checkpoint;
// the losses after the resume are the bits of an uninterrupted run; the timeline is printed.
Test(step08_ddp, killed_rank_recovers_bit_identical, .timeout = 90) {
    test_need_mpi();
    char dir[64], ref[128], got[128];
    test_mkdtemp(dir, sizeof dir, "ddp_kill");
    snprintf(ref, sizeof ref, "%s/ref.log", dir);
    snprintf(got, sizeof got, "%s/got.log", dir);
    cr_assert_eq(run(LAUNCH " -- " TRAIN " --steps 150 --loss-log %s", ref), 0, "%s", out);
    const int rc = run(LAUNCH " --max-restarts 1 --kill-rank 1 --kill-after-step 50 --log-dir %s/launch -- " TRAIN
                       " --steps 150 --ckpt-dir %s/ck --ckpt-every 20 --loss-log %s",
                       dir, dir, got);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "launch: SIGKILL sent to rank 1"), "%s", out);
    const char *rt = strstr(out, "launch: recovery time ");
    cr_assert(rt, "no recovery line:\n%s", out);
    double rec = -1;
    int lost = -1, from = -1;
    cr_expect_eq(sscanf(rt, "launch: recovery time %lf s (failure -> first completed step after the resume); steps lost %d",
                        &rec, &lost),
                 2, "%s", rt);
    const char *rf = strstr(out, "resumed from the checkpoint of step ");
    cr_assert(rf && sscanf(rf, "resumed from the checkpoint of step %d", &from) == 1, "%s", out);
    cr_expect(rec > 0 && rec < 30, "recovery time %g s", rec);
    cr_expect(from >= 40 && from % 20 == 0, "resumed from step %d (the kill came after step 50)", from);
    cr_expect_geq(lost, 0);
    double a[160], b[160];
    int fa, fb;
    const int na = read_losses(ref, a, 160, &fa), nb = read_losses(got, b, 160, &fb);
    cr_assert_eq(na, 150);
    cr_assert_eq(fb, from + 1, "the resumed run's log starts at step %d, not %d", fb, from + 1);
    cr_assert_eq(nb, 150 - from);
    for (int i = 0; i < nb; i++)
        cr_expect(!memcmp(&a[from + i], &b[i], sizeof(double)), "step %d: %a uninterrupted, %a after the recovery",
                  from + 1 + i, a[from + i], b[i]);
    test_rmtree(dir);
}

// A checkpoint without DONE (its write interrupted) is skipped, with a message, for the previous
// complete one; and a checkpoint of 2 ranks is refused by a 1-rank resume.
Test(step08_ddp, partial_checkpoint_skipped_and_world_size_checked, .timeout = 60) {
    test_need_mpi();
    char dir[64], p[256];
    test_mkdtemp(dir, sizeof dir, "ddp_partial");
    cr_assert_eq(run(LAUNCH " -- " TRAIN " --steps 20 --ckpt-dir %s/ck --ckpt-every 5 --stop-at 10 --loss-log %s/a.log",
                     dir, dir),
                 0, "%s", out);
    snprintf(p, sizeof p, "%s/ck/step-000010/DONE", dir);
    cr_assert_eq(unlink(p), 0, "%s: the run did not write it", p);
    cr_assert_eq(run(LAUNCH " -- " TRAIN " --steps 20 --ckpt-dir %s/ck --ckpt-every 5 --stop-at 12 --loss-log %s/b.log",
                     dir, dir),
                 0, "%s", out);
    cr_expect(strstr(out, "--resume: skipped step-000010") && strstr(out, "no DONE marker"), "no skip message:\n%s", out);
    cr_expect(strstr(out, "/ck/step-000005: step 5 done"), "did not resume from step 5:\n%s", out);
    // steps 6..10 again: the same bits as the first run
    double a[32], b[32];
    int fa, fb;
    const int na = read_losses(strcat(strcpy(p, dir), "/a.log"), a, 32, &fa);
    const int nb = read_losses(strcat(strcpy(p, dir), "/b.log"), b, 32, &fb);
    cr_assert(na == 10 && nb == 7 && fb == 6, "logged %d and %d steps, from %d", na, nb, fb);
    cr_expect(!memcmp(a + 5, b, 5 * sizeof(double)), "steps 6..10 differ after the resume");
    // one rank cannot continue what two trained
    const int rc = run(ONE_RANK TRAIN " --steps 20 --ckpt-dir %s/ck --ckpt-every 5 --resume", dir);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "option world_size was 2, is 1 now"), "%s", out);
    test_rmtree(dir);
}
