// test_step08_train.c — the CPU training core of step08 (step08_ddp/train.h, task.h).
//
//   forward   the training forward's logits against step02's forward_cpu (the engine checked
//             against transformers) on the tiny f32 checkpoints of tests/data/models, its loss
//             against a cross-entropy computed here in double, its tensor list against the HF names
//             in the checkpoint files;
//   backward  every parameter tensor (and the embedding rows used) against central finite
//             differences of the loss, on odd random configs that cover GQA/MQA, biases, q/k norm,
//             tied embeddings and llama3 rope;
//   optimizer AdamW, global-norm clipping and the schedule against straightforward double
//             versions written here;
//   learning  a tiny model trained on the copy task, then asked to do it through forward_cpu;
//   program   build/bin/train refuses bad options with one line naming them, and runs.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_util.h"
#include "golden_util.h"
#include "train_util.h"
#include "model.h"
#include "rng.h"
#include "step02_attention/forward.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"

// ---------------------------------------------------------------- forward vs the engine

static void random_ids(Rng *r, int *ids, int n, int V) {
    for (int i = 0; i < n; i++) ids[i] = (int)(rng_u32(r) % (uint32_t)V);
}

Test(step08, forward_matches_step02_on_checkpoints) {
    // the f32 checkpoints, and two bf16 ones (both sides upcast the same bf16 values)
    const char *names[] = {"llama_mha_f32", "llama_gqa_hd_f32", "llama3_tied_rope_f32", "qwen2_bias_f32",
                           "qwen3_qknorm_f32", "llama_mha_bf16", "qwen3_qknorm_bf16"};
    for (size_t c = 0; c < sizeof names / sizeof names[0]; c++) {
        char dir[512], err[512];
        snprintf(dir, sizeof dir, "%s/%s", MODELS_DIR, names[c]);
        ModelWeights w;
        cr_assert(model_load(dir, &w, err, sizeof err) == 0, "%s: %s", dir, err);
        TrainModel tm;
        cr_assert(train_model_from_weights(&w, &tm, err, sizeof err) == 0, "%s: %s", dir, err);
        // every tensor of the layout is in the file under that name with that many elements, and
        // every tensor of the file is in the layout
        for (int i = 0; i < tm.n_tensors; i++) {
            const StTensor *t = st_get(&w.st, tm.tensors[i].name);
            cr_expect(t && (size_t)t->numel == tm.tensors[i].numel, "%s: %s missing or of another size", names[c],
                      tm.tensors[i].name);
        }
        cr_expect_eq(tm.n_tensors, w.st.n_tensors, "%s: %d tensors in the layout, %d in the file", names[c],
                     tm.n_tensors, w.st.n_tensors);
        CpuModel cm;
        cr_assert(cpu_model_load(&w, &cm, err, sizeof err) == 0, "%s", err);
        const int B = 3, T = 11, V = w.cfg.vocab;
        int ids[33], tg[33];
        Rng r;
        rng_seed(&r, 100 + c);
        random_ids(&r, ids, B * T, V);
        for (int i = 0; i < B * T; i++) tg[i] = (i % T == T - 1 || i % 4 == 1) ? TRAIN_IGNORE : ids[i + 1];
        TrainActs a;
        train_acts_new(&tm.cfg, B, T, &a);
        const double loss = train_forward(&tm, &a, ids, tg, B, T);
        float *ref = malloc((size_t)T * V * sizeof(float));
        double worst = 0, maxabs = 0, ce = 0;
        int cnt = 0;
        for (int b = 0; b < B; b++) {
            cr_assert(forward_cpu(&cm, ids + b * T, T, ref, NULL) == 0);
            for (int t = 0; t < T; t++) {
                const float *z = ref + (size_t)t * V, *y = a.logits + ((size_t)b * T + t) * V;
                for (int j = 0; j < V; j++) {
                    const double e = fabs((double)y[j] - z[j]);
                    if (!(e <= worst)) worst = e;
                    if (fabs(z[j]) > maxabs) maxabs = fabs(z[j]);
                }
                const int target = tg[b * T + t];
                if (target == TRAIN_IGNORE) continue;
                double mx = -INFINITY, se = 0;
                for (int j = 0; j < V; j++) mx = fmax(mx, z[j]);
                for (int j = 0; j < V; j++) se += exp(z[j] - mx);
                ce += mx + log(se) - z[target], cnt++;
            }
        }
        ce /= cnt;
        cr_expect(worst <= 1e-5 * maxabs, "%s: max|train - forward_cpu| = %.3e (max|logit| %.2f)", names[c], worst,
                  maxabs);
        cr_expect(fabs(loss - ce) <= 1e-5 * ce, "%s: loss %.8f, cross-entropy of forward_cpu's logits %.8f", names[c],
                  loss, ce);
        cr_expect_eq(a.n_counted, cnt);
        cr_log_info("%s: max|train - forward_cpu| %.2e (max|logit| %.2f), |loss - ce| %.2e", names[c], worst, maxabs,
                    fabs(loss - ce));
        free(ref);
        train_acts_free(&a);
        cpu_model_free(&cm);
        train_model_free(&tm);
        model_free(&w);
    }
}

Test(step08, refuses_unsupported_configs) {
    ModelConfig c = {0};
    c.hidden = 8, c.intermediate = 8, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 2, c.head_dim = 4, c.vocab = 5;
    c.rms_eps = 1e-6f, c.rope_theta = 1e4;
    TrainModel m;
    char err[256] = "";
    c.mlp_bias = 1;
    cr_expect(train_model_new(&c, &m, err, sizeof err) == -1 && strstr(err, "mlp_bias"), "mlp_bias: '%s'", err);
    c.mlp_bias = 0, c.head_dim = 3;
    cr_expect(train_model_new(&c, &m, err, sizeof err) == -1 && strstr(err, "odd"), "odd head_dim: '%s'", err);
    c.head_dim = 4, c.n_kv_heads = 3;
    cr_expect(train_model_new(&c, &m, err, sizeof err) == -1 && strstr(err, "multiple"), "heads: '%s'", err);
    c.n_kv_heads = 1;
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_free(&m);
}

// The random init is the one train.h documents: norms 1, biases 0, matrices N(0, 1/fan_in) with
// o_proj / down_proj further / sqrt(2 n_layers), untied embedding N(0, 1), lm_head N(0, 1/d).
Test(step08, random_init_follows_the_documented_scheme) {
    ModelConfig c = {0};
    c.hidden = 96, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 24, c.intermediate = 160;
    c.vocab = 200, c.rms_eps = 1e-6f, c.rope_theta = 1e4, c.qkv_bias = 1, c.qk_norm = 1;
    TrainModel m;
    char err[256];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 11);
    for (int i = 0; i < m.n_tensors; i++) {
        const TrainTensor *t = &m.tensors[i];
        const float *p = m.params + t->off;
        double s1 = 0, s2 = 0;
        for (size_t j = 0; j < t->numel; j++) s1 += p[j], s2 += (double)p[j] * p[j];
        const double mean = s1 / t->numel, sd = sqrt(s2 / t->numel - mean * mean);
        double want_mean = 0, want_sd;
        if (strstr(t->name, "norm")) want_mean = 1, want_sd = 0;
        else if (strstr(t->name, "bias")) want_sd = 0;
        else if (!strcmp(t->name, "model.embed_tokens.weight")) want_sd = 1;
        else if (!strcmp(t->name, "lm_head.weight")) want_sd = 1 / sqrt(96.0);
        else want_sd = 1 / sqrt((double)t->cols) / (strstr(t->name, "o_proj") || strstr(t->name, "down_proj") ? sqrt(6.0) : 1);
        cr_expect(fabs(mean - want_mean) <= 0.05 * (want_sd + 1e-3) + 1e-7 && fabs(sd - want_sd) <= 0.05 * want_sd + 1e-7,
                  "%s: mean %.4f sd %.4f, expected %.4f and %.4f", t->name, mean, sd, want_mean, want_sd);
        cr_expect(t->decay == (t->rows > 1), "%s: decay flag %d", t->name, t->decay);
    }
    train_model_free(&m);
}

// ---------------------------------------------------------------- backward vs finite differences

static ModelConfig fd_config(int variant) {
    ModelConfig c = {0};
    c.arch = ARCH_LLAMA;
    c.hidden = 24, c.n_layers = 2, c.n_heads = 6, c.head_dim = 4, c.intermediate = 40, c.vocab = 37;
    c.max_pos = 64, c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    if (variant == 0) {  // GQA 6/2, untied, q/k/v and o biases, q/k norm (Qwen2 + Qwen3 features)
        c.n_kv_heads = 2, c.qkv_bias = 1, c.o_bias = 1, c.qk_norm = 1;
    } else {  // MQA 6/1, tied embeddings, llama3 rope scaling with short original context
        c.n_kv_heads = 1, c.tie_embeddings = 1, c.rope_theta = 500.0, c.rope_type = ROPE_LLAMA3;
        c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4, c.rope_original_max_pos = 4;
    }
    return c;
}

// The loss is computed in fp32 (~1e-7 relative noise on a loss of ~3.6), so the step cannot be
// small: h = 1e-2 on parameters of size ~0.1 .. 1. The central difference D(h) is then off by
// O(h^2) where the loss curves (attention, softmax); Richardson's (4 D(h/2) - D(h)) / 3 cancels
// that term, leaving O(h^4) and the noise, ~4e-7 / h ~ 5e-5 at worst.
#define FD_H 1e-2f
#define FD_RTOL 1e-2   // |fd - analytic| <= FD_RTOL * max(|fd|, |analytic|) + FD_ATOL
#define FD_ATOL 5e-5

Test(step08, backward_matches_finite_differences) {
    omp_set_num_threads(1);  // ~1600 tiny forwards: see copy_task_is_learned on threads
    for (int variant = 0; variant < 2; variant++) {
        ModelConfig c = fd_config(variant);
        TrainModel m;
        char err[256];
        cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
        train_model_init_random(&m, 7 + variant);
        Rng r;
        rng_seed(&r, 1234 + variant);
        // move every parameter off its init (norms off 1, biases off 0) so no term hides
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.2f * rng_normal(&r);
        const int B = 2, T = 7, N = B * T;
        int ids[14], tg[14];
        random_ids(&r, ids, N, 30);  // ids < 30: rows 30..36 of an untied embedding get no gradient
        for (int i = 0; i < N; i++) tg[i] = (i % T < 2) ? TRAIN_IGNORE : (int)(rng_u32(&r) % 37);
        TrainActs a;
        train_acts_new(&c, B, T, &a);
        train_zero_grad(&m);
        train_forward(&m, &a, ids, tg, B, T);
        train_backward(&m, &a);
        int checked = 0, bad = 0;
        double worst = 0, worst_big = 0;
        for (int ti = 0; ti < m.n_tensors; ti++) {
            const TrainTensor *t = &m.tensors[ti];
            const int is_embed = !strcmp(t->name, "model.embed_tokens.weight");
            double tmax = 0;  // the tensor's largest analytic gradient, for the message
            for (size_t j = 0; j < t->numel; j++) tmax = fmax(tmax, fabs(m.grads[t->off + j]));
            const int samples = t->numel < 8 ? (int)t->numel : 8;
            for (int s = 0; s < samples; s++) {
                size_t j = t->numel < 8 ? (size_t)s : rng_u32(&r) % t->numel;
                if (is_embed) {  // a row that was read (and, tied, also any other row as lm_head)
                    const int row = (s % 2 == 0 || !c.tie_embeddings) ? ids[rng_u32(&r) % N] : (int)(rng_u32(&r) % 37);
                    j = (size_t)row * c.hidden + rng_u32(&r) % c.hidden;
                }
                float *p = m.params + t->off + j;
                const float p0 = *p;
                double D[2];
                for (int k = 0; k < 2; k++) {
                    const float h = k ? FD_H / 2 : FD_H;
                    *p = p0 + h;
                    const double lp = train_forward(&m, &a, ids, tg, B, T);
                    *p = p0 - h;
                    const double lm = train_forward(&m, &a, ids, tg, B, T);
                    D[k] = (lp - lm) / ((double)(p0 + h) - (double)(p0 - h));  // the step as stored in fp32
                }
                *p = p0;
                const double fd = (4 * D[1] - D[0]) / 3, an = m.grads[t->off + j];
                const double e = fabs(fd - an), lim = FD_RTOL * fmax(fabs(fd), fabs(an)) + FD_ATOL;
                checked++;
                if (!(e <= lim)) {
                    bad++;
                    cr_log_error("variant %d %s[%zu]: analytic %.6e, finite difference %.6e (tensor max %.3e)", variant,
                                 t->name, j, an, fd, tmax);
                }
                if (fabs(an) > 1e-3) worst = fmax(worst, e / fabs(an));
                if (fabs(an) > 1e-2) worst_big = fmax(worst_big, e / fabs(an));
            }
            cr_expect(tmax > 0, "variant %d: %s has an all-zero gradient", variant, t->name);
        }
        cr_expect_eq(bad, 0, "variant %d: %d of %d sampled entries off (worst relative error %.2e)", variant, bad,
                     checked, worst);
        cr_log_info("variant %d: %d entries of %d tensors, worst relative error %.2e where |g| > 1e-3, %.2e where "
                    "|g| > 1e-2", variant, checked, m.n_tensors, worst, worst_big);
        // untied: rows of the table no id read have exactly zero gradient
        if (!c.tie_embeddings)
            for (int row = 30; row < 37; row++)
                for (int e = 0; e < c.hidden; e++)
                    cr_expect(m.grads[(size_t)row * c.hidden + e] == 0.0f, "embedding row %d got a gradient", row);
        train_acts_free(&a);
        train_model_free(&m);
    }
}

// Two backward calls add up (gradient accumulation), and a fully masked batch gives no gradient.
Test(step08, gradients_accumulate_and_mask) {
    ModelConfig c = fd_config(0);
    TrainModel m;
    char err[256];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 3);
    const int B = 2, T = 5;
    int ids[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, tg[10] = {2, 3, 4, 5, -1, 7, 8, 9, 10, -1}, none[10];
    for (int i = 0; i < 10; i++) none[i] = TRAIN_IGNORE;
    TrainActs a;
    train_acts_new(&c, B, T, &a);
    train_zero_grad(&m);
    train_forward(&m, &a, ids, tg, B, T);
    train_backward(&m, &a);
    float *g1 = malloc(m.n_params * sizeof(float));
    memcpy(g1, m.grads, m.n_params * sizeof(float));
    train_forward(&m, &a, ids, tg, B, T);
    train_backward(&m, &a);
    double worst = 0;
    for (size_t i = 0; i < m.n_params; i++) worst = fmax(worst, fabs(m.grads[i] - 2.0 * g1[i]) / (fabs(g1[i]) + 1e-6));
    cr_expect(worst < 1e-5, "two backwards vs twice one: worst relative %.2e", worst);
    train_zero_grad(&m);
    cr_expect_eq(train_forward(&m, &a, ids, none, B, T), 0.0);
    train_backward(&m, &a);
    double s = 0;
    for (size_t i = 0; i < m.n_params; i++) s += fabs(m.grads[i]);
    cr_expect(s == 0, "a fully masked batch gave gradient mass %.3e", s);
    free(g1);
    train_acts_free(&a);
    train_model_free(&m);
}

// ---------------------------------------------------------------- optimizer, clipping, schedule

// AdamW as the paper writes it (bias-corrected moments, decoupled decay), in double.
static void adamw_ref(double *p, const double *g, double *m, double *v, int n, int t, double lr, double b1, double b2,
                      double eps, double wd) {
    for (int i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        const double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mh / (sqrt(vh) + eps);
    }
}

Test(step08, adamw_matches_reference) {
    ModelConfig c = fd_config(0);
    TrainModel m;
    char err[256];
    cr_assert(train_model_new(&c, &m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&m, 5);
    const size_t n = m.n_params;
    double *p = malloc(n * sizeof(double)), *mm = calloc(n, sizeof(double)), *vv = calloc(n, sizeof(double));
    double *g = malloc(n * sizeof(double)), *wd = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) p[i] = m.params[i];
    // decay on matrices only: the test decides by name, independently of the layout's flag
    for (int ti = 0; ti < m.n_tensors; ti++) {
        const TrainTensor *t = &m.tensors[ti];
        const int vec = strstr(t->name, "norm") || strstr(t->name, "bias");
        for (size_t j = 0; j < t->numel; j++) wd[t->off + j] = vec ? 0.0 : 0.1;
    }
    AdamW o;
    adamw_new(&o, n);
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    Rng r;
    rng_seed(&r, 77);
    double worst = 0, lr_sum = 0;
    for (int step = 1; step <= 6; step++) {
        const float lr = 1e-2f * step;
        for (size_t i = 0; i < n; i++) m.grads[i] = (step == 3 && i % 5 == 0) ? 0.0f : 1e-3f * rng_normal(&r), g[i] = m.grads[i];
        train_adamw_step(&m, &o, &ac, lr);
        for (size_t i = 0; i < n; i++) adamw_ref(p + i, g + i, mm + i, vv + i, 1, step, lr, 0.9, 0.95, 1e-8, wd[i]);
        lr_sum += lr;  // how far AdamW can move a parameter in total: the scale of its error
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(m.params[i] - p[i]) / (fabs(p[i]) + lr_sum));
    }
    cr_expect(worst < 1e-6, "AdamW vs reference over 6 steps: worst relative error %.3e", worst);
    cr_expect_eq(o.t, 6);
    adamw_free(&o);
    free(p), free(mm), free(vv), free(g), free(wd);
    train_model_free(&m);
}

Test(step08, clip_and_schedule) {
    Rng r;
    rng_seed(&r, 9);
    const size_t n = 1001;
    float *g = rng_new_normal(&r, n, 0, 0.3f), *g0 = malloc(n * sizeof(float));
    memcpy(g0, g, n * sizeof(float));
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    const double norm = sqrt(ss);  // ~ 0.3 sqrt(1001) ~ 9.5
    // above the norm: untouched
    cr_expect(fabs(grad_global_norm_clip(g, n, norm * 2) - norm) < 1e-9 * norm);
    cr_expect(memcmp(g, g0, n * sizeof(float)) == 0, "clipping above the norm changed g");
    // below: scaled to the limit, direction kept
    const double got = grad_global_norm_clip(g, n, 1.0);
    cr_expect(fabs(got - norm) < 1e-9 * norm, "norm %.9f, expected %.9f", got, norm);
    double ss2 = 0, worst = 0;
    for (size_t i = 0; i < n; i++) ss2 += (double)g[i] * g[i], worst = fmax(worst, fabs(g[i] - g0[i] / norm));
    cr_expect(fabs(sqrt(ss2) - 1.0) < 1e-5, "clipped norm %.7f", sqrt(ss2));
    cr_expect(worst < 1e-6, "clipped direction off by %.2e", worst);
    // schedule: warmup 10, 111 steps, 1e-3 -> 1e-4
    const long W = 10, S = 111;
    const double hi = 1e-3, lo = 1e-4;
    for (long s = 0; s < S; s++) {
        const double want = s < W ? hi * (s + 1) / W : lo + (hi - lo) * 0.5 * (1 + cos(M_PI * (s - W) / (S - 1 - W)));
        const double got_lr = lr_schedule(s, W, S, (float)hi, (float)lo);
        cr_expect(fabs(got_lr - want) <= 1e-6 * hi, "step %ld: lr %.9g, expected %.9g", s, got_lr, want);
    }
    cr_expect(fabs(lr_schedule(W - 1, W, S, 1e-3f, 1e-4f) - 1e-3) < 1e-9);
    cr_expect(fabs(lr_schedule(S - 1, W, S, 1e-3f, 1e-4f) - 1e-4) < 1e-9);
    cr_expect(fabs(lr_schedule(W + (S - 1 - W) / 2, W, S, 1e-3f, 1e-4f) - 5.5e-4) < 1e-8);
    free(g), free(g0);
}

// ---------------------------------------------------------------- learning is visible

#define LEARN_STEPS 300
#define LEARN_LOSS 0.05   // mean cross-entropy of the last 10 steps' answers must fall below this
#define LEARN_ACC 0.90    // held-out examples answered exactly by greedy decoding through forward_cpu

Test(step08, copy_task_is_learned, .timeout = 120) {
    TrainModel m;
    double first = 0, last10 = 0;
    test_train_copy(&m, LEARN_STEPS, &first, &last10);
    const int L = TCOPY_L, n_sym = TCOPY_NSYM;
    cr_expect(first > 1.5, "the first loss %.3f should be near ln(10) = 2.30 (random answers)", first);
    cr_expect(last10 < LEARN_LOSS, "loss after %d steps %.4f (first %.3f), expected < %.2f", LEARN_STEPS, last10, first,
              LEARN_LOSS);
    CpuModel cm;
    train_cpu_view(&m, &cm);
    double tok = 0;
    const double acc = task_eval(&cm, TASK_COPY, 999, 100, L, n_sym, &tok);
    cr_expect(acc >= LEARN_ACC, "held-out copy accuracy %.2f (tokens %.2f), expected >= %.2f", acc, tok, LEARN_ACC);
    cr_log_info("copy: loss %.3f -> %.4f in %d steps; held-out exact %.2f, tokens %.3f", first, last10, LEARN_STEPS,
                acc, tok);
    train_cpu_view_free(&cm);
    train_model_free(&m);
}

// ---------------------------------------------------------------- the program

// BUILD_BIN_DIR/train args: exit code, and stdout + stderr in out.
static int run_train(const char *args, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/train %s 2>&1", BUILD_BIN_DIR, args);
    return test_run_cmd(cmd, out, cap);
}

Test(step08, train_program_refuses_bad_options_and_runs, .timeout = 120) {
    static const struct { const char *args; int rc; const char *msg; } cases[] = {
        {"--preset tiny --steps 0", 2, "--steps: 0 is out of range"},
        {"--preset tiny --lr nan", 2, "--lr: 'nan' is not a finite number"},
        {"--preset tiny --clip -1", 2, "--clip: -1 is out of range"},
        {"--preset tiny --batch 1e3", 2, "--batch: '1e3' is not an integer"},
        {"--preset tiny --task sort", 2, "--task: 'sort' is not a task (allowed: copy, reverse)"},
        {"--preset huge", 2, "--preset: 'huge' is not a preset (allowed: tiny, small)"},
        {"--preset tiny --model " MODELS_DIR "/llama_mha_f32", 2, "need exactly one of --preset tiny / --model DIR"},
        {"--preset tiny --steps 10 --warmup 10", 2, "--warmup: 10 is not below --steps 10"},
        {"--preset tiny --lr 1e-3 --min-lr 1e-2", 2, "--min-lr: 0.01 is above --lr 0.001"},
        {"--preset tiny --seq 200", 2, "sequences of 402 tokens exceed the model's 256 positions"},
        {"--model " MODELS_DIR "/llama_mha_f32 --symbols 700", 2, "a vocabulary of 608, smaller than the task's 702 ids"},
        {"--preset tiny --bogus", 2, "unknown or incomplete argument: --bogus"},
    };
    static char out[1 << 16];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int rc = run_train(cases[i].args, out, sizeof out);
        cr_expect_eq(rc, cases[i].rc, "train %s: exit %d, expected %d:\n%s", cases[i].args, rc, cases[i].rc, out);
        cr_expect(strstr(out, cases[i].msg) && strstr(out, "error: "), "train %s: no \"error: ... %s\":\n%s",
                  cases[i].args, cases[i].msg, out);
    }
    // a short run: a table row per step, the held-out line, exit 0
    const int rc = run_train("--preset tiny --steps 4 --warmup 1 --log-every 1 --eval 3 --csv", out, sizeof out);
    cr_expect_eq(rc, 0, "train control run: exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "step,loss,grad_norm,lr,tok_s") && strstr(out, "\n4,") && strstr(out, "# held_out: 3 examples"),
              "train control run output:\n%s", out);
    cr_expect(!strstr(out, "runtime error") && !strstr(out, "Sanitizer"), "sanitizer report:\n%s", out);
}
