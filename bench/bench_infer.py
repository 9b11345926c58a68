"""Inference speed of GRISP on this CPU: beam search, the re-ranker's prefix cache, time per question.

1. beam: 8 beams x N new tokens (sampling, temperature 0.4, top-p 0.9) after the skeleton prompt of a
   demo question, no end-of-turn (both run exactly N steps): generate.beam_search on model.py (after
   cpu_speed.prepare_for_inference, and with plain nn.Linear) against transformers' `generate(num_beams=8,
   do_sample=True, temperature=0.4, top_p=0.9)` on the same weights. Round-robin (each round starts one
   further along), median over rounds.
2. rerank: the re-ranking calls of oracle-skeleton resolutions of the demo questions, replayed with the
   prefix cache and without it (one full forward per prompt, the reference), alternating who goes
   first; prompt tokens, tokens run, time per call, and how far the scores differ.
3. e2e: per-question timings (generate, search, constraint, rerank, validate, total) with oracle (gold)
   skeletons and with generated skeletons.
`--precision` (default float32) sets the weights of every model: GRISP's, the plain model.py one and
transformers'; the header names it and the CPU.

    python bench/bench_infer.py --adapter none
    python bench/bench_infer.py --adapter none --parts beam --rounds 5 --new-tokens 60
    python bench/bench_infer.py --adapter none --parts rerank e2e --questions 5
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.flags import positive_int  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from common import defaults  # noqa: E402
from common.jsonl import read_jsonl  # noqa: E402
from grisp.generate import beam_search  # noqa: E402
from grisp.options import Options  # noqa: E402
from grisp.pipeline import Grisp, GrispError  # noqa: E402
from grisp.prompts import rerank_messages, skeleton_messages  # noqa: E402
from grisp.rerank import ModelReranker  # noqa: E402
from grisp.skeleton import skeletonize  # noqa: E402
from grisp.sparql import SparqlError  # noqa: E402
from llm.cpu_speed import cpu_name, native_bf16, pick_precision  # noqa: E402
from llm.tokenizer import chat_prompt  # noqa: E402
from model import Transformer  # noqa: E402

STAGES = ["generate", "search", "constraint", "rerank", "validate", "total"]


def table(header: list[str], rows: list[list]) -> str:
    """A plain text table, numbers right-aligned."""
    cells = [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in row] for row in [header] + rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in cells
    ]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])


def speedup(reference: list[float], times: list[float]) -> float:
    """Median over rounds of reference / time: each round's pair ran back to back under the same load."""
    return statistics.median(r / t for r, t in zip(reference, times))


def oracle_skeleton(grisp: Grisp, sparql: str) -> str:
    """The gold query with every IRI the index knows turned into a placeholder with its label."""
    indices = grisp.indices
    return skeletonize(sparql, lambda iri: indices.item(iri).label if iri in indices else None).skeleton


# ---------------------------------------------------------------------------- 1. beam search
def bench_beam(grisp: Grisp, args: argparse.Namespace, question: str) -> None:
    from transformers import GenerationConfig, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    prompt = grisp.tokenizer.encode(chat_prompt(skeleton_messages(question)))
    dtype = getattr(torch, args.precision)  # GRISP's model was loaded in it too (main)
    plain = Transformer.from_pretrained(
        args.model_dir, dtype
    )  # nn.Linear everywhere: isolates the search itself
    hf = Qwen2ForCausalLM.from_pretrained(args.model_dir, dtype=dtype).eval()
    W, N = args.num_beams, args.new_tokens

    def ours(model, steps):
        return lambda: beam_search(
            model,
            prompt,
            [],
            num_beams=W,
            max_new_tokens=steps,
            sample=True,
            temperature=0.4,
            top_p=0.9,
            generator=torch.Generator().manual_seed(0),
        )

    def theirs(steps):
        config = GenerationConfig(
            num_beams=W,
            do_sample=True,
            temperature=0.4,
            top_p=0.9,
            top_k=0,
            max_new_tokens=steps,
            min_new_tokens=steps,
            pad_token_id=grisp.tokenizer.pad_id,
            eos_token_id=grisp.tokenizer.eos_ids,
        )
        ids = torch.tensor([prompt])
        return lambda: hf.generate(ids, generation_config=config)

    impls = {
        "beam_search, model.py prepared": ours(grisp.model, N),
        "beam_search, model.py plain": ours(plain, N),
        "transformers generate": theirs(N),
    }
    warmups = [ours(grisp.model, 3), ours(plain, 3), theirs(3)]
    with torch.inference_mode():
        for run in warmups:
            run()
        times = {name: [] for name in impls}
        for r in range(args.rounds):
            for name in rotated(impls, r):
                start = time.perf_counter()
                impls[name]()
                times[name].append(time.perf_counter() - start)
    reference = times["transformers generate"]
    print(
        f"\n## beam search: {W} beams x {N} new tokens after a {len(prompt)}-token prompt, {args.rounds} rounds "
        f"(speedup = median over rounds of transformers s / ours s in the same round)"
    )
    rows = [
        [name, statistics.median(t), min(t), f"{speedup(reference, t):.2f}x"] for name, t in times.items()
    ]
    print(table(["implementation", "median s", "best s", "speedup"], rows))


# ---------------------------------------------------------------------------- 2. re-ranking
def bench_rerank(grisp: Grisp, args: argparse.Namespace, questions: list[dict]) -> None:
    calls = []  # (question, marked query, alternatives, resolved items) of every re-rank in the oracle resolutions
    reranker = grisp.resolver.reranker

    def recording(question, marked_query, alternatives, resolved):
        calls.append((question, marked_query, alternatives, resolved))
        return reranker(question, marked_query, alternatives, resolved)

    grisp.resolver.reranker = recording
    for sample in questions:
        grisp.answer_from_skeletons(sample["question"], [oracle_skeleton(grisp, sample["sparql"])])
    grisp.resolver.reranker = reranker
    if not calls:
        print("\n## re-ranking: no re-ranking calls (no placeholder had search hits)")
        return

    per_call, scores, counts = {True: [], False: []}, {}, {}
    for r in range(args.rounds):
        for prefix_cache in rotated((False, True), r):
            reranker = ModelReranker(
                grisp.model, grisp.tokenizer, prefix_cache=prefix_cache, prompt_format=grisp.prompt_format
            )
            start = time.perf_counter()
            scores[prefix_cache] = [reranker(*call) for call in calls]
            per_call[prefix_cache].append((time.perf_counter() - start) / len(calls))
            counts[prefix_cache] = reranker.tokens
    diff = max(abs(a - b) for x, y in zip(scores[True], scores[False]) for a, b in zip(x, y))
    lengths = [
        len(grisp.tokenizer.encode(chat_prompt(rerank_messages(q, m, a, True, r, grisp.prompt_format)[0])))
        for q, m, a, r in calls
    ]
    full, cached = statistics.median(per_call[False]), statistics.median(per_call[True])
    print(
        f"\n## re-ranking: {len(calls)} calls from {len(questions)} oracle resolutions, {args.rounds} rounds "
        f"(median; speedup = median over rounds of full / cached)"
    )
    print(
        f"prompt tokens per call: mean {statistics.mean(lengths):.0f}, min {min(lengths)}, max {max(lengths)}; "
        f"run through the model with the prefix cache: mean {counts[True]['computed'] / len(calls):.0f}"
    )
    print(
        table(
            ["re-ranker", "ms per call", "tokens run per call", "speedup"],
            [
                [
                    "full forward (reference)",
                    1000 * full,
                    f"{counts[False]['computed'] / len(calls):.0f}",
                    "1.00x",
                ],
                [
                    "prefix cache",
                    1000 * cached,
                    f"{counts[True]['computed'] / len(calls):.0f}",
                    f"{speedup(per_call[False], per_call[True]):.2f}x",
                ],
            ],
        )
    )
    print(f"max |score difference| prefix cache vs full forward: {diff:.2e}")


# ---------------------------------------------------------------------------- 3. end to end
def bench_e2e(grisp: Grisp, questions: list[dict]) -> None:
    rows = []
    for mode in ("oracle", "generated"):
        for sample in questions:
            start = time.perf_counter()
            if mode == "oracle":
                answer = grisp.answer_from_skeletons(
                    sample["question"], [oracle_skeleton(grisp, sample["sparql"])]
                )
            else:
                answer = grisp.answer(sample["question"])
            timings = answer.timings | {"total": time.perf_counter() - start}
            rerank_calls = sum("reranked" in e for e in answer.trace)
            beams = [
                len(grisp.tokenizer.encode(e["skeleton"])) for e in answer.trace if e["event"] == "skeleton"
            ]
            rows.append(
                [
                    f"{sample['id']} {mode}",
                    *(timings.get(stage, 0.0) for stage in STAGES),
                    max(beams, default=0),
                    rerank_calls,
                    answer.backtracks,
                    "yes" if answer.sparql else answer.failure,
                ]
            )
    print(
        "\n## end to end: seconds per question (oracle = gold skeleton, generated = beam search; "
        "beam tokens = the longest beam's length, about the decoding steps)"
    )
    print(table(["question", *STAGES, "beam tokens", "reranks", "backtracks", "answer"], rows))
    for mode in ("oracle", "generated"):
        mine = [r for r in rows if r[0].endswith(mode)]
        means = [statistics.mean(r[1 + i] for r in mine) for i in range(len(STAGES))]
        print(f"mean {mode}: " + ", ".join(f"{s} {m:.2f}" for s, m in zip(STAGES, means)))


def main(args: argparse.Namespace) -> int:
    # --- setup
    torch.set_num_threads(args.threads)
    adapter = None if args.adapter.lower() == "none" else args.adapter
    # auto resolved once, so that every model gets the same explicit precision
    args.precision, why_precision = pick_precision(args.precision, torch.device("cpu"))
    try:  # Options checks --max-new-tokens and --time-budget (GrispError)
        options = Options(
            max_new_tokens=args.max_new_tokens, time_budget=args.time_budget, precision=args.precision
        )
        grisp = Grisp(args.model_dir, adapter, args.index, args.endpoint, options, "cpu")
    except (GrispError, SparqlError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    questions = read_jsonl(args.questions_file)[: args.questions]
    print(f"config: {json.dumps(vars(args))}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"CPU {cpu_name()} (native bf16: {native_bf16()}); every model in {args.precision} ({why_precision})"
    )

    # --- the parts, cheapest first
    if "rerank" in args.parts:
        bench_rerank(grisp, args, questions)
    if "e2e" in args.parts:
        bench_e2e(grisp, questions)
    if "beam" in args.parts:
        bench_beam(grisp, args, max((q["question"] for q in questions), key=len))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    # model, index and knowledge graph
    parser.add_argument(
        "--model-dir", default=str(defaults.MODEL_DIR), help="base model directory (get_model.py)"
    )
    parser.add_argument(
        "--adapter", default=str(defaults.ADAPTER_DIR), help="LoRA adapter directory, or 'none'"
    )
    parser.add_argument(
        "--index", default=str(defaults.DEMO_INDEX_DIR), help="search index directory (build_index.py)"
    )
    parser.add_argument(
        "--endpoint", default=defaults.ENDPOINT_URL, help="SPARQL endpoint URL (python endpoint.py start)"
    )
    parser.add_argument(
        "--questions-file", default=str(defaults.DEMO_DIR / "questions.jsonl"), help="benchmark JSONL"
    )
    # what to measure
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["rerank", "e2e", "beam"],
        choices=["rerank", "e2e", "beam"],
        help="which measurements to run",
    )
    parser.add_argument("--questions", type=int, default=3, help="first N questions of --questions-file")
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="timed rounds per implementation (median)"
    )
    parser.add_argument("--num-beams", type=int, default=8, help="beam width of the beam part")
    parser.add_argument("--new-tokens", type=int, default=60, help="new tokens per beam in the beam part")
    parser.add_argument(
        "--max-new-tokens", type=int, default=160, help="skeleton length limit in the e2e part"
    )
    parser.add_argument(
        "--time-budget", type=float, default=60.0, help="seconds per question in the e2e part"
    )
    parser.add_argument(
        "--precision",
        default="float32",
        choices=["float32", "bfloat16", "auto"],
        help="weights of every model (GRISP's, the plain model.py one, transformers'); auto = "
        "what infer.py runs on this CPU (bfloat16 with native bf16, else float32), resolved "
        "once for all",
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    sys.exit(main(parser.parse_args()))
