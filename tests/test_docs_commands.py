"""Every `python SCRIPT.py --flag` (or `python -m pkg.module --flag`) in the code blocks of README.md and
docs/*.md names a flag that the script's --help lists, so the documented commands stay true."""

import functools
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {";", "&&", "||", "|", "&", ">", ">>", "<"}


def shell_lines(doc):
    """(line number, command line) of each shell code block in doc; lines ending in a backslash joined."""
    fence, pending, start = None, "", 0
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip().strip("`").strip()
            continue
        if fence not in SHELL_FENCES:
            continue
        pending, start = pending + line, start or number
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        yield start, pending
        pending, start = "", 0


def tokens(line):
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)  # '#' starts a comment
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: not a command we can read
        return []


def script_of(words, i):
    """The repo script a `python` at words[i] runs, as the argv prefix to ask for its help, and where its
    arguments start; None for scripts that are not in the repository (pytest, third-party tools)."""
    if i + 1 < len(words) and words[i + 1].endswith(".py") and (ROOT / words[i + 1]).is_file():
        return (words[i + 1],), i + 2
    if i + 2 < len(words) and words[i + 1] == "-m":
        if (ROOT / (words[i + 2].replace(".", "/") + ".py")).is_file():
            return ("-m", words[i + 2]), i + 3
    return None


def documented_flags():
    """{script argv: {(flag, first positional argument or None): ["doc:line", ...]}}."""
    found = defaultdict(lambda: defaultdict(list))
    for doc in DOCS:
        for number, line in shell_lines(doc):
            words = tokens(line)
            for i, word in enumerate(words):
                if word not in ("python", "python3") or not (hit := script_of(words, i)):
                    continue
                script, j = hit
                subcommand = None
                for arg in words[j:]:
                    if arg in SEPARATORS:
                        break
                    if arg.startswith("--") and len(arg) > 2:
                        found[script][(arg.split("=")[0], subcommand)].append(
                            f"{doc.relative_to(ROOT)}:{number}"
                        )
                    elif subcommand is None and re.fullmatch(r"[a-z][a-z-]*", arg):
                        subcommand = arg
    return found


FLAGS = documented_flags()


@functools.cache
def help_text(argv):
    run = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    return run.stdout + run.stderr


def listed(flag, text):
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


@pytest.mark.parametrize("script", sorted(FLAGS), ids=lambda argv: " ".join(argv))
def test_documented_flags_are_in_the_help(script):
    missing = []
    for (flag, subcommand), places in sorted(FLAGS[script].items(), key=str):
        if listed(flag, help_text(script)):
            continue
        if subcommand and listed(flag, help_text(script + (subcommand,))):  # a subcommand's own flag
            continue
        missing.append(f"{flag} ({', '.join(places)})")
    assert not missing, f"{' '.join(script)} --help does not list: " + "; ".join(missing)


def test_the_docs_have_commands_to_check():
    assert ("train.py",) in FLAGS and ("infer.py",) in FLAGS and ("-m", "grisp.peft_format") in FLAGS
