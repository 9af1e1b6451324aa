"""Syslog facility names and codes (RFC 5424 §6.2.1, table 1), in a module of their own so
that the CLI can offer them as choices without importing the shipper (ssl, sockets)."""

FACILITIES = {"user": 1, "daemon": 3, "auth": 4, "authpriv": 10,
              **{f"local{i}": 16 + i for i in range(8)}}
