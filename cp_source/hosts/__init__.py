"""Factories on other hosts: their plans, the segment server, the ready operations over the wire."""
