"""The KV cache of the transformers engine: one row per sequence, written in place.

Every layer keeps keys and values in one preallocated tensor ``[rows, kv_heads, columns,
head_dim]``. A sequence owns a row and its tokens sit at columns ``0..length-1`` of it, so a
sequence joins or leaves without touching the others, and a decode step writes one column per
row instead of copying the cache (``DynamicCache`` concatenates a new tensor every step: a copy
of the whole cache per token). Rows ``0..n-1`` are occupied, so a decode step reads a plain view
of them; a leaving sequence's row is filled by moving the last one into it.

The model reads it through the ``Cache`` interface: before each forward the engine says which
rows the forward holds and where each writes (:meth:`plan_decode`, :meth:`plan_prefill`), so
nothing here depends on the model's architecture beyond its layer count and KV shape.

A decode step is a rectangle (one token per row, the engine's 4D mask hides each row's unused
columns) and runs transformers' SDPA attention. A prefill step packs chunks of several prompts,
of any lengths, into one row of tokens (:class:`Segment`): :func:`row_attention` runs each
chunk against its own row of the cache, so a forward costs what its tokens cost, with no
padding and no attention across prompts. It is registered with transformers' attention
interface as ``ROW_ATTENTION``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROW_ATTENTION = "batchserve_rows"


@dataclass(frozen=True, slots=True)
class _Decode:
    rows: int
    write_at: torch.Tensor
    read: int


@dataclass(frozen=True, slots=True)
class Segment:
    """One prompt's chunk in a packed prefill: tokens ``offset..offset+width-1`` of the
    forward are positions ``start..start+width-1`` of the sequence in row ``slot``."""

    slot: int
    start: int
    width: int
    offset: int

    @property
    def end(self) -> int:
        return self.start + self.width


@dataclass(frozen=True, slots=True)
class _Prefill:
    segments: list[Segment]


class RowCache(Cache):
    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        max_rows: int,
    ) -> None:
        # Not Cache.__init__: its layer objects are what this class replaces.
        self.layers: list[Any] = []
        self._shape = (num_kv_heads, head_dim)
        self._dtype, self._device = dtype, device
        self.rows = self.columns = 0
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._num_layers = num_layers
        self._rows_index = torch.arange(max_rows, device=device)
        self._plan: _Decode | _Prefill | None = None

    @property
    def bytes_per_token(self) -> int:
        heads, dim = self._shape
        return 2 * self._num_layers * heads * dim * torch.finfo(self._dtype).bits // 8

    def resize(self, rows: int, columns: int) -> None:
        """Hold ``rows`` rows of ``columns`` positions, keeping what fits of the contents."""
        if (rows, columns) == (self.rows, self.columns):
            return
        heads, dim = self._shape
        keep_rows, keep_columns = min(rows, self.rows), min(columns, self.columns)
        for store in (self._keys, self._values):
            for layer in range(self._num_layers):
                fresh = torch.zeros(
                    (rows, heads, columns, dim), dtype=self._dtype, device=self._device
                )
                if len(store) > layer:
                    if keep_rows and keep_columns:
                        fresh[:keep_rows, :, :keep_columns] = store[layer][
                            :keep_rows, :, :keep_columns
                        ]
                    store[layer] = fresh  # the old tensor is freed here, layer by layer
                else:
                    store.append(fresh)
        self.rows, self.columns = rows, columns

    def move_row(self, source: int, target: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``source`` into row ``target``."""
        for store in (self._keys, self._values):
            for tensor in store:
                tensor[target, :, :length] = tensor[source, :, :length]

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Give row ``target`` the first ``length`` positions of row ``source`` (a shared
        prompt prefix); ``source`` keeps its own."""
        self.move_row(source, target, length)

    def swap_rows(self, a: int, b: int, length: int) -> None:
        """Exchange the first ``length`` positions of rows ``a`` and ``b``."""
        for store in (self._keys, self._values):
            for tensor in store:
                held = tensor[a, :, :length].clone()
                tensor[a, :, :length] = tensor[b, :, :length]
                tensor[b, :, :length] = held

    def plan_decode(self, rows: int, write_at: torch.Tensor, read: int) -> None:
        """The next forward holds rows ``0..rows-1``, one token each, written at ``write_at``
        (a column per row); attention reads the first ``read`` columns."""
        self._plan = _Decode(rows, write_at, read)

    def plan_prefill(self, segments: list[Segment]) -> None:
        """The next forward is one row of these prompt chunks, packed one after another; pass
        the same list to the model as ``row_segments`` (:func:`row_attention` reads it)."""
        assert all(s.end <= self.columns for s in segments), "grow the cache first"
        self._plan = _Prefill(segments)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: object,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self._plan
        assert plan is not None, "plan the forward first"
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        if isinstance(plan, _Decode):
            index = self._rows_index[: plan.rows]
            keys[index, :, plan.write_at] = key_states[:, :, 0]
            values[index, :, plan.write_at] = value_states[:, :, 0]
            return keys[: plan.rows, :, : plan.read], values[: plan.rows, :, : plan.read]
        for segment in plan.segments:
            chunk = slice(segment.offset, segment.offset + segment.width)
            keys[segment.slot, :, segment.start : segment.end] = key_states[0, :, chunk]
            values[segment.slot, :, segment.start : segment.end] = value_states[0, :, chunk]
        return keys, values  # the whole layer: row_attention reads each segment's row

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Positions are passed explicitly with every forward; no caller needs a length here.
        return 0


def row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    row_segments: list[Segment] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over the row cache. A decode step (no ``row_segments``) is transformers' SDPA
    over the rows with the engine's mask. A packed prefill attends each segment's queries to
    its own row, causally from the segment's first position (``key``/``value`` are the whole
    layer here). Returns ``(batch, tokens, heads, head_dim)``, as every attention function."""
    if row_segments is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    grouped = query.shape[1] != key.shape[1]
    out = torch.empty_like(query)
    for segment in row_segments:
        chunk = slice(segment.offset, segment.offset + segment.width)
        keys = key[segment.slot : segment.slot + 1, :, : segment.end]
        values = value[segment.slot : segment.slot + 1, :, : segment.end]
        mask = None
        if segment.start:  # queries sit at the end of what they read: causal, bottom-right
            mask = torch.arange(segment.end, device=query.device)[None, :] <= (
                segment.start + torch.arange(segment.width, device=query.device)[:, None]
            )
        out[:, :, chunk] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, chunk],
            keys,
            values,
            attn_mask=mask,
            is_causal=mask is None,
            scale=scaling,
            enable_gqa=grouped,
        )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ROW_ATTENTION, row_attention)
