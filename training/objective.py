"""The training objective: the weighted sum of response-token losses, and the batches that feed it.

Every arm optimizes the same quantity: for an update's documents D,
    L = Σ_{d∈D} w_d · Σ_{t∈response(d)} CE(t) / W,   W = Σ_{d∈D} w_d · |response(d)|
Arms differ only in who computes which part of the sum and what they divide by (see `trainer.py`),
so the module here returns the *unnormalized* weighted sum and leaves the scale to the caller.

Only target positions reach the output layer: with a 49k vocabulary the full logits tensor would
dominate memory, and prompt or padding positions contribute nothing anyway.

A microbatch is either padded (one row per document, right-padded to the longest) or packed (its
documents end to end in one row, positions restarting at 0 for each, attention kept inside each
document). The two compute the same sum; packing only drops the padding, which at these document
lengths is about half of a padded microbatch's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.corpus import Corpus


@dataclass
class Microbatch:
    """Right-padded documents plus the flat list of positions whose next token is a target."""

    docs: list[int]  # corpus indices, in row order
    input_ids: torch.Tensor  # [b, L] int64
    attention_mask: torch.Tensor | None  # [b, L] int64, None when nothing is padded
    rows: torch.Tensor  # [T] row of each target's predicting position
    cols: torch.Tensor  # [T] column of the predicting position (target is at col + 1)
    labels: torch.Tensor  # [T] the target token
    weights: torch.Tensor  # [T] float32, the document's token weight
    weighted_targets: int  # Σ weights, exact
    position_ids: torch.Tensor | None = None  # [b, L] for packed rows (restarting per document)

    def args(self) -> tuple:
        """Positional arguments of `WeightedResponseLoss.forward` (also through a DDP wrapper)."""
        return (self.input_ids, self.attention_mask, self.rows, self.cols, self.labels, self.weights,
                self.position_ids)

    def to(self, device: torch.device | str) -> "Microbatch":
        mv = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Microbatch(self.docs, mv(self.input_ids), mv(self.attention_mask), mv(self.rows),
                          mv(self.cols), mv(self.labels), mv(self.weights), self.weighted_targets,
                          mv(self.position_ids))


def order_for_microbatches(corpus: Corpus, docs: Sequence[int], sort_by_length: bool) -> list[int]:
    """Longest first (ties keep assignment order), so each microbatch pads to similar lengths."""
    docs = list(docs)
    if not sort_by_length:
        return docs
    lengths = corpus.lengths
    return [d for _, d in sorted(enumerate(docs), key=lambda p: (-int(lengths[p[1]]), p[0]))]


def make_microbatches(corpus: Corpus, docs: Sequence[int], microbatch: int | None, *,
                      pad_id: int, sort_by_length: bool = True, pad_multiple: int | None = None,
                      pack: bool = False, pack_tokens: int | None = None,
                      pack_rows: int = 1) -> list[Microbatch]:
    """Split a local batch into microbatches of at most `microbatch` documents (last may be short),
    padded (`collate`) or packed (`collate_packed`). Packed microbatches keep the assignment order:
    sorting saves no padding there, and it would make the long and short microbatches' rows very
    different widths (under torch.compile, each width is a graph).

    With `pack_tokens`, a packed microbatch is instead one row of exactly that many tokens, filled
    first-fit in assignment order (`microbatch` is not used): every row has the same shape, so a
    compiled step has one graph, and only each row's tail is padding. `pack_rows` puts that many
    rows in one forward (`group_rows`): the weights' bf16 casts and the FP32 gradient accumulation,
    paid once per forward, are then paid once per `pack_rows` rows."""
    if pack and pack_tokens:
        rows: list[list[int]] = []
        room: list[int] = []
        for d in docs:
            n = len(corpus.doc(d))
            if n > pack_tokens:
                raise ValueError(f"document {d} has {n} tokens, more than a packed row's {pack_tokens}")
            i = next((i for i, r in enumerate(room) if r >= n), None)
            if i is None:
                rows.append([])
                room.append(pack_tokens)
                i = len(rows) - 1
            rows[i].append(d)
            room[i] -= n
        return [collate_rows(corpus, g, pad_id=pad_id, width=pack_tokens) for g in group_rows(rows, pack_rows)]
    ordered = order_for_microbatches(corpus, docs, sort_by_length and not pack)
    size = microbatch or max(1, len(ordered))
    make = collate_packed if pack else collate
    return [make(corpus, ordered[i:i + size], pad_id=pad_id, pad_multiple=pad_multiple)
            for i in range(0, len(ordered), size)]


def _targets(corpus: Corpus, d: int, s: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray]:
    """A document's length, prompt length, target tokens and their weights (the response tokens)."""
    n, p, w = len(s), int(corpus.prompt_lens[d]), int(corpus.weights[d])
    if not 1 <= p < n:
        raise ValueError(f"document {d} has prompt length {p} and length {n}: no target tokens")
    return n, p, s[p:n].astype(np.int64), np.full(n - p, w, dtype=np.float32)


def collate(corpus: Corpus, docs: Sequence[int], *, pad_id: int, pad_multiple: int | None = None) -> Microbatch:
    """`pad_multiple` rounds the width up (a compiled step then sees a few shapes, not one per batch);
    padding is masked and never a target, so the loss is the same."""
    seqs = [corpus.doc(d) for d in docs]
    width = max(len(s) for s in seqs)
    if pad_multiple:
        width = -(-width // pad_multiple) * pad_multiple
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    rows, cols, labels, weights = [], [], [], []
    total = 0
    for r, (d, s) in enumerate(zip(docs, seqs)):
        n, p, lab, wts = _targets(corpus, d, s)
        ids[r, :n] = s
        mask[r, :n] = 1
        positions = np.arange(p - 1, n - 1)
        rows.append(np.full(len(positions), r))
        cols.append(positions)
        labels.append(lab)
        weights.append(wts)
        total += int(corpus.weights[d]) * len(positions)
    padded = bool((mask == 0).any())
    cat = lambda xs, dt: torch.from_numpy(np.concatenate(xs).astype(dt))  # noqa: E731
    return Microbatch(list(docs), torch.from_numpy(ids), torch.from_numpy(mask) if padded else None,
                      cat(rows, np.int64), cat(cols, np.int64), cat(labels, np.int64),
                      cat(weights, np.float32), total)


def group_rows(rows: list[list[int]], per_forward: int) -> list[list[list[int]]]:
    """Full groups of `per_forward` rows in order, then the remainder one row at a time: a compiled
    step sees two shapes at most (`per_forward` rows and one row), each compiled once, and no
    forward carries an all-padding row."""
    if per_forward < 1:
        raise ValueError(f"pack_rows must be at least 1, not {per_forward}")
    full = len(rows) // per_forward * per_forward
    return [rows[i:i + per_forward] for i in range(0, full, per_forward)] + [[r] for r in rows[full:]]


def collate_packed(corpus: Corpus, docs: Sequence[int], *, pad_id: int,
                   pad_multiple: int | None = None) -> Microbatch:
    """The documents end to end in one row; `position_ids` restart at 0 for each document, which is
    how Hugging Face's mask builder recognizes packed sequences (no 2-D attention mask) and keeps
    each document's attention inside itself. A padded tail (`pad_multiple`) is one more sequence of
    its own, never a target, so it changes no document's result."""
    n_real = sum(len(corpus.doc(d)) for d in docs)
    width = -(-n_real // pad_multiple) * pad_multiple if pad_multiple else n_real
    return collate_rows(corpus, [list(docs)], pad_id=pad_id, width=width)


def collate_rows(corpus: Corpus, rows: Sequence[Sequence[int]], *, pad_id: int, width: int) -> Microbatch:
    """Packed rows (`collate_packed`'s layout) of one `width`, stacked as a batch: the mask builder
    finds each row's documents from its own `position_ids`, so no attention crosses a row or a
    document. The microbatch's documents are the rows' in order."""
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    pos = np.zeros((len(rows), width), dtype=np.int64)
    row_of, cols, labels, weights = [], [], [], []
    total = 0
    for r, docs in enumerate(rows):
        at = 0
        for d in docs:
            s = corpus.doc(d)
            n, p, lab, wts = _targets(corpus, d, s)
            if at + n > width:
                raise ValueError(f"documents {list(docs)} hold more than a row's {width} tokens")
            ids[r, at:at + n] = s
            pos[r, at:at + n] = np.arange(n)
            cols.append(at + np.arange(p - 1, n - 1))
            row_of.append(np.full(n - p, r))
            labels.append(lab)
            weights.append(wts)
            total += int(corpus.weights[d]) * (n - p)
            at += n
        pos[r, at:] = np.arange(width - at)
    cat = lambda xs, dt: torch.from_numpy(np.concatenate(xs).astype(dt))  # noqa: E731
    return Microbatch([d for docs in rows for d in docs], torch.from_numpy(ids), None,
                      cat(row_of, np.int64), cat(cols, np.int64), cat(labels, np.int64),
                      cat(weights, np.float32), total, torch.from_numpy(pos))


def packed_attention(device: torch.device) -> str:
    """The attention kernel packed rows use: FlexAttention on CUDA (its block mask skips the
    cross-document blocks), SDPA with the materialized document mask on CPU (tests)."""
    return "flex_attention" if device.type == "cuda" else "sdpa"


def weighted_targets(corpus: Corpus, docs: Sequence[int]) -> int:
    return int(corpus.weighted_targets[list(docs)].sum())


class WeightedResponseLoss(nn.Module):
    """Wraps a causal LM so that `forward` returns Σ w·CE over a microbatch's target tokens.

    DistributedDataParallel must wrap the module whose forward produces the loss, so the loss lives
    here rather than in the training loop; the wrapped model's parameters are this module's.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                rows: torch.Tensor, cols: torch.Tensor, labels: torch.Tensor,
                weights: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                          position_ids=position_ids, use_cache=False).last_hidden_state
        logits = self.model.get_output_embeddings()(hidden[rows, cols]).float()
        return (F.cross_entropy(logits, labels, reduction="none") * weights).sum()
