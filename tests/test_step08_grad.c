// test_step08_grad.c — step08's backward against PyTorch autograd (tests/data/grad_goldens/).
//
// A golden directory is what `train --grad-dump` wrote (the starting model as a Hugging Face
// directory in fp32, one batch, the C loss and gradients; step08_ddp/export.h) plus what
// tools/make_grad_goldens.py computed on it with transformers and autograd (torch_loss.json,
// torch_grads.safetensors). The test loads the directory with the engine's own loaders
// (model_load, train_model_from_weights), runs train_forward + train_backward on the batch, and
// compares every gradient tensor with torch's and with the C gradients written at dump time:
//   vs torch      max_rel (common/compare.h) <= 1e-4 per tensor; loss within 1e-5 relative
//   vs the dump   max_rel <= 1e-5 per tensor, loss within 1e-6 relative: the C code still computes
//                 what the goldens were made from (not bit for bit: another CPU, OpenBLAS kernel or
//                 compiler flags round the fp32 forward differently; the sanitizer build's loss is
//                 4.2e-8 relative from the -O3 -march=native one's, its gradients 8.3e-7)
// And the dump itself: `train --grad-dump` writes the seeded starting model, the first batch of the
// training stream, and the loss and gradients this process recomputes on them.
// Finite differences (test_step08_train.c) check the backward against the loss's definition on
// odd shapes; this checks it against an independent implementation of the whole model at once.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "fs_util.h"
#include "model.h"
#include "rng.h"
#include "safetensors.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"

#define GRAD_GOLDENS "tests/data/grad_goldens"
#define TOL_TORCH_GRAD 1e-4
#define TOL_TORCH_LOSS 1e-5
#define TOL_DUMP_GRAD 1e-5
#define TOL_DUMP_LOSS 1e-6

static json_t *load_json(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    cr_assert(j, "%s: %s (line %d)", p, je.text, je.line);
    return j;
}

// (B, T) ints of batch.json's key into out.
static void read_rows(const json_t *b, const char *key, int B, int T, int *out) {
    const json_t *a = json_object_get(b, key);
    cr_assert(json_is_array(a) && (int)json_array_size(a) == B, "batch.json: %s is not %d rows", key, B);
    for (int i = 0; i < B; i++) {
        const json_t *r = json_array_get(a, (size_t)i);
        cr_assert(json_is_array(r) && (int)json_array_size(r) == T, "batch.json: %s[%d] is not %d ids", key, i, T);
        for (int t = 0; t < T; t++) {
            const json_t *v = json_array_get(r, (size_t)t);
            cr_assert(json_is_integer(v), "batch.json: %s[%d][%d] is not an integer", key, i, t);
            out[(size_t)i * T + t] = (int)json_integer_value(v);
        }
    }
}

static double json_num(const json_t *o, const char *key, const char *file) {
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "%s: no number %s", file, key);
    return json_number_value(v);
}

// The tensor `name` of set s as fp32 into buf (numel floats), its shape checked against t.
static void tensor_f32(const StSet *s, const char *file, const TrainTensor *t, float *buf) {
    const StTensor *x = st_get(s, t->name);
    cr_assert(x, "%s: no tensor %s", file, t->name);
    cr_assert(x->dtype == ST_F32, "%s: %s is %s, not F32", file, t->name, st_dtype_name(x->dtype));
    const int ok = t->rows == 1 ? x->ndim == 1 && x->shape[0] == t->cols
                                : x->ndim == 2 && x->shape[0] == t->rows && x->shape[1] == t->cols;
    char sh[64];
    cr_assert(ok, "%s: %s has shape %s, expected (%d, %d)", file, t->name, st_shape_str(x->shape, x->ndim, sh, sizeof sh),
              t->rows, t->cols);
    st_to_f32(x, buf);
}

// A gradient dump loaded with the engine's loaders and its batch rerun: m->grads and the loss.
typedef struct {
    TrainModel m;
    TrainActs a;
    int B, T, *ids, *targets;
    double loss;
} Rerun;

static void rerun(const char *dir, Rerun *r) {
    char err[512];
    ModelWeights w;
    cr_assert(model_load(dir, &w, err, sizeof err) == 0, "%s", err);
    cr_assert(train_model_from_weights(&w, &r->m, err, sizeof err) == 0, "%s", err);
    model_free(&w);
    json_t *b = load_json(dir, "batch.json");
    r->B = (int)json_num(b, "batch", "batch.json"), r->T = (int)json_num(b, "seq_len", "batch.json");
    cr_assert(r->B >= 1 && r->T >= 1 && r->T <= r->m.cfg.max_pos, "batch.json: B %d T %d", r->B, r->T);
    cr_assert_eq((int)json_num(b, "ignore_index", "batch.json"), TRAIN_IGNORE);
    r->ids = malloc((size_t)r->B * r->T * sizeof(int)), r->targets = malloc((size_t)r->B * r->T * sizeof(int));
    read_rows(b, "input_ids", r->B, r->T, r->ids);
    read_rows(b, "targets", r->B, r->T, r->targets);
    json_decref(b);
    train_acts_new(&r->m.cfg, r->B, r->T, &r->a);
    train_zero_grad(&r->m);
    r->loss = train_forward(&r->m, &r->a, r->ids, r->targets, r->B, r->T);
    cr_assert(r->loss > 0, "train_forward: %g", r->loss);
    train_backward(&r->m, &r->a);
}

static void rerun_free(Rerun *r) {
    free(r->ids), free(r->targets);
    train_acts_free(&r->a);
    train_model_free(&r->m);
}

// c_loss.json's loss, exactly (loss_hex).
static double dumped_loss(const char *dir, int *n_counted) {
    json_t *cl = load_json(dir, "c_loss.json");
    const json_t *hex = json_object_get(cl, "loss_hex");
    cr_assert(json_is_string(hex), "c_loss.json: no loss_hex");
    const double l = strtod(json_string_value(hex), NULL);
    cr_assert(fabs(l - json_num(cl, "loss", "c_loss.json")) <= 1e-14 * fabs(l), "c_loss.json: loss and loss_hex differ");
    *n_counted = (int)json_num(cl, "n_counted", "c_loss.json");
    json_decref(cl);
    return l;
}

// max_rel of every tensor of the rerun's gradients against dir/file (which must hold exactly the
// model's tensors): into rel[i] (m.n_tensors). Returns the worst.
static double compare_grads(const char *dir, const char *file, const Rerun *r, double *rel) {
    char p[300], err[512];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    StSet s;
    cr_assert(st_open(p, &s, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(s.n_tensors, r->m.n_tensors, "%s: %d tensors, the model has %d", p, s.n_tensors, r->m.n_tensors);
    double worst = 0;
    for (int i = 0; i < r->m.n_tensors; i++) {
        const TrainTensor *t = &r->m.tensors[i];
        float *ref = malloc(t->numel * sizeof(float));
        tensor_f32(&s, p, t, ref);
        double mx = 0;
        for (size_t j = 0; j < t->numel; j++) mx = fmax(mx, fabs((double)ref[j]));
        cr_expect(mx > 0, "%s: the gradient of %s is all zero (nothing to compare)", p, t->name);
        const ErrStats e = compare_f32(r->m.grads + t->off, ref, t->numel);
        rel[i] = e.max_rel, worst = fmax(worst, e.max_rel);
        free(ref);
    }
    st_close(&s);
    return worst;
}

static void check_golden(const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", GRAD_GOLDENS, name);
    Rerun r;
    rerun(dir, &r);
    json_t *tl = load_json(dir, "torch_loss.json");
    const double t_loss = json_num(tl, "loss", "torch_loss.json");
    const int t_counted = (int)json_num(tl, "n_counted", "torch_loss.json");
    json_decref(tl);
    int c_counted;
    const double c_loss = dumped_loss(dir, &c_counted);
    cr_assert_eq(r.a.n_counted, t_counted, "counted targets: C %d, torch %d", r.a.n_counted, t_counted);
    cr_assert_eq(r.a.n_counted, c_counted, "counted targets: C %d, the dump %d", r.a.n_counted, c_counted);
    const double rl_t = fabs(r.loss - t_loss) / fabs(t_loss), rl_c = fabs(r.loss - c_loss) / fabs(c_loss);
    cr_log_info("%s: loss C %.10f, torch %.10f (rel %.2e), dump rel %.2e; %d of %d targets counted", name, r.loss,
                t_loss, rl_t, rl_c, r.a.n_counted, r.B * r.T);
    cr_expect(rl_t <= TOL_TORCH_LOSS, "%s: loss %.10f vs torch %.10f: rel %.2e > %g", name, r.loss, t_loss, rl_t,
              TOL_TORCH_LOSS);
    cr_expect(rl_c <= TOL_DUMP_LOSS, "%s: loss %.17g vs the dump's %.17g: rel %.2e > %g", name, r.loss, c_loss, rl_c,
              TOL_DUMP_LOSS);

    double *rt = calloc((size_t)r.m.n_tensors, sizeof(double)), *rc = calloc((size_t)r.m.n_tensors, sizeof(double));
    const double wt = compare_grads(dir, "torch_grads.safetensors", &r, rt);
    const double wc = compare_grads(dir, "c_grads.safetensors", &r, rc);
    int iw = 0;
    for (int i = 0; i < r.m.n_tensors; i++) {
        const char *tn = r.m.tensors[i].name;
        cr_log_info("%s %-46s max_rel vs torch %.2e, vs the dump %.2e", name, tn, rt[i], rc[i]);
        cr_expect(rt[i] <= TOL_TORCH_GRAD, "%s: %s vs torch: max_rel %.2e > %g", name, tn, rt[i], TOL_TORCH_GRAD);
        cr_expect(rc[i] <= TOL_DUMP_GRAD, "%s: %s vs the dumped C gradient: max_rel %.2e > %g", name, tn, rc[i],
                  TOL_DUMP_GRAD);
        if (rt[i] > rt[iw]) iw = i;
    }
    cr_log_info("%s: %d tensors, worst max_rel vs torch %.2e (%s), vs the dump %.2e", name, r.m.n_tensors, wt,
                r.m.tensors[iw].name, wc);
    free(rt), free(rc);
    rerun_free(&r);
}

// The tiny preset (Llama, GQA 4/2, untied) after 50 steps of the reverse task (loss 1.30: far
// from both guessing and one-hot answers; norm weights moved off 1), one batch of 4 x 14 tokens.
Test(step08_grad, tiny_reverse_matches_torch_autograd) { check_golden("tiny_reverse_step50"); }

// The dump itself: train --grad-dump writes the seeded starting model, the first batch of the
// training stream, and the loss and gradients of that batch; and refuses what it cannot do.
Test(step08_grad, train_grad_dump_writes_model_batch_and_gradients, .timeout = 120) {
    char tmp[64], dir[128], cmd[512];
    static char out[1 << 16];
    test_mkdtemp(tmp, sizeof tmp, "grad_dump");
    snprintf(dir, sizeof dir, "%s/d", tmp);
    snprintf(cmd, sizeof cmd, "%s/train --preset tiny --task reverse --batch 3 --seq 4 --symbols 7 --seed 5 "
             "--grad-dump %s 2>&1", BUILD_BIN_DIR, dir);
    int rc = test_run_cmd(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s: exit %d:\n%s", cmd, rc, out);
    cr_expect(strstr(out, "# grad_dump: ") && !strstr(out, "held_out"), "output:\n%s", out);

    Rerun r;
    rerun(dir, &r);
    // the starting model: the tiny preset's config, train.h's seeded init
    const ModelConfig *c = &r.m.cfg;
    cr_assert(c->hidden == 64 && c->n_layers == 2 && c->n_heads == 4 && c->n_kv_heads == 2 && c->vocab == TASK_SYM0 + 7,
              "config: d %d, %d layers, %d/%d heads, vocab %d", c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab);
    TrainModel init;
    char err[256];
    cr_assert(train_model_new(c, &init, err, sizeof err) == 0, "%s", err);
    train_model_init_random(&init, 5);
    cr_assert_eq(init.n_params, r.m.n_params);
    cr_expect(memcmp(init.params, r.m.params, init.n_params * sizeof(float)) == 0, "model.safetensors is not the seeded init");
    train_model_free(&init);
    // the batch: the first of the training stream (train.c seeds it with seed * 2 + 1)
    cr_assert(r.B == 3 && r.T == task_seq_len(4), "batch %d x %d", r.B, r.T);
    int ids[3 * 10], tg[3 * 10];
    Rng data;
    rng_seed(&data, 5 * 2 + 1);
    task_make_batch(TASK_REVERSE, &data, 3, 4, 7, ids, tg);
    cr_expect(memcmp(ids, r.ids, sizeof ids) == 0 && memcmp(tg, r.targets, sizeof tg) == 0, "batch.json is not the first batch");
    // the loss and the gradients: what this process computes on the same model and batch
    int n_counted;
    const double l = dumped_loss(dir, &n_counted);
    cr_expect(n_counted == 3 * 4 && fabs(l - r.loss) <= TOL_DUMP_LOSS * l, "dump: loss %.17g (%d counted), rerun %.17g (%d)",
              l, n_counted, r.loss, r.a.n_counted);
    double *rel = calloc((size_t)r.m.n_tensors, sizeof(double));
    const double worst = compare_grads(dir, "c_grads.safetensors", &r, rel);
    cr_log_info("train --grad-dump: loss %.6f, %d tensors, worst max_rel vs the rerun %.2e", l, r.m.n_tensors, worst);
    cr_expect(worst <= TOL_DUMP_GRAD, "c_grads.safetensors vs the rerun: worst max_rel %.2e > %g", worst, TOL_DUMP_GRAD);
    free(rel);
    rerun_free(&r);

    // refusals: a directory that is not empty, --save beside it
    snprintf(cmd, sizeof cmd, "%s/train --preset tiny --grad-dump %s 2>&1", BUILD_BIN_DIR, dir);
    rc = test_run_cmd(cmd, out, sizeof out);
    cr_expect(rc == 2 && strstr(out, "--grad-dump: ") && strstr(out, "is not empty"), "non-empty dir: exit %d:\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "%s/train --preset tiny --grad-dump %s/e --save %s/f 2>&1", BUILD_BIN_DIR, tmp, tmp);
    rc = test_run_cmd(cmd, out, sizeof out);
    cr_expect(rc == 2 && strstr(out, "does not go with --save"), "--save: exit %d:\n%s", rc, out);
    test_rmtree(tmp);
}
