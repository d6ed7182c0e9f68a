// chat_template.h — a model's chat template (Jinja, from tokenizer_config.json) rendered in C.
// defines: ChatMessage, ChatTemplate, chat_template_render, chat_template_load,
//          chat_template_parse_config, chat_template_free, chat_template_fixed_time
//
// A Hugging Face chat model says how a conversation becomes its prompt with a Jinja template
// (`chat_template` in tokenizer_config.json). transformers renders it in
// apply_chat_template(messages, add_generation_prompt=True) with jinja2's sandbox, trim_blocks and
// lstrip_blocks on, `messages`, `add_generation_prompt`, `tools` and `documents` (None), the
// tokenizer's special tokens (`bos_token`, `eos_token`), a `tojson` filter that is Python's
// json.dumps(ensure_ascii=False), and the globals raise_exception(msg) and strftime_now(fmt).
// chat_template.c renders the subset of Jinja that real chat templates use, with the same output
// byte for byte (final/README.md lists the subset; tests/test_chat_template.c compares against
// what transformers' apply_chat_template gives for Llama-3.1/3.2's, Qwen2.5's and Qwen3's own
// templates and more, tools/make_chat_goldens.py).
//
//   ChatTemplate ct;
//   if (chat_template_load(model_dir, &ct, err, sizeof err) != 0) die("%s", err);
//   ChatMessage m = {"user", "Hello!"};
//   char *text = chat_template_render(ct.text, &m, 1, 1, ct.bos_token, ct.eos_token, err, sizeof err);
//   if (!text) die("%s: %s", ct.source, err);
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

// One message of the conversation: role ("system", "user", "assistant", ...) and its text.
// content NULL (an assistant message that only calls tools) leaves the key out of the message, as
// transformers 5 drops the keys whose value is None: `message.content` is undefined, not None.
typedef struct {
    const char *role;
    const char *content;
} ChatMessage;

// The template text rendered for messages[0..n) (`messages` in the template), with
// `add_generation_prompt` and `bos_token` / `eos_token` (NULL: undefined, as when the tokenizer has
// none). Returns the text (malloc'ed, NUL-terminated; caller frees), or NULL with a one-line
// message in err: a syntax error with its line and column and what was found there, an error
// while rendering with the line and column of the expression, or the template's own
// raise_exception message.
char *chat_template_render(const char *tmpl, const ChatMessage *msgs, int n, int add_generation_prompt,
                           const char *bos_token, const char *eos_token, char *err, size_t errlen);

// A model's chat template and the special tokens it uses.
typedef struct {
    char *text;                  // the Jinja source
    char *bos_token, *eos_token; // NULL when tokenizer_config.json has none
    char source[1100];           // where text came from (for messages)
} ChatTemplate;

// From a model directory (or a tokenizer_config.json file): DIR/chat_template.jinja when it exists
// (newer transformers save the template there, and it takes precedence), else `chat_template` of
// DIR/tokenizer_config.json: a string, or a list of {"name", "template"} of which the one named
// "default" is taken. bos_token / eos_token: strings or {"content": ...} objects. Returns 0, or -1
// with a message naming the file (no template at all, unreadable JSON, a field of the wrong type).
int chat_template_load(const char *path, ChatTemplate *ct, char *err, size_t errlen);
// The same from tokenizer_config.json's text; src names it in messages and in ct->source.
int chat_template_parse_config(const char *json_text, const char *src, ChatTemplate *ct, char *err, size_t errlen);
void chat_template_free(ChatTemplate *ct);

// For tests: when nonzero, strftime_now formats this time (seconds since 1970, UTC) instead of
// the local clock, so a template that prints today's date renders the same every day.
extern long long chat_template_fixed_time;

#ifdef __cplusplus
}
#endif
