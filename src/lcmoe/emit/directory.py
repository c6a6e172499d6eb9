"""Putting a set of generated files at a directory without ever losing someone's data.

Rules (issue #30):

* A target that is a symlink, or exists and is not a directory, is refused.
* An existing non-empty directory is refused unless ``force``; with ``force`` only the files lcmoe
  wrote there before are replaced — those its manifest (``MANIFEST``: relative path → SHA-256)
  lists with an unchanged hash. Every other entry is kept (hard-linked into the new directory);
  a kept file whose name lcmoe would write, or a listed file someone edited, is refused.
* The new directory is built beside the target and swapped in by two renames with SIGINT, SIGTERM
  and SIGHUP held back, so an interrupt leaves the old directory or the new one. A run killed
  outright between the renames leaves the old one under ``.NAME.lcmoe-old-*``; the next write to
  the same target puts it back first (``recover``). No staging directory survives a write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from lcmoe.errors import LcmoeError

MANIFEST = ".lcmoe-manifest.json"
_STAGING, _OLD = "lcmoe-staging-", "lcmoe-old-"
_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@dataclass(frozen=True, slots=True)
class Installed:
    """What a write did: the files written, and the entries kept because lcmoe did not write them."""

    target: Path
    written: tuple[str, ...]
    kept: tuple[str, ...]
    replaced_directory: bool


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_target(target: Path, flag: str = "--emit") -> Path:
    """The absolute target path, refused when it cannot be a directory lcmoe may write."""
    text = str(target)
    if text.strip() in ("", ".", ".."):
        raise LcmoeError(
            flag, text, "must name a directory to write, not the current or parent directory", "e.g. --emit plan-out"
        )
    path = Path(os.path.abspath(target))
    if path.is_symlink():
        raise LcmoeError(flag, text, "is a symbolic link; lcmoe does not write through links", "name a real directory")
    if path.exists() and not path.is_dir():
        raise LcmoeError(flag, text, "exists and is not a directory", "name a new directory")
    cwd = Path.cwd()
    if path == cwd or path in cwd.parents or path.parent == path:
        raise LcmoeError(flag, text, "is the current directory or one of its parents", "name a new directory")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise LcmoeError(flag, text, f"lies under {parent}, which is a file", "name a directory elsewhere")
        if parent.exists():
            break
    return path


def not_empty_error(target: Path, names: list[str], flag: str = "--emit") -> LcmoeError:
    """The one sentence for a non-empty target written to without --force."""
    shown = ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
    return LcmoeError(
        flag,
        str(target),
        f"is not empty ({shown})",
        "name a new directory, or add --force to replace only the files lcmoe wrote there before (the others are kept)",
    )


def _old_manifest(target: Path) -> dict[str, str]:
    path = target / MANIFEST
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        files = json.loads(path.read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def _entries(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every non-directory entry under root, links not followed."""
    for folder, dirs, names in os.walk(root, followlinks=False):
        base = Path(folder)
        for name in names + [d for d in dirs if (base / d).is_symlink()]:
            path = base / name
            yield path.relative_to(root).as_posix(), path


def _classify(target: Path, new_files: Mapping[str, str], force: bool, flag: str) -> list[tuple[str, Path]]:
    """The entries of an existing ``target`` to keep; raises when the write would lose data."""
    existing = sorted(_entries(target))
    if not existing:
        return []
    old = _old_manifest(target)
    owned, keep, edited = [], [], []
    for rel, path in existing:
        if rel == MANIFEST:
            continue
        listed = old.get(rel)
        if listed is not None and path.is_file() and not path.is_symlink() and sha256(path.read_bytes()) == listed:
            owned.append(rel)
        elif listed is not None:
            edited.append(rel)
        else:
            keep.append((rel, path))
    user_names = [rel for rel, _ in keep] + edited
    if not force:
        raise not_empty_error(target, user_names or owned, flag)
    if edited:
        raise LcmoeError(
            flag,
            str(target),
            f"holds files lcmoe wrote that were edited since: {', '.join(edited[:8])}",
            "move them away or write to a new directory",
        )
    clashes = [rel for rel, _ in keep if rel in new_files or any(f.startswith(rel + "/") for f in new_files)]
    if clashes:
        raise LcmoeError(
            flag,
            str(target),
            f"holds files lcmoe did not write under names it writes: {', '.join(clashes[:8])}",
            "move them away or write to a new directory",
        )
    return keep


def _keep_into(staging: Path, keep: list[tuple[str, Path]]) -> None:
    """Hard-link (or copy, where links are refused) every kept entry into the staging tree."""
    for rel, path in keep:
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(path), dest)
        elif stat.S_ISREG(mode):
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
        else:
            raise LcmoeError("--emit", str(path), "is a special file lcmoe cannot keep", "move it away")


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP (delivered when the block ends) where the platform allows."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def recover(target: Path) -> None:
    """Undo what a killed write left: put a moved-aside old directory back when the target is
    missing, and delete staging directories and leftover old copies."""
    parent, prefix = target.parent, f".{target.name}."
    if not parent.is_dir():
        return
    for entry in sorted(parent.iterdir()):
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        rest = entry.name[len(prefix) :]
        if rest.startswith(_OLD) and not os.path.lexists(target):
            os.replace(entry, target)
        elif rest.startswith((_OLD, _STAGING)):
            shutil.rmtree(entry, ignore_errors=True)


def install_files(target: Path, files: Mapping[str, str], *, force: bool = False, flag: str = "--emit") -> Installed:
    """Write ``files`` (relative path → text) as the directory ``target`` under the rules above."""
    target = check_target(target, flag)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        recover(target)
        existed = target.is_dir()
        keep = _classify(target, files, force, flag) if existed else []
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{_STAGING}"))
    except OSError as err:
        raise LcmoeError(
            flag, str(target), f"cannot be written ({err.strerror or err})", "choose a writable directory"
        ) from err
    try:
        hashes: dict[str, str] = {}
        for rel, text in files.items():
            data = text.encode("utf-8")
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            hashes[rel] = sha256(data)
        _keep_into(staging, keep)
        (staging / MANIFEST).write_text(
            json.dumps({"written_by": "lcmoe", "files": hashes}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        os.chmod(staging, 0o777 & ~current_umask())
        _swap_in(staging, target, existed)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise LcmoeError(
            flag,
            str(target),
            f"could not be written ({err.strerror or err}); nothing changed there",
            "free space or choose a writable directory",
        ) from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Installed(target, tuple(sorted(files)), tuple(rel for rel, _ in keep), existed)


def _swap_in(staging: Path, target: Path, existed: bool) -> None:
    with _signals_held():
        if not existed:
            os.replace(staging, target)
            return
        backup = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{_OLD}"))
        backup.rmdir()
        os.replace(target, backup)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(backup, target)
            raise
        shutil.rmtree(backup, ignore_errors=True)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def install_directory(staging: Path, target: Path) -> None:
    """Put a completed ``staging`` directory lcmoe built at ``target`` (a directory lcmoe owns, e.g.
    a report's plots), by renames: an interruption leaves the old or the new one."""
    os.chmod(staging, 0o777 & ~current_umask())
    _swap_in(staging, target, target.exists())
