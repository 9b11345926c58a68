"""Beam search over model.py's Transformer: GRISP's skeleton generation (paper section 3, stage 1;
docs/method.md section 2.5).

GRISP decodes several skeletons per question with beam search (width 8) that samples its candidate
continuations (temperature 0.4, top-p 0.9). Two rankings (`ranking`, docs/method.md section 2.5):
"sum", this code's first rule, scores a beam by the sum of the model's token log-probabilities at
temperature 1, so scores stay comparable whether or not we sample and sampling only decides which
continuations are explored; "length-normalised" is Hugging Face's beam sampling as the reference runs
it: sums of the processed (temperature, top-p) log-probabilities, finished hypotheses divided by their
length. With `sample=False` the search is the classic deterministic beam search (tests: the same hypotheses
and scores as transformers' `generate` with length_penalty 0 for "sum" and 1 for "length-normalised";
the finished ones are listed before any cut off at `max_new_tokens`, where transformers ranks the two
together), and width 1 is greedy decoding.

The prompt is prefilled once (`prefill`), through a PromptCache (prompt_cache.py: a start it shares
with the previous prompt, such as the skeleton prompt's instructions, is not recomputed); its KV cache is
copied into the W beam rows and reordered whenever beams move (`KVCache.reorder`). Each step then takes
the candidate continuations (`candidates`), keeps W beams and the ended hypotheses (`select`), and runs
the W new tokens only (`decode_one_token`). `beam_search_stream` yields each hypothesis as soon as no
running beam can overtake it ("sum" ranking), so a caller that needs only the best few stops the search
there (exact). Choosing the continuations takes a few linear passes over the W x V scores (top-p from
a partial top-k, no full sort), so a step costs little more than the model's forward (bench/bench_infer.py
measures it).

    from grisp.generate import beam_search
    hyps = beam_search(model, prompt_ids, eos_ids, num_beams=8, sample=True, temperature=0.4, top_p=0.9)

At the end, `greedy` and a tiny chat command line check the base model itself:

    python -m grisp.generate --chat "What is the capital of France?"
    python -m grisp.generate --chat "Write a SPARQL query for the capital of France" --max-new-tokens 200
Tests: python -m pytest tests/test_generate.py
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from common import defaults
from llm.cpu_speed import pick_dtype, prepare_for_inference
from llm.prompt_cache import PromptCache
from llm.tokenizer import DEFAULT_SYSTEM, Tokenizer, chat_prompt
from model import KVCache, Transformer, pick_device

RANKINGS = ("sum", "length-normalised")  # how beams and hypotheses are scored (beam_search)


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without the end-of-turn id
    score: float  # sum of token log-probabilities, the end-of-turn token included ("sum"); or the sum
    # of processed log-probabilities / generated tokens ("length-normalised")
    finished: bool  # ended with an end-of-turn id (False: cut at max_new_tokens)


def top_p_tokens(
    logprobs: torch.Tensor, top_p: float, min_keep: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of logprobs [B, V], the smallest set of tokens whose probability reaches top_p (but at
    least the `min_keep` most probable), as LongTensors rows [M] and tokens [M].

    A sharp distribution's nucleus is a handful of tokens, so only the top k tokens are sorted (k = 64,
    then 8x more) until they hold top_p of every row: sorting all of 8 x 152k logits costs half a
    decoding step on a CPU. Every token past the top k has at least top_p of mass before it, so the
    sets equal those of a full sort."""
    B, V = logprobs.shape
    k = min(V, 64)
    while True:
        top_lp, order = logprobs.topk(k, dim=-1)  # [B, k], best first
        probs = top_lp.exp()
        cum = probs.cumsum(-1)  # [B, k]
        if k == V or bool((cum[:, -1] >= top_p).all()):
            break
        k = min(V, 8 * k)
    keep = (cum - probs) < top_p  # [B, k] keep a token if the mass before it is < top_p
    keep[:, :min_keep] = True
    rows = torch.arange(B, device=logprobs.device)[:, None].expand(B, k)
    return rows[keep], order[keep]


def top_p_mask(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool mask [B, V] of the smallest set of tokens per row whose probability reaches top_p."""
    rows, tokens = top_p_tokens(logprobs, top_p)
    mask = torch.zeros_like(logprobs, dtype=torch.bool)
    mask[rows, tokens] = True
    return mask


def sample_without_replacement(
    weights: torch.Tensor, allowed: torch.Tensor, size: int, n: int, generator: torch.Generator | None
) -> torch.Tensor:
    """n distinct entries of `allowed` drawn with probabilities softmax(weights), exactly as
    `torch.multinomial(probs, n)` draws them from the dense probabilities (zero off `allowed`).

    weights [M] float, allowed [M] their flat indices into a vector of `size` entries (M >= n).
    torch.multinomial without replacement is an exponential race: the top n of p / q with q ~ Exp(1)
    drawn for all `size` entries. The race is run here on the M allowed entries only, with the same
    `size` draws, so a seed picks the same tokens."""
    q = torch.empty(size, dtype=weights.dtype, device=weights.device).exponential_(1, generator=generator)
    probs = torch.softmax(weights, dim=0)  # [M]
    return allowed[(probs / q[allowed]).topk(n).indices]  # [n]


# ---------------------------------------------------------------------------- the two ranking rules
class SumRanking:
    """ranking="sum" (this code's first rule): a beam's score is the sum of its raw (temperature 1) token
    log-probabilities, so sampling only decides which continuations are explored. Each step looks at 2W
    continuations (sampled: drawn from softmax(score / temperature) over each beam's top-p set); a
    finished hypothesis keeps its score. Scores only fall, so a finished hypothesis at least as good as
    the best running beam is final and can be yielded at once; out of steps, the best running beams
    fill the places left, unfinished."""

    yields_early, ranks_cut_off_beams = True, False

    def candidates(self, beams: int, eos_ids: list[int]) -> int:
        return 2 * beams

    def min_keep(self, eos_ids: list[int]) -> int:  # tokens a top-p set keeps at least
        return 1

    def logprobs(
        self, logits: torch.Tensor, scaled: torch.Tensor | None, rows, tokens, temperature: float
    ) -> torch.Tensor:
        """The log-probabilities a beam's score adds up: the raw ones, whatever was sampled."""
        return torch.log_softmax(logits.float(), dim=-1)

    def sampling_temperature(
        self, temperature: float
    ) -> float:  # candidates are drawn from softmax(score / this)
        return temperature

    def final(self, score: float, length: int) -> float:  # a hypothesis's score from its beam's
        return score


class LengthNormalisedRanking:
    """ranking="length-normalised" (Hugging Face's beam search and beam sampling, what the reference
    decodes with; length_penalty 1.0, early_stopping False): a beam's score is the sum of the *processed*
    log-probabilities (sampled: as Hugging Face's logits processors leave them, log_softmax(logits) /
    temperature, -inf outside the top-p set of at least len(eos_ids) + 1 tokens, not renormalised); each
    step looks at max(2, 1 + len(eos_ids)) x W continuations
    (sampled: drawn from softmax(score) over all W x V without replacement); a hypothesis scores
    score / (generated tokens, the end-of-turn id included), and at the last step the cut-off beams are
    ranked with the finished ones. A longer hypothesis can still overtake, so nothing is final early."""

    yields_early, ranks_cut_off_beams = False, True

    def candidates(self, beams: int, eos_ids: list[int]) -> int:
        return max(2, 1 + len(eos_ids)) * beams

    def min_keep(self, eos_ids: list[int]) -> int:
        return len(eos_ids) + 1

    def logprobs(
        self, logits: torch.Tensor, scaled: torch.Tensor | None, rows, tokens, temperature: float
    ) -> torch.Tensor:
        processed = torch.log_softmax(logits.float(), dim=-1)
        if scaled is None:  # not sampled: nothing processed
            return processed
        processed = processed / temperature
        return torch.full_like(processed, float("-inf")).index_put((rows, tokens), processed[rows, tokens])

    def sampling_temperature(self, temperature: float) -> float:  # the scores are already scaled
        return 1.0

    def final(self, score: float, length: int) -> float:
        return score / length


Ranking = SumRanking | LengthNormalisedRanking
RANKING_RULES: dict[str, Ranking] = {"sum": SumRanking(), "length-normalised": LengthNormalisedRanking()}


# ---------------------------------------------------------------------------- beam search
def beam_search(model: Transformer, prompt: list[int], eos_ids: list[int], **settings) -> list[Hypothesis]:
    """All hypotheses of `beam_search_stream` (same arguments), best first."""
    return list(beam_search_stream(model, prompt, eos_ids, **settings))


def prefill(
    model: Transformer,
    prompt: list[int],
    num_beams: int,
    max_new_tokens: int,
    use_cache: bool,
    prompt_cache: PromptCache | None,
) -> tuple[torch.Tensor, KVCache | None]:
    """Run the prompt once: its next-token logits repeated for the W beams [W, V], and a KV cache of W
    rows holding the prompt with room for `max_new_tokens` more (None when use_cache is False)."""
    device = model.model.norm.weight.device
    if not use_cache:
        return model(torch.tensor([prompt], device=device), logits_at=-1).expand(
            num_beams, -1
        ), None  # [W, V]
    prompt_cache = prompt_cache or PromptCache(model)
    logits = prompt_cache.run(prompt)[None]  # [1, V]
    rows = torch.zeros(num_beams, dtype=torch.long, device=device)  # every beam starts as the prompt's row 0
    return logits.expand(num_beams, -1), prompt_cache.cache.copy_rows(rows, len(prompt) + max_new_tokens + 1)


def candidates(
    logits: torch.Tensor,
    beam_scores: torch.Tensor,
    rule: Ranking,
    n_candidates: int,
    eos_ids: list[int],
    sample: bool,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[list[int], list[int], list[float]]:
    """One step's candidate continuations, best first: (beam rows, tokens, scores), at most n_candidates.

    logits [W, V] are each beam's next-token logits, beam_scores [W] their scores (-inf: a dead beam).
    sample=False takes the best by score; sample=True draws without replacement over the tokens of each
    beam's top-p set of its temperature-scaled distribution, then ranks them by score."""
    scaled = rows = tokens = None
    if sample:  # each beam's top-p set of its temperature-scaled distribution
        scaled = torch.log_softmax(logits.float() / temperature, dim=-1)  # [W, V]
        rows, tokens = top_p_tokens(scaled, top_p, min_keep=rule.min_keep(eos_ids))
    scores = beam_scores[:, None] + rule.logprobs(
        logits, scaled, rows, tokens, temperature
    )  # [W, V] each continuation's
    W, V = scores.shape
    if sample:
        allowed = rows * V + tokens  # [M] flat indices into scores
        allowed = allowed[torch.isfinite(scores.flatten()[allowed])]  # dead beams continue nothing
        weights = scores.flatten()[allowed] / rule.sampling_temperature(temperature)  # [M]
        picked = sample_without_replacement(
            weights, allowed, W * V, min(n_candidates, len(allowed)), generator
        )
        picked = picked[scores.flatten()[picked].argsort(descending=True)]  # rank by score
    else:
        # the n best of all W*V continuations are among the n best of each row
        n = min(n_candidates, V)
        row_best, row_tokens = scores.topk(n, dim=-1)  # [W, n]
        best = row_best.flatten().topk(min(n, int(torch.isfinite(row_best).sum()))).indices
        picked = (best // n) * V + row_tokens.flatten()[best]
    return (picked // V).tolist(), (picked % V).tolist(), scores.flatten()[picked].tolist()


def select(
    rows: list[int],
    tokens: list[int],
    scores: list[float],
    beam_tokens: torch.Tensor,
    eos_ids: list[int],
    rule: Ranking,
    length: int,
    last_step: bool,
) -> tuple[list[Hypothesis], list[int], list[int], list[float]]:
    """Walk the candidates best first: an end-of-turn id among the W best ends a hypothesis, any other
    token continues its beam, until W beams run on. Returns the hypotheses ended this step (in candidate
    order; at the last step also the cut-off beams, if the rule ranks them) and the next beams' rows,
    tokens and scores (fewer than W if the candidates run out).

    beam_tokens [W, t] are the beams' generated tokens, `length` = t + 1 the candidates' length."""
    W = beam_tokens.shape[0]
    ended, next_rows, next_tokens, next_scores = [], [], [], []
    for rank, (row, token, score) in enumerate(zip(rows, tokens, scores)):
        if token in eos_ids:
            if rank < W:  # only an end among the W best counts (as in standard beam search)
                ended.append(Hypothesis(beam_tokens[row].tolist(), rule.final(score, length), True))
        else:
            if rule.ranks_cut_off_beams and last_step and rank < W:
                ended.append(
                    Hypothesis(beam_tokens[row].tolist() + [token], rule.final(score, length), False)
                )
            next_rows.append(row), next_tokens.append(token), next_scores.append(score)
        if len(next_rows) == W:
            break
    return ended, next_rows, next_tokens, next_scores


def decode_one_token(
    model: Transformer,
    tokens: torch.Tensor,
    cache: KVCache | None,
    prompt: list[int],
    beam_tokens: torch.Tensor,
) -> torch.Tensor:
    """The next-token logits [W, V] of the W beams after their newest `tokens` [W]: one token per beam
    over the (already reordered) KV cache, or without a cache the whole prompt + beam_tokens [W, t]
    recomputed."""
    if cache is not None:
        return model(tokens[:, None], cache=cache, logits_at=-1)  # [W, V]
    prompt_ids = torch.tensor([prompt], device=beam_tokens.device)  # [1, P]
    full = torch.cat([prompt_ids.expand(len(beam_tokens), -1), beam_tokens], dim=1)  # [W, P + t]
    return model(full, logits_at=-1)  # [W, V]


@torch.inference_mode()
def beam_search_stream(
    model: Transformer,
    prompt: list[int],
    eos_ids: list[int],
    num_beams: int = 8,
    max_new_tokens: int = 512,
    sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    ranking: str = "sum",
    prompt_cache: PromptCache | None = None,
) -> Iterator[Hypothesis]:
    """Up to `num_beams` hypotheses for `prompt`, best first (finished ones before cut-off ones), each
    yielded as soon as it is settled (the ranking rule says when: SumRanking, LengthNormalisedRanking
    above). A caller that stops iterating stops the search, so one that needs only the best few
    skeletons (grisp/pipeline.py) computes no more steps than those need, and gets exactly what the full
    search would rank first.

    Each step looks at the rule's number of candidate (beam, token) continuations: the best by score
    (sample=False), or drawn without replacement over the tokens of each beam's top-p set (sample=True),
    then ranked by score. Only an end-of-turn id among the W best finishes a hypothesis. The search stops
    when W are finished and the best running beam cannot beat the worst of them (exact for "sum";
    for "length-normalised" Hugging Face's heuristic, its score divided by its length now), after `max_new_tokens`
    steps at the latest, when running beams fill the W places as `finished=False`. use_cache=False
    recomputes every step from scratch (slow; the tests' reference).

    prompt_cache: a PromptCache that runs the prompt, computing only what it does not share with the
        cache's previous prompt (e.g. the skeleton prompt's fixed start); by default a fresh one.
    """
    assert num_beams >= 1 and temperature > 0 and 0 < top_p <= 1, "bad beam search settings"
    assert ranking in RANKINGS, f"ranking must be one of {RANKINGS}, got {ranking!r}"
    W, device, rule = num_beams, model.model.norm.weight.device, RANKING_RULES[ranking]
    n_candidates = rule.candidates(W, eos_ids)  # continuations looked at per step
    # W identical rows; only row 0 is live at first, so the first step does not pick duplicates
    beam_scores = torch.full((W,), float("-inf"), device=device)
    beam_scores[0] = 0.0
    beam_tokens = torch.zeros(W, 0, dtype=torch.long, device=device)  # [W, t]
    finished: list[Hypothesis] = []
    logits, cache = prefill(model, prompt, W, max_new_tokens, use_cache, prompt_cache)  # [W, V]
    settled = 0  # the leading finished hypotheses already yielded
    running = True  # beams still run (not all ended)

    for step in range(max_new_tokens):
        length, last_step = (
            step + 1,
            step == max_new_tokens - 1,
        )  # length: the candidates', new token included
        rows, tokens, scores = candidates(
            logits, beam_scores, rule, n_candidates, eos_ids, sample, temperature, top_p, generator
        )
        ended, next_rows, next_tokens, next_scores = select(
            rows, tokens, scores, beam_tokens, eos_ids, rule, length, last_step
        )
        finished = sorted(finished + ended, key=lambda h: h.score, reverse=True)[:W]
        best_running = rule.final(max(next_scores, default=float("-inf")), length)
        running = bool(next_rows)  # False: every candidate ended its hypothesis, nothing runs on
        if not running or (len(finished) == W and finished[-1].score >= best_running):
            break
        if (
            rule.yields_early
        ):  # yield what no running beam can overtake any more (a prefix: finished is sorted)
            final = sum(h.score >= best_running for h in finished)
            yield from finished[settled:final]
            settled = max(settled, final)
        while len(next_rows) < W:  # too few candidates (tiny vocab or top-p): pad with dead beams
            (
                next_rows.append(next_rows[0]),
                next_tokens.append(next_tokens[0]),
                next_scores.append(float("-inf")),
            )

        rows_t = torch.tensor(next_rows, device=device)
        tokens_t = torch.tensor(next_tokens, device=device)
        beam_scores = torch.tensor(next_scores, device=device)
        beam_tokens = torch.cat([beam_tokens[rows_t], tokens_t[:, None]], dim=1)  # [W, t+1]
        if last_step:
            break
        if cache is not None:
            cache.reorder(rows_t)  # each beam's cache row follows the beam it continues
        logits = decode_one_token(model, tokens_t, cache, prompt, beam_tokens)  # [W, V]

    if running and len(finished) < W and not rule.ranks_cut_off_beams:  # out of steps: the best running beams
        live = [(float(s), t.tolist()) for s, t in zip(beam_scores, beam_tokens) if torch.isfinite(s)]
        finished += [Hypothesis(t, s, False) for s, t in sorted(live, reverse=True)[: W - len(finished)]]
    ranked = sorted(finished, key=lambda h: (h.finished, h.score), reverse=True)
    assert settled <= len(ranked), "a yielded hypothesis was dropped"  # settled ones lead the ranking
    yield from ranked[settled:]


# ---------------------------------------------------------------------------- greedy chat (command line)
@torch.inference_mode()
def greedy(model: Transformer, prompt: list[int], max_new_tokens: int, stop_ids: list[int]) -> list[int]:
    """Greedy decoding of one prompt with a KV cache; returns the new ids without the stop id."""
    device = model.model.norm.weight.device
    cache, tokens, out = (
        model.new_cache(1, len(prompt) + max_new_tokens),
        torch.tensor([prompt], device=device),
        [],
    )
    for _ in range(max_new_tokens):
        next_id = int(model(tokens, cache=cache, logits_at=-1).argmax(-1))  # logits [1, V]
        if next_id in stop_ids:
            break
        out.append(next_id)
        tokens = torch.tensor([[next_id]], device=device)
    return out


def main(args: argparse.Namespace) -> None:
    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").exists():
        sys.exit(
            f"error: no model at {model_dir} (config.json missing). "
            f"Run `python get_model.py` to create it, or pass --model-dir."
        )
    if not args.chat.strip():
        sys.exit('error: --chat is empty; ask something, e.g. --chat "What is the capital of France?"')
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    dtype, why = pick_dtype(args.dtype, device)
    print(f"model {model_dir} on {device}, {why}", file=sys.stderr)
    tokenizer = Tokenizer(model_dir)
    model = prepare_for_inference(Transformer.from_pretrained(model_dir, dtype, device))
    prompt = tokenizer.encode(
        chat_prompt([{"role": "user", "content": args.chat}], default_system=args.system)
    )
    print(tokenizer.decode(greedy(model, prompt, args.max_new_tokens, tokenizer.eos_ids)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Answer one chat message with the base model (greedy).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--chat", required=True, help="the user message to answer")
    parser.add_argument("--system", default=DEFAULT_SYSTEM, help="the system prompt")
    parser.add_argument(
        "--model-dir", default=str(defaults.MODEL_DIR), help="Hugging Face Qwen2 model directory"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many new tokens")
    parser.add_argument(
        "--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps ..."
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weight dtype; auto = bfloat16 on a GPU with native bf16 (Ampere or newer) and on a CPU "
        "with it, float32 on other CPUs (llm/cpu_speed.pick_dtype)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    main(parser.parse_args())
