// prompt.c — see prompt.h.
#include "prompt.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

Tokenizer *tokenizer_for_model(const char *model_dir, int required, char *path, size_t pathlen) {
    char err[512];
    snprintf(path, pathlen, "%s/tokenizer.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (required) die("%s: cannot open (%s); --prompt needs the model's tokenizer.json", path, strerror(errno));
        return NULL;
    }
    fclose(f);
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok && required) die("broken or unsupported tokenizer: %s", err);
    if (!tok) fprintf(stderr, "warning: broken or unsupported tokenizer (token text not shown): %s\n", err);
    return tok;
}

int *prompt_to_ids(Tokenizer *tok, const char *tok_path, const char *text, int *n) {
    if (!tok) die("--prompt needs %s", tok_path);
    TokIds v = {0};
    if (tokenizer_encode(tok, text, strlen(text), 1, &v) != 0) die("--prompt: %s", tokenizer_error(tok));
    if (v.n == 0) die("--prompt: no tokens");
    *n = (int)v.n;
    int *ids = xmalloc(v.n * sizeof(int));
    for (size_t i = 0; i < v.n; i++) ids[i] = v.ids[i];
    tokids_free(&v);
    return ids;
}
