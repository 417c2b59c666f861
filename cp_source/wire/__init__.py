"""What travels on the wire: the bucket format, the sender's link to a factory, the workloads' rows."""
