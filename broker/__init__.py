"""A Kafka-compatible broker: server, APIs, coordinators and the storage engine."""
