"""Environments: the protocol and registries (base), MCPToolEnvironment (mcp_tool/), BFCL
(bfcl/), tool-call formats and parsing (toolcalls/), rewards and task datasets (tasks/).
Importing the package registers the built-in environments and dataset path sources."""

from environments.base import register, register_path_source

register("mcp_tool", "environments.mcp_tool.env:MCPToolEnvironment")
register("bfcl", "environments.bfcl.env:BFCLEnvironment")
register_path_source("bfcl:", "environments.bfcl.data:load_path")
