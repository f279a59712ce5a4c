"""Torch ``nn.Module`` models behind the :class:`~fednet.learning.model.Model` interface.

:class:`TorchModel` wraps any user module; :func:`mlp` and :class:`MLPModel` build the
multilayer perceptrons of the papers' baselines (DReS-FL, Sec. 6 and App. B: 784-64-64-10 with
ReLU; the float counterpart of its polynomial network uses :class:`Square`, the quadratic
activation). Parameters travel as :data:`~fednet.learning.model.Params` of NumPy arrays named as
``module.named_parameters()`` names them (``"0.weight"``, ``"0.bias"``, ...); every call runs the
module *functionally* at the given parameters (:func:`torch.func.functional_call`), so the model
holds no training state and a server and its devices can evaluate it at different parameters.

MACs. The MACs a call charges to the open meters (:mod:`fednet.algebra.meter`) are counted by
:class:`torch.utils.flop_counter.FlopCounterMode` from the operators actually dispatched, at the
shapes actually run, in the forward *and* the backward pass: ``MACs = FLOPs / 2`` of the
contractions it counts (``mm``, ``addmm``, ``bmm``, convolutions, attention). A ``Linear(in, out)``
layer on a ``b``-row batch thus charges ``b in out`` forward, ``b in out`` for its weight gradient
and, unless it is the first layer (autograd skips ``dL/dx`` for an input that needs no
gradient), ``b in out`` for its input gradient. Element-wise work (bias additions, activations,
the loss) is not a contraction and is not charged, as in :mod:`fednet.learning.models`. The count
of a call is measured once per (kind of call, input shape) and then reused when ``cache_macs`` is
true (the default: the cost of a module whose control flow depends on shapes only); with
``cache_macs=False`` every call runs under the counter (about 6x slower on a small MLP).

Speed: for a plain MLP (an ``nn.Sequential`` of ``nn.Linear`` layers with ``nn.ReLU`` between them,
flat inputs, cross-entropy) :meth:`TorchModel.gradient` and :meth:`TorchModel.gradient_with_input`
skip autograd once the call's MACs are cached: :func:`_mlp_gradient` calls the very ATen kernels
that autograd dispatches for that graph, with the same operand layouts, so the gradients are
bit-identical (``tests/test_learning_torch_models.py`` checks it over random shapes and batches);
every other module, loss or uncached call runs autograd. The constructor imports ``torch._dynamo``
(with sympy, ~120,000 objects), which :class:`FlopCounterMode` would otherwise import at the first
metered call: a protocol's run (under :func:`fednet.configure_host`) freezes the objects alive after its
set-up and collects the oldest generation every few rounds (:data:`fednet.protocol.base.GC_ROUNDS`), and
objects imported mid-run made each such collection take ~0.1 s of host time.

Determinism: :meth:`TorchModel.init_params` resets the module's layers under
``torch.manual_seed(seed)`` inside :func:`torch.random.fork_rng`, so the initial parameters are a
function of the seed alone and the global torch random state is left untouched. Keep torch on one
thread (``torch.set_num_threads(1)``) where floats must repeat across machines.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from fednet.algebra.meter import charge
from fednet.learning.model import Model, Params, ParamsOrArray, as_targets

__all__ = ["Square", "PolynomialLayer", "ACTIVATIONS", "mlp", "TorchModel", "MLPModel", "count_macs", "mlp_plan"]


class Square(nn.Module):
    """Quadratic activation ``sigma(z) = z^2`` (element-wise), the activation of polynomial networks.

    Source: DReS-FL (Shao et al.), Sec. 3.1 and App. E; FedVS (Li et al.), Sec. 3.
    """

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # noqa: D102
        """``z * z`` element-wise: any shape in, the same shape out."""
        return z * z


class PolynomialLayer(nn.Module):
    """Polynomial network layer ``H = sum_{i=1}^{D} X^i W^i`` (element-wise powers ``X^i``).

    Source: FedVS (Li et al.), Sec. 3, eq. (1): client ``n``'s bottom model over its feature block
    ``X_n`` (``D_n`` terms; FashionMNIST: a 1-layer PN, App. C). The float counterpart of the
    field model that FedVS evaluates on coded data; wrap it in :class:`TorchModel`. Its MACs are
    the ``D`` products ``X^i W^i`` (``b p e`` each); the element-wise powers are not contractions
    and are not charged.

    Parameters
    ----------
    n_inputs : int
        Features ``p_n`` of the block.
    n_outputs : int
        Embedding width ``e``.
    degree : int
        Number of terms ``D >= 1``.

    Attributes
    ----------
    powers : nn.ModuleList of nn.Linear
        ``powers[i-1].weight`` is ``(W^i)^T``, shape ``(e, p_n)``; parameter names
        ``"powers.0.weight"``, ... (no bias).
    """

    def __init__(self, n_inputs: int, n_outputs: int, degree: int = 1) -> None:
        super().__init__()
        if isinstance(degree, bool) or int(degree) != degree or degree < 1:
            raise ValueError(f"degree must be a positive integer, got {degree!r}")
        self.powers = nn.ModuleList([nn.Linear(n_inputs, n_outputs, bias=False) for _ in range(int(degree))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        """``sum_k W_k x^k`` (element-wise powers ``x^k``): shape (b, n_inputs) in, (b, n_outputs) out."""
        out = self.powers[0](x)
        xi = x
        for lin in self.powers[1:]:
            xi = xi * x
            out = out + lin(xi)
        return out


#: Activation names accepted by :func:`mlp`.
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "quadratic": Square,
    "identity": nn.Identity,
}


def mlp(layer_sizes: Sequence[int], activation: str | Callable[[], nn.Module] = "relu",
        bias: bool = True) -> nn.Sequential:
    """A multilayer perceptron ``Linear(n0, n1), act, Linear(n1, n2), act, ..., Linear(n_{L-1}, n_L)``.

    Parameters
    ----------
    layer_sizes : sequence of int
        Widths ``(n0, n1, ..., n_L)``, input first (at least two entries); e.g. ``(784, 64, 64, 10)``.
    activation : str or callable
        A name of :data:`ACTIVATIONS` or a zero-argument factory of an ``nn.Module``; applied
        after every layer but the last.
    bias : bool
        Whether the linear layers have biases.

    Returns
    -------
    nn.Sequential
        Layers named ``"0", "1", ...`` (the linear layers at even indices). Its parameters are
        torch's default initialisation under the *current* torch random state; use
        :meth:`TorchModel.init_params` for seeded parameters.

    Raises
    ------
    ValueError
        If ``layer_sizes`` has fewer than two entries or a non-positive width, or the
        activation name is unknown.
    """
    sizes = [int(s) for s in layer_sizes]
    if len(sizes) < 2 or any(s < 1 for s in sizes) or any(int(s) != s for s in layer_sizes):
        raise ValueError(f"layer_sizes must list at least two positive integers, got {list(layer_sizes)!r}")
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a module factory, "
                             f"got {activation!r}")
        act = ACTIVATIONS[activation]
    else:
        act = activation
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def _leaf_names(module: nn.Module) -> dict[str, str]:
    """FlopCounterMode's name of each leaf module (``"<RootClass>.<path>"``) -> ``named_modules`` path."""
    root = type(module).__name__
    return {f"{root}.{name}": name for name, m in module.named_modules() if name and not any(m.children())}


def count_macs(fn: Callable[[], Any], module: nn.Module | None = None) -> tuple[Any, int, dict[str, int]]:
    """Run ``fn()`` under :class:`FlopCounterMode` and return its MACs (FLOPs / 2), total and per layer.

    Nothing is charged to the meters (the caller charges).

    Parameters
    ----------
    fn : callable
        The torch computation (forward and/or backward).
    module : nn.Module, optional
        The module ``fn`` runs; its leaf modules name the per-layer counts.

    Returns
    -------
    result
        ``fn()``'s return value.
    macs : int
        Total MACs of the contractions dispatched.
    per_layer : dict of str to int
        MACs per leaf module (``named_modules`` path, e.g. ``"0"`` for ``Sequential``'s first
        layer), forward and backward together; contractions outside any leaf are in ``macs``
        only.

    Raises
    ------
    RuntimeError
        If FlopCounterMode reports an odd FLOP count (not a whole number of MACs).
    """
    counter = FlopCounterMode(display=False)
    with counter:
        result = fn()
    flops = int(counter.get_total_flops())
    if flops % 2:
        raise RuntimeError(f"FlopCounterMode counted an odd number of FLOPs ({flops}); MACs = FLOPs / 2 needs it even")
    per_layer: dict[str, int] = {}
    if module is not None:
        names = _leaf_names(module)
        for key, ops in counter.get_flop_counts().items():
            if key in names:
                per_layer[names[key]] = int(sum(ops.values())) // 2
    return result, flops // 2, per_layer


#: :func:`torch.nn.functional.cross_entropy`'s ``reduction="sum"`` as ATen's enum (``at::Reduction::Sum``)
_SUM = 2
#: ``ignore_index`` of :func:`torch.nn.functional.cross_entropy` (its default, no row ignored)
_IGNORE_INDEX = -100


def mlp_plan(module: nn.Module) -> list[tuple[str, str | None]] | None:
    """The linear layers of a plain ReLU MLP, or None for any other module.

    Parameters
    ----------
    module : nn.Module

    Returns
    -------
    list of (str, str or None), or None
        ``(weight name, bias name or None)`` of every linear layer in order, when ``module`` is
        exactly an ``nn.Sequential`` of ``nn.Linear`` layers alternating with non-in-place
        ``nn.ReLU`` (the form :func:`mlp` builds with ``activation="relu"``; first and last
        layers linear, no subclasses, no forward hooks); None otherwise.
    """
    if type(module) is not nn.Sequential or module._forward_hooks or module._forward_pre_hooks:
        return None
    layers = list(module.named_children())
    plan: list[tuple[str, str | None]] = []
    for i, (name, m) in enumerate(layers):
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            return None
        if i % 2 == 0:
            if type(m) is not nn.Linear:
                return None
            plan.append((f"{name}.weight", f"{name}.bias" if m.bias is not None else None))
        elif type(m) is not nn.ReLU or m.inplace:
            return None
    return plan if layers and len(layers) % 2 == 1 else None


def _mlp_gradient(plan: Sequence[tuple[str, str | None]], tensors: dict[str, torch.Tensor], x: torch.Tensor,
                  target: torch.Tensor, with_input: bool) -> list[torch.Tensor]:
    """Gradients of the summed cross-entropy of a ReLU MLP, by the kernels autograd runs for it.

    Forward: ``F.linear`` on a 2-D input is ``addmm(b, h, W.t())`` (``mm(h, W.t())`` without a
    bias), ``relu`` between layers, ``cross_entropy(reduction="sum")`` is ``_log_softmax`` then
    ``nll_loss_forward``. Backward, as autograd's formulas (``FunctionsManual.cpp``) evaluate them
    for these layouts: ``nll_loss_backward`` of a unit output gradient, ``_log_softmax_backward_data``;
    per layer ``dW = g.t().mm(h)`` (``mm_mat2_backward``: ``W.t()`` is column-major),
    ``db = sum_to(g, (out,))`` (``g.sum(0, keepdim=True)`` viewed as ``(out,)``),
    ``dh = g.mm(W)`` (``mm_mat1_backward``; not for the first layer unless ``with_input``) and
    ``threshold_backward(dh, relu(z), 0)`` through the activation.

    Parameters
    ----------
    plan : sequence of (str, str or None)
        :func:`mlp_plan` of the module.
    tensors : dict of str to Tensor
        The parameters (no autograd needed).
    x : Tensor, (b, n_inputs)
        Contiguous input rows.
    target : Tensor, (b,) int64
        Class labels.
    with_input : bool
        Append ``dL/dx``.

    Returns
    -------
    list of Tensor
        The gradients in the order of ``tensors`` (then ``dL/dx`` with ``with_input``).
    """
    hs = [x]
    for i, (w, b) in enumerate(plan):
        z = torch.mm(hs[-1], tensors[w].t()) if b is None else torch.addmm(tensors[b], hs[-1], tensors[w].t())
        if i < len(plan) - 1:
            hs.append(torch.relu(z))
    logp = torch._log_softmax(z, 1, False)
    _, total_weight = torch.ops.aten.nll_loss_forward(logp, target, None, _SUM, _IGNORE_INDEX)
    g = torch.ops.aten.nll_loss_backward(torch.ones((), dtype=z.dtype), logp, target, None, _SUM, _IGNORE_INDEX,
                                         total_weight)
    g = torch._log_softmax_backward_data(g, logp, 1, z.dtype)
    grads: dict[str, torch.Tensor] = {}
    for i in range(len(plan) - 1, -1, -1):
        w, b = plan[i]
        grads[w] = g.t().mm(hs[i])
        if b is not None:
            grads[b] = g.sum(0, keepdim=True).view(-1)
        if i or with_input:
            g = g.mm(tensors[w])
        if i:
            g = torch.ops.aten.threshold_backward(g, hs[i], 0)
    return [grads[k] for k in tensors] + ([g] if with_input else [])


class TorchModel(Model):
    """A torch module as a :class:`~fednet.learning.model.Model` (module docstring).

    Parameters
    ----------
    module : nn.Module
        Maps a ``(b, *input_shape)`` tensor to ``(b, n_outputs)`` scores. A copy serves as an
        architecture template: its parameter values are never used by the metered calls
        (buffers, e.g. batch-norm statistics, are read from it unchanged; keep such modules in
        ``eval()`` mode or free of buffers, since the calls do not update them).
    n_inputs : int
        Number of input features ``d``: ``x`` arrives as ``(b, d)`` rows.
    n_outputs : int
        Number of outputs ``c``.
    loss : {"cross_entropy", "mse"}
        Per-row loss ``l``: softmax cross-entropy on class labels, or ``1/2 ||f(x) - y||^2`` on
        one-hot targets (the ridge loss of Schlegel et al., eq. 2; the MSE of DReS-FL, Sec. 3.1).
    weight_decay : float
        ``lambda >= 0`` of the regulariser ``lambda/2 ||params||^2`` reported by :meth:`loss` and
        :meth:`evaluate` (the optimiser applies its own weight decay).
    input_shape : tuple of int, optional
        Shape of one input as the module expects it (e.g. ``(1, 28, 28)`` for a CNN); rows of
        ``x`` are reshaped to it. Default ``(n_inputs,)``.
    dtype : torch.dtype
        Floating type of parameters and computation (``torch.float32`` or ``torch.float64``).
    cache_macs : bool
        Measure each (call kind, input shape) once and charge the cached count afterwards.
    fast_mlp : bool
        Compute the gradients of a plain ReLU MLP with cross-entropy by :func:`_mlp_gradient`
        (bit-identical to autograd) once their MACs are cached; False always runs autograd.

    Raises
    ------
    ValueError
        For an unknown loss, non-positive sizes, a negative weight decay, an ``input_shape``
        whose size is not ``n_inputs``, or a module without parameters.
    """

    LOSSES = ("cross_entropy", "mse")

    def __init__(self, module: nn.Module, n_inputs: int, n_outputs: int, *, loss: str = "cross_entropy",
                 weight_decay: float = 0.0, input_shape: Sequence[int] | None = None,
                 dtype: torch.dtype = torch.float32, cache_macs: bool = True, fast_mlp: bool = True) -> None:
        for name, v in (("n_inputs", n_inputs), ("n_outputs", n_outputs)):
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if loss not in self.LOSSES:
            raise ValueError(f"loss must be one of {self.LOSSES}, got {loss!r}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
        self.n_inputs, self.n_outputs = int(n_inputs), int(n_outputs)
        self.input_shape = (self.n_inputs,) if input_shape is None else tuple(int(s) for s in input_shape)
        if int(np.prod(self.input_shape)) != self.n_inputs:
            raise ValueError(f"input_shape {self.input_shape} does not hold n_inputs = {self.n_inputs} features")
        self.module = copy.deepcopy(module).to(dtype)  # a private copy: the caller's module is not touched
        self.loss_name = loss
        self.weight_decay = weight_decay
        self.dtype = dtype
        self.np_dtype = np.float32 if dtype == torch.float32 else np.float64
        self.cache_macs = cache_macs
        self._shapes = {k: tuple(p.shape) for k, p in self.module.named_parameters()}
        if not self._shapes:
            raise ValueError("module has no parameters")
        self._macs: dict[tuple, tuple[int, dict[str, int]]] = {}
        importlib.import_module("torch._dynamo")  # FlopCounterMode's lazy import, before any run (module docstring)
        #: the linear layers of a plain ReLU MLP with cross-entropy on flat inputs (:func:`mlp_plan`), else None
        self._plan = mlp_plan(self.module) if fast_mlp and loss == "cross_entropy" \
            and self.input_shape == (self.n_inputs,) else None

    def __repr__(self) -> str:
        return (f"TorchModel({type(self.module).__name__}, n_inputs={self.n_inputs}, n_outputs={self.n_outputs}, "
                f"loss={self.loss_name!r}, dtype={self.dtype})")

    # -- description --------------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``module.named_parameters()`` names -> shapes (e.g. ``"0.weight": (out, in)``)."""
        return dict(self._shapes)

    def init_params(self, seed: int | np.random.Generator | None = None) -> Params:
        """Torch's default initialisation of every layer under ``torch.manual_seed(seed)``.

        Every submodule with a ``reset_parameters`` method is reset, in ``modules()`` order;
        a parameter of a module without one keeps the value it had in the module given to the
        constructor.

        Parameters
        ----------
        seed : int or Generator or None
            An int seeds torch directly; a Generator draws the seed (``integers(2**63)``); None
            means 0.

        Returns
        -------
        Params
            NumPy arrays of the model's dtype (copies; the template module is not modified).
        """
        if isinstance(seed, np.random.Generator):
            seed = int(seed.integers(2**63))
        seed = 0 if seed is None else int(seed)
        template = copy.deepcopy(self.module)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in template.modules():
                reset = getattr(m, "reset_parameters", None)
                if callable(reset):
                    reset()
        return {k: p.detach().numpy().copy() for k, p in template.named_parameters()}

    # -- helpers ------------------------------------------------------------------------------
    def _tensors(self, params: ParamsOrArray, grad: bool) -> dict[str, torch.Tensor]:
        p = self.as_params(params)
        out = {}
        for k, shape in self._shapes.items():
            a = np.asarray(p[k])
            if a.shape != shape:
                raise ValueError(f"parameter {k!r} has shape {a.shape}, expected {shape}")
            t = torch.tensor(a, dtype=self.dtype) if not a.flags.writeable or a.dtype != self.np_dtype \
                else torch.from_numpy(a)
            out[k] = t.detach().requires_grad_(grad)
        return out

    def _input(self, x: np.ndarray, grad: bool = False) -> torch.Tensor:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_inputs:
            raise ValueError(f"x must have shape (b, {self.n_inputs}), got {x.shape}")
        t = torch.tensor(x.reshape((x.shape[0],) + self.input_shape), dtype=self.dtype)
        return t.requires_grad_(grad)

    def _target(self, y: np.ndarray, b: int) -> torch.Tensor:
        y = np.asarray(y)
        if y.shape[0] != b:
            raise ValueError(f"y has {y.shape[0]} rows, x has {b}")
        if self.loss_name == "cross_entropy":
            labels = np.argmax(y, axis=1) if y.ndim == 2 else y
            if labels.ndim != 1 or (labels.size and (labels.min() < 0 or labels.max() >= self.n_outputs)):
                raise ValueError(f"y must be labels in [0, {self.n_outputs - 1}] or one-hot rows, got shape {y.shape}")
            return torch.as_tensor(labels.astype(np.int64))
        return torch.tensor(as_targets(y, self.n_outputs), dtype=self.dtype)

    def _data_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``sum_j l(f(x_j), y_j)`` over the batch."""
        if self.loss_name == "cross_entropy":
            return nn.functional.cross_entropy(out, target, reduction="sum")
        r = out - target
        return 0.5 * (r * r).sum()

    def _penalty(self, tensors: dict[str, torch.Tensor]) -> float:
        if not self.weight_decay:
            return 0.0
        return float(0.5 * self.weight_decay * sum(float((t.detach().double() ** 2).sum()) for t in tensors.values()))

    def _measure(self, kind: str, shape: tuple, fn: Callable[[], Any]) -> tuple[Any, int]:
        """Run ``fn``; its MACs measured now, or cached per ``(kind, shape)``. Charges nothing."""
        key = (kind, shape)
        if self.cache_macs and key in self._macs:
            return fn(), self._macs[key][0]
        result, macs, per_layer = count_macs(fn, self.module)
        self._macs[key] = (macs, per_layer)
        return result, macs

    def _run(self, kind: str, shape: tuple, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` and charge its MACs (measured, or cached per ``(kind, shape)``)."""
        result, macs = self._measure(kind, shape, fn)
        charge(macs)
        return result

    def layer_macs(self, kind: str, batch: int) -> dict[str, int]:
        """Per-layer MACs measured for a call (what the call charged, per layer).

        Parameters
        ----------
        kind : {"forward", "loss", "gradient", "gradient_with_input", "backward", "backward_params"}
            The method that ran (``"backward_params"``: :meth:`backward` with
            ``input_grad=False``); forward and backward together except for the backward kinds,
            which charge the backward pass only.
        batch : int
            Rows of ``x`` it ran on.

        Returns
        -------
        dict of str to int
            Leaf module path -> MACs, plus ``"total"``.

        Raises
        ------
        KeyError
            If no such call has run yet.
        """
        shape = (int(batch),) + self.input_shape
        macs, per = self._macs[(kind, shape)]
        return {**per, "total": macs}

    # -- metered computation ------------------------------------------------------------------
    def forward(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """Scores ``f(x)``, shape (b, c), the model's dtype; charges the forward MACs."""
        tensors, xt = self._tensors(params, False), self._input(x)

        return self._run("forward", tuple(xt.shape), lambda: self._no_grad_forward(tensors, xt)).numpy()

    def loss(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> float:
        """``(1/b) sum_j l(f(x_j), y_j) + lambda/2 ||params||^2``; charges the forward MACs."""
        tensors, xt = self._tensors(params, False), self._input(x)
        target = self._target(y, xt.shape[0])

        def run() -> float:
            """The mean data loss over the ``b`` rows (a float), without autograd."""
            with torch.no_grad():
                return float(self._data_loss(functional_call(self.module, tensors, (xt,)), target)) / xt.shape[0]

        return self._run("loss", tuple(xt.shape), run) + self._penalty(tensors)

    def gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> Params:
        """Gradient of ``sum_j l(f(x_j), y_j)`` (no regulariser); charges forward + backward MACs.

        Returns
        -------
        Params
            NumPy arrays of the parameters' shapes and the model's dtype.
        """
        return self._grad("gradient", params, x, y, with_input=False)[0]

    def gradient_with_input(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> tuple[Params, np.ndarray]:
        """Gradients of ``sum_j l(f(x_j), y_j)`` w.r.t. the parameters and ``x`` (a split model's top).

        FedVS, Sec. 3: the server's top model on the embedding ``H`` returns ``dL/dH`` to the
        clients. Charges forward + backward MACs, including the first layer's input gradient.

        Returns
        -------
        grads : Params
        grad_input : ndarray, shape (b, n_inputs)
        """
        return self._grad("gradient_with_input", params, x, y, with_input=True)

    def _grad(self, kind: str, params: ParamsOrArray, x: np.ndarray, y: np.ndarray,
              with_input: bool) -> tuple[Params, np.ndarray | None]:
        key = (kind, (np.shape(x)[0],) + self.input_shape)
        if self._plan is not None and self.cache_macs and key in self._macs:  # measured before: no autograd
            tensors, xt = self._tensors(params, False), self._input(x)
            grads = _mlp_gradient(self._plan, tensors, xt, self._target(y, xt.shape[0]), with_input)
            charge(self._macs[key][0])
            out = {k: g.numpy() for k, g in zip(tensors, grads)}
            return out, grads[-1].numpy() if with_input else None
        tensors, xt = self._tensors(params, True), self._input(x, grad=with_input)
        target = self._target(y, xt.shape[0])
        names = list(tensors)

        def run() -> tuple:
            """The parameter gradients (and the input's, with ``with_input``) of the summed data loss."""
            # a view, not the leaf itself, enters the module: FlopCounterMode's module tracker cannot
            # hook a leaf input while autograd.grad runs
            total = self._data_loss(functional_call(self.module, tensors, (xt.view_as(xt),)), target)
            inputs = [tensors[k] for k in names] + ([xt] if with_input else [])
            return torch.autograd.grad(total, inputs)

        grads = self._run(kind, tuple(xt.shape), run)
        out = {k: g.numpy() for k, g in zip(names, grads)}
        gx = grads[-1].reshape(xt.shape[0], self.n_inputs).numpy() if with_input else None
        return out, gx

    def backward(self, params: ParamsOrArray, x: np.ndarray, grad_output: np.ndarray, *,
                 input_grad: bool = True) -> tuple[Params, np.ndarray | None]:
        """Gradients of ``sum(f(x) * grad_output)`` w.r.t. the parameters (and ``x``); metered.

        Charges the MACs of the backward pass only: a device keeps the activations of the
        forward pass it ran (and was charged for) before the gradient arrived, so the forward
        pass that this call re-executes on the host is subtracted; both counts are measured by
        the torch counter at these shapes.

        Parameters
        ----------
        params : Params
        x : ndarray, (b, n_inputs)
        grad_output : ndarray, (b, n_outputs)
            ``dL/df(x)``.
        input_grad : bool
            Also compute ``dL/dx`` (a bottom model of a split model does not need it, and the
            first layer's input gradient is then neither computed nor charged).

        Returns
        -------
        grads : Params
        grad_input : ndarray, shape (b, n_inputs), or None without ``input_grad``
        """
        tensors, xt = self._tensors(params, True), self._input(x, grad=input_grad)
        g = np.asarray(grad_output)
        if g.shape != (xt.shape[0], self.n_outputs):
            raise ValueError(f"grad_output has shape {g.shape}, expected ({xt.shape[0]}, {self.n_outputs})")
        gt = torch.tensor(g, dtype=self.dtype)
        names = list(tensors)
        shape = tuple(xt.shape)

        def run() -> tuple:
            """The parameter gradients (and the input's, with ``input_grad``) given ``grad_output`` on the scores."""
            # views, not the leaves, enter the module and leave it: FlopCounterMode's module tracker
            # cannot hook a leaf input, and hooks the last layer's backward only below its output
            out = functional_call(self.module, tensors, (xt.view_as(xt) if input_grad else xt,))
            inputs = [tensors[k] for k in names] + ([xt] if input_grad else [])
            return torch.autograd.grad(out.view_as(out), inputs, grad_outputs=gt)

        kind = "backward" if input_grad else "backward_params"
        measured = not (self.cache_macs and (kind, shape) in self._macs)
        grads, total = self._measure(kind, shape, run)
        if measured:  # subtract the forward pass (measured at this shape) and store backward-only counts
            fwd_tensors = {k: t.detach() for k, t in tensors.items()}
            _, fwd = self._measure("forward", shape, lambda: self._no_grad_forward(fwd_tensors, xt.detach()))
            per = dict(self._macs[(kind, shape)][1])
            for layer, m in self._macs[("forward", shape)][1].items():
                per[layer] = per.get(layer, 0) - m
            self._macs[(kind, shape)] = (total - fwd, per)
        charge(self._macs[(kind, shape)][0])
        out = {k: gr.numpy() for k, gr in zip(names, grads)}
        gx = grads[-1].reshape(xt.shape[0], self.n_inputs).numpy() if input_grad else None
        return out, gx

    def _no_grad_forward(self, tensors: dict[str, torch.Tensor], xt: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return functional_call(self.module, tensors, (xt,))

    # -- observer -----------------------------------------------------------------------------
    def _scores(self, params: ParamsOrArray, x: np.ndarray) -> torch.Tensor:
        tensors, xt = self._tensors(params, False), self._input(x)
        with torch.no_grad():
            return functional_call(self.module, tensors, (xt,))

    def predict(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """``argmax`` of the scores, shape (b,) int64 (not metered)."""
        return self._scores(params, x).argmax(dim=1).numpy().astype(np.int64)

    def evaluate(self, params: ParamsOrArray, x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        """``(accuracy, loss)`` on a test set, the loss as :meth:`loss` (not metered).

        Parameters
        ----------
        params : Params
        x : ndarray, (m_test, d)
        labels : ndarray, (m_test,) int (or one-hot rows)
        """
        labels = np.asarray(labels)
        out = self._scores(params, x)
        lab = np.argmax(labels, axis=1) if labels.ndim == 2 else labels
        if lab.shape != (out.shape[0],):
            raise ValueError(f"labels has shape {labels.shape}, expected ({out.shape[0]},)")
        acc = float(np.mean(out.argmax(dim=1).numpy() == lab))
        with torch.no_grad():
            loss = float(self._data_loss(out, self._target(labels, out.shape[0]))) / out.shape[0]
        return acc, loss + self._penalty(self._tensors(params, False))


class MLPModel(TorchModel):
    """A :class:`TorchModel` of :func:`mlp` ``(layer_sizes, activation)``.

    Parameters
    ----------
    layer_sizes : sequence of int
        ``(n_inputs, hidden..., n_outputs)``, e.g. ``(784, 64, 64, 10)`` (DReS-FL, App. B).
    activation : str or callable
        As in :func:`mlp` (``"relu"``, ``"quadratic"``, ...).
    **kwargs
        ``loss``, ``weight_decay``, ``dtype``, ``cache_macs`` of :class:`TorchModel`.

    Attributes
    ----------
    layer_sizes : tuple of int
    """

    def __init__(self, layer_sizes: Sequence[int], activation: str | Callable[[], nn.Module] = "relu",
                 **kwargs: Any) -> None:
        with torch.random.fork_rng(devices=[]):  # the template's values are never used: keep torch's RNG
            module = mlp(layer_sizes, activation)
        self.layer_sizes = tuple(int(s) for s in layer_sizes)
        super().__init__(module, self.layer_sizes[0], self.layer_sizes[-1], **kwargs)

    def analytic_macs(self, batch: int, kind: str = "gradient") -> dict[str, int]:
        """The MACs an MLP's linear layers execute, by hand (a check on the measured counts).

        Layer ``i`` (``Linear(n_i, n_{i+1})``) on ``b`` rows: ``b n_i n_{i+1}`` forward;
        ``b n_i n_{i+1}`` for the weight gradient and as many for the input gradient (not for the
        first layer unless ``kind`` asks for the input's gradient); the backward kinds exclude
        the forward pass (:meth:`TorchModel.backward`).

        Parameters
        ----------
        batch : int
        kind : {"forward", "loss", "gradient", "gradient_with_input", "backward", "backward_params"}

        Returns
        -------
        dict of str to int
            Linear layer path (``"0"``, ``"2"``, ...) -> MACs, plus ``"total"``.
        """
        per: dict[str, int] = {}
        for i, (a, c) in enumerate(zip(self.layer_sizes[:-1], self.layer_sizes[1:])):
            unit = batch * a * c
            if kind in ("forward", "loss"):
                n = 1
            elif kind == "backward":
                n = 2
            elif kind == "backward_params":
                n = 2 if i > 0 else 1
            elif kind == "gradient_with_input" or i > 0:
                n = 3
            else:
                n = 2
            per[str(2 * i)] = n * unit
        return {**per, "total": sum(per.values())}
