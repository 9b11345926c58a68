"""Beam search (generate.py) on a tiny random model: greedy equivalence, scores, cache reordering."""
import pytest
import torch

from generate import beam_search, top_p_mask
from model import Transformer
from tests.tiny import make_model_dir

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
    hyps = beam_search(model, PROMPT, EOS, num_beams=4, max_new_tokens=8, sample=sample,
                       temperature=0.7, top_p=0.9, generator=g)
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
        return beam_search(model, PROMPT, EOS, num_beams=5, max_new_tokens=10, sample=sample,
                           temperature=0.5, top_p=0.95, generator=g, use_cache=use_cache)

    cached, recomputed = run(True), run(False)
    assert [h.tokens for h in cached] == [h.tokens for h in recomputed]
    assert [h.score for h in cached] == pytest.approx([h.score for h in recomputed], abs=1e-4)


def test_sampling_is_seeded(model):
    a = beam_search(model, PROMPT, EOS, num_beams=4, max_new_tokens=6, sample=True, temperature=2.0,
                    generator=torch.Generator().manual_seed(1))
    b = beam_search(model, PROMPT, EOS, num_beams=4, max_new_tokens=6, sample=True, temperature=2.0,
                    generator=torch.Generator().manual_seed(1))
    assert [h.tokens for h in a] == [h.tokens for h in b]


def test_top_p_mask_keeps_smallest_set_reaching_p():
    logprobs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert top_p_mask(logprobs, 0.7).tolist() == [[True, True, False, False]]
    assert top_p_mask(logprobs, 0.45).tolist() == [[True, False, False, False]]
    assert top_p_mask(logprobs, 1.0).tolist() == [[True, True, True, True]]
