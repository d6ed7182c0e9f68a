# one decode step's kernels from `ncu --csv --page raw --metrics gpu__time_duration.sum` over llm bench:
# the kernels between the last two k_embed launches, grouped by name and grid
import csv, re, sys
from collections import defaultdict
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
hi = next(i for i, r in enumerate(rows) if 'Kernel Name' in r); h = rows[hi]
tm = h.index('gpu__time_duration.sum'); kn = h.index('Kernel Name'); g = h.index('Grid Size'); b = h.index('Block Size')
data = [r for r in rows[hi + 1:] if len(r) == len(h) and re.match(r'^[0-9.,]+$', r[tm])]
ks = [(re.sub(r'\(.*', '', r[kn]).replace('void ', ''), r[g], r[b], float(r[tm].replace(',', '')) / 1e3) for r in data]
emb = [i for i, k in enumerate(ks) if k[0].startswith('k_embed')]
step = ks[emb[-2]:emb[-1]]
agg = defaultdict(list)
for n, gg, bb, t in step: agg[(n, gg, bb)].append(t)
print(f'# {sys.argv[1]}: one decode step (kernels {emb[-2]}..{emb[-1] - 1} of {len(ks)} profiled), {len(step)} kernels, {sum(t for *_, t in step):.1f} us')
print(f'{"total us":>9} {"n":>4} {"median us":>9}  kernel, grid, block')
for (n, gg, bb), v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    v2 = sorted(v)
    print(f'{sum(v):9.1f} {len(v):4d} {v2[len(v) // 2]:9.2f}  {n} {gg} {bb}')
