"""Enorm's compute/consolidate split in Spark: shared sliding windows, their per-key pane state, and
the salting of hot keys (data skew)."""
