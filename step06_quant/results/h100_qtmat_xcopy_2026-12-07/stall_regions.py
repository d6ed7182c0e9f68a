#!/usr/bin/env python3
"""Stall samples and warp instructions of an Nsight Compute source view (--page source --csv
--print-source sass), summed over ranges of SASS instruction indexes.

usage: stall_regions.py sass_o.csv[.gz] CUT1,CUT2,...   (the indexes where a region starts)
The cuts used in the step06 README are in commands.txt; they follow the kernel's landmarks
(the BAR.SYNC after x is staged, the stage loop's SYNCS.PHASECHK and SYNCS.ARRIVE, the strip's
BAR.SYNC, EXIT), which `stall_regions.py FILE marks` lists."""
import csv, gzip, sys


def load(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    rows = list(csv.reader(f))
    hi = [i for i, r in enumerate(rows) if r and r[0] == "Address"][0]
    return rows[hi], [r for r in rows[hi + 1:] if len(r) > 5]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


h, data = load(sys.argv[1])
S, E = h.index("Warp Stall Sampling (All Samples)"), h.index("Instructions Executed")
if sys.argv[2] == "marks":
    for i, r in enumerate(data):
        if any(k in r[1] for k in ("BAR.SYNC", "PHASECHK", "SYNCS.ARRIVE", "EXIT", "LDG.E.128", "UBLKCP")):
            print(i, r[E], r[1].strip()[:60])
    sys.exit(0)
tot = sum(num(r[S]) for r in data)
b = [0] + [int(x) for x in sys.argv[2].split(",")] + [len(data)]
for a, c in zip(b, b[1:]):
    s = sum(num(r[S]) for r in data[a:c])
    e = sum(num(r[E]) for r in data[a:c])
    print(f"#{a:5d}-{c:5d}: samples {s / tot * 100:5.1f}%  warp instructions {e:10.0f}  "
          f"[{data[a][1].strip()[:36]}] .. [{data[c - 1][1].strip()[:36]}]")
