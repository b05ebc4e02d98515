"""Environments: the protocol and registries (base), MCPToolEnvironment (mcp_tool/), BFCL
(bfcl/), τ²-bench with a simulated user (tau2/), tool-call formats and parsing (toolcalls/),
rewards and task datasets (tasks/).
Importing the package registers the built-in environments and dataset path sources."""

from environments.base import register, register_path_source

register("mcp_tool", "environments.mcp_tool.env:MCPToolEnvironment")
register("bfcl", "environments.bfcl.env:BFCLEnvironment")
register_path_source("bfcl:", "environments.bfcl.data:load_path")
register("tau2", "environments.tau2.env:Tau2Environment")
register_path_source("tau2:", "environments.tau2.data:load_path")
