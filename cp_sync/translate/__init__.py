"""Translation of stamps between TSC domains with an error bound and a status per record.

Relations between domains come from the sync table's probes over any number
of phases (cp_sync.translate.phase_spans): each record is translated with the relation
of the span between the two phases that bracket its stamp, by one of two
methods that share the same evaluation:

* ``minrtt`` (the paper's two-point method): the MinRTT probe of each of the
  span's two phases, from whichever direction has the smaller MinRTT;
* ``hull``: every probe of the span's two phases, both directions (the
  convex-hull / LP bound: never looser than ``minrtt``).

Each relation is the exact polygon of affine maps its probes allow
(cp_sync.translate.hull). Per record the scenario decides how the two stamps are
combined (docs/sync.md derives every formula): 0 both stamps on the
reference, 1 both on one other domain (the rate error only, 2 d/D e), 2 one on
the reference (the value error, e), 3 two other domains (the best of the
direct relation and the route through the reference: about e). ``naive``
translates each end to the reference on its own (2e), the baseline the paper
improves on. The estimate is the centre of the interval the truth must lie in
and the bound its half-width.

Every record gets a status (STATUSES): ``ok`` where the bound is guaranteed
under the model (each clock affine over the span, checked against the
neighbouring spans), else the reason; a record is refused alone, never the run.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "status_counts": "cp_sync.translate.records",
    "translate_points": "cp_sync.translate.records",
    "translate_records": "cp_sync.translate.records",
    "stage_table": "cp_sync.translate.waterfall",
    "waterfall_summary": "cp_sync.translate.waterfall",
    "Translator": "cp_sync.translate.translator",
    "STATUSES": "cp_sync.translate.relation",
    "Relation": "cp_sync.translate.relation",
    "fit_relation": "cp_sync.translate.relation",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
