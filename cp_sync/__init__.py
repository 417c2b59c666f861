"""cp_sync: cross-node time.

MinRTT probes timed in C between TSC domains (``probe``, ``agent``,
``coordinator``; ``probe_python`` is the pure-Python twin, ``probe_api`` their
shared types), sync tables that keep every probe (``sync_table``),
translation of stamps into a reference domain with a strict bound per record
by the paper's two-point method or the convex hull (``hull``, ``translate``),
summaries, the latency table and plots (``report``, ``latency_report``), the
methods it is compared with (``returntrip``, ``ntp``), and synthetic probes
with exact truth (``synthetic``). Commands: ``cloudprofiler sync`` and
``cloudprofiler translate``.
"""
