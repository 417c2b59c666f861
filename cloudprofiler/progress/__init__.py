"""Window progress read from a sink's records: output latency, SWM prediction, watermark advice."""
