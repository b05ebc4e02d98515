"""Shared fixtures: the real SmolLM2 tokenizer and a tiny random-init model over its vocabulary."""

from __future__ import annotations

import pytest
import torch

from grpo.model_source import build_tiny_model, load_tokenizer

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture
def tiny_model(tokenizer):
    """A fresh 2-layer random Llama (seeded: identical in every test)."""
    return build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)
