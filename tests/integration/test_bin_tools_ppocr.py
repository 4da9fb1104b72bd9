"""The .bin tools on the three PP-OCR models, as a user runs them after makertbin.

cls is built with its real config (default calibration, mixed int8/int16); det
and rec with copies of theirs using calibration_type max on four samples, which
keeps the conversion to seconds without changing what the tools see.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import numpy as np
import onnx
import pytest
import yaml
from bin_fixtures import Built, invoke, logger_restored, subgraph_counts
from onnx import helper

from hbtools.cli import (
    hb_mapper,
    hb_model_info,
    hb_model_modifier,
    hb_pack,
    hb_perf,
    hb_verifier,
    hrt_model_exec,
)
from hbtools.log import setup
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.rt_input import random_rt_input
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator

pytestmark = pytest.mark.integration
PASSED = "Quanti onnx and Sim result Strict check PASSED"
MODELS = ("cls", "det", "rec")


@pytest.fixture(scope="module")
def build(ppocr_sample_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("ppocr_bins")
    cache: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in cache:
            config = ppocr_sample_data.configs[name]
            if name != "cls":
                config = _fast_config(ppocr_sample_data, name, root)
            with logger_restored():
                setup(None)
                paths = makertbin(config, "onnx")
            cache[name] = Built(paths["bin"], paths["quantized"], f"ppocr_{name}")
        return cache[name]

    return get


def _fast_config(data, name: str, root: Path, **model_parameters: object) -> Path:
    cfg = yaml.safe_load(data.configs[name].read_text())
    samples = root / f"cal_{name}"
    samples.mkdir(parents=True, exist_ok=True)
    for f in sorted(data.calibration[name].iterdir())[:4]:
        if not (samples / f.name).exists():
            (samples / f.name).symlink_to(f)
    cfg["model_parameters"].update(onnx_model=str(data.models[name]), working_dir=str(root / name),
                                   **model_parameters)
    cfg["calibration_parameters"].update(cal_data_dir=str(samples), calibration_type="max")
    path = root / f"ppocr_{name}{'_removed' if model_parameters else ''}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", MODELS)
def test_verifier_passes(build, name: str) -> None:
    built = build(name)
    result = invoke(hb_verifier.main, ["-m", f"{built.quantized},{built.bin}", "-s", "True"])
    assert result.exit_code == 0 and PASSED in result.output, result.output


@pytest.mark.parametrize("name", MODELS)
def test_model_info_shows_the_config_used(build, ppocr_sample_data, name: str) -> None:
    built = build(name)
    result = invoke(hb_model_info.main, [built.bin])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(ppocr_sample_data.configs[name].read_text())
    ip = cfg["input_parameters"]
    for line in (f"******** ppocr_{name} info *********", "BPU march           : bayes-e",
                 f"input_type_rt       : {ip['input_type_rt']}", f"input_shape         : {ip['input_shape']}",
                 f"norm_type           : {ip['norm_type']}", "input_layout_rt     : NCHW",
                 "calibration_type    : " + ("default" if name == "cls" else "max"),
                 "model input types   : [<InputDataType.BGR: 10>]"):
        assert line in result.output, line
    mean = ",".join(str(float(v)) for v in str(ip["mean_value"]).split()) + ","
    assert f"mean_value          : {mean}" in result.output


@pytest.mark.parametrize("name", MODELS)
def test_perf_report_with_picture(build, in_tmp, name: str) -> None:
    built = build(name)
    result = invoke(hb_perf.main, [built.bin])
    assert result.exit_code == 0, result.output
    folder = in_tmp / "hb_perf_result" / f"ppocr_{name}"
    page = (folder / f"ppocr_{name}.html").read_text()
    assert f'<img src="ppocr_{name}.png"' in page
    picture = matplotlib.image.imread(folder / f"ppocr_{name}.png")
    assert min(picture.shape[:2]) > 200 and (picture[..., :3] != 1).any()
    subgraphs = sorted(folder.glob(f"ppocr_{name}_subgraph_*.json"))
    assert subgraphs and len(subgraphs) == len(list(folder.glob(f"ppocr_{name}_subgraph_*.html")))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        shot = in_tmp / "shot.png"
        subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}",
                        (folder / f"ppocr_{name}.html").as_uri()], check=True, capture_output=True, timeout=120)
        assert matplotlib.image.imread(shot).std() > 0


def test_pack_two_models_then_info_and_perf_each(build, in_tmp) -> None:
    cls, rec = build("cls"), build("rec")
    assert invoke(hb_pack.main, [cls.bin, rec.bin, "-o", "ocr.bin"]).exit_code == 0
    assert read_bin("ocr.bin").names == ["ppocr_cls", "ppocr_rec"]
    for name in ("ppocr_cls", "ppocr_rec"):
        info = invoke(hb_model_info.main, ["ocr.bin", "-m", name])
        assert info.exit_code == 0 and f"******** {name} info" in info.output
        perf = invoke(hb_perf.main, ["-m", name, "ocr.bin"])
        assert perf.exit_code == 0 and (in_tmp / "hb_perf_result" / name / f"{name}.png").is_file()


def test_removed_output_dequantize_keeps_the_integer_result(build, in_tmp) -> None:
    det = build("det")
    listing = invoke(hb_model_modifier.main, [det.bin]).output
    deletable = ast.literal_eval(re.search(r"Nodes that can be deleted: (\[.*\])", listing).group(1))
    dequantize = next(n for n in deletable if n.endswith("_HzDequantize"))
    # -o: by default the result goes beside the model, in the folder the other tests share
    result = invoke(hb_model_modifier.main, [det.bin, "-r", dequantize, "-o", "ppocr_det_modified.bin"])
    assert result.exit_code == 0 and "modified model saved as ppocr_det_modified.bin" in result.output
    info = invoke(hb_model_info.main, ["ppocr_det_modified.bin"])
    assert f"deleted nodes: {dequantize}" in info.output
    model = open_model("ppocr_det_modified.bin")
    out = model.outputs[0]
    assert out.dtype in (np.int8, np.int16) and out.scale
    sim = Simulator(model)
    feeds = {d.name: random_rt_input(d, np.random.default_rng(1)) for d in model.inputs}
    ours = sim.run(feeds)[out.name]
    quantized = onnx.load(str(det.quantized))
    elem = onnx.helper.np_dtype_to_tensor_dtype(out.dtype)
    tensor = read_bin("ppocr_det_modified.bin").model().deleted_nodes[-1]["inputs"][0]  # its quantized-model name
    quantized.graph.output.append(helper.make_tensor_value_info(tensor, elem, None))
    theirs = HB_ONNXRuntime(onnx_model=quantized).run([tensor], sim.prepare(feeds))[0]
    np.testing.assert_array_equal(ours, theirs)


def test_cls_dequantize_removal_routes_agree(ppocr_sample_data, tmp_path, in_tmp) -> None:
    """hb_model_modifier -r and remove_node_type give the same .bin description on PP-OCR cls
    (its Softmax runs on the BPU of bayes-e, so the Dequantize after it is the output node)."""
    built = {}
    for route, extra in (("cli", {}), ("yaml", {"remove_node_type": "Dequantize"})):
        config = _fast_config(ppocr_sample_data, "cls", tmp_path / route, **extra)
        with logger_restored():
            setup(None)
            built[route] = makertbin(config, "onnx")
    plain = read_bin(built["cli"]["bin"]).model()
    names = [o["name"] for o in plain.outputs]
    chain = [n.name for n in plain.load_graph().graph.node if n.op_type == "HzDequantize"]
    assert len(chain) == 1
    shutil.copy(built["cli"]["bin"], "logits.bin")
    assert invoke(hb_model_modifier.main, ["logits.bin", "-r", chain[0], "-o", "cli.bin"]).exit_code == 0
    cli, by_yaml = read_bin("cli.bin").model(), read_bin(built["yaml"]["bin"]).model()
    assert [o["name"] for o in cli.outputs] == names and cli.outputs == by_yaml.outputs
    assert cli.deleted_nodes == by_yaml.deleted_nodes and [r["name"] for r in cli.deleted_nodes] == chain
    assert cli.deleted_nodes[0]["scale"] == cli.outputs[0]["scale"]
    listings = [invoke(hrt_model_exec.main, ["model_info", f"--model_file={p}"]).output
                for p in ("cli.bin", built["yaml"]["bin"])]
    assert listings[0] == listings[1] and "quanti type: SCALE\nstride: (" in listings[0]
    assert "scale data: " in listings[0]
    before, after = open_model("logits.bin"), open_model("cli.bin")
    feeds = {d.name: random_rt_input(d, np.random.default_rng(2)) for d in before.inputs}
    expected, got = Simulator(before).run(feeds), Simulator(after).run(feeds)
    out = after.outputs[0]
    scale = np.asarray(out.scale).reshape(-1 if len(out.scale) > 1 else [])
    np.testing.assert_allclose(got[out.name] * scale, expected[out.name], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(("name", "shape"), [("cls", "1x3x48x192"), ("det", "1x3x640x640"), ("rec", "1x3x48x320")])
def test_subgraph_counts_agree(build, ppocr_sample_data, in_tmp, name: str, shape: str) -> None:
    """checker, the .bin (makertbin's partition), hb_perf, the profiler and the picture give one count."""
    built = build(name)
    checked = invoke(hb_mapper.main, ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                                      ppocr_sample_data.models[name], "--input-shape", "x", shape])
    assert checked.exit_code == 0, checked.output
    expected = int(re.search(r"The model has (\d+) BPU subgraph", checked.output).group(1))
    counts = subgraph_counts(built.bin, in_tmp)
    assert set(counts.values()) == {expected}, counts
