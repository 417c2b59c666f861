"""The throughput-controlled generator: senders at an exact rate, its CLI, hot-key data skew."""
