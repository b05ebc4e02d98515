"""Environments: the protocol and registry (base), MCPToolEnvironment, tool-call parsing, rewards
and task datasets. Importing the package registers the built-in environments."""

from environments.base import register

register("mcp_tool", "environments.mcp_tool.env:MCPToolEnvironment")
register("bfcl", "environments.bfcl.env:BFCLEnvironment")
