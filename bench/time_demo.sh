#!/usr/bin/env bash
# The demo's time as a newcomer meets it: a fresh clone of this repository, then `make install`,
# `make demo` and `make demo` again, each timed alone (installation shown separately).
#   bash bench/time_demo.sh [OUT_FILE]      (clones HEAD of this checkout into a temporary folder)
set -u
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=$(mktemp -d /tmp/bertflow-demo-XXXX)
git clone -q "$src" "$work/bertflow" && cd "$work/bertflow" || exit 1
export TORCH_EXTENSIONS_DIR="$work/torch_extensions"   # DeepSpeed's JIT ops built from scratch, as on a new machine
out=${1:-/dev/stdout}
t() { local s e; s=$(date +%s.%N); "$@" > "$work/$(echo "$*" | tr ' ' _).log" 2>&1; rc=$?; e=$(date +%s.%N); echo "rc $rc, $(echo "$e - $s" | bc) s"; }
{
echo "fresh clone of $(git log --oneline | head -1 | cut -c1-7), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "make install: $(t make install)"
echo "make demo (first run, installation done): $(t make demo), load average after $(cut -d' ' -f1-3 /proc/loadavg)"
echo "make demo (rerun): $(t make demo); $(grep -c 'skipped (complete)' "$work/make_demo.log") stage lines say skipped (complete)"
} > "$out"
