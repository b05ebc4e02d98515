"""The near-JSON reader: JSON plus the forms small models write by mistake.

Accepted besides strict JSON: single-quoted strings, trailing commas, Python `True`/`False`/`None`,
and unquoted identifier keys (`{name: "f"}`). With `close_at_end`, brackets left open at the end
of the text are closed. Errors (`NearJSONError`) say where reading stopped. Also holds `snippet`,
the one-line excerpt used in every parse error message.
"""

from __future__ import annotations

import re
from typing import Any


class NearJSONError(ValueError):
    def __init__(self, message: str, pos: int, at_end: bool = False, too_deep: bool = False):
        super().__init__(message)
        self.pos = pos
        self.at_end = at_end
        """The text ended before the value did (a missing closing bracket or quote)."""
        self.too_deep = too_deep


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
LITERAL_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
"""Bare words read as JSON values (JSON's and Python's spellings)."""
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class NearJSONReader:
    """A recursive-descent reader of JSON plus the near-JSON forms listed in the module doc."""

    MAX_DEPTH = 200

    def __init__(self, text: str, close_at_end: bool = False):
        self.text = text
        self.close_at_end = close_at_end

    def skip_ws(self, pos: int) -> int:
        text = self.text
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def _fail(self, message: str, pos: int) -> NearJSONError:
        at_end = pos >= len(self.text)
        where = "at the end" if at_end else f"before {snippet(self.text[pos:], 20)!r}"
        return NearJSONError(f"{message} {where}", pos, at_end)

    def value(self, pos: int, depth: int = 0) -> tuple[Any, int]:
        if depth > self.MAX_DEPTH:
            raise NearJSONError("nesting too deep", pos, too_deep=True)
        pos = self.skip_ws(pos)
        if pos >= len(self.text):
            raise self._fail("expected a value", pos)
        ch = self.text[pos]
        if ch == "{":
            return self._container(pos, depth, "}")
        if ch == "[":
            return self._container(pos, depth, "]")
        if ch in "\"'":
            return self._string(pos)
        m = _NUMBER.match(self.text, pos)
        if m:
            s = m.group()
            try:
                number: Any = int(s) if re.fullmatch(r"[-+]?\d+", s) else float(s)
            except (ValueError, OverflowError):
                raise self._fail(f"bad number {s!r}", pos) from None
            return number, m.end()
        m = _IDENT.match(self.text, pos)
        if m and m.group() in LITERAL_WORDS:
            return LITERAL_WORDS[m.group()], m.end()
        raise self._fail(f"unexpected {self.text[pos]!r}", pos)

    def _string(self, pos: int) -> tuple[str, int]:
        text, quote = self.text, self.text[pos]
        out: list[str] = []
        i = pos + 1
        while i < len(text):
            ch = text[i]
            if ch == quote:
                return "".join(out), i + 1
            if ch == "\\":
                if i + 1 >= len(text):
                    break
                esc = text[i + 1]
                if esc == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                    code = int(text[i + 2 : i + 6], 16)
                    i += 6
                    # A UTF-16 surrogate pair written as two escapes is one character.
                    if 0xD800 <= code < 0xDC00 and re.fullmatch(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", text[i : i + 6]):
                        low = int(text[i + 2 : i + 6], 16)
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        i += 6
                    out.append(chr(code))
                    continue
                out.append(_ESCAPES.get(esc, "\\" + esc))
                i += 2
                continue
            out.append(ch)
            i += 1
        raise self._fail("unterminated string", len(text))

    def _container(self, pos: int, depth: int, closer: str) -> tuple[Any, int]:
        is_object = closer == "}"
        result: Any = {} if is_object else []
        i = pos + 1
        while True:
            i = self.skip_ws(i)
            if i >= len(self.text):
                if self.close_at_end:
                    return result, i
                raise self._fail(f"expected {closer!r}", i)
            if self.text[i] == closer:
                return result, i + 1
            if is_object:
                key, i = self._key(i)
                i = self.skip_ws(i)
                if i >= len(self.text) or self.text[i] != ":":
                    raise self._fail(f"expected ':' after key {key!r}", i)
                item, i = self.value(i + 1, depth + 1)
                result[key] = item
            else:
                item, i = self.value(i, depth + 1)
                result.append(item)
            i = self.skip_ws(i)
            if i < len(self.text) and self.text[i] == ",":
                i += 1  # a trailing comma before the closer is accepted by the loop above
            elif i < len(self.text) and self.text[i] == closer:
                return result, i + 1
            elif i >= len(self.text) and self.close_at_end:
                return result, i
            else:
                raise self._fail(f"expected ',' or {closer!r}", i)

    def _key(self, pos: int) -> tuple[str, int]:
        if self.text[pos] in "\"'":
            return self._string(pos)
        m = _IDENT.match(self.text, pos)
        if m and m.group() not in LITERAL_WORDS:
            return m.group(), m.end()
        raise self._fail("expected a quoted key", pos)


def loads_near_json(text: str, *, close_at_end: bool = False) -> Any:
    """Read one near-JSON value that fills `text` (surrounding whitespace allowed).

    Raises `NearJSONError` (a ValueError) with a message that says where reading stopped.
    """
    reader = NearJSONReader(text, close_at_end)
    value, end = reader.value(0)
    end = reader.skip_ws(end)
    if end != len(text):
        raise reader._fail("unexpected text after the value", end)
    return value


def read_value_at(text: str, pos: int, close_at_end: bool = False) -> tuple[Any, int]:
    """The value starting at `pos` and the position just after it (text may follow)."""
    return NearJSONReader(text, close_at_end).value(pos)


def snippet(text: str, limit: int = 80) -> str:
    """`text` on one line, cut to `limit` characters (for error messages)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
