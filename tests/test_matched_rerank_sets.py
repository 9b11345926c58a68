"""tools/matched_rerank_sets.py: the --mention experiment's training sets differ only in the wording."""

import json

from tools import matched_rerank_sets as matched


def sample(record_id, placeholder, iri="Q1"):
    return {
        "id": record_id,
        "task": "rerank",
        "iri": iri,
        "target": "A",
        "epoch": 0,
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": f"SPARQL: SELECT ?x WHERE {{ <rep>{placeholder}</rep> ?p ?x }}"},
        ],
    }


def test_the_sets_pair_each_sample_with_its_worded_form(tmp_path):
    plain = [sample(f"r{i}", f"Label {i}") for i in range(12)] + [
        sample("gone", "Label"),
        sample("skel", "x") | {"task": "skeleton"},
    ]
    worded = [
        sample(f"r{i}", f"words {i}" if i % 2 else f"Label {i}", None if i == 1 else "Q1") for i in range(12)
    ]
    # "gone": its worded search found nothing, so it has no pair and is left out
    for name, rows in [("plain.jsonl", plain), ("worded.jsonl", worded)]:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = matched.argparse.Namespace(
        plain=str(tmp_path / "plain.jsonl"),
        worded=str(tmp_path / "worded.jsonl"),
        out_dir=str(tmp_path / "out"),
        n_worded=4,
        n_plain=4,
        n_val=1,
        seed=0,
    )
    matched.main(args)
    read = lambda name: [json.loads(line) for line in (tmp_path / "out" / f"{name}.jsonl").open()]
    mention, control, val = read("train-mention"), read("train-control"), read("val")
    assert [s["id"] for s in mention] == [s["id"] for s in control] and len(mention) == 8
    marked = matched.marked
    assert sum(marked(s).startswith("words") for s in mention) == 4  # half worded...
    assert not any(marked(s).startswith("words") for s in control)  # ...the control the same samples, plain
    for m, c in zip(mention, control):
        assert marked(m) == marked(c) or marked(m).replace("words", "Label") == marked(c)
    assert len(val) == 2 and not {s["id"] for s in val} & {s["id"] for s in mention}
