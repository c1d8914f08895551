"""What the broker tells its operators: Prometheus metrics per API and of its state, client
telemetry (KIP-714), the health check of the Docker image, the structlog setup and the
loggers (structlog's, imported at the first line logged)."""
