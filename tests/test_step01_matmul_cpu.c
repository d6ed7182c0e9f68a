// test_step01_matmul_cpu.c — every CPU matmul version equals the float64 reference, on shapes
// that are multiples of no tile size, and the check that says so can fail.
// Run: make check   (or build/tests/run_tests --filter 'step01/*' --verbose to see the errors)
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "step01_matmul/matmul_cpu.h"
#include "rng.h"

// Under AddressSanitizer everything runs several times slower: keep the big shape out.
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif
#ifndef UNDER_SANITIZER
#define UNDER_SANITIZER 0
#endif

// Tolerance on max_rel = max|C - C64| / max|C64| (compare.h), as a function of K.
// Each C element is a sum of K products; every fp32 multiply and add rounds with a relative
// error of at most u = 2^-24 (FLT_EPSILON / 2) of the running value. With zero-mean random
// inputs those roundings have random signs and add up like a random walk: the typical error
// of one element is ~ u * sqrt(K) * |C|, and the worst of up to 10^6 elements a few times that.
// The measured max_rel is 4e-8 .. 1.7e-6 for K up to 1001 (naive sequential sums are the worst,
// blocked versions with shorter partial sums the best), so a bound of 10 * u * sqrt(K)
// (6e-7 at K = 1, 1.9e-5 at K = 1001, the order of the project's fp32 bound ERR_TOL_FP32)
// leaves ~10x margin for rounding, while a real bug — a dropped k step, a missed edge row or
// column (left NaN), a wrong element — is off by 1e-3 or more and fails it (see
// check_rejects_wrong_results below).
static double tol_fp32(int K) { return 10.0 * (FLT_EPSILON / 2) * sqrt((double)K); }

static bool passes(ErrStats e, int K) { return e.n_bad == 0 && e.max_rel <= tol_fp32(K); }

typedef struct {
    int M, N, K;
} Shape;

// Odd shapes: degenerate (1x1x1, a single row / column), sizes just off the tiles of v3
// (64/128/256) and v4 (MR 12, NR 32, MC 96, KC 384, NC 512), K spanning several KC blocks,
// N spanning several NC blocks, M spanning several MC tiles shared by the threads, and
// K x N over v4's 2M-float packing limit (3x1100x2000: B packed in chunks of columns).
static const Shape odd_shapes[] = {
    {1, 1, 1},      {33, 1, 17},   {1, 33, 17},  {127, 129, 65},  {13, 37, 400},
    {7, 1100, 45},  {130, 70, 800}, {29, 515, 3}, {65, 257, 129}, {3, 1100, 2000},
};

// Inputs for one shape, filled fresh from a seed; C (and C_ref) to be filled by the caller.
typedef struct {
    Shape s;
    float *A, *B, *C;  // (M, K), (K, N), (M, N)
    double *R;         // (M, N), the float64 reference
} Problem;

static Problem problem_new(Shape s, uint64_t seed) {
    Problem p = {s, NULL, NULL, NULL, NULL};
    p.A = malloc((size_t)s.M * s.K * sizeof(float));
    p.B = malloc((size_t)s.K * s.N * sizeof(float));
    p.C = malloc((size_t)s.M * s.N * sizeof(float));
    p.R = malloc((size_t)s.M * s.N * sizeof(double));
    cr_assert(p.A && p.B && p.C && p.R, "out of memory");
    Rng r;
    rng_seed(&r, seed);
    rng_fill_uniform(&r, p.A, (size_t)s.M * s.K, -1.0f, 1.0f);
    rng_fill_uniform(&r, p.B, (size_t)s.K * s.N, -1.0f, 1.0f);
    matmul_ref_f64(s.M, s.N, s.K, p.A, p.B, p.R);
    return p;
}

static void problem_free(Problem *p) {
    free(p->A);
    free(p->B);
    free(p->C);
    free(p->R);
}

// Poison C with NaN (an element a version forgets to write stays NaN and fails the check),
// run the version, compare with the reference.
static ErrStats run_and_compare(const MatmulCpuVersion *v, Problem *p) {
    const size_t mn = (size_t)p->s.M * p->s.N;
    for (size_t i = 0; i < mn; i++) p->C[i] = NAN;
    v->fn(p->s.M, p->s.N, p->s.K, p->A, p->B, p->C);
    return compare_f32_f64(p->C, p->R, mn);
}

static void check_all_versions(Shape s, uint64_t seed, bool skip_naive) {
    Problem p = problem_new(s, seed);
    for (int v = 0; v < matmul_cpu_nversions; v++) {
        const MatmulCpuVersion *ver = &matmul_cpu_versions[v];
        if (skip_naive && strcmp(ver->name, "v1_naive") == 0) continue;
        ErrStats e = run_and_compare(ver, &p);
        cr_log_info("%-15s M=%4d N=%4d K=%4d  max_rel %.2e  l2_rel %.2e  (tol %.1e)", ver->name,
                    s.M, s.N, s.K, e.max_rel, e.l2_rel, tol_fp32(s.K));
        cr_expect(passes(e, s.K),
                  "%s on M=%d N=%d K=%d: max_rel %.3e (tol %.3e), %zu non-finite, worst at "
                  "row %zu col %zu",
                  ver->name, s.M, s.N, s.K, e.max_rel, tol_fp32(s.K), e.n_bad,
                  e.worst / (size_t)s.N, e.worst % (size_t)s.N);
    }
    problem_free(&p);
}

Test(step01, cpu_version_table_is_the_ladder) {
    static const char *expected[] = {"openblas", "v1_naive", "v2_reordered", "v3_blocked",
                                     "v4_blocked_omp"};
    cr_assert_eq(matmul_cpu_nversions, 5);
    for (int v = 0; v < matmul_cpu_nversions; v++) {
        cr_expect_eq(matmul_cpu_versions[v].id, v, "ids must be 0, 1, 2 ... in ladder order");
        cr_expect_str_eq(matmul_cpu_versions[v].name, expected[v]);
        cr_expect(matmul_cpu_versions[v].fn != NULL);
        cr_expect(matmul_cpu_versions[v].what && matmul_cpu_versions[v].what[0]);
    }
}

// The reference itself, on a product small enough to do by hand.
Test(step01, reference_f64_is_exact_on_a_hand_computed_product) {
    const float A[2 * 3] = {1, 2, 3, 4, 5, 6};          // (2, 3)
    const float B[3 * 2] = {7, 8, 9, 10, 11, 12};       // (3, 2)
    const double want[2 * 2] = {58, 64, 139, 154};      // (2, 2)
    double C[4] = {NAN, NAN, NAN, NAN};
    matmul_ref_f64(2, 2, 3, A, B, C);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(C[i], want[i], "C[%d] = %g, want %g", i, C[i], want[i]);
}

Test(step01, cpu_versions_match_reference_on_odd_shapes) {
    const int n = (int)(sizeof odd_shapes / sizeof odd_shapes[0]);
    for (int i = 0; i < n; i++) check_all_versions(odd_shapes[i], 1000 + (uint64_t)i, false);
}

// The shape of the lesson's benchmark, but odd: every tile boundary is crossed. The naive
// version (same loops as on the small shapes, 1 GFLOP/s) and sanitized builds skip it.
Test(step01, cpu_versions_match_reference_on_1000x999x1001) {
    if (UNDER_SANITIZER) cr_skip_test("too slow under AddressSanitizer; covered by odd shapes");
    check_all_versions((Shape){1000, 999, 1001}, 77, true);
}

// The check must be able to fail: feed it results with the bugs a blocked matmul typically
// has and make sure each one is rejected, while the correct result passes.
Test(step01, check_rejects_wrong_results) {
    const Shape s = {37, 45, 65};
    Problem p = problem_new(s, 5);
    const size_t mn = (size_t)s.M * s.N;
    const MatmulCpuVersion *v4 = &matmul_cpu_versions[matmul_cpu_nversions - 1];

    ErrStats good = run_and_compare(v4, &p);
    cr_assert(passes(good, s.K), "the correct result must pass (max_rel %.3e)", good.max_rel);

    // 1. a dropped k step (a K-remainder bug): C = A[:, :K-1] · B[:K-1, :]
    float *Cw = malloc(mn * sizeof(float));
    cr_assert(Cw);
    for (int i = 0; i < s.M; i++)
        for (int j = 0; j < s.N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < s.K - 1; k++)
                acc += p.A[(size_t)i * s.K + k] * p.B[(size_t)k * s.N + j];
            Cw[(size_t)i * s.N + j] = acc;
        }
    ErrStats e = compare_f32_f64(Cw, p.R, mn);
    cr_expect(!passes(e, s.K), "dropped k step not caught (max_rel %.3e)", e.max_rel);

    // 2. an edge column never written: it keeps the NaN poison
    memcpy(Cw, p.C, mn * sizeof(float));
    for (int i = 0; i < s.M; i++) Cw[(size_t)i * s.N + s.N - 1] = NAN;
    e = compare_f32_f64(Cw, p.R, mn);
    cr_expect(!passes(e, s.K), "unwritten column not caught");

    // 3. one element off by 1e-4 of the largest value (e.g. a wrong tile offset in one spot)
    memcpy(Cw, p.C, mn * sizeof(float));
    double rmax = 0;
    for (size_t i = 0; i < mn; i++) rmax = fmax(rmax, fabs(p.R[i]));
    Cw[mn / 2] += (float)(1e-4 * rmax);
    e = compare_f32_f64(Cw, p.R, mn);
    cr_expect(!passes(e, s.K), "one wrong element not caught (max_rel %.3e)", e.max_rel);

    free(Cw);
    problem_free(&p);
}

// v4 splits rows of C between threads, and each element is computed by exactly the same
// sequence of operations whatever the thread count: 1 and 2 threads must agree bit for bit.
Test(step01, v4_result_does_not_depend_on_thread_count) {
    const Shape s = {127, 129, 401};
    Problem p = problem_new(s, 9);
    const size_t mn = (size_t)s.M * s.N;
    const MatmulCpuVersion *v4 = &matmul_cpu_versions[matmul_cpu_nversions - 1];
    float *C1 = malloc(mn * sizeof(float));
    cr_assert(C1);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    run_and_compare(v4, &p);
    memcpy(C1, p.C, mn * sizeof(float));
    omp_set_num_threads(2);
    run_and_compare(v4, &p);
    omp_set_num_threads(saved);
    cr_expect(memcmp(C1, p.C, mn * sizeof(float)) == 0,
              "v4 with 1 and 2 threads must give identical bits");
    free(C1);
    problem_free(&p);
}
