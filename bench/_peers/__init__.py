"""Parts of ``python -m bench.peers``: peer servers, workloads per system, report."""
