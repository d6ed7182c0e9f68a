// test_chat_template.c — common/chat_template: chat templates rendered in C give, byte for byte,
// what transformers' apply_chat_template gives (tests/data/chat_templates/goldens.json, written by
// tools/make_chat_goldens.py: the own templates of Llama-3.1-8B-Instruct, Llama-3.2-3B-Instruct,
// Qwen2.5-7B-Instruct, Qwen3 and fifteen more (tests/data/chat_templates/README.md), and
// hand-written Llama-3, ChatML, Mistral and Zephyr layouts,
// over 18 conversations with and without the generation prompt; and one small template per Jinja
// feature); errors come back as messages, not crashes; tokenizer_config.json is read in its forms;
// and `llm generate --chat` renders and encodes the prompt.
#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "fs_util.h"
#include "golden_util.h"
#include "tokenizer.h"

#define CT_DIR "tests/data/chat_templates"
#define OR_NULL(s) ((s) ? (s) : "(null)")  // for messages about a rendering that may have failed

static json_t *load_goldens(void) {
    json_error_t je;
    json_t *g = json_load_file(CT_DIR "/goldens.json", 0, &je);
    cr_assert(g, CT_DIR "/goldens.json: %s (line %d); write it with tools/make_chat_goldens.py", je.text, je.line);
    chat_template_fixed_time = json_integer_value(json_object_get(g, "fixed_time"));
    cr_assert(chat_template_fixed_time > 0, "goldens.json has no fixed_time");
    return g;
}

// The conversation's messages (pointing into the JSON); returns how many.
static int messages_of(json_t *conv, ChatMessage *m, int cap) {
    cr_assert(json_is_array(conv));
    const int n = (int)json_array_size(conv);
    cr_assert_leq(n, cap);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(conv, (size_t)i);
        m[i].role = json_string_value(json_object_get(e, "role"));
        m[i].content = json_string_value(json_object_get(e, "content"));  // null: NULL (the key absent)
        cr_assert(m[i].role);
    }
    return n;
}

// Checks one rendering against its golden: the same bytes, or an error where transformers raised
// one; for raise_exception (TemplateError), an undefined value used (UndefinedError) and a
// namespace name refused (SecurityError) the C message must hold Python's. Prints the first difference. Returns 1 if it agrees.
static int agrees(const char *what, const char *got, const char *err, json_t *golden) {
    const char *want = json_string_value(json_object_get(golden, "expected"));
    const char *jerr = json_string_value(json_object_get(golden, "error"));
    if (jerr) {
        cr_expect(got == NULL, "%s: Python raised \"%s\" but the C renderer gave \"%s\"", what, jerr, OR_NULL(got));
        if (got) return 0;
        cr_expect(err[0], "%s: an error without a message", what);
        static const char *const kinds[] = {"TemplateError: ", "UndefinedError: ", "SecurityError: "};
        for (size_t i = 0; i < 3; i++) {
            const size_t k = strlen(kinds[i]);
            if (strncmp(jerr, kinds[i], k)) continue;
            cr_expect(strstr(err, jerr + k) != NULL, "%s: message \"%s\", want it to hold \"%s\"", what, err, jerr + k);
            return strstr(err, jerr + k) != NULL;
        }
        return err[0] != 0;
    }
    cr_assert(want, "%s: the golden has neither expected nor error", what);
    cr_expect(got != NULL, "%s: error \"%s\"; Python renders \"%s\"", what, err, want);
    if (!got) return 0;
    const size_t lg = strlen(got), lw = strlen(want);
    size_t i = 0;
    while (i < lg && i < lw && got[i] == want[i]) i++;
    cr_expect(lg == lw && i == lw, "%s: differs at byte %zu (length %zu, Python's %zu):\n  got  ...%.60s\n  want ...%.60s", what, i,
              lg, lw, got + i, want + i);
    return lg == lw && i == lw;
}

// Every template of goldens.json over every conversation, with and without the generation prompt:
// the same bytes as transformers' apply_chat_template (or the same error). The models' own
// templates must be among them, each over every conversation.
Test(chat_template, templates_match_transformers) {
    json_t *g = load_goldens(), *cases = json_object_get(g, "cases"), *convs = json_object_get(g, "conversations");
    static const char *const real[] = {"llama-3.1-8b-instruct.jinja", "llama-3.2-3b-instruct.jinja", "qwen2.5-7b-instruct.jinja",
                                       "qwen3.jinja"};
    int per_real[4] = {0}, ok = 0, raised = 0, failed = 0;
    for (size_t k = 0; k < json_array_size(cases); k++) {
        json_t *cs = json_array_get(cases, k);
        const char *file = json_string_value(json_object_get(cs, "template"));
        const char *conv = json_string_value(json_object_get(cs, "conversation"));
        cr_assert(file && conv, "case %zu names no template or conversation", k);
        for (int i = 0; i < 4; i++) per_real[i] += !strcmp(file, real[i]);
        char path[300], what[300], err[512] = "";
        snprintf(path, sizeof path, CT_DIR "/%s", file);
        char *tmpl = test_slurp(path, NULL);
        cr_assert(tmpl, "cannot read %s", path);
        ChatMessage m[16];
        const int n = messages_of(json_object_get(convs, conv), m, 16);
        const int agp = json_is_true(json_object_get(cs, "add_generation_prompt"));
        snprintf(what, sizeof what, "%s / %s / add_generation_prompt=%d", file, conv, agp);
        char *out = chat_template_render(tmpl, m, n, agp, json_string_value(json_object_get(cs, "bos_token")),
                                         json_string_value(json_object_get(cs, "eos_token")), err, sizeof err);
        ok += agrees(what, out, err, cs);
        const char *jerr = json_string_value(json_object_get(cs, "error"));
        if (jerr) (strncmp(jerr, "TemplateError: ", 15) ? failed++ : raised++);
        free(out), free(tmpl);
    }
    const size_t want_per = 2 * json_object_size(convs);
    for (int i = 0; i < 4; i++)
        cr_expect_eq((size_t)per_real[i], want_per, "%s: %d cases in goldens.json, want %zu (every conversation, agp true and false)", real[i],
                     per_real[i], want_per);
    fprintf(stderr, "[chat goldens] %d of %zu template renderings agree with %s (%d raise_exception, %d other errors)\n", ok,
            json_array_size(cases), json_string_value(json_object_get(g, "renderer")), raised, failed);
    cr_expect(raised > 0, "no case exercises raise_exception");
    json_decref(g);
}

// One small template per feature (whitespace control, literals, operators, loops, namespace,
// filters, tests, methods) and the errors Python raises, at parse time or while rendering.
Test(chat_template, snippets_match_transformers) {
    json_t *g = load_goldens(), *snippets = json_object_get(g, "snippets");
    json_t *conv = json_object_get(json_object_get(g, "conversations"), json_string_value(json_object_get(g, "snippet_conversation")));
    ChatMessage m[16];
    const int n = messages_of(conv, m, 16);
    int ok = 0;
    for (size_t k = 0; k < json_array_size(snippets); k++) {
        json_t *s = json_array_get(snippets, k);
        char err[512] = "", what[200];
        snprintf(what, sizeof what, "snippet %s: %.100s", json_string_value(json_object_get(s, "name")),
                 json_string_value(json_object_get(s, "template")));
        char *out = chat_template_render(json_string_value(json_object_get(s, "template")), m, n, 1, "<s>", "</s>", err, sizeof err);
        ok += agrees(what, out, err, s);
        free(out);
    }
    fprintf(stderr, "[chat goldens] %d of %zu snippets agree with %s\n", ok, json_array_size(snippets),
            json_string_value(json_object_get(g, "renderer")));
    json_decref(g);
}

// A broken template is an error whose message says where (line and column) and what was found.
Test(chat_template, syntax_errors_say_where_and_what) {
    static const struct {
        const char *tmpl, *where, *what;
    } bad[] = {
        {"{% if x %}\nnever closed", "line 1, column 1", "'if' is not closed (no 'endif'"},
        {"ok\n  {% for m in messages %}{{ m }}", "line 2, column 3", "'for' is not closed (no 'endfor'"},
        {"{{ 1 + }}", "line 1, column 8", "expected an expression, found '}}'"},
        {"a\nb\n{{ messages[0 }}", "line 3, column 15", "unexpected '}' (expected ']')"},
        {"{{ f(1]) }}", "line 1, column 7", "unexpected ']' (expected ')')"},
        {"{{ messages[0 + }}", "line 1, column 17", "unexpected '}' (expected ']')"},
        {"{{ messages[0] + }}", "line 1, column 18", "expected an expression, found '}}'"},
        {"{{ 'abc }}", "line 1, column 4", "string literal is not closed"},
        {"x {{ messages ", "line 1, column 3", "'{{' is not closed"},
        {"{# forever", "line 1, column 1", "comment '{#' is not closed"},
        {"{% endif %}", "line 1, column 4", "unexpected 'endif' (no block is open)"},
        {"{% for x in y %}{% endif %}{% endfor %}", "line 1, column 20", "unexpected 'endif' inside 'for'"},
        {"{% frobnicate %}", "line 1, column 4", "unknown tag 'frobnicate'"},
        {"{% call f() %}{% endcall %}", "line 1, column 4", "'call' tags are not supported"},
        {"{% macro f() %}x", "line 1, column 1", "'macro' is not closed (no 'endmacro'"},
        {"{% macro f(a, a) %}{% endmacro %}", "line 1, column 15", "duplicate parameter 'a'"},
        {"{% macro f(a=1, b) %}{% endmacro %}", "line 1, column 17", "a parameter without a default follows one with a default"},
        {"{% for x in y %}{% macro f() %}{% break %}{% endmacro %}{% endfor %}", "line 1, column 35", "'break' outside of a for loop"},
        {"{{ x|nosuch }}", "line 1, column 5", "no filter named 'nosuch'"},
        {"{{ x is nosuch }}", "line 1, column 6", "no test named 'nosuch'"},
        {"{{ x is divisibleby }}", "line 1, column 6", "test 'divisibleby' takes 1 argument(s), not 0"},
        {"{% break %}", "line 1, column 4", "'break' outside of a for loop"},
        {"{% set x %}y", "line 1, column 1", "'set' is not closed (no 'endset'"},
        {"{{ a $ b }}", "line 1, column 6", "unexpected character '$'"},
        {"{{ 'é' ¤ }}", "line 1, column 8", "unexpected character '¤'"},  // columns count characters
        {"{% for in x %}", "line 1, column 8", "expected a loop variable, found 'in'"},
        {"{% set if = 1 %}", "line 1, column 8", "expected a variable name, found 'if'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[512] = "";
        char *out = chat_template_render(bad[i].tmpl, NULL, 0, 1, NULL, NULL, err, sizeof err);
        cr_expect(out == NULL, "\"%s\" rendered \"%s\"", bad[i].tmpl, OR_NULL(out));
        free(out);
        cr_expect(strstr(err, bad[i].where) != NULL && strstr(err, bad[i].what) != NULL, "\"%s\": message \"%s\", want %s: ...%s...",
                  bad[i].tmpl, err, bad[i].where, bad[i].what);
    }
    // nesting deeper than the parser goes is refused, not a stack overflow
    char deep[1024] = "{{ ";
    for (int i = 0; i < 301; i++) strcat(deep, i < 150 ? "(" : i == 150 ? "1" : ")");
    strcat(deep, " }}");
    char err[512] = "";
    char *out = chat_template_render(deep, NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "nested more than"), "message \"%s\"", err);
    free(out);
    out = chat_template_render("{% if 1 %}{% if 1 %}{% if 1 %}{% for x in y %}{% endfor %}{% endif %}{% endif %}{% endif %}", NULL, 0, 1, NULL,
                               NULL, err, sizeof err);
    cr_expect(out && !out[0], "nested blocks: %s", err);
    free(out);
}

// Errors while rendering name the line and column of the expression; odd inputs (no messages,
// content NULL, a tool message, an empty template, huge loops) give text or an error, never a crash.
Test(chat_template, render_errors_and_odd_inputs) {
    char err[512] = "";
    char *out = chat_template_render("line one\n{{ messages[0].content.upper() }}", NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "line 2, column 4") && strstr(err, "list object has no element 0"), "message \"%s\"", err);
    free(out);
    out = chat_template_render("{% for m in messages %}\n  {{ raise_exception('no ' ~ m.role ~ ' here') }}\n{% endfor %}",
                               (ChatMessage[]){{"tool", "x"}}, 1, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "line 2, column 6") && strstr(err, "raised an error: no tool here"), "message \"%s\"", err);
    free(out);
    // content NULL is an absent key (transformers drops None values); a tool message goes through Qwen3's template
    char *qwen = test_slurp(CT_DIR "/qwen3.jinja", NULL);
    cr_assert(qwen);
    const ChatMessage m[] = {{"user", "call it"}, {"assistant", NULL}, {"tool", "42"}};
    out = chat_template_render("[{{ messages[1].content }}]{{ messages[1].content is defined }}{{ 'content' in messages[1] }}|{{ messages[1] }}", m, 3, 1,
                               NULL, NULL, err, sizeof err);
    cr_expect(out && !strcmp(out, "[]FalseFalse|{'role': 'assistant'}"), "got %s (%s)", OR_NULL(out), err);
    free(out);
    out = chat_template_render(qwen, m, 1, 0, NULL, "<|im_end|>", err, sizeof err);
    cr_expect(out && !strcmp(out, "<|im_start|>user\ncall it<|im_end|>\n"), "got %s (%s)", OR_NULL(out), err);
    free(out);
    const ChatMessage tool[] = {{"user", "call it"}, {"tool", "42"}};
    out = chat_template_render(qwen, tool, 2, 1, NULL, NULL, err, sizeof err);
    cr_expect(out && strstr(out, "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "got %s (%s)",
              OR_NULL(out), err);
    free(out);
    // Qwen3 with no messages: messages[0] is undefined, its .role an error (as in jinja2)
    out = chat_template_render(qwen, NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "line 13, column 12: list object has no element 0"), "got %s (%s)", OR_NULL(out), err);
    free(out), free(qwen);
    out = chat_template_render("", NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out && !strcmp(out, ""));
    free(out);
    out = chat_template_render("{% for i in range(100000000) %}{% endfor %}", NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "more than this renderer makes"), "message \"%s\"", err);
    free(out);
    out = chat_template_render("{{ 'x' * 100000000 }}", NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && err[0], "message \"%s\"", err);
    free(out);
    out = chat_template_render(NULL, NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "no template"));
    // a macro that calls itself forever is stopped, not a stack overflow; one whose text grows
    // past the output limit is stopped too
    out = chat_template_render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}", NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "macro calls nested more than"), "message \"%s\"", err);
    free(out);
    out = chat_template_render("{% macro f(s) %}{{ s ~ s }}{% endmacro %}{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                               "{% set ns.s = f(ns.s) %}{% endfor %}{{ ns.s|length }}",
                               NULL, 0, 1, NULL, NULL, err, sizeof err);
    cr_expect(out == NULL && strstr(err, "MiB"), "message \"%s\"", err);
    free(out);
}

// tokenizer_config.json in its forms: chat_template a string or a list of named templates
// ("default" taken), bos/eos strings or AddedToken objects, chat_template.jinja beside it taking
// precedence; and what is said when there is no template.
Test(chat_template, loads_tokenizer_config) {
    char err[512];
    ChatTemplate ct;
    cr_assert_eq(chat_template_parse_config("{\"chat_template\": \"{{ bos_token }}hi\", \"bos_token\": \"<s>\", \"eos_token\": "
                                            "{\"__type\": \"AddedToken\", \"content\": \"</s>\", \"lstrip\": false}}",
                                            "a.json", &ct, err, sizeof err),
                 0, "%s", err);
    cr_expect_str_eq(ct.text, "{{ bos_token }}hi");
    cr_expect_str_eq(ct.bos_token, "<s>");
    cr_expect_str_eq(ct.eos_token, "</s>");
    cr_expect_str_eq(ct.source, "a.json");
    chat_template_free(&ct);
    cr_assert_eq(chat_template_parse_config("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", "
                                            "\"template\": \"D\"}], \"bos_token\": null}",
                                            "b.json", &ct, err, sizeof err),
                 0, "%s", err);
    cr_expect_str_eq(ct.text, "D");
    cr_expect(ct.bos_token == NULL && ct.eos_token == NULL);
    chat_template_free(&ct);
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"bos_token\": \"<s>\"}", "c.json has no \"chat_template\""},
        {"{\"chat_template\": null}", "c.json has no \"chat_template\""},
        {"{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}", "named tool_use but none named \"default\""},
        {"{\"chat_template\": 5}", "neither a string nor a list"},
        {"{\"chat_template\": [5]}", "item 0 is not"},
        {"{\"chat_template\": \"x\", \"eos_token\": 3}", "\"eos_token\" is neither a string"},
        {"{\"chat_template\": ", "c.json: invalid JSON"},
        {"[]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        cr_expect_eq(chat_template_parse_config(bad[i].json, "c.json", &ct, err, sizeof err), -1, "%s was accepted", bad[i].json);
        cr_expect(strstr(err, bad[i].msg) != NULL, "%s: message \"%s\", want \"%s\"", bad[i].json, err, bad[i].msg);
        cr_expect(ct.text == NULL);
    }
    // a model directory: tokenizer_config.json, then chat_template.jinja taking precedence
    char dir[64], path[128];
    test_mkdtemp(dir, sizeof dir, "chat_cfg");
    cr_expect_eq(chat_template_load(dir, &ct, err, sizeof err), -1);
    cr_expect(strstr(err, "tokenizer_config.json: cannot read") && strstr(err, "no chat template"), "message \"%s\"", err);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"eos_token\": \"</s>\"}", f);
    fclose(f);
    cr_expect_eq(chat_template_load(dir, &ct, err, sizeof err), -1);
    cr_expect(strstr(err, path) && strstr(err, "has no \"chat_template\""), "message \"%s\" names %s", err, path);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    f = fopen(path, "w");
    fputs("{{ eos_token }}!\n", f);
    fclose(f);
    cr_assert_eq(chat_template_load(dir, &ct, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(ct.text, "{{ eos_token }}!\n");
    cr_expect_str_eq(ct.eos_token, "</s>");
    cr_expect_str_eq(ct.source, path);
    chat_template_free(&ct);
    test_rmtree(dir);
    // Qwen3's real tokenizer_config.json gives the template of qwen3.jinja
    cr_assert_eq(chat_template_load("tests/data/tokenizers/qwen3-tokenizer_config.json", &ct, err, sizeof err), 0, "%s", err);
    char *want = test_slurp(CT_DIR "/qwen3.jinja", NULL);
    cr_assert(want);
    cr_expect_str_eq(ct.text, want, "qwen3.jinja is the chat_template of tests/data/tokenizers/qwen3-tokenizer_config.json");
    cr_expect(ct.bos_token == NULL);
    cr_expect_str_eq(ct.eos_token, "<|im_end|>");
    free(want);
    chat_template_free(&ct);
}

// `llm generate --chat` on a test checkpoint (llama_mha_bf16, whose tokenizer has <s>, </s>,
// <|user|> and <sep> as special tokens) given a chat template: the prompt rendered as one user
// message with the generation prompt, encoded without a second BOS, its special tokens as
// tokens; and the errors when there is no template or no text prompt.
Test(chat_template, llm_generate_chat, .timeout = 120) {
    char dir[64], path[160], src[PATH_MAX], cmd[2048];
    test_mkdtemp(dir, sizeof dir, "chat_model");
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, MODELS_DIR "/llama_mha_bf16/%s", files[i]);
        cr_assert(realpath(path, src), "%s", path);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_assert_eq(symlink(src, path), 0, "symlink %s", path);
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\", \"add_bos_token\": true, \"chat_template\": "
          "\"{{ bos_token }}{% for m in messages %}<|user|>{{ m.content }}{{ eos_token }}{% endfor %}"
          "{% if add_generation_prompt %}<sep>{% endif %}\"}",
          f);
    fclose(f);
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --json --max-tokens 3 --chat --prompt 'hello world' 2>/dev/null",
             BUILD_BIN_DIR, dir);
    cr_assert_eq(test_run_cmd(cmd, out, sizeof out), 0, "%s failed: %s", cmd, out);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "not JSON: %s", out);
    const char *want = "<s><|user|>hello world</s><sep>";
    cr_expect_str_eq(json_string_value(json_object_get(j, "chat_prompt")), want);
    char err[512];
    Tokenizer *tok = tokenizer_load(MODELS_DIR "/llama_mha_bf16/tokenizer.json", err, sizeof err);
    cr_assert(tok, "%s", err);
    TokIds ids = {0};
    cr_assert_eq(tokenizer_encode(tok, want, strlen(want), 0, &ids), 0);
    json_t *pa = json_object_get(j, "prompt_ids");
    cr_expect_eq(json_array_size(pa), ids.n, "prompt of %zu ids, want %zu", json_array_size(pa), ids.n);
    for (size_t i = 0; i < ids.n && i < json_array_size(pa); i++)
        cr_expect_eq(json_integer_value(json_array_get(pa, i)), ids.ids[i], "prompt id %zu", i);
    // one BOS (the template's), and the markers as their special tokens
    const int32_t bos = tokenizer_token_id(tok, "<s>"), user = tokenizer_token_id(tok, "<|user|>"), sep = tokenizer_token_id(tok, "<sep>");
    cr_assert(bos >= 0 && user >= 0 && sep >= 0);
    cr_expect_eq(json_integer_value(json_array_get(pa, 0)), bos);
    cr_expect_neq(json_integer_value(json_array_get(pa, 1)), bos, "a second BOS");
    cr_expect_eq(json_integer_value(json_array_get(pa, 1)), user);
    cr_expect_eq(json_integer_value(json_array_get(pa, json_array_size(pa) - 1)), sep);
    tokids_free(&ids);
    tokenizer_free(tok);
    json_decref(j);
    // errors: a template that raises, no template (the message names the file), --chat with --ids
    f = fopen(path, "w");
    fputs("{\"chat_template\": \"{{ raise_exception('system message required') }}\"}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --chat --prompt hi 2>&1", BUILD_BIN_DIR, dir);
    cr_expect_neq(test_run_cmd(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, "system message required") && strstr(out, "tokenizer_config.json"), "message \"%s\"", out);
    f = fopen(path, "w");
    fputs("{\"bos_token\": \"<s>\"}", f);
    fclose(f);
    cr_expect_neq(test_run_cmd(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, path) && strstr(out, "has no \"chat_template\""), "message \"%s\"", out);
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --chat --prompt hi 2>&1", BUILD_BIN_DIR, MODELS_DIR "/llama_mha_bf16");
    cr_expect_neq(test_run_cmd(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, MODELS_DIR "/llama_mha_bf16/tokenizer_config.json") && strstr(out, "no chat template"), "message \"%s\"", out);
    snprintf(cmd, sizeof cmd, "%s/llm generate --model %s --device cpu --chat --ids 1,2 2>&1", BUILD_BIN_DIR, dir);
    cr_expect_neq(test_run_cmd(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, "--chat needs --prompt"), "message \"%s\"", out);
    test_rmtree(dir);
}
