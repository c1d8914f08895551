"""SASL: the per-connection authenticator (authenticator.py), the mechanism servers
(mechanisms.py: PLAIN, SCRAM-SHA-256/512, OAUTHBEARER), SCRAM credentials (scram.py), JAAS
text (jaas.py) and a listener's settings (settings.py). All sans-IO: no sockets, no asyncio."""
