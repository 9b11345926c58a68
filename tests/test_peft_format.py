"""Tests for peft_format.py on a tiny random Qwen2: adapters round-trip with Hugging Face PEFT in both
directions, bf16 copies, the `convert` command line, strict loading with clear errors, load_merged.
Model helpers come from tests/test_lora.py."""

import json
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import lora
from common import defaults
from grisp import peft_format
from model import Transformer
from tests.test_lora import (  # noqa: F401  (the same fixtures)
    EXACT,
    IDS,
    LAYERS,
    host_model,
    logits,
    model_dir,
    one_thread_and_a_seed,
    randomize_b,
)
from tests.tiny import make_model_dir

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def hf_model(model_dir) -> torch.nn.Module:
    """The reference: transformers' Qwen2ForCausalLM with the same weights, for PEFT."""
    return transformers.Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


# --- adapters: our files <-> PEFT


@pytest.mark.parametrize("layers", [None, [1, 2]])
def test_our_adapter_loads_in_peft_with_the_same_logits(model_dir, tmp_path, layers):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, dropout=0.1, layers=layers)
    randomize_b(model)
    ours = logits(model, IDS)
    peft_format.save_adapter(model, tmp_path, base_model_name_or_path="tiny-qwen2")
    config = json.loads((tmp_path / peft_format.CONFIG_NAME).read_text())
    assert config["layers_to_transform"] == layers and config["lora_dropout"] == 0.1

    peft_model = peft.PeftModel.from_pretrained(hf_model(model_dir), tmp_path).eval()
    assert peft_model.peft_config["default"].r == 4
    assert peft_model.peft_config["default"].layers_to_transform == layers
    n_lora = sum(1 for n, _ in peft_model.named_parameters() if ".lora_" in n)
    assert n_lora == len(lora.lora_state_dict(model))  # PEFT built exactly our layers
    torch.testing.assert_close(logits(peft_model, IDS), ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layers, n_layers", [(None, LAYERS), ([0, 2], 2), (1, 1)])  # PEFT allows an int
def test_peft_adapter_loads_here_with_the_same_logits(model_dir, tmp_path, layers, n_layers):
    config = peft.LoraConfig(
        r=4,
        lora_alpha=16,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
        layers_to_transform=layers,
        init_lora_weights=False,
    )  # random A and B
    peft_model = peft.get_peft_model(hf_model(model_dir), config).eval()
    expected = logits(peft_model, IDS)
    peft_model.save_pretrained(tmp_path)

    model = host_model(model_dir)
    assert not torch.allclose(logits(model, IDS), expected, atol=1e-3)
    loaded = peft_format.load_adapter(model, tmp_path)
    assert loaded["lora_alpha"] == 16
    assert len(lora.lora_layers(model)) == 5 * n_layers
    torch.testing.assert_close(logits(model, IDS), expected, atol=1e-5, rtol=0)


def test_bf16_save_round_trips(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8)
    randomize_b(model)
    peft_format.save_adapter(model, tmp_path, dtype=torch.bfloat16)
    saved = load_file(tmp_path / peft_format.WEIGHTS_NAME)
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in saved

    fresh = host_model(model_dir)
    peft_format.load_adapter(fresh, tmp_path)
    for name, p in lora.lora_state_dict(fresh).items():
        assert p.dtype == torch.float32
        assert torch.equal(p, lora.lora_state_dict(model)[name].to(torch.bfloat16).float())
    peft_model = peft.PeftModel.from_pretrained(hf_model(model_dir), tmp_path).eval()
    torch.testing.assert_close(logits(peft_model, IDS), logits(fresh, IDS), atol=1e-5, rtol=0)


def test_convert_casts_weights_and_renames_the_base_model(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, layers=[1, 2])
    randomize_b(model)
    peft_format.save_adapter(model, tmp_path / "fp32", base_model_name_or_path="/local/path")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grisp.peft_format",
            "convert",
            str(tmp_path / "fp32"),
            str(tmp_path / "bf16"),
            "--dtype",
            "bfloat16",
            "--base-model",
            "org/tiny-qwen2",
        ],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    config = peft_format.read_adapter_config(tmp_path / "bf16")
    assert config["base_model_name_or_path"] == "org/tiny-qwen2" and config["layers_to_transform"] == [1, 2]
    saved = load_file(tmp_path / "bf16" / peft_format.WEIGHTS_NAME)
    original = load_file(tmp_path / "fp32" / peft_format.WEIGHTS_NAME)
    assert saved.keys() == original.keys()
    assert all(
        saved[k].dtype == torch.bfloat16 and torch.equal(saved[k], original[k].to(torch.bfloat16))
        for k in saved
    )
    missing = subprocess.run(
        [sys.executable, "-m", "grisp.peft_format", "convert", str(tmp_path / "none"), str(tmp_path / "x")],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0 and "is not an adapter directory" in missing.stderr


# --- strict loading


@pytest.fixture
def adapter_dir(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    randomize_b(model)
    return peft_format.save_adapter(model, tmp_path / "adapter")


def edit_weights(adapter_dir, edit) -> None:
    path = adapter_dir / peft_format.WEIGHTS_NAME
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_key_fails_and_leaves_the_model_unchanged(model_dir, adapter_dir):
    edit_weights(
        adapter_dir, lambda t: t.pop("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight")
    )
    model = host_model(model_dir)
    with pytest.raises(ValueError, match=r"1 missing \['model.layers.1.self_attn.v_proj.lora_B'\]"):
        peft_format.load_adapter(model, adapter_dir)
    assert not lora.lora_layers(model)
    assert torch.equal(logits(model, IDS), logits(host_model(model_dir), IDS))


def test_unexpected_key_fails(model_dir, adapter_dir):
    def add(tensors):
        tensors["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"] = torch.zeros(4, 32)

    edit_weights(adapter_dir, add)
    with pytest.raises(ValueError, match="1 unexpected"):
        peft_format.load_adapter(host_model(model_dir), adapter_dir)


def test_adapter_for_another_shape_fails(adapter_dir, tmp_path):
    wider_dir = make_model_dir(tmp_path / "wide", num_hidden_layers=LAYERS, hidden_size=128)
    wider = Transformer.from_pretrained(wider_dir)
    with pytest.raises(ValueError, match="different base model"):
        peft_format.load_adapter(wider, adapter_dir)
    assert not lora.lora_layers(wider)


def test_adapter_for_another_architecture_fails(model_dir, adapter_dir):
    config = json.loads((adapter_dir / peft_format.CONFIG_NAME).read_text())
    config["target_modules"] = ["c_attn"]  # GPT-2's names
    (adapter_dir / peft_format.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="matched no module"):
        peft_format.load_adapter(host_model(model_dir), adapter_dir)


@pytest.mark.parametrize(
    "field, value",
    [
        ("use_dora", True),
        ("peft_type", "IA3"),
        ("bias", "all"),
        ("modules_to_save", ["lm_head"]),
        ("rank_pattern", {"q_proj": 8}),
    ],
)
def test_unsupported_peft_features_fail(model_dir, adapter_dir, field, value):
    config = json.loads((adapter_dir / peft_format.CONFIG_NAME).read_text())
    config[field] = value
    (adapter_dir / peft_format.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field):
        peft_format.load_adapter(host_model(model_dir), adapter_dir)


@pytest.mark.parametrize(
    "text, message", [("{not json", "not valid JSON"), ('{"peft_type": "LORA", "r": 4}', "lacks")]
)
def test_broken_config_fails(model_dir, adapter_dir, text, message):
    (adapter_dir / peft_format.CONFIG_NAME).write_text(text)
    with pytest.raises(ValueError, match=message):
        peft_format.load_adapter(host_model(model_dir), adapter_dir)


def test_not_an_adapter_dir_and_double_load_fail(model_dir, adapter_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        peft_format.load_adapter(host_model(model_dir), tmp_path / "nowhere")
    model = host_model(model_dir)
    peft_format.load_adapter(model, adapter_dir)
    with pytest.raises(ValueError, match="already has LoRA"):
        peft_format.load_adapter(model, adapter_dir)


def test_load_merged_equals_the_loaded_adapter_with_plain_linear_layers(model_dir, adapter_dir):
    with_lora = host_model(model_dir, torch.float64)
    peft_format.load_adapter(with_lora, adapter_dir)
    merged = host_model(model_dir, torch.float64)
    config = peft_format.load_merged(merged, adapter_dir)
    assert config["r"] == 4 and not lora.lora_layers(merged)
    assert type(merged.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    torch.testing.assert_close(logits(merged, IDS), logits(with_lora, IDS), **EXACT)


def test_an_adapter_of_another_base_model_loads_with_a_warning(model_dir, adapter_dir, tmp_path):
    base = shutil.copytree(model_dir, tmp_path / "base")
    peft_format.convert_adapter(
        adapter_dir, tmp_path / "coder", base_model_name_or_path="Qwen/Qwen2.5-Coder-0.5B-Instruct"
    )
    with warnings.catch_warnings():  # get_model.py's manifest unknown: nothing to compare
        warnings.simplefilter("error")
        peft_format.load_for_inference(base, tmp_path / "coder", "float32")
    for repo, warns in [("Qwen/Qwen2.5-Coder-0.5B-Instruct", False), ("Qwen/Qwen2.5-0.5B-Instruct", True)]:
        (base / "get_model.json").write_text(json.dumps({"args": {"hf_repo": repo}}))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            peft_format.load_for_inference(base, tmp_path / "coder", "float32")
        said = [str(w.message) for w in caught]
        assert (
            any("was trained on Qwen/Qwen2.5-Coder-0.5B-Instruct" in m and repo in m for m in said) == warns
        ), said


def test_save_refuses_what_a_peft_config_cannot_describe(model_dir, tmp_path):
    model = host_model(model_dir)
    with pytest.raises(ValueError, match="no LoRA layers"):
        peft_format.save_adapter(model, tmp_path)
    lora.inject_lora(model, r=4, target_modules=["q_proj"], layers=[0])
    lora.inject_lora(model, r=4, target_modules=["v_proj"], layers=[2])  # PEFT would add q_proj in 2
    with pytest.raises(ValueError, match="cannot be described"):
        peft_format.save_adapter(model, tmp_path)
    lora.inject_lora(model, r=8, target_modules=["k_proj"])
    with pytest.raises(ValueError, match="differ in"):
        peft_format.save_adapter(model, tmp_path)
    with pytest.raises(ValueError, match="float dtype"):
        peft_format.save_adapter(model, tmp_path, dtype=torch.int8)


# --- the real base model (slow)


@pytest.mark.slow
def test_real_model_adapter_round_trips_with_peft(tmp_path):
    from common import defaults

    if not (defaults.MODEL_DIR / "config.json").exists():
        pytest.skip(f"no base model at {defaults.MODEL_DIR}; run get_model.py first")
    model = Transformer.from_pretrained(defaults.MODEL_DIR)
    assert len(lora.inject_lora(model, r=32, alpha=32, layers=lora.last_layers(model, 8))) == 7 * 8
    randomize_b(model)
    ids = torch.randint(0, 1000, (1, 16))
    ours = logits(model, ids)
    peft_format.save_adapter(model, tmp_path, base_model_name_or_path=str(defaults.MODEL_DIR))
    del model
    peft_model = peft.PeftModel.from_pretrained(hf_model(defaults.MODEL_DIR), tmp_path).eval()
    torch.testing.assert_close(
        logits(peft_model, ids), ours, atol=1e-3, rtol=0
    )  # our forward vs transformers
    assert (logits(peft_model, ids).argmax(-1) == ours.argmax(-1)).all()


def test_prompt_format_is_saved_beside_the_adapter_and_travels_with_convert(model_dir, tmp_path):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, layers=[1])
    peft_format.save_adapter(model, tmp_path / "old")  # as adapters were saved before the file existed
    assert peft_format.read_prompt_format(tmp_path / "old") == "v1"
    peft_format.save_adapter(model, tmp_path / "new", prompt_format="v2")
    assert peft_format.read_prompt_format(tmp_path / "new") == "v2"
    peft_format.convert_adapter(tmp_path / "new", tmp_path / "copy", torch.bfloat16)
    assert peft_format.read_prompt_format(tmp_path / "copy") == "v2"
    assert peft_format.read_prompt_format(None) == "v2"  # the base model: the latest format
    peft.PeftModel.from_pretrained(hf_model(model_dir), tmp_path / "new")  # PEFT ignores our file
    (tmp_path / "new" / peft_format.GRISP_CONFIG_NAME).write_text('{"prompt_format": "v7"}')
    with pytest.raises(ValueError, match="unknown prompt_format 'v7'"):
        peft_format.read_prompt_format(tmp_path / "new")


def test_saving_over_an_adapter_replaces_every_file_and_a_failed_save_keeps_the_old_one(
    model_dir, tmp_path, monkeypatch
):
    model = host_model(model_dir)
    lora.inject_lora(model, r=4, alpha=8, layers=[1])
    peft_format.save_adapter(model, tmp_path / "a", prompt_format="v2")
    peft_format.save_adapter(
        model, tmp_path / "a"
    )  # no prompt format now: the old file must not speak for it
    assert peft_format.read_prompt_format(tmp_path / "a") == "v1"
    before = (tmp_path / "a" / peft_format.WEIGHTS_NAME).read_bytes()

    def killed(tensors, filename, metadata=None):  # a save cut off half way (a kill, a full disk)
        open(filename, "wb").write(b"\0" * 10)
        raise KeyboardInterrupt

    monkeypatch.setattr(peft_format, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        peft_format.save_adapter(model, tmp_path / "a")
    assert (tmp_path / "a" / peft_format.WEIGHTS_NAME).read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        peft_format.CONFIG_NAME,
        peft_format.WEIGHTS_NAME,
    ]


def test_the_committed_adapters_name_their_prompt_formats():
    assert (
        peft_format.read_prompt_format(defaults.REPO_DIR / "adapters" / "grisp-wwq-0.5b") == "v1"
    )  # the baseline
    assert peft_format.read_prompt_format(defaults.ADAPTER_DIR) == "v2"  # the default adapter
