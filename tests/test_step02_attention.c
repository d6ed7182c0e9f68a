// test_step02_attention.c — the forward pass, op by op and end to end.
//
// Ops: each CPU op against a plain float64 reference written here (or a property the math
// guarantees: RoPE's dot products depend only on the distance between positions; a causal
// output at position i does not move when later tokens change), on odd shapes and fresh random
// inputs. RoPE's llama3 frequencies against numbers computed with numpy the way transformers'
// _compute_llama3_parameters computes them.
// Model: the logits of every checkpoint under tests/data/models/ (tools/make_goldens.py: tiny
// random-weight Llama MHA / GQA + head_dim / llama3 rope + tied / Qwen2 bias / Qwen3 q-k norm,
// each f32 and bf16) against what transformers computed:
//   CPU (fp32)  f32 checkpoint  vs logits_T<n>.npy          max|diff| <= 1e-3 x max|logit|
//               bf16 checkpoint vs logits_T<n>_f32ref.npy   (the same bf16 weights run in f32 by
//                                                           transformers)   same bound
//               bf16 checkpoint vs logits_T<n>.npy          (transformers in bf16)  TOL_BF16
//   CUDA        f32 checkpoint  vs logits_T<n>.npy          (fp32 SGEMM, no TF32)  1e-3
//               bf16 checkpoint vs logits_T<n>.npy          TOL_BF16
//               and GPU vs CPU on every checkpoint          TOL_BF16 (f32: 1e-3)
// GPU tests skip (and say why) without a CUDA device.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "golden_util.h"
#include "gpu.h"
#include "model.h"
#include "npy.h"
#include "rng.h"
#include "step02_attention/forward.h"

#define TOL_F32 1e-3   // max|diff| / max|logit|: fp32 engine vs fp32 transformers
#define TOL_BF16 4e-2  // bf16 transformers (bf16 activations, bf16 residual) vs fp32-residual engines

// ---------------------------------------------------------------- ops

Test(step02, rmsnorm_matches_f64_formula) {
    Rng r;
    rng_seed(&r, 11);
    const int shapes[][2] = {{1, 1}, {3, 67}, {130, 96}, {5, 4096}};
    for (size_t s = 0; s < 4; s++) {
        int rows = shapes[s][0], n = shapes[s][1];
        float *x = rng_new_uniform(&r, (size_t)rows * n, -1.0f, 1.0f), *w = rng_new_uniform(&r, n, -1.0f, 1.0f), *y = malloc((size_t)rows * n * 4);
        for (int i = 0; i < rows * n; i++) y[i] = NAN;
        rmsnorm_cpu(x, w, rows, n, 1e-6f, y);
        double worst = 0;
        for (int i = 0; i < rows; i++) {
            double ss = 0;
            for (int j = 0; j < n; j++) ss += (double)x[i * n + j] * x[i * n + j];
            double inv = 1.0 / sqrt(ss / n + 1e-6);
            for (int j = 0; j < n; j++) {
                double ref = x[i * n + j] * inv * w[j];
                double e = fabs(y[i * n + j] - ref) / (fabs(ref) + 1e-6);
                if (!(e <= worst)) worst = e;  // NaN propagates into worst
            }
        }
        cr_expect(worst < 1e-5, "rmsnorm %dx%d: worst relative error %.3e", rows, n, worst);
        free(x), free(w), free(y);
    }
}

// Expected values: numpy float32, the formulas of transformers' _compute_default_rope_parameters
// and _compute_llama3_parameters (theta 5e5, hd 128, factor 8, low 1, high 4, original 8192).
Test(step02, rope_llama3_inv_freq_matches_transformers) {
    ModelConfig c = {0};
    c.head_dim = 128;
    c.rope_theta = 500000.0;
    c.rope_type = ROPE_LLAMA3;
    c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4, c.rope_original_max_pos = 8192;
    float f[64];
    rope_inv_freq(&c, f);
    const struct { int i; double v; } want[] = {
        {0, 1.0},                      // high frequency: unchanged
        {20, 0.016560440883040428},    // high frequency: unchanged
        {29, 0.0021665706299245358},   // medium: smoothed
        {32, 0.0005248460220173001},   // medium: smoothed
        {40, 3.428102354519069e-05},   // low frequency: divided by 8
        {63, 3.068925877869333e-07},   // low frequency: divided by 8
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        cr_expect(fabs(f[want[k].i] - want[k].v) <= 2e-6 * want[k].v, "inv_freq[%d] = %.9g, transformers %.9g",
                  want[k].i, f[want[k].i], want[k].v);
    c.rope_type = ROPE_DEFAULT;
    rope_inv_freq(&c, f);
    cr_expect(fabs(f[40] - 0.00027424818836152554) <= 2e-6 * 0.00027424818836152554, "default inv_freq[40] = %.9g",
              f[40]);
}

// Rotate-half: pair (x[i], x[i + hd/2]) turns by the angle pos * inv_freq[i].
Test(step02, rope_rotates_pairs_by_position_angle) {
    ModelConfig c = {0};
    c.head_dim = 24;
    c.rope_theta = 10000.0;
    const int T = 9, nh = 3, hd = 24, half = 12, ld = nh * hd + 5;  // a padded row stride
    Rng r;
    rng_seed(&r, 3);
    float *x = rng_new_uniform(&r, (size_t)T * ld, -1.0f, 1.0f), *x0 = malloc((size_t)T * ld * 4);
    memcpy(x0, x, (size_t)T * ld * 4);
    float cs[9 * 12], sn[9 * 12], inv[12];
    rope_table_cpu(&c, 0, T, cs, sn);
    rope_apply_cpu(x, T, nh, hd, ld, cs, sn);
    rope_inv_freq(&c, inv);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < half; i++) {
                const float *a = x0 + t * ld + h * hd, *b = x + t * ld + h * hd;
                double ang = (double)t * inv[i];
                double r1 = a[i] * cos(ang) - a[i + half] * sin(ang), r2 = a[i + half] * cos(ang) + a[i] * sin(ang);
                double e = fmax(fabs(b[i] - r1), fabs(b[i + half] - r2));
                if (!(e <= worst)) worst = e;
            }
    cr_expect(worst < 1e-5, "rope: worst abs error %.3e", worst);
    for (int t = 0; t < T; t++)  // the padding after the heads is not touched
        for (int j = nh * hd; j < ld; j++) cr_expect_eq(x[t * ld + j], x0[t * ld + j]);
    free(x), free(x0);
}

// q at position m and k at position n: after RoPE their dot product depends on m - n only.
Test(step02, rope_dot_product_depends_on_distance_only) {
    ModelConfig c = {0};
    c.head_dim = 64;
    c.rope_theta = 10000.0;
    Rng r;
    rng_seed(&r, 5);
    float q[64], k[64];
    rng_fill_uniform(&r, q, 64, -1, 1);
    rng_fill_uniform(&r, k, 64, -1, 1);
    const int P = 40;
    float *cs = malloc(P * 32 * 4), *sn = malloc(P * 32 * 4);
    rope_table_cpu(&c, 0, P, cs, sn);
    double dots[2];
    const int pairs[2][2] = {{7, 3}, {31, 27}};  // distance 4 both times
    for (int p = 0; p < 2; p++) {
        float qq[64], kk[64];
        memcpy(qq, q, sizeof q), memcpy(kk, k, sizeof k);
        rope_apply_cpu(qq, 1, 1, 64, 64, cs + pairs[p][0] * 32, sn + pairs[p][0] * 32);
        rope_apply_cpu(kk, 1, 1, 64, 64, cs + pairs[p][1] * 32, sn + pairs[p][1] * 32);
        dots[p] = 0;
        for (int i = 0; i < 64; i++) dots[p] += (double)qq[i] * kk[i];
    }
    cr_expect(fabs(dots[0] - dots[1]) < 1e-4, "q(7).k(3) = %.6f but q(31).k(27) = %.6f", dots[0], dots[1]);
    free(cs), free(sn);
}

Test(step02, linear_matches_f64_loop_with_bias) {
    Rng r;
    rng_seed(&r, 17);
    const int shapes[][3] = {{1, 64, 96}, {7, 33, 17}, {33, 100, 250}};
    for (int s = 0; s < 3; s++) {
        int T = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        float *x = rng_new_uniform(&r, (size_t)T * in, -1.0f, 1.0f), *W = rng_new_uniform(&r, (size_t)out * in, -1.0f, 1.0f), *b = rng_new_uniform(&r, out, -1.0f, 1.0f);
        float *y = malloc((size_t)T * out * 4);
        double *ref = malloc((size_t)T * out * 8);
        for (int pass = 0; pass < 2; pass++) {
            const float *bias = pass ? b : NULL;
            linear_cpu(x, W, bias, T, in, out, y);
            for (int t = 0; t < T; t++)
                for (int o = 0; o < out; o++) {
                    double acc = bias ? bias[o] : 0;
                    for (int i = 0; i < in; i++) acc += (double)x[t * in + i] * W[o * in + i];
                    ref[t * out + o] = acc;
                }
            ErrStats e = compare_f32_f64(y, ref, (size_t)T * out);
            cr_expect(e.max_rel < 1e-5 && e.n_bad == 0, "linear %dx%d->%d bias=%d: max_rel %.3e", T, in, out, pass,
                      e.max_rel);
        }
        free(x), free(W), free(b), free(y), free(ref);
    }
}

// The reference: full (T, T) score matrix per head in float64, -inf above the diagonal.
static void attention_ref(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, double *out) {
    double *s = malloc((size_t)T * 8);
    for (int h = 0; h < H; h++) {
        int kvh = h * KV / H;  // GQA: consecutive query heads share a kv head
        for (int i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < T; j++) {
                double dot = 0;
                for (int e = 0; e < hd; e++) dot += (double)q[(size_t)i * H * hd + h * hd + e] * k[(size_t)j * KV * hd + kvh * hd + e];
                s[j] = j > i ? -INFINITY : dot / sqrt((double)hd);
                if (s[j] > mx) mx = s[j];
            }
            for (int j = 0; j < T; j++) sum += s[j] = exp(s[j] - mx);
            for (int e = 0; e < hd; e++) {
                double acc = 0;
                for (int j = 0; j < T; j++) acc += s[j] / sum * v[(size_t)j * KV * hd + kvh * hd + e];
                out[(size_t)i * H * hd + h * hd + e] = acc;
            }
        }
    }
    free(s);
}

static const int attn_shapes[][4] = {
    // T, H, KV, hd
    {1, 2, 2, 8},     // one token: output = v
    {13, 4, 4, 16},   // MHA
    {37, 8, 2, 24},   // GQA, group 4, head_dim not a power of two
    {50, 6, 1, 64},   // MQA
    {129, 4, 2, 128}, // one past a tile multiple
};

Test(step02, attention_matches_f64_reference_mha_gqa_mqa) {
    Rng r;
    rng_seed(&r, 23);
    for (size_t s = 0; s < sizeof attn_shapes / sizeof attn_shapes[0]; s++) {
        int T = attn_shapes[s][0], H = attn_shapes[s][1], KV = attn_shapes[s][2], hd = attn_shapes[s][3];
        size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd;
        float *q = rng_new_uniform(&r, nq, -1.0f, 1.0f), *k = rng_new_uniform(&r, nk, -1.0f, 1.0f), *v = rng_new_uniform(&r, nk, -1.0f, 1.0f), *o = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) q[i] *= 3.0f;  // peaked softmax rows, not all-uniform
        for (size_t i = 0; i < nq; i++) o[i] = NAN;
        double *ref = malloc(nq * 8);
        attention_cpu(q, k, v, T, H, KV, hd, o);
        attention_ref(q, k, v, T, H, KV, hd, ref);
        ErrStats e = compare_f32_f64(o, ref, nq);
        cr_expect(e.n_bad == 0 && e.max_rel < 1e-5, "attention T=%d H=%d KV=%d hd=%d: max_rel %.3e, %zu non-finite", T,
                  H, KV, hd, e.max_rel, e.n_bad);
        free(q), free(k), free(v), free(o), free(ref);
    }
}

// Causality: changing the last token's k and v moves only the last output row.
Test(step02, attention_is_causal) {
    Rng r;
    rng_seed(&r, 29);
    const int T = 20, H = 4, KV = 2, hd = 16;
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd;
    float *q = rng_new_uniform(&r, nq, -1.0f, 1.0f), *k = rng_new_uniform(&r, nk, -1.0f, 1.0f), *v = rng_new_uniform(&r, nk, -1.0f, 1.0f);
    float *o1 = malloc(nq * 4), *o2 = malloc(nq * 4);
    attention_cpu(q, k, v, T, H, KV, hd, o1);
    for (size_t i = (size_t)(T - 1) * KV * hd; i < nk; i++) k[i] += 1.0f, v[i] -= 2.0f;
    attention_cpu(q, k, v, T, H, KV, hd, o2);
    cr_expect(memcmp(o1, o2, (size_t)(T - 1) * H * hd * 4) == 0, "rows before the changed token moved");
    int moved = 0;
    for (size_t i = (size_t)(T - 1) * H * hd; i < nq; i++) moved |= o1[i] != o2[i];
    cr_expect(moved, "the last row did not see its own (changed) key/value");
    free(q), free(k), free(v), free(o1), free(o2);
}

Test(step02, swiglu_matches_formula) {
    Rng r;
    rng_seed(&r, 31);
    const long n = 1001;
    float *g = rng_new_uniform(&r, n, -1.0f, 1.0f), *u = rng_new_uniform(&r, n, -1.0f, 1.0f), *o = malloc(n * 4);
    for (long i = 0; i < n; i++) g[i] *= 8.0f;  // reach the saturated ends of the sigmoid
    swiglu_cpu(g, u, n, o);
    for (long i = 0; i < n; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        cr_expect(fabs(o[i] - ref) <= 1e-6 * (1 + fabs(ref)), "swiglu[%ld]: %.8g vs %.8g", i, o[i], ref);
    }
    free(g), free(u), free(o);
}

// A small random model (cpu_model_random): the logits at position i do not depend on tokens
// after i (prefix property of a causal model), ids outside the vocabulary are refused.
Test(step02, cpu_forward_is_causal_and_checks_ids) {
    ModelConfig c;
    char err[256];
    const char *js = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":48,\"intermediate_size\":80,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
                     "\"vocab_size\":50,\"max_position_embeddings\":64,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,"
                     "\"tie_word_embeddings\":true}";
    cr_assert_eq(hf_config_parse(js, "test", &c, err, sizeof err), 0, "%s", err);
    CpuModel m;
    cpu_model_random(&c, 9, &m);
    int ids[9] = {3, 14, 15, 9, 26, 5, 35, 8, 49};
    float *a = malloc(9 * 50 * 4), *b = malloc(5 * 50 * 4);
    cr_assert_eq(forward_cpu(&m, ids, 9, a, NULL), 0);
    cr_assert_eq(forward_cpu(&m, ids, 5, b, NULL), 0);
    ErrStats e = compare_f32(b, a, 5 * 50);
    cr_expect(e.max_rel < 1e-5, "the first 5 positions moved when 4 tokens were appended: %.3e", e.max_rel);
    int bad[2] = {1, 50};
    cr_expect_neq(forward_cpu(&m, bad, 2, a, NULL), 0, "id 50 with vocab 50 was accepted");
    free(a), free(b);
    cpu_model_free(&m);
}

Test(step02, gpu_attention_matches_cpu) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    Rng r;
    rng_seed(&r, 37);
    const StDtype dts[3] = {ST_F32, ST_F16, ST_BF16};
    for (size_t s = 0; s < sizeof attn_shapes / sizeof attn_shapes[0]; s++)
        for (int di = 0; di < 3; di++) {
            int T = attn_shapes[s][0], H = attn_shapes[s][1], KV = attn_shapes[s][2], hd = attn_shapes[s][3];
            size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd;
            float *q = rng_new_uniform(&r, nq, -1.0f, 1.0f), *k = rng_new_uniform(&r, nk, -1.0f, 1.0f), *v = rng_new_uniform(&r, nk, -1.0f, 1.0f), *o = malloc(nq * 4);
            double *ref = malloc(nq * 8);
            cr_assert_eq(attention_gpu_check(q, k, v, T, H, KV, hd, dts[di], o), 0);
            attention_ref(q, k, v, T, H, KV, hd, ref);
            ErrStats e = compare_f32_f64(o, ref, nq);
            double tol = dts[di] == ST_F32 ? ERR_TOL_FP32 * 10 : ERR_TOL_HALF * 2;
            cr_expect(e.n_bad == 0 && e.max_rel < tol, "gpu attention %s T=%d H=%d KV=%d hd=%d: max_rel %.3e (tol %.0e)",
                      st_dtype_name(dts[di]), T, H, KV, hd, e.max_rel, tol);
            free(q), free(k), free(v), free(o), free(ref);
        }
}

// ---------------------------------------------------------------- full model vs goldens

static int load_npy_ids(const char *path, int **ids) {
    NpyArray a;
    if (npy_load(path, &a) != 0) return -1;
    *ids = malloc(a.count * sizeof(int));
    for (size_t i = 0; i < a.count; i++)
        (*ids)[i] = !strcmp(a.dtype, "<i4") ? ((int32_t *)a.data)[i] : (int)((int64_t *)a.data)[i];
    int n = (int)a.count;
    npy_free(&a);
    return n;
}

// max|out - ref| / max|ref|
static double rel_to_max(const float *out, const float *ref, size_t n) {
    double mx = 0, md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)out[i] - ref[i]);
        if (!(d <= md)) md = d;  // NaN wins
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
    }
    return md / mx;
}

static const int golden_T[] = {1, 7, 33};

typedef struct {
    const char *name;
    int is_bf16, use_cuda, vocab;
    const CpuModel *cm;
    GpuModel *gm;
} Run;

// One prompt: our logits vs gold (transformers in the checkpoint's dtype) and, for bf16, vs
// ref32 (transformers in f32 on the same bf16 weights; NULL if absent). Returns our logits
// (CPU, or GPU when use_cuda) for further checks; the caller frees them.
static float *check_prompt(const Run *r, const int *ids, int T, const NpyArray *gold, const NpyArray *ref32,
                           const char *label) {
    cr_assert(gold->ndim == 2 && (int)gold->shape[0] == T && (int)gold->shape[1] == r->vocab, "%s %s: golden shape",
              r->name, label);
    const size_t nl = (size_t)T * r->vocab;
    float *cpu = malloc(nl * 4), *gpu = malloc(nl * 4);
    for (size_t j = 0; j < nl; j++) cpu[j] = gpu[j] = NAN;  // poison: an unwritten logit fails
    cr_assert_eq(forward_cpu(r->cm, ids, T, cpu, NULL), 0);
    if (!r->use_cuda) {
        double e = rel_to_max(cpu, gold->data, nl);
        double tol = r->is_bf16 ? TOL_BF16 : TOL_F32;
        cr_expect(e <= tol, "%s %s cpu vs transformers %s: %.3e > %.0e", r->name, label, r->is_bf16 ? "bf16" : "f32",
                  e, tol);
        double e32 = ref32 ? rel_to_max(cpu, ref32->data, nl) : NAN;
        if (ref32)
            cr_expect(e32 <= TOL_F32, "%s %s cpu vs transformers f32 on the bf16 weights: %.3e > %.0e", r->name, label,
                      e32, TOL_F32);
        fprintf(stderr, "[golden] %s %s cpu: vs transformers %.2e%s", r->name, label, e, ref32 ? "" : "\n");
        if (ref32) fprintf(stderr, ", vs f32ref %.2e\n", e32);
        free(gpu);
        return cpu;
    }
    cr_assert_eq(forward_cuda(r->gm, ids, T, gpu, NULL), 0);
    double tol = r->is_bf16 ? TOL_BF16 : TOL_F32;
    double e = rel_to_max(gpu, gold->data, nl), ec = rel_to_max(gpu, cpu, nl);
    cr_expect(e <= tol, "%s %s gpu vs transformers: %.3e > %.0e", r->name, label, e, tol);
    cr_expect(ec <= tol, "%s %s gpu vs cpu: %.3e > %.0e", r->name, label, ec, tol);
    fprintf(stderr, "[golden] %s %s gpu: vs transformers %.2e, vs cpu %.2e\n", r->name, label, e, ec);
    free(cpu);
    return gpu;
}

// The 39-token sequence prompt_T7 + the 32 tokens transformers generated greedily: one
// uncached forward over it must give logits_full.npy, and its argmax at each generated position
// must follow the vLLM rule against greedy.json: identical until the first difference, where
// each side's token is in the other's top-5 (then stop: the sequences have diverged).
static void check_full(const Run *r, const char *dir) {
    Golden g;
    if (!golden_read(dir, &g, 0)) return;  // older goldens without greedy.json
    const int np = g.np, ng = g.ng, T = np + ng;
    int *ids = malloc((size_t)T * sizeof(int));
    memcpy(ids, g.prompt, (size_t)np * sizeof(int));
    memcpy(ids + np, g.gen, (size_t)ng * sizeof(int));
    char p[700];
    NpyArray gold, ref32;
    snprintf(p, sizeof p, "%.300s/goldens/logits_full.npy", dir);
    cr_assert_eq(npy_load(p, &gold), 0, "%s", p);
    snprintf(p, sizeof p, "%.300s/goldens/logits_full_f32ref.npy", dir);
    const int have32 = r->is_bf16 && npy_load(p, &ref32) == 0;
    char label[32];
    snprintf(label, sizeof label, "full T=%d", T);
    float *ours = check_prompt(r, ids, T, &gold, have32 ? &ref32 : NULL, label);
    int *best = malloc((size_t)ng * sizeof(int)), *best5 = malloc((size_t)ng * 5 * sizeof(int));
    for (int i = 0; i < ng; i++) {  // position np-1+i predicts generated token i
        forward_topk(ours + (size_t)(np - 1 + i) * r->vocab, r->vocab, 5, best5 + 5 * i);
        best[i] = best5[5 * i];
    }
    char what[400];
    snprintf(what, sizeof what, "%s %s greedy vs transformers", r->name, r->use_cuda ? "gpu" : "cpu");
    const int agreed = vllm_expect(what, best, best5, g.gen, g.top5, ng);
    fprintf(stderr, "[greedy] %s %s: %d of %d greedy tokens identical before the first difference\n", r->name,
            r->use_cuda ? "gpu" : "cpu", agreed, ng);
    free(ours);
    free(ids);
    free(best), free(best5);
    npy_free(&gold);
    if (have32) npy_free(&ref32);
    golden_free(&g);
}

// Run every checkpoint's golden prompts on the CPU (use_cuda 0) or the GPU and check them.
static void check_goldens(int use_cuda) {
    Ckpt ck[64];
    int n = ckpt_list(ck, 64, "goldens");
    if (n == 0) cr_skip_test("no checkpoints with goldens under %s (tools/make_goldens.py)", MODELS_DIR);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        char err[512];
        ModelWeights w;
        cr_assert_eq(model_load(ck[i].dir, &w, err, sizeof err), 0, "%s: %s", ck[i].dir, err);
        CpuModel cm;
        cr_assert_eq(cpu_model_load(&w, &cm, err, sizeof err), 0, "%s: %s", ck[i].dir, err);
        Run r = {ck[i].name, w.layers[0].wq->dtype == ST_BF16, use_cuda, w.cfg.vocab, &cm, NULL};
        if (use_cuda) {
            r.gm = gpu_model_load(&w, err, sizeof err);
            cr_assert(r.gm, "%s: %s", ck[i].dir, err);
        }
        for (size_t ti = 0; ti < sizeof golden_T / sizeof golden_T[0]; ti++) {
            char p[700], label[32];
            int *ids = NULL;
            snprintf(p, sizeof p, "%.300s/goldens/prompt_T%d.npy", ck[i].dir, golden_T[ti]);
            int T = load_npy_ids(p, &ids);
            if (T < 0) continue;
            NpyArray gold, ref32;
            snprintf(p, sizeof p, "%.300s/goldens/logits_T%d.npy", ck[i].dir, golden_T[ti]);
            cr_assert_eq(npy_load(p, &gold), 0, "%s", p);
            snprintf(p, sizeof p, "%.300s/goldens/logits_T%d_f32ref.npy", ck[i].dir, golden_T[ti]);
            const int have32 = r.is_bf16 && npy_load(p, &ref32) == 0;
            snprintf(label, sizeof label, "T=%d", T);
            free(check_prompt(&r, ids, T, &gold, have32 ? &ref32 : NULL, label));
            checked++;
            if (have32) npy_free(&ref32);
            npy_free(&gold);
            free(ids);
        }
        check_full(&r, ck[i].dir);
        cpu_model_free(&cm);
        if (r.gm) gpu_model_free(r.gm);
        model_free(&w);
    }
    cr_expect(checked > 0, "no golden prompts found");
}

Test(step02, cpu_logits_match_transformers_goldens, .timeout = 300) { check_goldens(0); }

Test(step02, gpu_logits_match_transformers_goldens_and_cpu, .timeout = 300) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) cr_skip_test("no CUDA device: %s", gi.reason);
    check_goldens(1);
}
