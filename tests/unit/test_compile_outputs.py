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


def test_bin_inputs_follow_the_model_order_not_input_name(tmp_path, monkeypatch) -> None:
    """input_name listing the inputs in another order than the model: the .bin numbered them in the YAML's
    order, so `hrt_model_exec --input_file` in the model's (and the quantized ONNX's) order was refused or,
    with equal sizes, fed the wrong inputs."""
    import numpy as np
    from debug_support import two_inputs

    from hbtools.cli import hrt_model_exec
    from hbtools.runtime import HB_ONNXRuntime

    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "m", two_inputs(), cal_count=2)
    ip = project.config["input_parameters"]
    for key in ("mean_value", "scale_value"):  # the featuremap takes none
        ip[key] = f"{ip[key]}; None"
    swapped = {key: "; ".join(reversed(str(value).split("; "))) for key, value in ip.items()
               if isinstance(value, str) and value.count("; ") == 1}
    cal = project.config["calibration_parameters"]["cal_data_dir"]
    project.write(input_parameters=swapped,
                  calibration_parameters={"cal_data_dir": "; ".join(reversed(cal.split("; ")))})
    assert project.config["input_parameters"]["input_name"] == "feat; data"
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    assert [d.name for d in open_model(project.artefact("bin")).inputs] == ["data", "feat"]

    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (1, 3, 8, 8), dtype=np.uint8)
    feat = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    image.tofile(tmp_path / "image.bin")
    feat.tofile(tmp_path / "feat.bin")
    ran = invoke(hrt_model_exec.main, ["infer", f"--model_file={project.artefact('bin')}",
                                       f"--input_file={tmp_path / 'image.bin'},{tmp_path / 'feat.bin'}",
                                       "--enable_dump=True", "--dump_format=npy", f"--dump_path={tmp_path / 'd'}"])
    assert ran.exit_code == 0, ran.output
    [dumped] = list((tmp_path / "d").glob("*.npy"))
    [expected] = HB_ONNXRuntime(model_file=str(project.artefact("quantized"))).run(None, {"data": image,
                                                                                         "feat": feat})
    np.testing.assert_allclose(np.load(dumped).reshape(expected.shape), expected, atol=1e-6)
