// decode_fused.cuh — step07's fusions inside step03's batch-1 decode graph (CUDA C++ only; included
// by step03_kvcache/decode_gpu.cu, which chooses between this step and its own, gpu_decoder_set_fused).
// defines: pdl_launch, k_gemv_fused, k_argmax_fused, k_rope_table, k_attn_fused
//
// At batch 1 a small model's decode step is ~10 small kernels per layer, each a few microseconds,
// and the GPU spends much of the step between kernels: one kernel drains (its last blocks finish
// while most SMs idle), the next is launched, and its first loads wait a full HBM round trip.
// Two remedies, both measured in kv_bench's "decode_step_by_fusion" line:
//
// 1. Fewer kernels: 10 per layer -> 5.
//      qkv GEMV     + the RMSNorm before it: y = inv * W (x * w), the lanes that read x for the dot
//                     product add up x^2 on the way, the finished dot product is scaled by
//                     inv = 1 / rms(x) (no pass, no barrier, nothing before the first weight load)
//      attention    + q/k norm, RoPE and the K/V cache write (k_rope_append; cos / sin from a table)
//                     + the split combine (the last block of a kv head to finish merges the splits;
//                     a block that holds all the keys writes the normalized heads itself), on
//                     step04's vectorized core (attn_vec_core) where head_dim allows
//      o GEMV       (adds into the residual, as before)
//      gate|up GEMV + the RMSNorm before it + SwiGLU after it (a warp computes gate row i and up
//                     row ff + i together and writes silu(g) * u: the (2 ff) intermediate is never
//                     written)
//      down GEMV    (adds into the residual)
//    The lm_head GEMV takes the final RMSNorm the same way; the argmax runs on many blocks.
// 2. Programmatic dependent launch (PDL, sm_90): each kernel is launched with
//    cudaLaunchAttributeProgrammaticStreamSerialization, so the next kernel's blocks may start
//    while this one still runs. Every kernel here first says so (griddepcontrol.launch_dependents)
//    and waits for the previous kernel's results (griddepcontrol.wait: the previous grid has
//    completed and its writes are visible) before it reads or writes anything the chain shares.
//    What it may do before the wait is what does not depend on the previous kernel: a GEMV issues
//    its first weight loads, the attention its first round of K/V rows (those of earlier steps),
//    so the HBM round trip overlaps the previous kernel's tail. The
//    graph captures the programmatic edges (CUDA 12.3+). Below sm_90 the attribute is not set and
//    the two instructions compile to nothing: the kernels then run one after the other as usual.
//
// Rounding: the norm is inv * W (x * w) where the unfused path computes W (x * inv * w), the
// attention sums in step04's order, the SwiGLU is g / (1 + exp(-g)) * u (k_swiglu_f32), RoPE the same
// products on the same cos / sin values (a table made at setup with k_rope_append's double-precision
// cos / sin). The two steps agree to rounding, not bit for bit; with and without PDL the results
// are bit-identical (tested: step03/gpu_fused_decode_matches_unfused_and_pdl_is_exact).
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "check.h"
#include "cuda_check.h"
#include "pdl.cuh"
#include "step03_kvcache/decode_gpu.cuh"

// ---------------------------------------------------------------- programmatic dependent launch
// (pdl_trigger, pdl_wait: common/pdl.cuh)

// Launch k on s, allowed to overlap the previous kernel of the stream when pdl != 0 (sm_90: the
// caller asks the device once; a kernel launched so must call pdl_wait before touching shared data).
template <class... KArgs, class... Args>
static void pdl_launch(int pdl, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...));
}

// ---------------------------------------------------------------- the fused GEMV
#define GEMVF_WARPS 8  // warps per block; one output per warp
#define GEMVF_U 8      // 16-byte chunks per lane per row in flight (as step03's v2_r1u8)

// y (rows) = W x' + b [+ y], one output per warp, x' = x (fp32, n_in), or with NORM
// x' = x * inv * nw, inv = 1 / sqrt(mean(x^2) + eps) (the RMSNorm of x with weight nw, fp32).
// NORM needs no pass of its own: the warp's lanes read all of x for the dot product anyway, so they
// add up x^2 on the way and scale the finished dot product: y = inv * (W (x * nw)).
// SWIGLU: output i is silu(W[i] x') * (W[pair + i] x') (gate rows, then up rows pair = ff later);
// no bias, no accumulate. The first weight loads are issued before pdl_wait.
template <class W, bool NORM, bool SWIGLU, bool TAIL>
__global__ void __launch_bounds__(GEMVF_WARPS * 32)
    k_gemv_fused(const W *__restrict__ Wm, const float *x, const float *__restrict__ nw, float eps,
                 const float *__restrict__ b, float *y, int rows, int n_in, int accumulate, int pair) {
    constexpr int N = Vec16<W>::N, R = SWIGLU ? 2 : 1, U = GEMVF_U;
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMVF_WARPS + threadIdx.x / 32;
    const int rr = min(row, rows - 1);  // a warp past the end computes a clamped row, writes nothing
    const W *wr[R];
    wr[0] = Wm + (size_t)rr * n_in;
    if (SWIGLU) wr[R - 1] = Wm + (size_t)(pair + rr) * n_in;
    const bool vec = n_in % N == 0;
    const int nv = vec ? n_in / N : 0;  // 16-byte chunks per row
    // Rounds of U chunks per lane (chunk c0 + 32 u), every load of a round issued before the first is
    // used. A full round loads unconditionally. A row shorter than one round is one predicated round
    // (a load past the row's end is skipped); a long row's last, partial round is predicated too in
    // the TAIL instance, chunk by chunk in the other (gemvf_launch picks: the tail's code slows the
    // full rounds' loop, README section 7). The first round does not depend on the previous kernel:
    // it is in flight while that kernel finishes.
    uint4 w[U][R];
    auto load_full = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) w[u][r] = __ldcs((const uint4 *)wr[r] + c0 + 32 * u);
    };
    auto load_part = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (c0 + 32 * u < nv) w[u][r] = __ldcs((const uint4 *)wr[r] + c0 + 32 * u);
    };
    float acc[R] = {}, ss = 0;  // ss (NORM): this lane's part of sum(x^2)
    // one round's dot products; FULL: all U chunks are in the row
    auto fma_round = [&](int c0, auto FULL) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!decltype(FULL)::value && c0 + 32 * u >= nv) break;
            float xf[N];
            const size_t e0 = (size_t)(c0 + 32 * u) * N;
#pragma unroll
            for (int i = 0; i < N; i += 4) {
                const float4 t = __ldg((const float4 *)(x + e0 + i));
                xf[i] = t.x, xf[i + 1] = t.y, xf[i + 2] = t.z, xf[i + 3] = t.w;
                if (NORM) {
                    const float4 gw = __ldg((const float4 *)(nw + e0 + i));
                    ss = fmaf(t.x, t.x, fmaf(t.y, t.y, fmaf(t.z, t.z, fmaf(t.w, t.w, ss))));
                    xf[i] *= gw.x, xf[i + 1] *= gw.y, xf[i + 2] *= gw.z, xf[i + 3] *= gw.w;
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wf[N];
                Vec16<W>::unpack(w[u][r], wf);
#pragma unroll
                for (int i = 0; i < N; i++) acc[r] = fmaf(wf[i], xf[i], acc[r]);
            }
        }
    };
    int c0 = lane;
    bool full = c0 + 32 * (U - 1) < nv;
    const bool short_row = !full && c0 < nv;  // less than one round: one predicated round
    if (full) load_full(c0);
    else if (short_row) load_part(c0);
    pdl_wait();
    if (vec) {
        if (!TAIL && short_row) fma_round(c0, std::false_type{});
        while (full) {
            fma_round(c0, std::true_type{});
            c0 += 32 * U;
            full = c0 + 32 * (U - 1) < nv;
            if (full) load_full(c0);
        }
        if constexpr (TAIL) {
            if (c0 < nv) {  // the last, partial round (or a short row's only one)
                if (!short_row) load_part(c0);
                fma_round(c0, std::false_type{});
            }
        } else if (!short_row) {
            for (; c0 < nv; c0 += 32) {  // a long row's last chunks (gemvf_launch: none), fewer than U per lane
                float xf[N];
                const size_t e0 = (size_t)c0 * N;
#pragma unroll
                for (int i = 0; i < N; i++) {
                    xf[i] = x[e0 + i];
                    if (NORM) ss = fmaf(xf[i], xf[i], ss), xf[i] *= nw[e0 + i];
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[N];
                    Vec16<W>::unpack(__ldcs((const uint4 *)wr[r] + c0), wf);
#pragma unroll
                    for (int i = 0; i < N; i++) acc[r] = fmaf(wf[i], xf[i], acc[r]);
                }
            }
        }
    } else {
        for (int i = lane; i < n_in; i += 32) {
            float xi = x[i];
            if (NORM) ss = fmaf(xi, xi, ss), xi *= nw[i];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = fmaf(tof(wr[r][i]), xi, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (NORM) {  // the lanes together read all of x once: W (x * nw) scaled by 1 / rms(x)
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = rsqrtf(ss / n_in + eps);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] *= inv;
    }
    if (lane == 0 && row < rows) {
        if (SWIGLU) {
            const float g = acc[0];
            y[row] = g / (1.0f + expf(-g)) * acc[R - 1];
        } else {
            y[row] = acc[0] + (b ? b[row] : 0.0f) + (accumulate ? y[row] : 0.0f);
        }
    }
}

// Launch k_gemv_fused for rows x n_in: TAIL only where a long row ends in a partial round (the
// code for it, even unused, costs the full rounds' loop: the Llama-3.1-8B step took 4.83 ms with it
// and 4.43 without, while Qwen3-0.6B's down projection, 3072 = 1.5 rounds, wants it).
template <class W, bool NORM, bool SWIGLU>
static void gemvf_launch(int pdl, cudaStream_t s, const W *Wm, const float *x, const float *nw, float eps,
                         const float *b, float *y, int rows, int n_in, int accumulate, int pair) {
    const int nv = n_in % Vec16<W>::N ? 0 : n_in / Vec16<W>::N, round = 32 * GEMVF_U;
    const dim3 grid((rows + GEMVF_WARPS - 1) / GEMVF_WARPS), block(GEMVF_WARPS * 32);
    if (nv > round && nv % round)
        pdl_launch(pdl, k_gemv_fused<W, NORM, SWIGLU, true>, grid, block, 0, s, Wm, x, nw, eps, b, y, rows, n_in,
                   accumulate, pair);
    else
        pdl_launch(pdl, k_gemv_fused<W, NORM, SWIGLU, false>, grid, block, 0, s, Wm, x, nw, eps, b, y, rows, n_in,
                   accumulate, pair);
}

// ---------------------------------------------------------------- argmax over many blocks
// The step's last kernel (step03's k_argmax_advance is one block of 1024 threads scanning the whole
// vocabulary: 148 dependent loads per thread for 151936 logits, tens of microseconds). Here block b
// finds the argmax of its slice, writes (value, index) to pv[b], pi[b]; the last block to finish (a
// counter, reset by it) reduces those and advances: *d_tok = the argmax, out_ids[*d_pos] = it,
// *d_pos += 1. Ties go to the lower index (argmax_pair, block_argmax: decode_gpu.cuh), so the
// result is exact and the same as step03's. Grid: any number of blocks <= 1024, 1024 threads.
__global__ void __launch_bounds__(1024)
    k_argmax_fused(const float *logits, int vocab, float *pv, int *pi, int *count, int *d_tok, int *d_pos,
                   int *out_ids) {
    pdl_trigger();
    pdl_wait();
    const int per = (vocab + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(vocab, lo + per);
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) argmax_pair(best, bi, logits[i], i);
    block_argmax(best, bi);
    __shared__ int last;
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = best, pi[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(count, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = -INFINITY, bi = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) argmax_pair(best, bi, __ldcg(pv + b), __ldcg(pi + b));
    __syncthreads();  // block_argmax's shared arrays are reused
    block_argmax(best, bi);
    if (threadIdx.x == 0) {
        const int p = *d_pos;
        out_ids[p] = bi;
        *d_tok = bi;
        *d_pos = p + 1;
        *count = 0;
    }
}

// ---------------------------------------------------------------- RoPE table
// cos_t, sin_t (max_seq, hd/2): the values k_rope_append computes per step (the fp32 angle
// pos * inv_freq, its cos and sin in double, rounded to fp32), once at setup.
__global__ void k_rope_table(const float *inv_freq, int max_seq, int half, float *cos_t, float *sin_t) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < max_seq * half; i += gridDim.x * blockDim.x) {
        const int p = i / half, j = i % half;
        const float ang = (float)p * inv_freq[j];
        cos_t[i] = (float)cos((double)ang), sin_t[i] = (float)sin((double)ang);
    }
}

// ---------------------------------------------------------------- attention + RoPE + cache + combine
// nw: the head's q or k norm weight (or NULL); x the head's fp32 qkv values (hd); one warp.
// out[i], out[i + half] = the rotated (normed) pair, as k_rope_append computes it.
template <class O>
static __device__ inline void rope_head_warp(const float *x, const float *nw, const float *cs, const float *sn,
                                             int hd, float eps, O *out) {
    const int lane = threadIdx.x & 31, half = hd / 2;
    const float inv = nw ? head_rms_inv(x, hd, eps) : 1.0f;
    for (int i = lane; i < half; i += 32) {
        float x1 = x[i] * inv, x2 = x[i + half] * inv;
        if (nw) x1 *= nw[i], x2 *= nw[i + half];
        const float c = cs[i], s = sn[i];
        out[i] = fromf<O>(x1 * c - x2 * s), out[i + half] = fromf<O>(x2 * c + x1 * s);
    }
}

// Grid (KV, nsplit), ATTN_CHUNK threads, attn_smem_bytes(g, hd) of dynamic shared memory.
// Block (kvh, split) of the step at position pos = *d_pos (len = pos + 1 keys):
//   1. the g query heads of kv head kvh from qkv: q norm (Qwen3) and RoPE, into shared memory;
//   2. the block that holds key pos writes the new token's k (k norm, RoPE) and v to the cache;
//   3. step03's split attention over keys [128 split, 128 split + 128) (attn_split_core), or the
//      vectorized core with its first round of K/V rows < pos loaded before the PDL wait;
//   4. the last block of kvh to finish (a counter per kv head, reset by that block) combines the
//      ceil(len / 128) splits of its g heads into att (H*hd, fp32): attn_combine_heads, as
//      k_attn_combine does per head. With one split the vectorized core writes att itself.
// LPR > 0: the vectorized core (attn_vec_core<C, LPR, G>, hd = LPR * 16 / sizeof(C)); LPR = 0:
// step03's scalar attn_split_core (any hd).
template <class C, int LPR, int G>
__global__ void __launch_bounds__(ATTN_CHUNK)
    k_attn_fused(const float *qkv, const float *q_norm, const float *k_norm, const float *cos_t, const float *sin_t,
                 const int *d_pos, int H, int KV, int hd, float eps, float scale, C *kc, C *vc, float *part_o,
                 float *part_ml, int *count, float *att) {
    pdl_trigger();
    extern __shared__ float sm[];
    const int kvh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, g = H / KV, t = threadIdx.x;
    const int warp = t / 32, half = hd / 2;
    // The position and the cache rows before it were written by earlier steps (earlier graph
    // launches), not by the kernels this one may overlap: read before the wait.
    const int pos = *d_pos, len = pos + 1;
    if (split * ATTN_CHUNK >= len) return;
    const int nact = (len + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const size_t kd = (size_t)KV * hd, r0 = (size_t)split * ATTN_CHUNK * kd + (size_t)kvh * hd;
    const int jn = min(ATTN_CHUNK, len - split * ATTN_CHUNK);
    AttnVecRound<C, LPR ? LPR : 1, G> pre;  // the vectorized core's first round of K and V rows < pos
    if constexpr (LPR > 0) pre.load(kc + r0, vc + r0, kd, split == nact - 1 ? jn - 1 : jn);
    pdl_wait();
    const float *cs = cos_t + (size_t)pos * half, *sn = sin_t + (size_t)pos * half;
    float *qs = sm;
    for (int hh = warp; hh < g; hh += ATTN_WARPS)
        rope_head_warp<float>(qkv + (size_t)(kvh * g + hh) * hd, q_norm, cs, sn, hd, eps, qs + hh * hd);
    if (split == nact - 1) {  // key pos is in this block's range: write it before reading it
        const size_t row = (size_t)pos * KV * hd + (size_t)kvh * hd;
        if (warp == 0) rope_head_warp<C>(qkv + (size_t)(H + kvh) * hd, k_norm, cs, sn, hd, eps, kc + row);
        else if (warp == 1) {
            const float *v = qkv + (size_t)(H + KV + kvh) * hd;
            for (int e = t - 32; e < hd; e += 32) vc[row + e] = fromf<C>(v[e]);
        }
    }
    __syncthreads();  // qs and the cache row are visible to the whole block
    if constexpr (LPR == 0) {
        attn_split_core<C>(qs, kc, vc, len, H, KV, hd, scale, part_o, part_ml, kvh, split, nsplit);
    } else {
        // one block holds all the keys (len <= ATTN_CHUNK): it writes the heads' outputs itself
        attn_vec_core<C, LPR, G>(qs, kc + r0, vc + r0, kd, jn, g, hd, scale, qs + g * hd, qs + g * hd + g * ATTN_CHUNK,
                                 part_o, part_ml, kvh, split, nsplit, &pre,
                                 nact == 1 ? att + (size_t)kvh * g * hd : NULL);
        if (nact == 1) return;
    }
    // both cores end with the block's writes of part_o / part_ml
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (t == 0) last = nact == 1 || atomicAdd(&count[kvh], 1) == nact - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (t == 0 && nact > 1) count[kvh] = 0;  // ready for the next layer / step
    attn_combine_heads<float>(part_o + (size_t)kvh * g * nsplit * hd, part_ml + (size_t)kvh * g * nsplit * 2, nsplit, g,
                              len, hd, att + (size_t)kvh * g * hd);
}
