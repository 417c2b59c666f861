"""The Arrow spool on disk: segments, the ledger of counts, compaction, durability."""
