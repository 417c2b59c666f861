"""The cost term of Klink's slack (Eq. 1, ``cost^q(t)``): how long Spark takes to run this query's
next batch, from the batches it has run.

The reader cannot see a batch end: Spark calls the source's ``latestOffset`` at a trigger, then plans
and runs the batch, and calls ``latestOffset`` again at the first trigger after it ends (at once when
the batch overran its trigger interval). So the time from an offered batch's call to the next call
is that batch's cost, exactly when the query is behind (where the cost matters) and at most one
trigger interval above it otherwise. A deferred or empty call runs no batch and measures nothing.
The cost of the next batch is the mean of the last ``history`` measured (Klink's mean processing
cost per query; a micro-batch runs the queued events together, so one batch's cost is the cost of
executing the queue).
"""

from __future__ import annotations

from collections import deque

MAX_COST_NS = 3_600_000_000_000  # an hour: a longer gap is a paused process, not a batch's cost


class BatchCosts:
    """Measured batch costs of one query (ns, its own clock); ``cost_ns`` is the term of its slack."""

    def __init__(self, history: int) -> None:
        if history < 1:
            raise ValueError(f"history={history}: expected at least 1 batch")
        self.samples: deque[int] = deque(maxlen=history)
        self._open_ns: int | None = None  # the call that offered a batch not yet measured

    def called(self, now_ns: int) -> None:
        """A ``latestOffset`` call: it ends the batch the previous call offered, if any."""
        start, self._open_ns = self._open_ns, None
        if start is not None and 0 < now_ns - start <= MAX_COST_NS:
            self.samples.append(now_ns - start)

    def offered(self, now_ns: int) -> None:
        """This call offered new data: Spark runs a batch now, measured at the next call."""
        self._open_ns = now_ns

    def cost_ns(self) -> float:
        """The mean of the measured costs; 0 before any batch ran."""
        return float(sum(self.samples)) / len(self.samples) if self.samples else 0.0
