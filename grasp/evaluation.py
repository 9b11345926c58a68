"""evaluate.py --system agent: the GRASP agent (agent.py) as an evaluation pipeline, with the same scoring
as GRISP (docs/agent.md; evaluate.py executes gold and predicted queries and scores them).

The agent's model and options come from a config file (config.py); its one knowledge graph is the
one evaluated (evaluate's --endpoint and --index). Each record gets, besides GRISP's fields, the
agent's status, steps (model turns), calls per function and feedback rounds; the summary their means.

    settings, make = eval_setup("grasp.toml", "http://127.0.0.1:7878/query", index_dir, agent.build_agent)
    answer = make().answer("Who directed Pulp Fiction?")   # grisp.Answer's fields + `extra`
"""

from collections import Counter
from dataclasses import asdict, replace
from types import SimpleNamespace
from typing import Callable

from grasp.backends import BackendError
from grasp.config import check, load_config
from grisp.sparql_syntax import PREFIXES, with_prefixes


class EvalPipeline:
    """For evaluate.py: `answer(question)` has grisp.Answer's fields (sparql with PREFIX lines, trace,
    timings, error, failure) plus `extra` (agent status, steps, calls per function, feedbacks)."""

    def __init__(self, agent):  # an agent.Agent
        self.agent = agent

    def answer(self, question: str):
        r = self.agent.run(question)
        prefixes = self.agent.kgs[r.kg].prefixes if r.kg in self.agent.kgs else PREFIXES
        extra = {
            "agent_status": r.status,
            "steps": r.steps,
            "calls": dict(r.calls),
            "feedbacks": r.feedbacks,
            "answer_text": r.answer,
        }
        return SimpleNamespace(
            sparql=with_prefixes(r.sparql, prefixes) if r.sparql else None,
            skeletons=[],
            trace=r.trace,
            timings=r.timings,
            backtracks=0,
            error=r.error,
            failure=r.failure,
            queries=None,
            endpoint_faults={},
            verified=None,  # no per-question tally for the agent
            extra=extra,
        )


def eval_setup(
    config_path: str | None, endpoint: str, index, build_agent: Callable
) -> tuple[dict, Callable[[], EvalPipeline]]:
    """evaluate.py --system agent: the settings to save, and a maker of the pipeline (the config file's
    model and options over the one knowledge graph evaluated: evaluate's --endpoint and --index);
    `build_agent(config)` is agent.py's (the loop lives in the root's agent.py, above this package)."""
    config = load_config(config_path)
    evaluated = replace(config.knowledge_graphs[0], endpoint=endpoint, index=str(index) if index else None)
    config.knowledge_graphs = [evaluated]
    check(config)
    settings = {
        "config_file": config.source,
        "kg": config.knowledge_graphs[0].name,
        "model": asdict(config.model),
        "options": asdict(config.agent),
    }

    def make() -> EvalPipeline:
        try:
            return EvalPipeline(build_agent(config))
        except BackendError as e:  # e.g. no model directory: a message, not a traceback
            raise ValueError(str(e)) from None

    return settings, make


def agent_summary(records: list[dict]) -> dict:
    """Steps, function calls and statuses per question over evaluation records."""
    runs = [r for r in records if "steps" in r]
    n = max(len(runs), 1)
    calls = Counter()
    for r in runs:
        calls.update(r["calls"])
    return {
        "steps_mean": sum(r["steps"] for r in runs) / n,
        "calls_mean": sum(calls.values()) / n,
        "calls_per_question": {k: v / n for k, v in sorted(calls.items())},
        "statuses": dict(Counter(r["agent_status"] for r in runs)),
    }
