// npy.h — read and write NumPy .npy files (format version 1.0), float32 and int32,
// C order, little endian: how logits and goldens travel between C and Python.
// defines: npy_save_f32, npy_save_i32, NpyArray, npy_load, npy_free
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

#define NPY_MAX_DIMS 8

// Returns 0 on success, -1 (with a message on stderr) on failure.
int npy_save_f32(const char *path, const float *data, int ndim, const size_t *shape);
int npy_save_i32(const char *path, const int *data, int ndim, const size_t *shape);

typedef struct {
    char dtype[8];                // "<f4", "<i4", "<f8", "<i8"
    int ndim;
    size_t shape[NPY_MAX_DIMS];
    size_t count;                 // product of shape
    void *data;                   // count elements of dtype
} NpyArray;

// Loads a C-order little-endian .npy of dtype f4/f8/i4/i8. Returns 0, or -1 with a message.
int npy_load(const char *path, NpyArray *out);
void npy_free(NpyArray *a);

#ifdef __cplusplus
}
#endif
