"""prompt_cache.PromptCache on a tiny random model: a prompt run after another equals a full forward
while running only the tokens after the shared start; chunked feeding; a failed forward leaves a
consistent cache; KVCache.copy_rows (the beam rows) leaves the prompt's cache unchanged."""

import pytest
import torch

from llm.prompt_cache import PromptCache
from model import Transformer
from tests.tiny import make_model_dir

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return Transformer.from_pretrained(make_model_dir(tmp_path_factory.mktemp("tiny")))


def full(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids]), logits_at=-1)[0]


def test_run_equals_a_full_forward_and_computes_only_the_new_tokens(model):
    prompts = PromptCache(model, room=4)  # small on purpose: the cache must grow
    a, b, c = [5, 6, 7, 8, 9], [5, 6, 7, 20, 21, 22], [5, 6, 7, 20, 21, 22]
    for ids in (a, b):
        torch.testing.assert_close(prompts.run(ids), full(model, ids), atol=1e-5, rtol=0)
    assert prompts.tokens == {"prompt": 11, "computed": 5 + 3}
    torch.testing.assert_close(prompts.run(c), full(model, c), atol=1e-5, rtol=0)  # same prompt: 1 token runs
    assert prompts.tokens["computed"] == 9 and prompts.ids == c


def test_feed_appends_and_chunks(model):
    prompts = PromptCache(model, chunk=2)
    prompts.run([5, 6, 7])
    torch.testing.assert_close(
        prompts.feed([8, 9, 10, 11, 12]), full(model, [5, 6, 7, 8, 9, 10, 11, 12]), atol=1e-5, rtol=0
    )
    assert prompts.ids == [5, 6, 7, 8, 9, 10, 11, 12]


def test_a_stopped_feed_keeps_only_what_ran(model):
    prompts = PromptCache(model, chunk=2)
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise TimeoutError("deadline")

    with pytest.raises(TimeoutError):
        prompts.run([5, 6, 7, 8, 9, 10], check=check)
    assert prompts.ids == [5, 6, 7, 8]
    torch.testing.assert_close(prompts.feed([30]), full(model, [5, 6, 7, 8, 30]), atol=1e-5, rtol=0)


def test_copy_rows_makes_beam_rows_and_leaves_the_prompt_cache(model):
    prompts = PromptCache(model)
    prompts.run([5, 6, 7])
    beams = prompts.cache.copy_rows(torch.zeros(3, dtype=torch.long), max_len=10)
    with torch.inference_mode():
        logits = model(torch.tensor([[8], [9], [10]]), cache=beams, logits_at=-1)  # [3, V]
    for row, token in enumerate((8, 9, 10)):
        torch.testing.assert_close(logits[row], full(model, [5, 6, 7, token]), atol=1e-5, rtol=0)
    assert prompts.cache.batch_size == 1 and len(prompts.cache) == 3
    torch.testing.assert_close(prompts.feed([11]), full(model, [5, 6, 7, 11]), atol=1e-5, rtol=0)
