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
