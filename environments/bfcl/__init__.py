"""BFCL multi-turn as an environment: the episode (scripted user turns over the bundled `bfcl`
MCP server), task records and declared splits from the bfcl-eval package, and the official
checker's scoring."""
