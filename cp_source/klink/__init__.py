"""Klink admission and the progress model that predicts when a watermark can close."""
