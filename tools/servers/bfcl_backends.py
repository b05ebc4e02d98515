"""What the bundled `bfcl` MCP server needs from the `bfcl-eval` package: its data files, the
documented function schemas and the multi-turn backend classes.

`bfcl-eval` is an optional dependency (`pip install --no-deps bfcl-eval mpmath`): its declared
dependencies are heavy and pinned, while the multi-turn backends and checker need only `mpmath`.
The environment side (environments/bfcl/) reads tasks and scores through this module too.
"""

from __future__ import annotations

import importlib
import json
from functools import cache
from pathlib import Path
from typing import Any

CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
"""The executable multi-turn categories (200 tasks each)."""

INSTALL_HINT = "pip install --no-deps bfcl-eval mpmath   (or: make install)"

# bfcl_eval is imported inside the functions below: it is an optional dependency, and importing
# this module (or the server's --help) must work without it.


class BFCLUnavailable(ImportError):
    """`bfcl-eval` (or a module it needs) is not installed; the message names the install command."""


def require_bfcl() -> Any:
    """The `bfcl_eval` package, or BFCLUnavailable naming the pip command."""
    try:
        import bfcl_eval
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker  # noqa: F401
    except ImportError as exc:
        raise BFCLUnavailable(f"the BFCL environment needs the bfcl-eval package ({exc}); install it with: "
                              f"{INSTALL_HINT}") from exc
    return bfcl_eval


def data_dir() -> Path:
    return Path(require_bfcl().__file__).resolve().parent / "data"


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise BFCLUnavailable(f"{path} is missing from the installed bfcl-eval; reinstall it: {INSTALL_HINT}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from: {', '.join(CATEGORIES)} (or all)")
    return category


@cache
def load_entries(category: str) -> tuple[dict, ...]:
    """The category's entries with their ground truth (`ground_truth`: call strings per turn)."""
    check_category(category)
    data = data_dir()
    questions = read_jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}
    entries = []
    for entry in questions:
        if entry["id"] not in answers:
            raise ValueError(f"bfcl-eval data: {entry['id']} has no possible answer")
        entries.append({**entry, "ground_truth": answers[entry["id"]]})
    return tuple(entries)


@cache
def function_docs() -> dict[str, list[dict]]:
    """The documented functions of every multi-turn class: {class name: [doc, ...]}."""
    require_bfcl()
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    classes = backend_classes()
    return {name: read_jsonl(data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[name])
            for name in classes}


@cache
def backend_classes() -> dict[str, type]:
    """{class name: backend class} of the classes the four multi-turn categories use."""
    require_bfcl()
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    names = sorted({c for category in CATEGORIES for e in load_entries(category) for c in e["involved_classes"]})
    classes = {}
    for name in names:
        try:
            classes[name] = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
        except ImportError as exc:
            raise BFCLUnavailable(f"BFCL backend {name} cannot be imported ({exc}); {INSTALL_HINT}") from exc
    return classes


@cache
def function_owner() -> dict[str, str]:
    """{function name: class name}; function names are unique across the multi-turn classes."""
    owner: dict[str, str] = {}
    for class_name, docs in function_docs().items():
        for doc in docs:
            if doc["name"] in owner:
                raise ValueError(f"BFCL function {doc['name']} is documented by {owner[doc['name']]} and {class_name}")
            owner[doc["name"]] = class_name
    return owner
