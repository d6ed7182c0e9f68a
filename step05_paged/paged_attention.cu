// paged_attention.cu — step05's paged K/V kernels (the C API and the kernels are described in
// paged_attention.h): the K/V write through the slot mapping, paged decode attention v1 (one
// CTA per (item, kv head)) and v2 (split-K partitions + a rescaling reduce), and the gather that
// lets chunked prefill run step02's GEMM path over a paged context.
// Tests: build/tests/run_tests --filter 'step05_gpu/*'; ladder: build/bin/paged_attn_bench.
//
// How the decode CTA reads K and V: lane c of a key row holds 16-byte vector c of it (8 bf16 or
// fp16, 4 fp32), LPR lanes per row (hd/8 rounded up to a power of two; lanes past the row idle),
// so one warp load instruction covers 32 / LPR rows. Consecutive positions of a sequence are
// consecutive rows of one block, so for B >= 2 a warp still reads whole contiguous rows; the
// block table costs one lookup per key (the LPR lanes of a row read the same entry), and a
// block of B = 1 makes every row its own scattered 256-byte read. Each warp works alone on its
// rows (its own online softmax in registers: running max m and sum l per head, accumulators
// rescaled by exp(m_old - m_new)), with 4 K rows and 4 V rows per lane in flight per iteration
// and no barrier in the loop; the warps of a CTA are merged once at the end. Scores: the q . k
// partial dots of a row's lanes summed with shuffles; P V: each lane accumulates its vector's
// elements for the g heads, summed across the lanes of a warp and across warps at the end.
//
// The versions that were measured before this one (H200, bf16, batch 32, 32/8 heads, hd 128,
// B = 16, % of the copy bandwidth at context 4096 / 32768; paged_attn_bench):
//   tiles of 128 keys, table rows in shared, K pass then V pass (8 rows in flight), scores and
//   softmax through shared memory, 4 barriers per tile .................... v2 64.6 / 70.8
//   K and V of a 64-key tile loaded together, per-lane table reads (each waiting on the last) .. 34 / 40
//   software-pipelined 32-key tiles (next tile in flight), 2 barriers per tile ........ 50 / 58
//   this loop with the next iteration's K/V loads held in registers (168 instead of 141 registers)
//   .............................................................. v2 53.6 / 63.0 (the plain loop, same run: 57.6 / 68.3)
//   a ring of 4 iterations per warp in shared memory filled by cp.async (each lane copies what it
//   reads, no barrier; 2-8 stages swept: 2-4 best, 6 and 8 lose occupancy) ....... v2 54.4 / 61.2
//   (this loop, same run: 65.7 / 75.5; results/versions/ladder_c473f5f_cp_async_ring.csv)
//   this loop held to 128 registers (4 CTAs per SM; variant 1) ......................... v2 66.1 / 76.7
// What reached the target was cutting the arithmetic's instructions, not hiding the loads better:
// k_paged_decode_mma (below) does the scores and P V with mma.sync, fed straight from the
// registers the loads filled: v2 88.6 / 104.2, v1 90.6 / 98.8 (1024-key partitions;
// results/paged_attn_ladder_1bec643_h200.csv). It is the default wherever it applies.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "cuda_check.h"
#include "pdl.cuh"  // pdl_trigger, pdl_wait, pdl_launch
#include "step03_kvcache/decode_gpu.cuh"  // Vec16; forward_gpu.cuh: tof, fromf, DISPATCH, block_sum/max
#include "step05_paged/mma.cuh"  // PA_MMA_ARCH: pack2, mma16816
#include "step05_paged/paged_attention.h"

// ---------------------------------------------------------------- K/V write

// Grid (T), row t of k and v (fp32, ld floats) to pool row slots[t]; slot -1 skipped.
template <class C>
__global__ void k_paged_kv_write(const float *k, const float *v, int ld, const int *slots, int kd, C *kc, C *vc) {
    const int t = blockIdx.x, s = slots[t];
    if (s < 0) return;
    for (int e = threadIdx.x; e < kd; e += blockDim.x) {
        kc[(size_t)s * kd + e] = fromf<C>(k[(size_t)t * ld + e]);
        vc[(size_t)s * kd + e] = fromf<C>(v[(size_t)t * ld + e]);
    }
}

extern "C" int paged_kv_write(StDtype dt, const float *k, const float *v, int ld, const int *slots, int T, int kd,
                              void *kc, void *vc) {
    if (T < 0 || kd < 1 || ld < kd) return -1;
    if (T == 0) return 0;
    const int threads = kd >= 256 ? 256 : 32 * ((kd + 31) / 32);
    DISPATCH(dt, C, k_paged_kv_write<C><<<T, threads>>>(k, v, ld, slots, kd, (C *)kc, (C *)vc));
    CUDA_CHECK_LAST();
    return 0;
}

// ---------------------------------------------------------------- decode attention

// The end of a decode CTA: its NW warps' (o, m, l) in shared memory (red: (NW, g, hd) o, then
// (NW, g, 2) m and l, m in natural-log units) merged into one; v1 (part 0) writes the normalized
// output row, v2 the partition's partial (o, M, L).
template <class C>
__device__ inline void merge_warps(const float *red, int NW, int g, int hd, int kvh, int H, int w, int pi, int nparts,
                                   int part, const int *rows, void *out, int ldo, int out_f32, float *part_o,
                                   float *part_ml) {
    const float *ml = red + (size_t)NW * g * hd;
    const int t = threadIdx.x;
    for (int o = t; o < g * hd; o += blockDim.x) {
        const int hh = o / hd, h = kvh * g + hh, e = o % hd;
        float M = -INFINITY;
        for (int wi = 0; wi < NW; wi++) M = fmaxf(M, ml[(wi * g + hh) * 2]);
        float sum = 0, L = 0;
        for (int wi = 0; wi < NW; wi++) {
            const float mw = ml[(wi * g + hh) * 2], f = mw == -INFINITY ? 0.0f : expf(mw - M);  // a warp with no rows: 0
            sum += f * red[((size_t)wi * g + hh) * hd + e], L += f * ml[(wi * g + hh) * 2 + 1];
        }
        if (part) {
            part_o[(((size_t)w * H + h) * nparts + pi) * hd + e] = sum;
            if (e == 0) {
                const size_t at = (((size_t)w * H + h) * nparts + pi) * 2;
                part_ml[at] = M, part_ml[at + 1] = L;
            }
        } else {
            const float val = L > 0 ? sum / L : 0.0f;  // len 0: zeros
            const size_t at = (size_t)rows[w] * ldo + (size_t)h * hd + e;
            if (out_f32) ((float *)out)[at] = val;
            else ((C *)out)[at] = fromf<C>(val);
        }
    }
}

// One CTA: work item blockIdx.z, kv head blockIdx.x, keys [k0, k1) where part == 0 (v1) means the
// whole context and part > 0 (v2) partition blockIdx.y of `part` keys. v1 writes the normalized
// output (fp32 when out_f32, else C); v2 the partial o (relative to its max m), m and the sum l
// of each head at part_o ((item, H, nparts, hd)), part_ml ((item, H, nparts, 2)).
// Every warp runs on its own: its rows are WR = U * RPW consecutive keys per iteration (the CTA
// covers NW * WR), with its own online softmax (running max m, sum l and accumulators rescaled
// by exp(m_old - m_new)) kept in registers: the scores never go through shared memory and the
// loop has no barrier. Each lane reads its U table entries first, then issues its U K and U V
// loads together (rows past the range load the range's last row, a valid address, and are
// masked). The NW warps' (m, l, o) are merged once at the end.
// Dynamic shared: NW * g * (hd + 2) floats.
// U: rows per lane per iteration (4; the ladder's u8 rung: 8); MINB: CTAs per SM the register
// budget must allow (1: no cap; the lb4 rung: 4, at most 128 registers a thread).
template <class C, int LPR, int G, int U = 4, int MINB = 1>
__global__ void __launch_bounds__(PA_THREADS, MINB)
    k_paged_decode(const float *__restrict__ q, int ldq, const C *__restrict__ kc, const C *__restrict__ vc,
                   const int *__restrict__ bt, int bt_stride, int B, const int *rows, const int *seqs,
                   const int *lens, int H, int KV, int hd, float scale, int part, void *out, int ldo, int out_f32,
                   float *part_o, float *part_ml) {
    pdl_trigger();  // (a no-op unless launched with PDL: PagedDecode.pdl)
    pdl_wait();
    constexpr int N = Vec16<C>::N, RPW = 32 / LPR, NW = PA_THREADS / 32;
    constexpr int WR = U * RPW, CR = NW * WR;
    extern __shared__ float red[];  // (NW, g, hd) accumulators, then (NW, g, 2) m and l
    const int w = blockIdx.z, kvh = blockIdx.x, pi = blockIdx.y, nparts = gridDim.y;
    const int len = lens[w];
    const int k0 = part ? pi * part : 0, k1 = part ? min(len, k0 + part) : len;
    if (part && k0 >= len) return;  // v2: a partition past this item's context (the reduce skips it)
    const int g = H / KV, t = threadIdx.x, warp = t / 32, lane = t % 32, c = lane % LPR, sub = lane / LPR;
    const int on = c * N < hd;  // lanes past the row's last vector idle
    const size_t kd = (size_t)KV * hd;
    const int *tab = bt + (size_t)seqs[w] * bt_stride;
    const C *kb = kc + (size_t)kvh * hd + c * N, *vb = vc + (size_t)kvh * hd + c * N;
    float qf[G][N], acc[G][N], m[G], l[G];
    {
        const float *qr = q + (size_t)rows[w] * ldq + (size_t)kvh * g * hd + c * N;
#pragma unroll
        for (int hh = 0; hh < G; hh++) {
            m[hh] = -INFINITY, l[hh] = 0.0f;
#pragma unroll
            for (int i = 0; i < N; i++) qf[hh][i] = (hh < g && on) ? qr[hh * hd + i] * scale : 0.0f, acc[hh][i] = 0.0f;
        }
    }
    for (int j0 = k0 + warp * WR; j0 < k1; j0 += CR) {
        // ---- this lane's rows j0 + k*RPW + sub: table entries, then all K and V loads
        size_t r[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int p = min(j0 + k * RPW + sub, k1 - 1);
            r[k] = ((size_t)tab[p / B] * B + p % B) * kd;
        }
        uint4 uk[U], uv[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            uk[k] = on ? *(const uint4 *)(kb + r[k]) : make_uint4(0, 0, 0, 0);
            uv[k] = on ? *(const uint4 *)(vb + r[k]) : make_uint4(0, 0, 0, 0);
        }
        // ---- scores: the LPR lanes of a row sum their partial dots (every one of them gets the sum)
        float s[U][G];
#pragma unroll
        for (int k = 0; k < U; k++) {
            float kf[N];
            Vec16<C>::unpack(uk[k], kf);
            const int valid = j0 + k * RPW + sub < k1;
#pragma unroll
            for (int hh = 0; hh < G; hh++) {
                float dot = 0;
#pragma unroll
                for (int i = 0; i < N; i++) dot = fmaf(qf[hh][i], kf[i], dot);
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                s[k][hh] = valid ? dot : -INFINITY;
            }
        }
        // ---- online softmax over the warp's WR rows (max and sum across the RPW row groups)
#pragma unroll
        for (int hh = 0; hh < G; hh++) {
            if (hh >= g) continue;
            float mt = s[0][hh];
#pragma unroll
            for (int k = 1; k < U; k++) mt = fmaxf(mt, s[k][hh]);
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
            const float mn = fmaxf(m[hh], mt);  // finite: row j0 is in range
            const float al = expf(m[hh] - mn);  // 0 on the warp's first rows (m = -inf)
            float ls = 0;
#pragma unroll
            for (int k = 0; k < U; k++) {
                const float p = expf(s[k][hh] - mn);  // 0 for masked rows
                s[k][hh] = p, ls += p;
            }
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1) ls += __shfl_xor_sync(0xffffffffu, ls, o);
            l[hh] = l[hh] * al + ls, m[hh] = mn;
#pragma unroll
            for (int i = 0; i < N; i++) acc[hh][i] *= al;
        }
        // ---- P V
#pragma unroll
        for (int k = 0; k < U; k++) {
            float vf[N];
            Vec16<C>::unpack(uv[k], vf);
#pragma unroll
            for (int hh = 0; hh < G; hh++)
                if (hh < g)
#pragma unroll
                    for (int i = 0; i < N; i++) acc[hh][i] = fmaf(s[k][hh], vf[i], acc[hh][i]);
        }
    }
    // ---- the warp's o: sum over its row groups; then merge the warps
    float *ml = red + (size_t)NW * g * hd;
#pragma unroll
    for (int hh = 0; hh < G; hh++)
#pragma unroll
        for (int i = 0; i < N; i++) {
            float a = acc[hh][i];
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (hh < g && sub == 0 && on) red[((size_t)warp * g + hh) * hd + c * N + i] = a;
        }
    if (lane < g) {
        float mv = -INFINITY, lv = 0;
#pragma unroll
        for (int hh = 0; hh < G; hh++)
            if (hh == lane) mv = m[hh], lv = l[hh];
        ml[(warp * g + lane) * 2] = mv, ml[(warp * g + lane) * 2 + 1] = lv;
    }
    __syncthreads();
    merge_warps<C>(red, NW, g, hd, kvh, H, w, pi, nparts, part, rows, out, ldo, out_f32, part_o, part_ml);
}

// The tensor-core loop (variant 4; variant 5 takes two tiles per iteration), bf16/fp16 caches,
// hd 64, 128 or 256, sm_80+. Same grid, work split and end as k_paged_decode; each warp takes
// tiles of 16 keys (the CTA 4 x 16 per step) and the g query heads of the kv head become the M
// rows of mma.sync m16n8k16 (rows g .. 15 zero: the MMA is cheap, the bytes are what counts):
//   S (heads x 16 keys) = Q K^T: two n-tiles of 8 keys, hd / 16 k-steps each. Lane (r, t4) =
//     (lane / 4, lane % 4) holds K's B fragment for key r of the n-tile: two consecutive d of
//     that key per register, i.e. straight from memory. The d order inside the dot product is
//     free (q . k is a sum), so lane t4 loads whole 16-byte vectors 4 v + t4 (v < hd / 32) of
//     the key: one load instruction reads 64 contiguous bytes of each of 8 keys, and its four
//     words are the B registers of k-steps 2 v and 2 v + 1. Q (fp32, scaled by scale * log2 e)
//     is rounded once into A fragments with the same d order.
//   online softmax: the accumulator S holds head r, keys 2 t4, 2 t4 + 1 of each n-tile; the
//     tile max is a 4-lane shuffle; l is kept per lane and summed across the 4 lanes at the end.
//   O^T (hd x heads) += V^T P^T: M = d (hd / 16 m-tiles), N = the 8 heads, K = the 16 keys.
//     P^T's B fragment is, register for register, S's accumulator rounded to bf16/fp16. V^T's
//     A fragment needs two keys' values of one d packed in a register: lane (r, t4) loads keys
//     2 t4, 2 t4 + 1, 8 + 2 t4, 9 + 2 t4, 16-byte vectors r and 8 + r (.. of the 64-element
//     halves of the row; one instruction reads 128 contiguous bytes of 4 keys) and pairs them
//     with byte permutes (prmt): m-tile i, row m is element d = (idx / 8) * 64 + (m % 8) * 8 +
//     idx % 8 of the row, idx = 2 i + m / 8 (the d order of O is also free; the end undoes it).
//   O's alpha rescale needs the factor of heads 2 t4, 2 t4 + 1: two shuffles from lanes 8 t4, 8 t4 + 4.
// Rows past the range load the range's last row (a valid address) and get p = 0. Registers at
// hd 128: 32 K + 32 V words in flight, 32 O, 16 Q.
template <class C, int HD, int TPI, int MINB = 1, bool PSPLIT = false, int NWT = PA_THREADS / 32>
__global__ void __launch_bounds__(NWT * 32, MINB)
    k_paged_decode_mma(const float *__restrict__ q, int ldq, const C *__restrict__ kc, const C *__restrict__ vc,
                       const int *__restrict__ bt, int bt_stride, int B, const int *rows, const int *seqs,
                       const int *lens, int H, int KV, float scale, int part, void *out, int ldo, int out_f32,
                       float *part_o, float *part_ml) {
#ifdef PA_MMA_ARCH
    pdl_trigger();
    pdl_wait();
    constexpr int NW = NWT, KS = HD / 16, NKV = HD / 32, NVV = HD / 64, MT = HD / 16;
    constexpr int TK = 16 * TPI;  // keys per warp iteration
    static_assert(HD % 64 == 0 && HD <= 256, "hd 64, 128 or 256");
    extern __shared__ float red[];
    const int w = blockIdx.z, kvh = blockIdx.x, pi = blockIdx.y, nparts = gridDim.y;
    const int len = lens[w];
    const int k0 = part ? pi * part : 0, k1 = part ? min(len, k0 + part) : len;
    if (part && k0 >= len) return;
    const int g = H / KV, warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, t4 = lane % 4;
    const size_t kd = (size_t)KV * HD;
    const int *tab = bt + (size_t)seqs[w] * bt_stride;
    const C *kb = kc + (size_t)kvh * HD + t4 * 8, *vb = vc + (size_t)kvh * HD + r * 8;
    constexpr float LOG2E = 1.4426950408889634f;
    // Q's A fragments: rows r (head r of the group) for k-step s = 2 v + hf: d = (4 v + t4) * 8 + 4 hf + {0, 1}
    // (a0a1) and + {2, 3} (a4a5); rows r + 8 are zero.
    unsigned qa[KS][2];
    {
        const float *qr = q + (size_t)rows[w] * ldq + ((size_t)kvh * g + r) * HD;
#pragma unroll
        for (int s = 0; s < KS; s++) {
            const int d = (4 * (s / 2) + t4) * 8 + 4 * (s % 2);
            const float sc = scale * LOG2E;
            qa[s][0] = r < g ? pack2<C>(qr[d] * sc, qr[d + 1] * sc) : 0u;
            qa[s][1] = r < g ? pack2<C>(qr[d + 2] * sc, qr[d + 3] * sc) : 0u;
        }
    }
    float o[MT][4], m = -INFINITY, l = 0.0f;  // m, l: head r (log2 units), l this lane's share
#pragma unroll
    for (int i = 0; i < MT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int j0 = k0 + warp * TK; j0 < k1; j0 += NW * TK) {
        // ---- table lookups, then every K and V load of the iteration
        uint4 kk[TPI][2][NKV], vv[TPI][4][NVV];
#pragma unroll
        for (int u = 0; u < TPI; u++) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int p = min(j0 + 16 * u + 8 * j + r, k1 - 1);
                const C *kr = kb + ((size_t)tab[p / B] * B + p % B) * kd;
#pragma unroll
                for (int v = 0; v < NKV; v++) kk[u][j][v] = __ldg((const uint4 *)(kr + v * 32));
            }
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int p = min(j0 + 16 * u + 8 * (c / 2) + 2 * t4 + c % 2, k1 - 1);
                const C *vr = vb + ((size_t)tab[p / B] * B + p % B) * kd;
#pragma unroll
                for (int h = 0; h < NVV; h++) vv[u][c][h] = __ldg((const uint4 *)(vr + h * 64));
            }
        }
#pragma unroll
        for (int u = 0; u < TPI; u++) {
            const int jt = j0 + 16 * u;
            // ---- S = Q K^T (log2 units)
            float sc[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
                for (int s = 0; s < KS; s++) {
                    const uint4 &x = kk[u][j][s / 2];
                    const unsigned a[4] = {qa[s][0], 0u, qa[s][1], 0u};
                    mma16816<C>(sc[j], a, s % 2 ? x.z : x.x, s % 2 ? x.w : x.y);
                }
            }
            // ---- online softmax for head r over this tile's keys jt + 8 j + 2 t4 + e
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (jt + 8 * j + 2 * t4 + e >= k1) sc[j][e] = -INFINITY;
                    mt = fmaxf(mt, sc[j][e]);
                }
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
            const float mn = fmaxf(m, mt);  // finite: key jt is in range
            const float al = exp2f(m - mn);
            float pp[2][2];
            l *= al, m = mn;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) pp[j][e] = exp2f(sc[j][e] - mn), l += pp[j][e];  // 0 for masked keys
            const float a0 = __shfl_sync(0xffffffffu, al, 8 * t4), a1 = __shfl_sync(0xffffffffu, al, 8 * t4 + 4);
#pragma unroll
            for (int i = 0; i < MT; i++) o[i][0] *= a0, o[i][1] *= a1, o[i][2] *= a0, o[i][3] *= a1;
            // ---- O^T += V^T P^T
            const unsigned pb0 = pack2<C>(pp[0][0], pp[0][1]), pb1 = pack2<C>(pp[1][0], pp[1][1]);
            unsigned pl0 = 0, pl1 = 0;  // PSPLIT: P's rounding error, rounded again (P = hi + lo to ~16 bits)
            if constexpr (PSPLIT) {
                float hi[4];
                unpack2<C>(pb0, hi[0], hi[1]), unpack2<C>(pb1, hi[2], hi[3]);
                pl0 = pack2<C>(pp[0][0] - hi[0], pp[0][1] - hi[1]), pl1 = pack2<C>(pp[1][0] - hi[2], pp[1][1] - hi[3]);
            }
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int h = i / 4, wd = i % 4;  // idx = 2 i: vector h of the lane's two, word (element pair) wd
                const unsigned x0 = (&vv[u][0][h].x)[wd], x1 = (&vv[u][1][h].x)[wd];
                const unsigned x2 = (&vv[u][2][h].x)[wd], x3 = (&vv[u][3][h].x)[wd];
                const unsigned a[4] = {__byte_perm(x0, x1, 0x5410), __byte_perm(x0, x1, 0x7632),
                                       __byte_perm(x2, x3, 0x5410), __byte_perm(x2, x3, 0x7632)};
                mma16816<C>(o[i], a, pb0, pb1);
                if constexpr (PSPLIT) mma16816<C>(o[i], a, pl0, pl1);
            }
        }
    }
    // ---- this warp's (o, m, l) to shared: l summed over the 4 lanes of head r; m in natural log
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float *ml = red + (size_t)NW * g * HD;
    if (t4 == 0 && r < g) {
        ml[(warp * g + r) * 2] = m == -INFINITY ? -INFINITY : m / LOG2E;
        ml[(warp * g + r) * 2 + 1] = l;
    }
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int hh = 2 * t4 + c % 2, idx = 2 * i + c / 2;
            const int d = (idx / 8) * 64 + r * 8 + idx % 8;
            if (hh < g) red[((size_t)warp * g + hh) * HD + d] = o[i][c];
        }
    __syncthreads();
    merge_warps<C>(red, NW, g, HD, kvh, H, w, pi, nparts, part, rows, out, ldo, out_f32, part_o, part_ml);
#endif
}

// v2's reduce: grid (H, items), one head of one item: M = max of the partitions' maxima,
// out = sum_i exp(m_i - M) o_i / sum_i exp(m_i - M) l_i. The weights exp(m_i - M) are recomputed
// by every thread from part_ml (a few dozen partitions: cheaper than sharing them).
template <class C>
__global__ void k_paged_reduce(const float *part_o, const float *part_ml, const int *rows, const int *lens, int nparts,
                               int part, int H, int hd, void *out, int ldo, int out_f32) {
    pdl_trigger();
    pdl_wait();
    const int h = blockIdx.x, w = blockIdx.y, t = threadIdx.x;
    const int len = lens[w], ns = len > 0 ? (len + part - 1) / part : 0;
    const float *ml = part_ml + ((size_t)w * H + h) * nparts * 2, *po = part_o + ((size_t)w * H + h) * nparts * hd;
    float m = -INFINITY;
    for (int s = t; s < ns; s += blockDim.x) m = fmaxf(m, ml[2 * s]);
    const float M = block_max(m);
    float ls = 0;
    for (int s = t; s < ns; s += blockDim.x) ls += expf(ml[2 * s] - M) * ml[2 * s + 1];
    const float L = block_sum(ls);
    for (int e = t; e < hd; e += blockDim.x) {
        float o = 0;
        for (int s = 0; s < ns; s++) o = fmaf(expf(ml[2 * s] - M), po[(size_t)s * hd + e], o);
        const float val = ns ? o / L : 0.0f;
        const size_t at = (size_t)rows[w] * ldo + (size_t)h * hd + e;
        if (out_f32) ((float *)out)[at] = val;
        else ((C *)out)[at] = fromf<C>(val);
    }
}

// Lanes per row: the row's 16-byte vectors rounded up to a power of two (2 .. 32); 0 if unsupported.
static int lanes_per_row(StDtype dt, int hd) {
    const int N = dt == ST_F32 ? 4 : 8;
    if (hd % N) return 0;
    const int nv = hd / N;
    for (int l = 2; l <= 32; l <<= 1)
        if (nv <= l) return l;
    return 0;
}

extern "C" int paged_decode_supported(StDtype dt, int H, int KV, int hd) {
    return KV >= 1 && H % KV == 0 && H / KV <= 8 && lanes_per_row(dt, hd) > 0;
}

// Launch k_paged_decode for grid (KV, nparts, n) with the template arguments this shape needs.
template <class C, int G>
static void launch_decode_g(int lpr, int loop, dim3 grid, size_t smem, const PagedDecode *a, const int *rows,
                            const int *seqs, const int *lens, int part, float *po, float *pm) {
#define PA_ARGS                                                                                                     \
    a->q, a->ldq, (const C *)a->kc, (const C *)a->vc, a->block_tables, a->bt_stride, a->block_size, rows, seqs, lens, \
        a->H, a->KV, a->hd, a->scale, part, a->out, a->ldo, a->out_f32, po, pm
#define PA_CASE(L)                                                     \
    case L: pdl_launch(a->pdl, k_paged_decode<C, L, G>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_ARGS); break;
    // loop (decode_loop): the other loops exist for 16 lanes per row (hd 128 in bf16/fp16, 64 in fp32)
    if (lpr == 16 && loop == 1) pdl_launch(a->pdl, k_paged_decode<C, 16, G, 4, 4>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_ARGS);
    else if (lpr == 16 && loop == 2) pdl_launch(a->pdl, k_paged_decode<C, 16, G, 8, 1>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_ARGS);
    else
        switch (lpr) {
            PA_CASE(2) PA_CASE(4) PA_CASE(8) PA_CASE(16) PA_CASE(32)
        }
#undef PA_CASE
#undef PA_ARGS
}
// A decode CTA of nw warps: its warps' partial outputs and (m, l) in dynamic shared memory.
static size_t decode_smem(int nw, const PagedDecode *a) {
    return (size_t)nw * (a->H / a->KV) * (a->hd + 2) * sizeof(float);
}
template <class C, int HD>
static void launch_decode_mma(int loop, dim3 grid, size_t smem, const PagedDecode *a, const int *rows, const int *seqs,
                              const int *lens, int part, float *po, float *pm) {
#define PA_MMA_ARGS                                                                                                 \
    a->q, a->ldq, (const C *)a->kc, (const C *)a->vc, a->block_tables, a->bt_stride, a->block_size, rows, seqs, lens, \
        a->H, a->KV, a->scale, part, a->out, a->ldo, a->out_f32, po, pm
    if (loop == 5) pdl_launch(a->pdl, k_paged_decode_mma<C, HD, 2>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_MMA_ARGS);
    else if (loop == 6) pdl_launch(a->pdl, k_paged_decode_mma<C, HD, 1, 4>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_MMA_ARGS);
    else if (loop == 7) pdl_launch(a->pdl, k_paged_decode_mma<C, HD, 1, 1, true>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_MMA_ARGS);
    else if (loop == 8) pdl_launch(a->pdl, k_paged_decode_mma<C, HD, 1, 1, false, 8>, grid, dim3(256), decode_smem(8, a), (cudaStream_t)a->stream, PA_MMA_ARGS);
    else if (loop == 9) pdl_launch(a->pdl, k_paged_decode_mma<C, HD, 1, 1, false, 16>, grid, dim3(512), decode_smem(16, a), (cudaStream_t)a->stream, PA_MMA_ARGS);
    else pdl_launch(a->pdl, k_paged_decode_mma<C, HD, 1>, grid, dim3(PA_THREADS), smem, (cudaStream_t)a->stream, PA_MMA_ARGS);
#undef PA_MMA_ARGS
}
template <class C>
static void launch_decode(int lpr, int loop, dim3 grid, size_t smem, const PagedDecode *a, const int *rows,
                          const int *seqs, const int *lens, int part, float *po, float *pm) {
    if constexpr (sizeof(C) == 2) {
        if (loop >= 4) {  // the tensor-core loop (decode_loop checked the shape)
            if (a->hd == 64) launch_decode_mma<C, 64>(loop, grid, smem, a, rows, seqs, lens, part, po, pm);
            else if (a->hd == 128) launch_decode_mma<C, 128>(loop, grid, smem, a, rows, seqs, lens, part, po, pm);
            else launch_decode_mma<C, 256>(loop, grid, smem, a, rows, seqs, lens, part, po, pm);
            return;
        }
    }
    const int g = a->H / a->KV;
    if (g <= 1) launch_decode_g<C, 1>(lpr, loop, grid, smem, a, rows, seqs, lens, part, po, pm);
    else if (g <= 2) launch_decode_g<C, 2>(lpr, loop, grid, smem, a, rows, seqs, lens, part, po, pm);
    else if (g <= 4) launch_decode_g<C, 4>(lpr, loop, grid, smem, a, rows, seqs, lens, part, po, pm);
    else launch_decode_g<C, 8>(lpr, loop, grid, smem, a, rows, seqs, lens, part, po, pm);
}

// The tensor-core loop needs a bf16/fp16 cache, hd 64, 128 or 256, an sm_80+ device and a binary
// whose kernel was built for sm_80+ (a CUDA_ARCHS=75 build run through its PTX has an empty one).
extern "C" int paged_decode_mma_ok(StDtype dt, int hd) {
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0;
        cudaFuncAttributes fa;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
             cudaFuncGetAttributes(&fa, k_paged_decode_mma<__nv_bfloat16, 128, 1>) == cudaSuccess && fa.ptxVersion >= 80;
        (void)cudaGetLastError();
    }
    return ok && dt != ST_F32 && (hd == 64 || hd == 128 || hd == 256);
}

// The environment's knobs (paged_attention.h), each read once: a number in [lo, 1e6], else dflt.
static double env_num(const char *name, double dflt, double lo) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end;
    const double v = strtod(e, &end);
    if (*end || !(v >= lo) || v > 1e6) {
        fprintf(stderr, "%s=%s: not a number in [%g, 1e6]; using %g\n", name, e, lo, dflt);
        return dflt;
    }
    return v;
}
extern "C" int paged_decode_simt_max_g(void) {
    static int v = -1;
    if (v < 0) v = (int)env_num("PAGED_DECODE_SIMT_G", PA_SIMT_MAX_G, 0);
    return v;
}
static double v1_ctas_per_sm(void) {
    static double v = -1;
    if (v < 0) v = env_num("PAGED_DECODE_V1_CTAS", PA_V1_CTAS_PER_SM, 1e-3);
    return v;
}

// The loop a->variant asks for (0 the first loop, 1 at most 128 registers, 2 eight rows per lane,
// 4 the tensor-core loop, 5 the same with two tiles per iteration, 6 at most 128 registers, 7 P
// rounded in two parts); variant 0 takes the default: the SIMT loop for a GQA group of at most
// paged_decode_simt_max_g() heads or where the tensor-core loop does not apply (!paged_decode_mma_ok),
// else the tensor-core loop. The SIMT default is the first loop in v1 and the 128-register one in
// v2 (64.9 / 74.1% of copy at contexts 4096 / 32768 against the first loop's 57.7 / 66.1% in the
// same run, results/paged_attn_ladder_a4918b7_*_h200.csv); variant 3 is the first loop by name.
// Variants 4 .. 7 on a shape the tensor-core loop does not take run the SIMT default.
// Variants 8 and 9 (the tensor-core loop with 8 and 16 warps a CTA) take the loop 4 where their
// warps' partial outputs would need more than 48 KB of shared memory. PAGED_DECODE_LOOP (a variant,
// read once) replaces variant 0 for a run.
static int decode_loop(const PagedDecode *a, int v2) {
    static int env_loop = -1;
    if (env_loop < 0) env_loop = (int)env_num("PAGED_DECODE_LOOP", 0, 0);
    const int simt = v2 ? 1 : 0, variant = a->variant == 0 && env_loop <= 9 ? env_loop : a->variant;
    if (variant == 0 && a->H / a->KV <= paged_decode_simt_max_g()) return simt;
    if (variant == 0 || variant >= 4) {
        if (!paged_decode_mma_ok(a->dt, a->hd)) return simt;
        if (variant >= 8 && decode_smem(variant == 8 ? 8 : 16, a) > 48 * 1024) return 4;
        return variant ? variant : 4;
    }
    return variant == 3 ? 0 : variant;
}

static int check_args(const PagedDecode *a) {
    if (!paged_decode_supported(a->dt, a->H, a->KV, a->hd) || a->n < 0 || a->block_size < 1 || a->max_len < 0) {
        fprintf(stderr, "paged_decode: unsupported shape (H=%d KV=%d hd=%d %s, n=%d, B=%d)\n", a->H, a->KV, a->hd,
                dt_name(a->dt), a->n, a->block_size);
        return -1;
    }
    return 0;
}

extern "C" int paged_decode_v1(const PagedDecode *a) {
    if (check_args(a)) return -1;
    const int lpr = lanes_per_row(a->dt, a->hd);
    const size_t smem = decode_smem(PA_THREADS / 32, a);
    int launches = 0;
    for (int w0 = 0; w0 < a->n; w0 += 65535) {
        const int n = a->n - w0 < 65535 ? a->n - w0 : 65535;
        DISPATCH(a->dt, C, launch_decode<C>(lpr, decode_loop(a, 0), dim3(a->KV, 1, n), smem, a, a->rows + w0, a->seqs + w0, a->lens + w0, 0,
                                            NULL, NULL));
        CUDA_CHECK_LAST();
        launches++;
    }
    return launches;
}

extern "C" int paged_decode_v2(const PagedDecode *a) {
    if (check_args(a)) return -1;
    const int lpr = lanes_per_row(a->dt, a->hd);
    const int part = a->part > 0 ? a->part : PA_PART;
    const int nparts = a->max_len > 0 ? (a->max_len + part - 1) / part : 1;
    const size_t per_item = (size_t)a->H * nparts * a->hd;
    if (!a->part_o || !a->part_ml || a->part_cap < per_item) {
        fprintf(stderr, "paged_decode_v2: partial buffer of %zu floats, one item needs %zu\n", a->part_cap, per_item);
        return -1;
    }
    size_t grp = a->part_cap / per_item;
    if (grp > 65535) grp = 65535;
    const size_t smem = decode_smem(PA_THREADS / 32, a);
    int launches = 0;
    for (int w0 = 0; w0 < a->n; w0 += (int)grp) {
        const int n = a->n - w0 < (int)grp ? a->n - w0 : (int)grp;
        DISPATCH(a->dt, C,
                 launch_decode<C>(lpr, decode_loop(a, 1), dim3(a->KV, nparts, n), smem, a, a->rows + w0, a->seqs + w0, a->lens + w0,
                                  part, a->part_o, a->part_ml));
        CUDA_CHECK_LAST();
        DISPATCH(a->dt, C,
                 pdl_launch(a->pdl, k_paged_reduce<C>, dim3(a->H, n), dim3(128), 0, (cudaStream_t)a->stream, a->part_o,
                            a->part_ml, a->rows + w0, a->lens + w0, nparts, part, a->H, a->hd, a->out, a->ldo,
                            a->out_f32));
        CUDA_CHECK_LAST();
        launches += 2;
    }
    return launches;
}

extern "C" int paged_decode_choose(int n, int KV, int max_len, int num_sms) {
    if (max_len <= PA_PART) return 1;
    return (double)n * KV >= v1_ctas_per_sm() * (num_sms > 0 ? num_sms : 1) ? 1 : 2;
}

extern "C" int paged_decode(const PagedDecode *a, int num_sms) {
    return paged_decode_choose(a->n, a->KV, a->max_len, num_sms) == 1 ? paged_decode_v1(a) : paged_decode_v2(a);
}

// ---------------------------------------------------------------- gather (chunked prefill's input)

// Unit i of the (L, nw) output: row p = i / nw of the context, from pool row tab[p / B] * B + p % B.
template <class W>
__global__ void k_paged_gather(const W *kc, const W *vc, const int *tab, int B, int L, int nw, W *dk, W *dv) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)L * nw; i += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(i / nw), e = (int)(i % nw);
        const size_t r = (size_t)tab[p / B] * B + p % B;
        dk[i] = kc[r * nw + e];
        dv[i] = vc[r * nw + e];
    }
}

extern "C" int paged_gather(StDtype dt, const void *kc, const void *vc, const int *block_tables, int bt_stride,
                            int block_size, int seq, int L, int kd, void *dk, void *dv) {
    if (L < 0 || kd < 1 || block_size < 1 || seq < 0) return -1;
    if (L == 0) return 0;
    const size_t bytes = (size_t)kd * esize(dt);
    const int *tab = block_tables + (size_t)seq * bt_stride;
    const int blocks_max = 4096;
    if (bytes % 16 == 0) {
        const int nw = (int)(bytes / 16);
        k_paged_gather<uint4><<<grid_for((size_t)L * nw, 256) < blocks_max ? grid_for((size_t)L * nw, 256) : blocks_max, 256>>>(
            (const uint4 *)kc, (const uint4 *)vc, tab, block_size, L, nw, (uint4 *)dk, (uint4 *)dv);
    } else if (bytes % 4 == 0) {
        const int nw = (int)(bytes / 4);
        k_paged_gather<unsigned><<<grid_for((size_t)L * nw, 256) < blocks_max ? grid_for((size_t)L * nw, 256) : blocks_max, 256>>>(
            (const unsigned *)kc, (const unsigned *)vc, tab, block_size, L, nw, (unsigned *)dk, (unsigned *)dv);
    } else {
        const int nw = (int)(bytes / 2);
        k_paged_gather<unsigned short><<<grid_for((size_t)L * nw, 256) < blocks_max ? grid_for((size_t)L * nw, 256) : blocks_max, 256>>>(
            (const unsigned short *)kc, (const unsigned short *)vc, tab, block_size, L, nw, (unsigned short *)dk,
            (unsigned short *)dv);
    }
    CUDA_CHECK_LAST();
    return 0;
}

// ---------------------------------------------------------------- device helpers for C callers

extern "C" void *pa_dev_alloc(size_t bytes) {
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        fprintf(stderr, "pa_dev_alloc(%zu bytes): %s\n", bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}
extern "C" void pa_dev_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}
extern "C" int pa_upload(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}
extern "C" int pa_download(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}
// Rounded on the host (fromf is host code too), so the device holds exactly what the CPU side
// rounds with the same conversion.
extern "C" int pa_upload_as(StDtype dt, void *dst, const float *src, size_t n) {
    if (dt == ST_F32) return pa_upload(dst, src, n * 4);
    unsigned short *tmp = (unsigned short *)xmalloc(n * 2);
    if (dt == ST_BF16)
        for (size_t i = 0; i < n; i++) ((__nv_bfloat16 *)tmp)[i] = fromf<__nv_bfloat16>(src[i]);
    else
        for (size_t i = 0; i < n; i++) ((__half *)tmp)[i] = fromf<__half>(src[i]);
    pa_upload(dst, tmp, n * 2);
    free(tmp);
    return 0;
}
extern "C" int pa_download_f32(StDtype dt, float *dst, const void *src, size_t n) {
    if (dt == ST_F32) return pa_download(dst, src, n * 4);
    unsigned short *tmp = (unsigned short *)xmalloc(n * 2);
    pa_download(tmp, src, n * 2);
    if (dt == ST_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = tof(((const __nv_bfloat16 *)tmp)[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = tof(((const __half *)tmp)[i]);
    free(tmp);
    return 0;
}
extern "C" int pa_sync(void) {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "pa_sync: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
extern "C" int pa_num_sms(void) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
