#!/usr/bin/env python3
"""Judges and reports scripts/e2e.sh's results (the JSON files of scripts/e2e_torch.py).

    e2e_report.py check OUT [--protos Simple,LL,LL128] [--transports off,zip]
        every result hash of each transport's run must equal the Socket run's, for
        each protocol and rank; all_reduce, all_gather and broadcast must also give
        both ranks the same bytes. Exit 1 on any difference or missing file.
    e2e_report.py bench OUT        (or just: e2e_report.py OUT)
        bus bandwidth table (OUT/report.md, printed) and a PNG plot against message
        size (OUT/busbw.png; skipped, saying so, where matplotlib is missing).
    e2e_report.py train OUT [--transports zip]
        per-step losses (as hex floats) and the final parameters' hash of each
        transport's run must equal the Socket run's, on both ranks.

    e2e_report.py paths LOG --net Zip|Socket
        from one rank's NCCL INFO log: which path NCCL took per channel ("[send] via
        NET/Zip/0/GDRDMA": the plugin got GPU buffers) and the plugin's "device
        path:" line and WARN lines, on one line. Exit 1 if any connection went
        another way (another net, P2P, SHM, CollNet), or if NCCL logged INFO lines
        but no connection line.

Runs anywhere: copy OUT back from the GPU machine and run it here if need be.
"""
import argparse
import collections
import json
import os
import re
import sys

# The collectives whose result is the same on both ranks (with two ranks, a + b is
# b + a bit for bit).
SAME_ON_ALL_RANKS = ("all_reduce", "all_gather", "broadcast")


def load(out, name, rank, problems):
    p = os.path.join(out, f"{name}.rank{rank}.json")
    try:
        with open(p) as f:
            return json.load(f)["result"]
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"{os.path.basename(p)}: unreadable ({e.__class__.__name__}: {e})")
        return None


def check(out, protos, transports):
    problems = []
    for proto in protos:
        refs = []
        for rank in (0, 1):
            ref = load(out, f"check-{proto}-socket", rank, problems)
            refs.append(ref)
            if ref is None:
                continue
            if not ref:
                problems.append(f"check-{proto}-socket.rank{rank}: no results")
                continue
            for t in transports:
                got = load(out, f"check-{proto}-{t}", rank, problems)
                if got is None:
                    continue
                diff = sorted(k for k in ref if got.get(k) != ref[k])
                extra = sorted(set(got) - set(ref))
                print(f"check {proto} {t} rank{rank}: {len(ref) - len(diff)}/{len(ref)} results identical to Socket"
                      + (f", {len(extra)} not in the Socket run" if extra else ""))
                for k in diff[:5]:
                    print("   differs:" if k in got else "   missing:", k)
                if len(diff) > 5:
                    print(f"   ... and {len(diff) - 5} more")
                if diff or extra:
                    problems.append(f"check {proto} {t} rank{rank}: {len(diff)} differ, {len(extra)} extra")
        # Cross-rank: the Socket baseline itself (and so the hashing) must be sane.
        if all(refs):
            keys = [k for k in refs[0] if k.split("/")[0] in SAME_ON_ALL_RANKS]
            bad = [k for k in keys if refs[0][k] != refs[1].get(k)]
            print(f"check {proto} socket: {len(keys) - len(bad)}/{len(keys)} all_reduce/all_gather/broadcast "
                  "results identical on both ranks")
            for k in bad[:5]:
                print("   differs between ranks:", k)
            if bad:
                problems.append(f"check {proto} socket: {len(bad)} results differ between ranks")
    return verdict("check", problems)


def train(out, transports):
    problems = []
    for rank in (0, 1):
        ref = load(out, "train-socket", rank, problems)
        if ref is None:
            continue
        a = ref.get("losses_hex", [])
        if not a:
            problems.append(f"train-socket.rank{rank}: no steps")
            continue
        for t in transports:
            got = load(out, f"train-{t}", rank, problems)
            if got is None:
                continue
            b = got.get("losses_hex", [])
            same = a == b
            params = ref.get("params_sha") is not None and ref.get("params_sha") == got.get("params_sha")
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"train {t} rank{rank}: {len(b)} steps ({got.get('dtype', 'bf16')}), losses identical to Socket: "
                  f"{same}" + ("" if same else f" (first difference at step {first})")
                  + f"; final parameters identical: {params}")
            if not same or not params:
                problems.append(f"train {t} rank{rank}: {'losses' if not same else 'parameters'} differ")
            if rank == 0 and same:
                print(f"   losses: {float.fromhex(a[0]):.4f} -> {float.fromhex(a[-1]):.4f}")
    # DDP keeps the replicas equal: both ranks must end with the same parameters.
    for t in ["socket"] + list(transports):
        r = [load(out, f"train-{t}", rank, []) for rank in (0, 1)]
        if all(r) and r[0].get("params_sha") != r[1].get("params_sha"):
            problems.append(f"train {t}: rank0 and rank1 end with different parameters")
    return verdict("train", problems)


def graph(out, transports):
    """Every replay of the captured all_reduces equals the eager result of the same
    run, and every transport's results equal Socket's."""
    problems = []
    for rank in (0, 1):
        runs = {t: load(out, f"graph-{t}", rank, problems) for t in ["socket"] + list(transports)}
        for t, res in runs.items():
            if res is None:
                continue
            bad = [k for k in res if k.startswith("graph/") and res[k] != res.get("eager/" + k.split("/")[1])]
            print(f"graph {t} rank{rank}: {sum(k.startswith('graph/') for k in res)} replayed results, "
                  f"{'all equal to eager' if not bad else str(len(bad)) + ' differ from eager'}")
            if bad:
                problems.append(f"graph {t} rank{rank}: {len(bad)} replays differ from eager, first {bad[0]}")
        ref = runs["socket"]
        for t in transports:
            if ref is not None and runs[t] is not None:
                same = runs[t] == ref
                print(f"graph {t} rank{rank}: {'identical to' if same else 'DIFFERS from'} Socket")
                if not same:
                    problems.append(f"graph {t} rank{rank}: results differ from Socket")
    return verdict("graph", problems)


def verdict(what, problems):
    for p in problems:
        print(f"{what} FAILED: {p}")
    if not problems:
        print(f"{what}: ok")
    return 1 if problems else 0


def load_bench(out, kind, t):
    p = f"{out}/bench-{kind}-{t}.rank0.json"
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return {r["bytes"]: r["busbw_GBps"] for r in json.load(f)["result"]}


def human(n):
    for u, s in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= u and n % u == 0:
            return f"{n // u}{s}"
    return str(n)


def ratio(a, b):
    return f"{a / b:.2f}" if b else "-"


def bench(out):
    lines = []
    meta_file = f"{out}/machine.txt"
    if os.path.exists(meta_file):
        with open(meta_file) as f:
            lines += ["```", f.read().strip(), "```", ""]
    series = {}
    for kind in ("gauss", "random"):
        s, o, z = (load_bench(out, kind, t) for t in ("socket", "off", "zip"))
        if not s:
            continue
        series[kind] = (s, o, z)
        lines += [f"## bf16 all_reduce, {'Gaussian' if kind == 'gauss' else 'incompressible (random int32)'} data", "",
                  "| size | Socket busbw GB/s | plugin off | plugin zip | zip / Socket | zip / off |", "|---|---|---|---|---|---|"]
        for n in sorted(s):
            sv, ov, zv = s[n], (o or {}).get(n, float("nan")), (z or {}).get(n, float("nan"))
            lines.append(f"| {human(n)} | {sv:.3f} | {ov:.3f} | {zv:.3f} | {ratio(zv, sv)} | {ratio(zv, ov)} |")
        lines.append("")
    if not series:
        print(f"bench FAILED: no bench-*-socket.rank0.json in {out}")
        return 1
    with open(f"{out}/report.md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}/report.md")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("busbw.png skipped: no matplotlib here (run scripts/e2e_report.py bench OUT on a machine with it)")
        return 0
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4), squeeze=False)
    for ax, (kind, (s, o, z)) in zip(axes[0], series.items()):
        for label, d in (("NCCL Socket", s), ("plugin, compression off", o), ("plugin, compressed", z)):
            if d:
                xs = sorted(d)
                ax.plot(xs, [d[x] for x in xs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title("bf16 all_reduce, " + ("Gaussian data" if kind == "gauss" else "random int32 (incompressible)"))
        ax.grid(True, alpha=0.3)
        ax.legend()
    if any("DRY RUN" in x for x in lines):
        fig.suptitle("DRY RUN: gloo on the CPU, no NCCL, no plugin (tests the scripts only)", color="red")
    fig.tight_layout()
    fig.savefig(f"{out}/busbw.png", dpi=110)
    print(f"wrote {out}/busbw.png")
    return 0


def paths(log, net):
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    # NCCL logs one line per connection: "Channel 00/0 : 0[0] -> 1[0] [send] via
    # NET/Zip/0/GDRDMA" (with "(1)" after the device for a send through a proxy rank,
    # "(PCI)" and "/Shared" suffixes), "Channel 00/0 : 0[0] -> 1[0] via P2P/IPC",
    # "Channel 00 : 0[0] -> 1[0] via SHM/direct/direct", "CollNet 00/0 : 0 [send]
    # via COLLNET/...". Every one of them is counted, so a path other than the
    # chosen net fails the run, not only another net.
    conn = re.compile(r"(?:Channel|CollNet) \d+(?:/\d+)? : .*?((?:\[(?:send|receive)\] )?via \S+)")
    via = collections.Counter(m.group(1) for m in (conn.search(x) for x in lines) if m)
    parts = ["NCCL: " + ("; ".join(f"{n} {k}" for k, n in sorted(via.items())) or "no connection ('via') line found")]
    if net == "Zip":
        dev = next((m.group(0) for m in (re.search(r"device path: .*", x) for x in lines) if m), None)
        parts.append("plugin: " + (dev or "host buffers only (no 'device path:' line)"))
        if dev is None and any("/GDRDMA" in k for k in via):
            parts.append("NOTE: NCCL says GDRDMA, yet the plugin logged no device path")
        warns = [x.split("NCCL WARN ", 1)[1] for x in lines if "NCCL WARN NET/Zip" in x]
        if warns:
            parts.append(f"{len(warns)} plugin WARN lines, first: {warns[0]}")
    print("; ".join(parts))
    other = sorted(k for k in via if not k.split("via ", 1)[1].startswith(f"NET/{net}/"))
    if other:
        print(f"FAILED: NCCL_NET={net}, but NCCL went {', '.join(other)}")
        return 1
    # NCCL logged (NCCL_DEBUG=INFO) yet no connection: the mask or the format
    # changed, and nothing above was checked. (The gloo dry run logs no NCCL line.)
    if not via and any(" NCCL INFO " in x for x in lines):
        print("FAILED: NCCL INFO log without any 'Channel ... via' line: the path NCCL took is unknown")
        return 1
    return 0


def main(argv):
    if len(argv) == 1 and argv[0] not in ("check", "bench", "train", "graph", "paths", "-h", "--help"):
        argv = ["bench"] + argv  # the old form: e2e_report.py OUT
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("out")
    c.add_argument("--protos", default="Simple,LL,LL128")
    c.add_argument("--transports", default="off,zip")
    b = sub.add_parser("bench")
    b.add_argument("out")
    t = sub.add_parser("train")
    t.add_argument("out")
    t.add_argument("--transports", default="zip")
    g = sub.add_parser("graph")
    g.add_argument("out")
    g.add_argument("--transports", default="zip")
    n = sub.add_parser("paths")
    n.add_argument("log")
    n.add_argument("--net", required=True)
    a = p.parse_args(argv)
    if a.cmd == "paths":
        return paths(a.log, a.net)
    if a.cmd == "check":
        return check(a.out, a.protos.split(","), a.transports.split(","))
    if a.cmd == "train":
        return train(a.out, a.transports.split(","))
    if a.cmd == "graph":
        return graph(a.out, a.transports.split(","))
    return bench(a.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
