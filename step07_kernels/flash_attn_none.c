// flash_attn_none.c — step07's flash attention for builds without CUDA (no nvcc): the ladder is
// empty and every launch fails (the tile plan and the fp32 reference in flash_attn_cpu.c are
// always built).
#include <stddef.h>

#include "step07_kernels/flash_attn.h"

#if !HAVE_CUDA
int flash_num_versions(void) { return 0; }
const FlashVersion *flash_version(int i) {
    (void)i;
    return NULL;
}
const FlashVersion *flash_find_version(int id) {
    (void)id;
    return NULL;
}
int flash_attn_run(const FlashAttn *a, int id) {
    (void)a, (void)id;
    return -1;
}
int flash_attn_tile_m(const FlashAttn *a) {
    (void)a;
    return FA_TILE_M_MAX;
}
int flash_attn(const FlashAttn *a) {
    (void)a;
    return -1;
}
int flash_attn_pick(const FlashAttn *a) {
    (void)a;
    return -1;
}
#else
typedef int flash_attn_none_is_empty_with_cuda;  // ISO C forbids an empty translation unit
#endif
