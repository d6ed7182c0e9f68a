// matmul_gpu_none.c — matmul_gpu.h for builds without CUDA (there are no GPU versions), and
// matmul_round_to_dtype, which both builds share: it is pure C so that a reference can be
// built on exactly the values the GPU sees, with or without CUDA.
#include "matmul_gpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

// fp16: 1 sign, 5 exponent, 10 stored mantissa bits (11 significant). Round to nearest even at
// the fp16 quantum of x's binade (2^-24 below the smallest normal 2^-14); |x| >= 65520 -> inf.
static float round_f16(float x) {
    if (!isfinite(x) || x == 0.0f) return x;
    int e;
    frexp((double)x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
    int q = e - 11;        // exponent of one unit in the last of 11 significant bits
    if (q < -24) q = -24;  // subnormal fp16: fixed quantum 2^-24
    double r = ldexp(nearbyint(ldexp((double)x, -q)), q);  // nearbyint: round half to even
    if (fabs(r) > 65504.0) return x > 0 ? INFINITY : -INFINITY;
    return (float)r;
}

// bf16: the top 16 bits of an fp32. Round to nearest even on the dropped 16 bits.
static float round_bf16(float x) {
    if (isnan(x)) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

void matmul_round_to_dtype(MmDtype dt, float *x, long n) {
    if (dt == MM_F16)
        for (long i = 0; i < n; i++) x[i] = round_f16(x[i]);
    else if (dt == MM_BF16)
        for (long i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

#if !HAVE_CUDA
#include <stdio.h>

int matmul_gpu_nversions(void) { return 0; }

const MatmulGpuVersion *matmul_gpu_version(int i) {
    (void)i;
    return NULL;
}

int matmul_gpu_supported(int i, char *why, int why_len) {
    (void)i;
    if (why && why_len > 0) snprintf(why, (size_t)why_len, "built without CUDA");
    return 0;
}

int matmul_gpu_run(int i, int M, int N, int K, const float *A, const float *B, float *C,
                   double *ms, int reps) {
    (void)i, (void)M, (void)N, (void)K, (void)A, (void)B, (void)C, (void)ms, (void)reps;
    fprintf(stderr, "matmul_gpu_run: built without CUDA (nvcc was not found at build time)\n");
    return -1;
}
#endif
