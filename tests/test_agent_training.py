"""Training the agent's local model on conversations (tools/gen_agent_data.py, loss.py's agent task): the
conversations a record gives over the demo KG, the tokens the loss reads, and train.py on them with a
tiny model."""

import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

import train
from agent import Agent
from grasp.config import AgentConfig
from grisp import loss, samples
from llm.tokenizer import Tokenizer, qwen_tool_prompt
from tests.agent_helpers import demo_index, demo_kg
from tests.tiny import make_model_dir
from tools import gen_agent_data

REPO = Path(__file__).resolve().parents[1]
PULP_FICTION = {
    "id": "r1",
    "question": "Who directed Pulp Fiction?",
    "sparql": "PREFIX wd: <http://www.wikidata.org/entity/> PREFIX wdt: <http://www.wikidata.org/prop/direct/> "
    "SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def demo(demo_endpoint):
    kg = demo_kg(demo_endpoint)
    functions, tools, system = Agent({kg.name: kg}, None, AgentConfig()).conversation("sparql-qa", [kg.name])
    return kg, functions, tools, system


def calls(messages: list[dict]) -> list[tuple[str, dict]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for m in messages
        if m.get("tool_calls")
        for c in m["tool_calls"]
    ]


# ---------------------------------------------------------------------------- conversations
def test_a_record_becomes_searches_then_the_answer(demo):
    kg, functions, tools, system = demo
    messages, reason = gen_agent_data.conversation(PULP_FICTION, kg, functions, system)
    assert (
        reason == ""
        and messages[0] == system
        and messages[1] == {"role": "user", "content": PULP_FICTION["question"]}
    )
    assert calls(messages) == [
        ("search_entity", {"kg": "wikidata", "query": "Pulp Fiction"}),  # as the question writes it
        ("search_property", {"kg": "wikidata", "query": "director"}),  # the property's label
        (
            "answer",
            {
                "kg": "wikidata",
                "sparql": "SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }",
                "answer": gen_agent_data.ANSWER_TEXT,
            },
        ),
    ]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert (
        "Pulp Fiction (wd:Q104123)" in results[0] and "director (wdt:P57)" in results[1]
    )  # the real searches
    assert len(results) == 2 and messages[-1]["role"] == "assistant"  # the answer ends it
    texts = [
        m["content"] for m in messages if m["role"] == "assistant"
    ]  # one call per turn, text only first:
    assert texts == [
        'I search "Pulp Fiction" (entity), "director" (property), then I answer.',
        "",
        "",
    ]  # the plan
    messages, _ = gen_agent_data.conversation(PULP_FICTION, kg, functions, system, plan=False)
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["", "", ""]  # the first adapter's


def test_a_record_whose_item_no_search_shows_is_skipped(demo, monkeypatch):
    kg, functions, tools, system = demo
    messages, _ = gen_agent_data.conversation(
        dict(PULP_FICTION, question="Who directed it?"), kg, functions, system
    )
    assert calls(messages)[0] == (
        "search_entity",
        {"kg": "wikidata", "query": "Pulp Fiction"},
    )  # not in it: the label
    search = kg.indices.search  # now the search never shows Pulp Fiction: the model could not have found it
    monkeypatch.setattr(
        kg.indices, "search", lambda *a, **kw: [h for h in search(*a, **kw) if not h.id.endswith("/Q104123")]
    )
    assert gen_agent_data.conversation(PULP_FICTION, kg, functions, system) == (
        None,
        "search_entity_misses_gold",
    )


def test_mention_prefers_the_longest_name_the_question_writes():
    assert (
        gen_agent_data.mention("where did ronald reagan die?", ["Ronald Reagan", "Reagan"]) == "ronald reagan"
    )
    assert gen_agent_data.mention("where did reagan die?", ["Ronald Reagan", "Reagan"]) == "reagan"
    assert gen_agent_data.mention("where did the gipper die?", ["Ronald Reagan", "Reagan"]) == "Ronald Reagan"
    assert gen_agent_data.mention("who plays in paris, texas?", ["Paris", "Paris, Texas"]) == "paris, texas"
    assert gen_agent_data.mention("is parisian food good?", ["Paris"]) == "Paris"  # whole words only


# ---------------------------------------------------------------------------- the loss's tokens
def test_agent_loss_reads_exactly_the_assistant_turns(demo, model_dir):
    kg, functions, tools, system = demo
    messages, _ = gen_agent_data.conversation(PULP_FICTION, kg, functions, system)
    tokenizer = Tokenizer(model_dir)
    encoded = loss.encode({"task": "agent", "messages": messages, "tools": tools}, tokenizer)
    assert encoded["ids"] == tokenizer.encode(qwen_tool_prompt(messages, tools, add_generation_prompt=False))
    read = tokenizer.decode([encoded["ids"][t] for t in encoded["answer_at"]], skip_special_tokens=False)
    texts = [
        m["content"] + "\n" if m["content"] else "" for m in messages if m["role"] == "assistant"
    ]  # the plan
    turns = [
        text
        + "<tool_call>\n"
        + json.dumps({"name": n, "arguments": a}, ensure_ascii=False)
        + "\n</tool_call><|im_end|>"
        for text, (n, a) in zip(texts, calls(messages))
    ]
    assert read == "".join(turns)
    assert (
        loss.units(encoded, "reference") == len(encoded["answer_at"])
        and loss.units(encoded, "per-sample") == 1
    )


def test_agent_sample_loss_equals_its_tokens_cross_entropy(demo, model_dir):
    from model import Transformer

    kg, functions, tools, system = demo
    messages, _ = gen_agent_data.conversation(PULP_FICTION, kg, functions, system)
    tokenizer = Tokenizer(model_dir)
    model = Transformer.from_pretrained(model_dir)
    encoded = loss.encode({"task": "agent", "messages": messages, "tools": tools}, tokenizer)
    losses, _ = loss.sample_losses(model, loss.collate([encoded], tokenizer.pad_id, "reference"))
    with torch.no_grad():
        logits = model(torch.tensor([encoded["ids"]]))[0].double()
    expected = sum(-logits[t - 1].log_softmax(-1)[encoded["ids"][t]] for t in encoded["answer_at"])
    assert float(losses[0].detach()) == pytest.approx(float(expected), rel=1e-4)
    validation = loss.evaluate(model, [encoded], 1, tokenizer.pad_id, "cpu", nullcontext(), "reference")
    assert set(validation) == {"val_loss", "val_agent"}  # only the tasks present
    assert validation["val_agent"] == pytest.approx(float(expected) / len(encoded["answer_at"]), rel=1e-4)


# ---------------------------------------------------------------------------- the command lines
def test_gen_agent_data_command_line_writes_conversations(demo_endpoint, model_dir, tmp_path):
    records = tmp_path / "records.jsonl"
    other = dict(
        PULP_FICTION,
        id="r2",
        question="Where was Quentin Tarantino born?",
        sparql="SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . }",
    )
    records.write_text("".join(json.dumps(r) + "\n" for r in [PULP_FICTION, other]))
    config = tmp_path / "grasp.toml"
    config.write_text(
        f'[[knowledge_graphs]]\nname = "wikidata"\nendpoint = "{demo_endpoint}"\n'
        f'index = "{demo_index(demo_endpoint)}"\n'
    )
    out = tmp_path / "traces.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "tools/gen_agent_data.py",
            "--data",
            str(records),
            "--config",
            str(config),
            "--index",
            str(demo_index(demo_endpoint)),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "2 conversations of 2 records" in done.stdout
    traces = samples.read_samples(out)[0]
    assert [t["task"] for t in traces] == ["agent", "agent"]
    assert calls(traces[1]["messages"])[0] == (
        "search_entity",
        {"kg": "wikidata", "query": "Quentin Tarantino"},
    )


def test_train_py_overfits_agent_conversations(model_dir, tmp_path):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search_entity",
                "description": "find an entity",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            },
        }
    ]

    def sample(i: int, query: str) -> dict:
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "search_entity", "arguments": json.dumps({"query": query})},
        }
        return {
            "id": f"r{i}",
            "epoch": 0,
            "task": "agent",
            "tools": tools,
            "messages": [
                {"role": "system", "content": "Answer."},
                {"role": "user", "content": f"Who is {query}?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
            ],
        }

    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in [sample(0, "Paris"), sample(1, "France")]))
    train.main(
        train.make_parser().parse_args(
            [
                "--samples",
                str(path),
                "--model-dir",
                str(model_dir),
                "--runs-dir",
                str(tmp_path / "runs"),
                "--val-fraction",
                "0",
                "--lora-r",
                "4",
                "--lora-alpha",
                "8",
                "--batch-size",
                "2",
                "--micro-batch-size",
                "1",
                "--checkpoint-every",
                "100",
                "--threads",
                "1",
                "--epochs",
                "30",
                "--lr",
                "1e-2",
                "--warmup",
                "0.1",
                "--lora-dropout",
                "0",
                "--max-length",
                "4096",
            ]
        )
    )
    log = [json.loads(line) for line in (tmp_path / "runs" / "grisp" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss_agent"] for r in log if "loss_agent" in r]
    assert len(losses) == 30 and not any("loss_skeleton" in r for r in log)
    assert sum(losses[-3:]) / 3 < 0.2 * losses[0], losses  # it learns the calls
