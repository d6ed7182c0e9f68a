// qlinear_pack.h — the GPU kernels' weight layout, built on the host (plain C, so the CPU tests
// check it): a QWeight (quant.h) repacked for qlinear_gpu.cu. The shuffle is done once at load.
// defines: QPacked, qpack, qpack_free, qpack_supported, qpack_word_index, qpack_nibble, qpack_get
//
// Columns: with g_idx (act-order) the columns are sorted by group (stably), so every group is a
// run of gs contiguous packed columns; packed column j is input column perm[j], and the kernels
// read x[perm[j]] (a gather at run time). Without g_idx perm is NULL (the identity).
// Padding: rows to np (a multiple of 16), packed columns to kp (a multiple of 64); a padded
// weight holds its group's zero point (it dequantizes to 0) and its input is 0.
//
// INT4, tiled for the tensor cores' m16n8k16 B fragment and for 16-byte loads: the matrix is cut
// into (16 rows x 64 columns) tiles, tile (nb, kc) at words [(nb * kp/64 + kc) * 128, +128);
// inside a tile, lane L (0..31) owns 4 consecutive words (one 16-byte load), word i covering the
// 16-column slice 16i .. 16i+15 of the tile. For row n = L / 4 (and n + 8) and k = 2 (L % 4)
// (and k + 1, k + 8, k + 9) of that slice, the 8 nibbles of the word are
//     nibble 0: (n, k)     nibble 4: (n, k+1)       -> b0 of the fragment of rows 0..7
//     nibble 1: (n, k+8)   nibble 5: (n, k+9)       -> b1 of rows 0..7
//     nibble 2: (n+8, k)   nibble 6: (n+8, k+1)     -> b0 of rows 8..15
//     nibble 3: (n+8, k+8) nibble 7: (n+8, k+9)     -> b1 of rows 8..15
// so (w & 0x000F000F) and (w & 0x00F000F0), then the same of w >> 8, are four 16-bit pairs that
// are exactly the four registers mma.sync wants, in order (the low half is the lower k).
// INT8: row-major (np, kp) bytes, packed columns (one 16-byte load = 16 weights of one row).
// Scales: (ng, np) fp32, group-major (a warp's rows are contiguous); zeros (ng, np) bytes, or
// NULL when symmetric (z = 2^(bits-1)).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "step06_quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    QuantKind kind;
    int rows, cols;   // out_features, in_features
    int np, kp;       // rows padded to 16, columns padded to 64
    int gs, ng;       // packed columns per group (cols when one group), number of groups
    int sym;
    int *perm;        // (cols) input column of packed column j, or NULL (identity)
    uint32_t *qw;     // INT4: (np/16, kp/64, 32, 4) words; INT8: (np, kp/4) words of 4 bytes
    size_t n_words;
    float *scales;    // (ng, np)
    uint8_t *zeros;   // (ng, np) or NULL
} QPacked;

// 1 when the kernels can take w: its groups are whole multiples of 32 columns or it has a single
// group; with g_idx every group has the same number of columns. Otherwise 0 and why in err.
int qpack_supported(const QWeight *w, char *err, int errlen);
// 0, or -1 + err (not supported, out of memory).
int qpack(const QWeight *w, QPacked *p, char *err, int errlen);
void qpack_free(QPacked *p);
// Where packed (row r, packed column j) lives: the word, and for INT4 the nibble (0..7) in it,
// for INT8 the byte (0..3).
size_t qpack_word_index(const QPacked *p, int r, int j);
int qpack_nibble(const QPacked *p, int r, int j);
int qpack_get(const QPacked *p, int r, int j);  // the integer q at packed (r, j)

#ifdef __cplusplus
}
#endif
