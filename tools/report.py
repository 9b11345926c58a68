"""The tables of docs/results.md and docs/results-*.md, printed from evaluate.py run directories
(docs/method.md section 7).

Every number in those tables comes from a run directory's summary.json or predictions.jsonl; this
script prints the tables from them, so a table can be re-made to the digit after a re-run.

    python tools/report.py systems ~/.cache/grisp/eval/demo-{none,no-rerank,no-beam-search}  # one row per run
    python tools/report.py skeletons ~/.cache/grisp/eval/{demo,qald10-dev}-skeletons         # one column per run
    python tools/report.py shapes ~/.cache/grisp/eval/{grisp-wwq-0.5b-float32,grisp-mix-0.5b-auto}/demo-none
    python tools/report.py compare ~/.cache/grisp/eval/wwq-dev-full-none ~/.cache/grisp/eval/wwq-dev-full-no-rerank
    python tools/report.py agent ~/.cache/grisp/eval/demo-agent                  # evaluate.py --system agent
    python tools/report.py risk RUN_A RUN_B --without-retry --plot risk.png   # precision at each coverage (coverage.py)
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
from common.jsonl import read_jsonl  # noqa: E402
from evaluate import ABLATIONS, first_per_id, pct  # noqa: E402
from grisp import coverage  # noqa: E402
from grisp.skeleton_score import SHAPES  # noqa: E402

# row names of the systems table, by evaluate.py --ablation (the paper's names)
SYSTEM_NAMES = {
    "none": "GRISP (all mechanisms)",
    "no-rerank": "w/o re-ranking",
    "no-beam-search": "w/o beam search",
    "no-kg-guidance": "w/o KG guidance",
    "no-constrained": "w/o constrained search",
    "no-backtracking": "w/o backtracking",
    "all-disabled": "all disabled",
    "rerank-only": "re-ranking only",
}
SHAPE_NAMES = {"aggregate": "aggregate (COUNT ...)"}


def load_summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.exists():
        sys.exit(f"error: {path} does not exist (is {run_dir} a finished evaluate.py run?)")
    return json.loads(path.read_text(encoding="utf-8"))


def load_predictions(run_dir: Path) -> list[dict]:
    path = run_dir / "predictions.jsonl"
    if not path.exists():
        sys.exit(f"error: {path} does not exist (is {run_dir} an evaluate.py run?)")
    return read_jsonl(path)


def system_name(summary: dict, with_adapter: bool, shared: frozenset = frozenset()) -> str:
    """The ablation's name, then what else sets the run apart: gold skeletons, changed knobs (but not
    the `shared` notes, which every run of the table has), the adapter, another re-ranker's adapter (for
    an agent run: the agent and its model)."""
    config = summary["config"]
    if config.get("system") == "agent":
        return f"GRASP agent ({agent_model(config)})"
    notes = ["gold skeletons"] if config.get("oracle_skeleton") else []
    notes += [note for note in option_notes(config) if note not in shared]
    notes += [adapter_name(config["adapter"])] if with_adapter else []
    notes += [f"re-ranker {adapter_name(config['rerank_adapter'])}"] if config.get("rerank_adapter") else []
    name = SYSTEM_NAMES.get(config["ablation"], config["ablation"])
    return f"{name} ({', '.join(notes)})" if notes else name


def adapter_name(path: str) -> str:
    """A run's adapter in a few words: the run name for a training run's adapter/ or best/."""
    path = Path(path)
    return path.parent.name if path.name in ("adapter", "best") else path.name


def option_notes(config: dict) -> list[str]:
    """The run's options that its ablation's preset does not set, as `name=value`."""
    preset = ABLATIONS.get(config["ablation"], {})
    return [
        f"{k}={v}" for k, v in sorted((config.get("options") or {}).items()) if preset.get(k, object()) != v
    ]


def systems_table(run_dirs: list[Path]) -> list[str]:
    """One row per full-system run: F1, what was answered and its precision, what was declined (and of the
    questions the index cannot name), seconds, backtracks and where the questions ended."""
    lines = [
        "| system | F1 | answered | precision | wrong | declined | index lacks: declined | EM | "
        "s/question (median / mean) | backtracks/sample | dead end / wrong / correct | scored |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summaries = [load_summary(d) for d in run_dirs]
    for run_dir, s in zip(run_dirs, summaries):
        if "f1" not in s:
            sys.exit(f"error: {run_dir} is a --skeleton-only run; use `tools/report.py skeletons`")
    several_adapters = len({s["config"]["adapter"] for s in summaries}) > 1
    shared = frozenset.intersection(*(frozenset(option_notes(s["config"])) for s in summaries))
    for s in summaries:
        f, t = s["failures"], s.get("trust") or {}
        lacks = t.get("index_lacks") or {}
        trust = (
            f"{t['answered']} | {pct(t['precision'])} | {t['wrong']} | {t['declined']} | "
            f"{lacks['declined']} of {lacks['questions']}"
            if t
            else "- | - | - | - | -"
        )
        lines.append(
            f"| {system_name(s, several_adapters, shared)} | {100 * s['f1']:.1f} | {trust} | {100 * s['em']:.1f} | "
            f"{s['seconds']['median']:.1f} / {s['seconds']['mean']:.1f} | {s['backtracks_per_sample']:.2f} | "
            f"{f['dead_end']} / {f['wrong_answer']} / {f['correct']}{others(f)} | {s['scored']} |"
        )
    return lines


# coverage levels of the risk table (the full coverage of each curve is added)
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def risk_curves(run_dirs: list[Path], without_retry: bool) -> list[tuple[str, list[dict]]]:
    """(name, coverage.risk_coverage points) per run, and per run its retry's answers taken back if asked
    (where the retry answered any)."""
    curves = []
    for run_dir in run_dirs:
        summary, records = load_summary(run_dir), list(first_per_id(load_predictions(run_dir)).values())
        # the curve sweeps the threshold, so the run's own threshold and precision are no part of its name
        shared = frozenset(
            n for n in option_notes(summary["config"]) if n.startswith(("min_confidence=", "precision="))
        )
        name = system_name(summary, False, shared)
        curves.append((name, coverage.risk_coverage(records)))
        if without_retry and any(r.get("retried") for r in records):  # w/o re-ranking nothing is retried
            curves.append((f"{name}, w/o the retry", coverage.risk_coverage(coverage.without_retry(records))))
    return curves


def risk_table(curves: list[tuple[str, list[dict]]]) -> list[str]:
    """Precision (mean F1 of the answered) at each coverage level as the confidence threshold moves; the
    threshold that reaches the level in parentheses; the last column is the curve's full coverage."""
    lines = [
        "| system | " + " | ".join(f"{100 * c:.0f}%" for c in LEVELS) + " | all answered |",
        "|---|" + "---|" * (len(LEVELS) + 1),
    ]
    for name, points in curves:
        cells = []
        for level in LEVELS:
            point = coverage.at_coverage(points, level)
            cells.append("-" if point is None else f"{pct(point['precision'])} ({point['threshold']:.2f})")
        last = points[-1] if points else None
        cells.append("-" if last is None else f"{pct(last['precision'])} at {pct(last['coverage'])}%")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def plot_risk(curves: list[tuple[str, list[dict]]], path: Path) -> None:
    """Precision against coverage, one line per curve, to an image whose format the suffix names (.png;
    .svg is text, the same bytes for the same runs: what the repository keeps)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: draw to a file
    matplotlib.rcParams["svg.hashsalt"] = "grisp"  # stable element ids in an SVG
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.4, 4.2), dpi=120)
    for name, points in curves:
        axes.plot(  # one confidence for every answer (w/o re-ranking): a single point, drawn as a dot
            [100 * p["coverage"] for p in points],
            [100 * p["precision"] for p in points],
            label=name,
            marker="o" if len(points) == 1 else None,
        )
    axes.set_xlabel("coverage: questions answered (%)")
    axes.set_ylabel("precision: mean F1 of the answered (%)")
    axes.set_xlim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, metadata={"Date": None} if Path(path).suffix == ".svg" else None)
    print(f"wrote {path}")


def others(failures: dict) -> str:
    """The failures the systems table has no column for (timeouts, endpoint errors, ...), e.g. " (2 timeout)"."""
    shown = ("dead_end", "wrong_answer", "correct")
    rest = [f"{n} {kind.replace('_', ' ')}" for kind, n in failures.items() if n and kind not in shown]
    return f" ({', '.join(rest)})" if rest else ""


def column_heads(run_dirs: list[Path]) -> list[str]:
    """Each run's directory name, with its parent's where names repeat (the same group of two adapters'
    runs.sh output: grisp-wwq-0.5b-float32/demo-none, grisp-mix-0.5b-auto/demo-none)."""
    names = [d.name for d in run_dirs]
    return [f"{d.parent.name}/{d.name}" if names.count(d.name) > 1 else d.name for d in run_dirs]


def shapes_table(run_dirs: list[Path]) -> list[str]:
    """One column per full-system run: F1 by the question's shape (from its gold query, skeleton_score.shape);
    cells: questions scored, F1 %."""
    summaries = [load_summary(d) for d in run_dirs]
    for run_dir, s in zip(run_dirs, summaries):
        if "f1_by_shape" not in s:
            sys.exit(
                f"error: {run_dir} has no F1 by shape (a --skeleton-only run, or scored before shapes "
                f"were recorded: re-score it with evaluate.py --score-only)"
            )
    heads = column_heads(run_dirs)
    lines = ["| shape | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for shape in SHAPES:
        blocks = [s["f1_by_shape"].get(shape) for s in summaries]
        if any(blocks):
            lines.append(
                f"| {SHAPE_NAMES.get(shape, shape)} | "
                + " | ".join(f"{b['scored']}: {100 * b['f1']:.1f}" if b else "-" for b in blocks)
                + " |"
            )
    lines.append("| all | " + " | ".join(f"{s['scored']}: {100 * s['f1']:.1f}" for s in summaries) + " |")
    return lines


def agent_model(config: dict) -> str:
    """The agent's model in a few words: the backend, the model's name or directory, a local adapter."""
    model = config["agent"]["model"]
    if model.get("model") or model["backend"] != "local":
        return f"{model['backend']}: {model.get('model')}"
    adapter = f" + {Path(model['adapter']).name}" if model.get("adapter") else ""
    return f"local: {Path(model['model_dir']).name}{adapter}"


def agent_table(run_dirs: list[Path]) -> list[str]:
    """One row per evaluate.py --system agent run: scores, time, steps, function calls and how runs ended."""
    lines = [
        "| run | model | F1 | EM | s/question (median / mean) | steps/question | calls/question "
        "| calls by function (per question) | ended | scored |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run_dir in run_dirs:
        s = load_summary(run_dir)
        if "agent" not in s:
            sys.exit(
                f"error: {run_dir} is not an evaluate.py --system agent run; use `tools/report.py systems`"
            )
        a = s["agent"]
        calls = ", ".join(
            f"{name} {n:.2f}" for name, n in sorted(a["calls_per_question"].items(), key=lambda kv: -kv[1])
        )
        ended = ", ".join(
            f"{status} {n}" for status, n in sorted(a["statuses"].items(), key=lambda kv: -kv[1])
        )
        lines.append(
            f"| {run_dir.name} | {agent_model(s['config'])} | {100 * s['f1']:.1f} | {100 * s['em']:.1f} | "
            f"{s['seconds']['median']:.1f} / {s['seconds']['mean']:.1f} | {a['steps_mean']:.2f} | "
            f"{a['calls_mean']:.2f} | {calls} | {ended} | {s['scored']} |"
        )
    return lines


def skeleton_cell(block: dict | None) -> str:
    if not block:
        return "-"
    return f"{block['questions']}: {100 * block['structure']:.1f}, {100 * block['label']:.1f}"


def skeletons_table(run_dirs: list[Path]) -> list[str]:
    """One column per --skeleton-only run; cells: questions, structure match %, label match %."""
    summaries = [load_summary(d) for d in run_dirs]
    for run_dir, s in zip(run_dirs, summaries):
        if "by_shape" not in s:
            sys.exit(f"error: {run_dir} is not a --skeleton-only run; use `tools/report.py systems`")
    heads = column_heads(run_dirs)
    lines = ["| shape | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for shape in SHAPES:  # most specific first, as skeleton_score assigns them
        cells = [skeleton_cell(s["by_shape"].get(shape)) for s in summaries]
        if any(c != "-" for c in cells):
            lines.append(f"| {SHAPE_NAMES.get(shape, shape)} | " + " | ".join(cells) + " |")
    lines.append("| all | " + " | ".join(skeleton_cell(s["all"]) for s in summaries) + " |")
    extra = []
    for s in summaries:  # the median over the run's selected questions (summaries before it have none)
        median = s.get("seconds", {}).get("median")
        extra.append(
            f"{s['unskeletonisable']} not skeletonisable, {s['no_skeleton']} without a skeleton"
            + (f", median {median:.1f} s" if median is not None else "")
        )
    lines.append("| not scored | " + " | ".join(extra) + " |")
    return lines


def outcome(record: dict) -> str:
    """ "not scored" (its gold query failed or returned nothing), else the record's failure kind or "correct"."""
    if record.get("f1") is None:
        return "not scored"
    return record.get("failure") or "correct"


def query_line(record: dict) -> str | None:
    """The predicted query without its PREFIX lines."""
    sparql = record.get("sparql")
    return sparql and " ".join(line for line in sparql.splitlines() if not line.upper().startswith("PREFIX"))


def compare(run_a: Path, run_b: Path, show: int) -> list[str]:
    """Question by question: how the outcomes moved from run A to run B, then the first `show` that changed."""
    a, b = (first_per_id(load_predictions(d)) for d in (run_a, run_b))
    common = [i for i in a if i in b]
    moves = Counter((outcome(a[i]), outcome(b[i])) for i in common)
    lines = [
        f"{len(common)} questions in both runs ({run_a.name} -> {run_b.name})",
        "",
        "| A | B | questions |",
        "|---|---|---|",
    ]
    lines += [f"| {x} | {y} | {n} |" for (x, y), n in sorted(moves.items(), key=lambda kv: (-kv[1], kv[0]))]
    changed = [i for i in common if outcome(a[i]) != outcome(b[i])]
    for i in changed[:show]:
        lines += [
            "",
            f"{i}: {a[i]['question']}  ({outcome(a[i])} -> {outcome(b[i])})",
            f"  A: {query_line(a[i])}",
            f"  B: {query_line(b[i])}",
        ]
    return lines


def main(args: argparse.Namespace) -> None:
    for run_dir in args.run_dirs:
        if not run_dir.is_dir():
            sys.exit(f"error: no run directory {run_dir}")
    if args.show < 0:
        sys.exit(f"error: --show {args.show}: the number of changed questions to print is 0 or more")
    if args.table == "systems":
        lines = systems_table(args.run_dirs)
    elif args.table == "skeletons":
        lines = skeletons_table(args.run_dirs)
    elif args.table == "shapes":
        lines = shapes_table(args.run_dirs)
    elif args.table == "agent":
        lines = agent_table(args.run_dirs)
    elif args.table == "risk":
        curves = risk_curves(args.run_dirs, args.without_retry)
        lines = risk_table(curves)
        if args.plot:
            plot_risk(curves, args.plot)
    else:
        if len(args.run_dirs) != 2:
            sys.exit("error: compare takes exactly two run directories (A, then B)")
        lines = compare(*args.run_dirs, show=args.show)
    print("\n".join(lines))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "table",
        choices=["systems", "skeletons", "shapes", "agent", "compare", "risk"],
        help="systems: one row per full-system run (F1, EM, s/question, backtracks, failures); "
        "skeletons: one column per --skeleton-only run (structure and label match by shape); "
        "shapes: one column per full-system run (F1 by the gold query's shape); "
        "agent: one row per --system agent run (steps, function calls, how runs ended); "
        "compare: outcome transitions from run A to run B; "
        "risk: precision at each coverage level as the confidence threshold moves",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="evaluate.py run directories (--out)")
    parser.add_argument(
        "--without-retry",
        action="store_true",
        help="risk: add each run with its retry's answers taken back (the paper's search: the "
        "first pass is the same, so those questions would have had no answer)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="IMAGE",
        help="risk: also draw the curves to this file (.png, or .svg: text, the same bytes for the same runs)",
    )
    parser.add_argument(
        "--show", type=int, default=0, help="compare: print the first N questions whose outcome changed"
    )
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
