// safetensors.c — see safetensors.h. The file is mmapped read-only; the header (JSON, parsed
// with jansson) is validated completely before any tensor pointer is handed out:
//   [8 bytes: header length N, little-endian u64][N bytes: JSON header][data area]
// Every check below exists because a real-world file (truncated download, hand-edited header,
// a non-float checkpoint) or the fuzzer produced that input. Nothing reads outside the buffer.
// Note: tensor data is only as aligned as the file makes it (files written by the safetensors
// library keep every tensor aligned to its dtype size); st_to_f32 reads with memcpy, so it is
// correct either way.
#define _GNU_SOURCE
#include "safetensors.h"

#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// ------------------------------------------------------------------------------------ dtypes

const char *st_dtype_name(StDtype d) {
    switch (d) {
    case ST_F32: return "F32";
    case ST_F16: return "F16";
    case ST_BF16: return "BF16";
    case ST_I32: return "I32";
    case ST_I8: return "I8";
    case ST_U8: return "U8";
    }
    return "?";
}

size_t st_dtype_size(StDtype d) {
    switch (d) {
    case ST_F32: return 4;
    case ST_F16: return 2;
    case ST_BF16: return 2;
    case ST_I32: return 4;
    case ST_I8: return 1;
    case ST_U8: return 1;
    }
    return 0;
}

int st_dtype_from_name(const char *name, StDtype *out) {
    static const StDtype all[] = {ST_F32, ST_F16, ST_BF16, ST_I32, ST_I8, ST_U8};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, st_dtype_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return -1;
}

static int32_t i32_at(const uint8_t *p, size_t i) {
    uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                 (uint32_t)p[4 * i + 3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Every half is exactly
// representable as a float, so this is exact; NaN payloads are kept (shifted up), so converting
// back gives the same 16 bits.
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {  // inf / NaN
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {  // normal: rebias 15 -> 127
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {  // +-0
        bits = sign;
    } else {  // subnormal half = man * 2^-24: shift the leading 1 up to the implicit bit
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        // the leading 1 was at bit 9 - e: value = 1.f x 2^(9 - e - 24), exponent field 112 - e
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    return f32_from_bits(bits);
}

// bfloat16 is the top half of a float32: same exponent, 7 mantissa bits.
static float bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

void st_to_f32(const StTensor *t, float *out) {
    const uint8_t *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_F32:
        memcpy(out, p, n * 4);
        break;
    case ST_F16:
        for (size_t i = 0; i < n; i++) out[i] = f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    case ST_I32:
        for (size_t i = 0; i < n; i++) out[i] = (float)i32_at(p, i);
        break;
    case ST_I8:
        for (size_t i = 0; i < n; i++) out[i] = (float)(int8_t)p[i];
        break;
    case ST_U8:
        for (size_t i = 0; i < n; i++) out[i] = (float)p[i];
        break;
    }
}

// Saturating float -> int32 (NaN -> 0): no undefined conversion for any input.
static int32_t f_to_i32(float f) {
    if (!(f == f)) return 0;
    if (f >= 2147483648.0f) return INT32_MAX;
    if (f <= -2147483648.0f) return INT32_MIN;
    return (int32_t)f;
}

void st_to_i32(const StTensor *t, int32_t *out) {
    const uint8_t *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_I32:
        for (size_t i = 0; i < n; i++) out[i] = i32_at(p, i);
        break;
    case ST_I8:
        for (size_t i = 0; i < n; i++) out[i] = (int8_t)p[i];
        break;
    case ST_U8:
        for (size_t i = 0; i < n; i++) out[i] = p[i];
        break;
    case ST_F32:
    case ST_F16:
    case ST_BF16: {
        float f;
        for (size_t i = 0; i < n; i++) {
            StTensor one = *t;
            one.numel = 1;
            one.data = p + i * st_dtype_size(t->dtype);
            st_to_f32(&one, &f);
            out[i] = f_to_i32(f);
        }
        break;
    }
    }
}

// ------------------------------------------------------------------------------------ errors

const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}



static void free_tensors(StTensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}

// Order by where the bytes start (then end), to find overlaps in one pass.
static int cmp_offset(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    const uint8_t *xb = x->data, *yb = y->data;
    if (xb != yb) return xb < yb ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

// A JSON integer >= 0 (jansson refuses integers that do not fit in 64 bits at parse time).
static int json_nonneg_int(json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

// ------------------------------------------------------------------------------------ parsing

// One tensor entry: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}.
static int parse_entry(const char *src, const char *name, json_t *e, const uint8_t *data, size_t data_len,
                       StTensor *t, char *err, int errlen) {
    char sbuf[160];
    if (!json_is_object(e)) return errf(err, errlen, "%s: tensor '%s': entry is not a JSON object", src, name);

    json_t *jd = json_object_get(e, "dtype");
    const char *dt = json_string_value(jd);
    if (!dt) return errf(err, errlen, "%s: tensor '%s': missing or non-string \"dtype\"", src, name);
    if (st_dtype_from_name(dt, &t->dtype))
        return errf(err, errlen, "%s: tensor '%s': dtype %.32s is not supported (only F32, F16, BF16, I32, I8, U8)",
                    src, name, dt);

    json_t *js = json_object_get(e, "shape");
    if (!json_is_array(js)) return errf(err, errlen, "%s: tensor '%s': missing or non-array \"shape\"", src, name);
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return errf(err, errlen, "%s: tensor '%s': shape has %zu dimensions (at most %d supported)", src, name, nd,
                    ST_MAX_DIMS);
    t->ndim = (int)nd;
    int64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        int64_t d;
        if (!json_nonneg_int(json_array_get(js, i), &d))
            return errf(err, errlen, "%s: tensor '%s': shape entry %zu is not a non-negative integer", src, name, i);
        t->shape[i] = d;
        if (d != 0 && numel > INT64_MAX / d) overflow = 1;  // keep going: a later 0 makes it fit
        else numel *= d;
    }
    if (overflow) {
        int has_zero = 0;
        for (int i = 0; i < t->ndim; i++) has_zero |= t->shape[i] == 0;
        if (!has_zero)
            return errf(err, errlen, "%s: tensor '%s': shape %s has more elements than fit in 64 bits", src, name,
                        st_shape_str(t->shape, t->ndim, sbuf, sizeof sbuf));
        numel = 0;
    }
    t->numel = numel;

    json_t *jo = json_object_get(e, "data_offsets");
    int64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_nonneg_int(json_array_get(jo, 0), &begin) ||
        !json_nonneg_int(json_array_get(jo, 1), &end))
        return errf(err, errlen, "%s: tensor '%s': \"data_offsets\" must be [begin, end], two non-negative integers",
                    src, name);
    if (begin > end)
        return errf(err, errlen, "%s: tensor '%s': data_offsets [%lld, %lld) end before they begin", src, name,
                    (long long)begin, (long long)end);
    int64_t esize = (int64_t)st_dtype_size(t->dtype);
    if (numel > INT64_MAX / esize || numel * esize != end - begin) {
        char nb[32] = "too many";
        if (numel <= INT64_MAX / esize) snprintf(nb, sizeof nb, "%lld", (long long)(numel * esize));
        return errf(err, errlen, "%s: tensor '%s': data_offsets [%lld, %lld) do not match shape %s x %s = %s bytes", src,
                    name, (long long)begin, (long long)end, st_shape_str(t->shape, t->ndim, sbuf, sizeof sbuf), dt, nb);
    }
    if ((uint64_t)end > (uint64_t)data_len)
        return errf(err, errlen,
                    "%s: tensor '%s': data_offsets [%lld, %lld) run past the end of the data area (%zu bytes): "
                    "the file is truncated or the header is wrong",
                    src, name, (long long)begin, (long long)end, data_len);
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return 0;
}

int st_parse_header(const uint8_t *buf, size_t len, const char *src, int shard, StTensor **out, int *n_out,
                    char *err, int errlen) {
    *out = NULL;
    *n_out = 0;
    if (!src) src = "safetensors";
    if (len < 8)
        return errf(err, errlen, "%s: file is %zu bytes, too short for the 8-byte header length (truncated?)", src, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > ST_HEADER_MAX)
        return errf(err, errlen, "%s: header length %llu bytes is larger than the %u-byte limit (not a safetensors file?)",
                    src, (unsigned long long)hlen, (unsigned)ST_HEADER_MAX);
    if (hlen > len - 8)
        return errf(err, errlen, "%s: header length %llu bytes is beyond the end of the file (%zu bytes): the file is "
                    "truncated or not a safetensors file", src, (unsigned long long)hlen, len);
    if (hlen < 2) return errf(err, errlen, "%s: header length %llu bytes is too short for a JSON object", src,
                              (unsigned long long)hlen);
    const uint8_t *data = buf + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return errf(err, errlen, "%s: header is not valid JSON (at byte %d of the header: %s)", src, je.position, je.text);
    StTensor *t = NULL, **by_off = NULL;
    int n = 0;
    if (!json_is_object(root)) {
        errf(err, errlen, "%s: header is not a JSON object", src);
        goto bad;
    }
    size_t cap = json_object_size(root);
    t = calloc(cap ? cap : 1, sizeof *t);
    if (!t) {
        errf(err, errlen, "%s: out of memory for %zu tensor entries", src, cap);
        goto bad;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;  // free-form string map: not ours to judge
        StTensor *ti = &t[n];
        if (parse_entry(src, key, val, data, data_len, ti, err, errlen)) goto bad;
        ti->shard = shard;
        ti->name = strdup(key);
        if (!ti->name) {
            errf(err, errlen, "%s: out of memory", src);
            goto bad;
        }
        n++;
    }

    // No two tensors may share a byte. Sorted by start, each non-empty tensor must begin at or
    // after the furthest end seen so far. (Empty tensors own no bytes.)
    by_off = malloc((size_t)(n ? n : 1) * sizeof *by_off);
    if (!by_off) {
        errf(err, errlen, "%s: out of memory", src);
        goto bad;
    }
    for (int i = 0; i < n; i++) by_off[i] = &t[i];
    qsort(by_off, (size_t)n, sizeof *by_off, cmp_offset);
    const StTensor *last = NULL;  // the non-empty tensor that reaches furthest
    for (int i = 0; i < n; i++) {
        const StTensor *c = by_off[i];
        if (!c->nbytes) continue;
        if (last && (const uint8_t *)c->data < (const uint8_t *)last->data + last->nbytes) {
            long long cb = (const uint8_t *)c->data - data, lb = (const uint8_t *)last->data - data;
            errf(err, errlen, "%s: tensors '%s' [%lld, %lld) and '%s' [%lld, %lld) overlap", src, last->name ? last->name : "?",
                 lb, lb + (long long)last->nbytes, c->name ? c->name : "?", cb, cb + (long long)c->nbytes);
            goto bad;
        }
        if (!last || (const uint8_t *)c->data + c->nbytes > (const uint8_t *)last->data + last->nbytes) last = c;
    }
    free(by_off);
    by_off = NULL;
    qsort(t, (size_t)n, sizeof *t, cmp_name);
    json_decref(root);
    *out = t;
    *n_out = n;
    return 0;
bad:
    free(by_off);
    free_tensors(t, n);
    json_decref(root);
    return -1;
}

// ------------------------------------------------------------------------------------ files

// Read a small text file (the index) into a NUL-terminated buffer.
static char *read_text(const char *path, size_t cap, char *err, int errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > cap) {
        errf(err, errlen, "%s: not a regular file of at most %zu bytes", path, cap);
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        errf(err, errlen, "%s: read failed", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

// Append one shard: open, mmap, parse; its tensors are added to s->tensors (unsorted).
static int add_shard(StSet *s, const char *path, char *err, int errlen) {
    int k = s->n_files;
    char **files = realloc(s->files, (size_t)(k + 1) * sizeof *files);
    if (files) s->files = files;
    void **maps = realloc(s->maps, (size_t)(k + 1) * sizeof *maps);
    if (maps) s->maps = maps;
    size_t *sizes = realloc(s->map_sizes, (size_t)(k + 1) * sizeof *sizes);
    if (sizes) s->map_sizes = sizes;
    if (!files || !maps || !sizes) return errf(err, errlen, "%s: out of memory", path);
    s->files[k] = strdup(path);
    s->maps[k] = NULL;
    s->map_sizes[k] = 0;
    s->n_files = k + 1;
    if (!s->files[k]) return errf(err, errlen, "%s: out of memory", path);

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return errf(err, errlen, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    const uint8_t *base = (const uint8_t *)"";
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return errf(err, errlen, "%s: mmap of %zu bytes failed: %s", path, size, strerror(e));
        }
        s->maps[k] = m;
        s->map_sizes[k] = size;
        base = m;
    }
    close(fd);  // the mapping stays valid

    StTensor *t;
    int n;
    if (st_parse_header(base, size, path, k, &t, &n, err, errlen)) return -1;
    StTensor *all = realloc(s->tensors, (size_t)(s->n_tensors + n + 1) * sizeof *all);
    if (!all) {
        free_tensors(t, n);
        return errf(err, errlen, "%s: out of memory", path);
    }
    s->tensors = all;
    memcpy(all + s->n_tensors, t, (size_t)n * sizeof *t);
    s->n_tensors += n;
    free(t);  // the names now belong to s->tensors
    return 0;
}

// Sharded checkpoint: {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}.
// Each shard is opened once; each tensor the map names must be in the shard it names.
static int open_index(StSet *s, const char *index_path, char *err, int errlen) {
    char *text = read_text(index_path, 64u << 20, err, errlen);
    if (!text) return -1;
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return errf(err, errlen, "%s: invalid JSON at line %d: %s", index_path, je.line, je.text);
    int rc = -1;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        errf(err, errlen, "%s: missing \"weight_map\" object", index_path);
        goto done;
    }
    // The directory of the index, for the shard paths.
    const char *slash = strrchr(index_path, '/');
    int dirlen = slash ? (int)(slash - index_path) + 1 : 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *shard = json_string_value(val);
        if (!shard || !*shard || strchr(shard, '/')) {
            errf(err, errlen, "%s: weight_map[\"%s\"] must be a plain file name in the model directory", index_path, key);
            goto done;
        }
        char path[4096];
        if (snprintf(path, sizeof path, "%.*s%s", dirlen, index_path, shard) >= (int)sizeof path) {
            errf(err, errlen, "%s: shard path too long", index_path);
            goto done;
        }
        int seen = 0;
        for (int i = 0; i < s->n_files && !seen; i++) seen = !strcmp(s->files[i], path);
        if (!seen && add_shard(s, path, err, errlen)) {
            if (err && errlen > 0 && strstr(err, "cannot open")) {
                size_t m = strlen(err);
                if (m < (size_t)errlen)
                    snprintf(err + m, (size_t)errlen - m, " (listed in %s)", index_path);
            }
            goto done;
        }
    }
    // Sort now so lookups below (and by callers) are binary searches.
    qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_name);
    for (int i = 1; i < s->n_tensors; i++) {
        if (!strcmp(s->tensors[i - 1].name, s->tensors[i].name)) {
            errf(err, errlen, "tensor '%s' appears twice: in %s and in %s", s->tensors[i].name,
                 s->files[s->tensors[i - 1].shard], s->files[s->tensors[i].shard]);
            goto done;
        }
    }
    json_object_foreach(wm, key, val) {
        const StTensor *t = st_get(s, key);
        const char *shard = json_string_value(val);
        const char *tf = t ? s->files[t->shard] : NULL;
        const char *base = tf ? (strrchr(tf, '/') ? strrchr(tf, '/') + 1 : tf) : NULL;
        if (!t || strcmp(base, shard)) {
            errf(err, errlen, "%s: weight_map puts tensor '%s' in %s, but %s", index_path, key, shard,
                 t ? "it is in another shard" : "that shard does not have it");
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int st_open(const char *path, StSet *s, char *err, int errlen) {
    memset(s, 0, sizeof *s);
    struct stat sb;
    if (stat(path, &sb)) return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    int rc;
    if (S_ISDIR(sb.st_mode)) {
        // As transformers does: a single model.safetensors first, else the sharded index.
        char single[4096], index[4096];
        int n1 = snprintf(single, sizeof single, "%s/model.safetensors", path);
        int n2 = snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
        if (n1 >= (int)sizeof single || n2 >= (int)sizeof index) return errf(err, errlen, "%s: path too long", path);
        if (is_file(single)) rc = add_shard(s, single, err, errlen);
        else if (is_file(index)) rc = open_index(s, index, err, errlen);
        else
            return errf(err, errlen, "%s: no model.safetensors or model.safetensors.index.json in this directory", path);
    } else {
        size_t n = strlen(path);
        if (n >= 5 && !strcmp(path + n - 5, ".json")) rc = open_index(s, path, err, errlen);
        else rc = add_shard(s, path, err, errlen);
    }
    if (rc) {
        st_close(s);
        return -1;
    }
    qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_name);
    return 0;
}

const StTensor *st_get(const StSet *s, const char *name) {
    int lo = 0, hi = s->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, s->tensors[mid].name);
        if (!c) return &s->tensors[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

void st_close(StSet *s) {
    free_tensors(s->tensors, s->n_tensors);
    for (int i = 0; i < s->n_files; i++) {
        if (s->maps && s->maps[i]) munmap(s->maps[i], s->map_sizes[i]);
        if (s->files) free(s->files[i]);
    }
    free(s->files);
    free(s->maps);
    free(s->map_sizes);
    memset(s, 0, sizeof *s);
}
