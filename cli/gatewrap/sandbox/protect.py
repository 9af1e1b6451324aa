"""Protected paths: what other tools execute (or read as code) implicitly in a writable folder
stays read-only for the agent, so that nothing it leaves there runs later, outside, as the user
(DESIGN.md, contract 6; issue 21, item 1: a planted ``core.fsmonitor`` ran at the user's next
``git status``).

In every writable path of the run (the working directory first, then ``--bind`` and the
policy's ``[sandbox] bind``), a bounded walk (:data:`SCAN_LIMIT` entries) finds the paths of
:data:`GIT_PARTS`, :data:`EDITOR_NAMES` and, in the agent's home, :data:`HOME_NAMES`. Those
that exist are shown read-only (nsjail ``-R`` over the writable bind, or the launcher's
read-only binds under ``--jail none``); a mount point cannot be renamed or removed either
(EBUSY), nor hard-linked elsewhere (EXDEV). Every one of those paths, present or not, is
also *watched*: its identity (device, inode) is taken at the start, and after the run (the
cgroup is empty by then) a path of the class that is new or another than at the start (made
in a folder the agent renamed away, or absent at the start: ``.envrc``, ``.vscode/``, the
``.git`` of a repository the agent made) is moved aside to ``NAME.gatewrap-RUN`` (never
deleted), with an audit record and a line of the summary (:func:`sweep`).

What each entry is for (the source of each):

- ``.git/config``, ``.git/config.worktree``: git-config(1) — ``core.fsmonitor``,
  ``core.hooksPath``, ``core.pager``, ``core.editor``, ``core.sshCommand``, ``diff.external``,
  ``filter.<driver>.clean/smudge/process``, ``credential.helper``, ``alias.*`` (``!cmd``),
  ``gpg.program``, ``sequence.editor`` are commands git runs; ``include.path`` reads more.
- ``.git/hooks/``: githooks(5) — run by commit, checkout, merge, push, rebase...
- ``.git/info/``: gitattributes(5) — ``info/attributes`` picks the filter/diff drivers git runs.
- what those configs name: the files they include (``include.path``, ``includeIf.*.path``)
  and the hook folder of ``core.hooksPath`` (husky's ``.husky/``), when in a writable path.
- ``.git/commondir``: gitrepository-layout(5) — moves most of the repository, its config and
  hooks included, to another folder.
- ``.git/modules/<name>/``: gitrepository-layout(5) — the submodules' repositories, each
  protected as a repository; ``.git/worktrees/<name>/{config.worktree,commondir}``: git-worktree(1).
- a ``.git`` *file* (``gitdir: PATH``, gitrepository-layout(5)) or link: protected itself,
  and the repository it names when that lies in a writable path.
- ``.envrc``: direnv(1) — sourced by bash on entering the folder (once ``direnv allow``-ed).
- ``.vscode/``: VS Code — ``tasks.json`` tasks with ``runOn: folderOpen``, ``settings.json``
  (``git.path``, terminal profiles), ``launch.json``.
- ``.idea/``: JetBrains IDEs — run configurations and startup tasks (``workspace.xml``, ``runConfigurations/``).
- ``.devcontainer/``: the Dev Container spec — ``initializeCommand`` runs on the host.
- in the agent's home: the shells' start-up files (bash(1) INVOCATION, zsh(1) STARTUP/SHUTDOWN
  FILES), ``~/.gitconfig`` and ``~/.config/git`` (git-config(1) FILES), ``~/.ssh``
  (ssh_config(5) ``ProxyCommand``, sshd(8) ``authorized_keys``).

Left out on purpose: ``.gitmodules`` and ``.gitattributes`` (they name a driver or a URL; the
command lives in the config: since git 2.20 ``submodule.<name>.update = !cmd`` is ignored
from ``.gitmodules``, CVE-2019-19604), and a project's own build files (Makefile,
``package.json``, ``.npmrc``, ``.pre-commit-config.yaml``): they run when the user runs the
project's tooling, whose source the agent may change anyway.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections import deque
from dataclasses import dataclass, field

from ..errors import GatewrapError

#: What git runs from a repository's folder (``.git``, or what a ``.git`` file names).
GIT_PARTS = ("config", "config.worktree", "commondir", "hooks", "info")
#: What git runs from a linked worktree's folder in the repository (``worktrees/<name>/``).
WORKTREE_PARTS = ("config.worktree", "commondir")
#: Names protected in any folder of a writable path (editors and direnv).
EDITOR_NAMES = (".envrc", ".vscode", ".idea", ".devcontainer")
#: Names protected in the agent's home when a writable path is that home.
HOME_NAMES = (".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshenv", ".zprofile",
              ".zshrc", ".zlogin", ".zlogout", ".gitconfig", ".config/git", ".ssh")
#: At most this many folder entries are looked at below the writable paths, in all (top-down,
#: breadth first; ~10 ms for 20,000 entries here). Deeper nested repositories are not found.
SCAN_LIMIT = 20_000
#: At most this many submodule repositories are looked for below one ``.git/modules``.
MODULES_LIMIT = 256
#: At most this many files included from one repository's config are looked for, nested ones
#: too (git's own bound is 10 levels, config.c ``MAX_INCLUDE_DEPTH``).
INCLUDES_LIMIT = 16
#: A config of at most this many bytes is first looked at by gatewrap itself: one that names
#: no include and no ``core.hooksPath`` is not handed to git (:func:`_named_by_config`).
MAX_CONFIG = 1 << 20
#: Suffix of a path the sweep moved aside: ``NAME.gatewrap-RUN``.
ASIDE = ".gatewrap-"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclass
class Protected:
    """What :func:`scan` found below the writable paths.

    ``readonly``: existing paths (host paths, no link on the way: the walk follows none) to
    show read-only, folders and regular files only, sorted. ``watched``: every
    protected-class path, existing or not, with its (st_dev, st_ino) or None when absent.
    ``outside``: (path, why) of what git in a writable path would read from outside the
    writable paths (a ``.git`` link or ``gitdir:`` file naming another folder): not protected
    here (in the jail it is not shown, or read-only). ``unprotected``: the protected-class
    paths dropped by ``unprotect``. ``truncated``: the walk stopped at its bound."""

    readonly: list[str] = field(default_factory=list)
    watched: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    outside: list[tuple[str, str]] = field(default_factory=list)
    unprotected: list[str] = field(default_factory=list)
    truncated: bool = False


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _gitdir_named(pointer: str) -> str | None:
    """The folder a ``.git`` file (``gitdir: PATH``, relative to the file's folder) or a
    ``.git`` link names, resolved (realpath); None if it names none."""
    if os.path.islink(pointer):
        return os.path.realpath(pointer)
    first = _first_line(pointer)
    if not first.startswith(b"gitdir:"):
        return None
    target = os.fsdecode(first[len(b"gitdir:"):].strip())
    return os.path.realpath(os.path.join(os.path.dirname(pointer), target)) if target else None


def _looks_like_gitdir(folder: str) -> bool:
    """Whether git's discovery would take ``folder`` itself for a repository (setup.c
    ``is_git_directory``: a ``HEAD``, and ``objects/`` and ``refs/`` or a ``commondir``): it
    does so, as a bare repository honouring its ``config``'s ``core.worktree``, when the
    folder's ``.git`` is absent or not a repository (its ``refs`` renamed, say)."""
    j = os.path.join
    return os.path.lexists(j(folder, "HEAD")) and (
        (os.path.isdir(j(folder, "objects")) and os.path.isdir(j(folder, "refs")))
        or os.path.lexists(j(folder, "commondir")))


def _named_by_config(config: str) -> tuple[list[str], list[str]]:
    """What git config file ``config`` names that git reads or runs: (the files it includes:
    ``include.path`` and ``includeIf.<condition>.path`` whatever the condition, git-config(1)
    INCLUDES, relative to the including file's folder; the hook folders ``core.hooksPath``
    names, as written: a relative one is relative to the working tree, githooks(5)). A ``~/``
    path (the home of the user who runs git, unknown here) is left out. Read by git itself
    (``git config --file --no-includes``: it runs nothing), with no other config; nothing
    without git, for anything but a regular file, or when git fails or takes more than 5 s."""
    git = shutil.which("git", path=os.defpath)
    try:
        if git is None or not stat.S_ISREG(os.stat(config).st_mode):
            return [], []
        with open(config, "rb") as f:
            text = f.read(MAX_CONFIG + 1).lower()
        # A section or key name is never escaped nor split across lines (git-config(1) SYNTAX):
        # a config naming neither costs no git process (~1.3 ms each, a repository each).
        if len(text) <= MAX_CONFIG and b"include" not in text and b"hookspath" not in text:
            return [], []
        p = subprocess.run([git, "config", "--file", config, "--no-includes", "-z", "--get-regexp",
                            r"^(include(if\..*)?\.path|core\.hookspath)$"], capture_output=True, timeout=5, cwd="/",
                           env={"PATH": os.defpath, "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
                                "GIT_CONFIG_GLOBAL": "/dev/null"})
    except (OSError, subprocess.TimeoutExpired):
        return [], []
    includes, hooks = [], []
    for entry in p.stdout.split(b"\0"):
        key, _, value = entry.partition(b"\n")
        named = os.fsdecode(value).removeprefix(":(optional)")
        if not named or named.startswith("~"):
            continue
        if key == b"core.hookspath":
            hooks.append(named)
        else:
            includes.append(os.path.normpath(os.path.join(os.path.dirname(config), named)))
    return includes, hooks


def _first_line(path: str) -> bytes:
    """The first line of regular file ``path`` (at most 4096 bytes); b"" for anything else: a
    FIFO planted at ``.git`` or ``commondir`` must not block the walk (opened ``O_NONBLOCK``,
    checked with fstat(2) before any read; a link is not followed; a device is never opened)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return b""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, 4096).split(b"\n", 1)[0]
    except OSError:
        return b""
    finally:
        os.close(fd)


class _Walk:
    """One :func:`scan`: the state of the walk and what it found."""

    def __init__(self, roots: list[str], unprotect: list[str], strict: bool = True, limit: int = SCAN_LIMIT):
        self.roots = roots
        #: Entries left to look at (the main walk's and the submodules' and worktrees' lists
        #: share it: a tree of nested repositories made to be slow is bounded as a whole).
        self.budget = limit
        self.strict = strict
        self.unprotect = unprotect
        self.out = Protected()
        self.gitdirs: set[str] = set()

    def writable(self, path: str) -> bool:
        return any(_inside(path, r) for r in self.roots)

    def add(self, path: str, follow: bool = True) -> None:
        """A protected-class path: watched, and shown read-only if it exists (a link: what it
        names, when that lies in a writable path and ``follow``; a link cannot be mounted
        over, but replacing it makes another inode, which the sweep sees)."""
        if path in self.out.watched or path in self.out.unprotected:
            return
        if any(_inside(path, u) for u in self.unprotect):
            self.out.unprotected.append(path)
            return
        self.out.watched[path] = _identity(path)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return
        if stat.S_ISLNK(mode):
            if not follow:
                return
            real = os.path.realpath(path)
            if self.writable(real) and os.path.exists(real):
                self.add(real)
            elif os.path.exists(real):
                self.out.outside.append((path, f"a link to {real}, outside the writable paths"))
            return
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            if not self.strict:
                return
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            raise GatewrapError(
                f"{path!r} is {kind}, where tools read code (gatewrap protects it): a read-only mount "
                "does not stop writes into it; remove it, or --unprotect it")
        self.out.readonly.append(path)

    def spend(self, n: int = 1) -> bool:
        """Take ``n`` entries from the budget; False (and ``truncated``) once it is spent."""
        self.budget -= n
        if self.budget < 0:
            self.out.truncated = True
            return False
        return True

    def gitdir(self, folder: str, depth: int = 0) -> None:
        """The parts of repository folder ``folder`` (real path) git runs, its submodules' and
        its worktrees' too; the common folder a ``commondir`` names, once."""
        if folder in self.gitdirs or depth > 8 or not self.spend(len(GIT_PARTS)):
            return
        self.gitdirs.add(folder)
        for part in GIT_PARTS:
            self.add(os.path.join(folder, part))
        self.includes([os.path.join(folder, "config"), os.path.join(folder, "config.worktree")],
                      os.path.dirname(folder) if os.path.basename(folder) == ".git" else None)
        common = os.path.join(folder, "commondir")
        named = os.fsdecode(_first_line(common).strip())
        if named:
            self.pointed(common, os.path.realpath(os.path.join(folder, named)), depth)
        worktrees = os.path.join(folder, "worktrees")
        for entry in _subfolders(worktrees):
            if not self.spend():
                return
            for part in WORKTREE_PARTS:
                self.add(os.path.join(worktrees, entry, part))
        modules = os.path.join(folder, "modules")
        found = 0
        pending = deque([modules])
        while pending and found < MODULES_LIMIT:
            here = pending.popleft()
            for name in _subfolders(here):
                sub = os.path.join(here, name)
                found += 1
                if not self.spend():
                    return
                if os.path.isfile(os.path.join(sub, "HEAD")):
                    self.gitdir(sub, depth + 1)
                else:  # a submodule named a/b: modules/a/b
                    pending.append(sub)

    def includes(self, configs: list[str], worktree: str | None) -> None:
        """What ``configs`` name (:func:`_named_by_config`) in a writable path, protected as
        the config itself: the files they include, nested ones too (at most
        :data:`INCLUDES_LIMIT`; a ``git config include.path ../.gitconfig`` that shares a
        project's settings would otherwise hand the agent the repository's config), and the
        hook folder ``core.hooksPath`` names (husky's ``.husky``), relative ones in
        ``worktree`` (None: not known, left out)."""
        pending, seen = deque(configs), set(configs)
        while pending and len(seen) <= INCLUDES_LIMIT + len(configs):
            included, hooks = _named_by_config(pending.popleft())
            for named in hooks:
                path = os.path.normpath(named if os.path.isabs(named) else os.path.join(worktree or "", named))
                if (os.path.isabs(named) or worktree) and self.spend() and self.writable(os.path.realpath(path)):
                    self.add(path)
            for path in included:
                if path in seen or not self.spend():
                    continue
                seen.add(path)
                if self.writable(os.path.realpath(path)):
                    self.add(path)
                    pending.append(path)

    def pointed(self, pointer: str, target: str | None, depth: int = 0) -> None:
        """A ``.git`` file or link, or a ``commondir``, naming repository folder ``target``."""
        if target is None:
            return
        if self.writable(target):
            self.gitdir(target, depth + 1)
        elif os.path.isdir(target):
            self.out.outside.append((pointer, f"names {target}, outside the writable paths"))

    def walk(self, home: str) -> None:
        for root in self.roots:
            if home and _inside(home, root):
                for name in HOME_NAMES:
                    self.add(os.path.join(home, name))
            if os.path.basename(root) == ".git":
                self.gitdir(root)
                continue
            pending = deque([root])
            while pending:
                here = pending.popleft()
                if _looks_like_gitdir(here):  # a bare-looking folder is a repository to git
                    self.gitdir(here)
                try:
                    entries = list(os.scandir(here))
                except OSError:
                    continue
                for entry in entries:
                    if not self.spend():
                        return
                    try:
                        folder = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        continue
                    if entry.name == ".git":
                        if folder:
                            self.gitdir(entry.path)
                        else:  # a gitdir: file or a link: watched itself, and what it names
                            self.add(entry.path, follow=False)
                            self.pointed(entry.path, _gitdir_named(entry.path))
                    elif entry.name in EDITOR_NAMES:
                        self.add(entry.path)
                    elif folder:
                        pending.append(entry.path)


def writable_roots(cwd: str, rw_binds: list[str]) -> list[str]:
    """The writable paths whose protected paths stay read-only: the working directory, unless
    it is one the jail makes its own (``view.PRIVATE``: ``/tmp``, ``/``...; under ``--jail
    none`` the host's, shared with every other process there, whose files the after-run
    sweep must not move), and every ``--bind`` / ``[sandbox] bind`` folder (absolute)."""
    from .view import PRIVATE

    cwd = os.path.abspath(cwd)
    return [*([cwd] if cwd not in PRIVATE else []), *(os.path.abspath(p) for p in rw_binds if os.path.isdir(p))]


def _subfolders(folder: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def scan(roots: list[str], unprotect: list[str] = (), home: str = "", limit: int = SCAN_LIMIT,
         strict: bool = True, own: list[str] = ()) -> Protected:
    """The protected paths below the writable paths ``roots`` (each made real: links followed,
    as the mount of it follows them). ``unprotect``: paths (absolute, or relative to each root)
    whose protected-class paths, at or below them, are left writable. ``home``: the agent's
    home (its :data:`HOME_NAMES` are protected when it is one of the roots). ``limit``: the
    walk's bound (:data:`SCAN_LIMIT`). ``strict`` False: any other kind of file is only watched.
    ``own``: files gatewrap itself reads at every run (the policy file, ``--env-file``s),
    protected when they lie in a writable path: rewritten, they would widen the next run.

    Raises:
        GatewrapError: (``strict``) a protected path is neither a folder, a regular file nor a link (a FIFO,
            a socket or a device: writes into it pass a read-only mount).
    """
    real = sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)}, key=len)
    outer = [r for i, r in enumerate(real) if not any(_inside(r, q) for q in real[:i])]
    unprotect_abs: list[str] = []
    for u in unprotect:
        if os.path.isabs(u):
            unprotect_abs += [os.path.normpath(u), os.path.realpath(u)]
        else:
            unprotect_abs += [os.path.join(r, os.path.normpath(u)) for r in real]
    w = _Walk(outer, sorted(set(unprotect_abs)), strict, limit)
    for path in own:
        if w.writable(os.path.realpath(path)):
            w.add(os.path.abspath(path))
    w.walk(os.path.realpath(home) if home else "")
    w.out.readonly = sorted(set(w.out.readonly), key=lambda p: (p.count("/"), p))
    return w.out


@dataclass(frozen=True)
class Moved:
    """A protected-class path the run made or replaced, moved aside by :func:`sweep`."""

    path: str
    moved_to: str
    #: "created" (absent at the start) or "replaced" (another file or folder than at the start).
    change: str


def sweep(start: Protected, roots: list[str], run_id: str, unprotect: list[str] = (), home: str = "",
          limit: int = SCAN_LIMIT) -> tuple[list[Moved], list[tuple[str, str]], bool]:
    """After the run (no process of it left): every protected-class path below ``roots`` that
    is new or another than at ``start`` (:func:`scan` of the run's start) is renamed to
    ``PATH.gatewrap-RUN`` (``-2``, ``-3``... if taken); never deleted. The walk is bounded as
    :func:`scan`'s; every path the start watched is looked at whatever the walk reaches (the
    agent can pad a folder to push a remade ``.git`` past the bound). Returns (moved, failed:
    (path, why), truncated: the walk stopped at its bound, so a path of the class made where
    it did not look was not seen). A folder whose class path was just moved is not looked
    into again."""
    end = scan(roots, unprotect, home, limit, strict=False)
    current = dict(end.watched)
    for path in start.watched:
        if path not in current:
            current[path] = _identity(path)
    moved: list[Moved] = []
    failed: list[tuple[str, str]] = []
    for path in sorted(current, key=lambda p: (p.count("/"), p)):
        now = current[path]
        if now is None or start.watched.get(path) == now or any(_inside(path, m.path) for m in moved):
            continue
        if now is not None and path not in start.watched and _identity_known(start, now):
            continue  # the same file found under another name (a root bound twice)
        if os.path.realpath(os.path.dirname(path)) != os.path.dirname(path):
            # A folder on its way was replaced by a link (a path the start watched, looked at
            # directly): what it names is not the run's to move, the host's own file maybe.
            failed.append((path, "a folder on its way is now a link, not followed"))
            continue
        aside = path + ASIDE + run_id
        n = 1
        while os.path.lexists(aside):
            n += 1
            aside = f"{path}{ASIDE}{run_id}-{n}"
        try:
            os.rename(path, aside)
        except OSError as e:
            failed.append((path, e.strerror or str(e)))
            continue
        moved.append(Moved(path, aside, "replaced" if start.watched.get(path) else "created"))
    return moved, failed, end.truncated


def _identity_known(start: Protected, ident: tuple[int, int]) -> bool:
    return ident in set(v for v in start.watched.values() if v is not None)
