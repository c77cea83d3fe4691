#!/usr/bin/env bash
# The suite on one GPU, in under 10 minutes: `make bench` on the device, one full-scale row, and the article's
# 7 rows x 3 seeds with each row's seeds batched into one model (`batch_seeds`). Writes its reports into
# ${OUT:-results/gpu} (bench.md, row.json, sweep.md, nvidia-smi.txt, log.txt).
#
#   bash bench/gpu.sh                    # with the project's .venv, or any Python that has its dependencies
#   PYTHON=python3 bash bench/gpu.sh     # e.g. a GPU machine's own PyTorch; pure-Python dependencies it lacks
#                                        # (hydra-core, omegaconf, submitit, the Hydra launchers) can come as
#                                        # wheels in .whl/, installed into a scratch folder first
#
# Each step has a time limit, so a slow step leaves the others their time; the reports say what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/gpu}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
log="$out/log.txt"
: > "$log"
say() { echo "[gpu $(date +%H:%M:%S)] $*" | tee -a "$log" >&2; }

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --target /tmp/bnrotation-site .whl/*.whl >>"$log" 2>&1
  export PYTHONPATH=/tmp/bnrotation-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
if ! "$py" -c "import torch, hydra, omegaconf, pandas, pyarrow; assert torch.cuda.is_available()" >>"$log" 2>&1; then
  say "no usable Python with CUDA and the suite's dependencies (PYTHON=$py); see $log"
  exit 2
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
"$py" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$log"
scratch=$(mktemp -d)

say "1/3 make bench on the GPU (in one process and as processes; probes, options, sweep)"
timeout 240 "$py" bench/bench.py --device cuda --steps 300 --rounds 2 --process-steps 600 --process-pairs 1 \
  --skip e,f --sweep-steps 300 --out "$out/bench.md" >>"$log" 2>&1 || say "bench stopped: $? (see $log)"

say "2/3 one full-scale row (adam, seed 0) on the GPU"
timeout 150 "$py" experiments/train.py experiment=adam seed=0 device=cuda progress=false \
  results_root="$scratch/row" >>"$log" 2>&1 || say "the row stopped: $?"
cp "$scratch/row/runs/adam/seed=0/run.json" "$out/row.json" 2>/dev/null || true

say "3/3 the article's 7 rows x 3 seeds, each row's seeds as one batched model"
rows=$(PYTHONPATH=src "$py" -c "from bnrotation.study.rows import PUBLISHED_ROWS; print(','.join(PUBLISHED_ROWS + ('adam_bn_m0.3',)))")
start=$(date +%s)
timeout 240 "$py" experiments/train.py -m batch_seeds=[0,1,2] experiment="$rows" device=cuda progress=false \
  results_root="$scratch/sweep" hydra.sweep.dir="$scratch/sweep/hydra" >>"$log" 2>&1 || say "the sweep stopped: $?"
wall=$(( $(date +%s) - start ))
"$py" - "$scratch/sweep" "$wall" > "$out/sweep.md" <<'EOF'
import json, sys
from pathlib import Path
root, wall = Path(sys.argv[1]), int(sys.argv[2])
runs = sorted(root.glob("runs/*/seed=*/run.json"))
print("# The article's rows on one GPU, seeds batched\n")
print(f"{len(runs)} runs finished in {wall} s of wall time (each row's 3 seeds trained as one model).\n")
print("| row | seed | wall seconds | train | checks | probes | interventions | averaging |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for path in runs:
    info = json.loads(path.read_text())
    t = info.get("timings_s", {})
    print(f"| {info['row']} | {info['seed']} | {info.get('wall_seconds')} | " +
          " | ".join(str(t.get(k, "-")) for k in ("train", "checks", "probes", "interventions", "averaging")) + " |")
EOF
say "done: $(ls "$out")"
rm -rf "$scratch"
