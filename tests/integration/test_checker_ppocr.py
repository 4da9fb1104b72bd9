"""hb_mapper checker, infer and vec_diff on the real PP-OCR models."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from hbtools.cli.hb_mapper import main as hb_mapper
from hbtools.cli.vec_diff import main as vec_diff
from hbtools.config.builtin import builtin_config
from hbtools.config.loader import load_config
from hbtools.data.calibration import read_sample_file
from hbtools.metrics import cosine_similarity
from hbtools.outputs import file_names
from hbtools.pipeline import optimize, parse
from hbtools.runtime import HB_ONNXRuntime

pytestmark = pytest.mark.integration

ROW = re.compile(r"^(\S+)\s+(BPU|CPU)\s+(id\(\d+\)|--)\s+(\S+)")


def run(main, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def rows(output: str) -> list[tuple[str, ...]]:
    start = output.index("The converted model node information")
    return [m.groups() for line in output[start:].splitlines() if (m := ROW.match(line))]


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_checker_on_det_is_one_subgraph(ppocr_sample_data, tmp_path: Path) -> None:
    det = ppocr_sample_data.models["det"]
    result = run(hb_mapper, "checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(det),
                 "--input-shape", "x", "1x3x640x640")
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    config = builtin_config(det, "onnx", "bayes-e", [("x", "1x3x640x640")], fast_perf=False,
                            working_dir=tmp_path / "w", prefix="det")
    optimized = optimize.run(parse.run(config).model)
    assert sorted(r[0] for r in table) == sorted(n.name for n in optimized.graph.node)
    assert {r[1:3] for r in table} == {("BPU", "id(0)")}
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in result.output
    assert Path("hb_mapper_checker.log").is_file()


def test_checker_on_rec_places_its_layer_norms(ppocr_sample_data) -> None:
    """rec's LayerNorm patterns are one BPU kernel each on bayes-e (nothing left on the CPU); on
    bernoulli2, which has no such kernel, they and what they isolate run on the CPU, each with its reason."""
    rec = ppocr_sample_data.models["rec"]
    result = run(hb_mapper, "checker", "--march", "bayes-e", "--model", str(rec), "--input-shape", "x", "1x3x48x320")
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    assert [r for r in table if r[3] == "HzSQuantizedLayerNorm" and r[1] == "BPU"], "no LayerNorm on the BPU"
    assert not [r for r in table if r[1] == "CPU"], [r for r in table if r[1] == "CPU"]
    result = run(hb_mapper, "checker", "--march", "bernoulli2", "--model", str(rec), "--input-shape", "x",
                 "1x3x48x320")
    assert result.exit_code == 0, result.output
    cpu = [r[0] for r in rows(result.output) if r[1] == "CPU"]
    reasons = result.output[result.output.index("The nodes running on the CPU and why"):]
    for name in cpu:
        assert re.search(rf"^{re.escape(name)}\s+\S+\s+\S", reasons, re.M), name
    assert "LayerNormalization is not supported on the BPU of bernoulli2" in reasons


def test_infer_and_vec_diff_on_cls(ppocr_sample_data, tmp_path: Path) -> None:
    """infer on the float and quantized artefacts, vec_diff of the dumps = the cosine computed directly."""
    config = yaml.safe_load(ppocr_sample_data.configs["cls"].read_text())
    config["model_parameters"].update(onnx_model=str(ppocr_sample_data.models["cls"]),
                                      working_dir=str(tmp_path / "out"), layer_out_dump=True)
    config["calibration_parameters"].update(cal_data_dir=str(ppocr_sample_data.calibration["cls"]),
                                            calibration_type="max")
    config_path = tmp_path / "cls.yaml"
    config_path.write_text(yaml.safe_dump(config))
    made = run(hb_mapper, "makertbin", "--config", str(config_path), "--model-type", "onnx")
    assert made.exit_code == 0, made.output
    prefix = tmp_path / "out" / config["model_parameters"]["output_model_file_prefix"]
    sample = sorted(ppocr_sample_data.heldout["cls"].iterdir())[0]
    for kind, folder in (("optimized_float_model", "float"), ("quantized_model", "quant")):
        result = run(hb_mapper, "infer", "-c", str(config_path), "--model-file", f"{prefix}_{kind}.onnx",
                     "--model-type", "onnx", "--image-file", "x", str(sample), "--output-dir", folder)
        assert result.exit_code == 0, result.output
    result = run(vec_diff, "quant", "float", "-o", "cls.csv")
    assert result.exit_code == 0, result.output
    with open("cls.csv", newline="") as fh:
        table = {r["Left Files"]: r for r in csv.DictReader(fh)}
    spec = load_config(config_path).inputs[0]
    feed = {"x": read_sample_file(sample, spec)}
    outputs = [HB_ONNXRuntime(model_file=f"{prefix}_{kind}.onnx").run(None, feed)[0]
               for kind in ("optimized_float_model", "quantized_model")]
    output_name = HB_ONNXRuntime(model_file=f"{prefix}_quantized_model.onnx").output_names[0]
    row = table[file_names([output_name], suffix="_float.bin")[output_name]]  # "/" in a layer name becomes "_"
    assert abs(float(row["Cosine Similarity"]) - cosine_similarity(*outputs)) < 1e-6
    convs = [r for name, r in table.items() if name.startswith("conv2d") or "Conv" in name]
    assert len(convs) > 10, list(table)
    assert min(float(r["Cosine Similarity"]) for r in convs) > 0.9
