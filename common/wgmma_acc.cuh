// wgmma_acc.cuh — the accumulator operands of an inline-asm wgmma, written once for the kernels
// that issue it (step01's v9 GEMM, step07's v6 / v7 flash attention). wgmma.mma_async names every
// fp32 accumulator register of the thread as an operand ("+f": read and written); `d` is the
// accumulator array in scope at the asm statement, WG_ACCn its first n elements in order.
// defines: WG_ACC8, WG_ACC32, WG_ACC64, WG_ACC128
#pragma once

#define WG_ACC8(b)                                                                                       \
    "+f"(d[(b)]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), \
        "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define WG_ACC32 WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
#define WG_ACC64 WG_ACC32, WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
#define WG_ACC128 WG_ACC64, WG_ACC8(64), WG_ACC8(72), WG_ACC8(80), WG_ACC8(88), WG_ACC8(96), WG_ACC8(104), WG_ACC8(112), WG_ACC8(120)
