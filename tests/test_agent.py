"""agent.py: the GRASP loop with a scripted backend over the demo KG (know_before_use, feedback, follow-ups,
several KGs, the general-QA task, step and time limits, malformed calls, backend errors), config.py,
the command line's clear errors, and evaluate.py --system agent with the same scoring."""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import evaluate
from agent import Agent, build_agent
from common import defaults
from grasp import evaluation
from grasp.backends import BackendError, BackendTimeout, Reply, ToolCall
from grasp.config import AgentConfig, ConfigError, load_config
from grasp.evaluation import EvalPipeline
from tests.agent_helpers import Scripted, bag_of_words, call, demo_index, demo_kg, reply

QUERY = "SELECT ?d WHERE { wd:Q104123 wdt:P57 ?d }"


@pytest.fixture(scope="module")
def kg(demo_endpoint):
    return demo_kg(demo_endpoint)


def agent_with(kg, replies, **options):
    backend = Scripted(replies)
    return Agent({kg.name: kg}, backend, AgentConfig(**options)), backend


def test_the_loop_searches_executes_and_answers(kg):
    agent, backend = agent_with(
        kg,
        [
            reply(call("search_entity", kg="wikidata", query="pulp fiction"), content="First the film."),
            reply(call("search_property_of_entity", kg="wikidata", entity="wd:Q104123", query="director")),
            reply(call("execute", kg="wikidata", sparql=QUERY)),
            reply(call("answer", kg="wikidata", sparql=QUERY, answer="Quentin Tarantino")),
        ],
    )
    events = []
    r = agent.run("Who directed Pulp Fiction?", on_event=events.append)
    assert (r.status, r.sparql, r.kg, r.answer, r.steps) == (
        "answer",
        QUERY,
        "wikidata",
        "Quentin Tarantino",
        4,
    )
    assert r.calls == {"search_entity": 1, "search_property_of_entity": 1, "execute": 1, "answer": 1}
    assert events == r.trace and [e["event"] for e in events][:3] == ["question", "model", "call"]
    assert "Quentin Tarantino (wd:Q3772)" in events[6]["result"]  # the execute result
    first = backend.asked[0]
    assert (
        first["messages"][0]["role"] == "system"
        and "wikidata: the demo subset" in first["messages"][0]["content"]
    )
    assert first["tools"] == [
        "execute",
        "list",
        "search_entity",
        "search_property",
        "search_property_of_entity",
        "search_object_of_property",
        "answer",
        "cancel",
    ]
    # every call got its result back under its id, in OpenAI's format
    last = backend.asked[-1]["messages"]
    assert last[-1]["role"] == "tool" and last[-2]["tool_calls"][0]["function"]["name"] == "execute"
    assert last[-1]["tool_call_id"] == last[-2]["tool_calls"][0]["id"]


def test_forced_examples_open_the_conversation_and_their_iris_become_known(kg, tmp_path):
    from grasp.examples import ExampleIndex
    from grasp.functions import KnowledgeGraph

    ExampleIndex.build(
        [{"question": "where was tarantino born?", "sparql": "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x }"}],
        tmp_path / "ex",
        bag_of_words,
    )
    kg_ex = KnowledgeGraph(
        kg.name, kg.client, kg.indices, examples=ExampleIndex(tmp_path / "ex", bag_of_words)
    )
    born = "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x }"
    backend = Scripted([reply(call("answer", kg="wikidata", sparql=born, answer="Knoxville"))])
    agent = Agent({kg.name: kg_ex}, backend, AgentConfig(force_examples="wikidata", num_examples=1))
    r = agent.run("Where was Quentin Tarantino born?")
    assert (r.status, r.sparql, r.calls) == ("answer", born, {"find_similar_examples": 1, "answer": 1})
    call_message, result = backend.asked[0]["messages"][-2:]  # before the model's first turn
    assert call_message["tool_calls"] == [
        {
            "id": "call_examples",
            "type": "function",
            "function": {
                "name": "find_similar_examples",
                "arguments": '{"kg": "wikidata", "question": "Where was Quentin Tarantino born?"}',
            },
        }
    ]
    assert result["tool_call_id"] == "call_examples" and "wd:Q3772 wdt:P19" in result["content"]


def test_know_before_use_blocks_an_unseen_iri_in_execute_and_answer(kg):
    hallucinated = "SELECT ?d WHERE { wd:Q104123 wdt:P57000 ?d }"
    agent, backend = agent_with(
        kg,
        [
            reply(call("search_entity", kg="wikidata", query="pulp fiction")),
            reply(call("execute", kg="wikidata", sparql=hallucinated)),
            reply(call("answer", kg="wikidata", sparql=hallucinated, answer="?")),
            reply(call("cancel", explanation="no property found")),
        ],
    )
    r = agent.run("Who directed Pulp Fiction?")
    results = [e["result"] for e in r.trace if e["event"] == "call"]
    assert results[1].startswith(
        "Error: The query uses IRIs that no earlier function result showed: wdt:P57000"
    )
    assert results[2].startswith("Error: The query uses IRIs")  # the answer was refused: the run went on
    assert (r.status, r.explanation, r.sparql) == ("cancel", "no property found", None)
    off, _ = agent_with(
        kg,
        [
            reply(call("execute", kg="wikidata", sparql=QUERY)),
            reply(call("answer", kg="wikidata", sparql=QUERY, answer="QT")),
        ],
        know_before_use=False,
    )
    r = off.run("Who directed Pulp Fiction?")
    assert r.status == "answer" and "Quentin Tarantino" in r.trace[2]["result"]


def test_feedback_sends_the_agent_back_until_done(kg):
    wrong = "SELECT ?d WHERE { wd:Q104123 wdt:P161 ?d }"
    judge_verdicts = iter(["retry", "done"])
    script = [
        reply(call("list", kg="wikidata", subject="wd:Q104123")),
        reply(call("answer", kg="wikidata", sparql=wrong, answer="the cast")),
        "judge",
        reply(call("answer", kg="wikidata", sparql=QUERY, answer="Quentin Tarantino")),
        "judge",
    ]

    class Backend(Scripted):
        def chat(self, messages, tools, deadline=None, tool_choice=None):
            step = script.pop(0)
            names = [t["function"]["name"] for t in tools]
            self.asked.append({"messages": messages, "tools": names, "tool_choice": tool_choice})
            if step == "judge":
                assert [t["function"]["name"] for t in tools] == [
                    "give_feedback"
                ] and tool_choice == "required"
                return reply(
                    call("give_feedback", status=next(judge_verdicts), feedback="use the director property")
                )
            return step

    backend = Backend([None])
    agent = Agent({kg.name: kg}, backend, AgentConfig(feedback=True, max_feedbacks=2))
    r = agent.run("Who directed Pulp Fiction?")
    assert (r.status, r.sparql, r.feedbacks) == ("answer", QUERY, 1)
    judged = backend.asked[2]["messages"][1]["content"]
    assert (
        "Question: Who directed Pulp Fiction?" in judged and "wdt:P161" in judged and "Its result:" in judged
    )
    assert any(
        m["role"] == "user" and m["content"].startswith("Feedback on your output (retry):\nuse the director")
        for m in backend.asked[3]["messages"]
    )
    assert [e["status"] for e in r.trace if e["event"] == "feedback"] == ["retry", "done"]


def test_follow_up_carries_the_past_turns_and_known_iris(kg):
    agent, backend = agent_with(
        kg,
        [
            reply(call("search_entity", kg="wikidata", query="pulp fiction")),
            reply(call("search_property", kg="wikidata", query="director")),
            reply(call("answer", kg="wikidata", sparql=QUERY, answer="Quentin Tarantino")),
        ],
    )
    first = agent.run("Who directed Pulp Fiction?")
    past = json.loads(json.dumps(first.past()))  # as a web client would send it back
    backend.replies = [
        reply(call("execute", kg="wikidata", sparql=QUERY + " LIMIT 1")),
        reply(call("answer", kg="wikidata", sparql=QUERY, answer="QT")),
    ]
    second = agent.run("And who directed it, once more?", past=past)
    asked = backend.asked[-2]["messages"]
    assert asked[0]["role"] == "system" and sum(m["role"] == "system" for m in asked) == 1
    assert asked[1] == {"role": "user", "content": "Who directed Pulp Fiction?"}
    assert asked[-1]["content"] == "And who directed it, once more?"
    assert len(asked) == len(first.messages) + 1
    # the IRIs known from the first question let the follow-up execute at once (know_before_use is on)
    assert "Quentin Tarantino" in second.trace[2]["result"] and second.status == "answer"


def test_several_knowledge_graphs_in_one_question(kg, demo_endpoint):
    other = demo_kg(demo_endpoint, name="films", with_index=False)
    backend = Scripted(
        [
            reply(call("execute", kg="films", sparql="ASK { ?s ?p ?o }")),
            reply(call("answer", kg="films", sparql="ASK { ?s ?p ?o }", answer="yes")),
        ]
    )
    agent = Agent({kg.name: kg, "films": other}, backend, AgentConfig())
    r = agent.run("Is there anything?")
    assert r.kg == "films" and r.trace[2]["result"] == "ASK result: yes"
    system = backend.asked[0]["messages"][0]["content"]
    assert "- wikidata:" in system and "- films:" in system
    only = agent.run("Is there anything?", kgs=["films"])
    assert "- wikidata:" not in backend.asked[-1]["messages"][0]["content"] and only.status == "answer"
    with pytest.raises(ValueError, match="configured: wikidata, films"):
        agent.run("q?", kgs=["dblp"])


def test_general_qa_answers_with_text(kg):
    agent, backend = agent_with(
        kg,
        [
            reply(call("search_entity", kg="wikidata", query="tarantino")),
            reply(call("answer", answer="Quentin Tarantino, an American filmmaker.")),
        ],
        task="general-qa",
    )
    r = agent.run("Tell me about Tarantino.")
    assert (r.status, r.answer, r.sparql) == ("answer", "Quentin Tarantino, an American filmmaker.", None)
    answer_tool = [t for t in backend.asked[0]["tools"]]
    assert answer_tool[-2:] == ["answer", "cancel"]
    assert "answer the user's question" in backend.asked[0]["messages"][0]["content"]


def test_step_limit_holds_for_a_model_that_never_answers(kg):
    queries = [f"SELECT ?s WHERE {{ ?s ?p ?o }} LIMIT {n}" for n in range(1, 6)]
    agent, _ = agent_with(kg, [reply(call("execute", kg="wikidata", sparql=q)) for q in queries], max_steps=3)
    r = agent.run("q?")
    assert (r.status, r.steps, r.failure) == ("step_limit", 3, "timeout")
    assert r.sparql == queries[2]  # GRASP's fallback: the last executed query
    assert r.trace[-2] == {
        "event": "limit",
        "kind": "step_limit",
        "steps": 3,
        "seconds": r.trace[-2]["seconds"],
    }


def test_a_repeated_turn_is_not_run_again_and_a_second_repeat_stops_the_run(kg):
    same = reply(call("execute", kg="wikidata", sparql="ASK { ?s ?p ?o }"))
    agent, backend = agent_with(kg, [same], max_loops=1)
    r = agent.run("q?")
    # turn 2 repeats turn 1: not run, the model is told; turn 3 repeats it again: the run stops
    assert (r.status, r.steps, r.calls["execute"], r.failure) == ("loop", 3, 1, "dead_end")
    told = backend.asked[2]["messages"]
    assert told[-2]["content"] == "Not run: the same call as in step 1; its result is above."
    assert "repeated an earlier call" in told[-1]["content"]
    assert [(e["loops"], e["repeats"]) for e in r.trace if e["event"] == "loop"] == [
        (1, "step 1"),
        (2, "step 1"),
    ]
    assert r.messages[-1] == {
        "role": "tool",
        "tool_call_id": same.tool_calls[0].id,
        "content": "Not run: the same call as in step 1; its result is above.",
    }  # `past` stays a valid chat


def test_a_cycle_of_calls_is_a_loop_and_a_turn_with_a_new_call_is_not(kg):
    first = reply(call("search_property", kg="wikidata", query="instance of"))
    second = reply(call("search_property", kg="wikidata", query="genre"))
    both = Reply(
        "",
        [
            call("search_property", kg="wikidata", query="genre"),
            call("search_property", kg="wikidata", query="director"),
        ],
    )
    # the cycle first, second, first, second: the third and fourth turns only repeat, so the run stops there
    agent, _ = agent_with(kg, [first, second, both, first, second], max_loops=1)
    r = agent.run("q?")
    assert (r.status, r.steps, r.calls["search_property"]) == ("loop", 5, 3)
    results = [m["content"] for m in r.messages if m["role"] == "tool"]
    assert results[2] == "Not run: the same call as in step 2; its result is above."  # genre again, in turn 3
    assert "director (wdt:P57)" in results[3]  # turn 3's new call ran: no loop
    assert [e["step"] for e in r.trace if e["event"] == "loop"] == [4, 5]
    # the same arguments in another key order are the same call
    again = reply(call("search_property", query="genre", kg="wikidata"))
    agent, _ = agent_with(kg, [second, again, again], max_loops=0)
    assert agent.run("q?").steps == 2


def test_a_call_refused_by_know_before_use_may_be_made_again_once_its_iris_are_seen(kg):
    execute = call("execute", kg="wikidata", sparql=QUERY)
    agent, _ = agent_with(
        kg,
        [
            reply(execute),
            reply(call("list", kg="wikidata", subject="wd:Q104123")),
            reply(call("search_property", kg="wikidata", query="director")),
            reply(ToolCall.made("again", "execute", execute.arguments)),
            reply(call("answer", kg="wikidata", sparql=QUERY, answer="QT")),
        ],
        max_loops=0,
    )
    r = agent.run("Who directed Pulp Fiction?")
    results = [e["result"] for e in r.trace if e["event"] == "call"]
    assert results[0].startswith("Error: The query uses IRIs") and "Quentin Tarantino" in results[3]
    assert r.status == "answer" and not [e for e in r.trace if e["event"] == "loop"]
    # ... but repeating it with nothing new seen is a loop, as any repeat
    agent, _ = agent_with(kg, [reply(execute)], max_loops=1, max_steps=10)
    r = agent.run("Who directed Pulp Fiction?")
    assert (r.status, r.steps, r.calls["execute"]) == ("loop", 3, 1)


def test_the_loop_warning_is_neither_the_question_nor_a_new_start(kg):
    """The output falls back to the last executed query before the warning; the judge gets the question."""
    ask = reply(call("execute", kg="wikidata", sparql="ASK { ?s ?p ?o }"))
    agent, _ = agent_with(kg, [ask, ask, Reply("I do not know.", [])], max_loops=1)
    r = agent.run("Is there anything?")
    assert (r.status, r.sparql) == ("no_answer", "ASK { ?s ?p ?o }")
    script = [ask, ask, reply(call("answer", kg="wikidata", sparql="ASK { ?s ?p ?o }", answer="yes"))]

    class Judged(Scripted):
        def chat(self, messages, tools, deadline=None, tool_choice=None):
            self.asked.append({"messages": messages, "tools": [t["function"]["name"] for t in tools]})
            if tools[0]["function"]["name"] == "give_feedback":
                return reply(call("give_feedback", status="done", feedback="fine"))
            return script.pop(0)

    backend = Judged([None])
    Agent({kg.name: kg}, backend, AgentConfig(feedback=True, max_loops=1)).run("Is there anything?")
    judged = backend.asked[-1]["messages"][1]["content"]
    assert "Question: Is there anything?" in judged and "repeated an earlier call" not in judged


def test_a_call_whose_arguments_are_not_an_object_ends_cleanly(kg):
    odd = ToolCall("c1", "execute", {}, "null", "the arguments must be a JSON object")
    agent, _ = agent_with(kg, [Reply("", [odd]), Reply("No idea.", [])])
    r = agent.run("q?")
    assert (r.status, r.sparql, r.calls["malformed"]) == ("no_answer", None, 1)


def test_a_new_call_runs_even_when_it_shares_its_id_with_a_repeated_one(kg):
    genre = call("search_property", kg="wikidata", query="genre")
    director = ToolCall.made(
        genre.id, "search_property", {"kg": "wikidata", "query": "director"}
    )  # a reused id
    agent, _ = agent_with(
        kg, [reply(genre), Reply("", [genre, director], seconds=0.01), reply(call("cancel", explanation="x"))]
    )
    r = agent.run("q?")
    assert r.calls["search_property"] == 2  # genre once, then director: the repeat did not stop its neighbour
    results = [m["content"] for m in r.messages if m["role"] == "tool"]
    assert (
        results[1] == "Not run: the same call as in step 1; its result is above."
        and "director (wdt:P57)" in results[2]
    )


def test_time_limit_holds_and_the_deadline_reaches_the_backend(kg):
    def slow(messages):
        time.sleep(0.3)
        return reply(call("list", kg="wikidata", subject="wd:Q104123"))

    agent, backend = agent_with(kg, [slow], time_limit_s=0.5)
    start = time.monotonic()
    r = agent.run("q?")
    assert r.status == "time_limit" and time.monotonic() - start < 1.5 and r.steps == 2

    class TimingOut:
        def chat(self, *args, **kwargs):
            raise BackendTimeout("no answer within 0.2 s")

    r = Agent({kg.name: kg}, TimingOut(), AgentConfig()).run("q?")
    assert (r.status, r.error) == ("time_limit", "no answer within 0.2 s")


def test_malformed_calls_are_reported_back_and_a_down_backend_is_an_error(kg):
    bad = ToolCall(
        "c1", "exeute", {}, '{"kg": "wikidata"}', "there is no function 'exeute'; the functions are ..."
    )
    agent, backend = agent_with(kg, [Reply("", [bad]), reply(call("cancel", explanation="gave up"))])
    r = agent.run("q?")
    assert [e["event"] for e in r.trace].count("malformed_call") == 1 and r.calls["malformed"] == 1
    answer = backend.asked[1]["messages"][-1]
    assert (
        answer["role"] == "tool"
        and answer["tool_call_id"] == "c1"
        and "no function 'exeute'" in answer["content"]
    )
    assert r.status == "cancel"

    class Down:
        name = "down"

        def chat(self, *args, **kwargs):
            raise BackendError("cannot reach the model server http://127.0.0.1:9/v1/chat/completions")

    r = Agent({kg.name: kg}, Down(), AgentConfig()).run("q?")
    assert (r.status, r.failure) == ("error", "error") and "cannot reach" in r.error
    assert r.trace[-2]["event"] == "backend_error"


def test_a_reply_without_calls_ends_with_its_sparql_block_and_cancel_stops_between_steps(kg):
    agent, _ = agent_with(kg, [Reply("The query is:\n```sparql\nSELECT ?x WHERE { ?x ?p ?o }\n```", [])])
    r = agent.run("q?")
    assert (r.status, r.sparql) == ("no_answer", "SELECT ?x WHERE { ?x ?p ?o }")
    stop = threading.Event()
    stop.set()
    r = agent_with(kg, [reply(call("cancel", explanation="x"))])[0].run("q?", cancel=stop)
    assert r.status == "cancelled" and r.steps == 0


def test_config_file_environment_and_errors(tmp_path):
    path = tmp_path / "grasp.toml"
    path.write_text(
        '[[knowledge_graphs]]\nname = "dblp"\nendpoint = "https://sparql.dblp.org/sparql"\nindex = "idx"\n'
        '[model]\nbackend = "openai"\nmodel = "qwen"\n[agent]\nmax_steps = 5\nfeedback = true\n'
    )
    config = load_config(path, env={"GRASP_AGENT_MAX_STEPS": "7", "GRASP_KG_DBLP_DESCRIPTION": "papers"})
    kg = config.knowledge_graphs[0]
    assert (kg.name, kg.index, kg.description) == ("dblp", str(tmp_path / "idx"), "papers")
    assert (config.model.backend, config.agent.max_steps, config.agent.feedback) == ("openai", 7, True)
    assert load_config(None, env={}).knowledge_graphs[0].endpoint == defaults.ENDPOINT_URL
    json_path = tmp_path / "grasp.json"
    json_path.write_text(json.dumps({"agent": {"know_before_use": False}}))
    assert load_config(json_path, env={}).agent.know_before_use is False
    for text, message in [
        ("[agent]\nmax_step = 3\n", "unknown setting.*max_step"),
        ("[agent]\nmax_steps = 0\n", "max_steps = 0 must be >= 1"),
        ("[model]\nbackend = 'openai'\n", "model.model .* must be set"),
        ("[agent]\nmax_steps = 'many'\n", "agent.max_steps must be int"),
        ("[agents]\n", "unknown section"),
        ("[agent\n", "not valid TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(path, env={})
    with pytest.raises(ConfigError, match="GRASP_AGENT_STEPS names no setting"):
        load_config(None, env={"GRASP_AGENT_STEPS": "3"})
    assert load_config(defaults.REPO_DIR / "grasp.toml", env={}).agent.know_before_use is True


def run_agent(*args, **env):
    return subprocess.run(
        [sys.executable, str(defaults.REPO_DIR / "agent.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_command_line_help_and_clear_errors(tmp_path):
    out = run_agent("--help", COLUMNS="1000")
    assert out.returncode == 0 and "--follow-up" in out.stdout and "--feedback" in out.stdout
    for text in (
        "(config [model] backend, default local)",
        "(config [agent] task, default sparql-qa)",
        "(config [agent] max_steps, default 30)",
        "(config [agent] time_limit_s, default 300.0)",
        f"(config [model] model_dir, default {defaults.MODEL_DIR})",
    ):  # the config's, not "default: None"
        assert text in out.stdout, text
    assert "(default: None)" not in out.stdout  # a None default: the help says what unset means
    out = run_agent("q?", "--kg", "nosuch", GRASP_KG_WIKIDATA_ENDPOINT="http://127.0.0.1:9/query")
    assert (
        out.returncode == 1 and "no knowledge graph 'nosuch'; configured: wikidata" in out.stderr
    )  # before all else
    out = run_agent("   ")
    assert out.returncode == 1 and "no question" in out.stderr and "Traceback" not in out.stderr
    out = run_agent("q?", GRASP_KG_WIKIDATA_ENDPOINT="http://127.0.0.1:9/query")
    assert out.returncode == 1 and "does not answer" in out.stderr and "endpoint.py start" in out.stderr
    out = run_agent("q?", "--config", str(tmp_path / "none.toml"))
    assert out.returncode == 1 and "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_evaluate_runs_the_agent_with_the_same_scoring(kg, demo_endpoint, tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text(
        json.dumps({"id": "q1", "question": "Who directed Pulp Fiction?", "sparql": QUERY})
        + "\n"
        + json.dumps(
            {"id": "q2", "question": "Who acted?", "sparql": "SELECT ?a WHERE { wd:Q104123 wdt:P161 ?a }"}
        )
        + "\n"
    )
    script = [
        reply(call("search_entity", kg="wikidata", query="pulp fiction")),
        reply(call("search_property", kg="wikidata", query="director")),
        reply(call("answer", kg="wikidata", sparql=QUERY, answer="QT")),
        reply(call("cancel", explanation="no idea")),
    ]
    pipeline = EvalPipeline(Agent({kg.name: kg}, Scripted(script), AgentConfig()))
    args = argparse.Namespace(
        benchmark=str(bench),
        out=str(tmp_path / "run"),
        limit=None,
        score_only=None,
        endpoint=demo_endpoint,
        index=demo_index(demo_endpoint),
        query_timeout=10.0,
        model_dir=defaults.MODEL_DIR,
        adapter="none",
        device="cpu",
        ablation="none",
        oracle_skeleton=False,
        num_beams=None,
        num_skeletons=None,
        top_k=None,
        time_budget=None,
        seed=None,
        beam_ranking=None,
        skeletons_from=None,
        skeleton_only=False,
        system="agent",
        agent_config=None,
    )
    summary = evaluate.main(args, pipeline=pipeline)
    assert (summary["f1"], summary["scored"]) == (0.5, 2)
    assert summary["agent"]["steps_mean"] == 2.0 and summary["agent"]["statuses"] == {
        "answer": 1,
        "cancel": 1,
    }
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert records[0]["steps"] == 3 and records[0]["calls"]["answer"] == 1 and records[0]["em"] is True
    assert records[1]["failure"] == "dead_end" and records[1]["agent_status"] == "cancel"
    assert (
        json.loads((tmp_path / "run" / "config.json").read_text())["agent"]["options"]["know_before_use"]
        is True
    )
    with pytest.raises(ValueError, match="not with --system agent"):
        evaluate.main(argparse.Namespace(**{**vars(args), "oracle_skeleton": True}))


def test_eval_setup_evaluates_the_given_endpoint_and_names_a_missing_model(
    demo_endpoint, tmp_path, monkeypatch
):
    monkeypatch.setenv("GRASP_MODEL_MODEL_DIR", str(tmp_path / "no-model"))
    settings, make = evaluation.eval_setup(None, demo_endpoint, demo_index(demo_endpoint), build_agent)
    assert settings["kg"] == "wikidata" and settings["model"]["model_dir"] == str(tmp_path / "no-model")
    with pytest.raises(ValueError, match="no model at .*get_model.py"):
        make()


@pytest.mark.slow  # the real 0.5B model with the shipped agent adapter: ~1 minute on 2 threads
def test_the_agent_adapter_answers_who_directed_pulp_fiction(demo_endpoint, demo_search_index):
    """Zero-shot the 0.5B model repeated calls; with its adapter it says its plan, searches the
    question's entity and property and answers with the query whose result is the director."""
    if not (defaults.MODEL_DIR / "config.json").exists():
        pytest.skip("needs the base model (python get_model.py)")
    out = subprocess.run(
        [sys.executable, str(defaults.REPO_DIR / "agent.py"), "Who directed Pulp Fiction?"],
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "GRASP_KG_WIKIDATA_ENDPOINT": demo_endpoint,
            "GRASP_KG_WIKIDATA_INDEX": str(demo_search_index),
        },
    )
    assert "Traceback" not in out.stderr and "+grasp-agent-0.5b]" in out.stdout  # the default adapter ran
    calls = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("-> ")]
    assert calls[0].lower().startswith('-> search_entity({"kg": "wikidata", "query": "pulp fiction')
    assert calls[1].lower().startswith('-> search_property({"kg": "wikidata", "query": "director')
    assert "Pulp Fiction (wd:Q104123)" in out.stdout and "director (wdt:P57)" in out.stdout
    assert "status: answer" in out.stdout and "| Quentin Tarantino (wd:Q3772) |" in out.stdout
