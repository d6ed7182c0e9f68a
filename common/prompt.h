// prompt.h — the model directory's tokenizer, and turning a --prompt text into token ids.
// defines: tokenizer_for_model, prompt_to_ids, text_printable, fput_printable, model_eos_ids
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "model.h"
#include "tokenizer.h"
#ifdef __cplusplus
extern "C" {
#endif

// DIR/tokenizer.json. required (--prompt needs it): a missing or broken file exits with one
// line that says which (a broken one with the parse error). Not required (it only shows token
// text): NULL silently when absent, NULL and a one-line warning with the parse error when broken.
// `path` receives DIR/tokenizer.json for messages.
Tokenizer *tokenizer_for_model(const char *model_dir, int required, char *path, size_t pathlen);
// Encode `text` with special tokens (BOS as the tokenizer's post-processor adds it) into a
// malloc'ed id array; exits with a message when there is no tokenizer or no tokens.
int *prompt_to_ids(Tokenizer *tok, const char *tok_path, const char *text, int *n);
// Token text made safe for a terminal: control bytes (a random-weight model emits plenty) become
// \n, \t, \r and \xNN; every other byte (UTF-8 included) is kept. text_printable writes a
// NUL-terminated string into dst (cut at cap); fput_printable streams to f.
void text_printable(char *dst, size_t cap, const char *s, size_t n);
void fput_printable(const char *s, size_t n, FILE *f);
// The model's EOS ids (at most max) into eos: generation_config.json's eos_token_id (an integer or
// a list) when the file has one, else config.json's. A generation_config.json that does not parse,
// or an EOS id outside the vocabulary, exits with a message (a silently ignored EOS would generate
// past the end). Returns how many.
int model_eos_ids(const char *dir, const ModelConfig *c, int *eos, int max);

#ifdef __cplusplus
}
#endif
