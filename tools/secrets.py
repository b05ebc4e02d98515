"""The one rule for what counts as a secret in text the project writes or prints.

Chat logs, tool results, transcripts and reasons may carry keys and passwords that a user pasted
or a tool echoed. Everything that leaves the process (task files and their reports, evaluation
transcripts, console and log lines) goes through `mask_secrets` / `mask_value`, so one rule
decides, and a shape added here is masked everywhere.

Masked as a whole (`***`): provider keys of a known shape (OpenAI `sk-`/`sk-proj-`, Anthropic
`sk-ant-`, Hugging Face `hf_`, Google `AIza`, Stripe `sk_live_`/`rk_live_` and `_test_`, GitHub
`ghp_`/`gho_`/`ghs_`/`ghu_`/`ghr_`/`github_pat_`, Slack `xox?-`, AWS `AKIA`/`ASIA` ids) and JWTs.
Masked with their context kept: the body of a PEM private-key block (its BEGIN/END lines stay),
the password of `scheme://user:password@host`, the path of a Slack webhook, a `Bearer` token, and
the value of an assignment whose name says secret (`api_key=`, `token:`, `password=`,
`client_secret`, any `*_PASSWORD=`, `*_SECRET=`, `*_TOKEN=`, `*_KEY=`; quoted values whole).
Commit hashes, UUIDs, numbers, dates and prose stay as they are: no rule matches bare hex or
digits.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

MASK = "***"

_NAME = (r"(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|client[_-]?secret"
         r"|secret|token|password|passwd|pwd)|(?:[A-Za-z0-9]+_)+key")
"""Names whose value is a secret: the words themselves (with any `PREFIX_`), or `*_KEY`."""

_RULES: tuple[tuple[re.Pattern, Callable[[re.Match], str]], ...] = (
    # A PEM private key: the body, over any lines (or `\n` escapes inside a JSON string).
    (re.compile(r"(-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----)(?!\*\*\*-----END).+?(-----END \2PRIVATE KEY-----)", re.DOTALL),
     lambda m: f"{m.group(1)}{MASK}{m.group(3)}"),
    # The password in `scheme://user:password@host`: user and host stay.
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]+:)(?!\*\*\*@)[^\s@/]+(@)"),
     lambda m: f"{m.group(1)}{MASK}{m.group(2)}"),
    (re.compile(r"(https://hooks\.slack\.com/services/)[A-Za-z0-9/_\-]+"), lambda m: m.group(1) + MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), lambda m: MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), lambda m: MASK),                         # OpenAI, Anthropic
    (re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}"), lambda m: MASK),       # Stripe
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), lambda m: MASK),                           # Hugging Face
    (re.compile(r"\bAIza[A-Za-z0-9_\-]{30,}"), lambda m: MASK),                       # Google
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,})"), lambda m: MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{8,}"), lambda m: MASK),                 # Slack
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), lambda m: MASK),                   # AWS key ids
    (re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/\-]{8,}=*"), lambda m: m.group(1) + MASK),
    # `name = value`, `"name": "value"`: the value (a quoted one whole) after a secret's name.
    (re.compile(rf"(?i)(\b(?:{_NAME})\b[\"']?\s*[:=]\s*)"
                r"(?:\"(?!\*\*\*\")[^\"\n]+\"|'(?!\*\*\*')[^'\n]+'|[^\s\"',;&]{4,})"),
     lambda m: m.group(1) + _quoted_mask(m.group(0)[len(m.group(1)):])),
)


def _quoted_mask(value: str) -> str:
    return value[0] + MASK + value[0] if value[0] in "\"'" else MASK


def mask_secrets(text: str) -> tuple[str, int]:
    """`text` with every secret masked as `***` (see the module docstring); how many were."""
    count = 0
    for pattern, replace in _RULES:
        def counted(match: re.Match, replace=replace) -> str:
            nonlocal count
            count += 1
            return replace(match)
        text = pattern.sub(counted, text)
    return text, count


def mask_value(value: Any) -> tuple[Any, int]:
    """`value` with every string in it masked (dict values and list items, recursively; keys,
    numbers and other values as they are); how many secrets were masked. Walks without
    recursion, so no nesting overflows the stack."""
    if isinstance(value, str):
        return mask_secrets(value)
    if not isinstance(value, (dict, list)):
        return value, 0
    total = 0
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (source, parent copy, slot)
    while stack:
        source, parent, slot = stack.pop()
        if isinstance(source, str):
            parent[slot], n = mask_secrets(source)
            total += n
        elif isinstance(source, dict):
            parent[slot] = copy = dict(source)
            stack.extend((item, copy, key) for key, item in source.items())
        elif isinstance(source, list):
            parent[slot] = copy = list(source)
            stack.extend((item, copy, i) for i, item in enumerate(source))
        else:
            parent[slot] = source
    return root[0], total


def mask_text(text: str) -> str:
    """`text` masked, for writers that need not count."""
    return mask_secrets(text)[0]


class MaskingFormatter(logging.Formatter):
    """A log formatter whose lines are masked: log lines echo tool results, reasons and
    exceptions, any of which may hold what a user pasted."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_text(super().format(record))
