"""The policy: the tolerance rule, the frontier and the decision, pure Python.

What the router decides with and the report shows, in one place below both (docs/architecture.md
§2, §6): :mod:`~gnnaas.policy.curve` (a variant's service curve), :mod:`~gnnaas.policy.rule` (which
variants a tolerance admits), :mod:`~gnnaas.policy.dominance` (the frontier: which variants no
request should consider), :mod:`~gnnaas.policy.decision` (the one decision of a request: a pure
step ``(request, load snapshot, now) -> selection``). No torch, no FastAPI, no file reading.
"""

from gnnaas.policy.curve import ServiceCurve
from gnnaas.policy.decision import (
    TIE_MARGIN,
    DecisionTable,
    LoadSnapshot,
    LoadView,
    RequestSpec,
    Selection,
    VariantLoad,
    describe_selection,
    effective_tolerance,
)
from gnnaas.policy.dominance import at_most_everywhere, dominated, fastest_everywhere
from gnnaas.policy.rule import (
    LOSS_MARGIN,
    Candidate,
    PairedDiff,
    admissible,
    admitting_tolerances,
    candidates_within,
    describe_rule,
    paired_comparable,
)

__all__ = [
    "LOSS_MARGIN",
    "TIE_MARGIN",
    "Candidate",
    "DecisionTable",
    "LoadSnapshot",
    "LoadView",
    "PairedDiff",
    "RequestSpec",
    "Selection",
    "ServiceCurve",
    "VariantLoad",
    "admissible",
    "admitting_tolerances",
    "at_most_everywhere",
    "candidates_within",
    "describe_rule",
    "describe_selection",
    "dominated",
    "effective_tolerance",
    "fastest_everywhere",
    "paired_comparable",
]
