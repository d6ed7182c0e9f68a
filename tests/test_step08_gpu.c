// test_step08_gpu.c — training on the GPU (step08_ddp/train_gpu.h) against the CPU trainer
// (train.h), which test_step08_train.c checks against finite differences and the engine.
//
//   gradients  the loss and EVERY gradient tensor of one forward + backward, GPU vs CPU, on the
//              tiny preset's shape (copy-task batch) and on an odd one (T = 37, GQA 6/2, head_dim
//              10, 3 layers, tied embeddings, llama3 rope), in both matmul modes
//   optimizer  clipping and two AdamW steps on the same gradients, GPU vs CPU
//   training   20 steps of the copy task (clip, schedule, AdamW), each step's loss vs the CPU's
//   program    train --device cuda runs on a GPU; without one (or in a build without CUDA) it
//              fails with one line saying why (suite step08: runs everywhere)
// Run: build/tests/run_tests --filter 'step08_gpu/*' (skips without a CUDA device).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_util.h"
#include "gpu.h"
#include "rng.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"
#include "step08_ddp/train_gpu.h"

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

// Bounds, as max|gpu - cpu| / max|cpu| per tensor (or for the loss |gpu - cpu| / cpu).
// fp32 GEMMs: both sides round in fp32 and only the summation order differs, ~1e-6 relative
// after a few layers; 1e-4 leaves room for the deeper sums of the larger shapes.
#define TOL_F32 1e-4
// bf16 GEMMs: every GEMM input is rounded to 8 significant bits (relative error up to 2^-9 =
// 2e-3); a gradient goes through about 2 + 4 L chained GEMMs (L layers: lm_head, o_proj, the
// MLP's two, and their transposes), whose roundings add up like a random walk: a few 2e-3, i.e.
// ~1e-2 of the tensor's largest element. 3e-2 is that with a margin; a wrong kernel is off by O(1).
#define TOL_BF16 3e-2

static ModelConfig shape_config(int odd) {
    ModelConfig c = {0};
    c.arch = ARCH_LLAMA, c.max_pos = 256, c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    if (!odd) {  // train --preset tiny over the copy task's 12 ids
        c.hidden = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.intermediate = 128;
        c.vocab = TASK_SYM0 + 10;
    } else {  // nothing a multiple of a tile: GQA 6/2, head_dim 10, tied, llama3 rope
        c.hidden = 40, c.n_layers = 3, c.n_heads = 6, c.n_kv_heads = 2, c.head_dim = 10, c.intermediate = 72;
        c.vocab = 53, c.tie_embeddings = 1, c.rope_theta = 500.0, c.rope_type = ROPE_LLAMA3;
        c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4, c.rope_original_max_pos = 8;
    }
    return c;
}

// A model of that shape, random init moved off it (norms off 1) so that no term of the
// gradient hides, and a batch: the copy task (tiny) or random ids with some targets ignored (odd).
static void make_case(int odd, TrainModel *m, int *B, int *T, int **ids, int **tg) {
    ModelConfig c = shape_config(odd);
    char err[256];
    cr_assert(train_model_new(&c, m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(m, 11 + odd);
    Rng r;
    rng_seed(&r, 77 + odd);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] += 0.1f * rng_normal(&r);
    *B = odd ? 3 : 16, *T = odd ? 37 : task_seq_len(6);
    const int N = *B * *T;
    *ids = malloc((size_t)N * sizeof(int)), *tg = malloc((size_t)N * sizeof(int));
    if (!odd) {
        task_make_batch(TASK_COPY, &r, *B, 6, 10, *ids, *tg);
    } else {
        for (int i = 0; i < N; i++) {
            (*ids)[i] = (int)(rng_u32(&r) % 50u);  // ids < 50: rows 50..52 of the embedding get no gradient
            (*tg)[i] = (i % *T < 3 || i % 7 == 5) ? TRAIN_IGNORE : (int)(rng_u32(&r) % (uint32_t)c.vocab);
        }
    }
}

// max|a - b| / max|b| over n; when b is all zero, max|a| (which must then be 0 too)
static double max_rel(const float *a, const float *b, size_t n) {
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;  // a NaN counts as the worst
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return mx > 0 ? e / mx : e;
}

static void grads_case(int odd, TrainGpuMath math, double tol) {
    TrainModel m, gm;
    int B, T, *ids, *tg;
    make_case(odd, &m, &B, &T, &ids, &tg);
    char err[512];
    cr_assert(train_model_new(&m.cfg, &gm, err, sizeof err) == 0, "%s", err);
    TrainActs a;
    train_acts_new(&m.cfg, B, T, &a);
    train_zero_grad(&m);
    const double loss_cpu = train_forward(&m, &a, ids, tg, B, T);
    cr_assert(loss_cpu > 0);
    train_backward(&m, &a);
    TrainGpu *g = train_gpu_new(&m, B, T, math, NULL, 0, err, sizeof err);
    cr_assert(g, "%s", err);
    int cnt = 0;
    const double loss_gpu = train_gpu_forward_backward(g, ids, tg, &cnt);
    cr_expect_eq(cnt, a.n_counted, "counted targets: GPU %d, CPU %d", cnt, a.n_counted);
    cr_expect(fabs(loss_gpu - loss_cpu) <= tol * loss_cpu, "%s shape, %s: loss GPU %.8f vs CPU %.8f",
              odd ? "odd" : "tiny", train_gpu_math_name(math), loss_gpu, loss_cpu);
    train_gpu_download(g, &gm);
    // the parameters came back as they went up; every gradient tensor is the CPU's
    cr_expect(max_rel(gm.params, m.params, m.n_params) == 0, "params changed on the device");
    for (int i = 0; i < m.n_tensors; i++) {
        const TrainTensor *t = &m.tensors[i];
        const double e = max_rel(gm.grads + t->off, m.grads + t->off, t->numel);
        cr_expect(e <= tol, "%s shape, %s: grad of %s: max_rel %.3e > %.1e", odd ? "odd" : "tiny",
                  train_gpu_math_name(math), t->name, e, tol);
    }
    // a second call gives the same loss and gradients bit for bit: they are zeroed, not
    // accumulated, and nothing is summed in a run-dependent order (no float atomics: the
    // embedding's rows repeat), which is what makes a resumed run repeat the uninterrupted one
    const double loss2 = train_gpu_forward_backward(g, ids, tg, NULL);
    cr_expect(memcmp(&loss2, &loss_gpu, sizeof loss2) == 0, "loss %.17g then %.17g", loss_gpu, loss2);
    TrainModel gm2;
    cr_assert(train_model_new(&m.cfg, &gm2, err, sizeof err) == 0, "%s", err);
    train_gpu_download(g, &gm2);
    cr_expect(memcmp(gm2.grads, gm.grads, m.n_params * sizeof(float)) == 0,
              "a second backward differs from the first (max_rel %.3e)", max_rel(gm2.grads, gm.grads, m.n_params));
    // an id outside the vocabulary is refused, not read
    ids[1] = m.cfg.vocab;
    cr_expect(train_gpu_forward_backward(g, ids, tg, NULL) == -1);
    train_gpu_free(g);
    train_acts_free(&a);
    train_model_free(&gm2), train_model_free(&gm), train_model_free(&m);
    free(ids), free(tg);
}

Test(step08_gpu, grads_match_cpu_fp32) {
    NEED_GPU();
    grads_case(0, TRAIN_GPU_FP32, TOL_F32);
    grads_case(1, TRAIN_GPU_FP32, TOL_F32);
}

Test(step08_gpu, grads_match_cpu_bf16) {
    NEED_GPU();
    grads_case(0, TRAIN_GPU_BF16, TOL_BF16);
    grads_case(1, TRAIN_GPU_BF16, TOL_BF16);
}

Test(step08_gpu, clip_and_adamw_match_cpu) {
    NEED_GPU();
    TrainModel m, gm;
    int B, T, *ids, *tg;
    make_case(1, &m, &B, &T, &ids, &tg);
    char err[512];
    cr_assert(train_model_new(&m.cfg, &gm, err, sizeof err) == 0, "%s", err);
    Rng r;
    rng_seed(&r, 99);
    TrainGpu *g = train_gpu_new(&m, B, T, TRAIN_GPU_FP32, NULL, 0, err, sizeof err);
    cr_assert(g, "%s", err);
    AdamW o;
    adamw_new(&o, m.n_params);
    const AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int step = 1; step <= 2; step++) {
        // the same gradient on both sides (a known one: the optimizer alone is under test), norm ~2.2
        for (size_t i = 0; i < m.n_params; i++) m.grads[i] = 0.01f * rng_normal(&r);
        train_gpu_upload(g, &m, 1);
        const double n_gpu = train_gpu_clip(g, 1.0), n_cpu = grad_global_norm_clip(m.grads, m.n_params, 1.0);
        cr_expect(fabs(n_gpu - n_cpu) <= 1e-9 * n_cpu, "step %d: grad norm GPU %.12g vs CPU %.12g", step, n_gpu, n_cpu);
        cr_assert(n_cpu > 1.0, "the test must clip");
        train_gpu_adamw_step(g, &ac, 1e-2f * step);
        train_adamw_step(&m, &o, &ac, 1e-2f * step);
        train_gpu_download(g, &gm);
        cr_expect(max_rel(gm.grads, m.grads, m.n_params) <= 1e-6, "step %d: clipped grads differ", step);
        double worst = 0;
        for (size_t i = 0; i < m.n_params; i++)
            worst = fmax(worst, fabs((double)gm.params[i] - m.params[i]) / fmax(1.0, fabs(m.params[i])));
        // the same float formula on both sides: a few roundings (6e-8 relative each) apart, where the
        // update itself is lr-sized (1e-2): a wrong formula is off by ~1e-2
        cr_expect(worst <= 1e-6, "step %d: params after AdamW differ by %.3e (relative to max(1, |p|))", step, worst);
    }
    AdamW go;
    adamw_new(&go, m.n_params);
    train_gpu_download_adamw(g, &go);
    cr_expect_eq(go.t, o.t);
    cr_expect(max_rel(go.m, o.m, m.n_params) <= 1e-6 && max_rel(go.v, o.v, m.n_params) <= 1e-6, "AdamW moments differ");
    // and back up: a resumed optimizer continues from the uploaded moments
    train_gpu_upload_adamw(g, &o);
    adamw_free(&go), adamw_free(&o);
    train_gpu_free(g);
    train_model_free(&gm), train_model_free(&m);
    free(ids), free(tg);
}

// 20 steps of the copy task as train does them (batch, clip 1, warmup + cosine, AdamW): the
// losses stay on the CPU's curve (train --preset tiny --steps 20 --warmup 5 --min-lr 1e-3, the same
// model, data and schedule, falls from 2.92 to 0.87). fp32: the gradients agree to ~1e-6 and the
// trajectories drift apart slowly (2e-3); bf16: its ~1e-2 gradient noise moves the curve more, not
// its shape (10%; a broken step would stay near 2.9 or blow up).
static void twenty_steps(TrainGpuMath math, double tol) {
    ModelConfig c = shape_config(0);
    TrainModel m;
    char err[512];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 1);
    const int B = 16, L = 6, T = task_seq_len(L), steps = 20;
    TrainGpu *g = train_gpu_new(&m, B, T, math, NULL, 0, err, sizeof err);
    cr_assert(g, "%s", err);
    TrainActs a;
    train_acts_new(&c, B, T, &a);
    AdamW o;
    adamw_new(&o, m.n_params);
    const AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};
    int ids[16 * 14], tg[16 * 14];
    Rng data;
    rng_seed(&data, 3);
    double first = 0, last_cpu = 0;
    for (int s = 0; s < steps; s++) {
        task_make_batch(TASK_COPY, &data, B, L, 10, ids, tg);
        const float lr = lr_schedule(s, 5, steps, 1e-2f, 1e-3f);
        train_zero_grad(&m);
        const double lc = train_forward(&m, &a, ids, tg, B, T);
        train_backward(&m, &a);
        grad_global_norm_clip(m.grads, m.n_params, 1.0);
        train_adamw_step(&m, &o, &ac, lr);
        const double lg = train_gpu_forward_backward(g, ids, tg, NULL);
        train_gpu_clip(g, 1.0);
        train_gpu_adamw_step(g, &ac, lr);
        cr_expect(fabs(lg - lc) <= tol * lc, "%s: step %d: loss GPU %.6f vs CPU %.6f", train_gpu_math_name(math), s + 1,
                  lg, lc);
        if (s == 0) first = lc;
        last_cpu = lc;
    }
    cr_expect(last_cpu < first, "the CPU run did not learn (%.4f -> %.4f): the comparison means little", first, last_cpu);
    adamw_free(&o);
    train_acts_free(&a);
    train_gpu_free(g);
    train_model_free(&m);
}

Test(step08_gpu, twenty_steps_follow_the_cpu_fp32) {
    NEED_GPU();
    twenty_steps(TRAIN_GPU_FP32, 2e-3);
}

Test(step08_gpu, twenty_steps_follow_the_cpu_bf16) {
    NEED_GPU();
    twenty_steps(TRAIN_GPU_BF16, 0.1);
}

Test(step08_gpu, refuses_what_it_does_not_run) {
    NEED_GPU();
    char err[512];
    ModelConfig c = shape_config(0);
    cr_expect(train_gpu_check_config(&c, err, sizeof err) == 0, "%s", err);
    c.qkv_bias = 1;
    cr_expect(train_gpu_check_config(&c, err, sizeof err) == -1 && strstr(err, "biases"), "%s", err);
    c = shape_config(0), c.qk_norm = 1;
    cr_expect(train_gpu_check_config(&c, err, sizeof err) == -1 && strstr(err, "q/k RMSNorm"), "%s", err);
}

// ---------------------------------------------------------------- the program

#define TRAIN_GPU_CMD BUILD_BIN_DIR "/train --preset tiny --device cuda --eval 0 --log-every 1000"

static char out[1 << 16];

Test(step08_gpu, train_program_runs_on_the_gpu) {
    NEED_GPU();
    const int rc = test_run_cmd(TRAIN_GPU_CMD " --steps 200 --eval 50 2>&1", out, sizeof out);
    cr_assert_eq(rc, 0, "train --device cuda failed:\n%s", out);
    cr_expect(strstr(out, "tokens/s") && strstr(out, "model FLOP/s"), "no throughput lines:\n%s", out);
    cr_expect(strstr(out, "held_out"), "no held-out evaluation:\n%s", out);
}

// Runs everywhere: on a machine without a GPU (CI) or in a build without CUDA, --device cuda fails
// with exit code 1 and one line saying why, before training anything.
Test(step08, train_device_cuda_fails_cleanly_without_a_gpu) {
    GpuInfo gi;
    if (HAVE_CUDA && gpu_info(&gi) == 0) cr_skip_test("there is a CUDA device: step08_gpu/train_program_runs_on_the_gpu runs instead");
    const int rc = test_run_cmd(TRAIN_GPU_CMD " --steps 30 2>&1", out, sizeof out);
    cr_expect_eq(rc, 1, "exit code %d:\n%s", rc, out);
    cr_expect(strstr(out, "training on the GPU: "), "no reason given:\n%s", out);
    cr_expect(HAVE_CUDA ? strstr(out, "no CUDA device") != NULL : strstr(out, "has no CUDA") != NULL, "%s", out);
    cr_expect(!strstr(out, "loss"), "it trained something:\n%s", out);
}

Test(step08, train_device_flag_is_checked) {
    const int rc = test_run_cmd(BUILD_BIN_DIR "/train --preset tiny --device tpu 2>&1", out, sizeof out);
    cr_expect_eq(rc, 2, "exit code %d:\n%s", rc, out);
    cr_expect(strstr(out, "--device: 'tpu' is not a device (allowed: cpu, cuda)"), "%s", out);
}
