"""The MCP tool layer: SharedToolManager (tools.manager) and the bundled offline MCP servers
(tools.servers). Import the manager from tools.manager; this package stays import-light so that
tools.config loads without the MCP SDK."""
