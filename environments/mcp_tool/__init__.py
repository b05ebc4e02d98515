"""`MCPToolEnvironment` (registry id `mcp_tool`): multi-turn episodes over real MCP tools, with
the system prompt it renders and the worked examples it shows."""
