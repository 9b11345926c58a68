"""train.py, grisp/trainer.py, loss.py and checkpoint.py on a tiny random Qwen2: the losses against hand computations
and full logits, overfitting a handful of samples, exact resumption after an interruption, batching,
the schedule, and the command line."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lora
import train
from common.jsonl import read_jsonl
from grisp import checkpoint, loss, peft_format, trainer
from grisp import samples as samples_module
from grisp.prompts import Alternative, rerank_messages, skeleton_messages
from llm.tokenizer import Tokenizer
from model import Transformer
from tests.conftest import free_port
from tests.test_samples import tiny  # noqa: F401 (the tiny index and records, a fixture)
from tests.tiny import make_model_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny"))


def make_samples(n: int, epoch: int = 0, prefix: str = "r") -> list[dict]:
    """n records' worth of samples: a short skeleton and a 2-4 alternative re-ranking prompt each."""
    samples = []
    for i in range(n):
        alternatives = [
            Alternative(f"http://x/Q{j}", f"wd:Q{j}", f"Paris {j}") for j in range(2 + (i + epoch) % 3)
        ]
        messages, identifiers = rerank_messages(
            f"Where {i}?", "SELECT ?x WHERE { <rep>Paris</rep> ?p ?x }", alternatives
        )
        samples += [
            {
                "id": f"{prefix}{i}",
                "epoch": epoch,
                "task": "skeleton",
                "messages": skeleton_messages(f"What {i}?"),
                "target": f"SELECT ?x WHERE {{ wd:Q{i + epoch} wdt:P19 ?x . }}",
            },
            {
                "id": f"{prefix}{i}",
                "epoch": epoch,
                "task": "rerank",
                "messages": messages,
                "target": identifiers[(i + epoch) % len(identifiers)],
                "identifiers": identifiers,
                "prompt_format": "v2",
            },
        ]
    return samples


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_args(model_dir: Path, tmp_path: Path, samples: Path, *extra: str):
    """Parsed train.py flags for a quick tiny run (short system prompts keep sequences small; 4 epochs and
    float32 on every CPU unless `extra` says otherwise)."""
    return train.make_parser().parse_args(
        [
            "--samples",
            str(samples),
            "--model-dir",
            str(model_dir),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--val-fraction",
            "0",
            "--lora-r",
            "4",
            "--lora-alpha",
            "8",
            "--batch-size",
            "2",
            "--micro-batch-size",
            "1",
            "--checkpoint-every",
            "100",
            "--threads",
            "1",
            "--epochs",
            "4",
            "--dtype",
            "float32",
            *extra,
        ]
    )


def log(tmp_path: Path, name: str = "grisp") -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "runs" / name / "log.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- losses
def test_restricted_cross_entropy_by_hand():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0, 3.0], [0.0, 0.0, 4.0, 1.0, 2.0]])
    choices = torch.tensor([[1, 2, 3], [4, 0, -1]])  # row 1: only two identifiers present
    targets = torch.tensor([2, 0])
    expected = [
        -math.log(math.exp(-1.0) / (math.exp(2.0) + math.exp(0.5) + math.exp(-1.0))),
        -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0))),
    ]
    assert loss.restricted_cross_entropy(logits, choices, targets).tolist() == pytest.approx(
        expected, abs=1e-6
    )


@pytest.mark.parametrize("weighting", loss.WEIGHTINGS)
def test_sample_losses_equal_a_loop_over_full_logits(model_dir, weighting):
    tokenizer = Tokenizer(model_dir)
    model = Transformer.from_pretrained(model_dir)
    samples = make_samples(3)
    encoded = [loss.encode(s, tokenizer) for s in samples]
    losses, correct = loss.sample_losses(model, loss.collate(encoded, tokenizer.pad_id, weighting))
    for b, (s, e) in enumerate(zip(samples, encoded)):
        with torch.no_grad():
            logits = model(torch.tensor([e["ids"]]))[0].double()  # [T, V], the sample alone: no padding
        P = e["n_prompt"]
        if s["task"] == "skeleton":
            answer = tokenizer.encode(s["target"]) + [tokenizer.im_end_id]
            assert e["ids"][P:] == answer
            expected = sum(-logits[P - 1 + t].log_softmax(-1)[a] for t, a in enumerate(answer))
            expected /= len(answer) if weighting == "per-sample" else 1  # a mean, or the tokens' sum
            assert not correct[b]
        else:
            ids = [tokenizer.encode(i)[0] for i in s["identifiers"]]
            picked = logits[P - 1, ids]
            expected = -picked.log_softmax(-1)[s["identifiers"].index(s["target"])]
            assert bool(correct[b]) == (int(picked.argmax()) == s["identifiers"].index(s["target"]))
        assert float(losses[b].detach()) == pytest.approx(float(expected), abs=1e-4)


class ConstantLogits(torch.nn.Module):
    """A "model" whose logits are 0 everywhere: every token CE is log V, every restricted CE log K."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.bias = vocab, torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens, cache=None, logits_at=None):
        return torch.zeros(int(logits_at.sum()), self.vocab) + self.bias


def test_loss_weightings_by_hand():
    V = 300
    skeleton = lambda n: {
        "task": "skeleton",
        "ids": [5] * (10 + n),
        "n_prompt": 10,  # n answer tokens
        "answer_at": list(range(10, 10 + n)),
        "choices": [],
        "target": -1,
    }
    rerank = lambda k: {
        "task": "rerank",
        "ids": [5] * 12,
        "n_prompt": 12,
        "answer_at": [],
        "choices": list(range(20, 20 + k)),
        "target": 0,
    }
    batch = [skeleton(3), skeleton(1), rerank(4)]
    model = ConstantLogits(V)
    for weighting, expected_losses, units in [
        ("reference", [3 * math.log(V), math.log(V), math.log(4)], [3, 1, 1]),
        ("per-sample", [math.log(V), math.log(V), math.log(4)], [1, 1, 1]),
    ]:
        losses, _ = loss.sample_losses(model, loss.collate(batch, 0, weighting))
        assert losses.tolist() == pytest.approx(expected_losses, abs=1e-5)
        assert [loss.units(s, weighting) for s in batch] == units
    # the batch loss: (3 + 1 token CEs + 1 row CE) / 5 under the reference weighting, a mean of 3 under per-sample
    reference = (4 * math.log(V) + math.log(4)) / 5
    per_sample = (2 * math.log(V) + math.log(4)) / 3
    for weighting, expected in (("reference", reference), ("per-sample", per_sample)):
        total = sum(loss.units(s, weighting) for s in batch)
        by_task = loss.backward_batch(
            model, batch, total, 2, weighting, 0, "cpu", torch.autocast("cpu", enabled=False)
        )
        assert sum(v for v, _ in by_task.values()) / total == pytest.approx(expected, abs=1e-5)
        assert by_task["skeleton"][1] == (4 if weighting == "reference" else 2) and by_task["rerank"][1] == 1


@pytest.mark.parametrize("weighting", loss.WEIGHTINGS)
def test_accumulated_micro_batches_equal_one_big_batch(model_dir, weighting):
    """The normaliser counts the units of the whole batch before the micro-batches: the accumulated
    gradient equals the gradient of the whole batch's loss computed at once, for any split."""
    tokenizer = Tokenizer(model_dir)
    encoded = [
        loss.encode(s, tokenizer) for s in make_samples(4)
    ]  # skeletons of different lengths + re-rankings
    encoded[0]["ids"] += encoded[0]["ids"][-3:]  # a longer skeleton: per-token and per-sample weights differ
    model = Transformer.from_pretrained(model_dir)
    total = sum(loss.units(s, weighting) for s in encoded)
    losses, _ = loss.sample_losses(model, loss.collate(encoded, tokenizer.pad_id, weighting))
    (losses.sum() / total).backward()
    whole = {n: p.grad.clone() for n, p in model.named_parameters()}
    for micro in (1, 3):
        model.zero_grad()
        loss.backward_batch(
            model,
            encoded,
            total,
            micro,
            weighting,
            tokenizer.pad_id,
            "cpu",
            torch.autocast("cpu", enabled=False),
        )
        assert all(
            torch.allclose(p.grad, whole[n], atol=1e-5, rtol=1e-5) for n, p in model.named_parameters()
        ), micro
    # and the two weightings really differ on this batch
    other = "per-sample" if weighting == "reference" else "reference"
    model.zero_grad()
    loss.backward_batch(
        model,
        encoded,
        sum(loss.units(s, other) for s in encoded),
        8,
        other,
        tokenizer.pad_id,
        "cpu",
        torch.autocast("cpu", enabled=False),
    )
    assert max(float((p.grad - whole[n]).abs().max()) for n, p in model.named_parameters()) > 1e-2


def shared_start_batch(vocab: int) -> tuple[list[int], list[dict]]:
    """Two agent-like samples and a re-ranking one that share a start of MIN_SHARED_PREFIX + 20 random
    tokens, then differ (their rests of 30, 12 and 9 tokens start with different tokens)."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(3, vocab, (loss.MIN_SHARED_PREFIX + 20,), generator=g).tolist()
    rest = lambda first, n: start + [first] + torch.randint(3, vocab, (n - 1,), generator=g).tolist()
    token_task = lambda ids: {
        "task": "agent",
        "ids": ids,
        "n_prompt": len(start) + 2,
        "answer_at": list(range(len(start) + 2, len(ids))),
        "choices": [],
        "target": -1,
    }
    rerank = {
        "task": "rerank",
        "ids": rest(5, 9),
        "n_prompt": len(start) + 9,
        "answer_at": [],
        "choices": [10, 11, 12, 13],
        "target": 2,
    }
    return start, [token_task(rest(3, 30)), token_task(rest(4, 12)), rerank]


@pytest.mark.parametrize("micro", [1, 2])
def test_a_shared_start_runs_once_and_the_gradient_stays_exact(model_dir, micro, monkeypatch):
    """Samples that share a long start (agent conversations: the tool definitions) run it once per
    batch (loss.SharedPrefix): losses and LoRA gradients, of every block, equal those of running each
    sample whole; without sending the gradient back through the start they would not."""
    torch.manual_seed(0)
    model = Transformer.from_pretrained(model_dir)
    lora.inject_lora(model, r=4, alpha=8)
    lora.mark_only_lora_trainable(model)
    for layer in lora.lora_layers(model).values():  # B = 0 at init would give A no gradient
        torch.nn.init.normal_(layer.lora_B, std=0.05)
    start, encoded = shared_start_batch(model.args.vocab_size)
    assert loss.shared_start(encoded) == len(start) and loss.shared_start(encoded[:1]) == len(start) + 1
    total = sum(loss.units(s, "reference") for s in encoded)
    losses, _ = loss.sample_losses(model, loss.collate(encoded, 0, "reference"))
    (losses.sum() / total).backward()
    whole = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    no_grad = torch.autocast("cpu", enabled=False)

    def shared_gradient():
        model.zero_grad()
        by_task = loss.backward_batch(model, encoded, total, micro, "reference", 0, "cpu", no_grad)
        assert sum(v for v, _ in by_task.values()) == pytest.approx(float(losses.detach().sum()), rel=1e-5)
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    shared = shared_gradient()
    assert all(torch.allclose(shared[n], whole[n], atol=1e-6, rtol=1e-4) for n in whole)
    monkeypatch.setattr(loss.SharedPrefix, "backward", lambda self: None)  # the start's own gradient left out
    assert max(float((g - whole[n]).abs().max()) for n, g in shared_gradient().items()) > 1e-4
    # validation: the same losses with and without the shared start
    with_start = loss.evaluate(
        model, encoded, 2, 0, "cpu", no_grad, "reference"
    )  # one start, two micro-batches
    monkeypatch.setattr(loss, "MIN_SHARED_PREFIX", 10**6)
    assert with_start == pytest.approx(
        loss.evaluate(model, encoded, 3, 0, "cpu", no_grad, "reference"), rel=1e-5
    )


def test_plan_steps_is_a_length_sorted_partition():
    lengths = [(7 * i) % 50 for i in range(103)]
    steps = trainer.plan_steps(lengths, batch_size=8, seed=0, epoch=1, pool=4)
    flat = [i for step in steps for i in step]
    assert len(steps) == 103 // 8 and all(len(s) == 8 for s in steps) and len(set(flat)) == len(flat)
    assert all(lengths[a] <= lengths[b] for s in steps for a, b in zip(s, s[1:]))
    assert steps == trainer.plan_steps(lengths, 8, 0, 1, 4) != trainer.plan_steps(lengths, 8, 0, 2, 4)


def test_warmup_then_cosine():
    lrs = [trainer.lr_at(step, 100, 1e-4, 0.05) for step in range(100)]
    assert lrs[0] == pytest.approx(2e-5) and lrs[4] == pytest.approx(1e-4) == max(lrs)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:])) and lrs[-1] < 1e-6


# ---------------------------------------------------------------------------- training runs
def test_tiny_model_overfits_a_handful_of_samples(model_dir, tmp_path):
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))  # 4 samples, 2 steps per epoch
    train.main(
        train_args(
            model_dir,
            tmp_path,
            samples,
            "--epochs",
            "25",
            "--lr",
            "1e-2",
            "--warmup",
            "0.1",
            "--lora-dropout",
            "0",
        )
    )
    losses = [r["loss"] for r in log(tmp_path) if "loss" in r]
    assert len(losses) == 50
    assert sum(losses[-4:]) / 4 < 0.1 * sum(losses[:2]) / 2, losses
    adapter = tmp_path / "runs" / "grisp" / "adapter"
    assert (
        tmp_path / "runs" / "grisp" / "latest"
    ).read_text() == "checkpoint-0000050"  # the end is resumable
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4


@pytest.mark.parametrize(
    "eval_every", ["0", "4"]
)  # validation after each epoch / every 4 steps and at step 0
def test_interrupted_and_resumed_run_equals_uninterrupted(model_dir, tmp_path, eval_every):
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(5, 0) + make_samples(5, 1))  # 5 steps per epoch
    val = write_jsonl(tmp_path / "v.jsonl", make_samples(2, 0, prefix="v"))
    common = [
        "--epochs",
        "3",
        "--lr",
        "5e-3",
        "--lora-dropout",
        "0.2",
        "--val-data",
        str(val),
        "--patience",
        "5",
        "--eval-every",
        eval_every,
    ]
    train.main(train_args(model_dir, tmp_path, samples, *common, "--name", "straight"))
    # interrupted mid-epoch 0, at the end of epoch 0 (before its validation), and mid-epoch 1
    for flags in (
        ["--stop-after", "3"],
        ["--resume", "--stop-after", "5"],
        ["--resume", "--stop-after", "7"],
        ["--resume"],
    ):
        train.main(train_args(model_dir, tmp_path, samples, *common, "--name", "interrupted", *flags))
    straight, interrupted = log(tmp_path, "straight"), log(tmp_path, "interrupted")
    assert sum("val_loss" in r for r in straight) == (3 if eval_every == "0" else 5)
    assert [r["step"] for r in interrupted] == [r["step"] for r in straight]  # no step lost or repeated
    for a, b in zip(straight, interrupted):
        assert a.get("loss") == pytest.approx(b.get("loss"), abs=1e-6) and a.get("val_loss") == pytest.approx(
            b.get("val_loss"), abs=1e-6
        )
    for name in ("adapter", "best"):
        a = load_file(tmp_path / "runs" / "straight" / name / "adapter_model.safetensors")
        b = load_file(tmp_path / "runs" / "interrupted" / name / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k), (
        "training changed the adapter"
    )


def test_a_last_epoch_shorter_than_the_first_ends_the_run(model_dir, tmp_path):
    # fresh samples per epoch: epoch 1 has a batch fewer than epoch 0, which planned the schedule (10 steps).
    # The run ends with epoch 1 (9 steps), validated once per epoch, not with a step of an epoch 2
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(5, 0) + make_samples(4, 1))
    val = write_jsonl(tmp_path / "v.jsonl", make_samples(1, 0, prefix="v"))
    train.main(train_args(model_dir, tmp_path, samples, "--epochs", "2", "--val-data", str(val)))
    records = log(tmp_path)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 10))
    assert [r["step"] for r in records if "val_loss" in r] == [5, 9]
    assert {r["epoch"] for r in records if "loss" in r} == {0, 1}
    assert (tmp_path / "runs" / "grisp" / "latest").read_text() == "checkpoint-0000009"


def test_a_portable_copy_continues_on_a_fresh_clone(model_dir, tmp_path):
    """A run stopped with --portable-dir; its copy placed in a fresh clone with no run directory; --resume
    continues to the end. Exact: step, schedule position, data order (each step's samples), RNG, logs. Not
    exact: the LoRA weights are the bf16-rounded ones, AdamW's moments start from zero, the lr is re-warmed."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(5, 0) + make_samples(5, 1))  # 5 steps per epoch
    val = write_jsonl(tmp_path / "v.jsonl", make_samples(2, 0, prefix="v"))
    common = [
        "--epochs",
        "2",
        "--lr",
        "5e-3",
        "--lora-dropout",
        "0.2",
        "--val-data",
        str(val),
        "--checkpoint-every",
        "2",
    ]
    train.main(train_args(model_dir, tmp_path, samples, *common, "--name", "straight"))
    straight = log(tmp_path, "straight")
    train.main(
        train_args(
            model_dir,
            tmp_path,
            samples,
            *common,
            "--portable-dir",
            str(tmp_path / "repo" / "runs"),
            "--stop-after",
            "7",
        )
    )  # mid-epoch 1, after epoch 0's validation made best/
    copy = tmp_path / "repo" / "runs" / "grisp"
    checkpoint_dir = tmp_path / "runs" / "grisp" / "checkpoint-0000007"
    assert sorted(p.name for p in copy.iterdir()) == [
        "config.json",
        "log.jsonl",
        "lora.safetensors",
        "rng-rank0.safetensors",
        "state.json",
        "stretches.jsonl",
    ]
    full, small = load_file(checkpoint_dir / checkpoint.LORA_FILE), load_file(copy / checkpoint.LORA_FILE)
    assert all(small[k].dtype == torch.bfloat16 and torch.equal(small[k], full[k].bfloat16()) for k in full)
    # a fresh clone on a new machine: the repository's copy only, no run directory
    (tmp_path / "runs").rename(tmp_path / "lost")
    (tmp_path / "repo").rename(tmp_path / "clone")
    train.main(
        train_args(
            model_dir,
            tmp_path,
            samples,
            *common,
            "--portable-dir",
            str(tmp_path / "clone" / "runs"),
            "--resume",
            "--rewarm-steps",
            "2",
        )
    )
    continued = log(tmp_path)
    assert [r["step"] for r in continued] == [r["step"] for r in straight]  # no step lost or repeated
    assert [r.get("tokens") for r in continued] == [
        r.get("tokens") for r in straight
    ]  # the same samples per step
    timing = lambda r: {k: v for k, v in r.items() if k not in ("s_per_step", "tokens_per_s")}
    assert [timing(r) for r in continued[:8]] == [
        timing(r) for r in straight[:8]
    ]  # to step 7: the logs came along
    lrs = {r["step"]: r["lr"] for r in straight if "lr" in r}
    after = {r["step"]: r["lr"] for r in continued if "lr" in r and r["step"] > 7}
    assert after[8] == pytest.approx(lrs[8] / 3) and after[9] == pytest.approx(lrs[9] * 2 / 3)  # re-warmed
    assert after[10] == pytest.approx(lrs[10])  # then the schedule's own lr
    assert after[8] != lrs[8] and continued[8]["loss"] == pytest.approx(straight[8]["loss"], rel=0.05)
    stretches = (tmp_path / "runs" / "grisp" / "stretches.jsonl").read_text().splitlines()
    stretches = [json.loads(line) for line in stretches]
    assert [(r["event"], r["step"]) for r in stretches] == [
        ("start", 0),
        ("stop", 7),
        ("start", 7),
        ("end", 10),
    ]
    assert stretches[2]["from"].startswith("portable copy") and stretches[1]["steps"] == 7
    assert all(r["dtype"] == "float32" and r["cpu"] for r in stretches if r["event"] == "start")
    assert (tmp_path / "runs" / "grisp" / "adapter" / peft_format.WEIGHTS_NAME).is_file()


def test_a_portable_copy_is_byte_identical_where_nothing_changed(model_dir, tmp_path):
    """Git stores a landing's unchanged files once only if they are rewritten byte for byte. best/ stays out
    of the copy: its weights would double a landing."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(4))
    val = write_jsonl(tmp_path / "v.jsonl", make_samples(2, 0, prefix="v"))
    flags = ["--val-data", str(val), "--portable-dir", str(tmp_path / "repo"), "--checkpoint-every", "1"]
    train.main(
        train_args(model_dir, tmp_path, samples, *flags, "--stop-after", "5")
    )  # validated at step 4 only
    copy, run_dir = tmp_path / "repo" / "grisp", tmp_path / "runs" / "grisp"
    assert (run_dir / "best").is_dir() and not (copy / "best").exists()
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    checkpoint.save_portable(run_dir / "checkpoint-0000005", run_dir, copy)
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    state = json.loads((copy / "state.json").read_text())
    assert state["step"] == 5 and state["best_step"] == 4 and state["rewarm_from"] is None


def test_a_best_left_on_another_machine_is_named_not_faked(model_dir, tmp_path, capsys):
    """Continued from a portable copy (no best/ in it), a run whose last validation is not its best ships
    its last weights and says whose the best loss was; a stale best/ of this machine is dropped."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(4))
    val = write_jsonl(tmp_path / "v.jsonl", make_samples(2, 0, prefix="v"))
    flags = [
        "--epochs",
        "2",
        "--val-data",
        str(val),
        "--portable-dir",
        str(tmp_path / "repo"),
        "--checkpoint-every",
        "1",
    ]
    train.main(train_args(model_dir, tmp_path, samples, *flags, "--stop-after", "3"))  # before any validation
    copy, run_dir = tmp_path / "repo" / "grisp", tmp_path / "runs" / "grisp"
    for path in run_dir.glob("checkpoint-*"):  # this machine's checkpoints lost; a stale best/ of it left
        shutil.rmtree(path)
    (run_dir / "latest").unlink()
    (run_dir / "best").mkdir()
    (run_dir / "best" / "stale").write_text("")
    state = json.loads((copy / "state.json").read_text())
    state.update(best_val=-1.0, best_step=2)  # as if another machine had validated better than any loss here
    (copy / "state.json").write_text(json.dumps(state))
    capsys.readouterr()
    train.main(train_args(model_dir, tmp_path, samples, *flags, "--resume"))
    out = capsys.readouterr().out
    assert (
        "adapter (the last step's weights; the best validation loss -1.0 was step 2's, whose weights stayed on "
        "the machine that validated it" in out
    )
    assert not (run_dir / "adapter" / "stale").exists()
    assert (run_dir / "adapter" / peft_format.WEIGHTS_NAME).is_file()
    assert not (run_dir / "best").exists()  # best/ holds only the best step's weights: not these
    train.main(
        train_args(model_dir, tmp_path, samples, *flags, "--resume")
    )  # the run is over: rewrites adapter/
    assert (
        "adapter (the last step's weights; the best validation loss -1.0 was step 2's"
        in capsys.readouterr().out
    )


def test_a_copy_landed_after_the_last_validation_becomes_the_adapter_on_a_fresh_machine(
    model_dir, tmp_path, capsys
):
    """What happened to the mixture run: its copy landed at the last step after the final validation (the
    best), the machine lost its run directory, and --resume on a fresh one trains nothing more and writes
    the copy's weights as the adapter, saying that they are the best."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(4))
    val = write_jsonl(tmp_path / "v.jsonl", make_samples(2, 0, prefix="v"))
    flags = [
        "--epochs",
        "2",
        "--val-data",
        str(val),
        "--portable-dir",
        str(tmp_path / "repo"),
        "--checkpoint-every",
        "1",
    ]
    train.main(train_args(model_dir, tmp_path, samples, *flags))
    copy, run_dir = tmp_path / "repo" / "grisp", tmp_path / "runs" / "grisp"
    state = json.loads((copy / "state.json").read_text())
    last = json.loads((copy / "config.json").read_text())["total_steps"]
    assert state["step"] == state["evaluated_step"] == last
    state.update(best_step=last)  # the last validation was the best (in this tiny run it need not be)
    (copy / "state.json").write_text(json.dumps(state))
    shutil.rmtree(run_dir)  # a fresh machine
    capsys.readouterr()
    train.main(train_args(model_dir, tmp_path, samples, *flags, "--resume"))
    out = capsys.readouterr().out
    assert f"adapter (the last step's weights, also the best by validation loss ({state['best_val']}))" in out
    assert [row for row in log(tmp_path) if row["step"] > last] == []  # no step trained after the end
    _, landed = checkpoint.read_lora(copy)
    shipped = peft_format.read_adapter_weights(run_dir / "adapter")
    assert len(shipped) == len(landed) > 0
    for (name, tensor), expected in zip(sorted(shipped.items()), (landed[k] for k in sorted(landed))):
        torch.testing.assert_close(tensor.float(), expected.float(), rtol=0, atol=0, msg=name)


def test_a_copy_cut_off_mid_swap_is_put_back_and_continued(model_dir, tmp_path):
    """save_portable renames the old copy to NAME.old before the new one takes its name: a kill between the two
    renames leaves only NAME.old, which a fresh machine's --resume must still find."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(4))
    flags = ["--portable-dir", str(tmp_path / "repo"), "--checkpoint-every", "1", "--epochs", "2"]
    train.main(train_args(model_dir, tmp_path, samples, *flags, "--stop-after", "3"))
    copy = tmp_path / "repo" / "grisp"
    copy.rename(copy.with_name("grisp.old"))  # cut off between the renames
    shutil.rmtree(tmp_path / "runs")  # a fresh machine
    train.main(train_args(model_dir, tmp_path, samples, *flags, "--resume"))
    stretches = [
        json.loads(line)
        for line in (tmp_path / "runs" / "grisp" / "stretches.jsonl").read_text().splitlines()
    ]
    assert (stretches[-2]["event"], stretches[-2]["step"]) == ("start", 3)
    assert stretches[-2]["from"].startswith(f"portable copy {copy}")
    assert (copy / "state.json").is_file() and not copy.with_name("grisp.old").exists()


def test_resume_without_checkpoint_or_copy_says_so(model_dir, tmp_path):
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    with pytest.raises(SystemExit, match="no checkpoint and .* no portable copy"):
        train.main(
            train_args(model_dir, tmp_path, samples, "--resume", "--portable-dir", str(tmp_path / "repo"))
        )


def test_a_new_run_does_not_replace_a_portable_copy(model_dir, tmp_path):
    """A fresh clone holds runs/NAME but no run directory: starting without --resume used to train from step 0
    and replace the landed copy at its first checkpoint."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    copy = tmp_path / "repo" / "grisp"
    copy.mkdir(parents=True)
    (copy / "state.json").write_text('{"step": 1675}')
    with pytest.raises(SystemExit, match="holds a portable copy of run grisp; continue it with --resume"):
        train.main(train_args(model_dir, tmp_path, samples, "--portable-dir", str(tmp_path / "repo")))
    assert (copy / "state.json").read_text() == '{"step": 1675}' and not (
        tmp_path / "runs" / "grisp"
    ).exists()


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_dtype_auto_trains_in_bf16_on_a_native_bf16_cpu(
    model_dir, tmp_path, mock_native_bf16, native, expected
):
    mock_native_bf16(native)
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    train.main(train_args(model_dir, tmp_path, samples, "--dtype", "auto", "--epochs", "1"))
    run = tmp_path / "runs" / "grisp"
    assert json.loads((run / "config.json").read_text())["dtype"] == expected
    start = json.loads((run / "stretches.jsonl").read_text().splitlines()[0])
    assert start["dtype"] == expected and start["native_bf16"] == native and "native bf16" in start["why"]
    latest = run / (run / "latest").read_text()  # the LoRA weights and AdamW's moments stay float32
    assert {t.dtype for t in load_file(latest / checkpoint.LORA_FILE).values()} == {torch.float32}
    moments = [t for k, t in load_file(latest / "optimizer.safetensors").items() if "exp_avg" in k]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    assert all(math.isfinite(r["loss"]) for r in log(tmp_path))


def test_rewarm_raises_the_lr_linearly_then_leaves_it():
    assert [trainer.rewarm(s, 10, 3) for s in range(9, 15)] == [1.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert trainer.rewarm(5, None, 3) == 1.0


def test_sigint_sets_the_stop_flag():
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job
    with checkpoint.StopFlag() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_resume_refuses_changed_settings(model_dir, tmp_path, capsys):
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    train.main(train_args(model_dir, tmp_path, samples, "--stop-after", "1"))
    with pytest.raises(SystemExit, match="--resume with different settings: lr"):
        train.main(train_args(model_dir, tmp_path, samples, "--resume", "--lr", "3e-4"))
    with pytest.raises(SystemExit, match="exists; continue it with --resume"):
        train.main(train_args(model_dir, tmp_path, samples))
    train.main(
        train_args(model_dir, tmp_path, samples, "--resume", "--micro-batch-size", "2", "--stop-after", "3")
    )  # same math: allowed
    (tmp_path / "runs").rename(tmp_path / "moved")  # a run moved elsewhere continues there
    train.main(train_args(model_dir, tmp_path, samples, "--resume", "--runs-dir", str(tmp_path / "moved")))
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "moved" / "grisp" / "log.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, 9))  # 4 epochs of 2 steps, none repeated


def test_resume_refuses_other_samples_under_the_same_settings(model_dir, tmp_path):
    rows = make_samples(2)
    samples = write_jsonl(tmp_path / "s.jsonl", rows)
    train.main(train_args(model_dir, tmp_path, samples, "--stop-after", "1"))
    rows[0] = {**rows[0], "target": rows[0]["target"] + " ."}  # e.g. the code that writes skeletons changed
    write_jsonl(samples, rows)
    with pytest.raises(SystemExit, match="other samples than the run's"):
        train.main(train_args(model_dir, tmp_path, samples, "--resume"))
    # a checkpoint from before the fingerprint existed resumes unchecked
    checkpoint_config = tmp_path / "runs" / "grisp" / "checkpoint-0000001" / "config.json"
    config = json.loads(checkpoint_config.read_text())
    checkpoint_config.write_text(json.dumps({k: v for k, v in config.items() if k != "data_sha256"}))
    train.main(train_args(model_dir, tmp_path, samples, "--resume", "--stop-after", "2"))
    assert [r["step"] for r in log(tmp_path)] == [1, 2]


def test_other_samples_continue_when_accepted_and_the_stretch_says_so(model_dir, tmp_path):
    rows = make_samples(2)
    samples = write_jsonl(tmp_path / "s.jsonl", rows)
    train.main(train_args(model_dir, tmp_path, samples, "--stop-after", "1"))
    was = json.loads((tmp_path / "runs" / "grisp" / "config.json").read_text())["data_sha256"]
    write_jsonl(samples, [{**rows[0], "target": rows[0]["target"] + " ."}, *rows[1:]])
    train.main(
        train_args(model_dir, tmp_path, samples, "--resume", "--accept-new-samples", "--stop-after", "2")
    )
    run = tmp_path / "runs" / "grisp"
    now = json.loads((run / "config.json").read_text())["data_sha256"]
    start = [r for r in read_jsonl(run / "stretches.jsonl") if r["event"] == "start"][-1]
    assert now != was and start["from"].endswith(
        f"samples changed, accepted: data_sha256 {was[:12]} -> {now[:12]}"
    )
    # later resumes check against the new samples, without the flag
    train.main(train_args(model_dir, tmp_path, samples, "--resume", "--stop-after", "3"))
    assert [r["step"] for r in log(tmp_path)] == [1, 2, 3]


@pytest.mark.parametrize("lora_layers", ["0", "1"])  # every block (layers_to_transform None), the last one
def test_a_checkpoint_converts_to_the_adapter_the_run_saves(model_dir, tmp_path, lora_layers):
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    train.main(train_args(model_dir, tmp_path, samples, "--epochs", "1", "--lora-layers", lora_layers))
    run = tmp_path / "runs" / "grisp"  # no validation data: adapter/ holds the last step's weights
    out = peft_format.convert_adapter(run / "checkpoint-0000002", tmp_path / "converted")
    for name in (peft_format.CONFIG_NAME, peft_format.GRISP_CONFIG_NAME):
        assert (out / name).read_text() == (run / "adapter" / name).read_text()
    converted, saved = (
        load_file(out / peft_format.WEIGHTS_NAME),
        load_file(run / "adapter" / peft_format.WEIGHTS_NAME),
    )
    assert converted.keys() == saved.keys() and all(torch.equal(converted[k], saved[k]) for k in saved)
    # the base model gone from where the run saw it, a run from before prompt formats: the same blocks, v1
    config_path = run / "checkpoint-0000002" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(
        json.dumps({k: v for k, v in config.items() if k != "prompt_format"} | {"model_dir": "/gone"})
    )
    out = peft_format.convert_adapter(run / "checkpoint-0000002", tmp_path / "old-run")
    expected = json.loads((run / "adapter" / peft_format.CONFIG_NAME).read_text()) | {
        "base_model_name_or_path": "/gone"
    }
    assert json.loads((out / peft_format.CONFIG_NAME).read_text()) == expected
    assert peft_format.read_prompt_format(out) == "v1"


HASH_SCRIPT = """import sys, train
from llm.tokenizer import Tokenizer
args = train.make_parser().parse_args(sys.argv[1:])
train_epoch, val = train.load_data(args, Tokenizer(args.model_dir))
first = train_epoch(0)
print(len(first), len(val), train.data_sha256(first + val))"""


def test_the_data_fingerprint_is_the_same_in_every_process(model_dir, tiny):
    """A resumed run regenerates its samples in a new process: nothing may depend on str hashing."""
    indices, records_file, _ = tiny
    flags = [
        "--data",
        str(records_file),
        "--index",
        str(indices.directory),
        "--model-dir",
        str(model_dir),
        "--val-fraction",
        "0.1",
        "--max-length",
        "4096",
    ]
    outputs = {
        subprocess.run(
            [sys.executable, "-c", HASH_SCRIPT, *flags],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            env=os.environ | {"PYTHONHASHSEED": seed},
        ).stdout.splitlines()[-1]
        for seed in ("1", "2")
    }
    assert len(outputs) == 1 and int(outputs.pop().split()[0]) > 100


def test_init_adapter_starts_from_a_trained_adapter(model_dir, tmp_path):
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    train.main(train_args(model_dir, tmp_path, samples, "--epochs", "2", "--lr", "1e-2", "--name", "first"))
    first = load_file(tmp_path / "runs" / "first" / "adapter" / "adapter_model.safetensors")
    assert any(float(v.abs().max()) > 0 for k, v in first.items() if "lora_B" in k)
    # a second run from it with a vanishing learning rate ends where the first one ended
    train.main(
        train_args(
            model_dir,
            tmp_path,
            samples,
            "--epochs",
            "1",
            "--lr",
            "1e-12",
            "--name",
            "second",
            "--init-adapter",
            str(tmp_path / "runs" / "first" / "adapter"),
        )
    )
    second = load_file(tmp_path / "runs" / "second" / "adapter" / "adapter_model.safetensors")
    assert first.keys() == second.keys() and all(
        torch.allclose(first[k], second[k], atol=1e-6) for k in first
    )
    start = json.loads((tmp_path / "runs" / "second" / "stretches.jsonl").read_text().splitlines()[0])
    assert (
        start["from"] == f"the adapter {tmp_path / 'runs' / 'first' / 'adapter'}"
    )  # where its stretch began
    # ... and so does one from the first run's last checkpoint
    train.main(
        train_args(
            model_dir,
            tmp_path,
            samples,
            "--epochs",
            "1",
            "--lr",
            "1e-12",
            "--name",
            "from-checkpoint",
            "--init-adapter",
            str(tmp_path / "runs" / "first" / "checkpoint-0000004"),
        )
    )
    third = load_file(tmp_path / "runs" / "from-checkpoint" / "adapter" / "adapter_model.safetensors")
    assert all(torch.allclose(first[k], third[k], atol=1e-6) for k in first)
    # a bf16 run keeps the float32 LoRA weights it starts from as they are (not rounded to bf16)
    train.main(
        train_args(
            model_dir,
            tmp_path,
            samples,
            "--epochs",
            "1",
            "--lr",
            "1e-12",
            "--name",
            "bf16",
            "--dtype",
            "bfloat16",
            "--init-adapter",
            str(tmp_path / "runs" / "first" / "adapter"),
        )
    )
    bf16 = load_file(tmp_path / "runs" / "bf16" / "adapter" / "adapter_model.safetensors")
    assert all(
        bf16[k].dtype == torch.float32 and torch.allclose(first[k], bf16[k], atol=1e-7, rtol=0) for k in first
    )
    with pytest.raises(SystemExit, match="pass the same --lora-r"):
        train.main(
            train_args(
                model_dir,
                tmp_path,
                samples,
                "--name",
                "third",
                "--lora-r",
                "8",
                "--init-adapter",
                str(tmp_path / "runs" / "first" / "adapter"),
            )
        )
    with pytest.raises(SystemExit, match="neither an adapter nor a checkpoint"):
        train.main(
            train_args(model_dir, tmp_path, samples, "--name", "fourth", "--init-adapter", str(tmp_path))
        )


# ---------------------------------------------------------------------------- command line
def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.make_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for group in ("data:", "model:", "LoRA:", "optimisation:", "checkpoints:", "CPU / device:"):
        assert group in text
    assert "(default: None)" not in " ".join(text.split())  # a None default: the help says what unset means
    assert "demo index" not in " ".join(
        text.split()
    )  # --data demo is refused (an evaluation set): its index is no default


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--samples", "no/such.jsonl"], "--samples no/such.jsonl does not exist"),
        (["--batch-size", "0"], "--batch-size 0 must be"),
        (["--val-fraction", "1.5"], "--val-fraction must be in"),
        (["--patience", "0"], "--patience must be at least 1"),  # 0 would stop after the first step
        (["--device", "bogus"], "unknown device 'bogus': use auto, cpu, cuda"),
        (["--threads", "-1"], "--threads must be at least 0"),  # torch.set_num_threads raised a RuntimeError
        (["--lr", "nan"], "--lr must be a finite number > 0"),  # nan <= 0 is False
        (["--lr", "inf"], "--lr must be a finite number > 0"),
        (
            ["--max-steps", "-1"],
            "--max-steps must be at least 0",
        ),  # ran 0 steps and saved an untrained adapter/
        (["--eval-every", "-1"], "--eval-every must be at least 0"),
        (
            ["--lora-r", "0"],
            "--lora-r must be at least 1",
        ),  # found by lora.py only after the data and the model loaded
        (["--lora-dropout", "1"], "--lora-dropout must be in"),  # 1 zeroes every LoRA input
        (["--lora-dropout", "nan"], "--lora-dropout must be in"),  # nan > 0 is False: silently no dropout
    ],
)
def test_bad_settings_exit_with_a_message(model_dir, tmp_path, flags, message):
    args = train.make_parser().parse_args(
        ["--model-dir", str(model_dir), "--runs-dir", str(tmp_path), *flags]
    )
    with pytest.raises(SystemExit, match=message):
        train.main(args)


INTERRUPTED_STARTUP = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a non-interactive shell starts
import train
train.setup = lambda args: os.kill(os.getpid(), signal.SIGINT)  # an INT while the run starts up
try:
    train.main(train.make_parser().parse_args(sys.argv[1:]))
except KeyboardInterrupt:
    sys.exit("stopped by the INT")
"""


def test_an_interrupt_before_the_loop_ends_a_background_run(tmp_path):
    """runs/mix.sh starts train.py in the background with SIGINT ignored: its documented `kill -INT` must
    still stop a run that has not reached the loop (which then checkpoints and exits on INT itself)."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPTED_STARTUP,
            "--runs-dir",
            str(tmp_path),  # no model:
            "--model-dir",
            str(tmp_path / "no-model"),
        ],
        cwd=REPO,  # a run not stopped fails fast
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stderr.strip().endswith("stopped by the INT"), run.stderr[-2000:]


def test_bad_data_exits_non_zero_without_traceback(model_dir, tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--model-dir",
            str(model_dir),
            "--index",
            str(tmp_path),
            "--runs-dir",
            str(tmp_path),
            "--data",
            "no/such.jsonl",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "no/such.jsonl" in run.stderr and "Traceback" not in run.stderr, run.stderr


@pytest.mark.slow  # two torchrun workers: ~10-40 s of process start-up
def test_two_process_ddp_equals_one_process(model_dir, tmp_path):
    """torchrun with 2 CPU processes (gloo): each takes half of every batch, DDP averages the gradients,
    so the adapter equals the single-process one (no dropout: each process draws its own masks)."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(4))
    flags = [
        "--samples",
        str(samples),
        "--model-dir",
        str(model_dir),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--val-fraction",
        "0",
        "--lora-r",
        "4",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "1",
        "--epochs",
        "2",
        "--lr",
        "5e-3",
        "--lora-dropout",
        "0",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
    train.main(train.make_parser().parse_args(flags + ["--name", "single"]))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(REPO / "train.py"),
            *flags,
            "--name",
            "ddp",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    a = load_file(tmp_path / "runs" / "single" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "runs" / "ddp" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    single, ddp = log(tmp_path, "single"), log(tmp_path, "ddp")
    assert [r["loss"] for r in ddp] == pytest.approx([r["loss"] for r in single], abs=1e-5)


@pytest.mark.parametrize("rank, order", [("0", ["open", "barrier"]), ("1", ["barrier", "open"])])
def test_with_several_processes_rank_0_builds_the_index_first(monkeypatch, rank, order):
    """A missing index is built by whoever opens it: under torchrun rank 0 opens it before the others pass the
    barrier, so they never build into the same directories at once."""
    calls = []
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(train.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(train.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(train.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(
        train.build_index, "open_index", lambda index, data: calls.append("open") or "indices"
    )
    assert train.open_index_once(None, "wwq") == "indices" and calls == order


def test_a_gpu_process_selects_its_own_device(monkeypatch, model_dir):
    """Without torch.cuda.set_device every torchrun process saves and restores cuda:0's RNG state (and NCCL
    opens a context on GPU 0), so a resumed rank k > 0 would draw other dropout masks."""

    class Selected(Exception):
        pass

    def select(device):
        raise Selected(device)

    monkeypatch.setattr(train, "pick_device", lambda name, local_rank: torch.device("cuda", local_rank))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(train.torch.cuda, "set_device", select)
    with pytest.raises(Selected, match="cuda:1"):
        train.setup(train.make_parser().parse_args(["--model-dir", str(model_dir)]))


# ---------------------------------------------------------------------------- recipe, mixture, prompt format
def test_unset_flags_take_the_devices_recipe(model_dir):
    for device, expected in (
        ("cpu", (0, 1, 2)),
        ("cuda", (0, 1, 4)),
    ):  # the tiny model has 2 blocks: LoRA on all
        args = train.make_parser().parse_args(["--model-dir", str(model_dir)])
        train.apply_recipe(args, torch.device(device))
        assert (args.lora_layers, args.micro_batch_size, args.epochs) == expected
    args = train.make_parser().parse_args(
        ["--model-dir", str(REPO / "no-model")]
    )  # the 0.5B's 24 blocks: all of them
    train.apply_recipe(args, torch.device("cpu"))
    assert (args.lora_layers, args.micro_batch_size, args.epochs) == (0, 1, 2)
    args = train.make_parser().parse_args(
        ["--model-dir", str(model_dir), "--lora-layers", "1", "--epochs", "3"]
    )
    train.apply_recipe(args, torch.device("cpu"))
    assert (args.lora_layers, args.micro_batch_size, args.epochs) == (1, 1, 3)  # given flags win
    args.batch_size, args.lora_r, args.lora_layers = 8, 32, 8
    plan = train.describe_plan(args, torch.device("cpu"), torch.float32, 1000, [{"ids": [0] * 300}], 24)
    # 1000 steps x 2,400 tokens x (7.5 + 0.6 x 8) ms = 8.2 h
    assert "CPU recipe (the shipped adapter's" in plan and "LoRA r=32 on the last 8 blocks" in plan
    assert "1000 steps of ~2400 tokens" in plan and "expected ~8.2 h in float32 (30 s/step" in plan
    first_epoch = [{"ids": [0] * 300}]
    assert "expected" not in train.describe_plan(
        args, torch.device("cuda"), torch.bfloat16, 1000, first_epoch, 24
    )
    # the same plan in bf16 (a CPU with native bf16): 1000 x 2,400 x (1.8 + 0.2 x 8) ms = 2.3 h
    plan = train.describe_plan(args, torch.device("cpu"), torch.bfloat16, 1000, first_epoch, 24)
    assert "expected ~2.3 h in bfloat16 (8 s/step" in plan


def test_command_line_trains_online_on_a_mixture_and_prints_the_plan(model_dir, tmp_path):
    import build_index
    from tests.test_samples import write_items, write_records

    write_items(tmp_path / "items.jsonl")
    write_records(tmp_path / "a.jsonl", 30)
    write_records(tmp_path / "b.jsonl", 10)
    build_index.build(tmp_path / "index", items=tmp_path / "items.jsonl", embed="none")
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--data",
            f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}:0.5",
            "--index",
            str(tmp_path / "index"),
            "--model-dir",
            str(model_dir),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--max-steps",
            "4",
            "--lora-r",
            "4",
            "--threads",
            "1",
            "--max-length",
            "4096",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert (
        f"| {tmp_path / 'a.jsonl'} | 31 | 0 | 0 | 0 | 1 |" in out
    )  # the table: the unknown-IRI record skipped
    assert (
        "CPU recipe (the shipped adapter's" in out
        and "LoRA r=4 on all 2 blocks" in out
        and "expected ~" in out
    )
    assert "measured" in out and "s/step over 3 steps" in out
    config = json.loads((tmp_path / "runs" / "grisp" / "config.json").read_text())
    assert (config["lora_layers"], config["micro_batch_size"], config["epochs"]) == (0, 1, 2)
    assert config["prompt_format"] == "v2" and config["loss_weighting"] == "reference"
    adapter = tmp_path / "runs" / "grisp" / "adapter"
    assert json.loads((adapter / "grisp_config.json").read_text()) == {"prompt_format": "v2"}


def test_precomputed_samples_must_match_the_prompt_format(model_dir, tmp_path):
    rows = make_samples(2)
    for row in rows:
        row.pop("prompt_format", None)  # samples from before the field: v1
    samples = write_jsonl(tmp_path / "s.jsonl", rows)
    with pytest.raises(SystemExit, match="format v1, not --prompt-format v2"):
        train.main(train_args(model_dir, tmp_path, samples))
    train.main(train_args(model_dir, tmp_path, samples, "--prompt-format", "v1", "--epochs", "1"))
    assert (
        json.loads((tmp_path / "runs" / "grisp" / "adapter" / "grisp_config.json").read_text())[
            "prompt_format"
        ]
        == "v1"
    )


def test_a_resumed_run_keeps_its_recipe_on_another_kind_of_device(model_dir, tmp_path):
    """Before: flags left unset took the device's recipe on --resume too, so the command that started a run
    on a CPU (2 epochs) was refused on a GPU (4 epochs: "--resume with different settings: epochs")."""
    samples = write_jsonl(tmp_path / "s.jsonl", make_samples(2))
    portable = ["--portable-dir", str(tmp_path / "repo")]
    started = train_args(model_dir, tmp_path, samples, "--stop-after", "1", *portable)
    started.epochs = started.micro_batch_size = None  # left unset: the CPU recipe's
    train.main(started)
    assert json.loads((tmp_path / "runs" / "grisp" / "config.json").read_text())["epochs"] == 2
    for where in ("run directory", "portable copy"):
        if where == "portable copy":
            shutil.rmtree(tmp_path / "runs")  # a fresh machine: the copy alone
        resumed = train_args(model_dir, tmp_path, samples, "--resume", *portable)
        resumed.epochs = resumed.micro_batch_size = None
        train.apply_recipe(resumed, torch.device("cuda"))
        assert (resumed.epochs, resumed.micro_batch_size) == (2, 1), where
    given = train_args(model_dir, tmp_path, samples, "--resume", "--epochs", "3", *portable)
    train.apply_recipe(given, torch.device("cuda"))
    assert given.epochs == 3  # a given flag still wins (and resume() judges it)
    fresh = train_args(model_dir, tmp_path, samples, "--name", "other")
    fresh.epochs = None
    train.apply_recipe(fresh, torch.device("cuda"))
    assert fresh.epochs == 4  # a new run takes the device's recipe


def test_a_run_saved_before_a_later_setting_resumes_with_its_old_value():
    from grisp.trainer import LATER_SETTINGS, check_same_run

    config = {"lr": 1e-4, "mention": 0.0, "data_sha256": "x"}
    saved = {"lr": 1e-4, "data_sha256": "x"}  # written before --mention existed
    assert LATER_SETTINGS["mention"] == 0.0
    check_same_run(saved, config)  # no exit: it made its samples as mention 0 does
    with pytest.raises(SystemExit, match="different settings: mention=0.5 \\(was None\\)"):
        check_same_run(saved, {**config, "mention": 0.5})
    check_same_run(saved, {**config, "compose_shapes": "chain"})  # saved before --compose-shapes: chains only
    with pytest.raises(SystemExit, match="compose_shapes=chain,ask"):
        check_same_run(saved, {**config, "compose_shapes": "chain,ask"})


def test_a_run_moves_to_another_home_directory_but_not_to_another_base_model():
    from grisp.trainer import check_same_run

    saved = {"model_dir": "/root/.cache/grisp/models/qwen2.5-coder-0.5b-instruct", "data_sha256": "x"}
    check_same_run(saved, {**saved, "model_dir": "/home/ada/.cache/grisp/models/qwen2.5-coder-0.5b-instruct"})
    with pytest.raises(SystemExit, match="different settings: model_dir=/m/qwen2.5-0.5b-instruct"):
        check_same_run(saved, {**saved, "model_dir": "/m/qwen2.5-0.5b-instruct"})


def test_first_epoch_continues_the_sample_stream_and_keeps_the_validation_split(model_dir, tiny):
    """A continuation (--first-epoch N) draws epoch e as the stream's epoch e + N and validates on the same samples."""
    indices, records_file, _ = tiny
    flags = [
        "--data",
        str(records_file),
        "--index",
        str(indices.directory),
        "--model-dir",
        str(model_dir),
        "--val-fraction",
        "0.1",
        "--max-length",
        "4096",
    ]
    stream = lambda *extra: train.load_data(
        train.make_parser().parse_args(flags + list(extra)), Tokenizer(model_dir)
    )
    (epoch, val), (continued, continued_val) = stream(), stream("--first-epoch", "1")
    assert continued(0) == epoch(1) and continued(1) == epoch(2) and continued(0) != epoch(0)
    assert continued_val == val and len(val) > 0  # the same held-out records, split by (seed, id)
    with pytest.raises(SystemExit, match="--first-epoch must be at least 0"):
        train.check_args(
            train.make_parser().parse_args(
                flags + ["--first-epoch", "-1", "--epochs", "1", "--micro-batch-size", "1"]
            ),
            world=1,
        )


def test_precomputed_composed_samples_stay_on_the_side_of_their_records(model_dir, tmp_path):
    """gen_data.py composes from every record; train.py --samples then splits by id hash. A composed sample
    was split by its own id, so the facts of held-out records trained: now it trains only if none of its
    records is held out, and validates only if all are."""
    rows = make_samples(12)
    is_val = samples_module.validation_split(0.5, 0)
    held, kept = (
        [r for r in (f"r{i}" for i in range(12)) if is_val(r)],
        [r for r in (f"r{i}" for i in range(12)) if not is_val(r)],
    )
    assert len(held) >= 2 and len(kept) >= 2
    skeleton = rows[0]
    pairs = {"both kept": kept[:2], "both held": held[:2], "mixed": [kept[0], held[0]]}
    composed = [
        skeleton | {"id": f"composed:chain:{'+'.join(pair)}", "composed_from": pair}
        for pair in pairs.values()
    ]
    path = write_jsonl(tmp_path / "s.jsonl", rows + composed)
    args = train_args(model_dir, tmp_path, path, "--val-fraction", "0.5", "--seed", "0")
    train_epoch, val = train.load_data(args, Tokenizer(model_dir))
    plain_val = sum(is_val(r["id"]) for r in rows)
    assert len(train_epoch(0)) == len(rows) - plain_val + 1  # + the composed sample of two kept records
    assert len(val) == plain_val + 1  # + the one of two held-out records; the mixed one is in neither


def test_latest_puts_back_a_checkpoint_a_cut_off_resave_left_as_old(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    (tmp_path / "checkpoint-0000007.old").mkdir()  # a re-save at step 7 killed between its two renames
    (tmp_path / "latest").write_text("checkpoint-0000007")
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoint-0000007"  # resume found nothing there before
    assert (tmp_path / "checkpoint-0000007").is_dir() and not (tmp_path / "checkpoint-0000007.old").exists()


@pytest.mark.parametrize("value, expected", [("", "~/.cache/grisp"), ("/tmp/elsewhere", "/tmp/elsewhere")])
def test_grisp_home_set_but_empty_is_the_default_as_in_the_scripts(value, expected):
    # an empty GRISP_HOME made the run directory runs/NAME: the portable copy itself, which a save renames away
    out = subprocess.run(
        [sys.executable, "-c", "from common import defaults; print(defaults.GRISP_HOME)"],
        capture_output=True,
        text=True,
        cwd=Path(train.__file__).parent,
        env={**os.environ, "GRISP_HOME": value},
        check=True,
    )
    assert out.stdout.strip() == str(Path(expected).expanduser())
