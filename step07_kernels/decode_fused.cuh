// decode_fused.cuh — step07's fusions inside step03's batch-1 decode graph (CUDA C++ only; included
// by step03_kvcache/decode_gpu.cu, which chooses between this step and its own, gpu_decoder_set_fused).
// defines: fused_proj, k_gemv_fused, k_gemv_rows, argmax_blocks_finish, k_argmax_fused, k_rope_table,
//          attn_merge_splits, k_attn_fused, k_attn_fused2, k_attn_mma, attn4_smem_bytes, attn_fused2_paged
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
// (pdl_trigger, pdl_wait, pdl_launch: common/pdl.cuh)

// ---------------------------------------------------------------- the fused GEMV
#define GEMVF_WARPS 8  // warps per block; one output per warp
#define GEMVF_U 8      // 16-byte chunks per lane per row in flight (as step03's v2_r1u8)

// y (rows) = W x' + b [+ y], one output per warp, x' = x (fp32, n_in), or with NORM
// x' = x * inv * nw, inv = 1 / sqrt(mean(x^2) + eps) (the RMSNorm of x with weight nw, fp32).
// NORM needs no pass of its own: the warp's lanes read all of x for the dot product anyway, so they
// add up x^2 on the way and scale the finished dot product: y = inv * (W (x * nw)).
// SWIGLU: output i is silu(W[i] x') * (W[pair + i] x') (gate rows, then up rows pair = ff later);
// no bias, no accumulate. The first weight loads are issued before pdl_wait.
// KS > 1 (split): KS warps share each output, warp part p taking the 16-byte chunks p*32 + lane +
// 32*KS*k of the row; their sums meet in shared memory. A block then holds GEMVF_WARPS / KS rows,
// so a matrix of few rows still puts enough blocks on the GPU (Qwen3-0.6B's o and down
// projections: 1024 rows = 128 blocks of 8 rows for 132 SMs, and the down row's 384 chunks are
// two rounds of loads one after the other; with KS = 2, 256 blocks and one round).
// U: chunks a lane has in flight, GEMVF_U, or 4 where a row is at most 4 chunks a lane (gemvf_launch:
// a short row then holds half the registers, and more blocks fit on an SM at once).
template <class W, bool NORM, bool SWIGLU, bool TAIL, int KS = 1, int U = GEMVF_U>
__global__ void __launch_bounds__(GEMVF_WARPS * 32)
    k_gemv_fused(const W *__restrict__ Wm, const float *x, const float *__restrict__ nw, float eps,
                 const float *__restrict__ b, float *y, int rows, int n_in, int accumulate, int pair) {
    constexpr int N = Vec16<W>::N, R = SWIGLU ? 2 : 1, S = 32 * KS;  // S: a lane's chunk stride
    static_assert(GEMVF_WARPS % KS == 0, "KS divides the block's warps");
    pdl_trigger();
    const int lane = threadIdx.x & 31, part = KS > 1 ? (threadIdx.x / 32) % KS : 0;
    const int row = blockIdx.x * (GEMVF_WARPS / KS) + threadIdx.x / 32 / KS;
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
            for (int r = 0; r < R; r++) w[u][r] = __ldcs((const uint4 *)wr[r] + c0 + S * u);
    };
    auto load_part = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (c0 + S * u < nv) w[u][r] = __ldcs((const uint4 *)wr[r] + c0 + S * u);
    };
    float acc[R] = {}, ss = 0;  // ss (NORM): this lane's part of sum(x^2)
    // one round's dot products; FULL: all U chunks are in the row
    auto fma_round = [&](int c0, auto FULL) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!decltype(FULL)::value && c0 + S * u >= nv) break;
            float xf[N];
            const size_t e0 = (size_t)(c0 + S * u) * N;
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
    int c0 = lane + 32 * part;
    bool full = c0 + S * (U - 1) < nv;
    const bool short_row = !full && c0 < nv;  // less than one round: one predicated round
    if (full) load_full(c0);
    else if (short_row) load_part(c0);
    pdl_wait();
    if (vec) {
        if (!TAIL && short_row) fma_round(c0, std::false_type{});
        while (full) {
            fma_round(c0, std::true_type{});
            c0 += S * U;
            full = c0 + S * (U - 1) < nv;
            if (full) load_full(c0);
        }
        if constexpr (TAIL) {
            if (c0 < nv) {  // the last, partial round (or a short row's only one)
                if (!short_row) load_part(c0);
                fma_round(c0, std::false_type{});
            }
        } else if (!short_row) {
            for (; c0 < nv; c0 += S) {  // a long row's last chunks (gemvf_launch: none), fewer than U per lane
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
        for (int i = lane + 32 * part; i < n_in; i += S) {
            float xi = x[i];
            if (NORM) ss = fmaf(xi, xi, ss), xi *= nw[i];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = fmaf(tof(wr[r][i]), xi, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (NORM)
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if constexpr (KS > 1) {  // the parts' sums, in part order, to part 0
        __shared__ float red[GEMVF_WARPS][R + 1];
        const int wi = threadIdx.x / 32;
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) red[wi][r] = acc[r];
            red[wi][R] = ss;
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int p = 1; p < KS; p++) {
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] += red[wi + p][r];
            ss += red[wi + p][R];
        }
    }
    if (NORM) {  // the lanes together read all of x once: W (x * nw) scaled by 1 / rms(x)
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

// The row loop (k_gemv_rows): for a matrix of many short rows (the lm_head: 151936 rows of 1024
// for Qwen3-0.6B) one warp per row means ~19000 blocks of 8 warps, each loading its 2 KB and
// exiting, and every warp reading all of x and nw again (8 KB of fp32 through L1 per 2 KB of
// weights) to redo the norm's sum of squares. Here a grid that fills the GPU once loops: each warp
// loads its lanes' part of x (and nw) into registers once, with NORM reduces sum(x^2) once, then
// walks rows gw, gw + warps, ... with the next row's weights in flight while it multiplies the
// current one. CPL: 16-byte chunks per lane (the whole row in one round: nv <= 32 CPL). Each row's
// dot product is summed in k_gemv_fused's order (lane chunks c = lane + 32 u, u ascending, then the
// same shuffle tree), so the logits are bit-identical to its KS = 1 instance.
// ARGMAX (the lm_head): the step's argmax too, as k_argmax_fused does it (every lane holds each
// row's sum after the shuffles, so the warps track their best row; the block's best goes to
// am.pv/am.pi, the last block to finish reduces them and advances d_tok, d_pos, out_ids): one
// kernel less a step. The logits are written as without it.
// XS (rows of 9 to 16 chunks a lane, e.g. the Llama-3.1-8B lm_head's 4096 inputs): x * nw would
// take 128 registers a lane, so the block stages it in shared memory instead (fp32, n_in of them)
// and reduces sum(x^2) over the block; each lane reads its chunks' x there.
struct ArgmaxOut {
    float *pv;
    int *pi, *count, *d_tok, *d_pos, *out_ids;
};
// The end of a many-block argmax, every thread of the block calling it with its (best, bi): the
// block's argmax to am.pv / am.pi [blockIdx.x]; the last block to finish (am.count, reset by it)
// reduces them and advances: *d_tok = the argmax, out_ids[*d_pos] = it, *d_pos += 1 (d_pos NULL:
// *d_tok only).
__device__ inline void argmax_blocks_finish(float best, int bi, const ArgmaxOut &am) {
    block_argmax(best, bi);
    __shared__ int last;
    if (threadIdx.x == 0) {
        am.pv[blockIdx.x] = best, am.pi[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(am.count, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = -INFINITY, bi = 0x7fffffff;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) argmax_pair(best, bi, __ldcg(am.pv + i), __ldcg(am.pi + i));
    __syncthreads();  // block_argmax's shared arrays are reused
    block_argmax(best, bi);
    if (threadIdx.x == 0) {
        if (am.d_pos) {
            const int p = *am.d_pos;
            am.out_ids[p] = bi;
            *am.d_tok = bi;
            *am.d_pos = p + 1;
        } else {
            *am.d_tok = bi == 0x7fffffff ? 0 : bi;  // the token only (step04's runner; all NaN: 0, as k_pick_rows)
        }
        *am.count = 0;
    }
}
template <class W, bool NORM, int CPL, bool ARGMAX, bool XS = false>
__global__ void __launch_bounds__(GEMVF_WARPS * 32)
    k_gemv_rows(const W *__restrict__ Wm, const float *x, const float *__restrict__ nw, float eps,
                const float *__restrict__ b, float *y, int rows, int n_in, int accumulate, ArgmaxOut am) {
    constexpr int N = Vec16<W>::N;
    pdl_trigger();
    const int lane = threadIdx.x & 31, nwarps = gridDim.x * GEMVF_WARPS;
    int row = blockIdx.x * GEMVF_WARPS + threadIdx.x / 32;
    const int nv = n_in / N;
    uint4 w[CPL], wn[CPL];
    auto load = [&](uint4 *dst, int r) {
        const uint4 *wr = (const uint4 *)(Wm + (size_t)r * n_in);
#pragma unroll
        for (int u = 0; u < CPL; u++)
            if (lane + 32 * u < nv) dst[u] = __ldcs(wr + lane + 32 * u);
    };
    if (row < rows) load(w, row);
    pdl_wait();
    float xf[XS ? 1 : CPL][N], ss = 0;
    extern __shared__ float4 xsm4[];  // XS: x * nw, n_in floats
    float *xsm = (float *)xsm4;
    if constexpr (XS) {
        for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
            float v = x[i];
            if (NORM) ss = fmaf(v, v, ss), v *= nw[i];
            xsm[i] = v;
        }
        __shared__ float wss[GEMVF_WARPS];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) wss[threadIdx.x / 32] = ss;
        __syncthreads();  // also: xsm is written
        ss = 0;
        for (int i = 0; i < GEMVF_WARPS; i++) ss += wss[i];
    } else {
#pragma unroll
        for (int u = 0; u < CPL; u++) {
            const int c = lane + 32 * u;
            if (c >= nv) break;
#pragma unroll
            for (int i = 0; i < N; i += 4) {
                const float4 t = __ldg((const float4 *)(x + (size_t)c * N + i));
                xf[u][i] = t.x, xf[u][i + 1] = t.y, xf[u][i + 2] = t.z, xf[u][i + 3] = t.w;
                if (NORM) {
                    const float4 gw = __ldg((const float4 *)(nw + (size_t)c * N + i));
                    ss = fmaf(t.x, t.x, fmaf(t.y, t.y, fmaf(t.z, t.z, fmaf(t.w, t.w, ss))));
                    xf[u][i] *= gw.x, xf[u][i + 1] *= gw.y, xf[u][i + 2] *= gw.z, xf[u][i + 3] *= gw.w;
                }
            }
        }
        if (NORM)
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    }
    const float inv = NORM ? rsqrtf(ss / n_in + eps) : 1.0f;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (; row < rows; row += nwarps) {
        const bool more = row + nwarps < rows;
        if (more) load(wn, row + nwarps);
        float acc = 0;
#pragma unroll
        for (int u = 0; u < CPL; u++) {
            if (lane + 32 * u >= nv) break;
            float wf[N];
            Vec16<W>::unpack(w[u], wf);
            if constexpr (XS) {
                const float4 *xp = (const float4 *)(xsm + (size_t)(lane + 32 * u) * N);
#pragma unroll
                for (int i = 0; i < N; i += 4) {
                    const float4 t = xp[i / 4];
                    acc = fmaf(wf[i], t.x, acc), acc = fmaf(wf[i + 1], t.y, acc);
                    acc = fmaf(wf[i + 2], t.z, acc), acc = fmaf(wf[i + 3], t.w, acc);
                }
            } else {
#pragma unroll
                for (int i = 0; i < N; i++) acc = fmaf(wf[i], xf[u][i], acc);
            }
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (NORM) acc *= inv;
        const float out = acc + (b ? b[row] : 0.0f) + (accumulate ? y[row] : 0.0f);
        if (lane == 0) y[row] = out;
        if (ARGMAX) argmax_pair(best, bi, out, row);
#pragma unroll
        for (int u = 0; u < CPL; u++) w[u] = wn[u];
    }
    if constexpr (ARGMAX) argmax_blocks_finish(best, bi, am);
}

// Which dense GEMVs run the row loop (g_gemvf_rows), of those that need no SwiGLU and whose rows
// fit one round of 8 chunks a lane (bf16 rows up to 2048, fp32 up to 1024) or, staged in shared
// memory (XS), of 16 (bf16 up to 4096, fp32 up to 2048): 0 (auto) the 8-chunk ones whose
// one-row-a-warp grid would be more than 8 times what the GPU holds at once (the lm_heads of
// Qwen3-0.6B, Llama-3.2-1B and, with x in shared memory, Llama-3.1-8B: its step 4.22 -> 4.17 ms on
// the H200), 1 none, 2 all of them, 3 as auto without the 16-chunk rows (the 8B's lm_head as
// k_gemv_fused then).
static int g_gemvf_rows = 0;
// The current device's SM count, asked once (the launchers' grid rules).
static int fused_sms() {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    return sms;
}
// am != NULL: with the argmax (ARGMAX), on at most 1024 blocks (the size of its pv / pi arrays).
template <class W, bool NORM, int CPL, bool XS = false>
static bool gemv_rows_try(int pdl, cudaStream_t s, const W *Wm, const float *x, const float *nw, float eps,
                          const float *b, float *y, int rows, int n_in, int accumulate, const ArgmaxOut *am) {
    const size_t smem = XS ? (size_t)n_in * sizeof(float) : 0;
    if (g_gemvf_rows == 1 || (XS && g_gemvf_rows == 3) || smem > 48 * 1024) return false;
    static size_t per_smem = (size_t)-1;  // blocks an SM holds with per_smem bytes (asked once per size)
    static int per = 0;
    if (per_smem != smem) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_gemv_rows<W, NORM, CPL, true, XS>,
                                                                 GEMVF_WARPS * 32, smem));
        per_smem = smem;
    }
    const int cap = fused_sms() * (per > 0 ? per : 1);  // blocks resident on the whole GPU at once
    const int blocks = (rows + GEMVF_WARPS - 1) / GEMVF_WARPS;
    if (g_gemvf_rows != 2 && blocks <= 8 * cap) return false;
    if (am)
        pdl_launch(pdl, k_gemv_rows<W, NORM, CPL, true, XS>, dim3(cap < 1024 ? cap : 1024), dim3(GEMVF_WARPS * 32), smem,
                   s, Wm, x, nw, eps, b, y, rows, n_in, accumulate, *am);
    else
        pdl_launch(pdl, k_gemv_rows<W, NORM, CPL, false, XS>, dim3(cap), dim3(GEMVF_WARPS * 32), smem, s, Wm, x, nw, eps,
                   b, y, rows, n_in, accumulate, ArgmaxOut{});
    return true;
}

// Launch k_gemv_fused for rows x n_in: TAIL only where a long row ends in a partial round (the
// code for it, even unused, costs the full rounds' loop: the Llama-3.1-8B step took 4.83 ms with it
// and 4.43 without, while Qwen3-0.6B's down projection, 3072 = 1.5 rounds, wants it).
// The split KS (g_gemvf_split: 0 chooses, 1, 2 or 4 forced): 2 where 8-row blocks would be fewer
// than two per SM and each part still gets a chunk per lane, else 1. The default is 0 (choose).
static int g_gemvf_split = 0;
// 1 (the default): rows of at most 4 chunks a lane run the U = 4 instance; 0: every row U = GEMVF_U
static int g_gemvf_short = 1;
static inline int gemvf_split_for(int rows, int nv) {
    const int sms = fused_sms();
    int ks = g_gemvf_split;
    if (ks == 0) ks = (rows + GEMVF_WARPS - 1) / GEMVF_WARPS < 2 * sms && nv >= 2 * 32 ? 2 : 1;
    while (ks > 1 && nv < ks * 32) ks /= 2;  // every part at least a chunk per lane (and vectorized rows)
    return ks;
}
// The row loop where gemv_rows_try takes it (then 1), else 0 (nothing launched).
template <class W, bool NORM>
static int gemv_rows_launch(int pdl, cudaStream_t s, const W *Wm, const float *x, const float *nw, float eps,
                            const float *b, float *y, int rows, int n_in, int accumulate, const ArgmaxOut *am) {
    const int nv = n_in % Vec16<W>::N ? 0 : n_in / Vec16<W>::N;
    constexpr int C16 = 16, C8 = 8, C4 = 4;
    if (nv && nv <= 32 * C4) return gemv_rows_try<W, NORM, C4>(pdl, s, Wm, x, nw, eps, b, y, rows, n_in, accumulate, am);
    if (nv > 32 * C4 && nv <= 32 * C8)
        return gemv_rows_try<W, NORM, C8>(pdl, s, Wm, x, nw, eps, b, y, rows, n_in, accumulate, am);
    if (nv > 32 * C8 && nv <= 32 * C16)
        return gemv_rows_try<W, NORM, C16, true>(pdl, s, Wm, x, nw, eps, b, y, rows, n_in, accumulate, am);
    return 0;
}
template <class W, bool NORM, bool SWIGLU>
static void gemvf_launch(int pdl, cudaStream_t s, const W *Wm, const float *x, const float *nw, float eps,
                         const float *b, float *y, int rows, int n_in, int accumulate, int pair) {
    const int nv = n_in % Vec16<W>::N ? 0 : n_in / Vec16<W>::N, round = 32 * GEMVF_U;
    if constexpr (!SWIGLU) {  // many short rows: the row loop
        if (gemv_rows_launch<W, NORM>(pdl, s, Wm, x, nw, eps, b, y, rows, n_in, accumulate, NULL)) return;
    }
    const int ks = gemvf_split_for(rows, nv);
    const bool u4 = g_gemvf_short && nv && nv <= 32 * ks * 4;  // at most 4 chunks a lane: the U = 4 instance
    const dim3 block(GEMVF_WARPS * 32);
#define GEMVF_LAUNCH(TAIL, KS, U)                                                                                          \
    pdl_launch(pdl, k_gemv_fused<W, NORM, SWIGLU, TAIL, KS, U>, grid, block, 0, s, Wm, x, nw, eps, b, y, rows, n_in,     \
               accumulate, pair)
    if (ks > 1) {  // the split instances are TAIL = false: a long row's tail goes chunk by chunk
        const dim3 grid((rows * ks + GEMVF_WARPS - 1) / GEMVF_WARPS);
        if (ks == 2 && u4) GEMVF_LAUNCH(false, 2, 4);
        else if (ks == 2) GEMVF_LAUNCH(false, 2, GEMVF_U);
        else if (u4) GEMVF_LAUNCH(false, 4, 4);
        else GEMVF_LAUNCH(false, 4, GEMVF_U);
        return;
    }
    const dim3 grid((rows + GEMVF_WARPS - 1) / GEMVF_WARPS);
    if (u4) GEMVF_LAUNCH(false, 1, 4);
    else if (nv > round && nv % round) GEMVF_LAUNCH(true, 1, GEMVF_U);
    else GEMVF_LAUNCH(false, 1, GEMVF_U);
#undef GEMVF_LAUNCH
}

// ---------------------------------------------------------------- one batch-1 projection
// y [+]= W rmsnorm(x, nw) (+ b) when nw != NULL, else y [+]= W in (+ b), for one token (x: the
// residual, fp32, n_in): a dense W by gemvf_launch (the norm folded in); a quantized one (step06) by
// its GEMV, the norm folded in where its rung has one (qlinear_gpu_gemv_fused), else a k_rmsnorm
// into xn (n_in floats) first. swiglu (gate|up, nw required): y (rows) = silu(W[:rows] x') *
// W[rows:] x'; a quantized gate|up without a fused rung goes through gu (2 rows) and k_swiglu.
// Returns the kernels launched. Used by step03's fused decode step and step04's runner for a lone decode row.
static int fused_proj(int pdl, cudaStream_t s, StDtype dt, const GpuQProj *q, const void *W, const float *x,
                      const float *nw, float eps, const float *in, const float *b, float *y, int rows, int n_in,
                      int acc, int swiglu, float *xn, float *gu) {
    if (q->n == 0) {
        if (swiglu) {
            DISPATCH(dt, A, gemvf_launch<A, true, true>(pdl, s, (const A *)W, x, nw, eps, (const float *)NULL, y, rows,
                                                        n_in, 0, rows));
        } else if (nw) {
            DISPATCH(dt, A, gemvf_launch<A, true, false>(pdl, s, (const A *)W, x, nw, eps, b, y, rows, n_in, acc, 0));
        } else {
            DISPATCH(dt, A, gemvf_launch<A, false, false>(pdl, s, (const A *)W, in, (const float *)NULL, eps, b, y,
                                                          rows, n_in, acc, 0));
        }
        return 1;
    }
    if (q->n == 1) {  // step06's one-kernel GEMV, with the norm (and SwiGLU) folded in, where its rung has one
        const int r = qlinear_gpu_gemv_fused(q->part[0], nw ? x : in, nw, eps, b, y, acc, swiglu ? rows : 0, pdl, s);
        if (r < 0) die("qlinear_gpu_gemv_fused failed (%s)", qlinear_gpu_describe(q->part[0]));
        if (r == 1) return 1;
    }
    int launches = q->n ? q->n : 1;
    if (nw) {
        k_rmsnorm<float><<<1, 1024, 0, s>>>(x, nw, n_in, 1, n_in, eps, xn);
        CUDA_CHECK_LAST();
        in = xn;
        launches++;
    }
    if (swiglu) {
        proj_gemv(dt, q, W, in, NULL, gu, 2 * rows, n_in, 0, s);
        k_swiglu<float><<<(rows + 255) / 256, 256, 0, s>>>(gu, y, 1, rows);
        CUDA_CHECK_LAST();
        return launches + 1;
    }
    proj_gemv(dt, q, W, in, b, y, rows, n_in, acc, s);
    return launches;
}

// ---------------------------------------------------------------- argmax over many blocks
// The step's last kernel (step03's k_argmax_advance is one block of 1024 threads scanning the whole
// vocabulary: 148 dependent loads per thread for 151936 logits, tens of microseconds). Here block b
// finds the argmax of its slice, writes (value, index) to pv[b], pi[b]; the last block to finish (a
// counter, reset by it; argmax_blocks_finish) reduces those and advances: *d_tok = the argmax, out_ids[*d_pos] = it,
// *d_pos += 1. Ties go to the lower index (argmax_pair, block_argmax: decode_gpu.cuh), so the
// result is exact and the same as step03's. Grid: any number of blocks <= 1024, 1024 threads.
static __global__ void __launch_bounds__(1024)
    k_argmax_fused(const float *logits, int vocab, float *pv, int *pi, int *count, int *d_tok, int *d_pos,
                   int *out_ids) {
    pdl_trigger();
    pdl_wait();
    const int per = (vocab + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(vocab, lo + per);
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) argmax_pair(best, bi, logits[i], i);
    argmax_blocks_finish(best, bi, ArgmaxOut{pv, pi, count, d_tok, d_pos, out_ids});
}

// ---------------------------------------------------------------- RoPE table
// cos_t, sin_t (max_seq, hd/2): the values k_rope_append computes per step (the fp32 angle
// pos * inv_freq, its cos and sin in double, rounded to fp32), once at setup.
static __global__ void k_rope_table(const float *inv_freq, int max_seq, int half, float *cos_t, float *sin_t) {
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

// The end of a fused attention block that wrote its split's partials (part_o / part_ml): the last
// of the nact blocks of kv head kvh to get here (counted in count[kvh], reset for the next layer or
// step) merges the splits into att; a lone split (nact == 1) merges its own.
__device__ inline void attn_merge_splits(int *count, int kvh, int nact, const float *part_o, const float *part_ml,
                                         int nsplit, int g, int len, int hd, float *att) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = nact == 1 || atomicAdd(&count[kvh], 1) == nact - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0 && nact > 1) count[kvh] = 0;
    attn_combine_heads<float>(part_o + (size_t)kvh * g * nsplit * hd, part_ml + (size_t)kvh * g * nsplit * 2, nsplit, g,
                              len, hd, att + (size_t)kvh * g * hd);
}
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
    attn_merge_splits(count, kvh, nact, part_o, part_ml, nsplit, g, len, hd, att);
}

// ---------------------------------------------------------------- attention v2: a short chain
// k_attn_fused above runs ATTN_CHUNK = 128 threads (4 warps, one per scheduler of the SM) on one
// (kv head, split) block. At a short context that is 8 blocks on 8 SMs for Qwen3-0.6B, and Nsight
// Compute reads 0.10 instructions issued per scheduler per cycle: each warp's ~2000 instructions
// wait ~10 cycles each on the one before (fixed-latency arithmetic, shuffles, shared memory, the
// instruction cache), with no other warp to switch to. Three changes shorten that chain:
//   - more warps on the same keys: NW = 16 warps (8 where the partial sums would not fit in 48 KB
//     of shared memory), so a warp holds 128 / NW / (32 / LPR) rows instead of 16 and each
//     scheduler has 4 warps to interleave;
//   - only the rounds that hold keys are computed (at position 10 one round of NW * 32 / LPR rows,
//     not all 128), and the new key's row comes from shared memory, not from the cache it was just
//     written to;
//   - the q/k/v heads are normed and rotated by one warp each in parallel (k_attn_fused: warp 0
//     does q head 0 and then k), with the cos / sin of the position loaded before the PDL wait.
// The result is the same function (softmax(q K^T * scale) V of step04's core, with the same
// per-row dot products and softmax); the P V sums run over other lanes in another order, so the
// two versions agree to fp32 rounding, not bit for bit.
template <class C, int LPR, int G> struct Attn2Shape {
    static constexpr int N = Vec16<C>::N, HD = LPR * N, NW = G * HD <= 512 ? 16 : 8, RPW = 32 / LPR,
                         RPI = NW * RPW, NIT = (ATTN_CHUNK + RPI - 1) / RPI, U = NIT < (G <= 4 ? 8 : 4) ? NIT : (G <= 4 ? 8 : 4);
};
// dynamic shared memory of k_attn_fused2: qs (g, hd) | knew, vnew (hd each) | ps (g, ATTN_CHUNK) | red (NW, g, hd)
static inline size_t attn2_smem_bytes(int g, int hd, int nw) {
    return (size_t)(g * hd + 2 * hd + g * ATTN_CHUNK + nw * g * hd) * sizeof(float);
}

// PAGED (step04's runner over step05's block pool, a lone decode row): key p of the sequence is
// cache row bt[p / bsz] * bsz + p % bsz, the new key goes to row *d_slot, and cos_t / sin_t are the
// step's own row (the runner's per-row table) instead of a table by position.
template <class C, int LPR, int G, bool PAGED = false>
__global__ void __launch_bounds__(Attn2Shape<C, LPR, G>::NW * 32, 1)
    k_attn_fused2(const float *qkv, const float *q_norm, const float *k_norm, const float *cos_t, const float *sin_t,
                  const int *d_pos, int H, int KV, int hd, float eps, float scale, C *kc, C *vc, float *part_o,
                  float *part_ml, int *count, float *att, const int *bt, int bsz, const int *d_slot) {
    using S = Attn2Shape<C, LPR, G>;
    constexpr int N = S::N, HD = S::HD, NW = S::NW, RPW = S::RPW, RPI = S::RPI, NIT = S::NIT, U = S::U;
    constexpr int HALF = HD / 2, NP = (HALF + 31) / 32, NE = (HD + 31) / 32;  // pairs and elements per lane
    pdl_trigger();
    extern __shared__ float sm[];
    const int kvh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, g = H / KV, t = threadIdx.x;
    const int warp = t / 32, lane = t % 32, c = lane % LPR, sub = lane / LPR;
    (void)hd;  // = HD (the launch checks)
    const int pos = *d_pos, len = pos + 1;
    if (split * ATTN_CHUNK >= len) return;
    const int nact = (len + ATTN_CHUNK - 1) / ATTN_CHUNK, last_split = split == nact - 1;
    const int jn = min(ATTN_CHUNK, len - split * ATTN_CHUNK), jold = last_split ? jn - 1 : jn;  // jold: rows cached
    const size_t kd = (size_t)KV * HD, r0 = (PAGED ? 0 : (size_t)split * ATTN_CHUNK * kd) + (size_t)kvh * HD + c * N;
    // row j of this split's keys, in elements from r0 (PAGED: through the block table)
    auto krow = [&](int j) -> size_t {
        if constexpr (PAGED) {
            const int p = split * ATTN_CHUNK + j;
            return (size_t)(bt[p / bsz] * bsz + p % bsz) * kd;
        } else {
            return (size_t)j * kd;
        }
    };
    const size_t new_row = (size_t)(PAGED ? *d_slot : pos) * kd + (size_t)kvh * HD;  // where key pos goes
    const float *cos_p = cos_t + (PAGED ? 0 : (size_t)pos * HALF), *sin_p = sin_t + (PAGED ? 0 : (size_t)pos * HALF);
    float *qs = sm, *knew = qs + g * HD, *vnew = knew + HD, *ps = vnew + HD, *red = ps + g * ATTN_CHUNK;
    // before the wait: the first U rounds of cached K and V rows, and this position's cos / sin
    uint4 kr[U], vr[U];
#pragma unroll
    for (int it = 0; it < U; it++) {
        const int j = it * RPI + warp * RPW + sub;
        if (j < jold) kr[it] = *(const uint4 *)(kc + r0 + krow(j)), vr[it] = *(const uint4 *)(vc + r0 + krow(j));
    }
    float cs[NP], sn[NP];
#pragma unroll
    for (int r = 0; r < NP; r++) {
        const int i = lane + 32 * r;
        cs[r] = i < HALF ? __ldg(cos_p + i) : 0.0f;
        sn[r] = i < HALF ? __ldg(sin_p + i) : 0.0f;
    }
    pdl_wait();
    // ---- one warp per item: the g query heads, then (the block holding key pos) its k and v
    const int nitems = g + (last_split ? 2 : 0);
    for (int item = warp; item < nitems; item += NW) {
        const int kind = item < g ? 0 : item - g + 1;  // 0 q, 1 k, 2 v
        const float *x = qkv + (size_t)(kind == 0 ? kvh * g + item : kind == 1 ? H + kvh : H + KV + kvh) * HD;
        const float *nw = kind == 0 ? q_norm : kind == 1 ? k_norm : NULL;
        float xv[NE], wv[NE];
#pragma unroll
        for (int k = 0; k < NE; k++) {
            const int e = lane + 32 * k;
            xv[k] = e < HD ? x[e] : 0.0f;
            wv[k] = nw && e < HD ? __ldg(nw + e) : 1.0f;
        }
        if (kind == 2) {  // v: into the cache as it is
            const size_t row = new_row;
#pragma unroll
            for (int k = 0; k < NE; k++) {
                const int e = lane + 32 * k;
                if (e < HD) {
                    const C v = fromf<C>(xv[k]);
                    vc[row + e] = v, vnew[e] = tof(v);
                }
            }
            continue;
        }
        float inv = 1.0f;
        if (nw) {  // head_rms_inv's sum, in its order
            float ss = 0;
#pragma unroll
            for (int k = 0; k < NE; k++) ss += xv[k] * xv[k];
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            inv = rsqrtf(ss / HD + eps);
        }
        float *scr = red + (size_t)warp * HD;  // the normed head, for the pairs (i, i + HALF)
#pragma unroll
        for (int k = 0; k < NE; k++) {
            const int e = lane + 32 * k;
            if (e < HD) scr[e] = nw ? xv[k] * inv * wv[k] : xv[k];
        }
        __syncwarp();
        float *out = kind == 0 ? qs + item * HD : knew;
#pragma unroll
        for (int r = 0; r < NP; r++) {
            const int i = lane + 32 * r;
            if (i >= HALF) continue;
            const float x1 = scr[i], x2 = scr[i + HALF];
            const float o1 = x1 * cs[r] - x2 * sn[r], o2 = x2 * cs[r] + x1 * sn[r];
            if (kind == 0) {
                out[i] = o1, out[i + HALF] = o2;
            } else {  // k: the cache row, and its rounded values for this block's own scores
                const size_t row = new_row;
                const C k1 = fromf<C>(o1), k2 = fromf<C>(o2);
                kc[row + i] = k1, kc[row + i + HALF] = k2;
                out[i] = tof(k1), out[i + HALF] = tof(k2);
            }
        }
        __syncwarp();  // scr is reused by the warp's next item
    }
    __syncthreads();
    // ---- scores of the rounds that hold keys: row j = it * RPI + warp * RPW + sub
    float qf[G][N];
#pragma unroll
    for (int hh = 0; hh < G; hh++)
#pragma unroll
        for (int i = 0; i < N; i++) qf[hh][i] = hh < g ? qs[hh * HD + c * N + i] * scale : 0.0f;
#pragma unroll
    for (int it = 0; it < NIT; it++) {
        if (it * RPI >= jn) break;  // the same for the whole block
        const int j = it * RPI + warp * RPW + sub;
        float kf[N];
        if (j < jold) {
            uint4 u;
            if (it < U) u = kr[it];
            else u = *(const uint4 *)(kc + r0 + krow(j));
            Vec16<C>::unpack(u, kf);
        } else {
#pragma unroll
            for (int i = 0; i < N; i++) kf[i] = j < jn ? knew[c * N + i] : 0.0f;
        }
        float dot[G];
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
    __syncthreads();
    __shared__ float m_s[G], l_s[G];
    attn_block_softmax(ps, jn, g, m_s, l_s, NW);
    __syncthreads();
    // ---- P V over the same rows, then the NW warps' sums through shared memory
    float acc[G][N];
#pragma unroll
    for (int hh = 0; hh < G; hh++)
#pragma unroll
        for (int i = 0; i < N; i++) acc[hh][i] = 0;
#pragma unroll
    for (int it = 0; it < NIT; it++) {
        if (it * RPI >= jn) break;
        const int j = it * RPI + warp * RPW + sub;
        if (j >= jn) continue;
        float vf[N];
        if (j < jold) {
            uint4 u;
            if (it < U) u = vr[it];
            else u = *(const uint4 *)(vc + r0 + krow(j));
            Vec16<C>::unpack(u, vf);
        } else {
#pragma unroll
            for (int i = 0; i < N; i++) vf[i] = vnew[c * N + i];
        }
#pragma unroll
        for (int hh = 0; hh < G; hh++)
            if (hh < g) {
                const float p = ps[hh * ATTN_CHUNK + j];
#pragma unroll
                for (int i = 0; i < N; i++) acc[hh][i] = fmaf(p, vf[i], acc[hh][i]);
            }
    }
    attn_vec_write<LPR, G, N, NW>(acc, g, HD, red, m_s, l_s, part_o, part_ml, kvh, split, nsplit,
                                  nact == 1 ? att + (size_t)kvh * g * HD : NULL);  // one split: the normalized heads
    if (nact == 1) return;
    attn_merge_splits(count, kvh, nact, part_o, part_ml, nsplit, g, len, HD, att);
}

// ---------------------------------------------------------------- attention v4: the tensor cores
// k_attn_fused2 at the Llama-3.1-8B shape (head_dim 128, 4 query heads a kv head) runs about 585
// instructions a warp after its wait, at ~12 cycles each: the scores are dot products over 16 lanes
// (a shuffle tree per head and round), and P V leaves 16 warps with partial sums of every output
// that go through shared memory and are added by one more pass. Version 4 computes the same
// softmax(q K^T * scale) V with mma.sync (m16n8k16, fp32 sums; sm_80+) and no partial sums:
//   - scores: A = the g query heads (rows, zero-padded to 16), B = 8 keys of the block (columns);
//     warp w takes keys 8w.. and 8(w + 8).., whose K rows it loads into its B fragments before the
//     PDL wait (they are earlier steps' rows). The head dimension is taken in a permuted order, the
//     same for q and K, so that a lane's B fragments are whole 16-byte loads of its key's row.
//   - P V: A = the probabilities (rows = heads), B = V (keys x head dims), read by ldmatrix.trans from
//     the block's V rows, copied to shared memory (cp.async) before the wait; warp w owns output
//     columns 8w.. (and 8(w + 8).. at head_dim 128), so each output is one warp's accumulator.
//   - precision: q * scale and p are split into two bf16 values (hi + lo, ~16 bits of mantissa
//     together) and each product is two mmas, so the only rounding beyond fp32 sums is that of the
//     cached K and V, as in version 2 (which sums over lanes in another order: the two agree to
//     fp32 rounding, not bit for bit).
// The new key's row and V row are this block's own (RoPE'd and rounded like the cache) and come
// from shared memory. Taken for a bf16 cache, head_dim 64 or 128, g <= 8, on sm_80+ (else v2).
#define ATTN4_WARPS 8
template <int HD> struct Attn4Shape {
    static constexpr int VS = HD + 8;              // V row stride in shared memory (elements): ldmatrix without bank conflicts
    static constexpr int NT = ATTN_CHUNK / 8 / ATTN4_WARPS;  // score tiles (8 keys) a warp
    static constexpr int DT = HD / 8 / ATTN4_WARPS;          // output tiles (8 head dims) a warp
    static constexpr int R = HD / 32;                        // 16-byte chunks of a K row a lane holds (2 k-steps each)
};
// dynamic shared memory: vs (CHUNK, VS) | qh, ql (G, HD) | kn (HD) of bf16, then ps (G, CHUNK) fp32, ph, pl (G, CHUNK) of bf16
template <int HD, int G> static inline size_t attn4_smem_bytes() {
    using S = Attn4Shape<HD>;
    return (size_t)(ATTN_CHUNK * S::VS + 2 * G * HD + HD) * 2 + (size_t)G * ATTN_CHUNK * 4 + (size_t)2 * G * ATTN_CHUNK * 2;
}
// d += A B for m16n8k16 bf16 with A's rows 8..15 zero: a0 = A (row g, k 2t..2t+1), a2 = (row g, k 2t+8..)
static __device__ __forceinline__ void mma_bf16_top8(float (&d)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
#endif
}
static __device__ __forceinline__ unsigned u4w(const uint4 &u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }

template <int HD, int G>
__global__ void __launch_bounds__(ATTN4_WARPS * 32, 1)
    k_attn_mma(const float *qkv, const float *q_norm, const float *k_norm, const float *cos_t, const float *sin_t,
               const int *d_pos, int H, int KV, float eps, float scale, __nv_bfloat16 *kc, __nv_bfloat16 *vc,
               float *part_o, float *part_ml, int *count, float *att) {
    using C = __nv_bfloat16;
    using S = Attn4Shape<HD>;
    static_assert(HD % 64 == 0 && HD / 8 >= ATTN4_WARPS && G <= 8, "k_attn_mma: head_dim 64 or 128, g <= 8");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int VS = S::VS, NT = S::NT, DT = S::DT, R = S::R, HALF = HD / 2, NE = HD / 32, NP = HALF / 32;
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char sm4[];
    C *vs = (C *)sm4, *qh = vs + ATTN_CHUNK * VS, *ql = qh + G * HD, *kn = ql + G * HD;
    float *ps = (float *)(kn + HD);
    C *ph = (C *)(ps + G * ATTN_CHUNK), *pl = ph + G * ATTN_CHUNK;
    __shared__ float m_s[G], l_s[G];
    const int kvh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, g = H / KV, t = threadIdx.x;
    const int warp = t / 32, lane = t % 32, lg = lane / 4, lt = lane % 4;
    const int pos = *d_pos, len = pos + 1;
    if (split * ATTN_CHUNK >= len) return;
    const int nact = (len + ATTN_CHUNK - 1) / ATTN_CHUNK, last_split = split == nact - 1;
    const int jn = min(ATTN_CHUNK, len - split * ATTN_CHUNK), jold = last_split ? jn - 1 : jn;  // jold: rows cached
    const int jn32 = (jn + 31) & ~31;  // P V runs over pairs of 16-key steps: rows jn .. jn32 - 1 are zeros
    const size_t kd = (size_t)KV * HD, r0 = (size_t)split * ATTN_CHUNK * kd + (size_t)kvh * HD;
    const size_t new_row = (size_t)pos * kd + (size_t)kvh * HD;
    // ---- before the wait: this warp's K fragments, the block's V rows, this position's cos / sin
    uint4 kf[NT][R];
#pragma unroll
    for (int i = 0; i < NT; i++) {
        const int j = (warp + ATTN4_WARPS * i) * 8 + lg;
#pragma unroll
        for (int r = 0; r < R; r++)
            kf[i][r] = j < jold ? *(const uint4 *)(kc + r0 + (size_t)j * kd + 8 * lt + 32 * r) : make_uint4(0, 0, 0, 0);
    }
    for (int c = t; c < jn32 * (HD / 8); c += ATTN4_WARPS * 32) {
        const int j = c / (HD / 8), e = c % (HD / 8) * 8;
        C *dst = vs + j * VS + e;
        if (j < jold) {
            const unsigned sa = (unsigned)__cvta_generic_to_shared(dst);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(vc + r0 + (size_t)j * kd + e) : "memory");
        } else if (j >= jn) {
            *(uint4 *)dst = make_uint4(0, 0, 0, 0);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    const float *cos_p = cos_t + (size_t)pos * HALF, *sin_p = sin_t + (size_t)pos * HALF;
    float cs[NP], sn[NP];
#pragma unroll
    for (int r = 0; r < NP; r++) cs[r] = __ldg(cos_p + lane + 32 * r), sn[r] = __ldg(sin_p + lane + 32 * r);
    pdl_wait();
    // ---- one warp per item: the g query heads (normed, rotated, scaled, split hi + lo), then (the
    // block holding key pos) its k and v: into the cache and into shared memory
    const int nitems = g + (last_split ? 2 : 0);
    for (int item = warp; item < nitems; item += ATTN4_WARPS) {
        const int kind = item < g ? 0 : item - g + 1;  // 0 q, 1 k, 2 v
        const float *x = qkv + (size_t)(kind == 0 ? kvh * g + item : kind == 1 ? H + kvh : H + KV + kvh) * HD;
        const float *nw = kind == 0 ? q_norm : kind == 1 ? k_norm : NULL;
        float xv[NE];
#pragma unroll
        for (int k = 0; k < NE; k++) xv[k] = x[lane + 32 * k];
        if (kind == 2) {
#pragma unroll
            for (int k = 0; k < NE; k++) {
                const C v = fromf<C>(xv[k]);
                vc[new_row + lane + 32 * k] = v, vs[jold * VS + lane + 32 * k] = v;
            }
            continue;
        }
        if (nw) {  // head_rms_inv's sum, in its order
            float ss = 0;
#pragma unroll
            for (int k = 0; k < NE; k++) ss += xv[k] * xv[k];
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float inv = rsqrtf(ss / HD + eps);
#pragma unroll
            for (int k = 0; k < NE; k++) xv[k] = xv[k] * inv * __ldg(nw + lane + 32 * k);
        }
#pragma unroll
        for (int r = 0; r < NP; r++) {  // the pair (i, i + HALF), i = lane + 32 r: both in this lane
            const float x1 = xv[r], x2 = xv[r + NP];
            const float o1 = x1 * cs[r] - x2 * sn[r], o2 = x2 * cs[r] + x1 * sn[r];
            const int i = lane + 32 * r;
            if (kind == 0) {
                const C h1 = fromf<C>(o1 * scale), h2 = fromf<C>(o2 * scale);
                qh[item * HD + i] = h1, qh[item * HD + i + HALF] = h2;
                ql[item * HD + i] = fromf<C>(o1 * scale - tof(h1)), ql[item * HD + i + HALF] = fromf<C>(o2 * scale - tof(h2));
            } else {
                const C k1 = fromf<C>(o1), k2 = fromf<C>(o2);
                kc[new_row + i] = k1, kc[new_row + i + HALF] = k2;
                kn[i] = k1, kn[i + HALF] = k2;
            }
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    // ---- scores: tile i of this warp = keys (warp + 8 i) * 8 ..; k-step 2 r + h of the head dims is,
    // in lane (lg, lt), dims 8 lt + 32 r + 4 h + {0, 1} (the mma's k 2 lt, 2 lt + 1) and + {2, 3}
    // (k 2 lt + 8, + 9): the same for the A rows (q) and the B columns (K)
#pragma unroll
    for (int i = 0; i < NT; i++)
        if (last_split && (warp + ATTN4_WARPS * i) * 8 + lg == jold)
#pragma unroll
            for (int r = 0; r < R; r++) kf[i][r] = *(const uint4 *)(kn + 8 * lt + 32 * r);
    float sh[NT][4], sl[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) sh[i][e] = sl[i][e] = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint4 qa = make_uint4(0, 0, 0, 0), qb = make_uint4(0, 0, 0, 0);
        if (lg < g) qa = *(const uint4 *)(qh + lg * HD + 8 * lt + 32 * r), qb = *(const uint4 *)(ql + lg * HD + 8 * lt + 32 * r);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < NT; i++)
                if ((warp + ATTN4_WARPS * i) * 8 < jn) {
                    mma_bf16_top8(sh[i], u4w(qa, 2 * h), u4w(qa, 2 * h + 1), u4w(kf[i][r], 2 * h), u4w(kf[i][r], 2 * h + 1));
                    mma_bf16_top8(sl[i], u4w(qb, 2 * h), u4w(qb, 2 * h + 1), u4w(kf[i][r], 2 * h), u4w(kf[i][r], 2 * h + 1));
                }
    }
    if (lg < g)
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const int j = (warp + ATTN4_WARPS * i) * 8 + 2 * lt;
            if (j < jn) *(float2 *)(ps + lg * ATTN_CHUNK + j) = make_float2(sh[i][0] + sl[i][0], sh[i][1] + sl[i][1]);
        }
    __syncthreads();
    // ---- softmax, one warp per head: m, p = exp(s - m) as hi + lo (zeros from jn to jn32), l (attn_block_softmax's
    // passes, writing the split form and the zero tail P V reads in the same pass)
    for (int hh = warp; hh < g; hh += ATTN4_WARPS) {
        float m = -INFINITY;
        for (int j = lane; j < jn; j += 32) m = fmaxf(m, ps[hh * ATTN_CHUNK + j]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0;
        for (int j = lane; j < jn32; j += 32) {
            const float p = j < jn ? expf(ps[hh * ATTN_CHUNK + j] - m) : 0.0f;
            const C hp = fromf<C>(p);
            ph[hh * ATTN_CHUNK + j] = hp, pl[hh * ATTN_CHUNK + j] = fromf<C>(p - tof(hp));
            l += p;
        }
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) m_s[hh] = m, l_s[hh] = l;
    }
    __syncthreads();
    // ---- P V: k-step s covers keys 16 s ..: in lane (lg, lt) the mma's k 2 lt, 2 lt + 1 are keys
    // 16 s + 4 lt + {0, 1} and k 2 lt + 8, + 9 keys 16 s + 4 lt + {2, 3}; ldmatrix.trans gives B in
    // that order when lane L points at row 16 (2 p + L / 16) + 4 (L % 8 / 2) + L % 2 + 2 (L / 8 % 2)
    float oh[DT][4], ol[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) oh[i][e] = ol[i][e] = 0.0f;
    const int lrow = 16 * (lane / 16) + 4 * (lane % 8 / 2) + lane % 2 + 2 * (lane / 8 % 2);
    for (int p2 = 0; p2 < jn32 / 32; p2++) {
        uint2 pa[2] = {make_uint2(0, 0), make_uint2(0, 0)}, pb[2] = {make_uint2(0, 0), make_uint2(0, 0)};
        if (lg < g)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 32 * p2 + 16 * h + 4 * lt;
                pa[h] = *(const uint2 *)(ph + lg * ATTN_CHUNK + j), pb[h] = *(const uint2 *)(pl + lg * ATTN_CHUNK + j);
            }
#pragma unroll
        for (int i = 0; i < DT; i++) {
            const int d0 = (warp + ATTN4_WARPS * i) * 8;
            const unsigned sa = (unsigned)__cvta_generic_to_shared(vs + (32 * p2 + lrow) * VS + d0);
            unsigned b[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                         : "r"(sa));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mma_bf16_top8(oh[i], pa[h].x, pa[h].y, b[2 * h], b[2 * h + 1]);
                mma_bf16_top8(ol[i], pb[h].x, pb[h].y, b[2 * h], b[2 * h + 1]);
            }
        }
    }
    // ---- out: lane (lg < g) holds head lg's dims d0 + 2 lt, + 1 of each of its tiles
    if (lg < g)
#pragma unroll
        for (int i = 0; i < DT; i++) {
            const int d = (warp + ATTN4_WARPS * i) * 8 + 2 * lt, h = kvh * g + lg;
            const float o0 = oh[i][0] + ol[i][0], o1 = oh[i][1] + ol[i][1];
            if (nact == 1) {
                const float il = 1.0f / l_s[lg];
                *(float2 *)(att + (size_t)h * HD + d) = make_float2(o0 * il, o1 * il);
            } else {
                *(float2 *)(part_o + ((size_t)h * nsplit + split) * HD + d) = make_float2(o0, o1);
            }
        }
    if (nact == 1) return;
    if (t < g) {
        const int h = kvh * g + t;
        part_ml[((size_t)h * nsplit + split) * 2] = m_s[t];
        part_ml[((size_t)h * nsplit + split) * 2 + 1] = l_s[t];
    }
    attn_merge_splits(count, kvh, nact, part_o, part_ml, nsplit, g, len, HD, att);
#endif
}

// step04's runner, a lone decode row over step05's block pool: RoPE, the K/V write, the attention
// and the split combine in one kernel (k_attn_fused2, PAGED), instead of k_qkv_rows + paged decode.
// Grid (KV, nsplit): nsplit = ceil(max context / ATTN_CHUNK) (the splits past a row's keys return
// at once, so one graph serves every position); part_o / part_ml hold H * nsplit * hd and 2 H *
// nsplit floats, count KV ints (zero, and left zero). Taken for a 16-bit cache of head_dim 8 * 8 or
// 8 * 16 (LPR 8, 16) with its shared memory in 48 KB; false (nothing launched) otherwise.
template <class C>
static bool attn_fused2_paged(int pdl, cudaStream_t s, int nsplit, const float *qkv, const float *q_norm,
                              const float *k_norm, const float *cos_row, const float *sin_row, const int *d_pos,
                              const int *d_slot, const int *bt, int bsz, int H, int KV, int hd, float eps, C *kc, C *vc,
                              float *part_o, float *part_ml, int *count, float *att) {
    if constexpr (sizeof(C) != 2) {
        return false;
    } else {
        constexpr int N = Vec16<C>::N;
        const int g = KV > 0 && H % KV == 0 ? H / KV : 0, lpr = hd % N ? 0 : hd / N;
        if (g < 1 || g > ATTN_MAXG || (lpr != 8 && lpr != 16)) return false;
        const float scale = 1.0f / sqrtf((float)hd);
        bool ok = false;
        auto go = [&](auto lpr_c, auto g_c) {
            constexpr int P = decltype(lpr_c)::value, GG = decltype(g_c)::value;
            using S2 = Attn2Shape<C, P, GG>;
            const size_t smem = attn2_smem_bytes(g, hd, S2::NW);
            if (smem > 48 * 1024) return;
            pdl_launch(pdl, k_attn_fused2<C, P, GG, true>, dim3(KV, nsplit), dim3(S2::NW * 32), smem, s, qkv, q_norm,
                       k_norm, cos_row, sin_row, d_pos, H, KV, hd, eps, scale, kc, vc, part_o, part_ml, count, att, bt,
                       bsz, d_slot);
            ok = true;
        };
        auto by_g = [&](auto lpr_c) {
            if (g <= 1) go(lpr_c, std::integral_constant<int, 1>{});
            else if (g <= 2) go(lpr_c, std::integral_constant<int, 2>{});
            else if (g <= 4) go(lpr_c, std::integral_constant<int, 4>{});
            else go(lpr_c, std::integral_constant<int, ATTN_MAXG>{});
        };
        if (lpr == 8) by_g(std::integral_constant<int, 8>{});
        else by_g(std::integral_constant<int, 16>{});
        return ok;
    }
}
