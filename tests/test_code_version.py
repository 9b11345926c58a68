"""Tests for common/code_version.py: which files the fingerprint reads, and what changes it."""

import subprocess

from common import code_version

FILES = {
    "evaluate.py": "print(1)\n",
    "grisp/pipeline.py": "x = 1\n",
    "tests/test_x.py": "",
    "bench/b.py": "",
    "runs/r.py": "",
    "tools/t.py": "",
    ".venv/lib/site.py": "",
    "README.md": "not code\n",
}


def make_tree(root):
    for path, text in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def git(root, *args):
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_the_fingerprint_reads_the_python_sources_that_decide_answers(tmp_path):
    root = make_tree(tmp_path)
    assert code_version.python_sources(root) == [
        "evaluate.py",
        "grisp/pipeline.py",
    ]  # no git here: found on disk
    before = code_version.code_version(root)
    assert before["commit"] is None and len(before["fingerprint"]) == 64
    for path in (
        "tests/test_x.py",
        "bench/b.py",
        "runs/r.py",
        "tools/t.py",
        ".venv/lib/site.py",
        "README.md",
    ):
        (root / path).write_text("changed\n")
    assert code_version.code_version(root) == before
    (root / "grisp/pipeline.py").write_text("x = 2\n")
    assert code_version.code_version(root)["fingerprint"] != before["fingerprint"]
    (root / "grisp/pipeline.py").write_text("x = 1\n")
    (root / "grisp/pipeline.py").rename(root / "grisp/resolve.py")  # the same text under another name
    assert code_version.code_version(root)["fingerprint"] != before["fingerprint"]


def test_in_a_checkout_git_lists_the_files_and_names_the_commit(tmp_path):
    root = make_tree(tmp_path)
    on_disk = code_version.code_version(root)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    (root / "scratch.py").write_text("untracked\n")  # not the project's: not read
    version = code_version.code_version(root)
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert version == {"fingerprint": on_disk["fingerprint"], "commit": head}  # the same files as on disk
    (root / "evaluate.py").write_text("print(2)\n")  # an edit not committed yet counts
    assert code_version.code_version(root)["fingerprint"] != on_disk["fingerprint"]


def test_the_projects_own_sources():
    sources = code_version.python_sources()
    assert {"evaluate.py", "common/code_version.py", "grisp/pipeline.py", "grasp/evaluation.py"} <= set(
        sources
    )
    assert not [path for path in sources if path.split("/")[0] in ("tests", "bench", "runs", "tools")]
