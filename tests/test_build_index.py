"""Tests of build_index.py and its library build_index.py: builds from a tiny items JSONL and from tiny
real oxigraph endpoints (Wikidata-style and generic RDF), reuse of finished parts, and clear errors for
bad input."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import free_port

import endpoint
from build_index import current_parts, fetch_pairs, local_name, open_index
from search import EmbeddingIndex, PrefixIndex, load_indices

ROOT = Path(__file__).resolve().parents[1]
WD = "http://www.wikidata.org/entity/"

WIKIDATA_TTL = """\
@prefix wd: <http://www.wikidata.org/entity/> .
@prefix wds: <http://www.wikidata.org/entity/statement/> .
@prefix wdt: <http://www.wikidata.org/prop/direct/> .
@prefix p: <http://www.wikidata.org/prop/> .
@prefix ps: <http://www.wikidata.org/prop/statement/> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix skos: <http://www.w3.org/2004/02/skos/core#> .
@prefix schema: <http://schema.org/> .
@prefix wikibase: <http://wikiba.se/ontology#> .
wd:Q104123 rdfs:label "Pulp Fiction"@en, "Pulp Fiktion"@de ; skos:altLabel "PF"@en ;
    schema:description "1994 film by Quentin Tarantino"@en ; wikibase:sitelinks 80 ; wdt:P57 wd:Q3772 .
wd:Q351718 rdfs:label "pulp fiction"@en ; schema:description "genre of fiction"@en ; wikibase:sitelinks 20 .
wd:Q3772 rdfs:label "Quentin Tarantino"@en ; wdt:P19 wd:Q185582 ; p:P19 wds:s1 ; wdt:P214 "12345" .
wds:s1 ps:P19 wd:Q185582 .
wd:Q185582 rdfs:label "Knoxville"@en .
wd:Q999 wdt:P31 wd:Q5 .
wd:P57 rdfs:label "director"@en ; skos:altLabel "film director"@en .
wd:P19 rdfs:label "place of birth"@en ; skos:altLabel "birthplace"@en .
wd:P214 rdfs:label "VIAF ID"@en ; wikibase:propertyType wikibase:ExternalId .
"""

GENERIC_TTL = """\
@prefix ex: <http://example.org/> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix skos: <http://www.w3.org/2004/02/skos/core#> .
@prefix schema: <http://schema.org/> .
ex:alice ex:knows ex:bob ; rdfs:label "Alice"@en, "Alicia"@es ; skos:altLabel "Ally" ;
    schema:description "a person"@en .
ex:bob ex:worksFor ex:ACME_Corp .
ex:carol ex:worksFor ex:ACME_Corp .
ex:worksFor rdfs:label "works for"@en .
ex:carol ex:memberOf ex:org .
ex:org rdfs:label "Org", "Organisation"@en-gb, "Organization"@en ;
    schema:description "an organised group"@en-GB, "an organized group"@EN .
"""


def run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "build_index.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_local_name():
    assert local_name("https://dblp.org/rdf/schema#authoredBy") == "authored By"
    assert local_name("http://example.org/ACME_Corp/") == "ACME Corp"
    assert local_name("http://www.wikidata.org/entity/Q42") == "Q42"


def test_build_from_items_jsonl_and_reuse(tmp_path):
    items = tmp_path / "items.jsonl"
    rows = [
        {
            "id": "Q1",
            "label": "Douglas Adams",
            "aliases": ["DNA"],
            "description": "writer",
            "count": 5,
        },
        {"id": "Q2", "label": "Douglas fir", "aliases": [], "description": "tree", "count": 9},
        {
            "id": "P19",
            "label": "place of birth",
            "aliases": ["born in"],
            "description": "",
            "count": 3,
        },
        {"id": "http://example.org/x", "label": "Douglas X", "kind": "entity", "count": 1},
    ]
    items.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "index"
    result = run("--items", str(items), "--out", str(out), "--embed", "none")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"entity": 3, "property": 1}
    assert manifest["settings"]["items"] == str(items.resolve()) and "numpy" in manifest["versions"]
    assert manifest["source"] == {
        "items_sha256": hashlib.sha256(items.read_bytes()).hexdigest(),
        "bytes": items.stat().st_size,
    }

    indices = load_indices(out)
    hits = indices.search("entity", "douglas", k=5)
    assert [h.id for h in hits] == [WD + "Q2", WD + "Q1", "http://example.org/x"]  # popularity ties
    assert hits[1].aliases == ["DNA"] and hits[1].description == "writer" and hits[1].popularity == 5
    assert indices.search("property", "birth", k=5)[0].id == WD + "P19"  # prefix: no embedding built
    assert indices.item(WD + "P19").aliases == ["born in"]

    again = run("--items", str(items), "--out", str(out), "--embed", "none")
    assert again.returncode == 0 and again.stdout.count("reusing") == 4  # items + prefix, 2 kinds
    forced = run("--items", str(items), "--out", str(out), "--embed", "none", "--force")
    assert forced.returncode == 0 and "reusing" not in forced.stdout
    items.write_text(items.read_text().replace("Douglas fir", "Douglas spruce"))  # edited source
    edited = run("--items", str(items), "--out", str(out), "--embed", "none")
    assert edited.returncode == 0 and "reusing" not in edited.stdout
    assert load_indices(out).item(WD + "Q2").label == "Douglas spruce"


def write_items(path: Path, names: list[str]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"Q{i}", "label": name, "count": 1}) + "\n"
            for i, name in enumerate(names, start=1)
        )
    )
    return path


def test_a_build_cut_short_leaves_no_index_and_mixed_parts_are_refused(tmp_path, monkeypatch):
    import build_index

    items = write_items(tmp_path / "items.jsonl", ["alpha", "beta", "gamma"])
    build_index.build(tmp_path / "index", items=items, embed="none")
    write_items(items, ["delta", "epsilon"])  # an edited items file, then a rebuild that dies half way

    def crash(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(build_index, "build_prefix", crash)
    with pytest.raises(RuntimeError, match="killed"):
        build_index.build(tmp_path / "index", items=items, embed="none")
    with pytest.raises(FileNotFoundError, match="no manifest"):  # the new items beside the old prefix index
        load_indices(tmp_path / "index")
    monkeypatch.undo()
    # a manifest over parts of two builds (copied by hand, say): rows would name other items
    build_index.build(tmp_path / "index", items=items, embed="none")
    build_index.build(
        tmp_path / "other", items=write_items(tmp_path / "other.jsonl", ["a", "b", "c"]), embed="none"
    )
    shutil.rmtree(tmp_path / "index" / "entities" / "prefix")
    shutil.copytree(tmp_path / "other" / "entities" / "prefix", tmp_path / "index" / "entities" / "prefix")
    with pytest.raises(ValueError, match="entity parts of the index .* disagree"):
        load_indices(tmp_path / "index")


def test_an_embedding_no_longer_asked_for_is_removed(tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "P19", "label": "place of birth", "count": 3}) + "\n")
    assert run("--items", str(items), "--out", str(tmp_path / "index")).returncode == 0  # properties embedded
    assert load_indices(tmp_path / "index").default_method("property") == "embedding"
    assert run("--items", str(items), "--out", str(tmp_path / "index"), "--embed", "none").returncode == 0
    assert not (
        tmp_path / "index" / "properties" / "embedding"
    ).exists()  # of the same items, removed all the same
    indices = load_indices(tmp_path / "index")
    assert indices.default_method("property") == "prefix" and indices.manifest["settings"]["embed"] == "none"


def test_the_default_wikidata_index_follows_its_items_file(tmp_path, monkeypatch, capsys):
    import build_index

    items = write_items(tmp_path / "items.jsonl", ["alpha", "beta"])
    monkeypatch.setattr(build_index.defaults, "WIKIDATA_INDEX_DIR", tmp_path / "index")
    monkeypatch.setattr(build_index.benchmarks, "cached_file", lambda relative: items)
    monkeypatch.setattr(build_index, "build", partial(build_index.build, embed="none"))
    assert len(open_index(None, "wwq").stores["entity"]) == 2
    assert "no index" in capsys.readouterr().err
    assert len(open_index(None, "wwq").stores["entity"]) == 2 and "building" not in capsys.readouterr().err
    write_items(items, ["alpha", "beta", "gamma"])  # a newer items file
    assert len(open_index(None, "wwq").stores["entity"]) == 3
    assert "another items file" in capsys.readouterr().err
    copy = tmp_path / "elsewhere.jsonl"  # the same file elsewhere (the data cache's copy of ../shared/data)
    copy.write_bytes(items.read_bytes())
    monkeypatch.setattr(build_index.benchmarks, "cached_file", lambda relative: copy)
    open_index(None, "wwq")
    assert "building" not in capsys.readouterr().err


def test_an_embedding_of_float32_vectors_is_rebuilt(tmp_path, capsys):
    """Indices from before the float64 encoder (no `vectors_from` in their config) embed again, in
    build_index.py and, for the default Wikidata index, in open_index; another index is used with a warning."""
    items = tmp_path / "items.jsonl"
    items.write_text(
        json.dumps({"id": "P19", "label": "place of birth", "aliases": ["born in"], "count": 3}) + "\n"
    )
    out = tmp_path / "index"
    assert run("--items", str(items), "--out", str(out)).returncode == 0
    part = out / "properties" / "embedding"
    assert EmbeddingIndex.is_current(part) and current_parts(out)
    again = run("--items", str(items), "--out", str(out))
    assert again.stdout.count("reusing") == 5  # items + prefix of 2 kinds, the embedding

    saved = json.loads((part / "config.json").read_text())  # as an index built before the float64 encoder
    (part / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "vectors_from"}))
    assert not EmbeddingIndex.is_current(part) and not current_parts(out)
    open_index(str(out), "wwq")  # not the default Wikidata index: used as it is, with a warning
    assert "holds float32 encoder vectors" in capsys.readouterr().err
    old = run("--items", str(items), "--out", str(out))
    reused = [line for line in old.stdout.splitlines() if line.startswith("reusing")]
    assert (
        old.returncode == 0 and len(reused) == 4 and not any(line.endswith("/embedding") for line in reused)
    )
    assert EmbeddingIndex.is_current(part)


def test_a_prefix_index_of_another_normalisation_is_rebuilt(tmp_path, capsys):
    """A prefix part built by another `normalize` (search.NORMALIZATION; none in its config: the first) is
    rebuilt by build_index.py, and an index holding one is loaded with a warning."""
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "Q1", "label": "Ma\u00adrie Curie", "count": 3}) + "\n")
    out = tmp_path / "index"
    assert run("--items", str(items), "--out", str(out), "--embed", "none").returncode == 0
    part = out / "entities" / "prefix"
    assert PrefixIndex.is_current(part) and current_parts(out)
    saved = json.loads((part / "config.json").read_text())
    (part / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "normalization"}))
    assert not PrefixIndex.is_current(part) and not current_parts(out)
    open_index(str(out), "wwq")
    assert "another text normalisation" in capsys.readouterr().err
    again = run("--items", str(items), "--out", str(out), "--embed", "none")
    reused = [line for line in again.stdout.splitlines() if line.startswith("reusing")]
    assert (
        again.returncode == 0
        and len(reused) == 3
        and not any(line.endswith("entities/prefix") for line in reused)
    )
    assert PrefixIndex.is_current(part) and load_indices(out).search("entity", "marie curie")[0].id.endswith(
        "Q1"
    )
    assert "another text normalisation" not in capsys.readouterr().err


def test_paged_fetch_goes_on_past_a_server_that_caps_its_results():
    rows = [
        {"item": {"type": "uri", "value": f"http://x/{i}"}, "value": {"type": "literal", "value": str(i)}}
        for i in range(7)
    ]

    class Capped:  # at most 2 rows whatever the LIMIT, as Virtuoso's ResultSetMaxRows
        def query(self, text: str) -> SimpleNamespace:
            limit, offset = map(int, re.search(r"LIMIT (\d+) OFFSET (\d+)", text).groups())
            return SimpleNamespace(rows=rows[offset : offset + min(limit, 2)])

    pairs = fetch_pairs(Capped(), "labels", "SELECT ?item ?value WHERE { ?item ?p ?value }", page_size=5)
    assert [iri for iri, _ in pairs] == [f"http://x/{i}" for i in range(7)]


def test_build_from_wikidata_endpoint(oxigraph_server, tmp_path):
    kg = tmp_path / "kg.ttl"
    kg.write_text(WIKIDATA_TTL)
    out = tmp_path / "index"
    result = run("--endpoint", oxigraph_server(kg), "--out", str(out), "--page-size", "3")
    assert result.returncode == 0, result.stderr
    indices = load_indices(out)
    entities = {indices.item(WD + q).id for q in ["Q104123", "Q351718", "Q3772", "Q185582", "Q999", "Q5"]}
    assert len(entities) == 6 and indices.manifest["counts"] == {"entity": 6, "property": 4}

    pulp = indices.search("entity", "pulp fiction", k=5)
    assert [h.id for h in pulp] == [WD + "Q104123", WD + "Q351718"]  # tie broken by sitelinks
    assert pulp[0].label == "Pulp Fiction" and pulp[0].aliases == ["PF"] and pulp[0].popularity == 80
    assert pulp[0].description == "1994 film by Quentin Tarantino"
    assert indices.item(WD + "Q999").label == "Q999"  # no label: local name

    # properties: canonical entity IRIs, usage over all variants (wdt + p + ps), external ids last
    assert indices.item(WD + "P19").popularity == 3 and indices.item(WD + "P31").label == "P31"
    assert indices.item(WD + "P214").popularity < 0 <= indices.item(WD + "P31").popularity
    assert indices.default_method("property") == "embedding"
    assert indices.search("property", "born in", k=1)[0].id == WD + "P19"
    allowed = [WD + "P57", WD + "P214", "http://not/indexed"]
    hits = indices.search("property", "born in", k=5, allowed_ids=allowed)
    assert sorted(h.id for h in hits) == [WD + "P214", WD + "P57"]


def test_an_endpoint_index_is_rebuilt_when_the_kg_behind_its_url_changes(tmp_path):
    kg, store, out = tmp_path / "kg.ttl", tmp_path / "store", tmp_path / "index"
    kg.write_text(WIKIDATA_TTL)
    port = free_port()
    url = endpoint.start([kg], store, port=port)
    try:
        assert run("--endpoint", url, "--out", str(out), "--embed", "none").returncode == 0
        again = run("--endpoint", url, "--out", str(out), "--embed", "none")
        assert again.returncode == 0 and again.stdout.count("reusing") == 4
        kg.write_text(WIKIDATA_TTL + '\nwd:Q7 rdfs:label "Added item"@en .\n')  # same URL, one item more
        assert endpoint.start([kg], store, port=port) == url  # the server reloads the edited file
        edited = run("--endpoint", url, "--out", str(out), "--embed", "none")
        assert edited.returncode == 0 and "reusing" not in edited.stdout, edited.stdout
        assert load_indices(out).item(WD + "Q7").label == "Added item"
    finally:
        endpoint.stop(store)


def test_build_from_generic_endpoint(oxigraph_server, tmp_path):
    kg = tmp_path / "generic.ttl"
    kg.write_text(GENERIC_TTL)
    out = tmp_path / "index"
    result = run(
        "--endpoint",
        oxigraph_server(kg),
        "--schema",
        "generic",
        "--out",
        str(out),
        "--embed",
        "none",
    )
    assert result.returncode == 0, result.stderr
    indices = load_indices(out)
    alice = indices.item("http://example.org/alice")
    assert alice.label == "Alice" and alice.aliases == ["Ally"] and alice.description == "a person"
    organization = indices.item(
        "http://example.org/org"
    )  # en before en-gb before untagged, whatever their order
    assert organization.label == "Organization" and organization.aliases == ["Organisation", "Org"]
    assert organization.description == "an organized group"
    assert indices.item("http://example.org/ACME_Corp").label == "ACME Corp"
    assert indices.item("http://example.org/ACME_Corp").popularity == 2  # two occurrences
    assert indices.search("entity", "acme", k=3)[0].id == "http://example.org/ACME_Corp"
    works_for = indices.search("property", "works", k=3)[0]
    assert works_for.id == "http://example.org/worksFor" and works_for.popularity == 2
    assert [h.id for h in indices.search("property", "knows", k=3)] == ["http://example.org/knows"]
    assert indices.search("entity", "works", k=3) == []  # predicates are not entities


def test_help_and_bad_input(tmp_path):
    assert run("--help").returncode == 0
    missing = run("--items", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"))
    assert missing.returncode != 0 and "nope.jsonl" in missing.stderr and "Traceback" not in missing.stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "Q1", "label": "ok"}\n{"id": "Q2"\n')
    bad = run("--items", str(broken), "--out", str(tmp_path / "o"), "--embed", "none")
    assert bad.returncode != 0 and "broken.jsonl:2" in bad.stderr and "Traceback" not in bad.stderr
    url = f"http://127.0.0.1:{free_port()}/query"
    down = run("--endpoint", url, "--out", str(tmp_path / "o"))
    assert down.returncode != 0 and url in down.stderr and "Traceback" not in down.stderr
    assert run("--out", str(tmp_path / "o")).returncode != 0  # no source
    empty = run(
        "--endpoint", url, "--page-size", "0", "--out", str(tmp_path / "o")
    )  # refused before any fetch
    assert empty.returncode != 0 and "--page-size 0" in empty.stderr and "Traceback" not in empty.stderr
