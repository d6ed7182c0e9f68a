// matmul.c — the matmul ladder: every CPU and GPU version, validated, then timed, in one table.
//
//   build/bin/matmul                       CPU rows at 1024^3, GPU rows at 4096^3 (if a GPU is here)
//   build/bin/matmul --device cuda --size 4096
//   build/bin/matmul --mnk 4096,4096,1024 --versions cublas_hgemm,v8_mma_f16 --csv
//
// What it teaches: how far each idea (coalescing, tiling, register blocking, vector loads, warp
// tiling, tensor cores, TMA/wgmma) moves a GEMM toward the library and toward the measured peak
// of the chip. Every version is first checked on fresh random inputs at an odd shape (default
// 1000x999x1001, a multiple of no tile size) against a float64 reference; a version over its
// error bound is reported FAILED and never timed. Then it is timed at the benchmark size, and
// its output there is compared with the library's (OpenBLAS on the CPU, cuBLAS of the same
// dtype on the GPU). The versions come from the tables in matmul_cpu.h and matmul_gpu.h only.
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ceilings.h"
#include "check.h"
#include "compare.h"
#include "cpu_env.h"
#include "gpu.h"
#include "matmul_cpu.h"
#include "matmul_gpu.h"
#include "rng.h"
#include "table.h"
#include "timer.h"

typedef struct {
    int do_cpu, do_gpu;         // what was asked (--device)
    int M, N, K;                // benchmark shape; 0 = per-device default
    int cM, cN, cK;             // check shape
    int reps;                   // 0 = per-device default
    const char *versions;       // comma list of names, NULL = all
    unsigned long long seed;
} Opts;

// Measured peaks (from build/bin/roofline via ceilings.h), in TFLOP/s; NaN when unknown.
typedef struct {
    double gpu_f32, gpu_f16, gpu_bf16, cpu_f32;
    char note[512];
} Peaks;

static void usage(FILE *f) {
    fprintf(f,
            "usage: matmul [--device cpu|cuda|all] [--size N | --mnk M,N,K] [--check M,N,K]\n"
            "              [--reps R] [--versions a,b,c] [--seed S] [--csv | --json] [-h]\n"
            "  --device    which ladder to run (default all; cuda rows only when a GPU is present)\n"
            "  --size N    square benchmark shape N x N x N (default: 1024 on the CPU, 4096 on the GPU)\n"
            "  --mnk       benchmark shape M,N,K: A (M,K) times B (K,N)\n"
            "  --check     the odd shape every version is validated on first (default 1000,999,1001)\n"
            "  --reps R    timed runs; the median is reported (default: 3 on the CPU, 20 on the GPU)\n"
            "  --versions  only these versions (comma list of names); library rows always run\n"
            "  --csv/--json machine-readable output (the table's meta lines say how it was measured)\n");
}

// Largest M, N or K: a 32768^2 fp32 matrix is already 4 GiB.
#define MAX_DIM 32768

static void parse_mnk(const char *opt, const char *s, int *M, int *N, int *K) {
    int n;
    int *v = arg_int_list(opt, s, 1, MAX_DIM, &n);
    if (n == 3) *M = v[0], *N = v[1], *K = v[2];
    free(v);
    if (n != 3) arg_die("%s: '%s' has %d values, want M,N,K", opt, s, n);
}

static void parse_args(int argc, char **argv, Opts *o) {
    memset(o, 0, sizeof *o);
    o->do_cpu = o->do_gpu = 1;
    o->cM = 1000, o->cN = 999, o->cK = 1001;
    o->seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) {
            // read by outfmt_from_args
        } else if (!v) {
            usage(stderr);
            arg_die("option %s needs a value (or is unknown)", a);
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) o->do_cpu = 1, o->do_gpu = 0;
            else if (!strcmp(v, "cuda") || !strcmp(v, "gpu")) o->do_cpu = 0, o->do_gpu = 1;
            else if (!strcmp(v, "all")) o->do_cpu = o->do_gpu = 1;
            else arg_die("--device: '%s' is not a device (allowed: cpu, cuda, all)", v);
            i++;
        } else if (!strcmp(a, "--size")) {
            o->M = o->N = o->K = (int)arg_int(a, v, 1, MAX_DIM);
            i++;
        } else if (!strcmp(a, "--mnk")) {
            parse_mnk(a, v, &o->M, &o->N, &o->K);
            i++;
        } else if (!strcmp(a, "--check")) {
            parse_mnk(a, v, &o->cM, &o->cN, &o->cK);
            i++;
        } else if (!strcmp(a, "--reps")) {
            o->reps = (int)arg_int(a, v, 1, 1000);
            i++;
        } else if (!strcmp(a, "--versions")) {
            o->versions = v;
            i++;
        } else if (!strcmp(a, "--seed")) {
            o->seed = arg_u64(a, v);
            i++;
        } else {
            usage(stderr);
            arg_die("unknown option '%s'", a);
        }
    }
}

// Is `name` in the comma list (or is there no list)?
static int selected(const char *list, const char *name) {
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

// Every name in --versions must be a version of one of the two tables; an unknown name is an
// error that lists the valid ones (a typo must not silently run nothing).
static void check_versions(const char *list) {
    if (!list) return;
    int n = 0;
    for (const char *p = list;; p++) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        n++;
        if (len == 0) arg_die("--versions: '%s': name %d is empty", list, n);
        int known = 0;
        for (int i = 0; i < matmul_cpu_nversions; i++)
            known |= strlen(matmul_cpu_versions[i].name) == len && !strncmp(p, matmul_cpu_versions[i].name, len);
        for (int i = 0; i < matmul_gpu_nversions(); i++)
            known |= strlen(matmul_gpu_version(i)->name) == len && !strncmp(p, matmul_gpu_version(i)->name, len);
        if (!known) {
            char valid[1024];
            int k = snprintf(valid, sizeof valid, "cpu:");
            for (int i = 0; i < matmul_cpu_nversions && k < (int)sizeof valid; i++)
                k += snprintf(valid + k, sizeof valid - (size_t)k, "%s%s", i ? "," : " ", matmul_cpu_versions[i].name);
            if (k < (int)sizeof valid) k += snprintf(valid + k, sizeof valid - (size_t)k, "; cuda:");
            for (int i = 0; i < matmul_gpu_nversions() && k < (int)sizeof valid; i++)
                k += snprintf(valid + k, sizeof valid - (size_t)k, "%s%s", i ? "," : " ", matmul_gpu_version(i)->name);
            if (!matmul_gpu_nversions() && k < (int)sizeof valid)
                snprintf(valid + k, sizeof valid - (size_t)k, " none (this build has no CUDA)");
            arg_die("--versions: unknown version '%.*s' (valid: %s)", (int)len, p, valid);
        }
        if (!e) break;
        p = e;
    }
}

static const char *dtype_name(MmDtype d) { return d == MM_F16 ? "fp16" : d == MM_BF16 ? "bf16" : "fp32"; }

// The error bounds, on max_rel = max|out - ref| / max|ref| against the float64 reference.
// fp32: each output is a K-term fp32 dot product; its rounding error grows about like sqrt(K)
// eps for random data, so the bound is 1e-5 up to K = 1024 and grows as sqrt(K / 1024) after.
// fp16/bf16: inputs are rounded before the reference is computed (so input rounding is not
// counted); what is left is fp32 accumulation plus the rounding of C itself to fp16 (2^-11)
// or bf16 (2^-8), well inside 1e-2.
static double err_bound(MmDtype d, int K) {
    if (d != MM_F32) return ERR_TOL_HALF;
    return ERR_TOL_FP32 * (K > 1024 ? sqrt(K / 1024.0) : 1.0);
}

// build/ceilings.json is written by build/bin/roofline. GPU peaks count only if the file names
// this GPU (a file from another machine would make the percentages meaningless).
static void read_peaks(Peaks *p, const char *gpu_name) {
    p->gpu_f32 = p->gpu_f16 = p->gpu_bf16 = p->cpu_f32 = NAN;
    Ceilings c;
    if (ceilings_load(&c) != 0) {
        snprintf(p->note, sizeof p->note, "no %s (run build/bin/roofline on this machine first): pct_of_peak is '-'",
                 ceilings_path());
        return;
    }
    if (c.cpu_fp32_gflops > 0) p->cpu_f32 = c.cpu_fp32_gflops / 1000.0;
    if (gpu_name && !strcmp(c.gpu_name, gpu_name)) {
        if (c.gpu_fp32_tflops > 0) p->gpu_f32 = c.gpu_fp32_tflops;
        if (c.gpu_fp16_tflops > 0) p->gpu_f16 = c.gpu_fp16_tflops;
        if (c.gpu_bf16_tflops > 0) p->gpu_bf16 = c.gpu_bf16_tflops;
        snprintf(p->note, sizeof p->note,
                 "pct_of_peak: of the peaks roofline measured (%s): fp32 = FMA-kernel peak, fp16/bf16 = "
                 "cuBLAS GEMM peak, CPU = fp32 peak", ceilings_path());
    } else if (gpu_name) {
        snprintf(p->note, sizeof p->note, "%s is for GPU '%s', not this one: GPU pct_of_peak is '-'",
                 ceilings_path(), c.gpu_name);
    } else {
        snprintf(p->note, sizeof p->note, "pct_of_peak: of the CPU fp32 peak roofline measured (%s)", ceilings_path());
    }
}

static double peak_for(const Peaks *c, int gpu, MmDtype d) {
    if (!gpu) return d == MM_F32 ? c->cpu_f32 : NAN;
    return d == MM_F16 ? c->gpu_f16 : d == MM_BF16 ? c->gpu_bf16 : c->gpu_f32;
}

static void table_setup(Table *t) {
    table_col(t, "device", NULL);
    table_col(t, "version", NULL);
    table_col(t, "dtype", NULL);
    table_col(t, "M", "%.0f");
    table_col(t, "N", "%.0f");
    table_col(t, "K", "%.0f");
    table_col(t, "ms", "%.3f");
    table_col(t, "min_ms", "%.3f");
    table_col(t, "max_ms", "%.3f");
    table_col(t, "TFLOP/s", "%.4g");
    table_col(t, "pct_of_library", "%.1f");
    table_col(t, "pct_of_peak", "%.1f");
    table_col(t, "max_rel_err", "%.2e");
    table_col(t, "err_vs_lib", "%.2e");
    table_col(t, "status", NULL);
}

// One row's common cells.
static void row_start(Table *t, const char *dev, const char *name, MmDtype d, int M, int N, int K) {
    table_row(t);
    table_str(t, "device", dev);
    table_str(t, "version", name);
    table_str(t, "dtype", dtype_name(d));
    table_num(t, "M", M);
    table_num(t, "N", N);
    table_num(t, "K", K);
}

// max_rel of out against another implementation's output; infinite if either has a NaN/Inf
// (compare_f32 checks only `out`, and a NaN in the reference would otherwise compare as 0).
static double err_vs_lib(const float *out, const float *lib, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(lib[i])) return INFINITY;
    return compare_f32(out, lib, n).max_rel;
}

static double tflops(int M, int N, int K, double ms) { return 2.0 * M * N * (double)K / (ms * 1e-3) / 1e12; }

// ------------------------------------------------------------------ CPU ladder
typedef struct {
    MatmulCpuFn fn;
    int M, N, K;
    const float *A, *B;
    float *C;
} CpuCtx;

static void cpu_call(void *p) {
    CpuCtx *c = p;
    c->fn(c->M, c->N, c->K, c->A, c->B, c->C);
}

static int run_cpu(Table *t, const Opts *o, const Peaks *ce, Rng *rng) {
    int M = o->M ? o->M : 1024, N = o->N ? o->N : 1024, K = o->K ? o->K : 1024;
    int reps = o->reps ? o->reps : 3, failures = 0;
    long cm = o->cM, cn = o->cN, ck = o->cK;
    float *bA = rng_new_uniform(rng, (size_t)M * K, -1.0f, 1.0f), *bB = rng_new_uniform(rng, (size_t)K * N, -1.0f, 1.0f);
    float *bC = xmalloc((size_t)M * N * sizeof(float)), *libC = xmalloc((size_t)M * N * sizeof(float));
    double lib_ms = NAN;
    int have_lib = 0;
    for (int i = 0; i < matmul_cpu_nversions; i++) {
        const MatmulCpuVersion *v = &matmul_cpu_versions[i];
        int is_lib = (i == 0);
        if (!is_lib && !selected(o->versions, v->name)) continue;
        fprintf(stderr, "[cpu] %s: validating at %ldx%ldx%ld ...\n", v->name, cm, cn, ck);
        // validate on fresh inputs at the odd shape
        float *A = rng_new_uniform(rng, (size_t)cm * ck, -1.0f, 1.0f), *B = rng_new_uniform(rng, (size_t)ck * cn, -1.0f, 1.0f);
        float *C = xmalloc((size_t)(cm * cn) * sizeof(float));
        double *R = xmalloc((size_t)(cm * cn) * sizeof(double));
        for (long j = 0; j < cm * cn; j++) C[j] = NAN;
        v->fn((int)cm, (int)cn, (int)ck, A, B, C);
        matmul_ref_f64((int)cm, (int)cn, (int)ck, A, B, R);
        ErrStats e = compare_f32_f64(C, R, (size_t)(cm * cn));
        free(A), free(B), free(C), free(R);
        row_start(t, "cpu", v->name, MM_F32, M, N, K);
        table_num(t, "max_rel_err", e.max_rel);
        double bound = err_bound(MM_F32, (int)ck);
        if (!(e.max_rel <= bound)) {
            table_str(t, "status", "FAILED");
            failures++;
            continue;
        }
        fprintf(stderr, "[cpu] %s: timing at %dx%dx%d ...\n", v->name, M, N, K);
        CpuCtx c = {v->fn, M, N, K, bA, bB, is_lib ? libC : bC};
        for (long j = 0; j < (long)M * N; j++) c.C[j] = NAN;
        const TimeStats ts = bench_cpu_stats(cpu_call, &c, 1, reps);
        double ms = 1e3 * ts.median;
        table_num(t, "ms", ms);
        table_num(t, "min_ms", 1e3 * ts.min);
        table_num(t, "max_ms", 1e3 * ts.max);
        table_num(t, "TFLOP/s", tflops(M, N, K, ms));
        if (is_lib) lib_ms = ms, have_lib = 1;
        if (have_lib) {
            table_num(t, "pct_of_library", 100.0 * lib_ms / ms);
            double el = err_vs_lib(c.C, libC, (size_t)M * N);
            table_num(t, "err_vs_lib", el);
            table_str(t, "status", el <= err_bound(MM_F32, K) ? "ok" : "ok (differs from lib)");
        } else {
            table_str(t, "status", "ok");
        }
        double pk = peak_for(ce, 0, MM_F32);
        if (isfinite(pk)) table_num(t, "pct_of_peak", 100.0 * tflops(M, N, K, ms) / pk);
    }
    free(bA), free(bB), free(bC), free(libC);
    return failures;
}

// ------------------------------------------------------------------ GPU ladder
static int run_gpu(Table *t, const Opts *o, const Peaks *ce, Rng *rng) {
    int M = o->M ? o->M : 4096, N = o->N ? o->N : 4096, K = o->K ? o->K : 4096;
    int reps = o->reps ? o->reps : 20, failures = 0;
    long cm = o->cM, cn = o->cN, ck = o->cK;
    int nv = matmul_gpu_nversions();
    // One set of benchmark inputs; for fp16/bf16 versions rounded copies, so the library of that
    // dtype and the versions see the same values.
    float *bA[3], *bB[3];
    bA[0] = rng_new_uniform(rng, (size_t)M * K, -1.0f, 1.0f), bB[0] = rng_new_uniform(rng, (size_t)K * N, -1.0f, 1.0f);
    for (int d = 1; d < 3; d++) {
        bA[d] = xmalloc((size_t)M * K * sizeof(float));
        bB[d] = xmalloc((size_t)K * N * sizeof(float));
        memcpy(bA[d], bA[0], (size_t)M * K * sizeof(float));
        memcpy(bB[d], bB[0], (size_t)K * N * sizeof(float));
        matmul_round_to_dtype((MmDtype)d, bA[d], (long)M * K);
        matmul_round_to_dtype((MmDtype)d, bB[d], (long)K * N);
    }
    float *bC = xmalloc((size_t)M * N * sizeof(float));
    float *libC[3] = {NULL, NULL, NULL};
    double lib_ms[3] = {NAN, NAN, NAN};

    // Libraries first (their time and output are every other row's baseline), then the ladder.
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < nv; i++) {
            const MatmulGpuVersion *v = matmul_gpu_version(i);
            if (v->is_library != (pass == 0)) continue;
            if (!v->is_library && !selected(o->versions, v->name)) continue;
            int d = (int)v->dtype;
            char why[256] = "";
            if (!matmul_gpu_supported(i, why, sizeof why)) {
                row_start(t, "cuda", v->name, v->dtype, M, N, K);
                char s[300];
                snprintf(s, sizeof s, "skipped: %s", why);
                table_str(t, "status", s);
                continue;
            }
            fprintf(stderr, "[cuda] %s: validating at %ldx%ldx%ld ...\n", v->name, cm, cn, ck);
            float *A = rng_new_uniform(rng, (size_t)cm * ck, -1.0f, 1.0f), *B = rng_new_uniform(rng, (size_t)ck * cn, -1.0f, 1.0f);
            matmul_round_to_dtype(v->dtype, A, cm * ck);
            matmul_round_to_dtype(v->dtype, B, ck * cn);
            float *C = xmalloc((size_t)(cm * cn) * sizeof(float));
            double *R = xmalloc((size_t)(cm * cn) * sizeof(double));
            for (long j = 0; j < cm * cn; j++) C[j] = NAN;
            int rc = matmul_gpu_run(i, (int)cm, (int)cn, (int)ck, A, B, C, NULL, 0);
            matmul_ref_f64((int)cm, (int)cn, (int)ck, A, B, R);
            ErrStats e = compare_f32_f64(C, R, (size_t)(cm * cn));
            free(A), free(B), free(C), free(R);
            row_start(t, "cuda", v->name, v->dtype, M, N, K);
            if (rc == 0) table_num(t, "max_rel_err", e.max_rel);
            if (rc != 0 || !(e.max_rel <= err_bound(v->dtype, (int)ck))) {
                table_str(t, "status", rc ? "FAILED (did not run)" : "FAILED");
                failures++;
                continue;
            }
            fprintf(stderr, "[cuda] %s: timing at %dx%dx%d ...\n", v->name, M, N, K);
            float *out = bC;
            if (v->is_library) out = libC[d] = xmalloc((size_t)M * N * sizeof(float));
            for (long j = 0; j < (long)M * N; j++) out[j] = NAN;
            double ms = NAN;
            if (matmul_gpu_run(i, M, N, K, bA[d], bB[d], out, &ms, reps) != 0) {
                table_str(t, "status", "FAILED (did not run)");
                failures++;
                continue;
            }
            if (v->is_library) lib_ms[d] = ms;
            table_num(t, "ms", ms);
            table_num(t, "TFLOP/s", tflops(M, N, K, ms));
            double pk = peak_for(ce, 1, v->dtype);
            if (isfinite(pk)) table_num(t, "pct_of_peak", 100.0 * tflops(M, N, K, ms) / pk);
            if (libC[d]) {
                table_num(t, "pct_of_library", 100.0 * lib_ms[d] / ms);
                double el = err_vs_lib(out, libC[d], (size_t)M * N);
                table_num(t, "err_vs_lib", el);
                table_str(t, "status", el <= err_bound(v->dtype, K) ? "ok" : "ok (differs from lib)");
            } else {
                table_str(t, "status", "ok");
            }
        }
    }
    for (int d = 0; d < 3; d++) free(bA[d]), free(bB[d]), free(libC[d]);
    free(bC);
    return failures;
}

static void cpu_model(char *out, size_t n) {
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ') p++;
                p[strcspn(p, "\n")] = 0;
                snprintf(out, n, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    Opts o;
    parse_args(argc, argv, &o);
    check_versions(o.versions);
    OutFmt fmt = outfmt_from_args(argc, argv);

    GpuInfo gi;
    int g = gpu_info(&gi), have_gpu = g == 0 && matmul_gpu_nversions() > 0;
    if (g == 0 && !have_gpu) snprintf(gi.reason, sizeof gi.reason, "this build has no GPU versions");
    if (o.do_gpu && !have_gpu) fprintf(stderr, "matmul: cuda rows skipped: %s\n", gi.reason);
    int do_gpu = o.do_gpu && have_gpu;
    if (o.do_gpu && !have_gpu && !o.do_cpu) die("--device cuda: %s", gi.reason);

    Peaks ce;
    read_peaks(&ce, have_gpu ? gi.name : NULL);

    Table *t = table_new("matmul ladder: C = A(M,K) . B(K,N), row-major");
    table_std_meta(t);
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    if (o.do_cpu) {
        table_meta(t, "cpu", "%s", cpu);
        int n = o.M ? o.M : 1024;
        table_meta(t, "cpu_shape", "%dx%dx%d (MxNxK), fp32", o.M ? o.M : n, o.N ? o.N : n, o.K ? o.K : n);
        table_meta(t, "cpu_timing", "median of %d runs after 1 warm-up, wall clock", o.reps ? o.reps : 3);
        table_meta(t, "cpu_threads", "%s", cpu_env_describe());
        char warn[640];
        if (blas_core_warning(warn, sizeof warn)) {
            table_meta(t, "cpu_warning", "%s (pct_of_library on the CPU is of that slow library)", warn);
            fprintf(stderr, "warning: %s\n", warn);
        }
    }
    if (do_gpu) {
        table_meta(t, "gpu", "%s (compute capability %d.%d, %d SMs)", gi.name, gi.cc_major, gi.cc_minor, gi.sms);
        table_meta(t, "gpu_shape", "%dx%dx%d (MxNxK); fp32, fp16 and bf16 versions", o.M ? o.M : 4096,
                   o.N ? o.N : 4096, o.K ? o.K : 4096);
        table_meta(t, "gpu_timing",
                   "median of %d runs after 2 warm-ups, CUDA events around each kernel (host<->device "
                   "copies excluded; padding of unaligned shapes included where a version needs it)",
                   o.reps ? o.reps : 20);
    } else if (o.do_gpu) {
        table_meta(t, "gpu", "skipped: %s", gi.reason);
    }
    table_meta(t, "check_shape", "%dx%dx%d: every version validated there first, on fresh inputs", o.cM, o.cN, o.cK);
    table_meta(t, "error",
               "max_rel_err = max|out - ref| / max|ref| vs a float64 reference at the check shape (half "
               "versions: on the rounded inputs); bounds: fp32 %.1e (1e-5 * max(1, sqrt(K/1024))), "
               "fp16/bf16 %.0e; err_vs_lib: same metric vs the library output at the timed shape",
               err_bound(MM_F32, o.cK), ERR_TOL_HALF);
    table_meta(t, "library", "pct_of_library = library ms / version ms, library of the same dtype and device "
               "(OpenBLAS sgemm; cuBLAS SGEMM without TF32, GemmEx fp16 / bf16 with fp32 compute)");
    table_meta(t, "peak", "%s", ce.note);
    table_setup(t);

    Rng rng;
    rng_seed(&rng, o.seed);
    int failures = 0;
    if (o.do_cpu) failures += run_cpu(t, &o, &ce, &rng);
    if (do_gpu) failures += run_gpu(t, &o, &ce, &rng);

    for (int r = 0; r < table_nrows(t); r++)
        if (table_get_num(t, r, "pct_of_peak") > 100.0) {
            table_meta(t, "peak_warning",
                       "a version ran faster than the 'peak' in %s, so that file's number is not this device's "
                       "ceiling (roofline --quick measures the library GEMM at a smaller size): rerun "
                       "build/bin/roofline without --quick", ceilings_path());
            break;
        }
    table_print(t, fmt, stdout);
    table_free(t);
    if (failures) fprintf(stderr, "matmul: %d version(s) FAILED validation\n", failures);
    return failures ? 1 : 0;
}
