#!/usr/bin/env python3
"""The peers' side of the offline benchmarks: vLLM and Hugging Face transformers run the request
files that workloads.py writes (the ones `llm bench --requests FILE` runs), and report the numbers
under the names of `llm bench --json`'s summary.

What is measured
  --requests FILE.jsonl   throughput of one offline workload: every request is known at time 0.
    vllm  LLM(model=DIR, dtype of config.json, seed 0, token ids in and out: no tokenizer is
          loaded); one warm-up generate of a short id prompt, then ONE llm.generate() of all the
          requests (each with its own SamplingParams(temperature, ignore_eos, max_tokens);
          temperature 0 is greedy), timed with time.perf_counter around that call (--repeat N: N such
          calls, the median run's numbers reported, the lower middle one for an even N, and every
          run's listed). Before each timed call vLLM's prefix cache is emptied
          (LLM.reset_prefix_cache()), so that every call starts as cold as the first: vLLM keeps the
          blocks of finished requests hashed until it needs them, and its pool holds a whole nano
          run, so without the reset a second call of the same prompts finds every full prompt block
          cached and skips most of its prefill (--keep-prefix-cache: no reset, the old behaviour).
          llm bench's timed run never finds its prompts cached (its warm-up bypasses the scheduler).
          vLLM's own
          scheduler batches them (continuous batching, paged KV, CUDA graphs unless
          --enforce-eager).
    hf    the naive baseline: AutoModelForCausalLM on --device, static batches of --batch-size
          requests in file order, left-padded with an attention mask, one model.generate() per
          batch (the default dynamic KV cache) with max_new_tokens = min_new_tokens = the batch's
          largest max_tokens, so EOS never ends a row early and every row runs to that length.
          One warm-up batch (the first batch, at most 32 new tokens) before the clock;
          torch.cuda.synchronize() before starting and before stopping it. Per-request latency
          (ttft/tpot/e2e_ms_p50/p99, llm bench's names): a streamer notes when each step's tokens
          reach the host; a request's TTFT is its batch's first step, its E2E its own last token
          (every request arrives at time 0, so later batches' TTFT include the batches before).
          peak_gpu_memory_gib is
          torch.cuda.max_memory_allocated() over the timed batches (weights included: weights_gib);
          gpu_memory_used_gib is the device's total - free at the end (the CUDA context and torch's
          cached blocks included), as llm bench --json reports it. The tokens a row
          generates past its request's own max_tokens are padding work: they are counted in
          padded_output_tokens, not in output_tokens.
    output_tokens  = sum of the requests' max_tokens (what nano-vllm's bench.py counts; with
                     ignore_eos every request produces exactly that many);
    output_tok_s   = output_tokens / duration_s; total_tok_s adds the prompt tokens;
    requests_s     = requests / duration_s;
    output_tokens_returned = the tokens the engine actually handed back (hf: padding included).
  --decode1               batch-1 decode latency: one 128-id prompt (random.Random(1234), ids in
          [0, min(10000, vocab - 1)]), 256 new tokens, greedy, EOS ignored. One warm-up, then the
          median of 5 runs; the same for max_tokens = 1 (prefill + one token); TPOT = (median -
          median_1) / 255, decode tok/s = 1 / TPOT. hf: model.generate with its default dynamic
          cache, torch.cuda.synchronize() around every run.

The JSON (--out, written to a temporary file and renamed): engine, versions, the device, the date
(UTC), the model directory and its shape, every option, and the numbers; one summary line is
printed. Nothing is downloaded: the model directory must hold config.json and the weights.

usage: python3 final/bench/peer_bench.py --engine vllm|hf --model-dir DIR
           (--requests FILE.jsonl | --decode1) --out FILE.json
           [--gpu-memory-utilization 0.9] [--max-model-len 4096] [--max-num-seqs N] [--enforce-eager]
           [--batch-size N] [--device cuda|cpu] [--limit N] [--max-tokens-cap N] [--decode-tokens N] [--repeat N]
           [--keep-prefix-cache]

  python3 final/bench/workloads.py nano /tmp/nano.jsonl
  python3 final/bench/peer_bench.py --engine vllm --model-dir /tmp/m/q3 --requests /tmp/nano.jsonl --out vllm_nano.json
  python3 final/bench/peer_bench.py --engine vllm --model-dir /tmp/m/q3 --decode1 --out vllm_decode1.json
  python3 final/bench/peer_bench.py --engine hf --model-dir /tmp/m/q3 --requests /tmp/nano.jsonl --batch-size 32 --out hf_nano.json
  python3 final/bench/peer_bench.py --engine hf --model-dir /tmp/m/q3 --decode1 --out hf_decode1.json
  # a CPU smoke test in seconds (the capped numbers are not a benchmark):
  python3 final/bench/peer_bench.py --engine hf --device cpu --model-dir /tmp/tiny --requests /tmp/nano.jsonl \\
      --limit 4 --batch-size 2 --max-tokens-cap 8 --out /tmp/hf.json

vLLM is imported only by --engine vllm (its site directory on PYTHONPATH: final/bench/README.md).
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time

# Local model directories only: never reach for a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The fields of a request line that llm bench knows (step04_batching/bench_main.c, read_jsonl).
KNOWN_FIELDS = ("prompt_ids", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
                "arrival_s")
DECODE1_PROMPT_LEN = 128
DECODE1_TOKENS = 256
DECODE1_RUNS = 5
HF_WARMUP_TOKENS = 32


class BenchError(Exception):
    pass


def die(msg):
    print(f"peer_bench: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------
# The model directory and the request file


def read_config(model_dir):
    if not os.path.isdir(model_dir):
        raise BenchError(f"--model-dir {model_dir}: no such directory")
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise BenchError(f"{path}: missing (a Hugging Face model directory has config.json and the weights)")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: cannot read it as JSON: {e}")
    if not isinstance(cfg, dict):
        raise BenchError(f"{path}: expected a JSON object")
    # Some multimodal or nested configs keep the language model's fields under text_config.
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}

    def get(k):
        return cfg.get(k, text.get(k))

    vocab = get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        raise BenchError(f"{path}: no integer vocab_size")
    dtype = get("torch_dtype") or get("dtype")  # transformers 5 writes "dtype"
    return dict(architectures=cfg.get("architectures"), model_type=cfg.get("model_type"),
                hidden_size=get("hidden_size"), num_hidden_layers=get("num_hidden_layers"),
                num_attention_heads=get("num_attention_heads"), num_key_value_heads=get("num_key_value_heads"),
                intermediate_size=get("intermediate_size"), vocab_size=vocab,
                max_position_embeddings=get("max_position_embeddings"),
                dtype=dtype if isinstance(dtype, str) else None)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_requests(path, vocab, limit=None):
    """The request lines, checked as llm bench checks them; stops after `limit` requests."""
    if not os.path.isfile(path):
        raise BenchError(f"--requests {path}: no such file")
    reqs = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(reqs) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                o = json.loads(line)
            except ValueError as e:
                raise BenchError(f"{where}: not JSON: {e}")
            if not isinstance(o, dict):
                raise BenchError(f"{where}: expected one JSON object per line")
            for k in o:
                if k not in KNOWN_FIELDS:
                    raise BenchError(f"{where}: field \"{k}\": unknown (known: {', '.join(KNOWN_FIELDS)})")
            ids = o.get("prompt_ids")
            if ids is None:
                raise BenchError(f"{where}: field \"prompt_ids\": missing")
            if not isinstance(ids, list) or not ids:
                raise BenchError(f"{where}: field \"prompt_ids\": must be a non-empty array of token ids")
            for i, t in enumerate(ids):
                if not _is_int(t) or not 0 <= t < vocab:
                    raise BenchError(f"{where}: field \"prompt_ids\": element {i} ({t!r}) is not a token id in "
                                     f"0..{vocab - 1} (the model's vocab_size is {vocab})")
            if "max_tokens" not in o:
                raise BenchError(f"{where}: field \"max_tokens\": missing")
            mt = o["max_tokens"]
            if not _is_int(mt) or mt < 1:
                raise BenchError(f"{where}: field \"max_tokens\": must be an integer >= 1, not {mt!r}")
            r = dict(line=lineno, prompt_ids=ids, max_tokens=mt)
            for k, lo, hi, integer, default in (("temperature", 0, 100, False, 0.0), ("top_p", 1e-6, 1, False, 1.0),
                                                ("top_k", 0, 1 << 30, True, 0), ("min_p", 0, 0.999999, False, 0.0),
                                                ("seed", 0, 2 ** 53, True, None), ("arrival_s", 0, 1e9, False, 0.0)):
                v = o.get(k, default)
                if v is None:
                    r[k] = None
                    continue
                if not (_is_int(v) if integer else _is_num(v)):
                    raise BenchError(f"{where}: field \"{k}\": must be {'an integer' if integer else 'a number'}")
                if not lo <= v <= hi:
                    raise BenchError(f"{where}: field \"{k}\": {v} is outside {lo}..{hi}")
                r[k] = v
            ie = o.get("ignore_eos", False)
            if not isinstance(ie, bool):
                raise BenchError(f"{where}: field \"ignore_eos\": must be true or false")
            r["ignore_eos"] = ie
            reqs.append(r)
    if not reqs:
        raise BenchError(f"{path}: no requests")
    return reqs


def decode1_prompt(vocab):
    rng = random.Random(1234)
    return [rng.randint(0, min(10000, vocab - 1)) for _ in range(DECODE1_PROMPT_LEN)]


def throughput(reqs, dt, returned):
    n_out = sum(r["max_tokens"] for r in reqs)
    n_in = sum(len(r["prompt_ids"]) for r in reqs)
    return dict(num_requests=len(reqs), prompt_tokens=n_in, output_tokens=n_out, output_tokens_returned=returned,
                duration_s=round(dt, 6), output_tok_s=round(n_out / dt, 3), total_tok_s=round((n_out + n_in) / dt, 3),
                requests_s=round(len(reqs) / dt, 4))


def percentile(v, q):
    """q-quantile of v with linear interpolation between the sorted values (numpy's default; llm bench's)."""
    s = sorted(v)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def decode1_summary(times, times1, n_out, returned):
    med, med1 = statistics.median(times), statistics.median(times1)
    tpot = (med - med1) / (n_out - 1)
    return dict(prompt_len=DECODE1_PROMPT_LEN, max_tokens=n_out, runs=len(times), output_tokens_returned=returned,
                times_s=[round(t, 6) for t in times], median_s=round(med, 6),
                tok_s_incl_prefill=round(n_out / med, 3),
                times_max_tokens_1_s=[round(t, 6) for t in times1], median_max_tokens_1_s=round(med1, 6),
                tpot_ms=round(tpot * 1e3, 4), decode_tok_s=round(1 / tpot, 3) if tpot > 0 else None)


# ---------------------------------------------------------------------------------------------
# vLLM

VLLM_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # sample with vLLM's own kernels (FlashInfer may be absent)
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
}


def run_vllm(a, cfg, reqs, res):
    for k, v in VLLM_ENV.items():
        os.environ.setdefault(k, v)
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except ImportError as e:
        raise BenchError(f"--engine vllm: cannot import vllm ({e}); put vLLM's site directory on PYTHONPATH "
                         "(final/bench/README.md)")
    import torch
    import transformers
    res["engine_version"] = vllm.__version__
    res["torch_version"] = torch.__version__
    res["transformers_version"] = transformers.__version__

    if reqs is not None:
        for r in reqs:
            if len(r["prompt_ids"]) + r["max_tokens"] > a.max_model_len:
                raise BenchError(f"{a.requests}:{r['line']}: prompt ({len(r['prompt_ids'])}) + max_tokens "
                                 f"({r['max_tokens']}) exceeds --max-model-len {a.max_model_len}")
    kw = dict(model=a.model_dir, dtype=cfg["dtype"] or "auto", gpu_memory_utilization=a.gpu_memory_utilization,
              max_model_len=a.max_model_len, seed=0, enforce_eager=a.enforce_eager,
              skip_tokenizer_init=True)  # ids in, ids out: no tokenizer, no detokenization
    if a.max_num_seqs is not None:
        kw["max_num_seqs"] = a.max_num_seqs
    res["options"]["vllm_llm_kwargs"] = {k: v for k, v in kw.items()}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    res["engine_start_s"] = round(time.perf_counter() - t0, 3)
    res["device"] = vllm_gpu_name()
    try:  # what the engine settled on (max_num_seqs and the token budget default by GPU)
        sc = llm.llm_engine.vllm_config.scheduler_config
        res["vllm_scheduler"] = dict(max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens)
    except Exception:
        pass

    def sp(temperature, max_tokens, ignore_eos, r=None):
        p = dict(temperature=float(temperature), max_tokens=int(max_tokens), ignore_eos=bool(ignore_eos))
        if r is not None:
            if r["top_p"] != 1.0:
                p["top_p"] = float(r["top_p"])
            if r["top_k"]:
                p["top_k"] = int(r["top_k"])
            if r["min_p"]:
                p["min_p"] = float(r["min_p"])
            if r["seed"] is not None:
                p["seed"] = int(r["seed"])
        return SamplingParams(**p)

    if reqs is not None:
        vocab = cfg["vocab_size"]
        warm = {"prompt_token_ids": [min(100 + i, vocab - 1) for i in range(8)]}
        llm.generate([warm], sp(1.0, 16, False), use_tqdm=False)
        prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in reqs]
        params = [sp(r["temperature"], r["max_tokens"], r["ignore_eos"], r) for r in reqs]
        runs, resets = vllm_timed_calls(llm, prompts, params, a.repeat, not a.keep_prefix_cache)
        dt, returned = sorted(runs)[(len(runs) - 1) // 2]
        res["results"] = throughput(reqs, dt, returned)
        res["results"]["prefix_cache_reset"] = "kept" if a.keep_prefix_cache else \
            "before every timed call" if all(resets) else "refused by vLLM at least once"
        if a.repeat > 1:
            res["results"]["runs_duration_s"] = [round(d, 6) for d, _ in runs]
            res["results"]["runs_output_tok_s"] = [round(sum(r["max_tokens"] for r in reqs) / d, 3) for d, _ in runs]
    else:
        prompt = {"prompt_token_ids": decode1_prompt(cfg["vocab_size"])}

        def timed(n):
            p = sp(0.0, n, True)
            t = time.perf_counter()
            o = llm.generate([prompt], p, use_tqdm=False)[0]
            return time.perf_counter() - t, len(o.outputs[0].token_ids)

        res["results"] = decode1(timed, a.decode_tokens)


def vllm_timed_calls(llm, prompts, params, repeat, reset):
    """`repeat` timed llm.generate() calls of all the prompts; with `reset`, vLLM's prefix cache is
    emptied before each one (outside the clock), so no call finds the prompts of the one before it
    cached. Returns [(seconds, tokens returned)] and the reset calls' results (True: emptied)."""
    runs, resets = [], []
    for _ in range(repeat):
        if reset:
            resets.append(bool(llm.reset_prefix_cache()))
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t
        runs.append((dt, sum(len(o.outputs[0].token_ids) for o in outs)))
    return runs, resets


def vllm_gpu_name():
    # NVML, so that this process opens no CUDA context of its own beside the engine's.
    try:
        from vllm.platforms import current_platform
        return current_platform.get_device_name(0)
    except Exception:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def decode1(timed, n_out):
    timed(n_out)  # warm-up
    runs = [timed(n_out) for _ in range(DECODE1_RUNS)]
    timed(1)
    runs1 = [timed(1) for _ in range(DECODE1_RUNS)]
    return decode1_summary([t for t, _ in runs], [t for t, _ in runs1], n_out, [n for _, n in runs])


# ---------------------------------------------------------------------------------------------
# transformers (the naive baseline)


def torch_dtype(torch, name):
    table = {"bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16, "float32": torch.float32,
             "float": torch.float32}
    if name is None:
        return torch.float32
    if name not in table:
        raise BenchError(f"config.json dtype {name!r}: not one of {', '.join(table)}")
    return table[name]


def version_tuple(v):
    out = []
    for p in v.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def run_hf(a, cfg, reqs, res):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    res["engine_version"] = transformers.__version__
    res["torch_version"] = torch.__version__
    res["transformers_version"] = transformers.__version__
    if a.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: torch sees no CUDA device (torch %s); use --device cpu" % torch.__version__)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    res["device"] = torch.cuda.get_device_name(dev) if cuda else f"cpu ({torch.get_num_threads()} threads, " \
                                                                  f"{platform.processor() or platform.machine()})"
    dt = torch_dtype(torch, cfg["dtype"])
    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype (the old name still works there).
    dkw = "dtype" if version_tuple(transformers.__version__) >= (4, 56) else "torch_dtype"
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, **{dkw: dt}).to(dev).eval()
    res["engine_start_s"] = round(time.perf_counter() - t0, 3)
    res["hf"] = dict(dtype=str(dt).replace("torch.", ""),
                     attn_implementation=getattr(model.config, "_attn_implementation", None))

    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = cfg_eos(model.config)
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.config, "pad_token_id", None)
    if pad is None:
        pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    # A fresh generation config: no defaults from the checkpoint's generation_config.json (top_k,
    # top_p, repetition penalty) change what is computed; EOS stays known so that min_new_tokens
    # can keep it from being sampled, and so from ending a row.
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad,
                                               bos_token_id=getattr(model.config, "bos_token_id", None))
    res["hf"]["pad_token_id"] = pad
    res["hf"]["eos_token_id"] = eos

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    class StepClock:
        """A transformers streamer that only notes when each step's tokens reach the host: generate()
        puts the prompt first, then every step's new tokens (already copied to the host, which waits
        for the step, as generate's own stop check does every step)."""

        def __init__(self):
            self.times, self.prompt_seen = [], False

        def put(self, value):
            if self.prompt_seen:
                self.times.append(time.perf_counter())
            self.prompt_seen = True

        def end(self):
            pass

    def generate(rows, n_new, temperature, clock=None):
        L = max(len(p) for p in rows)
        ids = torch.full((len(rows), L), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), L), dtype=torch.long)
        for i, p in enumerate(rows):  # left padding
            ids[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, L - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=pad, eos_token_id=eos)
        if temperature > 0:
            kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if clock is not None:
            kw["streamer"] = clock
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        return L, out[:, L:]  # the new tokens, every row as long as the longest

    torch.manual_seed(0)
    if reqs is not None:
        bs = a.batch_size
        batches = [reqs[i:i + bs] for i in range(0, len(reqs), bs)]
        for b in batches:
            for k in ("temperature", "top_p", "top_k", "min_p"):
                vals = {r[k] for r in b}
                if len(vals) > 1:
                    raise BenchError(f"--engine hf: lines {b[0]['line']}..{b[-1]['line']} form one static batch but "
                                     f"differ in {k} ({sorted(vals)}); model.generate takes one per batch")
            if b[0]["top_p"] != 1.0 or b[0]["top_k"] or b[0]["min_p"]:
                raise BenchError(f"--engine hf: line {b[0]['line']}: top_p/top_k/min_p are not supported by "
                                 "this baseline (temperature only)")
        notes = []
        if any(not r["ignore_eos"] for r in reqs):
            notes.append("requests with ignore_eos false also run to max_tokens here (EOS is never sampled)")
        if any(r["arrival_s"] for r in reqs):
            notes.append("arrival_s is ignored: every request is there at time 0")
        if any(r["seed"] is not None for r in reqs):
            notes.append("per-request seeds are ignored: torch.manual_seed(0) once")
        w = batches[0]
        generate([r["prompt_ids"] for r in w], min(HF_WARMUP_TOKENS, max(r["max_tokens"] for r in w)),
                 w[0]["temperature"])
        per_batch, outs, returned, padded_out, padded_in = [], [], 0, 0, 0
        ttft, tpot, e2e = [], [], []  # per request, ms, every request arriving at the run's start
        sync()
        if cuda:  # the timed batches' peak: weights + cache + activations, as torch's allocator saw them
            torch.cuda.reset_peak_memory_stats(dev)
        t = time.perf_counter()
        for b in batches:
            tb = time.perf_counter()
            n_new = max(r["max_tokens"] for r in b)
            clock = StepClock()
            L, new = generate([r["prompt_ids"] for r in b], n_new, b[0]["temperature"], clock)
            if len(clock.times) != n_new:
                raise BenchError(f"--engine hf: the streamer saw {len(clock.times)} steps of a batch of {n_new} new "
                                 "tokens (this transformers streams differently)")
            for q in b:  # a request's own tokens are its row's first max_tokens (the rest is padding)
                first, last = clock.times[0] - t, clock.times[q["max_tokens"] - 1] - t
                ttft.append(first * 1e3)
                e2e.append(last * 1e3)
                if q["max_tokens"] > 1:
                    tpot.append((last - first) / (q["max_tokens"] - 1) * 1e3)
            outs.append((b, new))
            returned += new.shape[0] * new.shape[1]
            padded_out += sum(n_new - r["max_tokens"] for r in b)
            padded_in += sum(L - len(r["prompt_ids"]) for r in b)
            per_batch.append(dict(requests=len(b), prompt_len=L, new_tokens=n_new,
                                  time_s=round(time.perf_counter() - tb, 6)))  # host time (no sync per batch)
        sync()
        d = time.perf_counter() - t
        check_full_length(outs, eos)
        r = throughput(reqs, d, returned)
        r.update(batch_size=bs, num_batches=len(batches), padded_output_tokens=padded_out,
                 padded_prompt_tokens=padded_in,
                 padding_note="each static batch runs every row to the batch's largest max_tokens: "
                              "padded_output_tokens are generated past a request's own max_tokens and are not counted "
                              "in output_tokens; padded_prompt_tokens are the left-padding positions",
                 warmup="the first batch with at most %d new tokens" % HF_WARMUP_TOKENS, batches=per_batch)
        for name, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            for q in (50, 99):
                r[f"{name}_ms_p{q}"] = round(percentile(v, q / 100), 3) if v else None
        r["latency_note"] = ("per request, every request arriving when the run starts: TTFT = when its batch's first "
                             "token reached the host; E2E = when its own last token did (its row's token max_tokens); "
                             "TPOT = (E2E - TTFT) / (max_tokens - 1); p50 / p99 interpolated linearly, as llm bench's")
        if cuda:
            r["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
            free_b, total_b = torch.cuda.mem_get_info(dev)  # as llm bench's gpu_memory_used_gib: total - free at the end
            r["gpu_memory_used_gib"] = round((total_b - free_b) / 2**30, 3)
            r["weights_gib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30, 3)
        if notes:
            r["notes"] = notes
        res["results"] = r
    else:
        prompt = decode1_prompt(cfg["vocab_size"])

        def timed(n):
            sync()
            t = time.perf_counter()
            _, new = generate([prompt], n, 0.0)
            sync()
            dt = time.perf_counter() - t
            check_full_length([([dict(max_tokens=n)], new)], eos)
            return dt, new.shape[1]

        res["results"] = decode1(timed, a.decode_tokens)


def check_full_length(outs, eos):
    """Every row must have run to its batch's max_new_tokens: min_new_tokens keeps EOS from being
    sampled, so an EOS id among the new tokens means generate() ended that row and padded it."""
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    for b, new in outs:
        n_new = max(r["max_tokens"] for r in b)
        if new.shape[1] != n_new:
            raise BenchError(f"--engine hf: generate() returned {new.shape[1]} new tokens per row, not {n_new}")
        for e in eos_ids:
            if bool((new == e).any()):
                raise BenchError(f"--engine hf: EOS id {e} among the new tokens: a row ended before "
                                 f"{n_new} tokens (min_new_tokens did not hold)")


def cfg_eos(config):
    e = getattr(config, "eos_token_id", None)
    if e is None and hasattr(config, "get_text_config"):
        e = getattr(config.get_text_config(), "eos_token_id", None)
    return e


# ---------------------------------------------------------------------------------------------


def write_atomic(path, obj):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def summary_line(res, out):
    r = res["results"]
    head = f"{res['engine']} {res['engine_version']} on {res['device']}"
    if res["workload"]["kind"] == "decode1":
        dec = f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "n/a"
        return (f"{head}: decode1 {r['max_tokens']} tokens, median {r['median_s']:.4f} s "
                f"({r['tok_s_incl_prefill']:.1f} tok/s incl. prefill), TPOT {r['tpot_ms']:.3f} ms, "
                f"decode {dec} tok/s -> {out}")
    s = (f"{head}: {r['num_requests']} requests, {r['output_tokens']} output tokens in {r['duration_s']:.3f} s: "
         f"{r['output_tok_s']:.1f} output tok/s, {r['total_tok_s']:.1f} total tok/s, {r['requests_s']:.3f} req/s")
    if "batch_size" in r:
        s += f" (batch {r['batch_size']}, {r['padded_output_tokens']} padded output tokens)"
    return s + f" -> {out}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, choices=["vllm", "hf"])
    ap.add_argument("--model-dir", required=True, help="a Hugging Face model directory (config.json + weights)")
    w = ap.add_mutually_exclusive_group(required=True)
    w.add_argument("--requests", metavar="FILE.jsonl", help="a request file (workloads.py writes them)")
    w.add_argument("--decode1", action="store_true", help="batch-1 decode: 128-id prompt, 256 greedy tokens")
    ap.add_argument("--out", required=True, metavar="FILE.json")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm (default 0.9)")
    ap.add_argument("--max-model-len", type=int, default=4096, help="vllm (default 4096)")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="vllm (default: vLLM's)")
    ap.add_argument("--enforce-eager", action="store_true", help="vllm: no CUDA graphs, no torch.compile")
    ap.add_argument("--batch-size", type=int, default=16, help="hf: requests per static batch (default 16)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="hf (default cuda)")
    ap.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N requests of the file")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="vllm --requests: N timed generate() calls after the warm-up, the median reported (default 1)")
    ap.add_argument("--keep-prefix-cache", action="store_true",
                    help="vllm --requests: do not empty vLLM's prefix cache before each timed call")
    ap.add_argument("--max-tokens-cap", type=int, default=None, metavar="N",
                    help="for smoke tests only: min(max_tokens, N) for every request (not a benchmark)")
    ap.add_argument("--decode-tokens", type=int, default=DECODE1_TOKENS, metavar="N",
                    help="for smoke tests only: --decode1's new tokens (default 256)")
    a = ap.parse_args(argv)
    for name, v, lo in (("--batch-size", a.batch_size, 1), ("--limit", a.limit, 1),
                        ("--max-tokens-cap", a.max_tokens_cap, 1), ("--decode-tokens", a.decode_tokens, 2),
                        ("--max-model-len", a.max_model_len, 2), ("--max-num-seqs", a.max_num_seqs, 1),
                        ("--repeat", a.repeat, 1)):
        if v is not None and v < lo:
            ap.error(f"{name} must be at least {lo}")
    if not 0 < a.gpu_memory_utilization <= 1:
        ap.error("--gpu-memory-utilization must be in (0, 1]")
    if a.decode1 and (a.limit is not None or a.max_tokens_cap is not None):
        ap.error("--limit and --max-tokens-cap go with --requests")
    if a.repeat > 1 and (a.engine != "vllm" or a.decode1):
        ap.error("--repeat goes with --engine vllm --requests")
    if a.keep_prefix_cache and (a.engine != "vllm" or a.decode1):
        ap.error("--keep-prefix-cache goes with --engine vllm --requests")

    try:
        cfg = read_config(a.model_dir)
        reqs = None
        if a.requests:
            reqs = read_requests(a.requests, cfg["vocab_size"], a.limit)
            if a.max_tokens_cap is not None:
                for r in reqs:
                    r["max_tokens"] = min(r["max_tokens"], a.max_tokens_cap)
        keys = ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "enforce_eager", "repeat", "keep_prefix_cache") if a.engine == "vllm" \
            else ("batch_size", "device") if reqs is not None else ("device",)
        keys += ("limit", "max_tokens_cap") if reqs is not None else ("decode_tokens",)
        opts = {k: getattr(a, k) for k in keys}
        res = dict(engine=a.engine, engine_version=None, torch_version=None, transformers_version=None, device=None,
                   date_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   python=platform.python_version(), host=platform.node(), argv=sys.argv[1:] if argv is None else argv,
                   model=dict(dir=os.path.abspath(a.model_dir), **cfg), options=opts)
        if reqs is not None:
            res["workload"] = dict(kind="requests", file=os.path.abspath(a.requests), num_requests=len(reqs))
        else:
            res["workload"] = dict(kind="decode1", prompt_len=DECODE1_PROMPT_LEN, max_tokens=a.decode_tokens,
                                   runs=DECODE1_RUNS, greedy=True, ignore_eos=True,
                                   prompt="random.Random(1234) ids in [0, min(10000, vocab - 1)]")
        if a.max_tokens_cap is not None or a.decode_tokens != DECODE1_TOKENS:
            res["smoke_test_only"] = "max_tokens capped or --decode-tokens changed: not the benchmark's workload"
        (run_vllm if a.engine == "vllm" else run_hf)(a, cfg, reqs, res)
        res["env"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH", "HF_HUB_OFFLINE",
                                                     "TRANSFORMERS_OFFLINE", *VLLM_ENV)}
    except BenchError as e:
        die(str(e))
    write_atomic(a.out, res)
    print(summary_line(res, a.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
