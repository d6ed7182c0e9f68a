// qgemm_bench.c — step06's quantized linear kernels (qlinear_gpu.h) against bf16 on the
// Llama-3.1-8B layer shapes: does 4-bit (8-bit) make a linear layer ~4x (~2x) faster when it is
// bound by its weight bytes, and up to how many tokens does that hold?
//
//   build/bin/qgemm_bench [--T 1,16,64] [--shapes qkv,o,gate_up,down] [--group 128] [--asym]
//                         [--act-order] [--formats bf16,int8,int4,int4_simt] [--reps 50]
//                         [--warmup 10] [--copy-gbps X] [--csv FILE]
//
// For each shape (out x in) and T, one row per format:
//   bf16       T = 1: step03's GEMV (v2_r1u8, what the decoder runs); T > 1: step02's gemm_xwt
//              (cuBLAS), bf16 X and W
//   int8       per-channel symmetric INT8: qlinear_gpu_gemv (T = 1) / qlinear_gpu_gemm (bf16 X)
//   int4       INT4, --group columns per group (symmetric unless --asym): the same calls
//              (T = 1: one row per version of the GEMV ladder, qlinear_gemv_version_name; the
//              engine runs v1 unless told otherwise)
//   int4_simt  (T > 1) the INT4 GEMM with the SIMT fallback forced (what sm_75 runs)
// Random integers and scales (every value in range), timed with CUDA events (gpu_bench: warm-up,
// median of --reps samples) over enough copies of the layer (>= 512 MB) that the weights come
// from memory, not the L2. GB/s counts the bytes read: weights + scales + zeros (+ the act-order
// permutation) + x; % of the device copy bandwidth measured in the same run (step01's
// roofline_gpu_bandwidth); TFLOP/s = 2 T out in / time. Every quantized row is first validated:
// the GEMV against linear_q_cpu on one x (tolerance 1e-3 of max|ref|), the GEMM on the first and
// last of its T tokens against linear_q_cpu on the same bf16-rounded rows (tolerance 2e-2).
// Without a GPU it says so and exits 0.
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
#include "step01_matmul/roofline_gpu.h"  // roofline_copy_gbps
#include "step03_kvcache/kvcache.h"      // gemv_gpu_bench_gbps: the bf16 GEMV baseline
#include "step05_paged/paged_attention.h"  // pa_dev_alloc, pa_upload(_as), pa_download, pa_sync
#include "step06_quant/qlinear_bench_gpu.h"
#include "step06_quant/qlinear_gpu.h"
#include "step06_quant/quant.h"
#include "table.h"

typedef struct {
    const char *name;
    int rows, cols;  // out_features, in_features
} Shape;
static const Shape SHAPES[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
#define N_SHAPES 4
static const char *const FORMATS[] = {"bf16", "int8", "int4", "int4_simt"};
#define N_FORMATS 4
static const char *shape_name(int k) { return SHAPES[k].name; }
static const char *format_name(int k) { return FORMATS[k]; }
#define BF16_GEMV_VERSION 1  // decode_gpu.cu's v2_r1u8, the decoder's default

static void usage(FILE *f) {
    fprintf(f,
            "usage: qgemm_bench [--T LIST] [--shapes LIST] [--group G] [--asym] [--act-order] [--formats LIST]\n"
            "                   [--reps R] [--warmup W] [--copy-gbps X] [--seed S] [--csv FILE]\n"
            "  --T          token counts (default 1,16,64): 1 times the GEMV, more the GEMM\n"
            "  --shapes     of qkv (6144x4096), o (4096x4096), gate_up (28672x4096), down (4096x14336): default all\n"
            "  --group      INT4 columns per group (default 128; -1: per channel); INT8 is per channel\n"
            "  --asym       INT4 with zero points (default symmetric)\n"
            "  --act-order  a GPTQ act-order g_idx (the columns permuted at load, x gathered at run time)\n"
            "  --formats    rows to time, of bf16, int8, int4, int4_simt (default all; without bf16 the\n"
            "               x_bf16 column is empty)\n"
            "  --reps       timed samples, median reported (default 50), after --warmup (default 10)\n"
            "  --copy-gbps  the bandwidth ceiling (default: measured now, device copy, read + write counted)\n"
            "  --csv FILE   also write the table as CSV to FILE\n");
}

// on[k] = 1 for each of the n names (name(k)) that the comma-separated list s gives, 0 for the
// rest; an unknown name ends the program with opt's error.
static void arg_names(const char *opt, const char *s, const char *(*name)(int), int n, int *on) {
    char buf[256], all[256] = "";
    snprintf(buf, sizeof buf, "%s", s);
    for (int k = 0; k < n; k++) on[k] = 0, snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", k ? ", " : "", name(k));
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int k = 0;
        while (k < n && strcmp(tok, name(k))) k++;
        if (k == n) arg_die("%s: '%s' is not one of %s", opt, tok, all);
        on[k] = 1;
    }
}

// A random QWeight (quant.h's qweight_random: every integer equally likely, scales in [0.5, 1.5) / 64).
static void make_qweight(Rng *r, QuantKind kind, int rows, int cols, int group, int sym, int act, QWeight *w) {
    if (qweight_random(w, r, kind, rows, cols, group, sym, act) != 0)
        die("qweight_random: bad sizes %d x %d g%d", rows, cols, group);
}

typedef struct {
    QLinearGpu **L;
    int n, at, T, cols, rows, err;
    const float *x;  // GEMV input (cols) fp32
    const void *X;   // GEMM input (T, cols) bf16
    float *Y;
} Ctx;

static void run_q(void *p) {
    Ctx *c = p;
    QLinearGpu *q = c->L[c->at];
    c->at = (c->at + 1) % c->n;
    const int rc = c->T == 1 ? qlinear_gpu_gemv(q, c->x, NULL, c->Y, 0, NULL)
                             : qlinear_gpu_gemm(q, ST_BF16, c->T, c->X, c->cols, c->Y, c->rows, 0.0f, NULL);
    if (rc != 0) c->err = 1;
}

int main(int argc, char **argv) {
    int nT = 3, *Ts = NULL, group = 128, asym = 0, act = 0, reps = 50, warmup = 10;
    int use[N_SHAPES] = {1, 1, 1, 1}, fmt[N_FORMATS] = {1, 1, 1, 1};
    uint64_t seed = 11;
    double copy_gbps = 0;
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--T") && more) free(Ts), Ts = arg_int_list(a, argv[++i], 1, 4096, &nT);
        else if (!strcmp(a, "--shapes") && more) arg_names(a, argv[++i], shape_name, N_SHAPES, use);
        else if (!strcmp(a, "--formats") && more) arg_names(a, argv[++i], format_name, N_FORMATS, fmt);
        else if (!strcmp(a, "--group") && more) group = (int)arg_int(a, argv[++i], -1, 1 << 20);
        else if (!strcmp(a, "--asym")) asym = 1;
        else if (!strcmp(a, "--act-order")) act = 1;
        else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 1, 100000);
        else if (!strcmp(a, "--warmup") && more) warmup = (int)arg_int(a, argv[++i], 0, 100000);
        else if (!strcmp(a, "--copy-gbps") && more) copy_gbps = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--seed") && more) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--csv") && more) csv = argv[++i];
        else arg_help_or_unknown(a, usage);
    }
    if (!Ts) {
        Ts = xmalloc(3 * sizeof(int));
        Ts[0] = 1, Ts[1] = 16, Ts[2] = 64;
    }
    if (group == 0 || (group > 0 && group % 32 != 0)) arg_die("--group %d: use a multiple of 32, or -1 (per channel)", group);
    if (act && group < 0) arg_die("--act-order needs groups (not --group -1)");
    for (int k = 0; k < N_SHAPES; k++)
        if (use[k] && group > 0 && SHAPES[k].cols % group) arg_die("--group %d does not divide %s's %d columns", group, SHAPES[k].name, SHAPES[k].cols);

    Table *t = table_new("step06 quantized linear layers vs bf16: Llama-3.1-8B shapes");
    table_std_meta(t);
    char g4[32];
    if (group < 0) snprintf(g4, sizeof g4, "per-channel");
    else snprintf(g4, sizeof g4, "g%d", group);
    table_meta(t, "formats", "bf16; int8 per-channel sym; int4 %s %s%s", g4, asym ? "asym" : "sym", act ? " act-order" : "");
    table_col(t, "shape", NULL);
    table_col(t, "T", "%.0f");
    table_col(t, "format", NULL);
    table_col(t, "us", "%.2f");
    table_col(t, "gb_s", "%.0f");
    table_col(t, "pct_copy", "%.1f");
    table_col(t, "tflops", "%.1f");
    table_col(t, "x_bf16", "%.2f");
    table_col(t, "mbytes", "%.2f");
    table_col(t, "max_rel_err", "%.2e");
    table_col(t, "kernel", NULL);

    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        table_meta(t, "device", "none: %s (nothing to time: the kernels are CUDA only)", gi.reason);
        table_print(t, FMT_TEXT, stdout);
        table_free(t);
        free(Ts);
        return 0;
    }
    table_meta(t, "device", "%s (sm_%d%d, %d SMs, L2 %.0f MB)", gi.name, gi.cc_major, gi.cc_minor, gi.sms, gi.l2_bytes / 1e6);
    const char *copy_src;
    copy_gbps = roofline_copy_gbps(copy_gbps, &copy_src, NULL);
    table_meta(t, "copy_gbps", "%.1f (%s)", copy_gbps, copy_src);
    table_meta(t, "timing", "CUDA events, %d warm-up calls, median of %d samples, each over >= 512 MB of layer copies",
               warmup, reps);
    table_meta(t, "bytes", "read: weights + scales + zeros (+ permutation) + x (fp32 for T = 1, bf16 for T > 1)");

    Rng rng;
    rng_seed(&rng, seed);
    int failed = 0;
    for (int si = 0; si < N_SHAPES; si++) {
        if (!use[si]) continue;
        const Shape *S = &SHAPES[si];
        const int rows = S->rows, cols = S->cols;
        int maxT = 1;
        for (int i = 0; i < nT; i++) maxT = Ts[i] > maxT ? Ts[i] : maxT;
        float *x = rng_new_uniform(&rng, (size_t)maxT * cols, -1, 1);
        matmul_round_to_dtype(MM_BF16, x, (long)maxT * cols);  // what the GEMM reads (the GEMV reads it as fp32)
        float *dx = pa_dev_alloc((size_t)cols * 4), *dY = pa_dev_alloc((size_t)maxT * rows * 4);
        void *dX = pa_dev_alloc((size_t)maxT * cols * 2);
        if (!dx || !dY || !dX) die("out of device memory for %s", S->name);
        pa_upload(dx, x, (size_t)cols * 4);
        pa_upload_as(ST_BF16, dX, x, (size_t)maxT * cols);
        float *ref = xmalloc((size_t)2 * rows * sizeof(float)), *out = xmalloc((size_t)maxT * rows * sizeof(float));
        float *x2 = xmalloc((size_t)2 * cols * sizeof(float));
        double bf16_us[64] = {0};
        for (int ti = 0; fmt[0] && ti < nT && ti < 64; ti++) {  // bf16 baseline first
            const int T = Ts[ti];
            const double wb = (double)rows * cols * 2, xb = T == 1 ? 4.0 * cols : 2.0 * T * cols;
            double ms;
            if (T == 1) {
                const double gbps = gemv_gpu_bench_gbps(BF16_GEMV_VERSION, rows, cols, ST_BF16);  // counts W + x + y
                ms = (wb + 4.0 * cols + 4.0 * rows) / gbps * 1e-6;
            } else {
                ms = qbench_bf16_gemm_ms(T, rows, cols, warmup, reps);
            }
            if (!(ms > 0)) die("%s T %d: the bf16 baseline failed", S->name, T);
            bf16_us[ti] = ms * 1e3;
            table_row(t);
            table_str(t, "shape", S->name), table_num(t, "T", T), table_str(t, "format", "bf16");
            table_num(t, "us", ms * 1e3);
            table_num(t, "gb_s", (wb + xb) / (ms * 1e-3) / 1e9);
            table_num(t, "pct_copy", copy_gbps > 0 ? 100.0 * (wb + xb) / (ms * 1e-3) / 1e9 / copy_gbps : NAN);
            table_num(t, "tflops", T > 1 ? 2.0 * T * rows * cols / (ms * 1e-3) / 1e12 : NAN);
            table_num(t, "x_bf16", 1.0);
            table_num(t, "mbytes", (wb + xb) / 1e6);
            table_str(t, "kernel", T == 1 ? "step03 GEMV v2_r1u8" : "cuBLAS gemm_xwt (bf16, fp32 accumulate)");
        }
        for (int kind = 0; kind < 2; kind++) {
            if (!(kind == 0 ? fmt[1] : fmt[2] || fmt[3])) continue;
            QWeight w;
            const int g = kind == 0 || group < 0 ? cols : group;
            make_qweight(&rng, kind == 0 ? QK_INT8 : QK_INT4, rows, cols, g, kind == 0 ? 1 : !asym, kind == 1 && act, &w);
            char err[256];
            QLinearGpu *q0 = qlinear_gpu_new(&w, err, sizeof err);
            if (!q0) die("%s: %s", S->name, err);
            const size_t lb = qlinear_gpu_bytes(q0);
            const int n = (int)(lb >= ((size_t)512 << 20) ? 1 : (((size_t)512 << 20) + lb - 1) / lb);
            Ctx c = {0};
            c.L = xmalloc((size_t)n * sizeof(QLinearGpu *));
            c.L[0] = q0;
            for (int i = 1; i < n; i++)
                if (!(c.L[i] = qlinear_gpu_new(&w, err, sizeof err))) die("%s copy %d: %s", S->name, i, err);
            c.n = n, c.cols = cols, c.rows = rows, c.x = dx, c.X = dX, c.Y = dY;
            for (int ti = 0; ti < nT; ti++) {
                const int T = Ts[ti];
                // T = 1: every GEMV version; T > 1: the default GEMM and (INT4) the SIMT fallback
                const int nvar = T == 1 ? qlinear_gemv_n_versions() : kind == 1 ? 2 : 1;
                for (int path = 0; path < nvar; path++) {
                    if (kind == 1 && !fmt[T > 1 && path ? 3 : 2]) continue;
                    if (T == 1) qlinear_gemv_set_version(path);
                    else
                        for (int i = 0; i < n; i++) qlinear_gpu_set_gemm_path(c.L[i], path ? QLINEAR_GEMM_SIMT : QLINEAR_GEMM_AUTO);
                    // validate: the GEMV on x; the GEMM on tokens 0 and T-1
                    c.T = T, c.at = 0, c.err = 0;
                    run_q(&c);
                    if (c.err || pa_sync()) die("%s %s T %d: launch failed", S->name, kind ? "int4" : "int8", T);
                    pa_download(out, dY, (size_t)T * rows * 4);
                    double e;
                    if (T == 1) {
                        linear_q_cpu(x, &w, NULL, 1, ref);
                        e = compare_f32(out, ref, (size_t)rows).max_rel;
                    } else {
                        memcpy(x2, x, (size_t)cols * sizeof(float));
                        memcpy(x2 + cols, x + (size_t)(T - 1) * cols, (size_t)cols * sizeof(float));
                        linear_q_cpu(x2, &w, NULL, 2, ref);
                        const double e0 = compare_f32(out, ref, (size_t)rows).max_rel;
                        const double e1 = compare_f32(out + (size_t)(T - 1) * rows, ref + rows, (size_t)rows).max_rel;
                        e = e0 > e1 ? e0 : e1;
                    }
                    if (!(e < (T == 1 ? 1e-3 : 2e-2))) failed = 1;
                    const double ms = gpu_bench(run_q, &c, warmup + n, reps, n);
                    if (c.err) die("%s: a timed launch failed", S->name);
                    const double bytes = (double)lb + (T == 1 ? 4.0 * cols : 2.0 * T * cols);
                    table_row(t);
                    table_str(t, "shape", S->name), table_num(t, "T", T);
                    table_str(t, "format", kind == 0 ? "int8" : T > 1 && path ? "int4_simt" : "int4");
                    table_num(t, "us", ms * 1e3);
                    table_num(t, "gb_s", bytes / (ms * 1e-3) / 1e9);
                    table_num(t, "pct_copy", copy_gbps > 0 ? 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbps : NAN);
                    table_num(t, "tflops", T > 1 ? 2.0 * T * rows * cols / (ms * 1e-3) / 1e12 : NAN);
                    table_num(t, "x_bf16", ti < 64 && bf16_us[ti] > 0 ? bf16_us[ti] / (ms * 1e3) : NAN);
                    table_num(t, "mbytes", bytes / 1e6);
                    table_num(t, "max_rel_err", e);
                    char kname[256];
                    snprintf(kname, sizeof kname, "qlinear_gpu_gemv %s", qlinear_gemv_version_name(path));
                    table_str(t, "kernel", T == 1 ? kname : qlinear_gpu_describe(c.L[0]));
                }
                qlinear_gemv_set_version(-1);
            }
            for (int i = 0; i < n; i++) qlinear_gpu_free(c.L[i]);
            free(c.L);
            qweight_free(&w);
        }
        pa_dev_free(dx), pa_dev_free(dY), pa_dev_free(dX);
        free(x), free(ref), free(out), free(x2);
    }
    table_meta(t, "check", "%s (GEMV: max relative error vs linear_q_cpu, tolerance 1e-3; GEMM: tokens 0 and T-1, "
               "tolerance 2e-2)", failed ? "FAILED" : "passed");
    table_print(t, FMT_TEXT, stdout);
    if (csv) {
        FILE *f = fopen_check(csv, "w");
        table_print(t, FMT_CSV, f);
        fclose(f);
    }
    table_free(t);
    free(Ts);
    return failed;
}
