"""``hb_mapper checker``: will this model convert, and where does each node run?

Runs the conversion stages on a built-in config, with the slow parts cut down:
parse -> optimize -> calibrate (``skip``: max thresholds of one generated
sample, no method search, no bias correction) -> quantize. Nothing is written
but the log. The node table comes from the quantize stage's partition, the very
function makertbin uses, so both commands report the same placement for the
same model and config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hbtools.config.builtin import builtin_config
from hbtools.data.calibration import RandomCalibrationSource
from hbtools.errors import HbError
from hbtools.march.profiles import get_profile
from hbtools.pipeline import calibrate, optimize, parse, quantize
from hbtools.pipeline.compile import check_fits_a_bin
from hbtools.pipeline.quantize import QuantizedResult
from hbtools.quant import report
from hbtools.quant.plan import make_plan
from hbtools.quant.units import model_partition
from hbtools.runs.memory import check_memory

log = logging.getLogger("hbtools")

CHECK_SAMPLES = 1  # thresholds only need to exist for the quantizer to lower every op


def check(model_path: str | Path, model_type: str, march: str, input_shapes: list[tuple[str, str]],
          proto: str | Path | None = None) -> QuantizedResult:
    log.info("Start Model Check....")
    profile = get_profile(march)
    log.info("march: %s", profile.label)
    config = builtin_config(model_path, model_type, march, input_shapes, fast_perf=False,
                            working_dir=Path(".hb_check"), prefix="model", proto=proto)
    parsed = parse.run(config, checking=True)
    check_memory(parsed.model, [spec.shape for spec in parsed.inputs if spec.shape])
    log.info("Parsing the input model done")
    optimized = optimize.run(parsed.take_model(), profile)  # the original is not read again
    log.info("Model optimization done")
    partition = model_partition(optimized, profile, config)
    try:
        check_fits_a_bin(optimized, partition)
    except HbError as exc:  # the check goes on: the node table is what the user asked for
        log.warning("makertbin cannot compile this model: %s; %s", exc, exc.hint)
    plan = make_plan(optimized, partition, config, profile)
    source = RandomCalibrationSource(parsed.inputs, num_samples=CHECK_SAMPLES)
    cal = calibrate.run(optimized, plan, lambda: iter(source), len(source), calibration_type="skip",
                        allow_int16=profile.int16, bias_correction="off", generated=True)
    result = quantize.run(cal.model, config, profile)
    del cal, optimized, plan, partition  # the node table reads the result only
    log.info("Model quantization done")
    report.log_node_table(result)
    report.log_cpu_reasons(result.partition, result.origins)
    log.info("End Model Check")
    return result
