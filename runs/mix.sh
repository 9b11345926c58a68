#!/usr/bin/env bash
# A long mixture run from the base model (issues 15/39): starts it, or continues it from
# $GRISP_HOME/runs/NAME (GRISP_HOME: default ~/.cache/grisp) or from the portable copy runs/NAME/, which
# train.py refreshes at every checkpoint and stop (commit it at every stop while the run lasts).
#   bash runs/mix.sh                          # NAME=mix: the run behind adapters/grisp-mix-0.5b
#   bash runs/mix.sh NAME [train.py flags]    # the same recipe under another name, with more flags
#                                             # (e.g. --compose-shapes ...); a resumed run must get the same flags
#   bash runs/mix.sh shapes --compose-shapes chain,ask,intersection,superlative,count,filter
#                                             # the run behind adapters/grisp-shapes-0.5b, the shipped adapter
# Runs in the background; stop it with: kill -INT $(cat ~/.cache/grisp/logs/NAME/pid)   (in the loop it
# checkpoints, copies, and exits; before the first step it just exits)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # usage: the comment above
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
if [[ ${1:-} == -* ]]; then  # train.py flags come after the name (its log, pid and run directory)
  echo "error: NAME $1 starts with '-': give the run's name first (bash runs/mix.sh mix $*); see --help" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
name=${1:-mix}
shift $(( $# > 0 ? 1 : 0 ))
home=${GRISP_HOME:-$HOME/.cache/grisp}
logs=$home/logs/$name
mkdir -p "$logs"
# one trainer per run (a pid file whose process is gone, or is another program, does not count)
if [ -f "$logs/pid" ] && ps -p "$(cat "$logs/pid")" -o args= 2>/dev/null | grep -q -- "train.py.*--name $name "; then
  echo "$name is already running (pid $(cat "$logs/pid")); stop it first: kill -INT $(cat "$logs/pid")" >&2
  exit 1
fi
resume=""
# (runs/NAME.old: a copy whose swap was cut off; train.py puts it back)
if [ -e "$home/runs/$name/latest" ] || [ -e "runs/$name/state.json" ] || [ -e "runs/$name.old/state.json" ]; then
  resume="--resume"
fi
nohup python train.py --data wwq,qald10,qald7,lcquad2,sq,spinach --name $name --lora-layers 0 \
  --loss-weighting reference --epochs 2 --checkpoint-every 10 --val-fraction 0.02 --threads 2 \
  --micro-batch-size 1 --portable-dir runs $resume "$@" >> "$logs/train.log" 2>&1 &
echo $! > "$logs/pid"
echo "$name: pid $(cat "$logs/pid") ${resume:-(new run)}; log $logs/train.log"
