#!/usr/bin/env python3
"""Single-thread encode throughput: the C tokenizer vs Hugging Face `tokenizers`, side by side.

    make build/bin/tokenize && python3 tools/bench_tokenizer.py [--seconds 3] [--mb 2]

Builds one corpus file (build/bench/tokenizer-corpus.txt: the test corpus of
tools/make_tokenizer_goldens.py -- English, Chinese, Japanese, emoji, code, whitespace, chat
special tokens -- plus English prose and Python source found on this machine), then for each
tokenizer in tests/data/tokenizers encodes it, repeatedly, in both, as the whole file in one
call and as ~4 KB documents (cut after the first newline past every 4096 bytes):
  - HF: Tokenizer.encode / encode_batch(add_special_tokens=False) with RAYON_NUM_THREADS=1
    (the cpu/wall column shows it ran on one thread);
  - C:  build/bin/tokenize --file ... --bench [--docs 4096] (one thread).
Both warm up once (word caches filled), then report the median time of the repeats.
Prints one table (MB/s HF, MB/s C, ratio C/HF) and checks that both give the same ids.
"""
import argparse
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from make_tokenizer_goldens import CORPUS, LONG  # noqa: E402


def build_corpus(path, mb):
    rng = random.Random(0)
    parts = []
    prose = [p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p)]
    code = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    for p in prose[:6] + code[:40]:
        with open(p, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    texts = [t for t in CORPUS + LONG if t]
    size = sum(len(p.encode()) for p in parts)
    while size < mb * 1e6:
        chunk = "\n".join(rng.choice(texts) for _ in range(50))
        parts.append(chunk)
        size += len(chunk.encode())
    rng.shuffle(parts)
    text = "\n\n".join(parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text


def split_docs(data, n):
    """The documents of `tokenize --docs n`: cut after the first newline at or past every n bytes."""
    if n <= 0:
        return [data.decode()]
    docs, d = [], 0
    while d < len(data):
        e = min(d + n, len(data))
        nl = data.find(b"\n", e)
        e = nl + 1 if nl >= 0 else len(data)
        docs.append(data[d:e].decode())
        d = e
    return docs


def bench_hf(tok, docs, seconds):
    """Median seconds to encode all docs; also the CPU/wall ratio (1.0 = one thread)."""
    def run():
        if len(docs) == 1:
            return [tok.encode(docs[0], add_special_tokens=False)]
        return tok.encode_batch(docs, add_special_tokens=False)  # RAYON_NUM_THREADS=1: one thread
    run()  # warm-up
    times, cpu, wall = [], 0.0, 0.0
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        a, c = time.perf_counter(), time.process_time()
        run()
        times.append(time.perf_counter() - a)
        cpu += time.process_time() - c
        wall += times[-1]
    return statistics.median(times), cpu / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--mb", type=float, default=2.0)
    args = ap.parse_args()
    corpus_path = os.path.join(ROOT, "build", "bench", "tokenizer-corpus.txt")
    text = build_corpus(corpus_path, args.mb)
    nbytes = len(text.encode())
    exe = os.path.join(ROOT, "build", "bin", "tokenize")
    rows = []
    data = text.encode()
    for tj in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "tokenizers", "*-tokenizer.json"))):
        name = os.path.basename(tj)[: -len("-tokenizer.json")]
        tok = Tokenizer.from_file(tj)
        hf_ids = tok.encode(text, add_special_tokens=False).ids
        c_ids = json.loads(subprocess.check_output([exe, "--tokenizer", tj, "--file", corpus_path, "--json"]))["ids"]
        for mode, n in (("whole file", 0), ("4 KB docs", 4096)):
            docs = split_docs(data, n)
            hf_s, hf_cpu = bench_hf(tok, docs, args.seconds)
            out = subprocess.check_output([exe, "--tokenizer", tj, "--file", corpus_path, "--bench", "--docs", str(n),
                                           "--seconds", str(args.seconds), "--json"])
            row = json.loads(out)["rows"][0]
            c_mbs, c_cpu = row["MB_per_s"], row["cpu_per_wall"]
            hf_mbs = nbytes / hf_s / 1e6
            rows.append((name, mode, len(docs), len(hf_ids), hf_mbs, hf_cpu, c_mbs, c_cpu, c_mbs / hf_mbs,
                         hf_ids == c_ids))
    import tokenizers
    print(f"# corpus: {os.path.relpath(corpus_path, ROOT)} ({nbytes} bytes); HF tokenizers {tokenizers.__version__} "
          f"with RAYON_NUM_THREADS=1 vs build/bin/tokenize --bench; median of repeats over {args.seconds:.0f} s "
          f"after one warm-up; host {os.uname().nodename}, {os.cpu_count()} CPUs")
    print(f"{'tokenizer':<10} {'input':<11} {'docs':>5} {'tokens':>8} {'HF MB/s':>8} {'HF cpu/wall':>11} "
          f"{'C MB/s':>8} {'C cpu/wall':>10} {'C/HF':>6}  same ids")
    for name, mode, nd, n, h, hc, c, cc, r, same in rows:
        print(f"{name:<10} {mode:<11} {nd:>5} {n:>8} {h:>8.2f} {hc:>11.2f} {c:>8.2f} {cc:>10.2f} {r:>6.2f}  "
              f"{'yes' if same else 'NO'}")
    if not all(r[-1] for r in rows):
        sys.exit("ids differ between C and HF on the bench corpus")

if __name__ == "__main__":
    main()
