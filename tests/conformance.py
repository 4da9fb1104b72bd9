"""Run a small float model through everything a user runs, and say where each op went.

``convert_and_check`` is the conformance check for one model and one calibration type:
``hb_mapper checker`` and ``hb_mapper makertbin`` on the command line (exit 0, no
"internal error"), every ONNX artefact loads and runs in ``HB_ONNXRuntime``, the
quantized model agrees with the float one on held-out data, and ``hb_verifier``
finds the ``.bin`` equal to the quantized model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bin_fixtures import logger_restored
from builders import FloatModel, Project, make_project, random_sample
from click.testing import CliRunner

from hbtools.cli.hb_mapper import main as hb_mapper
from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin
from hbtools.tools.verifier import verify

ARTEFACTS = ("original", "optimized", "calibrated", "quantized")
INTERNAL = "internal error"


@dataclass
class Outcome:
    cosine: list[float]  # quantized vs float model, per output
    cpu: list[dict]  # the .bin's CPU nodes: name, type, reason
    bpu_nodes: list[str]
    log: str
    project: Project | None = None

    def placement(self) -> str:
        cpu = "; ".join(f"{c['type']} {c['name']}: {c['reason']}" for c in self.cpu) or "none"
        return f"BPU nodes {len(self.bpu_nodes)}, CPU nodes: {cpu}"


def _cli(args: list[str], cwd: Path) -> tuple[int, str]:
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with logger_restored():
            result = CliRunner().invoke(hb_mapper, args, catch_exceptions=False)
    finally:
        os.chdir(old)
    return result.exit_code, result.output


def convert_featuremaps(root: Path, model, samples: dict[str, list[np.ndarray]], input_shape: str,
                        cal_data_type: str, prefix: str, calibration_type: str = "default",
                        calibration: dict[str, str] | None = None, inputs: dict[str, str] | None = None,
                        **model_parameters: str) -> str:
    """makertbin (``calibration_type``, ``default`` unless given; other ``calibration`` parameters) on ``model``
    whose inputs are all featuremaps, calibrated on ``samples`` (per input, .npy files); fails the test on an
    error; ``inputs``: input parameters beyond the featuremap defaults (a norm_type). The console output."""
    import onnx
    import yaml

    onnx.save(model, root / f"{prefix}.onnx")
    for name, values in samples.items():
        (root / f"cal_{name}").mkdir()
        for k, value in enumerate(values):
            np.save(root / f"cal_{name}" / f"{k}.npy", value)
    def each(value: str) -> str:
        return ";".join([value] * len(samples))

    config = {
        "model_parameters": {"onnx_model": str(root / f"{prefix}.onnx"), "march": "bayes-e",
                             "working_dir": str(root / "out"), "output_model_file_prefix": prefix,
                             **model_parameters},
        "input_parameters": {"input_name": ";".join(samples), "input_type_train": each("featuremap"),
                             "input_layout_train": each("NCHW"), "input_type_rt": each("featuremap"),
                             "input_shape": input_shape, "norm_type": each("no_preprocess"), **(inputs or {})},
        "calibration_parameters": {"cal_data_dir": ";".join(str(root / f"cal_{name}") for name in samples),
                                   "cal_data_type": cal_data_type, "calibration_type": calibration_type,
                                   **(calibration or {})},
        "compiler_parameters": {"optimize_level": "O3"},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    code, out = _cli(["makertbin", "--config", str(root / "config.yaml"), "--model-type", "onnx"], root)
    assert INTERNAL not in out, out[-3000:]
    assert code == 0, out[-3000:]
    return out


def _source_feed(fm: FloatModel, x: dict[str, np.ndarray], mean: list[float], scale: list[float]) -> dict:
    m = np.array(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.array(scale, dtype=np.float32).reshape(1, -1, 1, 1)
    return {n: v if n in fm.featuremap else (v.astype(np.float32) - m) * s for n, v in x.items()}


def convert_and_check(fm: FloatModel, root: Path, calibration_type: str = "max", cal_count: int = 8,
                      checker: bool = True) -> Outcome:
    """Convert ``fm`` under ``root`` and check every artefact; fails the test on any problem."""
    from builders import EXACT_MEAN, EXACT_SCALE

    project = make_project(root, fm, cal_count=cal_count, calibration_type=calibration_type)
    logs = []
    if checker:
        code, out = _cli(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                          str(project.model_path)], root)
        assert INTERNAL not in out and code == 0, f"checker failed:\n{out[-3000:]}"
        logs.append(out)
    code, out = _cli(["makertbin", "--config", str(project.config_path), "--model-type", "onnx"], root)
    logs.append(out)
    assert INTERNAL not in out, out[-3000:]
    assert code == 0, f"makertbin ({calibration_type}) failed:\n{out[-3000:]}"
    rng = np.random.default_rng(4321)
    x = {n: random_sample(fm, n, rng) for n in fm.inputs}
    ref = HB_ONNXRuntime(onnx_model=fm.model).run(None, _source_feed(fm, x, EXACT_MEAN, EXACT_SCALE))
    outs = {}
    for kind in ARTEFACTS:
        sess = HB_ONNXRuntime(model_file=str(project.artefact(kind)))
        shapes = {i.name: list(i.shape) for i in sess.get_inputs()}
        feed = {n: v if list(v.shape) == shapes[n] or v.ndim != 4 else v.transpose(0, 2, 3, 1) for n, v in x.items()}
        outs[kind] = sess.run(None, feed) if kind != "original" else sess.run(None, x, input_offset=128)
        assert all(np.isfinite(o).all() for o in outs[kind]), f"{kind} model gives non-finite outputs"
    want = [np.shape(r) for r in ref]
    for kind in ARTEFACTS[1:]:
        shapes = [np.shape(o) for o in outs[kind]]
        assert shapes == want, f"{kind} model outputs {shapes}, the float model {want}"
    cos = [cosine_similarity(np.asarray(r, np.float64), np.asarray(q, np.float64))
           for r, q in zip(ref, outs["quantized"], strict=True)]
    verdict = verify(project.artefact("quantized"), project.artefact("bin"), None, 5)
    bad = [c.name for c in verdict.outputs if not c.passed]
    assert not bad, f"hb_verifier: quantized model and .bin differ on {bad}"
    part = read_bin(project.artefact("bin")).models[0].partition
    bpu = [n for s in part["subgraphs"] for n in s["nodes"]]
    return Outcome(cos, part["cpu_nodes"], bpu, "\n".join(logs), project)


def bayes_e_placement(model) -> tuple[int, list[str]]:
    """The number of BPU subgraphs and the CPU nodes' op types of an optimized ``model`` on bayes-e."""
    from hbtools.march.profiles import get_profile
    from hbtools.quant.units import build_partition

    part = build_partition(model, get_profile("bayes-e"), {})
    subgraphs = {sub for _, on, sub, _ in part.rows() if on == "BPU"}
    return len(subgraphs), sorted(u.main.op_type for u in part.units if u.on == "CPU")
