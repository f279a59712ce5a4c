"""Crash-safe output folders: a marker, a lock, a staging folder renamed into place.

Rules (issue 14, item 3):

- fednet deletes or replaces only what it created. Every output folder it writes holds a marker
  file, :data:`MARKER`, listing the files it wrote. An existing ``--out`` folder is replaced only
  when it carries the marker and holds nothing else than the files listed there; an empty folder
  is used as is; anything else (a user's folder, the current folder or one of its parents, a
  file) is refused with :class:`~fednet.errors.OutputError` and left untouched.
- Results are written into a sibling staging folder ``.<name>.partial-<pid>-<random>`` and
  renamed to ``<name>`` at the end. SIGTERM, SIGHUP and SIGINT (and interpreter exit) remove the
  staging folder and release the lock; a staging folder left by a killed run (SIGKILL, power
  loss) is removed by the next run on the same ``--out`` once it holds the lock.
- A lock file ``.<name>.fednet-lock`` beside the output folder, held with an exclusive ``flock``
  and holding the writer's pid, makes a second run on the same ``--out`` fail at once with
  :class:`~fednet.errors.OutputLocked` naming the first run's pid. The kernel releases the lock
  when its process dies (even by SIGKILL), so a lock file left by a killed run is taken over.

Usage::

    with StagedOutput(out_dir) as staging:      # checks, lock, stale clean-up, signal handlers
        (staging / "summary.json").write_text(...)
    # on success the staging folder is now out_dir; on any exception or signal it is gone
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import secrets
import shutil
import signal
import stat
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from fednet.errors import OutputError, OutputLocked

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["MARKER", "StagedOutput", "check_output_target", "pid_alive", "open_own", "read_own", "write_own",
           "read_marker", "is_plain_dir"]

#: Name of the marker file in every folder fednet writes (JSON: ``{"fednet": "output", "files": [...]}``).
MARKER = ".fednet-output"

_PARTIAL = ".partial-"
_OLD = ".replaced-"
_LOCK = ".fednet-lock"

# Paths to remove if the interpreter exits while a StagedOutput is open (atexit; signal handlers
# raise SystemExit so the context manager's own clean-up normally runs first).
_pending: set[Path] = set()
_pending_lock = threading.Lock()


#: ``O_NOFOLLOW`` where the platform has it: fednet's own files are never opened through a link.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def is_plain_dir(p: Path) -> bool:
    """Whether ``p`` is a folder itself, not a link to one (``lstat``)."""
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _foreign(path: Path, why: str) -> OutputError:
    return OutputError(f"{path} {why}; fednet keeps its own bookkeeping file there and did not write this one: "
                       f"move it away")


def open_own(path: Path, flags: int, mode: int = 0o644) -> int:
    """Open one of fednet's bookkeeping files (lock, marker, checkpoint record) without following links.

    The file is opened with ``O_NOFOLLOW`` and must then be a regular file with a single link (a hard
    link planted there would let fednet write someone else's file).

    Parameters
    ----------
    path : Path
    flags : int
        ``os.open`` flags (``O_NOFOLLOW`` and ``O_CLOEXEC`` are added).
    mode : int

    Returns
    -------
    int
        The file descriptor.

    Raises
    ------
    OutputError
        If ``path`` is a symbolic link, not a regular file, or a file with other hard links (named).
    FileNotFoundError
        If it does not exist and ``flags`` do not create it.
    """
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
            raise _foreign(path, "is a symbolic link") from None
        if e.errno in (errno.EISDIR, errno.ENXIO):
            raise _foreign(path, "is not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise _foreign(path, "is not a regular file" if not stat.S_ISREG(st.st_mode) else
                       f"has {st.st_nlink} hard links")
    return fd


def read_own(path: Path, limit: int = 1 << 26) -> bytes | None:
    """The bytes of one of fednet's bookkeeping files, read without following links (None if it is
    missing, a link, not a regular file, or larger than ``limit`` bytes)."""
    try:
        fd = open_own(path, os.O_RDONLY)
    except (OSError, OutputError):
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    return None if len(data) > limit else data


def write_own(path: Path, data: bytes | str) -> None:
    """Write (create or replace) one of fednet's bookkeeping files without following links.

    Raises
    ------
    OutputError
        If ``path`` is a symbolic link or not a plain, singly-linked file (nothing is written).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = open_own(path, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "wb") as fh:
        fh.truncate(0)
        fh.write(raw)


def _remove_path(p: Path) -> None:
    """Remove a file, link or folder tree (a link is removed, not followed); errors are ignored."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except OSError:
            pass


def _cleanup_pending() -> None:  # pragma: no cover - exercised in subprocess tests
    with _pending_lock:
        for p in list(_pending):
            _remove_path(p)
        _pending.clear()


atexit.register(_cleanup_pending)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine (``kill(pid, 0)``)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_marker(folder: Path, kind: str = "output") -> dict[str, Any] | None:
    """The marker of a folder fednet wrote (``{"fednet": kind, ...}``), or None.

    None also when the folder is a link, or the marker a link or not a regular file (never followed).
    """
    if not is_plain_dir(folder):
        return None
    raw = read_own(folder / MARKER, limit=1 << 24)
    try:
        data = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (ValueError, RecursionError):           # not JSON, or nested past the interpreter's stack: not ours
        return None
    return data if isinstance(data, dict) and data.get("fednet") == kind else None


def _read_marker(folder: Path) -> dict[str, Any] | None:
    return read_marker(folder, "output")


def _write_marker(folder: Path, files: list[str], **extra: Any) -> None:
    # No pid or time in it: two runs of one study write byte-identical output folders.
    write_own(folder / MARKER, json.dumps({"fednet": "output", "files": sorted(files), **extra}, indent=1) + "\n")


def _remove_marked(folder: Path) -> None:
    """Remove a folder fednet made, its marker last (an interrupted removal stays recognisable).

    A link in place of the folder is left alone (its target is never emptied).
    """
    if not is_plain_dir(folder):
        return
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name != MARKER:
            _remove_path(p)
    try:
        (folder / MARKER).unlink()
    except OSError:
        pass
    try:
        folder.rmdir()
    except OSError:
        pass


#: The names a result folder (or its staging folder) holds besides the run folders' ``trace.csv``.
_RESULT_NAMES = frozenset({"summary.json", "study.json", "timing.json", "provenance.json", "accuracy_vs_time.png",
                           "secret_seed.json",
                           MARKER})


def _only_results(folder: Path) -> bool:
    """Whether ``folder`` holds only what fednet writes into a result: :data:`_RESULT_NAMES` as plain files and run
    folders holding at most a plain ``trace.csv`` (a staging folder of a killed run holds a part of that)."""
    try:
        for p in folder.iterdir():
            if p.is_symlink():
                return False
            if p.is_dir():
                if any(q.name != "trace.csv" or q.is_symlink() or not q.is_file() for q in p.iterdir()):
                    return False
            elif p.name not in _RESULT_NAMES or not p.is_file():
                return False
    except OSError:
        return False
    return True


def _listing(folder: Path) -> list[str]:
    """Every path under ``folder`` (files, links, folders), relative, '/'-separated, not following links."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        rel = Path(root).relative_to(folder)
        for name in dirs + files:
            out.append((rel / name).as_posix())
    return sorted(out)


def check_output_target(out_dir: str | os.PathLike) -> Path:
    """Check that fednet may write ``out_dir``; returns it as an absolute path.

    Allowed: a path that does not exist (its parent folders are created), an empty folder, or a
    folder fednet wrote earlier (it carries :data:`MARKER` and holds only the files listed there).

    Raises
    ------
    OutputError
        For the current folder or one of its parents, a path that is a file or a link, or a folder
        holding anything fednet did not write (the message names one such entry).
    """
    given = Path(out_dir)
    out = Path(os.path.abspath(given))
    cwd = Path(os.path.abspath(os.getcwd()))
    real, real_cwd = Path(os.path.realpath(given)), Path(os.path.realpath(cwd))
    if out == cwd or out in cwd.parents or real == real_cwd or real in real_cwd.parents:
        raise OutputError(f"--out {str(given)!r} is the current folder or one of its parents; fednet writes a "
                          f"whole folder and replaces it on the next run: give a new or empty folder instead")
    if out.is_symlink():
        raise OutputError(f"--out {str(given)!r} is a symbolic link; give a plain folder")
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {str(given)!r} exists and is not a folder; fednet will not replace it")
    if out.is_dir():
        entries = _listing(out)
        if entries:
            marker = _read_marker(out)
            if marker is None:
                raise OutputError(f"--out {str(given)!r} holds files fednet did not write (e.g. {entries[0]!r}) "
                                  f"and has no {MARKER} marker; fednet never deletes them: give a new or empty folder")
            allowed = set(marker.get("files", [])) | {MARKER}
            foreign = [e for e in entries if e not in allowed]
            if foreign:
                raise OutputError(f"--out {str(given)!r} is a fednet output folder but also holds {foreign[0]!r}, "
                                  f"which fednet did not write; move it away or give another folder")
    return out


class StagedOutput:
    """Context manager that stages an output folder and renames it into place on success.

    Entering: checks the target (:func:`check_output_target`), creates the missing parent folders,
    takes the lock, removes stale staging folders of dead runs, creates the staging folder (with
    the marker) and installs SIGTERM/SIGHUP handlers (main thread only) that raise ``SystemExit``
    (status 128 + signal) so the clean-up runs; SIGINT raises ``KeyboardInterrupt`` as usual,
    which cleans up the same way. Leaving without an exception: writes the marker's
    file list and renames the staging folder to the target (replacing an earlier fednet output).
    Leaving with an exception: removes the staging folder and any parent folders it created.
    Always: releases the lock and restores the signal handlers.

    Parameters
    ----------
    out_dir : path-like
        The output folder.

    Attributes
    ----------
    out : Path
        The absolute output folder.
    staging : Path or None
        The staging folder while the context is open.

    Raises
    ------
    OutputError
        See :func:`check_output_target`.
    OutputLocked
        If a live process holds the lock of the same output folder (the message names its pid).
    """

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.given = Path(out_dir)
        self.out = Path(os.path.abspath(self.given))
        self.staging: Path | None = None
        self.lock = self.out.parent / f".{self.out.name}{_LOCK}"
        self._created_parents: list[Path] = []
        self._old_handlers: dict[int, Any] = {}
        self._locked = False
        self._lock_fd: int | None = None

    # -- lock -----------------------------------------------------------------------------
    def _lock_message(self, pid: int | None) -> str:
        who = f"process id {pid}" if pid else "process id unknown"
        return (f"--out {str(self.given)!r} is in use by another fednet run ({who}; lock file {self.lock}); "
                f"wait for it to finish or choose another folder")

    def _acquire_lock(self) -> None:
        """Take the output's lock (an exclusive ``flock`` on the lock file, which holds our pid).

        The kernel drops an ``flock`` when its process dies, even by SIGKILL, so a lock file left
        by a killed run is simply taken over. Without ``fcntl`` (not POSIX) the lock is the file's
        exclusive creation, and a file whose pid is no longer alive is stale.
        """
        if fcntl is None:  # pragma: no cover - non-POSIX fallback
            return self._acquire_lock_by_pid()
        for _ in range(20):
            fd = open_own(self.lock, os.O_RDWR | os.O_CREAT)        # never through a link
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = None
                for _ in range(20):            # the holder writes its pid right after locking
                    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                    if text.isdigit():
                        pid = int(text)
                        break
                    time.sleep(0.01)
                os.close(fd)
                raise OutputLocked(self._lock_message(pid)) from None
            try:
                same = os.stat(self.lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:                        # the holder removed it as we opened it: retry
                os.close(fd)
                continue
            held = os.pread(fd, 64, 0)
            if len(held) > 32 or not held.strip().isdigit() and held.strip():
                os.close(fd)                    # not a pid: someone's file with our lock's name
                raise _foreign(self.lock, "holds something other than a fednet process id")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._lock_fd = fd
            self._locked = True
            with _pending_lock:
                _pending.add(self.lock)
            return None
        raise OutputLocked(self._lock_message(None))

    def _acquire_lock_by_pid(self) -> None:  # pragma: no cover - non-POSIX fallback
        for _ in range(3):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    pid = int(self.lock.read_text().strip() or "0")
                except (OSError, ValueError):
                    pid = 0
                if pid and pid_alive(pid):
                    raise OutputLocked(self._lock_message(pid)) from None
                try:
                    self.lock.unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{os.getpid()}\n")
            self._locked = True
            with _pending_lock:
                _pending.add(self.lock)
            return
        raise OutputLocked(self._lock_message(None))

    def _release_lock(self) -> None:
        if self._locked:
            try:
                self.lock.unlink()              # while still holding it: waiters see a new inode
            except OSError:
                pass
            if self._lock_fd is not None:
                os.close(self._lock_fd)         # releases the flock
                self._lock_fd = None
            self._locked = False
            with _pending_lock:
                _pending.discard(self.lock)

    # -- stale staging folders ----------------------------------------------------------------
    def remove_stale(self) -> list[Path]:
        """Remove staging (and half-replaced) folders of this output left by killed runs.

        Called with the lock held, so no other run is writing to this output: a folder qualifies
        when its name is ``.<name>.partial-<pid>-...`` or ``.<name>.replaced-<pid>-...`` with
        ``<pid>`` not this process, and it is empty or carries the marker and holds nothing but files of the
        names fednet writes there (:func:`_only_results`: a user's folder that happens to match the name, or
        one with a planted marker beside the user's own files, is left alone). Without ``fcntl``, ``<pid>`` must also be dead.
        A previous result renamed away by a run killed before its new result was in place is
        renamed back to the output folder. Returns the removed folders.
        """
        removed = []
        prefix = f".{self.out.name}"
        if not self.out.parent.is_dir():
            return removed
        for p in self.out.parent.iterdir():
            name = p.name
            for tag in (_PARTIAL, _OLD):
                if not name.startswith(prefix + tag):
                    continue
                pid_text = name[len(prefix + tag):].split("-", 1)[0]
                if not pid_text.isdigit() or int(pid_text) == os.getpid() or p.is_symlink() or not p.is_dir():
                    continue
                if fcntl is None and pid_alive(int(pid_text)):  # pragma: no cover
                    continue
                if tag == _OLD and _read_marker(p) is not None and not self.out.exists():
                    p.rename(self.out)          # killed between the two renames: put it back
                    continue
                if (_read_marker(p) is not None and _only_results(p)) or not any(p.iterdir()):
                    _remove_marked(p)
                    removed.append(p)
        return removed

    # -- signals ----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    def _install_handlers(self) -> None:
        # SIGINT keeps Python's own handler: KeyboardInterrupt already unwinds through __exit__
        # (and an interactive session survives it); SIGTERM and SIGHUP would kill the process
        # without clean-up, so they raise SystemExit(128 + signal) instead.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):  # pragma: no cover - not the main interpreter
                pass

    def _restore_handlers(self) -> None:
        for sig, h in self._old_handlers.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):  # pragma: no cover
                pass
        self._old_handlers.clear()

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> Path:
        check_output_target(self.given)
        missing = []
        p = self.out.parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create the parent folder of --out {str(self.given)!r}: {e.strerror}") from None
        self._created_parents = missing         # innermost first
        self._install_handlers()
        try:
            self._acquire_lock()
            self.remove_stale()
            check_output_target(self.given)     # again, under the lock
            name = f".{self.out.name}{_PARTIAL}{os.getpid()}-{secrets.token_hex(4)}"
            staging = self.out.parent / name
            with _pending_lock:
                _pending.add(staging)
            staging.mkdir()
            self.staging = staging
            _write_marker(staging, [], state="partial")
        except OutputError:
            self._abort()
            raise
        except OSError as e:
            self._abort()
            raise OutputError(f"cannot write next to --out {str(self.given)!r} in {self.out.parent}: "
                              f"{e.strerror or e}") from None
        except BaseException:
            self._abort()
            raise
        return staging

    def _abort(self) -> None:
        if self.staging is not None:
            _remove_marked(self.staging)
            with _pending_lock:
                _pending.discard(self.staging)
            self.staging = None
        self._release_lock()
        for p in self._created_parents:
            try:
                p.rmdir()
            except OSError:
                break
        self._created_parents = []
        self._restore_handlers()

    def commit(self) -> Path:
        """Write the marker's file list and rename the staging folder to the output folder.

        The renames (and the removal of the previous result) run with SIGTERM, SIGINT and SIGHUP
        blocked (main thread), so a signal cannot leave the previous result renamed away and the
        new one not yet in place; a signal that arrives meanwhile is delivered afterwards. The
        mask only holds back signals the kernel delivers to the main thread: one that lands on
        another thread (a BLAS worker, say) still runs its Python handler on the main thread, so
        the handlers are swapped for ones that only note the signal, and the first noted signal is
        raised once the result is in place.
        """
        assert self.staging is not None
        staging = self.staging
        files = [e for e in _listing(staging) if e != MARKER]
        _write_marker(staging, files)
        sigs = {signal.SIGTERM, signal.SIGINT} | ({signal.SIGHUP} if hasattr(signal, "SIGHUP") else set())
        mask = getattr(signal, "pthread_sigmask", None)
        blocked = mask is not None and threading.current_thread() is threading.main_thread()
        held: list[int] = []
        saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in sigs:
                try:
                    saved[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
                except (ValueError, OSError):  # pragma: no cover - not the main interpreter
                    pass
        if blocked:
            mask(signal.SIG_BLOCK, sigs)
        old = None
        try:
            if self.out.is_dir() and not self.out.is_symlink():
                if any(self.out.iterdir()):
                    check_output_target(self.given)
                    old = self.out.parent / f".{self.out.name}{_OLD}{os.getpid()}-{secrets.token_hex(4)}"
                    self.out.rename(old)
                    try:
                        staging.rename(self.out)
                    except BaseException:
                        old.rename(self.out)     # put the previous result back
                        old = None
                        raise
                else:
                    self.out.rmdir()
                    staging.rename(self.out)
            else:
                try:
                    staging.rename(self.out)
                except OSError as e:
                    if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        raise OutputError(f"--out {str(self.given)!r} appeared while fednet was writing; fednet "
                                          f"does not replace it and discards this run's results") from None
                    raise
            with _pending_lock:
                _pending.discard(staging)
            self.staging = None
            if old is not None:
                _remove_marked(old)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            if blocked:
                mask(signal.SIG_UNBLOCK, sigs)      # a blocked signal is delivered here
            if held:                                # one that reached another thread: raise it now
                if held[0] == signal.SIGINT:
                    raise KeyboardInterrupt
                raise SystemExit(128 + held[0])
        return self.out

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            try:
                self.commit()
            except OutputError:
                self._abort()
                raise
            except OSError as e:                # a read-only or full file system, a vanished folder
                self._abort()
                raise OutputError(f"cannot put the results in place at --out {str(self.given)!r}: "
                                  f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}; nothing was "
                                  f"changed there") from None
            except BaseException:
                self._abort()
                raise
            self._created_parents = []
            self._release_lock()
            self._restore_handlers()
        else:
            self._abort()
