#!/usr/bin/env bash
# The evaluations behind README Results for one adapter in one precision: builds what they need (the
# evaluation KGs, indices and endpoints; each step is reused when already built), runs every row and
# prints each table with report.py. Interrupted, run it again: every evaluate.py run resumes where it
# stopped. The timings mean something only on a machine left alone while it runs.
#
#   bash runs/results.sh                       # every group, adapters/grisp-mix-0.5b, precision auto
#   bash runs/results.sh skeletons demo        # some groups
#   ADAPTER=adapters/grisp-wwq-0.5b PRECISION=float32 bash runs/results.sh skeletons   # another adapter
#   EVALUATE_FLAGS="--limit 2" bash runs/results.sh demo   # extra evaluate.py flags for every run (a smoke test)
#
# Groups (in the default order): skeletons (--skeleton-only on demo, qald10-dev and wwq-dev; each alone
# as demo-skeletons etc.), demo, wwq-dev-kg, wwq-dev-full (the full system, then `-ablations`: every
# ablation row and the gold-skeleton row; `demo-ablations` etc. also work alone). Runs land in
# ~/.cache/grisp/eval/<adapter>-<precision>/.
set -euo pipefail
shopt -s inherit_errexit  # a failing step inside $(kg_flags ...) stops the script too
cd "$(dirname "$0")/.."
adapter=${ADAPTER:-adapters/grisp-mix-0.5b}
precision=${PRECISION:-auto}
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(skeletons demo demo-ablations wwq-dev-kg wwq-dev-kg-ablations wwq-dev-full wwq-dev-full-ablations)
out=~/.cache/grisp/eval/$(basename "$adapter")-$precision
items_index=~/.cache/grisp/indices/wikidata-items
eval_kg=~/.cache/grisp/eval_kg

read -r -a extra_flags <<< "${EVALUATE_FLAGS:-}"
evaluate() { python evaluate.py --adapter "$adapter" --precision "$precision" "${extra_flags[@]}" "$@"; }

# the benchmark flags of each KG setting; starts its endpoint and builds its index first
kg_flags() {
  case $1 in
    demo)
      python endpoint.py start >&2
      python build_index.py --endpoint http://127.0.0.1:7878/query >&2
      echo "--benchmark demo" ;;
    wwq-dev-kg)
      python build_eval_kg.py >&2
      python build_index.py --items $eval_kg/wwq-dev/items.jsonl --out ~/.cache/grisp/indices/wwq-dev >&2
      python endpoint.py start --data $eval_kg/wwq-dev/kg.nt --store ~/.cache/grisp/stores/wwq-dev --port 7879 >&2
      echo "--benchmark wwq-dev-kg --endpoint http://127.0.0.1:7879/query --index $HOME/.cache/grisp/indices/wwq-dev" ;;
    wwq-dev-full)
      python build_eval_kg.py --setting full >&2
      python build_index.py --items ~/.cache/grisp/data/wikidata/items.jsonl --out $items_index >&2
      python endpoint.py start --data $eval_kg/wwq-dev-full/kg.nt --store ~/.cache/grisp/stores/wwq-dev-full --port 7880 >&2
      echo "--benchmark wwq-dev-full --endpoint http://127.0.0.1:7880/query --index $items_index" ;;
  esac
}

full_system() {  # $1 = KG setting
  local flags; flags=$(kg_flags "$1")
  evaluate $flags --out "$out/$1-none"
  python report.py systems "$out/$1-none"
}

ablations() {  # $1 = KG setting; the resolution-only rows reuse the full system's skeletons
  local flags run=$out/$1; flags=$(kg_flags "$1")
  evaluate $flags --out "$run-none"
  for ablation in no-rerank no-kg-guidance no-constrained no-backtracking; do
    evaluate $flags --ablation $ablation --skeletons-from "$run-none" --out "$run-$ablation"
  done
  evaluate $flags --ablation no-beam-search --out "$run-no-beam-search"
  evaluate $flags --ablation all-disabled --skeletons-from "$run-no-beam-search" --out "$run-all-disabled"
  evaluate $flags --oracle-skeleton --out "$run-oracle"
  python report.py systems "$run"-{none,no-rerank,no-beam-search,no-kg-guidance,no-constrained,no-backtracking,all-disabled}
  python report.py systems "$run-oracle"
}

skeletons() {  # $1 = benchmark: demo (labels from the demo index), qald10-dev or wwq-dev (all items)
  if [ "$1" = demo ]; then
    kg_flags demo > /dev/null
    evaluate --skeleton-only --benchmark demo --out "$out/demo-skeletons"
  else
    python build_index.py --items ~/.cache/grisp/data/wikidata/items.jsonl --out $items_index
    evaluate --skeleton-only --benchmark "$1" --index $items_index --out "$out/$1-skeletons"
  fi
  python report.py skeletons "$out/$1-skeletons"
}

echo "adapter $adapter, precision $precision, runs in $out; groups: ${groups[*]}"
for group in "${groups[@]}"; do
  case $group in
    skeletons)
      for benchmark in demo qald10-dev wwq-dev; do skeletons $benchmark; done
      python report.py skeletons "$out"/{demo,qald10-dev,wwq-dev}-skeletons ;;
    demo-skeletons | qald10-dev-skeletons | wwq-dev-skeletons) skeletons "${group%-skeletons}" ;;
    demo | wwq-dev-kg | wwq-dev-full) full_system "$group" ;;
    demo-ablations | wwq-dev-kg-ablations | wwq-dev-full-ablations) ablations "${group%-ablations}" ;;
    *) echo "unknown group $group (skeletons or demo-, qald10-dev-, wwq-dev-skeletons; demo, wwq-dev-kg," \
            "wwq-dev-full, each also with -ablations)" >&2
       exit 2 ;;
  esac
done
