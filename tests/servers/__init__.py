"""Test-only MCP servers (fault injection) and helpers for the tool-layer tests."""
