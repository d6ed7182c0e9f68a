// flash_bench.c — step07's flash attention ladder (flash_attn.h) on the prefill shapes of the
// models this project serves. First every version of every case is checked against the fp32 CPU
// reference on fresh random inputs (odd lengths; for long sequences a subset of rows, every head);
// a mismatch exits with status 1 before anything is timed. Then each is timed (CUDA events,
// warm-up, median of --reps) and printed as ms, TFLOP/s, % of the bf16 tensor-core GEMM peak
// measured in the same run (cuBLAS, step01's roofline_gpu_gemm_ms at 8192^3) and x over v1.
//
//   build/bin/flash_bench [--case NAME] [--version N] [--dtype bf16|fp16] [--reps 20] [--warmup 5]
//                         [--block-size 16] [--check-rows 48] [--peak-tflops X] [--seed S] [--csv|--json]
//   build/bin/flash_bench --explain     the online softmax of a 3-key example, step by step
//
// Cases (CASES below is the only list; T tokens, H query / KV kv heads, head dim hd, causal):
//   llama8b_4k   1 x 4096 tokens, 32 / 8 heads, hd 128 (Llama-3.1-8B)
//   llama1b_4k   1 x 4096, 32 / 8, hd 64 (Llama-3.2-1B)
//   qwen06b_1k   1 x 1024, 16 / 8, hd 128 (Qwen3-0.6B)
//   qwen06b_4k   1 x 4096, 16 / 8, hd 128
//   varlen       8 sequences of 1 .. 3001 tokens (9,417 in all) in one launch, 32 / 8, hd 128
//   chunked      64 sequences, 64 new tokens each after 1024 context tokens read through shuffled
//                block tables (step05's pool), 16 / 8, hd 128
// FLOPs = 4 * hd * H * (query, key) pairs computed (QK^T and PV, a multiply-add = 2): causal from 0
// that is 4 * hd * H * T (T + 1) / 2, about 4 * T^2 * hd * H / 2.
// Without a GPU the program says so and exits 0 (the CPU reference is the test suite's).
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
#include "step01_matmul/matmul_gpu.h"    // matmul_round_to_dtype
#include "step01_matmul/roofline_gpu.h"  // roofline_gpu_gemm_ms
#include "step05_paged/paged_attention.h"  // pa_dev_alloc, pa_upload_as, pa_download_f32, pa_sync
#include "step07_kernels/flash_attn.h"
#include "table.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: flash_bench [--case NAME] [--version N] [--dtype bf16|fp16] [--reps R] [--warmup W]\n"
            "                   [--block-size B] [--check-rows N] [--peak-tflops X] [--seed S] [--csv | --json]\n"
            "  --case         one of llama8b_4k llama1b_4k qwen06b_1k qwen06b_4k varlen chunked (default: all)\n"
            "  --version      one version id of the ladder (default: all; v1 is always run as the baseline)\n"
            "  --dtype        bf16 (default) or fp16\n"
            "  --reps         timed runs per version, median reported (default 20, at least 10), after --warmup (5)\n"
            "  --block-size   positions per KV block of the chunked case (default 16)\n"
            "  --check-rows   query rows per sequence compared with the CPU reference, every head (default 48:\n"
            "                 the first 8, the last 8 and the rest spread; all rows of shorter sequences)\n"
            "  --peak-tflops  the bf16 GEMM ceiling (default: measured now, cuBLAS 8192^3, median of 10)\n"
            "  --explain      print the online softmax of a 3-key example (FLASH.md), computed, and exit\n");
}

#define MAX_SEQ 64
typedef struct {
    const char *name, *what;
    int H, KV, hd, nseq, ctx;  // ctx: context tokens of every sequence (in the pool)
    int lens[MAX_SEQ];         // new tokens per sequence; nseq > 0 and lens[0] == 0: all lens[1]
} Case;
static const Case CASES[] = {
    {"llama8b_4k", "1 x 4096, 32/8 heads, hd 128 (Llama-3.1-8B)", 32, 8, 128, 1, 0, {4096}},
    {"llama1b_4k", "1 x 4096, 32/8 heads, hd 64 (Llama-3.2-1B)", 32, 8, 64, 1, 0, {4096}},
    {"qwen06b_1k", "1 x 1024, 16/8 heads, hd 128 (Qwen3-0.6B)", 16, 8, 128, 1, 0, {1024}},
    {"qwen06b_4k", "1 x 4096, 16/8 heads, hd 128 (Qwen3-0.6B)", 16, 8, 128, 1, 0, {4096}},
    {"varlen", "8 sequences, 1..3001 tokens (9417), 32/8 heads, hd 128", 32, 8, 128, 8, 0,
     {1, 77, 300, 513, 1000, 1525, 3000, 3001}},
    {"chunked", "64 x 64 new tokens after 1024 context (paged), 16/8 heads, hd 128", 16, 8, 128, 64, 1024, {0, 64}},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

// One case's inputs on the host (rounded to the dtype, so the reference reads what the device
// holds) and on the device.
typedef struct {
    const Case *c;
    int T, nseq, nb, B;
    int *cu, *ctx, *bt;
    size_t pool_rows;
    float *q, *k, *v, *kc, *vc;
    void *dq, *dk, *dv, *dkc, *dvc, *dout;
    int *dcu, *dctx, *dbt, *dtiles;
    FlashAttn fa;
    int launch_err, version;
} Inst;

static void inst_new(Inst *in, const Case *c, StDtype dt, int B, uint64_t seed) {
    memset(in, 0, sizeof *in);
    in->c = c, in->nseq = c->nseq, in->B = B;
    const int qd = c->H * c->hd, kd = c->KV * c->hd;
    in->cu = xmalloc((size_t)(c->nseq + 1) * sizeof(int));
    in->ctx = xmalloc((size_t)c->nseq * sizeof(int));
    in->cu[0] = 0;
    for (int s = 0; s < c->nseq; s++) {
        const int n = c->lens[0] == 0 ? c->lens[1] : c->lens[s];
        in->cu[s + 1] = in->cu[s] + n, in->ctx[s] = c->ctx;
    }
    in->T = in->cu[c->nseq];
    Rng rng;
    rng_seed(&rng, seed);
    const MmDtype md = dt == ST_F16 ? MM_F16 : MM_BF16;
    in->q = rng_new_uniform(&rng, (size_t)in->T * qd, -1.0f, 1.0f);
    in->k = rng_new_uniform(&rng, (size_t)in->T * kd, -1.0f, 1.0f);
    in->v = rng_new_uniform(&rng, (size_t)in->T * kd, -1.0f, 1.0f);
    matmul_round_to_dtype(md, in->q, (long)in->T * qd);
    matmul_round_to_dtype(md, in->k, (long)in->T * kd), matmul_round_to_dtype(md, in->v, (long)in->T * kd);
    // the context: shuffled blocks 1 .. (block 0 unused), B rows each
    in->nb = c->ctx > 0 ? (c->ctx + B - 1) / B : 1;
    const int nblk = c->nseq * in->nb + 1;
    in->pool_rows = (size_t)nblk * B;
    in->bt = xmalloc((size_t)c->nseq * in->nb * sizeof(int));
    int *perm = xmalloc((size_t)nblk * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(&rng) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(in->bt, perm, (size_t)c->nseq * in->nb * sizeof(int));
    free(perm);
    if (c->ctx > 0) {
        in->kc = rng_new_uniform(&rng, in->pool_rows * kd, -1.0f, 1.0f);
        in->vc = rng_new_uniform(&rng, in->pool_rows * kd, -1.0f, 1.0f);
        matmul_round_to_dtype(md, in->kc, (long)(in->pool_rows * kd)), matmul_round_to_dtype(md, in->vc, (long)(in->pool_rows * kd));
    }
    const size_t es = 2;
    in->dq = pa_dev_alloc((size_t)in->T * qd * es), in->dout = pa_dev_alloc((size_t)in->T * qd * es);
    in->dk = pa_dev_alloc((size_t)in->T * kd * es), in->dv = pa_dev_alloc((size_t)in->T * kd * es);
    in->dcu = pa_dev_alloc((size_t)(c->nseq + 1) * 4), in->dtiles = pa_dev_alloc((size_t)(c->nseq + 1) * 4);
    if (!in->dq || !in->dout || !in->dk || !in->dv || !in->dcu || !in->dtiles) die("out of device memory for case %s", c->name);
    pa_upload_as(dt, in->dq, in->q, (size_t)in->T * qd);
    pa_upload_as(dt, in->dk, in->k, (size_t)in->T * kd), pa_upload_as(dt, in->dv, in->v, (size_t)in->T * kd);
    pa_upload(in->dcu, in->cu, (size_t)(c->nseq + 1) * 4);
    if (c->ctx > 0) {
        in->dkc = pa_dev_alloc(in->pool_rows * kd * es), in->dvc = pa_dev_alloc(in->pool_rows * kd * es);
        in->dctx = pa_dev_alloc((size_t)c->nseq * 4), in->dbt = pa_dev_alloc((size_t)c->nseq * in->nb * 4);
        if (!in->dkc || !in->dvc || !in->dctx || !in->dbt) die("out of device memory for case %s", c->name);
        pa_upload_as(dt, in->dkc, in->kc, in->pool_rows * kd), pa_upload_as(dt, in->dvc, in->vc, in->pool_rows * kd);
        pa_upload(in->dctx, in->ctx, (size_t)c->nseq * 4), pa_upload(in->dbt, in->bt, (size_t)c->nseq * in->nb * 4);
    }
    if (pa_sync()) die("device setup failed for case %s", c->name);
    in->fa = (FlashAttn){dt, c->H, c->KV, c->hd, 1.0f / sqrtf((float)c->hd), 1, c->nseq, in->dcu,
                         c->ctx > 0 ? in->dctx : NULL, in->dq, qd, in->dk, in->dv, kd, in->dkc, in->dvc, in->dbt, in->nb, B,
                         in->dout, qd, in->dtiles, 0, NULL, in->T};
}

static void inst_free(Inst *in) {
    void *d[] = {in->dq, in->dk, in->dv, in->dkc, in->dvc, in->dout, in->dcu, in->dctx, in->dbt, in->dtiles};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (d[i]) pa_dev_free(d[i]);
    free(in->cu), free(in->ctx), free(in->bt), free(in->q), free(in->k), free(in->v), free(in->kc), free(in->vc);
}

// Plan for version id (uploads cu_tiles). 0, or -1 for a bad plan.
static int inst_plan(Inst *in, const FlashVersion *ver) {
    int *tiles = xmalloc((size_t)(in->nseq + 1) * sizeof(int));
    const int nt = flash_plan(ver->tile_m, in->c->H, in->c->KV, in->cu, in->nseq, tiles);
    if (nt >= 0) pa_upload(in->dtiles, tiles, (size_t)(in->nseq + 1) * 4);
    free(tiles);
    in->fa.ntiles = nt;
    return nt < 0 ? -1 : 0;
}

static void run_version(void *p) {
    Inst *in = p;
    if (flash_attn_run(&in->fa, in->version) != 1) in->launch_err = 1;
}

// The rows checked of sequence s: all when short, else the first 8, the last 8 and the rest spread.
static int check_rows(int n, int want, int *rows) {
    if (n <= want) {
        for (int j = 0; j < n; j++) rows[j] = j;
        return n;
    }
    int k = 0;
    for (int j = 0; j < 8; j++) rows[k++] = j;
    const int mid = want - 16;
    for (int i = 0; i < mid; i++) rows[k++] = 8 + (int)((long)(i + 1) * (n - 16) / (mid + 1));
    for (int j = n - 8; j < n; j++) rows[k++] = j;
    return k;
}

typedef struct {
    double err;   // max over the checked rows of max|out - ref| / max|ref| (per row)
    size_t nonfinite;  // non-finite values anywhere in the output
    int rc;       // flash_attn_run's return of the check run
} Check;

// Reference of the checked rows (every head), (rows, H * hd) for sequence s.
static float *reference(const Inst *in, int s, const int *rows, int nr) {
    const Case *c = in->c;
    const FlashHost h = {c->H, c->KV, c->hd, 1.0f / sqrtf((float)c->hd), 1, in->nseq, in->cu,
                         c->ctx > 0 ? in->ctx : NULL, in->q, in->k, in->v, c->H * c->hd, c->KV * c->hd, in->kc, in->vc,
                         in->bt, in->nb, in->B};
    float *ref = xmalloc((size_t)nr * c->H * c->hd * sizeof(float));
#pragma omp parallel for schedule(dynamic, 1) collapse(2)
    for (int r = 0; r < nr; r++)
        for (int hh = 0; hh < c->H; hh++) flash_attn_row_cpu(&h, s, rows[r], hh, ref + ((size_t)r * c->H + hh) * c->hd);
    return ref;
}

static Check check_version(Inst *in, StDtype dt, int id, float **refs, int **rows, const int *nrows) {
    const Case *c = in->c;
    const size_t qd = (size_t)c->H * c->hd, n = (size_t)in->T * qd;
    Check ck = {0, 0, 0};
    float *out = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) out[i] = NAN;
    pa_upload_as(dt, in->dout, out, n);
    ck.rc = flash_attn_run(&in->fa, id);
    if (ck.rc != 1 || pa_sync()) {
        free(out);
        if (ck.rc == 1) ck.rc = -1;
        return ck;
    }
    pa_download_f32(dt, out, in->dout, n);
    for (size_t i = 0; i < n; i++) ck.nonfinite += !isfinite(out[i]);
    for (int s = 0; s < in->nseq; s++)
        for (int r = 0; r < nrows[s]; r++) {
            ErrStats e = compare_f32(out + ((size_t)in->cu[s] + rows[s][r]) * qd, refs[s] + (size_t)r * qd, qd);
            const double er = e.n_bad ? INFINITY : e.max_rel;
            if (er > ck.err) ck.err = er;
        }
    if (ck.nonfinite) ck.err = INFINITY;
    free(out);
    return ck;
}

// --explain: the online softmax of FLASH.md's example, computed here: one query row, scores s and
// values v arriving one key at a time, against the two-pass softmax.
static int explain(void) {
    const double s[3] = {1, 3, 2}, v[3] = {10, 20, 30};
    double mx = -INFINITY, l = 0, acc = 0;
    printf("online softmax, one row: scores [1, 3, 2], values [10, 20, 30]\n");
    printf("key |  s | new m | alpha=exp(m_old-m_new) | p=exp(s-m_new) |      l |      acc\n");
    for (int i = 0; i < 3; i++) {
        const double mn = s[i] > mx ? s[i] : mx, al = exp(mx - mn), p = exp(s[i] - mn);
        l = l * al + p, acc = acc * al + p * v[i], mx = mn;
        printf("%3d | %2.0f | %5.0f | %22.4f | %14.4f | %6.4f | %8.4f\n", i + 1, s[i], mn, al, p, l, acc);
    }
    double m2 = -INFINITY, l2 = 0, a2 = 0;
    for (int i = 0; i < 3; i++) m2 = s[i] > m2 ? s[i] : m2;
    for (int i = 0; i < 3; i++) l2 += exp(s[i] - m2), a2 += exp(s[i] - m2) * v[i];
    printf("online: acc / l = %.4f / %.4f = %.4f (normalized once, at the end)\n", acc, l, acc / l);
    printf("two-pass: max %.0f, sum %.4f, out %.4f\n", m2, l2, a2 / l2);
    return 0;
}

int main(int argc, char **argv) {
    const char *only_case = NULL;
    int only_version = -1, reps = 20, warmup = 5, B = 16, want_rows = 48;
    double peak = 0;
    uint64_t seed = 12;
    StDtype dt = ST_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--case") && more) only_case = argv[++i];
        else if (!strcmp(a, "--version") && more) only_version = (int)arg_int(a, argv[++i], 0, 1000);
        else if (!strcmp(a, "--dtype") && more) {
            const char *d = argv[++i];
            if (!strcmp(d, "bf16")) dt = ST_BF16;
            else if (!strcmp(d, "fp16")) dt = ST_F16;
            else arg_die("--dtype: '%s' is not bf16 or fp16", d);
        } else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 10, 100000);
        else if (!strcmp(a, "--warmup") && more) warmup = (int)arg_int(a, argv[++i], 0, 100000);
        else if (!strcmp(a, "--block-size") && more) B = (int)arg_int(a, argv[++i], 1, 1 << 16);
        else if (!strcmp(a, "--check-rows") && more) want_rows = (int)arg_int(a, argv[++i], 17, 1 << 20);
        else if (!strcmp(a, "--peak-tflops") && more) peak = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--seed") && more) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--explain")) return explain();
        else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else arg_help_or_unknown(a, usage);
    }
    int ncase = 0;
    const Case *cases[N_CASES];
    for (int i = 0; i < N_CASES; i++)
        if (!only_case || !strcmp(only_case, CASES[i].name)) cases[ncase++] = &CASES[i];
    if (!ncase) arg_die("--case: '%s' is not a case (see --help)", only_case);
    if (only_version >= 0 && !flash_find_version(only_version) && flash_num_versions() > 0)
        arg_die("--version: no version %d", only_version);

    Table *t = table_new("step07 flash attention prefill ladder: validated against the fp32 CPU reference, then timed");
    table_std_meta(t);
    table_meta(t, "dtype", "%s (q, k, v, the pool and out; fp32 accumulate)", dt == ST_F16 ? "fp16" : "bf16");
    table_meta(t, "flops", "4 * hd * H * (query, key) pairs computed; causal from 0: 4 * hd * H * T(T+1)/2 ~ 4 T^2 hd H / 2");
    table_col(t, "case", NULL);
    table_col(t, "shape", NULL);
    table_col(t, "version", NULL);
    table_col(t, "gflop", "%.2f");
    table_col(t, "ms", "%.4f");
    table_col(t, "tflops", "%.1f");
    table_col(t, "pct_peak", "%.1f");
    table_col(t, "x_v1", "%.2f");
    table_col(t, "max_rel_err", "%.2e");
    table_col(t, "what", NULL);
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        table_meta(t, "device", "none: %s (every row needs a GPU; the CPU reference is checked by the tests)", gi.reason);
        table_print(t, outfmt_from_args(argc, argv), stdout);
        table_free(t);
        return 0;
    }
    table_meta(t, "device", "%s (sm_%d%d, %d SMs)", gi.name, gi.cc_major, gi.cc_minor, gi.sms);
    const double tol = 2 * ERR_TOL_HALF;

    // ---- pass 1: every version of every case against the reference; nothing is timed before all pass
    int failed = 0;
    double *errs = xcalloc((size_t)N_CASES * flash_num_versions(), sizeof(double));
    int *rcs = xcalloc((size_t)N_CASES * flash_num_versions(), sizeof(int));
    for (int ci = 0; ci < ncase; ci++) {
        Inst in;
        inst_new(&in, cases[ci], dt, B, seed + (uint64_t)ci);
        float **refs = xmalloc((size_t)in.nseq * sizeof(float *));
        int **rows = xmalloc((size_t)in.nseq * sizeof(int *)), *nrows = xmalloc((size_t)in.nseq * sizeof(int));
        for (int s = 0; s < in.nseq; s++) {
            const int n = in.cu[s + 1] - in.cu[s];
            rows[s] = xmalloc((size_t)(n < want_rows ? n : want_rows) * sizeof(int));
            nrows[s] = check_rows(n, want_rows, rows[s]);
            refs[s] = reference(&in, s, rows[s], nrows[s]);
        }
        for (int vi = 0; vi < flash_num_versions(); vi++) {
            const FlashVersion *ver = flash_version(vi);
            if (only_version >= 0 && ver->id != only_version && ver->id != 1) continue;
            if (inst_plan(&in, ver)) die("the tile plan failed");
            const Check ck = check_version(&in, dt, ver->id, refs, rows, nrows);
            const size_t at = (size_t)(cases[ci] - CASES) * flash_num_versions() + vi;
            errs[at] = ck.err, rcs[at] = ck.rc;
            if (ck.rc == -2) continue;  // not on this device (the table says skipped)
            if (ck.rc != 1 || !(ck.err <= tol)) {
                fprintf(stderr, "flash_bench: %s %s FAILED: %s (max_rel_err %.3e, %zu non-finite outputs, tolerance %.0e)\n",
                        cases[ci]->name, ver->name, ck.rc != 1 ? "launch failed" : "mismatch", ck.err, ck.nonfinite, tol);
                failed = 1;
            }
        }
        for (int s = 0; s < in.nseq; s++) free(refs[s]), free(rows[s]);
        free(refs), free(rows), free(nrows);
        inst_free(&in);
    }
    if (failed) {
        fprintf(stderr, "flash_bench: validation failed; nothing was timed\n");
        return 1;
    }

    // ---- the ceiling, then pass 2: time
    const char *peak_src = "given (--peak-tflops)";
    if (peak <= 0) {
        const int nn = 8192;
        const double ms = roofline_gpu_gemm_ms(dt == ST_F16 ? 1 : 2, nn, nn, nn, 10);
        peak = ms > 0 ? 2.0 * nn * nn * nn / (ms * 1e-3) / 1e12 : 0;
        peak_src = dt == ST_F16 ? "measured now: cuBLAS fp16 GEMM 8192^3 (fp32 accumulate), median of 10"
                                : "measured now: cuBLAS bf16 GEMM 8192^3 (fp32 accumulate), median of 10";
    }
    table_meta(t, "peak_tflops", "%.1f (%s)", peak, peak_src);
    table_meta(t, "timing", "CUDA events, %d warm-up runs, median of %d", warmup, reps);
    for (int ci = 0; ci < ncase; ci++) {
        Inst in;
        inst_new(&in, cases[ci], dt, B, seed + (uint64_t)ci);
        const double flops = 4.0 * cases[ci]->hd * cases[ci]->H *
                             flash_visible_pairs(in.cu, cases[ci]->ctx > 0 ? in.ctx : NULL, in.nseq, 1);
        // every version first (v1 is the baseline of x_v1 whatever the table order), then the rows
        char shape[96];
        if (in.nseq == 1) snprintf(shape, sizeof shape, "1x%d", in.T);
        else if (cases[ci]->ctx > 0) snprintf(shape, sizeof shape, "%dx%d after %d", in.nseq, in.T / in.nseq, cases[ci]->ctx);
        else snprintf(shape, sizeof shape, "%d seqs, %d tokens", in.nseq, in.T);
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ", %d/%d heads, hd %d", cases[ci]->H, cases[ci]->KV,
                 cases[ci]->hd);
        double ms_of[64], ms_v1 = NAN;
        const int nv = flash_num_versions() < 64 ? flash_num_versions() : 64;
        for (int vi = 0; vi < nv; vi++) {
            const FlashVersion *ver = flash_version(vi);
            const size_t at = (size_t)(cases[ci] - CASES) * flash_num_versions() + vi;
            ms_of[vi] = NAN;
            if ((only_version >= 0 && ver->id != only_version && ver->id != 1) || rcs[at] == -2) continue;
            if (inst_plan(&in, ver)) die("the tile plan failed");
            in.version = ver->id, in.launch_err = 0;
            ms_of[vi] = gpu_bench(run_version, &in, warmup, reps, 1);
            if (in.launch_err || !(ms_of[vi] > 0)) die("%s %s: a timed launch failed", cases[ci]->name, ver->name);
            if (ver->id == 1) ms_v1 = ms_of[vi];
        }
        for (int vi = 0; vi < nv; vi++) {
            const FlashVersion *ver = flash_version(vi);
            const size_t at = (size_t)(cases[ci] - CASES) * flash_num_versions() + vi;
            if (only_version >= 0 && ver->id != only_version && ver->id != 1) continue;
            table_row(t);
            table_str(t, "case", cases[ci]->name);
            table_str(t, "shape", shape);
            table_str(t, "version", ver->name);
            table_num(t, "gflop", flops / 1e9);
            if (rcs[at] == -2) {
                table_str(t, "what", "skipped: this version does not run this call on this device");
                continue;
            }
            const double tf = flops / (ms_of[vi] * 1e-3) / 1e12;
            table_num(t, "ms", ms_of[vi]);
            table_num(t, "tflops", tf);
            table_num(t, "pct_peak", peak > 0 ? 100.0 * tf / peak : NAN);
            table_num(t, "x_v1", ms_v1 / ms_of[vi]);
            table_num(t, "max_rel_err", errs[at]);
            table_str(t, "what", ver->what);
        }
        inst_free(&in);
    }
    table_meta(t, "check", "passed: every version of every case within %.0e of the fp32 CPU reference (max relative "
               "error per row over %d checked rows per sequence, every head; no non-finite output anywhere)", tol, want_rows);
    table_print(t, outfmt_from_args(argc, argv), stdout);
    table_free(t);
    free(errs), free(rcs);
    return 0;
}
