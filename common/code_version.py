"""What code a result comes from: a fingerprint of the project's Python sources.

evaluate.py records it in a run's config.json and compares it when the run resumes, so that one run's
answers do not silently come from two versions of the code (docs/method.md 7.3). The fingerprint is a
SHA-256 over the sorted relative paths and the contents of the Python files outside tests/, bench/,
runs/ and tools/ (edits not committed yet count), listed by `git ls-files` in a git checkout, else found
on disk in the same directories; the git commit is recorded beside it for information (a commit that
changes only documentation keeps the fingerprint).

    from common.code_version import code_version
    code_version()   # {"fingerprint": "<64 hex digits>", "commit": "<40 hex digits>" or None}
"""

import hashlib
import subprocess
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent  # common/ is one level down
NOT_ANSWERING = ("tests", "bench", "runs", "tools")  # they decide no answer


def git(root: Path, *args: str) -> str | None:
    """The output of a git command in `root`, or None without git or outside a checkout."""
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def python_sources(root: Path = REPO_DIR) -> list[str]:
    """The relative paths of the project's Python files outside NOT_ANSWERING and hidden directories
    (a virtualenv, say), sorted: git's tracked ones in a checkout, else those on disk."""
    listed = git(root, "ls-files", "-z", "*.py")
    paths = (
        listed.split("\0")
        if listed is not None
        else [p.relative_to(root).as_posix() for p in root.rglob("*.py")]
    )

    def answering(path: str) -> bool:
        parts = path.split("/")
        return (
            parts[0] not in NOT_ANSWERING
            and not any(part.startswith(".") for part in parts)
            and (root / path).is_file()
        )  # tracked but deleted: no code

    return sorted(path for path in paths if path and answering(path))


def code_version(root: Path = REPO_DIR) -> dict:
    """{"fingerprint": SHA-256 hex digest of python_sources' paths and contents, "commit": HEAD or None}."""
    digest = hashlib.sha256()
    for path in python_sources(root):
        data = (root / path).read_bytes()
        digest.update(
            f"{path}\0{len(data)}\0".encode()
        )  # the length keeps one file's end from another's start
        digest.update(data)
    commit = git(root, "rev-parse", "HEAD")
    return {"fingerprint": digest.hexdigest(), "commit": commit.strip() if commit else None}
