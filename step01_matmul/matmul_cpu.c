// matmul_cpu.c — the CPU matmul ladder: from three nested loops to within reach of OpenBLAS.
// defines: matmul_cpu_versions, matmul_cpu_nversions, matmul_ref_f64 (see matmul_cpu.h)
//
// Every version computes C = A·B in fp32, row-major, for ANY M, N, K >= 1:
//   A (M, K), B (K, N), C (M, N); C is only written, never read before it is set
//   (callers may hand us a C full of NaN).
//
//   0 openblas        cblas_sgemm: the library every other version is measured against
//   1 v1_naive        i-j-k: the textbook dot product; B is walked down a column (stride N)
//   2 v2_reordered    i-k-j: the same arithmetic, but the inner loop walks B and C along a
//                     row (stride 1), so every cache line is used whole and the compiler
//                     vectorizes it (SIMD)
//   3 v3_blocked      i-k-j on tiles: a tile of B stays in cache and is reused by many rows
//   4 v4_blocked_omp  what BLAS libraries do (the GotoBLAS/BLIS design): pack panels of A and
//                     B into contiguous buffers, a register-blocked micro-kernel that keeps a
//                     whole MR x NR tile of C in SIMD registers, and OpenMP threads
//
// How to run: build/bin/matmul --device cpu --size 1024   (prints GFLOP/s and % of OpenBLAS)
// The tests: tests/test_step01_matmul_cpu.c checks every version against matmul_ref_f64.
#include "matmul_cpu.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

// ---------------------------------------------------------------------------------------
// 0. OpenBLAS: the baseline. beta = 0 means "overwrite C" (C's old contents are ignored).
// ---------------------------------------------------------------------------------------
static void matmul_openblas(int M, int N, int K, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C,
                N);
}

// ---------------------------------------------------------------------------------------
// 1. Naive i-j-k: C[i][j] = sum_k A[i][k] * B[k][j].
// A is read along a row (good), but B[k][j] for k = 0, 1, 2 ... is one element per row of B:
// each access touches a new 64-byte cache line and uses 4 bytes of it. For N = 1024 the
// K lines of a column do not stay in L1 until the next j, so nearly every B load is a miss,
// and the loop is a serial chain of dependent adds that the compiler cannot vectorize
// (that would change the order of the fp32 additions).
// ---------------------------------------------------------------------------------------
static void matmul_v1_naive(int M, int N, int K, const float *A, const float *B, float *C) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) sum += A[(size_t)i * K + k] * B[(size_t)k * N + j];
            C[(size_t)i * N + j] = sum;
        }
}

// ---------------------------------------------------------------------------------------
// 2. Reordered i-k-j: for each A[i][k], add A[i][k] * (row k of B) to (row i of C).
// Same FLOPs, same result up to rounding order, but the inner loop now runs along rows of B
// and C with stride 1: every byte of each cache line is used, the hardware prefetcher sees
// a linear stream, and the j iterations are independent, so the compiler turns the loop
// into SIMD fused multiply-adds (16 floats per instruction with AVX-512).
// What still limits it: each inner loop streams a whole row of B (4 KB for N = 1024) and a
// row of C through the caches for just one FMA per element loaded — memory bound.
// ---------------------------------------------------------------------------------------
static void matmul_v2_reordered(int M, int N, int K, const float *A, const float *B, float *C) {
    for (int i = 0; i < M; i++) {
        float *restrict c = C + (size_t)i * N;
        for (int j = 0; j < N; j++) c[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float a = A[(size_t)i * K + k];
            const float *restrict b = B + (size_t)k * N;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}

// ---------------------------------------------------------------------------------------
// 3. Cache blocking (tiling), one thread.
// v2 reads all of B (K x N, 4 MB at 1024^2) once per row of A: M times from DRAM/L3.
// Here the loops are cut into tiles so that a V3_BK x V3_BN tile of B (128 KB) stays in the
// L2 cache while all rows of a V3_BM-row block of A use it, and the V3_BN-float slice of
// a row of C being updated (1 KB) stays in L1 across the whole k loop. Inside a tile the
// loop is v2's unit-stride, vectorized i-k-j.
// When it pays: once B no longer fits in the last-level cache. On a 2-core AMD EPYC (32 MB
// L3) we measured v2 = v3 = ~27 GFLOP/s at 1024^3 (B is 4 MB: v2's streams come from L3 fast
// enough), but at 2048^3 v2 fell to about 10 GFLOP/s while v3 held 26. Try --size 2048.
// What still limits it: the inner loop loads and stores C for every FMA (three memory
// operations per SIMD FMA), so it runs at load/store speed, not at FMA speed. v4 fixes that.
// ---------------------------------------------------------------------------------------
enum { V3_BM = 64, V3_BK = 128, V3_BN = 256 };

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

static void matmul_v3_blocked(int M, int N, int K, const float *A, const float *B, float *C) {
    for (size_t i = 0; i < (size_t)M * N; i++) C[i] = 0.0f;
    for (int i0 = 0; i0 < M; i0 += V3_BM)
        for (int k0 = 0; k0 < K; k0 += V3_BK)
            for (int j0 = 0; j0 < N; j0 += V3_BN) {
                const int i1 = imin(i0 + V3_BM, M), k1 = imin(k0 + V3_BK, K);
                const int nj = imin(V3_BN, N - j0);
                for (int i = i0; i < i1; i++) {
                    float *restrict c = C + (size_t)i * N + j0;
                    for (int k = k0; k < k1; k++) {
                        const float a = A[(size_t)i * K + k];
                        const float *restrict b = B + (size_t)k * N + j0;
                        for (int j = 0; j < nj; j++) c[j] += a * b[j];
                    }
                }
            }
}

// ---------------------------------------------------------------------------------------
// 4. Packing + register-blocked micro-kernel + OpenMP (the GotoBLAS / BLIS structure).
//
// The micro-kernel computes one MR x NR tile of C as a sum of kc rank-1 updates:
//     for p in 0..kc:  tile[i][j] += a[p][i] * b[p][j]      (MR*NR independent FMAs per p)
// The whole tile lives in SIMD registers for all kc steps, so per step it loads only MR
// floats of A (broadcast) and NR floats of B (NR/16 vector loads) and does MR*NR/16 vector
// FMAs: with MR = 12, NR = 32 that is 24 FMAs for 2 vector loads + 12 broadcasts, and C is
// touched once per kc steps instead of once per step as in v3. 24 independent accumulators
// also hide the FMA latency (4 cycles x 2 FMA units = 8 must be in flight).
// Plain C, no intrinsics: the compiler keeps acc[][] in registers and vectorizes the j loop
// because MR and NR are compile-time constants (the i loop is fully unrolled). Check with
// `gcc -O3 -march=native -S`: the p loop is 2 vector loads, 12 vbroadcastss and
// 24 vfmadd231ps on zmm registers, with no stack traffic.
//
// Packing makes the micro-kernel's operands contiguous and in the exact order it reads them:
//   Bp: B cut into NR-wide column panels, each stored row by row, (K, NR) per panel:
//       B[p][jp*NR + j] is at Bp[jp*K*NR + p*NR + j]. Packed once per call by all threads
//       (for a huge B, one chunk of columns at a time), then only read.
//   Ap: MR rows of A for the current kc, stored column by column (Ap[p*MR + i]); 18 KB,
//       stays in L1 while the micro-kernel sweeps it across the NR panels of a tile.
// Panels are zero-padded to full MR / NR, so the micro-kernel never needs a bounds check;
// only the write-back of an edge tile stores the valid mr x nr part. This is what makes any
// M, N, K work.
//
// Loops (outer to inner), for one MC x NC tile of C (a task):
//   pc (KC rows of B: the KC x NC block of Bp in use, 768 KB, stays in the 1 MB L2)
//   > ir (MR rows: pack Ap, L1) > jr (NR columns: the micro-kernel, C tile in registers)
// Threads: tiles of C are handed out one at a time (OpenMP dynamic schedule). No two threads
// write the same element of C, each element is computed by the same operations whatever the
// number of threads, and the only waits are one after packing B and one at the end. Fewer
// waits matter on a small shared machine: when another process takes a core for a time
// slice, a thread waiting at a barrier is stuck; with per-block barriers (pack a KC x NC
// block, barrier, compute, barrier) we measured v4 falling to a third of OpenBLAS under load.
// A waiting OpenMP thread spins for a while before it sleeps; OMP_WAIT_POLICY=passive makes it
// sleep at once, which on a loaded 2-core machine brought v4 level with OpenBLAS again.
// ---------------------------------------------------------------------------------------

// Register tile: NR = two SIMD vectors wide, MR rows, chosen so that the MR*NR/VL accumulators
// + the NR/VL B vectors + 1 broadcast fit in the register file without spilling.
#if defined(__AVX512F__)
enum { MR = 12, NR = 32 };  // 24 zmm accumulators + 2 B + 1 broadcast of 32 zmm registers
#elif defined(__AVX__)
enum { MR = 6, NR = 16 };  // 12 ymm accumulators + 2 B + 1 broadcast of 16 ymm registers
#else
enum { MR = 4, NR = 8 };  // SSE2 and anything else: 8 accumulators of 16 128-bit registers
#endif
// Cache blocks (for a 32 KB L1 and a 1 MB L2 per core; KC = 256 or NC = 1024 measure within
// a few percent): the packed A micro-panel, MR*KC floats (18 KB), stays in L1; the KC x NC
// block of packed B in use (768 KB) stays in L2 and is streamed through L1 one NR-wide panel
// (48 KB) per micro-kernel call. MC x NC is one task: 96 x 512 (about 1 ms on one core at
// 1024^3) is small enough to balance two threads and big enough to reuse the B block 8 times.
enum { KC = 384, NC = 512, MC = 96 };
// The most of B packed at once (8 MB): all of it up to 1024 x 2048, else chunks of columns.
#define BP_MAX_FLOATS ((size_t)2 << 20)

// acc = Ap·Bp over kc steps, then C_tile = acc (first k block) or C_tile += acc.
// mr x nr (<= MR x NR) is the part of the tile that lies inside C.
static void micro_kernel(int kc, const float *restrict a, const float *restrict b,
                         float *restrict c, int ldc, int mr, int nr, int first) {
    float acc[MR][NR] = {{0}};
    for (int p = 0; p < kc; p++) {
        for (int i = 0; i < MR; i++) {
            const float ai = a[p * MR + i];
            // `omp simd` asks for exactly one vector loop over j; without it gcc may fully
            // unroll this short loop first and then pack it into narrower vectors that spill.
#pragma omp simd
            for (int j = 0; j < NR; j++) acc[i][j] += ai * b[p * NR + j];
        }
    }
    if (mr == MR && nr == NR) {  // full tile: the common case, straight vector stores
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                c[(size_t)i * ldc + j] = first ? acc[i][j] : c[(size_t)i * ldc + j] + acc[i][j];
    } else {  // edge tile: store only what lies inside C
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++)
                c[(size_t)i * ldc + j] = first ? acc[i][j] : c[(size_t)i * ldc + j] + acc[i][j];
    }
}

// Pack columns [0, nr) of B (K rows, row stride N) into one panel (K, NR), zero-padded to NR.
static void pack_b_panel(int K, int nr, const float *B, int N, float *restrict dst) {
    for (int p = 0; p < K; p++) {
        const float *src = B + (size_t)p * N;
        for (int j = 0; j < nr; j++) dst[(size_t)p * NR + j] = src[j];
        for (int j = nr; j < NR; j++) dst[(size_t)p * NR + j] = 0.0f;
    }
}

// Pack A[i0 : i0+mr, pc : pc+kc] (row stride K) column by column, zero-padded to MR rows.
static void pack_a(int kc, int mr, const float *A, int K, float *restrict Ap) {
    for (int i = 0; i < mr; i++) {
        const float *src = A + (size_t)i * K;
        for (int p = 0; p < kc; p++) Ap[p * MR + i] = src[p];
    }
    for (int i = mr; i < MR; i++)
        for (int p = 0; p < kc; p++) Ap[p * MR + i] = 0.0f;
}

static void matmul_v4_blocked_omp(int M, int N, int K, const float *A, const float *B,
                                  float *C) {
    // Columns of B packed at once: all N if K x N fits in BP_MAX_FLOATS, else a multiple of NC.
    int ncols = N;
    if ((size_t)K * N > BP_MAX_FLOATS)
        ncols = imax(1, (int)(BP_MAX_FLOATS / (size_t)K / NC)) * NC;
    const size_t bp_floats = (size_t)K * ((imin(ncols, N) + NR - 1) / NR) * NR;
    // 64-byte aligned so that every NR-float row of a panel starts on a cache line
    float *Bp = aligned_alloc(64, bp_floats * sizeof(float));
    if (!Bp) die("v4_blocked_omp: cannot allocate %zu bytes for packed B",
                 bp_floats * sizeof(float));

#pragma omp parallel
    {
        _Alignas(64) float Ap[MR * KC];  // this thread's packed A micro-panel, (KC, MR)
        for (int j0 = 0; j0 < N; j0 += ncols) {  // one chunk of columns (all, unless huge)
            const int nch = imin(ncols, N - j0);
            const int npanels = (nch + NR - 1) / NR;
#pragma omp for schedule(dynamic, 1)
            for (int jp = 0; jp < npanels; jp++)
                pack_b_panel(K, imin(NR, nch - jp * NR), B + j0 + (size_t)jp * NR, N,
                             Bp + (size_t)jp * K * NR);
            // (implicit barrier: all of Bp is packed before anyone reads it)

            // Tasks: MC x NC tiles of C, column-block-major so both threads share one B block.
            const int mtiles = (M + MC - 1) / MC, ntiles = (nch + NC - 1) / NC;
#pragma omp for schedule(dynamic, 1)
            for (int t = 0; t < mtiles * ntiles; t++) {
                const int ic = (t % mtiles) * MC, mc = imin(MC, M - ic);
                const int jc = (t / mtiles) * NC, nc = imin(NC, nch - jc);
                for (int pc = 0; pc < K; pc += KC) {
                    const int kc = imin(KC, K - pc);
                    for (int ir = 0; ir < mc; ir += MR) {
                        const int mr = imin(MR, mc - ir);
                        pack_a(kc, mr, A + (size_t)(ic + ir) * K + pc, K, Ap);
                        for (int jr = 0; jr < nc; jr += NR) {
                            // panel (jc + jr) / NR of Bp, rows pc .. pc + kc
                            const float *bp =
                                Bp + (size_t)((jc + jr) / NR) * K * NR + (size_t)pc * NR;
                            float *c = C + (size_t)(ic + ir) * N + j0 + jc + jr;
                            micro_kernel(kc, Ap, bp, c, N, mr, imin(NR, nc - jr), pc == 0);
                        }
                    }
                }
            }  // (implicit barrier: Bp is not repacked while a thread still reads it)
        }
    }
    free(Bp);
}

// ---------------------------------------------------------------------------------------
// The reference: widen to double and let OpenBLAS dgemm accumulate in double. Its own error
// (~1e-16 relative) is negligible against fp32's (~1e-7 per operation).
// ---------------------------------------------------------------------------------------
void matmul_ref_f64(int M, int N, int K, const float *A, const float *B, double *C64) {
    double *A64 = xmalloc((size_t)M * K * sizeof(double));
    double *B64 = xmalloc((size_t)K * N * sizeof(double));
    for (size_t i = 0; i < (size_t)M * K; i++) A64[i] = A[i];
    for (size_t i = 0; i < (size_t)K * N; i++) B64[i] = B[i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0, A64, K, B64, N, 0.0,
                C64, N);
    free(A64);
    free(B64);
}

// The one list of CPU versions (the program, the tests and the notebook read it).
const MatmulCpuVersion matmul_cpu_versions[] = {
    {0, "openblas", matmul_openblas, "OpenBLAS cblas_sgemm: the library baseline"},
    {1, "v1_naive", matmul_v1_naive, "i-j-k dot products: B walked down columns (stride N)"},
    {2, "v2_reordered", matmul_v2_reordered,
     "i-k-j: unit-stride inner loop over rows of B and C, vectorized by the compiler"},
    {3, "v3_blocked", matmul_v3_blocked,
     "cache tiles: a tile of B stays in L2 and is reused by many rows of A"},
    {4, "v4_blocked_omp", matmul_v4_blocked_omp,
     "packed panels + MRxNR register micro-kernel (12x32 on AVX-512) + OpenMP threads"},
};
const int matmul_cpu_nversions = (int)(sizeof matmul_cpu_versions / sizeof matmul_cpu_versions[0]);
