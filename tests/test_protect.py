"""The protected paths of a run's writable paths (gatewrap.sandbox.protect): which are found,
which are refused, and what the after-run sweep moves aside. Real git makes the
repositories; the kernel tests (read-only in the jail, nothing planted runs outside) are
tests/escape/test_protected.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from gatewrap.errors import GatewrapError
from gatewrap.sandbox import protect, view
from gatewrap.sandbox.user import Target

ROOT_AGENT = Target(uid=0, gid=0, groups=(0,), name="root", home="/root")
GIT = ["git", "-c", "init.defaultBranch=main", "-c", "user.name=t", "-c", "user.email=t@t", "-c",
       "protocol.file.allow=always"]


def git(cwd, *args):
    subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True)


def rel(root, paths):
    return sorted(os.path.relpath(p, root) for p in paths)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    git(root, "init", "-q")
    (root / "a.txt").write_text("a")
    git(root, "add", "a.txt")
    git(root, "commit", "-qm", "one")
    return root


def test_a_repository_protects_its_config_hooks_and_info_but_not_objects_or_refs(repo):
    found = protect.scan([str(repo)])
    assert rel(repo, found.readonly) == [".git/config", ".git/hooks", ".git/info"]
    assert {".git/commondir", ".git/config.worktree"} <= set(rel(repo, [p for p, i in found.watched.items() if i is None]))
    assert not found.truncated and not found.outside


@pytest.mark.parametrize("case, make, want", [
    ("editor folders and .envrc, at any depth",
     lambda r: [os.makedirs(r / "x/.vscode"), (r / ".envrc").write_text("x"), os.makedirs(r / ".idea"),
                os.makedirs(r / "y/z/.devcontainer")],
     [".envrc", ".git/config", ".git/hooks", ".git/info", ".idea", "x/.vscode", "y/z/.devcontainer"]),
    ("a nested repository",
     lambda r: [os.makedirs(r / "vendor/lib"), git(r / "vendor/lib", "init", "-q")],
     [".git/config", ".git/hooks", ".git/info", "vendor/lib/.git/config", "vendor/lib/.git/hooks",
      "vendor/lib/.git/info"]),
])
def test_the_scan_finds_each_kind(repo, case, make, want):
    make(repo)
    assert rel(repo, protect.scan([str(repo)]).readonly) == want, case


def test_a_submodule_and_a_worktree_are_protected_as_repositories(tmp_path, repo):
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q")
    (lib / "l").write_text("l")
    git(lib, "add", "l")
    git(lib, "commit", "-qm", "l")
    git(repo, "submodule", "add", "-q", str(lib), "sub")
    git(repo, "worktree", "add", "-q", "wt")
    found = protect.scan([str(repo)])
    got = rel(repo, found.readonly)
    for want in (".git/modules/sub/config", ".git/modules/sub/hooks", "sub/.git", "wt/.git",
                 ".git/worktrees/wt/commondir"):
        assert want in got, (want, got)


def test_a_linked_worktree_as_workdir_protects_the_repository_it_names_when_bound(tmp_path, repo):
    git(repo, "worktree", "add", "-q", str(tmp_path / "wt"))
    alone = protect.scan([str(tmp_path / "wt")])
    assert rel(tmp_path, alone.readonly) == ["wt/.git"]
    assert alone.outside and "outside the writable paths" in alone.outside[0][1]
    both = protect.scan([str(tmp_path / "wt"), str(repo)])
    assert {"work/.git/config", "work/.git/hooks", "work/.git/worktrees/wt/commondir", "wt/.git"} <= set(
        rel(tmp_path, both.readonly))


@pytest.mark.parametrize("case, link", [
    ("a .git link to a repository outside", "../outside/.git"),
    ("a .git file naming /etc", None),
])
def test_a_git_pointer_leading_outside_is_watched_never_mounted_over(tmp_path, case, link):
    (tmp_path / "outside").mkdir()
    git(tmp_path / "outside", "init", "-q")
    work = tmp_path / "work"
    work.mkdir()
    if link:
        os.symlink(link, work / ".git")
    else:
        (work / ".git").write_text("gitdir: /etc\n")
    found = protect.scan([str(work)])
    assert all(p.startswith(str(work)) for p in found.readonly), case
    assert str(work / ".git") in found.watched
    assert found.outside, case


def test_a_link_at_git_config_mounts_its_target_only_inside_the_writable_paths(tmp_path, repo):
    os.replace(repo / ".git/config", repo / "real-config")
    os.symlink("../real-config", repo / ".git/config")
    assert str(repo / "real-config") in protect.scan([str(repo)]).readonly
    os.remove(repo / ".git/config")
    (tmp_path / "elsewhere").write_text("[core]\n")
    os.symlink(str(tmp_path / "elsewhere"), repo / ".git/config")
    found = protect.scan([str(repo)])
    assert str(tmp_path / "elsewhere") not in found.readonly and str(repo / ".git/config") not in found.readonly
    assert found.outside[0][0] == str(repo / ".git/config")


def test_a_fifo_at_a_protected_name_refuses_the_run(repo):
    os.mkfifo(repo / ".envrc")
    with pytest.raises(GatewrapError, match=r"'.*\.envrc' is a FIFO.*--unprotect"):
        protect.scan([str(repo)])
    assert protect.scan([str(repo)], unprotect=[".envrc"]).unprotected == [str(repo / ".envrc")]


def test_a_name_with_a_newline_is_protected_and_a_colon_is_refused_for_the_jail(repo):
    odd = repo / "a\nb"
    odd.mkdir()
    git(odd, "init", "-q")
    found = protect.scan([str(repo)])
    assert str(odd / ".git/config") in found.readonly
    assert [m.dst for m in view.protected_mounts(found.readonly)] == found.readonly
    colon = repo / "c:d"
    colon.mkdir()
    git(colon, "init", "-q")
    with pytest.raises(GatewrapError, match="cannot protect .*':'.*--unprotect"):
        view.protected_mounts(protect.scan([str(repo)]).readonly)


def test_unprotect_takes_absolute_and_relative_paths(repo):
    (repo / ".vscode").mkdir()
    found = protect.scan([str(repo)], unprotect=[".vscode", str(repo / ".git/hooks")])
    assert rel(repo, found.readonly) == [".git/config", ".git/info"]
    assert rel(repo, found.unprotected) == [".git/hooks", ".vscode"]
    everything = protect.scan([str(repo)], unprotect=[".git"])
    assert rel(repo, everything.readonly) == [".vscode"]


def test_a_huge_tree_is_walked_up_to_the_bound_and_says_so(tmp_path):
    root = tmp_path / "big"
    for i in range(30):
        (root / f"d{i:02}").mkdir(parents=True)
        for j in range(10):
            (root / f"d{i:02}" / f"f{j}").write_text("")
    git(root / "d00", "init", "-q")
    git(root / "d29", "init", "-q")
    found = protect.scan([str(root)], limit=200)
    assert found.truncated
    assert str(root / "d00/.git/config") in found.readonly          # breadth first: reached
    assert str(root / "d29/.git/config") not in found.readonly      # past the bound
    assert not protect.scan([str(root)]).truncated


def test_the_home_protects_the_shells_and_gits_start_up_files(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("")
    found = protect.scan([str(home)], home=str(home))
    assert rel(home, found.readonly) == [".bashrc", ".ssh"]
    assert str(home / ".profile") in found.watched


def test_the_sweep_moves_aside_what_the_run_made_or_replaced_and_nothing_else(tmp_path, repo):
    (repo / "sub").mkdir()
    git(repo / "sub", "init", "-q")
    start = protect.scan([str(repo)])
    # What an agent could do around read-only mounts: make absent ones, swap a folder holding one.
    (repo / ".envrc").write_text("curl evil")
    (repo / "x/.vscode").mkdir(parents=True)
    os.rename(repo / "sub", repo / "sub-old")
    (repo / "sub").mkdir()
    git(repo / "sub", "init", "-q")
    (repo / "notes.txt").write_text("work")
    moved, failed, _ = protect.sweep(start, [str(repo)], "gw-0123456789")
    assert not failed
    got = {os.path.relpath(m.path, repo): (os.path.relpath(m.moved_to, repo), m.change) for m in moved}
    assert got == {
        ".envrc": (".envrc.gatewrap-gw-0123456789", "created"),
        "x/.vscode": ("x/.vscode.gatewrap-gw-0123456789", "created"),
        "sub/.git/config": ("sub/.git/config.gatewrap-gw-0123456789", "replaced"),
        "sub/.git/hooks": ("sub/.git/hooks.gatewrap-gw-0123456789", "replaced"),
        "sub/.git/info": ("sub/.git/info.gatewrap-gw-0123456789", "replaced"),
    }
    assert (repo / ".envrc.gatewrap-gw-0123456789").read_text() == "curl evil", "moved, never deleted"
    assert (repo / "sub-old/.git/config").exists() and (repo / "notes.txt").exists()
    assert protect.sweep(protect.scan([str(repo)]), [str(repo)], "gw-0123456789") == ([], [], False)


def test_the_sweep_never_follows_a_folder_the_run_replaced_with_a_link_out_of_the_tree(repo, tmp_path):
    """A nested repository's folder swapped for a link to a host folder holding a file of the
    same name (``/etc/.git/config`` under etckeeper): the sweep, which looks at every path
    the start watched, must not rename the host's file through the link; it says so."""
    (repo / "sub").mkdir()
    git(repo / "sub", "init", "-q")
    host = tmp_path / "host"
    (host / ".git").mkdir(parents=True)
    (host / ".git/config").write_text("[core]\n")
    start = protect.scan([str(repo)])
    os.rename(repo / "sub", repo / "sub-old")
    os.symlink(host, repo / "sub")
    moved, failed, _ = protect.sweep(start, [str(repo)], "gw-0123456789")
    assert (host / ".git/config").read_text() == "[core]\n", "a host file was moved"
    assert not [m for m in moved if m.path.startswith(str(repo / "sub") + "/")]
    assert str(repo / "sub/.git/config") in dict(failed)
    assert "link" in dict(failed)[str(repo / "sub/.git/config")]


def test_the_view_shows_each_protected_path_read_only_after_its_writable_bind(repo):
    found = protect.scan([str(repo)])
    mounts = view.build(str(repo), "/nonexistent", ROOT_AGENT, [], [], mount_points=[],
                        protected=found.readonly)
    order = [(m.kind, m.dst) for m in mounts]
    assert order.index(("rw", str(repo))) < order.index(("ro", str(repo / ".git/config")))
    assert ("ro", str(repo / ".git/hooks")) in order and ("ro", str(repo / ".git/info")) in order


def test_the_summary_names_what_was_moved_aside_and_run_end_leaves_it_to_the_records():
    from gatewrap.run_types import RunResult, summary_line

    moved = [{"path": "/w/.envrc", "moved_to": "/w/.envrc.gatewrap-gw-0123456789", "change": "created"},
             {"path": "/w/a\nb/.git/config", "moved_to": "/w/a\nb/.git/config.gatewrap-gw-0123456789",
              "change": "replaced"}]
    line = summary_line(RunResult("gw-0123456789", 0, 0, 0, 0, 0, 0, "/var/log/gatewrap/audit.jsonl", protected=moved))
    assert "2 protected paths the agent made or replaced, moved aside" in line
    assert "'/w/.envrc' -> '.envrc.gatewrap-gw-0123456789'" in line
    assert "\n" not in line, "a name with a newline is escaped"
    assert RunResult("gw-0123456789", 0, 0, 0, 0, 0, 0, "x").as_record().get("protected") is None


def test_a_fifo_made_at_git_or_commondir_during_the_run_does_not_block_the_sweep(repo):
    start = protect.scan([str(repo)])
    (repo / "n").mkdir()
    os.mkfifo(repo / "n/.git")
    os.mkfifo(repo / ".git/commondir")
    moved, failed, _ = protect.sweep(start, [str(repo)], "gw-0123456789")
    assert not failed
    assert sorted(os.path.relpath(m.path, repo) for m in moved) == [".git/commondir", "n/.git"]


def test_repositories_nested_in_submodule_folders_share_the_walks_bound(tmp_path):
    """An agent's tree made to be slow (submodule folders of submodule folders) is bounded as a
    whole: 4 levels of 6 made-up submodules each would be 1,555 repositories."""
    root = tmp_path / "w"

    def make(folder, level):
        (folder / "HEAD").parent.mkdir(parents=True, exist_ok=True)
        (folder / "HEAD").write_text("ref: refs/heads/main\n")
        if level < 4:
            for i in range(6):
                make(folder / "modules" / f"m{i}", level + 1)

    make(root / ".git", 0)
    found = protect.scan([str(root)], limit=300)
    assert found.truncated and len(found.watched) < 300
