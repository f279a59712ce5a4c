"""Network builders: LTE star, groups, hierarchical group trees.

``TOPOLOGIES`` maps the names that study files use to builders returning a networkx graph
(see :mod:`fednet.sim.simulation` for the attributes a builder must set).
"""

from .lte import lte_star

TOPOLOGIES = {"lte_star": lte_star}
