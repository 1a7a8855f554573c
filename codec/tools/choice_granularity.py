#!/usr/bin/env python3
"""How much ratio a finer code choice would buy, with the format's static code family.

For each bf16 file, the exponent bits per value when (k, anchor) is chosen from the
full histogram of every 32768 values (one 64 KiB block, as format v1 does, but without
its 1/13 sample), of every 8192, or of every 1024 values (one segment; 2 bytes per
choice are charged), against the order-0 entropy of the exponents over the same
spans. Sign and mantissa are counted at 8 raw bits.

    python3 codec/tools/choice_granularity.py bench/data/*.bf16
"""
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def code_lengths():
    src = (ROOT / "src/codes.rs").read_text()
    start = src.index("pub const CODE_LENGTHS")
    body = src[src.index("= [", start) + 3 : src.index("\n];", start)]
    body = re.sub(r"//[^\n]*", "", body)
    rows = re.findall(r"\[([0-9,\s]+)\]", body)
    lens = np.array([[int(x) for x in r.split(",") if x.strip()] for r in rows])
    assert lens.shape == (32, 26), lens.shape
    return lens


LENS = code_lengths()


def symbol(e, a):
    if e == 0:
        return 24
    d = a - e
    return d if 0 <= d <= 23 else 25


def best_bits(h):
    """FORMAT.md §6 best_cost on a full histogram: min over anchors and codes."""
    es = np.nonzero(h)[0]
    smax = max(1, int(es.max())) if len(es) else 1
    best = None
    for a in range(max(1, smax - 4), min(255, smax + 1) + 1):
        cnt = np.zeros(26)
        for e in es:
            cnt[symbol(int(e), a)] += h[e]
        c = (LENS * cnt).sum(axis=1) + cnt[25] * 8
        best = c.min() if best is None else min(best, c.min())
    return best


def entropy_bits(h):
    p = h[h > 0] / h.sum()
    return -(p * np.log2(p)).sum() * h.sum()


for path in sys.argv[1:]:
    e = ((np.fromfile(path, dtype=np.uint16) >> 7) & 0xFF).astype(np.int64)
    n = len(e)
    cells = []
    for span in (32768, 8192, 1024):
        ours = ent = 0.0
        for i in range(0, n, span):
            h = np.bincount(e[i : i + span], minlength=256)
            ours += best_bits(h) + (16 if span < 32768 else 0)
            ent += entropy_bits(h)
        cells.append(
            f"{span}: {ours / n:.3f} bits ({16 / (ours / n + 8):.4f}x), "
            f"entropy {ent / n:.3f} ({16 / (ent / n + 8):.4f}x)"
        )
    print(f"{Path(path).name}: " + "; ".join(cells))
