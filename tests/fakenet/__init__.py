"""Fake internet for gatewrap's kernel tests.

``FakeInternet`` (context manager) builds a netns ``gwt-inet-<hex>`` behind a
veth pair with DNS on 198.51.100.2:53 (UDP+TCP), HTTP :80 / HTTPS :443 / echo :7
on 198.51.100.{138,148,158} and 2001:db8:100::{10,20,30}; see ``internet.py``.
"""

from .ca import TestPKI, make_pki
from .host_lock import hold_host_lock
from .internet import (
    AddressConflict,
    DEFAULT_NAMES,
    DNS_PORT,
    ECHO_PORT,
    HOST_V4,
    HOST_V6,
    HTTP_PORT,
    HTTPS_PORT,
    INET_V4,
    INET_V6,
    SERVER_NET_V4,
    SERVER_NET_V6,
    SERVER_V4,
    SERVER_V6,
    FakeInternet,
    FakeInternetError,
    cleanup_leftovers,
    conflicts,
    in_netns,
    leftovers,
)

__all__ = [
    "AddressConflict",
    "conflicts",
    "in_netns",
    "DEFAULT_NAMES",
    "DNS_PORT",
    "ECHO_PORT",
    "HOST_V4",
    "HOST_V6",
    "HTTP_PORT",
    "HTTPS_PORT",
    "INET_V4",
    "INET_V6",
    "SERVER_NET_V4",
    "SERVER_NET_V6",
    "SERVER_V4",
    "SERVER_V6",
    "FakeInternet",
    "FakeInternetError",
    "TestPKI",
    "cleanup_leftovers",
    "leftovers",
    "make_pki",
]
