// paged_prefill_none.c — step05's fused prefill attention for builds without CUDA (no nvcc):
// no shape is supported and every launch fails (the plan and the fp32 reference in
// paged_prefill_cpu.c are always built).
#include "step05_paged/paged_prefill.h"

#if !HAVE_CUDA
int paged_prefill_supported(StDtype dt, int H, int KV, int hd) {
    (void)dt, (void)H, (void)KV, (void)hd;
    return 0;
}
int paged_prefill(const PagedPrefill *a) {
    (void)a;
    return -1;
}
int paged_prefill_simt(const PagedPrefill *a) {
    (void)a;
    return -1;
}
#else
typedef int paged_prefill_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
