// paged_attention_none.c — step05's paged kernels for builds without CUDA (no nvcc): every entry
// point fails (the fp32 references in paged_attention_cpu.c are always built).
#include "step05_paged/paged_attention.h"

#if !HAVE_CUDA
#include <stdio.h>

int paged_kv_write(StDtype dt, const float *k, const float *v, int ld, const int *slots, int T, int kd, void *kc,
                   void *vc) {
    (void)dt, (void)k, (void)v, (void)ld, (void)slots, (void)T, (void)kd, (void)kc, (void)vc;
    return -1;
}
int paged_decode_supported(StDtype dt, int H, int KV, int hd) {
    (void)dt, (void)H, (void)KV, (void)hd;
    return 0;
}
int paged_decode_mma_ok(StDtype dt, int hd) {
    (void)dt, (void)hd;
    return 0;
}
int paged_decode_v1(const PagedDecode *a) {
    (void)a;
    return -1;
}
int paged_decode_v2(const PagedDecode *a) {
    (void)a;
    return -1;
}
int paged_decode_simt_max_g(void) { return PA_SIMT_MAX_G; }
int paged_decode_choose(int n, int KV, int max_len, int num_sms) {  // the rule of paged_attention.cu, defaults only
    if (max_len <= PA_PART) return 1;
    return (double)n * KV >= PA_V1_CTAS_PER_SM * (num_sms > 0 ? num_sms : 1) ? 1 : 2;
}
int paged_decode(const PagedDecode *a, int num_sms) {
    (void)a, (void)num_sms;
    return -1;
}
int paged_gather(StDtype dt, const void *kc, const void *vc, const int *block_tables, int bt_stride, int block_size,
                 int seq, int L, int kd, void *dk, void *dv) {
    (void)dt, (void)kc, (void)vc, (void)block_tables, (void)bt_stride, (void)block_size, (void)seq, (void)L, (void)kd;
    (void)dk, (void)dv;
    return -1;
}
void *pa_dev_alloc(size_t bytes) {
    (void)bytes;
    fprintf(stderr, "pa_dev_alloc: built without CUDA (nvcc was not found at build time)\n");
    return NULL;
}
void pa_dev_free(void *p) { (void)p; }
int pa_upload(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return -1;
}
int pa_download(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return -1;
}
int pa_upload_as(StDtype dt, void *dst, const float *src, size_t n) {
    (void)dt, (void)dst, (void)src, (void)n;
    return -1;
}
int pa_download_f32(StDtype dt, float *dst, const void *src, size_t n) {
    (void)dt, (void)dst, (void)src, (void)n;
    return -1;
}
int pa_sync(void) { return -1; }
int pa_num_sms(void) { return 0; }
#else
typedef int paged_attention_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
