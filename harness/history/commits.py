"""Which commit a measurement belongs to, asked of git: HEAD, the commit that added a file, a file's versions.

Every call runs `git` with a timeout and answers None (or nothing) where git, the repository or the commit is
missing: a history is still made, with the commit unknown. What cannot change (a full hash resolved, a file's
text at a commit) is cached per process: a backfill asks it once per report; HEAD, the status and the logs are
asked again each time, as a repository can move under a long process.
"""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from harness.bench.artifacts import git_commit
from harness.history.record import FULL_HASH
from harness.paths import REPO_ROOT

__all__ = ["NOT_HEAD", "at_head_if_unknown", "git", "head_commit", "commit_that_added", "commit_of", "added_commits", "file_versions", "show_file",
           "GIT_TIMEOUT_S"]

GIT_TIMEOUT_S = 20


def git(repo: Path | str, *args: str) -> str | None:
    """git's stdout, or None where git is missing, failed or timed out."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=1024)
def _immutable(repo: str, args: tuple[str, ...]) -> str | None:
    """git's answer to a question about fixed objects (a full hash, a file at a full hash): the same every time."""
    return git(repo, *args)


def head_commit(repo: Path | str = REPO_ROOT) -> tuple[str | None, bool]:
    """(HEAD's full hash or None, whether the work tree has changes): what a bench run's manifest records."""
    found = git_commit(repo)
    return found["commit"], found["dirty"] and found["commit"] is not None


def commit_of(rev: str, repo: Path | str = REPO_ROOT) -> str | None:
    """`rev` (a hash, short or full, a branch, HEAD~2...) as a full hash, or None where git does not know it."""
    args = ("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    out = _immutable(str(repo), args) if FULL_HASH.match(rev) else git(repo, *args)
    sha = (out or "").strip()
    return sha if FULL_HASH.match(sha) else None


def commit_that_added(path: Path | str, repo: Path | str = REPO_ROOT) -> str | None:
    """The oldest commit that added `path` (repository-relative, or absolute inside `repo`), or None."""
    rel = _relative(path, repo)
    out = git(repo, "log", "--diff-filter=A", "--format=%H", "--", rel)
    lines = [line for line in (out or "").split() if FULL_HASH.match(line)]
    return lines[-1] if lines else None


def added_commits(under: str, repo: Path | str = REPO_ROOT) -> dict[str, str]:
    """Every file added under `under` (repository-relative) -> the oldest commit that added it, in one git call
    (a backfill asks this for every report)."""
    out = git(repo, "log", "--diff-filter=A", "--name-only", "--format=%x00%H", "--", under)
    added: dict[str, str] = {}
    for chunk in (out or "").split("\x00")[1:]:
        sha, *names = [line for line in chunk.splitlines() if line.strip()]
        for name in names:
            added[name] = sha  # newest first: the oldest commit is the last one written
    return added


def file_versions(path: str, repo: Path | str = REPO_ROOT) -> list[str]:
    """The commits that changed `path`, oldest first (its versions in the history)."""
    out = git(repo, "log", "--format=%H", "--", path)
    return [line for line in (out or "").split() if FULL_HASH.match(line)][::-1]


def show_file(sha: str, path: str, repo: Path | str = REPO_ROOT) -> str | None:
    """`path`'s text at commit `sha`, or None where it did not exist there."""
    return _immutable(str(repo), ("show", f"{sha}:{path}")) if FULL_HASH.match(sha) else git(repo, "show", f"{sha}:{path}")


def _relative(path: Path | str, repo: Path | str) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.resolve().relative_to(Path(repo).resolve()))
        except ValueError:
            return str(p)
    return str(p)


# A reader that knows a run's commit is not this checkout's (a reference server's arm) starts its commit_source so.
NOT_HEAD = "not this checkout's:"


def at_head_if_unknown(record, by: str):
    """`record` filed under HEAD where its run recorded no commit (tune's reports do not): such a run was made on
    this checkout, as a rule just before `by` files it; the record says so. Unchanged where the commit is known,
    where its reader knows it is another's (NOT_HEAD), or where git cannot tell HEAD."""
    import dataclasses

    if record.commit is not None or record.commit_source.startswith(NOT_HEAD):
        return record
    head, dirty = head_commit()
    if head is None:
        return record
    tree = "the work tree had uncommitted changes" if dirty else "a clean work tree"
    return dataclasses.replace(record, commit=head,
                               commit_source=f"HEAD of the checkout at {by} ({record.commit_source}; {tree})")
