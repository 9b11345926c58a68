"""GRISP's training objective: from a sample to its loss (paper section 3, "Training Data";
docs/method.md section 4.1).

The model is trained jointly on two tasks:
- skeleton: next-token cross-entropy on each answer token (the skeleton and <|im_end|>);
- re-ranking: cross-entropy restricted to the logits of the identifier tokens present in the prompt
  (A, B, ..., and the one of "None of the above"), read at the first answer position: one row.
A third task trains the GRASP agent's local model (tools/gen_agent_data.py; not GRISP's): agent, a whole
conversation with tools, next-token cross-entropy on every token of the model's own turns (its calls and
<|im_end|>), weighed as skeleton answer tokens are.
How they add up is the weighting (WEIGHTINGS; docs/method.md section 4.1):
- "reference" (the reference implementation's, the default): the batch loss is the sum of all token
  and row cross-entropies over the whole batch, divided by (skeleton answer tokens + re-ranking rows)
  of the whole batch; a 40-token skeleton weighs 40 re-ranking choices;
- "per-sample" (the first adapter's): a skeleton's tokens are averaged first, every sample weighs 1,
  the batch loss is the mean over samples.
Both are sum(sample losses) / sum(units) over the batch: `sample_losses` gives each sample's summed
(reference) or averaged (per-sample) cross-entropy, `units` its share of the denominator (its loss
positions, or 1). train.py counts the units of the whole batch before its micro-batches, so gradient
accumulation and DDP give the loss of the whole batch exactly.
Samples that share a long prompt start (agent conversations: the system instruction and the tool
definitions, ~2,000 of ~3,000 tokens) run it once per batch (SharedPrefix): each sample's forward
pass covers only its own rest, and the gradient stays exact.
Logits are computed only at these loss positions (model.forward's `logits_at`), which saves the
large lm_head matmul everywhere else. The identifier tokens and their logits come from rerank.py, the
scoring rule inference uses. `backward_batch` accumulates a batch's gradient over micro-batches and
`evaluate` weighs a validation set the same way. Used by train.py; tested in tests/test_train.py.

    encoded = [encode(sample, tokenizer) for sample in samples]  # samples.py's (online, or read from gen_data.py)
    losses, correct = sample_losses(model, collate(encoded, tokenizer.pad_id, "reference"))  # [B], [B]
    batch_loss = losses.sum() / sum(units(e, "reference") for e in encoded)
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from grisp.rerank import identifier_logits, identifier_token_ids
from llm.tokenizer import Tokenizer, chat_prompt, qwen_tool_prompt

MIN_SHARED_PREFIX = 256  # shorter common starts are not worth a forward pass of their own
WEIGHTINGS = ("reference", "per-sample")  # how skeleton tokens and re-ranking rows add up (module docstring)
TASKS = ("skeleton", "rerank", "agent")  # what a sample trains (module docstring)


def encode(sample: dict, tokenizer: Tokenizer) -> dict:
    """Token ids of one sample and what its loss reads: the positions of the tokens it predicts
    (`answer_at`: a skeleton's answer, an agent's turns) or the identifier ids with the index of the
    target among them (re-ranking; the ids end with the prompt). `n_prompt`: the tokens before the
    first predicted one."""
    task = sample["task"]
    if task == "agent":
        ids, answer_at = agent_tokens(sample["messages"], sample["tools"], tokenizer)
        return {
            "task": task,
            "ids": ids,
            "n_prompt": answer_at[0],
            "answer_at": answer_at,
            "choices": [],
            "target": -1,
        }
    prompt = tokenizer.encode(chat_prompt(sample["messages"], add_generation_prompt=True))
    if task == "skeleton":
        answer = tokenizer.encode(sample["target"]) + [tokenizer.im_end_id]
        return {
            "task": task,
            "ids": prompt + answer,
            "n_prompt": len(prompt),
            "answer_at": list(range(len(prompt), len(prompt) + len(answer))),
            "choices": [],
            "target": -1,
        }
    return {
        "task": task,
        "ids": prompt,
        "n_prompt": len(prompt),
        "answer_at": [],
        "choices": identifier_token_ids(tokenizer, sample["identifiers"]),
        "target": sample["identifiers"].index(sample["target"]),
    }


def agent_tokens(
    messages: list[dict], tools: list[dict], tokenizer: Tokenizer
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation with tools (Qwen's format, as the agent's local backend writes it) and
    the positions of the assistant's tokens: each of its turns from after `<|im_start|>assistant\n` to
    its `<|im_end|>`. Control tokens split the text, so each turn's ids extend the ids before it."""
    ids, answer_at = [], []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.encode(qwen_tool_prompt(messages[:i], tools, add_generation_prompt=True))
        ids = tokenizer.encode(qwen_tool_prompt(messages[: i + 1], tools, add_generation_prompt=False))
        assert ids[: len(before)] == before and ids[-2] == tokenizer.im_end_id, (
            "a turn does not extend the ids"
        )
        answer_at += range(len(before), len(ids) - 1)  # its text and <|im_end|>, not the "\n" after it
    if not answer_at:
        raise ValueError("an agent sample needs at least one assistant turn")
    return ids, answer_at


def units(sample: dict, weighting: str) -> int:
    """An encoded sample's share of the loss's denominator: its loss positions (the tokens it predicts,
    or the one re-ranking row) under "reference", 1 under "per-sample"."""
    assert weighting in WEIGHTINGS, f"weighting must be one of {WEIGHTINGS}, got {weighting!r}"
    if weighting == "per-sample" or sample["choices"]:
        return 1
    return len(sample["answer_at"])


def collate(batch: list[dict], pad_id: int, weighting: str = "reference", start: int = 0) -> dict:
    """Right-padded tokens [B, T] and, per loss position (row-major, as model.forward's bool
    logits_at returns them): the label id, the owning row, the weight (units / loss positions of its
    sample: 1 under "reference", 1/answer-length for a token task under "per-sample"), and for
    re-ranking rows the identifier ids [N, K] (-1 = padding) and the target column. `start`: the tokens
    before it are left out (a SharedPrefix holds them; no loss position may lie there)."""
    T = max(len(s["ids"]) for s in batch)
    tokens = torch.full((len(batch), T), pad_id, dtype=torch.long)
    at = torch.zeros(len(batch), T, dtype=torch.bool)
    K = max([len(s["choices"]) for s in batch] + [1])
    labels, rows, weights, choices, targets = [], [], [], [], []
    for b, s in enumerate(batch):
        n, P = len(s["ids"]), s["n_prompt"]
        tokens[b, :n] = torch.tensor(s["ids"])
        if s["choices"]:  # re-ranking: one position, the last prompt token predicts the identifier
            positions, row_labels = [P - 1], [-1]
        else:  # skeleton, agent: position t - 1 predicts token t, for every answer token t
            positions, row_labels = [t - 1 for t in s["answer_at"]], [s["ids"][t] for t in s["answer_at"]]
        at[b, positions] = True
        labels += row_labels
        rows += [b] * len(positions)
        weights += [units(s, weighting) / len(positions)] * len(positions)
        choices += [s["choices"] + [-1] * (K - len(s["choices"]))] * len(positions)
        targets += [s["target"]] * len(positions)
    assert not at[:, :start].any(), "a loss position lies in the left-out start"
    return {
        "tokens": tokens[:, start:],
        "at": at[:, start:],
        "labels": torch.tensor(labels),
        "rows": torch.tensor(rows),
        "weights": torch.tensor(weights),
        "choices": torch.tensor(choices),
        "targets": torch.tensor(targets),
    }


def restricted_cross_entropy(
    logits: torch.Tensor, choices: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy over only the identifier tokens present: logits [N, V], choices [N, K] token ids
    (-1 = absent), targets [N] column in `choices`. Returns [N]."""
    return F.cross_entropy(identifier_logits(logits, choices).float(), targets, reduction="none")


def sample_losses(
    model: torch.nn.Module, batch: dict, prefix: "SharedPrefix | None" = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss per sample [B]: the weighted sum of its cross-entropies (collate's weights: the sum over a
    skeleton's answer tokens, or their mean; one restricted CE per re-ranking sample), and whether each
    re-ranking sample ranks its target first [B] (skeletons: False). With `prefix`, the batch holds the
    tokens after it (collate's `start`)."""
    device = batch["tokens"].device
    logits = model(batch["tokens"], cache=prefix, logits_at=batch["at"])  # [N, V], only the loss positions
    rerank = batch["labels"] < 0  # [N]
    losses = torch.zeros(batch["tokens"].shape[0], device=device)
    correct = torch.zeros_like(losses, dtype=torch.bool)
    if (~rerank).any():
        token_loss = F.cross_entropy(logits[~rerank].float(), batch["labels"][~rerank], reduction="none")
        losses = losses.index_add(0, batch["rows"][~rerank], token_loss * batch["weights"][~rerank])
    if rerank.any():
        choices, targets = batch["choices"][rerank], batch["targets"][rerank]
        losses = losses.index_add(
            0, batch["rows"][rerank], restricted_cross_entropy(logits[rerank], choices, targets)
        )
        best = identifier_logits(logits[rerank], choices).argmax(-1)
        correct[batch["rows"][rerank]] = best == targets
    return losses, correct


# ---------------------------------------------------------------------------- a shared prompt start
class SharedPrefix:
    """The keys and values of a prompt start that every sample of a batch shares, computed once: it
    stands in for model.KVCache in Transformer.forward. Made with the start's ids, it runs them (one
    row) and keeps each layer's keys and values; every later forward pass (the samples' rests, B rows,
    right-padded) attends to them from position len(ids) on. Nothing is written in place, so autograd
    runs through both passes. The rests' losses put a gradient on the kept keys and values (leaves of
    their graphs); `backward()` sends it through the start's own forward pass, once: the gradient of
    the batch is the one of running every sample whole. (LoRA dropout draws one mask for the start,
    shared by the samples, where whole samples draw one each.)"""

    @classmethod
    def of(cls, model: torch.nn.Module, samples: list[dict], device) -> tuple[int, "SharedPrefix | None"]:
        """(tokens every sample starts with, their SharedPrefix), or (0, None) if that start is short."""
        start = shared_start(samples)
        return start, (cls(model, samples[0]["ids"][:start], device) if start else None)

    def __init__(self, model: torch.nn.Module, ids: list[int], device):
        self.keys, self.values, self.mask, self.length, self.device = [], [], None, 0, device
        model(torch.tensor([ids], device=device), cache=self, logits_at=-1)
        self.length = len(ids)
        self.start_keys, self.start_values = self.keys, self.values  # with the start's graph (training)
        self.keys = [k.detach().requires_grad_(k.requires_grad) for k in self.keys]
        self.values = [v.detach().requires_grad_(v.requires_grad) for v in self.values]

    # --- what Transformer.forward asks of a cache
    def seen(self) -> torch.Tensor:
        """The position of every row's next token, [1] (the same for all rows)."""
        return torch.tensor([self.length], device=self.device)

    def append(self, mask: torch.Tensor) -> int:
        """A forward pass of rows after the start (each pass starts again right after it)."""
        self.mask = torch.cat([mask.new_ones(mask.shape[0], self.length), mask], 1)
        return self.length

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        if start == 0:  # the start itself
            self.keys.append(k)
            self.values.append(v)
            return k, v
        B = k.shape[0]
        return (
            torch.cat([self.keys[layer].expand(B, -1, -1, -1), k], 2),
            torch.cat([self.values[layer].expand(B, -1, -1, -1), v], 2),
        )

    def backward(self) -> None:
        """The gradient the rests put on the start's keys and values, through the start's forward pass."""
        pairs = [
            (out, leaf.grad)
            for out, leaf in zip(self.start_keys + self.start_values, self.keys + self.values)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward(*zip(*pairs))


def shared_start(samples: list[dict]) -> int:
    """Tokens every sample starts with, up to the first position any of them reads a loss at; 0 if
    fewer than MIN_SHARED_PREFIX."""
    first = samples[0]["ids"]
    n = min(s["answer_at"][0] - 1 if s["answer_at"] else s["n_prompt"] - 1 for s in samples)
    for s in samples[1:]:
        n = next(
            (i for i, (a, b) in enumerate(zip(first[:n], s["ids"][:n])) if a != b), min(n, len(s["ids"]))
        )
    return n if n >= MIN_SHARED_PREFIX else 0


# ---------------------------------------------------------------------------- a batch, a validation set
def backward_batch(
    model,
    mine: list[dict],
    total: int,
    micro_batch_size: int,
    weighting: str,
    pad_id: int,
    device,
    autocast,
    world: int = 1,
) -> dict[str, tuple[float, int]]:
    """Accumulate the gradient of sum(sample losses of `mine`) / `total` over micro-batches, where
    `total` is the units of the whole batch (`units`: counted before any micro-batch, so the result
    is the whole batch's loss however it is split); DDP averages gradients over the `world` processes,
    hence the factor. A long start all of `mine` share runs once (SharedPrefix; one process only).
    Returns per task (summed sample losses, units) of `mine`."""
    by_task = {}
    micro = [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]
    with autocast:
        start, prefix = SharedPrefix.of(model, mine, device) if world == 1 else (0, None)
    for j, batch in enumerate(micro):
        sync = nullcontext() if world == 1 or j == len(micro) - 1 else model.no_sync()
        with sync, autocast:
            losses, _ = sample_losses(
                model, to_device(collate(batch, pad_id, weighting, start), device), prefix
            )
            (losses.sum() * world / total).backward()
        add_up(by_task, batch, losses.tolist(), weighting)
    if prefix is not None:
        prefix.backward()
    return by_task


@torch.no_grad()
def evaluate(model, val: list[dict], micro_batch: int, pad_id: int, device, autocast, weighting: str) -> dict:
    """Validation loss as training weighs it (sum of losses / units), the same per task present
    (val_skeleton, val_rerank, val_agent), and the re-ranking accuracy if there are re-ranking samples (no
    dropout, no RNG use). A long start all of `val` share runs once (SharedPrefix)."""
    model.eval()
    totals = {}
    correct_reranks = []
    order = sorted(range(len(val)), key=lambda i: len(val[i]["ids"]))
    with autocast:
        shared, prefix = SharedPrefix.of(model, val, device)  # agent conversations share their start
    for start in range(0, len(order), micro_batch):
        batch = [val[i] for i in order[start : start + micro_batch]]
        with autocast:
            losses, correct = sample_losses(
                model, to_device(collate(batch, pad_id, weighting, shared), device), prefix
            )
        add_up(totals, batch, losses.tolist(), weighting)
        correct_reranks += [float(ok) for s, ok in zip(batch, correct.tolist()) if s["choices"]]
    model.train()
    total_loss, total_units = (sum(values) for values in zip(*totals.values())) if totals else (0.0, 0)
    return {
        "val_loss": total_loss / max(1, total_units),
        **{f"val_{task}": totals[task][0] / totals[task][1] for task in TASKS if task in totals},
        **({"val_rerank_acc": sum(correct_reranks) / len(correct_reranks)} if correct_reranks else {}),
    }


def add_up(
    totals: dict[str, tuple[float, int]], batch: list[dict], losses: list[float], weighting: str
) -> None:
    """Add each sample's loss and units to its task's (summed losses, units) in `totals`."""
    for s, value in zip(batch, losses):
        total_loss, total_units = totals.get(s["task"], (0.0, 0))
        totals[s["task"]] = (total_loss + value, total_units + units(s, weighting))


def to_device(batch: dict, device) -> dict:
    """The collated tensors on `device`."""
    return {k: v.to(device) for k, v in batch.items()}
