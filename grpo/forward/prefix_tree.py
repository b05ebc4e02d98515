"""Prefix tree (one micro-batch, packed): every distinct prefix once as a node, no padding.

A GRPO micro-batch repeats itself (every row starts with the chat template and system prompt, the
G rows of a group share their prompt) and pads its rows to the longest. Its rows' real tokens form
a trie: a node is one distinct prefix, i.e. one (token, everything before it). Packing lays the
nodes side by side in one row (or a few, "bins"), each at its depth as position id, with an
attention mask that lets a node see exactly its ancestors and itself. One decoder call then runs
every distinct prefix once and no padded column at all, and each batch row reads its hidden
states back from the nodes on its path (`PackedRows.unpack`). A causal decoder's state at a token
depends only on the tokens up to it and their positions, so these are the plain forward's hidden
states, and through autograd (a node's gradient is the sum over the rows that read it) its
gradients: tests/test_prefix_tree.py checks both against the plain forward.

What it costs: a bin's attention compares every node with every other one ([N, N] pairs, most of
them masked off) where the rows' own attention would compare each row with itself. So a micro-batch
is packed only when the estimate says it pays (`pack_if_cheaper`: the cheapest bins of
`plan_packing` against the segment plan of grpo/forward/segment_plan.py), in bins of at most
PACK_MAX_TOKENS nodes (a CPU only, so far), and a bin's
attention is priced at `pair_cost` token-rows per query-key pair: the attention FLOPs of a pair
over a token's matmul FLOPs (`attention_pair_ratio`, from the model's shape) times what the
device's attention kernel makes of them (PAIR_COST_FACTOR).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo.forward.training_attention import ADDITIVE_MASK_ATTENTIONS

PACK_MAX_TOKENS = {"cpu": 512}
"""Most nodes in one packed row, per device type; a device type not listed never packs. On the
2-core CPU (SmolLM2-135M, eager attention, forward+backward) the extra attention of one packed row
of B unrelated 128-token rows cost 3.9e-4 token-rows per added query-key pair at 256 nodes, 6.6e-4
at 512 and 1.25e-3 at 1,024 (its [N, N] score matrices outgrow the caches); SDPA's 4.0-5.7e-4 at
every size, but its call costs more below ~500 nodes. The standard step's forward+backward with
the cap at 384 / 512 / 1,024 (medians of 3 rounds of 3 steps, alternating): 3.12 / 2.74 / 3.25 s.
CUDA and MPS are not listed: a masked SDPA call there cannot use the flash kernel and may fall
back to one that keeps every [N, N] score matrix for the backward, and no GPU has measured it
(a varlen flash kernel, block-diagonal rows without the tree, would be the CUDA route)."""

PAIR_COST_FACTOR = {"cpu": 2.0}
"""What one query-key pair of packed attention costs relative to its FLOPs, per device type: on the
CPU 4.0-6.6e-4 token-rows per pair up to 512 nodes (above) against SmolLM2's FLOP ratio 3.26e-4,
i.e. 1.2-2.0x."""


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch packed as a prefix tree: `input_ids`, `position_ids` [P, N] (P bins of N
    nodes; unused slots hold token 0 at position 0), `allowed` [P, 1, N, N] (node q may attend
    to node k: k is q or one of its ancestors; an unused slot sees only itself), and `index`
    [B, T]: where batch row b's column t reads its hidden state in the flattened [P * N] outputs,
    P * N (a zero row) for padded columns."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    index: torch.Tensor

    @property
    def token_rows(self) -> int:
        """The decoder rows the packed forward runs (P * N)."""
        return self.input_ids.numel()

    def unpack(self, hidden: torch.Tensor) -> torch.Tensor:
        """[P, N, H] outputs of the packed rows -> [B, T, H] for the batch (zeros where padded)."""
        flat = hidden.reshape(-1, hidden.shape[-1])  # [P * N, H]
        flat = torch.cat([flat, flat.new_zeros(1, flat.shape[-1])])  # [P * N + 1, H]
        return flat[self.index]  # [B, T, H]

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """`allowed` as the additive mask eager attention adds to its scores: 0 or dtype's min."""
        mask = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
        return mask.masked_fill_(~self.allowed, torch.finfo(dtype).min)


@dataclass(frozen=True)
class PackingPlan:
    """Which batch rows share each bin (`bins`, rows in trie order), its nodes per bin, and the
    estimated cost in token-rows (see `packed_cost`)."""

    bins: list[list[int]]
    nodes: list[int]
    cost: float


def real_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Each row's real tokens (attention_mask 1) in column order: the sequence the row is."""
    valid = attention_mask.bool().cpu()
    ids = input_ids.cpu()
    return [ids[row][valid[row]].tolist() for row in range(ids.shape[0])]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def trie_order(sequences: list[list[int]]) -> tuple[list[int], list[int]]:
    """(rows in lexicographic order of their sequences, each one's common prefix with the row
    before it in that order). In that order the longest prefix a row shares with any earlier row
    is the one it shares with the row right before it, so a run of rows has sum(lengths) -
    sum(common prefixes) nodes."""
    order = sorted(range(len(sequences)), key=lambda row: sequences[row])
    common = [0] + [_common_prefix(sequences[a], sequences[b]) for a, b in itertools.pairwise(order)]
    return order, common


def packed_cost(nodes: list[int], pair_cost: float, call_tokens: float) -> float:
    """Estimated cost of one packed forward, in token-rows: every bin padded to the largest
    (P * N rows), its [N, N] attention pairs at `pair_cost` each, and one decoder call."""
    if not nodes:
        return 0.0
    width = max(nodes)
    return len(nodes) * (width + pair_cost * width * width) + call_tokens


def plan_packing(sequences: list[list[int]], max_tokens: int, pair_cost: float,
                 call_tokens: float) -> PackingPlan | None:
    """The cheapest packing of the rows into bins of consecutive rows in trie order, each of at
    most `max_tokens` nodes (a longer row gets a bin of its own); None when there is no token.
    For each number of bins P, the narrowest width that P bins reach (a bisection over the
    width, filling bins greedily) is priced with `packed_cost`."""
    order, common = trie_order(sequences)
    rows = [(row, shared) for row, shared in zip(order, common) if sequences[row]]
    if not rows:
        return None

    def fill(width: int) -> tuple[list[list[int]], list[int]]:
        bins, nodes = [[]], [0]
        for row, shared in rows:
            added = len(sequences[row]) - (shared if bins[-1] else 0)
            if bins[-1] and nodes[-1] + added > width:
                bins.append([])
                nodes.append(0)
                added = len(sequences[row])
            bins[-1].append(row)
            nodes[-1] += added
        return bins, nodes

    longest = max(len(sequences[row]) for row, _ in rows)
    cap = max(max_tokens, longest)
    best: PackingPlan | None = None
    narrowest = cap + 1
    for count in range(len(fill(cap)[0]), len(rows) + 1):
        low, high = longest, narrowest - 1  # more bins are never wider than fewer
        while low < high:  # the narrowest width that fills at most `count` bins
            middle = (low + high) // 2
            if len(fill(middle)[0]) <= count:
                high = middle
            else:
                low = middle + 1
        if low == narrowest:
            continue
        narrowest = low
        bins, nodes = fill(low)
        cost = packed_cost(nodes, pair_cost, call_tokens)
        if best is None or cost < best.cost:
            best = PackingPlan(bins, nodes, cost)
        if low == longest:
            break
    return best


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, bins: list[list[int]],
              sequences: list[list[int]] | None = None) -> PackedRows:
    """Pack the batch as `bins` say (each a list of batch rows; rows of no bin, and padded
    columns, read zeros): the trie of each bin's rows, nodes in depth-first (lexicographic) order,
    so every node comes after its ancestors. `sequences`: `real_tokens` of the batch, if known."""
    if sequences is None:
        sequences = real_tokens(input_ids, attention_mask)
    device = input_ids.device
    orders = [trie_order([sequences[r] for r in rows]) for rows in bins]  # each bin sorted once
    sizes = [sum(len(sequences[r]) for r in rows) - sum(common) for rows, (_, common) in zip(bins, orders)]
    width = max(1, max(sizes, default=1))
    count = len(bins)
    tokens = torch.zeros(count, width, dtype=torch.long)
    positions = torch.zeros(count, width, dtype=torch.long)
    allowed = torch.eye(width, dtype=torch.bool).repeat(count, 1, 1)  # [P, N, N]
    index = torch.full(input_ids.shape, count * width, dtype=torch.long)  # [B, T]
    columns = attention_mask.bool().cpu()
    lower = torch.ones(1, 1, dtype=torch.bool)
    for b, (rows, (order, common)) in enumerate(zip(bins, orders)):
        path = torch.zeros(0, dtype=torch.long)  # node ids of the previous row's path
        size = 0
        for position_in_bin, shared in zip(order, common):
            row = rows[position_in_bin]
            sequence = sequences[row]
            length = len(sequence)
            if not length:
                continue
            new = length - shared
            path = torch.cat([path[:shared], torch.arange(size, size + new)])  # [length]
            tokens[b, size : size + new] = torch.tensor(sequence[shared:])
            positions[b, size : size + new] = torch.arange(shared, length)
            if lower.shape[0] < length:
                lower = torch.ones(length, length, dtype=torch.bool).tril()
            # A new node at depth j sees the path's nodes at depths 0..j.
            allowed[b, path[shared:, None], path[None, :]] = lower[shared:length, :length]
            index[row, columns[row]] = b * width + path
            size += new
    return PackedRows(
        input_ids=tokens.to(device),
        position_ids=positions.to(device),
        allowed=allowed.unsqueeze(1).to(device),
        index=index.to(device),
    )


def segments_cost(segments, pair_cost: float, call_tokens: float) -> float:
    """Estimated cost of the segment plan's forward (grpo/forward/segment_plan.py), in the same
    units as `packed_cost`: each segment's token-rows, its attention pairs (its columns against
    every column up to its end) and one call per segment."""
    total = 0.0
    for segment in segments:
        rows, columns = len(segment.rows), segment.end - segment.start
        total += rows * columns * (1 + pair_cost * segment.end) + call_tokens
    return total


def attention_pair_ratio(config) -> float | None:
    """Attention FLOPs of one query-key pair over one token's decoder matmul FLOPs, from a
    transformers config (per layer: 4 * heads * head_dim against 2 * the layer's weights; a gated
    MLP assumed); None when the config does not say enough."""
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    inner = getattr(config, "intermediate_size", None)
    if not (hidden and heads and inner):
        return None
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    layer_weights = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inner
    return 2.0 * heads * head_dim / layer_weights


def supports_tree_mask(config) -> str | None:
    """Why a model cannot run a packed forward (None when it can): packing needs every layer to
    attend through the mask it is given (full attention; eager, grpo_eager or SDPA)."""
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (*ADDITIVE_MASK_ATTENTIONS, "sdpa"):
        return f"attention implementation {implementation!r} (packing needs one of {(*ADDITIVE_MASK_ATTENTIONS, 'sdpa')})"
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(kind != "full_attention" for kind in layer_types):
        return f"layer types {sorted(set(layer_types))} (packing needs full attention everywhere)"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "a sliding attention window"
    return None


def pair_cost(config, device_type: str) -> float | None:
    """What one query-key pair of packed attention costs on `device_type`, in token-rows (the
    model's FLOP ratio times PAIR_COST_FACTOR); None when the model cannot be packed, or not on
    this device type (not in PACK_MAX_TOKENS)."""
    ratio = attention_pair_ratio(config)
    if ratio is None or supports_tree_mask(config) is not None or device_type not in PACK_MAX_TOKENS:
        return None
    return ratio * PAIR_COST_FACTOR[device_type]


def pack_if_cheaper(input_ids: torch.Tensor, attention_mask: torch.Tensor, segments,
                    per_pair: float, call_tokens: float) -> PackedRows | None:
    """The batch packed in its cheapest bins (PACK_MAX_TOKENS nodes at most, for the device of
    `input_ids`) when that is estimated cheaper than running `segments`, else None."""
    sequences = real_tokens(input_ids, attention_mask)
    max_tokens = PACK_MAX_TOKENS[input_ids.device.type]
    plan = plan_packing(sequences, max_tokens, per_pair, call_tokens)
    if plan is None or plan.cost >= segments_cost(segments, per_pair, call_tokens):
        return None
    return pack_rows(input_ids, attention_mask, plan.bins, sequences)
