"""fednet: a discrete-event simulator of coded and secure federated learning over wireless networks.

Layers (a layer imports only the layers above it in this list):

``fednet.algebra``  fixed point, prime fields, exact kernels, the MAC meter
``fednet.codes``    gradient codes, Shamir, Lagrange coded computing, mask codes
``fednet.learning`` datasets, partitions, features, models
``fednet.sim``      the SimPy engine: nodes, links, compute-time models, trace
``fednet.protocol`` the ``Protocol`` base class and registry
``fednet.study``    study configs, runs, results, plots; ``fednet.cli`` the command
"""

__version__ = "0.1.0"
