"""The share-partition engine (KIP-932) on the partition side: per-record states and acquisition
locks (`engine`, `inflight`), the share sessions of ShareFetch (`session`), the manager that
serves ShareFetch and ShareAcknowledge over every share-partition of this broker (`manager`),
the dead-letter queue (`dlq`) and the share metrics (`metrics`). Durable state goes through the
share-state coordinator (broker/coordinator/share)."""
