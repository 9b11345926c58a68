#!/usr/bin/env bash
# The --mention experiment (docs/results-mention.md): the shipped
# adapter trained 30 steps further on re-ranking samples alone, once with 120 of its 240 samples naming
# the entity by the question's words (--mention) and once on the same samples in their plain form (the
# control); then each re-ranks the shipped adapter's own skeletons (--rerank-adapter, --skeletons-from)
# on wwq-dev-full and the demo, under None's cut alone (--no-retry: what the re-rankers' None does).
# Needs, in $O, the full system (-none) and w/o re-ranking (-no-rerank) runs of both benchmarks, which
# the -ablations groups of runs/results.sh make (with their other ablation rows):
#   PRECISION=bfloat16 bash runs/results.sh demo-ablations wwq-dev-full-ablations
# docs/results-mention.md compares with full systems under None's cut alone: for its tables give that
# command OUT=$O EVALUATE_FLAGS=--no-retry and this one the same O, another directory than the default
# (e.g. O=~/.cache/grisp/eval/grisp-mix-0.5b-bfloat16-no-retry).
# About 35 min of training and 25 of evaluation on 2 cores.
#
# N=480 WORK=~/.cache/grisp/mention2 ARMS=mention bash runs/mention.sh   # the longer run: 120 steps, no control
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # usage: the comment above
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
N=${N:-120}                                   # worded training samples, as many plain beside them
ARMS=${ARMS:-mention control}
home=${GRISP_HOME:-$HOME/.cache/grisp}
work=${WORK:-$home/mention}
O=${O:-$home/eval/grisp-mix-0.5b-bfloat16}
tag=$([ "$N" = 120 ] && echo "" || echo "-$((2 * N))")   # eval dirs: rerank-mention, rerank-mention-960
mkdir -p "$work"
for m in 0 1; do
  [ -f "$work/all-$m.jsonl" ] || python gen_data.py --data wwq,qald10,qald7,lcquad2,sq,spinach --epochs 1 \
    --mention $m --out "$work/all-$m.jsonl"
done
python tools/matched_rerank_sets.py "$work/all-0.jsonl" "$work/all-1.jsonl" "$work" --n-worded "$N" --n-plain "$N"
for arm in $ARMS; do
  [ -d "$work/runs/$arm/adapter" ] || python train.py --samples "$work/train-$arm.jsonl" --val-data "$work/val.jsonl" \
    --init-adapter adapters/grisp-mix-0.5b --epochs 1 --runs-dir "$work/runs" --name $arm --checkpoint-every 10
done
for arm in $ARMS; do
  python evaluate.py --benchmark wwq-dev-full --endpoint http://127.0.0.1:7880/query \
    --index "$home/indices/wikidata-items" --precision bfloat16 --rerank-adapter "$work/runs/$arm/adapter" \
    --no-retry --skeletons-from "$O/wwq-dev-full-none" --out "$O/wwq-dev-full-rerank-$arm$tag"
  python evaluate.py --benchmark demo --precision bfloat16 --rerank-adapter "$work/runs/$arm/adapter" \
    --no-retry --skeletons-from "$O/demo-none" --out "$O/demo-rerank-$arm$tag"
done
python tools/report.py systems "$O"/wwq-dev-full-{none,no-rerank} $(for a in $ARMS; do echo "$O/wwq-dev-full-rerank-$a$tag"; done)
python tools/report.py systems "$O"/demo-{none,no-rerank} $(for a in $ARMS; do echo "$O/demo-rerank-$a$tag"; done)
