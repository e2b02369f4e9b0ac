"""The plumbing every stage shares: user errors, safe files, settings and ``--help``, seeds,
Ctrl-C, statistics, TensorBoard runs and the benchmark table. It imports nothing else of ours."""
