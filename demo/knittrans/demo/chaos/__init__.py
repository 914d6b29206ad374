"""`knittrans demo --chaos SEED`: the demo under a seeded schedule of kill -9 and SIGSTOP/SIGCONT (docs/failures.md)."""
