#!/usr/bin/env bash
# Dry run of the GPU end-to-end test on a machine without a GPU: scripts/e2e.sh with
# E2E_DRYRUN=1 runs every part (check, bench, train) as it would on the GPU machine,
# two ranks on 127.0.0.1, but with torch.distributed's gloo backend on the CPU and
# small sizes (1 MiB, 2 training steps); e2e_report.py then judges the results as it
# would there (all three "transports" are gloo, so they must agree). Then:
#   - the judges must catch a changed hash, a changed loss and a missing file;
#   - e2e.sh must stop a rank whose peer died, and exit non-zero.
# This tests the scripts, not the plugin: gloo ignores every NCCL_* variable.
#
# Needs PyTorch (CPU is enough) and, for busbw.png, matplotlib: installed into
# VENV (default .venv-e2e, ignored by git), from local wheels (PIP_FIND_LINKS) when
# they have them, else from the package index. Not part of scripts/test.sh.
#
# Env: VENV, OUT (results folder; default a temporary one, removed on success),
# STEPS (2), PARTS (check,bench,train: e2e.sh's parts to run; the judges of a part
# left out are not tested; the log-summary and dead-rank tests always run), NETNS
# (0; "auto": the ranks in network namespaces, as on the GPU machine: needs root,
# and replaces any zipa/zipb namespaces already up).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv-e2e}
PY=$VENV/bin/python
say() { echo "e2e_dryrun: $*" >&2; }

pip_install() { # local wheels only first (a CPU torch there is far smaller), then the index
  local links=${PIP_FIND_LINKS:-}
  if [[ -n $links ]] && "$PY" -m pip install --quiet --no-index --find-links "$links" "$@" 2>/dev/null; then
    return 0
  fi
  "$PY" -m pip install --quiet "$@"
}
has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
[[ -x $PY ]] || python3 -m venv "$VENV"
if ! has torch; then
  say "installing torch into $VENV"
  pip_install torch numpy
fi
if ! has matplotlib; then
  pip_install matplotlib || say "matplotlib unavailable: the report must say busbw.png was skipped"
fi
HAVE_MPL=0
has matplotlib && HAVE_MPL=1
# Two ranks share this machine's cores: one thread each, or they fight for them.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

KEEP=${OUT:+1}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/e2e-dryrun.XXXXXX")}
mkdir -p "$OUT"
FAILS=()
fail() { say "FAIL: $*"; FAILS+=("$*"); }
T0=$SECONDS

PARTS=${PARTS:-check,bench,train}
part() { [[ ,$PARTS, == *,$1,* ]]; }

# 1. The whole e2e run, dry. A caller's NCCL_ZIP_LINK_MBPS must not reach the ranks
# (LINK_HINT unset: auto is not told the link's speed).
say "e2e.sh, dry run, results in $OUT"
if NCCL_ZIP_LINK_MBPS=1234 E2E_DRYRUN=1 PYTHON="$PY" OUT="$OUT/run" STEPS="${STEPS:-2}" MAX_BYTES=$((1 << 20)) \
  MAX_BYTES_CHECK=$((1 << 20)) BENCH_ARGS="--warmup 1 --iters 5" RUN_TIMEOUT=300 PARTS=$PARTS scripts/e2e.sh; then
  say "e2e.sh passed"
else
  fail "e2e.sh exited $?"
fi
R=$OUT/run
for f in machine.txt e2e.log; do [[ -s $R/$f ]] || fail "no $f"; done
grep -q '^link hint: none' "$R/machine.txt" || fail "machine.txt does not say 'link hint: none' (LINK_HINT unset)"
if part check; then
  for p in Simple LL LL128; do for t in socket off zip; do for r in 0 1; do
    [[ -s $R/check-$p-$t.rank$r.json ]] || fail "no check-$p-$t.rank$r.json"
    # Sizes run smallest first, each rank saving what it has after each size.
    "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d["done_up_to_bytes"] != 1 << 20 or not d["result"])' \
      "$R/check-$p-$t.rank$r.json.partial" 2>/dev/null || fail "check-$p-$t.rank$r.json.partial missing or not up to 1 MiB"
  done; done; done
fi
if part bench; then
  for k in gauss random; do for t in socket off zip; do
    [[ -s $R/bench-$k-$t.rank0.json ]] || fail "no bench-$k-$t.rank0.json"
  done; done
  [[ -s $R/report.md ]] || fail "no report.md"
  grep -q 'zip / Socket' "$R/report.md" || fail "report.md has no bandwidth table"
  if ((HAVE_MPL)); then
    [[ -s $R/busbw.png ]] || fail "matplotlib is here but there is no busbw.png"
  fi
fi
# Without matplotlib the report must say so (checked on a copy, with matplotlib hidden).
if part bench; then
  mkdir -p "$OUT/nompl/hide/matplotlib"
  echo 'raise ImportError("hidden by e2e_dryrun.sh")' >"$OUT/nompl/hide/matplotlib/__init__.py"
  cp "$R"/bench-*.json "$OUT/nompl/"
  if PYTHONPATH="$OUT/nompl/hide" "$PY" scripts/e2e_report.py bench "$OUT/nompl" >"$OUT/nompl.out" 2>&1; then
    grep -q 'busbw.png skipped' "$OUT/nompl.out" || fail "without matplotlib, the report does not say busbw.png was skipped"
    [[ -s $OUT/nompl/report.md ]] || fail "without matplotlib, no report.md"
  else
    fail "e2e_report.py bench fails without matplotlib: $(tail -1 "$OUT/nompl.out")"
  fi
fi
grep -q 'DRY RUN' "$R/machine.txt" || fail "machine.txt does not say DRY RUN"
for m in check bench train; do
  part "$m" || continue
  "$PY" - "$R" "$m" <<'EOF' || fail "$m JSON not as e2e_report.py expects"
import json, sys
out, m = sys.argv[1], sys.argv[2]
name = {"check": "check-Simple-zip", "bench": "bench-gauss-zip", "train": "train-zip"}[m]
d = json.load(open(f"{out}/{name}.rank0.json"))
assert d["meta"]["backend"] == "gloo", d["meta"]
# The NCCL settings e2e.sh gives the ranks (gloo ignores them; the JSON records them).
env = d["meta"]["env"]
want = {"NCCL_NET": "Zip", "NCCL_NET_PLUGIN_REF_COUNT": "1", "NCCL_ZIP_COMPRESS": "auto", "NCCL_ZIP_GPU": "on",
        "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
bad = {k: (env.get(k), v) for k, v in want.items() if env.get(k) != v}
assert not bad, f"rank env (got, want): {bad}"
assert "TUNING" in env.get("NCCL_DEBUG_SUBSYS", "").split(","), env
assert "NCCL_ZIP_LINK_MBPS" not in env, "a caller's NCCL_ZIP_LINK_MBPS reached the ranks without LINK_HINT=1"
assert env.get("NCCL_NET_PLUGIN", "").endswith("libnccl-net-zip.so"), env
sock = json.load(open(f"{out}/{name.replace('-zip', '-socket')}.rank0.json"))["meta"]["env"]
assert sock.get("NCCL_NET") == "Socket" and sock.get("NCCL_NET_PLUGIN") == "none", sock
r = d["result"]
if m == "check":
    assert len(r) >= 5 * 3 * 2 * 6 - 12, len(r)  # sizes x dtypes x kinds x collectives
    assert all(len(v) == 64 for v in r.values())
elif m == "bench":
    assert r and all(x["busbw_GBps"] > 0 for x in r), r
else:
    assert len(r["losses_hex"]) >= 1 and len(r["params_sha"]) == 64, r
    assert [float.fromhex(h) for h in r["losses_hex"]] == r["losses"], r
EOF
done

# 2. The judges must catch what they are there to catch.
mutate() { # FILE PYTHON-EXPR-ON-d: rewrites a results JSON
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
p, expr = sys.argv[1], sys.argv[2]
d = json.load(open(p))
exec(expr)
json.dump(d, open(p, "w"))
EOF
}
expect_fail() { # WHAT SUBCOMMAND DIR PATTERN
  local what=$1 sub=$2 dir=$3 pat=$4 out
  if out=$("$PY" scripts/e2e_report.py "$sub" "$dir" 2>&1); then
    fail "e2e_report.py $sub passed with $what"
  elif ! grep -q -- "$pat" <<<"$out"; then
    fail "e2e_report.py $sub failed with $what, but did not say '$pat': $(tail -1 <<<"$out")"
  else
    say "e2e_report.py $sub catches $what"
  fi
}
N=$OUT/neg
mkdir -p "$N/hash" "$N/missing" "$N/loss" "$N/params" "$N/empty"
# On the saved results of each part e2e.sh ran (PARTS).
if part check; then
  cp "$R"/check-*.json "$N/hash/"
  mutate "$N/hash/check-LL128-zip.rank1.json" 'k = sorted(d["result"])[7]; d["result"][k] = "0" * 64'
  expect_fail "one changed hash" check "$N/hash" "differs:"
  cp "$R"/check-*.json "$N/missing/"
  rm "$N/missing/check-LL-off.rank0.json"
  expect_fail "a missing run" check "$N/missing" "unreadable"
fi
if part train; then
  cp "$R"/train-*.json "$N/loss/"
  mutate "$N/loss/train-zip.rank0.json" 'd["result"]["losses_hex"][-1] = (float.fromhex(d["result"]["losses_hex"][-1]) * (1 + 2**-20)).hex()'
  expect_fail "one changed loss" train "$N/loss" "first difference at step"
  cp "$R"/train-*.json "$N/params/"
  mutate "$N/params/train-zip.rank1.json" 'd["result"]["params_sha"] = "f" * 64'
  expect_fail "changed final parameters" train "$N/params" "parameters identical: False"
fi
expect_fail "no bench results" bench "$N/empty" "no bench-"

# e2e.sh's summary of NCCL's INFO log (no NCCL here: synthetic lines in its format).
cat >"$N/zip.log" <<'EOF'
h:10:11 [0] NCCL INFO NET/Plugin: Loaded net plugin Zip (v8)
h:10:12 [0] NCCL INFO NET/Zip : device path: CUDA device 0, GPU codec kernels
h:10:13 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Zip/0/GDRDMA
h:10:13 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Zip/0/GDRDMA
h:10:13 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Zip/0/GDRDMA
h:10:13 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[0] [send] via NET/Zip/0(1)/GDRDMA(PCI)/Shared
h:10:14 [0] lane.rs:98 NCCL WARN NET/Zip : GPU codec unavailable on device 0 (test)
EOF
want='NCCL: 1 [receive] via NET/Zip/0/GDRDMA; 1 [send] via NET/Zip/0(1)/GDRDMA(PCI)/Shared; 2 [send] via NET/Zip/0/GDRDMA; plugin: device path: CUDA device 0, GPU codec kernels; 1 plugin WARN lines, first: NET/Zip : GPU codec unavailable on device 0 (test)'
got=$("$PY" scripts/e2e_report.py paths "$N/zip.log" --net Zip) || fail "paths: exit $? on a good Zip log"
[[ $got == "$want" ]] || fail "paths: got '$got', want '$want'"
sed 's|NET/Zip/0/GDRDMA|NET/Socket/0|; /device path/d' "$N/zip.log" >"$N/mixed.log"
if got=$("$PY" scripts/e2e_report.py paths "$N/mixed.log" --net Zip); then
  fail "paths: exit 0 although NCCL went NET/Socket with NCCL_NET=Zip"
elif ! grep -q 'but NCCL went .*NET/Socket' <<<"$got" || ! grep -q 'host buffers only' <<<"$got"; then
  fail "paths: unexpected summary of a Socket/Zip log: $got"
else
  say "e2e_report.py paths summarises NCCL's via-NET lines and the plugin's device path, and catches a wrong net"
fi

# 3. A rank that dies leaves its peer waiting: e2e.sh must stop the peer and fail.
S=$SECONDS
if E2E_FAIL_RANK=1 E2E_DRYRUN=1 PYTHON="$PY" OUT="$OUT/dead" PARTS=train STEPS=1 GRACE=3 RUN_TIMEOUT=120 \
  scripts/e2e.sh >"$OUT/dead.out" 2>&1; then
  fail "e2e.sh exited 0 although rank 1 failed"
elif ((SECONDS - S > 90)); then
  fail "e2e.sh took $((SECONDS - S)) s to give up on a dead rank (GRACE=3)"
elif ! grep -q 'train-socket FAILED after [0-9]* s (rank0 exit [1-9][0-9]*, rank1 exit 1' "$OUT/dead.out"; then
  fail "e2e.sh did not report the dead rank: $(grep FAILED "$OUT/dead.out" | head -1)"
else
  say "e2e.sh stops the peer of a dead rank ($((SECONDS - S)) s) and exits non-zero"
fi

echo
say "$((SECONDS - T0)) s; matplotlib: $( ((HAVE_MPL)) && echo yes || echo no)"
if ((${#FAILS[@]})); then
  say "${#FAILS[@]} FAILED (results kept in $OUT):"
  printf '  %s\n' "${FAILS[@]}" >&2
  exit 1
fi
say "all passed"
[[ -n $KEEP ]] || rm -rf "$OUT"
