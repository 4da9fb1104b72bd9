"""A makertbin run as a transaction on its ``working_dir`` (SPEC §6).

The artefacts are built in a staging folder inside ``working_dir`` and moved into
place only after all of them were written. The commit point is one atomic rename
of a marker file into the staging folder: before it, an interrupted run is rolled
back (the staging folder is deleted by the next run); after it, the moves are
finished by whoever gets there first (the run itself, or the next run if this one
was killed mid-move). Each move is an ``os.replace`` on the same filesystem, so a
reader sees either the old or the new file, never a partial one.

One run per ``working_dir`` at a time: an exclusive ``flock`` on a lock file that
holds the owner's pid. The kernel drops the lock when its process dies, so the
lock of a killed run is simply taken over.

A set (one ``output_model_file_prefix``) records its entries in a hidden manifest, moved
in with them: the next set of that name removes what the previous one had and it does not
make (a ``calibration_data`` dump, the pages of more subgraphs), so no stale part is left
next to a model it does not belong to. Before the commit, every entry is checked to be
replaceable, and no input of the run may lie where an entry goes or goes away.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from hbtools.errors import ConfigError, HbError, ResourceError, os_error
from hbtools.outputs import REPLACED_PREFIX, create_dir
from hbtools.runs.signals import signals_deferred, signals_ignored

log = logging.getLogger("hbtools")

LOCK_NAME = ".hbtools.lock"
STAGING_NAME = ".hbtools_staging"
_COMMITTED = ".committed"  # inside the staging folder: the entries to move in and to remove
_OLD = REPLACED_PREFIX  # a replaced or removed entry waits here until the moves are done
_MANIFEST = ".hbtools_set_{}.json"  # in working_dir: the entries of the set of that name


def final_path(path: Path) -> Path:
    """Where ``path``, written inside a run's staging folder, lands once the run completes (messages name that)."""
    parts = path.parts
    if STAGING_NAME not in parts:
        return path
    k = parts.index(STAGING_NAME)
    return Path(*parts[:k], *parts[k + 1:])


class Destination(NamedTuple):
    """How messages name the folder a set goes to, and what the user may do instead."""

    option: str  # the folder as the user gave it: "working_dir", "save_dir"
    elsewhere: str  # how to write somewhere else
    renamed: str = ""  # what else avoids a name clash (makertbin: its output_model_file_prefix)


WORKING_DIR = Destination("working_dir", "choose another working_dir", "output_model_file_prefix")


@contextlib.contextmanager
def artefact_transaction(working_dir: Path, *, set_name: str | None = None, inputs: Sequence[Path] = (),
                         committed: Callable[[], None] | None = None,
                         folder: Destination = WORKING_DIR, keep_others: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder; on success move everything in it into ``working_dir``.

    Anything raised inside the block (KeyboardInterrupt included) deletes the staging
    folder and leaves ``working_dir`` as it was. ``set_name`` names the set (its previous
    entries that this one does not make are removed); ``keep_others``: a file inside one of its
    folders that no set wrote is kept, carried into the new folder (runall's step folders, where users
    keep figures of single debugger calls; a tool's own dump folder is replaced whole, since files an
    older version wrote there cannot be told from a user's); ``inputs`` are the run's input files
    and folders, which the commit never replaces or removes. ``committed`` runs once the new set is in
    place, before a Ctrl-C held back meanwhile is acted on (with a WARNING that the set was replaced).
    ``folder``: how messages name ``working_dir`` (another tool's result folder).
    """
    made = [p for p in (working_dir, *working_dir.parents) if not p.exists() and not p.is_symlink()]
    create_dir(working_dir, folder.option, f"{folder.elsewhere} in a folder you can write")
    try:
        with _transaction(working_dir, set_name, inputs, committed, folder, keep_others) as staging:
            yield staging
    except BaseException:
        _remove_made(made)
        raise


def _remove_made(made: list[Path]) -> None:
    """The folders a failed run created for its results, deepest first, if they hold nothing but its lock file:
    a failed run into a new folder leaves no folder behind."""
    for made_folder in made:
        with contextlib.suppress(OSError):
            if {p.name for p in made_folder.iterdir()} <= {LOCK_NAME}:
                (made_folder / LOCK_NAME).unlink(missing_ok=True)
            made_folder.rmdir()  # fails, and stays, when something else is in it


@contextlib.contextmanager
def _transaction(working_dir: Path, set_name: str | None, inputs: Sequence[Path],
                 committed: Callable[[], None] | None, folder: Destination, keep_others: bool) -> Iterator[Path]:
    with _lock(working_dir, folder):
        recover(working_dir)
        staging = working_dir / STAGING_NAME
        try:
            staging.mkdir()
        except OSError as exc:  # name the folder the user chose, not our hidden staging folder
            raise _staging_error(exc, working_dir, folder) from None
        try:
            yield staging
            entries = _entries(staging)
            _check_replaceable(staging, working_dir, entries, inputs, folder)
            others = _other_sets(working_dir, set_name)
            stale = [n for n in _stale(working_dir, set_name, entries, inputs)
                     if not any(n in listed for listed in others.values())]
            if set_name is not None:
                # With keep_others, the files inside its folders too: a file there that no run wrote is carried
                # over (below).
                written = entries + (_files_inside(staging, entries) if keep_others else [])
                (staging / _MANIFEST.format(set_name)).write_text(json.dumps(written), encoding="utf-8")
                # An entry another set listed (the calibration_data dump of two prefixes in one working_dir) is
                # this set's now: that set's next run must not remove it, nor its model be paired with it.
                for manifest, listed in others.items():
                    if any(n in entries for n in listed):
                        (staging / manifest).write_text(json.dumps([n for n in listed if n not in entries]),
                                                        encoding="utf-8")
            if keep_others and set_name is not None:  # without a manifest nothing tells ours from the user's
                folders = [n for n in entries if (staging / n).is_dir()]
                _carry_over(working_dir, staging, _foreign_files(working_dir, folders), folder)
            with signals_deferred(str(working_dir)):  # Ctrl-C amid the moves would leave a mixed set
                _commit(staging, stale)
                _roll_forward(staging, working_dir)
                if committed is not None:
                    committed()
        except BaseException as exc:
            if not (staging / _COMMITTED).exists():
                with signals_ignored():
                    shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError) and _is_staging_write(exc, staging):
                raise _staging_error(exc, working_dir, folder) from None
            if isinstance(exc, HbError) and f"{staging}{os.sep}" in str(exc):  # a tool's write error: where it goes
                exc.args = (str(exc).replace(f"{staging}{os.sep}", f"{working_dir}{os.sep}"), *exc.args[1:])
            raise


def _is_staging_write(exc: OSError, staging: Path) -> bool:
    """Whether ``exc`` came from writing the artefacts (a full disk names no file on ``write``)."""
    if exc.filename is None:
        return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
    return str(exc.filename).startswith(str(staging))


def _staging_error(exc: OSError, working_dir: Path, folder: Destination) -> ResourceError:
    # The user never sees the staging folder: name working_dir, and say why a disk that held the
    # previous set may not hold the next one (both are on disk until the new set replaces the old).
    fix = None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (f"the disk is full; the new results are written next to the previous ones before they replace "
               f"them, so {folder.option} needs room for both: free some space or {folder.elsewhere}")
    named = OSError(exc.errno, exc.strerror, str(working_dir))
    return os_error(named, f"cannot write the results in {folder.option}", fix)


def warn_if_mid_commit(path: str | os.PathLike[str]) -> None:
    """A WARNING when the folder of the artefact ``path`` holds a commit a killed makertbin did not finish: its
    files may come from two runs until the next run in that folder finishes the moves."""
    if (Path(path).parent / STAGING_NAME / _COMMITTED).is_file():
        log.warning("%s lies in a folder where a run was killed while it moved its results into place: the files "
                    "there may come from two runs. Run makertbin (or the tool that wrote them) again there: it "
                    "finishes the moves first", path)


def recover(working_dir: Path) -> None:
    """Finish or undo what a killed run left behind (call with the lock held)."""
    staging = working_dir / STAGING_NAME
    if not staging.exists():
        return
    if (staging / _COMMITTED).is_file():
        log.info("finishing the interrupted commit of a previous run in %s", working_dir)
        _roll_forward(staging, working_dir)
    else:
        log.info("removing the staging folder an interrupted run left in %s", working_dir)
        shutil.rmtree(staging, ignore_errors=True)


def _entries(staging: Path) -> list[str]:
    """What the run wrote into ``staging``: every entry but the transaction's own (a prefix may start with '.')."""
    return sorted(p.name for p in staging.iterdir()
                  if not (p.name.startswith(_OLD) or p.name in (_COMMITTED, f"{_COMMITTED}.tmp")))


def _holds(path: Path, inputs: Sequence[Path]) -> Path | None:
    """The first of ``inputs`` that is ``path`` or lies inside it (a symbolic link at ``path`` is replaced,
    not what it points to)."""
    where = os.path.join(os.path.realpath(path.parent), path.name)
    for given in inputs:
        real = os.path.realpath(given)
        if real == where or real.startswith(where.rstrip(os.sep) + os.sep):
            return Path(given)
    return None


def check_inputs_outside(working_dir: Path, names: Sequence[str], inputs: Sequence[Path],
                         folder: Destination = WORKING_DIR) -> None:
    """Refuse a run one of whose ``inputs`` lies where it writes one of ``names`` (before any work, with
    the names known then, and again at the commit with every entry)."""
    for name in names:
        held = _holds(working_dir / name, inputs)
        if held is not None:
            renamed = f" or {folder.renamed}" if folder.renamed else ""
            raise ConfigError(f"'{held}' is an input of this run and lies where it writes '{working_dir / name}'; "
                              "the run would replace it", hint=f"move it out of {folder.option}, or "
                                                              f"{folder.elsewhere}{renamed}")


def _files_inside(root: Path, names: Sequence[str]) -> list[str]:
    """The files, symbolic links and empty folders under the folders ``names`` of ``root`` (links not
    followed), as paths relative to it with '/'."""
    found: list[str] = []
    for name in names:
        top = root / name
        if top.is_symlink() or not top.is_dir():
            continue
        for folder, dirs, files in os.walk(top):
            here = Path(folder)
            links = [d for d in dirs if (here / d).is_symlink()]
            found += [(here / f).relative_to(root).as_posix() for f in [*files, *links]]
            if not dirs and not files and here != top:
                found.append(here.relative_to(root).as_posix())
    return sorted(found)


def _foreign_files(working_dir: Path, names: Sequence[str]) -> list[str]:
    """The files inside the folders ``names`` of ``working_dir`` that no run of a set there wrote (the user's
    notes beside runall's tables, a figure of another debugger call), as paths relative to it with '/'."""
    known = {n for manifest in working_dir.glob(_MANIFEST.format("*")) for n in _listed(manifest)}
    foreign: list[str] = []
    for name in names:
        if not (working_dir / name).is_dir() or (working_dir / name).is_symlink():
            continue
        if name in known and not any(n.startswith(f"{name}/") for n in known):
            continue  # listed by a version that recorded no files inside: all of it its own
        foreign += [f for f in _files_inside(working_dir, [name]) if f not in known]
    return foreign


def _carry_over(working_dir: Path, staging: Path, foreign: list[str], folder: Destination) -> None:
    """Copy ``foreign`` files into the staged folders that replace theirs (a staged file of the same name wins):
    a commit replaces a folder whole, and they are not this run's to remove. Copies, not moves: a run stopped
    before its commit point leaves the originals where they were."""
    for rel in foreign:
        blocked = next((p for p in (staging / rel).parents if p != staging and p.is_relative_to(staging)
                        and p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise ResourceError(f"{folder.option} holds '{working_dir / rel}', inside a folder where this run writes "
                                f"its file '{final_path(blocked)}'; nothing was replaced",
                                hint=f"move '{working_dir / rel}' elsewhere, or {folder.elsewhere}")
    for rel in foreign:
        source, target = working_dir / rel, staging / rel
        if target.exists() or target.is_symlink():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_dir():  # an empty folder
            target.mkdir()
        else:
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)


def _listed(manifest: Path) -> list[str]:
    try:
        listed = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [n for n in listed if isinstance(n, str)] if isinstance(listed, list) else []


def _check_replaceable(staging: Path, working_dir: Path, entries: list[str], inputs: Sequence[Path],
                       folder: Destination) -> None:
    """Refuse, before the commit, a move that would fail half-way through or destroy an input."""
    check_inputs_outside(working_dir, entries, inputs, folder)
    for name in entries:
        target = working_dir / name
        if not target.exists() or target.is_symlink():
            continue
        if target.is_dir() != (staging / name).is_dir():
            kind, wanted = ("a folder", "file") if target.is_dir() else ("a file", "folder")
            hint = f"remove or rename it, or {folder.elsewhere}" + (f" or {folder.renamed}" if folder.renamed else "")
            raise ResourceError(f"{folder.option} holds {kind} '{target}' where this run writes its {wanted} of that "
                                f"name; nothing was replaced", hint=hint)


def _other_sets(working_dir: Path, set_name: str | None) -> dict[str, list[str]]:
    """The entries of the other sets in ``working_dir``, by the file name of their manifest."""
    own = _MANIFEST.format(set_name) if set_name is not None else None
    return {path.name: _listed(path) for path in working_dir.glob(_MANIFEST.format("*")) if path.name != own}


def _stale(working_dir: Path, set_name: str | None, entries: list[str], inputs: Sequence[Path]) -> list[str]:
    """Entries of the previous set of ``set_name`` that this one does not make (inputs of the run stay).

    Without a manifest (a set of an older version, or none) nothing is known to remove; the paths of files
    inside the set's folders (``keep_others``) are no entries."""
    if set_name is None:
        return []
    previous = _listed(working_dir / _MANIFEST.format(set_name))
    return [n for n in previous if n not in entries and n and "/" not in n and os.sep not in n
            and n not in (".", "..") and (working_dir / n).exists() and _holds(working_dir / n, inputs) is None]


def _commit(staging: Path, stale: list[str] | None = None) -> None:
    entries = _entries(staging)
    for path in staging.rglob("*"):
        if path.is_file():
            _fsync(path)
    tmp = staging / f"{_COMMITTED}.tmp"
    tmp.write_text(json.dumps({"move": entries, "remove": stale or []}), encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, staging / _COMMITTED)  # the commit point
    _fsync(staging)


def _roll_forward(staging: Path, working_dir: Path) -> None:
    """Move the committed entries into place and the stale ones out; safe to repeat after an interruption."""
    moves, removals = _commit_plan(staging, working_dir)
    for name in moves:
        new, target, old = staging / name, working_dir / name, staging / f"{_OLD}{name}"
        if not new.exists() and not new.is_symlink():
            continue  # moved before the interruption
        if new.is_dir() and target.exists():
            # os.replace cannot put a folder over a non-empty one: set the old one aside first.
            os.replace(target, old)
        os.replace(new, target)
    for name in removals:
        target = working_dir / name
        if target.exists() or target.is_symlink():
            os.replace(target, staging / f"{_OLD}{name}")  # deleted with the staging folder
    _fsync(working_dir)
    shutil.rmtree(staging, ignore_errors=True)


def _commit_plan(staging: Path, working_dir: Path) -> tuple[list[str], list[str]]:
    """The names a committed run moves into ``working_dir`` and out of it, from its record. A record damaged
    from outside (written atomically, it is whole or absent otherwise) is an ERROR saying what to do, not a
    traceback on every later run in that folder."""
    record = staging / _COMMITTED
    try:
        plan = json.loads(record.read_text(encoding="utf-8"))
        moves, removals = (plan, []) if isinstance(plan, list) else (plan["move"], plan["remove"])
        names = [*moves, *removals]
        if not all(isinstance(n, str) and n and n not in (".", "..") and "/" not in n and "\0" not in n
                   for n in names):
            raise ValueError("it names something other than files of the folder")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HbError(f"the commit record '{record}' of an interrupted run is damaged ({exc}), so its artefacts "
                      f"cannot be put in place", hint=f"keep what you need from '{staging}' and '{working_dir}', "
                      f"then delete the folder '{staging}' and run again") from exc
    return moves, removals


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _lock(working_dir: Path, folder: Destination) -> Iterator[None]:
    path = working_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise os_error(exc, "cannot create the lock file",
                       f"make {folder.option} writable, or {folder.elsewhere}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            owner = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise ResourceError(
                f"{folder.option} '{working_dir}' is in use by another run (pid {owner}, lock {path}); wait for it "
                f"to finish or {folder.elsewhere}"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: named with the file, as every other write's failure is
            raise os_error(exc, f"cannot write the lock file '{path}'") from None
        try:
            yield
        finally:
            # The file stays: deleting it would let a waiting run lock an orphaned inode.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
