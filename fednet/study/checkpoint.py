"""Finished (run, seed) pairs kept across an interrupted study, for ``fednet run --resume``.

A study writes its output folder only when every (run, seed) has finished
(:mod:`fednet.study.output`), so an interrupted study of hours used to lose everything it had
finished. :func:`~fednet.study.runner.run_study` now also records each finished pair, as it
finishes, in a checkpoint folder beside the output (made at the first finished pair)::

    .<name>.fednet-checkpoint/.fednet-output   marker ({"fednet": "checkpoint"}; only such folders are removed)
    .<name>.fednet-checkpoint/study.json       the validated study the pairs belong to
    .<name>.fednet-checkpoint/run<i>-seed<s>.pkl
                                               one finished pair: its trace rows, host seconds, feature draw

With ``resume=True`` (``fednet run --resume``) the pairs of a checkpoint written for the same
study (``study.json`` equal, byte for byte) are taken as they are and only the others run, so the
result files equal those of an uninterrupted run byte for byte (the rows are pickled, not
re-parsed; ``timing.json`` lists the resumed pairs under ``resumed``). Without it an existing
checkpoint is discarded (with a warning naming how many pairs it held). The checkpoint is removed
once the output folder is in place. It is read and written only under the output's lock.

The pickles are fednet's own files, read back only from a folder that carries fednet's marker; do
not resume from a checkpoint you did not write (unpickling runs code).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError, OutputError

from .config import Study
from .output import MARKER, _remove_marked

__all__ = ["CHECKPOINT", "Checkpoint"]

log = logging.getLogger(__name__)

#: Suffix of the checkpoint folder ``.<name><CHECKPOINT>`` beside the output folder ``<name>``.
CHECKPOINT = ".fednet-checkpoint"

#: A finished pair: ``rows`` (trace), ``wall_s`` and ``data_s`` (host seconds), ``feature_seed``;
#: the dict :func:`fednet.study.parallel.run_task` returns.
Record = dict[str, Any]


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

    def _is_ours(self) -> bool:
        try:
            data = json.loads((self.folder / MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("fednet") == "checkpoint"

    def _path(self, run_index: int, seed: int) -> Path:
        return self.folder / f"run{run_index}-seed{seed}.pkl"

    def open(self, resume: bool) -> dict[tuple[int, int], Record]:
        """Prepare the folder; return the finished pairs to reuse (``{(run index, seed): record}``).

        Parameters
        ----------
        resume : bool
            Reuse the pairs of an existing checkpoint of the same study; False: discard it.

        Raises
        ------
        OutputError
            The checkpoint's path exists but fednet did not write it (left untouched).
        ConfigError
            ``resume`` and the checkpoint belongs to another study (another file, ``--set``,
            ``--runs``, ``--seed`` or ``--epochs``); nothing is changed.
        """
        finished: dict[tuple[int, int], Record] = {}
        if self.folder.exists() or self.folder.is_symlink():
            if not self.folder.is_dir() or self.folder.is_symlink() or not self._is_ours():
                raise OutputError(f"{self.folder} exists and fednet did not write it; fednet keeps its "
                                  f"checkpoint there: move it away")
            if resume:
                finished = self._load()
            else:
                n = len(list(self.folder.glob("run*-seed*.pkl")))
                if n:
                    log.warning("%s: discarding %d finished (run, seed) pairs of an interrupted run in %s "
                                "(rerun with --resume to keep them)", self.study.name, n, self.folder)
                _remove_marked(self.folder)
        elif resume:
            log.info("%s: no checkpoint at %s; running every (run, seed)", self.study.name, self.folder)
        return finished

    def _load(self) -> dict[tuple[int, int], Record]:
        try:
            stored = (self.folder / "study.json").read_text(encoding="utf-8")
        except OSError:
            stored = None
        if stored != self._study_json:
            raise ConfigError(f"--resume: the checkpoint {self.folder} was written for another study than this "
                              f"one ({self.study.name!r} with these runs, seeds, epochs and settings); rerun the "
                              f"command that wrote it with --resume, or run without --resume to discard it")
        finished = {}
        for i in range(len(self.study.runs)):
            for seed in self.study.seeds:
                path = self._path(i, seed)
                if path.is_file():
                    with open(path, "rb") as fh:
                        finished[(i, seed)] = pickle.load(fh)
        log.info("%s: resuming %d finished (run, seed) pairs from %s", self.study.name, len(finished), self.folder)
        return finished

    def save(self, run_index: int, seed: int, record: Record) -> None:
        """Record one finished pair (written to a temporary name, then renamed: never half a file).

        The folder is made at the first pair, so a study that fails before any pair finishes leaves
        nothing behind.
        """
        if not self.folder.exists():
            self.folder.mkdir()
            (self.folder / MARKER).write_text(json.dumps({"fednet": "checkpoint"}) + "\n", encoding="utf-8")
            (self.folder / "study.json").write_text(self._study_json, encoding="utf-8")
        path = self._path(run_index, seed)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(record, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    def discard(self) -> None:
        """Remove the checkpoint folder (only if it carries fednet's marker)."""
        if self._is_ours():
            _remove_marked(self.folder)
