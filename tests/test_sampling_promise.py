"""The HF engine's promise about seeded requests (grpo/rollout/batch_invariance.py): the same batch
gives the same tokens and log-probs everywhere; each request's tokens do not depend on the rows
beside it where the engine says so (fp32 on a CPU); and the probe of its Linear products tells the
truth. Checked on this CPU, and in a subprocess with the other CPU family's kernels forced
(MKL's and oneDNN's AVX2 paths, aten's AVX2 kernels), since a session has one machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_fp32_close
from promise_report import measure, probe_against_direct

from grpo.rollout.batch_invariance import sampling_promise
from grpo.rollout.hf import HFEngine
from grpo.rollout.weights import _Matmul, probe_rows_independent

pytestmark = pytest.mark.usefixtures("one_thread")
FORCED_KERNELS = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
}
"""What an x86-64 CPU without AVX-512 runs (and MKL's AVX2 kernels, whose packed fp32 products,
unlike its AVX-512 ones, depend on the rows beside them for some shapes). The libraries read these
when they load, so only a fresh process can take them."""


def assert_promise_kept(measured: dict, dtype: str) -> None:
    """Reproducible always; batch-invariant tokens (log-probs within fp32 rounding of sums over
    the vocabulary) where claimed; claimed exactly for fp32."""
    assert measured["reproducible"], measured
    assert measured["batch_invariant"] == (dtype == "torch.float32"), measured
    if measured["batch_invariant"]:
        assert measured["alone_same_tokens"] == measured["requests"], measured
        alone, batched = (torch.tensor(measured[key]) for key in ("alone_logprobs", "batched_logprobs"))
        assert_fp32_close(alone, batched, measured["vocab"])
        assert measured["promise"].startswith("batch-invariant up to fp32 rounding"), measured
    else:
        assert measured["promise"].startswith("reproducible for a fixed batch ("), measured


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_engine_keeps_its_promise_here(varied_tiny_model, tokenizer, dtype):
    assert_promise_kept(measure(varied_tiny_model, tokenizer, dtype), str(dtype))


def test_the_probe_agrees_with_a_direct_check_here(varied_tiny_model, tokenizer):
    """Every product of an fp32 copy: 2 layers' fused q/k/v, o, fused gate/up and down; the head."""
    found = probe_against_direct(varied_tiny_model, tokenizer, torch.float32)
    assert len(found) == 9
    assert all(kind["probe"] == kind["direct"] for kind in found), found


@pytest.fixture(scope="module")
def forced() -> dict:
    """promise_report.py's JSON from a process running the AVX2 kernels (~10 s)."""
    env = {**os.environ, **FORCED_KERNELS, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "promise_report.py")],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16"])
def test_the_engine_keeps_its_promise_with_the_other_family_forced(forced, dtype):
    assert_promise_kept(forced[dtype], dtype)


def test_the_probe_agrees_with_a_direct_check_with_the_other_family_forced(forced):
    assert len(forced["probe"]) == 9
    assert all(kind["probe"] == kind["direct"] for kind in forced["probe"]), forced["probe"]
    # What the engine says about its products is what the probe found.
    rows_independent = all(kind["probe"] for kind in forced["probe"])
    said = "Linear products row-independent" in forced["torch.float32"]["promise"]
    assert said == rows_independent, forced


def test_bf16_weights_are_packed_only_where_onednn_has_bf16_kernels(forced, varied_tiny_model,
                                                                      tokenizer):
    """oneDNN refuses to pack bf16 weights on a CPU without AVX-512 (or AVX-NE-CONVERT): there the
    bf16 copy computes with `F.linear` instead of failing to build."""
    assert forced["onednn_bf16"] is False  # capped at AVX2, oneDNN has no bf16 kernels
    assert forced["torch.bfloat16"]["packers"] == ["None"]
    here = measure(varied_tiny_model, tokenizer, torch.bfloat16)["packers"]
    assert here == (["onednn"] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ["None"])


def test_the_claim_follows_what_computes_below_fp32(varied_tiny_model, tokenizer):
    def promise(**options):
        return HFEngine(varied_tiny_model, tokenizer, **options).sampling_promise

    assert promise(dtype=torch.float32).reason == ""
    assert promise(dtype=torch.bfloat16).reason == "bfloat16 weights; a bfloat16 KV cache"
    cache = promise(dtype=torch.float32, kv_cache_dtype=torch.bfloat16)
    assert (cache.batch_invariant, cache.reason) == (False, "a bfloat16 KV cache")
    assert promise(copy_weights=False).batch_invariant
    autocast = promise(copy_weights=False, autocast_dtype=torch.bfloat16)
    assert (autocast.batch_invariant, autocast.reason) == (False, "autocast to bfloat16")
    engine = HFEngine(varied_tiny_model, tokenizer, dtype=torch.float32)
    elsewhere = sampling_promise(engine.model, torch.device("cuda"), None, None)
    assert (elsewhere.batch_invariant, elsewhere.reason) == (False, "not measured on cuda")
    # The plain policy's products are F.linear's; the copy's are packed (where this CPU packs).
    plain = [_Matmul(m.weight, m.bias, packer=None).rows_independent()
             for m in varied_tiny_model.modules() if isinstance(m, torch.nn.Linear)]
    assert promise(copy_weights=False).products_rows_independent == all(plain)


def test_the_probe_finds_rows_that_depend_on_the_rows_beside_them():
    """Products built to depend on their company in known ways, on any CPU: each row computed on
    its own is independent by construction; the others compute some rows in float64."""
    weight = torch.randn(24, 16, generator=torch.Generator().manual_seed(0))

    def row_by_row(x):
        return torch.stack([weight @ row for row in x])

    def exact_when(rows_in_float64):
        def product(x):
            out = row_by_row(x)
            wide = rows_in_float64(len(x))
            out[wide] = (x[wide].double() @ weight.double().T).float()
            return out
        return product

    def probe(product) -> bool:
        return probe_rows_independent(product, 16, torch.float32, torch.device("cpu"))

    assert probe(row_by_row)
    assert not probe(exact_when(lambda n: slice(0, 1) if n == 1 else slice(0, 0)))  # a lone row
    # The remainder after blocks of 4 rows, as MKL's AVX2 kernels treat it for some shapes.
    assert not probe(exact_when(lambda n: slice(n - n % 4, n)))
    # Only the last row of a batch, computed apart.
    assert not probe(exact_when(lambda n: slice(n - 1, n) if n > 40 else slice(0, 0)))
