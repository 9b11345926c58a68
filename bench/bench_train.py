"""Training speed of train.py's step against transformers + peft on the same model, LoRA and batch.

One optimiser step = a batch of `--batch` sequences in micro-batches of `--micro-batch`, each of
`--prompt-len` prompt tokens and `--answer-len` answer tokens (the skeleton task: loss on the answer
tokens), forward + backward + AdamW. Ours computes logits only at the answer positions (loss.py);
the reference is the standard transformers recipe, `model(input_ids, labels=labels)` with -100 on the
prompt, on a `peft.get_peft_model` with the same LoraConfig. Each row of `--rows` is an
implementation:precision pair; the precision is float32, or bfloat16 as train.py trains on a CPU with
native bf16 (bf16 base weights under `torch.autocast`, LoRA weights and AdamW float32). All models live
in this process and each round times every row, starting one row further along each round (a, b, c;
b, c, a; ...), so that load from other processes hits all alike; the table shows median training
tokens/s and the ratio to the last row (> 1: faster than it).

    python bench/bench_train.py                       # ours float32 and bf16, transformers + peft bf16; all 24 blocks
    python bench/bench_train.py --lora-layers 8       # LoRA on the last 8 blocks
    python bench/bench_train.py --rows ours:float32 transformers+peft:float32
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROWS = ("ours:float32", "ours:bfloat16", "transformers+peft:bfloat16")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lora  # noqa: E402
from bench.flags import positive_int  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from common import defaults  # noqa: E402
from llm.cpu_speed import cpu_name, native_bf16  # noqa: E402
from model import Transformer  # noqa: E402


def ours(args, layers: list[int] | None, dtype: torch.dtype):
    """Our model with LoRA (float32 LoRA weights, as train.py) and a `step(tokens, answer_mask)` closure
    for one micro-batch."""
    model = Transformer.from_pretrained(args.model_dir, dtype)
    lora.inject_lora(model, args.r, args.alpha, args.dropout, layers=layers)
    lora.mark_only_lora_trainable(model)
    for p in lora.lora_state_dict(model).values():
        p.data = p.data.float()
    model.train()

    def step(tokens, at):
        # position t predicts token t + 1: the loss positions are the answer mask shifted left by one
        at_prev = torch.zeros_like(at)
        at_prev[:, :-1] = at[:, 1:]
        logits = model(tokens, logits_at=at_prev)  # [N, V]
        return torch.nn.functional.cross_entropy(logits, tokens[at])

    return model, step


def reference(args, layers: list[int] | None, dtype: torch.dtype):
    """transformers' Qwen2ForCausalLM + peft LoRA with the same config, trained the standard way (peft
    keeps the LoRA weights in float32 over bf16 base weights by default)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(args.model_dir, dtype=dtype)
    config = LoraConfig(
        r=args.r,
        lora_alpha=args.alpha,
        lora_dropout=args.dropout,
        target_modules=list(lora.DEFAULT_TARGETS),
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    model.train()

    def step(tokens, at):
        labels = tokens.masked_fill(~at, -100)  # transformers shifts the labels itself
        return model(input_ids=tokens, labels=labels).loss

    return model, step


def time_step(
    model, step, batch: list[tuple[torch.Tensor, torch.Tensor]], optimizer, dtype: torch.dtype
) -> float:
    """Seconds for one optimiser step over the micro-batches (gradient accumulation), under autocast
    to `dtype` unless it is float32."""
    started = time.perf_counter()
    for tokens, at in batch:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = step(tokens, at) / len(batch)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if not (Path(args.model_dir) / "config.json").exists():
        sys.exit(f"error: no model at {args.model_dir}; run `python get_model.py` or pass --model-dir")
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    n_layers, vocab = config["num_hidden_layers"], config["vocab_size"]
    layers = list(range(n_layers))[-args.lora_layers :] if args.lora_layers else None
    impls = {}
    for row in args.rows:
        name, _, precision = row.partition(":")
        dtype = getattr(torch, precision)
        model, step = {"ours": ours, "transformers+peft": reference}[name](args, layers, dtype)
        params = [p for p in model.parameters() if p.requires_grad]
        impls[row] = (model, step, torch.optim.AdamW(params, lr=1e-5), sum(p.numel() for p in params), dtype)
    sizes = {row: impl[3] for row, impl in impls.items()}
    assert len(set(sizes.values())) == 1, f"LoRA sizes differ: {sizes}"

    T = args.prompt_len + args.answer_len
    batch = []
    for _ in range(args.batch // args.micro_batch):
        tokens = torch.randint(min(100, vocab // 2), min(20000, vocab), (args.micro_batch, T))
        at = torch.zeros(args.micro_batch, T, dtype=torch.bool)
        at[:, args.prompt_len :] = True  # the answer tokens are the labels
        batch.append((tokens, at))
    print(
        f"batch {args.batch} x {T} tokens ({args.answer_len} answer tokens each) in micro-batches of "
        f"{args.micro_batch}; LoRA r={args.r} alpha={args.alpha} on {args.lora_layers or 'all'} blocks "
        f"({next(iter(sizes.values())):,} parameters); "
        f"{args.threads} threads; CPU {cpu_name()} (native bf16: {native_bf16()})"
    )
    times = {name: [] for name in impls}
    for model, step, optimizer, _, dtype in impls.values():  # warm-up step, not timed
        time_step(model, step, batch, optimizer, dtype)
    for round_ in range(args.repeats):
        for name in rotated(impls, round_):
            model, step, optimizer, _, dtype = impls[name]
            times[name].append(time_step(model, step, batch, optimizer, dtype))
            print(f"  round {round_ + 1}: {name} {times[name][-1]:.2f} s/step", flush=True)

    tokens = args.batch * T
    speed = {name: tokens / statistics.median(t) for name, t in times.items()}
    last = args.rows[-1]
    print(
        f"\n| implementation:precision | s/step (median of {args.repeats}) | training tokens/s | ratio to {last} |"
    )
    print("|---|---|---|---|")
    for name, t in times.items():
        print(
            f"| {name} | {statistics.median(t):.2f} | {speed[name]:.1f} | {speed[name] / speed[last]:.2f}x |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Training tokens/s: train.py's LoRA step vs transformers + peft.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument("--batch", type=int, default=8, help="sequences per optimiser step")
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per forward pass")
    parser.add_argument("--prompt-len", type=int, default=200, help="prompt tokens per sequence (no loss)")
    parser.add_argument("--answer-len", type=int, default=48, help="answer tokens per sequence (loss)")
    parser.add_argument("--r", type=int, default=32, help="LoRA rank")
    parser.add_argument("--alpha", type=float, default=32, help="LoRA alpha")
    parser.add_argument("--dropout", type=float, default=0.05, help="LoRA dropout")
    parser.add_argument("--lora-layers", type=int, default=0, help="LoRA on the last N blocks only (0 = all)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed steps per implementation")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--rows",
        nargs="+",
        default=list(ROWS),
        help="implementation:precision rows to time "
        "(implementation: ours or transformers+peft; precision: float32 or bfloat16); ratios are to the last",
    )
    main(parser.parse_args())
