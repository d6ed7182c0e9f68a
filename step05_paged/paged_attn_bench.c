// paged_attn_bench.c — the ladder of step05's paged kernels at one decode shape: every kernel is
// checked against the fp32 CPU reference, then timed (CUDA events, warm-up, median of --reps),
// as GB/s of the bytes it must move and as % of the device copy bandwidth measured in the same
// run (step01's roofline_gpu_bandwidth: a 2 GiB device copy, read + write counted).
//
//   build/bin/paged_attn_bench [--batch 32] [--context 4096] [--heads 32] [--kv-heads 8]
//                              [--head-dim 128] [--block-size 16] [--dtype bf16] [--csv|--json]
//   build/bin/paged_attn_bench --op prefill [--heads 16 --kv-heads 8 ...] [--chunks N --rows n --prior P]
//
// Rows (the LADDER table below is the only list of them):
//   step04_contiguous  step04's split decode kernel over contiguous slots (the baseline: no table)
//   paged_v1           one CTA per (sequence, kv head), the whole context
//   paged_v2           split-K: partitions of PA_PART keys + the rescaling reduce
//   paged_rule         what paged_decode picks for this shape (paged_decode_choose)
//   gather             every sequence's context copied through its table into contiguous rows
//                      (chunked prefill's input): bytes = read + write
//   kv_write_decode    the K/V write of one decode step (batch rows) through the slot mapping
//   kv_write_prefill   the same for 8192 rows (a prefill chunk)
// Decode bytes = K and V of every context read once (batch * context * kv_heads * head_dim *
// 2 * dtype size); the q reads and output writes are counted too. Without a GPU the CPU
// reference alone runs (timed on the host) and the CUDA rows are reported as skipped.
// The K/V values are multiples of 1/128 in [-1, 1): exact in bf16, fp16 and fp32, so the CPU
// reference reads exactly what the device holds; the tables hand out shuffled blocks.
//
// --op prefill: the chunked-prefill attention of one layer, every chunk of a step at once (each
// chunk its own sequence: n new rows after P cached positions, context L = P + n), by default
// two cases: 64 chunks of 64 rows after 1024 (a shared prefix hit by 64 requests: L = 1088) and
// 8 chunks of 512 rows from 0. Rows (PREFILL_LADDER below):
//   fused        paged_prefill: one launch for all chunks (tensor cores for bf16/fp16)
//   fused_simt   its SIMT kernel alone (fp32 math; the sm_75 / fp32 path)
//   gather_gemm  the runner's other path: per chunk a gather through its table, then step02's
//                GEMM-softmax-GEMM (cuBLAS), one chunk after the other
// TFLOP/s counts the causal attention FLOPs: 4 * H * hd per (query row, key it sees).
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
#include "step04_batching/runner_gpu.h"
#include "step05_paged/paged_attention.h"
#include "step05_paged/paged_prefill.h"
#include "table.h"
#include "timer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: paged_attn_bench [--batch N] [--context L] [--heads H] [--kv-heads KV] [--head-dim D]\n"
            "                        [--block-size B] [--dtype bf16|fp16|fp32] [--reps R] [--warmup W]\n"
            "                        [--copy-gbps X] [--check-items N] [--part P] [--seed S] [--csv | --json]\n"
            "       paged_attn_bench --op prefill [--heads H] [--kv-heads KV] [--head-dim D] [--block-size B]\n"
            "                        [--dtype T] [--chunks N --rows n --prior P] [--reps R] [--warmup W] [--csv | --json]\n"
            "  --op           decode (default: the table above) or prefill (the fused prefill ladder; default cases\n"
            "                 64 chunks x 64 rows after 1024 cached positions and 8 x 512 from 0, heads 16/8)\n"
            "  --chunks, --rows, --prior  one prefill case instead: N chunks of n rows after P cached positions\n"
            "  --batch        sequences, one decode row each (default 32)\n"
            "  --context      keys of every sequence (default 4096)\n"
            "  --heads        query heads (default 32); --kv-heads (default 8); --head-dim (default 128)\n"
            "  --block-size   positions per KV block (default 16)\n"
            "  --dtype        the cache dtype (default bf16)\n"
            "  --reps         timed runs per kernel, median reported (default 20), after --warmup (default 5)\n"
            "  --copy-gbps    the bandwidth ceiling (default: measured now, device copy, read + write counted)\n"
            "  --check-items  sequences compared with the CPU reference (default 2: the first and the last)\n"
            "  --part         keys per v2 partition (default PA_PART = 1024)\n");
}

// K/V value of element i: a multiple of 1/128 in [-1, 1) from a counter hash (splitmix64).
static float kv_value(uint64_t seed, size_t i) {
    uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)((int)(z & 255) - 128) / 128.0f;
}

typedef struct {
    PagedDecode pd;
    int version;  // 1, 2, 0 = the rule
    int nsms;
    // step04 baseline
    StDtype dt;
    const void *ck, *cv;
    const int *rows, *lens, *bases;
    int n, L, H, KV, hd;
    void *out;
    float *po, *pm;
    size_t part_cap4;
    // gather
    const void *kc, *vc;
    const int *bt;
    int bt_stride, B, kd;
    void *gk, *gv;
    // kv write
    const float *wk, *wv;
    const int *wslots;
    int wT;
    int launch_err;
} Ctx;

static void run_paged(void *p) {
    Ctx *c = p;
    const int r = c->version == 1 ? paged_decode_v1(&c->pd) : c->version == 2 ? paged_decode_v2(&c->pd)
                                                                              : paged_decode(&c->pd, c->nsms);
    if (r < 0) c->launch_err = 1;
}
static void run_step04(void *p) {
    Ctx *c = p;
    if (step04_decode_attention_dev(c->dt, c->pd.q, c->pd.ldq, c->ck, c->cv, c->rows, c->lens, c->bases, c->n, c->L,
                                    c->H, c->KV, c->hd, c->out, c->po, c->pm, c->part_cap4) < 0)
        c->launch_err = 1;
}
static void run_gather(void *p) {
    Ctx *c = p;
    const size_t es = c->dt == ST_F32 ? 4 : 2;
    for (int s = 0; s < c->n; s++)
        if (paged_gather(c->dt, c->kc, c->vc, c->bt, c->bt_stride, c->B, s, c->L, c->kd,
                         (char *)c->gk + (size_t)s * c->L * c->kd * es, (char *)c->gv + (size_t)s * c->L * c->kd * es))
            c->launch_err = 1;
}
static void run_kv_write(void *p) {
    Ctx *c = p;
    if (paged_kv_write(c->dt, c->wk, c->wv, c->kd, c->wslots, c->wT, c->kd, (void *)c->kc, (void *)c->vc)) c->launch_err = 1;
}

typedef enum { K_DECODE, K_STEP04, K_GATHER, K_WRITE_DECODE, K_WRITE_PREFILL } Kind;
static const struct {
    const char *id;
    Kind kind;
    int version, variant;
    const char *what;
} LADDER[] = {
    {"step04_contiguous", K_STEP04, 0, 0, "step04 split decode kernel, contiguous slots (baseline)"},
    {"paged_v1", K_DECODE, 1, 3, "one CTA per (sequence, kv head), whole context, the first (SIMT) loop"},
    {"paged_v1_lb4", K_DECODE, 1, 1, "v1, SIMT, at most 128 registers a thread: 4 CTAs per SM (16 lanes per row only)"},
    {"paged_v1_u8", K_DECODE, 1, 2, "v1, SIMT, 8 rows per lane per iteration (16 lanes per row only)"},
    {"paged_v1_mma", K_DECODE, 1, 4, "v1, the tensor-core loop (bf16/fp16, hd 64/128/256, sm_80+; else the SIMT loop)"},
    {"paged_v2", K_DECODE, 2, 3, "split-K partitions (--part keys) + rescaling reduce, the first (SIMT) loop"},
    {"paged_v2_lb4", K_DECODE, 2, 1, "v2, SIMT, at most 128 registers a thread: 4 CTAs per SM (16 lanes per row only)"},
    {"paged_v2_u8", K_DECODE, 2, 2, "v2, SIMT, 8 rows per lane per iteration (16 lanes per row only)"},
    {"paged_v2_mma", K_DECODE, 2, 4, "v2, the tensor-core loop: one 16-key tile per warp iteration (v2's default)"},
    {"paged_v2_mma_t2", K_DECODE, 2, 5, "v2, the tensor-core loop, two 16-key tiles per warp iteration"},
    {"paged_v2_mma_lb4", K_DECODE, 2, 6, "v2, the tensor-core loop, at most 128 registers a thread: 4 CTAs per SM"},
    {"paged_v2_mma_psplit", K_DECODE, 2, 7, "v2, the tensor-core loop, P rounded in two parts (hi + lo: two P V MMAs)"},
    {"paged_rule", K_DECODE, 0, 0, "paged_decode: v1 or v2 by paged_decode_choose, each with its default loop"},
    {"gather", K_GATHER, 0, 0, "contexts through the tables into contiguous rows (read + write)"},
    {"kv_write_decode", K_WRITE_DECODE, 0, 0, "K/V write through the slot mapping, batch rows"},
    {"kv_write_prefill", K_WRITE_PREFILL, 0, 0, "K/V write through the slot mapping, 8192 rows"},
};  // the K/V writes come last: they overwrite pool rows the decode rows read
#define N_LADDER ((int)(sizeof LADDER / sizeof LADDER[0]))

// ---------------------------------------------------------------- --op prefill

typedef struct {
    LongAttnBench *lb;
    PagedPrefill pp;
    int which;  // 0 fused (through the runner's attention), 1 simt, 2 gather
    int launch_err;
} PCtx;
static void run_prefill(void *p) {
    PCtx *c = p;
    const int r = c->which == 1 ? paged_prefill_simt(&c->pp) : long_attn_bench_run(c->lb, c->which == 0);
    if (r < 0) c->launch_err = 1;
}
static const struct {
    const char *id;
    int which;
    const char *what;
} PREFILL_LADDER[] = {
    {"fused", 0, "paged_prefill: all chunks in one launch, K/V through the tables"},
    {"fused_simt", 1, "paged_prefill_simt: the SIMT kernel alone"},
    {"gather_gemm", 2, "per chunk: gather + GEMM-softmax-GEMM (cuBLAS)"},
};
#define N_PREFILL ((int)(sizeof PREFILL_LADDER / sizeof PREFILL_LADDER[0]))

// One case: nch chunks of n rows after P cached positions each. Returns 1 when a check failed.
static int prefill_case(Table *t, int nch, int n, int P, int H, int KV, int hd, int B, StDtype dt, int reps, int warmup,
                        uint64_t seed) {
    const int qd = H * hd, kd = KV * hd, L = P + n, nb = (L + B - 1) / B, nblk = nch * nb + 1, T = nch * n;
    const int ldq = qd + 2 * kd;  // q inside qkv rows, as the runner holds it
    const size_t es = dt == ST_F32 ? 4 : 2, prow = (size_t)nblk * B;
    if ((double)nblk * B > 2147483647.0) arg_die("the pool (%d blocks of %d) has more than 2^31 rows", nblk, B);
    const float scale = 1.0f / sqrtf((float)hd);
    Rng rng;
    rng_seed(&rng, seed);
    int *perm = xmalloc((size_t)nblk * sizeof(int)), *bt = xmalloc((size_t)nch * nb * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(&rng) % (unsigned)(i + 1)), tt = perm[i];
        perm[i] = perm[j], perm[j] = tt;
    }
    memcpy(bt, perm, (size_t)nch * nb * sizeof(int));
    float *kc = xmalloc(prow * kd * sizeof(float)), *vc = xmalloc(prow * kd * sizeof(float));
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)(prow * kd); i++) kc[i] = kv_value(seed, (size_t)i), vc[i] = kv_value(seed + 1, (size_t)i);
    float *q = rng_new_uniform(&rng, (size_t)T * ldq, -1.0f, 1.0f);
    PrefillChunk *ch = xmalloc((size_t)nch * sizeof(PrefillChunk));
    for (int i = 0; i < nch; i++) ch[i] = (PrefillChunk){i, i * n, n, L};
    // the CPU reference for the first and the last chunk
    const int ncheck = nch > 1 ? 2 : 1;
    PrefillChunk chk[2] = {ch[0], ch[nch - 1]};
    float *ref = xcalloc((size_t)T * qd, sizeof(float)), *out = xmalloc((size_t)T * qd * sizeof(float));
    paged_prefill_cpu(q, ldq, kc, vc, bt, nb, B, chk, ncheck, H, KV, hd, scale, ref, qd);
    double flops = 0;
    for (int j = 0; j < n; j++) flops += 4.0 * H * hd * (P + j + 1);
    flops *= nch;

    float *dq = pa_dev_alloc((size_t)T * ldq * 4);
    void *dk = pa_dev_alloc(prow * kd * es), *dv = pa_dev_alloc(prow * kd * es), *dout = pa_dev_alloc((size_t)T * qd * 4);
    int *dbt = pa_dev_alloc((size_t)nch * nb * 4);
    const int nt = paged_prefill_num_tiles(ch, nch, H, KV);
    int *tiles = xmalloc((size_t)nt * PP_TILE_INTS * sizeof(int)), *dtl = pa_dev_alloc((size_t)nt * PP_TILE_INTS * 4);
    if (!dq || !dk || !dv || !dout || !dbt || !dtl) die("out of device memory for this case");
    if (paged_prefill_plan(ch, nch, H, KV, tiles, nt) != nt) die("the prefill tile plan failed");
    pa_upload(dq, q, (size_t)T * ldq * 4);
    pa_upload_as(dt, dk, kc, prow * kd), pa_upload_as(dt, dv, vc, prow * kd);
    pa_upload(dbt, bt, (size_t)nch * nb * 4), pa_upload(dtl, tiles, (size_t)nt * PP_TILE_INTS * 4);
    PCtx c = {0};
    c.lb = long_attn_bench_new(dt, H, KV, hd, dq, ldq, dk, dv, dbt, nb, B, ch, nch, dout);
    if (!c.lb) die("long_attn_bench_new refused the case");
    c.pp = (PagedPrefill){dt, H, KV, hd, scale, dq, ldq, dk, dv, dbt, nb, B, dtl, nt, dout, qd, 0};
    char cname[64];
    snprintf(cname, sizeof cname, "%dx%d after %d", nch, n, P);
    int failed = 0;
    for (int li = 0; li < N_PREFILL; li++) {
        c.which = PREFILL_LADDER[li].which, c.launch_err = 0;
        if (c.which == 0 && !paged_prefill_supported(dt, H, KV, hd)) continue;  // the runner would not take it either
        for (size_t i = 0; i < (size_t)T * qd; i++) out[i] = NAN;
        pa_upload_as(dt, dout, out, (size_t)T * qd);
        const int launches = c.which == 1 ? paged_prefill_simt(&c.pp) : long_attn_bench_run(c.lb, c.which == 0);
        if (launches < 0 || pa_sync()) die("%s: launch failed", PREFILL_LADDER[li].id);
        pa_download_f32(dt, out, dout, (size_t)T * qd);
        double err = 0;
        for (int k = 0; k < ncheck; k++)
            for (int j = 0; j < n; j++) {
                const size_t r = (size_t)(chk[k].row0 + j) * qd;
                ErrStats e = compare_f32(out + r, ref + r, (size_t)qd);
                if (e.n_bad) err = INFINITY;
                else if (e.max_rel > err) err = e.max_rel;
            }
        if (!(err < 2 * ERR_TOL_HALF)) failed = 1;
        const double ms = gpu_bench(run_prefill, &c, warmup, reps, 1);
        if (c.launch_err) die("%s: a timed launch failed", PREFILL_LADDER[li].id);
        table_row(t);
        table_str(t, "case", cname);
        table_str(t, "kernel", PREFILL_LADDER[li].id);
        table_num(t, "ms", ms);
        table_num(t, "tflops", flops / (ms * 1e-3) / 1e12);
        table_num(t, "max_rel_err", err);
        table_num(t, "launches", launches);
        table_str(t, "what", PREFILL_LADDER[li].what);
    }
    long_attn_bench_free(c.lb);
    void *dps[] = {dq, dk, dv, dout, dbt, dtl};
    for (size_t i = 0; i < sizeof dps / sizeof dps[0]; i++) pa_dev_free(dps[i]);
    free(perm), free(bt), free(kc), free(vc), free(q), free(ch), free(ref), free(out), free(tiles);
    return failed;
}

static int prefill_ladder(int argc, char **argv, int nch, int n, int P, int H, int KV, int hd, int B, StDtype dt, int reps,
                          int warmup, uint64_t seed) {
    Table *t = table_new("step05 fused prefill attention: every chunk of a step in one launch, K/V through the tables");
    table_std_meta(t);
    table_meta(t, "shape", "%d query / %d kv heads, head_dim %d, block size %d, %s cache; chunks of n rows after P cached "
               "positions, one sequence each", H, KV, hd, B, dt == ST_F32 ? "fp32" : dt == ST_F16 ? "fp16" : "bf16");
    table_meta(t, "flops", "causal attention FLOPs: 4 * H * hd per (query row, key it sees)");
    table_col(t, "case", NULL);
    table_col(t, "kernel", NULL);
    table_col(t, "ms", "%.4f");
    table_col(t, "tflops", "%.1f");
    table_col(t, "max_rel_err", "%.2e");
    table_col(t, "launches", "%.0f");
    table_col(t, "what", NULL);
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        table_meta(t, "device", "none: %s (the CUDA rows are skipped)", gi.reason);
        table_print(t, outfmt_from_args(argc, argv), stdout);
        table_free(t);
        return 0;
    }
    table_meta(t, "device", "%s (sm_%d%d, %d SMs)", gi.name, gi.cc_major, gi.cc_minor, pa_num_sms());
    table_meta(t, "timing", "CUDA events, %d warm-up runs, median of %d", warmup, reps);
    int failed = 0;
    if (nch > 0) failed |= prefill_case(t, nch, n, P, H, KV, hd, B, dt, reps, warmup, seed);
    else {
        failed |= prefill_case(t, 64, 64, 1024, H, KV, hd, B, dt, reps, warmup, seed);
        failed |= prefill_case(t, 8, 512, 0, H, KV, hd, B, dt, reps, warmup, seed);
    }
    table_meta(t, "check", "%s (max relative error of the first and the last chunk vs the fp32 CPU reference, tolerance "
               "%.0e)", failed ? "FAILED" : "passed", 2 * ERR_TOL_HALF);
    table_print(t, outfmt_from_args(argc, argv), stdout);
    table_free(t);
    return failed;
}

static StDtype parse_dtype(const char *s) {
    if (!strcmp(s, "bf16")) return ST_BF16;
    if (!strcmp(s, "fp16")) return ST_F16;
    if (!strcmp(s, "fp32")) return ST_F32;
    arg_die("--dtype: '%s' is not one of bf16, fp16, fp32", s);
}

int main(int argc, char **argv) {
    int batch = 32, L = 4096, H = 32, KV = 8, hd = 128, B = 16, reps = 20, warmup = 5, check_items = 2, part = PA_PART;
    uint64_t seed = 5;
    double copy_gbps = 0;
    StDtype dt = ST_BF16;
    int prefill = 0, heads_given = 0, nch = 0, nrows = 64, prior = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--batch") && more) batch = (int)arg_int(a, argv[++i], 1, 65535);
        else if (!strcmp(a, "--context") && more) L = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--heads") && more) H = (int)arg_int(a, argv[++i], 1, 256), heads_given = 1;
        else if (!strcmp(a, "--kv-heads") && more) KV = (int)arg_int(a, argv[++i], 1, 256), heads_given = 1;
        else if (!strcmp(a, "--chunks") && more) nch = (int)arg_int(a, argv[++i], 1, 65535);
        else if (!strcmp(a, "--rows") && more) nrows = (int)arg_int(a, argv[++i], 1, 1 << 16);
        else if (!strcmp(a, "--prior") && more) prior = (int)arg_int(a, argv[++i], 0, 1 << 20);
        else if (!strcmp(a, "--op") && more) {
            const char *o = argv[++i];
            if (!strcmp(o, "prefill")) prefill = 1;
            else if (strcmp(o, "decode")) arg_die("--op: '%s' is not decode or prefill", o);
        }
        else if (!strcmp(a, "--head-dim") && more) hd = (int)arg_int(a, argv[++i], 2, 512);
        else if (!strcmp(a, "--block-size") && more) B = (int)arg_int(a, argv[++i], 1, 1 << 16);
        else if (!strcmp(a, "--dtype") && more) dt = parse_dtype(argv[++i]);
        else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 1, 100000);
        else if (!strcmp(a, "--warmup") && more) warmup = (int)arg_int(a, argv[++i], 0, 100000);
        else if (!strcmp(a, "--copy-gbps") && more) copy_gbps = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--check-items") && more) check_items = (int)arg_int(a, argv[++i], 1, 65535);
        else if (!strcmp(a, "--seed") && more) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--part") && more) part = (int)arg_int(a, argv[++i], 32, 1 << 20);
        else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else arg_help_or_unknown(a, usage);
    }
    if (prefill && !heads_given) H = 16, KV = 8;  // the Qwen3-0.6B shape of the shared-prefix workload
    if (H % KV) arg_die("--heads %d is no multiple of --kv-heads %d", H, KV);
    if (prefill) return prefill_ladder(argc, argv, nch, nrows, prior, H, KV, hd, B, dt, reps, warmup, seed);
    if (check_items > batch) check_items = batch;
    const int qd = H * hd, kd = KV * hd, nb = (L + B - 1) / B, nblk = batch * nb + 1;
    const size_t es = dt == ST_F32 ? 4 : 2, prow = (size_t)nblk * B;
    if ((double)nblk * B > 2147483647.0) arg_die("the pool (%d blocks of %d) has more than 2^31 rows", nblk, B);
    const float scale = 1.0f / sqrtf((float)hd);
    const char *dname = dt == ST_F32 ? "fp32" : dt == ST_F16 ? "fp16" : "bf16";

    // ---- host inputs: shuffled tables, K/V through them, queries
    Rng rng;
    rng_seed(&rng, seed);
    int *perm = xmalloc((size_t)nblk * sizeof(int)), *bt = xmalloc((size_t)batch * nb * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(&rng) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(bt, perm, (size_t)batch * nb * sizeof(int));
    float *kc = xmalloc(prow * kd * sizeof(float)), *vc = xmalloc(prow * kd * sizeof(float));
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)(prow * kd); i++) kc[i] = kv_value(seed, (size_t)i), vc[i] = kv_value(seed + 1, (size_t)i);
    float *q = rng_new_uniform(&rng, (size_t)batch * qd, -1.0f, 1.0f);
    int *rows = xmalloc((size_t)batch * sizeof(int)), *seqs = xmalloc((size_t)batch * sizeof(int));
    int *lens = xmalloc((size_t)batch * sizeof(int)), *bases = xmalloc((size_t)batch * sizeof(int));
    for (int s = 0; s < batch; s++) rows[s] = s, seqs[s] = s, lens[s] = L, bases[s] = s * L;
    // the CPU reference for check_items sequences: the first ones and the last
    int *crow = xmalloc((size_t)check_items * sizeof(int));
    for (int i = 0; i < check_items; i++) crow[i] = i == check_items - 1 ? batch - 1 : i;
    float *ref = xcalloc((size_t)batch * qd, sizeof(float));
    const double t0 = now_sec();
    paged_decode_cpu(q, qd, kc, vc, bt, nb, B, crow, crow, lens, check_items, H, KV, hd, scale, ref, qd);
    const double cpu_s = now_sec() - t0;
    const double kv_read = (double)batch * L * kd * es * 2, dec_bytes = kv_read + (double)batch * qd * (4 + es);

    Table *t = table_new("step05 paged attention ladder: one decode row per sequence through its block table");
    table_std_meta(t);
    table_meta(t, "shape", "batch %d, context %d, %d query / %d kv heads, head_dim %d, block size %d, %s cache", batch, L, H,
               KV, hd, B, dname);
    table_meta(t, "kv_bytes_read", "%.1f MB (batch * context * kv_heads * head_dim * 2 * %zu B)", kv_read / 1e6, es);
    table_col(t, "kernel", NULL);
    table_col(t, "ms", "%.4f");
    table_col(t, "gb_s", "%.1f");
    table_col(t, "pct_copy", "%.1f");
    table_col(t, "mbytes", "%.1f");
    table_col(t, "max_rel_err", "%.2e");
    table_col(t, "launches", "%.0f");
    table_col(t, "what", NULL);

    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        table_meta(t, "device", "none: %s (the CUDA rows are skipped; the CPU reference alone ran)", gi.reason);
        table_row(t);
        table_str(t, "kernel", "cpu_reference");
        table_num(t, "ms", cpu_s * 1e3);
        table_num(t, "mbytes", (double)check_items / batch * dec_bytes / 1e6);
        table_str(t, "what", "fp32 CPU reference (paged_attention_cpu.c), check items only");
        table_print(t, outfmt_from_args(argc, argv), stdout);
        table_free(t);
        return 0;
    }
    const int nsms = pa_num_sms();
    table_meta(t, "device", "%s (sm_%d%d, %d SMs)", gi.name, gi.cc_major, gi.cc_minor, nsms);
    const char *copy_src;
    double rd = 0;
    copy_gbps = roofline_copy_gbps(copy_gbps, &copy_src, &rd);
    table_meta(t, "copy_gbps", "%.1f (%s)", copy_gbps, copy_src);
    if (rd > 0) table_meta(t, "read_gbps", "%.1f (read-only, same measurement)", rd);
    const int rule = paged_decode_choose(batch, KV, L, nsms);
    const int simt = H / KV <= paged_decode_simt_max_g() || !paged_decode_mma_ok(dt, hd);
    table_meta(t, "rule", "v%d: %s", rule,
               L <= PA_PART ? "the context fits one partition"
               : rule == 1 ? "batch * kv_heads >= PA_V1_CTAS_PER_SM CTAs per SM (or PAGED_DECODE_V1_CTAS)"
                           : "batch * kv_heads < PA_V1_CTAS_PER_SM CTAs per SM (or PAGED_DECODE_V1_CTAS) and the context spans partitions");
    table_meta(t, "v2_partition", "%d keys", part);
    table_meta(t, "default_loop", "%s", !simt ? "tensor cores (mma.sync m16n8k16, variant 4)"
                                        : paged_decode_mma_ok(dt, hd) ? "SIMT (the GQA group is at most paged_decode_simt_max_g() heads)"
                                                                      : "SIMT (the tensor-core loop does not take this dtype / hd / device)");
    table_meta(t, "timing", "CUDA events, %d warm-up runs, median of %d", warmup, reps);
    if (dec_bytes < 2.0 * gi.l2_bytes)
        table_meta(t, "note", "the K/V (%.1f MB) is under twice the L2 (%.1f MB): timings are partly cache-resident",
                   dec_bytes / 1e6, gi.l2_bytes / 1e6);
    table_meta(t, "cpu_reference", "%d sequences, %.3f s on the host", check_items, cpu_s);

    // ---- device buffers
    float *dq = pa_dev_alloc((size_t)batch * qd * 4);
    void *dk = pa_dev_alloc(prow * kd * es), *dv = pa_dev_alloc(prow * kd * es);
    void *ck = pa_dev_alloc((size_t)batch * L * kd * es), *cv = pa_dev_alloc((size_t)batch * L * kd * es);
    void *dout = pa_dev_alloc((size_t)batch * qd * 4);
    int *dbt = pa_dev_alloc((size_t)batch * nb * 4), *ditem = pa_dev_alloc((size_t)4 * batch * 4);
    const int nparts = (L + part - 1) / part, nsplit = (L + 127) / 128;
    const size_t part_cap = (size_t)batch * H * (nparts > nsplit ? nparts : nsplit) * hd;
    float *po = pa_dev_alloc(part_cap * 4), *pm = pa_dev_alloc(part_cap / hd * 8);
    const int WT = 8192;
    float *wk = pa_dev_alloc((size_t)WT * kd * 4), *wv = pa_dev_alloc((size_t)WT * kd * 4);
    int *wslots = pa_dev_alloc((size_t)WT * 4);
    if (!dq || !dk || !dv || !ck || !cv || !dout || !dbt || !ditem || !po || !pm || !wk || !wv || !wslots)
        die("out of device memory for this shape");
    pa_upload(dq, q, (size_t)batch * qd * 4);
    pa_upload_as(dt, dk, kc, prow * kd), pa_upload_as(dt, dv, vc, prow * kd);
    pa_upload(dbt, bt, (size_t)batch * nb * 4);
    pa_upload(ditem, rows, (size_t)batch * 4), pa_upload(ditem + batch, seqs, (size_t)batch * 4);
    pa_upload(ditem + 2 * batch, lens, (size_t)batch * 4), pa_upload(ditem + 3 * batch, bases, (size_t)batch * 4);
    for (int s = 0; s < batch; s++)  // step04's contiguous slots: sequence s at rows s*L ..
        if (paged_gather(dt, dk, dv, dbt, nb, B, s, L, kd, (char *)ck + (size_t)s * L * kd * es,
                         (char *)cv + (size_t)s * L * kd * es))
            die("gather refused");
    {   // the K/V write's inputs: fresh rows to shuffled pool rows (every 8th a padding -1)
        float *h = rng_new_uniform(&rng, (size_t)WT * kd, -1.0f, 1.0f);
        pa_upload(wk, h, (size_t)WT * kd * 4), pa_upload(wv, h, (size_t)WT * kd * 4);
        free(h);
        int *sl = xmalloc((size_t)WT * sizeof(int));
        for (int i = 0; i < WT; i++) sl[i] = i % 8 == 7 ? -1 : (int)(((size_t)i * 2654435761u) % prow);
        pa_upload(wslots, sl, (size_t)WT * 4);
        free(sl);
    }
    if (pa_sync()) die("device setup failed");

    Ctx c = {0};
    c.pd = (PagedDecode){dt, H, KV, hd, scale, dq, qd, dk, dv, dbt, nb, B, ditem, ditem + batch, ditem + 2 * batch, batch,
                         L, dout, qd, 0, po, pm, part_cap, part, 0, NULL, 0};
    c.nsms = nsms, c.dt = dt, c.ck = ck, c.cv = cv, c.rows = ditem, c.lens = ditem + 2 * batch, c.bases = ditem + 3 * batch;
    c.n = batch, c.L = L, c.H = H, c.KV = KV, c.hd = hd, c.out = dout, c.po = po, c.pm = pm, c.part_cap4 = part_cap;
    c.kc = dk, c.vc = dv, c.bt = dbt, c.bt_stride = nb, c.B = B, c.kd = kd, c.gk = ck, c.gv = cv;
    c.wk = wk, c.wv = wv, c.wslots = wslots;
    float *out = xmalloc((size_t)batch * qd * sizeof(float));
    float *g1 = xmalloc((size_t)L * kd * sizeof(float)), *g2 = xmalloc((size_t)L * kd * sizeof(float));
    int failed = 0;
    for (int li = 0; li < N_LADDER; li++) {
        void (*fn)(void *) = NULL;
        double bytes = 0, err = NAN;
        int launches = 1;
        c.launch_err = 0;
        if (LADDER[li].kind == K_DECODE || LADDER[li].kind == K_STEP04) {
            fn = LADDER[li].kind == K_STEP04 ? run_step04 : run_paged;
            c.version = LADDER[li].version, c.pd.variant = LADDER[li].variant;
            bytes = dec_bytes;
            // check: poison, one run, compare the checked sequences
            for (size_t i = 0; i < (size_t)batch * qd; i++) out[i] = NAN;
            pa_upload_as(dt, dout, out, (size_t)batch * qd);
            if (LADDER[li].kind == K_STEP04)
                launches = step04_decode_attention_dev(dt, dq, qd, ck, cv, c.rows, c.lens, c.bases, batch, L, H, KV, hd,
                                                       dout, po, pm, part_cap);
            else
                launches = c.version == 1 ? paged_decode_v1(&c.pd) : c.version == 2 ? paged_decode_v2(&c.pd) : paged_decode(&c.pd, nsms);
            if (launches < 0 || pa_sync()) die("%s: launch failed", LADDER[li].id);
            pa_download_f32(dt, out, dout, (size_t)batch * qd);
            err = 0;
            for (int i = 0; i < check_items; i++) {
                ErrStats e = compare_f32(out + (size_t)crow[i] * qd, ref + (size_t)crow[i] * qd, (size_t)qd);
                if (e.n_bad) err = INFINITY;
                else if (e.max_rel > err) err = e.max_rel;
            }
            if (!(err < 2 * ERR_TOL_HALF)) failed = 1;
        } else if (LADDER[li].kind == K_GATHER) {
            fn = run_gather;
            bytes = 2.0 * kv_read;
            launches = batch;
            run_gather(&c);
            if (c.launch_err || pa_sync()) die("gather: launch failed");
            pa_download_f32(dt, g1, ck, (size_t)L * kd);
            pa_download_f32(dt, g2, cv, (size_t)L * kd);
            size_t bad = 0;
            for (int p = 0; p < L; p++) {
                const size_t r = (size_t)bt[p / B] * B + p % B;
                for (int e = 0; e < kd; e++) bad += g1[(size_t)p * kd + e] != kc[r * kd + e] || g2[(size_t)p * kd + e] != vc[r * kd + e];
            }
            err = (double)bad;
            if (bad) failed = 1;
        } else {
            fn = run_kv_write;
            c.wT = LADDER[li].kind == K_WRITE_DECODE ? batch : WT;
            bytes = (double)c.wT * kd * 2 * (4 + es);
            err = NAN;  // its exactness is tests/test_step05_gpu.c's (kv_write_through_slot_mapping_matches_cpu)
        }
        const double ms = gpu_bench(fn, &c, warmup, reps, 1);
        if (c.launch_err) die("%s: a timed launch failed", LADDER[li].id);
        table_row(t);
        table_str(t, "kernel", LADDER[li].id);
        table_num(t, "ms", ms);
        table_num(t, "gb_s", bytes / (ms * 1e-3) / 1e9);
        table_num(t, "pct_copy", copy_gbps > 0 ? 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbps : NAN);
        table_num(t, "mbytes", bytes / 1e6);
        table_num(t, "max_rel_err", err);
        table_num(t, "launches", launches);
        table_str(t, "what", LADDER[li].what);
    }
    table_meta(t, "check", "%s (decode rows: max relative error of %d sequences vs the fp32 CPU reference, tolerance %.0e; "
               "gather: elements differing from the CPU gather of sequence 0)", failed ? "FAILED" : "passed", check_items,
               2 * ERR_TOL_HALF);
    table_print(t, outfmt_from_args(argc, argv), stdout);
    table_free(t);
    void *dps[] = {dq, dk, dv, ck, cv, dout, dbt, ditem, po, pm, wk, wv, wslots};
    for (size_t i = 0; i < sizeof dps / sizeof dps[0]; i++) pa_dev_free(dps[i]);
    free(perm), free(bt), free(kc), free(vc), free(q), free(rows), free(seqs), free(lens), free(bases), free(crow);
    free(ref), free(out), free(g1), free(g2);
    return failed;
}
