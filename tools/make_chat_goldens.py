#!/usr/bin/env python3
"""Expected outputs for tests/test_chat_template.c: chat templates rendered by Python's jinja2.

The templates are rendered the way transformers' apply_chat_template renders them
(transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, the loopcontrols extension and a `generation` tag; a `tojson` filter that is
json.dumps(ensure_ascii=False); the globals raise_exception(msg) and strftime_now(fmt); and the
variables messages, tools=None, documents=None, add_generation_prompt and the special tokens.
strftime_now formats a fixed time (FIXED_TIME, UTC) so the goldens do not change with the date;
the C test sets chat_template_fixed_time to the same value.

Writes tests/data/chat_templates/goldens.json:
  cases:    every template file here (qwen3.jinja is Qwen3's own, copied from
            tests/data/tokenizers/qwen3-tokenizer_config.json) x every conversation x
            add_generation_prompt true/false: the text, or the error jinja2 raised;
  snippets: small templates, one Jinja feature each, rendered for the multi_turn conversation
            with bos_token <s> and eos_token </s>: the text, or the error (syntax errors too).

    pip install Jinja2==3.1.6
    python3 tools/make_chat_goldens.py           # rewrites the file (byte-identical when nothing changed)
    python3 tools/make_chat_goldens.py --check   # exits 1 when the committed file differs
"""
import argparse
import datetime
import json
import os
import platform
import sys

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates"))
FIXED_TIME = 1721995200  # 2024-07-26 12:00:00 UTC

# The template files and the special tokens of the tokenizers they come with.
TEMPLATES = {
    "qwen3.jinja": (None, "<|im_end|>"),
    "llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "chatml.jinja": (None, "<|im_end|>"),
    "mistral.jinja": ("<s>", "</s>"),
    "zephyr.jinja": ("<s>", "</s>"),
}

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi there."},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "thinking": [  # Qwen3 moves the reasoning out of an earlier assistant turn
        {"role": "system", "content": "  Think first.  "},
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\nIt has no divisor but 1 and 7.\n</think>\n\nYes."},
        {"role": "user", "content": "And 9?"},
    ],
    "unicode": [
        {"role": "user", "content": "你好，世界！🌍 Ünïcödé — «ok»?"},
        {"role": "assistant", "content": "こんにちは 😀"},
        {"role": "user", "content": "Ελληνικά\tand ½ ✓"},
    ],
    "braces_quotes": [
        {"role": "user", "content": "{{ not a tag }} {% neither %} {# nor #} 'single' \"double\" \\ back\\slash\n  new line  "},
    ],
    "empty_and_spaces": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "   "},
        {"role": "user", "content": "\n\nend\n"},
    ],
    "not_alternating": [  # Mistral's template raises on this one
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ],
}

# One Jinja feature each; rendered with messages = multi_turn, bos <s>, eos </s>, add_generation_prompt true.
SNIPPETS = [
    # whitespace control: trim_blocks, lstrip_blocks, - and +
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter"),
    ("lstrip_blocks", "a\n    {% if true %}\n    in\n    {% endif %}\nb"),
    ("lstrip_not_midline", "a  {% if true %}x{% endif %}  \nb"),
    ("lstrip_between_tags", "{% if true %}  {% if true %}x{% endif %}{% endif %}"),
    ("lstrip_at_start", "  {% if true %}x\n  {% endif %}\nb"),
    ("lstrip_not_for_output", "  {{ 'v' }}\nb"),
    ("minus_both_sides", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c"),
    ("minus_output", "x \n {{- 'y' -}} \n z"),
    ("plus_disables", "  {%+ if true %}x{% endif +%}\nb"),
    ("comments", "a {# hidden #}\nb\n  {# own line #}\nc{#- strip -#}   d"),
    ("trailing_newline_dropped", "text\n\n"),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc"),
    # literals and printing
    ("literals", "{{ 'single' }} {{ \"double\" }} {{ 'a' 'b' }} {{ 42 }} {{ -7 }} {{ true }} {{ False }} {{ none }} {{ None }}"),
    ("string_escapes", "{{ 'tab\\there\\nnl \\'q\\' \\x41\\u00e9\\U0001F600 \\d' }}"),
    ("floats", "{{ 1.5 }} {{ 4 / 2 }} {{ 7 / 2 }} {{ 1e5 }} {{ 1.5e-5 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ -0.0 }} {{ 2 ** -1 }}"),
    ("list_and_dict_repr", "{{ [1, 'a', none, true, [2.5]] }} {{ {'k': 'v', 'n': 1} }} {{ ['it\\'s', \"q\\\"\"] }} {{ (1, 2) }} {{ (1,) }} {{ () }}"),
    ("message_repr", "{{ messages[0] }}"),
    # arithmetic and operators
    ("float_math", "{{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 7.5 % -2 }} {{ true % 0.1 }} {{ -7.5 // 2 }} {{ false // -2.5 }} {{ 1 / 3 }} {{ 2 ** 0.5 }} {{ 10 / 4 * 2 }}"),
    ("int_math", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 7.5 // 2 }}"),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'a' ~ (1 + 2) }} {{ 1 ~ 2 * 3 }} {{ messages|length - 1 }} {{ -2 ** 2 }} {{ not 1 == 2 }} {{ 2 * 3 ** 2 }}"),
    ("concat", "{{ 'a' ~ none ~ 1 ~ true ~ undefined_name ~ [1] }}"),
    ("repeat_and_join_lists", "{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1, 2] + [3] }} {{ 'x' + 'y' }}"),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 == true }} {{ [1, 2] == [1, 2] }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
    ("in_not_in", "{{ 'a' in 'cat' }} {{ 'x' not in ['x'] }} {{ 'role' in messages[0] }} {{ 'z' in messages[0] }} {{ undefined_name in [1] }} {{ '' in 'abc' }}"),
    ("and_or_values", "{{ 0 or '' or 'z' }} {{ 1 and 2 }} {{ none and 1 }} {{ 'a' or 'b' }} {{ [] or 'empty' }} {{ not undefined_name }}"),
    ("ternary", "{{ 'y' if messages else 'n' }} {{ 'y' if [] else 'n' }} [{{ 'only' if false }}] {{ 'a' if false else 'b' if true else 'c' }}"),
    # variables, attributes, items
    ("attr_and_item", "{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} [{{ messages[0].missing }}] [{{ messages[9] }}]"),
    ("undefined_is_empty_and_false", "[{{ nothing }}] {{ nothing is defined }} {{ nothing is undefined }} {% if nothing %}t{% else %}f{% endif %} {{ nothing|length }}"),
    ("tools_and_documents_are_none", "{{ tools is defined }} {{ tools is none }} {{ documents }} {% if tools %}t{% else %}f{% endif %}"),
    ("special_tokens", "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}"),
    ("slicing", "{{ messages[1:]|length }} {{ messages[::-1][0].content }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-2] }} {{ [1, 2, 3][-2:] }} {{ 'héllo'[1] }} {{ 'héllo'[-3:] }} {{ [1, 2, 3][5:] }}"),
    # statements
    ("set_and_scope", "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}[{{ x }}]{% endfor %} after: {{ x }}"),
    ("set_per_iteration", "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}"),
    ("set_in_if_leaks", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}"),
    ("namespace", "{% set ns = namespace(count=0, last='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.count }} {{ ns.last }} {{ ns.nothing }}[{{ ns }}]"),
    ("namespace_new_attr", "{% set ns = namespace() %}{% set ns.z = 'new' %}{{ ns.z }}"),
    ("reassign_messages", "{% set messages = messages[1:] %}{{ messages|length }} {{ messages[0].role }}"),
    ("if_elif_else", "{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role == 'user' %}U{% else %}A{% endif %}{% endfor %}"),
    ("loop_variables", "{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
    ("loop_prev_next", "{% for i in range(3) %}({{ loop.previtem }},{{ loop.nextitem }}){% endfor %}"),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}"),
    ("loop_reversed", "{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %} {% for m in messages|reverse %}{{ loop.index }}{{ m.role[0] }}{% endfor %}"),
    ("loop_filter_and_else", "{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }} {% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}"),
    ("loop_unpack_items", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'p': 1, 'q': 2} %}{{ k }}{% endfor %}"),
    ("break_continue", "{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
    ("range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}"),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}"),
    # filters
    ("filter_trim_length", "[{{ '  pad \\n'|trim }}] [{{ 'xxhixx'|trim('x') }}] {{ 'héllo'|length }} {{ messages|length }} {{ {'a': 1}|length }} {{ messages|count }}"),
    ("filter_case", "{{ 'héllo World'|upper }} {{ 'ÀBC Def'|lower }} {{ 'hELLO wORLD'|capitalize }}"),
    ("filter_default", "{{ nothing|default('d') }} [{{ ''|default('d') }}] {{ ''|default('d', true) }} {{ none|default('d') }} {{ nothing|d('short') }} {{ ''|default(boolean=true, default_value='kw') }}"),
    ("filter_tojson", "{{ messages|tojson }} {{ 'é\\n\"\\\\'|tojson }} {{ [1, 2.5, none, true]|tojson }} {{ {}|tojson }} {{ '\\u0001\\u007f'|tojson }}"),
    ("filter_tojson_indent", "{{ {'a': [1, {'b': none}], 'c': []}|tojson(indent=2) }}"),
    ("filter_join_first_last", "{{ ['a', 'b']|join }} {{ [1, 2]|join('-') }} {{ ['a', none]|join(', ') }} {{ messages|first }} {{ (messages|last).content }} {{ 'abc'|first }} [{{ []|first }}]"),
    ("filter_reverse_list", "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }} {{ 'ab'|list }} {{ {'k': 1}|list }}"),
    ("filter_string_int_items", "{{ 5|string ~ 'x' }} {{ '5'|int + 1 }} {{ '3.7'|int }} {{ 'abc'|int }} {{ 2|float }} {{ {'a': 1}|items|list }} {{ 'a-b'|replace('-', '+') }}"),
    # tests
    ("tests_types", "{{ 'a' is string }} {{ 1 is string }} {{ {} is mapping }} {{ messages[0] is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 3 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ true is boolean }} {{ 1.5 is float }}"),
    ("filter_select_map", "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ messages|map(attribute='role')|join(',') }} {{ ['a', 'B']|map('upper')|list }} {{ messages|selectattr('tool_calls', 'undefined')|list|length }} {{ messages|map(attribute='nope', default='-')|list }}"),
    ("filter_select_llama_tools", "{{ 'Tools: ' + ['brave_search', 'code_interpreter', 'wolfram_alpha']|reject('equalto', 'code_interpreter')|join(', ') }}"),
    ("unknown_filter_in_dead_branch", "{% if false %}{{ x|no_such_filter }}{% endif %}ok"),
    ("tests_values", "{{ none is none }} {{ 0 is none }} {{ tools is not none }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is odd }} {{ 3 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ 'a' is in 'cat' }} {{ x is not defined }}"),
    # string methods
    ("str_startswith_endswith", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('x') }}"),
    ("str_strip", "[{{ '  x  '.strip() }}] [{{ '  x  '.lstrip() }}] [{{ '  x  '.rstrip() }}] [{{ '\\n\\nx\\n'.lstrip('\\n') }}] [{{ 'xyhiyx'.strip('xy') }}]"),
    ("str_split", "{{ 'a b  c'.split() }} {{ ' a  b '.split(' ') }} {{ 'a,b,c'.split(',', 1) }} {{ 'x</think>y'.split('</think>')[-1] }} {{ 'a b  c '.split(none, 1) }}"),
    ("str_replace_join_case", "{{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }} {{ ', '.join(['x', 'y']) }} {{ 'Mixed'.upper() }} {{ 'Mixed'.lower() }}"),
    ("dict_methods", "{{ messages[0].get('role') }} {{ messages[0].get('nope') }} {{ messages[0].get('nope', 'dflt') }} {{ messages[0].keys()|list }} {{ messages[0].items()|list }}"),
    ("qwen3_think_split", "{% set c = messages[1].content ~ '<think>\\nr\\n</think>\\n\\nans' %}{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[-1].lstrip('\\n') }}"),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%dT%H:%M:%S') }} {{ strftime_now is defined }}"),
    # errors while rendering: the C side must fail too
    ("raise_exception", "before {{ raise_exception('Roles must alternate!') }} after"),
    ("error_attr_of_undefined", "{{ nothing.attr }}"),
    ("error_add_str_int", "{{ 'a' + 1 }}"),
    ("error_concat_binds_tighter_than_plus", "{{ 'a' ~ 1 + 2 }}"),
    ("error_add_undefined", "{{ nothing + 1 }}"),
    ("error_divide_by_zero", "{{ 1 // 0 }}"),
    ("error_not_iterable", "{% for x in 5 %}{% endfor %}"),
    ("error_ns_attr_on_non_namespace", "{% set x = 1 %}{% set x.y = 2 %}"),
    ("error_tojson_undefined", "{{ nothing|tojson }}"),
    ("error_length_of_none", "{{ none|length }}"),
    # syntax errors
    ("syntax_unclosed_if", "{% if true %}never closed"),
    ("syntax_unclosed_for", "{% for m in messages %}{{ m }}"),
    ("syntax_stray_endif", "text {% endif %}"),
    ("syntax_bad_expression", "{{ 1 + }}"),
    ("syntax_unclosed_tag", "{{ messages "),
    ("syntax_unclosed_string", "{{ 'abc }}"),
    ("syntax_unknown_tag", "{% frobnicate %}"),
    ("syntax_unknown_filter", "{{ 'a'|nosuchfilter }}"),
    ("syntax_unknown_test", "{{ 'a' is nosuchtest }}"),
    ("syntax_break_outside_loop", "{% break %}"),
    ("syntax_elif_after_else", "{% if 1 %}{% else %}{% elif 2 %}{% endif %}"),
    ("syntax_unclosed_comment", "{# never closed"),
]


class GenerationTag(Extension):
    """transformers' {% generation %}...{% endgeneration %}: here it only renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(FIXED_TIME, tz=datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, messages, add_generation_prompt, bos, eos):
    """{"expected": text} or {"error": message}."""
    tokens = {}
    if bos is not None:
        tokens["bos_token"] = bos
    if eos is not None:
        tokens["eos_token"] = eos
    try:
        t = env.from_string(source)
        return {"expected": t.render(messages=messages, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt, **tokens)}
    except Exception as e:  # noqa: BLE001 — every jinja2 error is a golden too
        return {"error": f"{type(e).__name__}: {e}"}


def build():
    env = environment()
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(HERE, name), encoding="utf-8", newline="") as f:
            source = f.read()
        for conv, messages in CONVERSATIONS.items():
            for agp in (True, False):
                case = {"template": name, "conversation": conv, "add_generation_prompt": agp,
                        "bos_token": bos, "eos_token": eos}
                case.update(render(env, source, messages, agp, bos, eos))
                cases.append(case)
    snippets = []
    for name, source in SNIPPETS:
        s = {"name": name, "template": source}
        s.update(render(env, source, CONVERSATIONS["multi_turn"], True, "<s>", "</s>"))
        snippets.append(s)
    return {
        "generated_by": "tools/make_chat_goldens.py",
        "jinja2": jinja2.__version__,
        "python": platform.python_version(),
        "fixed_time": FIXED_TIME,
        "snippet_conversation": "multi_turn",
        "conversations": CONVERSATIONS,
        "cases": cases,
        "snippets": snippets,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed goldens instead of writing")
    args = ap.parse_args()
    qwen = os.path.join(HERE, "..", "tokenizers", "qwen3-tokenizer_config.json")
    with open(qwen, encoding="utf-8") as f:
        qwen_template = json.load(f)["chat_template"]
    with open(os.path.join(HERE, "qwen3.jinja"), encoding="utf-8", newline="") as f:
        if f.read() != qwen_template:
            sys.exit("qwen3.jinja differs from the chat_template of " + qwen)
    text = json.dumps(build(), ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(HERE, "goldens.json")
    if args.check:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{path} is not what this script writes now (rerun it without --check)")
        print(f"{path}: up to date")
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    d = json.loads(text)
    n_err = sum("error" in c for c in d["cases"]) + sum("error" in s for s in d["snippets"])
    print(f"wrote {path}: {len(d['cases'])} template cases, {len(d['snippets'])} snippets ({n_err} of them errors)")


if __name__ == "__main__":
    main()
