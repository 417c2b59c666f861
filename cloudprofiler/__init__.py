"""cloudprofiler: the command line and the jobs that tie the packages together."""
