// fuzz_chat_template.c — libFuzzer target for the chat-template renderer (common/chat_template.c)
// that `llm generate --chat` and `llm serve`'s /v1/chat/completions use. The input is the template;
// it is rendered for a fixed conversation, with and without the generation prompt. On anything,
// chat_template_render must return text (NUL-terminated, no longer than its limit) or NULL with a
// non-empty message (one line, but for raise_exception's, which is the template's own text), never
// crash, hang, leak or read outside its input. Seeds: the real
// templates of tests/data/chat_templates/ (macros, block sets, loops, namespaces).
//   make fuzz FUZZ_TARGETS=chat                   # FUZZ_SECONDS, default 60
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"

static void check(int ok) {
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *tmpl = malloc(size + 1);
    check(tmpl != NULL);
    memcpy(tmpl, data, size);
    tmpl[size] = 0;  // the template ends at the first NUL, as a C string does
    static const ChatMessage m[] = {{"system", "Be brief."}, {"user", "Hi {{ there }} 你好"}, {"assistant", NULL},
                                    {"tool", "42"}, {"user", ""}};
    chat_template_fixed_time = 1721995200;
    for (int gen = 0; gen < 2; gen++) {
        char err[512];
        err[0] = 0;
        char *out = chat_template_render(tmpl, m, 5, gen, "<s>", "</s>", err, sizeof err);
        if (out) {
            check(strlen(out) <= (size_t)64 << 20);
            free(out);
        } else {
            // one line, except raise_exception's message, which is the template's own text
            check(err[0] != 0 && memchr(err, 0, sizeof err) != NULL &&
                  (strchr(err, '\n') == NULL || strstr(err, "the template raised an error: ") != NULL));
        }
    }
    free(tmpl);
    return 0;
}
