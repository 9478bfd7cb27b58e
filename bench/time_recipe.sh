#!/usr/bin/env bash
# The cpu-tiny recipe as a newcomer meets it: a fresh clone of this checkout's main in a new folder beside
# ../shared (the recipe's corpus and GLUE paths are relative to it), `make install` timed on its own, then
# `bertflow recipe --config recipes/cpu-tiny.yaml` timed end to end (every stage, the three GLUE rows, the
# learning curve, zero-shot STS-B). Writes the timing to OUT_DIR/recipe_cpu_tiny_<stamp>.txt and copies the
# report (comparison.md, .json, .png) into REPORT_DIR, its paths made relative to the clone (bench/relative_paths.py).
#   bash bench/time_recipe.sh [RECIPE] [OUT_DIR] [REPORT_DIR]
#   (defaults: recipes/cpu-tiny.yaml, docs/results/timings, docs/results/cpu-tiny-<stamp>, stamp = UTC start)
set -u
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
recipe=${1:-recipes/cpu-tiny.yaml}
out_dir=$(cd "${2:-$src/docs/results/timings}" && pwd)
stamp=$(date -u '+%Y-%m-%d_%H%M')
report_dir=${3:-$src/docs/results/$(basename "$recipe" .yaml)-$stamp}  # its own folder: never an earlier run's
base=$(cd "$src/.." && pwd)
work="$base/fresh-recipe-$stamp"
git clone -q -b main "$src" "$work" && cd "$work" || exit 1
commit=$(git log --oneline -1 | cut -c1-7)
start=$(date -u '+%Y-%m-%d %H:%M')
( while sleep 60; do cut -d' ' -f1 /proc/loadavg; done ) > "$work.load" & sampler=$!
t0=$(date +%s)
make install > "$work.install.log" 2>&1; rc_install=$?
t1=$(date +%s)
TORCH_EXTENSIONS_DIR="$work.torch_extensions" /usr/bin/time -f "%e %M" -o "$work.time" \
  .venv/bin/bertflow recipe --config "$recipe" > "$work.log" 2>&1
rc=$?
t2=$(date +%s)
kill "$sampler"
read -r wall_s rss_kb < <(tail -1 "$work.time")
load=$(sort -n "$work.load" | awk '{a[NR]=$1; s+=$1} END {if (NR) printf "min %.2f, max %.2f, mean %.1f (%d samples)", a[1], a[NR], s/NR, NR}')
found=$(ls runs/*/compare/*/comparison.json 2>/dev/null | head -1)  # the report's folder, not a reference row's cells
report=${found:+$(dirname "$found")}
if [ "$rc" = 0 ] && [ -n "$report" ]; then
  mkdir -p "$report_dir" && cp "$report"/comparison.md "$report"/comparison.json "$report"/comparison.png "$report_dir/"
  # the copies name paths relative to the clone, not this machine's folders
  "$work/.venv/bin/python" "$src/bench/relative_paths.py" --root "$work" "$report_dir"/comparison.md "$report_dir"/comparison.json
fi
cat > "$out_dir/recipe_$(basename "$recipe" .yaml | tr - _)_${stamp}.txt" <<EOF
bertflow recipe --config $recipe on a fresh clone (2 CPU cores unless said otherwise)
=======================================================
what:     git clone of main at $commit into a new folder beside ../shared, \`make install\`, then
          \`.venv/bin/bertflow recipe --config $recipe\` (script: bench/time_recipe.sh)
when:     $start UTC, $(nproc) cores
load:     1-minute load average sampled every 60 s: $load
install:  $((t1 - t0)) s (exit $rc_install)
recipe:   $((t2 - t1)) s wall (exit $rc), peak RSS $((rss_kb / 1024)) MB (largest single process, /usr/bin/time)
total:    $((t2 - t0)) s from the clone to the report
report:   $report -> ${report_dir#"$src"/}

Where the wall time went (bench/recipe_times.py: the flow log's task spans, the GLUE cells' finish times;
paths relative to the clone):
$([ -n "$report" ] && "$work/.venv/bin/python" "$src/bench/recipe_times.py" --log "$work.log" \
   --output-root "$(dirname "$(dirname "$report")")" 2>&1 | sed "s|$work/||g")
EOF
echo "recipe: exit $rc in $((t2 - t1)) s; log $work.log"
