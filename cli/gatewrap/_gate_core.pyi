"""gatewrap's gate core (Rust, pyo3): policy, audit log, the gate, and the pre-exec launcher."""

from typing import Any, Callable

class PolicyError(ValueError):
    """A bad policy file or ``--allow``/``--deny`` value.

    The message names the file and line (``policy.toml:12: unknown key `foo```) or the bad
    value (``invalid host "a..b": empty label``).
    """

class GateError(RuntimeError):
    """The gate could not start (netns open/setns/bind failed, bad nameserver...).

    The message says what failed and what to do.
    """

class SpawnError(OSError):
    """The launcher could not start the agent; ``.errno`` is set.

    A missing command gives errno ENOENT and ``strerror`` "command not found: X"; a
    non-executable one EACCES and "permission denied: X"; a failing sandbox step (setns,
    cgroup join, setresuid...) names the step and carries that step's errno.
    """

    stage: str
    """"exec" when exec failed (the command: missing, not executable...), "setup" when
    preparing the sandbox failed (netns or cgroup could not be opened or joined, privilege
    drop failed). Check it before mapping ``errno`` ENOENT to "command not found".
    """

class Policy:
    """Egress policy: rules evaluated in order, then the default.

    Evaluation order of :meth:`decide_request` and :meth:`decide_connect`:

    1. command-line rules (:meth:`add_rule`), in the order added;
    2. policy-file rules, in file order;
    3. the first rule that matches decides: host, ports (none given: 80 and 443), and
       ``schemes``, ``methods``, ``path`` where given. A CONNECT tunnel (scheme https) cannot
       show methods or paths: a rule with them inspects the tunnel if it says
       ``inspect = true``; without it an allow rule is skipped and a deny/ask rule denies the
       tunnel (fail closed);
    4. otherwise ``default`` decides.

    Hosts are compared in canonical form: lower-case, one trailing dot stripped, IDN as
    punycode, IP literals normalised. ``"*.example.com"`` matches strict subdomains only
    (``a.example.com``, ``a.b.example.com``), never ``example.com`` nor ``evilexample.com``.

    Rules added after a :class:`Gate` was started with this policy apply to its new requests.

    The unspecified addresses (``0.0.0.0``, ``::``, ``::ffff:0.0.0.0``, any spelling) are
    never destinations: both decisions deny them before any rule (reason
    ``"policy: unspecified address"``, rule ``None``), ``report`` mode does not let them
    through, and a rule naming one raises :class:`PolicyError`.
    """

    @staticmethod
    def from_toml(text: str, source: str) -> Policy:
        """Parse a policy file (schema ``version = 1``).

        ``source`` is the file name used in error messages and rule ids
        (``"policy.toml:rule[3]"``). Unknown keys and invalid values (a lower-case method,
        an ambiguous path, a duration outside ``N`` + ``s``/``m``/``h``, ``timeout`` on a
        non-ask rule, ``budget`` on a non-allow rule) raise :class:`PolicyError` naming the
        line.
        ``inspect = true`` on an allow rule makes the gate TLS-inspect the https CONNECTs it
        matches (see :class:`Gate`, ``ca_dir``).

        A rule may set ``allow_private = true`` (allow rules on names or ``*.`` patterns
        only; on a deny rule or an IP-literal host it raises :class:`PolicyError`): the
        names it matches may then resolve to loopback, private, link-local, CGNAT,
        documentation, benchmarking and reserved addresses. Never to a cloud metadata address
        nor an IPv6 form embedding IPv4: only a rule naming that exact address allows those
        (see :class:`Gate`).
        """

    @staticmethod
    def new(default: str = "deny") -> Policy:
        """An empty policy with ``default`` ("deny", "allow" or "ask")."""

    def add_rule(self, spec: str, action: str, origin: str) -> None:
        """Add a command-line rule, evaluated before every file rule.

        ``spec`` is ``HOST[:PORT]`` (``pypi.org``, ``*.example.com:8443``, ``[::1]:443``,
        bare ``::1``); without a port the rule covers 80 and 443. ``action`` is "allow",
        "deny" or "ask". ``origin`` (e.g. ``"--allow pypi.org"``) becomes the rule id.
        Raises :class:`PolicyError` for a bad host, port or action, and for an unspecified
        address (``0.0.0.0``, ``::``), which can never be a destination.
        """

    def add_private_rule(self, spec: str, origin: str) -> None:
        """``--allow-private HOST[:PORT]``: as :meth:`add_rule` with action "allow" and
        ``allow_private = true`` (the name may resolve to a private, loopback, link-local,
        CGNAT, documentation, benchmarking or reserved address; never metadata nor embedded
        IPv4). Raises :class:`PolicyError` as :meth:`add_rule`, and for an address (a rule
        naming an address allows it already)."""

    def replace_with(self, other: Policy) -> None:
        """Put ``other``'s rules, default, mode, ``public_ranges`` and ``[approvals]`` limits
        in place of this policy's: a gate made with this policy decides the requests that
        come next by them (``gatewrap reload``). ``[sandbox]`` and ``[notify]`` stay."""

    @property
    def public_ranges(self) -> list[str]:
        """The file's top-level ``public_ranges`` (CIDR strings; [] without)."""

    def decide_connect(self, host: str, port: int) -> tuple[str, str, str | None, bool]:
        """Decide on a CONNECT tunnel to ``host:port`` as the gate would in ``enforce`` mode.

        Returns ``(action, reason, rule_id, inspect)``: action "allow" | "deny" | "ask";
        reason ``"policy: rule ID"``, ``"policy: default deny"``, ``"ask: rule ID is a
        breakpoint"``, ``"policy: rule ID matches methods or
        paths, which a tunnel hides; it needs `inspect = true`"`` or ``"policy: unspecified
        address"``; rule_id ``None`` when no rule applied; ``inspect`` True when the tunnel
        is to be TLS-inspected and each request in it decided by :meth:`decide_request`.
        Policy only: the SSRF guard and budgets come after, in the gate. Raises
        :class:`PolicyError` if ``host`` is not a valid host.
        """

    def decide_request(self, host: str, port: int, scheme: str, method: str, path: str) -> tuple[str, str, str | None]:
        """Decide on one request (``scheme`` "http" or "https"; ``path`` as sent, query
        included) as the gate would in ``enforce`` mode: ``(action, reason, rule_id)``.

        A rule that must compare a lower-case method or a path the gate refuses to
        interpret (encoded ``/``, dot segments, ...) denies it: reason ``"method: ..."`` /
        ``"path: ..."``. Raises :class:`PolicyError` for an invalid host, ValueError for
        another scheme.
        """

    @property
    def default(self) -> str:
        """The default action: "deny", "allow" or "ask"."""

    @property
    def mode(self) -> str:
        """"enforce", or "report" (the gate allows everything and records ``would = "deny"``)."""

    def describe(self) -> list[dict[str, Any]]:
        """The rules in evaluation order, for display.

        Each dict: ``id`` (str), ``host`` (canonical pattern), ``ports`` (list[int]),
        ``ports_default`` (bool: no port given, so 80 and 443), ``action``
        ("allow"|"deny"|"ask"), ``origin`` ("cli"|"file"), ``line`` (int for file rules, else
        None), ``allow_private`` and ``inspect`` (bool), ``methods`` (list[str] | None),
        ``path`` (the canonical pattern | None), ``schemes`` (list[str] | None), ``timeout``
        (e.g. "10m" | None), ``budget`` ((count, per), e.g. (6, "10m") | None), ``inject``
        ((secret name, place), e.g. ("github", "header authorization") | None).
        """

    def add_host_secrets(self, text: str | None = None, source: str = "/etc/gatewrap/secrets.toml") -> None:
        """Add the host secrets file's ``[[secret]]``s (``text``; None: none) and check that
        every rule's ``inject`` names a defined secret. Raises :class:`PolicyError` (``FILE:LINE: ...``)."""

    def secrets(self) -> list[dict[str, Any]]:
        """The ``[[secret]]``s: ``name``, ``source`` (("file"|"env", str) or ("command", list[str])),
        ``placeholder_env`` (str | None), ``budget`` (int | None: requests per run), ``origin`` ("FILE:LINE").
        Never a value."""

    def notify(self) -> dict[str, str | None]:
        """The file's ``[notify]`` table: ``{"webhook": URL or None}``."""

    def sandbox(self) -> dict[str, list[tuple[str, int]]]:
        """The file's ``[sandbox]`` table: ``{"ro_bind": [(path, line)], "bind": [(path, line)]}``,
        host paths the run shows in the jail read-only / writable (as ``--ro-bind``/``--bind``);
        empty lists without one. Paths are absolute, without ``.``/``..`` components and not
        ``/`` (:meth:`from_toml` raises :class:`PolicyError` naming the line otherwise).
        ``"env"``: ``[(entry, line)]``, ``NAME`` or ``NAME=VALUE`` as written (as ``--env``;
        checked by :mod:`gatewrap.sandbox.environment`).
        ``"unprotect": [(path, line)]``: protected paths left writable (as ``--unprotect``),
        absolute or relative to each writable path, without ``.``/``..`` components.
        """

class AuditLog:
    """An append-only JSON-lines audit log shared by the gate and Python."""

    def __init__(self, path: str, key: str | None = "/var/lib/gatewrap/audit/signing-key",
                 checkpoint_every: int = 1000, checkpoint_interval: float = 60.0,
                 max_size: int = 104857600, keep: int | None = None) -> None:
        """Open ``path`` for appending (created with mode 0o640; missing parent directories
        with 0o750).

        Every line is hash-chained to the one before it (``seq``, ``prev``; README "Tamper
        evidence"). With ``key`` (a signed-note Ed25519 key file, made 0600 in a 0700 root
        directory on first use), a signed ``checkpoint`` record follows every record whose
        ``seq`` is a multiple of ``checkpoint_every`` (0: never), the first record written
        ``checkpoint_interval`` seconds after this handle's last checkpoint, and each
        :meth:`checkpoint` call; ``key=None``: no checkpoints. A key that cannot be read or
        made raises ValueError (unsafe directory or file, malformed key) or OSError.

        With a key, the log is rotated by size (README "Rotation"): before a record that would
        take the file past ``max_size`` bytes (default 100 MiB; 0: never; at least 4096), the
        file is renamed ``<path>.<seq of its first record, 12 digits>`` after a closing
        checkpoint, and a new file takes ``path``, its first line a checkpoint continuing the
        chain (``rotated_from``: the segment's name). ``keep``: delete the oldest segments
        beyond this many (None: keep all). A max_size below 4096 raises ValueError.

        The directory must be root's and not writable by group or others, and so must every
        directory above it unless it is sticky (``/tmp`` itself is refused: anyone could
        plant the file there; a root-owned directory under it is fine). The file is opened
        without following a link and without blocking (a FIFO would block open(2)), and must
        be a regular file. Raises ValueError (an unsafe directory, or a link, FIFO, device or
        directory at ``path``: the message names the path and what to do), OSError when the
        open itself fails.
        """

    @property
    def path(self) -> str:
        """The log's path."""

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as one line, in one write(2), whole or not at all.

        The line starts with ``"v": 1``, ``"time"`` (RFC 3339 UTC, microseconds), ``"seq"``
        and ``"prev"``, then the record's keys in order. Values may be str, int, float, bool,
        None, list, tuple, dict (str keys), bytes (invalid UTF-8 written as ``\\xNN``; so is
        a str's surrogate-escaped byte). Every control character (C0, DEL, C1) of every
        string is written as an escape. A line is at most 16 KiB: longer strings are cut (ending in "…"), then
        the largest values set to null, and ``"truncated"`` lists the keys cut. Writers
        (this process or another) take an exclusive flock(2) on the file; a write that
        stops short (a full disk) is undone with ftruncate(2), so the log never holds a cut
        line; a rotation that cannot be made (a full disk) is this record's error, and the
        record is not written. Raises ValueError if the record sets ``v``, ``time``, ``seq`` or ``prev`` or holds a non-finite
        float, TypeError for other value types, OSError (errno of the cause, e.g. ENOSPC)
        if the write fails. Thread-safe.
        """

    def checkpoint(self) -> None:
        """Append a signed checkpoint of the chain as the file holds it (unless the file is
        empty or its last record is one; nothing without a key). Raises OSError as
        :meth:`write`."""

    def sync(self) -> None:
        """fsync the log."""

class Gate:
    """The gate: an HTTP forward proxy (absolute-form ``http://`` and CONNECT).

    Listens on 127.0.0.1 and [::1] inside the sandbox netns; dials upstream from the host
    netns. Every decision is one audit record (event "request" | "connect", decision
    "allowed" | "denied" | "failed"); an allowed request or tunnel has, before it, an
    ``"admit"`` record (the decision, no outcome), written before the gate dials. If a
    record cannot be written (a full disk), the gate admits nothing: the request gets 503
    with a body naming the log and the cause, and nothing is dialled; requests pass again
    once a record can be written. At most 1024 connections at once over the proxy port and
    the DNS stub's TCP side (DNS over TCP at most 64, closed after 10 s without a query). A denied destination gets 403 naming the rule and how
    to allow it; names are resolved only after the policy allowed them; upstream failures get
    502 (504 on timeout).

    Refused with 400 and audited as denied (reason ``"protocol: ..."``): a request head hyper
    cannot parse (``"protocol: malformed request (<cause>)"``, status 400, or 431 for a head
    over 64 KiB; no method/target in the record), a target port outside 1-65535 or empty
    (``"protocol: invalid port"``), and an absolute-form request whose ``Host`` header names
    another host or port than the target (``"protocol: host mismatch"``; compared
    canonically, port 80 implied). A client that disconnects without a complete request
    leaves no record. An unspecified address (``0.0.0.0``, ``::``) gets 403 with reason
    ``"policy: unspecified address"`` in every mode, and a name that resolves only to one
    fails (502) rather than being dialled.

    SSRF guard: after the policy allowed a destination (and a name was resolved), every
    address is classified, on every request (nothing is cached, so a rebinding name is
    judged again), and the gate dials only addresses it kept, never looking the name up a
    second time. Public addresses are kept. Not public (IANA special-purpose registries,
    RFC 6890): loopback, private (RFC 1918, fc00::/7), link-local, CGNAT (100.64/10),
    multicast, broadcast, "this network" 0.0.0.0/8, documentation (192.0.2/24, 198.51.100/24,
    203.0.113/24, 2001:db8::/32, 3fff::/20), benchmarking, reserved (240/4, IPv6 outside
    2000::/3, ...); class ``metadata`` (169.254.169.254, fd00:ec2::254, 169.254.170.2,
    100.100.100.200, 168.63.129.16); class ``embedded-ipv4`` (::ffff:0:0/96, ::/96,
    ::ffff:0:0:0/96, 64:ff9b::/96, 64:ff9b:1::/48, 2002::/16, 2001::/32), whatever it embeds.
    A non-public address is kept only when an allow rule names that exact address (first
    matching rule for the IP literal and port; any class, however the host was reached), or
    when the destination is a name whose rule has ``allow_private = true`` and the class is
    loopback, private, link-local, cgnat, documentation, benchmarking or reserved. If no
    address is left: 403 naming the host, the address, its class and how to allow it, and an
    audit record with decision "denied", reason ``"ssrf: <class> address <ip>"`` (e.g.
    ``"ssrf: loopback address 127.0.0.1"``), ``dst_host``, ``dst_ip``, status 403 and the
    ``rule`` that allowed the name. ``report`` mode does not lift the guard.
    """

    def __init__(
        self,
        *,
        run_id: str,
        netns_path: str,
        policy: Policy,
        audit: AuditLog,
        listen_port: int = 3128,
        nameservers: list[str] | None = None,
        connect_timeout: float = 10.0,
        public_ranges: list[str] | None = None,
        notices: bool = False,
        dns_stub: bool = False,
        ca_dir: str | None = None,
        upstream_ca: list[str] | None = None,
        body_limit: int = 16 * 1024 * 1024,
        idle_timeout: float = 300.0,
        run_cgroup: str | None = None,
        state: str | None = None,
        on_asked: Callable[[dict[str, Any]], None] | None = None,
        shared_runtime: bool = False,
        notice_fd: int | None = None,
        secrets: list[tuple[str, str, str | None]] | None = None,
        answer_prefix: str | None = None,
        answer_suffix: str | None = None,
        allow_hint: str = "run",
    ) -> None:
        """Bind the listeners inside ``netns_path`` and start serving; returns once listening.

        ``state``: the approvals store URL (see :class:`ApprovalStore`); ``None`` = approvals
        off (an ``ask`` is a denial). With it the gate registers ``run_id`` in the store (wake
        socket ``/run/gatewrap/<run_id>/control.sock``, 0700) and ends it at :meth:`stop`
        (pending approvals cancelled). A request an ``ask`` rule matches (http, or https with
        ``inspect = true``; an uninspected CONNECT to an ask rule stays a denial) is let
        through by an active grant of the run (reason ``grant: gr-...``), else persisted as an
        approval (or joins the pending one with the same digest or Idempotency-Key) and, with
        ``hold = "wait"``, held until decided: approved -> sent once (the claim winner; the
        agent's original credentials; the edited body and headers if edited), a second
        request sharing it gets 409 "already sent once"; rejected -> 403 with the reason;
        deadline -> 403 "expired (a timeout is never a yes)". ``hold = "return"``: 409 at once
        with ``Retry-After: 5`` and ``Gatewrap-Approval: ap-...``; the retry (same digest or
        Idempotency-Key) is answered by that approval's state. A store that cannot be used:
        503, recorded as denied, nothing sent. ``GET /.well-known/gatewrap/approvals/ID
        [?wait=S]`` in origin form on the gate's port answers ``{"id","status","reason",
        "version","deadline"}`` of an approval of this run (others 404), waiting up to 60 s.
        Audit records: ``approval_asked|edited|approved|rejected|expired|sent|cancelled``.
        ``on_asked(approval_dict)`` is called for each new approval on a worker thread; its
        exceptions are ignored (a notification never decides). With ``notices`` a line
        ``gatewrap: approval ap-...: METHOD URL (rule R) waits until T; answer with: ...`` is
        printed on stderr (or ``notice_fd``); its commands are ``{answer_prefix} approve ID{answer_suffix}``
        (default ``sudo gatewrap approvals`` and nothing), the same for ``reject`` and ``show``.

        ``run_cgroup``: the run's cgroup directory. With it, each TCP connection's records
        carry ``client_pid`` and ``client_comm``: the process of that cgroup (or one below
        it) holding the client's socket, found once per connection from the socket's inode
        (the sandbox's /proc/PID/net/tcp{,6} and its processes' /proc/PID/fd), at most
        500 ms; ``client_pid: null`` when none was found. DNS over UDP is not attributed.

        ``nameservers``: ``["198.51.100.2:53", "[2001:db8::2]:53"]`` (UDP and TCP each);
        ``None`` reads the host's /etc/resolv.conf. ``listen_port`` 0 picks a free port.
        ``connect_timeout`` bounds each connection attempt (and a DNS lookup), in seconds.
        The IPv6 listener is skipped when the netns has no ``::1``.
        ``public_ranges``: CIDRs (``["198.51.100.128/25", "2001:db8:100::/48"]``) whose
        addresses the SSRF guard counts as public, e.g. a test network on documentation
        addresses. They never make a metadata, embedded-IPv4 or unspecified address public.
        A malformed CIDR (no ``/len``, bits set after the prefix, octal/short IPv4) or a
        range covering a metadata address raises ValueError naming the value.
        ``notices``: print one line on stderr per denied or failed request (at most 20 per
        gate, then one line saying the rest are suppressed, a repeat of the previous line not
        shown again), control characters escaped.
        ``dns_stub``: also serve UDP and TCP port 53 on the same loopback addresses; every
        query is answered REFUSED (RFC 1035 RCODE 5) and recorded (event ``"dns"``, decision
        ``"denied"``, ``dst_host`` = the queried name).
        ``ca_dir``: the TLS inspection CA (see :func:`ensure_ca`), loaded (or made) at start;
        ``None``: no inspection, and a CONNECT that an ``inspect = true`` rule allows fails
        with 502 (error ``"tls: inspection is off ..."``). With a CA, such a CONNECT is
        answered 200 at once (no dial; audit record event ``"connect"``, no ``dst_ip``),
        the client's TLS is accepted with a leaf for the CONNECT host (dNSName or iPAddress
        SAN, signed by the CA, cached up to 1024 hosts for 24 h, valid 7 days; ALPN
        ``http/1.1`` only), and each request inside is decided (scheme https) and audited on
        its own: event ``"request"``, proto ``"https"``, target ``https://host[:port]/path``.
        Refused inside a tunnel: an SNI naming another host (TLS alert ``access_denied``;
        reason ``tls: SNI "x" does not match the CONNECT host y``), a ``Host`` header or
        target naming another host or port (421, reason ``protocol: host mismatch (...)``),
        a CONNECT (400), ``Upgrade: h2c`` (400, also on plain http), a body over
        ``body_limit`` bytes (413,
        reason ``limit: request body over N bytes``). A handshake the client abandons (it
        does not trust the CA) is recorded as failed, error ``downstream: tls: ...``.
        Upstream TLS is verified against Mozilla's roots (compiled in; never the
        environment's ``SSL_CERT_FILE``) plus the PEM files ``upstream_ca``; a failure is
        502 with error ``upstream: tls: <cause>`` (e.g. ``invalid peer certificate:
        UnknownIssuer``).
        ``Upgrade: websocket`` on an allowed request (plain http or inspected https) is
        relayed both ways after the upstream's 101.
        ``idle_timeout``: seconds after which a tunnel or an upgraded connection that
        carried nothing either way is closed. An inspected connection's next request head
        must arrive within 30 s.
        ``shared_runtime``: run on the one process-wide tokio runtime (2 worker threads
        ``gate-N``, built by the first such gate on the calling thread, which must be in the
        host netns) that all gates started with it share, instead of a runtime of the gate's
        own (2 workers each); for a process serving many sandboxes. Every task of the gate
        (accept loops, connections, tunnels, held requests...) stays its own:
        :meth:`stop` ends exactly those. Per-gate state (policy, counts, pools, resolver,
        approvals) is the same either way.
        ``notice_fd``: with ``notices``, the lines go to this file descriptor (e.g. the run's
        terminal) instead of the process's stderr. The gate keeps a close-on-exec duplicate
        (the caller may close its own) and closes it when the Gate is garbage-collected;
        lines are written by a thread of the gate's, at most 64 waiting (then dropped; the
        audit log has them all), and write errors (EPIPE: the reader went away) are ignored.
        Raises :class:`GateError` on failure (an unreadable CA, a CA key readable by others,
        a bad ``upstream_ca`` file), ValueError for a negative ``notice_fd`` and OSError
        (errno set, e.g. EBADF) when it cannot be duplicated. Needs root (setns).
        ``secrets``: the run's resolved secrets ``[(name, value, placeholder | None)]`` that
        rules inject (gate_core/src/gate/secrets); ValueError for a bad one.
        ``allow_hint``: which settings the 403 bodies and notices name to allow a destination:
        ``"run"``, ``gatewrap run``'s (``--allow``, ``--allow-private``, ``--public-range``, the
        policy file); ``"container"``, a container's run's (gatewrap-oci: the annotations
        ``gatewrap.allow`` and ``gatewrap.policy``, the runtime's ``--gatewrap-allow`` and
        ``--gatewrap-public-range``); ValueError for another value.
        """

    def set_secrets(self, secrets: list[tuple[str, str, str | None]]) -> None:
        """Replace the run's secrets (``Gate(secrets=[(name, value, placeholder)])``: a rotation,
        placeholders unchanged); requests from now on carry the new values. ValueError names
        a bad secret, never its value."""

    @property
    def listen_addrs(self) -> list[str]:
        """Where the gate listens, e.g. ``["127.0.0.1:3128", "[::1]:3128"]``."""

    def counts(self) -> dict[str, int]:
        """Decisions so far: ``{"allowed": n, "denied": n, "failed": n, "inspected": n,
        "would_deny": n, "unsent": n}``: ``inspected`` counts TLS-inspected tunnels (not in
        ``allowed``; their requests are counted each), ``would_deny`` report-mode decisions
        that enforce mode would have denied (also in ``allowed``), ``unsent`` requests refused
        with 503 before any dial because their record could not be written (not in
        ``failed``, which counts what upstream broke)."""

    def stop(self, end_run: bool = True) -> None:
        """Stop accepting, abort tunnels and requests in flight, shut down (within ~1 s):
        every task of this gate is cancelled and awaited (at most 0.8 s), so its listeners
        refuse connections and its sockets are closed when it returns; on the shared runtime
        other gates go on untouched. Then the DNS queries held over the stub's record rate
        are recorded (one record with their count) and, if ``end_run``, the run is ended in
        the approvals store (False: a stopping daemon whose runs a restarted one takes back,
        pending approvals and all). Runs with the GIL released. Idempotent; also done when
        the Gate is garbage-collected."""

def ensure_ca(ca_dir: str) -> str:
    """Load the TLS inspection CA from ``ca_dir``, or make it (ECDSA P-256, ten years, path
    length 0): ``ca_dir/ca.crt`` (0644) and ``ca_dir/private/ca.key`` (0600 in a 0700
    directory). Returns the certificate's path. Raises :class:`GateError` when the key is
    readable by others or not owned by the caller, or the files do not match."""

def parse_duration(text: str) -> float:
    """Seconds of ``text`` in the policy file's duration grammar: a positive whole number and
    a unit s, m or h (``30s``, ``10m``, ``2h``), at most 31 days. Raises ValueError naming
    the grammar."""

def landlock_abi() -> int | None:
    """The kernel's Landlock ABI version (landlock_create_ruleset(2) with
    ``LANDLOCK_CREATE_RULESET_VERSION``; 6 and later have the signal and abstract unix socket
    scopes), or None when Landlock is not built or not enabled at boot."""

def spawn_agent(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    netns_path: str,
    cgroup_dir: str,
    uid: int,
    gid: int,
    groups: list[int],
    hide: list[str] = ...,
    readonly: list[str] = ...,
    jail: str = "none",
    join_cgroups: list[str] = ...,
    oom_score_adj: int | None = None,
    nproc: int | None = None,
    nofile: int | None = None,
) -> int:
    """Start ``argv`` inside the sandbox and return its pid (reap it with ``os.waitpid``).

    The child is born in ``cgroup_dir`` (clone3(2) ``CLONE_INTO_CGROUP``, Linux 5.7+). The
    environment is exactly ``env``; ``argv[0]`` is looked up on ``env["PATH"]`` as execvp(3)
    does. Before exec, in this order, the child: enters the working directory; joins each
    ``join_cgroups`` folder (cgroup v1 leaves: ``0`` written to its ``cgroup.procs``, opened
    by the parent); writes ``oom_score_adj`` (proc(5)) and sets RLIMIT_NPROC to ``nproc``
    (soft and hard) when given, and the soft RLIMIT_NOFILE to ``nofile`` (at most the hard
    one, which stays); resets
    SIGPIPE/SIGXFSZ to default and empties the signal mask; joins the netns; enters new cgroup and
    mount namespaces (mounts private), covers each ``hide`` path with an empty read-only tmpfs
    and bind-mounts each ``readonly`` path read-only onto itself; sets ``groups``, then gid; empties the capability
    bounding and ambient sets; sets uid; clears every capability (even for uid 0); sets
    no_new_privs; installs the baseline seccomp filter for ``jail`` (``"nsjail"``: argv is
    nsjail, which runs as root without a user namespace and drops to uid/gid/groups itself,
    so the groups-to-capabilities steps are left to it, and the filter leaves it its
    mount/pid/ipc/uts namespaces and mounts; ``"none"``: argv is the agent, no namespace or
    mount system call); marks every fd above 2 close-on-exec. Where ``/`` is not a mount
    point (a chroot), a recursive clone of the tree is mounted on it and entered first, so
    that the mounts can be made private. Raises :class:`SpawnError`; ``ValueError`` for
    another ``jail``.
    """

def audit_verifier_key(path: str = "/var/lib/gatewrap/audit/signing-key") -> str:
    """The signed-note verifier key (``<name>+<key id hex>+<base64(0x01 || Ed25519 public
    key)>``) of the audit signing key at ``path``, made if missing. Raises ValueError
    (unsafe directory, malformed key) or OSError."""

class StaleDecision(ValueError):
    """A decision or edit made on a view of an approval that is no longer current.

    Nothing changed in the store. ``why`` is one of ``"decided"`` (someone answered first:
    the message says who, what and when), ``"edited"`` (its version moved: look again),
    ``"expired"`` (its deadline passed; a timeout is never a yes), ``"run ended"`` (its run
    is over: the run id is the fence), ``"digest"`` (the request is not the one you saw),
    ``"not found"``. ``detail`` is the sentence for the human, ``id`` the approval.
    """

    why: str
    detail: str
    id: str

class PendingLimit(ValueError):
    """A new approval past a cap of pending approvals (``[approvals] max_pending`` per run,
    ``max_pending_store`` per store): nothing was stored. ``scope`` is ``"run"`` or
    ``"store"``, ``limit`` the cap."""

    scope: str
    limit: int

class UnsafeStore(ValueError):
    """A SQLite store whose file (or -wal, -shm, -journal) is not root's regular file with mode
    0600, or whose folder is not root's and closed to others (checked as the audit log's):
    a local user could have written approvals or decisions into it. The message says why and
    what to do."""

DEFAULT_MAX_PENDING: int
DEFAULT_MAX_PENDING_STORE: int
MAX_REASON: int

class ApprovalStore:
    """The approvals store (issue 12): the truth about held requests, decisions and grants.

    ``url``: a path or ``sqlite:PATH`` (SQLite in WAL mode, busy timeout 5 s,
    ``synchronous = NORMAL``: a commit survives any crash, not a power cut; a new file 0600, a new directory 0700;
    an existing one must be root's alone, else :class:`UnsafeStore`), or
    ``postgresql://USER@HOST:PORT/DB`` (also ``postgres://``; plain TCP or a unix socket
    ``?host=/dir``: TLS to the server is not built). The schema is created on open
    (idempotent, ``meta.schema`` = "1"). Raises OSError (the file, or the database refused:
    errno EIO and its message), ValueError (a URL of another kind).

    An approval dict has: ``id`` ("ap-" + 20 base32), ``run_id``, ``created``, ``deadline``
    (seconds since the epoch), ``rule``, ``method``, ``url`` (canonical absolute URL, or
    ``host:port`` for a CONNECT), ``headers`` ([[name, value], ...], credentials redacted as
    ``"[redacted]"``), ``body`` (bytes, at most 64 KiB), ``body_len`` (the whole body's),
    ``body_truncated``, ``body_digest`` (sha256 hex of the whole body), ``digest`` (sha256 hex
    of ``method "\\n" url "\\n" body_digest``, of the current request), ``idem_key``,
    ``version`` (1, +1 on every change), ``status`` (pending | approved | rejected | expired
    | sending | sent | cancelled), ``hold`` (wait | return), ``grants_allowed``, ``token``
    (the review page's secret), ``review_path`` (``/a/<token>``), ``decided_by``,
    ``decided_at``, ``reason``, ``edited``, ``orig_headers``, ``orig_body`` (the request as
    the agent sent it, after an edit), ``grant_id``, ``sent_at``, ``upstream_status``,
    ``waiters`` (requests of the agent sharing it).

    A grant dict: ``id`` ("gr-..."), ``run_id``, ``approval_id``, ``method``, ``host``
    (the URL's authority: ``host`` or ``host:port``), ``path_prefix``, ``created``,
    ``expires``, ``revoked``, ``revoked_by``, ``uses``, ``created_by``.
    A run dict: ``run_id``, ``started``, ``ended``, ``host``, ``pid``, ``wake``.
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        """Open the store; ``create=False``: a SQLite store that does not exist is not made
        (FileNotFoundError), for commands that only read or decide."""
    @property
    def url(self) -> str:
        """The URL, any password shown as ``***``."""

    def list(self, *, status: str | None = None, run_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Approvals, newest first."""

    def get(self, id: str) -> dict[str, Any] | None: ...
    def get_by_token(self, token: str) -> dict[str, Any] | None:
        """The approval whose review token is ``token`` (compared in constant time), or None."""

    def decide(
        self,
        id: str,
        *,
        version: int,
        digest: str,
        verdict: str,
        by: str,
        reason: str | None = None,
        grant: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Approve (``verdict="approve"``) or reject (``"reject"``) a pending approval as seen
        at ``version`` with ``digest``; ``by`` is recorded. ``grant`` =
        ``{"method": "POST", "host": "mail.test", "path_prefix": "/v3/", "seconds": 1800}``
        lets later requests of the same run through (``host`` must be the request's own,
        the rule must allow grants; method exact, path prefix segment-wise). Wakes the run
        after the commit. Returns the approval. Raises :class:`StaleDecision`, ValueError (an
        unknown verdict, a grant on a rejection, a grant wider than the request's host or
        forbidden by the rule), OSError (the database)."""

    def edit(
        self, id: str, *, version: int, digest: str, by: str, headers: list[tuple[str, str]], body: bytes
    ) -> dict[str, Any]:
        """Replace the headers and body of a pending approval (seen at ``version`` with
        ``digest``): version + 1, a new digest, the first original kept. ``headers`` is the
        whole list as shown (redacted values included); credentials, Host, hop-by-hop headers,
        Content-Length, Transfer-Encoding, Expect and Idempotency-Key must be unchanged. The
        URL is not editable. Raises ValueError (such a header changed, the body over 64 KiB,
        the stored body truncated), :class:`StaleDecision`, OSError."""

    def grants(self, *, run_id: str | None = None, active: bool = True) -> list[dict[str, Any]]:
        """Grants, newest first; ``active``: unrevoked, unexpired, of a run not ended."""

    def revoke_grant(self, id: str, *, by: str) -> dict[str, Any]:
        """Revoke a grant (again: no change). Raises ValueError when there is no such grant."""

    def runs(self, *, active: bool | None = None) -> list[dict[str, Any]]:
        """Runs, newest first; ``active`` True: not ended, False: ended."""

    def start_run(self, run_id: str, *, host: str = "localhost", pid: int = 0, wake: str | None = None) -> None:
        """Register a run (the gate does this itself when started with ``state``)."""

    def end_run(self, run_id: str) -> None:
        """Mark the run ended: its pending and approved-unsent approvals become
        ``cancelled``, its grants stop applying, later decisions are refused (``"run ended"``).
        Idempotent."""

    def counts(self, run_id: str) -> dict[str, int]:
        """``{"asked", "approved", "rejected", "expired", "granted", "by_grant"}`` of a run
        (``approved`` counts approved, sending and sent; ``by_grant`` the requests grants
        let through)."""

    def ask(
        self,
        run_id: str,
        *,
        rule: str,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        timeout: float = 600.0,
        hold: str = "wait",
        grants_allowed: bool = True,
        idem_key: str | None = None,
        max_pending: int = 100,
        max_pending_store: int = 1000,
    ) -> tuple[dict[str, Any], bool]:
        """Persist a pending approval as the gate does, or join the pending one of the run
        with the same digest or ``idem_key``: (approval, new). For tools and tests of the CLI
        and review page without a sandbox; headers are redacted before they are stored.
        Raises :class:`PendingLimit` when a new one would pass ``max_pending`` pending
        approvals of the run or ``max_pending_store`` in the store."""

    def prune(self, before: float) -> dict[str, int]:
        """Remove approvals rejected, sent, cancelled or expired (or pending past their
        deadline) before ``before`` (Unix seconds), grants revoked or expired before it, and
        runs ended before it with nothing left: ``{"approvals", "grants", "runs"}`` removed.
        Never a pending approval still to be decided, nor an approved one still to be sent."""

class RingReader:
    """A BPF ring buffer map read through its memory (mmap(2)), as libbpf's ring_buffer reads
    it but without an epoll instance of its own: poll the map's fd (readable while records
    wait), then :meth:`consume`. One thread at a time."""

    def __init__(self, map_fd: int, size: int) -> None:
        """Map the buffer of ``map_fd`` (its data area ``size`` bytes: the map's
        max_entries, a power of two). The fd may be closed after: the mappings hold the map.
        Raises OSError (mmap(2) failed) or ValueError (``size`` not a power of two)."""

    def consume(self, callback: Callable[[bytes], object]) -> int:
        """Call ``callback(record)`` for each record waiting, in order, without waiting for
        more; returns how many. An exception from ``callback`` is raised after its record is
        marked read. 0 once closed."""

    def close(self) -> None:
        """Unmap the buffer. Idempotent."""
