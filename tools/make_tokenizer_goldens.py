#!/usr/bin/env python3
"""Expected tokenizer outputs from Hugging Face `tokenizers`, for tests/test_tokenizer.c.

Run once (needs `pip install tokenizers`; the C code and its tests never need Python):
    python3 tools/make_tokenizer_goldens.py
Also writes tests/data/tokenizers/tiny-tokenizer.json, a small byte-level tokenizer trained here
that uses the features the two real tokenizers do not (see build_tiny).
Writes tests/data/tokenizers/goldens-<name>.json for each tokenizer in that directory:
    {"tokenizers_version": ..., "cases": [{"text", "ids", "ids_special", "decoded",
     "decoded_skip"}], "decode_cases": [{"ids", "text", "text_skip"}]}
"ids" is encode(text, add_special_tokens=False), "ids_special" the same with True;
"decoded" / "decoded_skip" are decode(ids_special, skip_special_tokens=False / True).
"decode_cases" decode random and hand-picked id lists (invalid UTF-8, unknown ids).
Also writes tests/data/tokenizers/goldens-sp32k-metaspace.json: the sp32k tokenizer rewritten the
way newer HF exports of Llama-2 / Mistral look (normalizer null, a Metaspace pre-tokenizer and
decoder), one variant per prepend_scheme / split / legacy spelling (METASPACE_VARIANTS). Each
variant stores its "pre_tokenizer" and "decoder" JSON; the C test makes the same edit to
sp32k-tokenizer.json at run time, so no 1.8 MB copy is committed.

    python3 tools/make_tokenizer_goldens.py --random-diff 20000 [--seed 1]
instead writes nothing under tests/: a differential test beyond the committed corpus. Random
strings (ASCII, CJK, Korean, Cyrillic, Arabic, Devanagari, Thai, combining marks and what NFC
composes, emoji parts, special-token texts, whitespace, NUL, BOM; 1..200 characters; half
with add_special_tokens) go to build/diff/<name>.jsonl with HF's ids, and
`build/bin/tokenize --check` compares (needs `make build/bin/tokenize`).
"""
import argparse
import json
import os
import random
import subprocess
import sys

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")

CORPUS = [
    # empty and one-character strings
    "", " ", "a", "A", "\n", "\t", "0", ".", "中", "é", "😀", "\u00a0", "'", "▁", "\x00",
    # English
    "Hello world",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing spaces  ",
    "It's, I'm, you're, they've, we'll, she'd, don't, can't, won't",
    "IT'S I'M YOU'RE THEY'VE WE'LL SHE'D DON'T",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "rock'n'roll o'clock y'all",
    "Mr. Smith paid $1,234.56 on 2024-03-15 at 10:30am (UTC+8).",
    "Numbers: 0 1 12 123 1234 12345 123456 3.14159 -42 1e-10 0x1F 1,000,000",
    "Unicode digits: ١٢٣ ४५६ 七八九 ⅣⅤ ²³",
    "Email: someone@example.com, URL: https://example.com/path?q=1&r=two#frag",
    "ALL CAPS SENTENCE WITH SHOUTING!!!",
    "Tabs\tand\ttabs\t\tand newlines\n\nand\r\nwindows\rline endings",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    # whitespace runs
    "a  b   c    d     e",
    "    ",
    "\n\n\n",
    "\t\t\t",
    " \t \n \r\n ",
    "word\n\n\n\nword",
    "trailing newline\n",
    "x" + " " * 40 + "y",
    "\u3000full-width\u3000space",
    "nbsp\u00a0here\u2009thin\u202fnarrow",
    "line\u2028separator\u2029paragraph",
    # Chinese
    "你好，世界！",
    "大语言模型的推理引擎需要分词器把文本变成词元。",
    "我们今天学习KV缓存和连续批处理，明天学习分页注意力。",
    "中文标点：，。、；：？！“”‘’（）《》【】……——",
    "混合English和中文mixed在一起123个数字",
    "繁體中文：這是一個測試。",
    "𠀀𠀁𪚥 rare CJK extension characters",
    # Japanese
    "こんにちは、世界！",
    "日本語のテキストをトークン化します。カタカナ、ひらがな、漢字。",
    "ｶﾀｶﾅ half-width katakana ｱｲｳｴｵ",
    # Korean, other scripts
    "안녕하세요 세계",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Γειά σου Κόσμε",
    # emoji: ZWJ sequences, skin tones, flags, keycaps
    "😀😃😄😁",
    "👨‍👩‍👧‍👦 family",
    "👩🏽‍💻 coder 👍🏿 thumbs",
    "🏳️‍🌈 rainbow flag 🏴‍☠️ pirate",
    "🇨🇳🇺🇸🇯🇵🇩🇪 flags",
    "1️⃣ #️⃣ keycaps",
    "❤️ ♥ ☺️ text vs emoji presentation",
    "emoji🙂inside🙃words",
    # accents and combining marks (NFC vs NFD)
    "café naïve résumé",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "A\u030a \u212b \u00c5",
    "e\u0301\u0302\u0303 stacked marks",
    "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
    "\u1100\u1161\u11a8 jamo \uac01",
    "\u0b47\u0b3e oriya",
    "\uf900 compatibility ideograph",
    "Tiếng Việt có dấu",
    "Ǆ ǅ ǆ ﬁ ﬂ ligatures",
    # code
    "def main():\n    print(\"hello\")\n    return 0\n",
    "int main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n}\n",
    "if (x != y && y >= 0) { z = x << 2 | y >> 1; }",
    "const f = async (a, b) => { await g(a ?? b); };",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    "<html><body><div class=\"x\">text</div></body></html>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "x=1;y=2;z=x+y*3/4-5%6",
    "    indented\n        more\n\tand tab\n",
    "__init__ __name__ self._private snake_case camelCase PascalCase",
    "$ make test SANITIZE=1 && ./build/bin/tokenize --json",
    # special tokens and chat templates
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "text<|endoftext|>text",
    "  <|im_start|>  spaces around  <|im_end|>  ",
    "<|im_start", "<|im_start|", "<|<|im_start|>|>", "|>",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<s>[INST] What is 2+2? [/INST] 4</s>",
    "<s><s></s>",
    "<s> hello</s> world",
    "a<s>b",
    "<unk> token",
    "<0x41> literal byte token text",
    # odd characters
    "\ufeffBOM at start",
    "replacement \ufffd char",
    "control \x01\x02\x1f\x7f chars",
    "zero\u200bwidth\u200cjoiner\u200d",
    "𝕳𝖊𝖑𝖑𝖔 math letters",
    "\U0010fffd private use plane 16",
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
    "...---...",
    "a" * 300,
    "ab" * 200,
    " " * 100,
    "\n" * 50,
]

LONG = [
    "Large language models generate text one token at a time. " * 8,
    "分词器把文本切成词元，模型再把词元变成向量。" * 10,
    "for (int i = 0; i < n; i++) {\n    sum += a[i] * b[i];\n}\n" * 6,
]


def encode_cases(tok, corpus):
    cases = []
    for text in corpus:
        e0 = tok.encode(text, add_special_tokens=False)
        e1 = tok.encode(text, add_special_tokens=True)
        cases.append({
            "text": text,
            "ids": e0.ids,
            "ids_special": e1.ids,
            "decoded": tok.decode(e1.ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(e1.ids, skip_special_tokens=True),
        })
    return cases


def decode_cases(tok):
    rng = random.Random(1234)
    vs = tok.get_vocab_size(with_added_tokens=True)
    lists = []
    for _ in range(60):
        lists.append([rng.randrange(vs) for _ in range(rng.randrange(1, 12))])
    # byte-level pieces of multi-byte characters, cut and shuffled: invalid UTF-8
    for s in ["中文", "😀", "é", "👨‍👩‍👧"]:
        ids = tok.encode(s, add_special_tokens=False).ids
        lists += [ids[:1], ids[1:], ids[::-1], ids + ids[:1]]
    byte_ids = [tok.token_to_id(t) for t in ["<0xE4>", "<0xB8>", "<0xAD>", "<0x80>", "<0xFF>", "<0x41>"]]
    if all(i is not None for i in byte_ids):
        e4, b8, ad, x80, xff, a41 = byte_ids
        lists += [[e4, b8, ad], [e4, b8], [e4, b8, a41], [x80], [xff, a41], [e4, x80, ad], [a41, e4]]
    lists += [[], [vs + 5], [0, vs + 100, 1]]
    return [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
             "text_skip": tok.decode(ids, skip_special_tokens=True)} for ids in lists]


TINY_EXTRA = [
    " <|user|>  hi there <|user|>x", "a[MASK]b [MASK] c [MASK]", "say Hello world and hello world!",
    "x  <sep>y<sep>", "Ünï and U\u0308n\u0131\u0308 forms", "``quoted`` text", "a||b||||c", "en--dash--es",
    "12 345 6789", "<s> literal </s>", "hello   world", "hellohello world",
]


META_EXTRA = [
    " leading space", "  two leading spaces", "▁already a metaspace", "▁▁two", "a▁b ▁ c",
    "trailing space ", "<s> x", "<s>x", "x<s> y", " <s>", "<s>", "</s> </s>", "a </s>b", "<s>▁", "▁<s>",
    "<unk><s></s>", "many     spaces   here", " ", "  ", "<s> ", "<s>  hi", "　ideographic space",
    "\n newline then space", "hello▁▁▁world", "x▁", "▁",
]

MS = "▁"


def _ms(scheme=None, split=None, legacy=False):
    d = {"type": "Metaspace", "replacement": MS}
    if legacy:  # old exports: add_prefix_space (and str_rep) instead of prepend_scheme
        d.update({"str_rep": MS, "add_prefix_space": True})
    if scheme is not None:
        d["prepend_scheme"] = scheme
    if split is not None:
        d["split"] = split
    return d


# name -> (pre_tokenizer, decoder); the decoders include Metaspace alone and inside a Sequence
# with ByteFallback/Fuse, before and after ByteFallback.
METASPACE_VARIANTS = {
    "first": (_ms("first", False),
              {"type": "Sequence", "decoders": [_ms("first", False), {"type": "ByteFallback"}, {"type": "Fuse"}]}),
    "always": (_ms("always", False),
               {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, _ms("always", False), {"type": "Fuse"}]}),
    "first_split": (_ms("first", True), _ms("first", True)),
    "always_split": (_ms("always", True),
                     {"type": "Sequence", "decoders": [_ms("always", True), {"type": "ByteFallback"}, {"type": "Fuse"}]}),
    "legacy_add_prefix_space": (_ms(legacy=True), _ms(legacy=True)),
    "never": (_ms("never", False),
              {"type": "Sequence", "decoders": [_ms("never", False), {"type": "ByteFallback"}, {"type": "Fuse"}]}),
}


def metaspace_variant(name):
    """sp32k-tokenizer.json with the normalizer removed and a Metaspace pre-tokenizer and decoder."""
    with open(os.path.join(DATA, "sp32k-tokenizer.json"), encoding="utf-8") as f:
        root = json.load(f)
    pre, dec = METASPACE_VARIANTS[name]
    root["normalizer"] = None
    root["pre_tokenizer"] = pre
    root["decoder"] = dec
    return root


def write_metaspace_goldens():
    variants = []
    for name in METASPACE_VARIANTS:
        root = metaspace_variant(name)
        tok = Tokenizer.from_str(json.dumps(root))
        variants.append({"name": name, "pre_tokenizer": root["pre_tokenizer"], "decoder": root["decoder"],
                         "cases": encode_cases(tok, CORPUS + LONG + TINY_EXTRA + META_EXTRA),
                         "decode_cases": decode_cases(tok)})
    out = {"tokenizers_version": tokenizers.__version__, "base": "sp32k", "variants": variants}
    path = os.path.join(DATA, "goldens-sp32k-metaspace.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(variants)} variants x {len(variants[0]['cases'])} texts")


def build_tiny(path):
    """A small byte-level tokenizer with the features the two real ones do not use:
    lstrip/rstrip/single_word/normalized added tokens, Replace normalizer, Split with a String
    pattern and with Removed, ByteLevel add_prefix_space + use_regex, ignore_merges, BOS+EOS."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace("``", '"')])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\|\|"), behavior="removed"),
        pre_tokenizers.Split("--", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([t for t in CORPUS + LONG + TINY_EXTRA if t] * 3, trainer)
    tok.add_special_tokens([AddedToken("<|user|>", lstrip=True, rstrip=True), AddedToken("[MASK]", single_word=True),
                            AddedToken("<sep>", lstrip=True)])
    tok.add_tokens([AddedToken("hello world", normalized=True), AddedToken("Ünï", normalized=True)])
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", s), ("</s>", e)])
    tok.save(path)


POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\r.,;:'\"!?-_()[]{}<>|/\\@#$%^&*+=~`")
        + list("你好世界中文分词器模型推理的一是了我不人在他有这个上们来到时大地为子说生国年着就那和要她出也得里后自以会家可下而过天去能对小多然于心学")
        + list("こんにちはカタカナ한국어안녕Привет مرحبا שלום नमस्ते สวัสดี")
        + ["\u0301", "\u0308", "\u0327", "\u200d", "\ufe0f", "\u3000", "\u00a0", "\u2028", "\u0b3e", "\u0b47", "\u1100",
           "\u1161", "\u11a8", "😀", "👍", "🏽", "👨", "👩", "🇨", "🇳", "❤", "\U0001F9D1", "\U0001FAE0", "\U00020000",
           "\U0002A6A5", "\uf900", "\u212b", "\u00c5", "é", "ñ", "ǅ", "ﬁ", "'s", "'LL", "<|im_start|>", "<|im_end|>",
           "<|endoftext|>", "<s>", "</s>", "<unk>", "<think>", "▁", "  ", "\n\n", "\x00", "\x7f", "\ufeff", "\ufffd",
           "\U000E0067", "\U0001D400", "\u0e33", "\u0f73", "\u1b3b", "\u09be", "\u09c7", "\u0cd5", "\u0cbf", "\u3099",
           "\u304b", "\uff76", "\uff9e"])


def random_diff(n, seed):
    out_dir = os.path.join(ROOT, "build", "diff")
    os.makedirs(out_dir, exist_ok=True)
    failed = False
    files = [os.path.join(DATA, f) for f in sorted(os.listdir(DATA)) if f.endswith("-tokenizer.json")]
    for name in METASPACE_VARIANTS:  # the Metaspace variants of sp32k, written under build/diff
        path = os.path.join(out_dir, f"sp32k-ms-{name}-tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(metaspace_variant(name), f, ensure_ascii=False)
        files.append(path)
    for tj in files:
        name = os.path.basename(tj)[: -len("-tokenizer.json")]
        tok = Tokenizer.from_file(tj)
        rng = random.Random(seed)
        path = os.path.join(out_dir, f"{name}.jsonl")
        with open(path, "w") as f:
            for i in range(n):
                s = "".join(rng.choice(POOL) for _ in range(rng.choice([1, 2, 3, 5, 8, 20, 60, 200])))
                sp = bool(i & 1)
                f.write(json.dumps({"text": s, "ids": tok.encode(s, add_special_tokens=sp).ids, "add_special": sp}) + "\n")
        r = subprocess.run([os.path.join(ROOT, "build", "bin", "tokenize"), "--tokenizer", tj, "--check", path])
        failed |= r.returncode != 0
    sys.exit(1 if failed else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random-diff", type=int, default=0, metavar="N")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--metaspace-only", action="store_true", help="write only goldens-sp32k-metaspace.json")
    args = ap.parse_args()
    if args.random_diff:
        random_diff(args.random_diff, args.seed)
    write_metaspace_goldens()
    if args.metaspace_only:
        return
    build_tiny(os.path.join(DATA, "tiny-tokenizer.json"))
    names = sorted(f[: -len("-tokenizer.json")] for f in os.listdir(DATA) if f.endswith("-tokenizer.json"))
    if not names:
        sys.exit(f"no *-tokenizer.json in {DATA}")
    for name in names:
        tok = Tokenizer.from_file(os.path.join(DATA, f"{name}-tokenizer.json"))
        out = {
            "tokenizers_version": tokenizers.__version__,
            "cases": encode_cases(tok, CORPUS + LONG + TINY_EXTRA),
            "decode_cases": decode_cases(tok),
        }
        path = os.path.join(DATA, f"goldens-{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=True, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {len(out['cases'])} texts, {len(out['decode_cases'])} decode cases")


if __name__ == "__main__":
    main()
