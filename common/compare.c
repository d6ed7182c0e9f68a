// compare.c — see compare.h.
#include "compare.h"

#include <math.h>

#define COMPARE_BODY                                                                  \
    ErrStats s = {0, 0, 0, 0, 0};                                                     \
    double ref_max = 0.0, d2 = 0.0, r2 = 0.0;                                         \
    for (size_t i = 0; i < n; i++) {                                                  \
        double o = (double)out[i], r = (double)ref[i];                                \
        if (!isfinite(o)) { s.n_bad++; continue; }                                    \
        double d = fabs(o - r);                                                       \
        if (d > s.max_abs) { s.max_abs = d; s.worst = i; }                            \
        if (fabs(r) > ref_max) ref_max = fabs(r);                                     \
        d2 += d * d;                                                                  \
        r2 += r * r;                                                                  \
    }                                                                                 \
    if (s.n_bad) { s.max_rel = s.l2_rel = s.max_abs = INFINITY; return s; }           \
    s.max_rel = ref_max > 0 ? s.max_abs / ref_max : s.max_abs;                        \
    s.l2_rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);                                     \
    return s;

ErrStats compare_f32(const float *out, const float *ref, size_t n) { COMPARE_BODY }
ErrStats compare_f32_f64(const float *out, const double *ref, size_t n) { COMPARE_BODY }
