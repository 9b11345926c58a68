"""Tests for cpu_speed.py: prepare_for_inference is exact (full forward and cached decoding, both
matmul forms of SplitLinear), converts only plain nn.Linear layers without copying weights, switches
the model to eval mode without gradients, and the int8 option quantises the layers it names only and
stays close; the precision each machine gets (native bf16 read from the CPU flags, mocked both ways).
Tiny random models from tests/tiny.py, tied and untied lm_head. (LoRA layers on this path:
tests/test_lora.py.)
"""
from pathlib import Path

import pytest
import torch

import model as M
from llm import cpu_speed
from llm.cpu_speed import SplitLinear, prepare_for_inference
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
    assert isinstance(model.lm_head, SplitLinear) == split
    torch.testing.assert_close(model(x), before, atol=1e-5, rtol=0)
    cache = model.new_cache(2)
    steps = [model(x[:, :4], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), before, atol=1e-5, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("max_rows", [0, 1000], ids=["F.linear", "bmm"])
@pytest.mark.parametrize("bias", [True, False])
def test_split_linear_equals_the_linear_in_both_forms(max_rows, bias):
    linear = torch.nn.Linear(12, 8, bias=bias)
    x = torch.randn(3, 5, 12)
    expected = linear(x)
    split = SplitLinear(linear, parts=4, max_rows=max_rows)
    assert split.weight.data_ptr() == linear.weight.data_ptr()  # a view, no copy
    torch.testing.assert_close(split(x), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(split(x[:1, :1]), expected[:1, :1], atol=1e-6, rtol=0)


def test_split_linear_picks_the_form_by_row_count(monkeypatch):
    """Few rows go to torch.bmm, more than max_rows to F.linear."""
    calls = []
    monkeypatch.setattr(torch, "bmm", lambda *a: calls.append("bmm") or torch.matmul(*a))
    monkeypatch.setattr(torch, "baddbmm", lambda b, x, w: calls.append("bmm") or b + torch.matmul(x, w))
    split = SplitLinear(torch.nn.Linear(4, 6), parts=2, max_rows=8)
    split(torch.randn(2, 4, 4))  # 8 rows
    split(torch.randn(3, 3, 4))  # 9 rows
    assert calls == ["bmm"]


@torch.no_grad()
def test_int8_quantises_all_but_down_proj_and_stays_close(model_dir):
    model = M.Transformer.from_pretrained(model_dir)
    x = tokens(2, 9, seed=3)
    before = model(x)
    prepare_for_inference(model, int8=True)
    block = model.model.layers[0]
    assert isinstance(block.mlp.down_proj, SplitLinear)
    for layer in (block.self_attn.q_proj, block.mlp.gate_proj, block.mlp.up_proj, block.self_attn.o_proj):
        assert isinstance(layer, torch.ao.nn.quantized.dynamic.Linear)
    assert isinstance(model.lm_head, SplitLinear) == model.args.tie_word_embeddings
    after = model(x)
    assert not torch.equal(after, before)  # really quantised
    # int8 with per-channel scales: close to float32 on a tiny random model (a wrong scale gives ~1)
    relative_error = (after - before).pow(2).mean().sqrt() / before.pow(2).mean().sqrt()
    assert relative_error < 0.15, relative_error  # measured: 0.08


# ---------------------------------------------------------------------------- precision per machine
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
AVX2 = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu sse2 avx2 fma avx512f\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_speed.native_bf16(cpu_speed.cpu_flags(EPYC))
    assert cpu_speed.native_bf16(cpu_speed.cpu_flags(GRAVITON))  # Arm's BF16 extension
    assert not cpu_speed.native_bf16(cpu_speed.cpu_flags(AVX2))  # AVX-512 without BF16: emulated, slow
    assert not cpu_speed.native_bf16(cpu_speed.cpu_flags(""))  # nothing readable: float32
    assert cpu_speed.cpu_name(EPYC) == "AMD EPYC 9R14"


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_precision_follows_the_cpu(monkeypatch, native, expected):
    monkeypatch.setattr(cpu_speed, "native_bf16", lambda flags=None: native)
    dtype, why = cpu_speed.pick_dtype("auto", torch.device("cpu"))
    assert dtype == expected and ("native bf16" in why)
    assert cpu_speed.pick_dtype("float32", torch.device("cpu"))[0] == torch.float32  # asked for: always
    assert cpu_speed.pick_dtype("bfloat16", torch.device("cpu"))[0] == torch.bfloat16
    assert cpu_speed.pick_dtype("auto", torch.device("cuda"))[0] == torch.bfloat16
