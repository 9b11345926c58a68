#!/usr/bin/env bash
# The evaluations behind docs/results.md for one adapter in one precision: builds what they need (the
# evaluation KGs, indices and endpoints; each is built once and reused), runs every row and prints each
# table with tools/report.py. Interrupted, run it again: every evaluate.py run resumes where it stopped (after a
# change to the Python sources it refuses: another OUT, or EVALUATE_FLAGS=--accept-other-code). Leave
# the machine alone while it runs: the time budgets are wall-clock, so on a busy machine answers can change,
# not only timings (evaluate.py warns when the load is high as a run starts). Needs bash 4.4 or newer. The
# endpoints it starts keep running for the next group or run; stop them with `python endpoint.py stop`
# (demo), `... stop --store ~/.cache/grisp/stores/wwq-dev` and `.../stores/wwq-dev-full`.
#
#   bash runs/results.sh                       # every group, adapters/grisp-shapes-0.5b, precision auto
#   bash runs/results.sh skeletons demo        # some groups
#   ADAPTER=adapters/grisp-wwq-0.5b PRECISION=float32 bash runs/results.sh skeletons   # another adapter
#   OUT=/tmp/smoke EVALUATE_FLAGS="--limit 2" bash runs/results.sh demo   # a smoke test, runs kept apart
#   OUT=~/.cache/grisp/eval/paper-cut EVALUATE_FLAGS=--no-retry bash runs/results.sh demo   # None's cut alone
#
# Groups (in the default order: the headline rows first, so an interrupted day has them): skeletons
# (--skeleton-only on demo, qald10-dev and wwq-dev; each alone as demo-skeletons etc.), demo, wwq-dev-kg,
# wwq-dev-full (the full systems), then demo-ablations, wwq-dev-kg-ablations, wwq-dev-full-ablations
# (w/o re-ranking and None's cut alone `--no-retry` on the full system's skeletons, gold skeletons with and
# without re-ranking, then every other ablation row and the paper's "re-ranking only"). Not in the default
# order: wwq-dev-real-tune and wwq-dev-real-report (the full system and w/o re-ranking on a half of the
# realistic setting, with the precision-coverage table and plot; docs/evaluation.md).
# Settings: ADAPTER (relative to the current directory), PRECISION, OUT (where the runs land, relative to the current directory; default
# ~/.cache/grisp/eval/<adapter name>-<precision>, the adapter's name being its directory's, or its
# run's for a training run's `adapter/`), EVALUATE_FLAGS (added to every evaluate.py run: flags that
# every kind of run takes, such as --limit or --seed).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # usage: the comment above
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
adapter=$(realpath "${ADAPTER:-$(dirname "$0")/../adapters/grisp-shapes-0.5b}")
[ -z "${OUT:-}" ] || OUT=$(realpath -m "$OUT")  # relative to the current directory, as ADAPTER
cd "$(dirname "$0")/.."
precision=${PRECISION:-auto}
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(skeletons demo wwq-dev-kg wwq-dev-full demo-ablations wwq-dev-kg-ablations wwq-dev-full-ablations)
name=$(basename "$adapter")
[ "$name" != adapter ] || name=$(basename "$(dirname "$adapter")")
home=${GRISP_HOME:-$HOME/.cache/grisp}
out=${OUT:-$home/eval/$name-$precision}
eval_kg=$home/eval_kg
items_index=$home/indices/wikidata-items
read -r -a extra_flags <<< "${EVALUATE_FLAGS:-}"

evaluate() { python evaluate.py --adapter "$adapter" --precision "$precision" "${extra_flags[@]}" "$@"; }

build_items_index() {  # the index over all of items.jsonl (the file copied into the cache first if need be)
  local items
  items=$(python -c "from grisp import benchmarks; print(benchmarks.cached_file(benchmarks.ITEMS_FILE))")
  python build_index.py --items "$items" --out "$items_index"
}

kg=()  # the benchmark flags of a KG setting, set by use_kg
use_kg() {  # $1 = KG setting: builds its KG and index once, starts its endpoint, sets kg
  case $1 in
    demo)
      python endpoint.py start
      python build_index.py --endpoint http://127.0.0.1:7878/query
      kg=(--benchmark demo) ;;
    wwq-dev-kg)  # (re)built unless built with today's popularity (counted in the training material)
      grep -qs '"popularity": "training"' "$eval_kg/wwq-dev/stats.json" || python tools/build_eval_kg.py
      python build_index.py --items "$eval_kg/wwq-dev/items.jsonl" --out "$home/indices/wwq-dev"
      python endpoint.py start --data "$eval_kg/wwq-dev/kg.nt" --store "$home/stores/wwq-dev" --port 7879
      kg=(--benchmark wwq-dev-kg --endpoint http://127.0.0.1:7879/query --index "$home/indices/wwq-dev") ;;
    wwq-dev-full)
      grep -qs '"popularity": "training"' "$eval_kg/wwq-dev-full/stats.json" || python tools/build_eval_kg.py --setting full
      python build_index.py --items "$eval_kg/wwq-dev-full/items.jsonl" --out "$home/indices/wwq-dev-full"
      python endpoint.py start --data "$eval_kg/wwq-dev-full/kg.nt" --store "$home/stores/wwq-dev-full" --port 7880
      kg=(--benchmark wwq-dev-full --endpoint http://127.0.0.1:7880/query --index "$home/indices/wwq-dev-full") ;;
    wwq-dev-real-tune | wwq-dev-real-report)  # one KG, two halves (docs/evaluation.md)
      [ -s "$eval_kg/wwq-dev-real/stats.json" ] || python tools/build_eval_kg.py --setting real
      python build_index.py --items "$eval_kg/wwq-dev-real/items.jsonl" --out "$home/indices/wwq-dev-real"
      python endpoint.py start --data "$eval_kg/wwq-dev-real/kg.nt" --store "$home/stores/wwq-dev-real" --port 7881
      kg=(--benchmark "$1" --endpoint http://127.0.0.1:7881/query --index "$home/indices/wwq-dev-real") ;;
  esac
}

full_system() {  # $1 = KG setting
  use_kg "$1"
  evaluate "${kg[@]}" --out "$out/$1-none"
  python tools/report.py systems "$out/$1-none"
  python tools/report.py shapes "$out/$1-none"
}

ablations() {  # $1 = KG setting; the resolution-only rows reuse the full system's skeletons
  local run=$out/$1
  use_kg "$1"
  evaluate "${kg[@]}" --out "$run-none"
  # the rows that place the full system first: w/o re-ranking, None's cut alone (the paper's search), gold skeletons
  evaluate "${kg[@]}" --ablation no-rerank --skeletons-from "$run-none" --out "$run-no-rerank"
  evaluate "${kg[@]}" --no-retry --skeletons-from "$run-none" --out "$run-none-no-retry"
  evaluate "${kg[@]}" --oracle-skeleton --out "$run-oracle"
  # gold skeletons resolved in the index's order: what re-ranking can add once the skeleton is right
  evaluate "${kg[@]}" --oracle-skeleton --ablation no-rerank --out "$run-no-rerank-oracle"
  for ablation in no-kg-guidance no-constrained no-backtracking; do
    evaluate "${kg[@]}" --ablation $ablation --skeletons-from "$run-none" --out "$run-$ablation"
  done
  evaluate "${kg[@]}" --ablation no-beam-search --out "$run-no-beam-search"
  for ablation in all-disabled rerank-only; do  # the paper's stripped-down rows: plain index search, + re-ranking
    evaluate "${kg[@]}" --ablation $ablation --skeletons-from "$run-no-beam-search" --out "$run-$ablation"
  done
  python tools/report.py systems "$run"-{none,none-no-retry,no-rerank,no-beam-search,no-kg-guidance,no-constrained,no-backtracking,all-disabled,rerank-only}
  python tools/report.py systems "$run"-{oracle,no-rerank-oracle}
}

trust() {  # $1 = wwq-dev-real-tune or -report: the full system and w/o re-ranking, precision against coverage
  local run=$out/$1
  use_kg "$1"
  evaluate "${kg[@]}" --out "$run-none"
  evaluate "${kg[@]}" --ablation no-rerank --skeletons-from "$run-none" --out "$run-no-rerank"
  python tools/report.py systems "$run"-{none,no-rerank}
  python tools/report.py risk "$run"-{none,no-rerank} --without-retry --plot "$run-risk.svg"
}

skeletons() {  # $1 = benchmark: demo (labels from the demo index), qald10-dev or wwq-dev (all items)
  if [ "$1" = demo ]; then
    use_kg demo
    evaluate --skeleton-only --benchmark demo --out "$out/demo-skeletons"
  else
    build_items_index
    evaluate --skeleton-only --benchmark "$1" --index "$items_index" --out "$out/$1-skeletons"
  fi
  python tools/report.py skeletons "$out/$1-skeletons"
}

all_skeletons() {
  for benchmark in demo qald10-dev wwq-dev; do skeletons $benchmark; done
  python tools/report.py skeletons "$out"/{demo,qald10-dev,wwq-dev}-skeletons
}

steps=()  # every group name is checked before the first group runs
for group in "${groups[@]}"; do
  case $group in
    skeletons) steps+=(all_skeletons) ;;
    demo-skeletons | qald10-dev-skeletons | wwq-dev-skeletons) steps+=("skeletons ${group%-skeletons}") ;;
    demo | wwq-dev-kg | wwq-dev-full) steps+=("full_system $group") ;;
    demo-ablations | wwq-dev-kg-ablations | wwq-dev-full-ablations) steps+=("ablations ${group%-ablations}") ;;
    wwq-dev-real-tune | wwq-dev-real-report) steps+=("trust $group") ;;
    *) echo "unknown group $group (skeletons or demo-, qald10-dev-, wwq-dev-skeletons; demo, wwq-dev-kg," \
            "wwq-dev-full, each also with -ablations; wwq-dev-real-tune, wwq-dev-real-report)" >&2
       exit 2 ;;
  esac
done
echo "adapter $adapter, precision $precision, runs in $out; groups: ${groups[*]}"
for step in "${steps[@]}"; do
  $step  # a function and its group's KG setting or benchmark
done
