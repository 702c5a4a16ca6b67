"""The learned strategy (the default of ``tune run``), one module per step of a proposal.

Split as Optuna's GP sampler is: ``sampler`` (LearnedSampler: the settings
and one proposal), ``design`` (the first trials, before any model),
``table`` (the space's grid and encoding, built once), ``candidates``
(which unmeasured configurations a proposal scores), ``models`` (the
roofline and GP fits, which one to trust), ``acquisition`` (constrained
expected improvement, local steps and probes) and ``headroom`` (what an
unmeasured configuration could still save: the stop rule's bound).
"""

from tuner.strategies.learned.sampler import LearnedSampler
from tuner.strategies.learned.table import Table, space_table

__all__ = ["LearnedSampler", "Table", "space_table"]
