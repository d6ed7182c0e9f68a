// test_step08_nccl.c — data parallelism over GPUs (step08_ddp/ddp_nccl.h, train --device cuda under
// mpirun).
//
//   step08_nccl (runs everywhere)  under mpirun without a GPU (or without NCCL / CUDA in the build)
//              --device cuda ends every rank at once with one line saying why; a batch that does not
//              split over the ranks and --flip-rank are refused
//   step08_gpu (a GPU)  the GPU backward reports the CPU's ready ranges; a communicator of one rank
//              all-reduces a known buffer in the expected buckets and gives it back bit for bit;
//              train under `mpirun -np 1` logs the losses of train without mpirun; 2 ranks on one
//              GPU fail with the clear error in bounded time; with 2 GPUs: 2 ranks follow 1 rank,
//              and the watchdog ends a job whose rank hangs
// Run: build/tests/run_tests --filter '@(step08_nccl|step08_gpu)/*'. Every command runs under
// `timeout`; the mpirun ones skip when the build has no MPI or mpirun is missing.
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_util.h"
#include "gpu.h"
#include "rng.h"
#include "step08_ddp/ddp.h"
#include "step08_ddp/ddp_nccl.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"
#include "step08_ddp/train_gpu.h"
#include "timer.h"
#include "train_util.h"

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)


// GPUs nvidia-smi lists (0 without it)
static int gpu_count(void) {
    char buf[4096];
    if (test_run_cmd("nvidia-smi -L 2>/dev/null", buf, sizeof buf) != 0) return 0;
    int n = 0;
    for (const char *p = buf; (p = strstr(p, "GPU ")); p += 4) n += p == buf || p[-1] == '\n';
    return n;
}

#define TRAIN BUILD_BIN_DIR "/train --preset tiny --device cuda --batch 16 --warmup 4 --eval 0 --log-every 1000"
// TEST_CMD_TIMEOUT (seconds, default 120): the bound on each command; tools/gpu_sanitize.sh raises
// it, since a process under compute-sanitizer runs many times slower.
#define LAUNCH(np) "OMP_NUM_THREADS=1 timeout ${TEST_CMD_TIMEOUT:-120} step08_ddp/launch.sh --np " #np " -- "
#define ONE "OMP_NUM_THREADS=1 timeout ${TEST_CMD_TIMEOUT:-120} "

static char out[1 << 17];

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = test_run_vfmt(out, sizeof out, fmt, ap);
    va_end(ap);
    return rc;
}

// a loss log (step, loss, grad norm as hex floats) into loss[0..n), norm[0..n); returns n
static int read_log(const char *path, double *loss, double *norm, int cap) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "no loss log %s", path);
    int s, n = 0;
    double l, g;
    while (n < cap && fscanf(f, "%d %la %la", &s, &l, &g) == 3) {
        cr_assert_eq(s, n + 1, "%s: step %d where %d was due", path, s, n + 1);
        loss[n] = l, norm[n] = g, n++;
    }
    fclose(f);
    return n;
}

// ---------------------------------------------------------------- everywhere

// Without a GPU (CI), or in a build without NCCL or CUDA: every rank stops before training, with
// the reason, and the job ends (no rank waits for a peer that already left).
Test(step08_nccl, under_mpirun_without_a_gpu_fails_cleanly, .timeout = 120) {
    test_need_mpi();
    GpuInfo gi;
    if (HAVE_NCCL && gpu_info(&gi) == 0) cr_skip_test("there is a CUDA device: the step08_gpu/nccl_* tests run instead");
    const double t0 = now_sec();
    const int rc = run(LAUNCH(2) TRAIN " --steps 30");
    const double dt = now_sec() - t0;
    cr_expect_neq(rc, 0, "exit 0:\n%s", out);
    const char *why = !HAVE_CUDA ? "NCCL is not available in this build (it has no CUDA)"
                      : !HAVE_NCCL ? "NCCL is not available in this build"
                                   : "training on the GPU: no CUDA device";
    cr_expect(strstr(out, why), "no '%s' in:\n%s", why, out);
    cr_expect(!strstr(out, "loss"), "it trained something:\n%s", out);
    cr_expect_lt(dt, 30, "it took %.1f s to fail", dt);
}

Test(step08_nccl, batch_must_split_over_the_gpu_ranks, .timeout = 120) {
    test_need_mpi();
    cr_expect_neq(run(LAUNCH(2) TRAIN " --steps 5 --batch 15"), 0, "%s", out);
    cr_expect(strstr(out, "--batch 15: the global batch must split evenly over the 2 ranks"), "%s", out);
}

Test(step08_nccl, flip_rank_is_refused_on_the_gpu) {
    const int rc = run(ONE TRAIN " --steps 5 --flip-rank 0 --flip-at-step 2");
    cr_expect_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "--flip-rank: flips a bit of the host's weights, and with --device cuda they live on the GPU"),
              "%s", out);
}

// ---------------------------------------------------------------- on a GPU

typedef struct {
    size_t off[64], n[64];
    int count;
} Ranges;

static void record(void *ctx, size_t off, size_t n) {
    Ranges *r = ctx;
    cr_assert_lt(r->count, 64);
    r->off[r->count] = off, r->n[r->count] = n, r->count++;
}

static ModelConfig small_config(int tied) {
    ModelConfig c = {0};
    c.arch = ARCH_LLAMA, c.max_pos = 64, c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    c.hidden = 32, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8, c.intermediate = 48;
    c.vocab = TASK_SYM0 + 10, c.tie_embeddings = tied;
    return c;
}

// The GPU backward calls the hook with the CPU backward's ranges, in its order (ddp_nccl.h joins
// them into buckets exactly as ddp.h does on the CPU).
static void gpu_ranges_case(int tied) {
    ModelConfig c = small_config(tied);
    TrainModel m;
    char err[512];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 5);
    const int B = 2, L = 4, T = task_seq_len(L);
    int ids[2 * 10], tg[2 * 10];
    Rng r;
    rng_seed(&r, 6);
    task_make_batch(TASK_COPY, &r, B, L, 10, ids, tg);
    TrainActs a;
    train_acts_new(&c, B, T, &a);
    Ranges cpu = {0}, gpu = {0};
    train_zero_grad(&m);
    cr_assert_gt(train_forward(&m, &a, ids, tg, B, T), 0);
    train_backward_hooked(&m, &a, record, &cpu);
    TrainGpu *g = train_gpu_new(&m, B, T, TRAIN_GPU_FP32, NULL, 0, err, sizeof err);
    cr_assert(g, "%s", err);
    cr_assert_gt(train_gpu_forward_backward_hooked(g, ids, tg, NULL, record, &gpu), 0);
    cr_expect_eq(gpu.count, c.n_layers + 2, "ranges: the head, %d layers, the embedding; got %d", c.n_layers, gpu.count);
    cr_assert_eq(gpu.count, cpu.count);
    for (int i = 0; i < gpu.count; i++)
        cr_expect(gpu.off[i] == cpu.off[i] && gpu.n[i] == cpu.n[i], "range %d: GPU [%zu, +%zu), CPU [%zu, +%zu)", i,
                  gpu.off[i], gpu.n[i], cpu.off[i], cpu.n[i]);
    train_gpu_free(g);
    train_acts_free(&a);
    train_model_free(&m);
}

Test(step08_gpu, nccl_backward_ready_ranges_are_the_cpus_untied) {
    NEED_GPU();
    gpu_ranges_case(0);
}
Test(step08_gpu, nccl_backward_ready_ranges_are_the_cpus_tied) {
    NEED_GPU();
    gpu_ranges_case(1);
}

#if HAVE_NCCL
// A communicator of one rank: the buckets are what joining the ranges until >= bucket_floats gives
// (counted here on the side), and the all-reduce of one GPU gives the buffer back bit for bit.
static void one_rank_case(size_t bucket_floats) {
    ModelConfig c = small_config(0);
    TrainModel m, back;
    char err[512];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    cr_assert(train_model_new(&c, &back, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 7);
    Rng r;
    rng_seed(&r, 8);
    for (size_t i = 0; i < m.n_params; i++) m.grads[i] = rng_normal(&r) * (float)(1 + i % 7);
    TrainGpu *g = train_gpu_new(&m, 2, 8, TRAIN_GPU_FP32, NULL, 0, err, sizeof err);
    cr_assert(g, "%s", err);
    train_gpu_upload(g, &m, 1);
    Ddp dp;
    ddp_init(&dp, NULL, NULL, 120.0, bucket_floats);  // not a watchdog test: a deadline a sanitizer does not hit
    cr_assert_eq(dp.world, 1, "the test process is one rank");
    DdpNccl nc;
    ddp_nccl_init(&nc, &dp);
    for (int step = 1; step <= 2; step++) {  // twice: the events and the comm stream are reused
        ddp_nccl_grads_begin(&nc, train_gpu_grads(g), m.n_params, step);
        // ranges of uneven sizes, from the end of the buffer to its start
        size_t end = m.n_params, pend = 0;
        int expect = 0;
        for (int k = 0; end > 0; k++) {
            size_t n = 97 + (size_t)k * 613 % 2500;
            if (n > end) n = end;
            ddp_nccl_grad_ready(&nc, end - n, n);
            end -= n, pend += n;
            if (bucket_floats && pend >= bucket_floats) expect++, pend = 0;
        }
        expect += pend > 0;
        ddp_nccl_grads_finish(&nc);
        cr_expect_eq(nc.n_buckets, expect, "bucket %zu floats: %d buckets, expected %d", bucket_floats, nc.n_buckets,
                     expect);
        cr_expect_eq(nc.n_allreduce, (long)expect * step);
        size_t at = m.n_params;
        for (int b = 0; b < nc.n_buckets; b++) {  // the buckets tile the buffer from its end
            cr_expect_eq(nc.b_off[b] + nc.b_n[b], at, "bucket %d", b);
            cr_expect(b == nc.n_buckets - 1 || nc.b_n[b] >= bucket_floats, "bucket %d has %zu floats", b, nc.b_n[b]);
            at = nc.b_off[b];
        }
        cr_expect_eq(at, 0);
        cr_expect(nc.exposed_s >= 0 && nc.wait_s >= 0);
        train_gpu_download(g, &back);
        cr_expect(!memcmp(back.grads, m.grads, m.n_params * sizeof(float)), "the one-rank all-reduce changed the buffer");
    }
    ddp_nccl_free(&nc);
    cr_expect(nc.comm == NULL);
    ddp_finalize(&dp);
    train_gpu_free(g);
    train_model_free(&back), train_model_free(&m);
}

Test(step08_gpu, nccl_one_rank_allreduce_returns_the_buffer) {
    NEED_GPU();
    one_rank_case(4096);
}
Test(step08_gpu, nccl_one_rank_one_bucket_at_the_end) {
    NEED_GPU();
    one_rank_case(0);
}
#endif

// The same run in one process and as one rank under mpirun (which takes the NCCL path: the hook,
// the buckets on the comm stream, the events, the watchdog's wait). The GPU trainer sums nothing
// in a run-dependent order (train_gpu.cu: no float atomics), so two plain runs agree bit for bit,
// and the one-rank NCCL run must too: its all-reduce of one GPU is the buffer itself, and dividing
// by 1 changes no bit.
Test(step08_gpu, nccl_mpirun_one_rank_logs_the_same_losses, .timeout = 900) {
    NEED_GPU();
    test_need_mpi();
    if (!HAVE_NCCL) cr_skip_test("this build has no NCCL: mpirun -np 1 runs the plain GPU path");
    char dir[64], pa[128], pb[128], pc[128];
    test_mkdtemp(dir, sizeof dir, "nccl_one");
    snprintf(pa, sizeof pa, "%s/a.log", dir), snprintf(pb, sizeof pb, "%s/b.log", dir), snprintf(pc, sizeof pc, "%s/c.log", dir);
    cr_assert_eq(run(ONE TRAIN " --steps 30 --loss-log %s", pa), 0, "%s", out);
    cr_assert_eq(run(ONE TRAIN " --steps 30 --loss-log %s", pc), 0, "%s", out);
    cr_assert_eq(run(LAUNCH(1) TRAIN " --steps 30 --collective-timeout 240 --loss-log %s", pb), 0, "%s", out);
    cr_expect(strstr(out, "# ddp: 1 rank (MPI), one GPU each") && strstr(out, "by NCCL"), "not the NCCL path:\n%s", out);
    cr_expect(strstr(out, "bucket all-reduces by NCCL"), "no all-reduce line:\n%s", out);
    double la[64], lb[64], lc[64], na[64], nb[64], nc[64];
    cr_assert_eq(read_log(pa, la, na, 64), 30);
    cr_assert_eq(read_log(pb, lb, nb, 64), 30);
    cr_assert_eq(read_log(pc, lc, nc, 64), 30);
    for (int i = 0; i < 30; i++) {
        cr_expect(la[i] == lc[i] && na[i] == nc[i], "step %d: two plain runs differ: loss %a / %a, norm %a / %a", i + 1,
                  la[i], lc[i], na[i], nc[i]);
        cr_expect(la[i] == lb[i] && na[i] == nb[i], "step %d: loss %a / norm %a, under mpirun %a / %a", i + 1, la[i],
                  na[i], lb[i], nb[i]);
    }
    test_rmtree(dir);
}

// NCCL cannot put two ranks on one GPU: with one GPU visible, 2 ranks end at once with the reason.
Test(step08_gpu, nccl_two_ranks_on_one_gpu_fail_clearly, .timeout = 120) {
    NEED_GPU();
    test_need_mpi();
    if (!HAVE_NCCL) cr_skip_test("this build has no NCCL");
    const double t0 = now_sec();
    const int rc = run("CUDA_VISIBLE_DEVICES=0 " LAUNCH(2) TRAIN " --steps 30");
    const double dt = now_sec() - t0;
    cr_expect_neq(rc, 0, "exit 0:\n%s", out);
    cr_expect(strstr(out, "2 ranks on this node but 1 GPU: NCCL runs one rank per GPU"), "no clear error:\n%s", out);
    cr_expect(!strstr(out, "# train_time"), "it trained:\n%s", out);
    cr_expect_lt(dt, 60, "it took %.1f s to fail", dt);
}

// With 2 GPUs: 2 ranks (8 rows each) follow 1 process (16 rows), as on the CPU (ddp.h): the
// gradient sums run in another order, so 1e-4 relative per step (fp32 matmuls); at step 1 (identical
// weights) only the GEMMs' shapes (8 or 16 rows) and the mean's order differ: 1e-6.
Test(step08_gpu, nccl_two_gpus_match_one, .timeout = 300) {
    NEED_GPU();
    test_need_mpi();
    if (!HAVE_NCCL) cr_skip_test("this build has no NCCL");
    if (gpu_count() < 2) cr_skip_test("fewer than 2 GPUs (nvidia-smi -L)");
    char dir[64], pa[128], pb[128];
    test_mkdtemp(dir, sizeof dir, "nccl_two");
    snprintf(pa, sizeof pa, "%s/a.log", dir), snprintf(pb, sizeof pb, "%s/b.log", dir);
    cr_assert_eq(run(ONE TRAIN " --matmul fp32 --steps 30 --loss-log %s", pa), 0, "%s", out);
    cr_assert_eq(run(LAUNCH(2) TRAIN " --matmul fp32 --steps 30 --check-every 10 --bucket-kb 16 --loss-log %s", pb), 0,
                 "%s", out);
    cr_expect(strstr(out, "# ddp: 2 ranks (MPI), one GPU each") && strstr(out, "8 sequences each"), "%s", out);
    cr_expect(strstr(out, "# replicas: the weights are identical on all 2 ranks"), "%s", out);
    double la[64], lb[64], na[64], nb[64];
    cr_assert_eq(read_log(pa, la, na, 64), 30);
    cr_assert_eq(read_log(pb, lb, nb, 64), 30);
    cr_expect_lt(fabs(la[0] - lb[0]), 1e-6 * la[0], "step 1: %.17g vs %.17g", la[0], lb[0]);
    for (int i = 0; i < 30; i++)
        cr_expect_lt(fabs(la[i] - lb[i]) / la[i], 1e-4, "step %d: 1 GPU %.9g, 2 GPUs %.9g", i + 1, la[i], lb[i]);
    cr_expect_lt(lb[29], 0.5 * lb[0], "the 2-GPU run did not learn: %g -> %g", lb[0], lb[29]);
    test_rmtree(dir);
}

// With 2 GPUs: rank 1 stops answering; rank 0's NCCL all-reduce never completes, and its watchdog
// (cudaEventQuery polls) ends the job with exit code 3 within --collective-timeout, saying which
// bucket it waited for.
Test(step08_gpu, nccl_watchdog_ends_a_hung_job, .timeout = 120) {
    NEED_GPU();
    test_need_mpi();
    if (!HAVE_NCCL) cr_skip_test("this build has no NCCL");
    if (gpu_count() < 2) cr_skip_test("fewer than 2 GPUs (nvidia-smi -L)");
    const double t0 = now_sec();
    const int rc = run(LAUNCH(2) TRAIN " --steps 50 --hang-rank 1 --hang-at-step 5 --collective-timeout 2");
    const double dt = now_sec() - t0;
    cr_expect_eq(rc, 3, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "rank 0 of 2") && strstr(out, "watchdog: step 5: the gradient all-reduce (NCCL) of bucket 0") &&
                  strstr(out, "not complete after 2.0 s"),
              "no watchdog message:\n%s", out);
    cr_expect_lt(dt, 30, "the hung job took %.1f s to end", dt);
}
