"""The ``gatewrap-oci`` console script: an OCI runtime with runc's command line (runc(8)).

Every command goes to runc as given (exec(3): stdio, signals and exit code are runc's), but:

- ``create``: the bundle's ``config.json`` is checked (:func:`bundle.refusals`), the daemon
  sets the container's run up (:mod:`gatewrap.oci.runs`), the config is rewritten to join it
  (:func:`bundle.confine`), then ``runc create`` runs; if it fails, the run is torn down.
- ``delete``: ``runc delete``, then the daemon tears the run down (whatever runc said: a
  container runc no longer knows has no sandbox to keep); started if it is down.
- ``exec``: refused if the process it adds has capabilities beyond the default set
  (:func:`_check_exec`), else runc's.
- ``run`` and ``restore`` (a container created without ``create``) are refused.

gatewrap's own global flags, taken out before runc sees them: ``--gatewrap-socket PATH`` (the
daemon's; default ``$GATEWRAP_DAEMON_SOCKET``, else /run/gatewrap/daemon.sock),
``--gatewrap-audit-log PATH``, ``--gatewrap-resolver IP`` and ``--gatewrap-public-range
CIDR`` (repeatable; as ``gatewrap run``'s --resolver and --public-range), ``--gatewrap-runc
PATH`` (default: runc on PATH), and ``--gatewrap-policy PATH`` and ``--gatewrap-allow
HOST[,HOST]`` (repeatable), the policy of a container without gatewrap annotations (a
runtime entry per policy: docker 20.10 has no ``--annotation``). Failures of gatewrap's exit 125, with the message on stderr
and in runc's ``--log`` file (the engines read the runtime's error from there).

Start-up: a command passed on imports nothing but this module and :mod:`.argv` (measured
~9 ms over runc's own, of a Python start-up); ``create`` and ``delete`` import json, the
bundle rules and the daemon's protocol (no click, no extension).
"""

from __future__ import annotations

import contextlib
import os
import sys

from ..errors import EXIT_GATEWRAP
from . import argv as cli_args

#: runc's usual places, looked at before PATH (which may hold this runtime under runc's name).
RUNC_PATHS = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")
#: Commands that make a container without ``create``: refused (fail closed).
REFUSED = {"run": "use create and start (podman, docker and containerd do)",
           "restore": "checkpoint/restore is not supported by gatewrap-oci"}


#: What ``gatewrap-oci --help`` says before runc's own help.
HELP = """gatewrap-oci: an OCI runtime with runc's command line; each container runs in a gatewrap sandbox
(its egress through the gate only, audited). Docs: docs/guide/containers.md.

gatewrap's flags (global, before the command; an engine passes them as runtime arguments:
podman --runtime-flag NAME=VALUE, docker's runtimeArgs, a wrapper script for ctr):
  --gatewrap-allow HOST[,HOST]  hosts the container may reach, if it has no gatewrap.* annotation (repeatable)
  --gatewrap-policy PATH        a policy file (root's), if the container has no gatewrap.* annotation
  --gatewrap-socket PATH        the gatewrap daemon's socket (default /run/gatewrap/daemon.sock)
  --gatewrap-audit-log PATH     the containers' audit log (default /var/log/gatewrap/audit.jsonl)
  --gatewrap-resolver IP        the gate's DNS server (repeatable; as gatewrap run --resolver)
  --gatewrap-public-range CIDR  a range counted as public (repeatable; as gatewrap run --public-range)
  --gatewrap-runc PATH          the runc to delegate to (default: runc in /usr/sbin, /usr/bin, /usr/local/...)
Annotations: gatewrap.allow=HOST[,HOST], gatewrap.policy=PATH (they win over the flags).
Exit 125: gatewrap refused or failed (the reason on stderr and in runc's --log).

runc's help follows.
"""


class Failed(Exception):
    """gatewrap-oci cannot do what it was asked (the message says what to do)."""


def main() -> None:
    """The console script's entry: exits with runc's code, or 125 on gatewrap's failure."""
    try:
        line = cli_args.split(sys.argv[1:])
    except cli_args.UsageError as e:
        _fail(str(e), None, runc_globals=_leading_flags(sys.argv[1:]))
    if line.command is None and {"--help", "-h"} & set(line.runc_globals):
        with contextlib.suppress(BrokenPipeError):
            print(HELP, flush=True)
    runc = str(line.gatewrap.get("runc") or _find_runc())
    if not os.access(runc, os.X_OK):
        _fail(f"--gatewrap-runc {runc}: no such program (install runc: apt-get install runc; crun is not "
              "supported on hybrid cgroup hosts)", line)
    if line.command in REFUSED:
        _fail(f"{line.command}: {REFUSED[line.command]}", line)
    try:
        if line.command == "create":
            sys.exit(_create(line, runc))
        if line.command == "delete":
            sys.exit(_delete(line, runc))
        if line.command == "exec":
            given = _check_exec(line.args)
            if given is not None:
                _give_exec_the_containers_env(line, runc, *given)
    except (Failed, cli_args.UsageError) as e:
        _fail(str(e), line)
    os.execv(runc, line.runc_argv(runc))


def _find_runc() -> str:
    for path in RUNC_PATHS:
        if os.access(path, os.X_OK):
            return path
    _fail("runc is not installed (apt-get install runc), or name it with --gatewrap-runc PATH", None)
    raise AssertionError


def _run(argv: list[str]) -> int:
    """Run ``argv`` with this process's stdio and wait; its exit code (128+N: signal N)."""
    pid = os.posix_spawn(argv[0], argv, os.environ)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _ask(line: cli_args.CommandLine, message: dict, start: bool = True) -> dict:
    """Send ``message`` to the daemon and return its answer. The daemon: the one that serves
    the container's run (the registry says, :func:`gatewrap.sandbox.registry.saved`: an
    engine does not always pass its runtime flags to ``delete``, podman's cleanup does not),
    else ``--gatewrap-socket``'s, else the default one; started on demand when ``start``.

    Raises:
        Failed: no daemon, or it refused (its message).
    """
    from ..errors import GatewrapError
    from ..sandbox import registry
    from ..shared import client, protocol
    from .argv import RUN_PREFIX

    saved = registry.saved(RUN_PREFIX + str(message.get("container")))
    flag = (saved or {}).get("socket") or line.gatewrap.get("socket")
    try:
        sock = client.connect(protocol.socket_path(flag=flag), start=start)  # type: ignore[arg-type]
    except GatewrapError as e:
        raise Failed(str(e)) from None
    try:
        protocol.send(sock, message)
        got = protocol.Reader(sock).message() or {"error": "the daemon closed the connection without an answer"}
    finally:
        sock.close()
    if "error" in got:
        raise Failed(str(got["error"]))
    return got


def _create(line: cli_args.CommandLine, runc: str) -> int:
    import json

    from . import bundle

    bundle_dir, container = cli_args.create_args(line.args)
    cli_args.check_id(container)
    path = os.path.join(bundle_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        why = bundle.refusals(config, systemd_cgroup="--systemd-cgroup" in line.runc_globals, bundle_dir=bundle_dir)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise Failed(f"container {container} refused: {path} is not a runtime-spec config.json ({e})") from None
    if why:
        raise Failed(f"container {container} refused: " + "; ".join(why))
    policy, allow = bundle.policy_of(config)
    source = "annotations"
    if policy is None and not allow:  # the runtime's own (docker 20.10 has no --annotation)
        policy = line.gatewrap.get("policy")
        allow = [h.strip() for a in line.gatewrap["allow"] for h in a.split(",") if h.strip()]  # type: ignore[union-attr]
        source = "runtime flags"
    if policy is not None:
        mine = bundle.policy_refusal(config, str(policy), bundle_dir)
        if mine:
            raise Failed(f"container {container} refused: {mine}")
    got = _ask(line, {"op": "container_create", "container": container, "policy": policy, "allow": allow, "policy_source": source,
                      "uid": bundle.container_uid(config), "bounds": bundle.engine_bounds(config),
                      "unix_sockets": bundle.unix_sockets_of(config),
                      "argv": (config.get("process") or {}).get("args") or [],
                      "audit_log": line.gatewrap.get("audit_log"), "resolvers": line.gatewrap["resolvers"],
                      "public_ranges": line.gatewrap["public_ranges"]})
    try:
        bundle.confine(config, got["netns"], got["cgroups_path"], got["env"], [tuple(m) for m in got["mounts"]])
        bundle.seal_namespaces(bundle.seal_vsock(config))
        tmp = path + ".gatewrap"
        with open(tmp, "w") as f:
            json.dump(config, f)
        os.replace(tmp, path)
        code = _run(line.runc_argv(runc))
    except BaseException:
        _ask(line, {"op": "container_delete", "container": container}, start=False)
        raise
    if code != 0:
        _ask(line, {"op": "container_delete", "container": container}, start=False)
    return code


def _delete(line: cli_args.CommandLine, runc: str) -> int:
    container = cli_args.last_positional(line.args)
    if container is not None:
        cli_args.check_id(container)
    code = _run(line.runc_argv(runc))
    if container is not None and _served(container):
        # Its daemon down: one is started (on the run's socket), whose start collects the run,
        # dead now, as a stale one; the engine's delete must not fail for it (podman rm would).
        _ask(line, {"op": "container_delete", "container": container, "deleted": code == 0})
    return code


def _give_exec_the_containers_env(line: cli_args.CommandLine, runc: str, process_file: str,
                                  process: dict) -> None:
    """``exec --process FILE`` (podman's and docker's exec; ``process``: FILE as
    :func:`_check_exec` read it): the variables of the container's
    own process (its ``config.json``, as gatewrap-oci rewrote it: the proxy and CA variables
    and the shims') that FILE lacks are added to it; those FILE sets stay. The engines build
    FILE from their own record of the container, which has none of gatewrap's, so an exec'd
    agent would otherwise find no proxy (its direct connects fail: it would only not work).
    ``runc exec`` without ``--process`` starts from config.json's process already (runc(8)).
    Nothing is changed where runc does not know the container (its exec then says so).

    Raises:
        Failed: FILE cannot be rewritten.
    """
    import json
    import subprocess

    container = cli_args.exec_container(line.args)
    if container is None:
        return
    state = subprocess.run([runc, *line.runc_globals, "state", container], capture_output=True, text=True)
    try:
        with open(os.path.join(json.loads(state.stdout)["bundle"], "config.json")) as f:
            theirs = ((json.load(f).get("process") or {}).get("env")) or []
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # no such container, or no readable config: runc's exec says what is wrong
    env = process.get("env") or []
    have = {e.partition("=")[0] for e in env if isinstance(e, str)}
    added = [e for e in theirs if isinstance(e, str) and e.partition("=")[0] not in have]
    if not added:
        return
    process["env"] = [*env, *added]
    try:
        with open(process_file, "w") as f:
            json.dump(process, f)
    except OSError as e:
        raise Failed(f"exec: the process file {process_file} cannot be rewritten ({e.strerror})") from None


def _check_exec(args: list[str]) -> tuple[str, dict] | None:
    """``exec``: the process it adds to the container (``--process`` FILE, runtime-spec
    ``process``, as docker and podman pass it; ``--cap``) gets no capability beyond the
    default set: ``podman exec --privileged`` would give a process in the run's cgroup
    CAP_SYS_ADMIN and CAP_BPF, with which it could detach the hooks. Returns (FILE, its
    process object) for :func:`_give_exec_the_containers_env`, None without one.

    Raises:
        Failed: it would, or the process file cannot be read.
    """
    import json

    from . import bundle

    caps: dict[str, list[str]] = {"--cap": []}
    given = None
    for name, value in cli_args.exec_options(args):
        if name in ("--cap", "-c"):
            caps["--cap"].append(value if value.upper().startswith("CAP_") else "CAP_" + value.upper())
        elif name in ("--process", "-p"):
            try:
                with open(value) as f:
                    process = json.load(f)
                if isinstance(process, dict):
                    caps.update(process.get("capabilities") or {})
                    given = (value, process)
            except (OSError, ValueError, AttributeError) as e:
                raise Failed(f"exec: the process file {value} cannot be read ({e})") from None
    try:
        extra = bundle.beyond_default_caps(caps)
    except TypeError as e:
        raise Failed(f"exec: the process's capabilities are not lists of names ({e})") from None
    if extra:
        raise Failed(f"exec refused: capabilities beyond the default set ({', '.join(extra)}; exec --privileged or "
                     "--cap): with them the process could detach gatewrap's hooks or leave its cgroup")
    return given


def _served(container: str) -> bool:
    """Whether a daemon keeps a run for ``container`` (the registry's lock file): a
    container of another runtime, or whose run a gc removed, has nothing to tear down."""
    from ..sandbox import registry
    from .argv import RUN_PREFIX

    return os.path.exists(registry.lock_path(RUN_PREFIX + container))


def _fail(message: str, line: cli_args.CommandLine | None, runc_globals: list[str] | None = None) -> None:
    """Say ``message`` on stderr and in runc's --log file (its --log-format), exit 125.
    ``runc_globals``: runc's global flags where there is no ``line`` (it could not be read)."""
    text = f"gatewrap-oci: {message}"
    print(text, file=sys.stderr, flush=True)
    flags = line.runc_globals if line is not None else runc_globals
    if flags:
        _log(flags, text)
    sys.exit(EXIT_GATEWRAP)


def _leading_flags(argv: list[str]) -> list[str]:
    """The flags before the command (where runc's ``--log`` is), from a command line
    :func:`cli_args.split` refused: for the log of that refusal."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if not arg.startswith("-") and not (out and out[-1] in cli_args.RUNC_VALUED):
            break
        out.append(arg)
    return out


def _log(runc_globals: list[str], text: str) -> None:
    """Append ``text`` to the ``--log`` file runc was given, as runc writes (text or json)."""
    flags: dict[str, str] = {}
    for i, arg in enumerate(runc_globals):
        name, eq, value = arg.partition("=")
        if name in ("--log", "--log-format"):
            flags[name] = value if eq else (runc_globals[i + 1] if i + 1 < len(runc_globals) else "")
    if not flags.get("--log"):
        return
    import json
    import time

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entry = (json.dumps({"level": "error", "msg": text, "time": now}) if flags.get("--log-format") == "json"
             else f'time="{now}" level=error msg="{text}"')
    try:
        with open(flags["--log"], "a") as f:
            f.write(entry + "\n")
    except OSError:
        pass
