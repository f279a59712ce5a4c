"""One family of errors for bad input and failed runs.

Every error fednet raises on purpose (a bad study or parameter, a data file it cannot use, an
output folder it must not touch, a round that cannot be decoded) is a :class:`FednetError`.
The ``fednet`` command prints any of them as one line-oriented message on stderr and exits with
status 2; anything else is a bug and keeps its traceback.

The classes keep the built-in bases that existing code catches (``ValueError`` for bad
configuration, ``RuntimeError`` for data and decoding failures, ``OSError`` for output folders),
so ``except ValueError`` around a config still works.

==========================  =================================  =============================
class                        built-in base                       raised for
==========================  =================================  =============================
:class:`ConfigError`         ``ValueError``                      a study or parameter that does
                                                                 not validate (the message names
                                                                 the key and its value)
:class:`CapacityError`       ``ValueError`` (via ConfigError)    a ring or field too small for
                                                                 the values it must carry
:class:`DataError`           ``RuntimeError``                    a data file that is missing,
                                                                 corrupted or malformed
:class:`OutputError`         ``OSError``                         an output folder fednet may not
                                                                 write or replace (user files,
                                                                 another run's lock)
:class:`DecodeFailure`       ``RuntimeError``                    a round that cannot complete
                                                                 (too few results to decode)
:class:`SetupFailure`        ``RuntimeError`` (via               a setup phase that cannot
                             DecodeFailure)                      complete (devices absent under
                                                                 the protocol's reaction)
:class:`ClusterError`        ``RuntimeError``                    a Dask cluster that cannot run
                                                                 the study (no worker left, or a
                                                                 task whose workers all died)
:class:`PluginError`         ``RuntimeError``                    a study's own code (protocol or
                                                                 network builder) that raised
                                                                 while fednet ran it
:class:`TrainingFailure`     ``RuntimeError``                    training that cannot go on: a
                                                                 non-finite loss or parameter,
                                                                 or values overflowing the field
                                                                 at run time (``strict`` runs;
                                                                 otherwise recorded in the trace)
==========================  =================================  =============================

This module imports nothing from fednet, so every layer may use it.
"""

from __future__ import annotations

__all__ = ["FednetError", "ConfigError", "CapacityError", "DataError", "OutputError", "OutputLocked",
           "DecodeFailure", "SetupFailure", "TrainingFailure", "ClusterError", "PluginError"]


class FednetError(Exception):
    """Base of every error fednet raises on purpose (bad input, unusable data or output, failed decoding)."""


class ConfigError(FednetError, ValueError):
    """A configuration (study file, protocol parameters, network) that does not validate.

    The message names the offending key and its value.
    """


class CapacityError(ConfigError):
    """A fixed-point ring or prime field too small for the values an exact computation forms.

    The message names the parameter, the bound, and the smallest setting that works.
    """


class DataError(FednetError, RuntimeError):
    """A data file that is missing, cannot be downloaded, is corrupted or is malformed."""


class OutputError(FednetError, OSError):
    """An output folder fednet must not write or replace (it holds files fednet did not create,
    is the current folder, or is not a folder)."""


class OutputLocked(OutputError):
    """Another live fednet process is writing to the same output folder (the message names its pid)."""


class DecodeFailure(FednetError, RuntimeError):
    """A round that cannot complete: too few results reached the server to decode the aggregate."""


class SetupFailure(DecodeFailure):
    """A setup phase (round 0) that cannot complete: devices were absent and the protocol's reaction
    (``Protocol.setup_dropouts``: ``"fail"``, or ``"reshare"`` beyond ``max_setup_attempts``) gives up.

    The message names the protocol, the absent devices and the number of attempts.
    """


class TrainingFailure(FednetError, RuntimeError):
    """Training that cannot go on: the loss or a model parameter is no longer finite (the model diverged),
    or the values of an exact computation overflowed its ring or field during a round.

    Raised only under ``strict = true``; otherwise the run ends at that round as a recorded failure (the
    trace's ``failure`` column, the summary's ``failed``; :mod:`fednet.protocol.finite`). The message
    names the run, the round and the reason.
    """


class ClusterError(FednetError, RuntimeError):
    """A Dask cluster that cannot run the study: no worker left for longer than the stated timeout
    (:data:`fednet.study.parallel.WORKERLESS_TIMEOUT_S`), e.g. a worker without a nanny that died."""


class PluginError(FednetError, RuntimeError):
    """A study's own code (a ``"module:Name"`` protocol or network builder, or an installed plugin) that raised
    while fednet ran it: the message names the code, what fednet was doing (constructing it, a round, its
    ``Config`` or ``check``), the file and line where it raised, and the exception
    (:func:`fednet.study.usercode.user_code_error`). fednet's own protocols keep their tracebacks (a bug)."""
