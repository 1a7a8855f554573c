#!/usr/bin/env python3
"""NCCL's own tuning choices, read from rank logs written with NCCL_DEBUG=INFO and
TUNING in NCCL_DEBUG_SUBSYS: for each collective and size, the algorithm, protocol
and channel range NCCL picked (NCCL 2.28.9 src/enqueue.cc logs, on rank 0,
"<Func>: <bytes> Bytes -> Algo <algo> proto <proto> channel{Lo..Hi}={lo..hi}"),
plus the channel count and what the net reported.

  nccl_tuning.py LOG [LOG...]        one table per log, then a side-by-side table
                                     when several logs are given (e.g. Socket vs Zip)
Exit status 1 when a log holds no tuning line at all (TUNING not in the mask, or
NCCL never ran a collective).
"""
import re
import sys
from collections import OrderedDict

CHOICE = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels, (\d+) p2p channels")
NET = re.compile(r"NCCL INFO (?:Using network .*|NET/Plugin: Loaded net plugin .*)")


def parse(path):
    choices = OrderedDict()
    facts = []
    with open(path, errors="replace") as f:
        for line in f:
            m = CHOICE.search(line)
            if m:
                func, nbytes, algo, proto, lo, hi = m.groups()
                choices.setdefault((func, int(nbytes)), f"{algo}/{proto}/ch{lo}-{hi}")
                continue
            for rx in (CHANNELS, NET):
                m = rx.search(line)
                fact = m.group(0).split("NCCL INFO ", 1)[1].strip() if m else None
                if fact and fact not in facts:
                    facts.append(fact)
    return choices, facts


def main(paths):
    runs = OrderedDict((p, parse(p)) for p in paths)
    empty = [p for p, (c, _) in runs.items() if not c]
    for p, (choices, facts) in runs.items():
        print(f"## {p}")
        for x in facts:
            print(f"- {x}")
        if not choices:
            print("- no tuning line (is TUNING in NCCL_DEBUG_SUBSYS? did rank 0 run a collective?)")
        print()
    if len(runs) > 1:
        keys = OrderedDict()
        for c, _ in runs.values():
            for k in c:
                keys[k] = True
        names = [p.rsplit("/", 1)[-1] for p in runs]
        print("| collective | bytes | " + " | ".join(names) + " |")
        print("|---|---:|" + "---|" * len(names))
        for k in keys:
            cells = [c.get(k, "-") for c, _ in runs.values()]
            mark = "" if len(set(cells)) == 1 else " **differs**"
            print(f"| {k[0]} | {k[1]} | " + " | ".join(cells) + f" |{mark}")
    elif runs:
        (c, _), = runs.values()
        print("| collective | bytes | algo/proto/channels |")
        print("|---|---:|---|")
        for k, v in c.items():
            print(f"| {k[0]} | {k[1]} | {v} |")
    return 1 if empty else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
