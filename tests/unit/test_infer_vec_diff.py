"""``hb_mapper infer`` on float and quantized artefacts, then ``vec_diff`` of the two dumps."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
from builders import MODELS, Project, make_project
from click.testing import CliRunner, Result

from hbtools.cli.hb_mapper import main as hb_mapper
from hbtools.cli.vec_diff import main as vec_diff
from hbtools.config.loader import load_config
from hbtools.data.calibration import read_sample_file
from hbtools.data.folders import sample_files
from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.tools.vec_diff import COLUMNS, read_vector


def infer(project: Project, kind: str, out: str, *extra: str) -> Result:
    return CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                          str(project.artefact(kind)), "--model-type", "onnx", "--image-file", "data",
                                          str(project.root / "cal_data" / "000.bin"), "--output-dir", out, *extra],
                              catch_exceptions=False)


def diff(*args: str) -> Result:
    return CliRunner().invoke(vec_diff, list(args), catch_exceptions=False)


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _converted(root: Path, march: str, layer_out_dump: bool = True) -> Project:
    project = make_project(root, MODELS["resnet_like"](), march=march, cal_count=3)
    project.write(model_parameters={"layer_out_dump": layer_out_dump})
    made = CliRunner().invoke(hb_mapper, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output
    return project


def _direct_output(project: Project, kind: str, layout: str | None = None) -> np.ndarray:
    spec = load_config(project.config_path).inputs[0]
    sample = read_sample_file(project.root / "cal_data" / "000.bin", spec)
    if layout == "NHWC":
        sample = np.transpose(sample, (0, 2, 3, 1))
    sess = HB_ONNXRuntime(model_file=str(project.artefact(kind)))
    return sess.run(None, {"data": sample})[0]


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
def test_infer_then_vec_diff_matches_direct_cosine(tmp_path: Path, march: str) -> None:
    project = _converted(tmp_path / "p", march)
    for kind, folder in (("optimized", "float_out"), ("quantized", "quant_out")):
        result = infer(project, kind, folder)
        assert result.exit_code == 0, result.output
    assert Path("hb_mapper_infer.log").is_file()
    output = project.fm.model.graph.output[0].name
    names = {p.name for p in sample_files(Path("quant_out"))}
    assert names == {p.name for p in sample_files(Path("float_out"))}
    assert {f"{output}_float.bin", "Conv_0_float.bin", "Conv_1_float.bin", "Gemm_0_float.bin"} <= names
    result = diff("quant_out", "float_out", "-o", "diff.csv")
    assert result.exit_code == 0, result.output
    assert re.search(r"Left Files\s+Right Files\s+Cosine Similarity\s+Relative Euclidean Distance\s+"
                     r"Max Absolute Error\s+Mean Square Error", result.output)
    with open("diff.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert tuple(table[0]) == COLUMNS
    by_file = {r["Left Files"]: r for r in table}
    direct = cosine_similarity(_direct_output(project, "optimized"),
                               _direct_output(project, "quantized", "NHWC" if march == "bernoulli2" else None))
    assert abs(float(by_file[f"{output}_float.bin"]["Cosine Similarity"]) - direct) < 1e-6
    # Conv layers of the quantized model come back dequantized: close to the float ones.
    for layer in ("Conv_0", "Conv_1", "Gemm_0"):
        assert float(by_file[f"{layer}_float.bin"]["Cosine Similarity"]) > 0.95, by_file[f"{layer}_float.bin"]
    # The original model's layers are the quantized model's units too (its Conv_0 is followed by a
    # BatchNormalization and a Relu that the unit includes), not its raw convs.
    assert infer(project, "original", "orig_out").exit_code == 0
    for layer in ("Conv_0", "Conv_1"):  # (on bernoulli2 the Gemm becomes a conv of new tensors: left out)
        original = read_vector(Path("orig_out") / f"{layer}_float.bin")
        assert cosine_similarity(original, read_vector(Path("quant_out") / f"{layer}_float.bin")) > 0.95, layer
    # The calibrated model emulates the quantized one.
    assert infer(project, "calibrated", "cal_out").exit_code == 0
    cal = read_vector(Path("cal_out") / f"{output}_float.bin")
    assert cosine_similarity(cal, read_vector(Path("quant_out") / f"{output}_float.bin")) > 0.99


def test_infer_without_layer_out_dump_writes_outputs_only(tmp_path: Path) -> None:
    project = _converted(tmp_path / "p", "bayes-e", layer_out_dump=False)
    assert infer(project, "quantized", "q").exit_code == 0
    assert [p.name for p in sample_files(Path("q"))] == [f"{project.fm.model.graph.output[0].name}_float.bin"]
    # Turning it on afterwards cannot recover the conv layers of a model built without it.
    project.write(model_parameters={"layer_out_dump": True})
    result = infer(project, "quantized", "q2")
    assert result.exit_code == 0 and "built without layer_out_dump" in result.output


def test_infer_mistakes(tmp_path: Path) -> None:
    project = _converted(tmp_path / "p", "bayes-e", layer_out_dump=False)
    wrong = project.root / "wrong.bin"
    wrong.write_bytes(b"\x00" * 10)
    damaged = project.root / "damaged.png"
    damaged.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    bad = [
        (["--image-file", "image", "x.bin"], r"'image'"),
        (["--image-file", "data", str(damaged)], r"cannot read input image .*damaged\.png"),  # hunt 41 D7
        (["--image-file", "data", str(wrong)], r"input file .*wrong\.bin.*10 bytes.*768"),
        (["--image-file", "data", str(wrong), "--image-file", "data", "x.bin"], r"'data' more than once"),
    ]
    for extra, expected in bad:
        args = ["infer", "-c", str(project.config_path), "--model-file", str(project.artefact("quantized")),
                "--output-dir", "o", *extra]
        result = CliRunner().invoke(hb_mapper, args, catch_exceptions=False)
        assert result.exit_code == 1
        assert re.search(expected, result.output), result.output
        assert "Traceback" not in result.output
        # the file is the user's --image-file, not a file of the calibration folder
        assert "calibration file" not in result.output and "keep only calibration" not in result.output
        assert "calibration image" not in result.output
    result = CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                            str(project.model_path), "--image-file", "data",
                                            str(project.root / "cal_data" / "000.bin"), "--output-dir", "o"])
    assert result.exit_code == 1 and "makertbin artefact" in result.output


def test_infer_reads_an_image_file(tmp_path: Path) -> None:
    import skimage.io

    project = _converted(tmp_path / "p", "bayes-e", layer_out_dump=False)
    image = np.random.default_rng(0).integers(0, 256, size=(40, 30, 3), dtype=np.uint8)
    skimage.io.imsave(tmp_path / "photo.png", image, check_contrast=False)
    result = CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                            str(project.artefact("optimized")), "--image-file", "data",
                                            str(tmp_path / "photo.png"), "--output-dir", "img"])
    assert result.exit_code == 0, result.output
    assert len(sample_files(Path("img"))) == 1


def test_vec_diff_files_and_formats(tmp_path: Path) -> None:
    a = np.linspace(-1, 1, 12, dtype=np.float32)
    b = a + np.float32(0.01)
    a.tofile("a.bin")
    np.save("b.npy", b)
    Path("b.txt").write_text(" ".join(map(str, b.tolist())))
    for right in ("b.npy", "b.txt"):
        result = diff("a.bin", right)
        assert result.exit_code == 0, result.output
        with open("vec_diff_out.csv", newline="") as fh:
            row = list(csv.DictReader(fh))[0]
        assert row["Left Files"] == "a.bin" and row["Right Files"] == right
        assert float(row["Max Absolute Error"]) == pytest.approx(0.01, abs=1e-6)
        assert float(row["Mean Square Error"]) == pytest.approx(1e-4, rel=1e-3)
        assert float(row["Relative Euclidean Distance"]) == pytest.approx(
            np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-5)
        assert 0.99 < float(row["Cosine Similarity"]) <= 1.0
    np.zeros(5, np.float32).tofile("short.bin")
    result = diff("a.bin", "short.bin")
    assert result.exit_code == 1 and re.search(r"ERROR .*12 values.*5", result.output)
    assert diff("a.bin", "missing.bin").exit_code == 1
    assert diff("--version").exit_code == 0
    # a dump with NaN gives a row of nan: the warning says which file and how many values (it was silent)
    with_nan = a.copy()
    with_nan[[2, 5]] = np.nan
    with_nan.tofile("nan.bin")
    result = diff("a.bin", "nan.bin")
    assert result.exit_code == 0
    assert re.search(r"WARNING nan\.bin holds 2 NaN/infinite value\(s\) of 12", result.output), result.output


def test_vec_diff_folders_match_by_name(tmp_path: Path) -> None:
    for folder in ("L", "R"):
        Path(folder).mkdir()
    for name in ("x_float.bin", "y_float.bin"):
        np.arange(4, dtype=np.float32).tofile(Path("L") / name)
        np.arange(4, dtype=np.float32).tofile(Path("R") / name)
    np.ones(3, np.float32).tofile(Path("L") / "only_left.bin")
    np.ones(3, np.float32).tofile(Path("L") / "z_float.bin")
    np.ones(5, np.float32).tofile(Path("R") / "z_float.bin")
    result = diff("L", "R", "-o", "out.csv")
    assert result.exit_code == 0, result.output
    assert "only_left.bin" in result.output and "WARNING" in result.output
    assert re.search(r"WARNING skipped: .*z_float\.bin has 3 values", result.output)
    with open("out.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [r["Left Files"] for r in table] == ["x_float.bin", "y_float.bin"]
    assert all(float(r["Cosine Similarity"]) == 1.0 for r in table)
    assert diff("L", "a_file_that_is_not_here").exit_code == 1


def test_layer_out_dump_bin_dumps_its_conv_layers_like_the_quantized_model(tmp_path: Path) -> None:
    """The .bin of a layer_out_dump model gives the conv layer results hb_mapper infer gives for the quantized
    ONNX model, under the same file names, so vec_diff pairs them (and they agree exactly)."""
    from hbtools.cli import hrt_model_exec
    from hbtools.runtime.binfile import read_bin

    project = _converted(tmp_path / "p", "bayes-e")
    assert read_bin(project.artefact("bin")).model().meta["layer_out_dump"] is True
    assert infer(project, "quantized", "quant_out").exit_code == 0
    result = CliRunner().invoke(hrt_model_exec.main, [
        "infer", f"--model_file={project.artefact('bin')}", f"--input_file={project.root / 'cal_data' / '000.bin'}",
        "--enable_dump=true", "--dump_path=bin_out"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    layers = {p.name for p in Path("bin_out").glob("*_float.bin")}
    assert layers == {"Conv_0_float.bin", "Conv_1_float.bin", "Gemm_0_float.bin"}
    for name in layers:
        np.testing.assert_array_equal(read_vector(Path("bin_out") / name), read_vector(Path("quant_out") / name))
    # without layer_out_dump the .bin has no layers to give
    plain = _converted(tmp_path / "plain", "bayes-e", layer_out_dump=False)
    assert read_bin(plain.artefact("bin")).model().meta["layer_out_dump"] is False
    CliRunner().invoke(hrt_model_exec.main, ["infer", f"--model_file={plain.artefact('bin')}", "--enable_dump=true",
                                             "--dump_path=plain_out"], catch_exceptions=False)
    assert not list(Path("plain_out").glob("*_float.bin"))


def test_infer_logs_the_model_file_it_runs(tmp_path: Path) -> None:
    """Without input_shape in the config, infer reads the config's float model for the shapes, and logged
    'Using onnx model file: <that float model>' while it ran the quantized artefact."""
    project = _converted(tmp_path / "p", "bayes-e", layer_out_dump=False)
    project.write(input_parameters={"input_shape": None})
    result = infer(project, "quantized", "q")
    assert result.exit_code == 0, result.output
    used = re.findall(r"INFO Using onnx model file: (\S+)", result.output)
    assert used == [str(project.artefact("quantized"))], result.output
    assert f"Input names and shapes from the config's float onnx model file: {project.root / 'model.onnx'}" in \
        result.output


def test_infer_needs_no_calibration_folder(tmp_path: Path) -> None:
    """infer reads only its --image-file, yet refused to start when the config's cal_data_dir was gone
    (artefacts and config copied to another machine)."""
    import shutil

    project = _converted(tmp_path / "p", "bayes-e", layer_out_dump=False)
    sample = tmp_path / "sample.bin"
    shutil.copy(project.root / "cal_data" / "000.bin", sample)
    before = infer(project, "quantized", "before")
    shutil.rmtree(project.root / "cal_data")
    result = CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                            str(project.artefact("quantized")), "--image-file", "data", str(sample),
                                            "--output-dir", "after"], catch_exceptions=False)
    assert before.exit_code == 0 and result.exit_code == 0, result.output
    [name] = [p.name for p in sample_files(Path("before"))]
    np.testing.assert_array_equal(read_vector(Path("before") / name), read_vector(Path("after") / name))


def test_infer_replaces_its_results_as_one_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--output-dir holds one run's results, as vec_diff compares them: the conv layers of a model dumped
    there before, which the next model does not have, were left next to its results; a run that fails
    while writing left a mix of both. The user's own files stay."""
    import errno

    from hbtools import outputs

    project = _converted(tmp_path / "p", "bayes-e")
    assert infer(project, "quantized", "q").exit_code == 0
    Path("q", "notes.txt").write_text("mine")
    first = {p.name: p.read_bytes() for p in sample_files(Path("q"))}
    output = f"{project.fm.model.graph.output[0].name}_float.bin"
    assert len(first) > 2 and output in first

    write = outputs.write_array
    calls = []

    def full_disk(path: Path, values: np.ndarray) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, values)

    monkeypatch.setattr(outputs, "write_array", full_disk)
    failed = infer(project, "original", "q")
    monkeypatch.setattr(outputs, "write_array", write)
    assert failed.exit_code != 0 and "ERROR" in failed.output
    assert {p.name: p.read_bytes() for p in sample_files(Path("q"))} == first

    project.write(model_parameters={"layer_out_dump": False})
    made = CliRunner().invoke(hb_mapper, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output
    assert infer(project, "quantized", "q").exit_code == 0
    assert sorted(p.name for p in sample_files(Path("q"))) == sorted([output, "notes.txt"])


def test_infer_takes_one_input_layout_per_input(tmp_path: Path) -> None:
    """--input-layout took one value for all inputs ('NCHW;NHWC' was refused): a model with inputs of mixed
    layouts could not be fed. Now one value per input, in input_name order, ';'-separated (one means all).
    Each 4x4x4 input fits either layout, so only the option says which input's data is transposed."""
    from builders import _Graph

    g = _Graph(5)
    out = g.op("Add", [g.conv("a", 4, 4, k=1), g.conv("b", 4, 4, k=1)])
    project = make_project(tmp_path / "p", g.model({"a": [1, 4, 4, 4], "b": [1, 4, 4, 4]}, [out],
                                                   featuremap={"a", "b"}), cal_count=3)
    made = CliRunner().invoke(hb_mapper, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output
    files = {n: project.root / f"cal_{n}" / "000.bin" for n in "ab"}
    specs = {s.name: s for s in load_config(project.config_path).inputs}
    data = {n: read_sample_file(f, specs[n]) for n, f in files.items()}
    sess = HB_ONNXRuntime(model_file=str(project.artefact("optimized")))
    for layouts, transposed in (("NCHW;NHWC", "b"), ("nhwc;NCHW", "a"), ("NHWC", "ab")):
        feed = {n: np.transpose(v, (0, 2, 3, 1)) if n in transposed else v for n, v in data.items()}
        result = CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                                str(project.artefact("optimized")), "--image-file", "a",
                                                str(files["a"]), "--image-file", "b", str(files["b"]),
                                                "--input-layout", layouts, "--output-dir", transposed],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        (dump,) = sample_files(Path(transposed))
        want = sess.run(None, feed)[0]
        np.testing.assert_allclose(np.fromfile(dump, np.float32).reshape(want.shape), want, rtol=1e-6, atol=1e-6)
    result = CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                            str(project.artefact("optimized")), "--image-file", "a", str(files["a"]),
                                            "--image-file", "b", str(files["b"]), "--input-layout", "NCHW;NHWC;NCHW",
                                            "--output-dir", "three"])
    assert result.exit_code == 1 and "--input-layout has 3 values but the config has 2 inputs (a, b)" in result.output


def test_infer_feeds_integer_ids_as_calibration_does(tmp_path: Path) -> None:
    """A token-id input (int64, read by a Gather) was refused by infer ("float32 data cannot be converted to it
    exactly: give it as int64") even with the config's own int64 calibration files: infer read every featuremap
    as float32. It feeds them in the input's own type, as calibration does, for every artefact."""
    from builders import FloatModel
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    table = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "table")
    w = numpy_helper.from_array((rng.standard_normal((8, 6)) / 3).astype(np.float32), "w")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
             helper.make_node("MatMul", ["emb", "w"], ["proj"], name="proj"),
             helper.make_node("Relu", ["proj"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 12])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 12, 6])], [table, w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    project = make_project(tmp_path / "p", FloatModel(model, {"ids": [1, 12]}, {"ids"}), cal_count=3)
    for f in sorted((project.root / "cal_ids").iterdir()):
        rng.integers(0, 50, (1, 12), dtype=np.int64).tofile(f)
    project.write(calibration_parameters={"cal_data_type": "int64"})
    made = CliRunner().invoke(hb_mapper, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output
    sample = project.root / "cal_ids" / "000.bin"
    ids = np.fromfile(sample, np.int64).reshape(1, 12)
    for kind in ("original", "quantized"):
        result = CliRunner().invoke(hb_mapper, ["infer", "-c", str(project.config_path), "--model-file",
                                                str(project.artefact(kind)), "--image-file", "ids", str(sample),
                                                "--output-dir", kind], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        (dump,) = sample_files(Path(kind))
        want = HB_ONNXRuntime(model_file=str(project.artefact(kind))).run(None, {"ids": ids})[0]
        np.testing.assert_array_equal(np.fromfile(dump, np.float32).reshape(want.shape), want)


def test_infer_that_cannot_write_its_results_leaves_no_new_output_folder(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A run into a new --output-dir that fails while writing (a full disk) left the empty folder it had made
    before its transaction, as the other tools do not."""
    import errno

    from hbtools import outputs

    project = _converted(tmp_path / "p", "bayes-e")

    def full_disk(path: Path, values: np.ndarray) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(outputs, "write_array", full_disk)
    failed = infer(project, "quantized", "new/q")
    assert failed.exit_code != 0 and "No space left on device" in failed.output, failed.output
    assert not Path("new").exists()
