"""Polynomial integer neural networks (PINNs) over a prime field, exact through the RNS kernels.

Shao et al., "DReS-FL" (NeurIPS 2022), Sec. 3.1 and App. E: an MLP with quadratic activations
``h(z) = z**2`` and the squared-error loss has a gradient that is a polynomial with integer
coefficients in the data, of degree ``deg(g) = 2^(L+1)`` for ``L`` quadratic layers, so it can be
evaluated over GF(p) on Lagrange-coded data and decoded (:mod:`fednet.codes.dresfl`).  The parameters
are integers of the signed set ``Z_p``.

Forward (rows are samples; ``W_i`` has shape ``(d_{i-1}, d_i)``)::

    A_0 = X_bar,   Z_i = A_{i-1} W_i + c_i b_i,   A_i = Z_i**2 (i <= L),   R = Z_{L+1} - c_y Y_bar,
    loss = sum(R**2)

and backward ``dZ_{L+1} = 2R``, ``gW_i = A_{i-1}^T dZ_i``, ``gb_i = c_i 1^T dZ_i``,
``dZ_{i-1} = 2 Z_{i-1} * (dZ_i W_i^T)``; every product runs exactly modulo p in
:mod:`fednet.algebra.rns` and charges its MACs.  The public integers ``c_i, c_y`` are the only
difference between the two parameterisations:

* **paper** (``weight_bits=None``): ``c_i = c_y = 1``; the integer network on ``X_bar = Round(2^l x)``
  is the model (Sec. 3.1), its output read in units of ``2^l`` (labels are ``Y_bar = 2^l y``), and the
  update is ``w <- w - Q(eta/(bK) g)`` on the raw integer gradient (Sec. 4.2).  How the paper
  initialises integer weights is not stated; :meth:`FieldPolyMLP.init_params` rounds a scaled uniform
  draw.
* **fixed point** (``weight_bits=f``): the integers are a real network's weights ``w = W / 2^f``; the
  multipliers ``c_1 = 2^l``, ``c_{i+1} = 2^(s_i)`` (``s_i`` the exponent of ``A_i``) and
  ``c_y = 2^(s_out - l)`` keep every layer at a single power-of-two scale, so the integer computation
  equals the real network on the quantised data scaled by ``2^(s_out)``, and the integer gradient is the
  real gradient times ``2^G`` with ``G = 2 s_out - f`` (exactly, no rounding beyond the quantisation of
  weights and data).  This is the variant that trains well in a few hundred steps.

Measured (float64 simulation of the same integer arithmetic, MNIST, 784-64-64-10, batch 64, 3000
steps, 20,000 training images, stochastic rounding Q): the paper parameterisation with integer
weights ``Round(N(0, s))``, ``s`` in {0, 0.3, 1}, lr 0.1 and clipping at 2e4 stays at chance (9-10 %
test accuracy; a zero start has a zero gradient); the fixed-point one with ``f = 8``, ``init_scale =
0.5``, lr 0.1 and clipping the real-unit gradient at norm 64 reaches 91.5 %.  Trained *exactly* over
GF(2^200 - 75) with :class:`FieldSGD` (``benchmarks/bench_field_kernels.py --train 2500``), the
fixed-point network reaches 22.6 / 80.9 / 87.6 / 90.5 % test accuracy (2,000 test images) after
1000 / 1500 / 2000 / 2500 steps.  The paper does not say how its integer weights are scaled or
initialised; a reproduction of Table 2 has to choose.

The field must hold the integer gradient: :meth:`FieldPolyMLP.gradient_bound` bounds it and
:meth:`FieldPolyMLP.integer_gradient` refuses (:class:`FieldOverflowError`) when ``2 bound >= p``.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import numpy as np

from fednet.algebra.capacity import check_resolution
from fednet.algebra.meter import charge
from fednet.errors import CapacityError, ConfigError
from fednet.algebra.rns import RnsArray, RnsContext, rns_context
from fednet.algebra.wideint import WideInts
from fednet.codes.dresfl import DRESFL_PRIME_200, dresfl_update, global_shards, gradient_degree, psi, transform_data
from fednet.learning.model import (Model, Optimizer, Params, ParamsOrArray, Schedule, ConstantSchedule, as_targets,
                                   flatten, unmetered)

__all__ = ["FieldOverflowError", "FieldPolyMLP", "FieldSGD", "PLAIN_MODULI", "global_datasets", "sum_over_k",
           "decoded_sum"]

#: Primes for the exact plain integer gradient (:meth:`FieldPolyMLP.integer_gradient` with ``wide=True``):
#: Poly1305's ``2^130 - 5``, NIST P-192's ``2^192 - 2^64 - 1``, P-224's ``2^224 - 2^96 + 1`` and Curve25519's
#: ``2^255 - 19`` (RNS bases of 16, 21, 24 and 27 moduli at ``max_inner = 4096``; ``2^440 - 33``: 44).
PLAIN_MODULI = (2**130 - 5, 2**192 - 2**64 - 1, 2**224 - 2**96 + 1, 2**255 - 19)


class FieldOverflowError(ValueError):
    """The prime is too small for the integer values of the polynomial network (they would wrap)."""


class FieldPolyMLP(Model):
    """MLP with quadratic activations and squared-error loss over GF(p) (DReS-FL Sec. 3.1, App. E).

    Parameters
    ----------
    sizes : sequence of int
        Layer widths ``(d_0, d_1, ..., d_{L+1})``; the paper's MNIST network is ``(784, 64, 64, 10)``
        (``L = 2`` quadratic layers, ``deg(g) = 8``).
    q : int
        The prime (Table 4: ``2**200 - 75`` or ``2**440 - 33``).
    data_bits : int
        ``l`` of the data transformation ``X_bar = Round(2^l (x + c))`` (Table 4: 4 for MNIST).
    data_shift : float
        ``c`` of the transformation (footnote 4; 0 in the paper).
    weight_bits : int or None
        ``None``: the paper's integer network; ``f``: fixed-point weights ``w = W / 2^f`` (module
        docstring).
    init_scale : float
        Initial real weights are uniform in ``+-init_scale / sqrt(fan_in)`` (then ``Round(2^f w)``);
        biases start at 0.
    max_inner : int
        Largest inner dimension of the RNS products (>= the widest layer and the batch).

    Attributes
    ----------
    n_hidden : int
        ``L``.
    degree : int
        ``deg(g) = 2^(L+1)`` as a polynomial in the (coded) data.
    bias_mult : list of int
        ``c_i`` per layer.
    label_mult : int
        ``c_y``.
    out_bits : int
        Exponent of the output's scale (``forward`` divides by ``2^out_bits``).
    grad_bits : int
        ``G``: the integer gradient is the real one times ``2^G``.
    ctx : RnsContext

    Raises
    ------
    ValueError
        If fewer than two sizes are given or a size is not positive.
    """

    def __init__(self, sizes=(784, 64, 64, 10), q: int = DRESFL_PRIME_200, *, data_bits: int = 4,
                 data_shift: float = 0.0, weight_bits: int | None = None, init_scale: float = 1.0,
                 max_inner: int = 4096):
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"sizes must hold at least two positive widths, got {sizes}")
        self.sizes = sizes
        self.n_inputs, self.n_outputs = sizes[0], sizes[-1]
        self.q = int(q)
        self.l = int(data_bits)
        self.c = float(data_shift)
        self.f = None if weight_bits is None else int(weight_bits)
        self.init_scale = float(init_scale)
        self.n_layers = len(sizes) - 1
        self.n_hidden = self.n_layers - 1
        self.degree = gradient_degree(self.n_hidden)
        if self.f is None:
            self.bias_mult = [1] * self.n_layers
            self.label_mult = 1
            self.out_bits = self.l
            self.grad_bits = 2 * self.l
            self._param_bits = 0
        else:
            s_in = self.l
            self.bias_mult = []
            for i in range(self.n_layers):
                self.bias_mult.append(2**s_in)
                s_z = self.f + s_in
                s_in = 2 * s_z
            self.out_bits = s_z
            self.label_mult = 2 ** (self.out_bits - self.l)
            self.grad_bits = 2 * self.out_bits - self.f
            self._param_bits = self.f
        self.ctx = rns_context(self.q, int(max_inner))

    def __repr__(self) -> str:
        mode = "paper integer" if self.f is None else f"fixed point f={self.f}"
        return f"FieldPolyMLP(sizes={self.sizes}, q: {self.q.bit_length()} bits, l={self.l}, {mode}, deg(g)={self.degree})"

    # ------------------------------------------------------------------ parameters
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``W1 (d0, d1), b1 (d1,), W2, b2, ...`` in this order."""
        out = {}
        for i in range(self.n_layers):
            out[f"W{i + 1}"] = (self.sizes[i], self.sizes[i + 1])
            out[f"b{i + 1}"] = (self.sizes[i + 1],)
        return out

    def init_params(self, seed: int | np.random.Generator | None = None) -> Params:
        """Integer parameters ``Round(2^f w)``, ``w`` uniform in ``+-init_scale/sqrt(fan_in)``; biases 0.

        Returns
        -------
        Params
            int64 arrays in ``Z_p``.
        """
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        out = {}
        for name, shape in self.param_shapes().items():
            if name.startswith("W"):
                w = rng.uniform(-1.0, 1.0, shape) * self.init_scale / np.sqrt(shape[0])
                out[name] = np.rint(np.ldexp(w, self._param_bits)).astype(np.int64)
            else:
                out[name] = np.zeros(shape, dtype=np.int64)
        return out

    def zeros(self) -> Params:
        """All-zero integer parameters (int64) of the right shapes."""
        return {k: np.zeros(s, dtype=np.int64) for k, s in self.param_shapes().items()}

    def dequantize(self, params: ParamsOrArray) -> Params:
        """Real parameters ``W / 2^f`` (weights) of the fixed-point network (float64; ``f = 0`` for paper)."""
        p = self.as_params(params)
        return {k: np.asarray(a).astype(np.float64) * 2.0 ** -self._param_bits for k, a in p.items()}

    def transform(self, x: np.ndarray, y: np.ndarray | None = None):
        """Data transformation of Sec. 4.1 for features (and targets): ``Round(2^l (x + c))``, ``Round(2^l y)``.

        Returns
        -------
        xbar : ndarray of int64, shape (b, d_0)
        ybar : ndarray of int64, shape (b, d_{L+1}) (only if ``y`` is given; class labels become one-hot)
        """
        xbar = transform_data(x, self.l, self.c)
        if y is None:
            return xbar
        return xbar, transform_data(as_targets(np.asarray(y), self.n_outputs), self.l)

    # ------------------------------------------------------------------ exact field computation
    def _rns_params(self, params: ParamsOrArray, ctx: RnsContext | None = None):
        p = self.as_params(params)
        ctx = ctx or self.ctx
        Ws, bterms = [], []
        for i in range(self.n_layers):
            W = np.asarray(p[f"W{i + 1}"])
            b = np.asarray(p[f"b{i + 1}"])
            if W.shape != self.param_shapes()[f"W{i + 1}"] or b.shape != (self.sizes[i + 1],):
                raise ValueError(f"layer {i + 1}: parameter shapes {W.shape}, {b.shape} do not match {self.sizes}")
            Ws.append(ctx.from_signed(W))
            bterms.append(ctx.from_signed(b.astype(object) * self.bias_mult[i]))
        return Ws, bterms

    def _forward_rns(self, Ws, bterms, X: RnsArray):
        ctx = X.ctx
        acts, zs = [X], []
        for i in range(self.n_layers):
            z = ctx.add(ctx.matmul(acts[-1], Ws[i]), bterms[i])
            zs.append(z)
            if i < self.n_layers - 1:
                acts.append(ctx.square(z))
        return acts, zs

    def _gradient_rns(self, params: ParamsOrArray, X: RnsArray, Y: RnsArray) -> dict[str, RnsArray]:
        ctx = X.ctx
        Ws, bterms = self._rns_params(params, ctx)
        acts, zs = self._forward_rns(Ws, bterms, X)
        if self.label_mult != 1:
            Y = ctx.multiply(Y, ctx.from_signed(np.full(Y.shape, self.label_mult, dtype=object)))
        dz = ctx.scale(2, ctx.add(zs[-1], Y, scale_b=-1))
        grads: dict[str, RnsArray] = {}
        for i in reversed(range(self.n_layers)):
            grads[f"W{i + 1}"] = ctx.matmul(acts[i].T, dz)
            gb = ctx.sum_rows(dz)
            if self.bias_mult[i] != 1:
                gb = ctx.multiply(gb, ctx.from_signed(np.full(gb.shape, self.bias_mult[i], dtype=object)))
            grads[f"b{i + 1}"] = gb
            if i > 0:
                da = ctx.matmul(dz, Ws[i].T)
                dz = ctx.scale(2, ctx.multiply(zs[i - 1], da))
        return {k: grads[k] for k in self.param_shapes()}

    def field_gradient(self, params: ParamsOrArray, x_field: np.ndarray, y_field: np.ndarray, *,
                       as_rns: bool = False) -> Params:
        """The gradient polynomial ``g~(X, Y; w) = g(X, Y; w) mod p`` on field data (e.g. coded data).

        Parameters
        ----------
        params : Params
            Signed integers in ``Z_p``.
        x_field : ndarray, shape (b, d_0), over GF(p) (canonical), or RnsArray of ``self.ctx``
            Features, e.g. a client's coded minibatch ``X~_j^(I_t)`` (Sec. 4.2), possibly kept in
            residue form (:func:`fednet.codes.dresfl.share_dataset` with ``as_rns=True, ctx=model.ctx``).
        y_field : ndarray, shape (b, d_{L+1}), over GF(p), or RnsArray

        as_rns : bool
            Return the gradient as :class:`fednet.algebra.rns.RnsArray` (an upload that
            :func:`fednet.codes.dresfl.decode_gradients` decodes without converting it).

        Returns
        -------
        Params
            Canonical field elements (Python-int object arrays for ``p >= 2**62``), or RnsArrays;
            charges the MACs of the forward and backward pass (``b (d_0 d_1 + ...)`` per product, one
            per element-wise op).
        """
        X = x_field if isinstance(x_field, RnsArray) else self.ctx.from_field(x_field)
        Y = y_field if isinstance(y_field, RnsArray) else self.ctx.from_field(y_field)
        for name, arr in (("x_field", X), ("y_field", Y)):
            if arr.ctx is not self.ctx:
                raise ValueError(f"{name} is in residues of another RnsContext; share with ctx=model.ctx")
        grads = self._gradient_rns(params, X, Y)
        if as_rns:
            return grads
        return {k: v.to_field() for k, v in grads.items()}

    def field_gradient_probe(self, params: Params, b: int) -> Params:
        """:meth:`field_gradient` on zeros: parameters of ``params``' shapes, a ``b``-row batch.

        Its MACs are those of a client's coded gradient at these shapes (they do not depend on the values): how
        timing mode measures the step once, without coded data.
        """
        return self.field_gradient({k: np.zeros_like(v) for k, v in params.items()},
                                   np.zeros((b, self.sizes[0]), np.int64), np.zeros((b, self.sizes[-1]), np.int64))

    def integer_gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray, *,
                         transformed: bool = False, wide: bool = False) -> Params:
        """Exact integer gradient ``psi(g~)`` of ``||Y_bar - f(X_bar)||^2`` (summed over the batch).

        Parameters
        ----------
        params : Params
        x : ndarray, shape (b, d_0)
            Real features (or ``X_bar`` integers if ``transformed``).
        y : ndarray, shape (b,) labels or (b, d_{L+1}) targets (or ``Y_bar`` if ``transformed``).
        transformed : bool
            The data are already ``(X_bar, Y_bar)``.
        wide : bool
            Return :class:`~fednet.algebra.wideint.WideInts` (the same integers as 16-bit digit columns,
            :meth:`~fednet.algebra.rns.RnsContext.to_signed_wide` within the bound below; no Python ints),
            computed modulo a smaller prime when one holds them (:meth:`_plain_context`).

        Returns
        -------
        Params
            Signed Python integers (object arrays), or WideInts: the integer gradient, computed over GF(p).

        Raises
        ------
        FieldOverflowError
            If :meth:`gradient_bound` does not prove ``|g| < (p-1)/2``.
        """
        xb, yb = (np.asarray(x), np.asarray(y)) if transformed else self.transform(x, y)
        bound = self.gradient_bound(params, xb, yb)
        if 2 * bound >= self.q - 1:
            raise FieldOverflowError(
                f"integer gradient bound 2^{np.log2(max(bound, 1)):.1f} does not fit the signed range of the "
                f"{self.q.bit_length()}-bit prime; use a larger prime or fewer weight_bits"
            )
        B = math.ceil(bound)
        ctx = self._plain_context(B, params, xb, yb) if wide else self.ctx
        # |g| <= bound < (p-1)/2, where psi (eq. 6) and the symmetric signed map agree
        grads = self._gradient_rns(params, ctx.from_signed(xb), ctx.from_signed(yb))
        if not wide:
            return {k: ctx.to_signed(v) for k, v in grads.items()}
        out = {k: ctx.to_signed_wide(v, B) if 8 * B < ctx.q else None for k, v in grads.items()}
        if any(w is None for w in out.values()):     # a check failed (or 8 bound >= q): over GF(p), as Python ints
            plain = self.integer_gradient(params, xb, yb, transformed=True)
            return {k: WideInts.from_ints(v, -(-(self.q.bit_length() + 1) // 16)) for k, v in plain.items()}
        return out

    def _plain_context(self, bound: int, params: ParamsOrArray, xb: np.ndarray, yb: np.ndarray) -> RnsContext:
        """The RNS context of the smallest modulus of :data:`PLAIN_MODULI` (below ``q``) above ``8 v``, ``v`` the
        largest of the gradient bound and every input ``|X_bar|, |c_y Y_bar|, |W|, |c_i b_i|, c_y, c_i`` (else
        ``self.ctx``).

        The gradient is a polynomial with integer coefficients in these inputs, so computed modulo any odd
        ``q'`` it is ``g mod q'``, and ``g`` is its balanced representative while ``2 |g| < q'``: the same integers
        as over GF(p), on a base of fewer moduli (27 instead of 44 at ``2^255 - 19`` against ``2^440 - 33``).
        """
        p = self.as_params(params)
        big = [bound, int(np.abs(xb).max(initial=0)), int(np.abs(yb).max(initial=0)) * self.label_mult,
               self.label_mult, *self.bias_mult]
        for i in range(self.n_layers):
            big.append(int(np.abs(np.asarray(p[f"W{i + 1}"])).max(initial=0)))
            big.append(int(np.abs(np.asarray(p[f"b{i + 1}"])).max(initial=0)) * self.bias_mult[i])
        for m in PLAIN_MODULI:
            if m < self.q and 8 * max(big) < m:
                return rns_context(m, self.ctx.max_inner)
        return self.ctx

    def gradient_bound(self, params: ParamsOrArray, xbar: np.ndarray, ybar: np.ndarray) -> float:
        """Upper bound on ``max |g|`` over the integer gradient, by the network on absolute values.

        Runs the forward and backward pass on ``|X_bar|, |W|, |c b|, |c_y Y_bar|`` in float64 (all terms
        non-negative) and inflates by ``1 + 1e-6`` for float rounding.  Not metered (a planning check).

        Returns
        -------
        float
            Bound (``inf`` if it exceeds float64).
        """
        p = self.dequantize_int(params)
        with np.errstate(over="ignore", invalid="ignore"):
            a = [np.abs(np.asarray(xbar, dtype=np.float64))]
            zs = []
            for i in range(self.n_layers):
                z = a[-1] @ np.abs(p[f"W{i + 1}"]) + self.bias_mult[i] * np.abs(p[f"b{i + 1}"])
                zs.append(z)
                if i < self.n_layers - 1:
                    a.append(z * z)
            dz = 2 * (zs[-1] + self.label_mult * np.abs(np.asarray(ybar, dtype=np.float64)))
            m = 0.0
            for i in reversed(range(self.n_layers)):
                m = max(m, float((a[i].T @ dz).max()), float(self.bias_mult[i] * dz.sum(axis=0).max()))
                if i > 0:
                    dz = 2 * zs[i - 1] * (dz @ np.abs(p[f"W{i + 1}"]).T)
        return m * (1 + 1e-6) if np.isfinite(m) else float("inf")

    def dequantize_int(self, params: ParamsOrArray) -> Params:
        """Parameters as float64 integers (no scaling), for bounds."""
        p = self.as_params(params)
        return {k: np.asarray(a).astype(np.float64) for k, a in p.items()}

    # ------------------------------------------------------------------ Model interface
    def forward(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """Real output ``Z_{L+1} / 2^out_bits`` of the exact integer network on ``X_bar``; metered.

        Returns
        -------
        ndarray of float64, shape (b, d_{L+1})
        """
        Ws, bterms = self._rns_params(params)
        _, zs = self._forward_rns(Ws, bterms, self.ctx.from_signed(self.transform(x)))
        z = psi(zs[-1].to_field(), self.q)
        return np.asarray(z).astype(np.float64) * 2.0 ** -self.out_bits

    def loss(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> float:
        """``(1/b) sum_j ||y_j - f(x_j)||^2`` in real units (labels quantised like the data); metered."""
        out = self.forward(params, x)
        yb = transform_data(as_targets(np.asarray(y), self.n_outputs), self.l) * 2.0 ** -self.l
        return float(np.sum((out - yb) ** 2) / out.shape[0])

    def gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> Params:
        """Real-unit gradient ``psi(g) 2^-G`` of the summed squared error (float64); metered."""
        g = self.integer_gradient(params, x, y)
        return {k: np.ldexp(np.asarray(a).astype(np.float64), -self.grad_bits) for k, a in g.items()}

    def float_gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> Params:
        """Reference: gradient of the same network in float64 at the dequantised weights and quantised data.

        Real units (comparable to :meth:`gradient`); not metered.
        """
        xb, yb = self.transform(x, y)
        xr = xb * 2.0 ** -self.l if self.f is not None else xb.astype(np.float64)
        yr = yb * 2.0 ** -self.l
        p = self.dequantize(params)
        a, zs = [xr], []
        for i in range(self.n_layers):
            z = a[-1] @ p[f"W{i + 1}"] + p[f"b{i + 1}"]
            zs.append(z)
            if i < self.n_layers - 1:
                a.append(z * z)
        out = zs[-1] * (2.0 ** -self.l if self.f is None else 1.0)
        dz = 2 * (out - yr) * (2.0 ** -self.l if self.f is None else 1.0)
        g = {}
        for i in reversed(range(self.n_layers)):
            g[f"W{i + 1}"] = a[i].T @ dz
            g[f"b{i + 1}"] = dz.sum(axis=0)
            if i > 0:
                dz = 2 * zs[i - 1] * (dz @ p[f"W{i + 1}"].T)
        return {k: g[k] for k in self.param_shapes()}

    def _float_forward(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        xb = self.transform(x)
        a = xb * 2.0 ** -self.l if self.f is not None else xb.astype(np.float64)
        p = self.dequantize(params)
        for i in range(self.n_layers):
            z = a @ p[f"W{i + 1}"] + p[f"b{i + 1}"]
            a = z * z if i < self.n_layers - 1 else z
        return a if self.f is not None else a * 2.0 ** -self.l

    def predict(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """Predicted classes (argmax of the float64 network at the dequantised weights; not metered)."""
        return np.argmax(self._float_forward(params, x), axis=1).astype(np.int64)

    def evaluate(self, params: ParamsOrArray, x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        """``(accuracy, mean squared error)`` of the float64 network at the dequantised weights (not metered)."""
        out = self._float_forward(params, x)
        labels = np.asarray(labels)
        y = as_targets(labels, self.n_outputs)
        return float(np.mean(np.argmax(out, axis=1) == labels)), float(np.sum((out - y) ** 2) / out.shape[0])


class FieldSGD(Optimizer):
    """DReS-FL's server update (Sec. 4.2, eq. 7): ``w <- w - Q(eta/m c g 2^-shift)`` in ``Z_p``.

    ``gradient_sum`` is the integer gradient (``psi`` of the decoded one, summed over the K global
    minibatches); for the fixed-point network it is converted to parameter units (``shift = G - f``),
    for the paper's integer network ``shift = 0``.  Clipping (Table 4) uses the real-unit norm
    (``2^-G g`` for fixed point, the raw integer norm for the paper's network).

    Parameters
    ----------
    model : FieldPolyMLP
    schedule : Schedule or float
        ``eta`` per round (App. B: 0.1, times 0.65 every 1500 rounds).
    rng : numpy.random.Generator
        Secret stream of the stochastic rounding Q.
    max_norm : float, optional
        Clipping norm (Table 4: 2e4 for MNIST).
    """

    def __init__(self, model: FieldPolyMLP, schedule: Schedule | float, rng: np.random.Generator,
                 max_norm: float | None = None):
        self.model = model
        self.schedule = schedule if isinstance(schedule, Schedule) else ConstantSchedule(schedule)
        self.rng = rng
        self.max_norm = max_norm

    def step(self, params: ParamsOrArray, gradient_sum: ParamsOrArray, m_used: int, epoch: int) -> Params:
        """New integer parameters; charges one MAC per parameter (the scaled subtraction).

        Raises
        ------
        ValueError
            If ``m_used < 1`` or a parameter leaves ``Z_p``.
        """
        m = self.model
        p = m.as_params(params)
        g = m.as_params(gradient_sum)
        charge(m.n_params)
        shift = 0 if m.f is None else m.grad_bits - m.f
        clip_bits = 0 if m.f is None else m.grad_bits
        return dresfl_update(p, g, self.schedule(epoch), int(m_used), m.q, self.rng,
                             max_norm=self.max_norm, shift=shift, clip_bits=clip_bits)


def global_datasets(model: FieldPolyMLP, X: Sequence[np.ndarray], Y: Sequence[np.ndarray], shard_rows: Sequence[int],
                    K: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``K`` global data sets ``[X_bar^(k)_1; ...; X_bar^(k)_N]`` and their targets, transformed (Sec. 4.1).

    What DReS-FL's decoding recovers the gradients of (:func:`fednet.codes.dresfl.global_shards`, then
    :meth:`FieldPolyMLP.transform`; element-wise, so the rows of a round can be selected afterwards).

    Parameters
    ----------
    model : FieldPolyMLP
    X, Y : sequences of N ndarrays, (m_i, d_0) and (m_i,) labels or (m_i, d_{L+1}) targets
    shard_rows : sequence of N ints
        ``m_i / K`` (:func:`fednet.codes.dresfl.shard_rows`).
    K : int

    Returns
    -------
    list of K (xbar, ybar)
        int64 arrays, shapes ``(sum_i m_i / K, d_0)`` and ``(sum_i m_i / K, d_{L+1})``.
    """
    return [model.transform(x, y) for x, y in zip(global_shards(X, shard_rows, K), global_shards(Y, shard_rows, K))]


def sum_over_k(gradients: Sequence[Params], names: Sequence[str]) -> Params:
    """``sum_k g_k`` of each parameter in ``names``, left to right (``g_0 + g_1 + ...``; WideInts stay WideInts)."""
    return {n: functools.reduce(operator.add, (g[n] for g in gradients)) for n in names}


def decoded_sum(decoded: Sequence[Params], q: int, names: Sequence[str]) -> np.ndarray:
    """``sum_k psi(g_k)`` (eq. 6) of DReS-FL's K decoded global gradients, flattened: ``(d_w,)`` Python ints.

    Parameters
    ----------
    decoded : sequence of K Params over GF(q)
        :func:`fednet.codes.dresfl.decode_gradients`' output.
    q : int
    names : sequence of str
        The parameters, in the order of :func:`~fednet.learning.model.flatten`.
    """
    return np.sum([flatten({n: psi(gk[n], q).astype(object) for n in names}) for gk in decoded], axis=0)


def check_dresfl_fits(model: "FieldPolyMLP", params: dict, X: Sequence[np.ndarray], Y: Sequence[np.ndarray], *,
                      p: int, element_bits: int | None, batch_size: int, m_coded: int, K: int, data_bits: int,
                      data_shift: float, weight_bits: int | None, init_scale: float) -> None:
    """Refuse, before anything runs, DReS-FL parameters that do not fit the data and the field (issue 33).

    - ``element_bits`` below ``ceil(log2 p)`` (the wire would carry field elements too short);
    - ``batch_size`` above the ``m~`` coded rows it is drawn from (without replacement);
    - ``data_bits`` (``weight_bits``) that round most nonzero features (initial weights) to zero
      (:func:`fednet.algebra.capacity.check_resolution`);
    - a prime whose signed range ``(p-1)/2`` cannot hold the transformed data, the labels times
      ``c_y``, the bias multipliers ``c_i`` or the initial integer weights.

    A gradient that outgrows the field during training is a recorded failure at its round
    (:mod:`fednet.protocol.finite`).

    Parameters
    ----------
    model : FieldPolyMLP
    params : dict
        The initial integer weights.
    X, Y : sequences of ndarray
        The clients' data.
    p, element_bits, batch_size, K, data_bits, data_shift, weight_bits, init_scale
        The protocol's parameters (:class:`fednet.protocols.dresfl.DReSFLConfig`).
    m_coded : int
        ``m~``, the coded rows a minibatch is drawn from.

    Raises
    ------
    fednet.errors.ConfigError, fednet.errors.CapacityError
        Naming the parameter, its value and a setting that works.
    """
    field_bits = math.ceil(math.log2(p))
    if element_bits is not None and element_bits < field_bits:
        raise ConfigError(f"element_bits = {element_bits} is below the {field_bits} bits of an element of "
                          f"GF(p), p = {p}: every coded message would be counted too short; leave it unset "
                          f"(ceil(log2 p) = {field_bits}) or raise it")
    if batch_size > m_coded:
        raise ConfigError(f"batch_size = {batch_size} exceeds the m~ = {m_coded} coded rows the "
                          f"minibatch is drawn from without replacement (K = {K}); use batch_size <= "
                          f"{m_coded}")
    shift = data_shift
    check_resolution([x + shift for x in X] if shift else list(X), data_bits,
                     "data_bits", "the training features" + (" plus data_shift" if shift else ""))
    sizes = model.sizes
    if weight_bits is not None:         # the initial weights' magnitudes (a draw of their law, not the model's)
        rng = np.random.default_rng(0)
        check_resolution([rng.uniform(-1.0, 1.0, min(4096, a * b)) * init_scale / math.sqrt(a)
                          for a, b in zip(sizes[:-1], sizes[1:])], weight_bits, "weight_bits",
                         "the initial weights")
    half = (p - 1) // 2
    x_max = max(max(abs(float(x.max()) + shift), abs(float(x.min()) + shift)) if x.size else 0.0
                for x in X)
    y_max = max(float(np.abs(y).max()) if y.size else 0.0 for y in Y)
    w_max = max((int(np.abs(np.asarray(v, dtype=object)).max()) for v in params.values() if v.size),
                default=0)
    needs = {"the transformed features Round(2^l (x + c))": round(2.0 ** model.l * x_max),
             "the transformed labels times c_y": round(2.0 ** model.l * y_max) * model.label_mult,
             "the bias multipliers c_i": max(model.bias_mult, default=1),
             "the initial integer weights": w_max}
    x0, y0 = X[0][:batch_size], Y[0][:batch_size]
    with unmetered(), np.errstate(all="ignore"):    # the initial gradient of one real minibatch
        needs["the integer gradient of the initial model on a minibatch of client 0"] = \
            model.gradient_bound(params, *model.transform(x0, y0))
    for what, need in needs.items():
        if not need <= half:
            bits = "more than 1024" if not math.isfinite(need) else f"{math.log2(max(need, 1)):.1f}"
            need_bits = "1024" if not math.isfinite(need) else f"{math.ceil(math.log2(2 * need + 1))}"
            raise CapacityError(f"p = {p} ({p.bit_length()} bits) is too small for {what} (up to "
                                f"2^{bits}, above (p-1)/2): use a prime above 2^{need_bits} or fewer "
                                f"data_bits / weight_bits")
