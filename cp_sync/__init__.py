"""cp_sync: cross-node time.

MinRTT probes timed in C between TSC domains (``probe``, ``agent``,
``coordinator``), sync tables that keep every probe (``sync_table``),
translation of stamps into a reference domain with a strict bound per record
by the paper's two-point method or the convex hull (``hull``, ``translate``),
summaries and plots (``report``), and the methods it is compared with
(``returntrip``, ``ntp``). Commands: ``cloudprofiler sync`` and
``cloudprofiler translate``.
"""
