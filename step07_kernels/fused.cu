// fused.cu — step07's fused kernels: residual add + RMSNorm, SwiGLU, RoPE + paged K/V write, each
// a ladder of versions (fused.h says what each computes and where it rounds; fused_bench times
// them, tests/test_step07_kernels.c checks every version against fused_cpu.c).
//
// Why fusion pays for these ops: they do a few FLOPs per byte, so their time is bytes / bandwidth
// plus a launch. The unfused add + RMSNorm pair moves, per element of a (T, n) row block in a
// 2-byte dtype: add (read x, read r, write r: 6 bytes) + norm (read r, write out: 4 bytes, plus a
// second read of r when the row does not stay in L1) = 10-12 bytes and 2 launches; fused: read x,
// read r, write r, write out = 8 bytes and 1 launch. RoPE + K/V write: the unfused pair writes the
// rotated k back to the qkv buffer and reads k and v again to copy them into the cache; fused, k
// goes from registers straight to its cache row.
//
// The add + RMSNorm ladder:
//   v0  k_residual_add (grid-stride, one element per thread) + the RMSNorm kernel (step02's
//       k_rmsnorm for an fp32 residual; the same kernel reading a 16-bit residual otherwise): one
//       block of 256 threads per row, the row read twice (once for the sum of squares, once to
//       normalize).
//   v1  one block per row; each thread keeps its VPT elements of s = x + r in registers between
//       the reduction and the output, so x and r are read once; block_sum for the reduction.
//   v2  16-byte vector loads/stores (8 bf16/fp16 or 4 fp32 per access); a row is handled by TPR
//       threads (a power of two >= 32, each holding <= 4 vectors), reduced with warp shuffles and
//       one shared-memory step across the row's warps; 256 / TPR rows per block when rows are
//       short (hidden 1024 bf16: a warp per row, 8 rows per block). A hidden size that is not a
//       multiple of the vector width (or unaligned pointers) runs the same kernel with scalar
//       accesses.
//   v3  what v2's structure leaves: at large T, each block re-reads w for every row and sits
//       idle across the reduction barrier with no loads in flight; at small T, the few rows are
//       latency-bound. v3 is persistent (a grid that fills the GPU once, rows grid-strided), keeps
//       its columns of w in registers, issues the next row's x and r loads before this row's
//       reduction, reads x and w through the read-only path (__ldg) and r as streaming (__ldcs);
//       below T = 2 * SMs it spreads a row over more threads (one vector each).
//   v4  a warp per row with the whole row in flight (up to 16 vectors of x and of r per lane, the
//       rounded sum kept packed in x's registers): no block barrier at all, 4 rows per block;
//       rows of more than 512 vectors or not vectorizable run v2.
// SwiGLU: v0 the engine's k_swiglu (one element per thread, a 64-bit division per element), v1
// a 2-D grid (columns x rows) with 16-byte loads of gate and up. RoPE + K/V write: v0 step02's
// k_rope + step05's paged_kv_write, v1 one kernel per row (scalar), v2 the same with float4
// loads (4 rotation pairs per thread, needs hd % 8 == 0, else v1's kernel runs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "cuda_check.h"
#include "step02_attention/forward_gpu.cuh"  // tof, fromf, DISPATCH, block_sum, k_rmsnorm, k_swiglu
#include "step05_paged/paged_attention.h"    // paged_kv_write
#include "step07_kernels/fused.h"

// step02's rotate-half RoPE in place on x (T, nh, hd), row stride ld (defined in forward_gpu.cu).
__global__ void k_rope(float *x, int T, int nh, int hd, size_t ld, const float *cos_t, const float *sin_t);

// ---------------------------------------------------------------- small device helpers

// x rounded to T's precision, back as a float (the HF rounding points of fused.h).
template <class T> __device__ __forceinline__ float rnd(float x) { return tof(fromf<T>(x)); }

// The raw word of N elements of T: what one vector access moves.
template <int BYTES> struct RawT { typedef unsigned short type; };
template <> struct RawT<4> { typedef unsigned type; };
template <> struct RawT<8> { typedef uint2 type; };
template <> struct RawT<16> { typedef uint4 type; };
template <> struct RawT<32> { typedef uint4 type; };  // not used for loads (see load_w)

// N consecutive elements of T at p (aligned to N * sizeof(T) when N > 1) as floats.
// H: 0 plain load, 1 read-only path (__ldg), 2 streaming (__ldcs).
template <class T, int N, int H = 0> __device__ __forceinline__ void load_f(const T *p, float *f) {
    if constexpr (N == 1) {
        f[0] = tof(p[0]);
    } else {
        typedef typename RawT<N * sizeof(T)>::type W;
        static_assert(sizeof(W) == N * sizeof(T), "vector access of 2, 4, 8 or 16 bytes");
        W u;
        if constexpr (H == 1) u = __ldg(reinterpret_cast<const W *>(p));
        else if constexpr (H == 2) u = __ldcs(reinterpret_cast<const W *>(p));
        else u = *reinterpret_cast<const W *>(p);
        const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
        for (int i = 0; i < N; i++) f[i] = tof(e[i]);
    }
}
// N floats rounded to T, stored at p with one access.
template <class T, int N> __device__ __forceinline__ void store_f(T *p, const float *f) {
    if constexpr (N == 1) {
        p[0] = fromf<T>(f[0]);
    } else if constexpr (N * sizeof(T) > 16) {  // 8 fp32: two 16-byte stores
        store_f<T, N / 2>(p, f);
        store_f<T, N / 2>(p + N / 2, f + N / 2);
    } else {
        typedef typename RawT<N * sizeof(T)>::type W;
        W u;
        T *e = reinterpret_cast<T *>(&u);
#pragma unroll
        for (int i = 0; i < N; i++) e[i] = fromf<T>(f[i]);
        *reinterpret_cast<W *>(p) = u;
    }
}
// N fp32 weights (N = 1, 4 or 8; 16-byte aligned when N >= 4).
template <int N, bool LDG> __device__ __forceinline__ void load_w(const float *p, float *f) {
    if constexpr (N == 1) {
        f[0] = LDG ? __ldg(p) : p[0];
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 v = LDG ? __ldg(reinterpret_cast<const float4 *>(p + i)) : *reinterpret_cast<const float4 *>(p + i);
            f[i] = v.x, f[i + 1] = v.y, f[i + 2] = v.z, f[i + 3] = v.w;
        }
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
// add + RMSNorm's rows can be read and written in 16-byte vectors of vw elements
static int addnorm_vectorizable(const void *x, const void *res, const float *w, const void *out, int n, int vw) {
    return n % vw == 0 && aligned16(x) && aligned16(res) && aligned16(w) && aligned16(out);
}

static int num_sms(void) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    return sms;
}

// ---------------------------------------------------------------- add + RMSNorm: v0 (unfused)

// r[i] = round_R(x[i] + r[i]) over n elements: the residual add as its own kernel.
template <class R> __global__ void k_residual_add(const R *x, R *r, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        r[i] = fromf<R>(tof(x[i]) + tof(r[i]));
}

// step02's k_rmsnorm (one block per row, the row read twice) for a 16-bit residual R, with the
// HF rounding of the normalized value to R before the weight. Grid (T).
template <class R, class O> __global__ void k_rmsnorm_hf(const R *x, const float *w, int n, float eps, O *y) {
    const size_t off = (size_t)blockIdx.x * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += tof(x[off + i]) * tof(x[off + i]);
    const float inv = rsqrtf(block_sum(ss) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[off + i] = fromf<O>(w[i] * rnd<R>(tof(x[off + i]) * inv));
}

// ---------------------------------------------------------------- add + RMSNorm: v1 (one pass)

// One block per row; thread i holds elements i, i + blockDim, ... (VPT of them) in registers.
template <class R, class O, int VPT>
__global__ void __launch_bounds__(1024) k_addnorm_v1(const R *x, R *res, const float *w, int n, float eps, O *out) {
    const size_t off = (size_t)blockIdx.x * n;
    float v[VPT];
    float ss = 0;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = 0;
        if (i < n) {
            v[k] = rnd<R>(tof(x[off + i]) + tof(res[off + i]));
            res[off + i] = fromf<R>(v[k]);
            ss += v[k] * v[k];
        }
    }
    const float inv = rsqrtf(block_sum(ss) / n + eps);
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n) out[off + i] = fromf<O>(w[i] * rnd<R>(v[k] * inv));
    }
}

// ---------------------------------------------------------------- add + RMSNorm: v2, v3 (vectorized)

// The raw word one access of N elements of T moves (T itself for N = 1), loaded with hint H and
// converted to floats afterwards, so a prefetched row costs N * sizeof(T) / 4 registers.
template <class T, int N> struct Raw { typedef typename RawT<N * sizeof(T)>::type type; };
template <class T> struct Raw<T, 1> { typedef T type; };
template <class T, int N, int H> __device__ __forceinline__ typename Raw<T, N>::type load_raw(const T *p) {
    typedef typename Raw<T, N>::type W;
    if constexpr (H == 1) return __ldg(reinterpret_cast<const W *>(p));
    else if constexpr (H == 2) return __ldcs(reinterpret_cast<const W *>(p));
    else return *reinterpret_cast<const W *>(p);
}
template <class T, int N> __device__ __forceinline__ void raw_to_f(const typename Raw<T, N>::type &u, float *f) {
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < N; i++) f[i] = tof(e[i]);
}

#define AN_THREADS 256  // the most threads per block of v2 / v3 (the register budget assumes it)

// TPR threads per row (a power of two, 32 .. 256), blockDim / TPR rows per block; thread lt of a
// row handles vectors lt, lt + TPR, ... (at most VMAX) of VW elements. PERSIST (v3): the grid
// strides over rows, w stays in registers, the next row's loads are issued before this row's
// reduction. Row bases and pointers are aligned to VW elements (the launcher checks).
template <class R, class O, int VW, int VMAX, bool PERSIST>
__global__ void __launch_bounds__(AN_THREADS)
    k_addnorm_vec(const R *__restrict__ x, R *__restrict__ res, const float *__restrict__ w, int T, int n, int tpr,
                  float eps, O *__restrict__ out) {
    typedef typename Raw<R, VW>::type W;
    constexpr int HX = PERSIST ? 1 : 0, HR = PERSIST ? 2 : 0;
    __shared__ float part[AN_THREADS / 32];
    const int nvec = n / VW, rpb = blockDim.x / tpr;
    const int lr = threadIdx.x / tpr, lt = threadIdx.x % tpr, wpr = tpr / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    W xr[VMAX], rr[VMAX];
    float wv[PERSIST ? VMAX * VW : 1];
    if constexpr (PERSIST) {
#pragma unroll
        for (int k = 0; k < VMAX; k++) {
            const int j = lt + k * tpr;
            if (j < nvec) load_w<VW, true>(w + (size_t)j * VW, wv + k * VW);
        }
    }
    const int stride = PERSIST ? gridDim.x * rpb : T;
    auto load_row = [&](int row) {
#pragma unroll
        for (int k = 0; k < VMAX; k++) {
            const int j = lt + k * tpr;
            if (row < T && j < nvec) {
                const size_t o = (size_t)row * n + (size_t)j * VW;
                xr[k] = load_raw<R, VW, HX>(x + o);
                rr[k] = load_raw<R, VW, HR>(res + o);
            }
        }
    };
    int base = blockIdx.x * rpb;
    load_row(base + lr);
    for (; base < T; base += stride) {  // uniform over the block: every thread takes each barrier
        const int row = base + lr;
        float s[VMAX * VW];
        float ss = 0;
#pragma unroll
        for (int k = 0; k < VMAX; k++) {
            const int j = lt + k * tpr;
            if (row < T && j < nvec) {
                float a[VW], b[VW];
                raw_to_f<R, VW>(xr[k], a);
                raw_to_f<R, VW>(rr[k], b);
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    s[k * VW + i] = rnd<R>(a[i] + b[i]);
                    ss += s[k * VW + i] * s[k * VW + i];
                }
                store_f<R, VW>(res + (size_t)row * n + (size_t)j * VW, s + k * VW);
            }
        }
        if constexpr (PERSIST) load_row(base + stride + lr);  // next row's loads in flight across the reduction
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (wpr > 1) {
            __syncthreads();  // part[] of the previous row has been read
            if (lane == 0) part[warp] = ss;
            __syncthreads();
            ss = 0;
            for (int i = 0; i < wpr; i++) ss += part[lr * wpr + i];
        }
        const float inv = rsqrtf(ss / n + eps);
#pragma unroll
        for (int k = 0; k < VMAX; k++) {
            const int j = lt + k * tpr;
            if (row < T && j < nvec) {
                float wk[VW], y[VW];
                if constexpr (PERSIST) {
#pragma unroll
                    for (int i = 0; i < VW; i++) wk[i] = wv[k * VW + i];
                } else {
                    load_w<VW, false>(w + (size_t)j * VW, wk);
                }
#pragma unroll
                for (int i = 0; i < VW; i++) y[i] = wk[i] * rnd<R>(s[k * VW + i] * inv);
                store_f<O, VW>(out + (size_t)row * n + (size_t)j * VW, y);
            }
        }
    }
}

static int pow2_at_least(int v, int lo) {
    int p = lo;
    while (p < v) p <<= 1;
    return p;
}

// The launch of k_addnorm_vec<.., VW, VMAX, PERSIST>; nvec = n / VW <= AN_THREADS * VMAX.
template <class R, class O, int VW, int VMAX, bool PERSIST>
static int addnorm_vec_launch(const R *x, R *res, const float *w, int T, int n, float eps, O *out, cudaStream_t s) {
    const int nvec = n / VW;
    int tpr = pow2_at_least((nvec + VMAX - 1) / VMAX, 32);
    if (PERSIST && T < 2 * num_sms()) tpr = pow2_at_least(nvec < AN_THREADS ? nvec : AN_THREADS, 32);  // latency-bound: spread
    const int rpb = AN_THREADS / tpr, bd = tpr * rpb;
    int grid = (T + rpb - 1) / rpb;
    if (PERSIST) {
        static int per_sm[AN_THREADS / 32 + 1];  // blocks per SM by block size, one table per template instance
        int &ps = per_sm[bd / 32];
        if (!ps) CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, k_addnorm_vec<R, O, VW, VMAX, PERSIST>, bd, 0));
        const int cap = (ps > 0 ? ps : 1) * num_sms();
        if (grid > cap) grid = cap;
    }
    k_addnorm_vec<R, O, VW, VMAX, PERSIST><<<grid, bd, 0, s>>>(x, res, w, T, n, tpr, eps, out);
    CUDA_CHECK_LAST();
    return 1;
}

template <class R, class O>
static int addnorm_v1(const R *x, R *res, const float *w, int T, int n, float eps, O *out, cudaStream_t s) {
    const int vpt = n <= 1024 ? 1 : n <= 2048 ? 2 : n <= 4096 ? 4 : n <= 8192 ? 8 : n <= 16384 ? 16 : 32;
    const int bd = ((n + vpt - 1) / vpt + 31) / 32 * 32;
#define V1(P) k_addnorm_v1<R, O, P><<<T, bd, 0, s>>>(x, res, w, n, eps, out)
    switch (vpt) {
    case 1: V1(1); break;
    case 2: V1(2); break;
    case 4: V1(4); break;
    case 8: V1(8); break;
    case 16: V1(16); break;
    default: V1(32); break;
    }
#undef V1
    CUDA_CHECK_LAST();
    return 1;
}

// v2 (PERSIST false) or v3: 16-byte vectors when n and the pointers allow, else scalar accesses;
// a row longer than the register tiles hold (bf16 > 16384, fp32 > 8192, scalar > 8192) runs v1.
template <class R, class O, bool PERSIST>
static int addnorm_vec(const R *x, R *res, const float *w, int T, int n, float eps, O *out, cudaStream_t s) {
    constexpr int VW = 16 / sizeof(R);
    const int vec = addnorm_vectorizable(x, res, w, out, n, VW);
    if (vec && n / VW <= AN_THREADS * 4) return addnorm_vec_launch<R, O, VW, 4, PERSIST>(x, res, w, T, n, eps, out, s);
    if (vec && n / VW <= AN_THREADS * 8) return addnorm_vec_launch<R, O, VW, 8, PERSIST>(x, res, w, T, n, eps, out, s);
    if (!vec && n <= AN_THREADS * 8) return addnorm_vec_launch<R, O, 1, 8, PERSIST>(x, res, w, T, n, eps, out, s);
    if (!vec && n <= AN_THREADS * 32) return addnorm_vec_launch<R, O, 1, 32, PERSIST>(x, res, w, T, n, eps, out, s);
    return addnorm_v1<R, O>(x, res, w, T, n, eps, out, s);
}

// ---------------------------------------------------------------- add + RMSNorm: v4 (a warp per row)

// One warp per row and every vector of the row in flight at once (V 16-byte vectors per lane: up to
// 512 vectors, hidden 4096 in bf16): no block barrier, the reduction is the warp's shuffles only.
// The rounded sum s is kept packed in the residual dtype, in the registers x arrived in (s is
// rounded to R anyway, so nothing is lost), which is what lets a lane hold 16 vectors of x and r.
#define AN4_WARPS 4  // rows per block
template <class R, class O, int V>
__global__ void __launch_bounds__(AN4_WARPS * 32)
    k_addnorm_v4(const R *__restrict__ x, R *__restrict__ res, const float *__restrict__ w, int T, int n, float eps,
                 O *__restrict__ out) {
    constexpr int VW = 16 / sizeof(R);
    const int lane = threadIdx.x % 32, row = blockIdx.x * AN4_WARPS + threadIdx.x / 32;
    if (row >= T) return;  // a whole warp: nothing below waits for other warps
    const int nvec = n / VW;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x + (size_t)row * n);
    uint4 *rv = reinterpret_cast<uint4 *>(res + (size_t)row * n);
    uint4 xr[V], rr[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int j = lane + 32 * k;
        if (j < nvec) xr[k] = __ldcs(xv + j), rr[k] = __ldcs(rv + j);
    }
    float ss = 0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int j = lane + 32 * k;
        if (j < nvec) {
            float a[VW], b[VW];
            raw_to_f<R, VW>(xr[k], a);
            raw_to_f<R, VW>(rr[k], b);
            R *e = reinterpret_cast<R *>(&xr[k]);
#pragma unroll
            for (int i = 0; i < VW; i++) {
                const float sv = rnd<R>(a[i] + b[i]);
                e[i] = fromf<R>(sv);
                ss += sv * sv;
            }
            rv[j] = xr[k];
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / n + eps);
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int j = lane + 32 * k;
        if (j < nvec) {
            float sv[VW], wk[VW], y[VW];
            raw_to_f<R, VW>(xr[k], sv);
            load_w<VW, true>(w + (size_t)j * VW, wk);
#pragma unroll
            for (int i = 0; i < VW; i++) y[i] = wk[i] * rnd<R>(sv[i] * inv);
            store_f<O, VW>(out + (size_t)row * n + (size_t)j * VW, y);
        }
    }
}

// v4 where the row is vectorizable and at most 512 vectors (else v2's kernel runs).
template <class R, class O>
static int addnorm_v4(const R *x, R *res, const float *w, int T, int n, float eps, O *out, cudaStream_t s) {
    constexpr int VW = 16 / sizeof(R);
    const int nvec = n / VW;
    if (!addnorm_vectorizable(x, res, w, out, n, VW) || nvec > 32 * 16)
        return addnorm_vec<R, O, false>(x, res, w, T, n, eps, out, s);
    const int grid = (T + AN4_WARPS - 1) / AN4_WARPS;
    if (nvec <= 32 * 4) k_addnorm_v4<R, O, 4><<<grid, AN4_WARPS * 32, 0, s>>>(x, res, w, T, n, eps, out);
    else if (nvec <= 32 * 8) k_addnorm_v4<R, O, 8><<<grid, AN4_WARPS * 32, 0, s>>>(x, res, w, T, n, eps, out);
    else k_addnorm_v4<R, O, 16><<<grid, AN4_WARPS * 32, 0, s>>>(x, res, w, T, n, eps, out);
    CUDA_CHECK_LAST();
    return 1;
}

template <class R, class O>
static int addnorm_typed(int version, const void *xp, void *resp, const float *w, int T, int n, float eps, void *outp,
                         cudaStream_t s) {
    const R *x = (const R *)xp;
    R *res = (R *)resp;
    O *out = (O *)outp;
    if (version == 0) {
        k_residual_add<R><<<grid_for((size_t)T * n, 256), 256, 0, s>>>(x, res, (size_t)T * n);
        CUDA_CHECK_LAST();
        if constexpr (std::is_same<R, float>::value) k_rmsnorm<O><<<T, 256, 0, s>>>(res, w, n, 1, n, eps, out);
        else k_rmsnorm_hf<R, O><<<T, 256, 0, s>>>(res, w, n, eps, out);
        CUDA_CHECK_LAST();
        return 2;
    }
    if (version == 1) return addnorm_v1<R, O>(x, res, w, T, n, eps, out, s);
    if (version == 2) return addnorm_vec<R, O, false>(x, res, w, T, n, eps, out, s);
    if (version == 3) return addnorm_vec<R, O, true>(x, res, w, T, n, eps, out, s);
    return addnorm_v4<R, O>(x, res, w, T, n, eps, out, s);
}

static int float_dtype(StDtype d) { return d == ST_F32 || d == ST_F16 || d == ST_BF16; }

extern "C" int fused_add_rmsnorm(int version, StDtype rdt, StDtype odt, const void *x, void *residual, const float *w,
                                 int T, int n, float eps, void *out, void *stream) {
    if (version < 0 || version >= FUSED_ADDNORM_VERSIONS || !float_dtype(rdt) || !float_dtype(odt) ||
        (rdt != ST_F32 && odt != rdt) || T < 0 || n < 1 || n > 32768 || !x || !residual || !w || !out) {
        fprintf(stderr, "fused_add_rmsnorm: bad arguments (version %d, T %d, n %d, dtypes %d/%d)\n", version, T, n,
                (int)rdt, (int)odt);
        return -1;
    }
    if (T == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    int r = -1;
    // the pairs the engine has: an fp32 residual with an output in any dtype, or both 16-bit alike
    if (rdt == ST_F32 && odt == ST_F32) r = addnorm_typed<float, float>(version, x, residual, w, T, n, eps, out, s);
    else if (rdt == ST_F32 && odt == ST_BF16) r = addnorm_typed<float, __nv_bfloat16>(version, x, residual, w, T, n, eps, out, s);
    else if (rdt == ST_F32) r = addnorm_typed<float, __half>(version, x, residual, w, T, n, eps, out, s);
    else if (rdt == ST_BF16) r = addnorm_typed<__nv_bfloat16, __nv_bfloat16>(version, x, residual, w, T, n, eps, out, s);
    else r = addnorm_typed<__half, __half>(version, x, residual, w, T, n, eps, out, s);
    return r;
}

// ---------------------------------------------------------------- SwiGLU

// v0 for a 16-bit input: the engine's k_swiglu loop with the input-dtype rounding of silu.
template <class I, class O> __global__ void k_swiglu_hf(const I *gu, O *h, int T, int ff) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * ff; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / ff, j = i % ff;
        const float g = tof(gu[t * 2 * ff + j]), u = tof(gu[t * 2 * ff + ff + j]);
        h[i] = fromf<O>(rnd<I>(g / (1.0f + expf(-g))) * u);
    }
}

// v1: grid (column blocks, rows); thread j of the row handles columns j*VW .. j*VW+VW-1.
// Launched with PDL (fused_swiglu_pdl) it waits for the kernel before it first thing.
template <class I, class O, int VW> __global__ void k_swiglu_vec(const I *__restrict__ gu, O *__restrict__ h, int T, int ff) {
    pdl_trigger();
    pdl_wait();
    const int nvec = ff / VW, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= nvec) return;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        const I *row = gu + (size_t)t * 2 * ff;
        float g[VW], u[VW], y[VW];
        load_f<I, VW, 1>(row + (size_t)j * VW, g);
        load_f<I, VW, 1>(row + ff + (size_t)j * VW, u);
#pragma unroll
        for (int i = 0; i < VW; i++) y[i] = rnd<I>(g[i] / (1.0f + __expf(-g[i]))) * u[i];
        store_f<O, VW>(h + (size_t)t * ff + (size_t)j * VW, y);
    }
}

template <class I, class O> static int swiglu_typed(int version, const I *gu, O *h, int T, int ff, cudaStream_t s, int pdl) {
    if (version == 0) {
        if constexpr (std::is_same<I, float>::value)
            k_swiglu<O><<<grid_for((size_t)T * ff, 256), 256, 0, s>>>(gu, h, T, ff);
        else
            k_swiglu_hf<I, O><<<grid_for((size_t)T * ff, 256), 256, 0, s>>>(gu, h, T, ff);
        CUDA_CHECK_LAST();
        return 1;
    }
    constexpr int VW = 16 / sizeof(I);
    const int vec = ff % VW == 0 && aligned16(gu) && aligned16(h);
    const int nvec = vec ? ff / VW : ff, threads = 128;
    const dim3 grid((nvec + threads - 1) / threads, T < 65535 ? T : 65535);
    if (vec) pdl_launch(pdl, k_swiglu_vec<I, O, VW>, grid, dim3(threads), 0, s, gu, h, T, ff);
    else pdl_launch(pdl, k_swiglu_vec<I, O, 1>, grid, dim3(threads), 0, s, gu, h, T, ff);
    return 1;
}

extern "C" int fused_swiglu(int version, StDtype idt, StDtype odt, const void *gu, void *h, int T, int ff, void *stream) {
    return fused_swiglu_pdl(version, idt, odt, gu, h, T, ff, stream, 0);
}

extern "C" int fused_swiglu_pdl(int version, StDtype idt, StDtype odt, const void *gu, void *h, int T, int ff, void *stream,
                                int pdl) {
    if (version < 0 || version >= FUSED_SWIGLU_VERSIONS || !float_dtype(idt) || !float_dtype(odt) || T < 0 || ff < 1 ||
        !gu || !h) {
        fprintf(stderr, "fused_swiglu: bad arguments (version %d, T %d, ff %d)\n", version, T, ff);
        return -1;
    }
    if (T == 0) return 0;
    int r = -1;
    DISPATCH(idt, I, DISPATCH(odt, O, r = swiglu_typed<I, O>(version, (const I *)gu, (O *)h, T, ff, (cudaStream_t)stream, pdl)));
    return r;
}

// ---------------------------------------------------------------- RoPE + paged K/V write

// One block per row t. Items: (H + KV) * half/P rotation groups (P pairs each: head h, pairs
// e .. e+P-1 with their partners e+half ..), then KV*hd/P v groups of P elements.
// P = 1 (v1) or 4 (v2: float4 loads; half % 4 == 0 and 16-byte aligned rows).
template <class C, int P>
__global__ void k_rope_kv(float *__restrict__ qkv, int H, int KV, int hd, const float *__restrict__ cos_t,
                          const float *__restrict__ sin_t, const int *__restrict__ slots, C *__restrict__ kc,
                          C *__restrict__ vc) {
    const int t = blockIdx.x, half = hd / 2, gph = half / P, s = slots[t];
    const size_t kd = (size_t)KV * hd;
    float *row = qkv + (size_t)t * (H + 2 * KV) * hd;
    const float *ct = cos_t + (size_t)t * half, *st = sin_t + (size_t)t * half;
    const int n_rot = (s < 0 ? H : H + KV) * gph, n_v = s < 0 ? 0 : (int)(kd / P);
    for (int it = threadIdx.x; it < n_rot + n_v; it += blockDim.x) {
        if (it < n_rot) {
            const int h = it / gph, e = (it % gph) * P;
            float *p = row + (size_t)h * hd;
            float x1[P], x2[P], c[P], sn[P], y1[P], y2[P];
            if constexpr (P == 4) {
                const float4 a = *reinterpret_cast<const float4 *>(p + e), b = *reinterpret_cast<const float4 *>(p + e + half);
                const float4 cc = __ldg(reinterpret_cast<const float4 *>(ct + e)), ss = __ldg(reinterpret_cast<const float4 *>(st + e));
                x1[0] = a.x, x1[1] = a.y, x1[2] = a.z, x1[3] = a.w, x2[0] = b.x, x2[1] = b.y, x2[2] = b.z, x2[3] = b.w;
                c[0] = cc.x, c[1] = cc.y, c[2] = cc.z, c[3] = cc.w, sn[0] = ss.x, sn[1] = ss.y, sn[2] = ss.z, sn[3] = ss.w;
            } else {
                x1[0] = p[e], x2[0] = p[e + half], c[0] = ct[e], sn[0] = st[e];
            }
#pragma unroll
            for (int i = 0; i < P; i++) y1[i] = x1[i] * c[i] - x2[i] * sn[i], y2[i] = x2[i] * c[i] + x1[i] * sn[i];
            if (h < H) {  // q: in place, fp32
                if constexpr (P == 4) {
                    *reinterpret_cast<float4 *>(p + e) = make_float4(y1[0], y1[1], y1[2], y1[3]);
                    *reinterpret_cast<float4 *>(p + e + half) = make_float4(y2[0], y2[1], y2[2], y2[3]);
                } else {
                    p[e] = y1[0], p[e + half] = y2[0];
                }
            } else {  // k: straight to its cache row
                C *dst = kc + (size_t)s * kd + (size_t)(h - H) * hd;
                store_f<C, P>(dst + e, y1);
                store_f<C, P>(dst + e + half, y2);
            }
        } else {
            const size_t e = (size_t)(it - n_rot) * P;
            float v[P];
            if constexpr (P == 4) {
                const float4 a = *reinterpret_cast<const float4 *>(row + (size_t)(H + KV) * hd + e);
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            } else {
                v[0] = row[(size_t)(H + KV) * hd + e];
            }
            store_f<C, P>(vc + (size_t)s * kd + e, v);
        }
    }
}

extern "C" int fused_rope_kv_write(int version, StDtype cdt, float *qkv, int T, int H, int KV, int hd,
                                   const float *cos_t, const float *sin_t, const int *slots, void *kc, void *vc,
                                   void *stream) {
    if (version < 0 || version >= FUSED_ROPE_VERSIONS || !float_dtype(cdt) || T < 0 || H < 1 || KV < 1 || hd < 2 ||
        hd % 2 || !qkv || !cos_t || !sin_t || !slots || !kc || !vc || (version == 0 && stream)) {
        fprintf(stderr, "fused_rope_kv_write: bad arguments (version %d, T %d, H %d, KV %d, hd %d%s)\n", version, T, H,
                KV, hd, version == 0 && stream ? ", v0 runs on the default stream only" : "");
        return -1;
    }
    if (T == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const int ld = (H + 2 * KV) * hd, half = hd / 2;
    if (version == 0) {
        k_rope<<<grid_for((size_t)T * (H + KV) * half, 256), 256>>>(qkv, T, H + KV, hd, ld, cos_t, sin_t);
        CUDA_CHECK_LAST();
        if (paged_kv_write(cdt, qkv + (size_t)H * hd, qkv + (size_t)(H + KV) * hd, ld, slots, T, KV * hd, kc, vc)) return -1;
        return 2;
    }
    const int vec = version == 2 && half % 4 == 0 && aligned16(qkv) && aligned16(cos_t) && aligned16(sin_t) &&
                    aligned16(kc) && aligned16(vc);
    const int items = (H + KV) * half + KV * hd;
    const int per = vec ? 4 : 1, want = (items / per + 31) / 32 * 32;
    const int threads = want < 32 ? 32 : want > 256 ? 256 : want;
    if (vec) {
        DISPATCH(cdt, C, k_rope_kv<C, 4><<<T, threads, 0, s>>>(qkv, H, KV, hd, cos_t, sin_t, slots, (C *)kc, (C *)vc));
    } else {
        DISPATCH(cdt, C, k_rope_kv<C, 1><<<T, threads, 0, s>>>(qkv, H, KV, hd, cos_t, sin_t, slots, (C *)kc, (C *)vc));
    }
    CUDA_CHECK_LAST();
    return 1;
}
