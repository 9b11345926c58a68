#!/usr/bin/env bash
# The long mixture run behind adapters/grisp-mix-0.5b (issues 15/39): starts it, or continues it from
# ~/.cache/grisp/runs/mix or from a portable copy runs/mix/ (committed at every stop while it ran).
# Runs in the background; stop it with: kill -INT $(cat ~/.cache/grisp/logs/mix/pid)   (it checkpoints,
# copies, and exits)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p ~/.cache/grisp/logs/mix
resume=""
if [ -e ~/.cache/grisp/runs/mix/latest ] || [ -e runs/mix/state.json ]; then resume="--resume"; fi
nohup python train.py --data wwq,qald10,qald7,lcquad2,sq,spinach --name mix --lora-layers 0 \
  --loss-weighting reference --epochs 2 --checkpoint-every 10 --val-fraction 0.02 --threads 2 \
  --micro-batch-size 1 --portable-dir runs $resume >> ~/.cache/grisp/logs/mix/train.log 2>&1 &
echo $! > ~/.cache/grisp/logs/mix/pid
echo "mix: pid $(cat ~/.cache/grisp/logs/mix/pid) ${resume:-(new run)}; log ~/.cache/grisp/logs/mix/train.log"
