"""Checks on the paths a tool writes, made before it writes anything.

A folder that is a file, a missing parent, no permission, a name too long, or an
output that is one of the tool's own inputs is one ERROR line, not a traceback and
not a replaced input.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # numpy only for write_array: a tool's start-up stays light (Ctrl-C there is a traceback)
    import numpy as np

from hbtools.errors import ResourceError, UsageError, os_error

log = logging.getLogger("hbtools")

NAME_MAX = 255  # bytes in one file name on Linux file systems (ext4, xfs, btrfs, tmpfs)
# An artefact a run replaces waits under this prefix in the staging folder until the commit's moves are done
# (``runs.transaction``): no artefact of a run may be named so.
REPLACED_PREFIX = ".old-"
_HASH_LENGTH = 8  # hex digits of the hash that ends a cut name


def output_dir(path: str | Path, option: str, *, create: bool = True) -> Path:
    """Check (and with ``create`` make) the output folder ``path``, or say in one line why not.

    Without ``create`` the folder is made later, when the first file is written, so a
    run that fails on its arguments leaves no empty folder behind.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ResourceError(f"{option} '{path}' is a file, not a folder; give a folder path")
    if not create:
        existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor or "."))
        if existing.exists() and not existing.is_dir():
            raise ResourceError(f"{option} '{path}': '{existing}' is a file, not a folder; correct the path")
        if existing.exists() and not os.access(existing, os.W_OK | os.X_OK):
            raise ResourceError(f"{option} '{path}': '{existing}' is not writable; choose a folder you may write")
        _probe_creatable(path, option)
        return path
    create_dir(path, f"the {option} folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ResourceError(f"{option} '{path}' is not writable; choose a folder you may write")
    return path


def _probe_creatable(path: Path, option: str) -> None:
    """Create the missing folders of ``path`` and remove them again, or say why they cannot be made.

    ``os.access`` answers yes for root in /proc or /sys, where mkdir still fails; only trying tells.
    """
    missing = [p for p in (path, *path.parents) if not p.exists() and not p.is_symlink()]
    if not missing:
        return
    try:
        create_dir(path, f"the {option} folder")
    finally:
        for folder in missing:  # deepest first; a folder made meanwhile by someone else is not empty and stays
            with contextlib.suppress(OSError):
                folder.rmdir()


def create_dir(path: Path, what: str, fix: str | None = None) -> None:
    """``mkdir -p`` that names a dangling symbolic link on the way instead of saying 'File exists'."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        link = next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()), None)
        if link is not None:
            raise ResourceError(
                f"cannot create {what} '{path}': '{link}' is a symbolic link to '{os.readlink(link)}', which "
                "does not exist; create the link's target or correct the path"
            ) from None
        raise os_error(exc, f"cannot create {what}", fix) from None


def output_file(path: str | Path, option: str, inputs: Iterable[str | Path] = ()) -> Path:
    """Check that ``path`` can be written as a new file and is none of ``inputs``."""
    path = Path(path)
    if "\0" in str(path):
        raise UsageError(f"{option} '{path!s}' contains a NUL character; give a plain file path")
    for given in inputs:
        if _same_file(path, Path(given)):
            raise UsageError(f"{option} '{path}' is also an input ({given}); write the result to another file")
    if path.is_dir():
        raise ResourceError(f"{option} '{path}' is a folder; give a file name")
    parent = path.parent
    if not parent.exists():
        raise ResourceError(f"{option} '{path}': the folder '{parent}' does not exist; create it first")
    if not parent.is_dir():
        raise ResourceError(f"{option} '{path}': '{parent}' is a file, not a folder; correct the path")
    if len(path.name.encode()) > 255:
        raise ResourceError(f"{option} '{path.name[:40]}...' is too long a file name; use a shorter one")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        if _read_only(parent):  # os.access says no there too, but no permission would help
            raise ResourceError(f"{option} '{path}' cannot be written: '{parent}' is on a read-only file system; "
                                "choose a path on a writable one")
        raise ResourceError(f"{option} '{path}' cannot be written (no permission); choose another path")
    return path


def _read_only(folder: Path) -> bool:
    """Whether ``folder`` lies on a file system mounted read-only."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.abspath(a) == os.path.abspath(b)


# What a writer puts into the temp file: the bytes (one or several chunks), or a function that writes to the
# open binary file (``fig.savefig``, ``np.save``) for libraries that want a file rather than bytes.
Writer = Callable[[BinaryIO], object]
Content = bytes | str | Iterable[bytes] | Writer


def replace_atomically(path: str | Path, content: Content) -> None:
    """Write ``content`` to ``path`` whole or not at all: a temp file beside it (usual umask mode), synced,
    then a rename. On any failure the temp file is removed, a file that was there stays as it was, and an
    ``OSError`` propagates naming ``path`` (a failed ``write`` names no file of its own; a short write,
    numpy's "4096 requested and 2016 written", becomes ENOSPC: the disk filled up under it)."""
    path = Path(path)
    tmp = path.with_name(_temp_name(path.name))
    try:
        # os.open with 0o666 (not mkstemp's 0o600) so the result gets the usual umask mode.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as fh:  # close() reports what a buffered write on a full disk deferred
            _fill(fh, content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _naming(exc, path, tmp) from None
    except BaseException:  # incl. KeyboardInterrupt: never leave the temp file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # persist the rename; not possible on every OS
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _temp_name(name: str) -> str:
    """A hidden temp file name beside ``name``, within the file name limit even when ``name`` is just within it."""
    tail = f".{secrets.token_hex(4)}.tmp"
    start = name.encode()[:NAME_MAX - 1 - len(tail)].decode("utf-8", "ignore")
    return f".{start}{tail}"


def _fill(fh: BinaryIO, content: Content) -> None:
    if callable(content):
        content(fh)
    elif isinstance(content, str):
        fh.write(content.encode("utf-8"))
    elif isinstance(content, bytes):
        fh.write(content)
    else:
        for chunk in content:
            fh.write(chunk)


def _naming(exc: OSError, path: Path, tmp: Path) -> OSError:
    """``exc`` about ``path``, not about our temp file or no file at all; a short write as a full disk."""
    if exc.errno is None:  # numpy's short write (fwrite wrote less) carries no errno: the disk filled up
        return OSError(errno.ENOSPC, f"could not write all of it ({exc})", str(path))
    if exc.filename is None or str(exc.filename) == str(tmp):
        return OSError(exc.errno, exc.strerror, str(path))
    return exc  # about another file, e.g. one the writer function read


def write_file(path: str | Path, content: Content) -> Path:
    """``replace_atomically``, with a failure (a full disk, no permission) as one ``ResourceError``
    naming ``path`` (exit 3). ``content``: bytes, text (written as UTF-8), chunks of bytes, or a function
    writing to the open binary file (``lambda fh: fig.savefig(fh, format="png")``)."""
    path = Path(path)
    try:
        replace_atomically(path, content)
    except OSError as exc:
        raise os_error(exc, "cannot write") from None
    return path


def write_array(path: str | Path, array: np.ndarray) -> Path:
    """``array.tofile(path)`` that fails loudly: numpy's tofile drops a small write on a full disk silently."""
    import numpy as np

    return write_file(path, np.ascontiguousarray(array).tobytes())


def file_names(names: Iterable[str], *, prefix: str = "", suffix: str = "", fallback: str = "tensor") -> dict[str, str]:
    """A distinct file name ``prefix + stem + suffix`` for each of the tensor, node or input ``names`` that a
    tool writes into one folder.

    The stem is the name with every character but letters, digits, '.', '_' and '-' turned into '_', without
    a '.' at either end (no hidden file, no '..'; ``fallback`` when nothing is left). A stem that would make
    the file name longer than ``NAME_MAX`` bytes is cut and ends in '_' and a hash of the whole name. When
    names share a stem, one that is its own stem keeps it, and the others get '_1', '_2', ... in their order.
    Each name so changed is logged (DEBUG, the tool's log file) with its file, and one INFO line counts them.
    """
    room = NAME_MAX - len(prefix.encode()) - len(suffix.encode())
    bases = {name: _mapped(name) or fallback for name in names}
    # 'r_0' keeps r_0.npy beside an 'r:0' met first: a plain name's file is always the name itself
    ordered = sorted(bases, key=lambda name: bases[name] != name)
    stems: dict[str, str] = {}
    used: set[str] = set()
    for name in ordered:
        base, count = bases[name], 0
        stem = _within(base, name, room)
        while stem in used:
            count += 1
            stem = _within(base, name, room - len(f"_{count}")) + f"_{count}"
        stems[name] = stem
        used.add(stem)
    files = {name: f"{prefix}{stems[name]}{suffix}" for name in bases}
    _log_changed([name for name in bases if stems[name] != bases[name]], files)
    return files


def file_stem(name: str) -> str:
    """What ``file_names`` makes of ``name`` before any cut: the stem of the files named after it."""
    return _mapped(name)


def _mapped(name: str) -> str:
    """``name`` with what a file name should not hold as '_' ('/', ':', spaces) and no '.' at either end."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip(".")


def _within(stem: str, name: str, room: int) -> str:
    """``stem`` if it fits in ``room`` bytes, else its start and a hash of ``name`` (cut at a character)."""
    encoded = stem.encode()
    if len(encoded) <= room:
        return stem
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LENGTH]
    start = encoded[:room - _HASH_LENGTH - 1].decode("utf-8", "ignore")
    return f"{start}_{digest}"


def _log_changed(changed: list[str], files: dict[str, str]) -> None:
    # The full names go to the log file only: a TFLite model's fused names can be hundreds, each hundreds long.
    for name in changed:
        log.debug("file name of '%s': '%s'", name, files[name])
    if changed:
        log.info("%d name(s) too long for a file name (%d bytes) or sharing one with another name got a file "
                 "name of their own, e.g. '%s': '%s'; the log file lists them all", len(changed), NAME_MAX,
                 _shortened(changed[0]), files[changed[0]])


def _shortened(name: str, most: int = 80) -> str:
    return name if len(name) <= most else f"{name[:most]}..."
