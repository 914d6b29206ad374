"""Start and stop real local servers (Redis, Mooncake) by PID, for tests, the demo and single-machine runs."""
