// mma.cuh — the sm_80+ tensor-core building blocks step05's kernels share (paged_prefill.cu's
// fused prefill, paged_attention.cu's tensor-core decode loop): bf16/fp16 pair packing, the
// m16n8k16 MMA with fp32 accumulation, ldmatrix; step07's flash attention uses them too. The MMA
// and ldmatrix exist from sm_80 on (PA_MMA_ARCH is then defined); in code built for an older GPU
// they trap, and the hosts never launch a kernel that uses them there.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PA_MMA_ARCH 1
#endif
template <class C> __device__ inline unsigned pack2(float lo, float hi);
template <> __device__ inline unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
    return *(unsigned *)&v;
}
template <> __device__ inline unsigned pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(unsigned *)&v;
}
template <class C> __device__ inline void unpack2(unsigned v, float &lo, float &hi);
template <> __device__ inline void unpack2<__nv_bfloat16>(unsigned v, float &lo, float &hi) {
    lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
}
template <> __device__ inline void unpack2<__half>(unsigned v, float &lo, float &hi) {
    const float2 f = __half22float2(*(const __half2 *)&v);
    lo = f.x, hi = f.y;
}
// d (16x8 fp32) += a (16x16, row) * b (16x8, col)
template <class C> __device__ inline void mma16816(float d[4], const unsigned a[4], unsigned b0, unsigned b1);
template <> __device__ inline void mma16816<__nv_bfloat16>(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
#ifdef PA_MMA_ARCH
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1, __trap();
#endif
}
template <> __device__ inline void mma16816<__half>(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
#ifdef PA_MMA_ARCH
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1, __trap();
#endif
}
// Four 8x8 b16 matrices; lanes 8i .. 8i+7 give the row addresses of matrix i, r[i] its fragment
// (lane holds row lane/4, columns 2*(lane%4), +1; transposed with .trans).
__device__ inline void ldsm_x4(unsigned r[4], const void *p) {
#ifdef PA_MMA_ARCH
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    (void)p, r[0] = r[1] = r[2] = r[3] = 0, __trap();
#endif
}
__device__ inline void ldsm_x4_t(unsigned r[4], const void *p) {
#ifdef PA_MMA_ARCH
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    (void)p, r[0] = r[1] = r[2] = r[3] = 0, __trap();
#endif
}
