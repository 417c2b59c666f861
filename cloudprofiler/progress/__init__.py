"""Window progress read from a sink's records: output latency, SWM prediction, watermark advice."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "Batches": "cp_source.klink.progress_model",
    "Tuples": "cp_source.klink.progress_model",
    "epoch_delay_stats": "cp_source.klink.progress_model",
    "predict_next_swm": "cp_source.klink.progress_model",
    "prediction_table": "cp_source.klink.progress_model",
    "slack_ns": "cp_source.klink.progress_model",
    "sweeping_watermarks": "cp_source.klink.progress_model",
    "watermark_advice": "cp_source.klink.progress_model",
    "window_deadlines": "cp_source.klink.progress_model",
    "progress_report": "cloudprofiler.progress.report",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
