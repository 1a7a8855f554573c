#!/usr/bin/env python3
"""Designs the static exponent code family of the nccl-zip frame format (docs/FORMAT.md §5).

Prints the code-length table that codec/src/codes.rs holds. The table is part of the
format: changing it changes the bytes of every coded block (bump the format version).

Symbols: 0..=23 are d = anchor - exponent, 24 = ZERO (exponent field 0), 25 = ESC
(the raw exponent follows). Every code is a complete canonical prefix code with
lengths 1..=12.  Code index k = 4*shape + zero_level.
"""
import heapq
import math

NSYM, ZERO, ESC, MAXLEN, ND = 26, 24, 25, 12, 24


def phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def gauss_pmf(f):
    # exponent pmf of |N(0, 2^f)|, over j = -60..20 (floor(log2 |x|))
    s = 2.0 ** f
    return {j: 2 * (phi(2.0 ** (j + 1) / s) - phi(2.0 ** j / s)) for j in range(-60, 20)}


def laplace_pmf(f):
    s = 2.0 ** f
    return {j: math.exp(-(2.0 ** j) / s) - math.exp(-(2.0 ** (j + 1)) / s) for j in range(-60, 20)}


def mix_pmf(width, base=gauss_pmf):
    # scale mixture: sigma = 2^u, u uniform over [0, width): wider exponent spread (gradients)
    out = {}
    steps = 16
    for i in range(steps):
        pm = base(width * (i + 0.5) / steps)
        for j, p in pm.items():
            out[j] = out.get(j, 0) + p / steps
    return out


def to_d(pmf, tail=2.0 ** -13):
    # anchor = smallest j whose upper tail is below `tail`
    js = sorted(pmf)
    acc, top = 0.0, js[-1]
    for j in reversed(js):
        if acc + pmf[j] > tail:
            top = j
            break
        acc += pmf[j]
    d = [0.0] * ND
    esc = acc
    for j, p in pmf.items():
        k = top - j
        if 0 <= k < ND:
            d[k] += p
        elif k >= ND or k < 0:
            esc += p if k >= ND else 0
    return d, esc


def huffman_lengths(p):
    h = [(pi, i, [i]) for i, pi in enumerate(p)]
    heapq.heapify(h)
    ln = [0] * len(p)
    cnt = len(p)
    while len(h) > 1:
        a = heapq.heappop(h)
        b = heapq.heappop(h)
        for s in a[2] + b[2]:
            ln[s] += 1
        cnt += 1
        heapq.heappush(h, (a[0] + b[0], cnt, a[2] + b[2]))
    return ln


def limited(p):
    floor = 2.0 ** -20
    while True:
        q = [max(x, floor) for x in p]
        t = sum(q)
        ln = huffman_lengths([x / t for x in q])
        if max(ln) <= MAXLEN:
            assert abs(sum(2.0 ** -l for l in ln) - 1) < 1e-12
            return ln
        floor *= 1.5


SHAPES = [
    ("gauss f=0", gauss_pmf(0.0)),
    ("gauss f=.33", gauss_pmf(0.33)),
    ("gauss f=.67", gauss_pmf(0.67)),
    ("laplace", laplace_pmf(0.0)),
    ("mix w=2", mix_pmf(2.0)),
    ("mix w=4", mix_pmf(4.0)),
    ("mix w=7", mix_pmf(7.0, laplace_pmf)),
    ("mix w=12", mix_pmf(12.0, laplace_pmf)),
]
ZERO_LEVELS = [2.0 ** -12, 1 / 16, 1 / 4, 1 / 2]


def family():
    codes = []
    for name, pmf in SHAPES:
        d, esc = to_d(pmf)
        for z in ZERO_LEVELS:
            p = [x * (1 - z) for x in d] + [z, max(esc, 2.0 ** -12)]
            codes.append((f"{name}, zero~{z:.4g}", limited(p)))
    return codes


def entropy(p):
    return -sum(x * math.log2(x) for x in p if x > 0)


def best_cost(pmf, codes, zero=0.0):
    # expected bits/value with the best (code, anchor) for an exponent pmf, escapes = len(ESC)+8
    best = 1e9
    js = [j for j, p in pmf.items() if p > 1e-12]
    for _, ln in codes:
        for top in range(max(js) - 6, max(js) + 3):
            c = zero * ln[ZERO]
            for j in js:
                k = top - j
                c += (1 - zero) * pmf[j] * (ln[k] if 0 <= k < ND else ln[ESC] + 8)
            best = min(best, c)
    return best


if __name__ == "__main__":
    import sys
    codes = family()
    if "--eval" in sys.argv:
        for name, pmf in [("gauss", None)] + [(f"laplace f={f}", laplace_pmf(f)) for f in (0, .5)] + [
                (f"mix{w}", mix_pmf(w)) for w in (1, 3, 5, 8, 10)]:
            fs = [i / 8 for i in range(8)] if pmf is None else [None]
            for f in fs:
                pm = gauss_pmf(f) if pmf is None else pmf
                h = entropy(pm.values())
                print(f"{name} f={f}: H={h:.3f} cost={best_cost(pm, codes):.3f}")
        for z in (0.05, 0.3, 0.5, 0.7):
            pm = gauss_pmf(0.3)
            h = entropy([z] + [(1 - z) * p for p in pm.values()])
            print(f"gauss+zero{z}: H={h:.3f} cost={best_cost(pm, codes, z):.3f}")
    else:
        print("pub const CODE_LENGTHS: [[u8; NSYM]; NCODES] = [")
        for name, ln in codes:
            print(f"    // {name}")
            print("    [" + ", ".join(str(x) for x in ln) + "],")
        print("];")
