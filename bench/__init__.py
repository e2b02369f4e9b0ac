"""Speed benchmarks (run as ``python -m bench.bench_NAME``) and the support they share with the tests
and the experiments: ``table`` (the printed table), ``dbs`` (real segment DBs), ``label_harness``
(the label server in a subprocess, headless Chromium)."""
