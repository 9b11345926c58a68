"""Tests for lora.py on a tiny random Qwen2: exactness, merging, training mask, injection by name and
layer, and LoRA on model.py's inference paths (KV cache, cpu_speed). Adapter files and the round trip
with Hugging Face PEFT: tests/test_peft_format.py (which reuses this file's helpers)."""

import pytest
import torch

import lora
from llm.cpu_speed import prepare_for_inference
from model import Transformer
from tests.tiny import make_model_dir

LAYERS = 3
IDS = torch.randint(3, 300, (2, 7), generator=torch.Generator().manual_seed(1))  # tiny vocabulary: 300


# Merging, caching and the fast path change the float order of operations; in float32 that moves these
# logits (|logit| up to ~6) by ~1e-5. Those tests run in float64 so a tight tolerance checks the math.
EXACT = dict(atol=1e-10, rtol=0)


@pytest.fixture(autouse=True)
def one_thread_and_a_seed():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # lora_A's random init
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen2 with a tied lm_head (like Qwen2.5-0.5B), shared by every model in a test."""
    return make_model_dir(tmp_path_factory.mktemp("tiny"), tie_word_embeddings=True, num_hidden_layers=LAYERS)


def host_model(model_dir, dtype: torch.dtype = torch.float32) -> Transformer:
    """The model lora.py adapts in the project: our model.py."""
    return Transformer.from_pretrained(model_dir, dtype=dtype)


@torch.no_grad()
def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits  # ours: a tensor; HF / PEFT: an output object


def randomize_b(model: torch.nn.Module) -> None:
    """LoRA starts as a no-op (B = 0); give B values so the adapter changes the output."""
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape) * 0.1)


# --- the LoRA layer


def test_zero_b_equals_base_exactly(model_dir):
    model = host_model(model_dir)
    base = logits(model, IDS)
    names = lora.inject_lora(model, r=4, alpha=8)
    assert len(names) == 7 * LAYERS
    assert all(torch.count_nonzero(m.lora_A) > 0 for m in lora.lora_layers(model).values())
    assert torch.equal(logits(model, IDS), base)


def test_merged_equals_unmerged_and_unmerge_restores_base(model_dir):
    model = host_model(model_dir, torch.float64)
    base = logits(model, IDS)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    adapted = logits(model, IDS)
    assert (adapted - base).abs().max() > 1e-2, "random B should change the output"
    lora.merge_lora(model)
    torch.testing.assert_close(logits(model, IDS), adapted, **EXACT)
    lora.unmerge_lora(model)
    torch.testing.assert_close(logits(model, IDS), adapted, **EXACT)
    base_weights = host_model(model_dir, torch.float64).state_dict()
    for name, layer in lora.lora_layers(model).items():
        torch.testing.assert_close(layer.base_layer.weight, base_weights[name + ".weight"], **EXACT)


def test_a_bf16_merge_rounds_the_sum_once(model_dir):
    model = host_model(model_dir, torch.bfloat16)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    layers = lora.lora_layers(model)
    expected = {
        name: (
            layer.base_layer.weight.float() + (layer.lora_B.float() @ layer.lora_A.float()) * layer.scaling
        ).to(torch.bfloat16)
        for name, layer in layers.items()
    }
    lora.merge_lora(model)
    for name, layer in layers.items():
        assert torch.equal(layer.base_layer.weight, expected[name]), name


def test_merge_is_explicit_and_train_mode_refuses_merged_weights(model_dir):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8)
    weight = model.model.layers[0].self_attn.q_proj.base_layer.weight.clone()
    randomize_b(model)
    model.train()
    model.eval()
    assert torch.equal(model.model.layers[0].self_attn.q_proj.base_layer.weight, weight)
    lora.merge_lora(model)
    model.train()
    with pytest.raises(RuntimeError, match="unmerge"):
        model(IDS)


def test_merge_refuses_a_tied_lm_head(model_dir):
    model = host_model(model_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    lora.inject_lora(model, target_modules=["lm_head"])
    with pytest.raises(ValueError, match="lm_head shares its weight"):
        lora.merge_lora(model)
    assert not any(layer.merged for layer in lora.lora_layers(model).values())


def test_unload_after_merge_gives_plain_linear_layers(model_dir):
    model = host_model(model_dir, torch.float64)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    adapted = logits(model, IDS)
    lora.merge_lora(model)
    lora.unload_lora(model)
    assert not lora.lora_layers(model)
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    torch.testing.assert_close(logits(model, IDS), adapted, **EXACT)


# --- with model.py's inference paths


def test_cached_decoding_with_lora_equals_the_full_forward(model_dir):
    model = host_model(model_dir, torch.float64)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    full = logits(model, IDS)  # [B, T, V]
    cache = model.new_cache(IDS.shape[0])
    with torch.no_grad():
        steps = [model(IDS[:, :4], cache=cache, logits_at=-1)]
        steps += [model(IDS[:, t : t + 1], cache=cache, logits_at=-1) for t in range(4, IDS.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], **EXACT)


def test_fast_inference_path_keeps_unmerged_lora(model_dir):
    """prepare_for_inference swaps plain nn.Linear layers only, so LoRA layers keep working."""
    model = host_model(model_dir, torch.float64)
    lora.inject_lora(model, r=4, alpha=8, layers=[1, 2])
    randomize_b(model)
    adapted = logits(model, IDS)
    prepare_for_inference(model)
    assert len(lora.lora_layers(model)) == 7 * 2
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "SplitLinear"
    torch.testing.assert_close(logits(model, IDS), adapted, **EXACT)


def test_merged_and_unloaded_adapter_runs_on_the_fast_inference_path(model_dir):
    model = host_model(model_dir, torch.float64)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    adapted = logits(model, IDS)
    lora.merge_lora(model)
    lora.unload_lora(model)
    prepare_for_inference(model)
    assert type(model.model.layers[2].mlp.down_proj).__name__ == "SplitLinear"
    torch.testing.assert_close(logits(model, IDS), adapted, **EXACT)


def test_inject_after_the_fast_inference_conversion_fails_loudly(model_dir):
    model = prepare_for_inference(host_model(model_dir))
    with pytest.raises(ValueError, match="SplitLinear, LoRA wraps plain nn.Linear only"):
        lora.inject_lora(model)


def test_dropout_acts_on_the_lora_path_in_training_only(model_dir):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, dropout=0.5)
    assert not any(m.training for m in lora.lora_layers(model).values()), "inherit the model's eval mode"
    randomize_b(model)
    adapted = logits(model, IDS)
    model.train()
    assert not torch.allclose(logits(model, IDS), adapted)
    model.eval()
    assert torch.equal(logits(model, IDS), adapted)


def test_only_lora_parameters_train(model_dir):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, layers=[2])
    n_trainable = lora.mark_only_lora_trainable(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(lora.lora_state_dict(model))
    assert len(trainable) == 2 * 7
    assert n_trainable == sum(p.numel() for n, p in model.named_parameters() if n in trainable)
    model(IDS).sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in trainable if n.endswith("lora_B"))


# --- injection by name and layer


def test_layer_restriction_and_target_names(model_dir):
    model = host_model(model_dir)
    assert lora.last_layers(model, 2) == [1, 2]
    names = lora.inject_lora(model, r=2, alpha=2, target_modules=["q_proj", "down_proj"], layers=[0, 2])
    assert names == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.2.self_attn.q_proj",
        "model.layers.2.mlp.down_proj",
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target_modules": ["qkv"]}, "matched no module"),
        (
            {"target_modules": ["q_proj", "v-proj"]},
            r"\['v-proj'\] matched no module",
        ),  # a typo beside a real name
        ({"layers": [0, 7]}, r"layers \[7\] do not exist"),
        ({"target_modules": ["mlp"]}, "plain nn.Linear only"),
        ({"r": 0}, "rank must be positive"),
    ],
)
def test_inject_rejects_bad_requests(model_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        lora.inject_lora(host_model(model_dir), **kwargs)


def test_failed_inject_changes_nothing(model_dir):
    model = host_model(model_dir)
    with pytest.raises(ValueError, match="plain nn.Linear"):
        lora.inject_lora(model, target_modules=["q_proj", "mlp"])
    assert not lora.lora_layers(model)


def test_inject_twice_and_last_layers_out_of_range_fail(model_dir):
    model = host_model(model_dir)
    with pytest.raises(ValueError, match="last 4 layers"):
        lora.last_layers(model, 4)
    lora.inject_lora(model, target_modules=["q_proj"])
    with pytest.raises(ValueError, match="already has LoRA"):
        lora.inject_lora(model, target_modules=["q_proj"])
