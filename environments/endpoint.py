"""A minimal client of OpenAI-compatible chat-completions endpoints (httpx, no SDK): the one client
of the τ² `openai` user backend, the NL-assertion judge and the task writer (environments/taskgen).

The API key is read from the environment variable the config names, when the client is built (a
missing variable is an error naming it), and is sent only in the Authorization header: never
logged, never in an error message.
"""

from __future__ import annotations

import os
from typing import Any

import httpx


class EndpointError(RuntimeError):
    """The endpoint could not be used (missing key, HTTP error, malformed answer)."""


class OpenAIEndpoint:
    """POST `<base_url>/chat/completions` with a model, messages and optional tools."""

    def __init__(self, base_url: str, model: str, api_key_env: str, timeout: float = 120.0):
        key = os.environ.get(api_key_env)
        if not key:
            raise EndpointError(f"the endpoint {base_url} needs an API key in the environment variable "
                                f"{api_key_env}, which is not set")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {key}"}

    def __repr__(self) -> str:  # the key stays out of reprs and logs
        return f"OpenAIEndpoint({self.url!r}, model={self.model!r})"

    def _payload(self, messages: list[dict], tools: list[dict] | None, temperature: float,
                 max_tokens: int | None = None) -> dict:
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": temperature}
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        if tools:
            payload["tools"] = [{"type": "function", "function": tool} for tool in tools]
        return payload

    def _message(self, response: httpx.Response) -> dict:
        if response.status_code != 200:
            raise EndpointError(f"{self.url} answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            return response.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.url} answered without choices[0].message: {response.text[:300]}") from exc

    def complete(self, messages: list[dict], tools: list[dict] | None = None, temperature: float = 0.0) -> dict:
        """The reply message ({"content", "tool_calls"?}); blocking."""
        with httpx.Client(timeout=self.timeout) as client:
            response = client.post(self.url, json=self._payload(messages, tools, temperature), headers=self._headers)
        return self._message(response)

    async def acomplete(self, messages: list[dict], tools: list[dict] | None = None,
                        temperature: float = 0.0, max_tokens: int | None = None) -> dict:
        """The reply message; a fresh connection per call, so any event loop may call it."""
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            response = await client.post(self.url, json=self._payload(messages, tools, temperature, max_tokens),
                                         headers=self._headers)
        return self._message(response)
