"""Training speed of train.py's step against transformers + peft on the same model, LoRA and batch.

One optimiser step = a batch of `--batch` sequences in micro-batches of `--micro-batch`, each of
`--prompt-len` prompt tokens and `--answer-len` answer tokens (the skeleton task: loss on the answer
tokens), forward + backward + AdamW. Ours computes logits only at the answer positions (loss.py);
the reference is the standard transformers recipe, `model(input_ids, labels=labels)` with -100 on the
prompt, on a `peft.get_peft_model` with the same LoraConfig. Both models live in this process and
the rounds alternate (ours, reference, ours, ...) so that load from other processes hits both alike;
the table shows median training tokens/s and the ratio ours / reference (> 1: ours is faster).

    python bench/bench_train.py                       # LoRA r=32 on all 24 blocks
    python bench/bench_train.py --lora-layers 8       # the CPU fast mode (LoRA on the last 8 blocks)
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import defaults  # noqa: E402
import lora  # noqa: E402
from model import Transformer  # noqa: E402


def ours(args, layers: list[int] | None):
    """Our model with LoRA and a `step(tokens, answer_mask)` closure for one micro-batch."""
    model = Transformer.from_pretrained(args.model_dir)
    lora.inject_lora(model, args.r, args.alpha, args.dropout, layers=layers)
    lora.mark_only_lora_trainable(model)
    model.train()

    def step(tokens, at):
        # position t predicts token t + 1: the loss positions are the answer mask shifted left by one
        at_prev = torch.zeros_like(at)
        at_prev[:, :-1] = at[:, 1:]
        logits = model(tokens, logits_at=at_prev)  # [N, V]
        return torch.nn.functional.cross_entropy(logits, tokens[at])
    return model, step


def reference(args, layers: list[int] | None):
    """transformers' Qwen2ForCausalLM + peft LoRA with the same config, trained the standard way."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM
    model = Qwen2ForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    config = LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=args.dropout, target_modules=list(lora.DEFAULT_TARGETS),
                        layers_to_transform=layers, task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.train()

    def step(tokens, at):
        labels = tokens.masked_fill(~at, -100)  # transformers shifts the labels itself
        return model(input_ids=tokens, labels=labels).loss
    return model, step


def time_step(model, step, batch: list[tuple[torch.Tensor, torch.Tensor]], optimizer) -> float:
    """Seconds for one optimiser step over the micro-batches (gradient accumulation)."""
    started = time.perf_counter()
    for tokens, at in batch:
        (step(tokens, at) / len(batch)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if not (Path(args.model_dir) / "config.json").exists():
        sys.exit(f"error: no model at {args.model_dir}; run `python get_model.py` or pass --model-dir")
    n_layers = json.loads((Path(args.model_dir) / "config.json").read_text())["num_hidden_layers"]
    layers = list(range(n_layers))[-args.lora_layers:] if args.lora_layers else None
    impls = {}
    for name, build in (("ours", ours), ("transformers+peft", reference)):
        model, step = build(args, layers)
        params = [p for p in model.parameters() if p.requires_grad]
        impls[name] = (model, step, torch.optim.AdamW(params, lr=1e-5), sum(p.numel() for p in params))
    assert impls["ours"][3] == impls["transformers+peft"][3], f"LoRA sizes differ: {impls['ours'][3]} vs {impls['transformers+peft'][3]}"

    T = args.prompt_len + args.answer_len
    batch = []
    for _ in range(args.batch // args.micro_batch):
        tokens = torch.randint(100, 20000, (args.micro_batch, T))
        at = torch.zeros(args.micro_batch, T, dtype=torch.bool)
        at[:, args.prompt_len:] = True  # the answer tokens are the labels
        batch.append((tokens, at))
    print(f"batch {args.batch} x {T} tokens ({args.answer_len} answer tokens each) in micro-batches of {args.micro_batch}; "
          f"LoRA r={args.r} alpha={args.alpha} on {args.lora_layers or 'all'} blocks ({impls['ours'][3]:,} parameters); "
          f"{args.threads} threads")
    times = {name: [] for name in impls}
    for name, (model, step, optimizer, _) in impls.items():  # warm-up step, not timed
        time_step(model, step, batch, optimizer)
    for round_ in range(args.repeats):
        for name, (model, step, optimizer, _) in impls.items():
            times[name].append(time_step(model, step, batch, optimizer))
            print(f"  round {round_ + 1}: {name} {times[name][-1]:.2f} s/step", flush=True)

    tokens = args.batch * T
    speed = {name: tokens / statistics.median(t) for name, t in times.items()}
    print(f"\n| implementation | s/step (median of {args.repeats}) | training tokens/s | ratio |")
    print("|---|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t):.2f} | {speed[name]:.1f} | {speed[name] / speed['transformers+peft']:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Training tokens/s: train.py's LoRA step vs transformers + peft.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument("--batch", type=int, default=8, help="sequences per optimiser step")
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per forward pass")
    parser.add_argument("--prompt-len", type=int, default=200, help="prompt tokens per sequence (no loss)")
    parser.add_argument("--answer-len", type=int, default=48, help="answer tokens per sequence (loss)")
    parser.add_argument("--r", type=int, default=32, help="LoRA rank")
    parser.add_argument("--alpha", type=float, default=32, help="LoRA alpha")
    parser.add_argument("--dropout", type=float, default=0.05, help="LoRA dropout")
    parser.add_argument("--lora-layers", type=int, default=0, help="LoRA on the last N blocks only (0 = all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per implementation")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    main(parser.parse_args())
