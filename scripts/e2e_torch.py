#!/usr/bin/env python3
"""One rank of the end-to-end check: real torch.distributed (backend nccl) through
whatever NCCL_NET / NCCL_NET_PLUGIN the environment selects. scripts/e2e.sh starts
two of these (two "nodes" on one GPU) and compares the runs.

Dry run (scripts/e2e_dryrun.sh): --backend gloo --device cpu runs every mode on the
CPU, with gloo between two local processes, so this file, e2e.sh and e2e_report.py
can be tested on a machine without a GPU. NCCL_* variables then have no effect.

Modes (--mode):
  check  every collective x dtype x size on deterministic data; writes the SHA-256
         of every result (rank-local) to --out, so runs over different transports
         can be compared bit for bit.
  bench  bus bandwidth (nccl-tests definition) of all_reduce etc. per size.
  train  a short DDP run of a small GPT in bf16; per-step losses and a hash of the
         final parameters to --out.
  graph  bf16 all_reduces of every size captured in one CUDA graph
         (torch.cuda.graph), replayed --replays times from the same inputs; the
         hash of each result after each replay, and of the same all_reduce run
         eagerly, to --out (eager on the CPU dry run, which has no graphs).

With two ranks, every reduction is a + b, which IEEE addition makes commutative bit
for bit: results must not depend on the algorithm or channel count NCCL picks, so
any difference between transports is a transport bug.
"""
import argparse
import hashlib
import json
import os
import sys
import time
import zlib

# Deterministic cuBLAS (train mode) needs this before CUDA initialises.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"]


def sizes(lo, hi):
    s = lo
    out = []
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def sync(dev):
    """Waits for the device's queued work (collectives on CUDA run asynchronously)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def data(nbytes, dtype, rank, tag, kind, dev):
    """Deterministic per (rank, tag): Gaussian values, or random bits (incompressible)."""
    # zlib.crc32, not hash(): str hashing is randomized per process.
    g = torch.Generator(device="cpu").manual_seed(zlib.crc32(f"{rank}/{tag}/{nbytes}/{dtype}".encode()))
    n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
    if kind == "random":
        bits = torch.randint(-(2**31), 2**31 - 1, (max(1, nbytes // 4),), generator=g, dtype=torch.int32)
        return bits.to(dev)  # int32: sums wrap deterministically, bytes look random
    return (torch.randn(n, generator=g) * 0.02).to(dtype).to(dev)


def run_collective(name, x, rank, world):
    if name == "all_reduce":
        y = x.clone()
        dist.all_reduce(y)
        return y
    if name == "all_gather":
        out = torch.empty(world * x.numel(), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x)
        return out
    if name == "reduce_scatter":
        n = x.numel() - x.numel() % world or world
        inp = x[:n] if x.numel() >= world else x.repeat(world)[:world]
        out = torch.empty(inp.numel() // world, dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, inp)
        return out
    if name == "broadcast":
        y = x.clone()
        dist.broadcast(y, src=0)
        return y
    if name == "all_to_all":
        n = x.numel() - x.numel() % world or world
        inp = x[:n] if x.numel() >= world else x.repeat(world)[:world]
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        return out
    if name == "send_recv":
        y = torch.empty_like(x)
        if rank == 0:
            dist.send(x, 1)
            dist.recv(y, 1)
        else:
            dist.recv(y, 0)
            dist.send(x, 0)
        return y
    raise ValueError(name)


def unsupported(a, rank, world, dev):
    """(collective, dtype) pairs this backend cannot run: none for nccl. For the dry
    run, each pair is tried once on a tiny tensor (both ranks fail alike, before any
    traffic) and the failures are printed and then skipped."""
    if a.backend == "nccl":
        return set()
    skip = set()
    for c in COLLECTIVES:
        for dt in list(DTYPES.values()) + [torch.int32]:
            try:
                run_collective(c, torch.ones(2 * world, dtype=dt, device=dev), rank, world)
            except (RuntimeError, ValueError, TypeError) as e:
                skip.add((c, dt))
                if rank == 0:
                    print(f"dry-run: skipped {c} {dt} ({a.backend}: {str(e).splitlines()[0][:120]})", flush=True)
    dist.barrier()
    if rank == 0 and not skip:
        print(f"dry-run: {a.backend} runs all {len(COLLECTIVES)} collectives in bf16, fp16, fp32 and int32", flush=True)
    return skip


def tobytes(t):
    """A tensor's bytes, in memory order."""
    u = t.detach().contiguous().view(torch.uint8).cpu()
    try:
        return u.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch built or installed without numpy
        return bytes(u.tolist())


def sha(t):
    return hashlib.sha256(tobytes(t)).hexdigest()


def mode_check(a, rank, world, dev):
    res = {}
    skip = unsupported(a, rank, world, dev)
    # Smallest sizes first, every dtype and kind at each: a run stopped at its time
    # limit still leaves whole sizes in the .partial file.
    for nbytes in sizes(a.min_bytes, a.max_bytes):
        for dt in a.dtypes.split(","):
            for kind in ("gauss", "random"):
                x = data(nbytes, DTYPES[dt], rank, 1, kind, dev)
                for c in COLLECTIVES:
                    if (c, x.dtype) in skip:
                        continue
                    y = run_collective(c, x, rank, world)
                    sync(dev)
                    res[f"{c}/{dt}/{kind}/{nbytes}"] = sha(y)
        with open(a.out + ".partial", "w") as f:
            json.dump({"done_up_to_bytes": nbytes, "result": res}, f)
    if not res:
        raise SystemExit("check: no collective ran")
    return res


def busbw_factor(name, world):
    return {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
            "reduce_scatter": (world - 1) / world, "broadcast": 1.0,
            "all_to_all": (world - 1) / world, "send_recv": 1.0}[name]


def mode_bench(a, rank, world, dev):
    res = []
    skip = unsupported(a, rank, world, dev)
    for c in a.collectives.split(","):
        for dt in a.dtypes.split(","):
            for nbytes in sizes(a.min_bytes, a.max_bytes):
                x = data(nbytes, DTYPES[dt], rank, 2, a.kind, dev)
                if (c, x.dtype) in skip:
                    continue
                for _ in range(a.warmup):
                    run_collective(c, x, rank, world)
                sync(dev)
                dist.barrier()
                iters = max(a.iters_min, min(a.iters, int(a.bench_bytes // max(nbytes, 1))))
                t0 = time.perf_counter()
                for _ in range(iters):
                    run_collective(c, x, rank, world)
                sync(dev)
                dt_s = (time.perf_counter() - t0) / iters
                algbw = x.numel() * x.element_size() / dt_s / 1e9
                res.append({"collective": c, "dtype": dt, "kind": a.kind, "bytes": x.numel() * x.element_size(),
                            "time_us": dt_s * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(c, world)})
                if rank == 0:
                    print(f"BENCH {c} {dt} {a.kind} {nbytes} busbw={res[-1]['busbw_GBps']:.3f} GB/s", flush=True)
    if not res:
        raise SystemExit("bench: no collective ran")
    return res


class Block(torch.nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x, mask):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=512, d=256, h=4, layers=4, ctx=128):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList([Block(d, h) for _ in range(layers)])
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), 1))

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t].to(x.dtype))
        return self.head(x)


def math_attention():
    """Attention by the math kernel (matmul, softmax): deterministic in forward and
    backward on every device, where the fused CUDA kernels may not be."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.MATH)
    except ImportError:  # torch < 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False)


def mode_train(a, rank, world, dev):
    torch.manual_seed(1234)  # same init on both ranks
    torch.use_deterministic_algorithms(True)
    dtype = torch.bfloat16  # bf16 parameters, so gradients travel as bf16
    if (("all_reduce", dtype) in unsupported(a, rank, world, dev)):
        print(f"dry-run: skipped bf16 gradients ({a.backend}): training in fp32", flush=True)
        dtype = torch.float32
    model = TinyGPT().to(dev).to(dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator(device="cpu").manual_seed(99 + rank)
    losses = []
    with math_attention():
        for step in range(a.steps):
            idx = torch.randint(0, 512, (8, 129), generator=g).to(dev)
            logits = ddp(idx[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 512), idx[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if rank == 0:
                print(f"STEP {step} loss={loss.item():.6f}", flush=True)
    # DDP keeps both ranks' parameters identical; any transport error shows here too.
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(tobytes(p))
    return {"losses_hex": [float(l).hex() for l in losses], "losses": losses, "params_sha": h.hexdigest(),
            "dtype": str(dtype).split(".")[-1]}


def mode_graph(a, rank, world, dev):
    """all_reduce inside a CUDA graph, the way graph-captured training and inference
    step run their collectives: NCCL's kernels are replayed without the host, and
    the plugin must move their data all the same."""
    dtype = torch.bfloat16
    if ("all_reduce", dtype) in unsupported(a, rank, world, dev):
        dtype = torch.float32
    ns = sizes(a.min_bytes, a.max_bytes)
    xs = [data(n, dtype, rank, 3, a.kind, dev) for n in ns]
    res = {}
    # Eager first: the reference, and NCCL's connections exist before the capture.
    for n, x in zip(ns, xs):
        e = x.clone()
        dist.all_reduce(e)
        sync(dev)
        res[f"eager/{n}"] = sha(e)
    bufs = [x.clone() for x in xs]
    if dev.type == "cuda":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for b in bufs:
                dist.all_reduce(b)
        replay = g.replay
    else:
        def replay():
            for b in bufs:
                dist.all_reduce(b)
    for r in range(a.replays):
        for b, x in zip(bufs, xs):
            b.copy_(x)
        replay()
        sync(dev)
        for n, b in zip(ns, bufs):
            res[f"graph/{n}/replay{r}"] = sha(b)
    bad = [k for k in res if k.startswith("graph/") and res[k] != res["eager/" + k.split("/")[1]]]
    if rank == 0:
        print(f"GRAPH {len(ns)} sizes x {a.replays} replays ({'captured' if dev.type == 'cuda' else 'eager, dry run'}): "
              f"{'all equal to eager' if not bad else 'DIFFER from eager: ' + ', '.join(bad)}", flush=True)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["check", "bench", "train", "graph"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtypes", default="bf16,fp16,fp32")
    p.add_argument("--collectives", default="all_reduce")
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--kind", default="gauss", choices=["gauss", "random"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--iters-min", type=int, default=3)
    p.add_argument("--bench-bytes", type=float, default=2e9)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo: the CPU dry run")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args()
    if a.backend == "nccl" and a.device != "cuda":
        p.error("--backend nccl needs --device cuda")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("E2E_FAIL_RANK") == str(rank):
        # scripts/e2e_dryrun.sh: a rank that dies before the rendezvous leaves its
        # peer waiting, which is what e2e.sh must notice and stop.
        sys.exit(f"rank {rank}: failing on purpose (E2E_FAIL_RANK)")
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_DEVICE", "0")))
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    if a.backend == "nccl":
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    else:
        dist.init_process_group(a.backend, rank=rank, world_size=world)
    t0 = time.time()
    res = {"check": mode_check, "bench": mode_bench, "train": mode_train, "graph": mode_graph}[a.mode](a, rank, world, dev)
    dist.barrier()
    dist.destroy_process_group()
    meta = {"rank": rank, "secs": time.time() - t0, "torch": torch.__version__, "backend": a.backend,
            "device": str(dev), "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}
    if a.backend == "nccl":
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if dev.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(dev)
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "result": res}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
