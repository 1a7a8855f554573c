# Shared by the scripts that write bench/results/*.md: the lines that say where and
# at which commit a figure was measured.

# "Intel(R) Xeon(R) ..., 2 cores, kernel 6.x"
machine_desc() {
  echo "$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, kernel $(uname -r)"
}

# commit_desc ROOT → "abc1234", with " (src/ modified)" when src/ differs from it
commit_desc() {
  echo "$(git -C "$1" rev-parse --short HEAD)$(git -C "$1" diff --quiet HEAD -- src || echo ' (src/ modified)')"
}

# results_path NAME → bench/results/NAME-<date>.md under ROOT, or $OUT if set
# (the directory is made).
results_path() {
  mkdir -p "$ROOT/bench/results"
  echo "${OUT:-$ROOT/bench/results/$1-$(date -u +%Y-%m-%d).md}"
}

# results_head TITLE MACHINE_NOTE COMMAND SETTINGS: the title, then the machine,
# commit, command (with the script's settings after it) and plugin-settings lines
# every results file starts with.
results_head() {
  echo "# $1 ($(date -u +%Y-%m-%d))"
  echo
  echo "- Machine: $(machine_desc)$2"
  echo "- Commit: $(commit_desc "$ROOT")"
  echo "- Command: \`$3\` ($4)"
  echo "- Plugin settings: $(env | grep '^NCCL_ZIP_' | tr '\n' ' ' || true)(unset = defaults)"
}

# results_table HEAD ROWS: a markdown table, its separator row as wide as HEAD.
results_table() {
  echo "$1"
  awk -F'|' '{ s = "|"; for (i = 2; i < NF; i++) s = s "---|"; print s }' <<<"$1"
  echo "$2"
}

# results_runs WHAT FILE: a results file's last section, the raw runs (WHAT: their
# columns) in a code block.
results_runs() {
  echo "## Runs ($1)"
  echo
  echo '```'
  cat "$2"
  echo '```'
}

# results_record FILE PREFIX RESULT: one run's line, PREFIX then the GB/s and the
# wire/payload of RESULT (run_pair's or run_bidir's output), printed and appended
# to FILE (the raw runs that results_runs prints).
results_record() {
  local line
  line="$2 $(field GBps <<<"$3") $(field wire_per_payload <<<"$3")"
  echo "$line"
  echo "$line" >>"$1"
}
