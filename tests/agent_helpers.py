"""Helpers of the agent tests (tests/test_agent*.py): the demo KG as grasp.functions sees it, a scripted
chat backend, calls / replies written briefly, and a tiny text encoder for example indices.

    kg = demo_kg(demo_endpoint)                       # demo endpoint + prefix-only index (built once per session)
    backend = Scripted([reply(call("search_entity", kg="wikidata", query="pulp fiction")), ...])
"""

import copy
import functools
import tempfile
from pathlib import Path

import numpy as np

import build_index
from grasp.backends import Reply, ToolCall
from grasp.functions import KnowledgeGraph
from grisp.sparql import SparqlClient
from search import load_indices


@functools.lru_cache(maxsize=None)
def demo_index(endpoint_url: str) -> Path:
    """A search index of the demo KG, prefix search only (no encoder weights needed), built once."""
    out = Path(tempfile.mkdtemp(prefix="agent-demo-index-"))
    build_index.build(out, endpoint=endpoint_url, embed="none")
    return out


def demo_kg(endpoint_url: str, name: str = "wikidata", with_index: bool = True) -> KnowledgeGraph:
    indices = load_indices(demo_index(endpoint_url)) if with_index else None
    return KnowledgeGraph(name, SparqlClient(endpoint_url, retries=0), indices, "the demo subset of Wikidata")


def bag_of_words(texts):
    """A tiny deterministic encoder (hashed words) standing in for MiniLM."""
    out = np.zeros((len(texts), 64), np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().replace("?", "").split():
            out[i, hash(word) % 64] += 1.0
    return out


_ids = iter(range(10**9))


def call(name: str, **args) -> ToolCall:
    return ToolCall.made(f"call_{next(_ids)}", name, args)


def reply(*calls: ToolCall, content: str = "") -> Reply:
    return Reply(content, list(calls), seconds=0.01)


class Scripted:
    """A chat backend that plays back replies (a Reply, or a function of the messages returning one),
    repeating the last when the script runs out, and records what it was asked."""

    name = "scripted"

    def __init__(self, replies: list):
        self.replies, self.asked = list(replies), []

    def chat(self, messages, tools, deadline=None, tool_choice=None):
        self.asked.append(
            {
                "messages": copy.deepcopy(messages),
                "tools": [t["function"]["name"] for t in tools],
                "tool_choice": tool_choice,
            }
        )
        turn = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return turn(messages) if callable(turn) else copy.deepcopy(turn)
