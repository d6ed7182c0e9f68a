// roofline_gpu_none.c — roofline_gpu.h for builds without CUDA.
#include "roofline_gpu.h"

#if !HAVE_CUDA
int roofline_gpu_bandwidth(size_t bytes, int reps, double *c, double *r, double *w) {
    (void)bytes, (void)reps;
    *c = *r = *w = 0;
    return -1;
}
double roofline_gpu_fma_tflops(int reps) {
    (void)reps;
    return -1;
}
double roofline_gpu_gemm_ms(int dtype, int M, int N, int K, int reps) {
    (void)dtype, (void)M, (void)N, (void)K, (void)reps;
    return -1;
}
#else
typedef int roofline_gpu_none_is_empty_with_cuda;
#endif
