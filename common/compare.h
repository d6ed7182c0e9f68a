// compare.h — how "correct" is measured everywhere in this repository.
// defines: ErrStats, compare_f32, ERR_TOL_FP32, ERR_TOL_TF32, ERR_TOL_HALF
//
// Two numbers per comparison, both relative, so they do not depend on the data's scale:
//   max_rel = max_i |out_i - ref_i| / max_i |ref_i|   (worst element, against the largest value)
//   l2_rel  = ||out - ref||_2 / ||ref||_2               (overall, as in METHOD-style checks)
// A NaN or Inf anywhere in `out` makes both infinite, so it can never pass.
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

#define ERR_TOL_FP32 1e-5
#define ERR_TOL_TF32 3e-4
#define ERR_TOL_HALF 1e-2

typedef struct {
    double max_abs;   // max |out - ref|
    double max_rel;   // max |out - ref| / max |ref|
    double l2_rel;    // ||out - ref|| / ||ref||
    size_t worst;     // index of the worst element
    size_t n_bad;     // non-finite values in out
} ErrStats;

ErrStats compare_f32(const float *out, const float *ref, size_t n);
// Same, with a float64 reference (for validating fp32 kernels against a float64 GEMM).
ErrStats compare_f32_f64(const float *out, const double *ref, size_t n);

#ifdef __cplusplus
}
#endif
