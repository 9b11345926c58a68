"""Model re-ranking: the scoring rule and the re-ranker that resolve.py calls (paper section 3;
docs/method.md section 6.4).

The re-ranking prompt (prompts.rerank_messages) lists the alternatives with identifier letters A, B, ...
and "None of the above" last. An alternative's score is the logit of its identifier's token at the
position after the prompt: one forward pass scores the whole list. Training uses the same rule
(loss.py: cross-entropy restricted to these logits). Both map letters to tokens with
`identifier_token_ids` (single token ids, or a clear error); training gathers the identifiers' logits
from a batch's full logits with `identifier_logits` (absent ones masked), the re-ranker asks the model
for those rows of the lm_head only, in float32 (`Transformer.forward(..., vocab=...)`: in bf16 the full
logits are rounded coarsely enough to tie an alternative with None, and a tie is cut).

`ModelReranker` adds the speed-up: its prompts run through a PromptCache (prompt_cache.py), which
computes only the tokens after the start a prompt shares with the previous one (tests/test_rerank.py:
same scores as a full forward; docs/cpu_speed.md section 3.3: the speed-up).

    reranker = ModelReranker(model, tokenizer, prompt_format="v2")   # the adapter's format (peft_format)
    scores = reranker(question, marked_query, alternatives, resolved)   # len(alternatives) + 1, None's last
"""

from typing import Iterable

import torch

from grisp.prompts import IDENTIFIERS, LATEST_PROMPT_FORMAT, PROMPT_FORMATS, Alternative, rerank_messages
from llm.prompt_cache import PromptCache
from llm.tokenizer import Tokenizer, chat_prompt
from model import Transformer


def identifier_token_ids(tokenizer: Tokenizer, identifiers: Iterable[str]) -> list[int]:
    """The token id of each identifier letter; ValueError if the tokenizer splits one (its logit
    would then not be one answer token)."""
    token_ids = []
    for identifier in identifiers:
        ids = tokenizer.encode(identifier)
        if len(ids) != 1:
            raise ValueError(
                f"the tokenizer splits the identifier {identifier!r} into {ids}; re-ranking needs "
                f"single-token identifiers (use a Qwen2 tokenizer)"
            )
        token_ids.append(ids[0])
    return token_ids


def identifier_logits(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The identifiers' logits: logits [N, V], ids [N, K] token ids (-1 = no identifier there) ->
    [N, K], -inf where absent (a softmax or argmax over a row sees only the identifiers present)."""
    return logits.gather(1, ids.clamp(min=0)).masked_fill(ids < 0, float("-inf"))


class ModelReranker:
    """List-wise re-ranking by the next-token logits of the identifiers (A, B, ...) after the prompt.

    Successive prompts share a long start: always the system message and chat header, within one
    question also the question line, the query up to its first changed placeholder and, on a backtrack,
    the whole query and the resolved items. So the re-ranker runs its prompts through a PromptCache,
    which computes only the tokens after the start a prompt shares with the previous one.
    prefix_cache=False runs every prompt in full (the reference; scores agree up to rounding).
    `tokens` counts prompt tokens seen and tokens actually run through the model. `prompt_format` is the
    one the adapter was trained on (prompts.PROMPT_FORMATS; v2 also shows the `resolved` items)."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        show_infos: bool = True,
        prefix_cache: bool = True,
        prompt_format: str = LATEST_PROMPT_FORMAT,
    ):
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt format {prompt_format!r}; known: {', '.join(PROMPT_FORMATS)}")
        self.model, self.tokenizer, self.show_infos, self.prefix_cache = (
            model,
            tokenizer,
            show_infos,
            prefix_cache,
        )
        self.prompt_format = prompt_format
        # identifier letter -> its token id; the scores are these logits
        self.identifier_ids = dict(zip(IDENTIFIERS, identifier_token_ids(tokenizer, IDENTIFIERS)))
        self.prompts = PromptCache(model)  # the KV cache of the previous prompt
        # prompt tokens seen and tokens run through the model (with the prefix cache: the PromptCache's)
        self.tokens = self.prompts.tokens if prefix_cache else {"prompt": 0, "computed": 0}

    def __call__(
        self,
        question: str,
        marked_query: str,
        alternatives: list[Alternative],
        resolved: list[Alternative] = (),
    ) -> list[float]:
        messages, identifiers = rerank_messages(
            question, marked_query, alternatives, self.show_infos, resolved, self.prompt_format
        )
        vocab = torch.tensor([self.identifier_ids[i] for i in identifiers])  # [K]
        return self.next_token_logits(self.tokenizer.encode(chat_prompt(messages)), vocab).tolist()

    @torch.inference_mode()
    def next_token_logits(self, ids: list[int], vocab: torch.Tensor) -> torch.Tensor:
        """The logits [K] of the token ids `vocab` after the prompt `ids`, in float32 (only those rows of the
        lm_head run), reusing the start the prompt shares with the last one."""
        vocab = vocab.to(self.model.model.norm.weight.device)
        if self.prefix_cache:
            return self.prompts.run(ids, vocab=vocab)
        self.tokens["prompt"] += len(ids)
        self.tokens["computed"] += len(ids)
        return self.model(torch.tensor([ids], device=vocab.device), logits_at=-1, vocab=vocab)[0]
