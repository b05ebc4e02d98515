"""The run report as one self-contained HTML file: the page's styles and script
(grpo/report/assets/) and the run's data as JSON, inline. No network: a Content-Security-Policy
allows nothing to load from anywhere, and every text from tools and the model goes into the page
as text (the script builds the DOM with textContent; the JSON is escaped so that no `</script>`
or `<!--` in a result can end its block).

`write_report(run_dir)` writes `<run_dir>/report.html` and returns its path; `mcp-grpo report
RUN_DIR` calls it at any time, also while the run is going. `write_tasks_report` writes a task
generation's page (`generate-tasks`: `<out>.report.html`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo.report.payload import run_payload, tasks_payload

ASSETS = Path(__file__).parent / "assets"
REPORT_FILE = "report.html"
POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
          "connect-src 'none'; form-action 'none'; base-uri 'none'")
SIZE_BUDGET_BYTES = 40 * 1024 * 1024
"""What a report may weigh: 5,000 held-out episodes over three evaluations and 40 token samples
stay well under it (transcript messages are cut at 2,000 characters, token samples at 1,536
tokens); past it the report says so at the top."""


def embedded_json(data: Any) -> str:
    """JSON that is safe inside a <script> block: `<`, `>`, `&` and the two line separators that
    end a JavaScript string are written as escapes."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def render(payload: dict[str, Any]) -> str:
    style = (ASSETS / "report.css").read_text()
    script = (ASSETS / "report.js").read_text()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{POLICY}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>run report</title>
<style>{style}</style></head>
<body><header><h1 id="title">run report</h1><div class="meta" id="meta"></div></header>
<nav id="tabs"></nav><main id="content"></main>
<script id="report-data" type="application/json">{embedded_json(payload)}</script>
<script>{script}</script>
</body></html>
"""


def write_report(run_dir: Path) -> Path:
    """Write `<run_dir>/report.html` from what the run directory holds now."""
    run_dir = Path(run_dir)
    return write_page(render(run_payload(run_dir)), run_dir / REPORT_FILE)


def write_tasks_report(report: dict[str, Any], records: list[dict], path: Path) -> Path:
    """A task generation's report as a page at `path` (its Tasks view)."""
    return write_page(render(tasks_payload(report, records, path.stem, str(path.parent))), path)


def write_page(html: str, path: Path) -> Path:
    """Replace `path` whole (a reader never sees half a page)."""
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(html)
    tmp.replace(path)
    return path
