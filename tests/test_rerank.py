"""The model re-ranker (rerank.ModelReranker) on a tiny random model: the prefix-cached forward equals a
full forward, identifiers are single tokens, the scores order the alternatives, None comes last."""

import pytest
import torch

from grisp import loss
from grisp.options import Options
from grisp.prompts import IDENTIFIERS, NONE_TEXT, RERANK_SYSTEM, Alternative, rerank_messages
from grisp.rerank import ModelReranker, identifier_logits
from grisp.resolve import Frame, Resolver
from grisp.skeleton import find_placeholders
from grisp.tracing import Trace
from llm.cpu_speed import prepare_for_inference
from llm.tokenizer import Tokenizer, chat_prompt
from model import Transformer
from search import Hit
from tests.tiny import make_model_dir

torch.set_num_threads(1)
WD = "http://www.wikidata.org/entity/"
QUERY = "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer(model_dir)


@pytest.fixture
def model(model_dir):  # fresh per test: one test rigs the lm_head
    return prepare_for_inference(Transformer.from_pretrained(model_dir))


def alternatives(n, start=0):
    return [
        Alternative(f"{WD}Q{i}", f"wd:Q{i}", f"item {i}", [f"alias {i}"], f"thing number {i}")
        for i in range(start, start + n)
    ]


def full_scores(model, tokenizer, question, query, alts, resolved=(), prompt_format="v2"):
    """The reference: one forward over the whole prompt, the logits of the identifier tokens."""
    messages, identifiers = rerank_messages(question, query, alts, True, resolved, prompt_format)
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer.encode(chat_prompt(messages))]), logits_at=-1)[0]
    return [float(logits[tokenizer.encode(i)[0]]) for i in identifiers]


# a resolution's calls (question, query, alternatives, items resolved so far): two placeholders, a
# backtrack (same query, fewer alternatives), another question, a prompt that is a strict extension of
# the previous one, and the first prompt again
FILM = alternatives(1)[0]
CALLS = [
    (
        "who directed pulp fiction?",
        QUERY.replace("<iri>Pulp Fiction</iri>", "<rep>Pulp Fiction</rep>"),
        alternatives(5),
        [],
    ),
    (
        "who directed pulp fiction?",
        "SELECT ?x WHERE { wd:Q1 <rep>director (wdt)</rep> ?x . }",
        alternatives(4, 7),
        [FILM],
    ),
    (
        "who directed pulp fiction?",
        "SELECT ?x WHERE { wd:Q1 <rep>director (wdt)</rep> ?x . }",
        alternatives(3, 8),
        [FILM],
    ),
    (
        "where was tarantino born?",
        "SELECT ?x WHERE { <rep>Tarantino</rep> wdt:P19 ?x . }",
        alternatives(2),
        [],
    ),
    (
        "where was tarantino born?",
        "SELECT ?x WHERE { <rep>Tarantino</rep> wdt:P19 ?x . }",
        alternatives(6),
        [],
    ),
    (
        "who directed pulp fiction?",
        QUERY.replace("<iri>Pulp Fiction</iri>", "<rep>Pulp Fiction</rep>"),
        alternatives(5),
        [],
    ),
]


@pytest.mark.parametrize("prompt_format", ["v1", "v2"])
def test_prefix_cached_scores_equal_a_full_forward(model, tokenizer, prompt_format):
    reranker = ModelReranker(model, tokenizer, prompt_format=prompt_format)
    header = len(
        tokenizer.encode(f"<|im_start|>system\n{RERANK_SYSTEM[prompt_format]}<|im_end|>\n<|im_start|>user\n")
    )
    previous = []
    for number, (question, query, alts, resolved) in enumerate(CALLS):
        computed = reranker.tokens["computed"]
        scores = reranker(question, query, alts, resolved)
        assert scores == pytest.approx(
            full_scores(model, tokenizer, question, query, alts, resolved, prompt_format), abs=1e-5
        )
        # only the tokens after the start shared with the previous prompt ran through the model
        text = chat_prompt(rerank_messages(question, query, alts, True, resolved, prompt_format)[0])
        ids = tokenizer.encode(text)
        shared = next(
            i for i in range(len(ids)) if i == len(ids) - 1 or i == len(previous) or ids[i] != previous[i]
        )
        assert reranker.tokens["computed"] - computed == len(ids) - shared
        assert number == 0 or shared >= header  # the system message always, ...
        if number == 2:  # ... and on a backtrack the question, the whole query and the resolved items too
            assert shared >= len(tokenizer.encode(text[: text.index("Alternatives:")])) - 1
        previous = ids


def test_without_prefix_cache_every_prompt_runs_in_full(model, tokenizer):
    reranker = ModelReranker(model, tokenizer, prefix_cache=False)
    for question, query, alts, resolved in CALLS[:3]:
        assert reranker(question, query, alts, resolved) == pytest.approx(
            full_scores(model, tokenizer, question, query, alts, resolved), abs=1e-5
        )
    assert reranker.tokens["computed"] == reranker.tokens["prompt"] and reranker.prompts.cache is None


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_bf16_scores_are_not_rounded_to_bf16(model_dir, tokenizer, prefix_cache):
    # bf16 logits come in steps of 1/16 to 1/8 at re-ranking's sizes: an alternative close to None would tie
    # with it and be cut. The scores are the float32 products of the bf16 model's last hidden state.
    model = prepare_for_inference(Transformer.from_pretrained(model_dir, dtype=torch.bfloat16))
    scores = ModelReranker(model, tokenizer, prefix_cache=prefix_cache)(*CALLS[0])
    assert len(scores) == len(CALLS[0][2]) + 1
    assert any(torch.tensor(score).bfloat16().item() != score for score in scores)


def test_truncated_cache_continues_like_a_full_forward(model):
    # the mechanism the prefix cache rests on: cut a cache back, feed other tokens, get the full forward's logits
    a, b = [1, 40, 41, 42, 43, 44, 45], [1, 40, 41, 50, 51, 52]
    cache = model.new_cache(1, 4)  # small on purpose: the second forward makes it grow
    with torch.no_grad():
        model(torch.tensor([a]), cache=cache)
        cache.truncate(3)
        cached = model(torch.tensor([b[3:]]), cache=cache)[0]  # [3, V]
        full = model(torch.tensor([b]))[0, 3:]  # [3, V]
    assert len(cache) == len(b)
    assert torch.allclose(cached, full, atol=1e-5)


def test_identifiers_are_single_tokens(model, tokenizer):
    reranker = ModelReranker(model, tokenizer)
    assert sorted(reranker.identifier_ids) == sorted(IDENTIFIERS)
    for identifier, token in reranker.identifier_ids.items():
        assert tokenizer.encode(identifier) == [token] and tokenizer.decode([token]) == identifier
    # each alternatives line of a prompt starts with its identifier's token (what the answer token means)
    messages, identifiers = rerank_messages("q?", "SELECT ?x WHERE { <rep>a</rep> ?p ?x }", alternatives(3))
    ids = tokenizer.encode(chat_prompt(messages))
    for identifier in identifiers:
        line = tokenizer.encode(f"{identifier}.")
        assert line[0] == reranker.identifier_ids[identifier] and any(
            ids[i : i + len(line)] == line for i in range(len(ids))
        )


def test_a_tokenizer_that_splits_identifiers_is_refused(model, tokenizer):
    class Splitting:
        def encode(self, text):
            return tokenizer.encode(text) * 2

    with pytest.raises(ValueError, match="single-token identifiers"):
        ModelReranker(model, Splitting())


def test_identifier_logits_gather_and_mask_absent_ones():
    logits = torch.arange(12.0).reshape(2, 6)  # [N=2, V=6]
    ids = torch.tensor([[5, 0, 2], [1, 3, -1]])  # row 1: two identifiers present
    assert identifier_logits(logits, ids).tolist() == [[5.0, 0.0, 2.0], [7.0, 9.0, float("-inf")]]


def test_training_refuses_a_splitting_tokenizer_as_inference_does(tokenizer):
    class Splitting:
        def encode(self, text):
            return tokenizer.encode(text) * 2

    messages, identifiers = rerank_messages("q?", "SELECT ?x WHERE { <rep>a</rep> ?p ?x }", alternatives(2))
    sample = {"task": "rerank", "messages": messages, "identifiers": identifiers, "target": identifiers[0]}
    assert loss.encode(sample, tokenizer)["choices"] == [tokenizer.encode(i)[0] for i in identifiers]
    with pytest.raises(ValueError, match="single-token identifiers"):
        loss.encode(sample, Splitting())


def rig_lm_head(model, tokenizer, question, query, alts, wanted):
    """Make the identifier logits of this prompt equal `wanted`: identifier i's lm_head row becomes
    wanted[i] * h / |h|^2, with h the final hidden state at the prompt's last position."""
    hidden = []
    hook = model.lm_head.register_forward_hook(lambda module, inputs, output: hidden.append(inputs[0]))
    full_scores(model, tokenizer, question, query, alts)
    hook.remove()
    h = hidden[0].reshape(-1).double()  # [C]
    weight = model.lm_head.weight  # [V, C]
    for identifier, score in zip(IDENTIFIERS, wanted):
        weight[tokenizer.encode(identifier)[0]] = (score * h / h.dot(h)).float()


def test_scores_order_the_alternatives_and_none_is_last(model, tokenizer):
    hits = [Hit(f"{WD}Q{i}", f"item {i}", [], "", 0.0, 1.0) for i in range(5)]
    text = QUERY
    placeholder = find_placeholders(text)[0]
    question, marked = (
        "who directed pulp fiction?",
        QUERY.replace("<iri>Pulp Fiction</iri>", "<rep>Pulp Fiction</rep>"),
    )
    wanted = [2.0, 9.0, -1.0, 7.0, 5.0, 4.0]  # five hits, then None at 4.0
    rig_lm_head(
        model,
        tokenizer,
        question,
        marked,
        [Alternative(h.id, f"wd:Q{i}", h.label) for i, h in enumerate(hits)],
        wanted,
    )

    messages, identifiers = rerank_messages(
        question, marked, [Alternative(h.id, f"wd:Q{i}", h.label) for i, h in enumerate(hits)]
    )
    assert (
        messages[-1]["content"].splitlines()[-1] == f"{identifiers[-1]}. {NONE_TEXT}"
    )  # None: the last line
    reranker = ModelReranker(model, tokenizer)
    frame, trace = Frame(text, placeholder, "entity", list(hits)), Trace()
    event = trace.event("placeholder")  # the re-rank step adds its fields to the placeholder's event
    Resolver(None, None, reranker, Options()).rerank(question, frame, trace)
    assert [h.id for h in frame.alternatives] == [f"{WD}Q1", f"{WD}Q3", f"{WD}Q4"]  # above None, best first
    assert [iri for iri, _ in event["reranked"]] == [
        f"{WD}Q1",
        f"{WD}Q3",
        f"{WD}Q4",
        None,
        f"{WD}Q0",
        f"{WD}Q2",
    ]
    assert [s for _, s in event["reranked"]] == pytest.approx([9.0, 7.0, 5.0, 4.0, 2.0, -1.0], abs=1e-3)


def real_model_dir():
    from common import defaults

    if not (defaults.MODEL_DIR / "config.json").exists():
        pytest.skip(f"no base model at {defaults.MODEL_DIR} (python get_model.py)")
    return defaults.MODEL_DIR


@pytest.mark.slow
def test_qwen_identifiers_are_single_tokens_in_the_prompt():
    tokenizer = Tokenizer(real_model_dir())
    messages, identifiers = rerank_messages(
        "who directed pulp fiction?", CALLS[0][1], alternatives(len(IDENTIFIERS) - 1)
    )
    ids = tokenizer.encode(chat_prompt(messages))
    for identifier in identifiers:
        [token] = tokenizer.encode(identifier)
        line = tokenizer.encode(f"{identifier}.")
        assert line[0] == token and any(ids[i : i + len(line)] == line for i in range(len(ids)))


@pytest.mark.slow
def test_prefix_cache_on_the_real_model():
    model_dir = real_model_dir()
    model, tokenizer = prepare_for_inference(Transformer.from_pretrained(model_dir)), Tokenizer(model_dir)
    reranker = ModelReranker(model, tokenizer)
    for question, query, alts, resolved in CALLS[:3]:
        assert reranker(question, query, alts, resolved) == pytest.approx(
            full_scores(model, tokenizer, question, query, alts, resolved), abs=1e-3
        )
    assert reranker.tokens["computed"] < reranker.tokens["prompt"]
