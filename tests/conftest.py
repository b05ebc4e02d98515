"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random-init model over its vocabulary, and
a module-wide event loop with a real SharedToolManager over bundled MCP server subprocesses."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from grpo.models.source import build_tiny_model, load_tokenizer
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(2)


def assert_close_to(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """`actual` (detached, as fp32) equals the hand-computed `expected` within `atol`, exactly
    in relative terms (rtol 0)."""
    expected = torch.as_tensor(expected, dtype=torch.float32)
    torch.testing.assert_close(actual.detach().float(), expected, atol=atol, rtol=0)


def assert_fp32_close(actual: torch.Tensor, expected: torch.Tensor, terms: int) -> None:
    """`actual` and `expected` are the same fp32 values computed with their sums in another order:
    another row count (a BLAS picks its kernel and blocking by the rows, differently on each CPU
    family), a chunked LM head, a shared prefix. A sum of `terms` numbers may be off by about
    log2(terms) roundings at the values' scale, so the two may differ by twice that: a fixed
    tolerance of a few units in the last place holds on one CPU family and not on another. A
    wrong computation is off by far more."""
    actual, expected = actual.detach().float(), expected.detach().float()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(float(expected.abs().max()), 1.0) if expected.numel() else 1.0
    bound = 2 * math.log2(terms) * torch.finfo(torch.float32).eps * scale
    diff = float((actual - expected).abs().max()) if expected.numel() else 0.0
    assert diff <= bound, f"max |diff| {diff:.3g} > {bound:.3g} (fp32 sums of {terms} at scale {scale:.3g})"


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture
def one_thread():
    """The tiny model's ops are too small to split: one thread is faster and immune to the
    OpenMP stalls two threads suffer on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_model(tokenizer):
    """A fresh 2-layer random Llama (seeded: identical in every test)."""
    return build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)


@pytest.fixture
def varied_tiny_model(tokenizer):
    return build_varied_tiny_model(tokenizer)


def build_varied_tiny_model(tokenizer):
    """The tiny Llama with O(1) weights, in eval mode: a default init (std 0.02) makes every
    position predict the same token; these give varied greedy continuations and
    peaked-but-wide distributions (sampling tests need both)."""
    model = build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                scale = (3.0 if "embed" in name else 1.0) / math.sqrt(param.shape[1])
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def loop():
    """One event loop per test module, so a module-scoped manager can serve every test in it."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@contextmanager
def running_manager(loop, *servers: str, **tools_options) -> Iterator[SharedToolManager]:
    """A started SharedToolManager over the bundled servers `servers` (python -m tools.servers.X),
    closed afterwards; `tools_options` go to ToolsConfig (e.g. call_timeout)."""
    configs = {
        name: MCPServerConfig(command="python", args=["-m", f"tools.servers.{name}"], cwd=str(REPO))
        for name in servers
    }
    manager = SharedToolManager(ToolsConfig(servers=configs, **tools_options))
    loop.run_until_complete(manager.start())
    try:
        yield manager
    finally:
        loop.run_until_complete(manager.close())


@pytest.fixture(scope="module")
def calculator_tools(loop):
    """A started SharedToolManager over the bundled calculator server, one per test module."""
    with running_manager(loop, "calculator") as manager:
        yield manager


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of 1s in a loss mask."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.fixture
def quiet_run_logging():
    """launch.train sets up the run's console and file logging; drop those handlers afterwards."""
    yield
    logger = logging.getLogger("mcp_grpo")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
