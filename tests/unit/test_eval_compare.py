"""hbtools.eval.compare_outputs / cosine_samples: held-out float vs quantized outputs."""

from __future__ import annotations

import numpy as np
import pytest

from hbtools.eval import DET_THRESH, compare_outputs, cosine_samples


def _det_map(text: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.uniform(0.0, 0.05, (1, 1, 8, 8)).astype(np.float32)
    if text:
        out[0, 0, 2:4, 1:6] = 0.9
    return out


def test_det_cosine_only_over_pictures_with_text() -> None:
    ref = [_det_map(True, 0), _det_map(False, 1), _det_map(True, 2)]
    assert cosine_samples("det", ref) == [0, 2]
    assert cosine_samples("cls", ref) == [0, 1, 2]
    quant = [r.copy() for r in ref]
    quant[1][:] = 0.2  # noise on the empty picture: not part of the cosine, still below the threshold
    quant[2][0, 0, 2, 1] = 0.1  # one text pixel lost
    got = compare_outputs("det", ref, quant)
    assert got.cosine_samples == 2
    assert got.cosine_min < got.cosine_mean < 1.0
    assert got.agreement == pytest.approx(1 - 1 / (3 * 64))
    assert got.iou == pytest.approx(19 / 20)


def test_det_map_lost_entirely_gives_cosine_zero() -> None:
    ref = [_det_map(True, 0), _det_map(True, 1)]
    quant = [ref[0].copy(), np.zeros_like(ref[1])]
    got = compare_outputs("det", ref, quant)
    assert got.cosine_min == 0.0 and got.cosine_mean == pytest.approx(0.5)
    assert (ref[1] > DET_THRESH).sum() == 10
    assert got.iou == pytest.approx(0.5)


def test_cls_and_rec_agreement() -> None:
    ref = [np.array([[0.9, 0.1]]), np.array([[0.2, 0.8]])]
    quant = [np.array([[0.8, 0.2]]), np.array([[0.6, 0.4]])]
    got = compare_outputs("cls", ref, quant)
    assert got.agreement == 0.5 and got.iou is None and got.cosine_samples == 2

    chars = ["a", "b"]  # classes: blank, a, b, space

    def line(indices: list[int]) -> np.ndarray:
        return np.eye(4, dtype=np.float32)[indices][None]

    ref = [line([1, 1, 0, 2]), line([2, 0, 2, 3])]  # "ab", "bb "
    quant = [line([1, 0, 0, 2]), line([2, 2, 2, 3])]  # "ab", "b "
    assert compare_outputs("rec", ref, quant, chars).agreement == 0.5


def test_bad_input_is_refused() -> None:
    one = [np.zeros((1, 2))]
    with pytest.raises(ValueError, match="unknown task"):
        compare_outputs("seg", one, one)
    with pytest.raises(ValueError, match="characters"):
        compare_outputs("rec", [np.zeros((1, 2, 3))], [np.zeros((1, 2, 3))])
    with pytest.raises(ValueError, match="1 float vs 0"):
        compare_outputs("cls", one, [])
