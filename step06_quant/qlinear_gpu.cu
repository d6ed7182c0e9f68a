// qlinear_gpu.cu — step06's quantized linear layer on CUDA (contract: qlinear_gpu.h; the weight
// layout, built on the host at load: qlinear_pack.h).
//
// Why: at batch 1 (and up to a few dozen rows) a linear layer is bound by the bytes of its
// weights, so 4-bit weights should take ~1/4 of bf16's time and 8-bit ~1/2, if the kernels
// stream them as fast as bf16 and the dequantization hides under the loads.
//
// Kernels:
//   k_qgemv4 / k_qgemv8   the GEMV (and, for TB > 1 tokens, the fallback GEMM): INT4 tiles or
//       INT8 rows streamed with 16-byte __ldcs loads, U of them in flight per lane, dequantized
//       in registers, fp32 multiply-adds, one scale (and zero) per 32 columns.
//       INT4: a block of QV_WARPS warps owns one 16-row tile column; its warps take the 64-column
//       tiles in turn (warp w: tiles w, w + 8, ...), so each warp load is 512 contiguous bytes and
//       the block reads its rows front to back; a lane's 4 words hold rows n, n + 8 and 16
//       columns; the 4 lanes of a row and then the 8 warps are summed at the end.
//       Nibbles become numbers without integer-to-float conversions: (w & 0x000F000F) | 0x64006400
//       is the fp16 pair (1024 + q0, 1024 + q4), so q - z is one exact fp16 subtraction.
//       INT8: one warp per row, 16 weights per load; byte b of a word becomes the float 2^23 + q
//       by one byte permute (__byte_perm with 0x4B000000).
//       The ladder (QGEMV_VERSIONS, timed by qgemm_bench): v1_u4, v2_u8, v3_u2 loads in flight;
//       v4_r2, v5_r4w16, v6_r2w16: k_qgemv4r / k_qgemv8r, R tiles or rows per lane (x loaded once
//       for all of them), W warps per block; v7_tc_w8u2, v8_tc_w8u4, v9_tc_w16u2: k_qmma (below); v10_tc_xs, v11_tc_xs_r2: k_qmma with x staged in shared memory;
//       v12_tma .. v16_tma_ts64w16_zf, v17_tma_zf (v12 zero-folded): k_qtma (sm_90a, below), which qlinear_gpu_gemv_fused also runs
//       with the decode step's RMSNorm and SwiGLU folded in.
//       x is read through the read-only L1 path (__ldg): every block on an SM reads the same x,
//       so L1 serves it once per SM; staging it in each block's shared memory would re-read the
//       whole vector from L2 per block (256 blocks x 56 KB for a 14336-column layer).
//   k_qgemm4<X, MT>        the tensor-core GEMM for INT4 on sm_80+: 4 warps x 2 tile columns =
//       128 output rows per block, MT m16 tiles (up to 64 tokens) per pass, the K range split
//       over blocks (gridDim.y) when there are too few row blocks to fill the SMs (then the
//       partial sums go to Y with atomicAdd after Y *= beta). Per 128-column stage: X rows into
//       shared memory (ldmatrix.x4 gives the A fragments), each lane's weight words arrive in
//       registers one stage ahead, and one word is dequantized straight into two B fragments:
//       the 4 masked pairs are (1024 + q) fp16 or (128 + q) bf16, minus (1024 + z) exactly (see
//       dequant4: bf16 needs a shift per pair, fp16 one per two), times
//       the group's scale (the scale and that product each rounded to the X type: q - z itself
//       is exact), then mma.sync.m16n8k16 with fp32 accumulation.
//   fallback GEMM (INT8 weights, and INT4 before sm_80): X gathered to fp32, then the GEMV
//       kernels over TB = 8 tokens at a time (each weight load feeds 8 tokens).
//   k_gather              x or X permuted (act-order) and padded to the packed width, into a
//       scratch the layer owns: made at creation for the GEMV (fp32, kp), grown on the first GEMM
//       that needs more (do the largest such call once before capturing a CUDA graph); used only
//       when the columns are permuted or padded, or the input is not aligned for vector loads.
//   k_qnaive_*            groups that are not multiples of 32 columns: the QWeight as stored,
//       dequantized one weight at a time (correct, slow).
// A layer must not be used from two streams at once (the scratch is shared).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>  // std::integral_constant

#include "cuda_check.h"
#include "pdl.cuh"  // pdl_trigger, pdl_wait
#include "step02_attention/forward_gpu.cuh"  // tof, fromf
#include "step06_quant/qlinear_gpu.h"
#include "step06_quant/qlinear_pack.h"
#include "wgmma.cuh"  // WGMMA_ARCH, mbar_init / wait / arrive / expect_tx (k_qtma)

#define QV_WARPS 8   // warps per GEMV block
#define QV_U 4       // 16-byte weight loads in flight per lane (the GEMV ladder's v1)
#define QF_TB 8      // tokens per pass of the fallback GEMM
#define QG_NB 2      // 16-row tiles per warp in the tensor-core GEMM
#define QG_SC 2      // 64-column tiles per stage
#define QG_WARPS 4

struct QLinearGpu {
    QuantKind kind;
    int rows, cols, np, kp, gs, ng, sym;
    int glog;        // log2(gs) when a power of two (30 for one group per row), else -1
    int fast;        // 1: the packed layout below; 0: the naive kernels on the QWeight as stored
    int mma;         // INT4 on sm_80+: the tensor-core GEMM
    int mma_ok;      // the device and kind allow it (qlinear_gpu_set_gemm_path can turn it off)
    int simt_forced; // qlinear_gpu_set_gemm_path(SIMT): no tensor cores, no cuBLAS path either
    int tc_gm;       // k_qmma's group mode (0 one group, 1 per 64 columns, 2 per 32), -1: k_qmma cannot run
    int sms, major;
    uint32_t *qw;    // qlinear_pack.h's words
    float *scales;   // (ng, np)
    uint8_t *zeros;  // (ng, np) or NULL
    __half *scales_t;  // the Hopper kernels' fp16 copies (sm_90): (np / 16, ng, 16), each strip's groups
                       // side by side, a group's 16 rows in the order 0, 8, 1, 9, ... 7, 15 (qt_spos)
    uint8_t *zeros_t;  // the same, or NULL
    int *perm;       // (cols) or NULL
    // the naive path: quant.h's layout
    uint8_t *q0, *z0;
    float *s0;
    int *g0, group0;
    size_t bytes;
    float *xg;       // (kp) the GEMV's gathered x
    int gather_x;    // the columns are permuted or padded: x always goes through xg
    int qt;          // k_qtma can run this layer (sm_90a code on an sm_90, x and a ring fit in shared memory)
    int qt_per_sm[3][2][2][2];  // its blocks per SM, [TS 16, 32, 64][NORM][SWIGLU][ZF] (asked at creation, not while capturing)
    int qc_per_sm;   // k_qtmc's blocks per SM with this layer's x (0: it cannot run the layer)
    void *scr;       // the GEMM's gathered X
    size_t scr_bytes;
    void *part;      // k_qtmat's chunk sums
    size_t part_bytes;
    char base[64], desc[240];
};

// k_qtmat for INT4 GEMMs of T <= 16 on sm_90a (the default; qlinear_gemm_set_qtmat, QLINEAR_QTMAT=0:
// k_qgemm4 instead), and the least number of column chunks it cuts x into (QLINEAR_QTMAT_NC, for measuring).
// A measuring knob from the environment: its integer value when set and within [lo, hi], else dflt.
static int env_int(const char *name, int lo, int hi, int dflt) {
    const char *e = getenv(name);
    if (!e) return dflt;
    const int v = atoi(e);
    return v >= lo && v <= hi ? v : dflt;
}
// A setting a setter may fix (*g >= 0) and the environment otherwise gives, read once.
static int knob(int *g, const char *name, int lo, int hi, int dflt) {
    if (*g < 0) *g = env_int(name, lo, hi, dflt);
    return *g;
}
static int g_qtmat = -1, g_qtmat_nc = 0;
static bool qtmat_on(void) {
    if (g_qtmat < 0) {
        const char *e = getenv("QLINEAR_QTMAT"), *n = getenv("QLINEAR_QTMAT_NC");
        g_qtmat = !e || atoi(e) != 0;
        g_qtmat_nc = n ? atoi(n) : 0;
    }
    return g_qtmat > 0;
}
extern "C" void qlinear_gemm_set_qtmat(int on) {
    qtmat_on();  // the environment read first, so it cannot undo this later
    g_qtmat = on ? 1 : 0;
}
static int deq_rows(const QLinearGpu *q);  // below: the fewest rows that go through dequantize + cuBLAS
static void set_desc(QLinearGpu *q) {
    char deq[48] = "";
    if (!q->simt_forced && deq_rows(q) > 0) snprintf(deq, sizeof deq, "; >= %d rows: dequantized + cuBLAS", deq_rows(q));
    snprintf(q->desc, sizeof q->desc, "%s: tiled GEMV, %s%s", q->base,
             !q->mma ? "SIMT GEMM (8 tokens a pass)"
             : q->kind == QK_INT4 ? (q->qt && qtmat_on() ? "tensor-core GEMM (mma.sync m16n8k16; <= 16 rows: bulk-copied weights, k_qtmat)"
                                                         : "tensor-core GEMM (mma.sync m16n8k16)")
                                  : "tensor-core GEMM (mma.sync m16n8k16, 16 tokens a pass)", deq);
}

// ---------------------------------------------------------------- helpers
template <class T> static cudaError_t upload(T **dst, const T *src, size_t n) {
    *dst = NULL;
    if (!src || n == 0) return cudaSuccess;
    cudaError_t e = cudaMalloc((void **)dst, n * sizeof(T));
    if (e != cudaSuccess) return e;
    return cudaMemcpy(*dst, src, n * sizeof(T), cudaMemcpyHostToDevice);
}

static int launch_ok(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s: launch failed: %s\n", what, cudaGetErrorString(e));
    return -1;
}

// The same 32 bits as another type (packed halves <-> the words they travel in).
template <class To, class From>
__device__ __forceinline__ To bits(From f) {
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}

// (w & mask) | m as one LOP3. Written in C, with two constants, it compiles to an AND and an OR
// (a SASS instruction takes one 32-bit immediate): measured on k_qtma's INT4 loop (ncu's source
// page, gate_up at T = 1), 8 LOP3 a word where 4 do. Here the constants travel in registers.
__device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t mask, uint32_t m) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(w), "r"(mask), "r"(m));  // 0xEA: (a & b) | c
    return d;
}

// A ring position: the stage's slot and the parity of its round, i.e. it % ns and (it / ns) & 1
// without the integer division a stage that those cost (ns is a launch argument).
struct RingPos {
    int slot = 0;
    uint32_t ph = 0;
    __device__ __forceinline__ void next(int ns) {
        if (++slot == ns) slot = 0, ph ^= 1u;
    }
};

// The group of packed column col: a shift when the group size is a power of two (glog >= 0; one
// group per row passes glog 30), a division otherwise; clamped for the padded columns.
__device__ __forceinline__ int group_of(int col, int gs, int glog, int ng) {
    return min(glog >= 0 ? col >> glog : col / gs, ng - 1);
}

// INT4's zero terms for one (group, row): za = 1024 + z, zb = -64 - z as fp16 pairs (z = 8 when
// symmetric), so that (1024 + q) - za and (1024 + 16 q) / 16 + zb are q - z exactly.
__device__ __forceinline__ void zero4_of(float z, __half2 &za, __half2 &zb) {
    za = __float2half2_rn(1024.0f + z), zb = __float2half2_rn(-64.0f - z);
}
template <bool ZP>
__device__ __forceinline__ void zero4(const uint8_t *__restrict__ zeros, size_t at, __half2 &za, __half2 &zb) {
    zero4_of(ZP ? (float)__ldg(zeros + at) : 8.0f, za, zb);
}
// q - z of one packed word: columns (k, k+1) and (k+8, k+9) of row n (low nibbles), then of row
// n + 8 (the word >> 8). (w & 0x000F000F) | 0x64006400 is the fp16 pair (1024 + q0, 1024 + q4).
__device__ __forceinline__ void dq4(uint32_t wd, __half2 za_lo, __half2 zb_lo, __half2 za_hi, __half2 zb_hi, float2 &qa,
                                    float2 &qb, float2 &qc, float2 &qd) {
    const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
    const uint32_t w2 = wd >> 8;
    qa = __half22float2(__hsub2(bits<__half2>(and_or(wd, 0x000F000Fu, 0x64006400u)), za_lo));
    qb = __half22float2(__hfma2(bits<__half2>(and_or(wd, 0x00F000F0u, 0x64006400u)), sixteenth, zb_lo));
    qc = __half22float2(__hsub2(bits<__half2>(and_or(w2, 0x000F000Fu, 0x64006400u)), za_hi));
    qd = __half22float2(__hfma2(bits<__half2>(and_or(w2, 0x00F000F0u, 0x64006400u)), sixteenth, zb_hi));
}
// out = v + bias[row] (+ beta * out).
__device__ __forceinline__ void out_store(float v, float *out, const float *bias, int row, float beta) {
    v += bias ? bias[row] : 0.0f;
    if (beta != 0.0f) v += beta * *out;
    *out = v;
}
// One output of a warp (INT8: a row's partial sums across the lanes): summed over the warp, then
// written by lane 0 where ok.
__device__ __forceinline__ void warp_out(float v, float *out, const float *bias, int row, float beta, bool ok) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0 && ok) out_store(v, out, bias, row, beta);
}
// INT4: the 4 lanes of a row pair (lane % 4) summed; the first writes rows lane/4 and lane/4 + 8
// of a 16-row tile's slot in shared memory.
__device__ __forceinline__ void quad_to_shared(float lo, float hi, float *red16) {
    const int lane = threadIdx.x & 31;
    lo += __shfl_xor_sync(0xffffffffu, lo, 1), hi += __shfl_xor_sync(0xffffffffu, hi, 1);
    lo += __shfl_xor_sync(0xffffffffu, lo, 2), hi += __shfl_xor_sync(0xffffffffu, hi, 2);
    if (lane % 4 == 0) red16[lane / 4] = lo, red16[lane / 4 + 8] = hi;
}
// INT8: byte b of a word becomes 2^23 + q exactly (one byte permute), minus zoff = 2^23 + z.
__device__ __forceinline__ float dq8(uint32_t w, int b, float zoff) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7650u | b)) - zoff;
}

// ---------------------------------------------------------------- GEMV (and fallback GEMM)
// Y[t][row] = sum_k W[row][k] x_t[k] (+ bias[row]) (+ beta * Y[t][row] when beta != 0), for the
// tokens t0 .. t0 + TB - 1 < T of x (T, ldxf) fp32, padded to kp with zeros (and permuted).
// ZP: zero points are stored (asymmetric); else z = 8 (INT4) / 128 (INT8) at compile time.
template <int TB, int U, bool ZP>
__global__ void __launch_bounds__(QV_WARPS * 32)
    k_qgemv4(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros,
             int np, int kp, int gs, int glog, int ng, int rows, const float *__restrict__ x, int ldxf, int T,
             const float *__restrict__ bias, float *Y, int ldy, float beta) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb = blockIdx.x, t0 = blockIdx.y * TB, nk = kp / 64;
    const int n_lo = nb * 16 + lane / 4, n_hi = n_lo + 8, kl = 2 * (lane % 4);
    const uint4 *wp = qw + (size_t)nb * nk * 32 + lane;
    const float *xr[TB];
#pragma unroll
    for (int t = 0; t < TB; t++) xr[t] = x + (size_t)min(t0 + t, T - 1) * ldxf;  // clamp: read, not written
    float acc_lo[TB], acc_hi[TB];
#pragma unroll
    for (int t = 0; t < TB; t++) acc_lo[t] = acc_hi[t] = 0.0f;
    for (int kc0 = warp; kc0 < nk; kc0 += QV_WARPS * U) {
        uint4 wv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kc = kc0 + QV_WARPS * u;
            wv[u] = kc < nk ? __ldcs(wp + (size_t)kc * 32) : make_uint4(0, 0, 0, 0);  // streamed once
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kc = kc0 + QV_WARPS * u;
            if (kc >= nk) break;  // the same for the whole warp
#pragma unroll
            for (int h = 0; h < 2; h++) {  // two 32-column halves, each inside one group
                const int col = kc * 64 + 32 * h, g = group_of(col, gs, glog, ng);
                const float s_lo = __ldg(scales + (size_t)g * np + n_lo), s_hi = __ldg(scales + (size_t)g * np + n_hi);
                __half2 za_lo, zb_lo, za_hi, zb_hi;
                zero4<ZP>(zeros, (size_t)g * np + n_lo, za_lo, zb_lo), zero4<ZP>(zeros, (size_t)g * np + n_hi, za_hi, zb_hi);
                float p_lo[TB], p_hi[TB];
#pragma unroll
                for (int t = 0; t < TB; t++) p_lo[t] = p_hi[t] = 0.0f;
#pragma unroll
                for (int i2 = 0; i2 < 2; i2++) {
                    const uint32_t wd = h == 0 ? (i2 == 0 ? wv[u].x : wv[u].y) : (i2 == 0 ? wv[u].z : wv[u].w);
                    float2 qa, qb, qc, qd;  // q - z, exact in fp16
                    dq4(wd, za_lo, zb_lo, za_hi, zb_hi, qa, qb, qc, qd);
                    const int k = col + 16 * i2 + kl;
#pragma unroll
                    for (int t = 0; t < TB; t++) {
                        const float2 xa = __ldg((const float2 *)(xr[t] + k)), xb = __ldg((const float2 *)(xr[t] + k + 8));
                        p_lo[t] = fmaf(qa.x, xa.x, fmaf(qa.y, xa.y, fmaf(qb.x, xb.x, fmaf(qb.y, xb.y, p_lo[t]))));
                        p_hi[t] = fmaf(qc.x, xa.x, fmaf(qc.y, xa.y, fmaf(qd.x, xb.x, fmaf(qd.y, xb.y, p_hi[t]))));
                    }
                }
#pragma unroll
                for (int t = 0; t < TB; t++) acc_lo[t] = fmaf(s_lo, p_lo[t], acc_lo[t]), acc_hi[t] = fmaf(s_hi, p_hi[t], acc_hi[t]);
            }
        }
    }
    __shared__ float red[QV_WARPS][TB][16];
#pragma unroll
    for (int t = 0; t < TB; t++) quad_to_shared(acc_lo[t], acc_hi[t], red[warp][t]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < TB * 16; idx += blockDim.x) {
        const int t = idx / 16, r = idx % 16, row = nb * 16 + r, tok = t0 + t;
        if (row >= rows || tok >= T) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < QV_WARPS; w++) v += red[w][t][r];
        out_store(v, Y + (size_t)tok * ldy + row, bias, row, beta);
    }
}

// INT8: one warp per row (QV_WARPS rows per block); lane loads 16 weights of the row.
template <int TB, int U, bool ZP>
__global__ void __launch_bounds__(QV_WARPS * 32)
    k_qgemv8(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros,
             int np, int kp, int gs, int glog, int ng, int rows, const float *__restrict__ x, int ldxf, int T,
             const float *__restrict__ bias, float *Y, int ldy, float beta) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * QV_WARPS + (threadIdx.x >> 5), t0 = blockIdx.y * TB;
    if (row >= rows) return;
    const int nv = kp / 16;  // 16-byte pieces per row
    const uint4 *wp = qw + (size_t)row * nv;
    const float *xr[TB];
#pragma unroll
    for (int t = 0; t < TB; t++) xr[t] = x + (size_t)min(t0 + t, T - 1) * ldxf;
    float acc[TB];
#pragma unroll
    for (int t = 0; t < TB; t++) acc[t] = 0.0f;
    for (int c0 = lane; c0 < nv; c0 += 32 * U) {
        uint4 wv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + 32 * u;
            wv[u] = c < nv ? __ldcs(wp + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + 32 * u;
            if (c >= nv) break;
            const int g = group_of(c * 16, gs, glog, ng);
            const float s = __ldg(scales + (size_t)g * np + row);
            const float zoff = 8388608.0f + (ZP ? (float)__ldg(zeros + (size_t)g * np + row) : 128.0f);
            float q[16];
            const uint32_t wd[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
            for (int i = 0; i < 16; i++) q[i] = dq8(wd[i / 4], i % 4, zoff);  // q - z
#pragma unroll
            for (int t = 0; t < TB; t++) {
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < 16; i += 4) {
                    const float4 xv = __ldg((const float4 *)(xr[t] + (size_t)c * 16 + i));
                    p = fmaf(q[i], xv.x, fmaf(q[i + 1], xv.y, fmaf(q[i + 2], xv.z, fmaf(q[i + 3], xv.w, p))));
                }
                acc[t] = fmaf(s, p, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TB; t++) warp_out(acc[t], Y + (size_t)(t0 + t) * ldy + row, bias, row, beta, t0 + t < T);
}

// ---------------------------------------------------------------- GEMV, R tiles / rows per warp (v4+)
// The same loads and arithmetic as k_qgemv4 / k_qgemv8 for one token, but each lane takes R
// 16-row tiles (INT4) or R rows (INT8) at the same columns, so every x value it loads serves 2R
// rows (INT4) or R rows (INT8) instead of 2 or 1: k_qgemv4 loads 64 bytes of fp32 x per 16 bytes
// of weights, which fills the load units before the weights do. W warps per block; INT4: the
// block's warps split the columns (warp w: 64-column tiles w, w + W, ...), UK of them per
// iteration, R x UK 16-byte loads in flight per lane; INT8: warp w owns rows (block * W + w) * R
// .. + R - 1 and takes the whole row, UK pieces of each row per iteration.
template <int W, int UK, int R, bool ZP>
__global__ void __launch_bounds__(W * 32)
    k_qgemv4r(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros,
              int np, int kp, int gs, int glog, int ng, int rows, const float *__restrict__ x,
              const float *__restrict__ bias, float *Y, float beta) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb0 = blockIdx.x * R, nt = np / 16, nk = kp / 64, kl = 2 * (lane % 4);
    float acc_lo[R], acc_hi[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc_lo[r] = acc_hi[r] = 0.0f;
    for (int kc0 = warp; kc0 < nk; kc0 += W * UK) {
        uint4 wv[UK][R];
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int kc = kc0 + W * u, nb = nb0 + r;
                wv[u][r] = kc < nk && nb < nt ? __ldcs(qw + ((size_t)nb * nk + kc) * 32 + lane) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < UK; u++) {
            const int kc = kc0 + W * u;
            if (kc >= nk) break;  // the same for the whole warp
#pragma unroll
            for (int h = 0; h < 2; h++) {  // two 32-column halves, each inside one group
                const int col = kc * 64 + 32 * h, g = group_of(col, gs, glog, ng);
                float2 xa[2], xb[2];  // columns k, k+1 and k+8, k+9 of the two 16-column steps
#pragma unroll
                for (int i2 = 0; i2 < 2; i2++) {
                    const int k = col + 16 * i2 + kl;
                    xa[i2] = __ldg((const float2 *)(x + k)), xb[i2] = __ldg((const float2 *)(x + k + 8));
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int n_lo = (nb0 + r) * 16 + lane / 4, n_hi = n_lo + 8;
                    if (nb0 + r >= nt) break;  // the same for the whole block
                    const float s_lo = __ldg(scales + (size_t)g * np + n_lo), s_hi = __ldg(scales + (size_t)g * np + n_hi);
                    __half2 za_lo, zb_lo, za_hi, zb_hi;
                    zero4<ZP>(zeros, (size_t)g * np + n_lo, za_lo, zb_lo), zero4<ZP>(zeros, (size_t)g * np + n_hi, za_hi, zb_hi);
                    float p_lo = 0.0f, p_hi = 0.0f;
#pragma unroll
                    for (int i2 = 0; i2 < 2; i2++) {
                        const uint32_t wd = h == 0 ? (i2 == 0 ? wv[u][r].x : wv[u][r].y) : (i2 == 0 ? wv[u][r].z : wv[u][r].w);
                        float2 qa, qb, qc, qd;
                        dq4(wd, za_lo, zb_lo, za_hi, zb_hi, qa, qb, qc, qd);
                        p_lo = fmaf(qa.x, xa[i2].x, fmaf(qa.y, xa[i2].y, fmaf(qb.x, xb[i2].x, fmaf(qb.y, xb[i2].y, p_lo))));
                        p_hi = fmaf(qc.x, xa[i2].x, fmaf(qc.y, xa[i2].y, fmaf(qd.x, xb[i2].x, fmaf(qd.y, xb[i2].y, p_hi))));
                    }
                    acc_lo[r] = fmaf(s_lo, p_lo, acc_lo[r]), acc_hi[r] = fmaf(s_hi, p_hi, acc_hi[r]);
                }
            }
        }
    }
    __shared__ float red[W][R][16];
#pragma unroll
    for (int r = 0; r < R; r++) quad_to_shared(acc_lo[r], acc_hi[r], red[warp][r]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * 16; idx += W * 32) {
        const int r = idx / 16, row = (nb0 + r) * 16 + idx % 16;
        if (nb0 + r >= nt || row >= rows) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) v += red[w][r][idx % 16];
        out_store(v, Y + row, bias, row, beta);
    }
}

template <int W, int UK, int R, bool ZP>
__global__ void __launch_bounds__(W * 32)
    k_qgemv8r(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros,
              int np, int kp, int gs, int glog, int ng, int rows, const float *__restrict__ x,
              const float *__restrict__ bias, float *Y, float beta) {
    const int lane = threadIdx.x & 31, row0 = (blockIdx.x * W + (threadIdx.x >> 5)) * R;
    if (row0 >= rows) return;
    const int nv = kp / 16;  // 16-byte pieces per row
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int c0 = lane; c0 < nv; c0 += 32 * UK) {
        uint4 wv[UK][R];
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int c = c0 + 32 * u, row = row0 + r;
                wv[u][r] = c < nv && row < rows ? __ldcs(qw + (size_t)row * nv + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < UK; u++) {
            const int c = c0 + 32 * u;
            if (c >= nv) break;
            const int g = group_of(c * 16, gs, glog, ng);
            float4 xv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) xv[i] = __ldg((const float4 *)(x + (size_t)c * 16 + 4 * i));
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int row = row0 + r;
                if (row >= rows) break;
                const float s = __ldg(scales + (size_t)g * np + row);
                const float zoff = 8388608.0f + (ZP ? (float)__ldg(zeros + (size_t)g * np + row) : 128.0f);
                const uint32_t wd[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    p = fmaf(dq8(wd[i], 0, zoff), xv[i].x,
                             fmaf(dq8(wd[i], 1, zoff), xv[i].y, fmaf(dq8(wd[i], 2, zoff), xv[i].z, fmaf(dq8(wd[i], 3, zoff), xv[i].w, p))));
                acc[r] = fmaf(s, p, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) warp_out(acc[r], Y + row0 + r, bias, row0 + r, beta, row0 + r < rows);
}

// ---------------------------------------------------------------- tensor-core GEMM (INT4, sm_80+)
template <class X> struct Q16;
template <> struct Q16<__half> {
    static constexpr uint32_t MAGIC = 0x64006400u;  // fp16 1024: 1024 + q is exact
    static constexpr float LO = 1024.0f, HI = 64.0f;
};
template <> struct Q16<__nv_bfloat16> {
    static constexpr uint32_t MAGIC = 0x43004300u;  // bf16 128: 128 + q is exact (q at bits 0..3)
    static constexpr float LO = 128.0f, HI = 8.0f;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t x2_of(__half, float v) { return bits<uint32_t>(__float2half2_rn(v)); }
__device__ __forceinline__ uint32_t x2_of(__nv_bfloat16, float v) { return bits<uint32_t>(__float2bfloat162_rn(v)); }
// a - b of two packed pairs of X.
__device__ __forceinline__ uint32_t sub2(__half, uint32_t a, uint32_t b) {
    return bits<uint32_t>(__hsub2(bits<__half2>(a), bits<__half2>(b)));
}
__device__ __forceinline__ uint32_t sub2(__nv_bfloat16, uint32_t a, uint32_t b) {
    return bits<uint32_t>(__hsub2(bits<__nv_bfloat162>(a), bits<__nv_bfloat162>(b)));
}
// (pair - zo) * s and (pair / 16 - zh) * s, in the X type's packed arithmetic.
__device__ __forceinline__ uint32_t dq_lo(__half t, uint32_t p, uint32_t zo, uint32_t s) {
    return bits<uint32_t>(__hmul2(bits<__half2>(sub2(t, p, zo)), bits<__half2>(s)));
}
__device__ __forceinline__ uint32_t dq_hi(__half, uint32_t p, uint32_t zh, uint32_t s) {
    return bits<uint32_t>(__hmul2(__hfma2(bits<__half2>(p), __float2half2_rn(1.0f / 16.0f), bits<__half2>(zh)), bits<__half2>(s)));
}
__device__ __forceinline__ uint32_t dq_lo(__nv_bfloat16 t, uint32_t p, uint32_t zo, uint32_t s) {
    return bits<uint32_t>(__hmul2(bits<__nv_bfloat162>(sub2(t, p, zo)), bits<__nv_bfloat162>(s)));
}
// One word -> the B fragments of rows 0..7 (b0, b1) and 8..15 (b2, b3), scaled. fp16: the pairs
// (w & 0x000F000F) and (w & 0x00F000F0), then of w >> 8 (a nibble at bits 4..7 is 16 q, still
// inside fp16's 10 mantissa bits). bf16 has 7 mantissa bits, so bit 7 is the exponent's: every
// pair is taken at bits 0..3 (w, w >> 4, w >> 8, w >> 12).
__device__ __forceinline__ void dequant4(__half t, uint32_t wd, const uint32_t *zo, const uint32_t *zh,
                                         const uint32_t *sc, uint32_t &b0, uint32_t &b1, uint32_t &b2, uint32_t &b3) {
    const uint32_t w2 = wd >> 8, M = Q16<__half>::MAGIC;
    b0 = dq_lo(t, and_or(wd, 0x000F000Fu, M), zo[0], sc[0]);
    b1 = dq_hi(t, and_or(wd, 0x00F000F0u, M), zh[0], sc[0]);
    b2 = dq_lo(t, and_or(w2, 0x000F000Fu, M), zo[1], sc[1]);
    b3 = dq_hi(t, and_or(w2, 0x00F000F0u, M), zh[1], sc[1]);
}
__device__ __forceinline__ void dequant4(__nv_bfloat16 t, uint32_t wd, const uint32_t *zo, const uint32_t *zh,
                                         const uint32_t *sc, uint32_t &b0, uint32_t &b1, uint32_t &b2, uint32_t &b3) {
    const uint32_t M = Q16<__nv_bfloat16>::MAGIC;
    (void)zh;
    b0 = dq_lo(t, and_or(wd, 0x000F000Fu, M), zo[0], sc[0]);
    b1 = dq_lo(t, and_or(wd >> 4, 0x000F000Fu, M), zo[0], sc[0]);
    b2 = dq_lo(t, and_or(wd >> 8, 0x000F000Fu, M), zo[1], sc[1]);
    b3 = dq_lo(t, and_or(wd >> 12, 0x000F000Fu, M), zo[1], sc[1]);
}
__device__ __forceinline__ void mma16816(__half, float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(__nv_bfloat16, float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t *a, const void *smem) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}
#endif

#define QG_KS (QG_SC * 64)  // columns per stage
#define QG_LDS (QG_KS + 8)  // shared row stride (elements): 272 bytes, so ldmatrix rows hit distinct banks
static_assert(QG_LDS * 2 % 16 == 0, "ldmatrix needs every shared row address 16-byte aligned");
static_assert(QG_LDS * 2 / 4 % 32 == 4, "8 rows of 16 bytes at this stride must fall in distinct banks");
static_assert(4 * 16 * QG_LDS * 2 <= 48 * 1024, "k_qgemm4's A tile (MT = 4) must fit static shared memory");
static_assert(QV_WARPS * QF_TB * 16 * 4 <= 48 * 1024, "k_qgemv4's reduction buffer must fit static shared memory");

// Y (T, ldy) = A (T, lda; kp valid columns, 16-byte aligned rows) W^T (+ beta Y); blockIdx.x: 128
// rows, blockIdx.y: the K split (of nsplit), blockIdx.z: 64-token pass. nsplit > 1: atomicAdd
// into a Y already scaled by beta.
template <class X, int MT, bool ZP>
__global__ void __launch_bounds__(QG_WARPS * 32)
    k_qgemm4(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros, int np,
             int kp, int gs, int glog, int ng, int rows, const X *__restrict__ A, int lda, int T, float *Y, int ldy, float beta,
             int nsplit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ __align__(16) X As[MT * 16][QG_LDS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nk = kp / 64, ntile = np / 16;
    const int per = (nk + nsplit - 1) / nsplit, kc_begin = blockIdx.y * per, kc_end = min(nk, kc_begin + per);
    const int tok0 = blockIdx.z * 64;
    int nb[QG_NB];
    bool nb_ok[QG_NB];
#pragma unroll
    for (int j = 0; j < QG_NB; j++) nb[j] = (blockIdx.x * QG_WARPS + warp) * QG_NB + j, nb_ok[j] = nb[j] < ntile;
    float acc[MT][QG_NB][2][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < QG_NB; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[m][j][h][e] = 0.0f;
    uint4 wcur[QG_SC][QG_NB], wnext[QG_SC][QG_NB];
    auto load_w = [&](uint4 (&w)[QG_SC][QG_NB], int kc_stage) {
#pragma unroll
        for (int s = 0; s < QG_SC; s++)
#pragma unroll
            for (int j = 0; j < QG_NB; j++) {
                const int kc = kc_stage + s;
                w[s][j] = nb_ok[j] && kc < kc_end ? __ldcs(qw + ((size_t)nb[j] * nk + kc) * 32 + lane)
                                                  : make_uint4(0, 0, 0, 0);
            }
    };
    if (kc_begin < kc_end) load_w(wcur, kc_begin);
    const X xzero = fromf<X>(0.0f);
    const uint32_t zo_sym = x2_of(xzero, Q16<X>::LO + 8.0f), zh_sym = x2_of(xzero, -(Q16<X>::HI + 8.0f));
    for (int kcs = kc_begin; kcs < kc_end; kcs += QG_SC) {
        if (kcs + QG_SC < kc_end) load_w(wnext, kcs + QG_SC);  // the next stage's weights, in flight now
        __syncthreads();  // the previous stage's A is no longer read
        for (int i = threadIdx.x; i < MT * 16 * (QG_KS / 8); i += QG_WARPS * 32) {
            const int m = i / (QG_KS / 8), c8 = (i % (QG_KS / 8)) * 8, tok = tok0 + m, col = kcs * 64 + c8;
            uint4 v;
            if (tok < T && col < kp) v = __ldg((const uint4 *)(A + (size_t)tok * lda + col));
            else {
                X z8[8];
                for (int e = 0; e < 8; e++) z8[e] = xzero;
                memcpy(&v, z8, 16);
            }
            *(uint4 *)&As[m][c8] = v;
        }
        __syncthreads();
#pragma unroll
        for (int s = 0; s < QG_SC; s++) {
            const int kc = kcs + s;
            if (kc >= kc_end) break;
#pragma unroll
            for (int h = 0; h < 2; h++) {  // 32-column halves: one group each
                const int g = group_of(kc * 64 + 32 * h, gs, glog, ng);
                uint32_t sc[QG_NB][2], zo[QG_NB][2], zh[QG_NB][2];
#pragma unroll
                for (int j = 0; j < QG_NB; j++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int n = min(nb[j], ntile - 1) * 16 + lane / 4 + 8 * r;
                        const float z = ZP ? (float)__ldg(zeros + (size_t)g * np + n) : 8.0f;
                        sc[j][r] = x2_of(xzero, __ldg(scales + (size_t)g * np + n));
                        zo[j][r] = ZP ? x2_of(xzero, Q16<X>::LO + z) : zo_sym;
                        zh[j][r] = ZP ? x2_of(xzero, -(Q16<X>::HI + z)) : zh_sym;
                    }
#pragma unroll
                for (int i2 = 0; i2 < 2; i2++) {
                    const int i = 2 * h + i2;  // the 16-column slice of the tile
                    uint32_t a[MT][4];
#pragma unroll
                    for (int m = 0; m < MT; m++) ldmatrix_x4(a[m], &As[m * 16 + (lane % 16)][s * 64 + i * 16 + (lane / 16) * 8]);
#pragma unroll
                    for (int j = 0; j < QG_NB; j++) {
                        const uint32_t wd = i == 0 ? wcur[s][j].x : i == 1 ? wcur[s][j].y : i == 2 ? wcur[s][j].z : wcur[s][j].w;
                        uint32_t b0, b1, b2, b3;
                        dequant4(xzero, wd, zo[j], zh[j], sc[j], b0, b1, b2, b3);
#pragma unroll
                        for (int m = 0; m < MT; m++) {
                            mma16816(xzero, acc[m][j][0], a[m], b0, b1);
                            mma16816(xzero, acc[m][j][1], a[m], b2, b3);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int s = 0; s < QG_SC; s++)
#pragma unroll
            for (int j = 0; j < QG_NB; j++) wcur[s][j] = wnext[s][j];
    }
    // C fragment: c0, c1 = (token lane/4, rows 2(lane%4), +1), c2, c3 = token + 8
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < QG_NB; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int tok = tok0 + m * 16 + lane / 4 + 8 * (e / 2);
                    const int row = nb[j] * 16 + 8 * h + 2 * (lane % 4) + (e % 2);
                    if (!nb_ok[j] || tok >= T || row >= rows) continue;
                    float *out = Y + (size_t)tok * ldy + row;
                    if (nsplit > 1) atomicAdd(out, acc[m][j][h][e]);
                    else *out = acc[m][j][h][e] + (beta != 0.0f ? beta * *out : 0.0f);
                }
#endif  // before sm_80 the body is empty: qlinear_gpu_new never picks this kernel there (mma_ok)
}

// ---------------------------------------------------------------- tensor-core GEMV / small GEMM (v7+)
// k_qmma: the same packed weights, but the multiply-adds on the tensor cores (mma.sync m16n8k16,
// fp16 x fp16 -> fp32) for one token (INT4 and INT8: the GEMV rungs v7+) and for INT8's batched
// rows, 16 tokens a pass (INT4's take k_qgemm4): A = the tokens' x (16 rows; at T = 1 every row
// is the one x, so no lane waits on a branch), B = the weights, dequantized into fp16 pairs exactly
// (q - z is a small integer). Why: k_qgemv4 spends ~27 instructions per 8 INT4 weights (unpack,
// fp16 -> fp32, 8 FMAs, x loads) and runs out of issue slots before the loads are done; here a
// word costs 9 (unpack + subtract) plus 2 mma. The group scale is applied in fp32 to each
// group's mma sums (GM 0: one group, at the end; 1: per 64-column tile; 2: per 32 columns).
//   INT4: a word is already two B fragments (qlinear_pack.h); one warp load = 16 rows x 64
//   columns; a lane's 4 words are the tile's 4 k16 slices.
//   INT8 (row-major): lane (g, t) loads 16 bytes of row 8 nb + g at columns 64 kc + 16 t; word j
//   of them is a B fragment if the mma's k index is permuted: k = 16 j + 2 t (+1) holds column
//   16 t + 4 j (+1), k = 16 j + 2 t + 8 (+1) holds 16 t + 4 j + 2 (+3); x is read with the same
//   permutation (the dot product does not care about the order of its terms). Byte -> fp16 is one
//   byte permute: 0x64 above byte b is the fp16 1024 + b. A k16 step spans all 64 columns of the
//   tile, so INT8 groups must be multiples of 64 (else the SIMT kernels run).
// x is rounded to fp16 (cvt.rn.satfinite: beyond +-65504 it saturates, never becomes inf): 11
// significant bits, more than the bf16 the activations already are in the batched path.
// W warps per block split the 64-column tiles (warp w: w, w + W, ...), UK tiles per step, R row
// tiles per block; the weights of step i + 1 are in flight while step i is computed. With
// programmatic dependent launch (sm_90, qlinear_gemv_set_pdl) the first step's weights are
// requested before griddepcontrol.wait, i.e. while the kernel that writes x is still running.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t h2_sat(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
// The fp16 pair of elements p[0], p[1] (p 8-byte aligned).
__device__ __forceinline__ uint32_t xpair(const float *p) {
    const float2 v = __ldg((const float2 *)p);
    return h2_sat(v.x, v.y);
}
// The 8 fp16 pairs of p[0..15] (16-byte aligned), with 16-byte loads.
__device__ __forceinline__ void x16(const float *p, uint32_t (&o)[8]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 v = __ldg((const float4 *)p + i);
        o[2 * i] = h2_sat(v.x, v.y), o[2 * i + 1] = h2_sat(v.z, v.w);
    }
}
// A packed pair of X as an fp16 pair: bf16 converted (saturating), fp16 as it is.
__device__ __forceinline__ uint32_t h2_of(__nv_bfloat16, uint32_t w) {
    const float2 f = __bfloat1622float2(bits<__nv_bfloat162>(w));
    return h2_sat(f.x, f.y);
}
__device__ __forceinline__ uint32_t h2_of(__half, uint32_t w) { return w; }
__device__ __forceinline__ void x16(const __nv_bfloat16 *p, uint32_t (&o)[8]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint4 v = __ldg((const uint4 *)p + i);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) o[4 * i + j] = h2_of(__nv_bfloat16(), w[j]);
    }
}
__device__ __forceinline__ void x16(const __half *p, uint32_t (&o)[8]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint4 v = __ldg((const uint4 *)p + i);
        o[4 * i] = v.x, o[4 * i + 1] = v.y, o[4 * i + 2] = v.z, o[4 * i + 3] = v.w;
    }
}
#endif

// One packed word as four fp16 pairs of q - z, in the mma fragments' order: b[0] (row g, columns
// 2t, 2t+1 of its k16 slice), b[1] (row g, 2t+8, 2t+9), b[2], b[3] (the same of row g + 8).
// INT4: (w & 0x000F000F) | 0x64006400 is the pair 1024 + q, minus za = 1024 + z; the high nibbles
// give 1024 + 16 q, times 1/16 plus zb = -64 - z. INT8 (wd: row g's word, w8: row g + 8's): one
// byte permute puts 0x64 above a byte (1024 + q), minus za.
__device__ __forceinline__ void dq4_pairs(uint32_t wd, __half2 za_lo, __half2 zb_lo, __half2 za_hi, __half2 zb_hi,
                                          __half2 sixteenth, uint32_t (&b)[4]) {  // sixteenth: the pair (1/16, 1/16)
    const uint32_t w2 = wd >> 8, M = 0x64006400u;
    b[0] = bits<uint32_t>(__hsub2(bits<__half2>(and_or(wd, 0x000F000Fu, M)), za_lo));
    b[1] = bits<uint32_t>(__hfma2(bits<__half2>(and_or(wd, 0x00F000F0u, M)), sixteenth, zb_lo));
    b[2] = bits<uint32_t>(__hsub2(bits<__half2>(and_or(w2, 0x000F000Fu, M)), za_hi));
    b[3] = bits<uint32_t>(__hfma2(bits<__half2>(and_or(w2, 0x00F000F0u, M)), sixteenth, zb_hi));
}
__device__ __forceinline__ void dq8_pairs(uint32_t wd, uint32_t w8, __half2 za_lo, __half2 za_hi, uint32_t (&b)[4]) {
    const uint32_t P = 0x64646464u;
    b[0] = bits<uint32_t>(__hsub2(bits<__half2>(__byte_perm(wd, P, 0x5140u)), za_lo));
    b[1] = bits<uint32_t>(__hsub2(bits<__half2>(__byte_perm(wd, P, 0x5342u)), za_lo));
    b[2] = bits<uint32_t>(__hsub2(bits<__half2>(__byte_perm(w8, P, 0x5140u)), za_hi));
    b[3] = bits<uint32_t>(__hsub2(bits<__half2>(__byte_perm(w8, P, 0x5342u)), za_hi));
}

template <int KIND, class XIn, int W, int UK, int R, int GM, bool ZP, bool T1, bool XS>
__global__ void __launch_bounds__(W * 32)
    k_qmma(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros, int np,
           int kp, int gs, int glog, int ng, int rows, const XIn *__restrict__ X, int ldx, int T,
           const float *__restrict__ bias, float *Y, int ldy, float beta) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int RT = KIND == 4 ? 16 : 8, NH = KIND == 4 ? 2 : 1;  // rows per tile, n8 halves per tile
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
    const int nb0 = blockIdx.x * R, nt = np / RT, nk = kp / 64;
    const XIn *x_lo = X + (size_t)(T1 ? 0 : min(g, T - 1)) * ldx, *x_hi = X + (size_t)(T1 ? 0 : min(g + 8, T - 1)) * ldx;
    float acc[R][NH][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[r][h][e] = 0.0f;
    auto load = [&](uint4 (&w)[UK][R], int kc0) {
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int kc = kc0 + W * u, nb = nb0 + r;
                const size_t at = KIND == 4 ? ((size_t)nb * nk + kc) * 32 + lane : (size_t)(nb * 8 + g) * (kp / 16) + kc * 4 + t;
                w[u][r] = kc < nk && nb < nt ? __ldcs(qw + at) : make_uint4(0, 0, 0, 0);
            }
    };
    // zero terms of a group for rows (tile r) g and g + 8 (INT4) / g (INT8): fp16 pairs
    const __half2 zsym_a = __float2half2_rn(KIND == 4 ? 1032.0f : 1152.0f), zsym_b = __float2half2_rn(-72.0f);
    auto zero_of = [&](int grp, int r, int which, __half2 &za, __half2 &zb) {
        if (!ZP) {
            za = zsym_a, zb = zsym_b;
            return;
        }
        const int n = min(nb0 + r, nt - 1) * RT + g + (KIND == 4 ? 8 * which : 0);
        const float z = (float)__ldg(zeros + (size_t)grp * np + n);
        zero4_of(z, za, zb);
    };
    // scales of the C fragment's rows (tile r, half h): rows 8 h + 2 t, + 1
    auto scale_of = [&](int grp, int r, int h) {
        const int n = min(nb0 + r, nt - 1) * RT + 8 * h + 2 * t;
        return __ldg((const float2 *)(scales + (size_t)grp * np + n));
    };
    // the mma of one k16 slice: B fragments from word wd of tile r, into c[h][4]
    auto mma_word = [&](uint32_t wd, const uint32_t *a, float (&c)[NH][4], __half2 za0, __half2 zb0, __half2 za1,
                        __half2 zb1) {
        uint32_t b[4];
        if (KIND == 4) {
            dq4_pairs(wd, za0, zb0, za1, zb1, __float2half2_rn(1.0f / 16.0f), b);
            mma16816(__half(), c[0], a, b[0], b[1]);
            mma16816(__half(), c[NH - 1], a, b[2], b[3]);
        } else {
            dq8_pairs(wd, wd, za0, za0, b);  // one row: only b[0], b[1]
            (void)zb0, (void)za1, (void)zb1;
            mma16816(__half(), c[0], a, b[0], b[1]);
        }
    };
    // The scales travel with the weights (loaded one step ahead): a scale requested only when the
    // mma sums are ready costs a memory latency per step (the INT4 GEMVs v1-v6 pay it).
    constexpr int NP = GM == 2 ? 2 : 1;  // scale groups per 64-column tile
    float2 scur[UK][R][NP][NH], snext[UK][R][NP][NH], s_one[R][NH];
    auto load_sc = [&](float2 (&sc)[UK][R][NP][NH], int kc0) {
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int p = 0; p < NP; p++) {
                    const int grp = group_of(min(kc0 + W * u, nk - 1) * 64 + 32 * p, gs, glog, ng);
#pragma unroll
                    for (int h = 0; h < NH; h++) sc[u][r][p][h] = scale_of(grp, r, h);
                }
    };
    __half2 za[R][2], zb[R][2];
    if (GM == 0)
#pragma unroll
        for (int r = 0; r < R; r++) {
            zero_of(0, r, 0, za[r][0], zb[r][0]), zero_of(0, r, 1, za[r][1], zb[r][1]);
#pragma unroll
            for (int h = 0; h < NH; h++) s_one[r][h] = scale_of(0, r, h);
        }
    uint4 wcur[UK][R], wnext[UK][R];
    const int kc_first = warp;
    load(wcur, kc_first);
    if (GM != 0) load_sc(scur, kc_first);
    pdl_wait();  // x (and Y) are the previous kernel's: read only from here on
    // XS (one token): x staged once per block in shared memory as the fp16 pairs a lane reads
    // together (INT4: tile kc, lane t: slices 0..3 x (lo, hi) pairs, 32 contiguous bytes; INT8:
    // the natural order), so a tile's A fragments are two 16-byte shared loads instead of eight
    // 8-byte global ones through an L1 the weight stream keeps busy.
    extern __shared__ uint32_t xs[];  // kp / 2 pairs (XS only)
    if constexpr (XS) {
        for (int d = threadIdx.x; d < kp / 2; d += W * 32) {
            int col = 2 * d;
            if (KIND == 4) {
                const int rem = d & 31;
                col = 64 * (d >> 5) + 16 * ((rem & 7) >> 1) + 2 * (rem >> 3) + 8 * (rem & 1);
            }
            xs[d] = xpair(x_lo + col);
        }
        __syncthreads();
    }
    for (int kc0 = kc_first; kc0 < nk; kc0 += W * UK) {
        if (kc0 + W * UK < nk) {
            load(wnext, kc0 + W * UK);
            if (GM != 0) load_sc(snext, kc0 + W * UK);
        }
#pragma unroll
        for (int u = 0; u < UK; u++) {
            const int kc = kc0 + W * u;
            if (kc >= nk) break;  // the same for the whole warp
            // A fragments of the 4 k16 slices: a[i][0..3] = (tok g, lo k), (tok g+8, lo k), (g, hi k), (g+8, hi k)
            uint32_t a[4][4];
            if constexpr (XS) {
                const uint4 p0 = *(const uint4 *)&xs[kc * 32 + t * 8], p1 = *(const uint4 *)&xs[kc * 32 + t * 8 + 4];
                const uint32_t pr[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
                for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = pr[2 * i], a[i][2] = a[i][3] = pr[2 * i + 1];
            } else if constexpr (KIND == 4) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int k = kc * 64 + 16 * i + 2 * t;
                    a[i][0] = xpair(x_lo + k), a[i][2] = xpair(x_lo + k + 8);
                    a[i][1] = T1 ? a[i][0] : xpair(x_hi + k), a[i][3] = T1 ? a[i][2] : xpair(x_hi + k + 8);
                }
            } else {  // columns 64 kc + 16 t .. + 15, word j's at 4 j .. 4 j + 3
                uint32_t lo[8], hi[8];
                x16(x_lo + kc * 64 + 16 * t, lo);
                if (!T1) x16(x_hi + kc * 64 + 16 * t, hi);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    a[j][0] = lo[2 * j], a[j][2] = lo[2 * j + 1];
                    a[j][1] = T1 ? lo[2 * j] : hi[2 * j], a[j][3] = T1 ? lo[2 * j + 1] : hi[2 * j + 1];
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t wd[4] = {wcur[u][r].x, wcur[u][r].y, wcur[u][r].z, wcur[u][r].w};
                if (GM == 0) {
#pragma unroll
                    for (int i = 0; i < 4; i++) mma_word(wd[i], a[i], acc[r], za[r][0], zb[r][0], za[r][1], zb[r][1]);
                } else {
#pragma unroll
                    for (int p = 0; p < (GM == 1 ? 1 : 2); p++) {  // the scale groups of this tile
                        const int grp = group_of(kc * 64 + 32 * p, gs, glog, ng);
                        __half2 za0, zb0, za1, zb1;
                        zero_of(grp, r, 0, za0, zb0), zero_of(grp, r, 1, za1, zb1);
                        float c[NH][4];
#pragma unroll
                        for (int h = 0; h < NH; h++)
#pragma unroll
                            for (int e = 0; e < 4; e++) c[h][e] = 0.0f;
#pragma unroll
                        for (int i = (GM == 1 ? 0 : 2 * p); i < (GM == 1 ? 4 : 2 * p + 2); i++)
                            mma_word(wd[i], a[i], c, za0, zb0, za1, zb1);
#pragma unroll
                        for (int h = 0; h < NH; h++) {
                            const float2 s = scur[u][r][p][h];
                            acc[r][h][0] = fmaf(s.x, c[h][0], acc[r][h][0]), acc[r][h][1] = fmaf(s.y, c[h][1], acc[r][h][1]);
                            acc[r][h][2] = fmaf(s.x, c[h][2], acc[r][h][2]), acc[r][h][3] = fmaf(s.y, c[h][3], acc[r][h][3]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                wcur[u][r] = wnext[u][r];
                if (GM != 0)
#pragma unroll
                    for (int p = 0; p < NP; p++)
#pragma unroll
                        for (int h = 0; h < NH; h++) scur[u][r][p][h] = snext[u][r][p][h];
            }
    }
    if (GM == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int h = 0; h < NH; h++) {
                const float2 s = s_one[r][h];
                acc[r][h][0] *= s.x, acc[r][h][1] *= s.y, acc[r][h][2] *= s.x, acc[r][h][3] *= s.y;
            }
    // C fragment: e = 0, 1: token g, rows 8 h + 2 t (+1); e = 2, 3: token g + 8
    constexpr int TOK = T1 ? 1 : 16;
    __shared__ float red[W][R][TOK][RT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = g + 8 * (e / 2), row = 8 * h + 2 * t + (e % 2);
                if (tok < TOK) red[warp][r][tok][row] = acc[r][h][e];
            }
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * TOK * RT; idx += W * 32) {
        const int r = idx / (TOK * RT), tok = idx / RT % TOK, row = (nb0 + r) * RT + idx % RT;
        if (nb0 + r >= nt || row >= rows || tok >= T) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) v += red[w][r][tok][idx % RT];
        out_store(v, Y + (size_t)tok * ldy + row, bias, row, beta);
    }
#endif  // before sm_80 the body is empty: never launched there (q->mma_ok)
}

// ---------------------------------------------------------------- v12_tma: the Hopper GEMV
// k_qtma (sm_90a; qlinear_gpu_gemv's rungs v12 - v16 and qlinear_gpu_gemv_fused).
// What v10 left: each of its blocks (one 16-row strip, 32 KB of INT4 weights for a 4096-column
// layer) staged the whole x (16 KB of fp32 from L2) before its first product, and kept only two
// tiles a warp in flight in registers. Here:
//   - persistent blocks: about as many as fit on the SMs, each taking strips u, u + grid, ...;
//     x is staged once per block (fp16 pairs, as v10), optionally RMS-normalized on the way
//     (NORM: x' = x * inv * nw with inv = 1 / sqrt(mean(x^2) + eps), the step's norm fused);
//   - one producer thread (an extra warp) streams each strip's weights, scales (and zeros) with
//     bulk copies (cp.async.bulk, counted on an mbarrier by bytes) into a ring of shared-memory
//     stages of TS 64-column tiles, so the bytes in flight do not cost registers; a stage goes
//     back to the producer on its "empty" mbarrier, on which every consumer thread arrives once it
//     has read the stage (W x 32 arrivals: an arrive releases only its own thread's reads);
//   - the W consumer warps split a stage's tiles and multiply with the weights as the A operand
//     of mma.m16n8k16 (16 rows x 16 columns: one INT4 word is exactly lane (g, t)'s A fragment,
//     rows g and g + 8) and x as B (all 8 columns the same x), so one mma covers 256 weights
//     (the B-operand rungs v7-v11 cover 128); C's rows g and g + 8 are the two outputs;
//   - at the end of a strip the warps' partial sums meet in shared memory (double buffered, one
//     named barrier of the consumers), and SWIGLU pairs gate strip u with up strip u + pair and
//     writes silu(gate) * up, so the gate|up intermediate never exists.
// INT8 uses the same kernel: a 16-row strip's rows are row-major (16 copies a stage), lane (g, t)
// reads 16 bytes of rows g and g + 8, x in its natural order (the k permutation of v7-v11).
// consumer warps per block (plus one producer warp) for TS tiles a stage: 4 tiles a warp from 32 up
#define QT_W(TS) ((TS) == 64 ? 16 : 8)

struct QTmaArgs {
    const uint4 *qw;
    const __half *scales;  // strip-major: (np / 16, ng, 16), a strip's groups side by side (rows: qt_spos)
    const uint8_t *zeros;  // strip-major, rows in order, or NULL
    int np, kp, gs, glog, ng, rows;
    const float *x, *nw;  // x (kp) fp32; nw (NORM): the RMSNorm weight
    float eps;
    const float *bias;
    float *y;
    float beta;
    int units, pair, out_rows, ns;  // strips to do; SWIGLU: up strip = gate strip + pair, outputs < out_rows; ring stages
};

// A stage's bytes for one strip: weights, then 16 scales (fp16, QT_SB bytes) and 16 zeros (a byte
// each) for each group it can touch. A group's scales are in the row order 0, 8, 1, 9, ..., 7, 15, so
// that lane (g, t)'s two rows, g and g + 8, are one 32-bit word: one shared load and one conversion.
#define QT_SB 32
__host__ __device__ constexpr int qt_spos(int row) { return (row & 7) * 2 + (row >> 3); }  // row in strip -> place
__host__ __device__ constexpr int qtma_maxg(int ts, int gm) { return gm == 0 ? 1 : gm == 1 ? ts + 1 : 2 * ts + 1; }
__host__ __device__ constexpr int qtma_wrow(int ts) { return ts * 64 + 64; }  // INT8: +64, rows g, g+1 on other banks
__host__ __device__ constexpr int qtma_wb(int kind, int ts) { return kind == 4 ? ts * 512 : 16 * qtma_wrow(ts); }
__host__ __device__ constexpr int qtma_part(int kind, int ts, int gm, bool zp) {
    return qtma_wb(kind, ts) + qtma_maxg(ts, gm) * (QT_SB + (zp ? 16 : 0));
}
template <int KIND, int TS, int GM, bool ZP, bool SWIGLU> struct QTmaGeom {
    static constexpr int R = SWIGLU ? 2 : 1;  // strips per unit
    static constexpr int MAXG = qtma_maxg(TS, GM), WROW = qtma_wrow(TS), WB = qtma_wb(KIND, TS);
    static constexpr int SOFF = WB, ZOFF = WB + MAXG * QT_SB, PART = qtma_part(KIND, TS, GM, ZP), STAGE = R * PART;
};

// What lane (g, t) reads of one strip's part of a ring stage (part = the stage + r G::PART), for the
// kernels on this ring (k_qtma, k_qtmc, k_qtmat): an INT4 tile's 16 bytes (the A fragments of its four
// k16 steps, rows g and g + 8), and the scales (fp32) and zero points of rows g, g + 8 in the stage's
// group gi.
__device__ __forceinline__ void strip_w4(const unsigned char *part, int kcl, int lane, uint32_t (&w)[4]) {
    const uint4 v = *(const uint4 *)(part + kcl * 512 + lane * 16);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
template <class G> __device__ __forceinline__ void strip_scales(const unsigned char *part, int gi, int g, float &lo, float &hi) {
    const float2 f = __half22float2(bits<__half2>(((const uint32_t *)(part + G::SOFF))[gi * 8 + g]));  // fp16 pairs
    lo = f.x, hi = f.y;
}
template <class G>
__device__ __forceinline__ void strip_zeros4(const unsigned char *part, int gi, int g, __half2 &za_lo, __half2 &zb_lo,
                                             __half2 &za_hi, __half2 &zb_hi) {
    const uint8_t *zs = part + G::ZOFF + gi * 16;
    const float zl = zs[g], zh = zs[g + 8];
    zero4_of(zl, za_lo, zb_lo), zero4_of(zh, za_hi, zb_hi);
}

#ifdef WGMMA_ARCH
// One contiguous global -> shared copy by the async proxy, counted on bar by its bytes as it lands
// (dst, src 16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void consumers_sync(int n) { asm volatile("bar.sync 1, %0;\n" ::"r"(n) : "memory"); }
// The same copy landing in every block of the cluster named in mask (at dst and counted on bar in
// each: the same shared-memory offsets there).
__device__ __forceinline__ void bulk_g2s_mc(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar, uint16_t mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "h"(mask)
                 : "memory");
}
// Every thread of every block of the cluster (the blocks' barrier initializations visible to the
// others' copies).
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
#endif

__global__ void k_qtma_probe(int *out) {
#ifdef WGMMA_ARCH
    *out = 1;
#else
    (void)out;
#endif
}

// ZF (zero folded, groups of 64 columns or more): the weights enter the mma as they come out of
// the mask, 1024 + q (INT4's high nibbles 1024 + 16 q, with x / 16 in their columns), and the
// offsets come off afterwards: a tile's products are D = sum q x' + 1024 P + z Q ... minus
// (1024 P + z Q), with P and Q the tile's sums of the staged x (Q counts the high columns' x / 16
// times 16), computed once per block while x is staged. That drops the four fp16 subtractions per
// INT4 word (two per INT8 word); the cancellation costs ~10 of fp32's 24 bits, far inside the
// tolerance of x in fp16.
template <int KIND, int TS, int GM, bool ZP, bool NORM, bool SWIGLU, bool ZF>
__global__ void __launch_bounds__((QT_W(TS) + 1) * 32, QT_W(TS) == 8 ? 2 : 1) k_qtma(const QTmaArgs a) {  // W 8: 2 blocks an SM
#ifdef WGMMA_ARCH
    using G = QTmaGeom<KIND, TS, GM, ZP, SWIGLU>;
    constexpr int R = G::R, W = QT_W(TS);
    extern __shared__ __align__(128) unsigned char sm[];
    const int ns = a.ns, nk = a.kp / 64, nst = (nk + TS - 1) / TS;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(sm);  // full[ns], then empty[ns]
    unsigned char *ring = sm + (2 * ns * 8 + 127) / 128 * 128;
    uint32_t *xs = (uint32_t *)(ring + (size_t)ns * G::STAGE);  // kp / 2 fp16 pairs
    float *ct = (float *)(xs + a.kp / 2);                       // ZF: [nk][2] the tiles' P and Q
    float *red = ct + 2 * nk;                                   // [2][W][R][16]
    float *ssr = red + 2 * W * R * 16;                          // [W]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    if (threadIdx.x == 0)  // full: the producer's expect_tx arrival; empty: every consumer thread
        for (int i = 0; i < ns; i++) mbar_init(bar0 + 8 * i, 1), mbar_init(bar0 + 8 * (ns + i), W * 32);
    __syncthreads();
    pdl_trigger();
    if (warp == W) {  // the producer: weights and scales are constants, so it starts before pdl_wait
        if (lane != 0) return;
        const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring);
        RingPos rp;
        for (int u = blockIdx.x; u < a.units; u += gridDim.x)
            for (int st = 0; st < nst; st++, rp.next(ns)) {
                const int slot = rp.slot;
                const uint32_t full = bar0 + 8 * slot;
                mbar_wait(bar0 + 8 * (ns + slot), rp.ph ^ 1u);  // the consumers are done with it
                const int k0 = st * TS, k1 = min(nk, k0 + TS);
                const int g0 = GM == 0 ? 0 : group_of(k0 * 64, a.gs, a.glog, a.ng);
                const int ngs = GM == 0 ? 1 : group_of(k1 * 64 - 1, a.gs, a.glog, a.ng) - g0 + 1;
                const uint32_t wrow = (uint32_t)(k1 - k0) * 64, wbytes = KIND == 4 ? (k1 - k0) * 512 : 16 * wrow;
                mbar_expect_tx(full, R * (wbytes + ngs * QT_SB + (ZP ? ngs * 16 : 0)));
                for (int r = 0; r < R; r++) {
                    const int s = u + r * a.pair;
                    const uint32_t d = ring0 + slot * G::STAGE + r * G::PART;
                    if (KIND == 4) bulk_g2s(d, a.qw + ((size_t)s * nk + k0) * 32, wbytes, full);
                    else
                        for (int i = 0; i < 16; i++)
                            bulk_g2s(d + i * G::WROW, (const unsigned char *)a.qw + (size_t)(s * 16 + i) * a.kp + k0 * 64,
                                     wrow, full);
                    // the stage's groups of this strip: contiguous in the strip-major copies
                    bulk_g2s(d + G::SOFF, a.scales + ((size_t)s * a.ng + g0) * 16, ngs * QT_SB, full);
                    if (ZP) bulk_g2s(d + G::ZOFF, a.zeros + ((size_t)s * a.ng + g0) * 16, ngs * 16, full);
                }
            }
        return;
    }
    // the consumers: x, then the strips
    const int tid = threadIdx.x, nthr = W * 32;
    pdl_wait();  // x (and y) are the previous kernel's
    // x is read in chunks of XB pairs a thread, every load of a chunk issued before the first is
    // used: one L2 round trip per chunk instead of one per pair (a 14336-column layer is 28 pairs a
    // thread, and nothing can start before x is staged).
    constexpr int XB = 8;
    const int npair = a.kp / 2;
    auto col_of = [&](int d) {  // the column of staged pair d (INT4: v10's order, lane t's 8 pairs together)
        if (KIND != 4) return 2 * d;
        const int rem = d & 31;
        return 64 * (d >> 5) + 16 * ((rem & 7) >> 1) + 2 * (rem >> 3) + 8 * (rem & 1);
    };
    // the first chunk's x (and norm weights) stay in registers from the norm's pass to the staging:
    // one L2 round trip fewer where x is one chunk (4096 columns: 8 pairs a thread)
    auto load_chunk = [&](int d0, float2 (&v)[XB], float2 (&nv)[XB]) {
#pragma unroll
        for (int b = 0; b < XB; b++) {
            const int d = d0 + b * nthr;
            if (d < npair) {
                v[b] = *(const float2 *)(a.x + col_of(d));
                if (NORM) nv[b] = __ldg((const float2 *)(a.nw + col_of(d)));
            }
        }
    };
    float2 v0[XB], nv0[XB];
    load_chunk(tid, v0, nv0);
    float inv = 1.0f;
    if (NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int b = 0; b < XB; b++)
            if (tid + b * nthr < npair) ss = fmaf(v0[b].x, v0[b].x, fmaf(v0[b].y, v0[b].y, ss));
        for (int d0 = tid + XB * nthr; d0 < npair; d0 += XB * nthr) {  // the other chunks (any order serves the sum)
            float2 v[XB];
#pragma unroll
            for (int b = 0; b < XB; b++)
                if (d0 + b * nthr < npair) v[b] = *(const float2 *)(a.x + 2 * (d0 + b * nthr));
#pragma unroll
            for (int b = 0; b < XB; b++)
                if (d0 + b * nthr < npair) ss = fmaf(v[b].x, v[b].x, fmaf(v[b].y, v[b].y, ss));
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) ssr[warp] = ss;
        consumers_sync(nthr);
        ss = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) ss += ssr[w];
        inv = rsqrtf(ss / a.kp + a.eps);
    }
    auto stage_chunk = [&](int d0, const float2 (&v)[XB], const float2 (&nv)[XB]) {
#pragma unroll
        for (int b = 0; b < XB; b++) {
            const int d = d0 + b * nthr;  // a warp's 32 pairs of one b: one tile (d / 32), all in range or none
            if (d >= npair) break;
            float2 x2 = v[b];
            if (NORM) x2.x = x2.x * inv * nv[b].x, x2.y = x2.y * inv * nv[b].y;
            const bool hi = KIND == 4 && ZF && (d & 1);  // INT4's high-nibble columns take x / 16
            if (hi) x2.x *= 0.0625f, x2.y *= 0.0625f;
            xs[d] = h2_sat(x2.x, x2.y);
        }
    };
    stage_chunk(tid, v0, nv0);
    for (int d0 = tid + XB * nthr; d0 < npair; d0 += XB * nthr) {
        float2 v[XB], nv[XB];
        load_chunk(d0, v, nv);
        stage_chunk(d0, v, nv);
    }
    if (ZF) {  // the tiles' P and Q from the staged pairs: a thread a tile (a warp-shuffle tree per
               // staged pair, as before, cost the 14336-column layer 4 x 8 x 10 shuffles a thread)
        consumers_sync(nthr);
        for (int i = tid; i < a.kp / 64; i += nthr) {
            float P = 0.0f, Q = 0.0f;
#pragma unroll 8
            for (int j = 0; j < 32; j++) {
                const int d = (j + lane) & 31;  // lanes on distinct banks
                const float2 f = __half22float2(bits<__half2>(xs[i * 32 + d]));
                const float sp = f.x + f.y;
                P += sp, Q += KIND == 4 && (d & 1) ? 16.0f * sp : sp;  // INT4's high-nibble columns hold x / 16
            }
            ct[2 * i] = P, ct[2 * i + 1] = Q;
        }
    }
    consumers_sync(nthr);
    const __half2 zsym_a = __float2half2_rn(KIND == 4 ? 1032.0f : 1152.0f), zsym_b = __float2half2_rn(-72.0f);
    const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
    // The products of NT tiles of a stage (kcl0, kcl0 + W, ...) into acc: every shared load first,
    // then the mmas, two independent chains per tile (slices 0, 2 and 1, 3), so that the tiles'
    // and strips' mmas overlap instead of each waiting for the one before.
    constexpr int NPG = GM == 2 ? 2 : 1;  // scale groups per tile
    float acc[R][2];
    auto tiles = [&](const unsigned char *stg, int k0, int g0, int kcl0, auto NT) {
        constexpr int N = decltype(NT)::value;
        uint32_t pr[N][8], wa[N][R][4], wb[N][R][4];
        float sl[N][R][NPG], sh[N][R][NPG];
        int gis[N][NPG];
#pragma unroll
        for (int j = 0; j < N; j++) {
            const int kcl = kcl0 + W * j, kc = k0 + kcl;
            const uint4 p0 = *(const uint4 *)&xs[kc * 32 + t * 8], p1 = *(const uint4 *)&xs[kc * 32 + t * 8 + 4];
            pr[j][0] = p0.x, pr[j][1] = p0.y, pr[j][2] = p0.z, pr[j][3] = p0.w;
            pr[j][4] = p1.x, pr[j][5] = p1.y, pr[j][6] = p1.z, pr[j][7] = p1.w;
#pragma unroll
            for (int p = 0; p < NPG; p++) gis[j][p] = GM == 0 ? 0 : group_of(kc * 64 + 32 * p, a.gs, a.glog, a.ng) - g0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const unsigned char *part = stg + r * G::PART;
                if (KIND == 4) {
                    strip_w4(part, kcl, lane, wa[j][r]);
                } else {  // rows g and g + 8
                    const uint4 v = *(const uint4 *)(part + g * G::WROW + kcl * 64 + t * 16);
                    const uint4 w8 = *(const uint4 *)(part + (g + 8) * G::WROW + kcl * 64 + t * 16);
                    wa[j][r][0] = v.x, wa[j][r][1] = v.y, wa[j][r][2] = v.z, wa[j][r][3] = v.w;
                    wb[j][r][0] = w8.x, wb[j][r][1] = w8.y, wb[j][r][2] = w8.z, wb[j][r][3] = w8.w;
                }
#pragma unroll
                for (int p = 0; p < NPG; p++)
                    if (GM != 0) strip_scales<G>(part, gis[j][p], g, sl[j][r][p], sh[j][r][p]);
            }
        }
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int p = 0; p < NPG; p++) {
                    __half2 za_lo = zsym_a, zb_lo = zsym_b, za_hi = zsym_a, zb_hi = zsym_b;
                    if (ZP && !ZF) strip_zeros4<G>(stg + r * G::PART, gis[j][p], g, za_lo, zb_lo, za_hi, zb_hi);
                    float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                    for (int i = (GM == 2 ? 2 * p : 0); i < (GM == 2 ? 2 * p + 2 : 4); i++) {
                        uint32_t b[4];  // dq4_pairs' order; the A fragment is {b[0], b[2], b[1], b[3]}
                        if (ZF && KIND == 4) {  // 1024 + q, 1024 + 16 q as they are
                            const uint32_t w = wa[j][r][i], w2 = w >> 8, M = 0x64006400u;
                            b[0] = and_or(w, 0x000F000Fu, M), b[1] = and_or(w, 0x00F000F0u, M);
                            b[2] = and_or(w2, 0x000F000Fu, M), b[3] = and_or(w2, 0x00F000F0u, M);
                        } else if (ZF) {
                            const uint32_t w = wa[j][r][i], w8 = wb[j][r][i], P = 0x64646464u;
                            b[0] = __byte_perm(w, P, 0x5140u), b[1] = __byte_perm(w, P, 0x5342u);
                            b[2] = __byte_perm(w8, P, 0x5140u), b[3] = __byte_perm(w8, P, 0x5342u);
                        } else if (KIND == 4) {
                            dq4_pairs(wa[j][r][i], za_lo, zb_lo, za_hi, zb_hi, sixteenth, b);
                        } else {
                            dq8_pairs(wa[j][r][i], wb[j][r][i], za_lo, za_hi, b);
                        }
                        const uint32_t A[4] = {b[0], b[2], b[1], b[3]};  // rows g, g + 8 x columns (2t, 2t+1), (2t+8, 2t+9)
                        mma16816(__half(), c[i & 1], A, pr[j][2 * i], pr[j][2 * i + 1]);
                    }
                    float lo = c[0][0] + c[1][0], hi = c[0][2] + c[1][2];
                    if (ZF) {  // the offsets off: 1024 P + z Q, z of row g / g + 8
                        const int kc = k0 + kcl0 + W * j;
                        const float P = ct[2 * kc], Q = ct[2 * kc + 1];
                        float zl = KIND == 4 ? 8.0f : 128.0f, zh = zl;
                        if (ZP) {
                            const uint8_t *zs = stg + r * G::PART + G::ZOFF + gis[j][p] * 16;
                            zl = zs[g], zh = zs[g + 8];
                        }
                        lo -= fmaf(zl, Q, 1024.0f * P), hi -= fmaf(zh, Q, 1024.0f * P);
                    }
                    if (GM == 0) acc[r][0] += lo, acc[r][1] += hi;
                    else acc[r][0] = fmaf(sl[j][r][p], lo, acc[r][0]), acc[r][1] = fmaf(sh[j][r][p], hi, acc[r][1]);
                }
    };
    RingPos rp;
    int nu = 0;
    for (int u = blockIdx.x; u < a.units; u += gridDim.x, nu++) {
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = 0.0f;
        for (int st = 0; st < nst; st++, rp.next(ns)) {
            const int slot = rp.slot;
            mbar_wait(bar0 + 8 * slot, rp.ph);
            const unsigned char *stg = ring + (size_t)slot * G::STAGE;
            const int k0 = st * TS, k1 = min(nk, k0 + TS);
            const int g0 = GM == 0 ? 0 : group_of(k0 * 64, a.gs, a.glog, a.ng);
            if (k1 - k0 == TS) tiles(stg, k0, g0, warp, std::integral_constant<int, TS / W>{});
            else  // a layer's last, partial stage
                for (int kcl = warp; kcl < k1 - k0; kcl += W) tiles(stg, k0, g0, kcl, std::integral_constant<int, 1>{});
            __syncwarp();
            mbar_arrive(bar0 + 8 * (ns + slot));  // this thread is done with the stage (it releases its own reads)
        }
        // the strip's outputs: lane (g, 0) holds rows g and g + 8 (C's columns are all the same)
        float *rb = red + (nu & 1) * W * R * 16;
        if (t == 0)
#pragma unroll
            for (int r = 0; r < R; r++) rb[(warp * R + r) * 16 + g] = acc[r][0], rb[(warp * R + r) * 16 + g + 8] = acc[r][1];
        consumers_sync(nthr);
        if (tid < 16) {
            float v[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                v[r] = 0.0f;
#pragma unroll
                for (int w = 0; w < W; w++) v[r] += rb[(w * R + r) * 16 + tid];
                if (GM == 0) v[r] *= __half2float(a.scales[(size_t)(u + r * a.pair) * 16 + qt_spos(tid)]);  // ng = 1
            }
            const int row = u * 16 + tid;
            if (SWIGLU) {
                if (row < a.out_rows) a.y[row] = v[0] / (1.0f + expf(-v[0])) * v[R - 1];
            } else if (row < a.rows) {
                out_store(v[0], a.y + row, a.bias, row, a.beta);
            }
        }
    }
#else
    (void)a;
#endif
}

// ---------------------------------------------------------------- k_qtmc: k_qtma over a chain of layers
// A batch-1 decode step runs its quantized projections one kernel each, and every kernel boundary
// costs the stream of weights a gap: the last blocks of one GEMV finish alone (the tail), then the
// next one starts with an empty ring (the ramp), while DRAM idles. The weights do not depend on
// the activations, so nothing but the launch order keeps the next layer's bytes from streaming
// during that gap. k_qtmc runs up to QTC_MAXP layers of a chain (o, gate|up, down and the next
// layer's q|k|v: everything between two attentions) as phases of one persistent kernel: its
// producer thread streams the phases' weights back to back through one ring, never waiting for an
// activation, and its consumers wait between phases at a grid barrier (every block's outputs of
// phase p written before any block stages x for phase p + 1). So while the slowest blocks finish
// phase p, the others' rings are already filling with phase p + 1.
// Each phase is exactly k_qtma v12's product (INT4, 16 tiles per strip and stage; the same tile
// order per warp, the same sums in the same order), so its outputs are bit for bit those of the
// layers run one kernel each. A stage holds two parts of TS tiles: the gate and up strips of a
// SWIGLU phase as in k_qtma, or two consecutive runs of one strip's tiles in the others.
// The barrier is a counter every block adds 1 to after each phase; the last block to finish the
// kernel resets it, so the next launch finds 0 (a launch's consumers touch it only after
// griddepcontrol.wait, i.e. after every kernel before them has completed). All the blocks must be
// resident at once: the grid is the number that fits (cudaOccupancy..., asked at the layers'
// creation), and nothing the blocks wait for runs after them on the stream.
#define QTC_MAXP 4
#define QTC_TS 16
#define QTC_W 8
struct QtcPhase {
    const uint4 *qw;
    const __half *scales;  // strip-major, as k_qtma's
    const uint8_t *zeros;  // or NULL
    int np, kp, gs, glog, ng, rows;
    const float *x, *nw;  // x (kp) fp32; nw: the RMSNorm weight, or NULL (no norm)
    const float *bias;
    float *y;
    float beta;
    int units, pair, out_rows;  // strips (SWIGLU: gate strips); pair > 0: SWIGLU, up strip = gate strip + pair
};
struct QtcArgs {
    QtcPhase p[QTC_MAXP];
    int nph, ns, maxkp;  // phases, ring stages, the widest x (kp) of the phases
    float eps;
    unsigned int *bar;  // the grid barrier's counter (0 at launch; back to 0 at exit)
    int n2;             // SWIGLU tiles two a warp at a time (QLINEAR_CHAIN_N2=1, for measuring)
};

#ifdef WGMMA_ARCH
__device__ __forceinline__ unsigned int ld_acquire_u32(const unsigned int *p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
#endif

template <int GM, bool ZP>
__global__ void __launch_bounds__((QTC_W + 1) * 32, 2) k_qtmc(const QtcArgs a) {
#ifdef WGMMA_ARCH
    constexpr int TS = QTC_TS, W = QTC_W;
    using G = QTmaGeom<4, TS, GM, ZP, true>;  // two parts a stage (G::PART each)
    extern __shared__ __align__(128) unsigned char sm[];
    const int ns = a.ns;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(sm);  // full[ns], then empty[ns]
    unsigned char *ring = sm + (2 * ns * 8 + 127) / 128 * 128;
    uint32_t *xs = (uint32_t *)(ring + (size_t)ns * G::STAGE);  // maxkp / 2 fp16 pairs
    float *red = (float *)(xs + a.maxkp / 2);                   // [2][W][2][16]
    float *ssr = red + 2 * W * 2 * 16;                          // [W]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    if (threadIdx.x == 0)
        for (int i = 0; i < ns; i++) mbar_init(bar0 + 8 * i, 1), mbar_init(bar0 + 8 * (ns + i), W * 32);
    __syncthreads();
    pdl_trigger();
    if (warp == W) {  // the producer: every phase's weights and scales, back to back
        if (lane != 0) return;
        const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring);
        RingPos rp;
        // each phase's code apart (the loop unrolled): its arguments stay constant-bank operands
        // instead of registers loaded by a run-time index
#pragma unroll
        for (int ph = 0; ph < QTC_MAXP; ph++) {
            if (ph >= a.nph) break;
            const QtcPhase &P = a.p[ph];
            const bool sw = P.pair > 0;
            const int nk = P.kp / 64, span = sw ? TS : 2 * TS, nst = (nk + span - 1) / span;
            for (int u = blockIdx.x; u < P.units; u += gridDim.x)
                for (int st = 0; st < nst; st++, rp.next(ns)) {
                    const int slot = rp.slot;
                    const uint32_t full = bar0 + 8 * slot;
                    mbar_wait(bar0 + 8 * (ns + slot), rp.ph ^ 1u);  // the consumers are done with it
                    int s[2], k0[2], k1[2], g0[2], ngs[2];
                    uint32_t bytes = 0;
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        s[r] = sw ? u + r * P.pair : u;
                        k0[r] = sw ? st * TS : st * 2 * TS + r * TS;
                        k1[r] = min(nk, k0[r] + TS);
                        if (k1[r] <= k0[r]) continue;
                        g0[r] = GM == 0 ? 0 : group_of(k0[r] * 64, P.gs, P.glog, P.ng);
                        ngs[r] = GM == 0 ? 1 : group_of(k1[r] * 64 - 1, P.gs, P.glog, P.ng) - g0[r] + 1;
                        bytes += (k1[r] - k0[r]) * 512 + ngs[r] * QT_SB + (ZP ? ngs[r] * 16 : 0);
                    }
                    mbar_expect_tx(full, bytes);
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        if (k1[r] <= k0[r]) continue;
                        const uint32_t d = ring0 + slot * G::STAGE + r * G::PART;
                        bulk_g2s(d, P.qw + ((size_t)s[r] * nk + k0[r]) * 32, (k1[r] - k0[r]) * 512, full);
                        bulk_g2s(d + G::SOFF, P.scales + ((size_t)s[r] * P.ng + g0[r]) * 16, ngs[r] * QT_SB, full);
                        if (ZP) bulk_g2s(d + G::ZOFF, P.zeros + ((size_t)s[r] * P.ng + g0[r]) * 16, ngs[r] * 16, full);
                    }
                }
        }
        return;
    }
    const int tid = threadIdx.x, nthr = W * 32;
    pdl_wait();  // the first phase's x (and every y) belong to the kernels before
    const __half2 zsym_a = __float2half2_rn(1032.0f), zsym_b = __float2half2_rn(-72.0f);
    const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
    constexpr int NPG = GM == 2 ? 2 : 1;  // scale groups per tile
    float acc[2][2];
    // k_qtma's tile products (KIND 4, not zero-folded), R parts of the stage into acc[0..R-1].
    // This and the staging of x below are k_qtma's code, copied, not shared: moved into common
    // helpers, the compiled k_qtma (the default GEMV, whose numbers the README gives) changed in
    // 117 of its 216 instances (SASS compared locally), which no GPU was left to re-measure.
    // Share them once this kernel is measured (a change of k_qtma must then be timed again).
    auto tiles = [&](int gs, int glog, int ng, const unsigned char *stg, int k0, int g0, int kcl0, auto RR, auto NT) {
        constexpr int R = decltype(RR)::value, N = decltype(NT)::value;
        uint32_t pr[N][8], wa[N][R][4];
        float sl[N][R][NPG], sh[N][R][NPG];
        int gis[N][NPG];
#pragma unroll
        for (int j = 0; j < N; j++) {
            const int kcl = kcl0 + W * j, kc = k0 + kcl;
            const uint4 p0 = *(const uint4 *)&xs[kc * 32 + t * 8], p1 = *(const uint4 *)&xs[kc * 32 + t * 8 + 4];
            pr[j][0] = p0.x, pr[j][1] = p0.y, pr[j][2] = p0.z, pr[j][3] = p0.w;
            pr[j][4] = p1.x, pr[j][5] = p1.y, pr[j][6] = p1.z, pr[j][7] = p1.w;
#pragma unroll
            for (int p = 0; p < NPG; p++) gis[j][p] = GM == 0 ? 0 : group_of(kc * 64 + 32 * p, gs, glog, ng) - g0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const unsigned char *part = stg + r * G::PART;
                strip_w4(part, kcl, lane, wa[j][r]);
#pragma unroll
                for (int p = 0; p < NPG; p++)
                    if (GM != 0) strip_scales<G>(part, gis[j][p], g, sl[j][r][p], sh[j][r][p]);
            }
        }
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int p = 0; p < NPG; p++) {
                    __half2 za_lo = zsym_a, zb_lo = zsym_b, za_hi = zsym_a, zb_hi = zsym_b;
                    if (ZP) strip_zeros4<G>(stg + r * G::PART, gis[j][p], g, za_lo, zb_lo, za_hi, zb_hi);
                    float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                    for (int i = (GM == 2 ? 2 * p : 0); i < (GM == 2 ? 2 * p + 2 : 4); i++) {
                        uint32_t b[4];
                        dq4_pairs(wa[j][r][i], za_lo, zb_lo, za_hi, zb_hi, sixteenth, b);
                        const uint32_t A[4] = {b[0], b[2], b[1], b[3]};
                        mma16816(__half(), c[i & 1], A, pr[j][2 * i], pr[j][2 * i + 1]);
                    }
                    const float lo = c[0][0] + c[1][0], hi = c[0][2] + c[1][2];
                    if (GM == 0) acc[r][0] += lo, acc[r][1] += hi;
                    else acc[r][0] = fmaf(sl[j][r][p], lo, acc[r][0]), acc[r][1] = fmaf(sh[j][r][p], hi, acc[r][1]);
                }
    };
    // one part of a stage: TS tiles (or the layer's last few) from tile k0 on. A warp's tiles of a
    // SWIGLU stage (R = 2) go one at a time: the same sums in the same order as k_qtma's two at a
    // time (each tile's products are added to acc[r] tile by tile either way), in fewer registers,
    // which this kernel, holding the code of every kind of phase, needs under its cap of 96.
    auto part = [&](int gs, int glog, int ng, const unsigned char *stg, int k0, int k1, auto RR) {
        const int g0 = GM == 0 ? 0 : group_of(k0 * 64, gs, glog, ng);
        if ((decltype(RR)::value == 1 || a.n2) && k1 - k0 == TS)
            tiles(gs, glog, ng, stg, k0, g0, warp, RR, std::integral_constant<int, TS / W>{});
        else
            for (int kcl = warp; kcl < k1 - k0; kcl += W)
                tiles(gs, glog, ng, stg, k0, g0, kcl, RR, std::integral_constant<int, 1>{});
    };
    RingPos rp;
    int nu = 0;
#pragma unroll
    for (int ph = 0; ph < QTC_MAXP; ph++) {  // unrolled, as the producer's
        if (ph >= a.nph) break;
        const QtcPhase &P = a.p[ph];
        const bool sw = P.pair > 0;
        const int nk = P.kp / 64, span = sw ? TS : 2 * TS, nst = (nk + span - 1) / span, npair = P.kp / 2;
        if (ph > 0) {  // the grid barrier: every block's outputs of the phase before are written
            consumers_sync(nthr);
            if (tid == 0) {
                __threadfence();
                atomicAdd(a.bar, 1u);
                const unsigned int target = (unsigned int)ph * gridDim.x;
                while (ld_acquire_u32(a.bar) < target) __nanosleep(20);
            }
            consumers_sync(nthr);
        }
        // x as k_qtma stages it (the same pairs, the same norm sums in the same order), with the norm
        // a compile-time choice as there (a run-time one put the chunks in local memory). Plain
        // loads (__ldcg compiled to strong GPU-scope loads, measured slow): the previous phase's
        // outputs are other blocks' writes, and this SM's L1 may hold older copies of those lines,
        // but in the PTX memory model the barrier's ld.acquire.gpu, then bar.sync, orders these
        // loads after those writes, so they may not be served from stale lines.
        constexpr int XB = 8;
        auto col_of = [&](int d) {
            const int rem = d & 31;
            return 64 * (d >> 5) + 16 * ((rem & 7) >> 1) + 2 * (rem >> 3) + 8 * (rem & 1);
        };
        auto stage_x = [&](auto NORM_) {
            constexpr bool NORM = decltype(NORM_)::value;
            auto load_chunk = [&](int d0, float2 (&v)[XB], float2 (&nv)[XB]) {
#pragma unroll
                for (int b = 0; b < XB; b++) {
                    const int d = d0 + b * nthr;
                    v[b] = nv[b] = make_float2(0.0f, 0.0f);  // every element defined: kept in registers
                    if (d < npair) {
                        v[b] = *(const float2 *)(P.x + col_of(d));
                        if (NORM) nv[b] = __ldg((const float2 *)(P.nw + col_of(d)));
                    }
                }
            };
            float2 v0[XB], nv0[XB];
            load_chunk(tid, v0, nv0);
            float inv = 1.0f;
            if (NORM) {
                float ss = 0.0f;
#pragma unroll
                for (int b = 0; b < XB; b++)
                    if (tid + b * nthr < npair) ss = fmaf(v0[b].x, v0[b].x, fmaf(v0[b].y, v0[b].y, ss));
                for (int d0 = tid + XB * nthr; d0 < npair; d0 += XB * nthr) {
                    float2 v[XB];
#pragma unroll
                    for (int b = 0; b < XB; b++)
                        if (d0 + b * nthr < npair) v[b] = *(const float2 *)(P.x + 2 * (d0 + b * nthr));
#pragma unroll
                    for (int b = 0; b < XB; b++)
                        if (d0 + b * nthr < npair) ss = fmaf(v[b].x, v[b].x, fmaf(v[b].y, v[b].y, ss));
                }
                for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                if (lane == 0) ssr[warp] = ss;
                consumers_sync(nthr);
                ss = 0.0f;
#pragma unroll
                for (int w = 0; w < W; w++) ss += ssr[w];
                inv = rsqrtf(ss / P.kp + a.eps);
            }
            auto stage_chunk = [&](int d0, const float2 (&v)[XB], const float2 (&nv)[XB]) {
#pragma unroll
                for (int b = 0; b < XB; b++) {
                    const int d = d0 + b * nthr;
                    if (d >= npair) break;
                    float2 x2 = v[b];
                    if (NORM) x2.x = x2.x * inv * nv[b].x, x2.y = x2.y * inv * nv[b].y;
                    xs[d] = h2_sat(x2.x, x2.y);
                }
            };
            stage_chunk(tid, v0, nv0);
            for (int d0 = tid + XB * nthr; d0 < npair; d0 += XB * nthr) {
                float2 v[XB], nv[XB];
                load_chunk(d0, v, nv);
                stage_chunk(d0, v, nv);
            }
        };
        if (P.nw) stage_x(std::true_type{});
        else stage_x(std::false_type{});
        consumers_sync(nthr);
        for (int u = blockIdx.x; u < P.units; u += gridDim.x, nu++) {
            acc[0][0] = acc[0][1] = acc[1][0] = acc[1][1] = 0.0f;
            for (int st = 0; st < nst; st++, rp.next(ns)) {
                const int slot = rp.slot;
                mbar_wait(bar0 + 8 * slot, rp.ph);
                const unsigned char *stg = ring + (size_t)slot * G::STAGE;
                if (sw) {
                    const int k0 = st * TS;
                    part(P.gs, P.glog, P.ng, stg, k0, min(nk, k0 + TS), std::integral_constant<int, 2>{});
                } else {  // two runs of the strip's tiles, summed into acc[0] in k_qtma's order
                    const int k0 = st * 2 * TS;
                    part(P.gs, P.glog, P.ng, stg, k0, min(nk, k0 + TS), std::integral_constant<int, 1>{});
                    if (k0 + TS < nk)
                        part(P.gs, P.glog, P.ng, stg + G::PART, k0 + TS, min(nk, k0 + 2 * TS), std::integral_constant<int, 1>{});
                }
                __syncwarp();
                mbar_arrive(bar0 + 8 * (ns + slot));
            }
            float *rb = red + (nu & 1) * W * 2 * 16;
            if (t == 0)
#pragma unroll
                for (int r = 0; r < 2; r++) rb[(warp * 2 + r) * 16 + g] = acc[r][0], rb[(warp * 2 + r) * 16 + g + 8] = acc[r][1];
            consumers_sync(nthr);
            if (tid < 16) {
                float v[2] = {0.0f, 0.0f};
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    if (r == 1 && !sw) break;
#pragma unroll
                    for (int w = 0; w < W; w++) v[r] += rb[(w * 2 + r) * 16 + tid];
                    if (GM == 0) v[r] *= __half2float(P.scales[(size_t)(u + r * P.pair) * 16 + qt_spos(tid)]);
                }
                const int row = u * 16 + tid;
                if (sw) {
                    if (row < P.out_rows) P.y[row] = v[0] / (1.0f + expf(-v[0])) * v[1];
                } else if (row < P.rows) {
                    float o = v[0] + (P.bias ? __ldg(P.bias + row) : 0.0f);
                    if (P.beta != 0.0f) o += P.beta * P.y[row];  // plain: see the staging of x
                    P.y[row] = o;
                }
            }
        }
    }
    // the kernel's end: the last block out resets the barrier's counter for the next launch
    consumers_sync(nthr);
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(a.bar, 1u) == (unsigned int)a.nph * gridDim.x - 1) atomicExch(a.bar, 0u);
    }
#else
    (void)a;
#endif
}

// ---------------------------------------------------------------- k_qtmat: k_qtma for 2..16 tokens
// qlinear_gpu_gemm's INT4 path on sm_90 for T <= 16. k_qgemm4 (the Marlin-style tile GEMM) reads
// each 128-row block's weights with plain loads and reaches ~20% of the copy bandwidth at T = 16;
// the weights are the same bytes as at T = 1, so here k_qtma's machinery carries them: the
// producer's bulk copies into a ring, the consumers' one uint4 of weights per lane per tile
// dequantized once into the A fragment (16 rows) and multiplied by x as B, whose 8 columns are now
// 8 tokens (NT = 2: two mmas per A fragment for tokens 0..7 and 8..15). What changes is x: 16
// tokens of a 4096-column layer are 128 KB, of a 14336-column one 448 KB, more than a block's
// shared memory, and every block reads all of it. So the columns are cut into nc chunks that fit:
// block b works on chunk b % nc only, over the strips b / nc, b / nc + grid / nc, ...; with nc > 1
// each chunk's sums go to a scratch (nc, T, rows) and a second kernel adds them in chunk order
// (deterministic, no atomics).
// x comes as it is (X's bf16 or fp16, columns in order) by the producer's bulk copies, one row a
// token, a stage's columns at a time on their own barrier, right after the ring's first round of
// weights: the first unit's stage st waits for its columns only, and the consumers spend no
// instruction on x. Blocks go in clusters of two (qtmat_cl) that take the same chunk, each copying
// every other token row into both with a multicast copy, so x leaves L2 once a pair. The mma then
// runs in X's type (bf16: the weights' q - z are small integers, exact in bf16 as in fp16), and
// ldmatrix gives the B fragments (8 tokens x 8 columns a matrix) from rows 16 bytes (mod 128) apart.
// Before (to 2026-12-07) the consumers loaded x with plain loads, converted it to fp16 in a permuted
// pair order and met at a barrier before the first tile: Nsight Compute put 52% (o), 37% (q|k|v) and
// 23% (down) of the 16-row kernel's stall samples there.
// SP = 2 (two strips a unit, 32 tiles a stage): a stage holds 16 tiles of each of two adjacent strips
// at the same columns, so each x fragment a lane loads serves both strips' A fragments, and the
// warps' partial sums meet (stored, a barrier, added) once per two strips: gate_up at 16 rows 39.8
// -> 34.7 us on an H100 (README "Two strips a unit").
// The folded RMSNorm's r_t = 1 / sqrt(sum_p ss[p] * inv_d + eps) from one token's nss partial sums of
// squares (QGemmNorm), by one warp and in one order wherever it is needed (k_qtmat's epilogue,
// k_norm_finish): each lane sums every 32nd partial, then a butterfly; every lane gets r_t.
__device__ __forceinline__ float norm_rt(const float *ss, int nss, float inv_d, float eps, int lane) {
    float v = 0.0f;
    for (int p = lane; p < nss; p += 32) v += ss[p];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return rsqrtf(v * inv_d + eps);
}

struct QTmatArgs {
    const uint4 *qw;
    const __half *scales;  // strip-major, as k_qtma's
    const uint8_t *zeros;  // or NULL
    int np, kp, gs, glog, ng, rows;
    const void *X;  // (T, ldx) bf16 or fp16, 16-byte aligned rows, kp valid columns
    int ldx, T;
    float *Y;  // nc == 1: Y (T, ldy) = sums + beta Y; else the chunk sums P (nc, T, rows)
    int ldy;
    float beta;
    int units, nc, kct, ns;  // units of SP strips; column chunks, tiles per chunk; ring stages
    int pair;  // SW: gate|up stacked, the up strip of unit u is u + pair (units = pair)
    void *H;   // SW: H (T, ldh) in X's type = silu(gate) * up, in place of Y
    int ldh;
    int xpre, xall;  // stages of weights before x's first; x a stage at a time (0) or all at once (1)
    int cl;          // blocks a cluster (1, 2, 4): they share a chunk, and each copies T / cl of x's rows into all
    int red;         // nc > 1, beta = 1: each chunk's sums added into Y (T, ldy) by atomic adds, no P, no k_qtmat_sum
    int rb1;         // the warps' partial sums in one buffer (a barrier more a unit) instead of two
    int adj;         // a warp's tiles of a stage adjacent (warp N + j) instead of W apart (warp + W j)
    // the RMSNorm folded in (qlinear_gpu_gemm_norm; nc == 1): out, where nw: besides Y, xn (T, ldxn)
    // in X's type = y * nw[row] and sso[t * nsso + strip] = the strip's sum of y^2 for token t;
    // in, where ssi: the sums scaled by r_t = rsqrt(sum_p ssi[t * nssi + p] * inv_d + eps) first
    const float *nw;
    void *xn;
    int ldxn, nsso;
    float *sso;
    const float *ssi;
    int nssi;
    float inv_d, eps;
};
#define QTT_TS 16  // tiles a stage up to 4 rows (qtmat_ts: 32 above; QLINEAR_QTMAT_TS or qlinear_gemm_set_qtmat_ts fix it)
#define QTT_W 8    // consumer warps (16 measured no faster twice: README "A fourth stage where x is in chunks")
#define QTT_XB 32  // the most stages a chunk of x has (a barrier each)
__host__ __device__ constexpr int qtmat_xs(int kct) { return kct * 32 + 4; }  // words a token row: +16 bytes, so 8 rows' 16-byte pieces fall on distinct banks
__host__ __device__ constexpr int qtmat_hdr(int ns) { return ((2 * ns + QTT_XB) * 8 + 127) / 128 * 128; }  // the barriers' bytes

#ifdef WGMMA_ARCH
// q - z of one k_qtmat weight word in X's type, as the A fragment's pairs: rows g (b[0]: columns
// 2t, 2t + 1; b[1]: 2t + 8, 2t + 9) and g + 8 (b[2], b[3]). Every pair is taken at bits 0..3 (w,
// w >> 4, w >> 8, w >> 12: bf16 has no room for 16 q), where magic + q is exact; zlo and zhi are
// the pairs (magic + z) of rows g and g + 8.
template <class X> __device__ __forceinline__ void dq4_nat(uint32_t wd, uint32_t zlo, uint32_t zhi, uint32_t (&b)[4]) {
    constexpr uint32_t M = Q16<X>::MAGIC;
    b[0] = sub2(X(), and_or(wd, 0x000F000Fu, M), zlo);
    b[1] = sub2(X(), and_or(wd >> 4, 0x000F000Fu, M), zlo);
    b[2] = sub2(X(), and_or(wd >> 8, 0x000F000Fu, M), zhi);
    b[3] = sub2(X(), and_or(wd >> 12, 0x000F000Fu, M), zhi);
}
#endif

// SW (SwiGLU, SP = 2, nc = 1): the layer is gate|up stacked and unit u is gate strip u with up
// strip u + pair; the epilogue writes h = silu(gate) * up in X's type instead of the two strips'
// fp32 sums (the same sums, in the same order, as the unfused GEMM's; the same formula as step07's
// SwiGLU kernel), so the step has no SwiGLU launch and no (T, 2 ff) fp32 buffer to write and read.
template <class X, int GM, bool ZP, int NT, int TS, int SP, bool SW>
__global__ void __launch_bounds__((QTT_W + 1) * 32, 1) k_qtmat(const QTmatArgs a) {
    static_assert(!SW || SP == 2, "SwiGLU pairs a gate and an up strip in one unit");
#ifdef WGMMA_ARCH
    constexpr int TSS = TS / SP;  // tiles of each of the unit's SP strips in a stage
    using G = QTmaGeom<4, TSS, GM, ZP, false>;  // one strip's part of a stage (a stage: SP parts)
    constexpr int W = QTT_W, NTOK = 8 * NT;
    extern __shared__ __align__(128) unsigned char sm[];
    // block -> (chunk, first unit): the blocks of a cluster (cl of them, consecutive) share a chunk;
    // gpc blocks a chunk take its units u0, u0 + gpc, ... (cl = 1: chunk b % nc, u0 = b / nc)
    const int ns = a.ns, nk = a.kp / 64, nc = a.nc, gpc = gridDim.x / nc, cl = a.cl;
    const int cid = blockIdx.x / cl, crank = blockIdx.x % cl, u0 = cid / nc * cl + crank;
    const int chunk = cid % nc, kc0 = chunk * a.kct, kc1 = min(nk, kc0 + a.kct);
    const int nst = (kc1 - kc0 + TSS - 1) / TSS, XP = qtmat_xs(a.kct) * 4;  // stages a unit; bytes a token row of x
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(sm);  // full[ns], empty[ns], then x's [QTT_XB]
    const uint32_t xb0 = bar0 + 16 * ns;
    unsigned char *ring = sm + qtmat_hdr(ns);
    unsigned char *xs = ring + (size_t)ns * SP * G::PART;  // [NTOK][XP bytes]: the chunk's columns of x in X's type
    float *red = (float *)(xs + (size_t)NTOK * XP);        // [2 (rb1: 1)][W][SP][16 tokens][16 rows]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    if (threadIdx.x == 0) {  // as k_qtma's: empty counts every consumer thread (W x 32); x's: the producer
        for (int i = 0; i < ns; i++) mbar_init(bar0 + 8 * i, 1), mbar_init(bar0 + 8 * (ns + i), W * 32);
        for (int i = 0; i < nst; i++) mbar_init(xb0 + 8 * i, 1);
        if (cl > 1) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (cl > 1) cluster_sync_all();  // (every thread of the cluster's blocks is here: none has returned)
    else __syncthreads();
    pdl_trigger();
    if (warp == W) {  // the producer, as k_qtma's over this block's chunk
        if (lane != 0) return;
        const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring), xs0 = (uint32_t)__cvta_generic_to_shared(xs);
        // x's T rows of the chunk, a stage's columns on each barrier, after pdl_wait (X is the
        // previous kernel's): the first xpre stages of weights (constants) go first, then x's stage
        // st before the weights of stage xpre + st (xall: all of x at once)
        // In a cluster each block copies the rows tok = crank (mod cl) into every block of it, and
        // every block, a unit or not, waits for all of its x (no block leaves while others copy into it).
        int xi = u0 < a.units || cl > 1 ? -1 : nst;  // the next stage of x (-1: before pdl_wait; alone without a unit: none)
        auto x_upto = [&](int n) {
            if (xi < 0) pdl_wait(), xi = 0;
            for (; xi < min(n, nst); xi++) {
                const int k0 = kc0 + xi * TSS, k1 = min(kc1, k0 + TSS);
                const uint32_t bytes = (uint32_t)(k1 - k0) * 128, xb = xb0 + 8 * xi;
                mbar_expect_tx(xb, bytes * (uint32_t)a.T);
                for (int tok = crank; tok < a.T; tok += cl) {
                    const uint32_t d = xs0 + (uint32_t)(tok * XP + (k0 - kc0) * 128);
                    const X *src = (const X *)a.X + (size_t)tok * a.ldx + (size_t)k0 * 64;
                    if (cl > 1) bulk_g2s_mc(d, src, bytes, xb, (uint16_t)((1u << cl) - 1u));
                    else bulk_g2s(d, src, bytes, xb);
                }
            }
        };
        int issued = 0;
        RingPos rp;
        for (int u = u0; u < a.units; u += gpc)
            for (int st = 0; st < nst; st++, rp.next(ns), issued++) {
                if (xi < nst && issued >= a.xpre) x_upto(a.xall ? nst : issued - a.xpre + 1);
                const int slot = rp.slot;
                const uint32_t full = bar0 + 8 * slot;
                mbar_wait(bar0 + 8 * (ns + slot), rp.ph ^ 1u);
                const int k0 = kc0 + st * TSS, k1 = min(kc1, k0 + TSS);
                const int g0 = GM == 0 ? 0 : group_of(k0 * 64, a.gs, a.glog, a.ng);
                const int ngs = GM == 0 ? 1 : group_of(k1 * 64 - 1, a.gs, a.glog, a.ng) - g0 + 1;
                const uint32_t wbytes = (k1 - k0) * 512;
                mbar_expect_tx(full, SP * (wbytes + ngs * QT_SB + (ZP ? ngs * 16 : 0)));
#pragma unroll
                for (int r = 0; r < SP; r++) {  // strip u SP + r into the stage's part r (past the
                    // last strip, an odd count's: the unit's first again, its sums computed, not written)
                    const size_t sr = SW ? (size_t)u + (r ? a.pair : 0)
                                         : (size_t)u * SP + ((size_t)u * SP + r < (size_t)(a.np / 16) ? r : 0);
                    const uint32_t d = ring0 + slot * SP * G::PART + r * G::PART;
                    bulk_g2s(d, a.qw + (sr * nk + k0) * 32, wbytes, full);
                    bulk_g2s(d + G::SOFF, a.scales + (sr * a.ng + g0) * 16, ngs * QT_SB, full);
                    if (ZP) bulk_g2s(d + G::ZOFF, a.zeros + (sr * a.ng + g0) * 16, ngs * 16, full);
                }
            }
        x_upto(nst);
        return;
    }
    const int tid = threadIdx.x, nthr = W * 32;
    pdl_wait();  // Y (beta Y) is the previous kernels' (x: the producer's copies, after its own wait)
    // ldmatrix's rows: lane l gives token 8 n + l % 8's (past T the last token's: those products are
    // never written) 16 bytes at columns 8 (l / 8) .. of each 32, so the four 8 x 8 matrices of a
    // load are the B fragments (b0, b1) of two k16 steps
    const unsigned char *xl[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) xl[n] = xs + (size_t)min(8 * n + (lane & 7), a.T - 1) * XP + (lane >> 3) * 16;
    const uint32_t zsym = x2_of(X(), Q16<X>::LO + 8.0f);  // magic + 8: the symmetric zero
    constexpr int NPG = GM == 2 ? 2 : 1;
    constexpr int N = TSS / W;  // k positions (one tile of each of the SP strips) a warp in a whole stage
    float acc[SP][NT][4];
    // The products of the tiles at k positions kcl0, kcl0 + W, ... (NJ of them) of a stage, SP
    // strips each, into acc: each x fragment loaded once serves the SP strips' tiles at its columns.
    auto tiles = [&](const unsigned char *stg, int k0, int g0, int kcl0, auto NJc) {
        constexpr int NJ = decltype(NJc)::value;
        uint32_t pr[NJ][NT][8], wa[NJ][SP][4];
        float sl[NJ][SP][NPG], sh[NJ][SP][NPG];
        int gis[NJ][NPG];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int kcl = a.adj ? kcl0 * NJ + j : kcl0 + W * j, kc = k0 + kcl, kx = kc - kc0;
#pragma unroll
            for (int n = 0; n < NT; n++) ldmatrix_x4(pr[j][n], xl[n] + kx * 128), ldmatrix_x4(pr[j][n] + 4, xl[n] + kx * 128 + 64);
#pragma unroll
            for (int p = 0; p < NPG; p++) gis[j][p] = GM == 0 ? 0 : group_of(kc * 64 + 32 * p, a.gs, a.glog, a.ng) - g0;
#pragma unroll
            for (int r = 0; r < SP; r++) {
                const unsigned char *part = stg + r * G::PART;
                strip_w4(part, kcl, lane, wa[j][r]);
#pragma unroll
                for (int p = 0; p < NPG; p++)
                    if (GM != 0) strip_scales<G>(part, gis[j][p], g, sl[j][r][p], sh[j][r][p]);
            }
        }
        // Each (tile, group) product goes through c into acc (scaled unless one group: GM 0). With one
        // group a tile (GM 1) a run of tiles of one group (a warp's adjacent tiles, a.adj, of a group
        // of 128 or more columns) is summed in c first and scaled once.
#pragma unroll
        for (int r = 0; r < SP; r++) {
            float c[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int p = 0; p < NPG; p++) {
                    uint32_t zlo = zsym, zhi = zsym;
                    if (ZP) {
                        const uint8_t *zs = stg + r * G::PART + G::ZOFF + gis[j][p] * 16;
                        zlo = x2_of(X(), Q16<X>::LO + (float)zs[g]), zhi = x2_of(X(), Q16<X>::LO + (float)zs[g + 8]);
                    }
#pragma unroll
                    for (int i = (GM == 2 ? 2 * p : 0); i < (GM == 2 ? 2 * p + 2 : 4); i++) {
                        uint32_t b[4];
                        dq4_nat<X>(wa[j][r][i], zlo, zhi, b);
                        const uint32_t A[4] = {b[0], b[2], b[1], b[3]};
#pragma unroll
                        for (int n = 0; n < NT; n++) mma16816(X(), c[n], A, pr[j][n][2 * i], pr[j][n][2 * i + 1]);
                    }
                    if (GM != 1 || j == NJ - 1 || gis[j + 1][0] != gis[j][0]) {  // the run's last tile
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                acc[r][n][e] = GM == 0 ? acc[r][n][e] + c[n][e]
                                                       : fmaf(e < 2 ? sl[j][r][p] : sh[j][r][p], c[n][e], acc[r][n][e]),
                                c[n][e] = 0.0f;
                    }
                }
        }
    };
    RingPos rp;
    int nu = 0;
    for (int u = u0; u < a.units; u += gpc, nu++) {
#pragma unroll
        for (int r = 0; r < SP; r++)
#pragma unroll
            for (int n = 0; n < NT; n++) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.0f;
        for (int st = 0; st < nst; st++, rp.next(ns)) {
            const int slot = rp.slot;
            mbar_wait(bar0 + 8 * slot, rp.ph);
            if (nu == 0) mbar_wait(xb0 + 8 * st, 0);  // the first unit: this stage's columns of x too
            const unsigned char *stg = ring + (size_t)slot * SP * G::PART;
            const int k0 = kc0 + st * TSS, k1 = min(kc1, k0 + TSS);
            const int g0 = GM == 0 ? 0 : group_of(k0 * 64, a.gs, a.glog, a.ng);
            if (k1 - k0 == TSS) tiles(stg, k0, g0, warp, std::integral_constant<int, N>{});
            else
                for (int kcl = warp; kcl < k1 - k0; kcl += W) tiles(stg, k0, g0, kcl, std::integral_constant<int, 1>{});
            __syncwarp();
            // this thread's reads of the stage before the producer's next bulk copy into it: each
            // thread fences and arrives, as each releases only its own reads
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            mbar_arrive(bar0 + 8 * (ns + slot));
        }
        // C's (row g / g + 8, token 2t, 2t + 1 (+ 8 n)) of every warp meet in red [strip][token][row]
        const int rbi = a.rb1 ? 0 : nu & 1;  // the buffer of this unit's sums
        float *rb = red + (rbi * W + warp) * SP * 256;
#pragma unroll
        for (int r = 0; r < SP; r++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) rb[r * 256 + (2 * t + (e & 1) + 8 * n) * 16 + g + (e >> 1) * 8] = acc[r][n][e];
        consumers_sync(nthr);
        float *rtk = red + (size_t)(a.rb1 ? 1 : 2) * W * SP * 256;  // [16] norm in: r_t (after the buffers)
        if (a.ssi && nu == 0) {  // the first unit: r_t of every token, a warp a token, partials in order
            for (int tk = warp; tk < a.T; tk += W) {
                const float rt = norm_rt(a.ssi + (size_t)tk * a.nssi, a.nssi, a.inv_d, a.eps, lane);
                if (lane == 0) rtk[tk] = rt;
            }
            consumers_sync(nthr);
        }
        if constexpr (SW) {  // unit u: gate strip u (part 0), up strip u + pair (part 1)
            const float *rs = red + (size_t)rbi * W * SP * 256;
            for (int o = tid; o < NTOK * 16; o += nthr) {
                const int row = o & 15, tok = o >> 4;
                float gv = 0.0f, uv = 0.0f;
#pragma unroll
                for (int w = 0; w < W; w++) gv += rs[w * SP * 256 + o], uv += rs[w * SP * 256 + 256 + o];
                if (GM == 0) {
                    gv *= __half2float(a.scales[(size_t)u * 16 + qt_spos(row)]);
                    uv *= __half2float(a.scales[(size_t)(u + a.pair) * 16 + qt_spos(row)]);
                }
                if (a.ssi && tok < a.T) gv *= rtk[tok], uv *= rtk[tok];
                if (tok < a.T) ((X *)a.H)[(size_t)tok * a.ldh + u * 16 + row] = X(gv / (1.0f + __expf(-gv)) * uv);
            }
        } else {
            for (int o = tid; o < SP * NTOK * 16; o += nthr) {  // (a warp's 32 o: two tokens of one strip)
                const int r = o / (NTOK * 16), oo = o % (NTOK * 16), row = oo & 15, tok = oo >> 4;
                const int strip = u * SP + r, rg = strip * 16 + row;
                const float *rp = red + (size_t)rbi * W * SP * 256 + r * 256 + oo;
                float v = 0.0f, sq = 0.0f;
#pragma unroll
                for (int w = 0; w < W; w++) v += rp[w * SP * 256];
                if (tok < a.T && rg < a.rows) {  // (rows <= np: a strip past the last writes nothing)
                    if (GM == 0) v *= __half2float(a.scales[(size_t)strip * 16 + qt_spos(row)]);  // ng = 1
                    if (a.ssi) v *= rtk[tok];
                    if (nc == 1) {
                        float *y = a.Y + (size_t)tok * a.ldy + rg;
                        const float yv = a.beta != 0.0f ? v + a.beta * *y : v;
                        *y = yv;
                        if (a.nw) ((X *)a.xn)[(size_t)tok * a.ldxn + rg] = X(yv * a.nw[rg]), sq = yv * yv;
                    } else if (a.red) {
                        atomicAdd(a.Y + (size_t)tok * a.ldy + rg, v);  // (result unused: a RED, no return trip)
                    } else {
                        a.Y[((size_t)chunk * a.T + tok) * a.rows + rg] = v;
                    }
                }
                if (a.nw) {  // norm out: the strip's sum of y^2 for this token (its 16 rows: 16 lanes)
#pragma unroll
                    for (int m = 8; m > 0; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
                    if (row == 0 && tok < a.T && strip < a.nsso) a.sso[(size_t)tok * a.nsso + strip] = sq;
                }
            }
        }
        if (a.rb1) consumers_sync(nthr);  // one buffer: every read of it before the next unit's writes
    }
    if (nu == 0 && cl > 1)  // a block of a cluster without a unit: its x has landed before it leaves
        for (int st = 0; st < nst; st++) mbar_wait(xb0 + 8 * st, 0);
#else
    (void)a;
#endif
}
// Y (T, ldy) = the nc chunk sums P (nc, T, rows) added in chunk order + beta Y.
__global__ void k_qtmat_sum(const float *__restrict__ P, int nc, int T, int rows, float *Y, int ldy, float beta) {
    const size_t n = (size_t)T * rows;  // one chunk's sums
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int c = 0; c < nc; c++) v += P[c * n + i];
        float *y = Y + (i / rows) * ldy + i % rows;
        *y = beta != 0.0f ? v + beta * *y : v;
    }
}

// k_qtmat_sum with the RMSNorm's first half folded in (qlinear_gpu_gemm_norm): grid (nsso, T),
// block (b, t) sums columns 256 b .. of token t, writes Y, xn (T, ldxn) = y * nw in X, and the block's
// sum of y^2 to sso[t * nsso + b] (no atomics: the reader adds them in order).
template <class X>
__global__ void __launch_bounds__(256) k_qtmat_sum_norm(const float *__restrict__ P, int nc, int T, int rows, float *Y,
                                                        int ldy, float beta, const float *__restrict__ nw, X *xn,
                                                        int ldxn, float *sso, int nsso) {
    __shared__ float wsum[8];
    const int t = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
    float sq = 0.0f;
    if (c < rows) {
        float v = 0.0f;
        for (int k = 0; k < nc; k++) v += P[((size_t)k * T + t) * rows + c];
        float *y = Y + (size_t)t * ldy + c;
        const float yv = beta != 0.0f ? v + beta * *y : v;
        *y = yv, xn[(size_t)t * ldxn + c] = X(yv * nw[c]), sq = yv * yv;
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = sq;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < 8; w++) s += wsum[w];
        sso[(size_t)t * nsso + blockIdx.x] = s;
    }
}

// Grid (T): row t of xn (ld, cols) *= r_t (norm_rt of its partials): the folded RMSNorm finished in
// xn itself, for a consumer that cannot take the partials (qlinear_gpu_norm_finish).
template <class X>
__global__ void k_norm_finish(X *xn, int ld, int cols, const float *__restrict__ ss, int nss, float inv_d, float eps) {
    __shared__ float rt;
    const int t = blockIdx.x;
    if (threadIdx.x < 32) {
        const float v = norm_rt(ss + (size_t)t * nss, nss, inv_d, eps, threadIdx.x);
        if (threadIdx.x == 0) rt = v;
    }
    __syncthreads();
    X *row = xn + (size_t)t * ld;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] = X((float)row[c] * rt);
}

// Y (T rows of `rows`, ldy) *= beta (= 0 when beta == 0: Y may hold anything).
__global__ void k_scale_y(float *Y, int ldy, int T, int rows, float beta) {
    const size_t n = (size_t)T * rows;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float *p = Y + (i / rows) * ldy + i % rows;
        *p = beta != 0.0f ? beta * *p : 0.0f;
    }
}

// Xo (T, kp) = X (T, ldx) with packed column j = input column perm[j] (or j), zero past cols.
template <class I, class O>
__global__ void k_gather(const I *__restrict__ X, int ldx, int T, const int *__restrict__ perm, int cols, int kp, O *Xo) {
    const size_t n = (size_t)T * kp;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / kp), j = (int)(i % kp);
        Xo[i] = fromf<O>(j < cols ? tof(X[(size_t)t * ldx + (perm ? perm[j] : j)]) : 0.0f);
    }
}
template <class I, class O>
static void gather(const I *X, int ldx, int T, const int *perm, int cols, int kp, O *Xo, cudaStream_t s) {
    const size_t n = (size_t)T * kp;
    const int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    k_gather<I, O><<<blocks, 256, 0, s>>>(X, ldx, T, perm, cols, kp, Xo);
}

// ---------------------------------------------------------------- naive path (any group)
struct QView {
    int kind, rows, cols, group, n_groups, sym;
    const uint8_t *q;
    const float *scales;
    const uint8_t *zeros;
    const int *g_idx;
};
// The weight (r, c) dequantized, as quant.c's dequant_row.
__device__ __forceinline__ float dq(const QView &v, int r, int c) {
    const int g = v.g_idx ? v.g_idx[c] : c / v.group;
    int qi;
    if (v.kind == QK_INT8) qi = v.q[(size_t)r * v.cols + c];
    else {
        const uint8_t b = v.q[(size_t)r * (v.cols / 2) + c / 2];
        qi = c % 2 == 0 ? (b & 0x0F) : (b >> 4);
    }
    const size_t sg = (size_t)r * v.n_groups + g;
    const float z = v.sym ? (float)(1 << (v.kind - 1)) : (float)v.zeros[sg];
    return ((float)qi - z) * v.scales[sg];
}
__global__ void k_qnaive_gemv(QView v, const float *__restrict__ x, const float *__restrict__ b, float *y, int acc) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= v.rows) return;
    float s = 0.0f;
    for (int c = lane; c < v.cols; c += 32) s = fmaf(dq(v, row, c), x[c], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[row] = s + (b ? b[row] : 0.0f) + (acc ? y[row] : 0.0f);
}
template <class X>
__global__ void k_qnaive_gemm(QView v, int T, const X *__restrict__ Xm, int ldx, float *Y, int ldy, float beta) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= v.rows || t >= T) return;
    const X *x = Xm + (size_t)t * ldx;
    float s = 0.0f;
    for (int c = 0; c < v.cols; c++) s = fmaf(dq(v, r, c), tof(x[c]), s);
    float *yo = Y + (size_t)t * ldy + r;
    *yo = beta == 0.0f ? s : s + beta * *yo;
}
static QView view(const QLinearGpu *q) {
    QView v = {(int)q->kind, q->rows, q->cols, q->group0, q->ng, q->sym, q->q0, q->s0, q->z0, q->g0};
    return v;
}

// ---------------------------------------------------------------- the API
static bool qtma_can(const QLinearGpu *q);  // below: whether k_qtma can run a layer
static void qtma_prepare(QLinearGpu *q);    // and its set-up at creation
static void qtmat_prepare(const QLinearGpu *q);  // k_qtmat's (qlinear_gpu_gemm, T <= 16)
extern "C" QLinearGpu *qlinear_gpu_new(const QWeight *w, char *err, int errlen) {
    if (!w || (w->kind != QK_INT8 && w->kind != QK_INT4) || w->rows < 1 || w->cols < 1 || w->n_groups < 1 || !w->q ||
        !w->scales || (!w->sym && !w->zeros)) {
        snprintf(err, errlen, "qlinear_gpu_new: not a valid QWeight");
        return NULL;
    }
    int dev = 0, major = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "qlinear_gpu_new: no CUDA device");
        return NULL;
    }
    QLinearGpu *q = (QLinearGpu *)calloc(1, sizeof *q);
    if (!q) {
        snprintf(err, errlen, "qlinear_gpu_new: out of host memory");
        return NULL;
    }
    q->kind = w->kind, q->rows = w->rows, q->cols = w->cols, q->ng = w->n_groups, q->sym = w->sym;
    q->sms = sms, q->major = major, q->tc_gm = -1;
    char why[160] = "";
    QPacked p;
    cudaError_t e = cudaSuccess;
    char gbuf[32];
    if (w->n_groups == 1) snprintf(gbuf, sizeof gbuf, "per-channel");
    else snprintf(gbuf, sizeof gbuf, "g%d", w->g_idx ? w->cols / w->n_groups : w->group);
    if (qpack_supported(w, why, sizeof why)) {
        if (qpack(w, &p, err, errlen) != 0) {
            free(q);
            return NULL;
        }
        q->fast = 1, q->np = p.np, q->kp = p.kp, q->gs = p.gs, q->glog = -1;
        if (p.ng == 1) q->glog = 30;  // every packed column (< 2^30) in group 0
        else
            for (int b = 0; b < 30; b++)
                if (p.gs == 1 << b) q->glog = b;
        // The tensor-core body exists only in code built for sm_80+ (__CUDA_ARCH__ >= 800); a
        // binary whose newest code is older (say CUDA_ARCHS=75 run on an sm_90 through its PTX)
        // has an empty k_qgemm4, so ask what k_qgemm4 was compiled for, not only the device.
        cudaFuncAttributes fa;
        const int mma_built =
            cudaFuncGetAttributes(&fa, k_qgemm4<__half, 1, false>) == cudaSuccess && fa.ptxVersion >= 80;
        cudaGetLastError();
        // k_qmma (INT4 and INT8): groups of one 64-column tile or more, or of 32 columns for INT4
        q->tc_gm = !(major >= 8 && mma_built) ? -1
                   : p.ng == 1                ? 0
                   : p.gs % 64 == 0           ? 1
                   : w->kind == QK_INT4       ? 2
                                              : -1;
        q->mma = q->mma_ok = major >= 8 && mma_built && (w->kind == QK_INT4 || q->tc_gm >= 0);
        const size_t ngp = (size_t)p.ng * p.np;
        e = upload(&q->qw, p.qw, p.n_words);
        if (e == cudaSuccess) e = upload(&q->scales, p.scales, ngp);
        if (e == cudaSuccess && p.zeros) e = upload(&q->zeros, p.zeros, ngp);
        if (e == cudaSuccess && p.perm) e = upload(&q->perm, p.perm, (size_t)w->cols);
        q->qt = e == cudaSuccess && qtma_can(q);
        if (q->qt) {  // the Hopper kernels' strip-major fp16 scales (and zeros)
            __half *st = (__half *)malloc(ngp * sizeof(__half));
            uint8_t *zt = p.zeros ? (uint8_t *)malloc(ngp) : NULL;
            if (!st || (p.zeros && !zt)) e = cudaErrorMemoryAllocation;
            for (size_t i = 0; st && i < ngp; i++) {  // i = (strip * ng + group) * 16 + row in strip
                const size_t strip = i / 16 / p.ng, grp = i / 16 % p.ng, n = strip * 16 + i % 16;
                const float sc = p.scales[grp * p.np + n];
                st[(i & ~(size_t)15) + qt_spos((int)(i % 16))] = __float2half_rn(fminf(fmaxf(sc, -65504.0f), 65504.0f));
                if (zt) zt[i] = p.zeros[grp * p.np + n];
            }
            if (e == cudaSuccess) e = upload(&q->scales_t, st, ngp);
            if (e == cudaSuccess && zt) e = upload(&q->zeros_t, zt, ngp);
            free(st), free(zt);
        }
        if (e == cudaSuccess) e = cudaMalloc((void **)&q->xg, (size_t)p.kp * sizeof(float));
        q->gather_x = p.perm || p.kp != p.cols;
        q->bytes = p.n_words * 4 + ngp * (q->qt ? sizeof(__half) : sizeof(float)) + (p.zeros ? ngp : 0) +
                   (p.perm ? (size_t)w->cols * sizeof(int) : 0);
        qpack_free(&p);
        snprintf(q->base, sizeof q->base, "%s %s %s%s", quant_kind_name(w->kind), gbuf, w->sym ? "sym" : "asym",
                 w->g_idx ? " act-order" : "");
        set_desc(q);
    } else {  // the naive kernels on the QWeight as stored
        const size_t qb = w->kind == QK_INT8 ? (size_t)w->rows * w->cols : (size_t)w->rows * (w->cols / 2);
        const size_t ng = (size_t)w->rows * w->n_groups;
        q->group0 = w->group;
        e = upload(&q->q0, w->q, qb);
        if (e == cudaSuccess) e = upload(&q->s0, w->scales, ng);
        if (e == cudaSuccess && !w->sym) e = upload(&q->z0, w->zeros, ng);
        if (e == cudaSuccess && w->g_idx) e = upload(&q->g0, w->g_idx, (size_t)w->cols);
        q->bytes = qb + ng * sizeof(float) + (w->sym ? 0 : ng) + (w->g_idx ? (size_t)w->cols * sizeof(int) : 0);
        snprintf(q->desc, sizeof q->desc, "%s %s %s%s: naive kernels (%s)", quant_kind_name(w->kind), gbuf,
                 w->sym ? "sym" : "asym", w->g_idx ? " act-order" : "", why);
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "qlinear_gpu_new: %s (%d x %d)", cudaGetErrorString(e), w->rows, w->cols);
        cudaGetLastError();
        qlinear_gpu_free(q);
        return NULL;
    }
    qtma_prepare(q);
    qtmat_prepare(q);
    return q;
}

extern "C" void qlinear_gpu_free(QLinearGpu *q) {
    if (!q) return;
    cudaFree(q->qw), cudaFree(q->scales), cudaFree(q->zeros), cudaFree(q->perm);
    cudaFree(q->scales_t), cudaFree(q->zeros_t);
    cudaFree(q->q0), cudaFree(q->s0), cudaFree(q->z0), cudaFree(q->g0);
    cudaFree(q->xg), cudaFree(q->scr), cudaFree(q->part);
    free(q);
}
extern "C" int qlinear_gpu_set_gemm_path(QLinearGpu *q, int path) {
    if (!q || (path != QLINEAR_GEMM_AUTO && path != QLINEAR_GEMM_SIMT)) return -1;
    if (!q->fast) return 0;  // the naive kernels have one path
    q->mma = path == QLINEAR_GEMM_AUTO && q->mma_ok;
    q->simt_forced = path == QLINEAR_GEMM_SIMT;
    set_desc(q);
    return 0;
}
extern "C" size_t qlinear_gpu_bytes(const QLinearGpu *q) { return q ? q->bytes : 0; }
extern "C" int qlinear_gpu_rows(const QLinearGpu *q) { return q ? q->rows : 0; }
extern "C" int qlinear_gpu_cols(const QLinearGpu *q) { return q ? q->cols : 0; }
extern "C" const char *qlinear_gpu_describe(const QLinearGpu *q) {
    if (!q) return "(null)";
    if (q->fast) set_desc((QLinearGpu *)q);  // (qlinear_gemm_set_qtmat may have changed it)
    return q->desc;
}

// The GEMV ladder: the only list of its versions (qgemm_bench times each; qlinear_gpu_gemv runs
// g_qgemv_version, dispatched by its index in launch_simt). v1-v3: k_qgemv4 / k_qgemv8 with U
// 16-byte weight loads in flight per lane (4, 8, 2); v4-v6: k_qgemv4r / k_qgemv8r with W warps
// per block and R tiles (INT4) or rows (INT8) per lane sharing each x load (W 8 R 2, W 16 R 4,
// W 16 R 2).
static const char *const QGEMV_VERSIONS[] = {"v1_u4",     "v2_u8",        "v3_u2",      "v4_r2",
                                             "v5_r4w16",  "v6_r2w16",     "v7_tc_w8u2", "v8_tc_w8u4",
                                             "v9_tc_w16u2", "v10_tc_xs",  "v11_tc_xs_r2", "v12_tma",
                                             "v13_tma_ts32", "v14_tma_ts64w16", "v15_tma_ts32_zf",
                                             "v16_tma_ts64w16_zf", "v17_tma_zf"};
#define N_QGEMV_VERSIONS 17
#define QGEMV_FIRST_TC 6   // v7+: k_qmma (x rounded to fp16)
#define QGEMV_FIRST_TMA 11 // v12+: k_qtma (sm_90a), else v10
// -1 (the default): the fastest rung in the engine, measured (step06_quant/results/qtma_d9e0253_h200:
// INT4 v12_tma 389.4 tok/s, INT8 v13_tma_ts32 347.9; v10_tc_xs 317.3 for INT8). Where k_qtma cannot
// run (no sm_90a code, or no room for x) v10_tc_xs; where k_qmma cannot take a layer's groups, v4_r2
// for INT8 and v1_u4 for INT4.
static int g_qgemv_version = -1;
#define QGEMV_AUTO_INT8 12
#define QGEMV_AUTO_INT4 11
extern "C" int qlinear_gemv_n_versions(void) { return N_QGEMV_VERSIONS; }
extern "C" const char *qlinear_gemv_version_name(int v) {
    return v == -1 ? "auto (INT4 v12_tma, INT8 v13_tma_ts32)" : v >= 0 && v < N_QGEMV_VERSIONS ? QGEMV_VERSIONS[v] : "?";
}
extern "C" void qlinear_gemv_set_version(int v) {
    if (v >= -1 && v < N_QGEMV_VERSIONS) g_qgemv_version = v;
}
extern "C" int qlinear_gpu_gemv_version(const QLinearGpu *q) {
    int v = g_qgemv_version;
    if (v < 0) v = q->kind == QK_INT8 ? QGEMV_AUTO_INT8 : QGEMV_AUTO_INT4;
    if (v >= QGEMV_FIRST_TMA && !q->qt) v = 9;  // no sm_90a code, or no room for x: v10
    if (v >= QGEMV_FIRST_TC && q->tc_gm < 0) v = q->kind == QK_INT8 ? 3 : 0;  // k_qmma cannot take these groups
    return v;
}
extern "C" int qlinear_gemv_version_fp16(int v) { return v >= QGEMV_FIRST_TC && v < N_QGEMV_VERSIONS; }
// Programmatic dependent launch for k_qmma (sm_90): -1 until set, then QLINEAR_PDL=1 in the
// environment turns it on when nothing set it.
static int g_pdl = -1;
extern "C" void qlinear_gemv_set_pdl(int on) { g_pdl = on ? 1 : 0; }
// k_qtma's grid (qtma_go): 0 the fewest blocks that do every strip in the fewest rounds (the
// default), 1 the grid whose busiest SM has the fewest strips (qtma_balanced_grid).
static int g_qtma_grid = 0;
extern "C" void qlinear_gemv_set_grid(int policy) { g_qtma_grid = policy == 1; }
// For measuring: QLINEAR_QTMA_PERSM=n caps k_qtma's blocks per SM at n (1: room on every SM for a
// block of the next kernel, which a dependent launch can then start while this one finishes).
static int qtma_persm_cap(void) {
    static const int cap = env_int("QLINEAR_QTMA_PERSM", 1, 64, 0);
    return cap;
}
static bool pdl_on(const QLinearGpu *q) {
    if (g_pdl < 0) {
        const char *e = getenv("QLINEAR_PDL");
        g_pdl = e && atoi(e) > 0;
    }
    return g_pdl > 0 && q->major >= 9;
}
// A launch, optionally allowed to start before the previous kernel on the stream has finished
// (it then waits in griddepcontrol.wait before touching that kernel's outputs), and (cl > 1) in
// clusters of cl blocks.
template <class... P, class... A>
static void launch_ex_cl(void (*k)(P...), dim3 grid, int threads, size_t smem, cudaStream_t s, bool pdl, int cl, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute at[2];
    int n = 0;
    if (pdl) at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization, at[n++].val.programmaticStreamSerializationAllowed = 1;
    if (cl > 1) at[n].id = cudaLaunchAttributeClusterDimension, at[n].val.clusterDim.x = (unsigned)cl,
                at[n].val.clusterDim.y = 1, at[n++].val.clusterDim.z = 1;  // (grid.x a multiple of cl)
    cfg.attrs = n ? at : NULL, cfg.numAttrs = n;
    cudaLaunchKernelEx(&cfg, k, (P)args...);
}
// How many clusters of cl blocks (this shared memory each) the device holds at once: 0 on error.
template <class... P> static int max_clusters(void (*k)(P...), int threads, size_t smem, int cl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cl), cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension, at[0].val.clusterDim.x = (unsigned)cl, at[0].val.clusterDim.y = 1,
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess) n = 0, cudaGetLastError();
    return n;
}
template <class... P, class... A>
static void launch_ex(void (*k)(P...), dim3 grid, int threads, size_t smem, cudaStream_t s, bool pdl, A... args) {
    launch_ex_cl(k, grid, threads, smem, s, pdl, 1, args...);
}
// ---------------------------------------------------------------- k_qtma's launch
// Whether this process's code has k_qtma's body (sm_90a) and the device is an sm_90: asked once.
static int qtma_built(void) {
    static int built = -1;
    if (built < 0) {
        built = 0;
        int dev = 0, major = 0, *d = NULL, h = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major == 9 &&
            cudaMalloc((void **)&d, sizeof(int)) == cudaSuccess) {
            cudaMemset(d, 0, sizeof(int));
            k_qtma_probe<<<1, 1>>>(d);
            if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess) built = h == 1;
            cudaFree(d);
        }
        cudaGetLastError();
    }
    return built;
}
#define QTMA_SMEM_MAX (227 * 1024)  // an sm_90 block's opt-in shared memory
// Bytes of stages a block aims to keep in flight: k_qtma (the GEMV) 56 KB, k_qtmat 64 KB. The
// GEMV's ring was 64 KB too until the batch-1 Llama-3.1-8B INT4+lm_head step measured 1.934-1.938
// ms with 64 KB and 1.896-1.897 with 48 (24-96 KB tried, README "The GEMV's ring"); with the fp16
// scales a stage is smaller, and 56 KB (6 stages of a one-strip layer, 3 of gate|up) measured
// 1.868 ms against 1.944 for 48 KB (5 and 2; README "fp16 scales"). k_qtmat keeps 64 KB.
#define QTMA_RING (56 * 1024)
#define QTT_RING (64 * 1024)
static size_t qtma_smem(int stage, int ns, int kp, int R, int W) {
    return (size_t)(2 * ns * 8 + 127) / 128 * 128 + (size_t)ns * stage + (size_t)kp * 2 + (size_t)kp / 64 * 8 +
           2 * W * R * 16 * 4 + W * 4;
}
// The GEMV ring's stage count for this layer: QTMA_RING's worth (at least 2), within the block's
// shared memory. For measuring: QLINEAR_QTMA_RING_KB=n aims at n KB instead (read once, before
// the first layer's set-up).
static int qtma_ring_bytes(void) {
    static const int b = env_int("QLINEAR_QTMA_RING_KB", 8, 200, QTMA_RING / 1024) * 1024;
    return b;
}
static int ring_stages(int ring, int stage) { return ring / stage < 2 ? 2 : ring / stage; }
// For measuring, one layer shape at a time: QLINEAR_QTMA_SHAPE="ROWSxCOLS:N[/G][,...]" (at most 8;
// ROWS as the layer holds them, a stacked gate|up 2 x intermediate) gives the GEMV of layers of that
// shape N stages (0: as the rest) and at most G blocks (read once). Returns N (0 where the list does
// not name the shape) and the cap in *grid (0: none).
static int qtma_shape_knob(int rows, int cols, int *grid) {
    static int n = -1, sh[8][4];
    if (n < 0) {
        n = 0;
        const char *e = getenv("QLINEAR_QTMA_SHAPE");
        for (const char *p = e; p && *p && n < 8;) {
            int r = 0, c = 0, k = 0, gcap = 0, used = 0;
            if (sscanf(p, "%dx%d:%d%n", &r, &c, &k, &used) != 3 || r < 1 || c < 1 || k < 0 || k > 64 || k == 1) break;
            p += used;
            if (*p == '/' && (sscanf(p + 1, "%d%n", &gcap, &used) != 1 || gcap < 1)) break;
            if (*p == '/') p += 1 + used;
            sh[n][0] = r, sh[n][1] = c, sh[n][2] = k, sh[n][3] = gcap, n++;
            if (*p == ',') p++;
        }
    }
    if (grid) *grid = 0;
    for (int i = 0; i < n; i++)
        if (sh[i][0] == rows && sh[i][1] == cols) {
            if (grid) *grid = sh[i][3];
            return sh[i][2];
        }
    return 0;
}
static int qtma_stages(int stage, int kp, int R, int W, int rows, int cols) {
    const int nsh = qtma_shape_knob(rows, cols, NULL);
    int ns = nsh ? nsh : ring_stages(qtma_ring_bytes(), stage);
    while (ns > 2 && qtma_smem(stage, ns, kp, R, W) > QTMA_SMEM_MAX) ns--;
    return qtma_smem(stage, ns, kp, R, W) <= QTMA_SMEM_MAX ? ns : 0;
}
// Whether a ring of TS-tile stages fits layer q (SWIGLU: two strips a stage).
static bool qtma_fits(const QLinearGpu *q, int ts, bool swiglu) {
    const int R = swiglu ? 2 : 1;
    return qtma_stages(R * qtma_part(q->kind == QK_INT4 ? 4 : 8, ts, q->tc_gm, q->zeros != NULL), q->kp, R, QT_W(ts),
                       q->rows, q->cols) > 0;
}
// The grid that gives the busiest SM the fewest strips. The fewest-rounds grid can leave SMs
// uneven: the Llama-3.1-8B qkv layer is 384 strips, 2 blocks an SM fit, so it runs 192 blocks of 2
// strips on 132 SMs: 60 SMs hold two blocks (4 strips), 72 one (2 strips), and the step waits for
// the busy ones. With G blocks (at most sms * per_sm resident) of about units / G strips each, and
// the block scheduler spreading blocks over the SMs, the busiest SM holds ceil(G / sms) blocks of
// ceil(units / G) strips; the G that minimizes that product, the largest on a tie (more warps an SM
// to hide latency), here 132 blocks of 2 or 3 strips: 3 strips on the busiest SM instead of 4.
static int qtma_balanced_grid(int units, int sms, int per_sm) {
    int best = 1, cost = units;
    const int most = sms * per_sm < units ? sms * per_sm : units;
    for (int g = 1; g <= most; g++) {
        const int c = (g + sms - 1) / sms * ((units + g - 1) / g);
        if (c <= cost) cost = c, best = g;
    }
    return best;
}
// Launch k_qtma, or (setup, at the layer's creation) allow it its shared memory and record its
// blocks per SM in *per_sm: neither may happen while a stream is being captured.
template <int KIND, int TS, int GM, bool ZP, bool NORM, bool SWIGLU, bool ZF>
static void qtma_go(const QLinearGpu *q, QTmaArgs a, bool pdl, cudaStream_t s, int *per_sm, bool setup) {
    using G = QTmaGeom<KIND, TS, GM, ZP, SWIGLU>;
    auto k = k_qtma<KIND, TS, GM, ZP, NORM, SWIGLU, ZF>;
    a.ns = qtma_stages(G::STAGE, q->kp, G::R, QT_W(TS), q->rows, q->cols);
    const size_t smem = qtma_smem(G::STAGE, a.ns, q->kp, G::R, QT_W(TS));
    if (setup) {
        *per_sm = 1;
        int n = 0;
        if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, QTMA_SMEM_MAX) == cudaSuccess &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, (QT_W(TS) + 1) * 32, smem) == cudaSuccess && n > 1)
            *per_sm = n;
        cudaGetLastError();
        return;
    }
    const int cap = qtma_persm_cap(), ps = cap > 0 && cap < *per_sm ? cap : *per_sm;
    const int most = q->sms * ps, rounds = (a.units + most - 1) / most;
    int grid = (a.units + rounds - 1) / rounds;  // as many strips per block everywhere, within a strip
    if (g_qtma_grid == 1) grid = qtma_balanced_grid(a.units, q->sms, ps);
    int gcap = 0;
    qtma_shape_knob(q->rows, q->cols, &gcap);
    if (gcap > 0 && gcap < grid) grid = gcap;
    launch_ex(k, dim3(grid), (QT_W(TS) + 1) * 32, smem, s, pdl, a);
}
template <int KIND, int TS, bool NORM, bool SWIGLU>
static void qtma_gm(const QLinearGpu *q, const QTmaArgs &a, bool pdl, cudaStream_t s, bool setup, bool zf) {
    const bool zp = q->zeros != NULL;
    zf = zf && q->tc_gm != 2;  // ZF needs whole tiles in a group
    int *per_sm = (int *)&q->qt_per_sm[TS == 16 ? 0 : TS == 32 ? 1 : 2][NORM][SWIGLU][zf];  // written only by the setup call
#define QT_GO(gm, z, f) qtma_go<KIND, TS, gm, z, NORM, SWIGLU, f>(q, a, pdl, s, per_sm, setup)
    if (q->tc_gm == 0) zf ? (zp ? QT_GO(0, true, true) : QT_GO(0, false, true)) : (zp ? QT_GO(0, true, false) : QT_GO(0, false, false));
    else if (q->tc_gm == 1) zf ? (zp ? QT_GO(1, true, true) : QT_GO(1, false, true)) : (zp ? QT_GO(1, true, false) : QT_GO(1, false, false));
    else if constexpr (KIND == 4) zp ? QT_GO(2, true, false) : QT_GO(2, false, false);
#undef QT_GO
}
// k_qtma over x (kp fp32, 8-byte aligned): y = W x' (+ bias) + beta y, x' = x or (nw) its RMSNorm;
// swiglu > 0: the layer is gate|up stacked (2 swiglu rows, swiglu % 16 == 0), y = silu(gate) * up.
template <int TS>
static void qtma_launch(const QLinearGpu *q, const float *x, const float *nw, float eps, const float *bias, float *y,
                        float beta, int swiglu, bool pdl, cudaStream_t s, bool zf, bool setup = false) {
    QTmaArgs a = {(const uint4 *)q->qw, q->scales_t, q->zeros_t, q->np, q->kp, q->gs, q->glog, q->ng, q->rows, x, nw, eps,
                  bias, y, beta, swiglu ? swiglu / 16 : q->np / 16, swiglu / 16, swiglu, 0};
#define QT_KIND(K)                                                           \
    if (nw && swiglu) qtma_gm<K, TS, true, true>(q, a, pdl, s, setup, zf);       \
    else if (nw) qtma_gm<K, TS, true, false>(q, a, pdl, s, setup, zf);           \
    else if (swiglu) qtma_gm<K, TS, false, true>(q, a, pdl, s, setup, zf);       \
    else qtma_gm<K, TS, false, false>(q, a, pdl, s, setup, zf);
    if (q->kind == QK_INT4) {
        QT_KIND(4)
    } else {
        QT_KIND(8)
    }
#undef QT_KIND
}
// Rung v (v12 / v13 / v14: 16, 32, 64 tiles a stage; fewer where the ring would not fit).
static void qtma_run(const QLinearGpu *q, int v, const float *x, const float *nw, float eps, const float *bias, float *y,
                     float beta, int swiglu, bool pdl, cudaStream_t s) {
    const int d = v - QGEMV_FIRST_TMA;  // v12 16, v13 32, v14 64 (16 warps); v15, v16, v17: v13, v14, v12 zero-folded
    int ts = d == 0 || d == 5 ? 16 : d == 1 || d == 3 ? 32 : 64;
    const bool zf = d >= 3;
    while (ts > 16 && !qtma_fits(q, ts, swiglu > 0)) ts /= 2;
    if (ts == 64) qtma_launch<64>(q, x, nw, eps, bias, y, beta, swiglu, pdl, s, zf);
    else if (ts == 32) qtma_launch<32>(q, x, nw, eps, bias, y, beta, swiglu, pdl, s, zf);
    else qtma_launch<16>(q, x, nw, eps, bias, y, beta, swiglu, pdl, s, zf);
}
// Whether k_qtma can run layer q (packed, groups k_qmma takes, sm_90a code on an sm_90, and the
// smallest ring with two strips a stage fits), and at creation each of its instances' blocks per SM.
static bool qtma_can(const QLinearGpu *q) {
    return q->fast && q->tc_gm >= 0 && q->major == 9 && qtma_built() && qtma_fits(q, 16, true);
}
static void qtmc_prepare(QLinearGpu *q);  // below: the chain kernel's (k_qtmc)
static void qtma_prepare(QLinearGpu *q) {
    qtmc_prepare(q);
    if (!q->qt) return;
    static const float one = 1.0f;  // stands for the norm weight: only its presence matters here
    for (int n = 0; n < 2; n++)
        for (int w = 0; w < 2; w++)
            for (int f = 0; f < 2; f++) {
                const float *nw = n ? &one : NULL;
                qtma_launch<16>(q, NULL, nw, 0.0f, NULL, NULL, 0.0f, w ? 16 : 0, false, NULL, f, true);
                if (qtma_fits(q, 32, w)) qtma_launch<32>(q, NULL, nw, 0.0f, NULL, NULL, 0.0f, w ? 16 : 0, false, NULL, f, true);
                if (qtma_fits(q, 64, w)) qtma_launch<64>(q, NULL, nw, 0.0f, NULL, NULL, 0.0f, w ? 16 : 0, false, NULL, f, true);
            }
}

// ---------------------------------------------------------------- k_qtmc's launch
// The chain kernel on (1) or off (0, the default until it is measured faster: the layers one
// kernel each); unset, the environment's QLINEAR_CHAIN=1 turns it on. For measuring, read with
// it: QLINEAR_CHAIN_NS its ring stages (2..8), QLINEAR_CHAIN_N2=1 a gate|up stage's tiles two a
// warp at a time, QLINEAR_CHAIN_DEBUG=1 a line on stderr per launch.
#define QTC_DEFAULT 0
static int g_chain = -1, g_chain_set = -1, g_chain_ns = 0, g_chain_n2 = 0, g_chain_dbg = 0;
static bool chain_on(void) {
    if (g_chain < 0) {
        g_chain = env_int("QLINEAR_CHAIN", INT_MIN, INT_MAX, QTC_DEFAULT) != 0;
        g_chain_ns = env_int("QLINEAR_CHAIN_NS", 2, 8, 0);
        g_chain_n2 = env_int("QLINEAR_CHAIN_N2", 1, INT_MAX, 0) > 0;
        g_chain_dbg = env_int("QLINEAR_CHAIN_DEBUG", 1, INT_MAX, 0) > 0;
    }
    return (g_chain_set >= 0 ? g_chain_set : g_chain) > 0;
}
extern "C" void qlinear_gemv_set_chain(int on) { g_chain_set = on < 0 ? -1 : on ? 1 : 0; }
#define QTC_BLOCK_SMEM (113 * 1024)  // two blocks an SM: 228 KB less 1 KB each the system keeps
static size_t qtmc_smem(int gm, bool zp, int ns, int maxkp) {
    return (size_t)(2 * ns * 8 + 127) / 128 * 128 + (size_t)ns * 2 * qtma_part(4, QTC_TS, gm, zp) + (size_t)maxkp * 2 +
           2 * QTC_W * 2 * 16 * 4 + QTC_W * 4;
}
// Ring stages: 4 (about 72 KB with groups of 128), fewer where two blocks an SM would not fit.
static int qtmc_ns(int gm, bool zp, int maxkp) {
    int ns = g_chain_ns ? g_chain_ns : 4;  // QLINEAR_CHAIN_NS, already within 2..8
    while (ns > 2 && qtmc_smem(gm, zp, ns, maxkp) > QTC_BLOCK_SMEM) ns--;
    return ns;
}
template <int GM, bool ZP>
static void qtmc_go(const QtcArgs *a, size_t smem, int grid, bool pdl, cudaStream_t s, int *per_sm) {
    auto k = k_qtmc<GM, ZP>;
    if (per_sm) {  // set-up (not while capturing): the shared memory allowed, the blocks an SM
        int n = 0;
        *per_sm = 0;
        if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, QTMA_SMEM_MAX) == cudaSuccess &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, (QTC_W + 1) * 32, smem) == cudaSuccess)
            *per_sm = n;
        cudaGetLastError();
        return;
    }
    launch_ex(k, dim3(grid), (QTC_W + 1) * 32, smem, s, pdl, *a);
}
static void qtmc_dispatch(int gm, bool zp, const QtcArgs *a, size_t smem, int grid, bool pdl, cudaStream_t s, int *per_sm) {
    if (gm == 0) zp ? qtmc_go<0, true>(a, smem, grid, pdl, s, per_sm) : qtmc_go<0, false>(a, smem, grid, pdl, s, per_sm);
    else if (gm == 1) zp ? qtmc_go<1, true>(a, smem, grid, pdl, s, per_sm) : qtmc_go<1, false>(a, smem, grid, pdl, s, per_sm);
    else zp ? qtmc_go<2, true>(a, smem, grid, pdl, s, per_sm) : qtmc_go<2, false>(a, smem, grid, pdl, s, per_sm);
}
// At a layer's creation: how many chain blocks fit an SM when this layer has the widest x of a chain.
static void qtmc_prepare(QLinearGpu *q) {
    q->qc_per_sm = 0;
    if (!q->qt || q->kind != QK_INT4 || q->tc_gm < 0) return;
    chain_on();
    const bool zp = q->zeros != NULL;
    qtmc_dispatch(q->tc_gm, zp, NULL, qtmc_smem(q->tc_gm, zp, qtmc_ns(q->tc_gm, zp, q->kp), q->kp), 0, false, NULL,
                  &q->qc_per_sm);
}
// Whether k_qtmc can run this chain: 1 yes, 0 no (see qlinear_gpu.h), -1 bad arguments.
static int chain_check(const QChainPhase *ph, int n) {
    if (!ph || n < 1 || !ph[0].q) return -1;
    if (n > QTC_MAXP || !chain_on()) return 0;
    const QLinearGpu *q0 = ph[0].q;
    const bool zp = q0->zeros != NULL;
    for (int i = 0; i < n; i++) {
        const QLinearGpu *q = ph[i].q;
        const int sw = ph[i].swiglu;
        if (!q || !ph[i].x || !ph[i].y) return -1;
        // v12 layers only (the product k_qtmc repeats), alike in groups and zero points, x read as it is
        if (q->qc_per_sm < 1 || qlinear_gpu_gemv_version(q) != QGEMV_FIRST_TMA || q->tc_gm != q0->tc_gm ||
            (q->zeros != NULL) != zp || q->gather_x || q->cols != q->kp || ((uintptr_t)ph[i].x & 7))
            return 0;
        if (sw && (q->rows != 2 * sw || sw % 16 || ph[i].bias || ph[i].acc)) return 0;
    }
    return 1;
}
extern "C" int qlinear_gpu_gemv_chain_ok(const QChainPhase *ph, int n) { return chain_check(ph, n) == 1; }
extern "C" int qlinear_gpu_gemv_chain(const QChainPhase *ph, int n, float eps, unsigned int *bar, int pdl, void *stream) {
    const int ok = bar ? chain_check(ph, n) : -1;
    if (ok != 1) return ok;
    const QLinearGpu *q0 = ph[0].q;
    const bool zp = q0->zeros != NULL;
    QtcArgs a = {};
    int maxkp = 0, per_sm = 1 << 30;
    for (int i = 0; i < n; i++) {
        const QLinearGpu *q = ph[i].q;
        const int sw = ph[i].swiglu;
        maxkp = q->kp > maxkp ? q->kp : maxkp;
        per_sm = q->qc_per_sm < per_sm ? q->qc_per_sm : per_sm;
        a.p[i] = {(const uint4 *)q->qw, q->scales_t, q->zeros_t, q->np, q->kp, q->gs, q->glog, q->ng, q->rows,
                  ph[i].x, ph[i].nw, ph[i].bias, ph[i].y, ph[i].acc ? 1.0f : 0.0f, sw ? sw / 16 : q->np / 16, sw / 16, sw};
    }
    a.nph = n, a.maxkp = maxkp, a.eps = eps, a.bar = bar, a.n2 = g_chain_n2;
    a.ns = qtmc_ns(q0->tc_gm, zp, maxkp);
    // every block resident at once (the barrier): the fewest an SM that any of the layers' x allows
    const int grid = q0->sms * per_sm;
    if (g_chain_dbg)
        fprintf(stderr, "qlinear_gpu_gemv_chain: %d phases, grid %d (%d an SM), %d stages, %zu bytes of shared memory\n",
                n, grid, per_sm, a.ns, qtmc_smem(q0->tc_gm, zp, a.ns, maxkp));
    qtmc_dispatch(q0->tc_gm, zp, &a, qtmc_smem(q0->tc_gm, zp, a.ns, maxkp), grid, pdl != 0, (cudaStream_t)stream, NULL);
    return launch_ok("qlinear_gpu_gemv_chain") == 0 ? 1 : -1;
}

// k_qmma over T <= 16 tokens of X (T, ldx; kp valid columns, zero-padded).
template <int KIND, class XIn, int W, int UK, int R, bool T1, bool XS>
static void launch_qmma_k(const QLinearGpu *q, const XIn *X, int ldx, int T, const float *bias, float *Y, int ldy,
                          float beta, cudaStream_t s) {
    const int rt = KIND == 4 ? 16 : 8, nt = q->np / rt;
    const dim3 grid((nt + R - 1) / R);
    const bool pdl = pdl_on(q);
    const uint4 *w = (const uint4 *)q->qw;
    const size_t smem = XS ? (size_t)q->kp * 2 : 0;
#define QM_LAUNCH(gm, zp)                                                                                             \
    launch_ex(k_qmma<KIND, XIn, W, UK, R, gm, zp, T1, XS>, grid, W * 32, smem, s, pdl, w, (const float *)q->scales,   \
              (const uint8_t *)q->zeros, q->np, q->kp, q->gs, q->glog, q->ng, q->rows, X, ldx, T, bias, Y, ldy, beta)
    const bool zp = q->zeros != NULL;
    if (q->tc_gm == 0) zp ? QM_LAUNCH(0, true) : QM_LAUNCH(0, false);
    else if (q->tc_gm == 1) zp ? QM_LAUNCH(1, true) : QM_LAUNCH(1, false);
    else if constexpr (KIND == 4) zp ? QM_LAUNCH(2, true) : QM_LAUNCH(2, false);
#undef QM_LAUNCH
}
// The tensor-core GEMV rungs: one token of fp32 x (kp wide).
template <int W, int UK, int R, bool XS = false>
static void launch_qmma(const QLinearGpu *q, const float *x, const float *bias, float *y, float beta, cudaStream_t s) {
    if (q->kind == QK_INT4) launch_qmma_k<4, float, W, UK, R, true, XS>(q, x, q->kp, 1, bias, y, q->rows, beta, s);
    else launch_qmma_k<8, float, W, UK, R, true, XS>(q, x, q->kp, 1, bias, y, q->rows, beta, s);
}
#define QMMA_XS_MAX_KP (20 * 1024)  // x in shared memory: kp * 2 bytes + the reduction, within the 48 KB default

template <int TB, int U, bool ZP>
static void launch_tb(const QLinearGpu *q, const float *xf, int ldxf, int T, const float *bias, float *Y, int ldy,
                      float beta, cudaStream_t s) {
    const uint4 *w = (const uint4 *)q->qw;
    const int passes = (T + TB - 1) / TB;
    if (q->kind == QK_INT4)
        k_qgemv4<TB, U, ZP><<<dim3(q->np / 16, passes), QV_WARPS * 32, 0, s>>>(
            w, q->scales, q->zeros, q->np, q->kp, q->gs, q->glog, q->ng, q->rows, xf, ldxf, T, bias, Y, ldy, beta);
    else
        k_qgemv8<TB, U, ZP><<<dim3((q->rows + QV_WARPS - 1) / QV_WARPS, passes), QV_WARPS * 32, 0, s>>>(
            w, q->scales, q->zeros, q->np, q->kp, q->gs, q->glog, q->ng, q->rows, xf, ldxf, T, bias, Y, ldy, beta);
}
template <int TB, int U>
static void launch_zp(const QLinearGpu *q, const float *xf, int ldxf, int T, const float *bias, float *Y, int ldy,
                      float beta, cudaStream_t s) {
    if (q->zeros) launch_tb<TB, U, true>(q, xf, ldxf, T, bias, Y, ldy, beta, s);
    else launch_tb<TB, U, false>(q, xf, ldxf, T, bias, Y, ldy, beta, s);
}

template <int W, int UK, int R, bool ZP>
static void launch_r(const QLinearGpu *q, const float *xf, const float *bias, float *Y, float beta, cudaStream_t s) {
    const uint4 *w = (const uint4 *)q->qw;
    if (q->kind == QK_INT4)
        k_qgemv4r<W, UK, R, ZP><<<(q->np / 16 + R - 1) / R, W * 32, 0, s>>>(w, q->scales, q->zeros, q->np, q->kp, q->gs,
                                                                         q->glog, q->ng, q->rows, xf, bias, Y, beta);
    else
        k_qgemv8r<W, UK, R, ZP><<<(q->rows + W * R - 1) / (W * R), W * 32, 0, s>>>(
            w, q->scales, q->zeros, q->np, q->kp, q->gs, q->glog, q->ng, q->rows, xf, bias, Y, beta);
}
template <int W, int UK, int R>
static void launch_rz(const QLinearGpu *q, const float *xf, const float *bias, float *Y, float beta, cudaStream_t s) {
    if (q->zeros) launch_r<W, UK, R, true>(q, xf, bias, Y, beta, s);
    else launch_r<W, UK, R, false>(q, xf, bias, Y, beta, s);
}

// The GEMV/fallback launch over T tokens of xf (T, ldxf) fp32 (kp wide, zero-padded).
static void launch_simt(const QLinearGpu *q, const float *xf, int ldxf, int T, const float *bias, float *Y, int ldy,
                        float beta, cudaStream_t s) {
    if (T == 1) {
        const int v = qlinear_gpu_gemv_version(q);
        switch (v) {  // QGEMV_VERSIONS' order
        case 1: launch_zp<1, 8>(q, xf, ldxf, 1, bias, Y, ldy, beta, s); break;
        case 2: launch_zp<1, 2>(q, xf, ldxf, 1, bias, Y, ldy, beta, s); break;
        case 3: launch_rz<8, 2, 2>(q, xf, bias, Y, beta, s); break;
        case 4: launch_rz<16, 1, 4>(q, xf, bias, Y, beta, s); break;
        case 5: launch_rz<16, 2, 2>(q, xf, bias, Y, beta, s); break;
        case 9:
        case 10:
            if (q->kp <= QMMA_XS_MAX_KP) {
                if (v == 9) launch_qmma<8, 2, 1, true>(q, xf, bias, Y, beta, s);
                else launch_qmma<8, 2, 2, true>(q, xf, bias, Y, beta, s);
                break;
            }  // else v7
            launch_qmma<8, 2, 1>(q, xf, bias, Y, beta, s);
            break;
        case 11:
        case 12:
        case 13:
        case 14:
        case 15:
        case 16:
            qtma_run(q, v, xf, NULL, 0.0f, bias, Y, beta, 0, pdl_on(q), s);
            break;
        case 6:
        case 7:
        case 8:
            if (v == 6) launch_qmma<8, 2, 1>(q, xf, bias, Y, beta, s);
            else if (v == 7) launch_qmma<8, 4, 1>(q, xf, bias, Y, beta, s);
            else launch_qmma<16, 2, 1>(q, xf, bias, Y, beta, s);
            break;
        default: launch_zp<1, QV_U>(q, xf, ldxf, 1, bias, Y, ldy, beta, s); break;
        }
        return;
    }
    launch_zp<QF_TB, 2>(q, xf, ldxf, T, bias, Y, ldy, beta, s);
}

// The GEMV's x: as given, or gathered into the layer's xg when the columns are permuted or padded
// or x is not aligned to `align` bytes (the vector loads of the kernel that reads it).
static const float *gemv_x(const QLinearGpu *q, const float *x, uintptr_t align, cudaStream_t s) {
    if (!q->gather_x && !((uintptr_t)x & (align - 1))) return x;
    gather<float, float>(x, q->cols, 1, q->perm, q->cols, q->kp, q->xg, s);
    return q->xg;
}
extern "C" int qlinear_gpu_gemv(const QLinearGpu *q, const float *x, const float *bias, float *y, int acc,
                                void *stream) {
    if (!q || !x || !y) return -1;
    cudaStream_t s = (cudaStream_t)stream;
    if (!q->fast) {
        k_qnaive_gemv<<<(q->rows + 7) / 8, 256, 0, s>>>(view(q), x, bias, y, acc);
        return launch_ok("qlinear_gpu_gemv");
    }
    launch_simt(q, gemv_x(q, x, 16, s), q->kp, 1, bias, y, q->rows, acc ? 1.0f : 0.0f, s);
    return launch_ok("qlinear_gpu_gemv");
}

extern "C" int qlinear_gpu_gemv_fused(const QLinearGpu *q, const float *x, const float *nw, float eps, const float *bias,
                                      float *y, int acc, int swiglu, int pdl, void *stream) {
    if (!q || !x || !y) return -1;
    const int v = qlinear_gpu_gemv_version(q);
    if (v < QGEMV_FIRST_TMA) return 0;  // not a k_qtma layer (or rung): the caller runs the steps apart
    if (nw && (q->gather_x || q->cols != q->kp || ((uintptr_t)x & 7))) return 0;  // the norm reads x as it is
    if (swiglu && (q->rows != 2 * swiglu || swiglu % 16 || bias || acc)) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    qtma_run(q, v, nw ? x : gemv_x(q, x, 8, s), nw, eps, bias, y, acc ? 1.0f : 0.0f, swiglu, pdl != 0, s);
    return launch_ok("qlinear_gpu_gemv_fused") == 0 ? 1 : -1;
}

// A scratch of the layer's (*p, *cap bytes) of at least `bytes` (grown: synchronizes `s` first,
// so do the largest call once before capturing a CUDA graph).
static void *grow(void **p, size_t *cap, size_t bytes, cudaStream_t s) {
    if (*cap >= bytes) return *p;
    if (*p) {
        if (cudaStreamSynchronize(s) != cudaSuccess) return NULL;
        cudaFree(*p);
    }
    *p = NULL, *cap = 0;
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        fprintf(stderr, "qlinear_gpu_gemm: out of device memory for a %zu-byte scratch\n", bytes);
        return NULL;
    }
    *cap = bytes;
    return *p;
}
static void *scratch(QLinearGpu *q, size_t bytes, cudaStream_t s) { return grow(&q->scr, &q->scr_bytes, bytes, s); }

// Launch k_qtmat, or (setup, at the layer's creation: not while a stream is being captured) allow
// it its shared memory.
template <class X, int GM, bool ZP, int NT, int TS, int SP, bool SW>
static void qtmat_go(QTmatArgs a, size_t smem, int grid, bool pdl, cudaStream_t s, bool setup) {
    auto k = k_qtmat<X, GM, ZP, NT, TS, SP, SW>;
    if (setup) {
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, QTMA_SMEM_MAX);
        cudaGetLastError();
        return;
    }
    if (a.cl > 1) {  // clusters only where all of the grid's fit at once (the copies wait on every block of one):
        // asked once per instance and cluster size, at the most shared memory a block can take (so
        // at least as many fit at the launch's own)
        static int most[5] = {-1, -1, -1, -1, -1};
        if (most[a.cl] < 0) most[a.cl] = max_clusters(k, (QTT_W + 1) * 32, QTMA_SMEM_MAX, a.cl);
        if ((long)most[a.cl] * a.cl < grid) a.cl = 1;
    }
    launch_ex_cl(k, dim3(grid), (QTT_W + 1) * 32, smem, s, pdl, a.cl, a);
}
template <class X, int NT, int TS, int SP, bool SW = false>
static void qtmat_kind(int gm, bool zp, const QTmatArgs &a, size_t smem, int grid, bool pdl, cudaStream_t s, bool setup) {
    if (gm == 0) zp ? qtmat_go<X, 0, true, NT, TS, SP, SW>(a, smem, grid, pdl, s, setup) : qtmat_go<X, 0, false, NT, TS, SP, SW>(a, smem, grid, pdl, s, setup);
    else if (gm == 1) zp ? qtmat_go<X, 1, true, NT, TS, SP, SW>(a, smem, grid, pdl, s, setup) : qtmat_go<X, 1, false, NT, TS, SP, SW>(a, smem, grid, pdl, s, setup);
    else zp ? qtmat_go<X, 2, true, NT, TS, SP, SW>(a, smem, grid, pdl, s, setup) : qtmat_go<X, 2, false, NT, TS, SP, SW>(a, smem, grid, pdl, s, setup);
}
// k_qtmat's tiles a stage: 16 or 32 (each consumer warp then has 4 tiles of a stage in flight).
// Unset (0), 16 up to 4 rows and 32 above: on an H100 (7ba5693) 32 was faster at 8 and 16 rows
// (the four 8B layers 72.1 vs 73.0 us at 8, 98.1 vs 99.5 at 16; batch 16 in the engine +2.8%) and
// slower at 2 (68.5 vs 66.6).
static int g_qtmat_ts = -1;
extern "C" void qlinear_gemm_set_qtmat_ts(int ts) { g_qtmat_ts = ts == 16 || ts == 32 ? ts : -1; }
static int qtmat_ts(int T) {
    if (g_qtmat_ts < 0) {
        const char *e = getenv("QLINEAR_QTMAT_TS");
        const int v = e ? atoi(e) : 0;
        g_qtmat_ts = v == 16 || v == 32 ? v : 0;
    }
    return g_qtmat_ts ? g_qtmat_ts : T <= 4 ? QTT_TS : 32;
}
// k_qtmat's strips a unit: 0 (unset) picks two where that costs no more rounds (qtmat_gemm), 1 or 2
// (QLINEAR_QTMAT_SP or qlinear_gemm_set_qtmat_sp) fix it (2 only at 32 tiles a stage).
static int g_qtmat_sp = -1;
extern "C" void qlinear_gemm_set_qtmat_sp(int sp) { g_qtmat_sp = sp == 1 || sp == 2 ? sp : -1; }
static int qtmat_sp() {
    if (g_qtmat_sp < 0) {
        const char *e = getenv("QLINEAR_QTMAT_SP");
        const int v = e ? atoi(e) : 0;
        g_qtmat_sp = v == 1 || v == 2 ? v : 0;
    }
    return g_qtmat_sp;
}
// When k_qtmat's producer copies x: after xpre stages of weights (more than the ring holds: a
// ring's worth), then a stage of x before each stage of weights, or all of x at once (xall). The
// default, 1 and 0, measured best at 16 rows on an H100: the four 8B layers 88.2 us against 90.3
// (a ring of weights first, then all of x), 90.1 (x first, a stage at a time) and 90.3 (2 stages
// of weights first) (results/h100_qtmat_xcopy_2026-12-07/xorder/). QLINEAR_QTMAT_XPRE / _XALL or
// qlinear_gemm_set_qtmat_xorder change it.
static int g_qtmat_xpre = -2, g_qtmat_xall = 0;
extern "C" void qlinear_gemm_set_qtmat_xorder(int xpre, int xall) {
    g_qtmat_xpre = xpre < 0 ? -2 : xpre, g_qtmat_xall = xall ? 1 : 0;
}
static int qtmat_xpre(int ns) {
    if (g_qtmat_xpre == -2) g_qtmat_xpre = env_int("QLINEAR_QTMAT_XPRE", 0, 1 << 20, 1), g_qtmat_xall = env_int("QLINEAR_QTMAT_XALL", 0, 1, 0);
    return g_qtmat_xpre < ns ? g_qtmat_xpre : ns;
}
// Blocks a cluster for k_qtmat (QLINEAR_QTMAT_CL or qlinear_gemm_set_qtmat_cl: 1, 2 or 4; default 2):
// the blocks of a cluster share a chunk of x, and each copies every cl-th row of it into all of
// them (a multicast bulk copy), so x leaves L2 once a cluster instead of once a block. Written
// after Nsight Compute showed the blocks waiting for x (README "x by bulk copies"). On an H100
// (results/h100_qtmat_cl_2026-12-07/) 2 took the four 8B layers at 16 rows from 88.7 to 81.2 us
// (at 8 rows 72.0 -> 68.1) and batch 16 in the engine from 4,217 to 4,489 tok/s; 4 ran as fast as
// 1 (likely the fallback below: the device holding fewer clusters of 4 than the grid's).
static int g_qtmat_cl = -1;
extern "C" void qlinear_gemm_set_qtmat_cl(int cl) { g_qtmat_cl = cl == 1 || cl == 2 || cl == 4 ? cl : -1; }
static int qtmat_cl() {
    if (knob(&g_qtmat_cl, "QLINEAR_QTMAT_CL", 1, 4, 2) == 3) g_qtmat_cl = 1;
    return g_qtmat_cl;
}
// nc > 1 with beta = 1 (a residual added to, as the o and down projections' Y): 1 (QLINEAR_QTMAT_RED or
// qlinear_gemm_set_qtmat_red) has every chunk add its sums into Y with atomic adds, which saves
// k_qtmat_sum's launch and the scratch's write and read, but the order of the nc additions then varies
// from run to run (the last bits of Y with it); 0, the default, keeps the sums deterministic.
static int g_qtmat_red = -1;
extern "C" void qlinear_gemm_set_qtmat_red(int on) { g_qtmat_red = on < 0 ? -1 : on ? 1 : 0; }
static int qtmat_red() { return knob(&g_qtmat_red, "QLINEAR_QTMAT_RED", 0, 1, 0); }
// k_qtmat's ring of weights in bytes (QLINEAR_QTMAT_RING or qlinear_gemm_set_qtmat_ring; 0, unset:
// QTT_RING, or QTT_RING_BIG where x is cut into chunks and the partial sums take one buffer): the
// stages it holds (at least 2), as many as fit beside the chunk of x, which is cut as for the
// default ring. A block has one ring, so its bytes in flight are about the ring less the stage
// being computed (the GEMV runs two blocks of a 56 KB ring an SM).
// The consumers' partial sums of a unit in one buffer (1: QLINEAR_QTMAT_RB1 or
// qlinear_gemm_set_qtmat_rb1) or two (0), for a barrier more a unit; unset (2): one where x is cut
// into chunks, two elsewhere. Measured on an H100 (README "A fourth stage where x is in chunks"): the
// larger ring alone changes nothing at 16 rows (x leaves no room for another stage), with one
// buffer it gives down (x in 3 chunks) a fourth stage, 26.2 -> 23.4-23.6 us, while the layers whose x
// is whole lose up to 7% with one buffer (q|k|v 13.1 -> 13.9-14.0 us) and 2 and 8 rows 3-5% in all.
#define QTT_RING_BIG (160 * 1024)
static int g_qtmat_ring = -1;
extern "C" void qlinear_gemm_set_qtmat_ring(int bytes) { g_qtmat_ring = bytes > 0 ? bytes : -1; }
static int qtmat_ring() { return knob(&g_qtmat_ring, "QLINEAR_QTMAT_RING", 1, QTMA_SMEM_MAX, 0); }
static int g_qtmat_rb1 = -1;
extern "C" void qlinear_gemm_set_qtmat_rb1(int on) { g_qtmat_rb1 = on < 0 ? -1 : on ? 1 : 0; }
static int qtmat_rb1() { return knob(&g_qtmat_rb1, "QLINEAR_QTMAT_RB1", 0, 1, 2); }
// Which tiles of a stage a consumer warp takes (QLINEAR_QTMAT_ADJ or qlinear_gemm_set_qtmat_adj):
// 1, N adjacent ones (warp N .. warp N + N - 1), so that with groups of 128 columns or more a warp's
// tiles of a group are summed before its scale is applied once (half the fp32 multiply-adds of the
// scales); 0 (the default until it is measured on a GPU), W apart (warp, warp + W, ...).
static int g_qtmat_adj = -1;
extern "C" void qlinear_gemm_set_qtmat_adj(int on) { g_qtmat_adj = on < 0 ? -1 : on ? 1 : 0; }
static int qtmat_adj() { return knob(&g_qtmat_adj, "QLINEAR_QTMAT_ADJ", 0, 1, 0); }
// At the layer's creation: every k_qtmat instance this INT4 layer can launch gets its shared memory.
template <class X> static void qtmat_prepare_x(int gm, bool zp) {  // (setup: the arguments are not read)
    const QTmatArgs a = {};
    qtmat_kind<X, 1, 16, 1>(gm, zp, a, 0, 0, false, NULL, true), qtmat_kind<X, 2, 16, 1>(gm, zp, a, 0, 0, false, NULL, true);
    qtmat_kind<X, 1, 32, 1>(gm, zp, a, 0, 0, false, NULL, true), qtmat_kind<X, 2, 32, 1>(gm, zp, a, 0, 0, false, NULL, true);
    qtmat_kind<X, 1, 32, 2>(gm, zp, a, 0, 0, false, NULL, true), qtmat_kind<X, 2, 32, 2>(gm, zp, a, 0, 0, false, NULL, true);
    qtmat_kind<X, 1, 32, 2, true>(gm, zp, a, 0, 0, false, NULL, true), qtmat_kind<X, 2, 32, 2, true>(gm, zp, a, 0, 0, false, NULL, true);
}
static void qtmat_prepare(const QLinearGpu *q) {
    if (!q->qt || q->kind != QK_INT4) return;  // (per layer, as qtma_prepare: the current device's allowance)
    qtmat_prepare_x<__half>(q->tc_gm, q->zeros != NULL);
    qtmat_prepare_x<__nv_bfloat16>(q->tc_gm, q->zeros != NULL);
}
// k_qtmat over T <= 16 rows of A (lda % 8 == 0, 16-byte aligned, kp valid columns). 1 launched, 0
// not this layer (not INT4 on sm_90a, or off: qlinear_gemm_set_qtmat), -1 out of scratch.
// ff > 0 (SwiGLU; gemm_swiglu_t has checked q gate|up stacked, rows = 2 ff, ff % 16 == 0, and 32
// tiles a stage): H (T, ldh) = silu(gate) * up instead of Y, where x fits one chunk at two strips a
// unit (else 0, nothing launched).
// nm (qlinear_gpu_gemm_norm): the RMSNorm folded in. Its input side (ss_in) needs x in one chunk
// (else 0); its output side writes xn and the partial sums of squares in k_qtmat's epilogue (one
// chunk: a partial a strip) or in k_qtmat_sum_norm (chunks: a partial a 256 columns), and sets
// nm->nss_out.
template <class X>
static int qtmat_gemm(QLinearGpu *q, int T, const X *A, int lda, float *Y, int ldy, float beta, cudaStream_t s,
                      int ff = 0, X *H = NULL, int ldh = 0, QGemmNorm *nm = NULL) {
    if (!qtmat_on() || !q->qt || q->kind != QK_INT4 || T < 1 || T > 16) return 0;
    const int NT = T > 8 ? 2 : 1, ntok = 8 * NT, nk = q->kp / 64, zp = q->zeros != NULL, gm = q->tc_gm;
    const int ts = qtmat_ts(T), strips = q->np / 16;
    // a stage of sp strips (ts / sp tiles of each), its ring, and the fixed shared memory (barriers,
    // ring, the strips' partial sums); then the most tiles a chunk of x can hold
    // buffers of the partial sums: qtmat_rb1's, or (auto, 2) one where x is cut into chunks (below)
    const int rb1_set = qtmat_rb1();
    int nrb = rb1_set == 1 ? 1 : 2;
    auto stage_of = [&](int sp) { return sp * qtma_part(4, ts / sp, gm, zp); };
    auto fixed_ns = [&](int sp, int ns) {
        return (size_t)qtmat_hdr(ns) + (size_t)ns * stage_of(sp) + (size_t)nrb * QTT_W * sp * 256 * 4;
    };
    // (x's chunks are cut for the default ring, QTT_RING)
    auto fixed_of = [&](int sp) { return fixed_ns(sp, ring_stages(QTT_RING, stage_of(sp))); };
    auto most_of = [&](size_t fixed) { return (((long)QTMA_SMEM_MAX - (long)fixed) / (ntok * 4) - 4) / 32; };
    // as many chunks as x needs (or QLINEAR_QTMAT_NC): nc chunks of kct tiles; 0 where none fits
    int nc = 0, kct = 0;
    auto cut = [&]() {
        const long most = most_of(fixed_of(1));
        if (most < 1) return 0;
        nc = (int)((nk + most - 1) / most);
        if (g_qtmat_nc > nc) nc = g_qtmat_nc < nk ? g_qtmat_nc : nk;
        kct = (nk + nc - 1) / nc;
        nc = (nk + kct - 1) / kct;
        return 1;
    };
    if (!cut()) return 0;
    if (rb1_set == 2 && nc > 1) {  // auto: x in chunks, so one buffer, and x cut again for its room
        nrb = 1;
        if (!cut()) return 0;
    }
    const int rb1 = nrb == 1;
    if (nm && nm->ss_in && nc != 1) return 0;  // r_t is applied in k_qtmat's epilogue: one chunk only
    const size_t extra = nm && nm->ss_in ? 16 * sizeof(float) : 0;  // r_t of the 16 tokens
    // one block an SM: the units of each chunk spread evenly over sms / nc blocks. Two strips a unit
    // (32 tiles a stage, x's chunk still fitting) where that takes no more strips' time on the busiest
    // block: each x fragment then serves two tiles, and the partial sums meet (a barrier of the
    // block's consumers) once per two strips. An odd count's last unit computes its strip twice.
    const int per = q->sms / nc > 0 ? q->sms / nc : 1, r1 = (strips + per - 1) / per, r2 = ((strips + 1) / 2 + per - 1) / per;
    int sp = 1;
    if (ff > 0) {  // one chunk, two strips (a gate and an up strip) a unit, or not at all
        if (nc != 1 || most_of(fixed_of(2)) < kct) return 0;
        sp = 2;
    } else if (ts == 32 && qtmat_sp() != 1 && (qtmat_sp() == 2 || 2 * r2 <= r1)) {
        if (most_of(fixed_of(2)) >= kct) sp = 2;
    }
    if ((kct + ts / sp - 1) / (ts / sp) > QTT_XB) return 0;  // more stages a chunk than x has barriers
    // the ring's stages: qtmat_ring() / stage (at least 2; auto: QTT_RING, QTT_RING_BIG where x is in
    // chunks), as many as fit beside x (the default ring's always do: x was cut for it)
    const size_t xbytes = (size_t)ntok * qtmat_xs(kct) * 4;
    const int want = ring_stages(qtmat_ring() ? qtmat_ring() : nc > 1 && rb1 ? QTT_RING_BIG : QTT_RING, stage_of(sp));
    int ns = 2;
    while (ns < want && fixed_ns(sp, ns + 1) + xbytes + extra <= (size_t)QTMA_SMEM_MAX) ns++;
    const size_t smem = fixed_ns(sp, ns) + xbytes + extra;
    if (smem > (size_t)QTMA_SMEM_MAX) return 0;
    // nc > 1: the chunk sums (nc, T, rows) go to the layer's part scratch, k_qtmat_sum adds them
    float *P = Y;
    const int nout = nm && nm->nw;  // the norm's output side
    const int red = nc > 1 && beta == 1.0f && qtmat_red() && !nout;
    if (nc > 1 && !red) {
        P = (float *)grow(&q->part, &q->part_bytes, (size_t)nc * T * q->rows * sizeof(float), s);
        if (!P) return -1;
    }
    // clusters (qtmat_cl): a chunk's blocks a multiple of cl, consecutive blocks sharing a chunk
    const int cl = per >= qtmat_cl() ? qtmat_cl() : 1, perc = per / cl * cl;
    const int units = ff > 0 ? ff / 16 : (strips + sp - 1) / sp, rounds = (units + perc - 1) / perc;
    const int gpc = ((units + rounds - 1) / rounds + cl - 1) / cl * cl, grid = gpc * nc;
    QTmatArgs a = {(const uint4 *)q->qw, q->scales_t, q->zeros_t, q->np, q->kp, q->gs, q->glog, q->ng, q->rows,
                   A, lda, T, P, ldy, beta, units, nc, kct, ns, ff / 16, H, ldh, qtmat_xpre(ns),
                   g_qtmat_xall, cl, red, rb1, qtmat_adj(), NULL, NULL, 0, 0, NULL, NULL, 0, 0.0f, 0.0f};
    if (nout && nc == 1) a.nw = nm->nw, a.xn = nm->xn, a.ldxn = nm->ldxn, a.sso = nm->ss_out, a.nsso = strips;
    if (nm && nm->ss_in) a.ssi = nm->ss_in, a.nssi = nm->nss_in, a.inv_d = 1.0f / (float)nm->cols, a.eps = nm->eps;
    const bool pdl = pdl_on(q);
    if (ff > 0) NT == 2 ? qtmat_kind<X, 2, 32, 2, true>(gm, zp, a, smem, grid, pdl, s, false)
                        : qtmat_kind<X, 1, 32, 2, true>(gm, zp, a, smem, grid, pdl, s, false);
    else if (ts == 32 && sp == 2) NT == 2 ? qtmat_kind<X, 2, 32, 2>(gm, zp, a, smem, grid, pdl, s, false)
                                     : qtmat_kind<X, 1, 32, 2>(gm, zp, a, smem, grid, pdl, s, false);
    else if (ts == 32) NT == 2 ? qtmat_kind<X, 2, 32, 1>(gm, zp, a, smem, grid, pdl, s, false)
                               : qtmat_kind<X, 1, 32, 1>(gm, zp, a, smem, grid, pdl, s, false);
    else NT == 2 ? qtmat_kind<X, 2, 16, 1>(gm, zp, a, smem, grid, pdl, s, false)
                 : qtmat_kind<X, 1, 16, 1>(gm, zp, a, smem, grid, pdl, s, false);
    if (nc > 1 && !red && nout) {
        const int nb = (q->rows + 255) / 256;
        k_qtmat_sum_norm<X><<<dim3(nb, T), 256, 0, s>>>(P, nc, T, q->rows, Y, ldy, beta, nm->nw, (X *)nm->xn, nm->ldxn,
                                                        nm->ss_out, nb);
        nm->nss_out = nb;
    } else if (nc > 1 && !red) {
        const size_t n = (size_t)T * q->rows;
        k_qtmat_sum<<<(int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, 0, s>>>(P, nc, T, q->rows, Y, ldy, beta);
    } else if (nout) {
        nm->nss_out = strips;
    }
    return 1;
}

// X as the tensor-core paths read it: packed column order, kp columns, 16-byte aligned rows. X
// itself when it already is (no permutation or padding, aligned), else gathered into the layer's
// scratch. 0, or -1 out of scratch.
template <class X>
static int x_packed(QLinearGpu *q, int T, const X *Xm, int ldx, cudaStream_t s, const X **A, int *lda) {
    *A = Xm, *lda = ldx;
    if (!q->perm && q->kp == q->cols && ldx % 8 == 0 && !((uintptr_t)Xm & 15)) return 0;
    X *xa = (X *)scratch(q, (size_t)T * q->kp * sizeof(X), s);
    if (!xa) return -1;
    gather<X, X>(Xm, ldx, T, q->perm, q->cols, q->kp, xa, s);
    *A = xa, *lda = q->kp;
    return 0;
}

// ---------------------------------------------------------------- many rows: dequantize, then cuBLAS
// From some tens of rows on (a prompt chunk, a large decode batch) a GEMM stops being bound by its
// weights' bytes and becomes bound by the tensor cores, where cuBLAS's bf16/fp16 GEMM is far ahead of
// k_qgemm4 and k_qmma (measured 3x at 2,048 rows). So for T >= deq_rows() the weights are expanded to
// X's type, a chunk of rows at a time, into a scratch shared by every layer (64 MiB at most), and
// cuBLAS multiplies X by each chunk: the extra cost is one write and one read of the 16-bit weights,
// small beside the GEMM's FLOPs at those row counts. Each weight is (q - z) * s computed in fp32 and
// rounded once to X's type (the tensor-core kernels round the scale and that product, so the two
// paths agree to the 16-bit rounding).
#define DEQ_WARPS 8
#define DEQ_CHUNK_BYTES ((size_t)64 << 20)
#define DEQ_BLAS_WS ((size_t)32 << 20)

// INT4 strips s0 .. s0 + nstrips - 1 (16 rows each) into W (nstrips * 16, kp) row-major: one warp a
// 16 x 64 tile. Lane L's word i holds rows n = L / 4 and n + 8, columns k = 16 i + 2 (L % 4), k + 1,
// k + 8, k + 9 (qlinear_pack.h); the tile goes through shared memory so each row is written with
// 16-byte stores.
template <class X>
__global__ void __launch_bounds__(DEQ_WARPS * 32)
    k_deq4(const uint4 *__restrict__ qw, const float *__restrict__ scales, const uint8_t *__restrict__ zeros, int np,
           int kp, int gs, int glog, int ng, int s0, int nstrips, X *__restrict__ W) {
    __shared__ __align__(16) X tile[DEQ_WARPS][16][64 + 8];  // +8: a row's 16-byte pieces on other banks
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nk = kp / 64;
    const long ntiles = (long)nstrips * nk;
    for (long ti = (long)blockIdx.x * DEQ_WARPS + warp; ti < ntiles; ti += (long)gridDim.x * DEQ_WARPS) {
        const int sl = (int)(ti / nk), kc = (int)(ti % nk), strip = s0 + sl;
        const uint4 v = __ldg(qw + ((size_t)strip * nk + kc) * 32 + lane);
        const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int grp = group_of(kc * 64 + 16 * i, gs, glog, ng), k = 16 * i + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; h++) {  // rows g (nibbles 0, 4, 1, 5) and g + 8 (2, 6, 3, 7)
                const int row = strip * 16 + g + 8 * h;
                const float sc = __ldg(scales + (size_t)grp * np + row);
                const float z = zeros ? (float)__ldg(zeros + (size_t)grp * np + row) : 8.0f;
                const uint32_t w = wd[i] >> (8 * h);
                X *r = &tile[warp][g + 8 * h][0];
                r[k] = fromf<X>(((float)(w & 15u) - z) * sc);
                r[k + 1] = fromf<X>(((float)((w >> 16) & 15u) - z) * sc);
                r[k + 8] = fromf<X>(((float)((w >> 4) & 15u) - z) * sc);
                r[k + 9] = fromf<X>(((float)((w >> 20) & 15u) - z) * sc);
            }
        }
        __syncwarp();
        const int row = lane >> 1, half = lane & 1;  // 64 bytes (32 columns) of one row a lane
        const uint4 *src = (const uint4 *)&tile[warp][row][32 * half];
        uint4 *dst = (uint4 *)(W + ((size_t)sl * 16 + row) * kp + (size_t)kc * 64 + 32 * half);
#pragma unroll
        for (int j = 0; j < 4; j++) dst[j] = src[j];
        __syncwarp();
    }
}

// INT8 rows r0 .. r0 + nr - 1 (row-major bytes, kp a row) into W (nr, kp): 16 weights a thread.
template <class X>
__global__ void k_deq8(const uint8_t *__restrict__ qb, const float *__restrict__ scales,
                       const uint8_t *__restrict__ zeros, int np, int kp, int gs, int glog, int ng, int r0, int nr,
                       X *__restrict__ W) {
    const int per = kp / 16;
    const long n = (long)nr * per;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const int rl = (int)(i / per), c16 = (int)(i % per), row = r0 + rl, grp = group_of(c16 * 16, gs, glog, ng);
        const uint4 v = __ldg((const uint4 *)(qb + (size_t)row * kp) + c16);
        const float sc = __ldg(scales + (size_t)grp * np + row);
        const float z = zeros ? (float)__ldg(zeros + (size_t)grp * np + row) : 128.0f;
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
        __align__(16) X o[16];
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = fromf<X>(((float)((w4[j / 4] >> (8 * (j % 4))) & 255u) - z) * sc);
        uint4 *dst = (uint4 *)(W + (size_t)rl * kp + (size_t)c16 * 16);
        dst[0] = ((const uint4 *)o)[0], dst[1] = ((const uint4 *)o)[1];
    }
}

// The process-wide pieces of the path: the dequantized chunk, cuBLAS's handle and its workspace
// (set, so that a captured GEMM allocates nothing). Layers run one after another on one stream.
static void *g_deq_w = NULL;
static size_t g_deq_cap = 0;
static cublasHandle_t g_deq_blas = NULL;
static void *g_deq_ws = NULL;
static int g_deq_t = -2;  // qlinear_gemm_set_deq_rows; -2: not set (QLINEAR_DEQ_T, else per kind)
static int g_deq_env = -2;  // QLINEAR_DEQ_T as read once (-1: absent)
extern "C" void qlinear_gemm_set_deq_rows(int t) { g_deq_t = t < 0 ? -2 : t; }
// The fewest rows that take this path for layer q (0: never).
static int deq_rows(const QLinearGpu *q) {
    if (g_deq_t != -2) return g_deq_t;
    if (g_deq_env == -2) {
        const char *e = getenv("QLINEAR_DEQ_T");
        g_deq_env = e && atoi(e) >= 0 ? atoi(e) : -1;
    }
    if (g_deq_env >= 0) return g_deq_env;
    return q->kind == QK_INT4 ? 512 : 64;  // measured crossovers (H100): INT4 256-512 rows, INT8 64
}
// Y (T, ldy) = X (T, cols; ldx) W^T + beta Y through the dequantized chunks. 1 done, 0 not taken (too
// few rows, the SIMT path forced, bf16 before sm_80, or the scratch / handle missing while the stream
// is being captured), -1 error.
template <class X>
static int deq_gemm(QLinearGpu *q, int T, const X *Xm, int ldx, float *Y, int ldy, float beta, cudaStream_t s) {
    const int t0 = deq_rows(q);
    if (t0 <= 0 || T < t0 || q->simt_forced || (std::is_same<X, __nv_bfloat16>::value && q->major < 8)) return 0;
    const size_t rowb = (size_t)q->kp * sizeof(X);
    int rc = (int)(DEQ_CHUNK_BYTES / rowb) / 16 * 16;  // rows a chunk (whole strips)
    if (rc < 16) rc = 16;
    if (rc > q->np) rc = q->np;
    const size_t need = (size_t)rc * rowb;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (cs != cudaStreamCaptureStatusNone && (!g_deq_blas || g_deq_cap < need)) return 0;  // nothing may be made now
    if (!g_deq_blas) {
        if (cublasCreate(&g_deq_blas) != CUBLAS_STATUS_SUCCESS) return 0;
        if (cudaMalloc(&g_deq_ws, DEQ_BLAS_WS) != cudaSuccess) {
            cudaGetLastError();
            cublasDestroy(g_deq_blas), g_deq_blas = NULL, g_deq_ws = NULL;
            return 0;
        }
    }
    if (!grow(&g_deq_w, &g_deq_cap, need, s)) return -1;
    const X *A;
    int lda;
    if (x_packed(q, T, Xm, ldx, s, &A, &lda) != 0) return -1;
    CUBLAS_CHECK(cublasSetStream(g_deq_blas, s));  // (which puts the default workspace back: set ours again)
    CUBLAS_CHECK(cublasSetWorkspace(g_deq_blas, g_deq_ws, DEQ_BLAS_WS));
    const StDtype dt = std::is_same<X, __nv_bfloat16>::value ? ST_BF16 : ST_F16;
    X *Wd = (X *)g_deq_w;
    for (int r0 = 0; r0 < q->rows; r0 += rc) {
        const int nr = q->rows - r0 < rc ? q->rows - r0 : rc;  // output rows of this chunk
        if (q->kind == QK_INT4) {
            const int ns = (nr + 15) / 16;
            const long tiles = (long)ns * (q->kp / 64);
            const int grid = (int)((tiles + DEQ_WARPS - 1) / DEQ_WARPS < 8L * q->sms ? (tiles + DEQ_WARPS - 1) / DEQ_WARPS
                                                                                      : 8L * q->sms);
            k_deq4<X><<<grid, DEQ_WARPS * 32, 0, s>>>((const uint4 *)q->qw, q->scales, q->zeros, q->np, q->kp, q->gs,
                                                      q->glog, q->ng, r0 / 16, ns, Wd);
        } else {
            const long n = (long)nr * (q->kp / 16);
            const int grid = (int)((n + 255) / 256 < 8L * q->sms ? (n + 255) / 256 : 8L * q->sms);
            k_deq8<X><<<grid, 256, 0, s>>>((const uint8_t *)q->qw, q->scales, q->zeros, q->np, q->kp, q->gs, q->glog,
                                           q->ng, r0, nr, Wd);
        }
        if (launch_ok("qlinear_gpu_gemm (dequantize)") != 0) return -1;
        gemm_xwt(g_deq_blas, dt, T, nr, q->kp, A, lda, Wd, Y + r0, ldy, beta);
    }
    return 1;
}

template <class X>
static int gemm_t(QLinearGpu *q, int T, const X *Xm, int ldx, float *Y, int ldy, float beta, cudaStream_t s) {
    if (!q->fast) {
        k_qnaive_gemm<X><<<dim3((q->rows + 127) / 128, T), 128, 0, s>>>(view(q), T, Xm, ldx, Y, ldy, beta);
        return launch_ok("qlinear_gpu_gemm");
    }
    const int dq = deq_gemm<X>(q, T, Xm, ldx, Y, ldy, beta, s);  // many rows: dequantize + cuBLAS
    if (dq != 0) return dq < 0 ? -1 : launch_ok("qlinear_gpu_gemm");
    if (!q->mma) {  // fallback: X gathered to fp32, then the SIMT kernels 8 tokens a pass
        float *xf = (float *)scratch(q, (size_t)T * q->kp * sizeof(float), s);
        if (!xf) return -1;
        gather<X, float>(Xm, ldx, T, q->perm, q->cols, q->kp, xf, s);
        launch_simt(q, xf, q->kp, T, NULL, Y, ldy, beta, s);
        return launch_ok("qlinear_gpu_gemm");
    }
    const X *A;
    int lda;
    if (x_packed(q, T, Xm, ldx, s, &A, &lda) != 0) return -1;
    const int tm = qtmat_gemm<X>(q, T, A, lda, Y, ldy, beta, s);
    if (tm != 0) return tm < 0 ? -1 : launch_ok("qlinear_gpu_gemm");
    if (q->kind == QK_INT8) {  // k_qmma, 16 tokens a pass (each pass reads the weights once); for INT4 at
        // T = 16 k_qgemm4 measured faster (gate_up 50.9 vs 81.8 us, qgemm_e4019eb_h200.txt)
        for (int t0 = 0; t0 < T; t0 += 16)
            launch_qmma_k<8, X, 4, 2, 1, false, false>(q, A + (size_t)t0 * lda, lda, T - t0 < 16 ? T - t0 : 16, NULL,
                                           Y + (size_t)t0 * ldy, ldy, beta, s);
        return launch_ok("qlinear_gpu_gemm");
    }
    const int MT = T >= 64 ? 4 : (T + 15) / 16, passes = (T + 63) / 64, nk = q->kp / 64;
    const int bx = (q->np / 16 + QG_WARPS * QG_NB - 1) / (QG_WARPS * QG_NB);
    int nsplit = (2 * q->sms + bx * passes - 1) / (bx * passes);  // about two blocks per SM
    nsplit = nsplit < 1 ? 1 : nsplit > nk / 4 ? (nk / 4 > 0 ? nk / 4 : 1) : nsplit;  // >= 4 tiles (256 columns) each
    if (nsplit > 1) {
        k_scale_y<<<q->sms * 4, 256, 0, s>>>(Y, ldy, T, q->rows, beta);
        if (launch_ok("qlinear_gpu_gemm") != 0) return -1;
    }
    const dim3 grid(bx, nsplit, passes);
    const uint4 *w = (const uint4 *)q->qw;
#define QG_LAUNCH(mt)                                                                                                  \
    do {                                                                                                               \
        if (q->zeros)                                                                                                  \
            k_qgemm4<X, mt, true><<<grid, QG_WARPS * 32, 0, s>>>(w, q->scales, q->zeros, q->np, q->kp, q->gs, q->glog,  \
                                                                 q->ng, q->rows, A, lda, T, Y, ldy, beta, nsplit);     \
        else                                                                                                           \
            k_qgemm4<X, mt, false><<<grid, QG_WARPS * 32, 0, s>>>(w, q->scales, q->zeros, q->np, q->kp, q->gs, q->glog, \
                                                                  q->ng, q->rows, A, lda, T, Y, ldy, beta, nsplit);    \
    } while (0)
    switch (MT) {
    case 1: QG_LAUNCH(1); break;
    case 2: QG_LAUNCH(2); break;
    case 3: QG_LAUNCH(3); break;
    default: QG_LAUNCH(4); break;
    }
#undef QG_LAUNCH
    return launch_ok("qlinear_gpu_gemm");
}

extern "C" int qlinear_gpu_gemm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy,
                                float beta, void *stream) {
    if (!q || T < 0 || (T > 0 && (!X || !Y || ldx < q->cols || ldy < q->rows))) return -1;
    if (xdt != ST_BF16 && xdt != ST_F16) {
        fprintf(stderr, "qlinear_gpu_gemm: X must be bf16 or fp16\n");
        return -1;
    }
    if (T == 0) return 0;
    QLinearGpu *qm = (QLinearGpu *)q;  // only the scratch changes
    cudaStream_t s = (cudaStream_t)stream;
    if (xdt == ST_BF16) return gemm_t<__nv_bfloat16>(qm, T, (const __nv_bfloat16 *)X, ldx, Y, ldy, beta, s);
    return gemm_t<__half>(qm, T, (const __half *)X, ldx, Y, ldy, beta, s);
}

// The RMSNorm folded into qlinear_gpu_gemm (k_qtmat only: INT4 on sm_90a, 1..16 rows).
template <class X>
static int gemm_norm_t(QLinearGpu *q, int T, const X *Xm, int ldx, float *Y, int ldy, float beta, QGemmNorm *nm,
                       cudaStream_t s) {
    if (q->kind != QK_INT4 || !q->qt || !q->fast || !q->mma || !qtmat_on() || T > 16) return 0;
    const X *A;
    int lda;
    if (x_packed(q, T, Xm, ldx, s, &A, &lda) != 0) return -1;
    const int tm = qtmat_gemm<X>(q, T, A, lda, Y, ldy, beta, s, 0, NULL, 0, nm);
    if (tm <= 0) return tm;
    return launch_ok("qlinear_gpu_gemm_norm") != 0 ? -1 : 1;
}

extern "C" int qlinear_gpu_gemm_norm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, float *Y, int ldy,
                                     float beta, QGemmNorm *nm, void *stream) {
    if (!q || !nm || T < 1 || !X || !Y || ldx < q->cols || ldy < q->rows || (xdt != ST_BF16 && xdt != ST_F16)) return -1;
    if ((!nm->nw && !nm->ss_in) || (nm->nw && (!nm->xn || !nm->ss_out || nm->ldxn < q->rows)) ||
        (nm->ss_in && (nm->nss_in < 1 || nm->cols < 1)))
        return -1;
    QLinearGpu *qm = (QLinearGpu *)q;
    cudaStream_t s = (cudaStream_t)stream;
    if (xdt == ST_BF16) return gemm_norm_t<__nv_bfloat16>(qm, T, (const __nv_bfloat16 *)X, ldx, Y, ldy, beta, nm, s);
    return gemm_norm_t<__half>(qm, T, (const __half *)X, ldx, Y, ldy, beta, nm, s);
}

extern "C" int qlinear_gpu_norm_finish(StDtype xdt, int T, void *xn, int ldxn, const QGemmNorm *nm, void *stream) {
    if (!nm || !nm->ss_in || nm->nss_in < 1 || nm->cols < 1 || T < 0 || (T > 0 && !xn) || ldxn < nm->cols ||
        (xdt != ST_BF16 && xdt != ST_F16))
        return -1;
    if (T == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const float inv_d = 1.0f / (float)nm->cols;
    if (xdt == ST_BF16)
        k_norm_finish<__nv_bfloat16><<<T, 256, 0, s>>>((__nv_bfloat16 *)xn, ldxn, nm->cols, nm->ss_in, nm->nss_in, inv_d, nm->eps);
    else
        k_norm_finish<__half><<<T, 256, 0, s>>>((__half *)xn, ldxn, nm->cols, nm->ss_in, nm->nss_in, inv_d, nm->eps);
    return launch_ok("qlinear_gpu_norm_finish");
}

template <class X>
static int gemm_swiglu_t(QLinearGpu *q, int T, const X *Xm, int ldx, X *H, int ldh, int ff, cudaStream_t s,
                         const QGemmNorm *nm = NULL) {
    // what qtmat_gemm's SwiGLU instance needs (the caller checked rows = 2 ff, ff % 16 == 0), before
    // x_packed, which may gather x for nothing
    if (q->kind != QK_INT4 || !q->qt || !qtmat_on() || T > 16 || qtmat_ts(T) != 32) return 0;
    const X *A;
    int lda;
    if (x_packed(q, T, Xm, ldx, s, &A, &lda) != 0) return -1;
    const int tm = qtmat_gemm<X>(q, T, A, lda, NULL, 0, 0.0f, s, ff, H, ldh, (QGemmNorm *)nm);
    if (tm <= 0) return tm;
    return launch_ok("qlinear_gpu_gemm_swiglu") != 0 ? -1 : 1;
}

extern "C" int qlinear_gpu_gemm_swiglu(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, void *H, int ldh,
                                       int ff, void *stream) {
    if (!q || T < 1 || !X || !H || ff < 1 || ldx < q->cols || ldh < ff || (xdt != ST_BF16 && xdt != ST_F16)) return -1;
    if (q->rows != 2 * ff || ff % 16) return 0;
    QLinearGpu *qm = (QLinearGpu *)q;
    cudaStream_t s = (cudaStream_t)stream;
    if (xdt == ST_BF16) return gemm_swiglu_t<__nv_bfloat16>(qm, T, (const __nv_bfloat16 *)X, ldx, (__nv_bfloat16 *)H, ldh, ff, s);
    return gemm_swiglu_t<__half>(qm, T, (const __half *)X, ldx, (__half *)H, ldh, ff, s);
}

extern "C" int qlinear_gpu_gemm_swiglu_norm(const QLinearGpu *q, StDtype xdt, int T, const void *X, int ldx, void *H,
                                            int ldh, int ff, const QGemmNorm *nm, void *stream) {
    if (!q || !nm || nm->nw || !nm->ss_in || nm->nss_in < 1 || nm->cols < 1 || T < 1 || !X || !H || ff < 1 ||
        ldx < q->cols || ldh < ff || (xdt != ST_BF16 && xdt != ST_F16))
        return -1;
    if (q->rows != 2 * ff || ff % 16) return 0;
    QLinearGpu *qm = (QLinearGpu *)q;
    cudaStream_t s = (cudaStream_t)stream;
    if (xdt == ST_BF16)
        return gemm_swiglu_t<__nv_bfloat16>(qm, T, (const __nv_bfloat16 *)X, ldx, (__nv_bfloat16 *)H, ldh, ff, s, nm);
    return gemm_swiglu_t<__half>(qm, T, (const __half *)X, ldx, (__half *)H, ldh, ff, s, nm);
}

// ---------------------------------------------------------------- the benchmark's bf16 baseline
#include "gpu.h"
#include "step06_quant/qlinear_bench_gpu.h"

__global__ void k_fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {  // uniform(-1, 1) from a hash
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2bfloat16_rn((float)(h & 0xFFFF) / 32768.0f - 1.0f);
    }
}

typedef struct {
    cublasHandle_t h;
    int T, rows, cols, n, at;
    __nv_bfloat16 **W, *X;
    float *Y;
} Bf16Gemm;

static void bf16_gemm_call(void *ctx) {
    Bf16Gemm *g = (Bf16Gemm *)ctx;
    gemm_xwt(g->h, ST_BF16, g->T, g->rows, g->cols, g->X, g->cols, g->W[g->at], g->Y, g->rows, 0.0f);
    g->at = (g->at + 1) % g->n;
}

extern "C" double qbench_bf16_gemm_ms(int T, int rows, int cols, int warmup, int reps) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return -1.0;
    const size_t wn = (size_t)rows * cols, wb = wn * 2, want = (size_t)512 << 20;
    Bf16Gemm g = {};
    g.T = T, g.rows = rows, g.cols = cols, g.n = (int)(wb >= want ? 1 : (want + wb - 1) / wb);
    g.W = (__nv_bfloat16 **)calloc((size_t)g.n, sizeof *g.W);
    if (!g.W) return -1.0;
    CUBLAS_CHECK(cublasCreate(&g.h));
    for (int i = 0; i < g.n; i++) {
        CUDA_CHECK(cudaMalloc((void **)&g.W[i], wb));
        k_fill_bf16<<<1024, 256>>>(g.W[i], wn, 17u + (uint32_t)i);
        CUDA_CHECK_LAST();
    }
    CUDA_CHECK(cudaMalloc((void **)&g.X, (size_t)T * cols * 2));
    k_fill_bf16<<<256, 256>>>(g.X, (size_t)T * cols, 5u);
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaMalloc((void **)&g.Y, (size_t)T * rows * 4));
    const double ms = gpu_bench(bf16_gemm_call, &g, warmup + g.n, reps, g.n);
    for (int i = 0; i < g.n; i++) CUDA_CHECK(cudaFree(g.W[i]));
    free(g.W);
    CUDA_CHECK(cudaFree(g.X));
    CUDA_CHECK(cudaFree(g.Y));
    CUBLAS_CHECK(cublasDestroy(g.h));
    return ms;
}
