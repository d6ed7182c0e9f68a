// decode_gpu.cuh — what step03's CUDA decode shares with later steps' CUDA code (CUDA C++ only):
// the 16-byte vector loads, the split decode attention (one query per head over a cache, as
// device functions so that step04 runs them for every row of a flat batch) and the GEMV.
// defines: Vec16, ATTN_CHUNK, ATTN_WARPS, ATTN_MAXG, ATTN_MAXE, attn_split_block, attn_split_core, attn_vec_core,
//          attn_smem_bytes, attn_combine_heads, head_rms_inv, attn_block_softmax, argmax_pair,
//          block_argmax; declares (decode_gpu.cu): proj_gemv
//
// Decode attention (flash-decoding's idea, done simply): the keys of one query are split in
// blocks of ATTN_CHUNK; attn_split_block handles one (kv head, split) for the g = H/KV query
// heads that share the kv head (each K/V row read once) -> local max m, sum l and unnormalized
// o = sum_j exp(s_j - m) v_j; attn_combine_heads merges the splits of each head.
#pragma once
#include <cuda_runtime.h>
#include <math.h>

#include "step02_attention/forward_gpu.cuh"

// 8 (bf16/fp16) or 4 (fp32) elements of a 16-byte vector, widened to fp32
template <class W> struct Vec16;
template <> struct Vec16<float> {
    static constexpr int N = 4;
    static __device__ inline void unpack(const uint4 &u, float *f) {
        f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
    }
};
template <> struct Vec16<__nv_bfloat16> {
    static constexpr int N = 8;
    static __device__ inline void unpack(const uint4 &u, float *f) {
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
};
template <> struct Vec16<__half> {
    static constexpr int N = 8;
    static __device__ inline void unpack(const uint4 &u, float *f) {
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 t = __half22float2(h[i]);
            f[2 * i] = t.x, f[2 * i + 1] = t.y;
        }
    }
};

#define ATTN_CHUNK 128  // keys per block = threads per block
#define ATTN_WARPS (ATTN_CHUNK / 32)
#define ATTN_MAXG 8     // query heads per kv head (H / KV) at most
#define ATTN_MAXE 8     // head_dim / 32 at most (head_dim <= 256)

// 1 / rms of one head's hd values (fp32), summed by the 32 lanes of a warp in a fixed order (the
// q/k norm of Qwen3: x * head_rms_inv * w); every lane gets it.
__device__ inline float head_rms_inv(const float *x, int hd, float eps) {
    float ss = 0;
    for (int e = threadIdx.x % 32; e < hd; e += 32) ss += x[e] * x[e];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    return rsqrtf(ss / hd + eps);
}

// The split attention's softmax over a block's jn keys, one warp per head hh < g: ps (g, CHUNK)
// scores -> p = exp(s - m) in place; m_s[hh] = the local max m, l_s[hh] = sum p (shared).
// nwarps: the block's warps (a block of another size than ATTN_CHUNK threads: step07's k_attn_fused2).
__device__ inline void attn_block_softmax(float *ps, int jn, int g, float *m_s, float *l_s, int nwarps = ATTN_WARPS) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int hh = warp; hh < g; hh += nwarps) {
        float m = -INFINITY;
        for (int j = lane; j < jn; j += 32) m = fmaxf(m, ps[hh * ATTN_CHUNK + j]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0;
        for (int j = lane; j < jn; j += 32) {
            const float p = expf(ps[hh * ATTN_CHUNK + j] - m);
            ps[hh * ATTN_CHUNK + j] = p;
            l += p;
        }
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) m_s[hh] = m, l_s[hh] = l;
    }
}

// argmax with ties to the lower index (as argmax_f32): fold (v, i) into (best, bi)
__device__ inline void argmax_pair(float &best, int &bi, float v, int i) {
    if (v > best || (v == best && i < bi)) best = v, bi = i;
}
// The block's argmax of every thread's (best, bi): thread 0 holds it after the call.
__device__ inline void block_argmax(float &best, int &bi) {
    __shared__ float bv[32];
    __shared__ int bx[32];
    for (int o = 16; o > 0; o >>= 1)
        argmax_pair(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) bv[w] = best, bx[w] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < (int)(blockDim.x / 32); i++) argmax_pair(best, bi, bv[i], bx[i]);
}

// One block (ATTN_CHUNK threads) of a split decode attention: kv head kvh, keys
// [split*CHUNK, split*CHUNK + CHUNK) of len. q (H*hd) fp32; kc, vc (>= len, KV*hd) one layer's cache.
// part_o (H, nsplit, hd), part_ml (H, nsplit, 2). Dynamic shared: (g*hd + g*CHUNK + WARPS*g*hd) floats.
//   scores: thread t scores key j0+t against the g heads, reading its K row once (16-byte loads
//           when hd allows) — all keys of the block in parallel;
//   softmax: one warp per head over the block's keys: local max m, p = exp(s - m), sum l;
//   P V:    warp w takes keys w, w+4, ...; lane owns elements lane, lane+32, ... of the V row
//           (coalesced), for all g heads at once; the 4 warps' partial sums are added in shared.
// attn_split_core is the block once the g query heads are in shared memory (qs = the start of the
// dynamic shared memory, (g, hd) fp32); attn_split_block (below) puts them there from q, step07's
// fused decode does it itself (after RoPE).
template <class C>
__device__ inline void attn_split_core(const float *qs, const C *kc, const C *vc, int len, int H, int KV, int hd,
                                       float scale, float *part_o, float *part_ml, int kvh, int split, int nsplit) {
    extern __shared__ float sm[];
    const int g = H / KV, t = threadIdx.x;
    const int j0 = split * ATTN_CHUNK;
    if (j0 >= len) return;
    const int jn = min(ATTN_CHUNK, len - j0), gh = g * hd;
    float *ps = sm + gh, *red = ps + g * ATTN_CHUNK;  // after qs: (g, CHUNK) (WARPS, g, hd)
    const size_t ld = (size_t)KV * hd;
    if (t < jn) {
        const C *kr = kc + (size_t)(j0 + t) * ld + (size_t)kvh * hd;
        float dot[ATTN_MAXG] = {};
        constexpr int N = Vec16<C>::N;
        if (hd % N == 0) {
            for (int c = 0; c < hd / N; c++) {
                float kf[N];
                Vec16<C>::unpack(*((const uint4 *)kr + c), kf);
#pragma unroll
                for (int hh = 0; hh < ATTN_MAXG; hh++)
                    if (hh < g)
#pragma unroll
                        for (int i = 0; i < N; i++) dot[hh] = fmaf(qs[hh * hd + c * N + i], kf[i], dot[hh]);
            }
        } else {
            for (int e = 0; e < hd; e++) {
                const float kv = tof(kr[e]);
#pragma unroll
                for (int hh = 0; hh < ATTN_MAXG; hh++)
                    if (hh < g) dot[hh] = fmaf(qs[hh * hd + e], kv, dot[hh]);
            }
        }
#pragma unroll
        for (int hh = 0; hh < ATTN_MAXG; hh++)
            if (hh < g) ps[hh * ATTN_CHUNK + t] = dot[hh] * scale;
    }
    __syncthreads();
    __shared__ float m_s[ATTN_MAXG], l_s[ATTN_MAXG];
    const int warp = t / 32, lane = t % 32;
    attn_block_softmax(ps, jn, g, m_s, l_s);
    __syncthreads();
    float acc[ATTN_MAXG][ATTN_MAXE] = {};
    const C *vb = vc + (size_t)j0 * ld + (size_t)kvh * hd;
#pragma unroll 4
    for (int j = warp; j < jn; j += ATTN_WARPS) {
        float v[ATTN_MAXE];
#pragma unroll
        for (int i = 0; i < ATTN_MAXE; i++) {
            const int e = lane + 32 * i;
            v[i] = e < hd ? tof(vb[(size_t)j * ld + e]) : 0.0f;
        }
#pragma unroll
        for (int hh = 0; hh < ATTN_MAXG; hh++)
            if (hh < g) {
                const float p = ps[hh * ATTN_CHUNK + j];
#pragma unroll
                for (int i = 0; i < ATTN_MAXE; i++) acc[hh][i] = fmaf(p, v[i], acc[hh][i]);
            }
    }
#pragma unroll
    for (int hh = 0; hh < ATTN_MAXG; hh++)
        if (hh < g)
#pragma unroll
            for (int i = 0; i < ATTN_MAXE; i++) {
                const int e = lane + 32 * i;
                if (e < hd) red[(warp * g + hh) * hd + e] = acc[hh][i];
            }
    __syncthreads();
    for (int o = t; o < gh; o += ATTN_CHUNK) {
        float s = 0;
        for (int w = 0; w < ATTN_WARPS; w++) s += red[w * gh + o];
        const int h = kvh * g + o / hd;
        part_o[((size_t)h * nsplit + split) * hd + o % hd] = s;
    }
    if (t < g) {
        const int h = kvh * g + t;
        part_ml[((size_t)h * nsplit + split) * 2] = m_s[t];
        part_ml[((size_t)h * nsplit + split) * 2 + 1] = l_s[t];
    }
}

template <class C>
__device__ inline void attn_split_block(const float *q, const C *kc, const C *vc, int len, int H, int KV, int hd,
                                        float scale, float *part_o, float *part_ml, int kvh, int split, int nsplit) {
    extern __shared__ float sm[];
    const int gh = (H / KV) * hd;
    if (split * ATTN_CHUNK >= len) return;
    for (int i = threadIdx.x; i < gh; i += ATTN_CHUNK) sm[i] = q[(size_t)kvh * gh + i];
    __syncthreads();
    attn_split_core<C>(sm, kc, vc, len, H, KV, hd, scale, part_o, part_ml, kvh, split, nsplit);
}

// The same block with every K and V row read by LPR lanes together (step04's k_attn_rows_vec; hd =
// LPR * N, LPR a power of two <= 32, G >= g = H / KV): lane c of a row holds its 16-byte vector c, so
// a warp's load covers 32 / LPR whole rows. qg: the g query heads of kv head kvh (g, hd) fp32, in
// global or shared memory; kh, vh: this kv head's first key of the block (rows kd apart); jn keys.
// ps (g, CHUNK) and red (WARPS, g, hd) shared; po, pm: part_o / part_ml of the sequence.
// pre (step07's fused decode, or NULL): the first round of K and V rows, loaded by pre->load before
// the block could read q (rows < pre->jn, the ones already in the cache; the rest is loaded here).
// out (or NULL): the block holds all the keys, so it writes the normalized heads (o / l, what
// attn_combine_heads makes of one split) to out (g, hd) instead of its partials.
template <class C, int LPR, int G> struct AttnVecRound {
    static constexpr int N = Vec16<C>::N, RPW = 32 / LPR, NW = ATTN_CHUNK / 32, RPI = NW * RPW, NIT = ATTN_CHUNK / RPI;
    // rows in flight per lane: as many as the registers allow beside q and the accumulators (G x N
    // floats each), so that a short context is one round trip for K and one for V
    static constexpr int UMAX = G <= 2 ? 16 : G <= 4 ? 8 : 4, U = NIT < UMAX ? NIT : UMAX;
    uint4 k[U], v[U];
    int jn;
    __device__ inline void load(const C *kh, const C *vh, size_t kd, int jpre) {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane % LPR, sub = lane / LPR;
        jn = jpre;
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int j = i * RPI + warp * RPW + sub;
            if (j < jpre) k[i] = *(const uint4 *)(kh + c * N + (size_t)j * kd), v[i] = *(const uint4 *)(vh + c * N + (size_t)j * kd);
        }
    }
};
// The end of a vectorized attention block of NW warps (attn_vec_core, step07's k_attn_fused2): each
// lane's P V sums acc (G heads x N elements of its rows) are added over the lanes of the same 16-byte
// column, one row group per warp goes to red (NW, g, hd), and after a barrier the block adds the
// warps' partials. out != NULL: the block held all the keys and writes the normalized heads
// (o / l) to out (g, hd); else its partials to po / pm (part_o / part_ml) at (head, split).
template <int LPR, int G, int N, int NW>
__device__ inline void attn_vec_write(const float (&acc)[G][N], int g, int hd, float *red, const float *m_s,
                                      const float *l_s, float *po, float *pm, int kvh, int split, int nsplit,
                                      float *out) {
    const int t = threadIdx.x, warp = t / 32, lane = t % 32, c = lane % LPR, sub = lane / LPR;
#pragma unroll
    for (int hh = 0; hh < G; hh++)
        if (hh < g)
#pragma unroll
            for (int i = 0; i < N; i++) {
                float a = acc[hh][i];
#pragma unroll
                for (int o = LPR; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
                if (sub == 0) red[((size_t)warp * g + hh) * hd + c * N + i] = a;
            }
    __syncthreads();
    for (int o = t; o < g * hd; o += NW * 32) {
        float s = 0;
        for (int wi = 0; wi < NW; wi++) s += red[(size_t)wi * g * hd + o];
        const int h = kvh * g + o / hd;
        if (out) out[o] = s / l_s[o / hd];
        else po[((size_t)h * nsplit + split) * hd + o % hd] = s;
    }
    if (out) return;
    if (t < g) {
        const int h = kvh * g + t;
        pm[((size_t)h * nsplit + split) * 2] = m_s[t];
        pm[((size_t)h * nsplit + split) * 2 + 1] = l_s[t];
    }
}

template <class C, int LPR, int G>
__device__ inline void attn_vec_core(const float *qg, const C *kh, const C *vh, size_t kd, int jn, int g, int hd,
                                     float scale, float *ps, float *red, float *po, float *pm, int kvh, int split,
                                     int nsplit, const AttnVecRound<C, LPR, G> *pre = NULL, float *out = NULL) {
    using RD = AttnVecRound<C, LPR, G>;
    constexpr int N = RD::N, RPW = RD::RPW, NW = RD::NW, RPI = RD::RPI, NIT = RD::NIT, U = RD::U;
    const int t = threadIdx.x, warp = t / 32, lane = t % 32, c = lane % LPR, sub = lane / LPR;
    const C *kb = kh + c * N, *vb = vh + c * N;
    const float *qr = qg + c * N;
    float qf[G][N];
#pragma unroll
    for (int hh = 0; hh < G; hh++)
#pragma unroll
        for (int i = 0; i < N; i++) qf[hh][i] = hh < g ? qr[hh * hd + i] * scale : 0.0f;
    // ---- scores: row j = it*RPI + warp*RPW + sub
    for (int it0 = 0; it0 < NIT; it0 += U) {
        uint4 u[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int j = (it0 + k) * RPI + warp * RPW + sub;
            if (pre && it0 == 0 && j < pre->jn) u[k] = pre->k[k];
            else u[k] = j < jn ? *(const uint4 *)(kb + (size_t)j * kd) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int j = (it0 + k) * RPI + warp * RPW + sub;
            float kf[N], dot[G];
            Vec16<C>::unpack(u[k], kf);
#pragma unroll
            for (int hh = 0; hh < G; hh++) {
                dot[hh] = 0;
                if (hh < g)
#pragma unroll
                    for (int i = 0; i < N; i++) dot[hh] = fmaf(qf[hh][i], kf[i], dot[hh]);
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) dot[hh] += __shfl_xor_sync(0xffffffffu, dot[hh], o);
            }
            if (c == 0 && j < jn)
#pragma unroll
                for (int hh = 0; hh < G; hh++)
                    if (hh < g) ps[hh * ATTN_CHUNK + j] = dot[hh];
        }
    }
    __syncthreads();
    // ---- softmax over the block's keys, one warp per head: local max m, p = exp(s - m), sum l
    __shared__ float m_s[G], l_s[G];
    attn_block_softmax(ps, jn, g, m_s, l_s);
    __syncthreads();
    // ---- P V: each lane its N elements of its rows, for the g heads
    float acc[G][N];
#pragma unroll
    for (int hh = 0; hh < G; hh++)
#pragma unroll
        for (int i = 0; i < N; i++) acc[hh][i] = 0;
    for (int it0 = 0; it0 < NIT; it0 += U) {
        uint4 u[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int j = (it0 + k) * RPI + warp * RPW + sub;
            if (pre && it0 == 0 && j < pre->jn) u[k] = pre->v[k];
            else u[k] = j < jn ? *(const uint4 *)(vb + (size_t)j * kd) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int j = (it0 + k) * RPI + warp * RPW + sub;
            if (j >= jn) continue;
            float vf[N];
            Vec16<C>::unpack(u[k], vf);
#pragma unroll
            for (int hh = 0; hh < G; hh++)
                if (hh < g) {
                    const float p = ps[hh * ATTN_CHUNK + j];
#pragma unroll
                    for (int i = 0; i < N; i++) acc[hh][i] = fmaf(p, vf[i], acc[hh][i]);
                }
        }
    }
    attn_vec_write<LPR, G, N, NW>(acc, g, hd, red, m_s, l_s, po, pm, kvh, split, nsplit, out);
}

static inline size_t attn_smem_bytes(int g, int hd) { return (size_t)(g * hd + g * ATTN_CHUNK + ATTN_WARPS * g * hd) * sizeof(float); }

// nh heads' outputs (hd each, dtype O; head i at out + i * hd) from the splits that hold keys
// (ceil(len / ATTN_CHUNK) of them): out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s; head i's
// part_o (nsplit, hd) at part_o + i * nsplit * hd and part_ml (nsplit, 2) at ml + i * nsplit * 2.
// The partials are read through L2 (__ldcg): in step07's fused decode other blocks of the same
// kernel wrote them. len <= 0 (no keys: a padding row) writes zeros.
template <class O>
__device__ inline void attn_combine_heads(const float *part_o, const float *ml, int nsplit, int nh, int len, int hd,
                                          O *out) {
    const int ns = len > 0 ? (len + ATTN_CHUNK - 1) / ATTN_CHUNK : 0;
    for (int o = threadIdx.x; o < nh * hd; o += blockDim.x) {
        const int h = o / hd, e = o % hd;
        const float *m = ml + (size_t)h * nsplit * 2, *po = part_o + (size_t)h * nsplit * hd + e;
        float M = -INFINITY;
        for (int s = 0; s < ns; s++) M = fmaxf(M, __ldcg(m + 2 * s));
        float L = 0;
        for (int s = 0; s < ns; s++) L += expf(__ldcg(m + 2 * s) - M) * __ldcg(m + 2 * s + 1);
        float acc = 0;
        for (int s = 0; s < ns; s++) acc += expf(__ldcg(m + 2 * s) - M) * __ldcg(po + (size_t)s * hd);
        out[o] = fromf<O>(ns ? acc / L : 0.0f);
    }
}

// y (rows) [+]= W (rows, n_in) x (n_in) + b (rows, or NULL) for one of a layer's projections (or the
// lm_head): the dense W (q->n == 0) with the GEMV version decode uses (gemv_set_version), or
// step06's qlinear_gpu_gemv over q's parts (part i writes outputs from the sum of the earlier parts'
// rows on, with that slice of b); on stream s; acc = 1 adds into y (the residual add). x, y fp32.
// Graph-capturable.
void proj_gemv(StDtype dt, const GpuQProj *q, const void *W, const float *x, const float *b, float *y, int rows,
               int n_in, int acc, cudaStream_t s);
