"""cp_source."""
