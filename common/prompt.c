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

// The escape of one byte, or NULL when it prints as itself.
static const char *escape_byte(unsigned char c, char tmp[8]) {
    if (c == '\n') return "\\n";
    if (c == '\t') return "\\t";
    if (c == '\r') return "\\r";
    if (c < 0x20 || c == 0x7F) {
        snprintf(tmp, 8, "\\x%02X", c);
        return tmp;
    }
    return NULL;
}

void text_printable(char *dst, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    char tmp[8];
    if (!cap) return;
    for (size_t i = 0; i < n; i++) {
        const char *e = escape_byte((unsigned char)s[i], tmp);
        const size_t len = e ? strlen(e) : 1;
        if (k + len >= cap) break;
        if (e) memcpy(dst + k, e, len);
        else dst[k] = s[i];
        k += len;
    }
    dst[k] = 0;
}

void fput_printable(const char *s, size_t n, FILE *f) {
    char tmp[8];
    for (size_t i = 0; i < n; i++) {
        const char *e = escape_byte((unsigned char)s[i], tmp);
        if (e) fputs(e, f);
        else fputc(s[i], f);
    }
}
