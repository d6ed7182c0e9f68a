// test_tokenizer.c — the C tokenizer gives exactly the ids and text of Hugging Face `tokenizers`.
// Goldens: tests/data/tokenizers/goldens-<name>.json, written once by
// tools/make_tokenizer_goldens.py with the pip package (the tests never need Python).
// Run: make check   (or build/tests/run_tests --filter 'tokenizer/*')
#define _GNU_SOURCE  // memmem
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer.h"

#define DATA "tests/data/tokenizers/"

static Tokenizer *load(const char *name) {
    char path[256], err[512];
    snprintf(path, sizeof path, DATA "%s-tokenizer.json", name);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    cr_assert(t, "load %s: %s", path, err);
    return t;
}

static json_t *goldens(const char *name) {
    char path[256];
    snprintf(path, sizeof path, DATA "goldens-%s.json", name);
    json_error_t e;
    json_t *g = json_load_file(path, JSON_ALLOW_NUL, &e);
    cr_assert(g, "%s line %d: %s", path, e.line, e.text);
    return g;
}

static int same_ids(const TokIds *a, json_t *want) {
    if (a->n != json_array_size(want)) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->ids[i] != json_integer_value(json_array_get(want, i))) return 0;
    return 1;
}

static void print_ids(const char *label, const TokIds *a, json_t *want) {
    fprintf(stderr, "  %s ours:", label);
    for (size_t i = 0; i < a->n; i++) fprintf(stderr, " %d", a->ids[i]);
    fprintf(stderr, "\n  %s   hf:", label);
    for (size_t i = 0; i < json_array_size(want); i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
    fprintf(stderr, "\n");
}

// Every corpus text, with and without special tokens: ids identical to HF. g holds "cases".
static void check_ids_of(Tokenizer *t, json_t *g, const char *name, const char *version) {
    json_t *cases = json_object_get(g, "cases"), *c;
    size_t i, bad = 0, n = 0;
    json_array_foreach(cases, i, c) {
        json_t *text = json_object_get(c, "text");
        for (int special = 0; special <= 1; special++) {
            json_t *want = json_object_get(c, special ? "ids_special" : "ids");
            TokIds ids = {0};
            int rc = tokenizer_encode(t, json_string_value(text), json_string_length(text), special, &ids);
            n++;
            if (rc != 0 || !same_ids(&ids, want)) {
                if (bad++ < 5) {
                    fprintf(stderr, "%s case %zu (special=%d) differs: %s\n", name, i, special, json_string_value(text));
                    print_ids("ids", &ids, want);
                }
            }
            tokids_free(&ids);
        }
    }
    cr_log_info("%s: %zu/%zu encodings identical to HF tokenizers %s", name, n - bad, n, version);
    cr_assert_gt(n, 0);
    cr_assert_eq(bad, 0, "%s: %zu of %zu encodings differ from HF", name, bad, n);
}
static void check_ids(const char *name) {
    Tokenizer *t = load(name);
    json_t *g = goldens(name);
    check_ids_of(t, g, name, json_string_value(json_object_get(g, "tokenizers_version")));
    json_decref(g);
    tokenizer_free(t);
}

Test(tokenizer, qwen3_ids_identical_to_hf) { check_ids("qwen3"); }
Test(tokenizer, sp32k_ids_identical_to_hf) { check_ids("sp32k"); }
// tiny: a byte-level tokenizer made by tools/make_tokenizer_goldens.py with what the real two
// do not use: lstrip/rstrip/single_word/normalized added tokens, Replace, Split with a String
// pattern and with Removed, ByteLevel add_prefix_space + GPT-2 regex, ignore_merges, BOS+EOS.
Test(tokenizer, tiny_ids_identical_to_hf) { check_ids("tiny"); }

// The heap merge (long words) and the O(n^2) merge (short words) must agree, with and
// without the word cache: force every word through the heap, cache off.
Test(tokenizer, qwen3_heap_merge_no_cache_identical) {
    tokenizer_small_word_max = 0;
    tokenizer_use_cache = 0;
    check_ids("qwen3");
}
Test(tokenizer, sp32k_small_merge_identical) {
    tokenizer_small_word_max = 64;
    check_ids("sp32k");
}

// Decode: the corpus ids and random / invalid-UTF-8 id lists decode to HF's exact text,
// with and without skip_special_tokens; decode(encode(s)) == s wherever HF gives that.
static void check_decode_of(Tokenizer *t, json_t *g, const char *name, size_t min_roundtrip) {
    json_t *c;
    size_t i, bad = 0, n = 0, roundtrip = 0;
    json_array_foreach(json_object_get(g, "cases"), i, c) {
        json_t *want_ids = json_object_get(c, "ids_special");
        size_t m = json_array_size(want_ids);
        int32_t *ids = malloc((m + 1) * sizeof(int32_t));
        for (size_t k = 0; k < m; k++) ids[k] = (int32_t)json_integer_value(json_array_get(want_ids, k));
        for (int skip = 0; skip <= 1; skip++) {
            json_t *want = json_object_get(c, skip ? "decoded_skip" : "decoded");
            size_t len;
            char *s = tokenizer_decode(t, ids, m, skip, &len);
            n++;
            if (len != json_string_length(want) || memcmp(s, json_string_value(want), len) != 0) {
                if (bad++ < 5) fprintf(stderr, "%s decode case %zu skip=%d: ours \"%s\" hf \"%s\"\n", name, i, skip, s, json_string_value(want));
            }
            json_t *text = json_object_get(c, "text");
            if (skip && json_equal(want, text)) {  // HF round-trips this text: so must we
                TokIds e = {0};
                cr_assert_eq(tokenizer_encode(t, json_string_value(text), json_string_length(text), 1, &e), 0);
                char *back = tokenizer_decode(t, e.ids, e.n, 1, &len);
                cr_assert(len == json_string_length(text) && !memcmp(back, json_string_value(text), len),
                          "%s: decode(encode(s)) != s for \"%s\"", name, json_string_value(text));
                roundtrip++;
                free(back);
                tokids_free(&e);
            }
            free(s);
        }
        free(ids);
    }
    json_array_foreach(json_object_get(g, "decode_cases"), i, c) {
        json_t *jids = json_object_get(c, "ids");
        size_t m = json_array_size(jids);
        int32_t *ids = malloc((m + 1) * sizeof(int32_t));
        for (size_t k = 0; k < m; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));
        for (int skip = 0; skip <= 1; skip++) {
            json_t *want = json_object_get(c, skip ? "text_skip" : "text");
            size_t len;
            char *s = tokenizer_decode(t, ids, m, skip, &len);
            n++;
            if (len != json_string_length(want) || memcmp(s, json_string_value(want), len) != 0) {
                if (bad++ < 5) fprintf(stderr, "%s decode_cases[%zu] skip=%d: ours \"%s\" hf \"%s\"\n", name, i, skip, s, json_string_value(want));
            }
            free(s);
        }
        free(ids);
    }
    cr_log_info("%s: %zu/%zu decodes identical to HF; %zu texts round-trip", name, n - bad, n, roundtrip);
    cr_assert_eq(bad, 0, "%s: %zu of %zu decodes differ from HF", name, bad, n);
    cr_assert_geq(roundtrip, min_roundtrip, "%s: only %zu texts round-trip", name, roundtrip);
}
static void check_decode(const char *name, size_t min_roundtrip) {
    Tokenizer *t = load(name);
    json_t *g = goldens(name);
    check_decode_of(t, g, name, min_roundtrip);
    json_decref(g);
    tokenizer_free(t);
}

Test(tokenizer, qwen3_decode_identical_to_hf) { check_decode("qwen3", 100); }
Test(tokenizer, sp32k_decode_identical_to_hf) { check_decode("sp32k", 100); }
Test(tokenizer, tiny_decode_identical_to_hf) { check_decode("tiny", 0); }  // add_prefix_space: " " comes back

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int len = u[i] < 0x80 ? 1 : u[i] >= 0xF0 ? 4 : u[i] >= 0xE0 ? 3 : u[i] >= 0xC2 ? 2 : 0;
        if (!len || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += (size_t)len;
    }
    return 1;
}

// Streaming: feeding ids one at a time gives, concatenated, the full decode; no chunk ever
// holds an incomplete UTF-8 sequence.
static void check_stream_of(Tokenizer *t, json_t *g, const char *name) {
    json_t *c;
    size_t i, chunks = 0;
    const char *keys[2] = {"cases", "decode_cases"};
    for (int w = 0; w < 2; w++) {
        json_array_foreach(json_object_get(g, keys[w]), i, c) {
            json_t *jids = json_object_get(c, w ? "ids" : "ids_special");
            size_t m = json_array_size(jids);
            int32_t *ids = malloc((m + 1) * sizeof(int32_t));
            for (size_t k = 0; k < m; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));
            size_t full_n;
            char *full = tokenizer_decode(t, ids, m, 1, &full_n);
            TokStream *s = tokstream_new(t, 1);
            char *acc = malloc(full_n * 2 + 64);
            size_t an = 0;
            for (size_t k = 0; k <= m; k++) {
                size_t len;
                const char *piece = k < m ? tokstream_step(s, ids[k], &len) : tokstream_flush(s, &len);
                cr_assert(valid_utf8(piece, len), "%s: streamed chunk is not valid UTF-8", name);
                cr_assert_leq(an + len, full_n * 2 + 64);
                memcpy(acc + an, piece, len);
                an += len;
                chunks += len > 0;
            }
            // A byte run that turns out invalid makes a full decode replace the whole run by
            // U+FFFD, text a stream has already emitted; elsewhere they must agree exactly.
            if (!memmem(full, full_n, "\xEF\xBF\xBD", 3))
                cr_assert(an == full_n && !memcmp(acc, full, an), "%s %s[%zu]: stream \"%.*s\" != decode \"%s\"",
                          name, keys[w], i, (int)an, acc, full);
            tokstream_free(s);
            free(acc);
            free(full);
            free(ids);
        }
    }
    cr_assert_gt(chunks, 100);
}
static void check_stream(const char *name) {
    Tokenizer *t = load(name);
    json_t *g = goldens(name);
    check_stream_of(t, g, name);
    json_decref(g);
    tokenizer_free(t);
}

Test(tokenizer, qwen3_stream_decode_equals_decode) { check_stream("qwen3"); }
Test(tokenizer, sp32k_stream_decode_equals_decode) { check_stream("sp32k"); }
Test(tokenizer, tiny_stream_decode_equals_decode) { check_stream("tiny"); }

// Metaspace: newer HF exports of Llama-2 / Mistral have no normalizer and a Metaspace
// pre-tokenizer and decoder. goldens-sp32k-metaspace.json holds, per variant (prepend_scheme
// first / always / never, split, the old add_prefix_space spelling; decoders alone and in a
// Sequence with ByteFallback/Fuse), the "pre_tokenizer" and "decoder" JSON and HF's outputs.
// The tokenizer is sp32k-tokenizer.json with that edit, made here (no 1.8 MB copy committed).
static Tokenizer *load_metaspace(json_t *variant) {
    json_error_t e;
    json_t *root = json_load_file(DATA "sp32k-tokenizer.json", 0, &e);
    cr_assert(root, "sp32k-tokenizer.json line %d: %s", e.line, e.text);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set(root, "pre_tokenizer", json_object_get(variant, "pre_tokenizer"));
    json_object_set(root, "decoder", json_object_get(variant, "decoder"));
    char path[] = "/tmp/test_tok_ms_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(json_dump_file(root, path, JSON_COMPACT), 0);
    json_decref(root);
    char err[512];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    unlink(path);
    cr_assert(t, "load the Metaspace variant: %s", err);
    return t;
}

static void check_metaspace(const char *variant, size_t min_roundtrip) {
    json_t *g = goldens("sp32k-metaspace"), *v, *found = NULL;
    size_t i;
    json_array_foreach(json_object_get(g, "variants"), i, v) {
        if (!strcmp(json_string_value(json_object_get(v, "name")), variant)) found = v;
    }
    cr_assert(found, "no variant \"%s\" in goldens-sp32k-metaspace.json", variant);
    Tokenizer *t = load_metaspace(found);
    char name[64];
    snprintf(name, sizeof name, "sp32k-metaspace-%s", variant);
    const char *version = json_string_value(json_object_get(g, "tokenizers_version"));
    check_ids_of(t, found, name, version);
    check_decode_of(t, found, name, min_roundtrip);
    check_stream_of(t, found, name);
    // the other merge path, cache off: the same ids
    tokenizer_small_word_max = 0;
    tokenizer_use_cache = 0;
    check_ids_of(t, found, name, version);
    tokenizer_small_word_max = 48;
    tokenizer_use_cache = 1;
    tokenizer_free(t);
    json_decref(g);
}

// The minimum round-trip counts are what HF gives; a decoder of Metaspace alone (first_split,
// legacy) leaves <0xNN> byte tokens as they are, so fewer texts come back.
Test(tokenizer, metaspace_first_ids_identical_to_hf) { check_metaspace("first", 120); }
Test(tokenizer, metaspace_always_ids_identical_to_hf) { check_metaspace("always", 120); }
Test(tokenizer, metaspace_first_split_ids_identical_to_hf) { check_metaspace("first_split", 80); }
Test(tokenizer, metaspace_always_split_ids_identical_to_hf) { check_metaspace("always_split", 120); }
Test(tokenizer, metaspace_legacy_add_prefix_space_ids_identical_to_hf) { check_metaspace("legacy_add_prefix_space", 80); }
Test(tokenizer, metaspace_never_ids_identical_to_hf) { check_metaspace("never", 130); }

// Streaming a Chinese character whose 3 bytes arrive as 3 tokens emits nothing until the
// character is complete.
Test(tokenizer, stream_holds_incomplete_utf8) {
    Tokenizer *t = load("sp32k");
    int32_t b[3] = {tokenizer_token_id(t, "<0xE4>"), tokenizer_token_id(t, "<0xB8>"), tokenizer_token_id(t, "<0xAD>")};
    cr_assert(b[0] >= 0 && b[1] >= 0 && b[2] >= 0);
    TokStream *s = tokstream_new(t, 0);
    size_t len;
    tokstream_step(s, b[0], &len);
    cr_assert_eq(len, 0);
    tokstream_step(s, b[1], &len);
    cr_assert_eq(len, 0);
    const char *p = tokstream_step(s, b[2], &len);
    cr_assert(len == 3 && !memcmp(p, "中", 3), "got %zu bytes", len);
    tokstream_free(s);
    tokenizer_free(t);
}

// Invalid UTF-8 is refused with a message, never a crash; the tokenizer still works after.
Test(tokenizer, invalid_utf8_is_refused) {
    const char *bad[] = {"\xff", "abc\x80", "\xc3", "\xe4\xb8", "\xed\xa0\x80 surrogate", "\xc0\xaf overlong",
                         "\xf4\x90\x80\x80 too big", "ok \xe4\xb8 then more"};
    for (int k = 0; k < 2; k++) {
        Tokenizer *t = load(k ? "sp32k" : "qwen3");
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            TokIds ids = {0};
            cr_assert_eq(tokenizer_encode(t, bad[i], strlen(bad[i]), 1, &ids), -1, "case %zu", i);
            cr_assert(strstr(tokenizer_error(t), "UTF-8"), "message: %s", tokenizer_error(t));
            tokids_free(&ids);
        }
        TokIds ids = {0};
        cr_assert_eq(tokenizer_encode(t, "fine", 4, 0, &ids), 0);
        cr_assert_gt(ids.n, 0);
        tokids_free(&ids);
        tokenizer_free(t);
    }
}

// BOS/EOS from tokenizer_config.json.
Test(tokenizer, config_bos_eos) {
    Tokenizer *t = load("sp32k");
    cr_assert_eq(tokenizer_bos_id(t), 1);
    cr_assert_eq(tokenizer_eos_id(t), 2);
    cr_assert_eq(tokenizer_add_bos(t), 1);
    cr_assert(tokenizer_is_special(t, 1));
    tokenizer_free(t);
    t = load("qwen3");
    cr_assert_eq(tokenizer_bos_id(t), -1);
    cr_assert_eq(tokenizer_eos_id(t), tokenizer_token_id(t, "<|im_end|>"));
    cr_assert_eq(tokenizer_add_bos(t), 0);
    cr_assert_str_eq(tokenizer_piece(t, tokenizer_token_id(t, "Ġworld")), "Ġworld");
    tokenizer_free(t);
}

// Anything not implemented is refused at load with a message naming it.
static void refuse(const char *json, const char *must_name) {
    char path[] = "/tmp/test_tok_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    char err[512] = "";
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    unlink(path);
    cr_assert_null(t, "must refuse: %s", json);
    cr_assert(strstr(err, must_name), "message \"%s\" must name \"%s\"", err, must_name);
}

#define TINY_MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

Test(tokenizer, unsupported_is_refused_at_load) {
    refuse("{" TINY_MODEL ", \"normalizer\": {\"type\": \"NFKC\"}}", "NFKC");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "Whitespace");
    // Metaspace: what HF itself refuses, and what is not implemented
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\"}}", "replacement");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}}", "one character");
    refuse("{" TINY_MODEL ", \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"add_prefix_space\": false}}",
           "add_prefix_space");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}}",
           "prepend_scheme");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"frob\": 1}}", "frob");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Metaspace\", "
           "\"replacement\": \"_\"}, {\"type\": \"ByteLevel\"}]}}", "ByteLevel");
    refuse("{" TINY_MODEL ", \"normalizer\": {\"type\": \"Prepend\", \"prepend\": \"_\"}, \"pre_tokenizer\": {\"type\": "
           "\"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\"}, \"added_tokens\": [{\"id\": 3, "
           "\"content\": \"<x>\", \"normalized\": true}]}", "first");
    refuse("{" TINY_MODEL ", \"decoder\": {\"type\": \"WordPiece\"}}", "WordPiece");
    refuse("{" TINY_MODEL ", \"post_processor\": {\"type\": \"BertProcessing\"}}", "BertProcessing");
    refuse("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "WordPiece");
    refuse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", "\"b\" is not in the vocab");
    refuse("{" TINY_MODEL ", \"truncation\": {\"max_length\": 5}}", "truncation");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": false}}", "regex");
    refuse("{" TINY_MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"MergedWithNext\", \"invert\": false}}", "MergedWithNext");
    refuse("{" TINY_MODEL ", \"normalizer\": {\"type\": \"NFC\", \"frobnicate\": 1}}", "frobnicate");
    refuse("{not json", "line 1");
    char err[512];
    cr_assert_null(tokenizer_load("/nonexistent/tokenizer.json", err, sizeof err));
    cr_assert(strstr(err, "/nonexistent/tokenizer.json"), "%s", err);
}
