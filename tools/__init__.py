"""Lab tooling: the scripts that build evaluation data, make the agent's training data and read results
(the stages a user runs are at the root). Each runs from the repository root as `python tools/NAME.py`.

    report.py               the results tables (docs/results*.md) from evaluate.py run directories
    build_eval_kg.py        the closed WWQ-dev evaluation KGs (docs/evaluation.md)
    gen_agent_data.py       agent conversations to fine-tune the local model as the agent (docs/agent.md)
    dead_ends.py            where one evaluation gives up on questions another answers
    name_choices.py         `named` for runs recorded before it existed (re-scored by today's confidence)
    matched_rerank_sets.py  the --mention experiment's two matched re-ranking training sets (runs/mention.sh)
    rerank_probe.py         an adapter's re-ranker on held-out re-ranking samples
"""
