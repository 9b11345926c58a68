"""Every function and method outside tests/ stays short: its body, from the first statement after its
docstring to its last line, spans at most MAX_LINES lines. ruff has no rule that counts a function's
lines (ruff.toml), so this test does. A function that grows past it is split along its seams, as
grisp/generate.py's beam search is into prefill, candidates, select and decode_one_token."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
KNOWN: set[str] = set()  # functions allowed to be longer for now (none)


def sources() -> list[Path]:
    """The project's Python files outside tests/ and hidden directories (a virtualenv, say)."""
    return sorted(
        path
        for path in ROOT.rglob("*.py")
        if not any(part == "tests" or part.startswith(".") for part in path.relative_to(ROOT).parts)
    )


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines a function's body spans, its docstring left out."""
    body = function.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return function.end_lineno - body[0].lineno + 1


def lengths(path: Path, root: Path = ROOT) -> dict[str, int]:
    """{"file:Class.method" or "file:function": body lines} for every function of `path` (named relative to
    `root`), nested ones too."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[f"{path.relative_to(root).as_posix()}:{prefix}{child.name}"] = body_lines(child)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_no_function_is_longer_than_max_lines():
    every = {name: n for path in sources() for name, n in lengths(path).items()}
    assert len(every) > 500, "the walk found too few functions: is ROOT the repository?"
    offenders = sorted(
        ((n, name) for name, n in every.items() if n > MAX_LINES and name not in KNOWN), reverse=True
    )
    assert not offenders, (
        f"functions longer than {MAX_LINES} lines (split them along their seams): "
        + ", ".join(f"{name} ({n})" for n, name in offenders)
    )


def test_the_length_counts_the_body_without_the_docstring(tmp_path):
    code = 'def f():\n    """Doc\n    string."""\n    a = 1\n\n    return a\n\n\nclass C:\n    def m(self):\n        pass\n'
    (tmp_path / "m.py").write_text(code)
    assert lengths(tmp_path / "m.py", tmp_path) == {"m.py:f": 3, "m.py:C.m": 1}
