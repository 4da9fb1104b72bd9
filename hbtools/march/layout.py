"""Input layout of the quantized model and the .bin (SPEC §5)."""

from __future__ import annotations

from hbtools.config.model import InputSpec
from hbtools.march.profiles import MarchProfile


def quantized_layout(spec: InputSpec, profile: MarchProfile) -> str:
    if spec.type_rt == "featuremap":
        return spec.layout_train
    return profile.quantized_input_layout or spec.effective_layout_rt


def to_layout(shape: list[int], src: str, dst: str) -> list[int]:
    if src == dst or len(shape) != 4:
        return list(shape)
    return [shape[src.index(c)] for c in dst]


def permutation(src: str, dst: str) -> list[int]:
    """Transpose perm taking a tensor in layout ``src`` to layout ``dst``."""
    return [src.index(c) for c in dst]
