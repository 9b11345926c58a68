"""Default locations of the embedded offline setup, shared by every stage, and how the stages' --help
shows defaults.

Everything large (base model, indices, the triple store, training runs) lives outside the
repository under GRISP_HOME (default ~/.cache/grisp); set the environment variable to move it.
"""

import argparse
import os
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent  # common/ is one level down
GRISP_HOME = Path(
    os.environ.get("GRISP_HOME") or "~/.cache/grisp"
).expanduser()  # set but empty: the default, as in bash's ${GRISP_HOME:-...}

MODEL_DIR = GRISP_HOME / "models" / "qwen2.5-coder-0.5b-instruct"  # written by get_model.py
DATA_DIR = GRISP_HOME / "data"  # benchmark and item caches (filled from ../shared/data or downloads)
SHARED_DATA_DIR = REPO_DIR.parent / "shared" / "data"  # a local cache of the downloads, if present
RUNS_DIR = GRISP_HOME / "runs"  # training runs: checkpoints and logs

DEMO_DIR = REPO_DIR / "data" / "demo"  # the committed demo knowledge graph and questions
DEMO_INDEX_DIR = GRISP_HOME / "indices" / "demo"
WIKIDATA_INDEX_DIR = GRISP_HOME / "indices" / "wikidata-items"  # built from the items file (training data)
DEMO_STORE_DIR = GRISP_HOME / "stores" / "demo"
ENDPOINT_URL = "http://127.0.0.1:7878/query"  # the local oxigraph server started by endpoint.py
ADAPTER_DIR = REPO_DIR / "adapters" / "grisp-shapes-0.5b"  # the shipped LoRA adapter (PEFT layout)
AGENT_ADAPTER_DIR = (
    REPO_DIR / "adapters" / "grasp-agent-0.5b"
)  # the GRASP agent's adapter for the local model


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default after its help, except None: the help of a flag whose default is
    None says what leaving it unset does (argparse's "(default: None)" would contradict it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)
