"""Klink admission and the progress model that predicts when a watermark can close."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "KlinkPools": "cp_source.klink.pools",
    "fair_conf": "cp_source.klink.pools",
    "Batches": "cp_source.klink.progress_model",
    "Tuples": "cp_source.klink.progress_model",
    "epoch_delay_stats": "cp_source.klink.progress_model",
    "predict_next_swm": "cp_source.klink.progress_model",
    "prediction_table": "cp_source.klink.progress_model",
    "slack_ns": "cp_source.klink.progress_model",
    "sweeping_watermarks": "cp_source.klink.progress_model",
    "watermark_advice": "cp_source.klink.progress_model",
    "window_deadlines": "cp_source.klink.progress_model",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
