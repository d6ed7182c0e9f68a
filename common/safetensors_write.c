// safetensors_write.c — st_write (see safetensors.h): the writing half of the format, for the
// programs that produce checkpoints (step06's quantize). The header is built with jansson.
// Layout written: [u64 LE header length N][N bytes of JSON, space-padded to N % 8 == 0][data].
#include "safetensors.h"

#include "check.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const StWriteTensor *t;
    size_t nbytes;
} Item;

// Larger element size first, then by name: no padding is needed between tensors to keep each
// one aligned to its dtype size (the data area itself starts at a multiple of 8).
static int cmp_item(const void *a, const void *b) {
    const Item *x = a, *y = b;
    size_t sx = st_dtype_size(x->t->dtype), sy = st_dtype_size(y->t->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

int st_write(const char *path, const StWriteTensor *t, int n, char *err, int errlen) {
    int rc = -1;
    FILE *f = NULL;
    char *hdr = NULL;
    json_t *root = json_object();
    Item *it = calloc((size_t)(n > 0 ? n : 1), sizeof *it);
    if (!root || !it) {
        errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const StWriteTensor *w = &t[i];
        if (!w->name || !w->name[0] || !strcmp(w->name, "__metadata__")) {
            errf(err, errlen, "%s: tensor %d has no usable name", path, i);
            goto done;
        }
        if (w->ndim < 0 || w->ndim > ST_MAX_DIMS || !st_dtype_size(w->dtype)) {
            errf(err, errlen, "%s: tensor '%s': bad ndim %d or dtype", path, w->name, w->ndim);
            goto done;
        }
        size_t numel = 1;
        for (int d = 0; d < w->ndim; d++) {
            if (w->shape[d] < 0) {
                errf(err, errlen, "%s: tensor '%s': negative dimension", path, w->name);
                goto done;
            }
            numel *= (size_t)w->shape[d];
        }
        it[i].t = w;
        it[i].nbytes = numel * st_dtype_size(w->dtype);
        if (it[i].nbytes && !w->data) {
            errf(err, errlen, "%s: tensor '%s': no data", path, w->name);
            goto done;
        }
    }
    qsort(it, (size_t)n, sizeof *it, cmp_item);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const StWriteTensor *w = it[i].t;
        if (json_object_get(root, w->name)) {
            errf(err, errlen, "%s: tensor '%s' is given twice", path, w->name);
            goto done;
        }
        json_t *shape = json_array();
        for (int d = 0; d < w->ndim; d++) json_array_append_new(shape, json_integer(w->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(w->dtype), "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + it[i].nbytes));
        if (!e || json_object_set_new(root, w->name, e)) {
            errf(err, errlen, "%s: out of memory", path);
            goto done;
        }
        off += it[i].nbytes;
    }
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!hdr) {
        errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    size_t hlen = strlen(hdr), padded = (hlen + 7) / 8 * 8;
    f = fopen(path, "wb");
    if (!f) {
        errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++)
        if (it[i].nbytes) ok = fwrite(it[i].t->data, 1, it[i].nbytes, f) == it[i].nbytes;
    if (fclose(f)) ok = 0;
    f = NULL;
    if (!ok) {
        errf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    if (f) fclose(f);
    free(hdr);
    free(it);
    json_decref(root);
    return rc;
}
