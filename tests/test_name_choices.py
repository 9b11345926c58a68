"""tools/name_choices.py: a run recorded before choices carried `named` gets it from its index, as resolve.py
would have recorded it, and --score-only's confidence then follows today's rule."""

import json
import subprocess
import sys

import pytest

from common import defaults
from common.jsonl import read_jsonl, write_jsonl
from grisp import confidence

WD = "http://www.wikidata.org/entity/"
ITEMS = [
    {"id": WD + "Q181", "label": "Jimmy Wales", "aliases": [], "description": "Wikipedia", "count": 3},
    {"id": WD + "Q5582", "label": "Vincent van Gogh", "aliases": [], "description": "painter", "count": 5},
    {"id": WD + "P551", "label": "residence", "aliases": [], "description": "", "count": 9},
]


def recorded(entity_placeholder: str, iri: str) -> dict:
    """A retry answer as evaluate.py recorded it before `named`: the entity below None, the property sure."""
    return {
        "id": iri,
        "trace": [
            {"event": "placeholder", "placeholder": entity_placeholder, "kind": "entity"},
            {"event": "placeholder", "placeholder": "<iri>residence (wdt)</iri>", "kind": "property"},
        ],
        "choices": [
            {"placeholder": entity_placeholder, "iri": iri, "p": 0.0004, "p_none": 0.999},
            {"placeholder": "<iri>residence (wdt)</iri>", "iri": WD + "P551", "p": 0.999, "p_none": 0.0001},
        ],
    }


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("name-choices")
    write_jsonl(root / "items.jsonl", ITEMS)
    command = [
        sys.executable,
        str(defaults.REPO_DIR / "build_index.py"),
        "--items",
        str(root / "items.jsonl"),
    ]
    subprocess.run(
        [*command, "--out", str(root / "index"), "--embed", "none"], check=True, capture_output=True
    )
    return root / "index"


def test_recorded_choices_are_named_from_the_runs_index(index, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"index": str(index)}))
    namesake, rewording = (
        recorded("<iri>Jimmy Hoffa</iri>", WD + "Q181"),
        recorded("<iri>Van Gogh</iri>", WD + "Q5582"),
    )
    already = recorded("<iri>Van Gogh</iri>", WD + "Q5582")
    already["choices"][0]["named"] = False  # recorded by resolve.py: left as it is
    write_jsonl(run / "predictions.jsonl", [namesake, rewording, already])
    subprocess.run(
        [sys.executable, str(defaults.REPO_DIR / "tools" / "name_choices.py"), str(run)], check=True
    )
    records = read_jsonl(run / "predictions.jsonl")
    assert [[c["named"] for c in r["choices"]] for r in records] == [
        [False, None],
        [True, None],
        [False, None],
    ]
    assert confidence.confidence(records[0]["choices"]) == pytest.approx(0.0004)  # the namesake: its least
    assert confidence.confidence(records[1]["choices"]) == pytest.approx((0.0004 + 0.999) / 2)


def test_a_directory_without_predictions_is_refused_with_a_clear_message(tmp_path):
    done = subprocess.run(
        [sys.executable, str(defaults.REPO_DIR / "tools" / "name_choices.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "no predictions.jsonl" in done.stderr
