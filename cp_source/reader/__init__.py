"""What Spark calls: the stream reader, its state, the ingest log, the naive baseline source."""
