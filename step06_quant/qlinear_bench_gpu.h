// qlinear_bench_gpu.h — the bf16 baseline that qgemm_bench times beside the quantized kernels
// (in qlinear_gpu.cu; qlinear_gpu_none.c returns -1). The T = 1 baseline is step03's GEMV
// (kvcache.h gemv_gpu_bench_gbps).
// defines: qbench_bf16_gemm_ms, qlinear_gemv_n_versions, qlinear_gemv_version_name, qlinear_gemv_set_version,
//          qlinear_gemv_version_fp16, qlinear_gemv_set_pdl, qlinear_gemv_set_grid,
//          qlinear_gpu_gemv_version, qlinear_gemv_set_chain, qlinear_gemm_set_qtmat,
//          qlinear_gemm_set_deq_rows, qlinear_gemm_set_qtmat_ts, qlinear_gemm_set_qtmat_sp,
//          qlinear_gemm_set_qtmat_xorder, qlinear_gemm_set_qtmat_cl, qlinear_gemm_set_qtmat_red,
//          qlinear_gemm_set_qtmat_ring, qlinear_gemm_set_qtmat_rb1, qlinear_gemm_set_qtmat_adj
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

// Median milliseconds of one Y (T, rows) fp32 = X (T, cols) W^T with bf16 X and W through step02's
// gemm_xwt (cuBLAS), W rotated over copies totalling >= 512 MB so that it streams from memory (as
// the quantized layers are timed). warmup untimed calls, then reps samples (CUDA events). -1 without
// a GPU.
double qbench_bf16_gemm_ms(int T, int rows, int cols, int warmup, int reps);

// The quantized GEMV's ladder (qlinear_gpu.cu's version table): how many, their names, and which
// one qlinear_gpu_gemv runs (process-wide; -1, the default: the best measured for each kind).
int qlinear_gemv_n_versions(void);
const char *qlinear_gemv_version_name(int version);  // -1: "auto (...)"
void qlinear_gemv_set_version(int version);
// The version layer q runs now (auto resolved; a tensor-core rung its groups do not allow runs v1).
struct QLinearGpu;
int qlinear_gpu_gemv_version(const struct QLinearGpu *q);
// 1 when that version rounds x to fp16 (the tensor-core rungs): its error is fp16's, not fp32's.
int qlinear_gemv_version_fp16(int version);
// Programmatic dependent launch of the tensor-core rungs on sm_90 (their first weight loads start
// while the previous kernel finishes): 1 on, 0 off; unset, the environment's QLINEAR_PDL=1 turns it on.
void qlinear_gemv_set_pdl(int on);
// The TMA rungs' grid (k_qtma): 0 (the default) the fewest blocks that take every 16-row strip in
// the fewest rounds, 1 the grid whose busiest SM holds the fewest strips. Any grid computes the same
// outputs (a block takes strips blockIdx.x, + gridDim.x, ...); only the balance over the SMs changes.
void qlinear_gemv_set_grid(int policy);
// qlinear_gpu_gemv_chain (k_qtmc): 1 on, 0 off (it returns 0 and the caller runs the layers one
// kernel each), -1 the default (off; the environment's QLINEAR_CHAIN=1 turns it on).
void qlinear_gemv_set_chain(int on);
// qlinear_gpu_gemm's INT4 kernel for T <= 16 on sm_90a: 1 k_qtmat (the default: the bulk-copied
// weight ring of the TMA GEMV rungs, 8 or 16 tokens as the mma's B operand), 0 k_qgemm4; unset, the
// environment's QLINEAR_QTMAT=0 turns it off. (It was off by default until compute-sanitizer's
// racecheck passed on it, which it does since every consumer thread releases a ring stage.)
void qlinear_gemm_set_qtmat(int on);
// k_qtmat's weight tiles a ring stage: 16 or 32 (4 tiles of a stage in flight per consumer warp);
// anything else: the default (the environment's QLINEAR_QTMAT_TS, else 16 up to 4 rows, 32 above).
void qlinear_gemm_set_qtmat_ts(int ts);
// k_qtmat's 16-row strips a unit: 2 (each x fragment serves the two strips' tiles; only at 32 tiles a
// stage), 1, anything else the default (the environment's QLINEAR_QTMAT_SP, else 2 where that costs
// the busiest block no more strips' time, 1 elsewhere).
void qlinear_gemm_set_qtmat_sp(int sp);
// When k_qtmat's producer copies x (the chunk's columns of the T rows, a stage's worth on each of
// its own barriers): after xpre stages of weights (at most a ring's worth), then one stage of x
// before each stage of weights (xall 0) or all of x at once (xall 1). xpre < 0: the default (the
// environment's QLINEAR_QTMAT_XPRE and QLINEAR_QTMAT_XALL, else 1 and 0). The same sums either way.
void qlinear_gemm_set_qtmat_xorder(int xpre, int xall);
// k_qtmat's blocks a cluster: 1, 2 or 4 (the blocks of a cluster share a chunk of x and each copies
// every cl-th row of it into all of them); anything else the default (the environment's
// QLINEAR_QTMAT_CL, else 2). Where the device cannot hold the grid's clusters at once: 1.
void qlinear_gemm_set_qtmat_cl(int cl);
// k_qtmat's column chunks (nc > 1) when beta = 1: 1 adds each chunk's sums into Y with atomic adds (no
// k_qtmat_sum; the order of the additions, so Y's last bits, vary from run to run), 0 (the default)
// sums them in chunk order in k_qtmat_sum; -1: QLINEAR_QTMAT_RED, else 0.
void qlinear_gemm_set_qtmat_red(int on);
// k_qtmat's ring of weights in bytes (its stages: bytes / stage, at least 2, as many as fit beside
// x); <= 0: the default (the environment's QLINEAR_QTMAT_RING, else 160 KB where x is cut into
// chunks and the partial sums take one buffer, 64 KB otherwise).
void qlinear_gemm_set_qtmat_ring(int bytes);
// k_qtmat's partial sums of a unit in one buffer (1; a barrier more a unit) or two (0); -1: the
// default (QLINEAR_QTMAT_RB1, else one where x is cut into chunks, two elsewhere). The same sums
// either way.
void qlinear_gemm_set_qtmat_rb1(int on);
// Which tiles of a stage each of k_qtmat's consumer warps takes: 1 adjacent ones (a group's scale then
// applied once to the products of its tiles), 0 W apart; -1: the default (QLINEAR_QTMAT_ADJ, else 0).
void qlinear_gemm_set_qtmat_adj(int on);
// qlinear_gpu_gemm from how many rows T on expands the weights to X's type (a chunk of rows at a
// time) and multiplies with cuBLAS: t >= 1 that many, 0 never, < 0 the default (the environment's
// QLINEAR_DEQ_T, else 512 rows for INT4 and 64 for INT8, where the tensor-core kernels fall behind).
void qlinear_gemm_set_deq_rows(int t);

#ifdef __cplusplus
}
#endif
