// npy.c — see npy.h. Format: magic "\x93NUMPY", version 1.0, uint16 header length,
// a Python-dict header padded with spaces to a multiple of 64 bytes, then the raw data.
#include "npy.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int npy_save(const char *path, const void *data, size_t elsize, const char *descr, int ndim,
                    const size_t *shape) {
    if (ndim < 0 || ndim > NPY_MAX_DIMS) {
        fprintf(stderr, "error: npy_save '%s': ndim %d out of range\n", path, ndim);
        return -1;
    }
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%zu%s", shape[i], (ndim == 1 || i < ndim - 1) ? ", " : "");
        count *= shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    int total = 10 + n + 1;  // magic(6)+version(2)+len(2) + dict + '\n'
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "error: cannot write '%s': %s\n", path, strerror(errno));
        return -1;
    }
    uint16_t hlen = (uint16_t)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(dict, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t w = fwrite(data, elsize, count, f);
    if (fclose(f) != 0 || w != count) {
        fprintf(stderr, "error: short write to '%s'\n", path);
        return -1;
    }
    return 0;
}

int npy_save_f32(const char *path, const float *data, int ndim, const size_t *shape) {
    return npy_save(path, data, 4, "<f4", ndim, shape);
}
int npy_save_i32(const char *path, const int *data, int ndim, const size_t *shape) {
    return npy_save(path, data, 4, "<i4", ndim, shape);
}

#define NPY_FAIL(...)                                   \
    do {                                                \
        fprintf(stderr, "error: npy_load '%s': ", path); \
        fprintf(stderr, __VA_ARGS__);                   \
        fprintf(stderr, "\n");                          \
        if (f) fclose(f);                               \
        free(hdr);                                      \
        return -1;                                      \
    } while (0)

int npy_load(const char *path, NpyArray *out) {
    memset(out, 0, sizeof *out);
    char *hdr = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) NPY_FAIL("%s", strerror(errno));
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6)) NPY_FAIL("not a .npy file");
    size_t hlen;
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        unsigned char b[2];
        if (fread(b, 1, 2, f) != 2) NPY_FAIL("truncated header");
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)b[0] << 16) | ((size_t)b[1] << 24);
    } else {
        NPY_FAIL("unsupported version %d", pre[6]);
    }
    if (hlen > 1 << 20) NPY_FAIL("header too large");
    hdr = calloc(1, hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) NPY_FAIL("truncated header");
    const char *d = strstr(hdr, "'descr':");
    if (!d) NPY_FAIL("no descr");
    d = strchr(d + 8, '\'');
    if (!d || strlen(d) < 5) NPY_FAIL("bad descr");
    size_t elsize;
    if (!strncmp(d + 1, "<f4", 3)) elsize = 4;
    else if (!strncmp(d + 1, "<i4", 3)) elsize = 4;
    else if (!strncmp(d + 1, "<f8", 3)) elsize = 8;
    else if (!strncmp(d + 1, "<i8", 3)) elsize = 8;
    else NPY_FAIL("unsupported dtype %.4s (want <f4, <f8, <i4 or <i8)", d + 1);
    memcpy(out->dtype, d + 1, 3);
    if (strstr(hdr, "'fortran_order': True")) NPY_FAIL("fortran order is not supported");
    const char *s = strstr(hdr, "'shape':");
    if (!s || !(s = strchr(s, '('))) NPY_FAIL("no shape");
    s++;
    out->count = 1;
    while (*s && *s != ')') {
        while (*s == ' ' || *s == ',') s++;
        if (*s == ')') break;
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || v > (1ull << 40)) NPY_FAIL("bad shape");
        if (out->ndim == NPY_MAX_DIMS) NPY_FAIL("more than %d dims", NPY_MAX_DIMS);
        if (v && out->count > ((size_t)1 << 40) / v) NPY_FAIL("shape too large");
        out->shape[out->ndim++] = (size_t)v;
        out->count *= (size_t)v;
        s = end;
    }
    out->data = malloc(out->count * elsize + 1);
    if (!out->data) NPY_FAIL("out of memory");
    if (fread(out->data, elsize, out->count, f) != out->count) {
        free(out->data);
        out->data = NULL;
        NPY_FAIL("truncated data (expected %zu elements)", out->count);
    }
    fclose(f);
    free(hdr);
    return 0;
}

void npy_free(NpyArray *a) {
    free(a->data);
    a->data = NULL;
}
