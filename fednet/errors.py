"""Named errors of fednet: every refusal of bad input is a :class:`FednetError`."""


class FednetError(Exception):
    """Base class of every error fednet raises on purpose (bad input, unmet capacity, failed decoding)."""


class ConfigError(FednetError, ValueError):
    """A configuration value, or a combination of values, that cannot work."""


class CapacityError(ConfigError):
    """A ring or field too small for an intermediate the computation would form."""


class DecodeFailure(FednetError, RuntimeError):
    """A decoding step could not produce the aggregate (too few results, inconsistent shares)."""
