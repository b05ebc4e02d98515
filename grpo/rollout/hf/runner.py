"""The HF engine's model and how one forward runs on it: `ModelRunner`.

The engine samples from its own inference copy of the policy (grpo/rollout/hf/weights.py: LoRA
merged, Linear weights in the compute dtype, packed, siblings fused; the family's RMSNorm layers
as one op, fused_norms.py), or from the policy module itself (`copy_weights: false`, under
autocast where the compute dtype differs from its weights'). What the model family allows comes
from its record (architecture.py, families/): which projections fuse, which norms, which
attention kinds, and whether a lean forward (lean_forward.py) replaces transformers' module
plumbing.

The decode loop (decode_loop.py) asks the runner for what it needs and nothing else: `forward`
(the logits of each row's last position), `mask` (a "may attend" mask in the form the model's
attention takes), `new_cache` (a KV cache of rows x columns; the persistent one of the
fixed-shape decoder when decode steps run static or as CUDA graphs, decode_graphs.py) and
`static_decoder`. `running()` is the context every call runs in: inference mode, autocast,
eval mode.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from grpo.forward.cache_argument import cache_keyword
from grpo.forward.training_attention import ADDITIVE_MASK_ATTENTIONS
from grpo.models.peft_weights import base_model_of, language_model_of
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.architecture import text_config
from grpo.rollout.hf.decode_attention import ENGINE_ATTENTION, PrefixAttention
from grpo.rollout.hf.decode_graphs import StaticDecoder
from grpo.rollout.hf.families import architecture_of
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.lean_forward import LeanForward
from grpo.rollout.hf.weights import copy_weights_into, inference_copy

GRAPH_MIN_ROWS = 64
"""CUDA-graph decode steps run at least this many rows (padding), so the 1-32-row buckets of a
draining batch's tail need no graphs of their own at every width (without it, large training
steps kept capturing new graphs step after step). The price: a step over a few live rows costs
a 64-row step, a little more on a GPU, where a decode step is launch-bound."""
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ModelRunner:
    """The engine's model and its forward (see the module docstring).

    model: a transformers causal LM, a peft model, or a wrapper holding one (`language_model_of`).
    settings: the engine's section resolved for `device` (`HFEngineConfig.for_device`).
    dtype: the compute dtype: the copy's Linear weights (None: the policy's dtype); without a
        copy, forwards run under autocast in it where it differs from the model's weights.
    pad_id: the token id of padding (None: the model config's, else 0).
    """

    def __init__(
        self,
        model,
        settings: HFEngineConfig,
        device: torch.device,
        dtype: torch.dtype | None,
        pad_id: int | None,
    ) -> None:
        lm = language_model_of(model)
        self.device = device
        self.architecture = architecture_of(base_model_of(lm))
        grouped = settings.copy_weights and settings.decode_attention == "grouped"
        if settings.copy_weights:
            head_dtype = None if settings.head_dtype == "auto" else _DTYPES[settings.head_dtype]
            self.model = inference_copy(
                lm, dtype, head_dtype, device, fused_groups=self.architecture.fused_groups,
                is_norm=self.architecture.is_norm if settings.fuse_norms else None,
            )
            # Our 4-D masks are boolean SDPA masks; the copy is ours to configure.
            self.model.set_attn_implementation(ENGINE_ATTENTION if grouped else "sdpa")
            self.autocast_dtype = None
        else:
            self.model = lm
            weights = lm.get_input_embeddings().weight.dtype
            self.autocast_dtype = dtype if dtype is not None and dtype != weights else None
        self.copies_weights = settings.copy_weights
        plain = base_model_of(self.model)
        config = text_config(plain)
        self.architecture.check_attention(config)
        self.lean, self.lean_reason = (
            LeanForward.build(self.model, self.architecture)
            if settings.lean_forward
            else (None, "lean_forward is off")
        )
        self.mask_kind = _mask_kind(plain)
        self.cache_keyword = cache_keyword(self.model)
        self.num_layers = config.num_hidden_layers
        self.pad_id = pad_id if pad_id is not None else (getattr(config, "pad_token_id", None) or 0)
        states = plain.get_input_embeddings().weight.dtype
        self.kv_cache_dtype = _cache_dtype(settings.kv_cache_dtype, dtype, grouped, device, states)
        # A bf16 cache's query x keys product runs faster with the keys stored transposed on a
        # CPU; an fp32 one's slower.
        self.keys_transposed = (
            device.type == "cpu" and self.kv_cache_dtype == torch.bfloat16
            if settings.keys_transposed is None
            else settings.keys_transposed
        )
        mode = settings.decode_mode
        if mode in ("static", "graph") and self.mask_kind != "bool":
            raise ValueError(
                f"decode_mode {mode!r} needs boolean attention masks (sdpa or the engine's "
                "attention), not this model's additive ones"
            )
        self.static_decoder = (
            StaticDecoder(
                self.forward, self.num_layers, device, capture=mode == "graph",
                min_rows=GRAPH_MIN_ROWS if mode == "graph" else 1,
                cache_dtype=self.kv_cache_dtype, keys_transposed=self.keys_transposed,
            )
            if mode in ("static", "graph")
            else None
        )
        """Fixed-shape decode steps over one persistent cache (static or graph decode), or None."""
        self._mask_dtype = self.autocast_dtype or states

    @property
    def forward_kind(self) -> str:
        """"lean (<family>)" (lean_forward.py), or "transformers' modules (<why not lean>)"."""
        if self.lean is not None:
            return f"lean ({self.architecture.name})"
        return f"transformers' modules ({self.lean_reason})"

    @contextlib.contextmanager
    def running(self):
        """The context of an engine call: inference mode, autocast (without a copy, where the
        compute dtype differs from the weights'), and the model in eval mode."""
        autocast = (
            contextlib.nullcontext()
            if self.autocast_dtype is None
            else torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
        )
        was_training = self.model.training
        with torch.inference_mode(), autocast:
            self.model.eval()
            try:
                yield
            finally:
                self.model.train(was_training)

    def forward(
        self, input_ids, attention_mask, position_ids, cache, shared_prefix: PrefixAttention | None = None
    ) -> torch.Tensor:
        """Logits of the last position: [n, V] (the model's output dtype; the sampler upcasts).
        `shared_prefix`: a decode step's kept prefix (decode_attention.py `PrefixAttention`)."""
        if self.lean is not None:
            return self.lean(input_ids, attention_mask, position_ids, cache, shared_prefix)
        extra = {} if shared_prefix is None else {"shared_prefix": shared_prefix}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{self.cache_keyword: cache},
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        return out.logits[:, -1]

    def mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean [.., q, k] "may attend" mask in the form the attention implementation takes."""
        if self.mask_kind == "bool":
            return allowed
        dtype = self._mask_dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )

    def new_cache(self, rows: int, capacity: int) -> PreallocatedCache:
        """A KV cache of `rows` rows and `capacity` columns: the fixed-shape decoder's persistent
        one (regrown if too small), else a fresh one."""
        if self.static_decoder is not None:
            return self.static_decoder.cache_for(rows, capacity)
        return PreallocatedCache(
            self.num_layers, rows, capacity, zero_columns=0,
            dtype=self.kv_cache_dtype, keys_transposed=self.keys_transposed,
        )

    @torch.no_grad()
    def sync_weights(self, policy) -> None:
        """Copy the policy's current weights (LoRA merged) into the copy (without a copy, the
        policy must be the module sampled from: nothing to copy)."""
        lm = language_model_of(policy)
        if not self.copies_weights:
            if lm is not self.model:
                raise ValueError("HFEngine(copy_weights=False) samples from the module it was built with")
            return
        copy_weights_into(self.model, lm)

    def close(self) -> None:
        """Drop the cache, the graphs and the weight copy (no forward can run afterwards)."""
        if self.static_decoder is not None:
            self.static_decoder.release()
        if self.copies_weights:
            self.model = self.lean = None

    def weight_bytes(self) -> int:
        """Bytes of the weights the engine samples from (its copy, or the policy's)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def _mask_kind(plain: nn.Module) -> str:
    impl = getattr(plain.config, "_attn_implementation", "sdpa")
    if impl in ("sdpa", ENGINE_ATTENTION):
        return "bool"
    if impl in ADDITIVE_MASK_ATTENTIONS:
        return "additive"
    raise NotImplementedError(
        f"HFEngine(copy_weights=False) needs attn_implementation 'sdpa' or one of "
        f"{ADDITIVE_MASK_ATTENTIONS}, not {impl!r}"
    )


def _cache_dtype(asked: str, dtype, grouped: bool, device: torch.device, states: torch.dtype):
    """The KV cache's dtype (None: the key states', i.e. the model's). "auto": on a CPU or a
    CUDA GPU with grouped decode attention over the engine's copy, the copy's matmul dtype (the
    cache is read whole at every decode step, and a bf16 one halves that; on a GPU an fp32 cache
    also makes both attention products fp32 matmuls); else the model's."""
    if asked == "auto":
        return dtype if grouped and device.type in ("cpu", "cuda") else None
    if asked == "model":
        return None
    chosen = _DTYPES[asked]
    if chosen != states and not grouped:
        raise ValueError(
            f"kv_cache_dtype {asked} differs from the model's {states}: that needs the "
            "engine's own weight copy with decode_attention 'grouped' (SDPA takes queries "
            "and keys of one dtype)"
        )
    return chosen
