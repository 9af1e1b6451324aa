"""The hooks' C sources stay quick to compile: bcc parses every header they include twice per
compile, and the kernel's internal headers (linux/socket.h, linux/net.h) cost 2-3 s of a cold
start (bench/startup.py --cold), so the socket ABI values are written out instead; they must be
the kernel's (socket(2), include/uapi/linux/in.h: the values Python's socket module has)."""

from __future__ import annotations

import re
import socket

from gatewrap.bpf import loader


def _text() -> str:
    return "".join((loader.sources_dir() / name).read_text() for name in loader.SOURCES)


def test_the_socket_abi_values_written_out_in_the_hooks_are_the_kernels():
    defines = dict(re.findall(r"^#define\s+((?:AF|SOCK|IPPROTO)_\w+)\s+(\d+)\s*$", _text(), re.M))
    assert {"AF_INET", "AF_INET6", "SOCK_STREAM", "SOCK_DGRAM", "IPPROTO_TCP", "IPPROTO_UDP"} <= set(defines)
    for name, value in defines.items():
        assert int(value) == int(getattr(socket, name)), name


def test_the_hooks_include_only_uapi_headers_and_their_own():
    includes = re.findall(r"^#include\s+([<\"][^>\"]+[>\"])", _text(), re.M)
    assert includes, "no include found: the pattern no longer matches the sources"
    for inc in includes:
        assert inc.startswith("<uapi/") or inc == '"gate.h"', \
            f"{inc}: a kernel-internal header makes every cold start compile far longer"
