"""What makertbin's compile stage leaves besides the .bin: the static performance page in working_dir,
the advice lines, the compile_mode note, and the stored static analysis with debug: True."""

from __future__ import annotations

from bin_fixtures import build_bin, invoke
from builders import make_project, yolo_like

from hbtools.cli import hb_mapper
from hbtools.march.profiles import get_profile
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.runtime_model import open_model
from hbtools.tools.perf_advice import advice_lines


def test_static_page_advice_and_balance(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "m", yolo_like(h=320), cal_count=2)
    project.write(model_parameters={"output_model_file_prefix": "det"},
                  compiler_parameters={"compile_mode": "balance", "balance_factor": 30, "advice": 1, "debug": True})
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    wd = project.working_dir
    page = (wd / "det.html").read_text()
    assert "Model Performance Summary" in page and '<img src="det.png"' in page
    assert 'href="det_subgraph_0.html"' in page and (wd / "det_subgraph_0.json").is_file()
    stored = read_bin(wd / "det.bin").model().perf
    assert stored is not None and stored["latency_ms"] > 0 and len(stored["subgraphs"]) == 1
    log = made.output
    assert "compile_mode balance (balance_factor 30): hbtools builds one schedule" in log
    # the 3-channel input conv of a 320x320 model fills 3/8 of the MAC array's input side: +1.7 us
    lines = [line.split(" INFO ", 1)[1] for line in log.splitlines() if " INFO advice: " in line]
    conv = next(line for line in lines if line.startswith("advice: Conv_0 "))
    assert "output shape (1,8,160,160)" in conv and "channels in 3 -> 8, out 8 -> 8: 62.5 % of the MAC array" in conv
    assert f"advice 1 us: {len(lines)} BPU layer(s) modelled more than 1 us above their ideal time" in log
    assert f"static performance page written: {wd / 'det.html'}" in log


def test_advice_lines_follow_the_threshold(tmp_path) -> None:
    rm = open_model(build_bin(tmp_path / "m", yolo_like(h=64), prefix="det").bin)
    profile = get_profile("bayes-e")
    everything, strict = advice_lines(rm, profile, 0), advice_lines(rm, profile, 10**6)
    assert not strict and everything
    assert all(" us against " in line and "(+" in line for line in everything)
