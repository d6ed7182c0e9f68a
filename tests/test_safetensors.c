// test_safetensors.c — step02's loader claims: a .safetensors file (or a sharded set) is read
// back exactly (values, dtypes, shapes, F16/BF16 -> F32 bit-exact), a Llama-family checkpoint
// is assembled tensor by tensor with shapes checked against config.json, and every kind of
// bad input is refused with -1 and a message naming the file, the tensor and what is wrong.
// Files are built here by a tiny safetensors writer, in a fresh temp directory per test.
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "fs_util.h"
#include "safetensors.h"

// ------------------------------------------------------------------------------ temp dir

static char tmp[64];

static void mk_tmp(void) { test_mkdtemp(tmp, sizeof tmp, "st_test"); }
static void rm_tmp(void) { test_rmtree(tmp); }

// tmp/<name>, in a static ring so a test can hold a few at once.
static const char *at(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", tmp, name);
    return p;
}

// ------------------------------------------------------------------------------ writer

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

// A safetensors file from a raw header: 8-byte LE length, the JSON padded with spaces to a
// multiple of 8 (as the safetensors library does), then the data. Returns the file size.
static size_t write_raw(const char *path, const char *header, const void *data, size_t dlen) {
    size_t h = strlen(header), hp = (h + 7) & ~(size_t)7;
    size_t n = 8 + hp + dlen;
    uint8_t *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, ' ', hp - h);
    if (dlen) memcpy(b + 8 + hp, data, dlen);
    write_bytes(path, b, n);
    free(b);
    return n;
}

typedef struct {
    const char *name, *dtype;
    int ndim;
    int64_t shape[4];
    const void *data;  // NULL: a byte pattern
} WT;

static size_t wt_bytes(const WT *t) {
    size_t n = !strcmp(t->dtype, "F32") ? 4 : 2;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

// Tensors packed in the given order, with a __metadata__ entry like real files carry.
static void write_st(const char *path, const WT *t, int n) {
    size_t cap = 256 + (size_t)n * 256, k = 0, off = 0, total = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t nb = wt_bytes(&t[i]);
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) k += (size_t)snprintf(h + k, cap - k, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        off += nb;
    }
    snprintf(h + k, cap - k, "}");
    total = off;
    uint8_t *d = malloc(total ? total : 1);
    off = 0;
    for (int i = 0; i < n; i++) {
        size_t nb = wt_bytes(&t[i]);
        if (t[i].data) memcpy(d + off, t[i].data, nb);
        else
            for (size_t j = 0; j < nb; j++) d[off + j] = (uint8_t)(i * 31 + j);
        off += nb;
    }
    write_raw(path, h, d, total);
    free(h);
    free(d);
}

// ------------------------------------------------------------------------------ helpers

static char err[1024];

static int open_err(const char *path, StSet *s) {
    err[0] = 0;
    int rc = st_open(path, s, err, sizeof err);
    if (rc == 0) st_close(s);
    return rc;
}

#define ASSERT_ERR(rc, ...)                                                            \
    do {                                                                               \
        cr_assert_eq((rc), -1, "expected -1 (an error), got %d", (rc));                \
        const char *want_[] = {__VA_ARGS__};                                           \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)                 \
            cr_assert(strstr(err, want_[i_]), "message \"%s\" should mention \"%s\"", err, want_[i_]); \
    } while (0)

static uint16_t u16(const void *p, size_t i) {
    const uint8_t *b = (const uint8_t *)p + 2 * i;
    return (uint16_t)(b[0] | b[1] << 8);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// ------------------------------------------------------------------------------ valid files

Test(step02, loader_roundtrips_values_dtypes_shapes, .init = mk_tmp, .fini = rm_tmp) {
    float a[6] = {1.5f, -2, 3.25f, 0, 1e-30f, 65504};
    uint16_t h[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};  // F16: 1, -2, 65504, 2^-24
    uint16_t b[4] = {0x3F80, 0xC040, 0x4049, 0x0001};  // BF16: 1, -3, 3.140625, 2^-133
    float s = 7;
    WT t[] = {
        {"w.f32", "F32", 2, {2, 3}, a}, {"w.f16", "F16", 1, {4}, h}, {"w.bf16", "BF16", 3, {1, 2, 2}, b},
        {"scalar", "F32", 0, {0}, &s},  {"empty", "BF16", 2, {0, 5}, NULL},
    };
    write_st(at("m.safetensors"), t, 5);
    StSet st;
    cr_assert_eq(st_open(at("m.safetensors"), &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st.n_tensors, 5, "__metadata__ is not a tensor");
    cr_assert_eq(st.n_files, 1);
    for (int i = 1; i < st.n_tensors; i++) cr_assert(strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0, "sorted");

    const StTensor *x = st_get(&st, "w.f32");
    cr_assert_not_null(x);
    cr_assert_eq(x->dtype, ST_F32);
    cr_assert_eq(x->ndim, 2);
    cr_assert_eq(x->shape[0], 2);
    cr_assert_eq(x->shape[1], 3);
    cr_assert_eq(x->numel, 6);
    cr_assert_eq(x->nbytes, 24);
    cr_assert_eq(x->shard, 0);
    cr_assert_eq(memcmp(x->data, a, sizeof a), 0);
    float out[6];
    st_to_f32(x, out);
    cr_assert_eq(memcmp(out, a, sizeof a), 0, "F32 -> F32 is a copy");

    x = st_get(&st, "w.f16");
    cr_assert(x && x->dtype == ST_F16 && x->ndim == 1 && x->shape[0] == 4 && x->nbytes == 8);
    for (int i = 0; i < 4; i++) cr_assert_eq(u16(x->data, i), h[i]);
    x = st_get(&st, "w.bf16");
    cr_assert(x && x->dtype == ST_BF16 && x->ndim == 3 && x->shape[2] == 2 && x->numel == 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(u16(x->data, i), b[i]);
    x = st_get(&st, "scalar");
    cr_assert(x && x->ndim == 0 && x->numel == 1 && x->nbytes == 4);
    st_to_f32(x, out);
    cr_assert_eq(out[0], 7.0f);
    x = st_get(&st, "empty");
    cr_assert(x && x->numel == 0 && x->nbytes == 0);
    cr_assert_null(st_get(&st, "w.f3"));
    cr_assert_null(st_get(&st, "zzz"));
    cr_assert_null(st_get(&st, ""));
    st_close(&st);
    st_close(&st);  // closing twice is harmless
}

Test(step02, st_to_f32_known_bit_patterns) {
    struct { uint16_t bits; float want; } f16[] = {
        {0x0000, 0.0f},         {0x3C00, 1.0f},         {0xC000, -2.0f},          {0x3555, 0.333251953125f},
        {0x7BFF, 65504.0f},     {0x0400, 0x1p-14f},     {0x03FF, 1023 * 0x1p-24f}, {0x0001, 0x1p-24f},
        {0x8001, -0x1p-24f},    {0x7C00, INFINITY},     {0xFC00, -INFINITY},      {0x3BFF, 0.99951171875f},
    };
    struct { uint16_t bits; float want; } bf16[] = {
        {0x3F80, 1.0f}, {0xC040, -3.0f}, {0x4049, 3.140625f}, {0x7F80, INFINITY}, {0x0001, 0x1p-133f}, {0x7F7F, 0x1.fep127f},
    };
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++) {
        StTensor t = {.dtype = ST_F16, .numel = 1, .data = &f16[i].bits};
        float o;
        st_to_f32(&t, &o);
        cr_assert_eq(f32_bits(o), f32_bits(f16[i].want), "F16 0x%04x -> %a, want %a", f16[i].bits, o, f16[i].want);
    }
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++) {
        StTensor t = {.dtype = ST_BF16, .numel = 1, .data = &bf16[i].bits};
        float o;
        st_to_f32(&t, &o);
        cr_assert_eq(f32_bits(o), f32_bits(bf16[i].want), "BF16 0x%04x -> %a, want %a", bf16[i].bits, o, bf16[i].want);
    }
    uint16_t neg0 = 0x8000, nan = 0x7E01;
    StTensor t = {.dtype = ST_F16, .numel = 1, .data = &neg0};
    float o;
    st_to_f32(&t, &o);
    cr_assert(o == 0 && signbit(o), "F16 -0 keeps its sign");
    t.data = &nan;
    st_to_f32(&t, &o);
    cr_assert(isnan(o), "F16 NaN stays NaN");
}

// Every one of the 65536 patterns: F16 -> F32 -> F16 and BF16 -> F32 -> BF16 give the same
// bits back (NaN payloads included), and F16 -> F32 agrees with the compiler's _Float16.
Test(step02, st_to_f32_all_16bit_patterns_roundtrip) {
    uint16_t *in = malloc(65536 * 2);
    float *o = malloc(65536 * 4);
    for (int i = 0; i < 65536; i++) in[i] = (uint16_t)i;
    StTensor t = {.dtype = ST_BF16, .numel = 65536, .data = in};
    st_to_f32(&t, o);
    for (int i = 0; i < 65536; i++) cr_assert_eq(f32_bits(o[i]) >> 16, (uint32_t)i, "BF16 0x%04x", i);
    for (int i = 0; i < 65536; i++) cr_assert_eq(f32_bits(o[i]) & 0xffff, 0u);
    t.dtype = ST_F16;
    st_to_f32(&t, o);
    for (int i = 0; i < 65536; i++) {
        uint32_t u = f32_bits(o[i]);
        uint32_t e = (u >> 23) & 0xff, man = u & 0x7fffff;
        uint16_t back;  // f32 -> f16 for values that are exact halves (all of them here)
        if (e == 0xff) back = (uint16_t)((u >> 16 & 0x8000) | 0x7C00 | man >> 13);
        else if (e == 0) back = (uint16_t)(u >> 16 & 0x8000);
        else if (e >= 113) back = (uint16_t)((u >> 16 & 0x8000) | (e - 112) << 10 | man >> 13);
        else back = (uint16_t)((u >> 16 & 0x8000) | ((man | 0x800000) >> (126 - e)));
        cr_assert_eq(back, (uint16_t)i, "F16 0x%04x -> %a -> 0x%04x", i, o[i], back);
        if (e != 0xff) cr_assert_eq(man & 0x1fff, 0u, "F16 0x%04x gave a float with low mantissa bits", i);
#ifdef __FLT16_MAX__
        _Float16 hf;
        memcpy(&hf, &in[i], 2);
        if (isnan((float)hf)) cr_assert(isnan(o[i]));
        else cr_assert_eq(f32_bits(o[i]), f32_bits((float)hf), "F16 0x%04x: %a, compiler says %a", i, o[i], (float)hf);
#endif
    }
    free(in);
    free(o);
}

Test(step02, loader_opens_a_directory_with_model_safetensors, .init = mk_tmp, .fini = rm_tmp) {
    WT t[] = {{"a", "F32", 1, {3}, NULL}};
    write_st(at("model.safetensors"), t, 1);
    StSet st;
    cr_assert_eq(st_open(tmp, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st.n_tensors, 1);
    cr_assert_not_null(st_get(&st, "a"));
    st_close(&st);
}

static const char *INDEX2 =
    "{\"metadata\": {\"total_size\": 40}, \"weight_map\": {"
    "\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
    "\"c\": \"model-00002-of-00002.safetensors\"}}";

static void write_two_shards(void) {
    float av[2] = {1, 2}, cv[3] = {5, 6, 7};
    WT s1[] = {{"a", "F32", 1, {2}, av}, {"b", "BF16", 2, {2, 2}, NULL}};
    WT s2[] = {{"c", "F32", 1, {3}, cv}};
    write_st(at("model-00001-of-00002.safetensors"), s1, 2);
    write_st(at("model-00002-of-00002.safetensors"), s2, 1);
}

Test(step02, loader_opens_sharded_checkpoint_via_index, .init = mk_tmp, .fini = rm_tmp) {
    write_two_shards();
    write_text(at("model.safetensors.index.json"), INDEX2);
    StSet st;
    cr_assert_eq(st_open(tmp, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st.n_files, 2, "each shard opened once");
    cr_assert_eq(st.n_tensors, 3);
    const StTensor *a = st_get(&st, "a"), *c = st_get(&st, "c");
    cr_assert(a && c && st_get(&st, "b"));
    cr_assert(strstr(st.files[a->shard], "model-00001-of-00002.safetensors"));
    cr_assert(strstr(st.files[c->shard], "model-00002-of-00002.safetensors"));
    float o[3];
    st_to_f32(c, o);
    cr_assert(o[0] == 5 && o[1] == 6 && o[2] == 7);
    st_to_f32(a, o);
    cr_assert(o[0] == 1 && o[1] == 2);
    st_close(&st);
    // The index path itself works too.
    cr_assert_eq(st_open(at("model.safetensors.index.json"), &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st.n_tensors, 3);
    st_close(&st);
}

// ------------------------------------------------------------------------------ bad files

Test(step02, loader_refuses_truncated_file, .init = mk_tmp, .fini = rm_tmp) {
    float v[4] = {1, 2, 3, 4};
    WT t[] = {{"model.norm.weight", "F32", 1, {4}, v}};
    write_st(at("full.safetensors"), t, 1);
    FILE *f = fopen(at("full.safetensors"), "rb");
    uint8_t buf[512];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    StSet st;
    // Cut in the length field, in the header, in the data.
    write_bytes(at("cut8.safetensors"), buf, 5);
    ASSERT_ERR(open_err(at("cut8.safetensors"), &st), "cut8.safetensors", "5 bytes", "truncated");
    write_bytes(at("cuth.safetensors"), buf, 30);
    ASSERT_ERR(open_err(at("cuth.safetensors"), &st), "cuth.safetensors", "header length", "truncated");
    write_bytes(at("cutd.safetensors"), buf, n - 3);
    ASSERT_ERR(open_err(at("cutd.safetensors"), &st), "cutd.safetensors", "'model.norm.weight'", "truncated");
    write_bytes(at("empty.safetensors"), buf, 0);
    ASSERT_ERR(open_err(at("empty.safetensors"), &st), "empty.safetensors", "0 bytes");
    // The whole file still opens.
    cr_assert_eq(open_err(at("full.safetensors"), &st), 0, "%s", err);
}

Test(step02, loader_refuses_header_length_beyond_file, .init = mk_tmp, .fini = rm_tmp) {
    uint8_t b[64] = {0};
    memcpy(b + 8, "{}", 2);
    StSet st;
    b[0] = 200;  // 200 bytes of header in a 64-byte file
    write_bytes(at("a.safetensors"), b, sizeof b);
    ASSERT_ERR(open_err(at("a.safetensors"), &st), "a.safetensors", "header length 200", "beyond the end");
    b[0] = 0, b[5] = 1;  // 2^40: over the size cap
    write_bytes(at("b.safetensors"), b, sizeof b);
    ASSERT_ERR(open_err(at("b.safetensors"), &st), "b.safetensors", "1099511627776", "limit");
    memset(b, 0xff, 8);  // 2^64 - 1: no wrap-around
    write_bytes(at("c.safetensors"), b, sizeof b);
    ASSERT_ERR(open_err(at("c.safetensors"), &st), "c.safetensors", "18446744073709551615");
}

Test(step02, loader_refuses_bad_json_header, .init = mk_tmp, .fini = rm_tmp) {
    StSet st;
    write_raw(at("a.safetensors"), "{\"x\": {\"dtype\": \"F32\",", NULL, 0);
    ASSERT_ERR(open_err(at("a.safetensors"), &st), "a.safetensors", "not valid JSON");
    write_raw(at("b.safetensors"), "[1, 2]", NULL, 0);
    ASSERT_ERR(open_err(at("b.safetensors"), &st), "b.safetensors", "not a JSON object");
    write_raw(at("c.safetensors"), "{\"x\": 3}", NULL, 0);
    ASSERT_ERR(open_err(at("c.safetensors"), &st), "tensor 'x'", "not a JSON object");
    write_raw(at("d.safetensors"), "{\"x\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", "abcd", 4);
    ASSERT_ERR(open_err(at("d.safetensors"), &st), "tensor 'x'", "dtype");
    write_raw(at("e.safetensors"), "{\"x\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", "abcd", 4);
    ASSERT_ERR(open_err(at("e.safetensors"), &st), "tensor 'x'", "shape");
    write_raw(at("f.safetensors"), "{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}", "abcd", 4);
    ASSERT_ERR(open_err(at("f.safetensors"), &st), "tensor 'x'", "data_offsets");
    write_raw(at("g.safetensors"), "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                                   " \"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", "abcd", 4);
    ASSERT_ERR(open_err(at("g.safetensors"), &st), "g.safetensors", "duplicate");
    write_raw(at("h.safetensors"), "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} junk", "abcd", 4);
    ASSERT_ERR(open_err(at("h.safetensors"), &st), "h.safetensors", "not valid JSON");
}

Test(step02, loader_refuses_unknown_dtype, .init = mk_tmp, .fini = rm_tmp) {
    StSet st;
    write_raw(at("a.safetensors"), "{\"model.position_ids\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}}",
              "0123456789abcdef", 16);
    ASSERT_ERR(open_err(at("a.safetensors"), &st), "a.safetensors", "'model.position_ids'", "I64", "not supported");
    write_raw(at("b.safetensors"), "{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [0, 2]}}", "01", 2);
    ASSERT_ERR(open_err(at("b.safetensors"), &st), "'w'", "F8_E4M3");
    write_raw(at("c.safetensors"), "{\"w\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", "0123", 4);
    ASSERT_ERR(open_err(at("c.safetensors"), &st), "'w'", "dtype");
}

Test(step02, loader_refuses_shape_length_mismatch, .init = mk_tmp, .fini = rm_tmp) {
    char data[32] = {0};
    StSet st;
    write_raw(at("model.safetensors"),
              "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [4096], \"data_offsets\": [10, 20]}}", data, 32);
    cr_assert_eq(open_err(at("model.safetensors"), &st), -1);
    char want[512];
    snprintf(want, sizeof want,
             "%s: tensor 'model.norm.weight': data_offsets [10, 20) do not match shape [4096] x F32 = 16384 bytes",
             at("model.safetensors"));
    cr_assert_str_eq(err, want);
    // Negative and non-integer dims, too many dims, a product that overflows 64 bits.
    write_raw(at("b.safetensors"), "{\"w\": {\"dtype\": \"F16\", \"shape\": [-2], \"data_offsets\": [0, 4]}}", data, 4);
    ASSERT_ERR(open_err(at("b.safetensors"), &st), "'w'", "shape");
    write_raw(at("c.safetensors"), "{\"w\": {\"dtype\": \"F16\", \"shape\": [2.0], \"data_offsets\": [0, 4]}}", data, 4);
    ASSERT_ERR(open_err(at("c.safetensors"), &st), "'w'", "shape");
    write_raw(at("d.safetensors"), "{\"w\": {\"dtype\": \"F16\", \"shape\": [1,1,1,1,2], \"data_offsets\": [0, 4]}}", data, 4);
    ASSERT_ERR(open_err(at("d.safetensors"), &st), "'w'", "5 dimensions");
    write_raw(at("e.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", data, 0);
    ASSERT_ERR(open_err(at("e.safetensors"), &st), "'w'", "64 bits");
    // 2^62 elements x 4 bytes overflows too; must not wrap to a small number.
    write_raw(at("f.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 0]}}",
              data, 0);
    ASSERT_ERR(open_err(at("f.safetensors"), &st), "'w'", "do not match");
    // A zero dimension makes an empty tensor even next to huge ones.
    write_raw(at("g.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 0], \"data_offsets\": [0, 0]}}", data, 0);
    cr_assert_eq(open_err(at("g.safetensors"), &st), 0, "%s", err);
}

Test(step02, loader_refuses_overlapping_tensors, .init = mk_tmp, .fini = rm_tmp) {
    char data[32] = {0};
    StSet st;
    write_raw(at("a.safetensors"),
              "{\"first\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
              " \"second\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [12, 20]}}", data, 32);
    ASSERT_ERR(open_err(at("a.safetensors"), &st), "a.safetensors", "'first'", "'second'", "overlap");
    // Same range twice; and one tensor inside a bigger one listed after a third.
    write_raw(at("b.safetensors"),
              "{\"p\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
              " \"q\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [0, 8]}}", data, 32);
    ASSERT_ERR(open_err(at("b.safetensors"), &st), "'p'", "'q'", "overlap");
    write_raw(at("c.safetensors"),
              "{\"big\": {\"dtype\": \"F32\", \"shape\": [6], \"data_offsets\": [0, 24]},"
              " \"next\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [24, 28]},"
              " \"inner\": {\"dtype\": \"F16\", \"shape\": [1], \"data_offsets\": [20, 22]}}", data, 32);
    ASSERT_ERR(open_err(at("c.safetensors"), &st), "'big'", "'inner'", "overlap");
    // Adjacent tensors, gaps and empty tensors are fine.
    write_raw(at("d.safetensors"),
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
              " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]},"
              " \"y\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]},"
              " \"z\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [20, 24]}}", data, 32);
    cr_assert_eq(open_err(at("d.safetensors"), &st), 0, "%s", err);
}

Test(step02, loader_refuses_offsets_out_of_range, .init = mk_tmp, .fini = rm_tmp) {
    char data[16] = {0};
    StSet st;
    write_raw(at("a.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}", data, 16);
    ASSERT_ERR(open_err(at("a.safetensors"), &st), "a.safetensors", "'w'", "[8, 24)", "16 bytes");
    write_raw(at("b.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", data, 16);
    ASSERT_ERR(open_err(at("b.safetensors"), &st), "'w'", "data_offsets");
    write_raw(at("c.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", data, 16);
    ASSERT_ERR(open_err(at("c.safetensors"), &st), "'w'", "[8, 4)");
    write_raw(at("d.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", data, 16);
    ASSERT_ERR(open_err(at("d.safetensors"), &st), "'w'", "data_offsets");
    write_raw(at("e.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [9223372036854775804, 9223372036854775807]}}",
              data, 16);
    ASSERT_ERR(open_err(at("e.safetensors"), &st), "'w'");
    write_raw(at("f.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 99999999999999999999999]}}", data, 16);
    ASSERT_ERR(open_err(at("f.safetensors"), &st), "f.safetensors");
}

Test(step02, loader_refuses_missing_shard_and_bad_index, .init = mk_tmp, .fini = rm_tmp) {
    StSet st;
    write_two_shards();
    remove(at("model-00002-of-00002.safetensors"));
    write_text(at("model.safetensors.index.json"), INDEX2);
    ASSERT_ERR(open_err(tmp, &st), "model-00002-of-00002.safetensors", "cannot open", "model.safetensors.index.json");

    write_two_shards();  // the index names a tensor its shard lacks
    write_text(at("model.safetensors.index.json"),
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"zz\": \"model-00002-of-00002.safetensors\"}}");
    ASSERT_ERR(open_err(tmp, &st), "model.safetensors.index.json", "'zz'", "model-00002-of-00002.safetensors");

    write_text(at("model.safetensors.index.json"), "{\"metadata\": {}}");
    ASSERT_ERR(open_err(tmp, &st), "model.safetensors.index.json", "weight_map");
    write_text(at("model.safetensors.index.json"), "{\"weight_map\": {\"a\": \"../etc/x.safetensors\"}}");
    ASSERT_ERR(open_err(tmp, &st), "model.safetensors.index.json", "plain file name");
    write_text(at("model.safetensors.index.json"), "{\"weight_map\": ");
    ASSERT_ERR(open_err(tmp, &st), "model.safetensors.index.json", "JSON");

    // The same tensor in two shards.
    WT dup[] = {{"c", "F32", 1, {3}, NULL}};
    write_st(at("model-00001-of-00002.safetensors"), dup, 1);
    write_text(at("model.safetensors.index.json"), INDEX2);
    ASSERT_ERR(open_err(tmp, &st), "'c'", "twice", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");

    remove(at("model.safetensors.index.json"));
    ASSERT_ERR(open_err(tmp, &st), tmp, "no model.safetensors");
    ASSERT_ERR(open_err(at("nope.safetensors"), &st), "nope.safetensors", "cannot open");
}

// st_parse_header straight on memory (the fuzzing entry point): no read past `len`.
Test(step02, st_parse_header_on_memory_never_reads_past_len) {
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t hl = strlen(h), n = 8 + hl + 8;
    StTensor *t;
    int nt;
    for (size_t len = 0; len <= n; len++) {
        uint8_t *b = malloc(len ? len : 1);  // exactly len bytes: ASan sees any over-read
        uint8_t full[128] = {0};
        full[0] = (uint8_t)hl;
        memcpy(full + 8, h, hl);
        memcpy(b, full, len);
        int rc = st_parse_header(b, len, "mem", 3, &t, &nt, err, sizeof err);
        if (len == n) {
            cr_assert_eq(rc, 0, "%s", err);
            cr_assert_eq(nt, 1);
            cr_assert_eq(t[0].shard, 3);
            cr_assert_eq((const uint8_t *)t[0].data, b + 8 + hl);
            free(t[0].name);
            free(t);
        } else {
            cr_assert_eq(rc, -1, "a file cut to %zu of %zu bytes must be refused", len, n);
            cr_assert(t == NULL && nt == 0);
            cr_assert(strstr(err, "mem: "), "%s", err);
        }
        free(b);
    }
}

// ------------------------------------------------------------------------------ model_load

typedef struct {
    const char *arch;  // "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"
    int tie, attention_bias, mlp_bias;
    const char *skip;     // a tensor name to leave out
    const char *reshape;  // a tensor name to write with a wrong shape
    int extra;            // add unused tensors (rotary_emb.inv_freq, and lm_head.weight even if tied)
    int mixed;            // cycle F32 / F16 / BF16
} Tiny;

// hidden 8, intermediate 12, 2 layers, 2 heads x head_dim 4 (Qwen3: 6), 1 KV head, vocab 10.
enum { H = 8, I = 12, NL = 2, NH = 2, NKV = 1, V = 10 };

static void write_tiny(const Tiny *o) {
    int qwen3 = strstr(o->arch, "Qwen3") != NULL, qwen2 = strstr(o->arch, "Qwen2") != NULL;
    int hd = qwen3 ? 6 : H / NH;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d%s, \"tie_word_embeddings\": %s,"
             " \"attention_bias\": %s, \"mlp_bias\": %s, \"rms_norm_eps\": 1e-5}",
             o->arch, H, I, NL, NH, NKV, V, qwen3 ? ", \"head_dim\": 6" : "", o->tie ? "true" : "false",
             o->attention_bias ? "true" : "false", o->mlp_bias ? "true" : "false");
    write_text(at("config.json"), cfg);

    static char names[128][64];
    WT t[128];
    int n = 0;
    static const char *dts[3] = {"F32", "F16", "BF16"};
#define ADD(nd, d0, d1, ...)                                                                      \
    do {                                                                                          \
        snprintf(names[n], 64, __VA_ARGS__);                                                      \
        t[n] = (WT){names[n], o->mixed ? dts[n % 3] : "F32", nd, {d0, d1}, NULL};                 \
        if (o->reshape && !strcmp(names[n], o->reshape)) t[n].shape[0] = (d0) + 1;                \
        if (!o->skip || strcmp(names[n], o->skip)) n++;                                           \
    } while (0)
    ADD(2, V, H, "model.embed_tokens.weight");
    ADD(1, H, 0, "model.norm.weight");
    if (!o->tie || o->extra) ADD(2, V, H, "lm_head.weight");
    for (int l = 0; l < NL; l++) {
        ADD(1, H, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(2, NH * hd, H, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(2, NKV * hd, H, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(2, NKV * hd, H, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(2, H, NH * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        if (qwen2 || o->attention_bias) {
            ADD(1, NH * hd, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(1, NKV * hd, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(1, NKV * hd, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (!qwen2 && o->attention_bias) ADD(1, H, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        if (qwen3) {
            ADD(1, hd, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(1, hd, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(1, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(2, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(2, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(2, H, I, "model.layers.%d.mlp.down_proj.weight", l);
        if (o->extra) ADD(1, hd / 2, 0, "model.layers.%d.self_attn.rotary_emb.inv_freq", l);
    }
#undef ADD
    write_st(at("model.safetensors"), t, n);
}

static void assert_2d(const StTensor *t, int64_t d0, int64_t d1) {
    cr_assert_not_null(t);
    cr_assert(t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1, "shape [%lld, %lld], want [%lld, %lld]",
              (long long)t->shape[0], (long long)t->shape[1], (long long)d0, (long long)d1);
}

Test(step02, model_load_llama_untied, .init = mk_tmp, .fini = rm_tmp) {
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM"});
    ModelWeights m;
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.n_layers, NL);
    assert_2d(m.embed, V, H);
    assert_2d(m.lm_head, V, H);
    cr_assert_neq(m.lm_head, m.embed);
    cr_assert_eq(m.lm_head, st_get(&m.st, "lm_head.weight"));
    cr_assert_eq(m.final_norm, st_get(&m.st, "model.norm.weight"));
    for (int l = 0; l < NL; l++) {
        const LayerTensors *L = &m.layers[l];
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_proj.weight", l);
        cr_assert_eq(L->wk, st_get(&m.st, nm), "layer %d gets its own tensors", l);
        assert_2d(L->wq, NH * 4, H);
        assert_2d(L->wk, NKV * 4, H);
        assert_2d(L->wv, NKV * 4, H);
        assert_2d(L->wo, H, NH * 4);
        assert_2d(L->w_gate, I, H);
        assert_2d(L->w_up, I, H);
        assert_2d(L->w_down, H, I);
        cr_assert(L->attn_norm && L->mlp_norm && L->attn_norm->shape[0] == H);
        cr_assert(!L->bq && !L->bk && !L->bv && !L->bo && !L->q_norm && !L->k_norm);
    }
    model_free(&m);
    model_free(&m);
}

Test(step02, model_load_tied_uses_embedding_and_ignores_extras, .init = mk_tmp, .fini = rm_tmp) {
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .tie = 1, .extra = 1, .mixed = 1});
    ModelWeights m;
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.lm_head, m.embed, "tied: lm_head is the embedding even though lm_head.weight is in the file");
    int dt[3] = {0};
    for (int i = 0; i < m.st.n_tensors; i++) dt[m.st.tensors[i].dtype]++;
    cr_assert(dt[ST_F32] && dt[ST_F16] && dt[ST_BF16], "mixed dtypes load");
    model_free(&m);
    // Tied without lm_head.weight in the file.
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .tie = 1});
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.lm_head, m.embed);
    model_free(&m);
}

Test(step02, model_load_qwen2_biases_and_qwen3_qk_norm, .init = mk_tmp, .fini = rm_tmp) {
    ModelWeights m;
    write_tiny(&(Tiny){.arch = "Qwen2ForCausalLM", .tie = 1});
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    for (int l = 0; l < NL; l++) {
        const LayerTensors *L = &m.layers[l];
        cr_assert(L->bq && L->bk && L->bv && !L->bo && !L->q_norm);
        cr_assert(L->bq->shape[0] == NH * 4 && L->bk->shape[0] == NKV * 4 && L->bv->ndim == 1);
    }
    model_free(&m);
    write_tiny(&(Tiny){.arch = "Qwen3ForCausalLM"});
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.head_dim, 6);
    for (int l = 0; l < NL; l++) {
        const LayerTensors *L = &m.layers[l];
        cr_assert(L->q_norm && L->k_norm && !L->bq && !L->bo);
        cr_assert(L->q_norm->shape[0] == 6 && L->k_norm->shape[0] == 6);
        assert_2d(L->wq, NH * 6, H);
        assert_2d(L->wo, H, NH * 6);
    }
    model_free(&m);
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .attention_bias = 1});
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    cr_assert(m.layers[1].bq && m.layers[1].bo && m.layers[1].bo->shape[0] == H);
    model_free(&m);
}

Test(step02, model_load_refuses_missing_tensor, .init = mk_tmp, .fini = rm_tmp) {
    ModelWeights m;
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .skip = "model.layers.1.mlp.up_proj.weight"});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "model.layers.1.mlp.up_proj.weight", "missing", tmp);
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .skip = "lm_head.weight"});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "lm_head.weight", "missing");
    write_tiny(&(Tiny){.arch = "Qwen2ForCausalLM", .skip = "model.layers.0.self_attn.v_proj.bias"});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "model.layers.0.self_attn.v_proj.bias", "missing");
    write_tiny(&(Tiny){.arch = "Qwen3ForCausalLM", .skip = "model.layers.1.self_attn.k_norm.weight"});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "model.layers.1.self_attn.k_norm.weight", "missing");
}

Test(step02, model_load_refuses_wrong_shape, .init = mk_tmp, .fini = rm_tmp) {
    ModelWeights m;
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .reshape = "model.layers.1.self_attn.k_proj.weight"});
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), -1);
    cr_assert(strstr(err, "model.layers.1.self_attn.k_proj.weight: expected shape [4, 8], got [5, 8]"), "%s", err);
    cr_assert(strstr(err, "model.safetensors"), "names the file: %s", err);
    write_tiny(&(Tiny){.arch = "Qwen3ForCausalLM", .reshape = "model.layers.0.self_attn.q_norm.weight"});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "model.layers.0.self_attn.q_norm.weight", "expected shape [6]",
               "got [7]");
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .reshape = "model.embed_tokens.weight"});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "model.embed_tokens.weight", "[10, 8]", "[11, 8]");
}

Test(step02, model_load_refuses_missing_config_and_mlp_bias, .init = mk_tmp, .fini = rm_tmp) {
    ModelWeights m;
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM"});
    remove(at("config.json"));
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "config.json", "cannot open");
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM", .mlp_bias = 1});
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "config.json", "mlp_bias is not implemented");
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM"});
    remove(at("model.safetensors"));
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "no model.safetensors");
    // Weights whose file is corrupt: the safetensors error comes through unchanged.
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM"});
    write_bytes(at("model.safetensors"), "\x10\0\0\0\0\0\0\0{", 9);
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "model.safetensors", "truncated");
}

Test(step02, model_load_sharded, .init = mk_tmp, .fini = rm_tmp) {
    // Split the tiny Llama in two shards: everything except layer 1 in the first.
    write_tiny(&(Tiny){.arch = "LlamaForCausalLM"});
    StSet st;
    cr_assert_eq(st_open(at("model.safetensors"), &st, err, sizeof err), 0, "%s", err);
    WT a[64], b[64];
    int na = 0, nb = 0;
    char idx[8192];
    size_t k = (size_t)snprintf(idx, sizeof idx, "{\"weight_map\": {");
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        int second = strstr(t->name, "layers.1.") != NULL;
        WT w = {t->name, st_dtype_name(t->dtype), t->ndim, {t->shape[0], t->shape[1]}, t->data};
        if (second) b[nb++] = w;
        else a[na++] = w;
        k += (size_t)snprintf(idx + k, sizeof idx - k, "%s\"%s\": \"part%d.safetensors\"", i ? ", " : "", t->name,
                              second + 1);
    }
    snprintf(idx + k, sizeof idx - k, "}}");
    write_st(at("part1.safetensors"), a, na);
    write_st(at("part2.safetensors"), b, nb);
    st_close(&st);
    remove(at("model.safetensors"));
    write_text(at("model.safetensors.index.json"), idx);
    ModelWeights m;
    cr_assert_eq(model_load(tmp, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.st.n_files, 2);
    cr_assert(strstr(m.st.files[m.layers[1].w_down->shard], "part2.safetensors"));
    cr_assert(strstr(m.st.files[m.layers[0].w_down->shard], "part1.safetensors"));
    model_free(&m);
    remove(at("part2.safetensors"));
    ASSERT_ERR(model_load(tmp, &m, err, sizeof err), "part2.safetensors", "cannot open");
}

// ------------------------------------------------------------------------------ integer dtypes, writer

// I32 / I8 / U8 (the packed words of quantized checkpoints) are read back bit for bit, by a raw
// header written here (not by st_write), and the size check applies to them as to floats.
Test(step02, loader_reads_integer_dtypes, .init = mk_tmp, .fini = rm_tmp) {
    const uint8_t data[16] = {0x78, 0x56, 0x34, 0x12, 0xff, 0xff, 0xff, 0xff,  // I32 [0x12345678, -1]
                              0x80, 0x7f, 0x01, 0xff,                          // I8 [-128, 127, 1, -1]
                              0x00, 0x80, 0xff, 0x05};                         // U8 [0, 128, 255, 5]
    write_raw(at("i.safetensors"),
              "{\"a\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
              " \"b\": {\"dtype\": \"I8\", \"shape\": [2, 2], \"data_offsets\": [8, 12]},"
              " \"c\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [12, 16]}}",
              data, sizeof data);
    StSet st;
    cr_assert_eq(st_open(at("i.safetensors"), &st, err, sizeof err), 0, "%s", err);
    int32_t o[4];
    float f[4];
    const StTensor *x = st_get(&st, "a");
    cr_assert(x && x->dtype == ST_I32 && x->numel == 2 && x->nbytes == 8);
    st_to_i32(x, o);
    cr_assert(o[0] == 0x12345678 && o[1] == -1, "I32 %d %d", o[0], o[1]);
    st_to_f32(x, f);
    cr_assert(f[1] == -1.0f);
    x = st_get(&st, "b");
    cr_assert(x && x->dtype == ST_I8 && x->ndim == 2 && x->nbytes == 4);
    st_to_i32(x, o);
    cr_assert(o[0] == -128 && o[1] == 127 && o[2] == 1 && o[3] == -1);
    st_to_f32(x, f);
    cr_assert(f[0] == -128.0f && f[3] == -1.0f);
    x = st_get(&st, "c");
    cr_assert(x && x->dtype == ST_U8 && x->nbytes == 4);
    st_to_i32(x, o);
    cr_assert(o[0] == 0 && o[1] == 128 && o[2] == 255 && o[3] == 5);
    cr_assert_str_eq(st_dtype_name(ST_I32), "I32");
    cr_assert_str_eq(st_dtype_name(ST_I8), "I8");
    cr_assert_str_eq(st_dtype_name(ST_U8), "U8");
    st_close(&st);

    // the shape x dtype size check: 3 I32 are 12 bytes, not 8
    write_raw(at("j.safetensors"), "{\"a\": {\"dtype\": \"I32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", data, 8);
    ASSERT_ERR(open_err(at("j.safetensors"), &st), "j.safetensors", "'a'", "I32", "do not match");
    write_raw(at("k.safetensors"), "{\"a\": {\"dtype\": \"U8\", \"shape\": [9], \"data_offsets\": [0, 9]}}", data, 8);
    ASSERT_ERR(open_err(at("k.safetensors"), &st), "'a'", "past the end");
    // st_to_i32 of a float tensor truncates toward zero, saturating
    const float fv[4] = {2.75f, -2.75f, 3e9f, -3e9f};
    StTensor t = {.dtype = ST_F32, .numel = 4, .data = fv};
    st_to_i32(&t, o);
    cr_assert(o[0] == 2 && o[1] == -2 && o[2] == INT32_MAX && o[3] == INT32_MIN);
}

// st_write: every dtype, the file opens with st_open and each tensor holds the bytes given; the
// layout is what the safetensors library requires (header length a multiple of 8, offsets
// contiguous from 0, each tensor aligned to its dtype size).
Test(step02, writer_roundtrips_every_dtype, .init = mk_tmp, .fini = rm_tmp) {
    const float a[3] = {1.5f, -2, 1e-30f};
    const uint16_t h[2] = {0x3c00, 0xc000}, b[2] = {0x3f80, 0x8001};
    const int32_t q[5] = {0x7fffffff, -1, 0, 0x01234567, (int32_t)0x89abcdefu};
    const int8_t i8[3] = {-128, 0, 127};
    const uint8_t u8[1] = {200};
    const StWriteTensor w[] = {
        {"z.u8", ST_U8, 1, {1}, u8},   {"y.i8", ST_I8, 1, {3}, i8},      {"x.i32", ST_I32, 2, {5, 1}, q},
        {"w.f16", ST_F16, 1, {2}, h}, {"v.bf16", ST_BF16, 2, {1, 2}, b}, {"u.f32", ST_F32, 1, {3}, a},
        {"t.empty", ST_F32, 2, {0, 4}, NULL},
    };
    const int n = (int)(sizeof w / sizeof w[0]);
    cr_assert_eq(st_write(at("w.safetensors"), w, n, err, sizeof err), 0, "%s", err);
    StSet st;
    cr_assert_eq(st_open(at("w.safetensors"), &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st.n_tensors, n);
    const uint8_t *base = st.maps[0];
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | base[i];
    cr_assert_eq(hl % 8, 0, "header length %llu", (unsigned long long)hl);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *x = st_get(&st, w[i].name);
        cr_assert_not_null(x, "%s", w[i].name);
        cr_assert_eq(x->dtype, w[i].dtype, "%s", w[i].name);
        cr_assert_eq(x->ndim, w[i].ndim);
        for (int d = 0; d < x->ndim; d++) cr_assert_eq(x->shape[d], w[i].shape[d]);
        if (x->nbytes) cr_assert_eq(memcmp(x->data, w[i].data, x->nbytes), 0, "%s bytes", w[i].name);
        size_t off = (size_t)((const uint8_t *)x->data - base) - 8 - (size_t)hl;
        cr_assert_eq(off % st_dtype_size(x->dtype), 0, "%s at %zu", w[i].name, off);
        total += x->nbytes;
    }
    cr_assert_eq(st.map_sizes[0], 8 + hl + total, "no gaps: %zu bytes", st.map_sizes[0]);
    st_close(&st);
    // a name given twice is refused, naming it
    const StWriteTensor dup[] = {{"d", ST_U8, 1, {1}, u8}, {"d", ST_U8, 1, {1}, u8}};
    cr_assert_eq(st_write(at("d.safetensors"), dup, 2, err, sizeof err), -1);
    cr_assert(strstr(err, "'d'"), "%s", err);
    cr_assert_eq(st_write("/nonexistent-dir/x.safetensors", w, 1, err, sizeof err), -1);
    cr_assert(strstr(err, "/nonexistent-dir/x.safetensors"), "%s", err);
}
