"""Tests for lora.py on a tiny random Qwen2: exactness, merging, training mask, and adapters that
round-trip with Hugging Face PEFT in both directions."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import defaults
import lora
from cpu_speed import prepare_for_inference
from model import Transformer
from tests.tiny import make_model_dir

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

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


def hf_model(model_dir) -> torch.nn.Module:
    """The reference: transformers' Qwen2ForCausalLM with the same weights, for PEFT."""
    return transformers.Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


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
        steps += [model(IDS[:, t:t + 1], cache=cache, logits_at=-1) for t in range(4, IDS.shape[1])]
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
    assert names == ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj",
                     "model.layers.2.self_attn.q_proj", "model.layers.2.mlp.down_proj"]


@pytest.mark.parametrize("kwargs, message", [
    ({"target_modules": ["qkv"]}, "matched no module"),
    ({"layers": [0, 7]}, r"layers \[7\] do not exist"),
    ({"target_modules": ["mlp"]}, "plain nn.Linear only"),
    ({"r": 0}, "rank must be positive"),
])
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


# --- adapters: our files <-> PEFT


@pytest.mark.parametrize("layers", [None, [1, 2]])
def test_our_adapter_loads_in_peft_with_the_same_logits(model_dir, tmp_path, layers):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, dropout=0.1, layers=layers)
    randomize_b(model)
    ours = logits(model, IDS)
    lora.save_adapter(model, tmp_path, base_model_name_or_path="tiny-qwen2")
    config = json.loads((tmp_path / lora.CONFIG_NAME).read_text())
    assert config["layers_to_transform"] == layers and config["lora_dropout"] == 0.1

    peft_model = peft.PeftModel.from_pretrained(hf_model(model_dir), tmp_path).eval()
    assert peft_model.peft_config["default"].r == 4
    assert peft_model.peft_config["default"].layers_to_transform == layers
    n_lora = sum(1 for n, _ in peft_model.named_parameters() if ".lora_" in n)
    assert n_lora == len(lora.lora_state_dict(model))  # PEFT built exactly our layers
    torch.testing.assert_close(logits(peft_model, IDS), ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layers, n_layers", [(None, LAYERS), ([0, 2], 2), (1, 1)])  # PEFT allows an int
def test_peft_adapter_loads_here_with_the_same_logits(model_dir, tmp_path, layers, n_layers):
    config = peft.LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                             target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
                             layers_to_transform=layers, init_lora_weights=False)  # random A and B
    peft_model = peft.get_peft_model(hf_model(model_dir), config).eval()
    expected = logits(peft_model, IDS)
    peft_model.save_pretrained(tmp_path)

    model = host_model(model_dir)
    assert not torch.allclose(logits(model, IDS), expected, atol=1e-3)
    loaded = lora.load_adapter(model, tmp_path)
    assert loaded["lora_alpha"] == 16
    assert len(lora.lora_layers(model)) == 5 * n_layers
    torch.testing.assert_close(logits(model, IDS), expected, atol=1e-5, rtol=0)


def test_bf16_save_round_trips(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    lora.save_adapter(model, tmp_path, dtype=torch.bfloat16)
    saved = load_file(tmp_path / lora.WEIGHTS_NAME)
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in saved

    fresh = host_model(model_dir)
    lora.load_adapter(fresh, tmp_path)
    for name, p in lora.lora_state_dict(fresh).items():
        assert p.dtype == torch.float32
        assert torch.equal(p, lora.lora_state_dict(model)[name].to(torch.bfloat16).float())
    peft_model = peft.PeftModel.from_pretrained(hf_model(model_dir), tmp_path).eval()
    torch.testing.assert_close(logits(peft_model, IDS), logits(fresh, IDS), atol=1e-5, rtol=0)


def test_convert_casts_weights_and_renames_the_base_model(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, layers=[1, 2])
    randomize_b(model)
    lora.save_adapter(model, tmp_path / "fp32", base_model_name_or_path="/local/path")
    result = subprocess.run([sys.executable, "lora.py", "convert", str(tmp_path / "fp32"), str(tmp_path / "bf16"),
                             "--dtype", "bfloat16", "--base-model", "org/tiny-qwen2"],
                            cwd=defaults.REPO_DIR, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    config = lora.read_adapter_config(tmp_path / "bf16")
    assert config["base_model_name_or_path"] == "org/tiny-qwen2" and config["layers_to_transform"] == [1, 2]
    saved = load_file(tmp_path / "bf16" / lora.WEIGHTS_NAME)
    original = load_file(tmp_path / "fp32" / lora.WEIGHTS_NAME)
    assert saved.keys() == original.keys()
    assert all(saved[k].dtype == torch.bfloat16 and torch.equal(saved[k], original[k].to(torch.bfloat16)) for k in saved)
    missing = subprocess.run([sys.executable, "lora.py", "convert", str(tmp_path / "none"), str(tmp_path / "x")],
                             cwd=defaults.REPO_DIR, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "is not an adapter directory" in missing.stderr


# --- strict loading


@pytest.fixture
def adapter_dir(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    randomize_b(model)
    return lora.save_adapter(model, tmp_path / "adapter")


def edit_weights(adapter_dir, edit) -> None:
    path = adapter_dir / lora.WEIGHTS_NAME
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_key_fails_and_leaves_the_model_unchanged(model_dir, adapter_dir):
    edit_weights(adapter_dir, lambda t: t.pop("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"))
    model = host_model(model_dir)
    with pytest.raises(ValueError, match=r"1 missing \['model.layers.1.self_attn.v_proj.lora_B'\]"):
        lora.load_adapter(model, adapter_dir)
    assert not lora.lora_layers(model)
    assert torch.equal(logits(model, IDS), logits(host_model(model_dir), IDS))


def test_unexpected_key_fails(model_dir, adapter_dir):
    def add(tensors):
        tensors["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"] = torch.zeros(4, 32)
    edit_weights(adapter_dir, add)
    with pytest.raises(ValueError, match="1 unexpected"):
        lora.load_adapter(host_model(model_dir), adapter_dir)


def test_adapter_for_another_shape_fails(adapter_dir, tmp_path):
    wider_dir = make_model_dir(tmp_path / "wide", num_hidden_layers=LAYERS, hidden_size=128)
    wider = Transformer.from_pretrained(wider_dir)
    with pytest.raises(ValueError, match="different base model"):
        lora.load_adapter(wider, adapter_dir)
    assert not lora.lora_layers(wider)


def test_adapter_for_another_architecture_fails(model_dir, adapter_dir):
    config = json.loads((adapter_dir / lora.CONFIG_NAME).read_text())
    config["target_modules"] = ["c_attn"]  # GPT-2's names
    (adapter_dir / lora.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="matched no module"):
        lora.load_adapter(host_model(model_dir), adapter_dir)


@pytest.mark.parametrize("field, value", [("use_dora", True), ("peft_type", "IA3"), ("bias", "all"),
                                          ("modules_to_save", ["lm_head"]), ("rank_pattern", {"q_proj": 8})])
def test_unsupported_peft_features_fail(model_dir, adapter_dir, field, value):
    config = json.loads((adapter_dir / lora.CONFIG_NAME).read_text())
    config[field] = value
    (adapter_dir / lora.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field):
        lora.load_adapter(host_model(model_dir), adapter_dir)


@pytest.mark.parametrize("text, message", [("{not json", "not valid JSON"),
                                           ('{"peft_type": "LORA", "r": 4}', "lacks")])
def test_broken_config_fails(model_dir, adapter_dir, text, message):
    (adapter_dir / lora.CONFIG_NAME).write_text(text)
    with pytest.raises(ValueError, match=message):
        lora.load_adapter(host_model(model_dir), adapter_dir)


def test_not_an_adapter_dir_and_double_load_fail(model_dir, adapter_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        lora.load_adapter(host_model(model_dir), tmp_path / "nowhere")
    model = host_model(model_dir)
    lora.load_adapter(model, adapter_dir)
    with pytest.raises(ValueError, match="already has LoRA"):
        lora.load_adapter(model, adapter_dir)


def test_save_refuses_what_a_peft_config_cannot_describe(model_dir, tmp_path):
    model = host_model(model_dir)
    with pytest.raises(ValueError, match="no LoRA layers"):
        lora.save_adapter(model, tmp_path)
    lora.inject_lora(model, r=4, target_modules=["q_proj"], layers=[0])
    lora.inject_lora(model, r=4, target_modules=["v_proj"], layers=[2])  # PEFT would add q_proj in 2
    with pytest.raises(ValueError, match="cannot be described"):
        lora.save_adapter(model, tmp_path)
    lora.inject_lora(model, r=8, target_modules=["k_proj"])
    with pytest.raises(ValueError, match="differ in"):
        lora.save_adapter(model, tmp_path)
    with pytest.raises(ValueError, match="float dtype"):
        lora.save_adapter(model, tmp_path, dtype=torch.int8)


# --- the real base model (slow)


@pytest.mark.slow
def test_real_model_adapter_round_trips_with_peft(tmp_path):
    import defaults
    if not (defaults.MODEL_DIR / "config.json").exists():
        pytest.skip(f"no base model at {defaults.MODEL_DIR}; run get_model.py first")
    model = Transformer.from_pretrained(defaults.MODEL_DIR)
    assert len(lora.inject_lora(model, r=32, alpha=32, layers=lora.last_layers(model, 8))) == 7 * 8
    randomize_b(model)
    ids = torch.randint(0, 1000, (1, 16))
    ours = logits(model, ids)
    lora.save_adapter(model, tmp_path, base_model_name_or_path=str(defaults.MODEL_DIR))
    del model
    peft_model = peft.PeftModel.from_pretrained(hf_model(defaults.MODEL_DIR), tmp_path).eval()
    torch.testing.assert_close(logits(peft_model, ids), ours, atol=1e-3, rtol=0)  # our forward vs transformers
    assert (logits(peft_model, ids).argmax(-1) == ours.argmax(-1)).all()
