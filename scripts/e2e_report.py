#!/usr/bin/env python3
"""Turns scripts/e2e.sh's bench JSON files into a markdown table (report.md) and a
PNG plot of bus bandwidth against message size (busbw.png) in the same folder.
Runs anywhere: copy the folder back from the GPU machine and run it here if the
GPU machine has no matplotlib."""
import glob
import json
import os
import sys


def load(out, kind, t):
    p = f"{out}/bench-{kind}-{t}.rank0.json"
    if not os.path.exists(p):
        return None
    return {r["bytes"]: r["busbw_GBps"] for r in json.load(open(p))["result"]}


def human(n):
    for u, s in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= u and n % u == 0:
            return f"{n // u}{s}"
    return str(n)


def main(out):
    lines = []
    meta_file = f"{out}/machine.txt"
    if os.path.exists(meta_file):
        lines += ["```", open(meta_file).read().strip(), "```", ""]
    series = {}
    for kind in ("gauss", "random"):
        s, o, z = (load(out, kind, t) for t in ("socket", "off", "zip"))
        if not s:
            continue
        series[kind] = (s, o, z)
        lines += [f"## bf16 all_reduce, {'Gaussian' if kind == 'gauss' else 'incompressible (random int32)'} data", "",
                  "| size | Socket busbw GB/s | plugin off | plugin zip | zip / Socket | zip / off |", "|---|---|---|---|---|---|"]
        for n in sorted(s):
            sv, ov, zv = s[n], (o or {}).get(n, float("nan")), (z or {}).get(n, float("nan"))
            lines.append(f"| {human(n)} | {sv:.3f} | {ov:.3f} | {zv:.3f} | {zv / sv:.2f} | {zv / ov:.2f} |")
        lines.append("")
    open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib here: run scripts/e2e_report.py on another machine for busbw.png")
        return 0
    fig, axes = plt.subplots(1, len(series), figsize=(6 * max(1, len(series)), 4), squeeze=False)
    for ax, (kind, (s, o, z)) in zip(axes[0], series.items()):
        for label, d in (("NCCL Socket", s), ("plugin, compression off", o), ("plugin, compressed", z)):
            if d:
                xs = sorted(d)
                ax.plot(xs, [d[x] for x in xs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"bf16 all_reduce, {kind} data")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/busbw.png", dpi=110)
    print(f"wrote {out}/busbw.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
