// tokenizer.h — a Hugging Face tokenizer.json in C, giving the same ids as HF `tokenizers`.
// defines: Tokenizer, TokIds, TokStream, tokenizer_load, tokenizer_free, tokenizer_encode,
//          tokenizer_decode, tokenizer_piece, tokenizer_token_id, tokenizer_vocab_size,
//          tokenizer_is_special, tokenizer_bos_id, tokenizer_eos_id, tokenizer_add_bos,
//          tokenizer_error, tokids_free, tokstream_new, tokstream_step, tokstream_flush,
//          tokstream_free
//
// Two families of BPE are implemented (common/TOKENIZER.md explains how BPE works):
//   - byte-level BPE (GPT-2, Llama-3, Qwen2/3): NFC, the file's Split regex (Oniguruma),
//     the ByteLevel byte->character mapping, merges, ignore_merges;
//   - SentencePiece-style BPE (Llama-2, TinyLlama, Mistral): Prepend/Replace "▁" normalizers
//     or the Metaspace pre-tokenizer (prepend_scheme always/first/never, split) and decoder,
//     byte_fallback <0xNN>, fuse_unk.
// Added/special tokens are split out of the text first; TemplateProcessing adds BOS when asked.
// Anything in tokenizer.json that is not implemented is refused by tokenizer_load with a
// message naming it; nothing is silently approximated.
//
//   char err[256];
//   Tokenizer *t = tokenizer_load("model/tokenizer.json", err, sizeof err);
//   if (!t) die("%s", err);
//   TokIds ids = {0};
//   if (tokenizer_encode(t, text, strlen(text), 1, &ids) != 0) die("%s", tokenizer_error(t));
//   char *s = tokenizer_decode(t, ids.ids, ids.n, 0, NULL);
//
// A Tokenizer is not thread-safe for encode (it keeps a word cache and scratch buffers);
// use one per thread. decode and the lookups are read-only.
#pragma once
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct Tokenizer Tokenizer;

// A growable list of token ids; encode appends to it. Zero-initialize before first use.
typedef struct {
    int32_t *ids;
    size_t n, cap;
} TokIds;
void tokids_free(TokIds *v);

// Loads tokenizer.json; also reads the tokenizer_config.json beside it when present
// ("x/tokenizer.json" -> "x/tokenizer_config.json", "x/name-tokenizer.json" ->
// "x/name-tokenizer_config.json") for bos_token, eos_token, add_bos_token.
// Returns NULL and writes a one-line message into err on any problem.
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);

// Appends the ids of text[0..len) to out. add_special: also add the post-processor's
// special tokens (BOS for Llama-2 style tokenizers), as HF's add_special_tokens=True.
// Special tokens written in the text (e.g. "<|im_start|>") are always recognized, as in HF.
// Returns 0, or -1 for text that is not valid UTF-8 (tokenizer_error says where).
int tokenizer_encode(Tokenizer *t, const char *text, size_t len, int add_special, TokIds *out);
// The message of the last failed call on t ("" if none).
const char *tokenizer_error(const Tokenizer *t);

// Decodes ids to a malloc'ed, NUL-terminated UTF-8 string (caller frees); *out_len (if not
// NULL) gets its length. Ids with no token are skipped; so are special tokens when
// skip_special. Invalid byte sequences become U+FFFD exactly as HF does.
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                       size_t *out_len);

// The token's string as written in tokenizer.json (byte-level tokens show as e.g. "Ġthe"),
// NULL if the id has no token.
const char *tokenizer_piece(const Tokenizer *t, int32_t id);
// Id of a token string as written in tokenizer.json (added tokens first), -1 if none.
int32_t tokenizer_token_id(const Tokenizer *t, const char *piece);
// 1 + the largest id.
int32_t tokenizer_vocab_size(const Tokenizer *t);
int tokenizer_is_special(const Tokenizer *t, int32_t id);
// From tokenizer_config.json (or -1 / 0 when absent).
int32_t tokenizer_bos_id(const Tokenizer *t);
int32_t tokenizer_eos_id(const Tokenizer *t);
int tokenizer_add_bos(const Tokenizer *t);

// Streaming decoder for generated tokens: each step returns the text that became final
// with this id (never an incomplete UTF-8 sequence; "" while waiting for more bytes).
// The returned pointer is valid until the next call. flush returns whatever is pending.
typedef struct TokStream TokStream;
TokStream *tokstream_new(const Tokenizer *t, int skip_special);
const char *tokstream_step(TokStream *s, int32_t id, size_t *len);
const char *tokstream_flush(TokStream *s, size_t *len);
void tokstream_free(TokStream *s);

// For tests: words longer than this use the heap merge, shorter ones the O(n^2) loop
// (both must give the same ids). Default 48.
extern int tokenizer_small_word_max;
// For tests: 0 disables the word cache.
extern int tokenizer_use_cache;

#ifdef __cplusplus
}
#endif
