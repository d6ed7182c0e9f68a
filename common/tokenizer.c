// tokenizer.c — Hugging Face tokenizer.json in C: load, encode, decode, stream-decode.
// Run: build/bin/tokenize --tokenizer tests/data/tokenizers/qwen3-tokenizer.json --text "Hi"
//
// Encode is HF's pipeline, stage by stage (each stage below names the Rust code it mirrors):
//   text --(1) added tokens split out (AddedVocabulary::find_matches, leftmost-longest)
//        --(2) normalizer on each remaining piece (NFC / Prepend / Replace)
//        --(3) pre-tokenizer: Split regex (Oniguruma, as HF), ByteLevel, Metaspace
//        --(4) BPE model per word (BPE::merge_word + Word::merge_all), with a word cache
//        --(5) post-processor (TemplateProcessing: BOS) when add_special
// Decode runs the decoder chain (ByteLevel, or Replace/Metaspace/ByteFallback/Fuse/Strip) on the
// tokens' strings and turns invalid UTF-8 into U+FFFD like Rust's String::from_utf8_lossy.
//
// Byte-level vocabularies are stored in raw bytes ("Ġthe" -> " the"): the ByteLevel mapping
// is a bijection byte <-> character, so BPE on raw bytes gives the same ids as BPE on the
// mapped characters, without building the mapped string for every word.
#define _GNU_SOURCE  // memmem
#include "tokenizer.h"

#include <jansson.h>
#include <oniguruma.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "check.h"

int tokenizer_small_word_max = 48;
int tokenizer_use_cache = 1;

// ================================================================ small helpers

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die("out of memory reallocating %zu bytes", n);
    return q;
}

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static void buf_reserve(Buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return;
    size_t c = b->cap ? b->cap : 64;
    while (c < b->n + extra + 1) c *= 2;
    b->p = xrealloc(b->p, c);
    b->cap = c;
}
static void buf_put(Buf *b, const void *s, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_putc(Buf *b, char c) { buf_put(b, &c, 1); }
static void buf_free(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

void tokids_free(TokIds *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}
static void ids_reserve(TokIds *v, size_t extra) {
    if (v->n + extra <= v->cap) return;
    size_t c = v->cap ? v->cap : 64;
    while (c < v->n + extra) c *= 2;
    v->ids = xrealloc(v->ids, c * sizeof(int32_t));
    v->cap = c;
}
static void ids_push(TokIds *v, int32_t id) {
    ids_reserve(v, 1);
    v->ids[v->n++] = id;
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    return h;
}

// ================================================================ UTF-8

// Length (1..4) of the valid UTF-8 sequence at s, or -k: the first k bytes are one
// "maximal invalid subpart", which String::from_utf8_lossy replaces by one U+FFFD.
static int utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    uint32_t v;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return -1;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i;
        uint8_t d = s[i];
        if (d < lo || d > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (d & 0x3F);
    }
    *cp = v;
    return need + 1;
}

#define REPLACEMENT "\xEF\xBF\xBD"  // U+FFFD

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
static void utf8_lossy(Buf *out, const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        int l = u[i] < 0x80 ? 1 : utf8_next(u + i, n - i, &cp);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        buf_put(out, s + run, i - run);
        buf_put(out, REPLACEMENT, 3);
        i += (size_t)(-l);
        run = i;
    }
    buf_put(out, s + run, n - run);
}

// Unicode White_Space (what Rust's \s and char::is_whitespace match).
static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}
// Rust regex \w: letters, marks, decimal digits, connector punctuation, join controls.
static int is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}
// The code point that ends at s[end) (the text before it is valid UTF-8); its length in *len.
static uint32_t utf8_prev(const char *s, size_t end, size_t *len) {
    size_t b = end - 1;
    while (b > 0 && end - b < 4 && ((uint8_t)s[b] & 0xC0) == 0x80) b--;
    uint32_t cp = 0xFFFD;
    utf8_next((const uint8_t *)s + b, end - b, &cp);
    *len = end - b;
    return cp;
}

// ================================================================ the ByteLevel alphabet
// GPT-2's bytes_to_unicode: printable bytes map to themselves ('!'..'~', '¡'..'¬', '®'..'ÿ'),
// the other 68 bytes to U+0100.. in order (space -> 'Ġ' U+0120, '\n' -> 'Ċ' U+010A).
static uint16_t b2u[256];
static int16_t u2b[324];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void global_init(void) {
    int k = 0;
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        b2u[b] = (uint16_t)(printable ? b : 256 + k++);
        u2b[b2u[b]] = (int16_t)b;
    }
    OnigEncoding enc[1] = {ONIG_ENCODING_UTF8};
    onig_initialize(enc, 1);
}

// Byte-level string ("Ġthe") -> raw bytes (" the"). Returns 0 if some character is not in
// the alphabet (then out is unchanged).
static int bytelevel_to_raw(Buf *out, const char *s, size_t n) {
    size_t start = out->n;
    buf_reserve(out, n);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (l < 0 || cp >= 324 || u2b[cp] < 0) {
            out->n = start;
            if (out->p) out->p[start] = 0;
            return 0;
        }
        char c = (char)u2b[cp];
        buf_put(out, &c, 1);
        i += (size_t)l;
    }
    return 1;
}

// ================================================================ the Tokenizer

typedef struct {
    uint32_t off, len;
} Span;
#define NO_SPAN UINT32_MAX
enum { TF_VOCAB = 1, TF_ADDED = 2, TF_SPECIAL = 4, TF_BYTE = 8 };  // TF_BYTE: a <0xNN> token under ByteFallback

typedef struct {
    Span content;  // as written in tokenizer.json
    Span pat;      // what is matched: content, or normalized content when normalized
    int32_t id;
    uint8_t lstrip, rstrip, single_word, normalized, special;
} Added;

enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE };
typedef struct {
    int kind;
    Span a, b;  // prepend: a; replace: a -> b
} NormStep;

enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };  // Metaspace prepend_scheme
typedef struct {
    int kind;
    regex_t *re;         // Split with a Regex pattern, or ByteLevel with use_regex
    OnigRegion *region;  // one per step: steps run nested
    Span lit;            // Split with a String pattern; Metaspace: the replacement character
    int removed, invert, prefix_space;
    int scheme, split;   // Metaspace
    Buf buf;             // Metaspace: the rewritten piece (a step is never re-entered while busy)
} PreStep;

enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct {
    int kind;
    Span a, b;  // replace a -> b; Metaspace: a = the replacement character
    uint32_t cp;
    int start, stop;  // strip; Metaspace: start = drop the first token's replacement chars
} DecStep;

typedef struct {
    uint64_t h;
    uint32_t koff, ioff;
    uint16_t klen, nids;
} CacheEnt;
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_WORD 255

typedef struct {
    uint64_t key;  // rank << 32 | position
    int32_t new_id;
} HeapEnt;

#define MAX_STEPS 32

struct Tokenizer {
    Buf arena;       // every string below, each NUL-terminated
    int32_t n_ids;   // 1 + largest id
    Span *str;       // (n_ids) token as written in tokenizer.json; decode input
    Span *key;       // (n_ids) model lookup form (raw bytes for byte-level vocabularies)
    uint8_t *flags;  // (n_ids) TF_*
    int32_t *vmap;   // open addressing: key -> id, -1 empty
    uint32_t *vmap_h;
    size_t vmap_mask;
    uint64_t *mkey;  // merges: (left << 32 | right) -> rank, new id; UINT64_MAX empty
    uint32_t *mrank;
    int32_t *mnew;
    size_t mmask;
    Added *added;
    int n_added;
    uint8_t first[2][256];  // [normalized] first bytes of added-token patterns
    int n_kind[2];
    NormStep norm[MAX_STEPS];
    int n_norm;
    PreStep pre[MAX_STEPS];
    int n_pre;
    DecStep dec[MAX_STEPS];
    int n_dec, has_decoder;
    int byte_level, byte_fallback, fuse_unk, ignore_merges;
    // No token has "▁" after another character, so no merge can join "x" and a following
    // "▁": cutting the text before such a "▁" changes no id. Checked on the vocabulary.
    int meta_split;
    int32_t unk_id;
    int32_t byte_id[256];      // byte-level: id of each single byte
    int32_t fallback_id[256];  // id of "<0xNN>", -1 if absent
    TokIds tmpl_pre, tmpl_post;  // TemplateProcessing: ids before and after the text
    int32_t bos_id, eos_id;
    int add_bos;
    // scratch for encode
    Buf nbuf[2], tmp;
    int32_t *hprev, *hnext;
    HeapEnt *heap;
    size_t hcap;
    CacheEnt *cache;
    size_t cache_n;
    Buf ckeys;
    TokIds cids;
    int search_err;  // an Oniguruma error during this encode
    // Metaspace "first" prepends only to a piece at offset 0 of the original text:
    const char *enc_text;   // the text being encoded
    const char *norm_base;  // the normalized form of the current raw piece
    int norm_at0;           // that raw piece starts at offset 0
    char err[512];
};

static const char *A(const Tokenizer *t, Span s) { return t->arena.p + s.off; }
static Span arena_add(Tokenizer *t, const char *s, size_t n) {
    Span sp = {(uint32_t)t->arena.n, (uint32_t)n};
    buf_put(&t->arena, s, n);
    buf_putc(&t->arena, 0);
    return sp;
}

static int32_t vmap_get(const Tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    uint32_t h32 = (uint32_t)(h >> 32);
    for (size_t i = h & t->vmap_mask;; i = (i + 1) & t->vmap_mask) {
        int32_t id = t->vmap[i];
        if (id < 0) return -1;
        if (t->vmap_h[i] == h32 && t->key[id].len == n && memcmp(A(t, t->key[id]), s, n) == 0) return id;
    }
}
static void vmap_put(Tokenizer *t, int32_t id) {
    const char *s = A(t, t->key[id]);
    size_t n = t->key[id].len;
    uint64_t h = hash_bytes(s, n);
    for (size_t i = h & t->vmap_mask;; i = (i + 1) & t->vmap_mask) {
        int32_t o = t->vmap[i];
        if (o < 0) {
            t->vmap[i] = id;
            t->vmap_h[i] = (uint32_t)(h >> 32);
            return;
        }
        if (t->key[o].len == n && memcmp(A(t, t->key[o]), s, n) == 0) {
            t->vmap[i] = id;  // a repeated key: the last one wins, as in a Rust HashMap
            return;
        }
    }
}

static inline size_t merge_slot(uint64_t k, size_t mask) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & mask; }
static inline int merge_get(const Tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = merge_slot(k, t->mmask);; i = (i + 1) & t->mmask) {
        if (t->mkey[i] == k) {
            *rank = t->mrank[i];
            *nid = t->mnew[i];
            return 1;
        }
        if (t->mkey[i] == UINT64_MAX) return 0;
    }
}
static void merge_put(Tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t nid) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = merge_slot(k, t->mmask);
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != k) i = (i + 1) & t->mmask;
    t->mkey[i] = k;  // a repeated pair: the later rank wins (HF collects into a HashMap)
    t->mrank[i] = rank;
    t->mnew[i] = nid;
}

const char *tokenizer_error(const Tokenizer *t) { return t->err; }
int32_t tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }
int32_t tokenizer_bos_id(const Tokenizer *t) { return t->bos_id; }
int32_t tokenizer_eos_id(const Tokenizer *t) { return t->eos_id; }
int tokenizer_add_bos(const Tokenizer *t) { return t->add_bos; }
int tokenizer_is_special(const Tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & TF_SPECIAL);
}
const char *tokenizer_piece(const Tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->str[id].len == NO_SPAN) return NULL;
    return A(t, t->str[id]);
}

// Model lookup of a token string as written in tokenizer.json (scratch: a work buffer).
static int32_t vocab_lookup_buf(const Tokenizer *t, const char *s, size_t n, Buf *scratch) {
    if (!t->byte_level) return vmap_get(t, s, n);
    scratch->n = 0;
    if (!bytelevel_to_raw(scratch, s, n)) return vmap_get(t, s, n);
    return vmap_get(t, scratch->p, scratch->n);
}
static int32_t vocab_lookup(Tokenizer *t, const char *s, size_t n) { return vocab_lookup_buf(t, s, n, &t->tmp); }

int32_t tokenizer_token_id(const Tokenizer *t, const char *piece) {
    size_t n = strlen(piece);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].content.len == n && memcmp(A(t, t->added[i].content), piece, n) == 0) return t->added[i].id;
    Buf scratch = {0};
    int32_t id = vocab_lookup_buf(t, piece, n, &scratch);
    buf_free(&scratch);
    return id;
}

// ================================================================ (2) normalizer

// Canonical composition can change the text only around code points that decompose
// canonically, have a combining class, can be the second of a composition, or are Hangul
// jamo. Text without them is already NFC; most text is, so this skips utf8proc.
static int nfc_is_identity(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0xCC) {  // below U+0300 nothing composes as the second character
            i += c < 0x80 ? 1 : 2;
            continue;
        }
        uint32_t cp;
        int l = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (l < 0) return 0;
        i += (size_t)l;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->combining_class != 0) return 0;
        if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) return 0;
        if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return 0;
        if (cp >= 0x1100 && cp <= 0x11FF) return 0;
        if (cp >= 0xAC00 && cp <= 0xD7A3) continue;  // syllables compose only with a T jamo (caught above)
    }
    return 1;
}

static void replace_lit(Buf *out, const char *s, size_t n, const char *pat, size_t pn, const char *rep, size_t rn) {
    size_t i = 0;
    while (i < n) {
        const char *f = memmem(s + i, n - i, pat, pn);
        if (!f) break;
        size_t at = (size_t)(f - s);
        buf_put(out, s + i, at - i);
        buf_put(out, rep, rn);
        i = at + pn;
    }
    buf_put(out, s + i, n - i);
}

// Runs the normalizer on s[0..n); the result is s itself or lives in t->nbuf.
static const char *normalize(Tokenizer *t, const char *s, size_t n, size_t *out_n) {
    const char *cur = s;
    size_t cn = n;
    int which = 0;
    for (int k = 0; k < t->n_norm; k++) {
        const NormStep *st = &t->norm[k];
        Buf *b = &t->nbuf[which];
        b->n = 0;
        switch (st->kind) {
        case NORM_NFC: {
            if (nfc_is_identity(cur, cn)) continue;
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cn, &o,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0) die("utf8proc_map: %s", utf8proc_errmsg(r));  // input was validated
            buf_put(b, o, (size_t)r);
            free(o);
            break;
        }
        case NORM_PREPEND:
            if (cn == 0) continue;  // HF prepends only to non-empty pieces
            buf_put(b, A(t, st->a), st->a.len);
            buf_put(b, cur, cn);
            break;
        case NORM_REPLACE:
            if (!memmem(cur, cn, A(t, st->a), st->a.len)) continue;
            replace_lit(b, cur, cn, A(t, st->a), st->a.len, A(t, st->b), st->b.len);
            break;
        }
        buf_reserve(b, 0);
        cur = b->p;
        cn = b->n;
        which ^= 1;
    }
    *out_n = cn;
    return cur;
}

// ================================================================ (4) BPE model

// Merges adjacent symbols, always the pair with the lowest rank, leftmost first. This is
// what HF's heap-based Word::merge_all computes; O(n^2) but fastest for short words.
static size_t merge_small(const Tokenizer *t, int32_t *ids, size_t n) {
    uint32_t rank[64];
    int32_t nid[64];
    if (n < 2) return n;
    for (size_t i = 0; i + 1 < n; i++)
        if (!merge_get(t, ids[i], ids[i + 1], &rank[i], &nid[i])) rank[i] = UINT32_MAX;
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        ids[best] = nid[best];
        // symbol best+1 disappears; pair i (i > best+1) becomes pair i-1
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(int32_t));
        if (n >= best + 3) {
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof(uint32_t));
            memmove(nid + best + 1, nid + best + 2, (n - best - 3) * sizeof(int32_t));
        }
        n--;
        if (best + 1 < n && !merge_get(t, ids[best], ids[best + 1], &rank[best], &nid[best])) rank[best] = UINT32_MAX;
        if (best > 0 && !merge_get(t, ids[best - 1], ids[best], &rank[best - 1], &nid[best - 1]))
            rank[best - 1] = UINT32_MAX;
    }
    return n;
}

static void heap_push(HeapEnt *h, size_t *n, HeapEnt e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= e.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}
static HeapEnt heap_pop(HeapEnt *h, size_t *n) {
    HeapEnt top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

// The same result for long words in O(n log n): a min-heap of (rank, position) over a
// linked list of symbols; stale heap entries are recognized and skipped (Word::merge_all).
static size_t merge_heap(Tokenizer *t, int32_t *ids, size_t n) {
    if (n < 2) return n;
    if (3 * n + 1 > t->hcap) {
        t->hcap = 3 * n + 1;
        t->hprev = xrealloc(t->hprev, t->hcap * sizeof(int32_t));
        t->hnext = xrealloc(t->hnext, t->hcap * sizeof(int32_t));
        t->heap = xrealloc(t->heap, t->hcap * sizeof(HeapEnt));
    }
    int32_t *prev = t->hprev, *next = t->hnext;
    HeapEnt *h = t->heap;
    size_t hn = 0;
    uint32_t r;
    int32_t nid;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        if (i + 1 < n && merge_get(t, ids[i], ids[i + 1], &r, &nid))
            heap_push(h, &hn, (HeapEnt){(uint64_t)r << 32 | i, nid});
    }
    while (hn) {
        HeapEnt top = heap_pop(h, &hn);
        int32_t pos = (int32_t)(top.key & 0xFFFFFFFFu);
        if (ids[pos] < 0) continue;  // merged into its left neighbour already
        int32_t nx = next[pos];
        if (nx < 0) continue;
        if (!merge_get(t, ids[pos], ids[nx], &r, &nid) || nid != top.new_id) continue;  // stale
        ids[pos] = nid;
        ids[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = pos;
        if (prev[pos] >= 0 && merge_get(t, ids[prev[pos]], nid, &r, &nid))
            heap_push(h, &hn, (HeapEnt){(uint64_t)r << 32 | (uint32_t)prev[pos], nid});
        if (next[pos] >= 0 && merge_get(t, ids[pos], ids[next[pos]], &r, &nid))
            heap_push(h, &hn, (HeapEnt){(uint64_t)r << 32 | (uint32_t)pos, nid});
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0) ids[m++] = ids[i];
    return m;
}

// BPE::merge_word: one symbol per character (per byte for byte-level vocabularies); a
// character not in the vocabulary becomes its <0xNN> byte tokens (byte_fallback) or the
// unknown token (consecutive ones fused into one with fuse_unk); then merges.
static void bpe_word(Tokenizer *t, const char *s, size_t n, TokIds *out) {
    size_t base = out->n;
    ids_reserve(out, n + 1);
    int pending_unk = 0;
    for (size_t i = 0; i < n;) {
        int32_t id;
        const char *chr;  // the character as the vocabulary spells it, for byte fallback
        size_t clen;
        char mapped[2];
        if (t->byte_level) {
            uint8_t b = (uint8_t)s[i];
            id = t->byte_id[b];
            i += 1;
            uint16_t u = b2u[b];  // the character this byte stands for, in UTF-8
            if (u < 0x80) {
                mapped[0] = (char)u;
                clen = 1;
            } else {
                mapped[0] = (char)(0xC0 | (u >> 6));
                mapped[1] = (char)(0x80 | (u & 0x3F));
                clen = 2;
            }
            chr = mapped;
        } else {
            uint32_t cp;
            int l = utf8_next((const uint8_t *)s + i, n - i, &cp);
            clen = l > 0 ? (size_t)l : 1;
            chr = s + i;
            id = vmap_get(t, chr, clen);
            i += clen;
        }
        if (id >= 0) {
            if (pending_unk) out->ids[out->n++] = t->unk_id;
            pending_unk = 0;
            out->ids[out->n++] = id;
            continue;
        }
        if (t->byte_fallback) {
            size_t k = 0;
            while (k < clen && t->fallback_id[(uint8_t)chr[k]] >= 0) k++;
            if (k == clen) {  // HF leaves a pending unknown token pending here
                ids_reserve(out, clen + 1);
                for (k = 0; k < clen; k++) out->ids[out->n++] = t->fallback_id[(uint8_t)chr[k]];
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (pending_unk && !t->fuse_unk) out->ids[out->n++] = t->unk_id;
            pending_unk = 1;
        }
        ids_reserve(out, n + 1);
    }
    if (pending_unk) ids_push(out, t->unk_id);
    size_t m = out->n - base;
    int small = tokenizer_small_word_max < 64 ? tokenizer_small_word_max : 64;
    m = (int)m <= small ? merge_small(t, out->ids + base, m) : merge_heap(t, out->ids + base, m);
    out->n = base + m;
}

static void cache_clear(Tokenizer *t) {
    memset(t->cache, 0, CACHE_SLOTS * sizeof(CacheEnt));
    t->cache_n = 0;
    t->ckeys.n = 0;
    t->cids.n = 0;
}

// One word through the model (BPE::tokenize_with_cache).
static void model_word(Tokenizer *t, const char *s, size_t n, TokIds *out) {
    if (t->ignore_merges) {  // Llama-3: a word that is itself a token is that token
        int32_t id = vmap_get(t, s, n);
        if (id >= 0) {
            ids_push(out, id);
            return;
        }
    }
    if (!tokenizer_use_cache || n > CACHE_MAX_WORD) {
        bpe_word(t, s, n, out);
        return;
    }
    if (!t->cache) {
        t->cache = xcalloc(CACHE_SLOTS, sizeof(CacheEnt));
    }
    uint64_t h = hash_bytes(s, n);
    size_t mask = CACHE_SLOTS - 1, i = h & mask;
    for (;; i = (i + 1) & mask) {
        CacheEnt *e = &t->cache[i];
        if (e->klen == 0) break;
        if (e->h == h && e->klen == n && memcmp(t->ckeys.p + e->koff, s, n) == 0) {
            if (e->nids) {
                ids_reserve(out, e->nids);
                memcpy(out->ids + out->n, t->cids.ids + e->ioff, e->nids * sizeof(int32_t));
                out->n += e->nids;
            }
            return;
        }
    }
    size_t base = out->n;
    bpe_word(t, s, n, out);
    size_t m = out->n - base;
    if (t->cache_n >= CACHE_SLOTS / 2 || t->ckeys.n > (64u << 20)) {
        cache_clear(t);
        for (i = h & mask; t->cache[i].klen; i = (i + 1) & mask) {
        }
    }
    CacheEnt *e = &t->cache[i];
    e->h = h;
    e->koff = (uint32_t)t->ckeys.n;
    e->klen = (uint16_t)n;
    e->ioff = (uint32_t)t->cids.n;
    e->nids = (uint16_t)m;
    buf_put(&t->ckeys, s, n);
    if (m) {
        ids_reserve(&t->cids, m);
        memcpy(t->cids.ids + t->cids.n, out->ids + base, m * sizeof(int32_t));
        t->cids.n += m;
    }
    t->cache_n++;
}

// ================================================================ (3) pre-tokenizer

#define META "\xE2\x96\x81"  // U+2581 "▁", SentencePiece's space

static void pretok(Tokenizer *t, int k, const char *s, size_t n, TokIds *out, int at0);

// Split (and ByteLevel's use_regex): HF's Pattern::find_matches over onig's find_iter, then
// the Isolated / Removed behaviour. Each piece goes on to the next pre-tokenizer step.
// at0: the piece starts at offset 0 of the original text (for Metaspace "first").
static void pre_split(Tokenizer *t, int k, const char *s, size_t n, TokIds *out, int at0) {
    PreStep *p = &t->pre[k];
    const UChar *us = (const UChar *)s, *end = us + n;
    size_t prev = 0, last_end = 0;
    long last_match_end = -1;
    while (last_end <= n) {
        size_t ms, me;
        if (p->re) {
            int r = onig_search(p->re, us, end, us + last_end, end, p->region, ONIG_OPTION_NONE);
            if (r == ONIG_MISMATCH) break;
            if (r < 0) {  // e.g. a backtracking limit: HF would panic; we report it
                if (!t->search_err) t->search_err = r;
                break;
            }
            ms = (size_t)p->region->beg[0];
            me = (size_t)p->region->end[0];
        } else {
            const char *f = memmem(s + last_end, n - last_end, A(t, p->lit), p->lit.len);
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + p->lit.len;
        }
        if (me == ms && last_match_end == (long)me) {  // no empty match right after a match
            size_t clen = 1;
            if (last_end < n) {
                uint32_t cp;
                int l = utf8_next((const uint8_t *)s + last_end, n - last_end, &cp);
                clen = l > 0 ? (size_t)l : 1;
            }
            last_end += clen;
            continue;
        }
        last_end = me;
        last_match_end = (long)me;
        if (prev != ms && (!p->removed || !p->invert)) pretok(t, k + 1, s + prev, ms - prev, out, at0 && prev == 0);
        if (!p->removed || p->invert) pretok(t, k + 1, s + ms, me - ms, out, at0 && ms == 0);
        prev = me;
    }
    if (prev != n && (!p->removed || !p->invert)) pretok(t, k + 1, s + prev, n - prev, out, at0 && prev == 0);
}

// Metaspace (pre_tokenizers/metaspace.rs): every ' ' becomes the replacement r; r is put in
// front unless the piece already starts with it ("always": every piece; "first": only the
// piece at offset 0 of the original text, so not after an added token; "never"). With split,
// the piece is cut before every r (HF's MergedWithNext folds from the end, so each r joins
// only what follows it: "▁▁a▁" -> "▁", "▁a", "▁").
static void pre_metaspace(Tokenizer *t, int k, const char *s, size_t n, TokIds *out, int at0) {
    PreStep *p = &t->pre[k];
    const char *r = A(t, p->lit);
    size_t rl = p->lit.len;
    Buf *b = &p->buf;
    b->n = 0;
    int starts = s[0] == ' ' || (n >= rl && memcmp(s, r, rl) == 0);
    if (!starts && (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && at0))) buf_put(b, r, rl);
    replace_lit(b, s, n, " ", 1, r, rl);
    s = b->p;
    n = b->n;
    if (!p->split) {
        pretok(t, k + 1, s, n, out, at0);
        return;
    }
    size_t a = 0;
    for (size_t i = 1; i + rl <= n; i++) {
        if (memcmp(s + i, r, rl) != 0) continue;
        pretok(t, k + 1, s + a, i - a, out, at0 && a == 0);
        a = i;
    }
    pretok(t, k + 1, s + a, n - a, out, at0 && a == 0);
}

static void pretok(Tokenizer *t, int k, const char *s, size_t n, TokIds *out, int at0) {
    if (n == 0) return;  // HF drops empty pieces
    if (k == t->n_pre) {
        if (!t->meta_split) {
            model_word(t, s, n, out);
            return;
        }
        // SentencePiece-style text is one long word; cut it before each "▁" that follows
        // another character (see meta_split) so that words hit the cache.
        size_t a = 0;
        for (size_t i = 1; i + 3 <= n; i++) {
            if (memcmp(s + i, META, 3) == 0 && !(i >= 3 && memcmp(s + i - 3, META, 3) == 0)) {
                model_word(t, s + a, i - a, out);
                a = i;
            }
        }
        model_word(t, s + a, n - a, out);
        return;
    }
    PreStep *p = &t->pre[k];
    if (p->kind == PRE_SPLIT) {
        pre_split(t, k, s, n, out, at0);
        return;
    }
    if (p->kind == PRE_METASPACE) {
        pre_metaspace(t, k, s, n, out, at0);
        return;
    }
    // ByteLevel: optional prefix space, optional GPT-2 regex split; the byte mapping itself
    // is implicit (the vocabulary is stored in raw bytes).
    char *own = NULL;
    if (p->prefix_space && s[0] != ' ') {
        own = xmalloc(n + 1);
        own[0] = ' ';
        memcpy(own + 1, s, n);
        s = own;
        n++;
    }
    if (p->re)
        pre_split(t, k, s, n, out, at0);
    else
        pretok(t, k + 1, s, n, out, at0);
    free(own);
}

// ================================================================ (1) added tokens, encode

static void split_added(Tokenizer *t, const char *s, size_t n, int kind, TokIds *out);

// A piece of text between added tokens: normalize it (raw pieces only), look for the
// normalized added tokens in it, pre-tokenize and tokenize.
static void segment(Tokenizer *t, const char *s, size_t n, int kind, TokIds *out) {
    if (n == 0) return;
    if (kind == 0) {
        size_t nn;
        const char *ns = normalize(t, s, n, &nn);
        t->norm_base = ns;
        t->norm_at0 = s == t->enc_text;
        if (t->n_kind[1])
            split_added(t, ns, nn, 1, out);
        else
            pretok(t, 0, ns, nn, out, t->norm_at0);
    } else {
        // at offset 0 of the normalized raw piece: at offset 0 of the original text when
        // that piece is (the loader refuses the normalizers where this would not hold)
        pretok(t, 0, s, n, out, t->norm_at0 && s == t->norm_base);
    }
}

// AddedVocabulary::find_matches: leftmost-longest matches of the added tokens of one kind
// (normalized or not), with the single_word / lstrip / rstrip rules.
static void split_added(Tokenizer *t, const char *s, size_t n, int kind, TokIds *out) {
    if (!t->n_kind[kind]) {
        segment(t, s, n, kind, out);
        return;
    }
    size_t start_offset = 0, i = 0;
    while (i < n) {
        if (!t->first[kind][(uint8_t)s[i]]) {
            i++;
            continue;
        }
        int best = -1;
        size_t blen = 0;
        for (int a = 0; a < t->n_added; a++) {
            const Added *ad = &t->added[a];
            if (ad->normalized != kind || ad->pat.len <= blen || ad->pat.len > n - i) continue;
            if (memcmp(A(t, ad->pat), s + i, ad->pat.len) == 0) {
                best = a;
                blen = ad->pat.len;
            }
        }
        if (best < 0) {
            i++;
            continue;
        }
        const Added *ad = &t->added[best];
        size_t start = i, stop = i + blen, cl;
        i = stop;  // the automaton goes on after this match
        if (ad->single_word) {
            if (start > 0 && is_word(utf8_prev(s, start, &cl))) continue;
            uint32_t cp = 0;
            if (stop < n && utf8_next((const uint8_t *)s + stop, n - stop, &cp) > 0 && is_word(cp)) continue;
        }
        if (ad->lstrip) {
            size_t ns = start;
            while (ns > 0 && is_ws(utf8_prev(s, ns, &cl))) ns -= cl;
            start = ns > start_offset ? ns : start_offset;
        }
        if (ad->rstrip) {
            uint32_t cp;
            int l;
            while (stop < n && (l = utf8_next((const uint8_t *)s + stop, n - stop, &cp)) > 0 && is_ws(cp))
                stop += (size_t)l;
        }
        if (start_offset < start) segment(t, s + start_offset, start - start_offset, kind, out);
        ids_push(out, ad->id);
        start_offset = stop;
    }
    if (start_offset < n) segment(t, s + start_offset, n - start_offset, kind, out);
}

int tokenizer_encode(Tokenizer *t, const char *text, size_t len, int add_special, TokIds *out) {
    t->err[0] = 0;
    const uint8_t *u = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = utf8_next(u + i, len - i, &cp);
        if (l < 0) {
            snprintf(t->err, sizeof t->err, "text is not valid UTF-8 (byte 0x%02X at offset %zu)", u[i], i);
            return -1;
        }
        i += (size_t)l;
    }
    size_t start = out->n;
    t->search_err = 0;
    if (add_special) {
        ids_reserve(out, t->tmpl_pre.n);
        for (size_t i = 0; i < t->tmpl_pre.n; i++) out->ids[out->n++] = t->tmpl_pre.ids[i];
    }
    t->enc_text = text;
    if (len) split_added(t, text, len, 0, out);
    if (t->search_err) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, t->search_err);
        snprintf(t->err, sizeof t->err, "pre-tokenizer regex search failed: %s", (const char *)msg);
        out->n = start;
        return -1;
    }
    if (add_special) {
        ids_reserve(out, t->tmpl_post.n);
        for (size_t i = 0; i < t->tmpl_post.n; i++) out->ids[out->n++] = t->tmpl_post.ids[i];
    }
    return 0;
}

// ================================================================ decode

typedef struct {
    Buf *v;
    size_t n, cap;
} StrList;
static Buf *sl_add(StrList *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = xrealloc(l->v, l->cap * sizeof(Buf));
    }
    Buf *b = &l->v[l->n++];
    memset(b, 0, sizeof *b);
    buf_reserve(b, 0);
    return b;
}
static void sl_free(StrList *l) {
    for (size_t i = 0; i < l->n; i++) buf_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

// A ByteLevel token's bytes: each character mapped back to its byte, or the token's own
// UTF-8 if some character is not in the alphabet (as HF's decode_chain).
static void bytelevel_bytes(Buf *out, const char *s, size_t n) {
    if (!bytelevel_to_raw(out, s, n)) buf_put(out, s, n);
}

static void flush_bytes(StrList *out, Buf *bytes) {
    if (!bytes->n) return;
    int ok = 1;
    for (size_t i = 0; i < bytes->n && ok;) {
        uint32_t cp;
        int l = utf8_next((const uint8_t *)bytes->p + i, bytes->n - i, &cp);
        if (l < 0) ok = 0;
        else i += (size_t)l;
    }
    if (ok) {
        buf_put(sl_add(out), bytes->p, bytes->n);
    } else {
        for (size_t i = 0; i < bytes->n; i++) buf_put(sl_add(out), REPLACEMENT, 3);
    }
    bytes->n = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
// "<0xNN>" as HF's ByteFallback reads it (u8::from_str_radix also takes "+N").
static int byte_token(const Buf *b) {
    if (b->n != 6 || memcmp(b->p, "<0x", 3) != 0 || b->p[5] != '>') return -1;
    if (b->p[3] == '+') return hexval(b->p[4]);
    int hi = hexval(b->p[3]), lo = hexval(b->p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void run_decoder(const Tokenizer *t, const DecStep *d, StrList *in, StrList *out) {
    switch (d->kind) {
    case DEC_BYTELEVEL: {
        Buf raw = {0};
        for (size_t i = 0; i < in->n; i++) bytelevel_bytes(&raw, in->v[i].p, in->v[i].n);
        Buf *o = sl_add(out);
        utf8_lossy(o, raw.p ? raw.p : "", raw.n);
        buf_free(&raw);
        break;
    }
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++)
            replace_lit(sl_add(out), in->v[i].p, in->v[i].n, A(t, d->a), d->a.len, A(t, d->b), d->b.len);
        break;
    case DEC_BYTEFALLBACK: {
        Buf bytes = {0};
        for (size_t i = 0; i < in->n; i++) {
            int b = byte_token(&in->v[i]);
            if (b >= 0) {
                buf_putc(&bytes, (char)b);
            } else {
                flush_bytes(out, &bytes);
                buf_put(sl_add(out), in->v[i].p, in->v[i].n);
            }
        }
        flush_bytes(out, &bytes);
        buf_free(&bytes);
        break;
    }
    case DEC_FUSE: {
        Buf *o = sl_add(out);
        for (size_t i = 0; i < in->n; i++) buf_put(o, in->v[i].p, in->v[i].n);
        break;
    }
    case DEC_METASPACE:  // the replacement back to ' '; in the first token dropped (all of them)
        for (size_t i = 0; i < in->n; i++)
            replace_lit(sl_add(out), in->v[i].p, in->v[i].n, A(t, d->a), d->a.len, " ", i == 0 && d->start ? 0 : 1);
        break;
    case DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->v[i].p;
            size_t n = in->v[i].n, a = 0, b = n;
            uint32_t cp;
            for (int k = 0; k < d->start && a < n; k++) {
                int l = utf8_next((const uint8_t *)s + a, n - a, &cp);
                if (l < 0 || cp != d->cp) break;
                a += (size_t)l;
            }
            for (int k = 0; k < d->stop && b > a; k++) {
                size_t cl;
                if (utf8_prev(s, b, &cl) != d->cp) break;
                b -= cl;
            }
            buf_put(sl_add(out), s + a, b - a);
        }
        break;
    }
}

char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, int skip_special, size_t *out_len) {
    Buf out = {0};
    buf_put(&out, "", 0);  // "" even when the decoders return no strings (no Fuse, no tokens)
    int fast_bl = t->n_dec == 1 && t->dec[0].kind == DEC_BYTELEVEL;
    StrList cur = {0}, next = {0};
    Buf raw = {0};
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->str[id].len == NO_SPAN) continue;
        if (skip_special && (t->flags[id] & TF_SPECIAL)) continue;
        const char *s = A(t, t->str[id]);
        size_t sn = t->str[id].len;
        if (fast_bl) {
            bytelevel_bytes(&raw, s, sn);
        } else if (!t->has_decoder) {  // no decoder: tokens joined by spaces
            if (!first) buf_putc(&out, ' ');
            buf_put(&out, s, sn);
        } else {
            buf_put(sl_add(&cur), s, sn);
        }
        first = 0;
    }
    if (fast_bl) {
        utf8_lossy(&out, raw.p ? raw.p : "", raw.n);
    } else if (t->has_decoder) {
        for (int k = 0; k < t->n_dec; k++) {
            run_decoder(t, &t->dec[k], &cur, &next);
            StrList x = cur;
            cur = next;
            next = x;
            sl_free(&next);
        }
        for (size_t i = 0; i < cur.n; i++) buf_put(&out, cur.v[i].p, cur.v[i].n);
    }
    sl_free(&cur);
    buf_free(&raw);
    if (out_len) *out_len = out.n;
    return out.p;
}

// ================================================================ streaming decode
// Re-decodes a short window of ids and emits what it adds beyond the text already emitted
// from that window. Text is held back while it ends in U+FFFD (an incomplete character
// that the next token may complete), as HF's DecodeStream. After each emit the window keeps
// context so that decoders looking at neighbours agree with a full decode: the last token
// (Strip removes the first token's space), or for ByteFallback the last token that is not
// a <0xNN> byte and the byte run after it (bytes are turned into text as one group).

struct TokStream {
    const Tokenizer *t;
    int skip;
    TokIds win;    // context + tokens not yet emitted
    char *prefix;  // decode(context), already emitted
    size_t prefix_n;
    char *text;  // last decode(win)
    size_t text_n;
};

TokStream *tokstream_new(const Tokenizer *t, int skip_special) {
    TokStream *s = xcalloc(1, sizeof *s);
    s->t = t;
    s->skip = skip_special;
    return s;
}
void tokstream_free(TokStream *s) {
    if (!s) return;
    tokids_free(&s->win);
    free(s->prefix);
    free(s->text);
    free(s);
}

static const char *stream_emit(TokStream *s, size_t *len, int force) {
    const Tokenizer *t = s->t;
    free(s->text);
    s->text = tokenizer_decode(t, s->win.ids, s->win.n, s->skip, &s->text_n);
    *len = 0;
    int held = s->text_n >= 3 && memcmp(s->text + s->text_n - 3, REPLACEMENT, 3) == 0;
    if (held && !force) return "";
    size_t from = s->prefix_n;
    if (s->text_n < from || (from && memcmp(s->text, s->prefix, from) != 0)) {
        // An invalid byte run turned text already emitted into U+FFFD; it cannot be taken
        // back, so continue after the common part (at a character boundary).
        from = 0;
        while (from < s->text_n && from < s->prefix_n && s->text[from] == s->prefix[from]) from++;
        while (from > 0 && ((uint8_t)s->text[from] & 0xC0) == 0x80) from--;
    }
    if (s->text_n <= from) return "";
    *len = s->text_n - from;
    size_t k = s->win.n - 1;
    if (t->flags) {
        while (k > 0 && (uint32_t)s->win.ids[k] < (uint32_t)t->n_ids && (t->flags[s->win.ids[k]] & TF_BYTE)) k--;
    }
    memmove(s->win.ids, s->win.ids + k, (s->win.n - k) * sizeof(int32_t));
    s->win.n -= k;
    free(s->prefix);
    s->prefix = tokenizer_decode(t, s->win.ids, s->win.n, s->skip, &s->prefix_n);
    return s->text + from;
}

const char *tokstream_step(TokStream *s, int32_t id, size_t *len) {
    ids_push(&s->win, id);
    return stream_emit(s, len, 0);
}
const char *tokstream_flush(TokStream *s, size_t *len) {
    if (!s->win.n) {
        *len = 0;
        return "";
    }
    return stream_emit(s, len, 1);
}

// ================================================================ loading

typedef struct {
    Tokenizer *t;
    const char *path;
    char *err;
    size_t errlen;
} Loader;

__attribute__((format(printf, 2, 3))) static int fail(Loader *L, const char *fmt, ...) {
    if (L->err[0]) return -1;  // keep the first message
    int k = snprintf(L->err, L->errlen, "%s: ", L->path);
    if (k < 0 || (size_t)k >= L->errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err + k, L->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

// Refuses keys we do not know: they might change what the tokenizer does.
static int check_keys(Loader *L, json_t *o, const char *what, const char *const *known) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (const char *const *q = known; *q; q++) ok |= strcmp(*q, k) == 0;
        if (!ok) return fail(L, "%s: key \"%s\" is not supported", what, k);
    }
    return 0;
}

static const char *jtype(json_t *o) {
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "(no type)";
}

static int get_bool(Loader *L, json_t *o, const char *key, int dflt, int *out, const char *what) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return fail(L, "%s: \"%s\" must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

// {"String": s} -> s (a literal); {"Regex": r} -> regex_out (when allowed).
static int get_pattern(Loader *L, json_t *o, const char *what, Span *lit, regex_t **re) {
    json_t *p = json_object_get(o, "pattern");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) {
        if (json_string_length(s) == 0) return fail(L, "%s: empty String pattern is not supported", what);
        *lit = arena_add(L->t, json_string_value(s), json_string_length(s));
        return 0;
    }
    if (json_is_string(r) && re) {
        const UChar *pat = (const UChar *)json_string_value(r);
        OnigErrorInfo einfo;
        int rc = onig_new(re, pat, pat + json_string_length(r), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &einfo);
        if (rc != ONIG_NORMAL) {
            UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
            onig_error_code_to_str(msg, rc, &einfo);
            *re = NULL;
            return fail(L, "%s: Oniguruma rejects the regex: %s", what, (const char *)msg);
        }
        return 0;
    }
    if (json_is_string(r)) return fail(L, "%s: Regex patterns are not supported here (only String)", what);
    return fail(L, "%s: \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}", what);
}

static int parse_normalizer(Loader *L, json_t *o) {
    Tokenizer *t = L->t;
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (t->n_norm >= MAX_STEPS) return fail(L, "normalizer: more than %d steps", MAX_STEPS);
    NormStep *st = &t->norm[t->n_norm];
    if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "normalizers", NULL};
        if (check_keys(L, o, "normalizer Sequence", k)) return -1;
        json_t *arr = json_object_get(o, "normalizers"), *v;
        size_t i;
        json_array_foreach(arr, i, v) if (parse_normalizer(L, v)) return -1;
        return 0;
    }
    if (!strcmp(ty, "NFC")) {
        static const char *const k[] = {"type", NULL};
        if (check_keys(L, o, "normalizer NFC", k)) return -1;
        st->kind = NORM_NFC;
    } else if (!strcmp(ty, "Prepend")) {
        static const char *const k[] = {"type", "prepend", NULL};
        json_t *p = json_object_get(o, "prepend");
        if (check_keys(L, o, "normalizer Prepend", k)) return -1;
        if (!json_is_string(p)) return fail(L, "normalizer Prepend: \"prepend\" must be a string");
        st->kind = NORM_PREPEND;
        st->a = arena_add(t, json_string_value(p), json_string_length(p));
    } else if (!strcmp(ty, "Replace")) {
        static const char *const k[] = {"type", "pattern", "content", NULL};
        json_t *c = json_object_get(o, "content");
        if (check_keys(L, o, "normalizer Replace", k)) return -1;
        if (!json_is_string(c)) return fail(L, "normalizer Replace: \"content\" must be a string");
        st->kind = NORM_REPLACE;
        if (get_pattern(L, o, "normalizer Replace", &st->a, NULL)) return -1;
        st->b = arena_add(t, json_string_value(c), json_string_length(c));
    } else {
        return fail(L, "normalizer \"%s\" is not supported (supported: NFC, Prepend, Replace, Sequence)", ty);
    }
    t->n_norm++;
    return 0;
}

// Metaspace, the pre-tokenizer and the decoder alike (HF deserializes both the same way):
// "replacement" (one character), "prepend_scheme" ("always" when absent), "split" (true when
// absent), the old "add_prefix_space" (false only together with prepend_scheme "never", as
// HF demands) and the old, unused "str_rep".
static int parse_metaspace(Loader *L, json_t *o, const char *what, Span *rep, int *scheme, int *split) {
    static const char *const k[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep", NULL};
    if (check_keys(L, o, what, k)) return -1;
    json_t *r = json_object_get(o, "replacement"), *ps = json_object_get(o, "prepend_scheme");
    uint32_t cp;
    if (!json_is_string(r) || json_string_length(r) == 0 ||
        utf8_next((const uint8_t *)json_string_value(r), json_string_length(r), &cp) != (int)json_string_length(r))
        return fail(L, "%s: \"replacement\" must be one character", what);
    *rep = arena_add(L->t, json_string_value(r), json_string_length(r));
    *scheme = PREPEND_ALWAYS;
    if (ps) {
        const char *v = json_string_value(ps);
        if (v && !strcmp(v, "always")) *scheme = PREPEND_ALWAYS;
        else if (v && !strcmp(v, "first")) *scheme = PREPEND_FIRST;
        else if (v && !strcmp(v, "never")) *scheme = PREPEND_NEVER;
        else return fail(L, "%s: \"prepend_scheme\" must be \"always\", \"first\" or \"never\"", what);
    }
    int aps = 1;
    if (get_bool(L, o, "add_prefix_space", 1, &aps, what) || get_bool(L, o, "split", 1, split, what)) return -1;
    if (!aps && *scheme != PREPEND_NEVER)
        return fail(L, "%s: add_prefix_space false does not match prepend_scheme (HF refuses it too)", what);
    json_t *sr = json_object_get(o, "str_rep");
    if (sr && !json_is_null(sr) && !json_is_string(sr)) return fail(L, "%s: \"str_rep\" must be a string", what);
    return 0;
}

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pretok(Loader *L, json_t *o) {
    Tokenizer *t = L->t;
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (t->n_pre >= MAX_STEPS) return fail(L, "pre_tokenizer: more than %d steps", MAX_STEPS);
    PreStep *st = &t->pre[t->n_pre];
    memset(st, 0, sizeof *st);
    if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "pretokenizers", NULL};
        if (check_keys(L, o, "pre_tokenizer Sequence", k)) return -1;
        json_t *arr = json_object_get(o, "pretokenizers"), *v;
        size_t i;
        json_array_foreach(arr, i, v) if (parse_pretok(L, v)) return -1;
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        static const char *const k[] = {"type", "pattern", "behavior", "invert", NULL};
        if (check_keys(L, o, "pre_tokenizer Split", k)) return -1;
        const char *beh = json_string_value(json_object_get(o, "behavior"));
        if (!beh || (strcmp(beh, "Isolated") && strcmp(beh, "Removed")))
            return fail(L, "pre_tokenizer Split: behavior \"%s\" is not supported (supported: Isolated, Removed)",
                        beh ? beh : "(missing)");
        st->kind = PRE_SPLIT;
        st->removed = !strcmp(beh, "Removed");
        if (get_bool(L, o, "invert", 0, &st->invert, "pre_tokenizer Split")) return -1;
        if (get_pattern(L, o, "pre_tokenizer Split", &st->lit, &st->re)) return -1;
    } else if (!strcmp(ty, "ByteLevel")) {
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        if (check_keys(L, o, "pre_tokenizer ByteLevel", k)) return -1;
        int use_regex = 1;
        st->kind = PRE_BYTELEVEL;
        if (get_bool(L, o, "add_prefix_space", 1, &st->prefix_space, "pre_tokenizer ByteLevel")) return -1;
        if (get_bool(L, o, "use_regex", 1, &use_regex, "pre_tokenizer ByteLevel")) return -1;
        if (use_regex) {
            OnigErrorInfo einfo;
            const UChar *p = (const UChar *)GPT2_REGEX;
            if (onig_new(&st->re, p, p + strlen(GPT2_REGEX), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                         ONIG_SYNTAX_DEFAULT, &einfo) != ONIG_NORMAL)
                return fail(L, "pre_tokenizer ByteLevel: cannot compile the GPT-2 regex");
        }
        t->byte_level = 1;
    } else if (!strcmp(ty, "Metaspace")) {
        st->kind = PRE_METASPACE;
        if (parse_metaspace(L, o, "pre_tokenizer Metaspace", &st->lit, &st->scheme, &st->split)) return -1;
    } else {
        return fail(L, "pre_tokenizer \"%s\" is not supported (supported: Split, ByteLevel, Metaspace, Sequence)", ty);
    }
    if (st->re) st->region = onig_region_new();
    t->n_pre++;
    return 0;
}

static int parse_decoder(Loader *L, json_t *o) {
    Tokenizer *t = L->t;
    if (!o || json_is_null(o)) return 0;
    t->has_decoder = 1;
    const char *ty = jtype(o);
    if (t->n_dec >= MAX_STEPS) return fail(L, "decoder: more than %d steps", MAX_STEPS);
    DecStep *st = &t->dec[t->n_dec];
    memset(st, 0, sizeof *st);
    if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "decoders", NULL};
        if (check_keys(L, o, "decoder Sequence", k)) return -1;
        json_t *arr = json_object_get(o, "decoders"), *v;
        size_t i;
        json_array_foreach(arr, i, v) if (parse_decoder(L, v)) return -1;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        if (check_keys(L, o, "decoder ByteLevel", k)) return -1;
        st->kind = DEC_BYTELEVEL;
    } else if (!strcmp(ty, "Replace")) {
        static const char *const k[] = {"type", "pattern", "content", NULL};
        json_t *c = json_object_get(o, "content");
        if (check_keys(L, o, "decoder Replace", k)) return -1;
        if (!json_is_string(c)) return fail(L, "decoder Replace: \"content\" must be a string");
        st->kind = DEC_REPLACE;
        if (get_pattern(L, o, "decoder Replace", &st->a, NULL)) return -1;
        st->b = arena_add(t, json_string_value(c), json_string_length(c));
    } else if (!strcmp(ty, "ByteFallback")) {
        static const char *const k[] = {"type", NULL};
        if (check_keys(L, o, "decoder ByteFallback", k)) return -1;
        st->kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(ty, "Fuse")) {
        static const char *const k[] = {"type", NULL};
        if (check_keys(L, o, "decoder Fuse", k)) return -1;
        st->kind = DEC_FUSE;
    } else if (!strcmp(ty, "Strip")) {
        static const char *const k[] = {"type", "content", "start", "stop", NULL};
        if (check_keys(L, o, "decoder Strip", k)) return -1;
        json_t *c = json_object_get(o, "content");
        uint32_t cp;
        if (!json_is_string(c) || json_string_length(c) == 0 ||
            utf8_next((const uint8_t *)json_string_value(c), json_string_length(c), &cp) !=
                (int)json_string_length(c))
            return fail(L, "decoder Strip: \"content\" must be one character");
        st->kind = DEC_STRIP;
        st->cp = cp;
        st->start = (int)json_integer_value(json_object_get(o, "start"));
        st->stop = (int)json_integer_value(json_object_get(o, "stop"));
    } else if (!strcmp(ty, "Metaspace")) {
        int scheme, split;
        st->kind = DEC_METASPACE;
        if (parse_metaspace(L, o, "decoder Metaspace", &st->a, &scheme, &split)) return -1;
        st->start = scheme != PREPEND_NEVER;
    } else {
        return fail(L, "decoder \"%s\" is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)", ty);
    }
    t->n_dec++;
    return 0;
}

static int parse_post(Loader *L, json_t *o) {
    Tokenizer *t = L->t;
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "processors", NULL};
        if (check_keys(L, o, "post_processor Sequence", k)) return -1;
        json_t *arr = json_object_get(o, "processors"), *v;
        size_t i;
        json_array_foreach(arr, i, v) if (parse_post(L, v)) return -1;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) return 0;  // only trims offsets; ids unchanged
    if (strcmp(ty, "TemplateProcessing"))
        return fail(L, "post_processor \"%s\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence)", ty);
    static const char *const k[] = {"type", "single", "pair", "special_tokens", NULL};
    if (check_keys(L, o, "post_processor TemplateProcessing", k)) return -1;
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens"), *it;
    size_t i;
    int seen_a = 0;
    t->tmpl_pre.n = t->tmpl_post.n = 0;
    json_array_foreach(single, i, it) {
        json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        if (sq) {
            const char *which = json_string_value(json_object_get(sq, "id"));
            if (!which || strcmp(which, "A") || seen_a)
                return fail(L, "post_processor TemplateProcessing: \"single\" must hold sequence A once");
            seen_a = 1;
        } else if (sp) {
            const char *name = json_string_value(json_object_get(sp, "id"));
            json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *x;
            if (!json_is_array(ids))
                return fail(L, "post_processor TemplateProcessing: special token \"%s\" has no ids", name ? name : "?");
            size_t j;
            json_array_foreach(ids, j, x) {
                json_int_t id = json_integer_value(x);
                if (!json_is_integer(x) || id < 0 || id >= t->n_ids)
                    return fail(L, "post_processor TemplateProcessing: bad id for \"%s\"", name);
                ids_push(seen_a ? &t->tmpl_post : &t->tmpl_pre, (int32_t)id);
            }
        } else {
            return fail(L, "post_processor TemplateProcessing: unknown item in \"single\"");
        }
    }
    if (!seen_a) return fail(L, "post_processor TemplateProcessing: \"single\" has no sequence A");
    return 0;
}

static int parse_model(Loader *L, json_t *m) {
    Tokenizer *t = L->t;
    if (!json_is_object(m)) return fail(L, "no \"model\" object");
    if (strcmp(jtype(m), "BPE")) return fail(L, "model \"%s\" is not supported (supported: BPE)", jtype(m));
    static const char *const k[] = {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                    "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges", NULL};
    if (check_keys(L, m, "model BPE", k)) return -1;
    json_t *d = json_object_get(m, "dropout");
    if (d && !json_is_null(d) && json_number_value(d) != 0.0) return fail(L, "model BPE: dropout is not supported");
    const char *pk[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(m, pk[i]);
        if (v && !json_is_null(v) && (!json_is_string(v) || json_string_length(v)))
            return fail(L, "model BPE: a non-empty %s is not supported", pk[i]);
    }
    if (get_bool(L, m, "fuse_unk", 0, &t->fuse_unk, "model BPE") ||
        get_bool(L, m, "byte_fallback", 0, &t->byte_fallback, "model BPE") ||
        get_bool(L, m, "ignore_merges", 0, &t->ignore_merges, "model BPE"))
        return -1;
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return fail(L, "model BPE: \"vocab\" must be an object");
    return 0;
}

static int load_tokens(Loader *L, json_t *root) {
    Tokenizer *t = L->t;
    json_t *m = json_object_get(root, "model"), *vocab = json_object_get(m, "vocab"), *added = json_object_get(root, "added_tokens");
    const char *key;
    json_t *v;
    int64_t max_id = -1;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7FFFFFF)
            return fail(L, "model vocab: id of \"%s\" is not a valid integer", key);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t i;
    if (added && !json_is_array(added)) return fail(L, "\"added_tokens\" must be an array");
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 0x7FFFFFF)
            return fail(L, "added_tokens[%zu]: bad id", i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    t->n_ids = (int32_t)(max_id + 1);
    t->str = xmalloc((size_t)t->n_ids * sizeof(Span));
    t->key = xmalloc((size_t)t->n_ids * sizeof(Span));
    t->flags = xcalloc((size_t)t->n_ids, 1);
    for (int32_t j = 0; j < t->n_ids; j++) t->str[j].len = t->key[j].len = NO_SPAN;
    size_t nv = json_object_size(vocab), cap = 16;
    while (cap < 2 * nv + 16) cap *= 2;
    t->vmap = xmalloc(cap * sizeof(int32_t));
    t->vmap_h = xmalloc(cap * sizeof(uint32_t));
    memset(t->vmap, 0xFF, cap * sizeof(int32_t));
    t->vmap_mask = cap - 1;
    json_object_foreach(vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        size_t n = strlen(key);
        t->str[id] = arena_add(t, key, n);
        t->flags[id] |= TF_VOCAB;
        if (t->byte_level) {
            t->tmp.n = 0;
            if (bytelevel_to_raw(&t->tmp, key, n))
                t->key[id] = arena_add(t, t->tmp.p, t->tmp.n);
            else
                t->key[id] = t->str[id];
        } else {
            t->key[id] = t->str[id];
        }
        vmap_put(t, id);
    }
    t->added = xcalloc(json_array_size(added) + 1, sizeof(Added));
    json_array_foreach(added, i, v) {
        static const char *const k[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special", NULL};
        char what[64];
        snprintf(what, sizeof what, "added_tokens[%zu]", i);
        if (check_keys(L, v, what, k)) return -1;
        json_t *c = json_object_get(v, "content");
        if (!json_is_string(c) || json_string_length(c) == 0) return fail(L, "%s: \"content\" must be a non-empty string", what);
        Added *a = &t->added[t->n_added++];
        int b[5] = {0};
        if (get_bool(L, v, "single_word", 0, &b[0], what) || get_bool(L, v, "lstrip", 0, &b[1], what) ||
            get_bool(L, v, "rstrip", 0, &b[2], what) || get_bool(L, v, "normalized", 0, &b[3], what) ||
            get_bool(L, v, "special", 0, &b[4], what))
            return -1;
        a->single_word = (uint8_t)b[0];
        a->lstrip = (uint8_t)b[1];
        a->rstrip = (uint8_t)b[2];
        a->normalized = (uint8_t)b[3];
        a->special = (uint8_t)b[4];
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->content = a->pat = arena_add(t, json_string_value(c), json_string_length(c));
    }
    return 0;
}

static int load_merges(Loader *L, json_t *merges) {
    Tokenizer *t = L->t;
    if (!json_is_array(merges)) return fail(L, "model BPE: \"merges\" must be an array");
    size_t n = json_array_size(merges), cap = 16;
    while (cap < 2 * n + 16) cap *= 2;
    t->mkey = xmalloc(cap * sizeof(uint64_t));
    t->mrank = xmalloc(cap * sizeof(uint32_t));
    t->mnew = xmalloc(cap * sizeof(int32_t));
    memset(t->mkey, 0xFF, cap * sizeof(uint64_t));
    t->mmask = cap - 1;
    size_t i;
    json_t *v;
    uint32_t rank = 0;
    Buf ab = {0};
    json_array_foreach(merges, i, v) {
        const char *a, *b;
        size_t an, bn;
        char *dup = NULL;
        if (json_is_string(v)) {  // "a b"; HF skips "#version" lines and wants exactly one space
            const char *s = json_string_value(v);
            if (!strncmp(s, "#version", 8)) continue;
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                buf_free(&ab);
                return fail(L, "merges[%zu] \"%s\" is not two tokens separated by one space", i, s);
            }
            dup = strdup(s);
            a = dup;
            an = (size_t)(sp - s);
            b = dup + an + 1;
            bn = strlen(b);
            dup[an] = 0;
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                   json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            an = strlen(a);
            bn = strlen(b);
        } else {
            buf_free(&ab);
            return fail(L, "merges[%zu] must be \"a b\" or [\"a\", \"b\"]", i);
        }
        ab.n = 0;
        buf_put(&ab, a, an);
        buf_put(&ab, b, bn);
        int32_t ia = vocab_lookup(t, a, an), ib = vocab_lookup(t, b, bn), iab = vocab_lookup(t, ab.p, ab.n);
        if (ia < 0 || ib < 0 || iab < 0) {
            int rc = fail(L, "merges[%zu] (\"%s\" \"%s\"): \"%s\" is not in the vocab", i, a, b,
                          ia < 0 ? a : ib < 0 ? b : ab.p);
            free(dup);
            buf_free(&ab);
            return rc;
        }
        free(dup);
        merge_put(t, ia, ib, rank++, iab);
    }
    buf_free(&ab);
    return 0;
}

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
static int32_t config_token(Tokenizer *t, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    return tokenizer_token_id(t, json_string_value(v));
}

static int load_config(Loader *L) {
    Tokenizer *t = L->t;
    size_t n = strlen(L->path);
    const char *suf = "tokenizer.json";
    size_t sn = strlen(suf);
    if (n < sn || strcmp(L->path + n - sn, suf)) return 0;
    char *cp = xmalloc(n + 16);
    memcpy(cp, L->path, n - sn);
    strcpy(cp + n - sn, "tokenizer_config.json");
    FILE *f = fopen(cp, "rb");
    if (!f) {
        free(cp);
        return 0;
    }
    fclose(f);
    json_error_t jerr;
    json_t *cfg = json_load_file(cp, JSON_DECODE_INT_AS_REAL, &jerr);  // model_max_length can exceed int64
    if (!cfg) {
        int rc = fail(L, "%s line %d: %s", cp, jerr.line, jerr.text);
        free(cp);
        return rc;
    }
    free(cp);
    t->bos_id = config_token(t, cfg, "bos_token");
    t->eos_id = config_token(t, cfg, "eos_token");
    t->add_bos = json_is_true(json_object_get(cfg, "add_bos_token"));
    json_decref(cfg);
    return 0;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (int k = 0; k < t->n_pre; k++) {
        if (t->pre[k].re) onig_free(t->pre[k].re);
        if (t->pre[k].region) onig_region_free(t->pre[k].region, 1);
        buf_free(&t->pre[k].buf);
    }
    buf_free(&t->arena);
    free(t->str);
    free(t->key);
    free(t->flags);
    free(t->vmap);
    free(t->vmap_h);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    free(t->added);
    tokids_free(&t->tmpl_pre);
    tokids_free(&t->tmpl_post);
    buf_free(&t->nbuf[0]);
    buf_free(&t->nbuf[1]);
    buf_free(&t->tmp);
    free(t->hprev);
    free(t->hnext);
    free(t->heap);
    free(t->cache);
    buf_free(&t->ckeys);
    tokids_free(&t->cids);
    free(t);
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen) {
    pthread_once(&g_once, global_init);
    char dummy[8];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = 0;
    Tokenizer *t = xcalloc(1, sizeof *t);
    t->unk_id = t->bos_id = t->eos_id = -1;
    Loader L = {t, path, err, errlen};
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        fail(&L, "line %d: %s", jerr.line, jerr.text);
        tokenizer_free(t);
        return NULL;
    }
    static const char *const top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                      "pre_tokenizer", "model", "post_processor", "decoder", NULL};
    int rc = check_keys(&L, root, "tokenizer.json", top);
    const char *tp[] = {"truncation", "padding"};
    for (int i = 0; i < 2 && !rc; i++) {
        json_t *v = json_object_get(root, tp[i]);
        if (v && !json_is_null(v)) rc = fail(&L, "%s is not supported (must be null)", tp[i]);
    }
    // the pre-tokenizer first: it says whether the vocabulary is byte-level
    if (!rc) rc = parse_pretok(&L, json_object_get(root, "pre_tokenizer"));
    for (int k = 0; !rc && k < t->n_pre; k++)
        if (t->pre[k].kind == PRE_METASPACE && t->byte_level)
            rc = fail(&L, "pre_tokenizer: Metaspace together with ByteLevel is not supported");
    if (!rc) rc = parse_model(&L, json_object_get(root, "model"));
    if (!rc) rc = load_tokens(&L, root);
    if (!rc) rc = load_merges(&L, json_object_get(json_object_get(root, "model"), "merges"));
    if (!rc) rc = parse_normalizer(&L, json_object_get(root, "normalizer"));
    if (!rc) rc = parse_decoder(&L, json_object_get(root, "decoder"));
    if (!rc) {
        // added tokens: their flags, their strings for decode, what is matched
        for (int i = 0; i < t->n_added; i++) {
            Added *a = &t->added[i];
            t->flags[a->id] |= TF_ADDED | (a->special ? TF_SPECIAL : 0);
            t->str[a->id] = a->content;
            if (a->normalized && t->n_norm) {  // matched (and decoded) in normalized form
                size_t nn;
                const char *ns = normalize(t, A(t, a->content), a->content.len, &nn);
                t->tmp.n = 0;
                buf_put(&t->tmp, ns, nn);
                a->pat = arena_add(t, t->tmp.p, t->tmp.n);
                t->str[a->id] = a->pat;
                if (!a->pat.len) rc = fail(&L, "added token \"%s\" normalizes to nothing", A(t, a->content));
            }
            int kind = a->normalized ? 1 : 0;
            t->first[kind][(uint8_t)A(t, a->pat)[0]] = 1;
            t->n_kind[kind]++;
        }
    }
    if (!rc) {
        // Metaspace "first" needs each piece's offset in the original text. Pieces between
        // normalized added tokens are cut from the normalized text; with NFC (or nothing)
        // normalized offset 0 is original offset 0, but Prepend/Replace can map several
        // leading characters to original offset 0. Refused rather than approximated.
        int first = 0, other_norm = 0;
        for (int k = 0; k < t->n_pre; k++) first |= t->pre[k].kind == PRE_METASPACE && t->pre[k].scheme == PREPEND_FIRST;
        for (int k = 0; k < t->n_norm; k++) other_norm |= t->norm[k].kind != NORM_NFC;
        if (first && other_norm && t->n_kind[1])
            rc = fail(&L, "pre_tokenizer Metaspace prepend_scheme \"first\" with a Prepend/Replace normalizer "
                          "and normalized added tokens is not supported");
    }
    if (!rc) rc = parse_post(&L, json_object_get(root, "post_processor"));
    if (!rc) {
        json_t *m = json_object_get(root, "model");
        json_t *unk = json_object_get(m, "unk_token");
        if (json_is_string(unk)) {
            t->unk_id = vocab_lookup(t, json_string_value(unk), json_string_length(unk));
            if (t->unk_id < 0) rc = fail(&L, "model BPE: unk_token \"%s\" is not in the vocab", json_string_value(unk));
        }
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->fallback_id[b] = vmap_get(t, name, 6);
            char c = (char)b;
            t->byte_id[b] = t->byte_level ? vmap_get(t, &c, 1) : -1;
        }
    }
    for (int k = 0; !rc && k < t->n_dec; k++) {
        if (t->dec[k].kind != DEC_BYTEFALLBACK) continue;
        for (int32_t id = 0; id < t->n_ids; id++) {
            if (t->str[id].len == NO_SPAN) continue;
            Buf b = {(char *)A(t, t->str[id]), t->str[id].len, 0};
            if (byte_token(&b) >= 0) t->flags[id] |= TF_BYTE;
        }
    }
    if (!rc && !t->byte_level && !t->ignore_merges) {
        t->meta_split = vmap_get(t, META, 3) >= 0;
        for (int32_t id = 0; id < t->n_ids && t->meta_split; id++) {
            if (t->key[id].len == NO_SPAN) continue;
            const char *k = A(t, t->key[id]);
            size_t n = t->key[id].len, i = 0;
            while (i + 3 <= n && memcmp(k + i, META, 3) == 0) i += 3;
            if (i < n && memmem(k + i, n - i, META, 3)) t->meta_split = 0;
        }
    }
    if (!rc) rc = load_config(&L);
    json_decref(root);
    if (rc) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}
