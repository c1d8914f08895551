"""Security: listeners and TLS, SASL authentication, principals, the authorizer and client quotas.

Modules, from the wire up:
  listeners.py   which listener speaks which protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
  tls.py         ssl.* properties -> ssl.SSLContext (PEM stores, client auth, protocols, ciphers)
  connection.py  TLS accept (handshake failures logged), the principal of a client certificate
  principal.py   principals as strings ("User:alice"), DNs, ssl.principal.mapping.rules
  sasl/          SASL: sans-IO mechanism state machines and the per-connection authenticator
  authz.py       what request handlers call: authorize(ctx, operation, resource_type, name), ...
  authorizer.py  StandardAuthorizer semantics over the ACLs of the metadata image
  quotas.py      client quotas (byte rates, request percentage) and throttling
"""
