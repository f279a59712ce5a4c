"""A model plugin for ``studies/fedopt_mnist.toml`` (issue 30, item 7): ``model = "small_models:small"``.

A study names a model as ``"package.module:factory"``; fednet imports the module from ``sys.path``, then the study
file's folder, then the working folder (:func:`fednet.plugins.import_object`), and calls
``factory(n_inputs, n_outputs)``. The returned ``torch.nn.Module`` maps ``(b, n_inputs)`` float rows to
``(b, n_outputs)`` scores; fednet wraps it (float32, MACs counted by torch's flop counter, so a smaller model is a
shorter computation on the simulated clock) and initialises it under the study's ``model_seed``.
"""

from torch import nn


def small(n_inputs: int, n_outputs: int) -> nn.Module:
    """One hidden layer of 32 ReLU units: ``n_inputs -> 32 -> n_outputs`` (25,450 parameters on MNIST)."""
    return nn.Sequential(nn.Linear(n_inputs, 32), nn.ReLU(), nn.Linear(32, n_outputs))
