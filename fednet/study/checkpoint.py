"""Finished (run, seed) pairs kept across an interrupted study, for ``fednet run --resume``.

A study writes its output folder only when every (run, seed) has finished
(:mod:`fednet.study.output`), so an interrupted study of hours used to lose everything it had
finished. :func:`~fednet.study.runner.run_study` now also records each finished pair, as it
finishes, in a checkpoint folder beside the output (made at the first finished pair)::

    .<name>.fednet-checkpoint/                 mode 0700, owned by the user who runs fednet
    .<name>.fednet-checkpoint/.fednet-output   marker ({"fednet": "checkpoint"})
    .<name>.fednet-checkpoint/study.json       the validated study the pairs belong to
    .<name>.fednet-checkpoint/key              32 random bytes (mode 0600): the records' HMAC key
    .<name>.fednet-checkpoint/run<i>-seed<s>.json
                                               one finished pair: its trace rows, host seconds, feature draw

Records are data, never code: JSON (:func:`encode` / :func:`decode`: every value of a trace row
keeps its exact type and bits -- numpy scalars by dtype and bytes, non-finite floats by name), with
an HMAC-SHA256 (:mod:`hmac`) under the folder's random key over the study, the pair and the record.
Nothing is unpickled.

With ``resume=True`` (``fednet run --resume``) the pairs of a checkpoint written for the same
study (``study.json`` equal, byte for byte) are taken as they are and only the others run, so the
result files equal those of an uninterrupted run byte for byte (``timing.json`` lists the resumed
pairs under ``resumed``). Without it an existing checkpoint is discarded (with a warning naming how
many pairs it held). The checkpoint is removed once the output folder is in place. It is read and
written only under the output's lock.

What is refused, by name and without changing anything (:class:`~fednet.errors.OutputError`, or
:class:`~fednet.errors.ConfigError` for a checkpoint of another study):

- a checkpoint path that is a link, not a folder, not owned by this user, open to other users
  (group or other permission bits), without the marker, or holding a file fednet does not write
  there (such a folder is never emptied);
- with ``--resume``: a record that is a link, not a regular file, not valid JSON, of another pair
  or study, or whose digest does not match (a damaged, forged or swapped record), and a pickle left
  by an older fednet (it is never loaded: run without ``--resume`` to discard it).

Every file is opened without following links (:func:`fednet.study.output.open_own`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

import numpy as np

from fednet.errors import ConfigError, OutputError

from .config import Study
from .output import MARKER, is_plain_dir, read_own, write_own

__all__ = ["CHECKPOINT", "Checkpoint", "encode", "decode", "FORMAT"]

log = logging.getLogger(__name__)

#: Suffix of the checkpoint folder ``.<name><CHECKPOINT>`` beside the output folder ``<name>``.
CHECKPOINT = ".fednet-checkpoint"

#: The ``format`` of a record file.
FORMAT = "fednet-checkpoint-record/1"

#: A finished pair: ``rows`` (trace), ``wall_s`` and ``data_s`` (host seconds), ``feature_seed``;
#: the dict :func:`fednet.study.parallel.run_task` returns.
Record = dict[str, Any]

_KEY = "key"
_RECORD = re.compile(r"run(\d+)-seed(\d+)\.json")
_OWN = re.compile(r"(run\d+-seed\d+\.(json|pkl)(\.tmp)?|study\.json|key|\.fednet-output)")


# -- a data-only encoding of records --------------------------------------------------------------
def encode(value: Any) -> Any:
    """A JSON-ready form of ``value`` that :func:`decode` turns back into an equal value of the same type.

    Python ``bool``, ``int``, ``str``, ``None`` and finite ``float`` are themselves; a non-finite
    float is ``{"$float": "nan" | "inf" | "-inf"}``; a numpy scalar ``{"$np": dtype, "b64": bytes}``
    (bit-exact); a numeric ndarray ``{"$nd": dtype, "shape": [...], "b64": bytes}``; a tuple
    ``{"$tuple": [...]}``; a dict with string keys not starting with ``$`` an object (order kept),
    another dict ``{"$dict": [[key, value], ...]}``; a list a list.

    Raises
    ------
    TypeError
        For any other type (objects, object arrays): only data are kept.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, np.generic):
        if value.dtype.kind not in "biufc":
            raise TypeError(f"cannot keep a numpy {value.dtype} scalar in a checkpoint")
        return {"$np": value.dtype.str, "b64": base64.b64encode(value.tobytes()).decode("ascii")}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise TypeError(f"cannot keep a numpy {value.dtype} array in a checkpoint")
        return {"$nd": value.dtype.str, "shape": list(value.shape),
                "b64": base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    raise TypeError(f"cannot keep a {type(value).__name__} in a checkpoint (data only)")


def decode(value: Any) -> Any:
    """The value :func:`encode` encoded.

    Raises
    ------
    ValueError
        For a form :func:`encode` does not write.
    """
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and "$float" in value:
        text = value["$float"]
        if text not in ("nan", "inf", "-inf"):
            raise ValueError(f"bad $float {text!r}")
        return float(text)
    if "$np" in value:
        dtype = np.dtype(value["$np"])
        if dtype.kind not in "biufc":
            raise ValueError(f"bad $np dtype {value['$np']!r}")
        raw = base64.b64decode(value["b64"], validate=True)
        if len(raw) != dtype.itemsize:
            raise ValueError("bad $np size")
        return np.frombuffer(raw, dtype=dtype)[0]
    if "$nd" in value:
        dtype = np.dtype(value["$nd"])
        if dtype.kind not in "biufc":
            raise ValueError(f"bad $nd dtype {value['$nd']!r}")
        shape = tuple(int(n) for n in value["shape"])
        raw = base64.b64decode(value["b64"], validate=True)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if len(value) == 1 and "$tuple" in value:
        return tuple(decode(v) for v in value["$tuple"])
    if len(value) == 1 and "$dict" in value:
        return {decode(k): decode(v) for k, v in value["$dict"]}
    if any(k.startswith("$") for k in value):
        raise ValueError(f"unknown tagged value {sorted(value)[:3]}")
    return {k: decode(v) for k, v in value.items()}


def _unlink(p: Path) -> None:
    """Remove a file or link (never followed, never a folder tree); a missing one is fine."""
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


class Checkpoint:
    """The checkpoint folder of one output folder and study (module docstring).

    Parameters
    ----------
    out_dir : path-like
        The study's output folder (``--out``).
    study : Study
        The validated study being run.

    Attributes
    ----------
    folder : Path
        ``.<name>.fednet-checkpoint`` beside ``out_dir``.
    """

    def __init__(self, out_dir: str | os.PathLike, study: Study) -> None:
        out = Path(os.path.abspath(out_dir))
        self.folder = out.parent / f".{out.name}{CHECKPOINT}"
        self.study = study
        self._study_json = study.model_dump_json(indent=2)
        self._key: bytes | None = None
        self._disabled = False

    # -- what is ours ------------------------------------------------------------------------
    def _refuse(self, why: str) -> OutputError:
        return OutputError(f"{self.folder} {why}; fednet keeps its checkpoint there and did not write it as it "
                           f"is: move it away (nothing was changed)")

    def _check_folder(self) -> None:
        """Refuse a checkpoint path that is not a private folder of this user with fednet's files only."""
        try:
            st = os.lstat(self.folder)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise self._refuse("is a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            raise self._refuse("is not a folder")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise self._refuse(f"belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise self._refuse(f"is open to other users (mode {stat.S_IMODE(st.st_mode):o}; fednet makes it 700)")
        marker = read_own(self.folder / MARKER, limit=4096)
        try:
            ok = marker is not None and json.loads(marker.decode("utf-8")) == {"fednet": "checkpoint"}
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            raise self._refuse(f"has no {MARKER} marker of a fednet checkpoint")
        for p in self.folder.iterdir():
            if not _OWN.fullmatch(p.name):
                raise self._refuse(f"holds {p.name!r}, which fednet does not write there")
            if p.is_symlink() or not p.is_file():
                raise self._refuse(f"holds {p.name!r}, which is not a regular file")

    def _is_ours(self) -> bool:
        try:
            self._check_folder()
        except OutputError:
            return False
        return is_plain_dir(self.folder)

    def _path(self, run_index: int, seed: int) -> Path:
        return self.folder / f"run{run_index}-seed{seed}.json"

    def _digest(self, key: bytes, body: bytes) -> str:
        return hmac.new(key, body, hashlib.sha256).hexdigest()

    def _body(self, run_index: int, seed: int, record: Any) -> bytes:
        """The bytes the digest covers: the study, the pair and the encoded record."""
        study = hashlib.sha256(self._study_json.encode("utf-8")).hexdigest()
        return json.dumps({"format": FORMAT, "study_sha256": study, "run": run_index, "seed": seed,
                           "record": record}, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def _remove_ours(self) -> None:
        """Remove the folder's files (only the names fednet writes there; checked first), the marker last."""
        self._check_folder()
        for p in self.folder.iterdir():
            if p.name != MARKER and _OWN.fullmatch(p.name):
                _unlink(p)
        _unlink(self.folder / MARKER)
        try:
            self.folder.rmdir()
        except OSError:
            pass

    # -- the interface -------------------------------------------------------------------------
    def open(self, resume: bool) -> dict[tuple[int, int], Record]:
        """Prepare the folder; return the finished pairs to reuse (``{(run index, seed): record}``).

        Parameters
        ----------
        resume : bool
            Reuse the pairs of an existing checkpoint of the same study; False: discard it.

        Raises
        ------
        OutputError
            The checkpoint's path exists but is not a checkpoint fednet wrote (module docstring), or,
            with ``resume``, a record does not verify; left untouched.
        ConfigError
            ``resume`` and the checkpoint belongs to another study (another file, ``--set``,
            ``--runs``, ``--seed`` or ``--epochs``); nothing is changed.
        """
        finished: dict[tuple[int, int], Record] = {}
        if os.path.lexists(self.folder):
            self._check_folder()
            if resume:
                finished = self._load()
            else:
                n = len([p for p in self.folder.iterdir() if _RECORD.fullmatch(p.name) or p.suffix == ".pkl"])
                if n:
                    log.warning("%s: discarding %d finished (run, seed) pairs of an interrupted run in %s "
                                "(rerun with --resume to keep them)", self.study.name, n, self.folder)
                self._remove_ours()
        elif resume:
            log.info("%s: no checkpoint at %s; running every (run, seed)", self.study.name, self.folder)
        return finished

    def _load(self) -> dict[tuple[int, int], Record]:
        raw = read_own(self.folder / "study.json")
        stored = None if raw is None else raw.decode("utf-8", errors="replace")
        if stored != self._study_json:
            raise ConfigError(f"--resume: the checkpoint {self.folder} was written for another study than this "
                              f"one ({self.study.name!r} with these runs, seeds, epochs and settings); rerun the "
                              f"command that wrote it with --resume, or run without --resume to discard it")
        legacy = sorted(p.name for p in self.folder.glob("run*-seed*.pkl"))
        if legacy:
            raise OutputError(f"--resume: {self.folder / legacy[0]} is a pickle of an older fednet; fednet no longer "
                              f"loads pickles (they can run code): run without --resume to discard the checkpoint")
        key = read_own(self.folder / _KEY, limit=64)
        if key is None or len(key) != 32:
            raise OutputError(f"--resume: the checkpoint {self.folder} has no valid key file; fednet did not write "
                              f"it as it is: run without --resume to discard it")
        self._key = key
        finished = {}
        wanted = {(i, s) for i in range(len(self.study.runs)) for s in self.study.seeds}
        for p in sorted(self.folder.iterdir()):
            m = _RECORD.fullmatch(p.name)
            if m is None:
                continue
            pair = (int(m.group(1)), int(m.group(2)))
            if pair not in wanted:
                raise self._bad(p, "names a (run, seed) this study does not have")
            finished[pair] = self._read(p, *pair)
        log.info("%s: resuming %d finished (run, seed) pairs from %s", self.study.name, len(finished), self.folder)
        return finished

    def _bad(self, path: Path, why: str) -> OutputError:
        return OutputError(f"--resume: checkpoint record {path} {why}; fednet did not write it as it is (damaged, "
                           f"forged or swapped): nothing was run; run without --resume to discard the checkpoint")

    def _read(self, path: Path, run_index: int, seed: int) -> Record:
        raw = read_own(path)
        if raw is None:
            raise self._bad(path, "is not a regular file fednet can read")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise self._bad(path, "is not valid JSON") from None
        except RecursionError:                   # arrays nested deeper than the interpreter's stack
            raise self._bad(path, "is JSON nested deeper than any record fednet writes") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or set(doc) != {"format", "digest", "record"}:
            raise self._bad(path, f"is not a {FORMAT} record")
        assert self._key is not None
        digest = self._digest(self._key, self._body(run_index, seed, doc["record"]))
        if not isinstance(doc["digest"], str) or not hmac.compare_digest(digest, doc["digest"]):
            raise self._bad(path, "does not match its digest")
        try:
            record = decode(doc["record"])
        except (ValueError, TypeError, KeyError) as e:
            raise self._bad(path, f"holds a value fednet does not write ({e})") from None
        rows = record.get("rows") if isinstance(record, dict) else None
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise self._bad(path, "holds no trace rows")
        return record

    def save(self, run_index: int, seed: int, record: Record) -> None:
        """Record one finished pair (written to a temporary name, then renamed: never half a file).

        The folder is made at the first pair (mode 0700, with its marker, study and a fresh random
        key), so a study that fails before any pair finishes leaves nothing behind. A record holding
        something other than data (:func:`encode`) is not kept (a warning; the study goes on).

        Raises
        ------
        OutputError
            When the checkpoint path is no longer a folder fednet wrote (a link or a foreign file was
            put there meanwhile): nothing is written through it.
        """
        if self._disabled:
            return
        try:
            self._save(run_index, seed, record)
        except OutputError:
            raise
        except OSError as e:                   # a full disk, a read-only folder: the study goes on without it
            self._disabled = True
            log.warning("%s: cannot keep finished (run, seed) pairs in %s (%s); --resume will not find them",
                        self.study.name, self.folder, e.strerror or e)

    def _save(self, run_index: int, seed: int, record: Record) -> None:
        try:
            encoded = encode(record)
        except TypeError as e:
            log.warning("%s: (run %d, seed %d) is not kept for --resume: %s", self.study.name, run_index, seed, e)
            return
        if not os.path.lexists(self.folder):
            os.mkdir(self.folder, 0o700)
            os.chmod(self.folder, 0o700)
            self._key = secrets.token_bytes(32)
            write_own(self.folder / _KEY, self._key)
            os.chmod(self.folder / _KEY, 0o600)
            write_own(self.folder / "study.json", self._study_json)
            write_own(self.folder / MARKER, json.dumps({"fednet": "checkpoint"}) + "\n")
        else:
            self._check_folder()
            if self._key is None:
                key = read_own(self.folder / _KEY, limit=64)
                if key is None or len(key) != 32:
                    raise self._refuse("has no valid key file")
                self._key = key
        body = self._body(run_index, seed, encoded)
        doc = json.dumps({"format": FORMAT, "digest": self._digest(self._key, body), "record": encoded},
                         allow_nan=False)
        path = self._path(run_index, seed)
        tmp = path.with_name(path.name + ".tmp")
        _unlink(tmp)                           # a leftover (or a planted link): removed, never followed
        write_own(tmp, doc)
        os.replace(tmp, path)

    def discard(self) -> None:
        """Remove the checkpoint folder (only if it is a checkpoint fednet wrote; its own files only)."""
        if self._is_ours():
            self._remove_ours()
