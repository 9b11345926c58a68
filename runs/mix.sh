#!/usr/bin/env bash
# A long mixture run from the base model (issues 15/39): starts it, or continues it from
# ~/.cache/grisp/runs/NAME or from a portable copy runs/NAME/ (committed at every stop while it runs).
#   bash runs/mix.sh                          # NAME=mix: the run behind adapters/grisp-mix-0.5b
#   bash runs/mix.sh NAME [train.py flags]    # the same recipe under another name, with more flags
#                                             # (e.g. --compose-shapes ...); a resumed run must get the same flags
# Runs in the background; stop it with: kill -INT $(cat ~/.cache/grisp/logs/NAME/pid)   (it checkpoints,
# copies, and exits)
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-mix}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p ~/.cache/grisp/logs/$name
resume=""
if [ -e ~/.cache/grisp/runs/$name/latest ] || [ -e runs/$name/state.json ]; then resume="--resume"; fi
nohup python train.py --data wwq,qald10,qald7,lcquad2,sq,spinach --name $name --lora-layers 0 \
  --loss-weighting reference --epochs 2 --checkpoint-every 10 --val-fraction 0.02 --threads 2 \
  --micro-batch-size 1 --portable-dir runs $resume "$@" >> ~/.cache/grisp/logs/$name/train.log 2>&1 &
echo $! > ~/.cache/grisp/logs/$name/pid
echo "$name: pid $(cat ~/.cache/grisp/logs/$name/pid) ${resume:-(new run)}; log ~/.cache/grisp/logs/$name/train.log"
