"""The trained policy: a causal LM (full weights or LoRA) plus a scalar value head.

`PolicyWithValueHead.forward(input_ids, attention_mask)` returns the log-probs of every next token
(`input_ids[:, 1:]`), optionally the entropy and the value-head outputs. It runs the decoder once
for the final hidden states and computes the log-probs with the chunked function of
grpo/models/logprobs.py: the LM head is never applied to all positions at once.

`from_config` builds it: loads the model (grpo/models/source.py), optionally in 4-bit (CUDA or
CPU), wraps it with a peft LoRA adapter, turns on gradient checkpointing, and picks the autocast
dtype for the device (grpo/models/devices.py). `state_dict` / `load_state_dict` hold what a
checkpoint needs (LoRA: adapter + value head only); grpo/models/export.py writes Hugging Face
directories.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model, prepare_model_for_kbit_training
from torch import nn

from grpo.models.cache_argument import cache_keyword, output_cache
from grpo.models.common_prefix import CommonPrefix
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.devices import autocast_context, check_weights_dtype, compute_dtype
from grpo.models.embedding_gradient import ReusedEmbeddingGradient
from grpo.models.four_bit import four_bit_kwargs, keep_4bit_layout_
from grpo.models.logprobs import DEFAULT_CHUNK_SIZE, token_logprobs_and_entropy
from grpo.models.peft_weights import is_peft
from grpo.models.prefix_segments import SEGMENT_CALL_TOKENS, Segment, plan_segments
from grpo.models.prefix_tree import PackedRows, pack_if_cheaper, pair_cost
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.models.training_attention import choose_attention

_WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])


@dataclass
class PolicyOutput:
    """What one policy forward returns; position t scores the token input_ids[:, t + 1]."""

    logprobs: torch.Tensor  # [B, T-1] log pi(input_ids[:, t+1] | input_ids[:, :t+1]) at temperature
    entropy: torch.Tensor | None  # [B, T-1] entropy of that next-token distribution
    values: torch.Tensor | None  # [B, T-1] value head at position t (the state before token t+1)


def is_checkpointing(model: nn.Module) -> bool:
    """Whether transformers gradient checkpointing is on (it turns the KV cache off)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)


def _scatter_rows(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N] values of the True entries of `positions` ([B, T]) back to [B, T], 0 elsewhere."""
    out = values.new_zeros(positions.shape)  # [B, T]
    return out.masked_scatter(positions, values)


class PolicyWithValueHead(nn.Module):
    """A causal LM (transformers model or peft-wrapped one) plus a Linear(hidden, 1) value head."""

    def __init__(
        self,
        model: nn.Module,
        *,
        value_head: bool = True,
        compute_dtype: torch.dtype = torch.float32,
        logprob_chunk_size: int = DEFAULT_CHUNK_SIZE,
        tokenizer=None,
        share_prefix_min: int = 16,
        segment_call_tokens: int | None = None,
        packing: bool = True,
    ):
        super().__init__()
        if share_prefix_min < 0 or (segment_call_tokens is not None and segment_call_tokens < 0):
            raise ValueError(
                f"share_prefix_min ({share_prefix_min}) and segment_call_tokens ({segment_call_tokens}) "
                "must be >= 0 (share_prefix_min 0: never share a prefix)"
            )
        self.model = model
        self.share_prefix_min = share_prefix_min
        """Shortest shared prefix segment, in columns, that runs once (see final_hidden_states); 0 =
        never share."""
        self.segment_call_tokens = segment_call_tokens
        """What one more segment costs, in token-rows; None: the device type's SEGMENT_CALL_TOKENS
        (grpo/models/prefix_segments.py), with or without gradients as the forward runs."""
        self.packing = packing
        """Whether a forward may pack its batch as a prefix tree where that is estimated to pay
        (grpo/models/prefix_tree.py; see forward_layout)."""
        self.is_lora = is_peft(model)
        self.compute_dtype = compute_dtype
        self.logprob_chunk_size = logprob_chunk_size
        self.tokenizer = tokenizer
        lm = self.language_model()
        # The input embedding's weight gradient in a reused buffer (CPU; None where frozen).
        self.embedding_gradient = ReusedEmbeddingGradient.install(lm.get_input_embeddings())
        self.value_head: nn.Linear | None = None
        if value_head:
            # Zero init: values start at 0 and the head adds no gradient to the trunk until it learns.
            head = nn.Linear(lm.config.hidden_size, 1, dtype=torch.float32, device=self.device)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            self.value_head = head
        # What a checkpoint holds: for LoRA the adapter (all that is trainable in the LM) and the
        # value head; for full fine-tuning every tensor (nn.Module's own state_dict).
        self._checkpoint_names = [
            name
            for name, p in self.named_parameters()
            if p.requires_grad or name.startswith("value_head.")
        ]

    # ----- construction ---------------------------------------------------------------------

    @classmethod
    def from_config(
        cls, model_cfg: ModelConfig, lora_cfg: LoraConfig, device: torch.device | str, seed: int = 0
    ) -> tuple[PolicyWithValueHead, object]:
        """Load the model named by `model_cfg` onto `device`, apply LoRA / 4-bit / checkpointing."""
        device = torch.device(device)
        tokenizer = load_tokenizer(model_cfg.name_or_path, model_cfg.cache_dir)
        weights_dtype = _WEIGHT_DTYPES[model_cfg.weights_dtype]
        check_weights_dtype(device, weights_dtype)
        autocast_dtype = compute_dtype(device, model_cfg.dtype)
        extra: dict = {}
        if model_cfg.load_in_4bit:
            extra = four_bit_kwargs(model_cfg, lora_cfg, device, autocast_dtype)
        model = load_causal_lm(
            model_cfg.name_or_path,
            cache_dir=model_cfg.cache_dir,
            dtype=weights_dtype,
            tokenizer=tokenizer,
            tiny_layers=model_cfg.tiny_layers,
            tiny_hidden_size=model_cfg.tiny_hidden_size,
            seed=seed,
            **extra,
        )
        model.set_attn_implementation(choose_attention(model_cfg.attn_implementation, model, device))
        checkpointing_kwargs = {"use_reentrant": False}
        if model_cfg.load_in_4bit:
            keep_4bit_layout_(model)
            model = prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=model_cfg.gradient_checkpointing,
                gradient_checkpointing_kwargs=checkpointing_kwargs,
            )
        else:
            model.to(device)
            if model_cfg.gradient_checkpointing:
                _enable_checkpointing(model, checkpointing_kwargs)
        if lora_cfg.enabled:
            if model_cfg.gradient_checkpointing:
                # Frozen embeddings give checkpointed blocks inputs without grad; with reentrant
                # checkpointing the adapters would then get no gradient at all.
                model.enable_input_require_grads()
            model = _add_lora(model, lora_cfg, seed)
        policy = cls(
            model,
            value_head=model_cfg.value_head,
            compute_dtype=autocast_dtype,
            tokenizer=tokenizer,
            packing=model_cfg.packing,
        )
        policy.train()
        return policy, tokenizer

    # ----- accessors --------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def language_model(self) -> nn.Module:
        """The transformers causal LM (for LoRA: the base model with the adapter layers injected)."""
        return self.model.get_base_model() if self.is_lora else self.model

    def generation_model(self) -> nn.Module:
        """The module a rollout engine samples from, with the current weights (LoRA: the peft model).

        Call its `generate` with the policy in eval mode: transformers turns the KV cache off for
        gradient-checkpointed models in training mode.
        """
        return self.model

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.trainable_parameters())

    # ----- forward ----------------------------------------------------------------------------

    def final_hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: CommonPrefix | None = None
    ) -> torch.Tensor:
        """[B, T, H] hidden states after the final norm, without applying the LM head.

        Rows' shared prefixes (the system prompt and tool docs of every row, a group's prompt) and
        padding are not run as such: `forward_layout` packs the batch as a prefix tree (every
        distinct prefix once, no padding: grpo/models/prefix_tree.py) or plans column segments,
        each run for one row per distinct prefix, continuing the KV cache of the rows that ran the
        segment before (grpo/models/prefix_segments.py), whichever is estimated cheaper. Either
        way the same hidden states and, through autograd, the same gradients as one forward of
        the whole batch, for less decoder work. Padded columns read zeros when packed.

        `prefix` (grpo/models/common_prefix.py): columns every row of the pass starts with, run
        once for the pass; this forward plans segments over the later columns only, continuing
        the prefix's cache.
        """
        decoder = self.language_model().get_decoder()
        # Positions count real tokens only, as generate() does, so left padding gives the same
        # positions the rollout engine used.
        position_ids = attention_mask.long().cumsum(-1) - 1  # [B, T]
        position_ids = position_ids.masked_fill(attention_mask == 0, 0)
        if prefix is not None and self.can_share_prefix():
            prefix.check(input_ids, attention_mask)
            start = len(prefix)
            hidden, cache = prefix.states(decoder)  # [1, P, H]
            segments = [Segment(s.start + start, s.end + start, s.rows, s.owner)
                        for s in self.prefix_segments(input_ids[:, start:], attention_mask[:, start:])]
            cache.batch_repeat_interleave(len(segments[0].rows))
            pieces = self._run_segments(decoder, input_ids, attention_mask, position_ids, segments, cache)
            return torch.cat([hidden.expand(input_ids.shape[0], -1, -1), pieces], dim=1)  # [B, T, H]
        layout = self.forward_layout(input_ids, attention_mask)
        if isinstance(layout, PackedRows):
            if decoder.config._attn_implementation == "sdpa":
                mask = layout.allowed
            else:  # eager (and grpo_eager) add the mask to the scores, in the states' dtype
                mask = layout.additive_mask(decoder.get_input_embeddings().weight.dtype)
            out = decoder(
                input_ids=layout.input_ids,
                attention_mask=mask,
                position_ids=layout.position_ids,
                use_cache=False,
            )
            return layout.unpack(out.last_hidden_state)  # [B, T, H]
        segments = layout
        if len(segments) == 1:
            out = decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
            )
            return out.last_hidden_state  # [B, T, H]
        return self._run_segments(decoder, input_ids, attention_mask, position_ids, segments)

    @staticmethod
    def _run_segments(decoder, input_ids, attention_mask, position_ids, segments: list[Segment],
                      cache=None) -> torch.Tensor:
        """[B, segments' columns, H]: the segments in order, each continuing the KV cache of the
        rows that ran the one before (the first continues `cache`, sized to its rows, if given)."""
        pieces, previous, keyword = [], None, cache_keyword(decoder)
        for segment in segments:
            rows, cols = segment.rows, slice(segment.start, segment.end)
            if previous is not None:
                cache.batch_select_indices(previous.owner[rows])  # [k_prev] -> [k], differentiable
            out = decoder(
                input_ids=input_ids[rows, cols],
                attention_mask=attention_mask[rows, : segment.end],  # cached columns and these
                position_ids=position_ids[rows, cols],
                **{keyword: cache},
                use_cache=True,
            )
            cache, previous, hidden = output_cache(out), segment, out.last_hidden_state
            if len(rows) < len(segment.owner):  # each row's copy of its prefix's states
                hidden = hidden.index_select(0, segment.owner)
            pieces.append(hidden)  # [B, end - start, H]
        return torch.cat(pieces, dim=1)  # [B, T, H]

    def forward_layout(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> list[Segment] | PackedRows:
        """How `final_hidden_states` runs this batch: packed as a prefix tree when `packing` is on,
        the model can take a tree mask and the estimate (decoder rows, attention pairs, calls; all
        in token-rows) is below the segment plan's (grpo/models/prefix_tree.py); else the segment
        plan."""
        segments = self.prefix_segments(input_ids, attention_mask)
        per_pair = pair_cost(self.language_model().config, self.device.type) if self.packing else None
        if per_pair is None:
            return segments
        packed = pack_if_cheaper(input_ids, attention_mask, segments, per_pair, self.segment_cost(input_ids))
        return segments if packed is None else packed

    def prefix_segments(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[Segment]:
        """The column segments `final_hidden_states` runs (one, [0, T) for every row, when nothing
        is shared: `share_prefix_min` 0, or gradient checkpointing, which turns the KV cache off)."""
        if not self.can_share_prefix():
            return plan_segments(input_ids, attention_mask, 0, 0)
        return plan_segments(input_ids, attention_mask, self.share_prefix_min, self.segment_cost(input_ids))

    def can_share_prefix(self) -> bool:
        """Whether forwards may continue a shared prefix's KV cache (not with gradient
        checkpointing, which turns the cache off, nor with `share_prefix_min` 0)."""
        return self.share_prefix_min > 0 and not is_checkpointing(self.language_model())

    def common_prefix(self, sequences: Sequence[Sequence[int]]) -> CommonPrefix | None:
        """The prefix a pass over `sequences` (token lists) runs once for all its micro-batches
        (grpo/models/common_prefix.py); None where prefixes are not shared."""
        return CommonPrefix.of(sequences, self.share_prefix_min) if self.can_share_prefix() else None

    def segment_cost(self, input_ids: torch.Tensor) -> int:
        """What one more segment of a forward over `input_ids` costs, in token-rows:
        `segment_call_tokens`, or the device type's default with or without gradients."""
        if self.segment_call_tokens is not None:
            return self.segment_call_tokens
        # Another accelerator: the CUDA estimate (launch-bound calls).
        with_grad, without = SEGMENT_CALL_TOKENS.get(input_ids.device.type, SEGMENT_CALL_TOKENS["cuda"])
        return with_grad if torch.is_grad_enabled() else without

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_values: bool = False,
        positions: torch.Tensor | None = None,
        prefix: CommonPrefix | None = None,
    ) -> PolicyOutput:
        """Log-probs of input_ids[:, 1:] under softmax(logits / temperature); see PolicyOutput.

        `positions` ([B, T-1] bool, optional): the target positions whose log-probs (and entropy)
        are wanted, e.g. the loss mask. The LM head and the softmax over the vocabulary then run on
        those rows only (the decoder still runs on every token); other positions read 0.
        `prefix`: the pass's common prefix (`common_prefix`; see final_hidden_states).
        """
        if with_values and self.value_head is None:
            raise ValueError(
                "with_values=True but this policy has no value head (model.value_head: false)"
            )
        with autocast_context(self.device, self.compute_dtype):
            hidden = self.final_hidden_states(input_ids, attention_mask, prefix)  # [B, T, H]
            head_hidden, targets = hidden[:, :-1], input_ids[:, 1:]  # [B, T-1, H], [B, T-1]
            if positions is not None:
                if positions.shape != targets.shape:
                    raise ValueError(
                        f"positions {tuple(positions.shape)} must have the targets' shape {tuple(targets.shape)}"
                    )
                head_hidden = head_hidden[positions].unsqueeze(0)  # [1, N, H]
                targets = targets[positions].unsqueeze(0)  # [1, N]
            logprobs, entropy = token_logprobs_and_entropy(
                head_hidden,
                self.language_model().get_output_embeddings(),
                targets,
                temperature=temperature,
                chunk_size=self.logprob_chunk_size,
                with_entropy=with_entropy,
            )
            if positions is not None:
                logprobs = _scatter_rows(logprobs[0], positions)  # [B, T-1]
                entropy = _scatter_rows(entropy[0], positions) if entropy is not None else None
        values = None
        if with_values:
            values = self.value_head(hidden[:, :-1].float()).squeeze(-1)  # [B, T-1] fp32
        return PolicyOutput(logprobs=logprobs, entropy=entropy, values=values)

    # ----- checkpoints ------------------------------------------------------------------------

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """Full fine-tuning: every tensor. LoRA: only the adapter and the value head."""
        if not self.is_lora:
            return super().state_dict(
                *args, destination=destination, prefix=prefix, keep_vars=keep_vars
            )
        out = OrderedDict() if destination is None else destination
        params = dict(self.named_parameters())
        for name in self._checkpoint_names:
            out[prefix + name] = params[name] if keep_vars else params[name].detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if not self.is_lora:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        params = dict(self.named_parameters())
        expected = set(self._checkpoint_names)
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"LoRA policy checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for name in expected & set(state_dict):
                params[name].copy_(state_dict[name])
        return LoadResult(missing, unexpected)



def _enable_checkpointing(model: nn.Module, kwargs: dict) -> None:
    # transformers 5 renamed gradient checkpointing to activation checkpointing (old name deprecated).
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _add_lora(model: nn.Module, lora_cfg: LoraConfig, seed: int) -> nn.Module:
    peft_cfg = PeftLoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the A matrices are random; B starts at zero
        return get_peft_model(model, peft_cfg)
