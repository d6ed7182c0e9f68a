// test_step01_matmul_gpu.c — every GPU matmul version computes C = A.B on any shape.
// Each version runs on fresh random inputs at shapes that are multiples of no tile (and some
// that are, to reach the unchecked fast paths), with the device output poisoned (NaN) before
// the run, and is compared with a float64 reference computed on the same (rounded) inputs.
// Without a GPU the GPU tests skip and say why; the rounding and table tests run everywhere.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "gpu.h"
#include "step01_matmul/matmul_cpu.h"
#include "step01_matmul/matmul_gpu.h"
#include "rng.h"

// Same bounds as build/bin/matmul: fp32 1e-5 * max(1, sqrt(K/1024)); fp16/bf16 1e-2.
static double bound(MmDtype d, int K) {
    if (d != MM_F32) return ERR_TOL_HALF;
    return ERR_TOL_FP32 * (K > 1024 ? sqrt(K / 1024.0) : 1.0);
}

static const int shapes[][3] = {
    {1000, 999, 1001},  // the odd check shape of the program
    {127, 129, 65},     // just under / over tile sizes
    {33, 1, 17},        // a single column
    {1, 2048, 2048},    // a single row (batch-1 decode shape)
    {256, 256, 256},    // tile multiples: the unchecked float4 / unpadded paths
    {384, 512, 200},    // tile multiples in M, N; K not a multiple of the k-tile
    {300, 264, 136},    // K, N multiples of 8 (no padding) with ragged M, N tiles
};

// 0 and *why filled if no GPU can run the tests.
static int need_gpu(char *why, size_t n) {
    GpuInfo g;
    if (gpu_info(&g) != 0) {
        snprintf(why, n, "%s", g.reason);
        return 0;
    }
    if (matmul_gpu_nversions() == 0) {
        snprintf(why, n, "this build has no GPU versions");
        return 0;
    }
    return 1;
}

Test(step01, gpu_versions_match_f64_reference_on_odd_shapes) {
    char why[256];
    if (!need_gpu(why, sizeof why)) cr_skip_test("no CUDA device: %s", why);
    Rng rng;
    rng_seed(&rng, 20261130);
    int ran = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        size_t nA = (size_t)M * K, nB = (size_t)K * N, nC = (size_t)M * N;
        float *A = malloc(nA * 4), *B = malloc(nB * 4), *Ar = malloc(nA * 4), *Br = malloc(nB * 4);
        float *C = malloc(nC * 4);
        double *R = malloc(nC * 8);
        cr_assert(A && B && Ar && Br && C && R);
        for (int i = 0; i < matmul_gpu_nversions(); i++) {
            const MatmulGpuVersion *v = matmul_gpu_version(i);
            if (!matmul_gpu_supported(i, NULL, 0)) continue;
            rng_fill_uniform(&rng, A, nA, -1.0f, 1.0f);  // fresh inputs for every version
            rng_fill_uniform(&rng, B, nB, -1.0f, 1.0f);
            memcpy(Ar, A, nA * 4);
            memcpy(Br, B, nB * 4);
            matmul_round_to_dtype(v->dtype, Ar, (long)nA);
            matmul_round_to_dtype(v->dtype, Br, (long)nB);
            for (size_t j = 0; j < nC; j++) C[j] = NAN;
            int rc = matmul_gpu_run(i, M, N, K, A, B, C, NULL, 0);  // the device rounds A, B itself
            cr_expect_eq(rc, 0, "%s %dx%dx%d did not run", v->name, M, N, K);
            if (rc) continue;
            matmul_ref_f64(M, N, K, Ar, Br, R);
            ErrStats e = compare_f32_f64(C, R, nC);
            cr_expect(e.n_bad == 0, "%s %dx%dx%d: %zu non-finite outputs (unwritten or overflowed)", v->name, M, N, K,
                      e.n_bad);
            cr_expect(e.max_rel <= bound(v->dtype, K), "%s %dx%dx%d: max_rel %.3e > bound %.1e (worst element %zu)",
                      v->name, M, N, K, e.max_rel, bound(v->dtype, K), e.worst);
            ran++;
        }
        free(A), free(B), free(Ar), free(Br), free(C), free(R);
    }
    cr_assert_gt(ran, 0, "no GPU version ran");
}

// A kernel that only worked when the output started at zero, or that mixed up A and B, must be
// caught: the same inputs give the same result when run twice, and transposing the problem
// (B^T A^T) gives the transposed result.
Test(step01, gpu_versions_are_deterministic_and_not_symmetric_by_accident) {
    char why[256];
    if (!need_gpu(why, sizeof why)) cr_skip_test("no CUDA device: %s", why);
    Rng rng;
    rng_seed(&rng, 7);
    int M = 70, N = 40, K = 24;
    float A[70 * 24], B[24 * 40], At[24 * 70], Bt[40 * 24], C1[70 * 40], C2[70 * 40], Ct[40 * 70];
    rng_fill_uniform(&rng, A, sizeof A / 4, -1, 1);
    rng_fill_uniform(&rng, B, sizeof B / 4, -1, 1);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) Bt[j * K + k] = B[k * N + j];
    for (int i = 0; i < matmul_gpu_nversions(); i++) {
        const MatmulGpuVersion *v = matmul_gpu_version(i);
        if (!matmul_gpu_supported(i, NULL, 0)) continue;
        cr_assert_eq(matmul_gpu_run(i, M, N, K, A, B, C1, NULL, 0), 0);
        cr_assert_eq(matmul_gpu_run(i, M, N, K, A, B, C2, NULL, 0), 0);
        cr_expect(memcmp(C1, C2, sizeof C1) == 0, "%s: two runs on the same inputs differ (a race?)", v->name);
        cr_assert_eq(matmul_gpu_run(i, N, M, K, Bt, At, Ct, NULL, 0), 0);  // (B^T A^T) = C^T
        double worst = 0;
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++) worst = fmax(worst, fabs(Ct[c * M + r] - C1[r * N + c]));
        cr_expect(worst <= (v->dtype == MM_F32 ? 1e-4 : 5e-2), "%s: C^T from B^T A^T differs by %.3e", v->name, worst);
    }
}

Test(step01, gpu_version_table_is_consistent) {
    int n = matmul_gpu_nversions(), lib[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        const MatmulGpuVersion *v = matmul_gpu_version(i);
        cr_assert_not_null(v);
        cr_expect_eq(v->id, i, "%s: id %d at position %d", v->name, v->id, i);
        cr_expect(v->dtype >= MM_F32 && v->dtype <= MM_BF16);
        if (v->is_library) lib[v->dtype]++;
        for (int j = 0; j < i; j++) cr_expect(strcmp(v->name, matmul_gpu_version(j)->name), "duplicate name %s", v->name);
    }
    cr_expect_null(matmul_gpu_version(n));
    if (n) {
        for (int d = 0; d < 3; d++) cr_expect_eq(lib[d], 1, "dtype %d needs exactly one library baseline", d);
    } else {
        char why[64] = "";
        cr_expect_eq(matmul_gpu_supported(0, why, sizeof why), 0);
        cr_expect(why[0] != 0, "an unsupported version must say why");
    }
}

// The host rounding must be what the device does (round to nearest, ties to even), or the
// half-precision references would be computed on different inputs than the GPU saw.
Test(step01, round_to_dtype_is_round_to_nearest_even) {
    float h[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65519.0f, 65520.0f, 0x1p-25f, 3 * 0x1p-25f, -2.5e-3f, 1e-8f};
    float he[] = {1.0f, 1.0f + 0x1p-9f, 65504.0f, INFINITY, 0.0f, 0x1p-23f, 0, 0.0f};
    // -2.5e-3: exponent -9 (2^-9 = 1.953e-3), quantum 2^-19
    he[6] = -roundf(2.5e-3f * 524288.0f) / 524288.0f;
    matmul_round_to_dtype(MM_F16, h, 8);
    for (int i = 0; i < 8; i++) cr_expect_eq(h[i], he[i], "fp16 case %d: got %a want %a", i, h[i], he[i]);
    float b[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.0e38f, -1.0f - 0x1p-7f - 0x1p-9f};
    float be[] = {1.0f, 1.0f + 0x1p-6f, 0.0f, -1.0f - 0x1p-7f};
    unsigned int u = 0x7F620000u;  // 3e38f is 0x7F61B1E6: dropped half 0xB1E6 > 0x8000 rounds up
    memcpy(&be[2], &u, 4);
    matmul_round_to_dtype(MM_BF16, b, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(b[i], be[i], "bf16 case %d: got %a want %a", i, b[i], be[i]);
    float f[] = {0.1f, -3.3f};
    matmul_round_to_dtype(MM_F32, f, 2);
    cr_expect(f[0] == 0.1f && f[1] == -3.3f, "fp32 rounding must be a no-op");
}
