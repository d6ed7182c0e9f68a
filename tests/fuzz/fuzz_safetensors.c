// fuzz_safetensors.c — libFuzzer target for the safetensors header parser (common/safetensors.c).
// The input bytes are a whole file: 8-byte length, JSON header, data. st_parse_header must
// return 0 or -1 on anything, never crash or read outside the input, and on success keep its
// promises, checked here on every accepted input:
//   - every tensor's bytes lie inside the data area, nbytes == numel x dtype size;
//   - names are sorted and unique, no two non-empty tensors share a byte;
//   - st_to_f32 can read every (small) tensor; the error message is a terminated string.
//   make fuzz FUZZ_TARGETS=safetensors                  # FUZZ_SECONDS each, default 60
//   build/fuzz/fuzz_safetensors -max_total_time=600 -dict=build/fuzz/seeds_safetensors.dict \
//       build/fuzz/corpus_safetensors build/fuzz/seeds_safetensors
// Seeds and dictionary are written by this program (make fuzz does it first):
//   FUZZ_WRITE_SEEDS=DIR build/fuzz/fuzz_safetensors   -> a few small valid files in DIR
//   (F32/F16/BF16, 4-d, scalar, empty tensor, __metadata__, a gap) and the keywords in DIR.dict.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static void check(int ok) {
    if (!ok) abort();
}

static void parse_and_check(const uint8_t *data, size_t size) {
    StTensor *t = NULL;
    int n = -1;
    char err[256];
    err[0] = 0;
    int rc = st_parse_header(data, size, "fuzz", 1, &t, &n, err, sizeof err);
    check(rc == 0 || rc == -1);
    check(memchr(err, 0, sizeof err) != NULL);
    if (rc) {
        check(t == NULL && n == 0 && err[0]);
        return;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    const uint8_t *lo = data + 8 + hlen, *hi = data + size;
    static float out[1 << 14];
    for (int i = 0; i < n; i++) {
        const StTensor *x = &t[i];
        check(x->shard == 1 && x->ndim >= 0 && x->ndim <= ST_MAX_DIMS && x->numel >= 0);
        int64_t numel = 1;
        for (int d = 0; d < x->ndim; d++) numel *= x->shape[d];  // fits: the parser checked
        check(numel == x->numel);
        check(x->nbytes == (size_t)x->numel * st_dtype_size(x->dtype));
        const uint8_t *b = x->data;
        check(b >= lo && b <= hi && x->nbytes <= (size_t)(hi - b));
        if (i) check(strcmp(t[i - 1].name, x->name) < 0);
        for (int j = 0; j < i; j++) {  // inputs are small (-max_len), so quadratic is fine
            const uint8_t *c = t[j].data;
            if (x->nbytes && t[j].nbytes) check(b + x->nbytes <= c || c + t[j].nbytes <= b);
        }
        if ((size_t)x->numel <= sizeof out / sizeof out[0]) st_to_f32(x, out);
    }
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse_and_check(data, size);
    // Most mutations of the JSON change its length, and the 8-byte length field then no longer
    // matches: parse a copy whose length field is fixed to end at the last '}' as well, so the
    // fuzzer also explores the JSON and offset checks, not only the length check.
    const uint8_t *close = size > 8 ? memrchr(data + 8, '}', size - 8) : NULL;
    if (close) {
        uint64_t h = (uint64_t)(close - data) - 7, old = 0;
        for (int i = 7; i >= 0; i--) old = old << 8 | data[i];
        if (h != old) {
            uint8_t *copy = malloc(size);  // exactly size bytes: ASan catches over-reads
            memcpy(copy, data, size);
            for (int i = 0; i < 8; i++) copy[i] = (uint8_t)(h >> (8 * i));
            parse_and_check(copy, size);
            free(copy);
        }
    }
    return 0;
}

// FUZZ_WRITE_SEEDS=DIR: write the seed files and DIR.dict, then exit.
static void seed(const char *dir, const char *name, const char *header, size_t dlen) {
    size_t h = strlen(header), hp = (h + 7) & ~(size_t)7;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    for (int i = 0; i < 8; i++) fputc((int)((hp >> (8 * i)) & 0xff), f);
    fputs(header, f);
    for (size_t i = h; i < hp; i++) fputc(' ', f);
    for (size_t i = 0; i < dlen; i++) fputc((int)(i * 37 + 11) & 0xff, f);
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("FUZZ_WRITE_SEEDS");
    if (!dir) return 0;
    seed(dir, "f32.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24);
    seed(dir, "mixed.safetensors",
         "{\"__metadata__\":{\"format\":\"pt\"},"
         "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
         "\"model.norm.weight\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]},"
         "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[20,28]}}",
         28);
    seed(dir, "scalar_empty.safetensors",
         "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
         "\"e\":{\"dtype\":\"F16\",\"shape\":[0,7],\"data_offsets\":[4,4]}}",
         4);
    seed(dir, "empty_header.safetensors", "{}", 0);
    seed(dir, "gap.safetensors",
         "{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
         "\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[8,10]}}",
         12);
    static const char *dict[] = {"\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"",
                                 "\"F16\"", "\"BF16\"", "\"I64\"", "\"F8_E4M3\"", "[]", "{}", "18446744073709551615",
                                 "9223372036854775807", "4294967296", "-1", "1e3", "\\u0000", "null", "true"};
    char path[512];
    snprintf(path, sizeof path, "%s.dict", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    for (size_t i = 0; i < sizeof dict / sizeof dict[0]; i++) {  // libFuzzer dict lines: "..." with \ escapes
        fputc('"', f);
        for (const char *c = dict[i]; *c; c++) fprintf(f, (*c == '"' || *c == '\\') ? "\\%c" : "%c", *c);
        fputs("\"\n", f);
    }
    fclose(f);
    fprintf(stderr, "fuzz_safetensors: seeds written to %s, dictionary to %s\n", dir, path);
    exit(0);
}
