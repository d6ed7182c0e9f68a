// safetensors.h — read Hugging Face .safetensors weights: one file or a sharded set, mmapped.
// defines: StDtype, StTensor, StSet, st_open, st_get, st_close, st_parse_header,
//          st_dtype_name, st_dtype_size, st_to_f32, st_to_i32, st_dtype_from_name,
//          StWriteTensor, st_write
//
// File format: 8-byte little-endian header length N, then N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {...}}
// then the data; offsets are relative to the end of the header. Everything is validated before
// use: header size cap, JSON, known dtype, shape x dtype size == end - begin, offsets inside the
// file, no two tensors overlapping. A bad file is an error naming the file and the tensor, never
// a crash.
#pragma once
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

// The float dtypes hold weights; the integer ones hold quantized checkpoints' packed words
// (GPTQ / AWQ qweight, qzeros, g_idx are I32) and small integer tensors.
typedef enum { ST_F32 = 0, ST_F16 = 1, ST_BF16 = 2, ST_I32 = 3, ST_I8 = 4, ST_U8 = 5 } StDtype;

#define ST_MAX_DIMS 4
#define ST_HEADER_MAX (100u << 20)  // refuse headers larger than 100 MiB

typedef struct {
    char *name;                  // "model.layers.0.self_attn.q_proj.weight"
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];  // row-major; a HF Linear weight is (out_features, in_features)
    int64_t numel;
    const void *data;            // into the mmapped file, numel * st_dtype_size(dtype) bytes
    size_t nbytes;
    int shard;                   // index into StSet.files
} StTensor;

typedef struct {
    int n_tensors;
    StTensor *tensors;  // sorted by name
    int n_files;
    char **files;       // paths of the shards, for messages
    void **maps;        // mmapped base addresses
    size_t *map_sizes;
} StSet;

// Open `path`: a .safetensors file, or a model directory holding model.safetensors or
// model.safetensors.index.json (sharded). Returns 0, or -1 with a one-line reason in err.
int st_open(const char *path, StSet *s, char *err, int errlen);
// NULL if no tensor of that name.
const StTensor *st_get(const StSet *s, const char *name);
void st_close(StSet *s);

// Parse and validate one file's bytes (header + data) already in memory: the fuzzing entry
// point, also used by st_open. On success the tensors point into buf. Returns 0 / -1 + err.
int st_parse_header(const uint8_t *buf, size_t len, const char *src, int shard, StTensor **out, int *n_out,
                    char *err, int errlen);

const char *st_dtype_name(StDtype d);  // "F32", "F16", "BF16", "I32", "I8", "U8"
size_t st_dtype_size(StDtype d);
// "F32" -> ST_F32 ...: 0, or -1 for a name not in StDtype.
int st_dtype_from_name(const char *name, StDtype *out);
// "[4096, 11008]" into buf (for messages); returns buf.
const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);
// Convert a whole tensor to fp32 (out has t->numel floats); integers by value (I32 beyond 2^24
// rounds: read packed words with st_to_i32 instead).
void st_to_f32(const StTensor *t, float *out);
// An integer tensor (I32, I8, U8) to int32 (out has t->numel ints); a float one is truncated
// toward zero. The packed words of a quantized checkpoint come back bit for bit.
void st_to_i32(const StTensor *t, int32_t *out);

// ------------------------------------------------------------------ writing (safetensors_write.c)
// One tensor to write: data holds numel(shape) * st_dtype_size(dtype) bytes, little endian.
typedef struct {
    const char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} StWriteTensor;

// Write a .safetensors file readable by st_open and by the safetensors library: header padded
// with spaces to a multiple of 8, "__metadata__": {"format": "pt"}, the data laid out without
// gaps, larger dtypes first (then by name), so every tensor starts aligned to its dtype size.
// Names must be unique. Returns 0, or -1 with a reason naming the file (and tensor) in err.
int st_write(const char *path, const StWriteTensor *t, int n, char *err, int errlen);

#ifdef __cplusplus
}
#endif
