"""docs/performance.md as `make bench` writes it (bench/report.py): one section per device, a run
replacing its own device's section and keeping the others."""

from __future__ import annotations

from bench.report import PAGE_HEAD, device_label, write_performance_page
from bench.run import headline


def _report(device: str, name: str, step_s: float) -> dict:
    report = {
        "machine": {"cpus": 2, "threads": 2, "torch": "2.13.0", "device": device,
                    "cpu_model": name if device == "cpu" else "host", "gpu": name if device == "cuda" else None},
        "load_average_start": 0.5, "load_average_end": 1.5,
        "standard": {"standard_step_median_s": step_s},
    }
    report.update(headline(report))
    return report


def test_a_run_replaces_its_own_device_section_and_keeps_the_others(tmp_path):
    page = tmp_path / "docs" / "performance.md"
    write_performance_page(_report("cpu", "Xeon A", 5.25), ["--steps", "4"], page)
    write_performance_page(_report("cuda", "H100", 1.5), ["--device", "cuda"], page)
    write_performance_page(_report("cpu", "Xeon A", 4.75), [], page)
    text = page.read_text()
    assert text.startswith(PAGE_HEAD)
    assert text.count("<!-- device: ") == 2 and text.count("<!-- end device -->") == 2
    assert "| standard step, median s | 4.75 |" in text and "5.25" not in text
    assert "| standard step, median s | 1.5 |" in text
    assert "`python -m bench.run --device cuda` on 2 CPUs, torch 2.13.0" in text
    assert "load average 0.5 at start, 1.5 at end" in text
    # Sections in a stable order (by title), so a rerun changes only its own lines.
    assert text.index("## CPU: Xeon A, 2 threads") < text.index("## CUDA: H100")


def test_two_cpus_of_different_models_get_sections_of_their_own(tmp_path):
    page = tmp_path / "performance.md"
    write_performance_page(_report("cpu", "AMD EPYC 9B14", 3.0), [], page)
    write_performance_page(_report("cpu", "Intel Xeon", 5.0), [], page)
    assert device_label(_report("cpu", "AMD EPYC 9B14", 0)) == "CPU: AMD EPYC 9B14, 2 threads"
    text = page.read_text()
    assert "| standard step, median s | 3.0 |" in text and "| standard step, median s | 5.0 |" in text


def test_rows_under_a_row_are_marked_and_unmeasured_values_are_a_dash(tmp_path):
    page = tmp_path / "performance.md"
    report = _report("cpu", "Xeon", 2.0)
    report["standard"]["split_median_s"] = {"rollout_s": 1.25}
    write_performance_page(report, [], page)
    text = page.read_text()
    assert "| ↳ rollout s | 1.25 |  |" in text
    assert "| generation b64, tokens/s | – |" in text
