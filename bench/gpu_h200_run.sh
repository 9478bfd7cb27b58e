#!/usr/bin/env bash
# What one lent H200 ran (15 minutes of device time in all, so one command with hard time limits):
#   1. bench/gpu_bert_large.py: BERT-large step variants beside the in-run plain-torch eager baseline;
#   2. bench/gpu_recipe.py device: recipes/gpu-small.yaml after its data stages (instances, pretraining,
#      export, intrinsic, GLUE rows, comparison report).
# Prepared on the CPU machine first (the GPU machine has torch but neither Prefect, Ray nor the corpus):
#   python bench/gpu_recipe.py prepare --config recipes/gpu-small.yaml        # runs/gpu-small/{documents,vocab}
#   mkdir -p runs/device-glue && cp -r ../shared/data/glue/{STS-B,SST-2,MRPC,RTE,CoLA} runs/device-glue/
#   wheels of what the GPU image lacks in .whl/ (deepspeed, pydantic, pydantic-core, annotated-types,
#   typing-inspection, typing-extensions, hjson, seqeval)
# and carried: .whl runs/gpu-small/documents runs/gpu-small/vocab runs/device-glue.
# Usage there: OUT=<folder for results> BENCH_S=160 RECIPE_S=400 bash bench/gpu_h200_run.sh
set -u
OUT=${OUT:?set OUT to a folder for the results}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc; date -u;
  python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

timeout "${BENCH_S:-160}" python3 bench/gpu_bert_large.py --json "$OUT/bert_large.json" --variants \
  torch_eager ds_zero1 ds_zero1_fast ds_zero1_fast_compiled torch_fast_compiled ds_zero1_fast_compiled_accum \
  torch_fast zro_fast_compiled fsdp2_fast_compiled > "$OUT/bert_large.log" 2>&1
echo "gpu_bert_large rc=$?" | tee -a "$OUT/bert_large.log"
grep -E '^\{' "$OUT/bert_large.log" | cut -c1-220

timeout "${RECIPE_S:-400}" python3 bench/gpu_recipe.py device --config recipes/gpu-small.yaml \
  --glue-dir runs/device-glue --no-minilm --timings "$OUT/recipe_timings.json" > "$OUT/recipe.log" 2>&1
echo "gpu_recipe rc=$?" | tee -a "$OUT/recipe.log"
grep -E '^stage |done in|^\|' "$OUT/recipe.log" | grep -v totals | cut -c1-200 | tail -60
# Everything the report and its figures come from, without the checkpoints' weights
find runs/gpu-small -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.png' \) \
  -not -path '*/step_*/*' | tar czf "$OUT/recipe.tgz" -T -
ls -la "$OUT"
