"""hb_pack: several ``.bin`` models in one packed file."""

from __future__ import annotations

import logging
from pathlib import Path

from hbtools.errors import HbError
from hbtools.march.profiles import PROFILES, get_profile
from hbtools.runtime.binfile import FORMAT_VERSION, BinFile, read_bin, write_bin
from hbtools.runtime.runtime_model import load

log = logging.getLogger("hbtools")


def warn_if_newer(f: BinFile) -> None:
    """Rewriting drops what a newer minor version added (docs/bin_format.md)."""
    if f.version > FORMAT_VERSION:
        log.warning("%s has format version %d.%d; rewriting it as %d.%d drops anything newer",
                    f.path, *f.version, *FORMAT_VERSION)


def pack(paths: list[str | Path], output: str | Path) -> Path:
    """Write the models of ``paths`` (each a single, unpacked model) into ``output``."""
    if len(paths) < 2:
        raise HbError("hb_pack needs at least two models", hint="hb_pack A.bin B.bin -o packed.bin")
    models, marches = [], {}
    for path in paths:
        f = read_bin(path)
        if f.packed:
            raise HbError(f"model: {path} is a packed model, it can not be packed again!")
        warn_if_newer(f)
        checked = load(f.models[0], f.path)  # refuse to pack a model the tools could not use
        marches.setdefault(checked.march.lower(), path)
        models.append(f.models[0])
    if len(marches) > 1:  # one board loads the packed file, and its BPU runs one instruction set
        built = ", ".join(f"{path} for {get_profile(march).label if march in PROFILES else march or 'an unknown march'}"
                          for march, path in marches.items())
        raise HbError(f"the models were built for different BPUs ({built}); a packed file runs on one board",
                      hint="pack only models converted with the same march")
    names = [m.name for m in models]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise HbError(f"two models are both named {', '.join(map(repr, dup))}; a packed file needs unique names",
                      hint="rebuild one of them with another output_model_file_prefix")
    write_bin(output, models, packed=True)
    return Path(output)
