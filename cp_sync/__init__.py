"""cp_sync."""
