// flash_attn.cu — step07's flash attention for prefill, a ladder of numbered versions (the C API is
// in flash_attn.h). FlashAttention-2's algorithm: a CTA owns a tile of query rows, streams the K/V
// tiles of its sequence through shared memory, and keeps the scores on the chip: S = Q K^T and
// O += P V with mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), the softmax online (a running
// max m and sum l per row; O rescaled by exp2(m_old - m_new) when the max grows) and normalized
// once, O / l, at the end. Tiles wholly above the causal diagonal are never loaded; the mask is
// applied only where a tile crosses it. GQA rows of one kv head are stacked in M (flash_attn.h).
// Tests: build/tests/run_tests --filter 'step07_flash_gpu/*'; ladder: build/bin/flash_bench.
//
// The ladder (LADDER below is the only list; each row one step over the one before):
//   v0_simt    the fallback (fp32, sm_75, unaligned rows): a warp per M row, lane = key; no tensor cores
//   v1_step05  step05's paged-prefill shape: 64-row tiles (4 warps x 16 rows), 64-key K/V tiles,
//              2-stage cp.async, rows padded by 16 bytes, Q in registers, P kept in registers
//   v2_128     128-row tiles with 8 warps and 128-key K/V tiles: each K/V byte loaded serves twice the
//              rows, half the loop iterations and barriers per key
//   v3_swz3    a 3-stage cp.async ring and XOR-swizzled shared rows (16-byte chunk c of row r at
//              c ^ (r % 8): ldmatrix's 8 rows hit 8 bank groups with no padding); 64-key tiles at hd 128
//              so 3 stages fit every sm_80+ part
//   v4_split   K and V in their own cp.async groups (the V copy overlaps S and the softmax, the next
//              K copy overlaps P V); exp2 as one FFMA (s * scale_log2 - m * scale_log2, the max kept
//              unscaled); a warp skips the key tiles its rows cannot see; Q in its own shared region
//   v5_rb      register blocking on v4: 4 warps x 32 rows (two m16 slices), so every K and V fragment
//              read from shared feeds two MMAs (half the shared-memory traffic per FLOP); at hd 128 Q
//              is re-read from shared each tile (its registers go to O)
//   v6_wgmma   sm_90a only: a producer warpgroup (cp.async into a 3-stage mbarrier ring, the copies
//              counted by the barrier as they land) and 2 consumer warpgroups of 64 rows issuing wgmma
//              (S = Q K^T from shared, O += P V with P from registers), 128-key tiles
//   v7_pingpong v6 with the two consumers taking turns at the tensor cores (named barriers), so one's
//              softmax runs under the other's GEMMs (FlashAttention-3's ping-pong)
//   v8_overlap v6 with FlashAttention-3's intra-warpgroup overlap: tile j+1's S = Q K^T issued before
//              tile j's P V, its softmax while the P V runs
//   v9_persist v7 with persistent CTAs (one an SM): the producer loads the next item's Q and K/V
//              while the consumers finish this one
//   v10_tma    v7 with a TMA producer (one thread, whole tiles, no proxy fences) for calls whose keys
//              are all rows of k and v (no context from the pool)
// flash_attn() runs the fastest rung measured on the H200 that takes the call (PREFERRED_128 / _64
// below). What the Hopper rungs measured and why: step07_kernels/FLASH.md.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>

#include "check.h"
#include "cuda_check.h"
#include "step02_attention/forward_gpu.cuh"  // tof, fromf, DISPATCH, dt_name
#include "step05_paged/cp_async.cuh"         // cp_async16, cp_async_commit, cp_async_wait
#include "step05_paged/mma.cuh"              // pack2, mma16816, ldsm_x4, ldsm_x4_t
#include "step07_kernels/flash_attn.h"
#include "tma_host.cuh"  // tma_map_2d (v10)
#include "wgmma.cuh"     // WGMMA_ARCH, mbar_*, tma_load_2d, fence_proxy_async, smem_desc, wgmma_*, WG_ACC32 / 64

// ---------------------------------------------------------------- shared pieces

struct FaArgs {  // what every kernel reads (flash_attn.h's FlashAttn, typed on the device side)
    const void *q, *k, *v, *kc, *vc;
    void *out;
    const int *cu_seqlens, *ctx_lens, *bt, *cu_tiles, *q_rows;
    int nseq, H, KV, ldq, ldk, ldo, bt_stride, B, causal;
    float scale, scale_log2;
    int nwork;  // ntiles * KV: the (tile, kv head) pairs
};

// The grid is flat, (ntiles * KV) CTAs: CTA b is tile b / KV of kv head b % KV, so the CTAs are
// dispatched tile by tile across the kv heads and the heaviest tiles of a sequence (its last, taken
// first) start first on every head.
// This CTA's tile: its sequence s (the last with cu_tiles[s] <= tile), the tile's first new token
// qi0 and rows, the sequence's first row krow0, context ctx, new tokens n.
struct FaTile {
    int s, qi0, nrows, krow0, ctx, n;
};
// w: the work item (tile w / KV of kv head w % KV); a CTA of the flat grid is item blockIdx.x.
__device__ inline FaTile find_tile(const FaArgs &a, int rpt, int w) {
    int lo = 0, hi = a.nseq - 1;  // cu_tiles[lo] <= tile < cu_tiles[nseq]
    const int b = w / a.KV;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldg(a.cu_tiles + mid) <= b) lo = mid;
        else hi = mid - 1;
    }
    FaTile t;
    t.s = lo;
    const int first = __ldg(a.cu_tiles + lo), count = __ldg(a.cu_tiles + lo + 1) - first;
    const int c0 = __ldg(a.cu_seqlens + lo);
    t.n = __ldg(a.cu_seqlens + lo + 1) - c0;
    t.krow0 = a.q_rows ? __ldg(a.q_rows + lo) : c0;
    t.ctx = a.ctx_lens ? __ldg(a.ctx_lens + lo) : 0;
    t.qi0 = (count - 1 - (b - first)) * rpt;  // the last tile (most keys) first
    t.nrows = min(rpt, t.n - t.qi0);
    return t;
}
__device__ inline FaTile find_tile(const FaArgs &a, int rpt) { return find_tile(a, rpt, blockIdx.x); }

// Key p of the tile's sequence: element offset of its kv head's row in the pool (p < ctx, or every
// key when k is NULL: *pool 1) or in k / v (the chunk's own keys).
__device__ inline size_t key_off(const FaArgs &a, const FaTile &t, const int *tab, int p, int kvh, int hd, int *pool) {
    if (p < t.ctx || !a.k) {
        *pool = 1;
        return ((size_t)__ldg(tab + p / a.B) * a.B + p % a.B) * ((size_t)a.KV * hd) + (size_t)kvh * hd;
    }
    *pool = 0;
    return (size_t)(t.krow0 + p - t.ctx) * a.ldk + (size_t)kvh * hd;
}

// ---------------------------------------------------------------- v0: the SIMT fallback

#define FA_SIMT_WARPS 4
#define FA_SIMT_TILE_M 64
// Grid (ntiles * KV), 128 threads; dynamic shared FA_SIMT_WARPS * hd floats (each warp's scaled q).
// hd <= 256 (acc holds 8 elements a lane).
template <class C> __global__ void __launch_bounds__(32 * FA_SIMT_WARPS) k_flash_simt(FaArgs a, int hd, int tile_m) {
    extern __shared__ float fa_qs[];
    const int g = a.H / a.KV, kvh = blockIdx.x % a.KV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const FaTile t = find_tile(a, tile_m / g);
    const int *tab = a.bt ? a.bt + (size_t)t.s * a.bt_stride : nullptr;
    const C *q = (const C *)a.q, *k = (const C *)a.k, *v = (const C *)a.v, *kc = (const C *)a.kc, *vc = (const C *)a.vc;
    float *qw = fa_qs + warp * hd;
    for (int m = warp; m < t.nrows * g; m += FA_SIMT_WARPS) {
        const int i = t.qi0 + m / g, h = kvh * g + m % g, lim = a.causal ? t.ctx + i : t.ctx + t.n - 1;
        const C *qr = q + (size_t)(t.krow0 + i) * a.ldq + (size_t)h * hd;
        __syncwarp();
        for (int e = lane; e < hd; e += 32) qw[e] = tof(qr[e]) * a.scale;
        __syncwarp();
        float mrun = -INFINITY, l = 0, acc[8];
#pragma unroll
        for (int c = 0; c < 8; c++) acc[c] = 0;
        for (int j0 = 0; j0 <= lim; j0 += 32) {
            const int j = j0 + lane, valid = j <= lim;
            int pool = 0;
            const size_t off = valid ? key_off(a, t, tab, j, kvh, hd, &pool) : 0;
            float s = -INFINITY;
            if (valid) {
                const C *kr = (pool ? kc : k) + off;
                float dot = 0;
                for (int e = 0; e < hd; e++) dot = fmaf(qw[e], tof(kr[e]), dot);
                s = dot;
            }
            float mt = s;
            for (int o = 16; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
            const float mn = fmaxf(mrun, mt);  // finite: key j0 is valid
            const float al = expf(mrun - mn), p = valid ? expf(s - mn) : 0.0f;
            float ps = p;
            for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l = l * al + ps, mrun = mn;
#pragma unroll
            for (int c = 0; c < 8; c++) acc[c] *= al;
            const int nj = min(32, lim - j0 + 1);
            for (int jj = 0; jj < nj; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                const unsigned long long oj = __shfl_sync(0xffffffffu, (unsigned long long)off, jj);
                const int pj_pool = __shfl_sync(0xffffffffu, pool, jj);
                const C *vr = (pj_pool ? vc : v) + oj;
#pragma unroll
                for (int c = 0; c < 8; c++)
                    if (lane + 32 * c < hd) acc[c] = fmaf(pj, tof(vr[lane + 32 * c]), acc[c]);
            }
        }
        C *o = (C *)a.out + (size_t)(t.krow0 + i) * a.ldo + (size_t)h * hd;
#pragma unroll
        for (int c = 0; c < 8; c++)
            if (lane + 32 * c < hd) o[lane + 32 * c] = fromf<C>(acc[c] / l);
    }
}

// ---------------------------------------------------------------- sm_80+ building blocks

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FA_MMA_ARCH 1
#endif
// pack2, mma16816, ldsm_x4, ldsm_x4_t: step05_paged/mma.cuh (they trap below sm_80)
// 2^x with the hardware approximation (MUFU.EX2; 2^-inf = 0), as every flash kernel uses it
__device__ inline float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// One version's shape. NW warps of MT m16 slices each (tile_m = 16 * NW * MT rows), BN keys per K/V
// tile, ST stages (V4: K and V each in 2 stages of their own groups), SWZ swizzled rows (else
// padded), QREG Q held in registers for the whole loop (else re-read from shared each tile), V4
// the split K/V pipeline, the FFMA exp2 and the per-warp causal skip.
template <int NW_, int MT_, int BN_, int ST_, bool SWZ_, bool QREG_, bool V4_> struct FaCfg {
    static constexpr int NW = NW_, MT = MT_, BN = BN_, ST = ST_, BM = 16 * NW_ * MT_;
    static constexpr bool SWZ = SWZ_, QREG = QREG_, V4 = V4_;
};

// Element offset of 16-byte chunk ch of row r in a tile of rows HD elements wide.
template <int HD, bool SWZ> __device__ inline int soff(int r, int ch) {
    if (SWZ) return r * HD + ((ch ^ (r & 7)) << 3);
    return r * (HD + 8) + (ch << 3);
}
template <int HD, bool SWZ> constexpr int tile_elems(int rows) { return rows * (SWZ ? HD : HD + 8); }

template <class C, int HD, class F> constexpr size_t mma_smem_bytes() {
    // non-V4: ST stages of (K, V); Q borrows the last stage. V4: Q, then 2 K stages, 2 V stages.
    return F::V4 ? (size_t)(tile_elems<HD, F::SWZ>(F::BM) + 4 * tile_elems<HD, F::SWZ>(F::BN)) * sizeof(C)
                 : (size_t)F::ST * 2 * tile_elems<HD, F::SWZ>(F::BN) * sizeof(C);
}

// ---------------------------------------------------------------- v1 .. v4: the tensor-core kernel

// Grid (ntiles * KV), 32 * F::NW threads, mma_smem_bytes<C, HD, F>() of dynamic shared memory.
template <class C, int HD, class F> __global__ void __launch_bounds__(32 * F::NW) k_flash_mma(FaArgs a) {
#ifdef FA_MMA_ARCH
    constexpr int NT = 32 * F::NW, BN = F::BN, BM = F::BM, MT = F::MT, ST = F::ST;
    constexpr int KCH = HD / 16, NB8 = BN / 8, DT = HD / 8, VPR = HD / 8, RPP = NT / VPR;
    constexpr bool SWZ = F::SWZ;
    constexpr int TK = tile_elems<HD, SWZ>(BN);  // elements of one K (or V) tile
    static_assert(F::V4 || F::QREG, "Q borrows a K/V stage: it must live in registers");
    static_assert(F::V4 || BM <= 2 * BN, "Q must fit in one (K, V) stage");
    static_assert(!F::V4 || ST == 2, "the split pipeline has 2 stages of each");
    static_assert(BN % RPP == 0 && BM % RPP == 0, "whole passes of the copy loop");
    extern __shared__ __align__(128) unsigned char fa_smem[];
    C *sm = (C *)fa_smem;
    // non-V4: stage st = K at sm + st * 2 * TK, V at + TK; Q over the last stage.
    // V4: Q (BM rows), K stages, V stages.
    C *Qs = F::V4 ? sm : sm + (ST - 1) * 2 * TK;
    C *Kbase = F::V4 ? sm + tile_elems<HD, SWZ>(BM) : sm;
    C *Vbase = F::V4 ? Kbase + 2 * TK : sm + TK;
    constexpr int KSTRIDE = F::V4 ? TK : 2 * TK;  // from one stage's K (V) to the next's

    const int g = a.H / a.KV, kvh = blockIdx.x % a.KV, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int gid = lane / 4, tig = lane % 4;
    const FaTile t = find_tile(a, BM / g);
    const int *tab = a.bt ? a.bt + (size_t)t.s * a.bt_stride : nullptr;
    const C *gq = (const C *)a.q, *gk = (const C *)a.k, *gv = (const C *)a.v, *gkc = (const C *)a.kc,
            *gvc = (const C *)a.vc;
    // the last key any row of the tile sees, the K/V tiles that covers
    const int klast = a.causal ? t.ctx + t.qi0 + t.nrows - 1 : t.ctx + t.n - 1, nkt = klast / BN + 1;

    // copies key tile kt's rows into stage st: K (want_k), V (want_v); keys past klast are zeros
    auto load_kv = [&](int kt, int st, bool want_k, bool want_v) {
        const int c = tid % VPR;
#pragma unroll
        for (int r0 = 0; r0 < BN; r0 += RPP) {
            const int r = r0 + tid / VPR, p = kt * BN + r, ok = p <= klast;
            int pool = 0;
            const size_t off = ok ? key_off(a, t, tab, p, kvh, HD, &pool) + c * 8 : 0;
            const int so = soff<HD, SWZ>(r, c);
            if (want_k) cp_async16(Kbase + st * KSTRIDE + so, (pool ? gkc : gk) + off, ok ? 16 : 0);
            if (want_v) cp_async16(Vbase + st * KSTRIDE + so, (pool ? gvc : gv) + off, ok ? 16 : 0);
        }
    };
    // Q: M row m = (new token qi0 + m / g, head kvh * g + m % g); padding rows are zeros
    {
        const int c = tid % VPR;
#pragma unroll
        for (int r0 = 0; r0 < BM; r0 += RPP) {
            const int m = r0 + tid / VPR, i = m / g, ok = i < t.nrows;
            const size_t off = ok ? (size_t)(t.krow0 + t.qi0 + i) * a.ldq + (size_t)(kvh * g + m % g) * HD + c * 8 : 0;
            cp_async16(Qs + soff<HD, SWZ>(m, c), gq + off, ok ? 16 : 0);
        }
        cp_async_commit();
    }
    if (F::V4) {
        load_kv(0, 0, true, false), cp_async_commit();
        load_kv(0, 0, false, true), cp_async_commit();
    } else {
#pragma unroll
        for (int st = 0; st < ST - 1; st++) {
            if (st < nkt) load_kv(st, st, true, true);
            cp_async_commit();
        }
    }

    // this thread's rows: slice mt, half hf -> M row warp * 16 * MT + mt * 16 + hf * 8 + gid, and the
    // last key each sees (padding rows: the last real row's)
    int lim[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int m = warp * 16 * MT + mt * 16 + hf * 8 + gid;
            lim[mt][hf] = a.causal ? t.ctx + t.qi0 + min(m / g, t.nrows - 1) : klast;
        }
    // the warp's first and last rows' limits: below the first no mask is needed; past the last the
    // warp has nothing to do (V4 skips those tiles)
    const int wr0 = warp * 16 * MT, wr1 = wr0 + 16 * MT - 1;
    const int wlim0 = a.causal ? t.ctx + t.qi0 + min(wr0 / g, t.nrows - 1) : klast;
    const int wlim1 = a.causal ? t.ctx + t.qi0 + min(wr1 / g, t.nrows - 1) : klast;

    unsigned qa[F::QREG ? MT : 1][F::QREG ? KCH : 1][4];
    float o[MT][DT][4], mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        mrow[mt][0] = mrow[mt][1] = -INFINITY, lrow[mt][0] = lrow[mt][1] = 0;
#pragma unroll
        for (int j = 0; j < DT; j++) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0;
    }
    auto load_q_frag = [&](unsigned r[4], int mt, int kc0) {
        ldsm_x4(r, Qs + soff<HD, SWZ>(warp * 16 * MT + mt * 16 + (lane & 15), kc0 * 2 + (lane >> 4)));
    };
    if (!F::V4) {
        cp_async_wait<ST - 1>();  // Q has landed (the K/V stages may still be in flight)
        __syncthreads();
        if (F::QREG)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kc0 = 0; kc0 < KCH; kc0++) load_q_frag(qa[F::QREG ? mt : 0][F::QREG ? kc0 : 0], mt, kc0);
        // Q's stage is refilled only after the loop's first barrier: every warp has its fragments
    }

    for (int kt = 0; kt < nkt; kt++) {
        const C *ks, *vs;
        if (F::V4) {
            cp_async_wait<1>();  // K(kt) (and Q) landed; V(kt) may be in flight
            __syncthreads();
            if (F::QREG && kt == 0)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int kc0 = 0; kc0 < KCH; kc0++) load_q_frag(qa[F::QREG ? mt : 0][F::QREG ? kc0 : 0], mt, kc0);
            if (kt + 1 < nkt) load_kv(kt + 1, (kt + 1) & 1, true, false);
            cp_async_commit();
            ks = Kbase + (kt & 1) * KSTRIDE, vs = Vbase + (kt & 1) * KSTRIDE;
        } else {
            cp_async_wait<ST - 2>();
            __syncthreads();
            const int nxt = kt + ST - 1;
            if (nxt < nkt) load_kv(nxt, nxt % ST, true, true);
            cp_async_commit();
            ks = Kbase + (kt % ST) * KSTRIDE, vs = Vbase + (kt % ST) * KSTRIDE;
        }
        const int k0 = kt * BN;
        const bool active = !F::V4 || k0 <= wlim1;  // V4: a warp whose rows see none of the tile skips it
        float s[MT][NB8][4];
        if (active) {
            // ---- S = Q K^T (16 MT x BN per warp)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NB8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0;
#pragma unroll
            for (int kc0 = 0; kc0 < KCH; kc0++) {
                unsigned qf[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (F::QREG)
#pragma unroll
                        for (int x = 0; x < 4; x++) qf[mt][x] = qa[F::QREG ? mt : 0][F::QREG ? kc0 : 0][x];
                    else load_q_frag(qf[mt], mt, kc0);
                }
#pragma unroll
                for (int np = 0; np < NB8 / 2; np++) {
                    unsigned b[4];
                    ldsm_x4(b, ks + soff<HD, SWZ>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kc0 * 2 + ((lane >> 3) & 1)));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<C>(s[mt][2 * np], qf[mt], b[0], b[1]);
                        mma16816<C>(s[mt][2 * np + 1], qf[mt], b[2], b[3]);
                    }
                }
            }
            // ---- causal mask (only on a tile that crosses a row's limit), online softmax
            const bool masked = k0 + BN - 1 > wlim0;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx[2] = {mrow[mt][0], mrow[mt][1]};
#pragma unroll
                for (int j = 0; j < NB8; j++) {
                    const int key = k0 + j * 8 + tig * 2;
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        if (!F::V4) s[mt][j][x] *= a.scale_log2;
                        if (masked && key + (x & 1) > lim[mt][x >> 1]) s[mt][j][x] = -INFINITY;
                    }
                    mx[0] = fmaxf(mx[0], fmaxf(s[mt][j][0], s[mt][j][1]));
                    mx[1] = fmaxf(mx[1], fmaxf(s[mt][j][2], s[mt][j][3]));
                }
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
#pragma unroll
                    for (int off = 1; off < 4; off <<= 1) mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], off));
                    // finite: tile 0 holds key 0, which every row sees, and the max only grows.
                    // V4 keeps the max unscaled: 2^((s - m) * scale_log2) = 2^(s * c - m * c), one FFMA
                    const float al = F::V4 ? fast_exp2((mrow[mt][hf] - mx[hf]) * a.scale_log2) : fast_exp2(mrow[mt][hf] - mx[hf]);
                    const float mc = F::V4 ? mx[hf] * a.scale_log2 : mx[hf];
                    mrow[mt][hf] = mx[hf];
                    float ps = 0;
#pragma unroll
                    for (int j = 0; j < NB8; j++) {
#pragma unroll
                        for (int x = 2 * hf; x < 2 * hf + 2; x++) {
                            s[mt][j][x] = F::V4 ? fast_exp2(fmaf(s[mt][j][x], a.scale_log2, -mc)) : fast_exp2(s[mt][j][x] - mc);
                            ps += s[mt][j][x];
                        }
                    }
                    lrow[mt][hf] = lrow[mt][hf] * al + ps;
#pragma unroll
                    for (int j = 0; j < DT; j++) o[mt][j][2 * hf] *= al, o[mt][j][2 * hf + 1] *= al;
                }
            }
        }
        if (F::V4) {
            cp_async_wait<1>();  // V(kt) landed; K(kt+1) may be in flight
            __syncthreads();
            if (kt + 1 < nkt) load_kv(kt + 1, (kt + 1) & 1, false, true);
            cp_async_commit();
        }
        if (active) {
            // ---- O += P V: n-tiles 2kk, 2kk+1 of S are, register for register, the A fragment of
            // keys kk*16 .. kk*16+15 (rounded to C); P never goes through shared memory
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                unsigned pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = pack2<C>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack2<C>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack2<C>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack2<C>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    unsigned b[4];
                    ldsm_x4_t(b, vs + soff<HD, SWZ>(kk * 16 + (lane & 15), dp * 2 + (lane >> 4)));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<C>(o[mt][2 * dp], pa[mt], b[0], b[1]);
                        mma16816<C>(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                    }
                }
            }
        }
    }
    // ---- deferred normalization: O / l once, then the write (row m = (token m / g, head m % g))
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lrow[mt][hf];
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
            const int m = warp * 16 * MT + mt * 16 + hf * 8 + gid;
            if (m >= t.nrows * g) continue;
            const float inv = 1.0f / l;
            C *dst = (C *)a.out + (size_t)(t.krow0 + t.qi0 + m / g) * a.ldo + (size_t)(kvh * g + m % g) * HD + tig * 2;
#pragma unroll
            for (int j = 0; j < DT; j++) *(unsigned *)(dst + j * 8) = pack2<C>(o[mt][j][2 * hf] * inv, o[mt][j][2 * hf + 1] * inv);
        }
#elif defined(__CUDA_ARCH__)
    __trap();  // no bf16/fp16 mma.sync below sm_80: the host never launches this there (mma_ok)
#endif
}

// ---------------------------------------------------------------- v6: Hopper wgmma (sm_90a only)

// FlashAttention-3's shape on step01 v9's building blocks. 3 warpgroups (384 threads): warpgroup 0 is
// the producer, warpgroups 1 and 2 the consumers, 64 M rows each (tile_m 128). The producer copies
// the K and V tiles (128 keys each) with cp.async into a FA6_ST-stage ring (the context keys are
// pool rows found through the block table, so no TMA: every key takes the same path), in the
// 128-byte swizzled layout wgmma reads; each producer thread ends a tile's copies with
// cp.async.mbarrier.arrive.noinc on the stage's "fullK" / "fullV" mbarrier (128 arrivals: the
// barrier completes when every thread's copies have landed), each consumer fences the async proxy
// after its wait (the copies are generic-proxy writes, wgmma reads through the async proxy), and the
// consumers release the stage on "empty" (one arrival a consumer warp) once their wgmmas have read it. A consumer holds its
// 64 rows' S (64 x 128 fp32, 64 registers a thread) and O (64 x hd fp32) as wgmma accumulators:
//   S = Q K^T   wgmma m64n128k16, Q and K from shared memory (both K-major: hd contiguous)
//   softmax     in registers on the accumulator layout (thread: rows 16 w + gid and + 8 of its
//               warpgroup's 64, columns 8 j + 2 tig + {0, 1}: the same as mma.sync's per warp)
//   O += P V    wgmma m64n{hd}k16 with P as the A operand from REGISTERS (the A fragment of keys
//               16 kk .. 16 kk + 15 is, register for register, accumulator n-tiles 2 kk and 2 kk + 1
//               rounded to C) and V from shared memory, MN-major (hd contiguous: transpose bit set)
// Shared layout (1024-aligned, the swizzle's period): Q, the K stages, the V stages, 3 mbarriers a stage. A
// tile of R rows is hd / 64 slabs of R rows x 128 bytes (64 columns); 16-byte chunk c of row r of a
// slab sits at chunk c ^ (r % 8), which is what the 128-byte swizzle mode means to wgmma.
// Simplified against FA3: no TMA (cp.async, since context keys come through the block table), no
// intra-warpgroup overlap of the next S with this P V (each wgmma batch is waited for at once); v7
// adds the ping-pong of the two consumers. The first draft waited for its own copies before it
// arrived and computed each address through key_off (a division by the block size per row): its
// consumers spent 27% of the sampled warp time waiting on "fullK" (ncu, 223 TFLOP/s at llama8b_4k);
// the producer below issues 16 copies a tile with pointer increments and does not wait (289.6).
#define FA6_BM 128  // M rows per CTA: 2 consumer warpgroups x 64
#define FA6_BN 128  // keys per K/V tile
#define FA6_NT 384  // producer + 2 consumer warpgroups
#define FA6_ST 3    // K/V stages in the ring (3 x 64 KB at hd 128: 225 KB with Q, under sm_90's 227 KB)

// bytes: Q, FA6_ST K and V stages, alignment slack, 3 * FA6_ST mbarriers (fullK, fullV, empty), qfull, qempty
template <int HD> constexpr size_t fa6_smem_bytes() {
    return (size_t)(FA6_BM + 2 * FA6_ST * FA6_BN) * HD * 2 + 1024 + (3 * FA6_ST + 2) * 8;
}

// Byte offset of 16-byte chunk ch (0 .. hd / 8 - 1) of row r in a swizzled tile of `rows` rows.
__device__ inline uint32_t fa6_off(int rows, int r, int ch) {
    return (uint32_t)((ch >> 3) * (rows * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

__global__ void k_fa6_probe(int *out) {
#ifdef WGMMA_ARCH
    *out = 1;
#else
    (void)out;
#endif
}

#ifdef WGMMA_ARCH
// the accumulator operands, spelled out once
#define FA6_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA6_OPS32 WG_ACC32
#define FA6_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FA6_OPS64 WG_ACC64
// d (64 x 128) += A (64 x 16, shared, K-major) . B (16 x 128, shared, K-major): S = Q K^T
// acc 0: d = A . B (scale-d false: d's old value is not read, so S needs no zeroing)
#define FA6_SS128(TY)                                                                                     \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                          \
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " FA6_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : FA6_OPS64 : "l"(da), "l"(db), "r"(acc))
// d (64 x N) += A (64 x 16, registers) . B (16 x N, shared, MN-major): O += P V. AB: the A registers'
// and the descriptor's operand numbers (after the N / 2 accumulators)
#define FA6_RS(N, DREGS, DOPS, AB, TY)                                                                       \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " DREGS ", " AB ", 1, 1, 1, 1;\n" \
                 : DOPS : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(db))
#define FA6_AB64 "{%32, %33, %34, %35}, %36"
#define FA6_AB128 "{%64, %65, %66, %67}, %68"
template <class C> __device__ inline void wg_ss128(float (&d)[64], uint64_t da, uint64_t db, int acc);
template <> __device__ inline void wg_ss128<__nv_bfloat16>(float (&d)[64], uint64_t da, uint64_t db, int acc) { FA6_SS128("bf16"); }
template <> __device__ inline void wg_ss128<__half>(float (&d)[64], uint64_t da, uint64_t db, int acc) { FA6_SS128("f16"); }
template <class C> __device__ inline void wg_rs(float (&d)[32], const unsigned p[4], uint64_t db);
template <> __device__ inline void wg_rs<__nv_bfloat16>(float (&d)[32], const unsigned p[4], uint64_t db) { FA6_RS(64, FA6_D32, FA6_OPS32, FA6_AB64, "bf16"); }
template <> __device__ inline void wg_rs<__half>(float (&d)[32], const unsigned p[4], uint64_t db) { FA6_RS(64, FA6_D32, FA6_OPS32, FA6_AB64, "f16"); }
template <class C> __device__ inline void wg_rs(float (&d)[64], const unsigned p[4], uint64_t db);
template <> __device__ inline void wg_rs<__nv_bfloat16>(float (&d)[64], const unsigned p[4], uint64_t db) { FA6_RS(128, FA6_D64, FA6_OPS64, FA6_AB128, "bf16"); }
template <> __device__ inline void wg_rs<__half>(float (&d)[64], const unsigned p[4], uint64_t db) { FA6_RS(128, FA6_D64, FA6_OPS64, FA6_AB128, "f16"); }

// S = Q K^T of one tile for a consumer's 64 rows: hd / 16 k-steps, k-step kk 32 bytes into slab
// kk / 4 of each row (qa: the warpgroup's first Q row, kb: the stage's K tile); issued, committed,
// not waited for
template <class C, int HD> __device__ inline void fa6_issue_s(float (&s)[64], uint32_t qa, uint32_t kb) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wg_ss128<C>(s, smem_desc(qa + (kk >> 2) * (FA6_BM * 128) + (kk & 3) * 32, 16, 1024),
                    smem_desc(kb + (kk >> 2) * (FA6_BN * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
    wgmma_commit();
}
// O += P V: keys 16 kk .. 16 kk + 15 are S's n-tiles 2 kk, 2 kk + 1 (registers 8 kk .. 8 kk + 7),
// the A fragment of m64nNk16 in that order; V's k-step kk is 16 rows of 128 bytes further, its
// 64-column slabs BN * 128 bytes apart (the leading offset). Issued and committed.
template <class C, int NO> __device__ inline void fa6_issue_pv(float (&o)[NO], const unsigned (&pa)[FA6_BN / 16][4], uint32_t vb) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < FA6_BN / 16; kk++) wg_rs<C>(o, pa[kk], smem_desc(vb + kk * 16 * 128, FA6_BN * 128, 1024));
    wgmma_commit();
}
template <class C> __device__ inline void fa6_pack_p(const float (&s)[64], unsigned (&pa)[FA6_BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < FA6_BN / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) pa[kk][i] = pack2<C>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}
// One tile's causal mask (when the tile crosses the warpgroup's first row's limit) and online
// softmax on the S accumulator, in place: s becomes p = 2^(s c - m c) (the max kept unscaled: one
// FFMA), the thread's two rows' running max and sum updated; al: what O must be scaled by.
__device__ inline void fa6_softmax(float (&s)[64], float (&mrow)[2], float (&lrow)[2], float (&al)[2], bool masked,
                                   int k0, const int (&lim)[2], int tig, float c) {
    float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int j = 0; j < FA6_BN / 8; j++) {
        const int key = k0 + j * 8 + tig * 2;
#pragma unroll
        for (int x = 0; x < 4; x++)
            if (masked && key + (x & 1) > lim[x >> 1]) s[4 * j + x] = -INFINITY;
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], off));
        // finite: tile 0 holds key 0, which every row sees, and the max only grows
        al[hf] = fast_exp2((mrow[hf] - mx[hf]) * c);
        const float mc = mx[hf] * c;
        mrow[hf] = mx[hf];
        float ps = 0;
#pragma unroll
        for (int j = 0; j < FA6_BN / 8; j++)
#pragma unroll
            for (int x = 2 * hf; x < 2 * hf + 2; x++) {
                s[4 * j + x] = fast_exp2(fmaf(s[4 * j + x], c, -mc));
                ps += s[4 * j + x];
            }
        lrow[hf] = lrow[hf] * al[hf] + ps;
    }
}
template <int NO> __device__ inline void fa6_rescale(float (&o)[NO], const float (&al)[2]) {
#pragma unroll
    for (int j = 0; j < NO / 4; j++) o[4 * j] *= al[0], o[4 * j + 1] *= al[0], o[4 * j + 2] *= al[1], o[4 * j + 3] *= al[1];
}
#endif

// v7 (PP): FlashAttention-3's warpgroup ping-pong. The two consumers take turns at the tensor cores:
// before issuing a batch of wgmmas (S, then P V) a consumer waits for its turn on its named barrier
// (3 + cw: its 128 threads sync, the other consumer's 128 arrive), and once they are issued it
// hands the turn over by arriving on the other's. The issue order becomes S1 S2 PV1 PV2 S1' ...:
// consumer 1's softmax runs while consumer 2's GEMMs use the tensor cores, and the other way round.
// Consumer 2 gives consumer 1 the first turn and skips its last hand-over, so every sync has its
// arrival; neither can arrive twice on one barrier before the other has synced (each hand-over
// waits for the turn it answers).
template <int CW> __device__ inline void fa_turn_wait() {
    if (CW == 0) asm volatile("bar.sync 3, 256;\n" ::: "memory");
    else asm volatile("bar.sync 4, 256;\n" ::: "memory");
}
template <int CW> __device__ inline void fa_turn_give() {  // to the other consumer
    if (CW == 0) asm volatile("bar.arrive 4, 256;\n" ::: "memory");
    else asm volatile("bar.arrive 3, 256;\n" ::: "memory");
}
__device__ inline void fa_turn_wait(int cw) { cw == 0 ? fa_turn_wait<0>() : fa_turn_wait<1>(); }
__device__ inline void fa_turn_give(int cw) { cw == 0 ? fa_turn_give<0>() : fa_turn_give<1>(); }

// Grid (ntiles * KV) CTAs, or (v9, PERSIST) at most one per SM, each taking work items in turn;
// FA6_NT threads, fa6_smem_bytes<HD>() of dynamic shared memory. MODE: v6's loop, v7's ping-pong or
// v8's overlap.
//
// v9 (PERSIST): FlashAttention-3's persistent CTAs. A CTA of the flat grid does one tile and exits,
// and the next CTA on that SM starts from nothing: barriers, its Q load, the producer's first K/V
// tiles, all with the tensor cores idle. A persistent CTA takes items b, then 2 G - 1 - b, then
// 2 G + b, ... (G CTAs; a snake, since the items come longest first), and its producer runs ahead
// across items: it loads the next item's Q (once both consumers have released the Q buffer on
// "qempty") and K/V tiles while the consumers finish this one and write its O. The ring's stages
// and phases count tiles over all of the CTA's items.
//
// v10 (TMA): the keys of a call without a context are rows of k and v, so the producer is one
// thread asking the copy engine for each tile (hd / 64 boxes of 128 rows x 128 bytes for K, the
// same for V, landing in the 128-byte swizzled layout, rows past k_rows as zeros) and counting its
// bytes on the stage's barrier (expect_tx); the copies are async-proxy writes, so the consumers
// wait and issue their wgmmas with no proxy fence. Rows past the sequence's last key are other
// sequences' keys (finite), masked like the zero rows of the other rungs.
struct FaTma {
    CUtensorMap k, v;  // (k_rows, KV * hd) each, boxes of FA6_BN rows x 64 columns
};
enum { FA6_PLAIN, FA6_PINGPONG, FA6_OVERLAP };
template <class C, int HD, int MODE, bool PERSIST, bool TMA>
__global__ void __launch_bounds__(FA6_NT, 1) k_flash_wgmma(FaArgs a, const __grid_constant__ FaTma tm) {
#ifdef WGMMA_ARCH
    static_assert(!(TMA && PERSIST), "v10 is v7 with TMA");
    constexpr bool PP = MODE == FA6_PINGPONG, OV = MODE == FA6_OVERLAP;
    constexpr int BM = FA6_BM, BN = FA6_BN, VPR = HD / 8, RPP = 128 / VPR, NO = HD / 2;
    constexpr uint32_t QB = BM * HD * 2, TB = BN * HD * 2;  // bytes of the Q tile, of one K (V) tile
    static_assert(BN == 128 && BM == 128, "S is one m64n128 accumulator; 2 consumer warpgroups");
    extern __shared__ unsigned char fa6_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(fa6_raw), pad = (1024 - (raw & 1023)) & 1023;
    unsigned char *sm = fa6_raw + pad;  // generic pointer to the 1024-aligned base
    constexpr int NS = FA6_ST;
    const uint32_t sq = raw + pad, sk = sq + QB, sv = sk + NS * TB, bars = sv + NS * TB;
    // bars + 8 st: fullK[st], + 8 (NS + st): fullV[st], + 8 (2 NS + st): empty[st]; v9: + 8 (3 NS)
    // qfull, + 8 (3 NS + 1) qempty
    const uint32_t qfull = bars + 8 * (3 * NS), qempty = qfull + 8;
    // wg, the item and nkt broadcast from lane 0: the same in every lane, and the compiler can tell (a
    // branch on them is not divergent; a wgmma in flight across a divergent branch gets serialized)
    const int g = a.H / a.KV, wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0), tid = threadIdx.x % 128;
    const int G = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int st = 0; st < NS; st++) {
            mbar_init(bars + 8 * st, TMA ? 1 : 128);         // fullK: every producer thread, when its K copies land
            mbar_init(bars + 8 * (NS + st), TMA ? 1 : 128);  // fullV: the same for V (TMA: the one thread's expect_tx)
            mbar_init(bars + 8 * (2 * NS + st), 8);    // empty: one arrival a consumer warp
        }
        mbar_init(qfull, 128);  // (v9) every producer thread, when its Q copies land
        mbar_init(qempty, 8);   // (v9) one arrival a consumer warp, once its last S is done
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // item r of this CTA (the flat grid: item b, then none)
    auto item = [&](int r) { return __shfl_sync(0xffffffffu, r * G + (r & 1 ? G - 1 - b : b), 0); };

    if (wg == 0) {  // ---- producer: K and V tiles of 128 keys, keys past klast as zeros (v9: and Q)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        // Thread tid copies 16-byte chunk c of rows rr, rr + RPP, ... of every tile. RPP is a multiple
        // of 8, so the swizzle (row % 8) is the same for all of them: the destination moves by RPP rows
        // of 128 bytes, a chunk of the chunk's own keys by RPP rows of k, a pooled key by RPP table
        // positions (its block and offset kept incrementally: no division in the loop). The copies
        // are not waited for: cp.async.mbarrier.arrive.noinc makes the stage's barrier count this
        // thread's arrival once they have landed, and the producer goes on to the next stage.
        const C *gk = (const C *)a.k, *gv = (const C *)a.v, *gkc = (const C *)a.kc, *gvc = (const C *)a.vc;
        const int c = tid % VPR, rr = tid / VPR, pool_all = gk == nullptr;
        const uint32_t d0 = fa6_off(BN, rr, c);
        int gt = 0;  // tiles loaded so far (all items): the ring's position
        for (int r = 0;; r++) {
            const int w = item(r);
            if (w >= a.nwork || (!PERSIST && r > 0)) break;
            const int kvh = w % a.KV;
            const FaTile t = find_tile(a, BM / g, w);
            const int klast = a.causal ? t.ctx + t.qi0 + t.nrows - 1 : t.ctx + t.n - 1;
            const int nkt = __shfl_sync(0xffffffffu, klast / BN + 1, 0);
            const int *tab = a.bt ? a.bt + (size_t)t.s * a.bt_stride : nullptr;
            const size_t col = (size_t)kvh * HD + c * 8, pstride = (size_t)a.KV * HD;
            const int B = tab ? a.B : 0x40000000;  // no pool: blk stays 0, boff never wraps
            if (PERSIST) {  // Q (M row m = new token qi0 + m / g, head kvh * g + m % g; padding rows zeros)
                mbar_wait(qempty, (r & 1) ^ 1);  // the consumers are done with the last item's Q
                const C *gq = (const C *)a.q;
#pragma unroll
                for (int r0 = 0; r0 < BM; r0 += RPP) {
                    const int m = r0 + rr, i = m / g, ok = i < t.nrows;
                    const size_t off = ok ? (size_t)(t.krow0 + t.qi0 + i) * a.ldq + (size_t)(kvh * g + m % g) * HD + c * 8 : 0;
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sq + fa6_off(BM, m, c)), "l"(gq + off),
                                 "r"(ok ? 16 : 0)
                                 : "memory");
                }
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(qfull) : "memory");
            }
            auto load = [&](int kt, uint32_t dst, const C *g_new, const C *g_pool, uint32_t bar) {
                int p = kt * BN + rr, blk = p / B, boff = p - blk * B;
                size_t noff = (size_t)(t.krow0 - t.ctx + p) * a.ldk + col;  // only read for p >= ctx when k is given
                dst += d0;
#pragma unroll 4
                for (int i = 0; i < BN / RPP; i++) {
                    const C *src = g_pool ? g_pool : g_new;  // any valid address for a zero fill
                    int bytes = 0;
                    if (p <= klast) {
                        bytes = 16;
                        src = p < t.ctx || pool_all ? g_pool + ((size_t)__ldg(tab + blk) * B + boff) * pstride + col : g_new + noff;
                    }
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
                    p += RPP, dst += RPP * 128, noff += (size_t)RPP * a.ldk, boff += RPP;
                    while (boff >= B) boff -= B, blk++;
                }
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
            };
            if constexpr (TMA) {
                if (tid == 0)
                    for (int kt = 0; kt < nkt; kt++, gt++) {
                        const int st = gt % NS, row = t.krow0 + kt * BN;
                        const uint32_t fk = bars + 8 * st, fv = bars + 8 * (NS + st);
                        mbar_wait(bars + 8 * (2 * NS + st), ((gt / NS) & 1) ^ 1);
                        mbar_expect_tx(fk, TB);  // the whole boxes count, zero-filled rows included
#pragma unroll
                        for (int j = 0; j < HD / 64; j++) tma_load_2d(sk + st * TB + j * (BN * 128), &tm.k, kvh * HD + j * 64, row, fk);
                        mbar_expect_tx(fv, TB);
#pragma unroll
                        for (int j = 0; j < HD / 64; j++) tma_load_2d(sv + st * TB + j * (BN * 128), &tm.v, kvh * HD + j * 64, row, fv);
                    }
            } else {
                for (int kt = 0; kt < nkt; kt++, gt++) {
                    const int st = gt % NS;
                    mbar_wait(bars + 8 * (2 * NS + st), ((gt / NS) & 1) ^ 1);  // stage free (the first round at once)
                    load(kt, sk + st * TB, gk, gkc, bars + 8 * st);
                    load(kt, sv + st * TB, gv, gvc, bars + 8 * (NS + st));
                }
            }
        }
        cp_async_wait<0>();  // nothing in flight when the producer's warps exit
    } else {  // ---- consumers: warpgroup 1 -> M rows 0 .. 63, 2 -> 64 .. 127
        asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
        const int cw = wg - 1, w_ = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
        const uint32_t qa = sq + cw * 64 * 128;  // this warpgroup's first Q row in each slab
        const int mr = cw * 64 + w_ * 16 + gid;  // this thread's rows: mr and mr + 8 (hf 0, 1)
        int gt = 0;                              // tiles consumed so far (all items)
        for (int r = 0;; r++) {
            const int w = item(r);
            if (w >= a.nwork || (!PERSIST && r > 0)) break;
            const int kvh = w % a.KV;
            const FaTile t = find_tile(a, BM / g, w);
            const int klast = a.causal ? t.ctx + t.qi0 + t.nrows - 1 : t.ctx + t.n - 1;
            const int nkt = __shfl_sync(0xffffffffu, klast / BN + 1, 0);
            if (PERSIST) {
                mbar_wait(qfull, r & 1);
                fence_proxy_async();
            } else {  // Q: this warpgroup's 64 rows, then visible to the warpgroup's wgmmas
                const C *gq = (const C *)a.q;
                const int c = tid % VPR;
#pragma unroll
                for (int r0 = 0; r0 < 64; r0 += RPP) {
                    const int m = cw * 64 + r0 + tid / VPR, i = m / g, ok = i < t.nrows;
                    const size_t off = ok ? (size_t)(t.krow0 + t.qi0 + i) * a.ldq + (size_t)(kvh * g + m % g) * HD + c * 8 : 0;
                    cp_async16(sm + fa6_off(BM, m, c), gq + off, ok ? 16 : 0);
                }
                cp_async_commit();
                cp_async_wait<0>();
                fence_proxy_async();
                // named barrier 1 / 2: this warpgroup only (immediate ids, so ptxas reserves just these)
                if (cw == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
                else asm volatile("bar.sync 2, 128;\n" ::: "memory");
            }
            // the last key each of the thread's rows sees (padding rows: the last real row's); the
            // warpgroup's first and last rows' limits (mask below / skip past)
            int lim[2];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) lim[hf] = a.causal ? t.ctx + t.qi0 + min((mr + 8 * hf) / g, t.nrows - 1) : klast;
            const int wlim0 = a.causal ? t.ctx + t.qi0 + min(cw * 64 / g, t.nrows - 1) : klast;
            const int wlim1 = a.causal ? t.ctx + t.qi0 + min((cw * 64 + 63) / g, t.nrows - 1) : klast;
            // the tiles whose keys the warpgroup's rows see: 0 .. nact - 1 (the rest it only releases)
            const int nact = __shfl_sync(0xffffffffu, min(nkt, wlim1 / BN + 1), 0);
            float o[NO], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < NO; i++) o[i] = 0;
            if (PP && cw == 1) fa_turn_give(cw);  // consumer 1 goes first (every item: its turns pair up)
            // tile kt of this item: its stage in the ring and the parity of that stage's round
            auto ring_stage = [&](int kt) { return (gt + kt) % NS; };
            auto ring_phase = [&](int kt) { return (uint32_t)(((gt + kt) / NS) & 1); };

            if constexpr (!OV) {
                for (int kt = 0; kt < nkt; kt++) {
                    const int st = ring_stage(kt), k0 = kt * BN;
                    const uint32_t ph = ring_phase(kt);
                    // a warpgroup whose rows see none of the tile skips its math (not its barriers: its
                    // arrival on empty must land in this round's phase)
                    const bool active = kt < nact;
                    float s[64], al[2];
                    mbar_wait(bars + 8 * st, ph);
                    if (!TMA) fence_proxy_async();  // the producer's cp.async writes (generic proxy), seen by this thread's wgmma
                    // each batch is issued and waited for inside one branch (the turn handed over
                    // between, on both sides): a wgmma in flight where a branch ends is serialized
                    if (PP) fa_turn_wait(cw);  // (every tile, active or not: the turns stay paired)
                    if (active) {
                        fa6_issue_s<C, HD>(s, qa, sk + st * TB);
                        if (PP) fa_turn_give(cw);
                        wgmma_wait0();
                        wgmma_fence_operands(s);
                        fa6_softmax(s, mrow, lrow, al, k0 + BN - 1 > wlim0, k0, lim, tig, a.scale_log2);
                        fa6_rescale(o, al);
                    } else if (PP) {
                        fa_turn_give(cw);
                    }
                    mbar_wait(bars + 8 * (NS + st), ph);
                    if (!TMA) fence_proxy_async();
                    if (PP) fa_turn_wait(cw);
                    const bool give = PP && !(cw == 1 && kt == nkt - 1);
                    if (active) {
                        unsigned pa[BN / 16][4];
                        fa6_pack_p<C>(s, pa);
                        fa6_issue_pv<C>(o, pa, sv + st * TB);
                        if (give) fa_turn_give(cw);
                        wgmma_wait0();
                        wgmma_fence_operands(o);
                        wgmma_fence_operands(pa);
                    } else if (give) {
                        fa_turn_give(cw);
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive(bars + 8 * (2 * NS + st));  // this warp is done with stage st
                }
            } else {
                // v8: FlashAttention-3's intra-warpgroup overlap. Tile kt's S = Q K^T is issued, then
                // tile kt - 1's O += P V; the softmax of S runs (wait 1: S's group is done, P V's may
                // not be) while the tensor cores still do P V, and O is rescaled once P V is done (wait
                // 0): O = (O_{kt-2} al_{kt-1} + P_{kt-1} V_{kt-1}) al_kt, the same sums in the same
                // order as v6. pa (tile kt - 1's P, the A operand of the P V in flight) and s (tile
                // kt's S) are both live.
                unsigned pa[BN / 16][4];
                int pst = -1;  // the stage whose P V is still to be issued (-1: none)
                uint32_t pph = 0;
                auto issue_pv = [&]() {  // tile pst's O += P V, once its V has landed
                    mbar_wait(bars + 8 * (NS + pst), pph);
                    fence_proxy_async();
                    fa6_issue_pv<C>(o, pa, sv + pst * TB);
                };
                auto pv_done = [&](int stage) {  // wait for it, then release the stage
                    wgmma_wait0();
                    wgmma_fence_operands(o);
                    wgmma_fence_operands(pa);
                    __syncwarp();
                    if (lane == 0) mbar_arrive(bars + 8 * (2 * NS + stage));
                };
                for (int kt = 0; kt < nkt; kt++) {
                    const int st = ring_stage(kt), k0 = kt * BN;
                    const uint32_t ph = ring_phase(kt);
                    const bool active = kt < nact;
                    float s[64], al[2];
                    mbar_wait(bars + 8 * st, ph);
                    fence_proxy_async();
                    if (active) fa6_issue_s<C, HD>(s, qa, sk + st * TB);
                    if (pst >= 0) issue_pv();
                    if (active) {
                        if (pst >= 0) wgmma_wait1();
                        else wgmma_wait0();
                        wgmma_fence_operands(s);
                        fa6_softmax(s, mrow, lrow, al, k0 + BN - 1 > wlim0, k0, lim, tig, a.scale_log2);
                    }
                    if (pst >= 0) pv_done(pst);
                    if (active) {
                        fa6_rescale(o, al);
                        fa6_pack_p<C>(s, pa);
                        pst = st, pph = ph;
                    } else {  // the tile's V is not read; its phase is still waited for, then released
                        pst = -1;
                        mbar_wait(bars + 8 * (NS + st), ph);
                        __syncwarp();
                        if (lane == 0) mbar_arrive(bars + 8 * (2 * NS + st));
                    }
                }
                if (pst >= 0) {  // the last active tile's P V
                    issue_pv();
                    pv_done(pst);
                }
            }
            gt += nkt;
            if (PERSIST) {  // every wgmma of this item is done: the producer may load the next Q
                __syncwarp();
                if (lane == 0) mbar_arrive(qempty);
            }
            // ---- O / l, then the write (row m = (token m / g, head m % g)); padding rows write nothing
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float l = lrow[hf];
#pragma unroll
                for (int off = 1; off < 4; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
                const int m = mr + 8 * hf;
                if (m >= t.nrows * g) continue;
                const float inv = 1.0f / l;
                C *dst = (C *)a.out + (size_t)(t.krow0 + t.qi0 + m / g) * a.ldo + (size_t)(kvh * g + m % g) * HD + tig * 2;
#pragma unroll
                for (int j = 0; j < HD / 8; j++) *(unsigned *)(dst + j * 8) = pack2<C>(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
            }
        }
    }
#else
    (void)a;  // sm_90a only: the host never launches it elsewhere (fits_wgmma's probe)
#endif
}

// ---------------------------------------------------------------- host side

static int device_props(int *cc_major, int *smem_optin) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(cc_major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
}

static int check_args(const FlashAttn *a) {
    if (a->KV < 1 || a->H < a->KV || a->H % a->KV || a->H / a->KV > 8 || a->hd < 2 || a->hd > 256 || a->hd % 2 ||
        (a->dt != ST_F32 && a->dt != ST_F16 && a->dt != ST_BF16) || a->nseq < 1 || a->ntiles < 0 ||
        (long long)a->ntiles * a->KV > 0x7fffffff || !a->cu_seqlens ||
        !a->cu_tiles || !a->q || !a->k != !a->v || (!a->k && !a->ctx_lens) || !a->out || a->ldq < a->H * a->hd ||
        a->ldo < a->H * a->hd || (a->k && a->ldk < a->KV * a->hd) ||
        (a->ctx_lens && (!a->kc || !a->vc || !a->block_tables || a->block_size < 1 || a->bt_stride < 1))) {
        fprintf(stderr, "flash_attn: unsupported arguments (H=%d KV=%d hd=%d %s, nseq=%d, tiles=%d, ldq=%d ldk=%d ldo=%d)\n",
                a->H, a->KV, a->hd, dt_name(a->dt), a->nseq, a->ntiles, a->ldq, a->ldk, a->ldo);
        return -1;
    }
    return 0;
}
static FaArgs fa_args(const FlashAttn *a) {
    FaArgs f;
    f.q = a->q, f.k = a->k, f.v = a->v, f.kc = a->kc, f.vc = a->vc, f.out = a->out;
    f.cu_seqlens = a->cu_seqlens, f.ctx_lens = a->ctx_lens, f.bt = a->ctx_lens ? a->block_tables : nullptr;
    f.cu_tiles = a->cu_tiles, f.q_rows = a->q_rows, f.nseq = a->nseq, f.H = a->H, f.KV = a->KV, f.ldq = a->ldq, f.ldk = a->ldk, f.ldo = a->ldo;
    f.bt_stride = a->bt_stride, f.B = a->block_size, f.causal = a->causal != 0;
    f.scale = a->scale, f.scale_log2 = a->scale * 1.4426950408889634f;
    f.nwork = a->ntiles * a->KV;
    return f;
}

// tile_m: the rows a tile of the plan holds (the fallback takes any plan: its warps stride the rows)
static int launch_simt_m(const FlashAttn *a, int tile_m) {
    const size_t smem = (size_t)FA_SIMT_WARPS * a->hd * sizeof(float);
    const FaArgs f = fa_args(a);
    DISPATCH(a->dt, C, k_flash_simt<C><<<a->ntiles * a->KV, 32 * FA_SIMT_WARPS, smem>>>(f, a->hd, tile_m));
    CUDA_CHECK_LAST();
    return 1;
}
static int launch_simt(const FlashAttn *a) { return launch_simt_m(a, FA_SIMT_TILE_M); }

// The tensor-core path takes: bf16/fp16, hd 64 or 128, sm_80+, 16-byte aligned rows.
static int mma_ok(const FlashAttn *a, int cc) {
    const uintptr_t al = (uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v | (uintptr_t)a->out |
                         (a->ctx_lens ? (uintptr_t)a->kc | (uintptr_t)a->vc : 0);
    return a->dt != ST_F32 && (a->hd == 64 || a->hd == 128) && cc >= 8 && al % 16 == 0 && a->ldq % 8 == 0 && (!a->k || a->ldk % 8 == 0) &&
           a->ldo % 2 == 0;
}

template <class C, int HD, class F> static int launch_mma_t(const FlashAttn *a, int dev, int optin) {
    const size_t smem = mma_smem_bytes<C, HD, F>();
    if (smem > (size_t)optin) return -2;
    // above 48 KB the kernel must be allowed first; the attribute lives in the device's context
    static unsigned long long attr_set = 0;
    if (dev >= 64 || !(attr_set >> dev & 1)) {
        CUDA_CHECK(cudaFuncSetAttribute(k_flash_mma<C, HD, F>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        if (dev < 64) attr_set |= 1ull << dev;
    }
    k_flash_mma<C, HD, F><<<a->ntiles * a->KV, 32 * F::NW, smem>>>(fa_args(a));
    CUDA_CHECK_LAST();
    return 1;
}
// Whether version (F64, F128) takes call a on a device of compute capability cc with optin bytes of
// shared memory per block: what launch_mma checks before it launches (bf16 and fp16 are one size).
template <class F64, class F128> static int fits_mma(const FlashAttn *a, int cc, int optin) {
    const size_t smem = a->hd == 64 ? mma_smem_bytes<__half, 64, F64>() : mma_smem_bytes<__half, 128, F128>();
    return mma_ok(a, cc) && smem <= (size_t)optin;
}
static int fits_simt(const FlashAttn *a, int cc, int optin) { return (void)a, (void)cc, (void)optin, 1; }

// F64 / F128: the version's shape at head dim 64 and 128
template <class F64, class F128> static int launch_mma(const FlashAttn *a) {
    int cc = 0, optin = 0;
    const int dev = device_props(&cc, &optin);
    if (dev < 0) return -1;
    if (!mma_ok(a, cc)) return -2;
    if (a->dt == ST_BF16) return a->hd == 64 ? launch_mma_t<__nv_bfloat16, 64, F64>(a, dev, optin)
                                             : launch_mma_t<__nv_bfloat16, 128, F128>(a, dev, optin);
    return a->hd == 64 ? launch_mma_t<__half, 64, F64>(a, dev, optin) : launch_mma_t<__half, 128, F128>(a, dev, optin);
}

// v6 takes: what mma_ok takes, on compute capability 9.0 exactly (sm_90a code: wgmma, setmaxnreg),
// when this binary holds that code (the probe kernel writes 1 only there) and its shared memory fits.
static int wgmma_built(void) {
    static int avail = -1;  // one answer per process (every device of one binary has the same code)
    if (avail >= 0) return avail;
    int *d = nullptr, h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return (void)cudaGetLastError(), 0;
    if (cudaMemset(d, 0, sizeof(int)) == cudaSuccess) {
        k_fa6_probe<<<1, 1>>>(d);
        if (cudaGetLastError() != cudaSuccess || cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) h = 0;
    }
    (void)cudaFree(d);
    (void)cudaGetLastError();
    return avail = h == 1;
}
static int fits_wgmma(const FlashAttn *a, int cc, int optin) {
    int dev = 0, minor = -1;
    if (cc != 9 || !mma_ok(a, cc) || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return (void)cudaGetLastError(), 0;
    const size_t smem = a->hd == 64 ? fa6_smem_bytes<64>() : fa6_smem_bytes<128>();
    return minor == 0 && smem <= (size_t)optin && wgmma_built();
}
template <class C, int HD, int MODE, bool PERSIST, bool TMA> static int launch_wgmma_t(const FlashAttn *a, int dev) {
    const size_t smem = fa6_smem_bytes<HD>();
    static unsigned long long attr_set = 0;
    if (dev >= 64 || !(attr_set >> dev & 1)) {
        CUDA_CHECK(cudaFuncSetAttribute(k_flash_wgmma<C, HD, MODE, PERSIST, TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        if (dev < 64) attr_set |= 1ull << dev;
    }
    int grid = a->ntiles * a->KV, sms = 0;
    if (PERSIST) {  // one CTA an SM (the shared memory allows no second), none without an item
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        grid = grid < sms ? grid : sms;
    }
    FaTma tm;
    memset(&tm, 0, sizeof tm);
    if (TMA) {  // the last maps encoded, kept: a timed loop or an engine's layers repeat the call
        static FaTma last;
        static const void *lk = nullptr, *lv = nullptr;
        static int lrows = -1, lld = -1, lkd = -1, ldev = -1;
        const int kd = a->KV * HD;
        if (a->k != lk || a->v != lv || a->k_rows != lrows || a->ldk != lld || kd != lkd || dev != ldev) {
            const CUtensorMapDataType ty = std::is_same<C, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
            if (tma_map_2d(&last.k, ty, a->k, (unsigned long long)a->k_rows, (unsigned long long)kd, (unsigned long long)a->ldk * 2, FA6_BN) ||
                tma_map_2d(&last.v, ty, a->v, (unsigned long long)a->k_rows, (unsigned long long)kd, (unsigned long long)a->ldk * 2, FA6_BN)) {
                lk = nullptr;
                return -1;
            }
            lk = a->k, lv = a->v, lrows = a->k_rows, lld = a->ldk, lkd = kd, ldev = dev;
        }
        tm = last;
    }
    k_flash_wgmma<C, HD, MODE, PERSIST, TMA><<<grid, FA6_NT, smem>>>(fa_args(a), tm);
    CUDA_CHECK_LAST();
    return 1;
}
// v10 takes what v6 takes when every key is a row of k and v (no context, no q_rows: rows past a
// sequence are the next one's) and k_rows says how many rows a copy may read.
static int fits_tma(const FlashAttn *a, int cc, int optin) {
    return a->k && !a->ctx_lens && !a->q_rows && a->k_rows > 0 && fits_wgmma(a, cc, optin);
}
template <int MODE, bool PERSIST, bool TMA> static int launch_wgmma(const FlashAttn *a) {
    int cc = 0, optin = 0;
    const int dev = device_props(&cc, &optin);
    if (dev < 0) return -1;
    if (!(TMA ? fits_tma : fits_wgmma)(a, cc, optin)) return -2;
    if (a->dt == ST_BF16)
        return a->hd == 64 ? launch_wgmma_t<__nv_bfloat16, 64, MODE, PERSIST, TMA>(a, dev)
                           : launch_wgmma_t<__nv_bfloat16, 128, MODE, PERSIST, TMA>(a, dev);
    return a->hd == 64 ? launch_wgmma_t<__half, 64, MODE, PERSIST, TMA>(a, dev) : launch_wgmma_t<__half, 128, MODE, PERSIST, TMA>(a, dev);
}

//                          NW MT  BN ST  SWZ    QREG   V4
typedef FaCfg<4, 1, 64, 2, false, true, false> V1;
typedef FaCfg<8, 1, 128, 2, false, true, false> V2;
typedef FaCfg<8, 1, 128, 3, true, true, false> V3_64;
typedef FaCfg<8, 1, 64, 3, true, true, false> V3_128;
typedef FaCfg<8, 1, 128, 2, true, true, true> V4_64;
typedef FaCfg<8, 1, 64, 2, true, true, true> V4_128;
typedef FaCfg<4, 2, 64, 2, true, true, true> V5_64;
typedef FaCfg<4, 2, 64, 2, true, false, true> V5_128;

static const struct {
    FlashVersion v;
    int (*fn)(const FlashAttn *);
    int (*fits)(const FlashAttn *, int cc, int optin);  // would fn take this call here (not -2)?
} LADDER[] = {
    {{0, "v0_simt", "fallback: a warp per row, lane = key, fp32 math, no tensor cores", FA_SIMT_TILE_M, 0}, launch_simt,
     fits_simt},
    {{1, "v1_step05", "step05's shape: 64-row tile, 4 warps, 64-key tiles, 2-stage cp.async, padded rows", V1::BM, 0},
     launch_mma<V1, V1>, fits_mma<V1, V1>},
    {{2, "v2_128", "128-row tiles, 8 warps, 128-key K/V tiles", V2::BM, 0}, launch_mma<V2, V2>, fits_mma<V2, V2>},
    {{3, "v3_swz3", "3-stage cp.async ring, XOR-swizzled rows (no padding); 64-key tiles at hd 128", V3_64::BM, 0},
     launch_mma<V3_64, V3_128>, fits_mma<V3_64, V3_128>},
    {{4, "v4_split", "K and V in separate cp.async groups, exp2 as one FFMA, per-warp causal skip", V4_64::BM, 0},
     launch_mma<V4_64, V4_128>, fits_mma<V4_64, V4_128>},
    {{5, "v5_rb", "register blocking: 4 warps x 32 rows, each K/V fragment feeds 2 MMAs", V5_64::BM, 0},
     launch_mma<V5_64, V5_128>, fits_mma<V5_64, V5_128>},
    {{6, "v6_wgmma", "sm_90a: producer warpgroup + 2 wgmma consumers, mbarrier ring, P from registers", FA6_BM, 0},
     launch_wgmma<FA6_PLAIN, false, false>, fits_wgmma},
    {{7, "v7_pingpong", "v6 + the two consumers take turns at the tensor cores (named barriers): one's softmax under the other's GEMMs", FA6_BM, 0},
     launch_wgmma<FA6_PINGPONG, false, false>, fits_wgmma},
    {{8, "v8_overlap", "v6 + intra-warpgroup overlap: the next tile's S = Q K^T issued before this P V, its softmax under the P V", FA6_BM, 0},
     launch_wgmma<FA6_OVERLAP, false, false>, fits_wgmma},
    {{9, "v9_persist", "v7 with persistent CTAs (one an SM, items in a snake): the producer loads the next item's Q and K/V during this one's last tiles and O write", FA6_BM, 0},
     launch_wgmma<FA6_PINGPONG, true, false>, fits_wgmma},
    {{10, "v10_tma", "v7 with a TMA producer (one thread, 2 x hd / 64 boxes a tile) and no proxy fences: calls whose keys are all rows of k, v", FA6_BM, 1},
     launch_wgmma<FA6_PINGPONG, false, true>, fits_tma},
};
#define N_LADDER ((int)(sizeof LADDER / sizeof LADDER[0]))
static_assert(V1::BM <= FA_TILE_M_MAX && V2::BM <= FA_TILE_M_MAX && V4_64::BM == V4_128::BM && V3_64::BM == V3_128::BM &&
                  V5_64::BM == V5_128::BM && V5_64::BM <= FA_TILE_M_MAX && FA6_BM <= FA_TILE_M_MAX,
              "one tile_m per version");

extern "C" int flash_num_versions(void) { return N_LADDER; }
extern "C" const FlashVersion *flash_version(int i) { return i >= 0 && i < N_LADDER ? &LADDER[i].v : nullptr; }
extern "C" const FlashVersion *flash_find_version(int id) {
    for (int i = 0; i < N_LADDER; i++)
        if (LADDER[i].v.id == id) return &LADDER[i].v;
    return nullptr;
}

extern "C" int flash_attn_run(const FlashAttn *a, int id) {
    if (check_args(a)) return -1;
    for (int i = 0; i < N_LADDER; i++)
        if (LADDER[i].v.id == id) return a->ntiles == 0 ? 0 : LADDER[i].fn(a);
    fprintf(stderr, "flash_attn: no version %d\n", id);
    return -1;
}

// The rungs flash_attn tries, fastest measured first: the first that takes the call runs, by head
// dim. On the H200 (results/flash_825ded8/, flash_d095334/, flash_88fcb99/, all rungs in one run each),
// hd 128: v10_tma the fastest wherever it takes the call (results/flash_88fcb99/: llama8b_4k 369.1
// TFLOP/s against v7's 294.8, qwen06b_4k 360.4, varlen 333.5); of the others v7_pingpong was the
// fastest at llama8b_4k (299.3 and 292.9 TFLOP/s in the two earlier runs, v6 296.1 / 291.2),
// qwen06b_1k and qwen06b_4k, within 0.2% of v6 on varlen. hd 64 (llama1b_4k): v6 246.6 / 252.2 /
// 245.7 against v7's 218.5 / 219.8 / 218.1 and v10's 237.2. v2_128 was the fastest at `chunked`
// (174.5 against v7's 162.8 at 88fcb99), not preferred for the engine's pooled prefill on that one
// shape. v6 and up need sm_90a exactly;
// elsewhere v2_128, whose 136 KB of shared memory at hd 128 exceed what sm_86 / sm_89 give a block
// (99 KB): there v3_swz3 (96 KB), then v1_step05.
static const int PREFERRED_128[] = {10, 7, 6, 2, 3, 1}, PREFERRED_64[] = {6, 7, 2, 3, 1};
static int pick(const FlashAttn *a) {
    int cc = 0, optin = 0;
    if (device_props(&cc, &optin) < 0) return 0;
    const int *pref = a->hd == 64 ? PREFERRED_64 : PREFERRED_128;
    const int np = a->hd == 64 ? (int)(sizeof PREFERRED_64 / sizeof PREFERRED_64[0]) : (int)(sizeof PREFERRED_128 / sizeof PREFERRED_128[0]);
    for (int p = 0; p < np; p++)
        for (int i = 0; i < N_LADDER; i++)
            if (LADDER[i].v.id == pref[p] && LADDER[i].fits(a, cc, optin)) return pref[p];
    return 0;
}
extern "C" int flash_attn_tile_m(const FlashAttn *a) { return flash_find_version(pick(a))->tile_m; }
extern "C" int flash_attn_pick(const FlashAttn *a) {
    int cc = 0, optin = 0;
    return device_props(&cc, &optin) < 0 ? -1 : pick(a);
}
extern "C" int flash_attn(const FlashAttn *a) {
    const int r = flash_attn_run(a, pick(a));
    return r == -2 ? launch_simt_m(a, flash_attn_tile_m(a)) : r;  // planned with the picked rung's tile_m
}
