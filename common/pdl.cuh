// pdl.cuh — programmatic dependent launch (sm_90) from inside a kernel, for the kernels launched
// with cudaLaunchAttributeProgrammaticStreamSerialization (step06's quantized GEMVs, step07's
// fused decode step). Below sm_90 both compile to nothing and the kernels run one after another.
// defines: pdl_trigger, pdl_wait
#pragma once

// The next kernel on the stream may start now (its blocks run up to their own pdl_wait).
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Wait until the previous kernel on the stream has completed and its writes are visible.
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
