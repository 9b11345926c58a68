"""Prompt caching: run a prompt through the model computing only what the previous prompt did not.

Successive prompts of one kind share long starts: every skeleton prompt starts with the same system
message and instructions (only the question differs), successive re-ranking prompts share the
question, the query and most alternatives, and an agent's conversation only grows. `PromptCache`
keeps the KV cache of the last prompt (one row), cuts it back to the longest start a new prompt
shares with it and runs only the rest. Cutting back is free, so reuse always pays; the logits equal a
full forward's up to float rounding (tests/test_prompt_cache.py). Users: generate.beam_search (the
skeleton prompt, then copied into the beam rows), rerank.ModelReranker, local_backend.LocalBackend.

    prompts = PromptCache(model)
    logits = prompts.run(ids)          # [V] after the prompt `ids`
    logits = prompts.feed([token])     # one more token (decoding)
    beams = prompts.cache.copy_rows(torch.zeros(8, dtype=torch.long), room)   # 8 rows for beam search
"""

from typing import Callable

import torch

from model import KVCache, Transformer


class PromptCache:
    """The KV cache of one growing or changing token sequence (`ids`) and the model it belongs to.

    `tokens` counts prompt tokens asked for and tokens actually run through the model. `chunk` bounds
    the tokens per forward (the attention's memory). `check`, if given, is called before every forward
    and may raise to stop (a deadline)."""

    def __init__(self, model: Transformer, room: int = 512, chunk: int = 512):
        self.model, self.room, self.chunk = model, room, chunk
        self.cache: KVCache | None = None
        self.ids: list[int] = []  # the tokens the cache holds
        self.tokens = {"prompt": 0, "computed": 0}

    def shared_start(self, ids: list[int]) -> int:
        """How many leading tokens `ids` shares with the cached ones."""
        shared, limit = 0, min(len(ids), len(self.ids))
        while shared < limit and ids[shared] == self.ids[shared]:
            shared += 1
        return shared

    def truncate(self, length: int) -> None:
        """Forget the tokens from `length` on."""
        if self.cache is not None:
            self.cache.truncate(length)
        self.ids = self.ids[:length]

    @torch.inference_mode()
    def run(
        self, ids: list[int], check: Callable[[], None] | None = None, vocab: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits [V] of the token after the prompt `ids` (with `vocab`: [K], those token ids' only, in
        float32; Transformer.forward); afterwards the cache holds `ids`. At least the last token runs:
        its logits are the answer."""
        assert ids, "an empty prompt has no next-token logits"
        self.tokens["prompt"] += len(ids)
        self.truncate(min(self.shared_start(ids), len(ids) - 1))
        return self.feed(ids[len(self.ids) :], check, vocab)

    @torch.inference_mode()
    def feed(
        self, ids: list[int], check: Callable[[], None] | None = None, vocab: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append `ids` (at least one) to the cached tokens; the logits [V] (or [K], `run`) after the last."""
        assert ids, "feed at least one token"
        if self.cache is None:
            self.cache = self.model.new_cache(1, max(self.room, len(ids)))
        self.cache.truncate(len(self.ids))  # drop positions a failed forward may have reserved
        device = self.model.model.norm.weight.device
        for i in range(0, len(ids), self.chunk):
            if check is not None:
                check()
            part = ids[i : i + self.chunk]
            logits = self.model(
                torch.tensor([part], device=device), cache=self.cache, logits_at=-1, vocab=vocab
            )[0]
            self.ids += part  # only what the cache really holds, should a later chunk fail
            self.tokens["computed"] += len(part)
        return logits
