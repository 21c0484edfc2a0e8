"""Replacing a directory by another one so that a failure at any point leaves one of them.

:class:`~fnnc.io.ShardedCheckpoints` re-saves a step by writing the new step beside the
old one (in a staging directory) and swapping them. Orbax offers no overwrite (its
``CheckpointManager.save`` refuses a step that exists, ``force=True`` included), and
deleting the old step first loses it when the write then fails.

On Linux the swap is one ``renameat2(RENAME_EXCHANGE)``: readers see the old step or
the new one, never neither. Elsewhere (or on a filesystem without it) the old directory
is renamed into the staging directory, then the new one into place; a process killed
between the two leaves the old one there, which :func:`recover` puts back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil

_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
REPLACED = "replaced-"  # staging/replaced-<name>: an old directory moved aside


def _renameat2() -> object:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except (OSError, TypeError, AttributeError):  # no C library to ask (Windows)
        return None


def exchange(a: str, b: str) -> bool:
    """Atomically exchanges directories ``a`` and ``b``; ``False`` where the system or
    the filesystem cannot (nothing changed then)."""
    call = _renameat2()
    if call is None:
        return False
    done = call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)  # type: ignore[operator]
    return done == 0


def swap_in(new: str, target: str, staging: str) -> None:
    """Puts directory ``new`` at ``target`` (an existing directory), the old ``target``
    ending inside ``staging`` (which the caller then removes)."""
    if not exchange(new, target):
        aside = os.path.join(staging, REPLACED + os.path.basename(target))
        os.rename(target, aside)
        try:
            os.rename(new, target)
        except OSError:
            os.rename(aside, target)
            raise
    sync_folder(os.path.dirname(target))


def recover(staging: str, root: str) -> None:
    """Undoes what a process killed mid-swap left: an old directory moved aside whose
    replacement never arrived goes back into ``root``; then ``staging`` is removed."""
    if not os.path.isdir(staging):
        return
    for name in os.listdir(staging):
        if name.startswith(REPLACED):
            target = os.path.join(root, name[len(REPLACED) :])
            if not os.path.exists(target):
                os.rename(os.path.join(staging, name), target)
    shutil.rmtree(staging, ignore_errors=True)
    sync_folder(root)


def sync_folder(folder: str) -> None:
    """Flushes ``folder``'s entries (renames) to disk, where the system allows."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
