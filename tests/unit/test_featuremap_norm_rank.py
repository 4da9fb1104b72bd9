"""``norm_type`` on a featuremap input that is not 4-D (a detector's 1x2 ``scale_factor``): normalisation is per channel
of a map, and such an input takes none. With ``input_shape`` in the config it was refused there; with the shape left
to the model the config passed, makertbin converted without a word and the normalisation was silently dropped (hunt
33 D5: ``scale_value: 2.0`` not applied). Now both refuse it with one ERROR before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders import MODELS, make_project
from conformance import INTERNAL, _cli

ERROR = re.compile(r"ERROR (.*)$")
FRAMING = re.compile(r"exception in command: |yaml file parse failed|Key '\w+' error:$")


@pytest.mark.parametrize("shape_given", [True, False])
@pytest.mark.parametrize("norm", [{"norm_type": "data_scale", "scale_value": "2.0"},
                                  {"norm_type": "data_mean", "mean_value": "0.5"}])
def test_a_normalised_featuremap_that_is_not_4d_is_refused(shape_given: bool, norm: dict, tmp_path: Path) -> None:
    project = make_project(tmp_path, MODELS["featuremap_mlp"](), cal_count=2)  # input 'feat' [1, 5, 12]
    project.write(input_parameters={**norm, "input_shape": "1x5x12" if shape_given else None})
    code, out = _cli(["makertbin", "--config", str(project.config_path), "--model-type", "onnx"], tmp_path)
    assert code == 1 and INTERNAL not in out and "Traceback" not in out, out[-3000:]
    problems = [m.group(1) for line in out.splitlines() if (m := ERROR.search(line)) and not FRAMING.search(line)]
    assert len(problems) == 1, out[-3000:]
    assert "'feat'" in problems[0] and "not 4-D" in problems[0] and "set norm_type to no_preprocess" in problems[0]
    assert not project.working_dir.exists(), sorted(p.name for p in project.working_dir.iterdir())


def test_a_featuremap_that_is_not_4d_without_normalisation_converts(tmp_path: Path) -> None:
    project = make_project(tmp_path, MODELS["featuremap_mlp"](), cal_count=2)
    project.write(input_parameters={"input_shape": None})
    code, out = _cli(["makertbin", "--config", str(project.config_path), "--model-type", "onnx"], tmp_path)
    assert code == 0, out[-3000:]
    assert project.artefact("bin").exists()
