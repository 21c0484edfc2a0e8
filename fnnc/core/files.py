"""Atomic file writes: a reader sees the old file or the new one, never part of one.

Every file fnnc writes whole (graphs as JSON, exported programs, safetensors files,
tuning tables) goes through :func:`atomic_write`: the content is written to a temporary
file in the same folder, flushed to disk, given the permissions the file had (a new one
gets what ``open`` would give it: ``0o666`` less the umask), and renamed over the
target. A crash or a full disk leaves the old file and no temporary one. A symbolic
link stays a link: the file it points to is the one replaced (as ``open(path, "w")``
would write it), the temporary file made beside that file so the rename stays on one
file system.

(SQLite tensor files and checkpoints are made atomic by their transactions and by
Orbax; this is for the files written in one piece.) A file that is read, merged with
new entries and written back (tuning tables) is updated under :func:`locked`, so two
processes saving at once each keep their entries: the second reads what the first wrote.

>>> import os, pathlib, stat, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp(), "table.json")
>>> atomic_write(path, b"{}")
>>> os.chmod(path, 0o644)
>>> atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text('{"a": 1}'))
>>> path.read_text(), oct(stat.S_IMODE(os.stat(path).st_mode))
('{"a": 1}', '0o644')
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; updates are atomic but not serialized
    fcntl = None  # type: ignore[assignment]


def atomic_write(
    path: str | os.PathLike[str],
    content: bytes | str | Callable[[str], Any],
    *,
    suffix: str = ".tmp",
) -> None:
    """Replaces the file at ``path`` with ``content`` atomically.

    ``content`` is bytes, text (UTF-8), or a function ``write(temporary_path)`` that
    writes the file itself (a library that writes to a path). Raises what the file
    system or ``write`` raises (``OSError`` for a missing folder or a full disk), with
    nothing left behind; a file-system error names ``path``, not the temporary file
    (a missing folder raises :class:`FileNotFoundError` saying so, a folder at ``path``
    :class:`IsADirectoryError`). Through a symbolic link, the file it points to is
    replaced and the link kept.
    """
    target = os.fspath(path)
    if os.path.islink(target):  # replace what the link points to, not the link
        target = os.path.realpath(target)
    if os.path.isdir(target):
        raise IsADirectoryError(
            errno.EISDIR, "is a folder; give the path of a file (in that folder)", target
        )
    folder = os.path.dirname(os.path.abspath(target))
    mode = _mode_for(target)
    try:
        fd, temporary = tempfile.mkstemp(
            dir=folder, prefix=f".{os.path.basename(target)}.", suffix=suffix
        )
    except OSError as e:
        raise _naming(e, target, folder) from None
    try:
        _write(fd, temporary, target, content, mode)
    except OSError as e:
        raise _naming(e, target, folder, temporary) from None


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Holds an exclusive advisory lock (``flock``) for a read-merge-write of the file at
    ``path``, against other processes (and threads) doing the same through this function.

    The lock is taken on the file's folder, which leaves nothing behind (the file itself
    is replaced by :func:`atomic_write`, so it could not carry the lock); updates of
    other files in that folder wait their turn too, which costs nothing for files saved
    now and then. Where the system has no ``fcntl`` (Windows) or the folder cannot be
    locked (some network file systems), nothing is locked.
    """
    target = os.fspath(path)
    if os.path.islink(target):
        target = os.path.realpath(target)
    with folder_locked(os.path.dirname(os.path.abspath(target))):
        yield


@contextlib.contextmanager
def folder_locked(folder: str | os.PathLike[str], *, shared: bool = False) -> Iterator[None]:
    """Holds an advisory lock (``flock``) on ``folder`` itself: exclusive, or with
    ``shared=True`` one that any number of holders share and an exclusive one waits
    for (and the other way round). Readers of a folder whose content writers replace
    in several steps hold a shared one while they read, writers an exclusive one, so a
    reader sees one write whole. Each call opens the folder anew, so on a local
    filesystem two threads of one process exclude each other as two processes do.
    Where the system has no ``fcntl`` or the folder cannot be opened or locked, nothing
    is locked.

    The lock is advisory and holds on local filesystems. On NFS, Linux emulates
    ``flock`` with POSIX record locks, which belong to the process: an exclusive lock
    on the folder (opened read-only, as a folder must be) fails with ``EBADF``, so an
    exclusive call locks nothing there; a shared one is taken, but closing any of the
    process's descriptors of the folder drops it (do not nest calls on one folder), and
    threads of one process do not exclude each other."""
    fd = -1
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fd = os.open(os.fspath(folder), os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing releases the lock


def _write(
    fd: int, temporary: str, target: str, content: bytes | str | Callable[[str], Any], mode: int
) -> None:
    try:
        if callable(content):
            os.close(fd)
            fd = -1
            content(temporary)
            fd = os.open(temporary, os.O_RDONLY)
        else:
            data = content.encode() if isinstance(content, str) else content
            view = memoryview(data)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def _naming(error: OSError, target: str, folder: str, temporary: str = "") -> OSError:
    """``error`` naming ``target`` instead of the temporary file (same class, errno and
    reason, so ``except FileNotFoundError`` still catches it and ``e.strerror`` still
    says why); ``error`` itself when it is about another file or carries no errno."""
    name = error.filename
    ours = name is None or name in (temporary, folder) or _is_temporary(name, target, folder)
    if error.errno is None or not ours:
        return error
    why = error.strerror or str(error)
    if not os.path.isdir(folder):
        why = f"{why} (its folder {folder} does not exist; create it first)"
    return type(error)(error.errno, why, target)


def _is_temporary(name: Any, target: str, folder: str) -> bool:
    """Whether ``name`` is one of the temporary names :func:`atomic_write` tries."""
    if not isinstance(name, str):
        return False
    prefix = f".{os.path.basename(target)}."
    return os.path.dirname(os.path.abspath(name)) == folder and os.path.basename(name).startswith(
        prefix
    )


def _mode_for(target: str) -> int:
    """The permission bits the new file gets: the old file's, or ``0o666`` less the
    umask for a new one (``mkstemp`` alone gives ``0o600``, which locks every other
    user out of a shared file)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:  # Linux
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and put back
    os.umask(mask)
    return mask
