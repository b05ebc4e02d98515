"""The run report in headless Chromium: every view drawn and populated with no script error, a
filter that changes what is shown, hostile tool results that neither run nor fetch, and a large
run that opens fast. (The report of a real run is opened in tests/test_smoke.py.)"""

from __future__ import annotations

import http.server
import re
import threading

import pytest
from browser import console_errors, needs_chromium, page_dom
from report_runs import write_run

from grpo.report.page import SIZE_BUDGET_BYTES, write_report, write_tasks_report

pytestmark = needs_chromium


def body_data(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))


def assert_drawn(dom: str, log: str) -> dict[str, str]:
    data = body_data(dom)
    assert data.get("ready") == "1" and "errors" not in data, data
    assert not console_errors(log), console_errors(log)
    return data


def test_every_view_is_drawn_and_a_filter_changes_what_is_shown(tmp_path):
    path = write_report(write_run(tmp_path / "run", steps=5, episodes=12))
    dom, log = page_dom(path)
    assert_drawn(dom, log)
    assert re.search(r'<table id="stages">.*?<td>kind=sum</td><td class="num">0\.0%</td><td class="num">100\.0%</td>', dom)
    # Per tool: tasks 0, 2, ..., 10 call calculate (3 fixed, 3 still failing); 0, 3, 6, 9 convert.
    assert re.search(r'<table id="tool-stages">.*?<td>calculator.calculate</td><td class="num">6</td>'
                     r'<td class="num">0\.0%</td><td class="num">50\.0%</td>', dom)
    dom, log = page_dom(path, "tab=curves")
    assert_drawn(dom, log)
    assert dom.count("<polyline") >= 6 and "reward (sampled)" in dom
    dom, log = page_dom(path, "tab=tools")
    assert_drawn(dom, log)
    assert re.search(r'<td>calculator.calculate</td><td class="num">50</td><td class="num">5</td>'
                     r'<td class="num">10\.0%</td><td>tool_error 5</td><td class="num">5\.0</td>'
                     r'<td class="num">50\.0</td><td class="num">1</td><td class="num">1</td>', dom)
    dom, log = page_dom(path, "tab=tokens")
    assert_drawn(dom, log)
    assert len(re.findall(r'class="tok[ "]', dom)) == 6 and 'class="tok turn"' in dom and 'class="tok obs"' in dom

    everything, log = page_dom(path, "tab=episodes")
    assert assert_drawn(everything, log)["shown"] == "12"
    fixed, log = page_dom(path, "tab=episodes&change=fixed")
    assert assert_drawn(fixed, log)["shown"] == "3"
    listed = re.findall(r'data-task="([^"]+)"', fixed)
    assert listed == ["task-00000", "task-00004", "task-00008"]
    assert 'id="episode-detail"' in fixed and "before: wrong" in fixed and "after: right" in fixed
    word, _ = page_dom(path, "tab=episodes&kind=word&q=What%20is%201%20")
    assert re.findall(r'data-task="([^"]+)"', word) == ["task-00001"]


def test_hostile_tool_results_neither_run_nor_fetch(tmp_path):
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    hostile = (f'</script><script>document.body.dataset.pwned = "1"</script><img src="http://127.0.0.1:{port}/img.png">'
               f'<img src=x onerror="document.body.dataset.pwned=2"><link rel=stylesheet href="http://127.0.0.1:{port}/s.css">')
    try:
        path = write_report(write_run(tmp_path / "run", episodes=4, hostile=hostile))
        dom, log = page_dom(path, "tab=episodes&episode=task-00000")
    finally:
        server.shutdown()
    data = assert_drawn(dom, log)
    assert "pwned" not in data and hits == []
    # Shown as text: the request in the list and the tool result in both transcripts.
    assert dom.count(f"&lt;img src=\"http://127.0.0.1:{port}/img.png\"&gt;") == 4
    assert "<img" not in dom and "<link" not in dom


@pytest.mark.slow
def test_a_large_run_opens_on_its_first_episode_page_with_a_filter_fast(tmp_path, capsys):
    path = write_report(write_run(tmp_path / "large", steps=500, episodes=5000, token_samples=500))
    size = path.stat().st_size
    assert size < SIZE_BUDGET_BYTES
    timings = []
    for fragment in ("tab=episodes", "tab=episodes&change=fixed&kind=sum"):
        dom, log = page_dom(path, fragment)
        data = assert_drawn(dom, log)
        timings.append(float(data["rendered-ms"]))
    assert data["shown"] == "1250" and len(re.findall(r'data-task="', dom)) == 50
    with capsys.disabled():
        print(f"\nreport of 500 steps, 5000 held-out episodes: {size / 2**20:.1f} MiB; first page drawn after "
              f"{timings[0]:.0f} ms, filtered page after {timings[1]:.0f} ms")
    assert max(timings) < 3000


def test_a_task_generation_report_opens_on_its_tasks_and_filters_by_split(tmp_path):
    records = [{"prompt": [{"role": "user", "content": f"Compute {n} + 1. <b>bold?</b>"}],
                "extra_info": {"split": ["train", "novel"][n % 2], "template": f"T{n}"},
                "reward_spec": {"ground_truth": {"success": {"answer": n + 1}, "tool_sequence": [
                    {"server": "calculator", "tool": "calculate", "params": {"expression": f"{n} + 1"}}]}}}
               for n in range(6)]
    report = {"servers": {"calculator": {"family": "arithmetic", "templates": 6, "tasks": 6, "multi_call_share": 0.0}},
              "tools_used": [{"server": "calculator", "tool": "calculate", "tasks": 6, "checks": 0}],
              "tools_left_out": [], "servers_without_tasks": [], "rejections": {}, "settings": {}}
    path = write_tasks_report(report, records, tmp_path / "chains.report.html")
    dom, log = page_dom(path)
    assert_drawn(dom, log)
    assert dom.count('<tr><td>train</td>') == 3 and dom.count('<tr><td>novel</td>') == 3
    assert "&lt;b&gt;bold?&lt;/b&gt;" in dom and "<b>bold" not in dom
    dom, log = page_dom(path, "tab=tasks&split=novel")
    assert_drawn(dom, log)
    assert dom.count('<tr><td>train</td>') == 0 and dom.count('<tr><td>novel</td>') == 3
