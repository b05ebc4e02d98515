"""Task generation from any MCP servers' tools, offline: a catalog of what each tool can do
(catalog.py), chain templates of dependent calls and their seeded plans (compose.py), and records
with ground truth from the real servers, a split by template and worked examples (build.py).
`python -m launch.generate_tasks` writes them."""
