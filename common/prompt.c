// prompt.c — see prompt.h.
#include "prompt.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
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

// EOS ids: generation_config.json's eos_token_id (int or list) when present, else config.json's.
// A generation_config.json that exists but does not parse, or an EOS id that is not an id of
// the vocabulary, is an error (a silently ignored EOS would generate past the end).
int model_eos_ids(const char *dir, const ModelConfig *c, int *eos, int max) {
    char p[1100];
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    int n = 0;
    FILE *f = fopen(p, "rb");
    if (f) {
        fclose(f);
        json_error_t je;
        json_t *g = json_load_file(p, 0, &je);
        if (!g) die("%s: invalid JSON at line %d: %s", p, je.line, je.text);
        json_t *e = json_object_get(g, "eos_token_id");
        char bad[160] = "";  // the problem, if any (g is freed before exiting)
        if (json_is_integer(e) || json_is_array(e)) {
            size_t i, ne = json_is_array(e) ? json_array_size(e) : 1;
            if ((int)ne > max) snprintf(bad, sizeof bad, "eos_token_id has %zu ids (at most %d)", ne, max);
            for (i = 0; i < ne && !bad[0]; i++) {
                json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab) {
                    char *txt = json_dumps(v, JSON_ENCODE_ANY);
                    snprintf(bad, sizeof bad, "eos_token_id %.60s is not a token id in [0, %d)", txt ? txt : "?", c->vocab);
                    free(txt);
                } else {
                    eos[n++] = (int)json_integer_value(v);
                }
            }
        } else if (e && !json_is_null(e)) {
            snprintf(bad, sizeof bad, "eos_token_id must be an integer or a list of integers");
        }
        json_decref(g);
        if (bad[0]) die("%s: %s", p, bad);
    }
    if (n == 0)
        for (int i = 0; i < c->n_eos && n < max; i++) eos[n++] = c->eos_token_ids[i];
    return n;
}
