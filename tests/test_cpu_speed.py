"""Tests for cpu_speed.py: prepare_for_inference is exact (full forward and cached decoding, both
matmul forms of SplitLinear), converts only plain nn.Linear layers without copying weights, switches
the model to eval mode without gradients, and the int8 option quantises the layers it names only and
stays close; the precision each machine gets (native bf16 read from the CPU flags, mocked both ways), for
training (pick_dtype) and inference (pick_precision) alike.
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
    steps = [model(x[:, :4], cache=cache)] + [model(x[:, t : t + 1], cache=cache) for t in range(4, 9)]
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


@torch.no_grad()
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_half_weight_linear_is_the_fp16_weight_for_few_rows_and_float32_for_many(bias):
    linear = torch.nn.Linear(64, 48, bias=bias)
    half = cpu_speed.HalfWeightLinear(linear, max_rows=4)
    assert half.weight.data_ptr() == linear.weight.data_ptr()  # the float32 weight kept, not copied
    rounded = linear.weight.half().float()
    for rows in (1, 4):  # the fp16 weight
        x = torch.randn(rows, 2, 64)[:, 0]  # not contiguous
        torch.testing.assert_close(
            half(x), torch.nn.functional.linear(x, rounded, linear.bias), atol=1e-4, rtol=1e-4
        )
    x = torch.randn(5, 64)  # more rows than max_rows: float32, exact
    torch.testing.assert_close(half(x), linear(x), atol=0, rtol=0)
    assert half(torch.randn(2, 2, 64)).shape == (2, 2, 48)


@torch.no_grad()
def test_fp16_weights_convert_every_linear_and_stay_close(model_dir):
    model = M.Transformer.from_pretrained(model_dir)
    x = tokens(1, 9, seed=3)
    cache = model.new_cache(1, 12)
    before = model(x, cache=cache, logits_at=-1)
    prepare_for_inference(model, fp16_weights=True)
    block = model.model.layers[0]
    for layer in (block.self_attn.q_proj, block.self_attn.v_proj, block.mlp.down_proj, model.lm_head):
        assert isinstance(layer, cpu_speed.HalfWeightLinear)
    after = model(x, cache=model.new_cache(1, 12), logits_at=-1)  # 9 rows: the fp16 form
    relative_error = (after - before).pow(2).mean().sqrt() / before.pow(2).mean().sqrt()
    assert 0 < relative_error < 0.005, relative_error  # measured: 0.0015 (weight-only int8: 0.03)


# ---------------------------------------------------------------------------- precision per machine
EPYC = (
    "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
)
AVX2 = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu sse2 avx2 fma avx512f\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_speed.native_bf16(cpu_speed.cpu_flags(EPYC))
    assert cpu_speed.native_bf16(cpu_speed.cpu_flags(GRAVITON))  # Arm's BF16 extension
    assert not cpu_speed.native_bf16(cpu_speed.cpu_flags(AVX2))  # AVX-512 without BF16: emulated, slow
    assert not cpu_speed.native_bf16(cpu_speed.cpu_flags(""))  # nothing readable: float32
    assert cpu_speed.cpu_name(EPYC) == "AMD EPYC 9R14"


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_precision_follows_the_cpu(mock_native_bf16, native, expected):
    mock_native_bf16(native)
    dtype, why = cpu_speed.pick_dtype("auto", torch.device("cpu"))
    assert dtype == expected and ("native bf16" in why)
    assert cpu_speed.pick_dtype("float32", torch.device("cpu"))[0] == torch.float32  # asked for: always
    assert cpu_speed.pick_dtype("bfloat16", torch.device("cpu"))[0] == torch.bfloat16


@pytest.mark.parametrize(
    "capability, expected",
    [((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16), ((7, 5), torch.float32), ((7, 0), torch.float32)],
)
def test_auto_precision_on_a_gpu_follows_its_compute_capability(monkeypatch, capability, expected):
    # a T4 (7.5) or V100 (7.0) has no native bf16 matmuls: auto took bf16 on every GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert cpu_speed.pick_dtype("auto", torch.device("cuda"))[0] == expected
    assert cpu_speed.pick_precision("auto", torch.device("cuda"))[0] == str(expected).removeprefix("torch.")


@pytest.mark.parametrize("precision", ["int8", "fp16-weights"])
def test_cpu_only_precisions_are_refused_off_the_cpu(precision):
    from grisp import pipeline

    for device in ("cuda", "mps"):
        with pytest.raises(ValueError, match=f"{precision} runs on a CPU only"):
            cpu_speed.pick_precision(precision, torch.device(device))
        with pytest.raises(
            pipeline.GrispError, match=f"{precision} runs on a CPU only"
        ):  # a clean message in infer/serve
            pipeline._precision(precision, torch.device(device))


def test_fp16_weights_are_refused_without_fbgemm(monkeypatch):
    monkeypatch.setattr(cpu_speed, "has_fbgemm", lambda: False)  # an Arm CPU's torch
    with pytest.raises(ValueError, match="needs torch's fbgemm"):
        cpu_speed.pick_precision("fp16-weights", torch.device("cpu"))


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_inference_precision_auto_is_the_training_detection(mock_native_bf16, native, expected):
    mock_native_bf16(native)
    cpu = torch.device("cpu")
    precision, why = cpu_speed.pick_precision("auto", cpu)
    assert precision == expected and why == cpu_speed.pick_dtype("auto", cpu)[1]  # one detection, one reason
    for asked in ("float32", "bfloat16", "int8", "fp16-weights"):  # asked for: as asked, on every CPU
        assert cpu_speed.pick_precision(asked, cpu)[0] == asked
    with pytest.raises(ValueError, match="auto, float32, bfloat16, int8, fp16-weights"):
        cpu_speed.pick_precision("float16", cpu)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory) -> Path:
    """An adapter on every linear layer of the untied tiny model whose B is far from 0 (it changes the output)."""
    import lora
    from grisp import peft_format

    model_dir = make_model_dir(tmp_path_factory.mktemp("tiny-for-adapter"))
    model = M.Transformer.from_pretrained(model_dir)
    torch.manual_seed(0)  # lora_A's initialisation
    lora.inject_lora(model, r=4, alpha=8)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.copy_(
                torch.randn(layer.lora_B.shape, generator=torch.Generator().manual_seed(1)) * 0.3
            )
    return peft_format.save_adapter(model, tmp_path_factory.mktemp("adapter") / "adapter"), model_dir


def test_bfloat16_weights_are_the_float32_merge_rounded_once(adapter_dir):
    from grisp.peft_format import load_for_inference

    adapter, model_dir = adapter_dir
    in_float32 = load_for_inference(model_dir, adapter, "float32").state_dict()
    in_bfloat16 = load_for_inference(model_dir, adapter, "bfloat16").state_dict()
    assert in_bfloat16.keys() == in_float32.keys()
    for (
        name,
        weight,
    ) in in_bfloat16.items():  # merging in bf16 would round the base and the LoRA product apart
        assert weight.dtype == torch.bfloat16 and torch.equal(weight, in_float32[name].to(torch.bfloat16)), (
            name
        )


@torch.no_grad()
def test_bfloat16_picks_the_float32_token_wherever_float32_is_clear(adapter_dir):
    """The answers of a bf16 model match float32's where they should: its logits stay within bf16's
    rounding of float32's, and its next token (prefill and cached decoding) is float32's wherever
    float32's best token leads the second by more than that rounding."""
    from grisp.peft_format import load_for_inference

    adapter, model_dir = adapter_dir
    in_float32, in_bfloat16 = (load_for_inference(model_dir, adapter, p) for p in ("float32", "bfloat16"))
    ids = tokens(4, 24, seed=3)
    expected, got = in_float32(ids), in_bfloat16(ids).float()  # [B, T, V]
    error = (got - expected).abs().max()
    assert (
        error < 0.1 * expected.abs().max()
    )  # bf16 keeps 8 bits: ~0.4% per rounding, dozens in a row (here ~4%)
    top2 = expected.topk(2, dim=-1).values
    clear = top2[..., 0] - top2[..., 1] > 2 * (got - expected).abs().amax(-1)  # [B, T]
    print(f"bf16 logits off by {error:.3f} at most; {clear.float().mean():.0%} of positions are clear")
    assert clear.float().mean() > 0.5  # the check below covers most positions
    assert torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])
    # cached decoding: the KV cache is bf16 too, the steps see the same logits as the full pass
    cache = in_bfloat16.new_cache(4, 24)
    assert cache.k.dtype == torch.bfloat16
    steps = torch.cat(
        [in_bfloat16(ids[:, :8], cache=cache)]
        + [in_bfloat16(ids[:, t : t + 1], cache=cache) for t in range(8, 24)],
        dim=1,
    ).float()
    torch.testing.assert_close(steps, got, atol=2 * float(error), rtol=0)


def test_bfloat16_weights_stay_plain_linear_layers(model_dir):
    """The split bmm is for float32 weights; in bf16 F.linear is faster (docs/cpu_speed.md 1.6)."""
    in_bfloat16 = prepare_for_inference(M.Transformer.from_pretrained(model_dir, torch.bfloat16))
    assert not any(isinstance(m, SplitLinear) for m in in_bfloat16.modules())
    assert type(in_bfloat16.model.layers[0].mlp.up_proj) is torch.nn.Linear
    in_float32 = prepare_for_inference(M.Transformer.from_pretrained(model_dir))
    assert isinstance(in_float32.model.layers[0].mlp.up_proj, SplitLinear)


@torch.no_grad()
def test_fp16_weights_load_the_merged_adapter_into_half_weight_layers(adapter_dir):
    from grisp.peft_format import load_for_inference

    adapter, model_dir = adapter_dir
    in_float32 = load_for_inference(model_dir, adapter, "float32")
    in_fp16 = load_for_inference(model_dir, adapter, "fp16-weights")
    layer = in_fp16.model.layers[0].mlp.down_proj
    assert isinstance(layer, cpu_speed.HalfWeightLinear)
    # the float32 weight is the adapter merged in float32, as without fp16 (the fp16 copy is made from it)
    assert torch.equal(layer.weight, in_float32.model.layers[0].mlp.down_proj.weight)
    x = tokens(1, 9, seed=5)
    a, b = in_float32(x, logits_at=-1), in_fp16(x, logits_at=-1)
    assert 0 < ((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()) < 0.005
