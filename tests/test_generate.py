"""Beam search (generate.py) on a tiny random model: greedy equivalence, scores, cache reordering; and
the chat command line (`python -m grisp.generate --chat ...`): clear errors, --help, an answer from a tiny
model, and (slow) the real base model knows Paris."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common import defaults
from grisp import generate
from grisp.generate import beam_search, sample_without_replacement, top_p_mask
from llm.tokenizer import DEFAULT_SYSTEM
from model import Transformer
from tests.tiny import make_model_dir

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)
PROMPT = [1, 40, 41, 42, 43, 2, 1, 44]
EOS = [2]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return Transformer.from_pretrained(make_model_dir(tmp_path_factory.mktemp("tiny")))


def sequence_logprob(model, prompt, tokens):
    """Sum of log p(token | prefix) over `tokens`, from one full forward pass."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids)[0].float(), dim=-1)  # [T, V]
    return sum(float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens))


def greedy_reference(model, prompt, steps):
    ids = list(prompt)
    out = []
    for _ in range(steps):
        next_id = int(model(torch.tensor([ids]))[0, -1].argmax())
        if next_id in EOS:
            return out, True
        out.append(next_id)
        ids.append(next_id)
    return out, False


def test_width_one_equals_greedy(model):
    hyps = beam_search(model, PROMPT, EOS, num_beams=1, max_new_tokens=12)
    tokens, finished = greedy_reference(model, PROMPT, 12)
    assert len(hyps) == 1
    assert hyps[0].tokens == tokens and hyps[0].finished == finished


@pytest.mark.parametrize("sample", [False, True])
def test_scores_are_summed_token_logprobs(model, sample):
    g = torch.Generator().manual_seed(0)
    hyps = beam_search(
        model,
        PROMPT,
        EOS,
        num_beams=4,
        max_new_tokens=8,
        sample=sample,
        temperature=0.7,
        top_p=0.9,
        generator=g,
    )
    assert len(hyps) == 4
    for h in hyps:
        full = h.tokens + ([EOS[0]] if h.finished else [])
        assert h.score == pytest.approx(sequence_logprob(model, PROMPT, full), abs=1e-4)


def test_deterministic_beams_are_distinct_and_sorted(model):
    hyps = beam_search(model, PROMPT, EOS, num_beams=6, max_new_tokens=8)
    keys = [(tuple(h.tokens), h.finished) for h in hyps]
    assert len(set(keys)) == len(keys)
    finished = [h.score for h in hyps if h.finished]
    assert finished == sorted(finished, reverse=True)


@pytest.mark.parametrize("sample", [False, True])
def test_cache_reordering_equals_recomputing(model, sample):
    def run(use_cache):
        g = torch.Generator().manual_seed(3)
        return beam_search(
            model,
            PROMPT,
            EOS,
            num_beams=5,
            max_new_tokens=10,
            sample=sample,
            temperature=0.5,
            top_p=0.95,
            generator=g,
            use_cache=use_cache,
        )

    cached, recomputed = run(True), run(False)
    assert [h.tokens for h in cached] == [h.tokens for h in recomputed]
    assert [h.score for h in cached] == pytest.approx([h.score for h in recomputed], abs=1e-4)


def test_sampling_is_seeded(model):
    a = beam_search(
        model,
        PROMPT,
        EOS,
        num_beams=4,
        max_new_tokens=6,
        sample=True,
        temperature=2.0,
        generator=torch.Generator().manual_seed(1),
    )
    b = beam_search(
        model,
        PROMPT,
        EOS,
        num_beams=4,
        max_new_tokens=6,
        sample=True,
        temperature=2.0,
        generator=torch.Generator().manual_seed(1),
    )
    assert [h.tokens for h in a] == [h.tokens for h in b]


def test_top_p_mask_keeps_smallest_set_reaching_p():
    logprobs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert top_p_mask(logprobs, 0.7).tolist() == [[True, True, False, False]]
    assert top_p_mask(logprobs, 0.45).tolist() == [[True, False, False, False]]
    assert top_p_mask(logprobs, 1.0).tolist() == [[True, True, True, True]]


def full_sort_top_p_mask(logprobs, top_p):
    """The reference: sort every row completely, keep a token while the mass before it is < top_p."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)
    before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
    return torch.zeros_like(order, dtype=torch.bool).scatter(-1, order, before < top_p)


@pytest.mark.parametrize("sharpness", [0.1, 3.0, 30.0])  # flat rows need the full sort, sharp ones 64 tokens
def test_top_p_mask_equals_a_full_sort(sharpness):
    g = torch.Generator().manual_seed(0)
    logprobs = torch.log_softmax(sharpness * torch.randn(5, 3000, generator=g), dim=-1)
    for top_p in (0.3, 0.9, 0.999):
        assert torch.equal(top_p_mask(logprobs, top_p), full_sort_top_p_mask(logprobs, top_p))


def test_sampling_on_the_allowed_entries_draws_what_multinomial_draws():
    g = torch.Generator().manual_seed(0)
    weights = 3 * torch.randn(4000, generator=g)
    allowed = torch.randperm(4000, generator=g)[:300]  # any order, as beam search passes them
    dense = torch.zeros(4000).index_copy(0, allowed, torch.softmax(weights[allowed], dim=0))
    for seed in range(5):
        ours = sample_without_replacement(
            weights[allowed], allowed, 4000, 16, torch.Generator().manual_seed(seed)
        )
        theirs = torch.multinomial(dense, 16, generator=torch.Generator().manual_seed(seed))
        assert set(ours.tolist()) == set(theirs.tolist()) and set(ours.tolist()) <= set(allowed.tolist())


# ---------------------------------------------------------------------------- length-normalised ranking
def hf_beam_search(model_dir, prompt, eos, num_beams, max_new_tokens, length_penalty=1.0):
    """transformers' own beam search (what the reference decodes with, length_penalty 1.0; 0.0 ranks by
    the sum): (tokens, score, finished) per returned sequence, best first."""
    from transformers import Qwen2ForCausalLM

    hf = Qwen2ForCausalLM.from_pretrained(model_dir).eval()
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        num_beams=num_beams,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        num_return_sequences=num_beams,
        eos_token_id=eos,
        pad_token_id=0,
        length_penalty=length_penalty,
        early_stopping=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    result = []
    for sequence, score in zip(out.sequences, out.sequences_scores):
        new = sequence[len(prompt) :].tolist()
        end = next((i for i, t in enumerate(new) if t in eos), None)
        result.append((new[:end], float(score), end is not None))
    return result


# end-of-turn ids chosen among tokens the tiny random model writes, so that hypotheses end at several
# lengths (and, with width 4 or 5 below, every beam ends early: HF's stopping heuristic is exercised)
HF_CASES = [
    ([12, 22, 55, 104], 4, 15),
    ([12, 22, 55, 104], 5, 40),
    ([104, 106, 22], 4, 15),
    ([22, 104, 215], 3, 30),
]


@pytest.mark.parametrize("eos, width, max_new_tokens", HF_CASES)
def test_length_normalised_beam_search_equals_transformers(
    model, eos, width, max_new_tokens, tmp_path_factory
):
    model_dir = make_model_dir(tmp_path_factory.mktemp("tiny"))  # the same seeded weights as `model`
    ours = beam_search(
        model, PROMPT, eos, num_beams=width, max_new_tokens=max_new_tokens, ranking="length-normalised"
    )
    theirs = hf_beam_search(model_dir, PROMPT, eos, width, max_new_tokens)
    assert [(h.tokens, h.finished) for h in sorted(ours, key=lambda h: -h.score)] == [
        (t, f) for t, _, f in theirs
    ]
    assert [h.score for h in sorted(ours, key=lambda h: -h.score)] == pytest.approx(
        [s for _, s, _ in theirs], abs=1e-4
    )
    finished = [h for h in ours if h.finished]
    if eos == [12, 22, 55, 104]:  # the cases are not trivial: several lengths, all ended before the limit
        assert len(finished) == width and len({len(h.tokens) for h in finished}) > 1
        assert max(len(h.tokens) for h in finished) < max_new_tokens - 1
        summed = beam_search(model, PROMPT, eos, num_beams=width, max_new_tokens=max_new_tokens)
        assert [h.tokens for h in summed] != [h.tokens for h in ours], "the rankings differ on this case"


def processed_score(model, prompt, tokens, temperature, top_p, min_keep):
    """Sum of the log-probabilities of `tokens` as transformers' beam sampling processes them (log_softmax,
    then its own temperature and top-p warpers, no renormalisation), from one full forward pass; -inf if
    a token is outside its top-p set."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids)[0].float(), dim=-1)  # [T, V]
    warpers = [TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p, min_tokens_to_keep=min_keep)]
    total = 0.0
    for i, token in enumerate(tokens):
        row = logprobs[len(prompt) - 1 + i][None]
        for warp in warpers:
            row = warp(ids[:, : len(prompt) + i], row)
        total += float(row[0, token])
    return total


@pytest.mark.parametrize("eos, width, max_new_tokens", HF_CASES)
def test_sum_ranked_beam_search_equals_transformers_without_length_penalty(
    model, eos, width, max_new_tokens, tmp_path_factory
):
    model_dir = make_model_dir(tmp_path_factory.mktemp("tiny"))
    ours = beam_search(model, PROMPT, eos, num_beams=width, max_new_tokens=max_new_tokens)
    theirs = hf_beam_search(model_dir, PROMPT, eos, width, max_new_tokens, length_penalty=0.0)
    assert [(h.tokens, h.finished) for h in sorted(ours, key=lambda h: -h.score)] == [
        (t, f) for t, _, f in theirs
    ]
    assert [h.score for h in sorted(ours, key=lambda h: -h.score)] == pytest.approx(
        [s for _, s, _ in theirs], abs=1e-4
    )


def test_length_normalised_sampling_scores_are_processed_logprobs_per_token(model):
    eos = [12, 22, 55, 104]
    for seed in range(3):
        hyps = beam_search(
            model,
            PROMPT,
            eos,
            num_beams=4,
            max_new_tokens=12,
            sample=True,
            temperature=0.7,
            top_p=0.9,
            generator=torch.Generator().manual_seed(seed),
            ranking="length-normalised",
        )
        for h in hyps:
            if h.finished:  # the end-of-turn id is one of eos: try each, one gives the score
                candidates = [
                    processed_score(model, PROMPT, h.tokens + [e], 0.7, 0.9, len(eos) + 1)
                    / (len(h.tokens) + 1)
                    for e in eos
                ]
                assert min(abs(c - h.score) for c in candidates) < 1e-4
            else:
                expected = processed_score(model, PROMPT, h.tokens, 0.7, 0.9, len(eos) + 1) / len(h.tokens)
                assert h.score == pytest.approx(expected, abs=1e-4)
        scores = [h.score for h in hyps if h.finished]
        assert scores == sorted(scores, reverse=True)


def test_a_long_limit_costs_nothing_when_the_beams_end_early(model):
    calls = []
    hook = model.model.norm.register_forward_hook(lambda *args: calls.append(1))
    for ranking in ("sum", "length-normalised"):
        calls.clear()
        long = beam_search(model, PROMPT, [12, 22, 55, 104], num_beams=4, max_new_tokens=512, ranking=ranking)
        steps = len(calls)
        short = beam_search(
            model, PROMPT, [12, 22, 55, 104], num_beams=4, max_new_tokens=steps + 1, ranking=ranking
        )
        assert all(h.finished for h in long) and steps < 20, (ranking, steps)
        assert [(h.tokens, h.score) for h in long] == [(h.tokens, h.score) for h in short]
    hook.remove()


def test_beams_that_all_end_before_the_limit_are_not_returned_again_as_cut_off(model):
    # a sharp top-p leaves one token per beam: the few live beams all end at the same step, with fewer than
    # W finished. Nothing ran out of steps, so no hypothesis is unfinished (the ended beams came back a
    # second time, without their end token's log-probability, as cut off)
    end = greedy_reference(model, PROMPT, 3)[0][2]  # the greedy path's third token ends the turn
    hyps = beam_search(
        model,
        PROMPT,
        [end],
        num_beams=4,
        max_new_tokens=20,
        sample=True,
        temperature=0.05,
        top_p=0.01,
        generator=torch.Generator().manual_seed(0),
    )
    assert 0 < len(hyps) < 4 and all(h.finished for h in hyps)
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


# ---------------------------------------------------------------------------- command line
def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grisp.generate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_cli_rejects_a_missing_model_and_an_empty_question(tmp_path):
    args = argparse.Namespace(
        chat="hi",
        model_dir=str(tmp_path / "nothing"),
        system=DEFAULT_SYSTEM,
        max_new_tokens=4,
        device="cpu",
        dtype="auto",
        threads=0,
    )
    with pytest.raises(SystemExit, match="get_model.py"):
        generate.main(args)
    args.model_dir, args.chat = str(make_model_dir(tmp_path / "tiny")), "  "
    with pytest.raises(SystemExit, match="--chat is empty"):
        generate.main(args)


def test_cli_help_and_answer_with_a_tiny_model(tmp_path):
    assert run_cli("--help").returncode == 0
    done = run_cli(
        "--chat",
        "What is the capital of France?",
        "--model-dir",
        str(make_model_dir(tmp_path)),
        "--max-new-tokens",
        "5",
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_real_model_chat_knows_paris():
    if (
        not (defaults.MODEL_DIR / "model.safetensors").exists()
        and not (defaults.MODEL_DIR / "model.safetensors.index.json").exists()
    ):
        pytest.skip(f"no base model at {defaults.MODEL_DIR}: run `python get_model.py` first")
    done = run_cli(
        "--chat",
        "What is the capital of France?",
        "--model-dir",
        str(defaults.MODEL_DIR),
        "--max-new-tokens",
        "32",
    )
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout, done.stdout


# ---------------------------------------------------------------------------- early end and prompt cache
MANY_EOS = list(range(2, 20))  # end-of-turn ids common enough that a tiny random model finishes often


class CountingModel(torch.nn.Module):
    """The tiny model, counting its forward passes."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.model, self.calls = inner, inner.model, 0

    def new_cache(self, *args):
        return self.inner.new_cache(*args)

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


@pytest.mark.parametrize("sample", [False, True])
def test_the_stream_yields_the_full_ranking_and_stopping_early_saves_steps(model, sample):
    counting = CountingModel(model)

    def stream():
        return generate.beam_search_stream(
            counting,
            PROMPT,
            MANY_EOS,
            num_beams=4,
            max_new_tokens=14,
            sample=sample,
            temperature=0.7,
            generator=torch.Generator().manual_seed(3),
        )

    full = [(h.tokens, h.score, h.finished) for h in stream()]
    full_calls, counting.calls = counting.calls, 0
    assert full == [
        (h.tokens, h.score, h.finished)
        for h in beam_search(
            model,
            PROMPT,
            MANY_EOS,
            num_beams=4,
            max_new_tokens=14,
            sample=sample,
            temperature=0.7,
            generator=torch.Generator().manual_seed(3),
        )
    ]
    first = next(stream())
    assert (first.tokens, first.score, first.finished) == full[0]
    assert counting.calls < full_calls  # the search stopped when the best one was settled


def test_the_length_normalised_stream_yields_only_at_the_end(model):
    counting = CountingModel(model)
    settings = dict(num_beams=4, max_new_tokens=8, ranking="length-normalised")
    full = beam_search(counting, PROMPT, MANY_EOS, **settings)
    full_calls, counting.calls = counting.calls, 0
    first = next(generate.beam_search_stream(counting, PROMPT, MANY_EOS, **settings))
    assert counting.calls == full_calls and first.tokens == full[0].tokens


def test_a_shared_prompt_cache_gives_the_same_beams_and_runs_only_the_new_tokens(model):
    from llm.prompt_cache import PromptCache

    other = [1, 40, 41, 42, 50, 51, 2, 1, 44]  # shares its first 4 tokens with PROMPT
    prompts = PromptCache(model)
    beam_search(model, PROMPT, EOS, num_beams=3, max_new_tokens=6, prompt_cache=prompts)
    computed = prompts.tokens["computed"]
    cached = beam_search(model, other, EOS, num_beams=3, max_new_tokens=6, prompt_cache=prompts)
    assert prompts.tokens["computed"] - computed == len(other) - 4
    fresh = beam_search(model, other, EOS, num_beams=3, max_new_tokens=6)
    assert [h.tokens for h in cached] == [h.tokens for h in fresh]
    for a, b in zip(cached, fresh):
        assert a.score == pytest.approx(b.score, abs=1e-4)


class ScriptedModel(torch.nn.Module):
    """The tiny model's cache and shapes with scripted logits: after the prompt the empty answer ends
    first at a low score (log 0.18), while 50 -> 51 -> end is likelier and overtakes it two steps later."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.model = inner, inner.model

    def new_cache(self, *args):
        return self.inner.new_cache(*args)

    def forward(self, tokens, cache=None, logits_at=None, vocab=None):  # vocab: unused by beam search
        real = self.inner(tokens, cache=cache, logits_at=logits_at)  # [B, V]
        logits = torch.zeros_like(real)
        if tokens.shape[1] > 1:  # the prompt
            logits[:, 50], logits[:, 2] = 20.0, 18.5
        else:  # 50 -> 51 -> end; other beams wander (flat logits)
            logits[tokens[:, -1] == 50, 51] = 30.0
            logits[tokens[:, -1] == 51, 2] = 30.0
        return logits


def test_the_stream_waits_until_a_later_hypothesis_can_no_longer_overtake(model):
    scripted = ScriptedModel(model)
    full = beam_search(scripted, PROMPT, EOS, num_beams=3, max_new_tokens=6)
    assert full[0].tokens == [50, 51] and full[1].tokens == []  # it overtook the first finished
    assert next(generate.beam_search_stream(scripted, PROMPT, EOS, num_beams=3, max_new_tokens=6)).tokens == [
        50,
        51,
    ]
