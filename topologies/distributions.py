"""Per-device values of a topology: one number, a list, or a named distribution.

Study files give a device parameter (MAC rate, link rate, loss) as a number (every device the same),
a list (one per device), or a table naming a distribution and its parameters, drawn once per
network from a seeded stream::

    loss = { dist = "uniform", low = 0.05, high = 0.2 }
    device_mac_rates = { dist = "choice", values = [25e6, 5e6, 2.5e6, 1.25e6] }
    uplink_bps = { dist = "lognormal", median = 5e6, sigma = 0.5, seed = 7 }   # the same for every run seed

=============  ==========================  ===========================================
``dist``       parameters                  draw
=============  ==========================  ===========================================
uniform        low, high                   ``U[low, high)``
loguniform     low, high (> 0)             ``exp(U[log low, log high))``
choice         values, p (optional)        one of ``values``, probabilities ``p``
lognormal      median (> 0), sigma (>= 0)  ``median * exp(sigma * N(0, 1))``
beta           a, b (> 0)                  ``Beta(a, b)`` in (0, 1) (loss probabilities)
=============  ==========================  ===========================================

``seed`` (optional, non-negative) fixes the draw across the study's seeds; without it the draw
follows the run's seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["DISTRIBUTIONS", "check_distribution", "support", "draw", "per_device"]

#: Required and optional parameters of each distribution.
DISTRIBUTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "uniform": (("low", "high"), ()),
    "loguniform": (("low", "high"), ()),
    "choice": (("values",), ("p",)),
    "lognormal": (("median", "sigma"), ()),
    "beta": (("a", "b"), ()),
}


def check_distribution(spec: Mapping[str, Any], what: str = "value") -> dict[str, Any]:
    """Validate a distribution table; return it as a plain dict.

    Raises
    ------
    ValueError
        For an unknown ``dist``, missing or unknown parameters, or parameters out of range (named).
    """
    spec = dict(spec)
    name = spec.get("dist")
    if name not in DISTRIBUTIONS:
        raise ValueError(f"{what}: dist must be one of {sorted(DISTRIBUTIONS)}, got {name!r}")
    need, opt = DISTRIBUTIONS[name]
    missing = [k for k in need if k not in spec]
    extra = sorted(set(spec) - set(need) - set(opt) - {"dist", "seed"})
    if missing or extra:
        raise ValueError(f"{what}: dist {name!r} takes {list(need) + list(opt)} (and seed); "
                         + (f"missing {missing}" if missing else f"unknown {extra}"))
    seed = spec.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"{what}: seed must be a non-negative integer, got {seed!r}")
    num = {k: spec[k] for k in need + opt if k in spec and k not in ("values", "p")}
    for k, v in num.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{what}: {k} must be a finite number, got {v!r}")
    if name in ("uniform", "loguniform") and not spec["low"] < spec["high"]:
        raise ValueError(f"{what}: low must be below high, got low = {spec['low']}, high = {spec['high']}")
    if name == "loguniform" and not spec["low"] > 0:
        raise ValueError(f"{what}: loguniform needs low > 0, got {spec['low']}")
    if name == "lognormal" and not (spec["median"] > 0 and spec["sigma"] >= 0):
        raise ValueError(f"{what}: lognormal needs median > 0 and sigma >= 0, got {spec['median']}, {spec['sigma']}")
    if name == "beta" and not (spec["a"] > 0 and spec["b"] > 0):
        raise ValueError(f"{what}: beta needs a > 0 and b > 0, got a = {spec['a']}, b = {spec['b']}")
    if name == "choice":
        values = spec["values"]
        if not isinstance(values, Sequence) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"{what}: values must be a non-empty list of numbers, got {values!r}")
        p = spec.get("p")
        if p is not None and (len(p) != len(values) or any(x < 0 for x in p) or not math.isclose(sum(p), 1.0)):
            raise ValueError(f"{what}: p must be {len(values)} non-negative probabilities summing to 1, got {p!r}")
    return spec


def support(spec: Mapping[str, Any]) -> tuple[float, float, bool]:
    """``(lo, hi, hi_open)``: every draw lies in ``[lo, hi]`` (``[lo, hi)`` if ``hi_open``)."""
    name = spec["dist"]
    if name in ("uniform", "loguniform"):
        return float(spec["low"]), float(spec["high"]), True
    if name == "choice":
        return float(min(spec["values"])), float(max(spec["values"])), False
    if name == "lognormal":
        return (float(spec["median"]), float(spec["median"]), False) if spec["sigma"] == 0 else (0.0, math.inf, True)
    return 0.0, 1.0, True  # beta


def draw(spec: Mapping[str, Any], n: int, rng: np.random.Generator) -> list[float]:
    """``n`` independent draws of a (checked) distribution from ``rng``."""
    name = spec["dist"]
    if name == "uniform":
        x = rng.uniform(spec["low"], spec["high"], n)
    elif name == "loguniform":
        x = np.exp(rng.uniform(math.log(spec["low"]), math.log(spec["high"]), n))
    elif name == "choice":
        p = spec.get("p")
        x = rng.choice(np.asarray(spec["values"], dtype=float), size=n, p=None if p is None else np.asarray(p))
    elif name == "lognormal":
        x = spec["median"] * np.exp(spec["sigma"] * rng.standard_normal(n))
    else:
        x = rng.beta(spec["a"], spec["b"], n)
    return [float(v) for v in x]


def per_device(value: float | Sequence[float] | Mapping[str, Any], n_devices: int,
               rng: np.random.Generator | None, what: str = "value") -> float | list[float]:
    """Resolve a per-device parameter: a number stays a number, a list is checked, a distribution is drawn.

    Parameters
    ----------
    value : float, sequence of float, or mapping
        One value for every device, one per device, or a distribution table (module docstring).
    n_devices : int
        D.
    rng : numpy.random.Generator or None
        The stream of the draw (ignored for numbers and lists).
    what : str
        The parameter's name, for messages.

    Returns
    -------
    float or list of float
        A number, or D numbers.

    Raises
    ------
    ValueError
        For a list of the wrong length or an invalid distribution.
    """
    if isinstance(value, Mapping):
        spec = check_distribution(value, what)
        if rng is None:
            raise ValueError(f"{what}: drawing from a distribution needs an rng")
        return draw(spec, n_devices, rng)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return float(value)
    if len(value) != n_devices:
        raise ValueError(f"{what} has {len(value)} entries for {n_devices} devices")
    return [float(v) for v in value]
