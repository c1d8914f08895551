"""The broker's network side: the Kafka protocol server (frames in, responses out, per-connection
order, TLS and SASL, quotas' muting) and its HTTP side door on `metrics.port` (Prometheus
metrics, fault injection)."""
