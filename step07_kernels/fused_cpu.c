// fused_cpu.c — the fp32 CPU references of step07's fused kernels (fused.h says what each
// computes and where it rounds), and the ladder tables the benchmark and the tests read.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "step07_kernels/fused.h"

const FusedVersion fused_addnorm_ladder[FUSED_ADDNORM_VERSIONS] = {
    {0, "v0_unfused", "the engine's way: an add kernel, then the RMSNorm kernel (reads the row twice): 2 launches"},
    {1, "v1_row_regs", "one block per row, the row kept in registers: x and residual read once, 1 launch"},
    {2, "v2_vec_warp", "16-byte loads, warp-shuffle reductions, several rows per block when the row is short"},
    {3, "v3_adaptive", "v2 plus read-only/streaming cache hints; threads per row chosen by T (latency at small T)"},
    {4, "v4_warp_row", "a warp per row, the whole row's loads in flight at once, no block barrier"},
};
const FusedVersion fused_swiglu_ladder[FUSED_SWIGLU_VERSIONS] = {
    {0, "v0_scalar", "the engine's k_swiglu: one element per thread, grid-stride, index divided per element"},
    {1, "v1_vec", "one row per grid row, 16-byte loads of gate and up, 16/8-byte stores"},
};
const FusedVersion fused_rope_ladder[FUSED_ROPE_VERSIONS] = {
    {0, "v0_unfused", "the engine's k_rope (q and k in place) + step05's paged_kv_write (k, v to the cache): 2 launches"},
    {1, "v1_fused", "one kernel: q rotated in place, k rotated straight into its cache row, v copied: 1 launch"},
    {2, "v2_fused_vec", "v1 with 16-byte loads (4 pairs per thread) and 8/16-byte cache stores"},
};

static float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) {  // Inf stays, NaN stays a (quiet) NaN
        if (u & 0x007fffffu) u |= 0x00400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    }
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

float fused_round(StDtype dt, float x) {
    if (dt == ST_BF16) return round_bf16(x);
    if (dt == ST_F16) return (float)(_Float16)x;
    return x;
}

void fused_add_rmsnorm_cpu(StDtype rdt, StDtype odt, const float *x, float *residual, const float *w, int T, int n,
                           float eps, float *out) {
    for (int t = 0; t < T; t++) {
        float *r = residual + (size_t)t * n;
        const float *xr = x + (size_t)t * n;
        double ss = 0;
        for (int i = 0; i < n; i++) {
            r[i] = fused_round(rdt, xr[i] + r[i]);
            ss += (double)r[i] * r[i];
        }
        const float inv = (float)(1.0 / sqrt(ss / n + (double)eps));
        for (int i = 0; i < n; i++) out[(size_t)t * n + i] = fused_round(odt, w[i] * fused_round(rdt, r[i] * inv));
    }
}

void fused_swiglu_cpu(StDtype idt, StDtype odt, const float *gu, float *h, int T, int ff) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < ff; j++) {
            const float g = gu[(size_t)t * 2 * ff + j], u = gu[(size_t)t * 2 * ff + ff + j];
            const float silu = (float)((double)g / (1.0 + exp(-(double)g)));
            h[(size_t)t * ff + j] = fused_round(odt, fused_round(idt, silu) * u);
        }
}

void fused_rope_kv_write_cpu(StDtype cdt, float *qkv, int T, int H, int KV, int hd, const float *cos_t,
                             const float *sin_t, const int *slots, float *kc, float *vc) {
    const int half = hd / 2;
    const size_t ld = (size_t)(H + 2 * KV) * hd, kd = (size_t)KV * hd;
    for (int t = 0; t < T; t++) {
        float *row = qkv + (size_t)t * ld;
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < H + KV; h++) {
            float *p = row + (size_t)h * hd;
            const int is_k = h >= H;
            if (is_k && slots[t] < 0) continue;
            float *dst = is_k ? kc + (size_t)slots[t] * kd + (size_t)(h - H) * hd : p;
            for (int e = 0; e < half; e++) {
                const float x1 = p[e], x2 = p[e + half];
                const float y1 = x1 * c[e] - x2 * s[e], y2 = x2 * c[e] + x1 * s[e];
                dst[e] = is_k ? fused_round(cdt, y1) : y1;
                dst[e + half] = is_k ? fused_round(cdt, y2) : y2;
            }
        }
        if (slots[t] < 0) continue;
        for (size_t e = 0; e < kd; e++) vc[(size_t)slots[t] * kd + e] = fused_round(cdt, row[(size_t)(H + KV) * hd + e]);
    }
}
