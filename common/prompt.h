// prompt.h — the model directory's tokenizer, and turning a --prompt text into token ids.
// defines: tokenizer_for_model, prompt_to_ids
#pragma once
#include <stddef.h>

#include "tokenizer.h"
#ifdef __cplusplus
extern "C" {
#endif

// DIR/tokenizer.json when it exists (a warning and NULL when it fails to load; NULL silently
// when absent). `path` receives DIR/tokenizer.json for messages.
Tokenizer *tokenizer_for_model(const char *model_dir, char *path, size_t pathlen);
// Encode `text` with special tokens (BOS as the tokenizer's post-processor adds it) into a
// malloc'ed id array; exits with a message when there is no tokenizer or no tokens.
int *prompt_to_ids(Tokenizer *tok, const char *tok_path, const char *text, int *n);

#ifdef __cplusplus
}
#endif
