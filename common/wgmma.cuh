// wgmma.cuh — the Hopper (sm_90a) pieces shared by the kernels that issue wgmma (step01's v9 GEMM,
// step07's v6 - v10 flash attention): mbarriers, TMA copies, the shared-memory matrix descriptor,
// the wgmma group fences, and the accumulator operand lists of an inline-asm wgmma.
// defines: WGMMA_ARCH (sm_90a code only), mbar_init, mbar_arrive, mbar_wait, mbar_expect_tx, tma_load_2d,
//          fence_proxy_async,
//          smem_desc, wgmma_fence, wgmma_commit, wgmma_wait0, wgmma_wait1,
//          wgmma_fence_operands, WG_ACC8, WG_ACC32, WG_ACC64, WG_ACC128
#pragma once
#include <stdint.h>

// The functions exist only where the instructions do: device code compiled for sm_90a.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_ARCH 1
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase with this parity has completed (a fresh barrier counts parity 1 as done).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// This thread's generic-proxy shared-memory accesses (stores, cp.async), ordered with the async
// proxy wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Shared-memory matrix descriptor: start address, leading/stride byte offsets (all >> 4),
// 128-byte swizzle (mode 1 in bits 62-63).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// TMA: the next phase of bar also waits for `bytes` of copies (the arrival of the thread that issues them)
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// TMA: one 2D box (c0 = innermost coordinate) of the tensor map (a __grid_constant__ kernel
// parameter) from global into shared memory, counted on bar as it lands (async proxy writes: the
// wgmmas that read them need no proxy fence)
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// all but the newest committed group have completed (groups complete in the order committed)
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// The compiler sees a wgmma's accumulators (and A registers) as written (read) when the asm
// statement issues, not when the hardware is done with them. After a wait, this pins each
// register to that point: no read or reuse of it is moved above the wait.
template <int N> __device__ __forceinline__ void wgmma_fence_operands(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int M, int N> __device__ __forceinline__ void wgmma_fence_operands(unsigned (&r)[M][N]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int j = 0; j < N; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}
#endif

// wgmma.mma_async names every fp32 accumulator register of the thread as an operand ("+f": read
// and written); `d` is the accumulator array in scope at the asm statement, WG_ACCn its first n
// elements in order.
#define WG_ACC8(b)                                                                                       \
    "+f"(d[(b)]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), \
        "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define WG_ACC32 WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
#define WG_ACC64 WG_ACC32, WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
#define WG_ACC128 WG_ACC64, WG_ACC8(64), WG_ACC8(72), WG_ACC8(80), WG_ACC8(88), WG_ACC8(96), WG_ACC8(104), WG_ACC8(112), WG_ACC8(120)
