// fuzz_tokenizer.c — libFuzzer target for the tokenizer: encode and decode never crash,
// never read out of bounds, and keep their promises on any input.
//   make fuzz                       # 60 s (FUZZ_SECONDS=600 for ten minutes)
//   build/fuzz/fuzz_tokenizer -max_total_time=600 build/fuzz/corpus tests/fuzz/seeds
// The first input byte picks the tokenizer (bit 0: Qwen3 byte-level / sp32k SentencePiece-style;
// for sp32k, bits 4-5 pick a Metaspace variant built at start-up as tests/test_tokenizer.c
// does: 1 prepend_scheme first, 2 always + split, 3 first + split, decoders Metaspace alone or
// in a Sequence with ByteFallback/Fuse) and the mode; the rest is text to encode, or ids to
// decode. Checked on every input:
//   - invalid UTF-8 is refused with -1 and a message; valid text always encodes;
//   - the O(n^2) merge and the heap merge give the same ids (cache on vs off);
//   - byte-level BPE is lossless: decode(encode(s)) == s for ASCII text;
//   - decode and the streaming decoder return valid UTF-8, whatever the ids.
// Run from the repository root (the tokenizers are read from tests/data/tokenizers/).
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer.h"

static Tokenizer *tok[2], *meta[4];  // meta[1..3]: sp32k with a Metaspace pre-tokenizer/decoder

static Tokenizer *load(const char *path) {
    char err[512];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err);
        abort();
    }
    return t;
}

// sp32k-tokenizer.json with the normalizer removed and the given Metaspace JSON.
static Tokenizer *load_metaspace(const char *pre, const char *dec) {
    json_error_t e;
    json_t *root = json_load_file("tests/data/tokenizers/sp32k-tokenizer.json", 0, &e);
    if (!root) abort();
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer", json_loads(pre, 0, &e));
    json_object_set_new(root, "decoder", json_loads(dec, 0, &e));
    char path[] = "/tmp/fuzz_tok_ms_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    if (json_dump_file(root, path, JSON_COMPACT) != 0) abort();
    json_decref(root);
    Tokenizer *t = load(path);
    unlink(path);
    return t;
}

#define MS(scheme, split) "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"" scheme "\", \"split\": " split "}"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok[0] = load("tests/data/tokenizers/qwen3-tokenizer.json");
    tok[1] = load("tests/data/tokenizers/sp32k-tokenizer.json");
    meta[1] = load_metaspace(MS("first", "false"), "{\"type\": \"Sequence\", \"decoders\": [" MS("first", "false")
                             ", {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}");
    meta[2] = load_metaspace(MS("always", "true"), "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, "
                             MS("always", "true") ", {\"type\": \"Fuse\"}]}");
    meta[3] = load_metaspace(MS("first", "true"), MS("first", "true"));
    return 0;
}

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        unsigned d = len > 1 ? u[i + 1] : 0x80;  // no overlong forms, surrogates or code points above U+10FFFF
        if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F))
            return 0;
        i += (size_t)len;
    }
    return 1;
}

static void check_decode(Tokenizer *t, const int32_t *ids, size_t n, int skip) {
    size_t len;
    char *s = tokenizer_decode(t, ids, n, skip, &len);
    if (!valid_utf8(s, len) || strlen(s) > len) abort();
    free(s);
    TokStream *st = tokstream_new(t, skip);
    for (size_t i = 0; i <= n; i++) {
        const char *p = i < n ? tokstream_step(st, ids[i], &len) : tokstream_flush(st, &len);
        if (!valid_utf8(p, len)) abort();
    }
    tokstream_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    Tokenizer *t = tok[mode & 1];
    if ((mode & 1) && (mode & 0x30)) t = meta[(mode >> 4) & 3];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    if (mode & 2) {  // decode arbitrary ids (some out of range, some negative)
        size_t m = n / 4;
        int32_t *ids = malloc((m + 1) * sizeof(int32_t));
        for (size_t i = 0; i < m; i++) {
            uint32_t v;
            memcpy(&v, text + 4 * i, 4);
            // mostly valid ids, sometimes anything
            ids[i] = (v >> 31) ? (int32_t)v : (int32_t)(v % (uint32_t)(tokenizer_vocab_size(t) + 8));
        }
        check_decode(t, ids, m, (mode >> 2) & 1);
        free(ids);
        return 0;
    }
    int add_special = (mode >> 2) & 1;
    TokIds a = {0}, b = {0};
    int rc = tokenizer_encode(t, text, n, add_special, &a);
    if (rc != (valid_utf8(text, n) ? 0 : -1)) abort();
    if (rc == 0) {
        // the other merge path, without the cache: the same ids
        int keep_small = tokenizer_small_word_max, keep_cache = tokenizer_use_cache;
        tokenizer_small_word_max = (mode & 8) ? 0 : 64;
        tokenizer_use_cache = 0;
        if (tokenizer_encode(t, text, n, add_special, &b) != 0) abort();
        tokenizer_small_word_max = keep_small;
        tokenizer_use_cache = keep_cache;
        if (a.n != b.n || (a.n && memcmp(a.ids, b.ids, a.n * sizeof(int32_t)) != 0)) abort();
        for (size_t i = 0; i < a.n; i++)
            if (a.ids[i] < 0 || a.ids[i] >= tokenizer_vocab_size(t)) abort();
        check_decode(t, a.ids, a.n, 0);
        // byte-level BPE loses nothing: ASCII text (NFC leaves it alone) comes back exactly
        int ascii = 1;
        for (size_t i = 0; i < n; i++) ascii &= (uint8_t)text[i] < 0x80;
        if (t == tok[0] && ascii) {
            size_t len;
            char *back = tokenizer_decode(t, a.ids, a.n, 0, &len);
            if (len != n || memcmp(back, text, n) != 0) abort();
            free(back);
        }
    } else if (!tokenizer_error(t)[0]) {
        abort();
    }
    tokids_free(&a);
    tokids_free(&b);
    return 0;
}
