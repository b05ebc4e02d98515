"""Tool calls in model text: one class per call format (parse, render, name) and the registry of
formats, the scanner that finds calls and final answers, and the near-JSON and Python-call
readers it uses."""
