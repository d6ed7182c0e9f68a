// linear_rows.h — the projection of the batched CPU runner: a GEMM whose every output element is
// computed by the same instructions in the same order whatever the number of rows.
// defines: linear_rows_cpu
//
// Why not step02's linear_cpu (OpenBLAS sgemm)? Its result for one row depends on how many rows
// are in the call: OpenBLAS 0.3.21 picks a different kernel (and with it a different order of
// the k-sum) for small M*N*K and for the M remainder of its tiles. Measured here on the shapes of
// the test checkpoints: a row computed in a call of 1 row and the same row in a call of 7 rows
// differ in the last bits for ~all rows of a 64x172 projection (tests/test_step04_batching.c
// reproduces it). A request's tokens would then depend on its batch mates. This kernel fixes the
// order: y[t][j] = b[j] + (8 partial sums over k, lane l taking k = l, l+8, ..., each one fused
// multiply-add, added in a fixed tree), computed on 4 rows x 2 columns at a time, where missing
// rows and columns of an edge tile are copies of the last real one (so edges run the same code).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// y (T, n_out) = x (T, n_in) W^T + b, W (n_out, n_in) (Hugging Face Linear layout), b (n_out) or NULL.
// Row t of y depends only on row t of x, W and b: bit for bit the same for any T and any thread count.
void linear_rows_cpu(const float *x, const float *W, const float *b, int T, int n_in, int n_out, float *y);

#ifdef __cplusplus
}
#endif
