#!/usr/bin/env python3
"""Expected outputs for tests/test_chat_template.c: chat templates rendered by transformers.

Each template is rendered by transformers' own tokenizer.apply_chat_template(messages,
tokenize=False, add_generation_prompt=...) on a tokenizer built from
tests/data/tokenizers/tiny-tokenizer.json with the template's bos_token / eos_token set (the
tokenizer's vocabulary plays no part when tokenize=False). strftime_now (transformers' global, the
local clock) is patched to format a fixed time (FIXED_TIME, UTC) so the goldens do not change with
the date; the C test sets chat_template_fixed_time to the same value.

When transformers is not importable, the script falls back to plain jinja2 set up the way
transformers' utils/chat_template_utils.py sets it up (an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension and a `generation` tag; a `tojson` filter
that is json.dumps(ensure_ascii=False); the globals raise_exception(msg), strftime_now(fmt), dict
and a namespace that refuses names starting with _; the
variables messages (keys whose value is None dropped, as transformers 5 drops them), tools=None,
documents=None, add_generation_prompt and the special tokens). goldens.json records which one
wrote it ("renderer", and the versions of transformers and jinja2).

Writes tests/data/chat_templates/goldens.json:
  cases:    every template listed in TEMPLATES x every conversation x add_generation_prompt
            true/false: the text, or the error raised (raise_exception's, or any other);
  snippets: small templates, one Jinja feature each, rendered for the multi_turn conversation
            with bos_token <s> and eos_token </s>: the text, or the error (syntax errors too).

    pip install transformers       # 5.25.0 wrote the committed file; torch is not needed
    python3 tools/make_chat_goldens.py           # rewrites the file (byte-identical when nothing changed)
    python3 tools/make_chat_goldens.py --check   # exits 1 when the committed outputs differ
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

try:
    import transformers
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import chat_template_utils
except ImportError:
    transformers = None

HERE = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates"))
TOKENIZER = os.path.join(HERE, "..", "tokenizers", "tiny-tokenizer.json")
FIXED_TIME = 1721995200  # 2024-07-26 12:00:00 UTC

# The template files and the special tokens of the tokenizers they come with: the models' own
# (tests/data/chat_templates/README.md says where each comes from), except llama3, chatml, mistral
# and zephyr, short hand-written templates in the layouts of those families.
TEMPLATES = {
    "qwen3.jinja": (None, "<|im_end|>"),
    "qwen2.5-7b-instruct.jinja": (None, "<|im_end|>"),
    "llama-3.1-8b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2-3b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "chatml.jinja": (None, "<|im_end|>"),
    "mistral.jinja": ("<s>", "</s>"),
    "zephyr.jinja": ("<s>", "</s>"),
    "gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "mistral-nemo-instruct-2407.jinja": ("<s>", "</s>"),
    "mistral-small-3.2-24b-instruct-2506.jinja": ("<s>", "</s>"),
    "deepseek-r1-distill-qwen-32b.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "smollm3-3b.jinja": (None, "<|im_end|>"),
    "granite-3.3-2b-instruct.jinja": ("<|end_of_text|>", "<|end_of_text|>"),
    "qwq-32b.jinja": (None, "<|im_end|>"),
    "qwen3-coder.jinja": (None, "<|im_end|>"),
    "qwen3.5-4b.jinja": (None, "<|im_end|>"),
    "hermes-3-llama-3.1-8b.jinja": ("<|begin_of_text|>", "<|im_end|>"),
    "gpt-oss-120b.jinja": (None, "<|return|>"),
    "minicpm5-1b.jinja": ("<s>", "<|im_end|>"),
    "apriel-1.5.jinja": ("<s>", "<|end|>"),
    "functionary-medium-v3.1.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
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
    "system_multi_turn": [
        {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    "whitespace": [  # leading / trailing spaces, tabs and blank lines: some templates trim, some keep
        {"role": "system", "content": "\n  Be brief.  \n\n"},
        {"role": "user", "content": "  \n\nfirst line\n\n\n  indented line\t\n  "},
        {"role": "assistant", "content": "\n\nSure.\n\n"},
        {"role": "user", "content": "\t\r\n tabs and CR \r\n"},
    ],
    "jinja_in_content": [  # text that looks like Jinja is data, never evaluated
        {"role": "system", "content": "Render {{ x }} and {% if %} literally. {%- raw -%} {# note #}"},
        {"role": "user", "content": "{{ messages[0].content }} {% for m in messages %}{{ m }}{% endfor %} {{- '-' -}}"},
        {"role": "assistant", "content": "{% endif %}{{ raise_exception('no') }}"},
        {"role": "user", "content": "}} %} #} {{{ {%% ok"},
    ],
    "non_ascii": [  # Chinese, emoji (with ZWJ and skin tone), Arabic and Hebrew (RTL), combining marks
        {"role": "system", "content": "你是一个乐于助人的助手。🤖"},
        {"role": "user", "content": "مرحبا بالعالم! שלום עולם — 👩‍👩‍👧‍👦 👍🏽 e\u0301 ñ"},
        {"role": "assistant", "content": "你好！こんにちは。안녕하세요 🌏"},
        {"role": "user", "content": "\u200f\u202eRTL override\u202c and zero\u200bwidth \u00a0nbsp"},
    ],
    "empty_system": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Hi"},
    ],
    "system_only": [
        {"role": "system", "content": "Only a system prompt."},
    ],
    "long_multi_turn": [
        {"role": "system", "content": "You are a math tutor."},
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "2."},
        {"role": "user", "content": "And 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6."},
        {"role": "user", "content": "And 4+4?"},
        {"role": "assistant", "content": "8."},
        {"role": "user", "content": "Now the pattern?"},
    ],
    "assistant_last": [  # rendered with and without the generation prompt, like every conversation
        {"role": "user", "content": "Finish this: once upon a"},
        {"role": "assistant", "content": "time, there was"},
    ],
    "tool_result": [  # a tool's answer: Qwen wraps it in <tool_response>, Llama 3.x in an ipython turn (as JSON)
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"°C\"}"},
        {"role": "tool", "content": "sunny"},
        {"role": "user", "content": "Thanks!"},
    ],
    "content_null": [  # a null content is dropped by transformers: the key is absent (undefined)
        {"role": "user", "content": "Call the tool."},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "Done?"},
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
    # what the real templates do in their tools branches (tools is None in every case above)
    ("llama31_builtin_tool_call", "{%- for arg_name, arg_val in {'query': 'weather \"Paris\"', 'n': '3'} | items %}{{- arg_name + '=\"' + arg_val + '\"' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"),
    ("llama_tools_tojson_indent4", "{%- set t = {'type': 'function', 'function': {'name': 'get_weather', 'description': 'Météo — 天气', 'parameters': {'type': 'object', 'properties': {'city': {'type': 'string'}, 'days': {'type': 'integer', 'default': 1.5}}, 'required': ['city'], 'strict': true, 'extra': none, 'empty': {}, 'none_list': []}}} %}{{- t | tojson(indent=4) }}\n{{ t | tojson }}"),
    ("tool_content_mapping_or_iterable", "{% for x in [{'a': 1}, [1, 'b'], 'str \"q\"', 42, none, true] %}{{ x is mapping or x is iterable }}:{% if x is mapping or x is iterable %}{{ x | tojson }}{% else %}{{ x }}{% endif %};{% endfor %}"),
    ("qwen25_tool_calls", "{%- set m = {'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'f', 'arguments': {'x': 1, 'y': 'é'}}}, {'name': 'g', 'arguments': {}}]} %}{{- '<|im_start|>' + m.role }}{%- if m.content %}{{- '\\n' + m.content }}{%- endif %}{%- for tool_call in m.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"),
    ("qwen3_tool_call_args_string", "{% for a in ['{\"x\": 1}', {'x': 1}] %}{% if a is string %}{{ a }}{% else %}{{ a | tojson }}{% endif %}|{% endfor %}"),
    ("filter_tojson_options", "{{ {'b': 'é😀\\u007f', 'a': [1, {'d': 2, 'c': none}]}|tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ {'b': [1, 2], 'a': 'x'}|tojson(separators=(',', ':')) }} {{ {'k': [1]}|tojson(indent='--') }} {{ {'k': [1]}|tojson(indent=0) }} {{ [1]|tojson(true, 1, none, true) }}"),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict({'k': 1}, z=2) }} {{ dict([('p', 1), ['q', 2]]) }} {{ dict() }} {{ dict.fromkeys(['a', 'b']) }} {{ dict.fromkeys('xy', 0) }} {{ dict(a=1).items()|list }}"),
    ("error_namespace_underscore", "{% set ns = namespace(_hidden=1) %}{{ ns._hidden }}"),
    ("error_namespace_set_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}"),
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
    # macros (Qwen3-Coder's, Qwen3.5's and gpt-oss's templates define them)
    ("macro_basic", "{% macro greet(name) %}Hi {{ name }}!{% endmacro %}{{ greet('a') }}|{{ greet(messages[0].content) }}"),
    ("macro_defaults_kwargs", "{% macro f(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}"
                              "{{ f(1) }} {{ f(1, 3) }} {{ f(1, c='y') }} {{ f(a=5, b=none) }} {{ f(c=1, a=2) }}"),
    ("macro_default_uses_param", "{% macro f(a, b=a * 2) %}{{ b }}{% endmacro %}{{ f(4) }}{{ f(4, 1) }}"),
    ("macro_missing_arg", "{% macro f(a, b) %}[{{ b }}]{{ b is defined }}{% endmacro %}{{ f(1) }}"),
    ("macro_whitespace", "{%- macro f(x) -%}\n  <{{ x }}>\n{%- endmacro -%}\n{{ f(1) }}{{ f(2)|trim }}\n{% macro g() %}\n  k\n{% endmacro %}[{{ g() }}]"),
    ("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(5) }}"),
    ("macro_sees_globals", "{% set sep = '|' %}{% macro j(xs) %}{% for x in xs %}{{ x.role }}{{ sep }}{% endfor %}{{ bos_token }}{% endmacro %}{{ j(messages) }}"),
    ("macro_called_in_loop", "{% macro r(m, i) %}{{ i }}.{{ m.role|upper }}:{{ m.content }}{% endmacro %}"
                             "{% for m in messages %}{{ r(m, loop.index) }};{% endfor %}"),
    ("macro_value_in_expressions", "{% macro f() %} x {% endmacro %}{{ (f() ~ 'y')|trim }}{{ f()|length }}{{ f() == ' x ' }}"
                                   "{% if f() %}T{% endif %}{% set v = f() %}[{{ v }}]"),
    ("macro_namespace_mutation", "{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}{% endmacro %}"
                                 "{{ bump() }}{{ bump() }}{{ ns.n }}"),
    ("macro_set_stays_inside", "{% set x = 1 %}{% macro f() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ f() }}{{ x }}"),
    ("macro_calls_macro", "{% macro a(x) %}<{{ x }}>{% endmacro %}{% macro b(y) %}{{ a(y) ~ a(y * 2) }}{% endmacro %}{{ b(3) }}"),
    ("macro_loop_inside", "{% macro each(xs) %}{% for x in xs %}{% if loop.first %}[{% endif %}{{ x }}{% if not loop.last %},{% endif %}"
                          "{% if x == 3 %}{% break %}{% endif %}{% endfor %}]{% endmacro %}{{ each([1, 2, 3, 4]) }}{{ each([]) }}"),
    ("macro_trailing_comma", "{% macro f(a, b=1,) %}{{ a + b }}{% endmacro %}{{ f(1) }}"),
    # block assignments, and select / map over a false value (nothing, as Jinja's filters check first)
    ("set_block", "{% set x %}  {{ messages|length }} turns, {{ bos_token }}\n{% endset %}[{{ x }}]{{ x|trim|length }}"),
    ("set_block_in_loop", "{% for m in messages %}{% set t %}{{ m.role }}!{% endset %}{{ t|upper }}{% endfor %}[{{ t }}]"),
    ("set_block_namespace", "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s %}{{ ns.s }}{{ m.role[0] }}{% endset %}"
                            "{% endfor %}{{ ns.s }}"),
    ("set_block_whitespace", "{%- set x -%}\n  a  \n{%- endset -%}\n({{ x }})"),
    ("filters_on_none", "{{ none|selectattr('type', 'equalto', 'x')|list }}{{ none|rejectattr('a')|list|length }}"
                        "{{ ''|select|list }}{{ none|map(attribute='a')|list }}{{ []|map('upper')|list }}"),
    ("macro_outlives_its_loop", "{% set ns = namespace(f=none) %}{% for i in [1, 2] %}{% macro g(x) %}<{{ x }}{{ bos_token }}{{ i is defined }}>{% endmacro %}"
                                "{% set ns.f = g %}{% endfor %}{{ ns.f(7) }}"),
    ("macro_outlives_its_macro", "{% set ns = namespace(f=none) %}{% macro outer() %}{% macro inner(y) %}[{{ y }}{{ eos_token }}]{% endmacro %}"
                                 "{% set ns.f = inner %}{% endmacro %}{{ outer() }}{{ ns.f(3) }}"),
    ("error_macro_too_many_args", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"),
    ("error_macro_unknown_kwarg", "{% macro f(a) %}{% endmacro %}{{ f(b=1) }}"),
    ("error_macro_raises", "{% macro f(a) %}{{ raise_exception('bad ' ~ a) }}{% endmacro %}x{{ f(7) }}"),
    ("error_macro_not_defined_yet", "{{ f(1) }}{% macro f(a) %}{{ a }}{% endmacro %}"),
    # syntax errors
    ("syntax_unclosed_macro", "{% macro f() %}never closed"),
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

    class TemplateDict:  # transformers' `dict` global: dict(...) and dict.fromkeys(...)
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):  # transformers' namespace: no _names
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def drop_none(messages):
    """transformers 5 drops the keys whose value is None before rendering (absent, not None)."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def render_jinja2(env, source, messages, add_generation_prompt, bos, eos):
    """{"expected": text} or {"error": message}, from plain jinja2 set up as transformers sets it up."""
    tokens = {}
    if bos is not None:
        tokens["bos_token"] = bos
    if eos is not None:
        tokens["eos_token"] = eos
    try:
        t = env.from_string(source)
        return {"expected": t.render(messages=drop_none(messages), tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt, **tokens)}
    except Exception as e:  # noqa: BLE001 — every error is a golden too
        return {"error": f"{type(e).__name__}: {e}"}


class FixedClock(datetime.datetime):
    """transformers' strftime_now reads datetime.now(): this one always says FIXED_TIME (UTC)."""

    @classmethod
    def now(cls, tz=None):
        t = datetime.datetime.fromtimestamp(FIXED_TIME, tz=datetime.timezone.utc)
        return t if tz is not None else t.replace(tzinfo=None)


_tokenizers = {}


def render_transformers(source, messages, add_generation_prompt, bos, eos):
    """{"expected": text} or {"error": message}, from tokenizer.apply_chat_template itself."""
    key = (bos, eos)
    if key not in _tokenizers:
        tokens = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        _tokenizers[key] = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER, **tokens)
    tok = _tokenizers[key]
    try:
        return {"expected": tok.apply_chat_template(messages, chat_template=source, tokenize=False,
                                                    add_generation_prompt=add_generation_prompt)}
    except Exception as e:  # noqa: BLE001 — every error is a golden too
        return {"error": f"{type(e).__name__}: {e}"}


def renderer():
    """The function that renders (source, messages, agp, bos, eos), and its name for goldens.json."""
    if transformers is not None:
        if not hasattr(chat_template_utils, "datetime"):
            sys.exit("transformers.utils.chat_template_utils has no `datetime` to fix strftime_now's clock with")
        chat_template_utils.datetime = FixedClock
        return render_transformers, f"transformers {transformers.__version__} apply_chat_template"
    env = environment()
    return (lambda *a: render_jinja2(env, *a)), "jinja2 set up as transformers does (transformers not installed)"


def build():
    render, name = renderer()
    cases = []
    for file, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(HERE, file), encoding="utf-8", newline="") as f:
            source = f.read()
        for conv, messages in CONVERSATIONS.items():
            for agp in (True, False):
                case = {"template": file, "conversation": conv, "add_generation_prompt": agp,
                        "bos_token": bos, "eos_token": eos}
                case.update(render(source, messages, agp, bos, eos))
                cases.append(case)
    snippets = []
    for sname, source in SNIPPETS:
        s = {"name": sname, "template": source}
        s.update(render(source, CONVERSATIONS["multi_turn"], True, "<s>", "</s>"))
        snippets.append(s)
    return {
        "generated_by": "tools/make_chat_goldens.py",
        "renderer": name,
        "transformers": transformers.__version__ if transformers is not None else None,
        "jinja2": jinja2.__version__,
        "python": platform.python_version(),
        "fixed_time": FIXED_TIME,
        "snippet_conversation": "multi_turn",
        "conversations": CONVERSATIONS,
        "cases": cases,
        "snippets": snippets,
    }


VERSION_KEYS = ("renderer", "transformers", "jinja2", "python")


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
    d = build()
    text = json.dumps(d, ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(HERE, "goldens.json")
    if args.check:  # the outputs must agree; the versions that wrote them may differ
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if {k: v for k, v in old.items() if k not in VERSION_KEYS} != {k: v for k, v in d.items() if k not in VERSION_KEYS}:
            sys.exit(f"{path} is not what this script writes now with {d['renderer']} (rerun it without --check)")
        print(f"{path}: up to date ({d['renderer']}; the file was written by {old.get('renderer')})")
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    n_err = sum("error" in c for c in d["cases"]) + sum("error" in s for s in d["snippets"])
    print(f"wrote {path} with {d['renderer']}: {len(d['cases'])} template cases, "
          f"{len(d['snippets'])} snippets ({n_err} of them errors)")


if __name__ == "__main__":
    main()
