// pdl.cuh — programmatic dependent launch (sm_90): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous kernel of its
// stream still runs (step06's quantized GEMVs, step07's fused decode step, step04's batch-1 decode
// graph). Below sm_90 the two instructions compile to nothing and the kernels run one after another.
// defines: pdl_trigger, pdl_wait, pdl_launch
#pragma once
#include <cuda_runtime.h>

#include "cuda_check.h"

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
