#!/usr/bin/env bash
# `make test` as CI and a newcomer meet it, on a loaded machine: RUNS consecutive runs, each on a fresh
# clone of this checkout's main (cloned when the run starts) in a new folder beside ../shared (so the
# shared-data tests run), with an empty TORCH_EXTENSIONS_DIR, and `python3 -c "while True: pass"` beside
# it the whole time (the second CPU-heavy job). Writes one result file per run into OUT_DIR.
#   bash bench/time_make_test.sh [RUNS] [OUT_DIR]        (defaults: 3, docs/results/timings)
set -u
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
runs=${1:-3}
out_dir=$(cd "${2:-$src/docs/results/timings}" && pwd)
base=$(cd "$src/.." && pwd)
for i in $(seq 1 "$runs"); do
  work="$base/fresh-loaded-$i"
  rm -rf "$work" && git clone -q -b main "$src" "$work" && cd "$work" || exit 1
  commit=$(git log --oneline -1 | cut -c1-7)
  start=$(date -u '+%Y-%m-%d %H:%M'); stamp=$(date -u '+%Y-%m-%d_%H%M')
  python3 -c "while True: pass" & hog=$!
  ( while sleep 30; do cut -d' ' -f1 /proc/loadavg; done ) > "$work.load" & sampler=$!
  TORCH_EXTENSIONS_DIR="$work.torch_extensions" /usr/bin/time -f "%e %M" -o "$work.time" make test > "$work.log" 2>&1
  rc=$?
  kill "$hog" "$sampler"
  read -r wall_s rss_kb < <(tail -1 "$work.time")  # a failed run: time writes its exit status first
  summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* in " "$work.log" | tail -1)
  hostile=$(grep -E "^hostile battery:" "$work.log" | tail -1)
  load=$(sort -n "$work.load" | awk '{a[NR]=$1; s+=$1} END {if (NR) printf "min %.2f, max %.2f, mean %.1f (%d samples)", a[1], a[NR], s/NR, NR}')
  cat > "$out_dir/make_test_loaded_${stamp}.txt" <<EOF
make test on a fresh clone, on a loaded 2-core machine (run $i of $runs, consecutive)
=======================================================
what:     git clone of main at $commit into a new folder beside ../shared (so the shared-data tests run),
          an empty TORCH_EXTENSIONS_DIR (DeepSpeed's ops built from scratch), then \`make test\` as README
          says, with \`python3 -c "while True: pass"\` running beside it the whole time (the second CPU-heavy
          job); script: bench/time_make_test.sh
when:     $start UTC, $(nproc) cores
load:     1-minute load average sampled every 30 s: $load
wall:     $(date -u -d "@${wall_s%.*}" '+%-H:%M:%S') for \`make test\` (/usr/bin/time), installation included
peak RSS: $((rss_kb / 1024)) MB (largest single process, /usr/bin/time)
exit:     $rc
result:   $summary
          $hostile
EOF
  rm -rf "$work.torch_extensions"
  [ "$rc" = 0 ] || { echo "run $i failed (exit $rc): $work.log"; exit "$rc"; }
done
