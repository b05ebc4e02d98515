"""A preallocated KV cache for batched sampling, plugged into a transformers model's forward.

Layout: one buffer per layer, keys and values `[rows, kv_heads, capacity, head_dim]`; with
`keys_transposed` the keys are stored `[rows, kv_heads, head_dim, capacity]` (attention still
sees `[rows, heads, columns, dim]` views), so a decode step's query x keys product reads each
row's keys along the columns. On a CPU that halves the product's time with a bf16 cache and
slows it with an fp32 one, so the engine transposes only bf16 caches by default. The buffers'
dtype may be lower than the states' (HFEngine's `kv_cache_dtype`).

Prompts are right-aligned at column P (the longest prompt's length): every row's first sampled
token goes to column P, the next to P + 1, and so on, so one decode step writes one column for the
whole batch and attends over a view `[lo, pos]` of the buffer. Nothing is concatenated or
reallocated per step (transformers' DynamicCache copies the whole cache every step). Columns left
of a row's prompt are masked by the caller's attention mask. Rows that join a running batch are
right-aligned at the column the next step writes (grpo/rollout/hf/live_batch.py).

A forward covers a `CacheWindow`: a contiguous slice of rows (prefill chunks fill some rows at a
time; an index tensor for the scattered rows of resumed sessions), the first column attended
(`lo`) and the column written first (`pos`). `copy_rows` compacts finished rows away (the rows
after them move up) and fans a prefilled prompt out to the rows sharing it; `zero` makes columns
that a row attends but never writes finite (the columns left of a joining prompt, and the gap a
longer joining prompt opens in the other rows).

A cache may keep one shared prefix (`keep_prefix`): the keys and values of a prompt prefix that
its rows start with (a multi-turn batch's system prompt and tool docs), copied once out of the row
that prefilled it into contiguous tensors. Decode steps attend to it once for all the rows that
hold it (grpo/rollout/hf/decode_attention.py `PrefixAttention`), and rows that join later with
prompts starting with it get it written into their columns (`write_prefix`) instead of
prefilling it again: bit for bit the keys and values the first rows hold.

Static windows (`set_static`) serve fixed-shape decode steps (grpo/rollout/hf/decode_graphs.py): the
column written is a device tensor instead of a Python int, and the forward attends over a fixed
number of columns [0, width) (the caller masks those not yet written), so one step's kernels do
not depend on the step and can be replayed as a CUDA graph. A cache used that way is zeroed
whole when allocated (`zero_columns=capacity`): masked columns are still multiplied by zero
weights, so every column must hold finite values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from grpo.rollout.hf.decode_attention import PrefixAttention


@dataclass
class CacheWindow:
    """What the next forward reads and writes; shared by all layers of one cache."""

    rows: slice | torch.Tensor
    """The rows read and written: a slice, or an index tensor (rows resuming a session)."""
    lo: int
    """First column attended."""
    pos: int
    """First column the forward writes (its query tokens occupy [pos, pos + q))."""
    write_index: torch.Tensor | None = None
    """Static windows: the column written, a one-element device tensor (`pos` is then unused)."""
    width: int = 0
    """Static windows: columns [0, width) are attended."""


class _PreallocatedLayer(CacheLayerMixin):
    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(
        self,
        window: CacheWindow,
        batch: int,
        capacity: int,
        zero_columns: int,
        dtype: torch.dtype | None,
        keys_transposed: bool,
    ) -> None:
        super().__init__()
        self.window = window
        self.batch = batch
        self.capacity = capacity
        self.zero_columns = zero_columns
        self.cache_dtype = dtype
        self.keys_transposed = keys_transposed
        self.pending_zero: list[tuple[slice, int, int]] = []
        """`zero` regions asked for before the buffers existed (they are made on first use)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, heads, _, key_dim = key_states.shape
        value_dim = value_states.shape[-1]
        self.dtype, self.device = self.cache_dtype or key_states.dtype, key_states.device
        key_shape = (
            (self.batch, heads, key_dim, self.capacity)
            if self.keys_transposed
            else (self.batch, heads, self.capacity, key_dim)
        )
        self.keys = torch.empty(key_shape, dtype=self.dtype, device=self.device)
        # Every read and write goes through this [rows, heads, capacity, dim] view of the keys,
        # whatever their storage layout: the same indexing as the values.
        self.key_view = self.keys.transpose(-1, -2) if self.keys_transposed else self.keys
        self.values = torch.empty(
            self.batch, heads, self.capacity, value_dim, dtype=self.dtype, device=self.device
        )
        # Masked columns are still multiplied by zero attention weights: garbage memory there could
        # hold NaN/inf bit patterns and poison the sum. Columns from P on are written before read.
        self.is_initialized = True
        self.zero(slice(None), 0, self.zero_columns)
        for rows, lo, end in self.pending_zero:
            self.zero(rows, lo, end)
        self.pending_zero.clear()

    def _key_columns(self, rows, lo: int, end: int) -> torch.Tensor:
        """Keys of `rows`, columns [lo, end), as [rows, heads, columns, dim]."""
        return self.key_view[rows, :, lo:end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        w = self.window
        # Index-tensor rows write through index_put, which does not cast: cast here.
        if key_states.dtype != self.dtype or value_states.dtype != self.dtype:
            key_states, value_states = key_states.to(self.dtype), value_states.to(self.dtype)
        if w.write_index is not None:
            self.key_view[w.rows].index_copy_(2, w.write_index, key_states)
            self.values[w.rows].index_copy_(2, w.write_index, value_states)
            return self._key_columns(w.rows, 0, w.width), self.values[w.rows, :, : w.width]
        end = w.pos + key_states.shape[-2]
        self.key_view[w.rows, :, w.pos : end] = key_states
        self.values[w.rows, :, w.pos : end] = value_states
        return self._key_columns(w.rows, w.lo, end), self.values[w.rows, :, w.lo : end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.window.write_index is not None:
            return self.window.width, 0
        return self.window.pos - self.window.lo + query_length, 0

    def get_seq_length(self) -> int:
        if self.window.write_index is not None:
            return self.window.width - 1
        return self.window.pos - self.window.lo

    def get_max_length(self) -> int:
        return self.capacity

    def copy_rows(self, source: torch.Tensor, lo: int, end: int, first: int = 0) -> None:
        """Row first + i becomes a copy of row source[i], columns [lo, end)."""
        if self.is_initialized:
            rows = slice(first, first + source.numel())
            self.key_view[rows, :, lo:end] = self.key_view[source, :, lo:end]
            self.values[rows, :, lo:end] = self.values[source, :, lo:end]

    def prefix_of(self, row: int, lo: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row `row`'s columns [lo, end) as contiguous keys [heads, dim, n] and values [heads,
        n, dim] (the layouts the shared-prefix products read)."""
        keys = self.key_view[row, :, lo:end].transpose(-1, -2).contiguous()
        return keys, self.values[row, :, lo:end].contiguous()

    def equals(self, row: int, lo: int, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Are row `row`'s columns [lo, lo + n) keys [heads, dim, n] and values [heads, n, dim],
        bit for bit?"""
        end = lo + values.shape[1]
        return torch.equal(self.key_view[row, :, lo:end], keys.transpose(-1, -2)) and torch.equal(
            self.values[row, :, lo:end], values
        )

    def write(self, rows: slice, lo: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Columns [lo, lo + n) of every row in `rows` become keys [heads, dim, n] and values
        [heads, n, dim]."""
        end = lo + values.shape[1]
        self.key_view[rows, :, lo:end] = keys.transpose(-1, -2)
        self.values[rows, :, lo:end] = values

    def zero(self, rows: slice, lo: int, end: int) -> None:
        """Zero columns [lo, end) of `rows` (now, or when the buffers are made)."""
        if not self.is_initialized:
            self.pending_zero.append((rows, lo, end))
        elif end > lo:
            self._key_columns(rows, lo, end).zero_()
            self.values[rows, :, lo:end].zero_()


class PreallocatedCache(Cache):
    """KV cache for `batch` rows of up to `capacity` tokens; columns [0, zero_columns) start
    zeroed. `dtype`: the buffers' dtype (None: the key states'); `keys_transposed`: keys stored
    [rows, heads, dim, capacity], the layout a decode step's query x keys product reads fastest on
    a CPU (attention still sees [rows, heads, columns, dim] views)."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        capacity: int,
        zero_columns: int,
        *,
        dtype: torch.dtype | None = None,
        keys_transposed: bool = False,
    ) -> None:
        self.window = CacheWindow(rows=slice(0, batch), lo=0, pos=0)
        self.prefix_tokens: tuple[int, ...] = ()
        """The kept shared prefix's tokens (empty: none kept)."""
        self.prefix: PrefixAttention | None = None
        """Its keys and values, per layer."""
        super().__init__(
            layers=[
                _PreallocatedLayer(
                    self.window, batch, capacity, zero_columns, dtype, keys_transposed
                )
                for _ in range(num_layers)
            ]
        )

    @property
    def rows(self) -> int:
        return self.layers[0].batch

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def set_window(self, rows: slice | torch.Tensor, lo: int, pos: int) -> None:
        self.window.rows, self.window.lo, self.window.pos = rows, lo, pos
        self.window.write_index = None

    def set_static(self, rows: slice, width: int, write_index: torch.Tensor) -> None:
        """The next forwards write one column, `write_index` (a [1] device tensor), of `rows`
        and attend over columns [0, width)."""
        self.window.rows, self.window.lo, self.window.width = rows, 0, width
        self.window.write_index = write_index

    def copy_rows(self, source: torch.Tensor, lo: int, end: int, first: int = 0) -> None:
        for layer in self.layers:
            layer.copy_rows(source, lo, end, first)

    def zero(self, rows: slice, lo: int, end: int) -> None:
        for layer in self.layers:
            layer.zero(rows, lo, end)

    def keep_prefix(self, tokens: tuple[int, ...], row: int, lo: int) -> None:
        """Keep the prefix `tokens`, prefilled into row `row`'s columns [lo, lo + len(tokens)),
        as the cache's shared prefix (replacing any kept before)."""
        end = lo + len(tokens)
        self.prefix = PrefixAttention([layer.prefix_of(row, lo, end) for layer in self.layers])
        self.prefix_tokens = tuple(tokens)

    def holds_prefix(self, row: int, lo: int) -> bool:
        """Are row `row`'s columns [lo, lo + P) the kept prefix, bit for bit?"""
        return self.prefix is not None and all(
            layer.equals(row, lo, keys, values)
            for layer, (keys, values) in zip(self.layers, self.prefix.layers)
        )

    def write_prefix(self, rows: slice, lo: int) -> None:
        """Columns [lo, lo + P) of `rows` become the kept prefix (its P tokens' keys and values)."""
        if self.prefix is None:
            raise RuntimeError("write_prefix: this cache keeps no shared prefix")
        for layer, (keys, values) in zip(self.layers, self.prefix.layers):
            layer.write(rows, lo, keys, values)
