# summarize ncu --csv --page raw output of llm bench: the kernels of the last decode steps (after the last k_embed)
import csv, sys, re
from collections import defaultdict
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
hi = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hi]; data = [r for r in rows[hi + 1:] if len(r) == len(h)]
kn = h.index('Kernel Name'); tm = h.index('gpu__time_duration.sum')
ks = [(r[kn], float(r[tm].replace(',', '')) if re.match(r'^[0-9.,]+$', r[tm] or '') else 0.0) for r in data]
emb = [i for i, (n, _) in enumerate(ks) if 'k_embed' in n]
print('kernels', len(ks), 'k_embed at', emb[-6:])
nsteps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
for a, b in zip(emb[-nsteps - 1:-1], emb[-nsteps:]):
    step = ks[a:b]
    tot = sum(t for _, t in step)
    agg = defaultdict(lambda: [0, 0.0])
    for n, t in step:
        short = re.sub(r'\(.*', '', n).replace('void ', '')[:70]
        agg[short][0] += 1; agg[short][1] += t
    print(f'step kernels {len(step)} total {tot/1e3:.1f} us')
    for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f'  {t/1e3:9.1f} us {c:4d}x {t/1e3/c:7.2f} us  {n}')
