"""Tiny random Qwen2 model directories for tests (no downloads, a fraction of a second to make).

`make_model_dir(path)` writes what a Hugging Face Qwen2 directory holds: config.json,
generation_config.json, model.safetensors (or shards with model.safetensors.index.json) with the
Qwen2ForCausalLM key names, and a byte-level BPE tokenizer.json with Qwen's special tokens.
Weights are drawn from a seeded generator and are large enough (std 0.2, random norm weights and
biases) that a wrong rotary sign or a missing bias changes the logits visibly.

    from tests.tiny import make_model_dir
    model_dir = make_model_dir(tmp_path / "tiny", tie_word_embeddings=True)
"""

import json
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import save_file

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 in the tiny vocabulary
TINY_CONFIG = dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=512,
    hidden_act="silu",
    use_sliding_window=False,
    attention_dropout=0.0,
    bos_token_id=0,
    eos_token_id=2,
    torch_dtype="float32",
)


def random_state_dict(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights named like Hugging Face's Qwen2ForCausalLM state_dict (no lm_head when tied)."""
    g = torch.Generator().manual_seed(seed)
    C, F_, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    D = C // config["num_attention_heads"]
    KV = config["num_key_value_heads"] * D

    def rand(*shape, mean=0.0):
        return mean + 0.2 * torch.randn(*shape, generator=g)

    state = {"model.embed_tokens.weight": rand(V, C), "model.norm.weight": rand(C, mean=1.0)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state |= {
            p + "input_layernorm.weight": rand(C, mean=1.0),
            p + "post_attention_layernorm.weight": rand(C, mean=1.0),
            p + "self_attn.q_proj.weight": rand(C, C),
            p + "self_attn.q_proj.bias": rand(C),
            p + "self_attn.k_proj.weight": rand(KV, C),
            p + "self_attn.k_proj.bias": rand(KV),
            p + "self_attn.v_proj.weight": rand(KV, C),
            p + "self_attn.v_proj.bias": rand(KV),
            p + "self_attn.o_proj.weight": rand(C, C),
            p + "mlp.gate_proj.weight": rand(F_, C),
            p + "mlp.up_proj.weight": rand(F_, C),
            p + "mlp.down_proj.weight": rand(C, F_),
        }
    if not config.get("tie_word_embeddings", False):
        state["lm_head.weight"] = rand(V, C)
    return state


QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)  # Qwen2.5's pre-tokenizer regex (keeps `_property` one word)
CORPUS = [
    "What is the capital of France? Paris is the capital of France.",
    "SELECT ?x WHERE { wd:Q42 wdt:P19 ?x . }",
    "You are a helpful assistant.",
]


def tiny_tokenizer(
    vocab_size: int, corpus: list[str] = CORPUS, qwen_split: bool = False
) -> tokenizers.Tokenizer:
    """A byte-level BPE (like Qwen's) trained on a few sentences, with Qwen's special tokens; with
    `qwen_split` its pre-tokenizer is Qwen2.5's own (GPT-2's otherwise, which cuts words differently)."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    if qwen_split:
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
            [
                tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT), "isolated"),
                tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus * 10, trainer)
    return tok


def make_model_dir(
    path: Path, tie_word_embeddings: bool = False, shards: int = 1, seed: int = 0, **config_overrides
) -> Path:
    """Write a tiny random Qwen2 model directory at `path` and return it."""
    path.mkdir(parents=True, exist_ok=True)
    config = TINY_CONFIG | {"tie_word_embeddings": tie_word_embeddings} | config_overrides
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "pad_token_id": 0, "eos_token_id": [2, 0]})
    )
    state = random_state_dict(config, seed)
    if shards == 1:
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    else:  # Hugging Face's sharded layout: model-0000i-of-0000n.safetensors + an index of key -> file
        keys, weight_map = sorted(state), {}
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = keys[i::shards]
            save_file({k: state[k] for k in part}, path / name, metadata={"format": "pt"})
            weight_map |= {k: name for k in part}
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    tiny_tokenizer(config["vocab_size"]).save(str(path / "tokenizer.json"))
    return path
