"""Escape suite, what the agent leaves behind: nothing it plants in its writable working
directory runs later, outside, as the user (DESIGN.md, contract 6; issue 21, item 1).

The working directory is a git repository the agent's user owns, with a nested repository
and a ``.vscode/`` folder. The agent commits (which must work), then plants each kind of
command git, direnv or an editor would run; the plant is refused in place (read-only mount:
EBUSY for git's rename of ``config.lock``, EROFS for a write) or, where it makes a path that
was absent (``.envrc``, a new nested repository behind a renamed folder), moved aside after
the run with a ``protected_path`` record. Then, outside, as the same user, git runs what the
user's next commands would run; a planted command would touch a marker file in a folder the
agent cannot see. Both jail modes (the jail's ``-R`` binds, and the launcher's read-only
binds under ``--jail none``); with ``GATEWRAP_SHARED=1`` the daemon makes the same plan.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import AGENT_UID, gatewrap_cmd

pytestmark = pytest.mark.kernel

GIT_ID = ["-c", "user.name=agent", "-c", "user.email=agent@example.test"]

#: (vector, the agent's shell command; {M} is the marker folder: a planted command that runs
#: touches {M}/<marker>, the vector's marker, named in its command).
PLANTS = [
    ("git config core.fsmonitor (run by the next git status)", 'git config core.fsmonitor "touch {M}/fsmonitor"'),
    ("git config core.hooksPath to a folder the agent writes",
     'mkdir -p hk && printf "#!/bin/sh\\ntouch {M}/hookspath\\n" > hk/post-commit && chmod +x hk/post-commit '
     '&& git config core.hooksPath hk'),
    ("a hook file in .git/hooks", 'printf "#!/bin/sh\\ntouch {M}/hook\\n" > .git/hooks/post-commit'),
    ("git config core.pager", 'git config core.pager "touch {M}/pager; cat"'),
    ("git config alias.st = !command", 'git config alias.st "!touch {M}/alias"'),
    ("a clean filter in .git/config, selected by .git/info/attributes",
     'git config filter.x.clean "touch {M}/filter; cat" && echo "* filter=x" > .git/info/attributes'),
    ("a new .envrc (direnv)", 'printf "touch {M}/envrc\\n" > .envrc'),
    (".vscode/tasks.json (runOn folderOpen)",
     'printf \'{{"tasks":[{{"command":"touch {M}/vscode","runOptions":{{"runOn":"folderOpen"}}}}]}}\' '
     '> .vscode/tasks.json'),
    ("a nested repository's folder renamed away and made again with a planted fsmonitor",
     'mv sub sub-old && mkdir sub && cd sub && git init -q && git config core.fsmonitor "touch {M}/nested"'),
]


def _as_agent(cmd: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    """``cmd`` run outside, as the agent's user would run it after the run (its own git)."""
    # PAGER=cat: the user's pager is no part of the test (Debian's fallback, more(1), waits for
    # a key on the terminal where less -FRX would exit); a planted core.pager still wins over
    # it (git-config(1), core.pager).
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C.UTF-8",
           "TERM": "dumb", "PAGER": "cat"}
    return subprocess.run(cmd, cwd=cwd, env=env, user=AGENT_UID, group=AGENT_UID, extra_groups=[],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module", params=["nsjail", "none"])
def planted(request):
    """One run per jail mode planting every kind; yields (mode, workdir, markers, home,
    {vector: shell exit code inside}, the run's stderr, its audit records)."""
    mode = request.param
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-"))
    top.chmod(0o755)
    work, markers, home = top / "work", top / "markers", top / "home"
    for d in (work, markers, home):
        d.mkdir()
    markers.chmod(0o777)
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "init", "-q", str(work / "sub")], check=True)
    (work / ".vscode").mkdir()
    (work / ".vscode/settings.json").write_text("{}\n")
    subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
    script = ["set +e", "echo one > one.txt",
              f"git {' '.join(GIT_ID)} add one.txt && git {' '.join(GIT_ID)} commit -qm one; echo \"COMMIT $?\""]
    for i, (_, plant) in enumerate(PLANTS):
        script.append(f"( {plant.format(M=markers)} ) >/dev/null 2>&1; echo \"PLANT {i} $?\"")
    script.append(f"git {' '.join(GIT_ID)} commit -qam two --allow-empty; echo \"COMMIT $?\"")
    audit = top / "audit.jsonl"
    # The audit log's folder must be root's; the repository is the agent's.
    logdir = Path(tempfile.mkdtemp(prefix="gwt-protect-log-"))
    audit = logdir / "audit.jsonl"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(work), "--jail", mode,
                       "--", "/bin/sh", "-c", "\n".join(script))
    env = {**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    inside = {}
    commits = []
    for line in p.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["PLANT"]:
            inside[PLANTS[int(parts[1])][0]] = int(parts[2])
        elif parts[:1] == ["COMMIT"]:
            commits.append(int(parts[1]))
    records = [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []
    yield mode, work, markers, home, inside, commits, p, records
    shutil.rmtree(top, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)


@pytest.fixture(scope="module")
def outside(planted):
    """The markers the user's next commands outside made (:func:`_outside_runs_nothing`), once per run."""
    mode, work, markers, home, *_ = planted
    return _outside_runs_nothing(work, markers, home)


def _outside_runs_nothing(work: Path, markers: Path, home: Path) -> list[str]:
    """What the user would run next, outside: git status (fsmonitor), a commit (hooks,
    hooksPath), git add of a changed file (filters), git st (an alias), git log through a
    pager on a terminal, git status in the nested repository. Returns the markers made."""
    (work / "one.txt").chmod(0o666)
    (work / "one.txt").write_text("changed\n")
    for cmd, cwd in ((["git", "status"], work), (["git", "add", "one.txt"], work),
                     (["git", *GIT_ID, "commit", "-qm", "outside"], work), (["git", "st"], work),
                     (["script", "-qc", "git log -1", "/dev/null"], work), (["git", "status"], work / "sub")):
        _as_agent(cmd, cwd, home)
    return sorted(os.listdir(markers))


@pytest.mark.parametrize("vector", [v for v, _ in PLANTS])
def test_a_planted_command_never_runs_outside(planted, outside, vector, outcome):
    mode, work, markers, home, inside, commits, p, records = planted
    assert p.returncode == 0, p.stderr
    assert commits and all(c == 0 for c in commits), f"a commit inside must work: {commits}; {p.stderr}"
    assert vector in inside, p.stdout
    marker = re.search(r"\{M\}/(\w+)", dict(PLANTS)[vector]).group(1)
    assert marker not in outside, f"the planted command ran outside: {marker} (mode {mode}; all: {outside})"
    assert outside == [], f"planted commands ran outside: {outside} (mode {mode})"
    moved = {r["path"]: r for r in records if r.get("event") == "protected_path"}
    if vector.startswith("a new .envrc"):
        assert inside[vector] == 0, "a new path cannot be refused in place"
        assert not (work / ".envrc").exists() and str(work / ".envrc") in moved
        assert moved[str(work / ".envrc")]["change"] == "created"
        assert "moved aside" in p.stderr and ".envrc" in p.stderr
        outcome("after-run sweep", "made during the run; moved aside after it (protected_path record)")
    elif vector.startswith("a nested repository"):
        assert inside[vector] == 0
        assert str(work / "sub/.git/config") in moved and moved[str(work / "sub/.git/config")]["change"] == "replaced"
        outcome("after-run sweep", "new repository's config moved aside after the run")
    else:
        assert inside[vector] != 0, f"{vector}: the plant succeeded inside ({mode})"
        outcome("read-only protected path", "EBUSY/EROFS inside; nothing ran outside")


def test_the_user_is_told_nothing_when_nothing_was_planted(tmp_path):
    """A run that only commits moves nothing and says nothing of protected paths."""
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-clean-"))
    top.chmod(0o755)
    try:
        subprocess.run(["git", "init", "-q", str(top / "w")], check=True)
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        audit = tmp_path / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(top / "w"), "--", "/bin/sh", "-c",
                           f"echo a > a && git {' '.join(GIT_ID)} add a && git {' '.join(GIT_ID)} commit -qm a")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        assert p.returncode == 0, p.stderr
        assert "protected" not in p.stderr
        assert not [r for r in map(json.loads, audit.read_text().splitlines()) if r.get("event") == "protected_path"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_unprotect_leaves_a_path_writable_and_says_so(tmp_path):
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-un-"))
    top.chmod(0o755)
    try:
        subprocess.run(["git", "init", "-q", str(top / "w")], check=True)
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        audit = tmp_path / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(top / "w"),
                           "--unprotect", str(top / "w/.git/config"), "--", "/bin/sh", "-c",
                           "git config gw.test yes && git config gw.test")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        assert p.returncode == 0 and p.stdout.strip() == "yes", p.stderr
        assert "left writable (--unprotect" in p.stderr and ".git/config" in p.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("case, make, message", [
    ("a FIFO at .envrc (writes into it pass a read-only mount)",
     lambda w: os.mkfifo(w / ".envrc"), "is a FIFO, where tools read code"),
    ("a nested repository whose path nsjail cannot name (a ':')",
     lambda w: subprocess.run(["git", "init", "-q", str(w / "a:b")], check=True), "cannot protect"),
])
def test_a_protected_path_that_cannot_be_protected_stops_the_run_before_the_agent(tmp_path, case, make, message):
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-bad-"))
    top.chmod(0o755)
    try:
        subprocess.run(["git", "init", "-q", str(top / "w")], check=True)
        make(top / "w")
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        audit = tmp_path / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(top / "w"), "--", "/bin/sh", "-c",
                           f"touch {top}/ran")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        assert p.returncode == 125, (case, p.stderr)
        assert message in p.stderr and "--unprotect" in p.stderr, p.stderr
        assert not (top / "ran").exists(), "the agent must not start"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_git_file_naming_etc_and_a_config_link_leading_out_mount_nothing_over_them(tmp_path):
    """Hostile pointers: ``.git`` a file saying ``gitdir: /etc``, a nested ``.git/config`` a link to
    a file outside the working directory. The run starts; nothing outside is bound over; the
    link's target on the host stays as it was (in the jail the link leads into the jail's own
    /tmp, where the write lands and is gone with the run)."""
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-ptr-"))
    top.chmod(0o755)
    try:
        (top / "w").mkdir()
        (top / "w/.git").write_text("gitdir: /etc\n")
        subprocess.run(["git", "init", "-q", str(top / "w/n")], check=True)
        (top / "outside.cfg").write_text("[core]\n")
        os.remove(top / "w/n/.git/config")
        os.symlink(str(top / "outside.cfg"), top / "w/n/.git/config")
        subprocess.run(["chown", "-R", "-h", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        audit = tmp_path / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(top / "w"), "--", "/bin/sh", "-c",
                           "echo x > n/.git/config; echo \"LINK $?\"; grep -c . /proc/self/mountinfo")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        assert p.returncode == 0, p.stderr
        assert "LINK" in p.stdout, p.stdout
        assert (top / "outside.cfg").read_text() == "[core]\n"
        assert (top / "w/.git").read_text() == "gitdir: /etc\n"
    finally:
        shutil.rmtree(top, ignore_errors=True)


#: (vector, the agent's shell command, the folder (relative to the workdir) where the user next
#: runs ``git status`` and a commit outside; {M} is the marker folder; optional: the user's set-up before the
#: run, a shell command in the workdir). Each plant dodges the protected paths rather than
#: writing them: git finds another repository, or another config, than the protected one.
DODGES = [
    ("the workdir's .git made invalid (refs renamed) and the workdir itself made a bare-looking "
     "repository with core.worktree and a planted fsmonitor",
     'mv .git/refs .git/refs-old && mkdir objects refs && echo "ref: refs/heads/master" > HEAD '
     '&& printf "[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n\\tfsmonitor = \\"touch {M}/bare; false\\"\\n" > config',
     "."),
    ("a nested repository renamed away and made again behind 20,001 files that use up the "
     "after-run walk's bound",
     'seq -f "pad%05g" 1 20001 | xargs touch && mv sub sub-old && mkdir sub && cd sub && git init -q '
     '&& git config core.fsmonitor "touch {M}/padded; false"',
     "sub"),
    ("the workdir's .git renamed away and made again, pushed past the after-run walk's bound "
     "in the folder's own order",
     'mv .git .git-old && git init -q && git config core.fsmonitor "touch {M}/rootpad; false" && n=0 '
     '&& while [ $n -lt 12 ]; do seq -f "p$n-%05g" 1 20000 | xargs touch; n=$((n+1)); '
     'ls -f | grep -nx .git | cut -d: -f1 | {{ read p; [ "$p" -gt 20010 ]; }} && break; done',
     "."),
    ("a project's .gitconfig that the repository's config includes (include.path ../.gitconfig)",
     'git config --file .gitconfig core.fsmonitor "touch {M}/include; false"; true', ".",
     'git config include.path ../.gitconfig && printf "[core]\\n\\tautocrlf = false\\n" > .gitconfig'),
    ("a file the repository's config includes under a condition, absent at the start",
     'git config --file .git-local core.fsmonitor "touch {M}/includeif; false"', ".",
     'git config "includeIf.onbranch:*.path" ../.git-local'),
    ("a hook in the folder core.hooksPath names in the workdir (husky's .husky)",
     'printf "#!/bin/sh\\ntouch {M}/husky\\n" > .husky/pre-commit; true', ".",
     'mkdir .husky && printf "#!/bin/sh\\n" > .husky/pre-commit && chmod +x .husky/pre-commit '
     '&& git config core.hooksPath .husky'),
]


@pytest.mark.parametrize("vector, plant, where, setup", [(*d, *d[3:], "")[:4] for d in DODGES],
                         ids=[d[0][:40] for d in DODGES])
def test_a_repository_git_finds_instead_of_the_protected_one_runs_nothing_outside(vector, plant, where, setup,
                                                                                  outcome):
    """The agent leaves the protected files alone and makes git find another repository: the
    workdir itself shaped as a bare repository (HEAD, objects/, refs/, config: git's
    discovery, setup.c, tries the folder itself when its ``.git`` is not a repository), or a
    remade ``.git`` the after-run walk never reaches (its bound spent on padding). The user's
    next ``git status`` outside runs nothing."""
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-dodge-"))
    top.chmod(0o755)
    try:
        work, markers, home = top / "work", top / "markers", top / "home"
        for d in (work, markers, home):
            d.mkdir()
        markers.chmod(0o777)
        subprocess.run(["git", "init", "-q", "-b", "master", str(work)], check=True)
        subprocess.run(["git", "init", "-q", str(work / "sub")], check=True)
        if setup:
            subprocess.run(["/bin/sh", "-c", setup], cwd=work, check=True)
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        logdir = Path(tempfile.mkdtemp(prefix="gwt-protect-log-"))
        audit = logdir / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(work), "--",
                           "/bin/sh", "-c", plant.format(M=markers))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        assert p.returncode == 0, (p.stdout, p.stderr)
        _as_agent(["git", "status"], work / where, home)
        _as_agent(["git", *GIT_ID, "commit", "-qm", "outside", "--allow-empty"], work / where, home)
        ran = sorted(os.listdir(markers))
        assert ran == [], f"the planted command ran outside: {ran}; {p.stderr}"
        records = [json.loads(x) for x in audit.read_text().splitlines()]
        assert [r for r in records if r.get("event") not in ("run_start", "run_end") and "protected" in json.dumps(r)], \
            "the plant must leave a record"
        outcome("read-only protected path, after-run sweep", "refused, or moved aside after the run")
        shutil.rmtree(logdir, ignore_errors=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("name, flag, widened", [
    ("the policy file (default allow, [sandbox] unprotect and env)", "--policy",
     'default = "allow"\n[sandbox]\nunprotect = [".git"]\nenv = ["GITHUB_TOKEN"]\n'),
    ("an --env-file (a bare name takes the caller's value)", "--env-file", "GITHUB_TOKEN\n"),
])
def test_a_file_gatewrap_reads_at_the_next_run_stays_as_the_user_wrote_it(tmp_path, name, flag, widened, outcome):
    """The policy file and env files kept in the working directory (a project's own
    ``gatewrap.toml``, ``.env``) are read by gatewrap at every run: an agent that rewrites them
    widens its next run (every host allowed, protection off, the caller's secrets passed)."""
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-own-"))
    top.chmod(0o755)
    try:
        work = top / "w"
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        own = work / ("policy.toml" if flag == "--policy" else ".env")
        first = 'default = "deny"\n' if flag == "--policy" else "LANG=C.UTF-8\n"
        own.write_text(first)
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        audit = tmp_path / "audit.jsonl"
        script = f"printf '%s' '{widened}' > {own.name}; cat {own.name} > /dev/null"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(work), flag, str(own), "--",
                           "/bin/sh", "-c", script)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        assert p.returncode in (0, 1, 2), p.stderr
        assert own.read_text() == first, f"the agent rewrote {own.name}: {own.read_text()!r}"
        outcome("read-only protected path", "the file gatewrap reads next is read-only inside")
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_policy_file_in_a_folder_the_agent_renames_is_not_reloaded_from_the_agents_copy(tmp_path, outcome):
    """The policy file in a subfolder of the working directory (``conf/policy.toml``) is
    read-only inside, but its folder is the agent's: renamed away and made again with a file
    of the agent's, the path names the agent's policy. A reload (``gatewrap reload``, SIGHUP:
    the human rotating a secret) must not put that file in force: it would allow every host
    (and a ``from_command`` of a secret the run injects would run as root on the host)."""
    top = Path(tempfile.mkdtemp(prefix="gwt-protect-reload-"))
    top.chmod(0o755)
    proc = None
    try:
        work = top / "w"
        (work / "conf").mkdir(parents=True)
        policy = work / "conf" / "policy.toml"
        policy.write_text('default = "deny"\n')
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(work)], check=True)
        policy.chmod(0o644)
        audit = tmp_path / "audit.jsonl"
        script = ("mv conf conf.old && mkdir conf && printf 'default = \"allow\"\\n' > conf/policy.toml; "
                  "echo \"SWAP $?\"; touch swapped; while [ ! -e go ]; do sleep 0.05; done")
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(work), "--policy", str(policy),
                           "--", "/bin/sh", "-c", script)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        end = time.monotonic() + 60
        while not (work / "swapped").exists():
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        run_id = next(r["run"] for r in map(json.loads, audit.read_text().splitlines()) if r["event"] == "run_start")
        r = subprocess.run(gatewrap_cmd("reload", run_id), capture_output=True, text=True, timeout=60)
        (work / "go").touch()
        out, err = proc.communicate(timeout=60)
        assert "SWAP 0" in out, out + err  # the folder move works inside: the vector is real
        records = [json.loads(x) for x in audit.read_text().splitlines()]
        reloads = [x for x in records if x.get("event") == "policy_reload"]
        assert [x["result"] for x in reloads] == ["failed"], (r.stdout, r.stderr, reloads)
        assert r.returncode == 1 and "replaced" in r.stderr, r.stdout + r.stderr
        outcome("reload", "refused: a folder on the policy file's path was replaced during the run")
    finally:
        if proc is not None and proc.poll() is None:
            (top / "w" / "go").touch()
            proc.communicate(timeout=60)
        shutil.rmtree(top, ignore_errors=True)
