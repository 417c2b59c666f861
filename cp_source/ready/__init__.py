"""Batches ready before Spark asks: the ready frontier and the batch plan over it."""
