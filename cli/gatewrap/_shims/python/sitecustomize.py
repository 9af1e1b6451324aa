"""gatewrap's Python shim, loaded by every Python agent through PYTHONPATH.

A connection the kernel refuses (a cgroup hook: EPERM) raises :class:`EgressBlocked`, a
PermissionError (so existing handlers still catch it) whose message names gatewrap, the
destination, and what to do. Nothing else of the socket module changes. aiohttp, which
reads the proxy variables only with ``trust_env=True``, gets that as the default of
``ClientSession`` when (and only if) the agent imports it. Then any other ``sitecustomize``
on the path runs, as it would have without gatewrap.
"""

import errno as _errno
import importlib.util as _ilu
import os as _os
import socket as _socket
import sys as _sys

_GATE = _os.environ.get("GATEWRAP_GATE", "the gate")
_RUN = _os.environ.get("GATEWRAP_RUN", "")
#: The command that shows the run's records (``gatewrap audit --run ID [--log PATH]``).
_AUDIT = _os.environ.get("GATEWRAP_AUDIT", "")
#: How to allow a host: gatewrap run's flag, or a container's annotation (``gatewrap.shims.ALLOW_HOST``).
_ALLOW = _os.environ.get("GATEWRAP_ALLOW") or "gatewrap run --allow HOST"


_INET = (_socket.AF_INET, _socket.AF_INET6)


class EgressBlocked(PermissionError):
    """Direct egress refused by gatewrap's kernel hooks (errno EPERM)."""


def _dest(address):
    try:
        host, port = address[0], address[1]
    except (TypeError, IndexError):
        return str(address)
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _loopback(address):
    """Whether ``address`` is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z)."""
    import ipaddress  # not at the top: only a refusal needs it

    try:
        ip = ipaddress.ip_address(str(address[0]).split("%")[0])
    except (TypeError, IndexError, ValueError):
        return False
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def _explain(address, stream):
    audit = f"{_AUDIT or ('gatewrap audit --run ' + _RUN if _RUN else 'gatewrap audit')} --denied"
    if stream and _loopback(address):
        # NO_PROXY names loopback (env.toml), so clients dial it themselves; the sandbox's
        # loopback holds only the gate, which would send it to the host's loopback.
        todo = (f"clients skip it for loopback (NO_PROXY): to send this through it, to the host's "
                f"{_dest(address)} if the policy allows that address, unset NO_PROXY (curl: --noproxy '')")
    else:
        todo = f"send the request through it (HTTP_PROXY/HTTPS_PROXY are set), with the host allowed there ({_ALLOW})"
    return (f"egress to {_dest(address)} was blocked by gatewrap: only the gate ({_GATE}) is reachable; "
            f"{todo}; the audit record: {audit}")


def _wrap(name, address_of):
    original = getattr(_socket.socket, name)

    def method(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except PermissionError as e:
            # Only inet sockets pass the cgroup hooks; an EPERM elsewhere (netlink, unix) is not ours.
            if e.errno != _errno.EPERM or isinstance(e, EgressBlocked) or self.family not in _INET:
                raise
            raise EgressBlocked(_errno.EPERM, _explain(address_of(args), self.type == _socket.SOCK_STREAM)) from None

    method.__name__ = name
    method.__qualname__ = f"socket.{name}"
    method.__doc__ = original.__doc__
    setattr(_socket.socket, name, method)


_wrap("connect", lambda a: a[0] if a else "?")
_wrap("sendto", lambda a: a[-1] if a else "?")
_wrap("sendmsg", lambda a: a[3] if len(a) > 3 else "?")
_socket.EgressBlocked = EgressBlocked


class _AiohttpTrustsEnv:
    """A one-shot sys.meta_path finder (PEP 451): when ``aiohttp`` is first imported, its
    ClientSession defaults to ``trust_env=True`` (an explicit ``trust_env=False`` still
    wins). Costs one name comparison per import otherwise."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "aiohttp":
            return None
        _sys.meta_path.remove(cls)
        spec = _ilu.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            session = getattr(module, "ClientSession", None)
            if session is not None:
                init = session.__init__

                def __init__(self, *args, **kwargs):
                    kwargs.setdefault("trust_env", True)
                    init(self, *args, **kwargs)

                __init__.__doc__ = init.__doc__
                __init__.__wrapped__ = init
                session.__init__ = __init__

        spec.loader.exec_module = exec_module
        return spec


_sys.meta_path.insert(0, _AiohttpTrustsEnv)


def _chain():
    """Run the next ``sitecustomize`` on sys.path, if any, under its own name (once: the
    shim's folder may be on the path twice, by another spelling)."""
    if getattr(_sys, "_gatewrap_shim_chained", False):
        return
    _sys._gatewrap_shim_chained = True
    here = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))
    for entry in _sys.path:
        if not entry or _os.path.realpath(entry) == here:
            continue
        path = _os.path.join(entry, "sitecustomize.py")
        if _os.path.isfile(path) and _os.path.realpath(path) != _os.path.realpath(__file__):
            spec = _ilu.spec_from_file_location("_gatewrap_chained_sitecustomize", path)
            if spec and spec.loader:
                spec.loader.exec_module(_ilu.module_from_spec(spec))
            return


_chain()
