"""Split the per-input parameters into one ``InputSpec`` per model input and check them.

Count rule: every per-input parameter has one value per input (in ``input_name``
order). ``input_layout_rt``, ``input_space_and_range`` and ``cal_data_type`` may
instead hold a single value, which then applies to every input: these are
properties users usually share across inputs, and a single value is unambiguous.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hbtools.config.model import ALLOWED_RT_FOR_TRAIN, InputSpec
from hbtools.config.schema import LAYOUTS
from hbtools.config.values import group_error, trailing_separator_dropped
from hbtools.log import logger

IN = "input_parameters"
USES_MEAN = ("data_mean", "data_mean_and_scale")
USES_SCALE = ("data_scale", "data_mean_and_scale")


def label(name: str | None) -> str:
    """How messages name an input (several inputs always have names)."""
    return f"input '{name}'" if name else "the input"


def _per_input(
    values: list[Any] | None,
    key: str,
    n: int,
    ref: str,
    *,
    group: str = IN,
    broadcast: bool = False,
    trailing_optional: bool = False,
) -> list[Any]:
    if values is None:
        return [None] * n
    values_once = trailing_separator_dropped(values)
    if broadcast and len(values_once) == 1:  # 'NHWC;': one value for every input, as without the ';'
        return values_once * n
    if len(fitted := trailing_separator_dropped(values, n)) == n:
        return fitted
    values = values_once
    if trailing_optional and len(values) < n:  # the inputs left out take the model's own (static) shape
        return [*values, *([None] * (n - len(values)))]
    if broadcast and len(values) == 1:
        return values * n
    single = " (or a single value for all inputs)" if broadcast else ""
    # A featuremap or data_scale input has no mean: users leave it out instead of writing None.
    skip = " ('None' for an input that takes none)" if key in ("mean_value", "scale_value") else ""
    raise group_error(
        group,
        f"'{key}' has {len(values)} value(s) but '{ref}' has {n}; give one "
        f"value per input, in input_name order, separated by ';'{single}{skip}",
    )


def channels_of(spec: InputSpec) -> int | None:
    """Channel count implied by the input type, else by the shape and layout."""
    if spec.type_train == "gray":
        return 1
    if spec.type_train != "featuremap":
        return 3
    if spec.shape is not None and len(spec.shape) == 4 and spec.layout_train in LAYOUTS:
        return spec.shape[1] if spec.layout_train == "NCHW" else spec.shape[3]
    return None


def check_input_channels(spec: InputSpec, channels: int) -> None:
    """Raise ConfigError unless mean/scale give 1 value or one per channel.

    Called by the loader when the channel count is known from the config, and by
    the parse stage once the model has told it the real channel count.
    """
    for key, values in (("mean_value", spec.mean), ("scale_value", spec.scale)):
        if values is not None and len(values) not in (1, channels):
            raise group_error(
                IN,
                f"'{key}' of {label(spec.name)} has {len(values)} values but the input has "
                f"{channels} channel(s); give 1 value (all channels) or "
                f"{channels} values separated by spaces",
            )


def check_even_size(spec: InputSpec, source: str) -> None:
    """nv12/yuv444 need an even height and width (``source``: where the shape came from)."""
    shape = spec.shape or []
    if spec.type_rt in ("nv12", "yuv444") and len(shape) == 4 and spec.layout_train in LAYOUTS:
        h, w = (shape[2], shape[3]) if spec.layout_train == "NCHW" else (shape[1], shape[2])
        if h % 2 or w % 2:
            raise group_error(
                IN,
                f"{label(spec.name)}: input_type_rt {spec.type_rt} needs an even height and "
                f"width, but {source} has H={h}, W={w}; use even sizes (set input_shape)",
            )


def check_layout_fits(spec: InputSpec, source: str) -> None:
    """An image input whose channel count sits where the other layout keeps it has the wrong input_layout_train.

    Left alone the mix-up surfaces later as an odd height for nv12 or a channel count of 32 for rgb, with a fix
    about input_shape that does not help. ``source``: where the shape came from.
    """
    shape = spec.shape or []
    if spec.is_featuremap or len(shape) != 4 or spec.layout_train not in LAYOUTS:
        return
    want = channels_of(spec)
    channel_axis = {"NCHW": 1, "NHWC": 3}
    other = "NHWC" if spec.layout_train == "NCHW" else "NCHW"
    if shape[channel_axis[spec.layout_train]] != want and shape[channel_axis[other]] == want:
        raise group_error(
            IN,
            f"{label(spec.name)}: input_layout_train {spec.layout_train} does not fit {source}, which looks "
            f"{other} ({want} channel(s) for input_type_train {spec.type_train}); set input_layout_train: {other}",
        )


# The pyramid and the resizer are image hardware: they hand the model nv12 frames (gray: the Y plane).
CAMERA_SOURCES = ("pyramid", "resizer")
CAMERA_TYPES = ("nv12", "gray")
# The resizer crops and scales regions of interest up to this many pixels (seed 004, input_source).
RESIZER_MAX_PIXELS = 18432


def check_input_source(spec: InputSpec, source: str | None, shape_from: str = "input_shape") -> None:
    """``source``: the input_source configured for ``spec`` (None: the default, always valid)."""
    if source not in CAMERA_SOURCES:
        return
    if spec.type_rt not in CAMERA_TYPES:
        raise group_error(
            "compiler_parameters",
            f"input_source {source} of {label(spec.name)} delivers nv12 or gray images, but its "
            f"input_type_rt is {spec.type_rt}; use input_source ddr for it (or input_type_rt nv12/gray)",
        )
    shape = spec.shape or []
    if source == "resizer" and len(shape) == 4 and spec.layout_train in LAYOUTS:
        h, w = (shape[2], shape[3]) if spec.layout_train == "NCHW" else (shape[1], shape[2])
        if h * w >= RESIZER_MAX_PIXELS:
            raise group_error(
                "compiler_parameters",
                f"input_source resizer of {label(spec.name)} needs H*W below {RESIZER_MAX_PIXELS}, but "
                f"{shape_from} gives {h}x{w} = {h * w}; use input_source pyramid or ddr, or a smaller input",
            )


def _check_shape(spec: InputSpec, label: str, batch: int) -> None:
    shape = spec.shape
    if shape is None:
        return
    text = "x".join(map(str, shape))
    if not spec.is_featuremap:
        if len(shape) != 4 or spec.layout_train not in LAYOUTS:
            raise group_error(
                IN,
                f"{label}: input_shape '{text}' must be 4-D ({spec.layout_train}) "
                f"for input_type_train {spec.type_train}; use featuremap for "
                f"other inputs",
            )
        c = shape[1] if spec.layout_train == "NCHW" else shape[3]
        want = channels_of(spec)
        if c != want:
            # given in the other layout: name the shape meant (input_shape is in the model's own layout)
            nchw = spec.layout_train == "NCHW"
            meant = [shape[0], shape[3], shape[1], shape[2]] if nchw else [shape[0], shape[2], shape[3], shape[1]]
            fix = (f"; in {spec.layout_train} that shape is '{'x'.join(map(str, meant))}'"
                   if (shape[3] if nchw else shape[1]) == want else "; check input_shape and input_layout_train")
            raise group_error(
                IN,
                f"{label}: input_shape '{text}' has {c} channel(s) in layout "
                f"{spec.layout_train} but input_type_train {spec.type_train} has "
                f"{want}{fix}",
            )
    check_even_size(spec, f"input_shape '{text}'")
    if batch > 1 and shape[0] != 1:
        raise group_error(
            IN,
            f"input_batch {batch} needs the first dimension of input_shape to be "
            f"1, but {label} has '{text}'; set input_batch: 1 or make it 1",
        )


def _warn_featuremap_layout_rt(spec: InputSpec) -> None:
    """The .bin takes a featuremap in its input_layout_train layout: no input stage rearranges it (only pictures
    go through the resizer/pyramid path that input_layout_rt describes)."""
    if spec.is_featuremap and spec.layout_rt and spec.layout_train in LAYOUTS and spec.layout_rt != spec.layout_train:
        logger.warning("%s: input_layout_rt applies to picture inputs; this featuremap input is fed in its "
                       "input_layout_train layout %s, so input_layout_rt %s is ignored", label(spec.name),
                       spec.layout_train, spec.layout_rt)


def _check_input(spec: InputSpec, label: str, batch: int, march: str) -> None:
    allowed = ALLOWED_RT_FOR_TRAIN[spec.type_train]
    if spec.type_rt not in allowed:
        raise group_error(
            IN,
            f"{label}: input_type_rt '{spec.type_rt}' cannot feed "
            f"input_type_train '{spec.type_train}'; with input_type_train "
            f"{spec.type_train} use input_type_rt {' or '.join(allowed)}",
        )
    if not spec.is_featuremap and spec.layout_train not in LAYOUTS:
        raise group_error(
            IN, f"{label}: input_layout_train '{spec.layout_train}' is not valid; use NCHW or NHWC"
        )
    if spec.space_and_range == "bt601_video" and (
        spec.type_rt != "nv12" or spec.type_train not in ("rgb", "bgr")
    ):
        raise group_error(
            IN,
            f"{label}: input_space_and_range bt601_video needs input_type_rt nv12 "
            f"and input_type_train rgb or bgr; use 'regular'",
        )
    if march == "bernoulli2" and spec.type_rt == "yuv444" and spec.layout_rt == "NCHW":
        raise group_error(
            IN,
            f"{label}: bernoulli2 does not support input_type_rt yuv444 with "
            f"input_layout_rt NCHW; use NHWC",
        )
    if march == "bernoulli2" and spec.layout_rt == "NCHW" and spec.type_rt == "gray":
        # One channel: the same bytes either way (the vendor's own gray samples say NCHW); only the array shape
        # a Python caller passes differs.
        logger.info("%s: on bernoulli2 the converted model takes gray data as NHWC, the same bytes as NCHW for one "
                    "channel; arrays given to HB_ONNXRuntime need the shape NxHxWx1", label)
    elif march != "bernoulli2" and spec.type_rt == "nv12" and spec.layout_rt == "NCHW":
        # The vendor documents call input_layout_rt unnecessary for nv12 (the board feeds NV12 planes), so
        # it is often left over from an rgb config; SPEC §5 still gives it the quantized model's layout.
        logger.warning("%s: input_layout_rt NCHW with input_type_rt nv12: the board takes NV12 planes either way, "
                       "but the quantized ONNX model (HB_ONNXRuntime) takes this input as NCHW yuv444 as "
                       "input_layout_rt says; leave input_layout_rt out for the usual NHWC", label)
    elif march == "bernoulli2" and spec.layout_rt == "NCHW" and spec.type_rt not in ("featuremap", "nv12"):
        # The X3 artefacts take image inputs NHWC (SPEC §5); data laid out as configured would be misread.
        logger.warning("%s: on bernoulli2 the quantized model and the .bin take %s data in NHWC whatever "
                       "input_layout_rt says (the float and calibrated models take it NCHW, as configured); feed "
                       "them NHWC (hrt_model_exec model_info shows the layout)", label, spec.type_rt)
    _check_shape(spec, label, batch)
    if spec.shape is not None and featuremap_norm_refused(spec):
        raise group_error(IN, f"{label}: {FEATUREMAP_NORM_REFUSED}")
    for key, values, users in (
        ("mean_value", spec.mean, USES_MEAN),
        ("scale_value", spec.scale, USES_SCALE),
    ):
        if spec.norm_type in users and values is None:
            raise group_error(
                IN,
                f"{label}: norm_type {spec.norm_type} needs '{key}'; give it "
                f"(one number, or one per channel separated by spaces)",
            )
    channels = channels_of(spec)
    if channels is not None:
        check_input_channels(spec, channels)


FEATUREMAP_NORM_REFUSED = "a featuremap input that is not 4-D takes no preprocessing; set norm_type to no_preprocess"


def featuremap_norm_refused(spec: InputSpec) -> bool:
    """Whether ``spec`` asks for a normalisation of a featuremap whose shape (given, or the model's) is not 4-D.
    Normalisation is per channel of a map (docs/hb_mapper.md); left as it was, it would be silently dropped.
    Checked on the config where input_shape gives the shape, at parse where the model does."""
    return spec.is_featuremap and spec.shape is not None and len(spec.shape) != 4 and \
        spec.norm_type != "no_preprocess"


def _drop_unused(spec: InputSpec, label: str) -> None:
    # Vendor templates often keep e.g. a mean_value next to norm_type data_scale; the
    # value has no effect there, so it is dropped (with a warning) rather than rejected.
    if spec.mean is not None and spec.norm_type not in USES_MEAN:
        logger.warning("%s: mean_value is ignored because norm_type is %s", label, spec.norm_type)
        spec.mean = None
    if spec.scale is not None and spec.norm_type not in USES_SCALE:
        logger.warning("%s: scale_value is ignored because norm_type is %s", label, spec.norm_type)
        spec.scale = None


def build_inputs(
    ip: dict[str, Any], cal: dict[str, Any], cal_dirs: list[Path | None] | None, march: str
) -> list[InputSpec]:
    """``ip``/``cal``: validated input/calibration groups; ``cal_dirs``: resolved cal_data_dir."""
    names = ip.get("input_name")
    names = trailing_separator_dropped(names) if names else names
    n, ref = (
        (len(names), "input_name")
        if names
        else (len(trailing_separator_dropped(ip["input_type_train"])), "input_type_train")
    )
    if names is None and n > 1:
        raise group_error(
            IN,
            f"'input_name' is required when the config describes {n} inputs; "
            f"list the model's input names separated by ';'",
        )
    names = _per_input(names, "input_name", n, ref)
    if n > 1 and (None in names or len(set(names)) != n):
        raise group_error(
            IN,
            f"'input_name' must list {n} different, non-empty names; "
            f"got {'; '.join(str(x or '') for x in names)}",
        )
    col = {
        key: _per_input(ip.get(key), key, n, ref, trailing_optional=key == "input_shape")
        for key in (
            "input_type_train",
            "input_layout_train",
            "input_type_rt",
            "input_shape",
            "norm_type",
            "mean_value",
            "scale_value",
        )
    }
    for key in ("input_layout_rt", "input_space_and_range"):
        col[key] = _per_input(ip.get(key), key, n, ref, broadcast=True)
    cal_types = _per_input(
        cal.get("cal_data_type"),
        "cal_data_type",
        n,
        ref,
        group="calibration_parameters",
        broadcast=True,
    )
    dirs = _per_input(cal_dirs, "cal_data_dir", n, ref, group="calibration_parameters")
    # One input_layout_rt for several inputs is meant for the pictures among them; the featuremaps need no warning.
    given = ip.get("input_layout_rt")
    layout_rt_shared = n > 1 and isinstance(given, list) and len(trailing_separator_dropped(given)) == 1  # 'NHWC;'
    specs: list[InputSpec] = []
    for i in range(n):
        for key in ("input_type_train", "input_layout_train", "input_type_rt"):
            if col[key][i] is None:
                raise group_error(
                    IN, f"'{key}' is empty for {label(names[i])}; every input needs one"
                )
        spec = InputSpec(
            name=names[i],
            shape=col["input_shape"][i],
            type_train=col["input_type_train"][i],
            layout_train=col["input_layout_train"][i],
            type_rt=col["input_type_rt"][i],
            layout_rt=col["input_layout_rt"][i],
            space_and_range=col["input_space_and_range"][i] or "regular",
            norm_type=col["norm_type"][i] or "no_preprocess",
            mean=col["mean_value"][i],
            scale=col["scale_value"][i],
            cal_data_dir=dirs[i],
            cal_data_type=cal_types[i],
        )
        _drop_unused(spec, label(spec.name))
        _check_input(spec, label(spec.name), ip["input_batch"], march)
        if not layout_rt_shared:
            _warn_featuremap_layout_rt(spec)
        specs.append(spec)
    return specs
