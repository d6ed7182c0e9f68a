// roofline.c — measure this machine's two ceilings (bytes/s and FLOP/s) on the CPU and, when
// present, the GPU; then the batch scan: why does a bigger decode batch barely add latency?
//
//   build/bin/roofline                 full run (CPU + GPU), writes build/ceilings.json
//   build/bin/roofline --quick         small buffers and fewer repeats (demo, notebook on CPU)
//   build/bin/roofline --device cpu --csv > roofline.csv
//
// How it measures (printed again in the table header):
//  * bandwidth: copy b[i] = a[i] (bytes read + bytes written counted, the STREAM convention),
//    read-only (a reduction), write-only (a fill), buffers far larger than the last-level cache;
//    GPU: 16-byte accesses, grid-stride, median of N runs timed with CUDA events.
//  * compute: fp32 FMA with many independent chains (no memory traffic); the library GEMM
//    (OpenBLAS sgemm on CPU; cuBLAS SGEMM without TF32, fp16 and bf16 GEMM on GPU) on random data.
//  * batch scan: a decode-shaped GEMM [B x 4096] x [4096 x 4096] for B = 1..1024 (the weights
//    are read once per call whatever B is, so until the arithmetic catches up with the bytes the
//    time hardly moves). Copies of the weights are rotated so L2 does not serve repeats.
// The ceilings land in build/ceilings.json, where matmul and account read them.
#define _GNU_SOURCE
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ceilings.h"
#include "check.h"
#include "cpu_env.h"
#include "gpu.h"
#include "rng.h"
#include "step01_matmul/roofline_gpu.h"
#include "table.h"
#include "timer.h"

static TimeStats g_spread;  // of the last CPU measurement, shown in the next row (min_ms, max_ms)
static int g_have_spread;
static double timed_ms(void (*fn)(void *), void *ctx, int warmup, int reps) {
    g_spread = bench_cpu_stats(fn, ctx, warmup, reps);
    g_have_spread = 1;
    return g_spread.median * 1e3;
}

// ---------------------------------------------------------------- CPU bandwidth
typedef struct {
    float *a, *b;
    size_t n;
    volatile float sink;
} BwCtx;

static void cpu_copy(void *p) {
    BwCtx *c = p;
    float *restrict a = c->a, *restrict b = c->b;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < c->n; i++) b[i] = a[i];
}

static void cpu_read(void *p) {
    BwCtx *c = p;
    const float *restrict a = c->a;
    float s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
    for (size_t i = 0; i < c->n; i++) s += a[i];
    c->sink = s;
}

static void cpu_write(void *p) {
    BwCtx *c = p;
    float *restrict b = c->b;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < c->n; i++) b[i] = 1.0f;
}

// ---------------------------------------------------------------- CPU FMA peak
// 8 independent chains of 16-float vectors per thread (GCC/clang vector extensions, split
// into narrower registers where the CPU has no 512-bit ones): enough independent work that the
// FMA units never wait for a previous result (latency ~4 cycles x 2 units).
typedef float v16f __attribute__((vector_size(64)));
#define CPU_FMA_LANES 128
#define CPU_FMA_ITERS 400000
static volatile float g_fma_sink;
static void cpu_fma(void *p) {
    (void)p;
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
        float t0 = (float)omp_get_thread_num() * 1e-3f;
        v16f x0 = {t0}, x1 = {t0 + 1e-3f}, x2 = {t0 + 2e-3f}, x3 = {t0 + 3e-3f};
        v16f x4 = {t0 + 4e-3f}, x5 = {t0 + 5e-3f}, x6 = {t0 + 6e-3f}, x7 = {t0 + 7e-3f};
        const v16f m = {0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f,
                        0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f, 0.9999f};
        const v16f a = m * 1e-4f;
        for (int i = 0; i < CPU_FMA_ITERS; i++) {
            x0 = x0 * m + a, x1 = x1 * m + a, x2 = x2 * m + a, x3 = x3 * m + a;
            x4 = x4 * m + a, x5 = x5 * m + a, x6 = x6 * m + a, x7 = x7 * m + a;
        }
        v16f s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
        for (int j = 0; j < 16; j++) total += s[j];
    }
    g_fma_sink = total;
}

// ---------------------------------------------------------------- CPU GEMM (OpenBLAS)
typedef struct {
    int M, N, K;
    float *A, *C;
    float **B;  // rotated weight copies
    int nsets, next;
} SgemmCtx;

static void cpu_sgemm(void *p) {
    SgemmCtx *c = p;
    const float *B = c->B[c->next];
    c->next = (c->next + 1) % c->nsets;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->M, c->N, c->K, 1.0f, c->A, c->K, B, c->N, 0.0f, c->C,
                c->N);
}

static double cpu_sgemm_ms(int M, int N, int K, int nsets, int reps) {
    Rng r;
    rng_seed(&r, 11);
    SgemmCtx c = {M, N, K, xmalloc((size_t)M * K * 4), xmalloc((size_t)M * N * 4), xmalloc(sizeof(float *) * nsets),
                  nsets, 0};
    rng_fill_uniform(&r, c.A, (size_t)M * K, -1, 1);
    for (int s = 0; s < nsets; s++) {
        c.B[s] = xmalloc((size_t)K * N * 4);
        rng_fill_uniform(&r, c.B[s], (size_t)K * N, -1, 1);
    }
    double t = timed_ms(cpu_sgemm, &c, 1, reps);
    for (int s = 0; s < nsets; s++) free(c.B[s]);
    free(c.A), free(c.C), free(c.B);
    return t;
}

static void cpu_model_name(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *v = strchr(line, ':');
            if (v) {
                v += 2;
                v[strcspn(v, "\n")] = 0;
                snprintf(buf, n, "%s", v);
            }
            break;
        }
    fclose(f);
}

// ---------------------------------------------------------------- output
static Table *T;
static void add(const char *dev, const char *test, int B, double bytes, double flops, double ms, double pct,
                const char *note) {
    table_row(T);
    table_str(T, "device", dev);
    table_str(T, "test", test);
    if (B > 0) table_num(T, "B", B);
    table_num(T, "ms", ms);
    if (g_have_spread) table_num(T, "min_ms", g_spread.min * 1e3), table_num(T, "max_ms", g_spread.max * 1e3);
    g_have_spread = 0;
    if (bytes > 0) table_num(T, "GB/s", bytes / (ms * 1e-3) / 1e9);
    if (flops > 0) table_num(T, "TFLOP/s", flops / (ms * 1e-3) / 1e12);
    if (flops > 0 && bytes > 0) table_num(T, "FLOP/byte", flops / bytes);
    if (!isnan(pct)) table_num(T, "pct_of_ceiling", pct);
    if (note) table_str(T, "note", note);
}

static const int SCAN_B[] = {1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024};
enum { SCAN_N = sizeof SCAN_B / sizeof SCAN_B[0] };

// One batch scan: time(B) for the decode-shaped GEMM, and where the knee is.
static void batch_scan(const char *dev, int is_gpu, int maxB, int reps, double peak_tflops, double copy_gbps,
                       double es) {
    const int K = 4096, N = 4096;
    double t1 = 0;
    int knee_measured = 0, knee_pred = 0;
    double ridge = peak_tflops * 1e12 / (copy_gbps * 1e9);
    for (int i = 0; i < SCAN_N && SCAN_B[i] <= maxB; i++) {
        int B = SCAN_B[i];
        double ms;
        if (is_gpu) {
            ms = roofline_gpu_gemm_ms(2, B, N, K, reps);
            if (ms < 0) ms = roofline_gpu_gemm_ms(1, B, N, K, reps);  // no bf16 before sm_80: fp16
        } else {
            ms = cpu_sgemm_ms(B, N, K, 2, reps);
        }
        if (ms <= 0) return;
        double flops = 2.0 * B * (double)N * K;
        double bytes = es * ((double)K * N + (double)B * K + (double)B * N);
        if (B == 1) t1 = ms;
        char note[160];
        double ai = flops / bytes;
        if (!knee_pred && ai >= ridge) knee_pred = B;
        if (!knee_measured && t1 > 0 && ms > 2.0 * t1) knee_measured = B;
        snprintf(note, sizeof note, "%.2fx the B=1 time for %dx the tokens%s", ms / t1, B,
                 ai >= ridge ? "; compute-bound side" : "; memory-bound side");
        add(dev, is_gpu ? "batch scan bf16 [Bx4096]x[4096x4096]" : "batch scan fp32 [Bx4096]x[4096x4096]", B, bytes,
            flops, ms, 100.0 * (flops / (ms * 1e-3) / 1e12) / peak_tflops, note);
    }
    char key[64];
    snprintf(key, sizeof key, "%s knee", dev);
    table_meta(T, key,
               "time first exceeds 2x the B=1 time at B=%d (measured); intensity reaches the ridge %.0f FLOP/byte at "
               "B~%d (predicted by the roofline)",
               knee_measured, ridge, knee_pred);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: roofline [--device cpu|cuda|all] [--quick] [--reps R] [--no-save] [--csv|--json]\n"
            "  Measures bandwidth (copy/read/write) and compute (FMA, library GEMM) ceilings, then the\n"
            "  decode batch scan; saves the ceilings to %s (read by matmul and account).\n",
            ceilings_path());
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    const char *device = "all";
    int quick = 0, reps = 0, save = 1;
    static struct option opts[] = {{"device", 1, 0, 'd'}, {"quick", 0, 0, 'q'}, {"reps", 1, 0, 'r'},
                                   {"no-save", 0, 0, 'n'}, {"csv", 0, 0, 'C'},  {"json", 0, 0, 'J'},
                                   {"help", 0, 0, 'h'},   {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'd': device = optarg; break;
        case 'q': quick = 1; break;
        case 'r': reps = (int)arg_int("--reps", optarg, 1, 1000); break;
        case 'n': save = 0; break;
        case 'C': case 'J': break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "all"))
        die("--device must be cpu, cuda or all (got '%s')", device);
    if (!reps) reps = quick ? 5 : 20;
    int do_cpu = strcmp(device, "cuda") != 0, want_gpu = strcmp(device, "cpu") != 0;
    GpuInfo g;
    int have_gpu = want_gpu && gpu_info(&g) == 0;
    if (want_gpu && !have_gpu && !strcmp(device, "cuda")) die("--device cuda: %s", g.reason);

    Ceilings ce;
    ceilings_load(&ce);  // keep the other device's numbers when only one is measured
    T = table_new("roofline: measured ceilings and the decode batch scan");
    table_std_meta(T);
    table_col(T, "device", NULL);
    table_col(T, "test", NULL);
    table_col(T, "B", "%.0f");
    table_col(T, "ms", "%.4f");
    table_col(T, "min_ms", "%.4f");
    table_col(T, "max_ms", "%.4f");
    table_col(T, "GB/s", "%.1f");
    table_col(T, "TFLOP/s", "%.4g");
    table_col(T, "FLOP/byte", "%.1f");
    table_col(T, "pct_of_ceiling", "%.1f");
    table_col(T, "note", NULL);

    if (do_cpu) {
        char name[128];
        cpu_model_name(name, sizeof name);
        int threads = omp_get_max_threads();
        table_meta(T, "cpu", "%s, %d OpenMP threads", name, threads);
        table_meta(T, "cpu_threads", "%s", cpu_env_describe());
        char warn[640];
        if (blas_core_warning(warn, sizeof warn)) {
            table_meta(T, "cpu_warning", "%s", warn);
            fprintf(stderr, "warning: %s\n", warn);
        }
        snprintf(ce.cpu_blas_core, sizeof ce.cpu_blas_core, "%s", blas_core_name());
        snprintf(ce.cpu_blas_warning, sizeof ce.cpu_blas_warning, "%s", warn);
        size_t bytes = (quick ? 64ul : 512ul) << 20;
        BwCtx c = {xmalloc(bytes), xmalloc(bytes), bytes / 4, 0};
        Rng r;
        rng_seed(&r, 3);
        rng_fill_uniform(&r, c.a, c.n, -1, 1);
        cpu_write(&c);
        cpu_copy(&c);  // validate before timing
        if (memcmp(c.a, c.b, bytes)) die("cpu copy produced wrong data");
        double ms_c = timed_ms(cpu_copy, &c, 1, reps);
        const TimeStats sp_c = g_spread;
        double ms_r = timed_ms(cpu_read, &c, 1, reps);
        const TimeStats sp_r = g_spread;
        double ms_w = timed_ms(cpu_write, &c, 1, reps);
        const TimeStats sp_w = g_spread;
        free(c.a), free(c.b);
        double copy = 2.0 * bytes / (ms_c * 1e-3) / 1e9;
        g_spread = sp_c, g_have_spread = 1;
        add("cpu", "copy (read+write counted)", 0, 2.0 * bytes, 0, ms_c, NAN, "the bandwidth ceiling used below");
        g_spread = sp_r, g_have_spread = 1;
        add("cpu", "read", 0, bytes, 0, ms_r, 100.0 * (bytes / (ms_r * 1e-3) / 1e9) / copy, "pct: of copy");
        g_spread = sp_w, g_have_spread = 1;
        add("cpu", "write", 0, bytes, 0, ms_w, 100.0 * (bytes / (ms_w * 1e-3) / 1e9) / copy, "pct: of copy");
        double ms_f = timed_ms(cpu_fma, NULL, 1, quick ? 3 : 10);
        double fma_flops = 2.0 * CPU_FMA_LANES * CPU_FMA_ITERS * threads;
        add("cpu", "fp32 FMA peak", 0, 0, fma_flops, ms_f, NAN, "independent FMA chains, all threads");
        int n = quick ? 1024 : 2048;
        double ms_g = cpu_sgemm_ms(n, n, n, 1, quick ? 3 : 10);
        double sg = 2.0 * n * n * (double)n / (ms_g * 1e-3) / 1e12;
        char note[160];
        snprintf(note, sizeof note, "OpenBLAS sgemm %d^3 (%s kernels); pct: of the FMA peak", n, blas_core_name());
        add("cpu", "sgemm (library)", 0, 0, 2.0 * n * n * (double)n, ms_g, 100.0 * sg / (fma_flops / (ms_f * 1e-3) / 1e12),
            note);
        snprintf(ce.cpu_name, sizeof ce.cpu_name, "%s", name);
        ce.cpu_threads = threads;
        ce.cpu_copy_gbps = copy;
        ce.cpu_read_gbps = bytes / (ms_r * 1e-3) / 1e9;
        ce.cpu_write_gbps = bytes / (ms_w * 1e-3) / 1e9;
        ce.cpu_fp32_gflops = fma_flops / (ms_f * 1e-3) / 1e9;
        ce.cpu_sgemm_gflops = sg * 1e3;
        batch_scan("cpu", 0, quick ? 64 : 256, quick ? 3 : 5, sg, copy, 4.0);
    }
    if (want_gpu && !have_gpu) table_meta(T, "gpu", "skipped: %s", g.reason);
    if (have_gpu) {
        table_meta(T, "gpu", "%s, sm_%d%d, %d SMs, %.0f GiB, L2 %d MiB", g.name, g.cc_major, g.cc_minor, g.sms, g.mem_gib,
                   g.l2_bytes >> 20);
        size_t bytes = (quick ? 256ul : 2048ul) << 20;
        double copy, rd, wr;
        if (roofline_gpu_bandwidth(bytes, reps, &copy, &rd, &wr)) die("GPU bandwidth measurement failed");
        double theo = 2.0 * g.mem_clock_khz * 1e3 * (g.mem_bus_bits / 8.0) / 1e9;
        char note[160];
        snprintf(note, sizeof note, "%.0f MiB buffers; pct: of %.0f GB/s from clock x bus width (a lead, not a ceiling)",
                 bytes / 1048576.0, theo);
        add("gpu", "copy (read+write counted)", 0, 2.0 * bytes, 0, 2.0 * bytes / (copy * 1e9) * 1e3, 100.0 * copy / theo, note);
        add("gpu", "read", 0, bytes, 0, bytes / (rd * 1e9) * 1e3, 100.0 * rd / copy, "pct: of copy");
        add("gpu", "write", 0, bytes, 0, bytes / (wr * 1e9) * 1e3, 100.0 * wr / copy, "pct: of copy");
        double fma = roofline_gpu_fma_tflops(reps);
        add("gpu", "fp32 FMA peak", 0, 0, 1e12, 1e3 / fma, NAN, "independent FMA chains (SIMT); ms is per TFLOP");
        int n = quick ? 2048 : 8192;
        double fl = 2.0 * n * n * (double)n;
        double ms32 = roofline_gpu_gemm_ms(0, n, n, n, quick ? 5 : 10);
        double ms16 = roofline_gpu_gemm_ms(1, n, n, n, reps);
        double msbf = roofline_gpu_gemm_ms(2, n, n, n, reps);
        snprintf(note, sizeof note, "cuBLAS %d^3, pedantic math (no TF32); pct: of the FMA peak", n);
        add("gpu", "sgemm fp32 (cuBLAS)", 0, 0, fl, ms32, 100.0 * (fl / (ms32 * 1e-3) / 1e12) / fma, note);
        snprintf(note, sizeof note, "cuBLAS GemmEx %d^3, fp32 accumulate, random data", n);
        add("gpu", "gemm fp16 (cuBLAS)", 0, 0, fl, ms16, NAN, note);
        if (msbf > 0) add("gpu", "gemm bf16 (cuBLAS)", 0, 0, fl, msbf, NAN, note);
        else table_meta(T, "gpu_bf16", "no bf16 GEMM on sm_%d%d (bf16 tensor cores start at sm_80): the batch scan and "
                        "account use the fp16 ceiling for bf16 weights", g.cc_major, g.cc_minor);
        snprintf(ce.gpu_name, sizeof ce.gpu_name, "%.127s", g.name);
        ce.gpu_copy_gbps = copy, ce.gpu_read_gbps = rd, ce.gpu_write_gbps = wr;
        ce.gpu_fp32_tflops = fma;
        ce.gpu_sgemm_tflops = fl / (ms32 * 1e-3) / 1e12;
        ce.gpu_fp16_tflops = fl / (ms16 * 1e-3) / 1e12;
        ce.gpu_bf16_tflops = msbf > 0 ? fl / (msbf * 1e-3) / 1e12 : 0;
        batch_scan("gpu", 1, 1024, reps, msbf > 0 ? ce.gpu_bf16_tflops : ce.gpu_fp16_tflops, copy, 2.0);
    }
    table_meta(T, "method",
               "median of %d runs after warm-up (CUDA events on GPU); GB/s counts bytes read + bytes written; "
               "pct_of_ceiling in the batch scan is of the library GEMM peak above",
               reps);
    table_print(T, outfmt_from_args(argc, argv), stdout);
    table_free(T);
    if (save && ceilings_save(&ce) == 0) fprintf(stderr, "roofline: ceilings saved to %s\n", ceilings_path());
    return 0;
}
