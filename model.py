"""Qwen2.5 in plain PyTorch: the language model that every GRISP stage runs on.

GRISP (paper Sec. 3) fine-tunes a small Qwen2.5 model to write SPARQL skeletons and to re-rank search
results. This file is that model and reads bottom-up: ModelArgs -> RMSNorm -> rotary embeddings ->
attention mask -> KVCache -> one-query attention (decoding) -> Attention -> MLP -> Block -> Transformer
(forward, from_pretrained).
Around it: tokenizer.py (the tokenizer and Qwen's chat prompt), lora.py (adapters), cpu_speed.py (the
CPU inference speed-up) and generate.py (decoding, and a chat command line to check the model).
Submodule names equal the Hugging Face Qwen2ForCausalLM checkpoint keys, so loading is one strict
`load_state_dict` with no rename table.

    model = Transformer.from_pretrained(model_dir)  # a Hugging Face Qwen2 directory
    logits = model(tokens)  # [B, T] -> [B, T, V]
    python -m grisp.generate --chat "What is the capital of France?"
Tests: python -m pytest tests/test_model.py
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn


@dataclass
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False  # lm_head shares the embedding matrix

    @classmethod
    def from_config(cls, path: str | Path) -> "ModelArgs":
        """Read a Hugging Face Qwen2 `config.json` (transformers 4.x or 5.x layout)."""
        cfg = json.loads(Path(path).read_text())
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default" or cfg.get("use_sliding_window") or cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"{path}: only plain Qwen2 is supported (rope {rope_type!r}, silu, no sliding window)"
            )
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", rope.get("rope_theta", 10000.0)),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in float32 whatever the model dtype, scale after casting back (as Hugging Face does)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


# ---------------------------------------------------------------------------- rotary embeddings
def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin of the rotation angles, each [B, 1, T, head_dim], for integer positions [B, T].

    Split-halves layout: frequency i rotates the pair (dim i, dim i + head_dim/2), so the checkpoint's
    q/k weights need no permutation."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions[..., None].float() * inv_freq  # [B, T, D/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D]: x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1] (HF's sign)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# ---------------------------------------------------------------------------- attention mask
def attention_mask(key_mask: torch.Tensor, start: int, T: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, T, S] additive mask (0 = may attend, -inf = may not) in the attention's dtype: query t (at
    position start + t) sees the real keys up to itself. Every query also sees itself, so padding
    queries get finite (ignored) outputs, not NaN. One float tensor serves every block: a bool mask
    would be turned into this float form, and kept for the backward pass, once per block."""
    S = key_mask.shape[1]
    q_idx = torch.arange(start, start + T, device=key_mask.device)[:, None]  # [T, 1]
    k_idx = torch.arange(S, device=key_mask.device)[None, :]  # [1, S]
    allowed = ((k_idx <= q_idx) & key_mask[:, None, :]) | (k_idx == q_idx)  # [B, T, S]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf")
    )
    return bias[:, None]  # [B, 1, T, S]


# ---------------------------------------------------------------------------- KV cache
class KVCache:
    """Keys and values of every token seen so far, for a batch of B sequences of equal length.

    Rows are left-padded: `mask[b, s]` is False where row b holds padding at position s. The buffers are
    preallocated for `max_len` positions and grow (doubling) if a forward needs more. Only inference
    uses a cache (decoding, and the re-ranker reusing a shared prompt start); training runs
    `Transformer.forward(cache=None)`."""

    def __init__(
        self,
        args: ModelArgs,
        batch_size: int,
        max_len: int = 256,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        shape = (args.num_hidden_layers, batch_size, args.num_key_value_heads, max_len, args.head_dim)
        # uninitialised: every position is written before attention reads it, and untouched memory is free
        self.k = torch.empty(shape, dtype=dtype, device=device)  # [L, B, H_kv, S_max, D]
        self.v = torch.empty(shape, dtype=dtype, device=device)  # [L, B, H_kv, S_max, D]
        self.mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # [B, S_max]
        self.length = 0  # positions filled so far (padding included), the same for every row
        self.spare = None  # a second set of buffers for reorder (k, v, mask), made on first use

    def __len__(self) -> int:
        return self.length

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def seen(self) -> torch.Tensor:
        """[B] real (non-pad) tokens per row so far = the rotary position of each row's next token."""
        return self.mask[:, : self.length].sum(-1)

    def append(self, mask: torch.Tensor) -> int:
        """Reserve T new positions with padding mask [B, T]; return where they start."""
        assert mask.shape[0] == self.batch_size, f"cache has {self.batch_size} rows, input {mask.shape[0]}"
        start, end = self.length, self.length + mask.shape[1]
        if end > self.k.shape[3]:  # grow: twice as long, or just long enough
            self._rebuild(slice(None), max(end, 2 * self.k.shape[3]))
        self.mask[:, start:end] = mask
        self.length = end
        return start

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Write one layer's new k, v [B, H_kv, T, D] at `start`; return all of them, [B, H_kv, S, D]."""
        end = start + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on; the next forward writes there (a prompt cache keeps the
        start that successive prompts share)."""
        assert 0 <= length <= self.length, f"cannot truncate a cache of {self.length} positions to {length}"
        self.length = length

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` (LongTensor [B_new]) in this order; rows may repeat (1 prompt -> 8 beams).

        At an unchanged batch size (beam search, every step) the rows are gathered into a second set of
        buffers of the same shape, which then swaps with the first: no allocation, and whole contiguous
        [H_kv, S_max, D] blocks copy faster than the filled part alone."""
        if len(rows) != self.batch_size:
            self._rebuild(rows, self.k.shape[3])
            return
        if self.spare is None or self.spare[0].shape != self.k.shape:
            self.spare = (torch.empty_like(self.k), torch.empty_like(self.v), torch.empty_like(self.mask))
        k, v, mask = self.spare
        torch.index_select(self.k, 1, rows, out=k)
        torch.index_select(self.v, 1, rows, out=v)
        torch.index_select(self.mask, 0, rows, out=mask)
        self.spare, (self.k, self.v, self.mask) = (self.k, self.v, self.mask), (k, v, mask)

    def copy_rows(self, rows: torch.Tensor, max_len: int) -> "KVCache":
        """A new cache holding `rows` (LongTensor, may repeat) of this one's filled part, with room for
        `max_len` positions; this cache stays as it is (a prompt's cache -> the beams of beam search)."""
        copy = object.__new__(KVCache)
        copy.length, copy.k, copy.v, copy.mask = self.length, self.k, self.v, self.mask
        copy._rebuild(rows, max(max_len, self.length))
        return copy

    def _rebuild(self, rows: torch.Tensor | slice, size: int) -> None:
        """Replace the buffers by ones holding `rows` of the filled part, with room for `size` positions."""
        n, (L, B, H, _, D) = self.length, self.k.shape
        B = B if isinstance(rows, slice) else len(rows)
        k, v = self.k.new_empty(L, B, H, size, D), self.v.new_empty(L, B, H, size, D)
        mask = self.mask.new_zeros(B, size)
        k[:, :, :, :n], v[:, :, :, :n] = self.k[:, rows, :, :n], self.v[:, rows, :, :n]
        mask[:, :n] = self.mask[rows, :n]
        self.k, self.v, self.mask = k, v, mask
        self.spare = None  # the old size; made anew by the next reorder


# ---------------------------------------------------------------------------- one-query attention
def one_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v for one new query per row (decoding), as two plain matmuls in
    float32 (float64 for float64 inputs, and under autocast too): q [B, H, 1, D], k and v [B, H_kv, S, D],
    attn_mask [B, 1, 1, S] or None; returns [B, H, 1, D] in q's dtype. Query head h reads key/value head
    h // (H / H_kv), as grouped-query attention pairs them. The same as F.scaled_dot_product_attention,
    whose flash kernel is 3-11x slower for this shape in bf16 on a CPU (bench/bench_attention.py)."""
    (B, H, _, D), H_kv, S, dtype = q.shape, k.shape[1], k.shape[2], q.dtype
    compute = torch.promote_types(dtype, torch.float32)  # float32, or float64 for a float64 model
    with torch.autocast(q.device.type, enabled=False):  # autocast would run these matmuls in bf16
        q = q.to(compute).view(B, H_kv, H // H_kv, D)  # the query heads of each key/value head
        scores = q @ k.to(compute).transpose(-1, -2) * D**-0.5  # [B, H_kv, H / H_kv, S]
        if attn_mask is not None:
            scores = scores + attn_mask.to(compute).view(B, 1, 1, S)  # [B, 1, 1, S] -> one row per batch row
        return (scores.softmax(-1) @ v.to(compute)).view(B, H, 1, D).to(dtype)


# ---------------------------------------------------------------------------- the transformer
class Attention(nn.Module):
    """Grouped-query attention: H query heads share H_kv key/value heads; q, k, v have biases."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        )
        self.q_proj = nn.Linear(args.hidden_size, self.n_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(args.hidden_size, self.n_kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(args.hidden_size, self.n_kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, args.hidden_size, bias=False)

    def forward(self, x, cos, sin, attn_mask, cache: KVCache | None, layer: int, start: int) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, H_kv, T, D]
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, H_kv, T, D]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.store(layer, start, k, v)  # [B, H_kv, S, D], S = start + T
        # attn_mask None means "plain causal" (or, for one new token, "see everything")
        if T == 1:  # decoding
            y = one_query_attention(q, k, v, attn_mask)  # [B, H, 1, D]
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, enable_gqa=True, is_causal=attn_mask is None
            )  # [B, H, T, D]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then + mlp(norm(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x, cos, sin, attn_mask, cache: KVCache | None, layer: int, start: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn_mask, cache, layer, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Qwen2ForCausalLM: embed_tokens -> blocks -> norm -> lm_head, with HF's parameter names."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = nn.ModuleDict(
            dict(
                embed_tokens=nn.Embedding(args.vocab_size, args.hidden_size),
                layers=nn.ModuleList(Block(args) for _ in range(args.num_hidden_layers)),
                norm=RMSNorm(args.hidden_size, args.rms_norm_eps),
            )
        )
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def vocab_logits(self, x: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
        """The lm_head's outputs for the token ids `vocab` [K] only, in float32: x [..., C] -> [..., K]."""
        weight = getattr(
            self.lm_head, "weight", None
        )  # nn.Linear, cpu_speed.SplitLinear: the head's own rows
        if not isinstance(weight, torch.Tensor):  # a LoRA or int8 lm_head: its rows are not at hand
            return self.lm_head(x)[..., vocab].float()
        with torch.autocast(x.device.type, enabled=False):  # float32 even inside an autocast region
            return x.float() @ weight[vocab].float().T

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        logits_at: int | torch.Tensor | None = None,
        vocab: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for the new tokens `tokens` (LongTensor [B, T]).

        mask: [B, T] bool or 0/1, 1 = real token, 0 = padding (default: all real). Rotary positions count
            real tokens only, so a left-padded row gives the same logits as the row run alone. Right
            padding is fine without a cache (training); generation pads on the left.
        cache: KVCache with B rows holding the earlier tokens, or None (the tokens are the whole
            sequence). The new keys/values are appended to it.
        logits_at: which positions get logits (the lm_head is the most expensive matmul):
            None                 -> [B, T, V] every position
            int i (e.g. -1)      -> [B, V]    position i of every row (decoding)
            LongTensor [B]       -> [B, V]    position logits_at[b] of row b (re-ranking)
            LongTensor [B, K]    -> [B, K, V] K positions per row
            BoolTensor [B, T]    -> [N, V]    the N True positions, row-major (training: answer tokens)
            Each equals the same selection from the full [B, T, V] logits.
        vocab: LongTensor [K] of token ids: only their logits, in float32 (V becomes K above). Re-ranking
            reads a few identifiers' logits: this skips the rest of the lm_head, and in bf16 the full
            logits are rounded to steps of 1/16 to 1/8 at the usual sizes, enough to tie close scores.
        Returns logits in the model's dtype (float32 with `vocab`)."""
        B, T = tokens.shape
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
        assert mask.shape == (B, T), f"mask {tuple(mask.shape)} does not match tokens {(B, T)}"
        past = torch.zeros(B, dtype=torch.long, device=tokens.device) if cache is None else cache.seen()
        start = 0 if cache is None else cache.append(mask)
        key_mask = mask if cache is None else cache.mask[:, : start + T]  # [B, S]
        positions = (past[:, None] + mask.cumsum(-1) - 1).clamp(min=0)  # [B, T], pads get a dummy
        x = self.model.embed_tokens(tokens)  # [B, T, C]
        device = x.device.type  # the attention runs in autocast's dtype if autocast is on
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        attn_mask = (
            None
            if bool(key_mask.all()) and (start == 0 or T == 1)
            else attention_mask(key_mask, start, T, dtype)
        )
        cos, sin = rotary_cos_sin(positions, self.args.head_dim, self.args.rope_theta, x.dtype)
        for layer, block in enumerate(self.model.layers):
            x = block(x, cos, sin, attn_mask, cache, layer, start)
        # the final norm is per position, so select first and pay the lm_head only where asked
        if logits_at is None:
            pass  # [B, T, C]
        elif isinstance(logits_at, int):
            x = x[:, logits_at]  # [B, C]
        elif logits_at.dtype == torch.bool:
            assert logits_at.shape == (B, T), f"logits_at mask {tuple(logits_at.shape)} != tokens {(B, T)}"
            x = x[logits_at]  # [N, C]
        else:
            index = logits_at if logits_at.dim() == 2 else logits_at[:, None]  # [B, K]
            x = x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))  # [B, K, C]
            x = x if logits_at.dim() == 2 else x[:, 0]  # [B, C] for a 1-D logits_at
        x = self.model.norm(x)
        return self.lm_head(x) if vocab is None else self.vocab_logits(x, vocab)

    def new_cache(self, batch_size: int, max_len: int = 256) -> KVCache:
        """An empty KVCache for this model (its dtype and device), room for `max_len` positions."""
        w = self.model.norm.weight
        return KVCache(self.args, batch_size, max_len, w.dtype, w.device)

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> "Transformer":
        """Load a Hugging Face Qwen2 directory: config.json + model.safetensors (or a sharded
        model.safetensors.index.json). Strict: a missing or unexpected weight raises."""
        model_dir = Path(model_dir)
        args = ModelArgs.from_config(model_dir / "config.json")
        with torch.device("meta"):  # no memory, no random init: every tensor comes from the checkpoint
            model = cls(args)
        state = load_safetensors(model_dir, dtype, device)
        if (
            args.tie_word_embeddings
            and "lm_head.weight" not in state
            and "model.embed_tokens.weight" in state
        ):
            state["lm_head.weight"] = state["model.embed_tokens.weight"]  # HF saves the tied matrix once
        model.load_state_dict(state, strict=True, assign=True)
        if args.tie_word_embeddings:  # assign=True made two Parameters; tie them again
            model.lm_head.weight = model.model.embed_tokens.weight
        return model.eval()


# ---------------------------------------------------------------------------- loading
DEVICES = "auto, cpu, cuda, cuda:N (the N-th GPU) or mps"  # what --device (and the config's device) takes


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """`name` as a torch.device; "auto" = cuda (this process's GPU under torchrun), then mps, then cpu.
    Another name raises a ValueError that lists DEVICES, and so does a GPU this machine lacks, before any
    loading (the scripts print it as a one-line error)."""
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError:  # not a device string at all, e.g. "bogus"
            device = None
        if device is None or device.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"unknown device {name!r}: use {DEVICES}")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s) here")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise ValueError(f"device {name!r}: MPS is not available here")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")


def load_safetensors(
    model_dir: Path, dtype: torch.dtype, device: str | torch.device
) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors, or of the shards listed in model.safetensors.index.json."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"{model_dir}: no model.safetensors or model.safetensors.index.json "
            f"(run `python get_model.py` to create the base model directory)"
        )
    state = {}
    for name in files:
        with safe_open(model_dir / name, framework="pt", device=str(device)) as f:
            keys = list(f.keys())
        for key in keys:
            # memory-mapped: a weight takes memory once touched (most embedding rows never are). One
            # mapping per tensor: a weight cast to another dtype releases the pages it was read from
            # (one mapping for all would hold every page read until the last tensor is gone)
            with safe_open(model_dir / name, framework="pt", device=str(device)) as f:
                state[key] = f.get_tensor(key).to(dtype)
    return state
