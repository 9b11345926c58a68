#!/usr/bin/env bash
# The embedded offline demo, from a fresh clone: installs the runtime packages, gets the base model,
# serves the demo Wikidata subset on a local SPARQL endpoint, builds its search index and answers the
# README question with the shipped adapter. Every step is idempotent.
#   bash demo.sh                                   # the README question
#   bash demo.sh "Who composed the music for Jaws?"
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # usage: the comment above
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
cd "$(dirname "$0")"
question=${1:-"Where was the Pulp Fiction director born?"}
python -m pip install -q -r requirements.txt
python get_model.py                                   # -> ~/.cache/grisp/models/qwen2.5-coder-0.5b-instruct
python endpoint.py start                              # data/demo/kg.ttl on http://127.0.0.1:7878/query
python build_index.py --endpoint http://127.0.0.1:7878/query   # -> ~/.cache/grisp/indices/demo
python infer.py "$question"                            # adapters/grisp-shapes-0.5b, the shipped adapter
echo "The demo endpoint keeps running for more questions (python infer.py \"...\"); stop it: python endpoint.py stop"
