"""infer.py and grisp/pipeline.py: the command line, clear errors on bad input, and the pipeline on a tiny model."""

import json
import shutil
import subprocess
import sys
import time
from math import inf

import pytest
import torch

import infer
import lora
from common import defaults
from grisp import peft_format
from grisp.generate import Hypothesis
from grisp.options import Options
from grisp.pipeline import Answer, Grisp, GrispError, answer_to_json
from grisp.resolve import Resolution, Resolver
from grisp.sparql import Result, SparqlClient, parse_results
from model import Transformer
from tests.tiny import make_model_dir

torch.set_num_threads(1)


def run_infer(*args):
    return subprocess.run(
        [sys.executable, str(defaults.REPO_DIR / "infer.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def demo_index(demo_endpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-index")
    subprocess.run(
        [
            sys.executable,
            str(defaults.REPO_DIR / "build_index.py"),
            "--endpoint",
            demo_endpoint,
            "--out",
            str(out),
            "--embed",
            "none",
        ],
        check=True,
        capture_output=True,
    )
    return out


def test_help_explains_every_flag():
    out = run_infer("--help")
    assert out.returncode == 0
    for flag in (
        "--no-rerank",
        "--no-constrained",
        "--no-kg-guidance",
        "--no-backtracking",
        "--no-beam-search",
        "--top-k",
        "--num-beams",
        "--num-skeletons",
        "--time-budget",
        "--json",
        "--adapter",
        "--endpoint",
    ):
        assert flag in out.stdout
    assert "(default: None)" not in " ".join(
        out.stdout.split()
    )  # a None default: the help says what unset means


def test_answer_json_holds_the_result_as_a_sparql_json_document():
    # the one shape of a result in JSON: infer.py --json and evaluate.py's predictions.jsonl both write it
    result = Result(["x"], [{"x": {"type": "uri", "value": "http://www.wikidata.org/entity/Q3772"}}])
    data = json.loads(json.dumps(answer_to_json(Answer("q?", "SELECT ...", result, [("S", -1.0)]))))
    assert data["result"] == result.to_json() and parse_results(json.dumps(data["result"])) == result
    assert data["skeletons"] == [["S", -1.0]] and data["sparql"] == "SELECT ..."
    assert answer_to_json(Answer("q?", "ASK {}", Result(boolean=False), []))["result"] == {
        "head": {},
        "boolean": False,
    }
    assert answer_to_json(Answer("q?", None, None, []))["result"] is None


def test_empty_question_is_a_clear_error():
    out = run_infer("   ")
    assert out.returncode == 2 and "question is empty" in out.stderr and "Traceback" not in out.stderr


def test_bad_settings_are_clear_errors(tiny_model):
    out = run_infer(
        "q?", "--model-dir", str(tiny_model), "--adapter", "none", "--top-k", "13", "--num-beams", "0"
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "num_beams = 0 must be >= 1" in out.stderr and "top_k = 13 must be in [1, 12]" in out.stderr
    with pytest.raises(GrispError, match="top_p = 0"):
        Options(top_p=0)
    Options(top_k=12)  # the largest that fits a re-ranking prompt


def test_bad_output_and_runtime_flags_are_clear_errors_before_the_model_loads(tmp_path):
    # no model there: these are found first (an unwritable --json failed only after the whole run)
    for flags, message in [
        (["--json", str(tmp_path / "no" / "such" / "a.json")], "does not exist or is not writable"),
        (["--json", str(tmp_path)], "is a directory"),
        (["--threads", "-1"], "--threads must be >= 0"),
    ]:
        out = run_infer("q?", "--model-dir", str(tmp_path / "no-model"), *flags)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
        out = run_infer("q?", "--skeleton-only", "--model-dir", str(tmp_path / "no-model"), *flags)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_a_bad_device_is_a_clear_error(tiny_model, tmp_path):
    (tmp_path / "manifest.json").write_text(
        "{}"
    )  # an index directory: the device is checked before it is read
    for mode in ([], ["--skeleton-only"]):
        out = run_infer(
            "q?",
            *mode,
            "--model-dir",
            str(tiny_model),
            "--adapter",
            "none",
            "--device",
            "bogus",
            "--index",
            str(tmp_path),
            "--no-kg-guidance",
        )  # no endpoint needed
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert "unknown device 'bogus': use auto, cpu, cuda" in out.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    out = run_infer("who directed pulp fiction?", "--model-dir", str(tmp_path / "nothing"))
    assert out.returncode == 2 and "get_model.py" in out.stderr and "Traceback" not in out.stderr


def test_missing_adapter_and_index_are_clear_errors(tiny_model, tmp_path):
    out = run_infer("q?", "--model-dir", str(tiny_model), "--adapter", str(tmp_path / "no-adapter"))
    assert out.returncode == 2 and "no adapter" in out.stderr and "Traceback" not in out.stderr
    out = run_infer(
        "q?", "--model-dir", str(tiny_model), "--adapter", "none", "--index", str(tmp_path / "no-index")
    )
    assert out.returncode == 2 and "build_index.py" in out.stderr and "Traceback" not in out.stderr


def test_an_adapter_that_does_not_fit_is_a_clear_error(tiny_model, tmp_path):
    good = tmp_path / "good"
    save_random_adapter(tiny_model, good)
    broken = {
        "no-weights": lambda d: (d / peft_format.WEIGHTS_NAME).unlink(),
        "not-lora": lambda d: (d / peft_format.CONFIG_NAME).write_text(
            (d / peft_format.CONFIG_NAME).read_text().replace('"LORA"', '"IA3"')
        ),
    }
    for name, breaks in broken.items():
        shutil.copytree(good, tmp_path / name)
        breaks(tmp_path / name)
        with pytest.raises(GrispError, match=f"cannot load the adapter at {tmp_path / name}"):
            Grisp.generator(tiny_model, tmp_path / name, Options())
    out = run_infer(
        "q?", "--skeleton-only", "--model-dir", str(tiny_model), "--adapter", str(tmp_path / "not-lora")
    )
    assert out.returncode == 2 and "cannot load the adapter" in out.stderr and "Traceback" not in out.stderr


def test_unreachable_endpoint_is_a_clear_error(tiny_model, demo_index):
    out = run_infer(
        "who directed pulp fiction?",
        "--model-dir",
        str(tiny_model),
        "--adapter",
        "none",
        "--index",
        str(demo_index),
        "--endpoint",
        "http://127.0.0.1:9/query",
    )
    assert out.returncode == 2 and "cannot connect to http://127.0.0.1:9/query" in out.stderr
    assert "endpoint.py start" in out.stderr and "Traceback" not in out.stderr


def test_endpoint_lost_during_resolution_ends_the_question(tiny_model, demo_index, demo_endpoint):
    # no re-ranking: a random model may rank None first, and the constraint query would never be sent
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(top_k=3, rerank=False))
    grisp.resolver.client = SparqlClient("http://127.0.0.1:9/query", retries=0)
    answer = grisp.answer_from_skeletons(
        "q",
        [
            "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }",
            "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }",
        ],
    )
    assert answer.sparql is None and answer.failure == "endpoint_error" and answer.verified is None
    assert answer.queries == 1 and answer.endpoint_faults == {"EndpointUnreachable": 1}
    assert "cannot connect to http://127.0.0.1:9/query" in answer.error
    assert [e["event"] for e in answer.trace].count("resolve") == 1, (
        "no further skeleton once the endpoint is lost"
    )
    assert answer.trace[-1]["event"] == "endpoint_lost"


def test_garbage_model_gives_no_skeleton_and_exit_1(tiny_model, demo_index, demo_endpoint, tmp_path):
    out = run_infer(
        "who directed pulp fiction?",
        "--model-dir",
        str(tiny_model),
        "--adapter",
        "none",
        "--index",
        str(demo_index),
        "--endpoint",
        demo_endpoint,
        "--num-beams",
        "2",
        "--json",
        str(tmp_path / "a.json"),
    )
    assert out.returncode == 1 and "no skeleton that parses" in out.stderr and "Traceback" not in out.stderr
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["failure"] == "no_skeleton" and saved["sparql"] is None
    assert [e["event"] for e in saved["trace"]] == ["skeleton"] * len(saved["trace"]) and saved["trace"]


def test_oracle_skeletons_move_on_to_the_next_skeleton(tiny_model, demo_index, demo_endpoint):
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(rerank=False, top_k=5))
    dead = "SELECT ?x WHERE { <iri>zzzz qqqq</iri> <iri>director (wdt)</iri> ?x . }"
    good = "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }"
    answer = grisp.answer_from_skeletons("who directed pulp fiction?", [dead, good])
    resolves = [e for e in answer.trace if e["event"] == "resolve"]
    assert [e["number"] for e in resolves] == [0, 1]
    assert answer.sparql is not None and answer.sparql.endswith("SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }")
    assert "PREFIX wd: <http://www.wikidata.org/entity/>" in answer.sparql
    assert {r["x"]["value"] for r in answer.result.rows} == {"http://www.wikidata.org/entity/Q3772"}
    assert answer.verified is True and answer.endpoint_faults == {} and answer.error is None
    assert answer.queries == answer.queries_answered > 0  # constraint and final queries, all answered


def test_dead_skeletons_get_a_second_pass_without_the_none_cut(tiny_model, demo_index, demo_endpoint):
    """The re-ranker puts the genre first and None above the film: the genre has no director, so under the
    paper's cut both skeletons dead-end; the retry resolves them once more and the film is left to try."""
    film, genre, director = (f"http://www.wikidata.org/entity/{id}" for id in ("Q104123", "Q351718", "P57"))
    skeleton = "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }"
    skeletons = [skeleton, skeleton.replace("Pulp Fiction", "Pulp Fiction film")]

    def reranker(question, marked_query, alternatives, resolved):
        return [{genre: 9.0, film: 5.0, director: 9.0}.get(a.iri, 1.0) for a in alternatives] + [
            7.0
        ]  # None: 7

    def answer(**options):
        grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(top_k=5, **options))
        grisp.resolver.reranker = reranker
        return grisp.answer_from_skeletons("who directed pulp fiction?", skeletons)

    strict = answer(retry=False)
    assert strict.sparql is None and strict.failure == "dead_end"
    assert [e["event"] for e in strict.trace].count("retry") == 0
    assert [e["number"] for e in strict.trace if e["event"] == "resolve"] == [0, 1]
    relaxed = answer()
    assert relaxed.sparql.endswith("SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }") and relaxed.failure is None
    assert relaxed.verified is True
    assert [e for e in relaxed.trace if e["event"] == "retry"] == [{"event": "retry", "skeletons": [0, 1]}]
    assert [e["number"] for e in relaxed.trace if e["event"] == "resolve"] == [
        0,
        1,
        0,
    ]  # the first resolves now
    assert [s for s, _ in relaxed.skeletons] == skeletons  # each kept once
    chosen = [e["iri"] for e in relaxed.trace if e["event"] == "choose"]
    assert chosen[-2:] == [film, director] and chosen[0] == genre
    margin = answer(none_margin=3.0)  # the film within the margin: answered in the first pass, no retry
    assert margin.sparql is not None and [e["event"] for e in margin.trace].count("retry") == 0


def test_a_low_confidence_answer_is_declined_with_its_guess_kept(tiny_model, demo_index, demo_endpoint):
    """The retry's answer took the film below None: its confidence is the film's probability there, and
    --min-confidence above it declines the answer but keeps its query as the guess (trace and JSON)."""
    film, genre, director = (f"http://www.wikidata.org/entity/{id}" for id in ("Q104123", "Q351718", "P57"))
    skeleton = "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }"

    def reranker(question, marked_query, alternatives, resolved):
        return [{genre: 9.0, film: 5.0, director: 9.0}.get(a.iri, 1.0) for a in alternatives] + [
            7.0
        ]  # None: 7

    def answer(min_confidence):
        grisp = Grisp(
            tiny_model, None, demo_index, demo_endpoint, Options(top_k=5, min_confidence=min_confidence)
        )
        grisp.resolver.reranker = reranker
        return grisp.answer_from_skeletons("who directed pulp fiction?", [skeleton])

    answered = answer(0.0)
    assert answered.sparql is not None and answered.retried and not answered.declined
    assert [c["iri"] for c in answered.choices] == [film, director]
    film_p = answered.choices[0]["p"]
    assert 0 < film_p < answered.choices[0]["p_none"]  # taken below None, in the retry
    assert (
        answered.confidence == pytest.approx(sum(c["p"] for c in answered.choices) / 2)
        and answered.confidence < 0.5
    )
    assert answered.guess == answered.sparql
    declined = answer(0.5)
    assert declined.sparql is None and declined.result is None and declined.declined
    assert declined.failure == "declined" and declined.guess == answered.sparql
    assert declined.confidence == pytest.approx(answered.confidence)
    event = [e for e in declined.trace if e["event"] == "declined"]
    assert event == [
        {
            "event": "declined",
            "confidence": round(declined.confidence, 4),
            "min_confidence": 0.5,
            "guess": answered.sparql,
        }
    ]
    saved = answer_to_json(declined)
    assert saved["guess"] == answered.sparql and saved["declined"] is True and saved["sparql"] is None
    assert infer.describe(event[0]).startswith("declined: confidence")


def save_random_adapter(tiny_model, out_dir):
    """An adapter with random (non-zero) LoRA B on the tiny model, saved to out_dir; returns some tokens
    and the adapted model's logits for them."""
    model = Transformer.from_pretrained(tiny_model)
    lora.inject_lora(model, r=4, alpha=8)
    for layer in lora.lora_layers(model).values():
        torch.nn.init.normal_(layer.lora_B, std=0.5)
    peft_format.save_adapter(model, out_dir)
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        return tokens, model(tokens)


def test_adapter_is_merged_into_the_model(tiny_model, demo_index, demo_endpoint, tmp_path):
    tokens, expected = save_random_adapter(tiny_model, tmp_path / "adapter")
    grisp = Grisp(tiny_model, tmp_path / "adapter", demo_index, demo_endpoint, Options())
    with torch.no_grad():
        assert torch.allclose(grisp.model(tokens), expected, atol=1e-4)
    with pytest.raises(GrispError, match="no adapter"):
        Grisp(tiny_model, tmp_path / "missing", demo_index, demo_endpoint, Options())


def test_an_adapter_path_with_a_tilde_is_the_home_directory(
    tiny_model, demo_index, demo_endpoint, tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path))  # `--adapter=~/...` reaches the scripts unexpanded
    tokens, expected = save_random_adapter(tiny_model, tmp_path / "adapter")
    grisp = Grisp(
        tiny_model,
        "~/adapter",
        demo_index,
        demo_endpoint,
        Options(precision="float32"),
        rerank_adapter_dir="~/adapter",
    )
    with torch.no_grad():
        assert torch.allclose(grisp.model(tokens), expected, atol=1e-4)
        assert torch.allclose(grisp.resolver.reranker.model(tokens), expected, atol=1e-4)
    assert Grisp.generator(tiny_model, "~/adapter", Options(precision="float32")).prompt_format


def test_a_rerank_adapter_gives_the_reranker_its_own_model(tiny_model, demo_index, demo_endpoint, tmp_path):
    tokens, expected = save_random_adapter(tiny_model, tmp_path / "rerank-adapter")
    grisp = Grisp(
        tiny_model,
        None,
        demo_index,
        demo_endpoint,
        Options(precision="float32"),
        rerank_adapter_dir=tmp_path / "rerank-adapter",
    )
    reranker_model = grisp.resolver.reranker.model
    assert reranker_model is not grisp.model
    with torch.no_grad():
        assert torch.allclose(reranker_model(tokens), expected, atol=1e-4)  # the adapter's
        assert not torch.allclose(grisp.model(tokens), expected, atol=1e-2)  # the skeletons: the base model's
    plain = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(precision="float32"))
    assert plain.resolver.reranker.model is plain.model
    with pytest.raises(GrispError, match="no adapter"):
        Grisp(tiny_model, None, demo_index, demo_endpoint, Options(), rerank_adapter_dir=tmp_path / "missing")


@pytest.mark.slow  # the real 0.5B model with the shipped adapter: ~30 s
def test_shipped_adapter_answers_the_readme_question(demo_endpoint, demo_search_index):
    if not (defaults.MODEL_DIR / "config.json").exists():
        pytest.skip("needs the base model (python get_model.py)")
    out = run_infer(
        "Where was the Pulp Fiction director born?",
        "--endpoint",
        demo_endpoint,
        "--index",
        str(demo_search_index),
        "--threads",
        "2",
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    assert "SELECT ?answer WHERE { wd:Q104123 wdt:P57 ?X . ?X wdt:P19 ?answer }" in out.stdout
    assert "Knoxville (wd:Q185582)" in out.stdout


def test_each_adapters_prompt_format_reaches_its_reranker(tiny_model, demo_index, demo_endpoint, tmp_path):
    for fmt in ("v1", "v2"):
        save_random_adapter(tiny_model, tmp_path / fmt)
        (tmp_path / fmt / peft_format.GRISP_CONFIG_NAME).write_text(json.dumps({"prompt_format": fmt}))
    grisp = Grisp(tiny_model, tmp_path / "v1", demo_index, demo_endpoint, Options(precision="float32"))
    assert grisp.prompt_format == grisp.resolver.reranker.prompt_format == "v1"
    grisp = Grisp(
        tiny_model,
        tmp_path / "v1",
        demo_index,
        demo_endpoint,
        Options(precision="float32"),
        rerank_adapter_dir=tmp_path / "v2",
    )
    assert (grisp.prompt_format, grisp.resolver.reranker.prompt_format) == ("v1", "v2")


def test_each_skeleton_gets_its_own_time_budget(tiny_model, demo_index, demo_endpoint):
    """As in the reference: a skeleton that runs out of time fails, and the next one starts with a fresh
    budget (the old rule, one budget per question, stopped at the first timeout)."""
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(rerank=False, time_budget=2.0))
    seen = []

    def resolve(question, skeleton, deadline, listener=None):
        seen.append((skeleton, deadline - time.monotonic()))
        if skeleton == "slow":
            time.sleep(0.5)
            return Resolution(None, None, 0, "timeout")
        return Resolution("SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }", None, 0, verified=None)

    grisp.resolver.resolve = resolve
    answer = grisp.answer_from_skeletons("q", ["slow", "fast"])
    assert [s for s, _ in seen] == ["slow", "fast"] and answer.sparql is not None and answer.failure is None
    assert all(1.8 < left <= 2.0 for _, left in seen), seen  # the second budget is fresh, not 2 s - 0.5 s
    seen.clear()
    answer = grisp.answer_from_skeletons(
        "q", ["slow", "slow"], deadline=time.monotonic() + 1.0
    )  # an overall cap
    assert len(seen) == 2 and all(left <= 1.0 for _, left in seen) and answer.failure == "timeout"


def test_the_retry_shares_one_time_budget(tiny_model, demo_index, demo_endpoint, monkeypatch):
    """Each skeleton of the first pass has a budget of its own; the second pass (no None cut, which can
    search far longer) gets one budget for all its skeletons."""
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(time_budget=2.0))
    seen = []

    def resolve(self, question, skeleton, deadline, listener=None):
        seen.append((self.options.none_margin, skeleton, deadline - time.monotonic()))
        time.sleep(0.3)
        return Resolution(None, None, 0, "dead_end")

    monkeypatch.setattr(Resolver, "resolve", resolve)
    answer = grisp.answer_from_skeletons("q", ["a", "b"])
    assert [(margin, skeleton) for margin, skeleton, _ in seen] == [
        (0.0, "a"),
        (0.0, "b"),
        (inf, "a"),
        (inf, "b"),
    ]
    first, second, retry_a, retry_b = (left for _, _, left in seen)
    assert 1.8 < first <= 2.0 and 1.8 < second <= 2.0 and 1.8 < retry_a <= 2.0  # fresh budgets
    assert retry_b < retry_a - 0.25, "the second pass's skeletons share one budget"
    assert answer.failure == "dead_end" and answer.sparql is None


# ---------------------------------------------------------------------------- --skeleton-only (generate-only)
def test_generator_needs_no_index_or_endpoint(tiny_model):
    generator = Grisp.generator(tiny_model, None, Options(num_beams=2, max_new_tokens=8))
    assert generator.indices is None and generator.resolver is None and generator.client is None
    kept, trace = generator.skeletons("who directed pulp fiction?")
    assert len(trace) == 2 and all(e["event"] == "skeleton" for e in trace)
    assert len(kept) <= 2
    with pytest.raises(GrispError, match="only generates skeletons"):
        generator.answer_from_skeletons("q", ["SELECT ?x WHERE { <iri>a</iri> <iri>b (wdt)</iri> ?x }"])
    with pytest.raises(GrispError, match="no base model"):
        Grisp.generator(tiny_model.parent / "nothing", None, Options())


BEAMS = [  # (skeleton, score, finished) as a beam search might settle them, best first
    ("SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x }", -1.0, True),
    ("SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x }", -1.5, True),
    ("ASK { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x }", -2.0, True),
    ("SELECT ?x WHERE { <iri>pulp fiction</iri> <iri>directed by (wdt)</iri> ?x }", -2.5, True),
    ("SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (p)</iri> ?x }", -3.0, True),
    ("SELECT ?x WHERE { <iri>Pulp Fiction (film)</iri> <iri>film director (wdt)</iri> ?x }", -3.5, True),
    ("SELECT ?x WHERE { <iri>Pulp</iri> <iri>cast member (wdt)</iri> ?y", -4.0, True),
    (
        "SELECT ?x WHERE { <iri>Pulp<sep>Fiction</iri> <iri>director (wdt)</iri> ?x }",
        -5.0,
        True,
    ),  # merging's mark
    ("SELECT ?x WHERE { <iri>Pulp</iri>", -9.0, False),
]


@pytest.mark.parametrize("dedupe", ["exact", "merge"])
def test_skeleton_stream_keeps_distinct_skeletons_and_merges_rewordings(tiny_model, monkeypatch, dedupe):
    class Texts:  # a tokenizer whose "token ids" index BEAMS
        eos_ids = [0]
        encode = staticmethod(lambda text: [1, 2, 3])
        decode = staticmethod(lambda tokens: BEAMS[tokens[0]][0])

    def scripted_beams(model, prompt, eos_ids, **settings):
        for i, (_, score, finished) in enumerate(BEAMS):
            yield Hypothesis([i], score, finished)

    monkeypatch.setattr("grisp.pipeline.beam_search_stream", scripted_beams)
    generator = Grisp.generator(tiny_model, None, Options(num_skeletons=2, skeleton_dedupe=dedupe))
    generator.tokenizer = Texts()
    trace = []
    stream = generator.skeleton_stream("who directed pulp fiction?", trace)
    if dedupe == "exact":  # each skeleton as soon as the search settles it; the search stops at the second
        assert next(stream) == (BEAMS[0][0], -1.0) and len(trace) == 1
        assert next(stream) == (BEAMS[2][0], -2.0) and list(stream) == []
        assert [e["verdict"] for e in trace] == ["kept", "duplicate", "kept"]
        return
    # merge: all at the end, each with the wordings of the later beams of its structure (at most three)
    assert list(stream) == [
        (
            "SELECT ?x WHERE { <iri>Pulp Fiction<sep>Pulp Fiction (film)</iri> "  # "pulp fiction": not twice
            "<iri>director<sep>directed by<sep>film director (wdt)</iri> ?x }",
            -1.0,
        ),
        (BEAMS[2][0], -2.0),
    ]
    assert [e["verdict"] for e in trace] == [
        "kept",
        "duplicate",
        "kept",
        "merged",
        "surplus",
        "merged",
        "does not parse",
        "does not parse",
        "unfinished",
    ]


def test_a_skeleton_the_client_would_refuse_is_not_resolved(tiny_model, monkeypatch):
    """A SERVICE clause (the label service the base model knows, or a call to another endpoint) parses, but
    every query made from it would be refused: such a skeleton used to be searched and backtracked to its end."""
    beams = [
        "SELECT ?x ?l WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . "
        'SERVICE wikibase:label { bd:serviceParam wikibase:language "en" } }',
        "SELECT ?x WHERE { SERVICE <http://example.org/sparql> { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x } }",
        "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x }",
    ]

    class Texts:
        eos_ids = [0]
        encode = staticmethod(lambda text: [1, 2, 3])
        decode = staticmethod(lambda tokens: beams[tokens[0]])

    def scripted_beams(model, prompt, eos_ids, **settings):
        yield from (Hypothesis([i], -1.0 - i, True) for i in range(len(beams)))

    monkeypatch.setattr("grisp.pipeline.beam_search_stream", scripted_beams)
    generator = Grisp.generator(tiny_model, None, Options(num_skeletons=2))
    generator.tokenizer = Texts()
    trace = []
    assert list(generator.skeleton_stream("who directed pulp fiction?", trace)) == [(beams[2], -3.0)]
    assert [e["verdict"] for e in trace] == ["refused", "refused", "kept"]


def test_a_slow_query_does_not_end_the_question(tiny_model, demo_index, demo_endpoint):
    """A timeout is the query's, not the endpoint's: the next skeleton is still tried (it used to end the
    question as "endpoint_error" when the timed-out query was the only one sent)."""
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(rerank=False))
    tried = []

    def resolve(question, skeleton, deadline, listener=None):
        tried.append(skeleton)
        if skeleton == "slow":
            grisp.resolver.client.tally.sent += 1
            grisp.resolver.client.tally.faults["QueryTimeout"] = 1
            return Resolution(None, None, 0, "timeout")
        grisp.resolver.client.tally.sent += 1
        grisp.resolver.client.tally.answered += 1
        return Resolution("SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }", None, 0, verified=True)

    grisp.resolver.resolve = resolve
    answer = grisp.answer_from_skeletons("q", ["slow", "fast"])
    assert tried == ["slow", "fast"] and answer.sparql is not None and answer.failure is None


def test_no_retry_when_a_request_switches_re_ranking_off(tiny_model, demo_index, demo_endpoint, monkeypatch):
    """The retry lifts None's cut; without re-ranking there is no None, and a second pass would only
    repeat the first (serve.py loads with re-ranking and switches it per request)."""
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(time_budget=2.0))
    passes = []

    def resolve(self, question, skeleton, deadline, listener=None):
        passes.append(self.options.none_margin)
        return Resolution(None, None, 0, "dead_end")

    monkeypatch.setattr(Resolver, "resolve", resolve)
    grisp.use_options(Options(time_budget=2.0, rerank=False))
    answer = grisp.answer_from_skeletons("q", ["a", "b"])
    assert passes == [0.0, 0.0] and [e["event"] for e in answer.trace].count("retry") == 0
    grisp.use_options(Options(time_budget=2.0))
    grisp.answer_from_skeletons("q", ["a"])
    assert passes[2:] == [0.0, inf], "with re-ranking on, the retry runs"
    grisp.use_options(
        Options(time_budget=2.0, none_margin=inf)
    )  # the cut lifted already: a retry would repeat it
    answer = grisp.answer_from_skeletons("q", ["a"])
    assert passes[4:] == [inf] and [e["event"] for e in answer.trace].count("retry") == 0


def test_skeleton_only_runs_without_index_or_endpoint(tiny_model, tmp_path):
    out = run_infer(
        "who directed pulp fiction?",
        "--skeleton-only",
        "--model-dir",
        str(tiny_model),
        "--adapter",
        "none",
        "--index",
        str(tmp_path / "no-index"),
        "--endpoint",
        "http://127.0.0.1:9/query",
        "--num-beams",
        "2",
        "--json",
        str(tmp_path / "s.json"),
    )
    # a random model writes no skeleton that parses: a message and exit 1, never an index or endpoint error
    assert out.returncode == 1 and "no skeleton" in out.stderr and "Traceback" not in out.stderr
    assert "skeleton" in out.stdout and "timings: generate" in out.stdout  # the beams and their verdicts
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["question"] == "who directed pulp fiction?" and saved["skeletons"] == []
    assert len(saved["trace"]) == 2 and saved["timings"]["generate"] > 0
    out = run_infer("q?", "--skeleton-only", "--model-dir", str(tmp_path / "no-model"))
    assert out.returncode == 2 and "get_model.py" in out.stderr and "Traceback" not in out.stderr


def test_skeleton_only_prints_the_ranked_skeletons(tiny_model, tmp_path, monkeypatch, capsys):
    import runpy

    class FakeGenerator:
        precision, why_precision = "float32", "float32 as asked"

        def skeletons(self, question):
            kept = [
                ("SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }", -0.25),
                ("SELECT ?x WHERE { ?x <iri>director (wdt)</iri> <iri>Pulp Fiction</iri> . }", -3.5),
            ]
            return kept, [
                {"event": "skeleton", "skeleton": s, "score": score, "verdict": "kept"} for s, score in kept
            ]

    built = []
    monkeypatch.setattr(
        Grisp, "generator", classmethod(lambda cls, *args: built.append(args) or FakeGenerator())
    )
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "infer.py",
            "who directed pulp fiction?",
            "--skeleton-only",
            "--quiet",
            "--model-dir",
            str(tiny_model),
            "--adapter",
            "none",
            "--num-skeletons",
            "5",
            "--json",
            str(tmp_path / "s.json"),
        ],
    )
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(str(defaults.REPO_DIR / "infer.py"), run_name="__main__")
    assert exit.value.code == 0
    ((model_dir, adapter, options, _),) = built
    assert adapter is None and options.num_skeletons == 5
    assert capsys.readouterr().out.splitlines() == [
        "1.   -0.250  SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }",
        "2.   -3.500  SELECT ?x WHERE { ?x <iri>director (wdt)</iri> <iri>Pulp Fiction</iri> . }",
    ]
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["precision"] == "float32"
    assert saved["skeletons"][0] == [
        "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }",
        -0.25,
    ]


def test_the_trace_printout_shows_a_next_wording_with_its_candidates():
    from infer import describe

    event = {
        "event": "wording",
        "placeholder": "<iri>zzqx<sep>Pulp Fiction</iri>",
        "wording": "Pulp Fiction",
        "hits": [("http://www.wikidata.org/entity/Q104123", "Pulp Fiction", 3.0)],
        "reranked": [("http://www.wikidata.org/entity/Q104123", 2.5), (None, 0.1)],
    }
    assert describe(event) == (
        "  <iri>zzqx<sep>Pulp Fiction</iri>: used up; next wording 'Pulp Fiction'\n"
        "    re-ranked: wd:Q104123 'Pulp Fiction' 2.5; None '' 0.1"
    )


def test_precision_auto_loads_bfloat16_where_the_cpu_has_it_and_says_why(
    tiny_model, demo_index, demo_endpoint, mock_native_bf16
):
    mock_native_bf16(True)
    grisp = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(top_k=3, precision="auto"))
    assert grisp.precision == "bfloat16" and "native bf16" in grisp.why_precision
    assert grisp.model.model.norm.weight.dtype == torch.bfloat16
    grisp.check_options(Options(precision="bfloat16"))  # what auto chose, asked by name or as auto
    grisp.check_options(Options(precision="auto"))
    with pytest.raises(GrispError, match="loaded in bfloat16"):
        grisp.check_options(Options(precision="float32"))
    # stage 1 (a bf16 KV cache) runs through; stage 2 re-ranks the same candidates as float32, scores close
    skeletons, trace = grisp.skeletons("who directed pulp fiction?")
    assert trace and all(isinstance(score, float) for _, score in skeletons)
    in_float32 = Grisp(tiny_model, None, demo_index, demo_endpoint, Options(top_k=3, precision="float32"))
    assert in_float32.model.model.norm.weight.dtype == torch.float32
    skeleton = "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }"
    answers = [g.answer_from_skeletons("who directed pulp fiction?", [skeleton]) for g in (grisp, in_float32)]
    assert answers[0].failure == answers[1].failure and answers[0].sparql == answers[1].sparql
    reranked = [[dict(e["reranked"]) for e in a.trace if "reranked" in e] for a in answers]
    assert len(reranked[0]) == len(reranked[1]) > 0
    for got, expected in zip(*reranked):
        assert got.keys() == expected.keys()
        assert all(abs(got[c] - expected[c]) < 0.25 for c in got)  # bf16 rounding (tests/test_cpu_speed.py)
    mock_native_bf16(False)  # auto on this CPU: float32
    assert Grisp.generator(tiny_model, None, Options(precision="auto")).precision == "float32"
