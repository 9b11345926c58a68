"""Tests for cpu_speed.py: prepare_for_inference is exact (full forward and cached decoding), converts
only plain nn.Linear layers, and switches the model to eval mode without gradients. Tiny random models
from tests/tiny.py, tied and untied lm_head. (LoRA layers on this path: tests/test_lora.py.)
"""
from pathlib import Path

import pytest
import torch

import model as M
from cpu_speed import SplitLinear, prepare_for_inference
from tests.tiny import make_model_dir

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def model_dir(request, tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny"), tie_word_embeddings=request.param)


def tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 300, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize("split", [True, False], ids=["split", "plain"])
def test_prepare_for_inference_is_exact_and_leaves_wrapped_layers(model_dir, split):
    model = M.Transformer.from_pretrained(model_dir)
    x = tokens(2, 9, seed=7)
    before = model(x)
    wrapped = torch.nn.Sequential(model.model.layers[0].self_attn.q_proj)  # stands in for a LoRA wrapper
    model.model.layers[0].self_attn.q_proj = wrapped
    assert prepare_for_inference(model, split_matmuls=split) is model and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.model.layers[0].self_attn.q_proj is wrapped and type(wrapped[0]) is torch.nn.Linear
    assert isinstance(model.model.layers[1].mlp.down_proj, SplitLinear) == split
    assert isinstance(model.lm_head, SplitLinear) == (split and not model.args.tie_word_embeddings)
    torch.testing.assert_close(model(x), before, atol=1e-5, rtol=0)
    cache = model.new_cache(2)
    steps = [model(x[:, :4], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), before, atol=1e-5, rtol=0)
