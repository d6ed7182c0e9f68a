// fused_bench.c — step07's fused-kernel ladder (being written: this first version only prints
// what it will measure).
#include <stdio.h>

int main(void) {
    printf("fused_bench: the fused add+RMSNorm, SwiGLU and RoPE+KV-write ladders (not built yet)\n");
    return 0;
}
