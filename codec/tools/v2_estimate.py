#!/usr/bin/env python3
"""ESTIMATES for the draft format v2 (docs/FORMAT-v2-draft.md), which no code implements.

Reads the data classes that `codec_bench --dump DIR` wrote (file `NN-name.TYPE`, TYPE
one of bf16 fp16 fp32 e4m3 e5m2), cuts each into the plugin's 256 KiB chunks (one frame
each) and 64 KiB blocks, and computes the byte size a v2 encoder following the draft
would produce, from the draft's rules:

* zero lines: 64-byte lines whose bytes are all 0 are elided, listed in a bitmap or
  as runs (whichever is smaller);
* symbols per remaining element: d = A + col_off - e (0..23), ZERO (the element is
  +0.0, all bits 0: no plane bytes), SUB (e == 0, not all-zero: -0.0 and subnormals,
  planes kept), ESC (exponent follows raw);
* code: per-block canonical Huffman lengths (limited to 12 bits, 4 bits per symbol in
  the block header) built from a 1/13 sample histogram of the block (+1 per symbol so
  every symbol has a code) -- the cost is computed exactly for that code on the full
  block;
* fp32: each of the two low mantissa byte planes is omitted when it is all zero;
* fp8: per block, the cheaper of a 256-symbol byte code (128-byte length table) or
  exponent symbols plus raw sign/mantissa bits;
* per frame: an optional column-offset table (4-bit offset per column, period P from
  the autocorrelation of a sample's exponents); used when it makes the frame smaller;
* per 1024-value segment: u16 byte length plus three u16 sub-segment bit offsets
  (256-value sub-segments) so the GPU decodes 4 sub-segments of a segment in parallel.

It also models format v1 (static code family, (k, A) from a 1/13 sample) on the same
chunks, to calibrate the model against the measured v1 ratio of codec_bench.

    cargo run --release -p nccl-zip-codec --example codec_bench -- --msg 262144 --dump /tmp/classes
    python3 codec/tools/v2_estimate.py /tmp/classes/*
"""
import heapq
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 256 << 10
BLOCK = 64 << 10
LINE = 64
SEG = 1024
HDR = 24

# Type: (width, exponent shift, exponent bits, raw bits in the stream per element,
#        plane bits per element)
TYPES = {
    "bf16": (2, 7, 8, 0, 8),
    "fp16": (2, 10, 5, 3, 8),
    "fp32": (4, 23, 8, 0, 24),
    "e4m3": (1, 3, 4, 4, 0),
    "e5m2": (1, 2, 5, 3, 0),
}
ND, ZERO, SUB, ESC = 24, 24, 25, 26
NSYM = 27


def v1_lengths():
    src = (ROOT / "src/codes.rs").read_text()
    start = src.index("pub const CODE_LENGTHS")
    body = src[src.index("= [", start) + 3 : src.index("\n];", start)]
    body = re.sub(r"//[^\n]*", "", body)
    rows = re.findall(r"\[([0-9,\s]+)\]", body)
    return np.array([[int(x) for x in r.split(",") if x.strip()] for r in rows])


V1LENS = v1_lengths()  # 32 x 26: d 0..23, ZERO (e == 0), ESC


def huff_lengths(counts, limit=12):
    """Huffman code lengths for all symbols (counts > 0), limited to `limit` bits
    by flattening the counts until the code fits."""
    c = np.asarray(counts, dtype=np.float64)
    while True:
        heap = [(w, i, [i]) for i, w in enumerate(c)]
        heapq.heapify(heap)
        lens = np.zeros(len(c), dtype=np.int64)
        uid = len(c)
        while len(heap) > 1:
            w1, _, s1 = heapq.heappop(heap)
            w2, _, s2 = heapq.heappop(heap)
            for s in s1 + s2:
                lens[s] += 1
            heapq.heappush(heap, (w1 + w2, uid, s1 + s2))
            uid += 1
        if lens.max() <= limit:
            return lens
        c = np.floor(c / 2) + 1


def words(b, w):
    n = len(b) // w
    if w == 1:
        return np.frombuffer(b, dtype=np.uint8, count=n).astype(np.int64)
    if w == 2:
        return np.frombuffer(b, dtype="<u2", count=n).astype(np.int64)
    return np.frombuffer(b, dtype="<u4", count=n).astype(np.int64)


def zero_lines(block):
    """(mask of elided 64-byte lines, bytes of the line list)."""
    nl = len(block) // LINE
    if nl == 0:
        return np.zeros(0, bool), 0
    a = np.frombuffer(block, dtype=np.uint8, count=nl * LINE).reshape(nl, LINE)
    z = ~a.any(axis=1)
    if not z.any():
        return z, 0
    runs = int(np.count_nonzero(np.diff(np.concatenate(([0], z.astype(np.int8)))) == 1))
    return z, 1 + min((nl + 7) // 8, 4 * runs)


def symbols(x, e, anchor, off, zflag):
    """v2 symbols: d = anchor + off - e in 0..23, ZERO, ESC. Without the block's Z flag
    ZERO means e == 0 (planes kept, as v1); with it ZERO means the element is +0.0 (no
    planes, no raw bits) and any other e == 0 element (-0.0, subnormals) is escaped."""
    d = anchor + off - e
    s = np.where((d >= 0) & (d < ND), d, ESC1)
    if zflag:
        s = np.where(e == 0, ESC1, s)
        s = np.where(x == 0, ZERO, s)
    else:
        s = np.where(e == 0, ZERO, s)
    return s


ESC1 = 25  # v2 uses v1's 26 symbols: d 0..23, ZERO (24), ESC (25)


def stream_cost(h, lens, eb, rawbits, planebits, n, zflag):
    """Bits of the exponent stream plus raw stream bits plus planes, from a histogram."""
    elided = int(h[ZERO]) if zflag else 0
    return int((h * lens).sum()) + int(h[ESC1]) * eb + (n - elided) * (rawbits + planebits)


SUBSEG = int(__import__("os").environ.get("V2_SUBSEG", "512"))  # values per sub-segment
STRIDE = int(__import__("os").environ.get("V2_SAMPLE_STRIDE", "13"))  # the choice's sample


def index_bytes(bits_el):
    """Bytes of the sub-segment index: the block's bitstream is one stream (no padding
    between segments); the index holds each 256-value sub-segment's bit length as
    base + an unsigned delta of `width` bits (base u16 and width u8 in 3 bytes)."""
    n = len(bits_el)
    ns = -(-n // SUBSEG)
    if ns <= 1:
        return 3
    pad = ns * SUBSEG - n
    sub = np.concatenate((bits_el, np.zeros(pad, bits_el.dtype))).reshape(ns, SUBSEG).sum(axis=1)
    span = int(sub.max() - sub.min())
    width = span.bit_length()
    return 3 + (ns * width + 7) // 8


def coded_block_v2(block, ty, col_off, pos0):
    """Estimated bytes of a v2 coded block. The encoder's choices (anchor, Z flag,
    static code k or explicit lengths, fp8 byte code) are made on a 1/13 sample, as
    v1 makes its (k, A) choice; the returned cost is that choice's cost on the block."""
    w, sh, eb, rawbits, planebits = TYPES[ty]
    L = len(block)
    z, zl_bytes = zero_lines(block)
    m = L // w
    x = words(block, w)
    idx = np.arange(m)
    if z.any():
        keep = np.ones(m, bool)
        zl = np.repeat(z, LINE // w)
        keep[: len(zl)] = ~zl
        x, idx = x[keep], idx[keep]
    n = len(x)
    tail = L - m * w
    head = 5 + zl_bytes  # mode, flags, k, A, phase+sub-segment size (index: 3 more)
    if n == 0:
        return head + tail
    e = (x >> sh) & ((1 << eb) - 1)
    off = col_off[(idx + pos0) % len(col_off)] if col_off is not None else 0
    # fp32 byte planes that are all zero are omitted (flag per plane)
    pb = planebits
    if ty == "fp32":
        nzx = x[x != 0]
        for sh2 in (0, 8):
            if not ((nzx >> sh2) & 0xFF).any():
                pb -= 8
    samp = slice(0, n, STRIDE)
    xs, es = x[samp], e[samp]
    ns = len(xs)
    offs = off[samp] if col_off is not None else 0
    nzs = es[xs != 0]
    smax = max(1, int(nzs.max()) if len(nzs) else 1)
    emax = (1 << eb) - 1
    cands = []  # (estimated bytes from the sample, lens, anchor, zflag)
    for anchor in range(max(1, smax - 4), min(emax, smax + 3) + 1):
        for zflag in (False, True):
            sy = symbols(xs, es, anchor, offs, zflag)
            hs = np.bincount(sy, minlength=26)
            # static family (v1's 32 codes)
            costs = (V1LENS * hs).sum(axis=1)
            k = int(np.argmin(costs))
            est = stream_cost(hs, V1LENS[k], eb, rawbits, pb, ns, zflag) * n / ns / 8
            cands.append((est, V1LENS[k], anchor, zflag))
            # explicit lengths from the sample (26 x 4 bits in the block header)
            lens = huff_lengths(hs * 16 + 1)
            est = stream_cost(hs, lens, eb, rawbits, pb, ns, zflag) * n / ns / 8 + 13
            cands.append((est, lens, anchor, zflag))
    est, lens, anchor, zflag = min(cands, key=lambda c: c[0])
    sy = symbols(x, e, anchor, off, zflag)
    bits_el = lens[sy] + np.where(sy == ESC1, eb, 0) + rawbits
    if zflag:
        bits_el = np.where(sy == ZERO, lens[ZERO], bits_el)
    cost = (int(bits_el.sum()) + 7) // 8 + index_bytes(bits_el) + pb * int(
        np.count_nonzero(~((sy == ZERO) & zflag))
    ) / 8
    if zflag:
        # per sub-segment count of ZERO elements (plane offsets for parallel decode)
        cost += index_bytes((sy == ZERO).astype(np.int64))
    if not any(lens is r for r in V1LENS):
        cost += 13
    if ty in ("e4m3", "e5m2"):
        # alternative: a 256-symbol code on whole bytes (128-byte length table)
        hb = np.bincount(xs, minlength=256)
        lb = huff_lengths(hb * 16 + 1)
        alt_est = int((hb * lb).sum()) * n / ns / 8 + 128
        if alt_est < est:
            hfull = np.bincount(x, minlength=256)
            cost = (int((hfull * lb).sum()) + 7) // 8 + index_bytes(lb[x]) + 128
    return head + cost + tail


def coded_block_v1(block, ty):
    """Bytes of a v1 coded block, modelled (static family, (k, A) from 1/13 sample)."""
    w, sh, eb, rawbits, planebits = TYPES[ty]
    x = words(block, w)
    m = len(x)
    if m < 64:
        return 1 + len(block)
    e = (x >> sh) & ((1 << eb) - 1)
    hs = np.bincount(e[::13], minlength=1 << eb)
    smax = max(1, int(np.nonzero(hs)[0].max()))
    emax = (1 << eb) - 1
    best = None
    for anchor in range(max(1, smax - 4), min(emax, smax + 1) + 1):
        d = anchor - e
        s = np.where((d >= 0) & (d < ND), d, 25)
        s = np.where(e == 0, 24, s)
        hsamp = np.bincount(s[::13], minlength=26)
        costs = (V1LENS * hsamp).sum(axis=1) + hsamp[25] * eb
        k = int(np.argmin(costs))
        c = int(costs[k])
        if best is None or c < best[0]:
            best = (c, k, anchor, s)
    _, k, anchor, s = best
    h = np.bincount(s, minlength=26)
    bits = int((V1LENS[k] * h).sum()) + int(h[25]) * eb + m * rawbits
    seg = -(-m // SEG)
    return 4 + 2 * seg + bits / 8 + seg * 0.5 + m * planebits / 8 + (len(block) - m * w)


def block_size(block, ty, col_off, pos0, v1):
    if len(block) and block.count(block[0]) == len(block):
        return 2
    if v1:
        c = coded_block_v1(block, ty) if ty in ("bf16", "fp16", "fp32") else 1 + len(block)
    else:
        c = coded_block_v2(block, ty, col_off, pos0)
    return min(c, 1 + len(block))


def find_period(x, ty, nsample=32768):
    """Period (in elements) whose column means explain most of the exponent variance
    in a sample, beyond what chance gives; None if none helps."""
    w, sh, eb, _, _ = TYPES[ty]
    xs = x[:nsample]
    e = ((xs >> sh) & ((1 << eb) - 1)).astype(np.float64)
    ok = xs != 0
    n = int(ok.sum())
    if n < 4096:
        return None
    pos = np.nonzero(ok)[0]
    ev = e[ok]
    var = ev.var()
    if var == 0:
        return None
    best = (0.02, None)
    # candidates: the 8 lags (multiples of 16, up to 8192) with the highest
    # autocorrelation of the centred exponents (zeros set to the mean)
    v = np.where(ok, e - ev.mean(), 0.0)
    f = np.fft.rfft(v, 2 * len(v))
    ac = np.fft.irfft(f * np.conj(f))[: min(8193, len(v) // 8)]
    lags = np.arange(16, len(ac), 16)
    if len(lags) == 0:
        return None
    for p in lags[np.argsort(-ac[lags])[:8]]:
        p = int(p)
        col = pos % p
        cnt = np.bincount(col, minlength=p)
        sm = np.bincount(col, weights=ev, minlength=p)
        mean = sm / np.maximum(cnt, 1)
        r2 = (cnt * (mean - ev.mean()) ** 2).sum() / (n * var)
        adj = r2 - (p - 1) / (n - 1)
        if adj > best[0]:
            best = (adj, p)
    return best[1]


def column_offsets(x, ty, p):
    w, sh, eb, _, _ = TYPES[ty]
    e = ((x >> sh) & ((1 << eb) - 1)).astype(np.float64)
    ok = x != 0
    pos = np.nonzero(ok)[0]
    col = pos % p
    cnt = np.bincount(col, minlength=p)
    mean = np.bincount(col, weights=e[ok], minlength=p) / np.maximum(cnt, 1)
    ref = np.median(mean[cnt > 0]) if (cnt > 0).any() else 0
    off = np.clip(np.round(mean - ref), -8, 7).astype(np.int64)
    off[cnt == 0] = 0
    return off


def frame_size(chunk, ty, v1):
    nb = -(-len(chunk) // BLOCK)
    blocks = [chunk[i * BLOCK : (i + 1) * BLOCK] for i in range(nb)]
    plain = HDR + 4 * nb + sum(block_size(b, ty, None, i * BLOCK // TYPES[ty][0], v1) for i, b in enumerate(blocks))
    used_cols = False
    if not v1 and ty != "e4m3" and ty != "e5m2":
        w = TYPES[ty][0]
        x = words(chunk, w)
        p = find_period(x, ty)
        if p:
            off = column_offsets(x[: 65536 // w * 2], ty, p)  # offsets from a sample (first 128 KiB)
            withc = HDR + 4 * nb + 2 + p // 2 + sum(
                block_size(b, ty, off, i * BLOCK // w, v1) for i, b in enumerate(blocks)
            )
            if withc < plain:
                plain, used_cols = withc, p
    return min(plain, HDR + len(chunk)), used_cols


def main():
    files = sys.argv[1:]
    print("| data | type | v1 (model) | v2 draft estimate | chunks using a column table (periods) |")
    print("|---|---|---|---|---|")
    for f in files:
        p = Path(f)
        ty = p.suffix[1:]
        if ty not in TYPES:
            continue
        d = p.read_bytes()
        name = p.stem.split("-", 1)[1]
        tot, v1s, v2s, cols = 0, 0, 0, []
        for i in range(0, len(d), CHUNK):
            c = d[i : i + CHUNK]
            tot += len(c)
            v1s += frame_size(c, ty, True)[0]
            s2, pc = frame_size(c, ty, False)
            v2s += s2
            if pc:
                cols.append(pc)
        nchunks = -(-len(d) // CHUNK)
        per = sorted(set(cols))
        print(
            f"| {name} | {ty} | {tot / v1s:.4f} | {tot / v2s:.4f} | {len(cols)}/{nchunks} {per[:6]} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
