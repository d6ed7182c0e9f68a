// cp_async.cuh — asynchronous 16-byte global -> shared copies (sm_80's cp.async) for step05's
// kernels: the copy goes straight to shared memory without passing through registers, so a
// thread can keep many loads in flight and wait for them by group. Below sm_80 the same calls
// copy synchronously (correct, not asynchronous), so a kernel needs one code path.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

// 16 bytes src -> dst (shared); src_bytes 0 writes 16 zero bytes and reads nothing.
__device__ inline void cp_async16(void *dst, const void *src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(src_bytes) : "memory");
#else
    *(uint4 *)dst = src_bytes ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#endif
}
// Close the group of the copies issued since the last commit (an empty group is allowed).
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N> __device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// The same with a run-time count (0 .. 7; a warp-uniform branch to the immediate form).
__device__ inline void cp_async_wait_n(int n) {
    switch (n) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        case 4: cp_async_wait<4>(); break;
        case 5: cp_async_wait<5>(); break;
        case 6: cp_async_wait<6>(); break;
        default: cp_async_wait<7>(); break;
    }
}
