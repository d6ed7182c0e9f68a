// fused_bench.c — step07's fused-kernel ladders (fused.h): residual add + RMSNorm, SwiGLU, and
// RoPE + paged K/V write, at the hidden sizes of Qwen3-0.6B (1024), Llama-3.2-1B (2048) and
// Llama-3.1-8B (4096) and T = 1, 16, 256, 4096 token rows. Every version of every kernel is first
// checked against the fp32 CPU reference (fused_cpu.c) on fresh random inputs, at an odd shape
// (T = 67 rows, the hidden size + 3: no vector width divides it) and at the timed shape; a
// mismatch stops the program (exit 1) before that version is timed. Then each is timed with CUDA
// events (warm-up, median of --reps samples), on buffers rotated over three times the L2 so
// every call reads from HBM, and reported as GB/s of the bytes the op must move and as % of the
// device copy bandwidth measured in the same run (step01's roofline_gpu_bandwidth).
//
//   build/bin/fused_bench [--kernel all|addnorm|swiglu|rope] [--dtype bf16|fp16|fp32] [--residual-f32]
//                         [--models 0.6b,1b,8b] [--tokens 1,16,256,4096] [--reps 20] [--csv|--json]
//   build/bin/fused_bench --quick     (one model, T = 1 and 256: the demo)
//   build/bin/fused_bench --launches  (only the launches-per-decode-step table)
//
// Bytes counted (what the op must move, the same for every version of a kernel):
//   addnorm  read x, read residual, write residual (3 * T * n * es_res), write out (T * n * es_out),
//            read w once (n * 4)
//   swiglu   read gate|up (T * 2ff * es_in), write h (T * ff * es_out)
//   rope     read q, k, v rows (fp32) and cos, sin; write q back (fp32); write k, v to the cache
//            rows of the non-padding rows (cache dtype)
// Without a GPU the program checks the CPU references alone (properties that hold whatever the
// code: residual = round(x + r), mean(out^2) / mean(w^2) ~ 1, rotations keep every pair's norm,
// padding rows untouched) and says the CUDA rows were skipped.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "check.h"
#include "compare.h"
#include "gpu.h"
#include "rng.h"
#include "step01_matmul/roofline_gpu.h"
#include "step05_paged/paged_attention.h"  // pa_dev_alloc, pa_upload_as, pa_download_f32, ...
#include "step07_kernels/fused.h"
#include "table.h"

// ---------------------------------------------------------------- the model shapes
typedef struct {
    const char *id, *name;
    int layers, hidden, heads, kv_heads, head_dim, ff, qk_norm;
} Shape;
static const Shape SHAPES[] = {
    {"0.6b", "Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 1},
    {"1b", "Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 0},
    {"8b", "Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 0},
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static void usage(FILE *f) {
    fprintf(f,
            "usage: fused_bench [--kernel all|addnorm|swiglu|rope] [--dtype bf16|fp16|fp32] [--residual-f32]\n"
            "                   [--models 0.6b,1b,8b] [--tokens 1,16,256,4096] [--reps R] [--warmup W]\n"
            "                   [--copy-gbps X] [--seed S] [--quick] [--launches] [--csv | --json]\n"
            "  --kernel        which ladder (default all)\n"
            "  --dtype         activation / cache dtype (default bf16)\n"
            "  --residual-f32  the engine's layout: an fp32 residual stream and fp32 GEMM outputs (add+RMSNorm\n"
            "                  reads x and the residual in fp32 and writes out in --dtype; SwiGLU reads fp32)\n"
            "  --models        shapes: 0.6b (Qwen3-0.6B, hidden 1024), 1b (Llama-3.2-1B, 2048), 8b (Llama-3.1-8B, 4096)\n"
            "  --tokens        token rows T (default 1,16,256,4096)\n"
            "  --reps          timed samples per version, median reported (default 20, at least 20), after --warmup\n"
            "                  (default 10)\n"
            "  --copy-gbps     the bandwidth ceiling (default: measured now, device copy, read + write counted)\n"
            "  --quick         the demo: the 1b shape at T = 1 and 256\n"
            "  --launches      print only the kernel launches per decode step (no GPU needed)\n");
}

static const char *dt_str(StDtype d) { return d == ST_F32 ? "fp32" : d == ST_F16 ? "fp16" : "bf16"; }
static size_t dt_size(StDtype d) { return d == ST_F32 ? 4 : 2; }
static double tol_for(StDtype d) { return d == ST_F32 ? ERR_TOL_FP32 : ERR_TOL_HALF; }

// ---------------------------------------------------------------- launches per decode step
// A batch-1 decode step of a Llama-family model, kernel by kernel, three ways. The counts come from
// the layer structure (the kernels each way launches per layer, then per step: embed, the final
// norm, lm_head, argmax), so they are exact for those structures:
//   op_per_kernel  every op its own kernel, as transformers eager or step02's forward lays a layer
//                  out: rmsnorm, qkv GEMM, [q-norm, k-norm], rope, kv write, attention (split +
//                  combine), o GEMM, residual add, rmsnorm, gate|up GEMM, SwiGLU, down GEMM,
//                  residual add
//   step07_fused   the same with step07's kernels: each residual add fused into the next norm
//                  (vLLM's fused_add_rms_norm; the last add into the final norm), RoPE + K/V write
//                  one kernel
//   step03_today   step03's decode graph as it is (decode_gpu.cu): the residual adds already sit in
//                  the o / down GEMV epilogues and the q/k norms, RoPE and K/V write in one
//                  k_rope_append, so: rmsnorm, qkv GEMV, rope_append, attn split, attn combine, o
//                  GEMV, rmsnorm, gate|up GEMV, SwiGLU, down GEMV
static void launches_table(OutFmt fmt) {
    Table *t = table_new("step07 kernel launches per batch-1 decode step (dense bf16 model, counted from the layer structure)");
    table_std_meta(t);
    table_meta(t, "op_per_kernel", "rmsnorm, qkv GEMM, [q-norm, k-norm], rope, kv write, attn split, attn combine, o GEMM, "
               "add, rmsnorm, gate|up GEMM, SwiGLU, down GEMM, add; + embed, final norm, lm_head, argmax");
    table_meta(t, "step07_fused", "add+rmsnorm, qkv GEMM, [q-norm, k-norm], rope+kv write, attn split, attn combine, o GEMM, "
               "add+rmsnorm, gate|up GEMM, SwiGLU, down GEMM; + embed, final add+norm, lm_head, argmax");
    table_meta(t, "step03_today", "rmsnorm, qkv GEMV, rope_append (q/k norm + RoPE + KV write), attn split, attn combine, "
               "o GEMV (+ residual), rmsnorm, gate|up GEMV, SwiGLU, down GEMV (+ residual); + embed, final norm, lm_head, argmax");
    table_col(t, "model", NULL);
    table_col(t, "layers", "%.0f");
    table_col(t, "structure", NULL);
    table_col(t, "per_layer", "%.0f");
    table_col(t, "per_step", "%.0f");
    table_col(t, "vs_op_per_kernel", "%.2f");
    for (int s = 0; s < N_SHAPES; s++) {
        const Shape *m = &SHAPES[s];
        const int qk = m->qk_norm ? 2 : 0;
        const int per[3] = {13 + qk, 10 + qk, 10};
        const char *names[3] = {"op_per_kernel", "step07_fused", "step03_today"};
        for (int k = 0; k < 3; k++) {
            const int step = per[k] * m->layers + 4;
            table_row(t);
            table_str(t, "model", m->name);
            table_num(t, "layers", m->layers);
            table_str(t, "structure", names[k]);
            table_num(t, "per_layer", per[k]);
            table_num(t, "per_step", step);
            table_num(t, "vs_op_per_kernel", (double)step / (per[0] * m->layers + 4));
        }
    }
    table_print(t, fmt, stdout);
    table_free(t);
}

// ---------------------------------------------------------------- inputs and the checks
typedef enum { K_ADDNORM = 0, K_SWIGLU = 1, K_ROPE = 2 } Kernel;
static const char *KNAME[] = {"addnorm", "swiglu", "rope_kv"};

typedef struct {
    Kernel k;
    int version;
    StDtype rdt, odt;  // addnorm: residual / out; swiglu: in / out; rope: cache dtype in rdt
    int T, n;          // rows; hidden (addnorm), ff (swiglu)
    int H, KV, hd;     // rope
    int pool;          // rope: cache rows
    int nrot, cur;     // rotated buffer sets, the one the next call uses
    size_t set_a, set_b, set_c;  // elements per set of the device arrays a, b, c
    void *a, *b, *c;   // addnorm: x, residual, out; swiglu: gu, h; rope: qkv, kc, vc
    float *w;          // addnorm weight; rope: cos table
    float *sn;         // rope: sin table
    int *slots;        // rope: (nrot, T)
    int failed;
} Run;

static void run_once(void *p) {
    Run *r = p;
    const int i = r->cur;
    r->cur = (r->cur + 1) % r->nrot;
    const size_t ea = dt_size(r->k == K_ROPE ? ST_F32 : r->rdt);
    int rc;
    if (r->k == K_ADDNORM) {
        const size_t eo = dt_size(r->odt);
        rc = fused_add_rmsnorm(r->version, r->rdt, r->odt, (char *)r->a + i * r->set_a * ea, (char *)r->b + i * r->set_b * ea,
                               r->w, r->T, r->n, 1e-6f, (char *)r->c + i * r->set_c * eo, NULL);
    } else if (r->k == K_SWIGLU) {
        rc = fused_swiglu(r->version, r->rdt, r->odt, (char *)r->a + i * r->set_a * ea,
                          (char *)r->b + i * r->set_b * dt_size(r->odt), r->T, r->n, NULL);
    } else {
        rc = fused_rope_kv_write(r->version, r->rdt, (float *)r->a + i * r->set_a, r->T, r->H, r->KV, r->hd,
                                 r->w + (size_t)i * r->T * (r->hd / 2), r->sn + (size_t)i * r->T * (r->hd / 2),
                                 r->slots + (size_t)i * r->T, r->b, r->c, NULL);
    }
    if (rc < 0) r->failed = 1;
}

static float *rounded(Rng *g, size_t n, float lo, float hi, StDtype dt) {
    float *x = rng_new_uniform(g, n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = fused_round(dt, x[i]);
    return x;
}

// Fill a device array of `sets` sets of n elements in dt with fresh values in [lo, hi) (host
// copy of set 0 returned: what the check's reference starts from).
static float *fill_sets(Rng *g, void *dev, StDtype dt, size_t n, int sets, float lo, float hi) {
    float *h0 = rounded(g, n, lo, hi, dt);
    if (pa_upload_as(dt, dev, h0, n)) die("upload failed");
    if (sets > 1) {
        const size_t rest = n * (size_t)(sets - 1);
        float *h = rng_new_uniform(g, rest, lo, hi);
        if (pa_upload_as(dt, (char *)dev + n * dt_size(dt), h, rest)) die("upload failed");
        free(h);
    }
    return h0;
}

// Worst relative error of out vs ref (infinite on a NaN); `bad` counts exact mismatches.
static double rel_err(const float *out, const float *ref, size_t n) {
    ErrStats e = compare_f32(out, ref, n);
    return e.n_bad ? INFINITY : e.max_rel;
}

// cos / sin tables (T, hd/2) of random positions in [0, 4096), theta 500000 (Llama 3).
static void rope_tables(Rng *g, int T, int hd, float *c, float *s) {
    const int half = hd / 2;
    for (int t = 0; t < T; t++) {
        const int pos = (int)(rng_u32(g) % 4096);
        for (int e = 0; e < half; e++) {
            const float inv_freq = (float)pow(500000.0, -2.0 * e / hd);
            const float ang = (float)pos * inv_freq;
            c[(size_t)t * half + e] = (float)cos((double)ang), s[(size_t)t * half + e] = (float)sin((double)ang);
        }
    }
}

// Slots of T rows into a pool of `pool` rows: distinct shuffled rows, every 7th row padding (-1).
static void make_slots(Rng *g, int T, int pool, int *slots) {
    int *perm = xmalloc((size_t)pool * sizeof(int));
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        const int j = (int)(rng_u32(g) % (uint32_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    for (int t = 0; t < T; t++) slots[t] = t % 7 == 6 ? -1 : perm[t];
    free(perm);
}

#define SENTINEL 3.5f  // what an untouched cache row holds (exact in every dtype)

// Allocate r's buffers for nrot sets, fill them, run set 0 once and compare it with the CPU
// reference. Returns the worst relative error (INFINITY on an inexact residual or a touched
// padding row); r->a.. stay allocated for the timing.
static double setup_and_check(Run *r, Rng *g) {
    const int T = r->T, n = r->n;
    double err = 0;
    if (r->k == K_ADDNORM) {
        r->set_a = r->set_b = r->set_c = (size_t)T * n;
        r->a = pa_dev_alloc(r->set_a * r->nrot * dt_size(r->rdt)), r->b = pa_dev_alloc(r->set_b * r->nrot * dt_size(r->rdt));
        r->c = pa_dev_alloc(r->set_c * r->nrot * dt_size(r->odt)), r->w = pa_dev_alloc((size_t)n * 4);
        if (!r->a || !r->b || !r->c || !r->w) die("out of device memory");
        float *x = fill_sets(g, r->a, r->rdt, r->set_a, r->nrot, -1, 1), *res = fill_sets(g, r->b, r->rdt, r->set_b, r->nrot, -1, 1);
        float *w = rng_new_uniform(g, (size_t)n, 0.5f, 1.5f);
        pa_upload(r->w, w, (size_t)n * 4);
        float *ref = xmalloc(r->set_c * 4), *out = xmalloc(r->set_c * 4), *res_out = xmalloc(r->set_b * 4);
        fused_add_rmsnorm_cpu(r->rdt, r->odt, x, res, w, T, n, 1e-6f, ref);
        r->cur = 0;
        run_once(r);
        if (r->failed || pa_sync()) die("%s v%d: launch failed", KNAME[r->k], r->version);
        pa_download_f32(r->odt, out, r->c, r->set_c), pa_download_f32(r->rdt, res_out, r->b, r->set_b);
        err = rel_err(out, ref, r->set_c);
        if (memcmp(res_out, res, r->set_b * 4)) err = INFINITY;  // the residual is exact: round(x + r)
        free(x), free(res), free(w), free(ref), free(out), free(res_out);
    } else if (r->k == K_SWIGLU) {
        r->set_a = (size_t)T * 2 * n, r->set_b = (size_t)T * n;
        r->a = pa_dev_alloc(r->set_a * r->nrot * dt_size(r->rdt)), r->b = pa_dev_alloc(r->set_b * r->nrot * dt_size(r->odt));
        if (!r->a || !r->b) die("out of device memory");
        float *gu = fill_sets(g, r->a, r->rdt, r->set_a, r->nrot, -6, 6);
        float *ref = xmalloc(r->set_b * 4), *out = xmalloc(r->set_b * 4);
        fused_swiglu_cpu(r->rdt, r->odt, gu, ref, T, n);
        r->cur = 0;
        run_once(r);
        if (r->failed || pa_sync()) die("%s v%d: launch failed", KNAME[r->k], r->version);
        pa_download_f32(r->odt, out, r->b, r->set_b);
        err = rel_err(out, ref, r->set_b);
        free(gu), free(ref), free(out);
    } else {
        const int H = r->H, KV = r->KV, hd = r->hd, half = hd / 2, ld = (H + 2 * KV) * hd, kd = KV * hd;
        r->set_a = (size_t)T * ld;
        r->pool = T * r->nrot + 5;
        r->a = pa_dev_alloc(r->set_a * r->nrot * 4);
        r->b = pa_dev_alloc((size_t)r->pool * kd * dt_size(r->rdt)), r->c = pa_dev_alloc((size_t)r->pool * kd * dt_size(r->rdt));
        r->w = pa_dev_alloc((size_t)r->nrot * T * half * 4), r->sn = pa_dev_alloc((size_t)r->nrot * T * half * 4);
        r->slots = pa_dev_alloc((size_t)r->nrot * T * 4);
        if (!r->a || !r->b || !r->c || !r->w || !r->sn || !r->slots) die("out of device memory");
        float *qkv = fill_sets(g, r->a, ST_F32, r->set_a, r->nrot, -1, 1);
        float *ct = xmalloc((size_t)r->nrot * T * half * 4), *st = xmalloc((size_t)r->nrot * T * half * 4);
        int *sl = xmalloc((size_t)r->nrot * T * sizeof(int));
        rope_tables(g, r->nrot * T, hd, ct, st);
        // set i's rows go to pool rows i*T .. (set 0's shuffled over the first T + 5 rows)
        make_slots(g, T, T + 5, sl);
        for (int i = 1; i < r->nrot; i++)
            for (int t = 0; t < T; t++) sl[(size_t)i * T + t] = t % 7 == 6 ? -1 : 5 + i * T + t;
        pa_upload(r->w, ct, (size_t)r->nrot * T * half * 4), pa_upload(r->sn, st, (size_t)r->nrot * T * half * 4);
        pa_upload(r->slots, sl, (size_t)r->nrot * T * 4);
        const size_t cn = (size_t)r->pool * kd;
        float *kc = xmalloc(cn * 4), *vc = xmalloc(cn * 4), *dk = xmalloc(cn * 4), *dv = xmalloc(cn * 4);
        for (size_t i = 0; i < cn; i++) kc[i] = vc[i] = SENTINEL;
        pa_upload_as(r->rdt, r->b, kc, cn), pa_upload_as(r->rdt, r->c, vc, cn);
        float *ref_qkv = xmalloc(r->set_a * 4), *out_qkv = xmalloc(r->set_a * 4);
        memcpy(ref_qkv, qkv, r->set_a * 4);
        fused_rope_kv_write_cpu(r->rdt, ref_qkv, T, H, KV, hd, ct, st, sl, kc, vc);
        r->cur = 0;
        run_once(r);
        if (r->failed || pa_sync()) die("%s v%d: launch failed", KNAME[r->k], r->version);
        pa_download(out_qkv, r->a, r->set_a * 4);
        pa_download_f32(r->rdt, dk, r->b, cn), pa_download_f32(r->rdt, dv, r->c, cn);
        // q heads of every row (v0 also rotates k in qkv: not part of the contract)
        float *q_out = xmalloc((size_t)T * H * hd * 4), *q_ref = xmalloc((size_t)T * H * hd * 4);
        for (int t = 0; t < T; t++) {
            memcpy(q_out + (size_t)t * H * hd, out_qkv + (size_t)t * ld, (size_t)H * hd * 4);
            memcpy(q_ref + (size_t)t * H * hd, ref_qkv + (size_t)t * ld, (size_t)H * hd * 4);
        }
        err = rel_err(q_out, q_ref, (size_t)T * H * hd);
        const double ek = rel_err(dk, kc, cn), ev = rel_err(dv, vc, cn);
        if (ek > err) err = ek;
        if (ev > err) err = ev;
        // rows no slot names (padding rows' targets included) must still hold the sentinel, exactly
        char *used = calloc((size_t)r->pool, 1);
        for (int t = 0; t < T; t++)
            if (sl[t] >= 0) used[sl[t]] = 1;
        for (int p = 0; p < T + 5; p++)
            if (!used[p])
                for (int e = 0; e < kd; e++)
                    if (dk[(size_t)p * kd + e] != SENTINEL || dv[(size_t)p * kd + e] != SENTINEL) err = INFINITY;
        free(used), free(q_out), free(q_ref), free(qkv), free(ct), free(st), free(sl), free(kc), free(vc), free(dk);
        free(dv), free(ref_qkv), free(out_qkv);
    }
    return err;
}

static void free_run(Run *r) {
    void *p[] = {r->a, r->b, r->c, r->w, r->sn, r->slots};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) pa_dev_free(p[i]);
    r->a = r->b = r->c = NULL, r->w = r->sn = NULL, r->slots = NULL;
}

// Bytes the op must move (the same for every version).
static double op_bytes(const Run *r) {
    const double T = r->T, n = r->n;
    if (r->k == K_ADDNORM) return 3.0 * T * n * dt_size(r->rdt) + T * n * dt_size(r->odt) + n * 4.0;
    if (r->k == K_SWIGLU) return T * 2 * n * dt_size(r->rdt) + T * n * dt_size(r->odt);
    const double half = r->hd / 2.0, kvrows = T - (double)(r->T / 7);  // every 7th row is padding
    return T * (r->H + 2.0 * r->KV) * r->hd * 4 + T * half * 8 + T * r->H * r->hd * 4 + kvrows * 2.0 * r->KV * r->hd * dt_size(r->rdt);
}

static int nversions(Kernel k) {
    return k == K_ADDNORM ? FUSED_ADDNORM_VERSIONS : k == K_SWIGLU ? FUSED_SWIGLU_VERSIONS : FUSED_ROPE_VERSIONS;
}
static const FusedVersion *ladder(Kernel k) {
    return k == K_ADDNORM ? fused_addnorm_ladder : k == K_SWIGLU ? fused_swiglu_ladder : fused_rope_ladder;
}

static Run make_run(Kernel k, int version, const Shape *m, int T, StDtype dt, int res_f32) {
    Run r = {0};
    r.k = k, r.version = version, r.T = T, r.nrot = 1;
    if (k == K_ADDNORM) r.rdt = res_f32 ? ST_F32 : dt, r.odt = dt, r.n = m->hidden;
    else if (k == K_SWIGLU) r.rdt = res_f32 ? ST_F32 : dt, r.odt = dt, r.n = m->ff;
    else r.rdt = dt, r.odt = dt, r.H = m->heads, r.KV = m->kv_heads, r.hd = m->head_dim;
    return r;
}

// ---------------------------------------------------------------- without a GPU: the references alone
static void cpu_row(Table *t, Kernel k, const Shape *m, int T, int n, const char *check, double value, int ok) {
    table_row(t);
    table_str(t, "kernel", KNAME[k]), table_str(t, "model", m->name), table_num(t, "T", T), table_num(t, "n", n);
    table_str(t, "check", check), table_num(t, "value", value), table_str(t, "result", ok ? "ok" : "FAILED");
}

// want[k]: kernel k was asked for (--kernel); the shapes of --models.
static int cpu_checks(Table *t, StDtype dt, int res_f32, uint64_t seed, const int *want, const int *model_ids,
                      int nmodels) {
    Rng g;
    rng_seed(&g, seed);
    int failed = 0;
    const StDtype rdt = res_f32 ? ST_F32 : dt;
    for (int mi = 0; mi < nmodels; mi++) {
        const Shape *m = &SHAPES[model_ids[mi]];
        const int T = 67, n = m->hidden + 3;
        if (want[K_ADDNORM]) {  // add + RMSNorm: residual == round(x + r) exactly; w = 1: mean(out^2) = 1
            float *x = rounded(&g, (size_t)T * n, -1, 1, rdt), *res = rounded(&g, (size_t)T * n, -1, 1, rdt);
            float *res0 = xmalloc((size_t)T * n * 4), *w = xmalloc((size_t)n * 4), *out = xmalloc((size_t)T * n * 4);
            memcpy(res0, res, (size_t)T * n * 4);
            for (int i = 0; i < n; i++) w[i] = 1.0f;
            fused_add_rmsnorm_cpu(rdt, dt, x, res, w, T, n, 0.0f, out);
            size_t bad = 0;
            double worst = 0;
            for (size_t i = 0; i < (size_t)T * n; i++) bad += res[i] != fused_round(rdt, x[i] + res0[i]);
            for (int r = 0; r < T; r++) {
                double ms = 0;
                for (int i = 0; i < n; i++) ms += (double)out[(size_t)r * n + i] * out[(size_t)r * n + i];
                if (fabs(ms / n - 1) > worst) worst = fabs(ms / n - 1);
            }
            const int ok1 = bad == 0 && worst < (dt == ST_F32 ? 1e-5 : 2e-2);
            failed |= !ok1;
            cpu_row(t, K_ADDNORM, m, T, n, "residual == round(x + r); |mean(out^2) - 1| with w = 1",
                    bad ? INFINITY : worst, ok1);
            free(x), free(res), free(res0), free(w), free(out);
        }
        if (want[K_SWIGLU]) {  // SwiGLU: h == silu(g) * u recomputed here in double (then rounded)
            const int ff = m->ff + 3;
            float *gu = rounded(&g, (size_t)T * 2 * ff, -6, 6, rdt), *h = xmalloc((size_t)T * ff * 4);
            fused_swiglu_cpu(rdt, dt, gu, h, T, ff);
            double e2 = 0;
            for (int r = 0; r < T; r++)
                for (int j = 0; j < ff; j++) {
                    const double gv = gu[(size_t)r * 2 * ff + j], uv = gu[(size_t)r * 2 * ff + ff + j];
                    const double ref = gv / (1 + exp(-gv)) * uv, got = h[(size_t)r * ff + j];
                    const double d = fabs(got - ref) / (fabs(ref) + 1e-3);
                    if (d > e2) e2 = d;
                }
            const int ok2 = e2 < (dt == ST_F32 && rdt == ST_F32 ? 1e-5 : 2e-2);
            failed |= !ok2;
            cpu_row(t, K_SWIGLU, m, T, ff, "max |h - silu(g) u| / (|silu(g) u| + 1e-3), double recomputation", e2,
                    ok2);
            free(gu), free(h);
        }
        if (want[K_ROPE]) {  // RoPE + K/V write: rotated pairs keep their norms; padding rows leave the pool
            const int H = m->heads, KV = m->kv_heads, hd = m->head_dim, half = hd / 2;
            const int ld = (H + 2 * KV) * hd, kd = KV * hd;
            const int pool = T + 5;
            float *qkv = rng_new_uniform(&g, (size_t)T * ld, -1, 1), *q0 = xmalloc((size_t)T * ld * 4);
            memcpy(q0, qkv, (size_t)T * ld * 4);
            float *ct = xmalloc((size_t)T * half * 4), *st = xmalloc((size_t)T * half * 4);
            float *kc = xmalloc((size_t)pool * kd * 4), *vc = xmalloc((size_t)pool * kd * 4);
            int *sl = xmalloc((size_t)T * sizeof(int));
            rope_tables(&g, T, hd, ct, st);
            make_slots(&g, T, pool, sl);
            for (size_t i = 0; i < (size_t)pool * kd; i++) kc[i] = vc[i] = SENTINEL;
            fused_rope_kv_write_cpu(ST_F32, qkv, T, H, KV, hd, ct, st, sl, kc, vc);
            double e3 = 0;
            for (int r = 0; r < T; r++)
                for (int h = 0; h < H + KV; h++) {
                    if (h >= H && sl[r] < 0) continue;
                    const float *a = q0 + (size_t)r * ld + (size_t)h * hd;
                    const float *b = h < H ? qkv + (size_t)r * ld + (size_t)h * hd
                                           : kc + (size_t)sl[r] * kd + (size_t)(h - H) * hd;
                    for (int e = 0; e < half; e++) {
                        const double n0 = hypot(a[e], a[e + half]), n1 = hypot(b[e], b[e + half]);
                        if (fabs(n1 - n0) > e3) e3 = fabs(n1 - n0);
                    }
                }
            char *used = calloc((size_t)pool, 1);
            for (int r = 0; r < T; r++)
                if (sl[r] >= 0) used[sl[r]] = 1;
            for (int p = 0; p < pool; p++)
                if (!used[p])
                    for (int e = 0; e < kd; e++)
                        if (kc[(size_t)p * kd + e] != SENTINEL || vc[(size_t)p * kd + e] != SENTINEL) e3 = INFINITY;
            const int ok3 = e3 < 1e-5;
            failed |= !ok3;
            cpu_row(t, K_ROPE, m, T, hd, "max | |rotated pair| - |pair| |; padding rows' cache rows untouched", e3,
                    ok3);
            free(qkv), free(q0), free(ct), free(st), free(kc), free(vc), free(sl), free(used);
        }
    }
    return failed;
}

// ---------------------------------------------------------------- main
int main(int argc, char **argv) {
    Kernel kernels[3] = {K_ADDNORM, K_SWIGLU, K_ROPE};
    int nk = 3, quick = 0, only_launches = 0, res_f32 = 0, reps = 20, warmup = 10;
    StDtype dt = ST_BF16;
    double copy_gbps = 0;
    uint64_t seed = 1234;
    int *tokens = NULL, ntok = 0, model_ids[N_SHAPES] = {0, 1, 2}, nmodels = N_SHAPES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else if (!strcmp(a, "--kernel") && more) {
            const char *v = argv[++i];
            if (!strcmp(v, "all")) nk = 3;
            else if (!strcmp(v, "addnorm")) nk = 1, kernels[0] = K_ADDNORM;
            else if (!strcmp(v, "swiglu")) nk = 1, kernels[0] = K_SWIGLU;
            else if (!strcmp(v, "rope")) nk = 1, kernels[0] = K_ROPE;
            else arg_die("--kernel: '%s' is not one of all, addnorm, swiglu, rope", v);
        } else if (!strcmp(a, "--dtype") && more) {
            const char *v = argv[++i];
            if (!strcmp(v, "bf16")) dt = ST_BF16;
            else if (!strcmp(v, "fp16")) dt = ST_F16;
            else if (!strcmp(v, "fp32")) dt = ST_F32;
            else arg_die("--dtype: '%s' is not one of bf16, fp16, fp32", v);
        } else if (!strcmp(a, "--models") && more) {
            const char *v = argv[++i];
            nmodels = 0;
            for (int s = 0; s < N_SHAPES; s++) {
                const char *p = strstr(v, SHAPES[s].id);
                const size_t l = strlen(SHAPES[s].id);
                while (p && ((p != v && p[-1] != ',') || (p[l] && p[l] != ','))) p = strstr(p + 1, SHAPES[s].id);
                if (p) model_ids[nmodels++] = s;
            }
            if (!nmodels) arg_die("--models: '%s' names none of 0.6b, 1b, 8b", v);
        } else if (!strcmp(a, "--tokens") && more) {
            free(tokens);
            tokens = arg_int_list("--tokens", argv[++i], 1, 65535, &ntok);
        } else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 20, 100000);
        else if (!strcmp(a, "--warmup") && more) warmup = (int)arg_int(a, argv[++i], 0, 100000);
        else if (!strcmp(a, "--copy-gbps") && more) copy_gbps = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--seed") && more) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--residual-f32")) res_f32 = 1;
        else if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--launches")) only_launches = 1;
        else arg_help_or_unknown(a, usage);
    }
    const OutFmt fmt = outfmt_from_args(argc, argv);
    if (only_launches) {
        launches_table(fmt);
        free(tokens);
        return 0;
    }
    static const int DEF_TOKENS[] = {1, 16, 256, 4096}, QUICK_TOKENS[] = {1, 256};
    const int *tok = tokens ? tokens : quick ? QUICK_TOKENS : DEF_TOKENS;
    if (!tokens) ntok = quick ? 2 : 4;
    if (quick && nmodels == N_SHAPES) nmodels = 1, model_ids[0] = 1;

    Table *t = table_new("step07 fused kernels: every version checked against the fp32 CPU reference, then timed");
    table_std_meta(t);
    table_meta(t, "dtype", "%s activations%s", dt_str(dt),
               res_f32 ? "; fp32 residual stream and fp32 GEMM outputs (--residual-f32: the engine's layout)" : "");
    table_meta(t, "rounding", "HF order: residual = round(x + r); out = round(w * round(s * inv_rms)); "
               "h = round(round(silu(g)) * u) (fused.h)");
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        table_meta(t, "device", "none: %s (the CUDA rows are skipped; checking the CPU references alone)", gi.reason);
        table_col(t, "kernel", NULL);
        table_col(t, "model", NULL);
        table_col(t, "T", "%.0f");
        table_col(t, "n", "%.0f");
        table_col(t, "check", NULL);
        table_col(t, "value", "%.2e");
        table_col(t, "result", NULL);
        int want[3] = {0, 0, 0};
        for (int ki = 0; ki < nk; ki++) want[kernels[ki]] = 1;
        const int failed = cpu_checks(t, dt, res_f32, seed, want, model_ids, nmodels);
        table_meta(t, "check", "%s", failed ? "FAILED" : "passed");
        table_print(t, fmt, stdout);
        table_free(t);
        if (fmt == FMT_TEXT) launches_table(fmt);
        free(tokens);
        return failed;
    }
    table_meta(t, "device", "%s (sm_%d%d, %d SMs, L2 %.0f MB)", gi.name, gi.cc_major, gi.cc_minor, gi.sms, gi.l2_bytes / 1e6);
    const char *copy_src;
    copy_gbps = roofline_copy_gbps(copy_gbps, &copy_src, NULL);
    table_meta(t, "copy_gbps", "%.1f (%s)", copy_gbps, copy_src);
    table_meta(t, "timing", "CUDA events, %d warm-up calls, median of %d samples (each sample several back-to-back calls, "
               "launch overhead included); buffers rotated over >= 3x L2 so each call reads HBM", warmup, reps);
    table_meta(t, "check", "before timing, each version vs the fp32 CPU reference at T = 67, n = hidden + 3 (ff + 3 for "
               "SwiGLU) and at the timed shape; tolerance fp32 %.0e, 16-bit %.0e; the residual exact; padding rows untouched",
               ERR_TOL_FP32, ERR_TOL_HALF);
    table_col(t, "kernel", NULL);
    table_col(t, "model", NULL);
    table_col(t, "T", "%.0f");
    table_col(t, "n", "%.0f");
    table_col(t, "dtype", NULL);
    table_col(t, "version", NULL);
    table_col(t, "us", "%.2f");
    table_col(t, "gb_s", "%.1f");
    table_col(t, "pct_copy", "%.1f");
    table_col(t, "x_v0", "%.2f");
    table_col(t, "launches", "%.0f");
    table_col(t, "err_odd", "%.1e");
    table_col(t, "err", "%.1e");

    Rng g;
    rng_seed(&g, seed);
    for (int ki = 0; ki < nk; ki++) {
        const Kernel k = kernels[ki];
        for (int mi = 0; mi < nmodels; mi++) {
            const Shape *m = &SHAPES[model_ids[mi]];
            for (int ti = 0; ti < ntok; ti++) {
                const int T = tok[ti];
                double us_v0 = NAN;
                for (int v = 0; v < nversions(k); v++) {
                    // 1) the odd shape: no vector width divides n, rows not a multiple of anything
                    Run odd = make_run(k, v, m, 67, dt, res_f32);
                    if (k != K_ROPE) odd.n += 3;
                    const double err_odd = setup_and_check(&odd, &g);
                    free_run(&odd);
                    // 2) the timed shape, on rotated buffers
                    Run r = make_run(k, v, m, T, dt, res_f32);
                    const double bytes = op_bytes(&r);
                    r.nrot = (int)ceil(3.0 * gi.l2_bytes / bytes);
                    if (r.nrot < 1) r.nrot = 1;
                    const double err = setup_and_check(&r, &g);
                    const double tol = tol_for(k == K_ROPE ? dt : dt == ST_F32 && r.rdt == ST_F32 ? ST_F32 : ST_BF16);
                    const FusedVersion *fv = &ladder(k)[v];
                    if (!(err_odd <= tol) || !(err <= tol)) {  // stop: nothing after a wrong kernel is timed
                        fprintf(stderr, "fused_bench: %s %s %s T=%d: error %.3g (odd shape %.3g) over the tolerance %.0e "
                                "(or an inexact residual / a touched padding row): stopping before timing it\n",
                                KNAME[k], fv->name, m->name, T, err, err_odd, tol);
                        table_meta(t, "result", "FAILED: %s %s at %s T = %d did not match the reference; nothing after "
                                   "it was timed", KNAME[k], fv->name, m->name, T);
                        table_print(t, fmt, stdout);
                        table_free(t);
                        free_run(&r);
                        free(tokens);
                        return 1;
                    }
                    // back-to-back calls per sample: enough to cover ~20 us
                    const double est_us = bytes / (copy_gbps > 0 ? copy_gbps : 1000) / 1e3 + 4;
                    const int inner = est_us >= 20 ? 1 : (int)ceil(20 / est_us);
                    r.cur = 0;
                    const double ms = gpu_bench(run_once, &r, warmup, reps, inner);
                    if (r.failed || ms <= 0) die("%s %s: a timed launch failed", KNAME[k], fv->name);
                    const double us = ms * 1e3;
                    if (v == 0) us_v0 = us;
                    const int launches = k == K_SWIGLU ? 1 : v == 0 ? 2 : 1;
                    table_row(t);
                    table_str(t, "kernel", KNAME[k]);
                    table_str(t, "model", m->name);
                    table_num(t, "T", T);
                    table_num(t, "n", k == K_ADDNORM ? m->hidden : k == K_SWIGLU ? m->ff : (m->heads + 2 * m->kv_heads) * m->head_dim);
                    char dts[32];
                    snprintf(dts, sizeof dts, "%s%s", r.rdt != r.odt ? "fp32>" : "", dt_str(dt));
                    table_str(t, "dtype", dts);
                    table_str(t, "version", fv->name);
                    table_num(t, "us", us);
                    table_num(t, "gb_s", bytes / (us * 1e-6) / 1e9);
                    table_num(t, "pct_copy", copy_gbps > 0 ? 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbps : NAN);
                    table_num(t, "x_v0", us_v0 / us);
                    table_num(t, "launches", launches);
                    table_num(t, "err_odd", err_odd);
                    table_num(t, "err", err);
                    free_run(&r);
                }
            }
        }
    }
    table_meta(t, "result", "every version matched the reference before it was timed");
    table_print(t, fmt, stdout);
    table_free(t);
    if (fmt == FMT_TEXT) launches_table(fmt);
    free(tokens);
    return 0;
}
