// test_step08_grad.c — step08's backward against PyTorch autograd (tests/data/grad_goldens/).
//
// A golden directory is what `train --grad-dump` wrote (the starting model as a Hugging Face
// directory in fp32, one batch, the C loss and gradients; step08_ddp/export.h) plus what
// tools/make_grad_goldens.py computed on it with transformers and autograd (torch_loss.json,
// torch_grads.safetensors). The test loads the directory with the engine's own loaders
// (model_load, train_model_from_weights), runs train_forward + train_backward on the batch, and
// compares every gradient tensor with torch's and with the C gradients written at dump time:
//   vs torch      max_rel (common/compare.h) <= 1e-4 per tensor; loss within 1e-5 relative
//   vs the dump   max_rel <= 1e-5 per tensor, loss within 1e-12 relative: the C code still computes
//                 what the goldens were made from (not bit for bit: OpenBLAS picks other kernels
//                 on other CPUs, which round differently)
// Finite differences (test_step08_train.c) check the backward against the loss's definition on
// odd shapes; this checks it against an independent implementation of the whole model at once.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "model.h"
#include "safetensors.h"
#include "step08_ddp/train.h"

#define GRAD_GOLDENS "tests/data/grad_goldens"
#define TOL_TORCH_GRAD 1e-4
#define TOL_TORCH_LOSS 1e-5
#define TOL_DUMP_GRAD 1e-5
#define TOL_DUMP_LOSS 1e-12

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

static void check_golden(const char *name) {
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "%s/%s", GRAD_GOLDENS, name);
    ModelWeights w;
    TrainModel m;
    cr_assert(model_load(dir, &w, err, sizeof err) == 0, "%s", err);
    cr_assert(train_model_from_weights(&w, &m, err, sizeof err) == 0, "%s", err);
    model_free(&w);

    json_t *b = load_json(dir, "batch.json"), *tl = load_json(dir, "torch_loss.json"), *cl = load_json(dir, "c_loss.json");
    const int B = (int)json_num(b, "batch", "batch.json"), T = (int)json_num(b, "seq_len", "batch.json");
    cr_assert(B >= 1 && T >= 1 && T <= m.cfg.max_pos, "batch.json: B %d T %d", B, T);
    cr_assert_eq((int)json_num(b, "ignore_index", "batch.json"), TRAIN_IGNORE);
    int *ids = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
    read_rows(b, "input_ids", B, T, ids);
    read_rows(b, "targets", B, T, tg);

    TrainActs a;
    train_acts_new(&m.cfg, B, T, &a);
    train_zero_grad(&m);
    const double loss = train_forward(&m, &a, ids, tg, B, T);
    cr_assert(loss > 0, "train_forward: %g", loss);
    train_backward(&m, &a);

    const double t_loss = json_num(tl, "loss", "torch_loss.json");
    const json_t *hex = json_object_get(cl, "loss_hex");  // the dumped double exactly
    cr_assert(json_is_string(hex), "c_loss.json: no loss_hex");
    const double c_loss = strtod(json_string_value(hex), NULL);
    cr_assert(fabs(c_loss - json_num(cl, "loss", "c_loss.json")) <= 1e-14 * fabs(c_loss), "c_loss.json: loss and loss_hex differ");
    cr_assert_eq(a.n_counted, (int)json_num(tl, "n_counted", "torch_loss.json"), "counted targets: C %d, torch %d",
                 a.n_counted, (int)json_num(tl, "n_counted", "torch_loss.json"));
    const double rl_t = fabs(loss - t_loss) / fabs(t_loss), rl_c = fabs(loss - c_loss) / fabs(c_loss);
    cr_log_info("%s: loss C %.10f, torch %.10f (rel %.2e), dump %.10f (rel %.2e); %d of %d targets counted", name, loss,
                t_loss, rl_t, c_loss, rl_c, a.n_counted, B * T);
    cr_expect(rl_t <= TOL_TORCH_LOSS, "%s: loss %.10f vs torch %.10f: rel %.2e > %g", name, loss, t_loss, rl_t,
              TOL_TORCH_LOSS);
    cr_expect(rl_c <= TOL_DUMP_LOSS, "%s: loss %.17g vs the dump's %.17g: rel %.2e > %g", name, loss, c_loss, rl_c,
              TOL_DUMP_LOSS);

    char tp[300], cp[300];
    snprintf(tp, sizeof tp, "%s/torch_grads.safetensors", dir);
    snprintf(cp, sizeof cp, "%s/c_grads.safetensors", dir);
    StSet ts, cs;
    cr_assert(st_open(tp, &ts, err, sizeof err) == 0, "%s", err);
    cr_assert(st_open(cp, &cs, err, sizeof err) == 0, "%s", err);
    // every parameter has a gradient on both sides, and nothing more
    cr_assert_eq(ts.n_tensors, m.n_tensors, "%s: %d tensors, the model has %d", tp, ts.n_tensors, m.n_tensors);
    cr_assert_eq(cs.n_tensors, m.n_tensors, "%s: %d tensors, the model has %d", cp, cs.n_tensors, m.n_tensors);
    double worst_t = 0, worst_c = 0;
    const char *worst_name = "";
    for (int i = 0; i < m.n_tensors; i++) {
        const TrainTensor *t = &m.tensors[i];
        float *ref = malloc(t->numel * sizeof(float)), *dumped = malloc(t->numel * sizeof(float));
        tensor_f32(&ts, tp, t, ref);
        tensor_f32(&cs, cp, t, dumped);
        const float *g = m.grads + t->off;
        const ErrStats et = compare_f32(g, ref, t->numel), ec = compare_f32(g, dumped, t->numel);
        double mx = 0;
        for (size_t j = 0; j < t->numel; j++) mx = fmax(mx, fabs((double)ref[j]));
        cr_log_info("%s %-44s max_rel vs torch %.2e (l2_rel %.2e, max|g| %.2e), vs the dump %.2e", name, t->name,
                    et.max_rel, et.l2_rel, mx, ec.max_rel);
        cr_expect(mx > 0, "%s: torch's gradient of %s is all zero (nothing to compare)", name, t->name);
        cr_expect(et.max_rel <= TOL_TORCH_GRAD, "%s: %s vs torch: max_rel %.2e > %g (worst [%zu]: C %.6e torch %.6e)",
                  name, t->name, et.max_rel, TOL_TORCH_GRAD, et.worst, g[et.worst], ref[et.worst]);
        cr_expect(ec.max_rel <= TOL_DUMP_GRAD, "%s: %s vs the dumped C gradient: max_rel %.2e > %g", name, t->name,
                  ec.max_rel, TOL_DUMP_GRAD);
        if (et.max_rel > worst_t) worst_t = et.max_rel, worst_name = t->name;
        worst_c = fmax(worst_c, ec.max_rel);
        free(ref), free(dumped);
    }
    cr_log_info("%s: %d tensors, worst max_rel vs torch %.2e (%s), vs the dump %.2e", name, m.n_tensors, worst_t,
                worst_name, worst_c);
    st_close(&ts), st_close(&cs);
    json_decref(b), json_decref(tl), json_decref(cl);
    free(ids), free(tg);
    train_acts_free(&a);
    train_model_free(&m);
}

// The tiny preset (Llama, GQA 4/2, untied) after 50 steps of the reverse task (loss 1.30: far
// from both guessing and one-hot answers; norm weights moved off 1), one batch of 4 x 14 tokens.
Test(step08_grad, tiny_reverse_matches_torch_autograd) { check_golden("tiny_reverse_step50"); }
