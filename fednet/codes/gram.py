"""Local statistics of the ridge model and the packing of symmetric matrices (shared by the coded protocols).

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg", Sec. III-A (eq. 3:
``G_i = X_i^T X_i Theta - X_i^T Y_i``), Remark 1 (only the upper triangle of the symmetric ``X_i^T X_i``
travels), Sec. VII (``X_i^T X_i`` and the first gradient are computed offline, in ``Q<k,f>``).
"""

from __future__ import annotations

import numpy as np

from fednet.algebra.fixed_point import FixedPoint

__all__ = ["pack_upper", "unpack_upper", "local_statistics"]


def pack_upper(a: np.ndarray) -> np.ndarray:
    """Upper triangle (with diagonal) of the last two axes, row by row: ``(..., d, d) -> (..., d(d+1)/2)``."""
    d = a.shape[-1]
    iu = np.triu_indices(d)
    return a[..., iu[0], iu[1]]


def unpack_upper(p: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_upper` for symmetric matrices: ``(..., d(d+1)/2) -> (..., d, d)``.

    Raises
    ------
    ValueError
        If the packed length is not ``d(d+1)/2``.
    """
    if p.shape[-1] != d * (d + 1) // 2:
        raise ValueError(f"packed length {p.shape[-1]} is not d(d+1)/2 for d = {d}")
    out = np.empty(p.shape[:-1] + (d, d), dtype=p.dtype)
    iu = np.triu_indices(d)
    out[..., iu[0], iu[1]] = p
    out[..., iu[1], iu[0]] = p
    return out


def local_statistics(q: FixedPoint, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``X^T X`` and the first gradient ``G^(1) = -X^T Y`` (``Theta^(1) = 0``, eq. 3) in ``Q<k,f>``.

    Parameters
    ----------
    q : FixedPoint
    X : ndarray, (n_i, d) float64
    Y : ndarray, (n_i, c) float64

    Returns
    -------
    M : ndarray, (d, d) int64
        ``X^T X`` (exact sum of the quantised data, floored once).
    G1 : ndarray, (d, c) int64
    """
    xb = q.encode(X)
    px = q.prepare(np.ascontiguousarray(xb.T))
    M = q.matmul(px, xb)
    G1 = q.wrap(-q.matmul(px, q.encode(Y)))
    return M, G1
