"""A cluster on etcd: what needs consensus (the controller, the order of the metadata log) lives in
etcd. `etcd` is the narrow interface (`etcd_http` over a real etcd, `etcd_fake` in memory),
`metadata_log` the KRaft records in etcd, `election` the cluster id, node-id claims and the
controller, `snapshot` an image as records. Imported only in cluster mode (README.md beside it)."""
