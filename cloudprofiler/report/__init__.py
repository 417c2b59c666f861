"""``cloudprofiler report``: one self-contained HTML page per run directory (cp_sync.run_page)."""
