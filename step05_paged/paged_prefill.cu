// paged_prefill.cu — step05's fused chunked-prefill attention (the C API is in paged_prefill.h):
// every chunk of a step, varlen, causal, GQA, in one launch over a grid of (tile, kv head), K and
// V read straight through the block tables; flash attention's online softmax, so the scores
// never leave the chip. Tests: build/tests/run_tests --filter 'step05_gpu/prefill*';
// ladder: build/bin/paged_attn_bench --op prefill.
//
// The tensor-core kernel (bf16/fp16, hd 64 or 128, sm_80+), one CTA of 4 warps per tile:
//   M = PP_TILE_M = 64 rows = the tile's query rows x the g heads of the kv head (row m is query
//   row m / g, head m % g), 16 per warp; N = PP_TILE_N = 64 keys per K/V tile; K = hd.
//   - Q (fp32 in global) is rounded to bf16/fp16 into shared once, then each warp keeps its
//     16 x hd slice in registers as mma A fragments for the whole loop.
//   - K/V tiles: key p of the tile is pool row tab[p / B] * B + p % B; each of the 64 rows x hd
//     is copied as 16-byte pieces with cp.async (asynchronous global -> shared, no registers),
//     two stages: tile t+1 is in flight while tile t is computed. Keys past the tile's last
//     needed key are zero-filled (cp.async's source size 0), so a 0 * garbage never reaches O.
//   - S = Q K^T: mma.sync m16n8k16 (fp32 accumulate); B fragments of K by ldmatrix.
//   - online softmax in fp32 in registers: each thread holds two rows' slices (rows lane/4 and
//     lane/4 + 8 of its warp's 16); a row's max is a 4-lane shuffle; O is rescaled by
//     exp2(m_old - m_new) and the sum l is kept per thread, summed across the 4 lanes at the end.
//     The scale is folded into the exponent (scale * log2 e) and the mask (key > row limit ->
//     -inf) is applied only in tiles that reach past the first row's limit.
//   - O += P V: the S accumulators are, register for register, the A fragments of P (rounded to
//     bf16/fp16), so P never goes through shared; V's B fragments by ldmatrix.trans.
//   Shared rows are padded by 8 elements (16 bytes) so ldmatrix's 8 row addresses fall in 8
//   different bank groups. Shared: 2 stages x (K + V) x 64 x (hd + 8) elements (69.6 KB at hd
//   128); Q borrows stage 1's V before the loop starts.
// The SIMT kernel (fp32 caches, and any dtype on sm_75 where the bf16 MMA does not exist):
//   one warp per M row at a time, lane = key for the scores (32 keys per step, online softmax
//   across steps), lane = output element for P V. Correct and simple; not tuned.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "cuda_check.h"
#include "step03_kvcache/decode_gpu.cuh"  // forward_gpu.cuh: tof, fromf, DISPATCH, dt_name, esize
#include "step05_paged/cp_async.cuh"  // cp_async16, cp_async_commit, cp_async_wait
#include "step05_paged/mma.cuh"       // PA_MMA_ARCH: pack2, mma16816, ldsm_x4, ldsm_x4_t
#include "step05_paged/paged_prefill.h"

#define PP_THREADS 128  // 4 warps per CTA, both kernels
#define PP_PAD 8        // elements of padding per shared K/V/Q row (16 bytes)


// ---------------------------------------------------------------- the tensor-core kernel

// Grid (tiles, KV), PP_THREADS threads; tile blockIdx.x = {row0, rows, seq, kmax0} (paged_prefill.h).
// Dynamic shared: 4 * PP_TILE_N * (HD + PP_PAD) elements of C.
template <class C, int HD>
__global__ void __launch_bounds__(PP_THREADS)
    k_prefill_mma(const float *__restrict__ q, int ldq, const C *__restrict__ kc, const C *__restrict__ vc,
                  const int *__restrict__ bt, int bt_stride, int B, const int *__restrict__ tiles, int H, int KV,
                  float scale_log2, void *out, int ldo, int out_f32) {
#ifdef PA_MMA_ARCH
    constexpr int BN = PP_TILE_N, BM = PP_TILE_M, LDS = HD + PP_PAD;
    constexpr int KCH = HD / 16, NT = BN / 8, DT = HD / 8, VPR = HD / 8;
    static_assert(BM == 16 * (PP_THREADS / 32), "one 16-row mma slice per warp");
    static_assert(BM == BN, "Q borrows a V stage");
    static_assert(4 * BN * LDS * sizeof(C) <= 99 * 1024, "over sm_86/sm_89's opt-in shared memory per block");
    static_assert(HD % 16 == 0 && LDS * sizeof(C) % 16 == 0, "ldmatrix / cp.async rows must be 16-byte aligned");
    extern __shared__ __align__(16) unsigned char pp_smem[];
    C *Ks = (C *)pp_smem;         // (2, BN, LDS)
    C *Vs = Ks + 2 * BN * LDS;    // (2, BN, LDS)
    C *Qs = Vs + BN * LDS;        // (BM, LDS): V's stage 1, free until the loop's first prefetch
    const int *d = tiles + (size_t)blockIdx.x * PP_TILE_INTS;
    // nrows * g <= BM: the plan's tiles for this H / KV (paged_prefill_tile_rows); more M rows
    // would be dropped silently
    const int row0 = d[0], nrows = d[1], kmax0 = d[3], kvh = blockIdx.y;
    const int *tab = bt + (size_t)d[2] * bt_stride;
    const int g = H / KV, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int kmax_t = kmax0 + nrows - 1, nkt = kmax_t / BN + 1;  // the tile's last key, K/V tiles
    const size_t kd = (size_t)KV * HD;

    auto load_kv = [&](int kt, int stage) {
        C *ks = Ks + stage * BN * LDS, *vs = Vs + stage * BN * LDS;
#pragma unroll 4
        for (int idx = tid; idx < BN * VPR; idx += PP_THREADS) {
            const int r = idx / VPR, c = idx % VPR, p = kt * BN + r, ok = p <= kmax_t;
            const size_t prow = ok ? (size_t)tab[p / B] * B + p % B : 0;
            const size_t off = prow * kd + (size_t)kvh * HD + c * 8;
            cp_async16(ks + r * LDS + c * 8, kc + off, ok ? 16 : 0);
            cp_async16(vs + r * LDS + c * 8, vc + off, ok ? 16 : 0);
        }
    };
    load_kv(0, 0);
    cp_async_commit();

    // ---- Q: M row m = (query row m / g, head m % g), rounded to C; padding rows are zeros
    for (int idx = tid; idx < BM * HD / 2; idx += PP_THREADS) {
        const int m = idx / (HD / 2), e = (idx % (HD / 2)) * 2, i = m / g, hh = m % g;
        float x = 0, y = 0;
        if (i < nrows) {
            const float *src = q + (size_t)(row0 + i) * ldq + (size_t)(kvh * g + hh) * HD + e;
            x = src[0], y = src[1];
        }
        *(unsigned *)(Qs + m * LDS + e) = pack2<C>(x, y);
    }
    __syncthreads();
    unsigned qa[KCH][4];
#pragma unroll
    for (int kc0 = 0; kc0 < KCH; kc0++) ldsm_x4(qa[kc0], Qs + (warp * 16 + (lane & 15)) * LDS + kc0 * 16 + (lane >> 4) * 8);
    __syncthreads();  // Qs is V's stage 1 again

    // This thread's two M rows and the last key each sees (padding rows: a real row's limit).
    const int ra = warp * 16 + gid, rb = ra + 8;
    const int lim_a = kmax0 + min(ra / g, nrows - 1), lim_b = kmax0 + min(rb / g, nrows - 1);
    float o[DT][4], m_a = -INFINITY, m_b = -INFINITY, l_a = 0, l_b = 0;
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0;

    for (int kt = 0; kt < nkt; kt++) {
        if (kt + 1 < nkt) {
            load_kv(kt + 1, (kt + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const C *ks = Ks + (kt & 1) * BN * LDS, *vs = Vs + (kt & 1) * BN * LDS;
        // ---- S = Q K^T (16 x BN per warp)
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
#pragma unroll
        for (int kc0 = 0; kc0 < KCH; kc0++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                unsigned b[4];
                ldsm_x4(b, ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kc0 * 16 + ((lane >> 3) & 1) * 8);
                mma16816<C>(s[2 * np], qa[kc0], b[0], b[1]);
                mma16816<C>(s[2 * np + 1], qa[kc0], b[2], b[3]);
            }
        // ---- scale (log2 domain), causal mask, online softmax
        const int k0 = kt * BN;
        const bool masked = k0 + BN - 1 > kmax0;
        float mx_a = m_a, mx_b = m_b;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int key = k0 + j * 8 + tig * 2;
            s[j][0] *= scale_log2, s[j][1] *= scale_log2, s[j][2] *= scale_log2, s[j][3] *= scale_log2;
            if (masked) {
                if (key > lim_a) s[j][0] = -INFINITY;
                if (key + 1 > lim_a) s[j][1] = -INFINITY;
                if (key > lim_b) s[j][2] = -INFINITY;
                if (key + 1 > lim_b) s[j][3] = -INFINITY;
            }
            mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
        }
        // finite: key 0 is inside every row's limit, so tile 0 sets a finite max and it only grows
        const float al_a = exp2f(m_a - mx_a), al_b = exp2f(m_b - mx_b);  // 0 on the first tile
        m_a = mx_a, m_b = mx_b;
        float ps_a = 0, ps_b = 0;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = exp2f(s[j][0] - mx_a), s[j][1] = exp2f(s[j][1] - mx_a);
            s[j][2] = exp2f(s[j][2] - mx_b), s[j][3] = exp2f(s[j][3] - mx_b);
            ps_a += s[j][0] + s[j][1], ps_b += s[j][2] + s[j][3];
        }
        l_a = l_a * al_a + ps_a, l_b = l_b * al_b + ps_b;
#pragma unroll
        for (int j = 0; j < DT; j++) o[j][0] *= al_a, o[j][1] *= al_a, o[j][2] *= al_b, o[j][3] *= al_b;
        // ---- O += P V: n-tiles 2kk, 2kk+1 of S are the A fragment of keys kk*16 .. kk*16+15
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const unsigned pa[4] = {pack2<C>(s[2 * kk][0], s[2 * kk][1]), pack2<C>(s[2 * kk][2], s[2 * kk][3]),
                                    pack2<C>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack2<C>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                unsigned b[4];
                ldsm_x4_t(b, vs + (kk * 16 + (lane & 15)) * LDS + dp * 16 + (lane >> 4) * 8);
                mma16816<C>(o[2 * dp], pa, b[0], b[1]);
                mma16816<C>(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();  // this stage is refilled by the next iteration's prefetch
    }
    // ---- normalize and write: row r = (query row r / g, head r % g)
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? rb : ra;
        if (r >= nrows * g) continue;
        const float inv = 1.0f / (half ? l_b : l_a);
        const size_t at = (size_t)(row0 + r / g) * ldo + (size_t)(kvh * g + r % g) * HD + tig * 2;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            const float x = o[j][half * 2] * inv, y = o[j][half * 2 + 1] * inv;
            if (out_f32) ((float *)out)[at + j * 8] = x, ((float *)out)[at + j * 8 + 1] = y;
            else ((C *)out)[at + j * 8] = fromf<C>(x), ((C *)out)[at + j * 8 + 1] = fromf<C>(y);
        }
    }
#elif defined(__CUDA_ARCH__)
    __trap();  // no bf16/fp16 mma.sync below sm_80: paged_prefill never launches this there (mma_path)
#endif
}

// ---------------------------------------------------------------- the SIMT kernel

// Grid (tiles, KV), PP_THREADS threads; dynamic shared (PP_THREADS / 32) * hd floats (each
// warp's scaled q row). hd <= 256 (acc holds 8 elements per lane).
template <class C>
__global__ void __launch_bounds__(PP_THREADS)
    k_prefill_simt(const float *__restrict__ q, int ldq, const C *__restrict__ kc, const C *__restrict__ vc,
                   const int *__restrict__ bt, int bt_stride, int B, const int *__restrict__ tiles, int H, int KV,
                   int hd, float scale, void *out, int ldo, int out_f32) {
    constexpr int NW = PP_THREADS / 32;
    extern __shared__ float pp_qs[];
    const int *d = tiles + (size_t)blockIdx.x * PP_TILE_INTS;
    const int row0 = d[0], nrows = d[1], kmax0 = d[3], kvh = blockIdx.y;
    const int *tab = bt + (size_t)d[2] * bt_stride;
    const int g = H / KV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t kd = (size_t)KV * hd;
    float *qw = pp_qs + warp * hd;
    const C *kb = kc + (size_t)kvh * hd, *vb = vc + (size_t)kvh * hd;
    for (int m = warp; m < nrows * g; m += NW) {
        const int i = m / g, h = kvh * g + m % g, lim = kmax0 + i;
        const float *qr = q + (size_t)(row0 + i) * ldq + (size_t)h * hd;
        __syncwarp();
        for (int e = lane; e < hd; e += 32) qw[e] = qr[e] * scale;
        __syncwarp();
        float mrun = -INFINITY, l = 0, acc[8];
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] = 0;
        for (int j0 = 0; j0 <= lim; j0 += 32) {
            const int j = j0 + lane, valid = j <= lim;
            const long long prow = valid ? (long long)tab[j / B] * B + j % B : 0;
            float s = -INFINITY;
            if (valid) {
                const C *kr = kb + prow * kd;
                float dot = 0;
                for (int e = 0; e < hd; e++) dot = fmaf(qw[e], tof(kr[e]), dot);
                s = dot;
            }
            float mt = s;
            for (int off = 16; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
            const float mn = fmaxf(mrun, mt);  // finite: key j0 is valid
            const float al = expf(mrun - mn), p = valid ? expf(s - mn) : 0.0f;
            float ps = p;
            for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l = l * al + ps, mrun = mn;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] *= al;
            const int nj = min(32, lim - j0 + 1);
            for (int jj = 0; jj < nj; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                const long long rj = __shfl_sync(0xffffffffu, prow, jj);
                const C *vr = vb + rj * kd;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (lane + 32 * k < hd) acc[k] = fmaf(pj, tof(vr[lane + 32 * k]), acc[k]);
            }
        }
        const size_t at = (size_t)(row0 + i) * ldo + (size_t)h * hd;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int e = lane + 32 * k;
            if (e >= hd) continue;
            if (out_f32) ((float *)out)[at + e] = acc[k] / l;
            else ((C *)out)[at + e] = fromf<C>(acc[k] / l);
        }
    }
}

// ---------------------------------------------------------------- host side

static int device_cc_major(void) {
    static int cc = -1;
    if (cc < 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        cc = v;
    }
    return cc;
}

static int shape_ok(StDtype dt, int H, int KV, int hd) {
    return KV >= 1 && H >= KV && H % KV == 0 && H / KV <= 8 && hd >= 2 && hd <= 256 && hd % 2 == 0 &&
           (dt == ST_F32 || dt == ST_F16 || dt == ST_BF16);
}
static int mma_path(StDtype dt, int hd) { return dt != ST_F32 && (hd == 64 || hd == 128) && device_cc_major() >= 8; }

extern "C" int paged_prefill_supported(StDtype dt, int H, int KV, int hd) {
    if (!shape_ok(dt, H, KV, hd)) return 0;
    return dt == ST_F32 ? device_cc_major() >= 8 : mma_path(dt, hd);
}

static int check_args(const PagedPrefill *a) {
    if (!shape_ok(a->dt, a->H, a->KV, a->hd) || a->ntiles < 0 || a->block_size < 1 || a->bt_stride < 1 || a->ldq < a->H * a->hd ||
        a->ldo < a->H * a->hd) {
        fprintf(stderr, "paged_prefill: unsupported arguments (H=%d KV=%d hd=%d %s, tiles=%d, B=%d, ldq=%d, ldo=%d)\n",
                a->H, a->KV, a->hd, dt_name(a->dt), a->ntiles, a->block_size, a->ldq, a->ldo);
        return -1;
    }
    return 0;
}

template <class C, int HD> static void launch_mma(const PagedPrefill *a) {
    const size_t smem = (size_t)4 * PP_TILE_N * (HD + PP_PAD) * sizeof(C);
    // More than 48 KB of dynamic shared memory (69.6 KB at hd 128; every sm_80+ part allows at
    // least 99 KB) must be allowed first; the attribute lives in the current device's context,
    // so one flag per device and instantiation (a process may drive several GPUs).
    static unsigned long long attr_set = 0;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 64 || !(attr_set >> dev & 1)) {
        CUDA_CHECK(cudaFuncSetAttribute(k_prefill_mma<C, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        if (dev < 64) attr_set |= 1ull << dev;
    }
    const float scale_log2 = a->scale * 1.4426950408889634f;
    k_prefill_mma<C, HD><<<dim3(a->ntiles, a->KV), PP_THREADS, smem>>>(
        a->q, a->ldq, (const C *)a->kc, (const C *)a->vc, a->block_tables, a->bt_stride, a->block_size, a->tiles, a->H,
        a->KV, scale_log2, a->out, a->ldo, a->out_f32);
}

extern "C" int paged_prefill_simt(const PagedPrefill *a) {
    if (check_args(a)) return -1;
    if (a->ntiles == 0) return 0;
    const size_t smem = (size_t)(PP_THREADS / 32) * a->hd * sizeof(float);
    DISPATCH(a->dt, C,
             k_prefill_simt<C><<<dim3(a->ntiles, a->KV), PP_THREADS, smem>>>(
                 a->q, a->ldq, (const C *)a->kc, (const C *)a->vc, a->block_tables, a->bt_stride, a->block_size,
                 a->tiles, a->H, a->KV, a->hd, a->scale, a->out, a->ldo, a->out_f32));
    CUDA_CHECK_LAST();
    return 1;
}

extern "C" int paged_prefill(const PagedPrefill *a) {
    if (check_args(a)) return -1;
    if (a->ntiles == 0) return 0;
    // cp.async copies 16-byte pieces: the pool's base must be 16-byte aligned (its rows then are,
    // KV * hd * 2 bytes with hd 64 or 128); cudaMalloc's always is, a sub-allocation may not be
    if (!mma_path(a->dt, a->hd) || ((uintptr_t)a->kc | (uintptr_t)a->vc) % 16) return paged_prefill_simt(a);
    if (a->dt == ST_BF16) {
        if (a->hd == 64) launch_mma<__nv_bfloat16, 64>(a);
        else launch_mma<__nv_bfloat16, 128>(a);
    } else {
        if (a->hd == 64) launch_mma<__half, 64>(a);
        else launch_mma<__half, 128>(a);
    }
    CUDA_CHECK_LAST();
    return 1;
}
