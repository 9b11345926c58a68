"""Synthesise GRASP agent conversations from question-SPARQL pairs, to fine-tune our small model as the
agent's local backend (docs/agent.md section 9). GRASP itself is zero-shot; the 0.5B model on this
machine does not follow the function-calling protocol by itself (docs/results-baselines.md: it loops), so we show
it the protocol on training questions.

For each record of the mixture `--data` (mixture.py: the QALD-10 hold-out stays out; records whose IRIs
the index cannot name are skipped), one conversation in the agent's own format (agent.Agent.conversation:
the system instruction and tool definitions of the config's first knowledge graph, as at inference):

    user       the question
    assistant  its plan (text): I search "pulp fiction" (entity), "director" (property), then I answer.
               search_entity(kg, query=<the entity as the question names it, else its label>)
    tool       the real result of that search in `--index`
    assistant  search_property(kg, query=<the property's label>)
    tool       ...                                 one search per KG item of the gold query, in query order
    assistant  answer(kg, sparql=<the gold query without PREFIX lines>, answer=ANSWER_TEXT)   the end

One call per turn (what the local backend decodes); the only text is the plan of the first turn, so
the model says what it will search before it does, and knows it is done when it has (`--no-plan`:
no text at all, the first agent adapter's conversations). There is no execute step: no offline
knowledge graph here holds the facts of the training questions (only WWQ dev's gold answers are on this
machine, and they are evaluation data), and a conversation whose query returns nothing would teach the
model to answer after an empty result. So the answer's text does not claim what the query returns.
A record is skipped, and counted, when a search does not show the gold item among its hits (the model
could not have found it so). A sample, for train.py --samples (loss.py: cross-entropy on the assistant
turns only):

    {"id": record id, "source": "wwq", "epoch": 0, "task": "agent", "messages": [...], "tools": [...]}

    python tools/gen_agent_data.py --data wwq --limit 300 --out ~/.cache/grisp/data/agent-wwq.jsonl
    python train.py --samples ~/.cache/grisp/data/agent-wwq.jsonl --name agent-wwq --max-length 4096 ...
"""

import argparse
import json
import random
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
from agent import Agent  # noqa: E402
from common import defaults  # noqa: E402
from common.defaults import WIKIDATA_INDEX_DIR  # noqa: E402
from common.jsonl import write_jsonl  # noqa: E402
from grasp.backends import ToolCall  # noqa: E402
from grasp.config import ConfigError, load_config, override  # noqa: E402
from grasp.functions import FunctionError, KnowledgeGraph, canonical, check_known  # noqa: E402
from grisp import (
    mixture,  # noqa: E402
)
from grisp.skeleton import query_iris, skeletonize  # noqa: E402

ANSWER_TEXT = "The result of this query."  # the trace never ran it (module docstring)


def main(args: argparse.Namespace) -> None:
    if args.limit < 0:
        sys.exit(f"error: --limit {args.limit}: give the number of records to sample, or 0 for all")
    # --- the agent's conversation start, with the knowledge graph's index replaced by --index
    config = load_config(args.config)
    if config.agent.task != "sparql-qa":
        sys.exit(f"error: the conversations answer with a query; the config's task is {config.agent.task!r}")
    kg = KnowledgeGraph.from_config(override(config.knowledge_graphs[0], index=args.index))
    agent = Agent({kg.name: kg}, backend=None, options=config.agent)
    functions, tools, system = agent.conversation(config.agent.task, [kg.name])

    # --- records: the mixture's usable ones, a seeded sample of --limit
    data = mixture.read(args.data).prepare(kg.indices)
    print(data.table())
    records = data.usable
    if args.limit and args.limit < len(records):
        records = random.Random(args.seed).sample(records, args.limit)

    # --- one conversation per record, written as made
    skipped, lengths = Counter(), []

    def conversations():
        for record in records:
            messages, reason = conversation(record, kg, functions, system, args.plan)
            if messages is None:
                skipped[reason] += 1
                continue
            lengths.append(sum(len(m["content"] or "") for m in messages))
            yield {
                "id": record["id"],
                "source": record.get("source", ""),
                "epoch": 0,
                "task": "agent",
                "messages": messages,
                "tools": tools,
            }

    out = Path(args.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, conversations())  # under a temporary name until complete
    print(
        f"{len(lengths)} conversations of {len(records)} records in {out}; skipped: "
        + (", ".join(f"{k} {v}" for k, v in skipped.most_common()) or "none")
    )
    if lengths:
        print(
            f"characters per conversation (without the tool definitions): median {statistics.median(lengths):.0f}, "
            f"max {max(lengths)}"
        )


def conversation(
    record: dict, kg: KnowledgeGraph, functions, system: dict, plan: bool = True
) -> tuple[list[dict] | None, str]:
    """The messages of one record's conversation (module docstring), or (None, why it was skipped)."""
    question, sparql = record["question"], skeletonize(record["sparql"], lambda _: None).skeleton
    messages, known = [system, {"role": "user", "content": question}], set()
    searches = []  # (function, query, item), one per KG item of the query, in query order
    for item in dict.fromkeys(canonical(iri) for iri in query_iris(record["sparql"])):
        indexed = kg.indices.item(item)
        if kg.indices.stores["property"].get(item) is not None:
            searches.append(("search_property", indexed.label, item))
        else:
            searches.append(("search_entity", mention(question, [indexed.label, *indexed.aliases]), item))
    for number, (name, query, item) in enumerate(searches, 1):
        arguments = {"kg": kg.name, "query": query}
        result = functions.call(name, arguments, known)
        if item not in known:
            return None, f"{name}_misses_gold"
        text = plan_text(searches) if plan and number == 1 else ""
        messages += call_messages(number, name, arguments, result, text)
    try:
        check_known(kg, sparql, known)
    except FunctionError:
        return None, "query_uses_unsearched_iri"
    answer = {"kg": kg.name, "sparql": sparql, "answer": ANSWER_TEXT}
    return messages + call_messages(
        len(searches) + 1, "answer", answer
    ), ""  # it ends the conversation: no result


def plan_text(searches: list[tuple[str, str, str]]) -> str:
    """The first turn's text: the searches to come, in order, then the answer."""
    kinds = {"search_entity": "entity", "search_property": "property"}
    steps = ", ".join(
        f"{json.dumps(query, ensure_ascii=False)} ({kinds[name]})" for name, query, _ in searches
    )
    return f"I search {steps}, then I answer."


def mention(question: str, names: list[str]) -> str:
    """How the question writes the longest of `names` (label, aliases), ignoring case; else the label."""
    for name in sorted(names, key=len, reverse=True):
        found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", question, re.IGNORECASE)
        if found:
            return found.group(0)
    return names[0]


def call_messages(
    number: int, name: str, arguments: dict, result: str | None = None, text: str = ""
) -> list[dict]:
    """An assistant turn with `text` and one call and, unless `result` is None, the tool message with it."""
    call = ToolCall.made(f"call_{number}", name, arguments)
    turn = {"role": "assistant", "content": text, "tool_calls": [call.message()]}
    return [turn] if result is None else [turn, {"role": "tool", "tool_call_id": call.id, "content": result}]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--data",
        default="wwq",
        help="training records: a mixture of sources with weights (mixture.py), e.g. wwq,qald10,sq",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="agent config (grasp.toml format) whose first knowledge graph, task and options the "
        "conversations use; default $GRASP_CONFIG or the built-in defaults (the demo KG)",
    )
    parser.add_argument(
        "--index",
        default=str(WIKIDATA_INDEX_DIR),
        help="search index the searches run in (instead of the config's); built by build_index.py",
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="use a seeded random sample of this many records (0: all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of that sample")
    parser.add_argument(
        "--plan",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the first turn says what will be searched (--no-plan: calls only, as the first "
        "agent adapter's conversations)",
    )
    parser.add_argument(
        "--out",
        default=str(defaults.GRISP_HOME / "data" / "agent-traces.jsonl"),
        help="output JSONL, one conversation per line",
    )
    return parser


if __name__ == "__main__":
    try:
        main(make_parser().parse_args())
    except (ConfigError, FileNotFoundError, ValueError, FunctionError) as error:
        sys.exit(f"error: {error}")
