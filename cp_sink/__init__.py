"""cp_sink."""
