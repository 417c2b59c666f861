"""The jobs that tie the packages together: the demo, the maximum-rate search and the queries they run."""
