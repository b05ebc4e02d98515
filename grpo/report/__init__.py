"""The run report: one self-contained HTML file per run directory (`report.html`), written at the
end of every run and by `mcp-grpo report RUN_DIR` at any time (grpo/report/page.py); what it
shows is read from the files the run leaves (grpo/report/payload.py), and the token view from
the samples the trainer keeps (grpo/report/samples.py)."""
