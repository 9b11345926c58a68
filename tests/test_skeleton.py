"""skeleton.py: placeholders, variants and parsing; and, for the four skeleton modules together
(skeleton, positions, constraints, skeletonize), that no text makes them crash."""

import socket

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from grisp import skeleton
from grisp.constraints import constraint_query
from grisp.positions import infer_position
from grisp.skeleton import (
    Placeholder,
    find_placeholders,
    parses,
    query_iris,
    skeletonize,
    split_variant,
    substitute,
    with_variant,
)
from grisp.sparql_syntax import PREFIXES, tokenize

WD = PREFIXES["wd"]
PH = "<iri>X</iri>"  # a placeholder that is not in the text


def first(text: str) -> Placeholder:
    return find_placeholders(text)[0]


# ---------------------------------------------------------------------------- placeholders, variants


def test_find_placeholders_labels_hints_and_spans():
    text = (
        "SELECT ?p WHERE { <iri>Pulp Fiction (film)</iri> <iri>director (wdt)</iri> ?d . "
        '?d <iri> place of birth (pq) </iri> ?p . FILTER(?p != "<iri>not one</iri>") } # <iri>nor this</iri>'
    )
    found = find_placeholders(text)
    assert [(p.label, p.variant) for p in found] == [
        ("Pulp Fiction (film)", None),
        ("director", "wdt"),
        ("place of birth", "pq"),
    ]
    assert all(text[p.start : p.end] == p.text for p in found)
    assert skeleton.placeholder_text("place  of\nbirth", "wdt") == "<iri>place of birth (wdt)</iri>"


@pytest.mark.parametrize("variant", skeleton.VARIANTS)
def test_variant_round_trip(variant):
    iri = PREFIXES[variant] + "P19"
    assert split_variant(iri) == (WD + "P19", variant)
    assert with_variant(WD + "P19", variant) == iri


def test_variants_of_entities_and_other_iris():
    assert split_variant(WD + "Q42") == (WD + "Q42", None)
    assert split_variant(WD + "P19") == (WD + "P19", None)
    assert split_variant("http://example.org/prop/direct/P19") == ("http://example.org/prop/direct/P19", None)
    assert with_variant(WD + "Q42", None) == WD + "Q42"
    with pytest.raises(ValueError, match="Wikidata property"):
        with_variant(WD + "Q42", "wdt")
    with pytest.raises(ValueError, match="variant 'xyz'"):
        with_variant(WD + "P19", "xyz")


def test_substitute_writes_variant_and_prefixed_name():
    text = "SELECT ?x WHERE { <iri>Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . ?s <iri>role (pq)</iri> ?x }"
    text = substitute(text, first(text), WD + "Q3772")
    text = substitute(text, first(text), WD + "P19")  # canonical id in, variant from the hint
    text = substitute(text, first(text), PREFIXES["ps"] + "P453")  # a variant IRI in: hint wins
    assert text == "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . ?s pq:P453 ?x }"
    odd = "SELECT ?x WHERE { ?x<iri>a (wdt)</iri>?y }"
    assert (
        substitute(odd, first(odd), "http://example.org/a")
        == "SELECT ?x WHERE { ?x <http://example.org/a>?y }"
    )
    with pytest.raises(ValueError, match="find_placeholders"):
        substitute("SELECT * { ?s ?p ?o }", Placeholder(PH, "X", None, 0, len(PH)), WD + "Q1")


@pytest.mark.parametrize(
    "text",
    [
        "SELECT ?x WHERE { ?x wdt:P31 <iri>a</iri>.<iri>b</iri> wdt:P1 ?x }",  # `wd:Q5.wd:Q90` is one name
        "SELECT ?x WHERE { ?x wdt:P31 <iri>a</iri>.FILTER(?x != <iri>b</iri>) }",
        "SELECT ?x WHERE { ?x wdt:P31 <iri>a</iri>..<iri>b</iri>-?x }",
        "SELECT ?x WHERE { ?x wdt:P31 <iri>a</iri>.?y wdt:P1 <iri>b</iri>. }",
    ],
)
def test_substitute_keeps_every_written_name_a_token_of_its_own(text):
    for order in ((0, 0), (1, 0)):  # first placeholder first, or the second
        done = text
        for index, iri in zip(order, (WD + "Q5", WD + "Q90")):
            done = substitute(done, find_placeholders(done)[index], iri)
        assert {"wd:Q5", "wd:Q90"} <= {t.text for t in tokenize(done)}, done
    untouched = "SELECT ?x WHERE { ?x wdt:P31 <iri>a</iri> . <iri>b</iri> wdt:P1 ?x . }"
    assert substitute(untouched, first(untouched), WD + "Q5") == untouched.replace("<iri>a</iri>", "wd:Q5")


# ---------------------------------------------------------------------------- merged wordings


BORN = "SELECT ?p WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?d . ?d <iri>place of birth (wdt)</iri> ?p . }"
REWORDED = "SELECT ?p WHERE { <iri>pulp fiction</iri> <iri>directed by (wdt)</iri> ?d . ?d <iri>birthplace (wdt)</iri> ?p . }"


def test_merging_adds_the_new_wordings_of_each_placeholder():
    merged = skeleton.merge_wordings(BORN, REWORDED)
    assert merged == (
        "SELECT ?p WHERE { <iri>Pulp Fiction</iri> <iri>director<sep>directed by (wdt)</iri> ?d . "
        "?d <iri>place of birth<sep>birthplace (wdt)</iri> ?p . }"
    )
    assert [skeleton.wordings(ph) for ph in find_placeholders(merged)] == [
        ["Pulp Fiction"],
        ["director", "directed by"],
        ["place of birth", "birthplace"],
    ]
    assert [ph.variant for ph in find_placeholders(merged)] == [None, "wdt", "wdt"]
    assert parses(merged) and skeleton.first_wordings(merged) == BORN
    assert skeleton.merge_wordings(BORN, BORN) == BORN  # nothing new: the text itself


def test_merging_keeps_at_most_three_wordings():
    texts = [
        BORN.replace("place of birth", label) for label in ("born in", "birthplace", "hometown", "origin")
    ]
    merged = BORN
    for text in texts:
        merged = skeleton.merge_wordings(merged, text)
    assert skeleton.wordings(find_placeholders(merged)[2]) == ["place of birth", "born in", "birthplace"]
    assert skeleton.MAX_WORDINGS == 3


def test_wordings_are_distinct_and_at_most_three_whatever_the_text_says():
    ph = first("SELECT ?x { <iri>a<sep> A <sep>b<sep><sep>c<sep>d</iri> ?p ?x }")
    assert skeleton.wordings(ph) == ["a", "b", "c"]
    spaced = BORN.replace("place of birth", "Place  of   Birth")
    assert skeleton.merge_wordings(BORN, spaced) == BORN  # case and spacing make no new wording


def test_wording_key_tells_structures_and_variants_apart():
    assert skeleton.wording_key(BORN) == skeleton.wording_key(REWORDED)
    other_variant = BORN.replace("place of birth (wdt)", "place of birth (p)")
    other_structure = BORN.replace("?d . ?d", "?d . ?p")
    for text in (other_variant, other_structure):
        assert skeleton.wording_key(text) != skeleton.wording_key(BORN)
        with pytest.raises(ValueError, match="structures differ"):
            skeleton.merge_wordings(BORN, text)


def test_first_wordings_leaves_unmerged_placeholders_as_written():
    odd = "SELECT ?x WHERE { <iri>  Pulp   Fiction </iri> <iri>director<sep>directed by (wdt)</iri> ?x }"
    assert (
        skeleton.first_wordings(odd)
        == "SELECT ?x WHERE { <iri>  Pulp   Fiction </iri> <iri>director (wdt)</iri> ?x }"
    )
    assert skeleton.wordings(first(odd)) == ["Pulp   Fiction"]


# ---------------------------------------------------------------------------- parsing


def test_parses_uses_a_real_parser():
    assert parses("SELECT ?x WHERE { <iri>film</iri> <iri>director (wdt)</iri> ?x }")
    assert parses("SELECT ?x WHERE { ?x wdt:P31/wdt:P279* wd:Q5 } ORDER BY DESC(?x) LIMIT 3")
    assert parses("ASK { wd:Q1 p:P161 [ ps:P161 ?a ; pq:P453 ?b ] }")
    assert not parses("SELECT ?x WHERE { ?x <iri>director (wdt)</iri> }")  # no object
    assert not parses("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 ")  # unclosed
    assert not parses("SELECT ?x WHERE { ?x foo:bar ?y }")  # unknown prefix
    assert not parses("INSERT DATA { <http://e/a> <http://e/b> <http://e/c> }")  # an update is no query
    assert not parses("")


def test_parses_never_calls_a_service():
    with socket.socket() as listener:  # a SERVICE target that records any connection
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/sparql"
        assert parses(f"ASK {{ SERVICE <{url}> {{ ?s ?p ?o }} }}")
        assert parses(f"ASK {{ VALUES ?e {{ <{url}> }} SERVICE SILENT ?e {{ ?s ?p ?o }} }}")
        with pytest.raises(BlockingIOError):
            listener.accept()


# ---------------------------------------------------------------------------- robustness

FRAGMENTS = [
    "SELECT",
    "ASK",
    "DISTINCT",
    "?x",
    "?y",
    "$z",
    "WHERE",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ".",
    ";",
    ",",
    "<iri>film</iri>",
    "<iri>director (wdt)</iri>",
    "<iri>role (pq)</iri>",
    "<iri>",
    "</iri>",
    "wd:Q1",
    "wdt:P31",
    "p:P161",
    "foo:",
    ":",
    "a",
    "/",
    "*",
    "+",
    "?",
    "|",
    "^",
    "!",
    "^^",
    "=",
    "<",
    ">",
    "FILTER",
    "OPTIONAL",
    "UNION",
    "MINUS",
    "VALUES",
    "BIND",
    "AS",
    "NOT",
    "EXISTS",
    "GRAPH",
    "SERVICE",
    "SILENT",
    "ORDER BY",
    "GROUP BY",
    "COUNT",
    "LIMIT 1",
    "PREFIX ex: <http://ex.org/>",
    '"str"',
    "'s'",
    '"""',
    "@en",
    "1",
    "2.5",
    "#c\n",
    "<http://e/a#b>",
    "_:b",
    "xsd:dateTime",
    "true",
    "\n",
]


TERMS = [
    "?x",
    "?y",
    "wd:Q1",
    "<iri>film</iri>",
    "<iri>Pulp Fiction</iri>",
    '"s"',
    '"s"@en',
    '"1" ^^ xsd:int',
    "[ wdt:P1 ?z ]",
    "( ?a ?b )",
    "1",
    "_:b",
]
VERBS = [
    "wdt:P31",
    "<iri>director (wdt)</iri>",
    "a",
    "wdt:P31 / wdt:P279 *",
    "^<iri>role (pq)</iri>",
    "(wdt:P1|<iri>cast (p)</iri>)",
    "?p",
    "!(wdt:P1)",
]
TRIPLE = st.tuples(st.sampled_from(TERMS), st.sampled_from(VERBS), st.sampled_from(TERMS)).map(" ".join)
BLOCK = st.one_of(
    TRIPLE,
    TRIPLE.map(lambda t: f"OPTIONAL {{ {t} }}"),
    TRIPLE.map(lambda t: f"{{ {t} }} UNION {{ {t} }}"),
    TRIPLE.map(lambda t: f"FILTER NOT EXISTS {{ {t} }}"),
    st.just("FILTER(?x != <iri>film</iri>)"),
    st.just("VALUES ?x { <iri>film</iri> wd:Q2 }"),
    st.just("BIND(<iri>film</iri> AS ?b)"),
)
BODY = st.lists(
    st.tuples(BLOCK, st.sampled_from([" . ", " ; wdt:P1 <iri>x</iri> . ", " , ?z . ", " "])), max_size=5
)
QUERY = st.builds(
    lambda head, body, tail: f"{head} {{ {''.join(b + sep for b, sep in body)}}}{tail}",
    st.sampled_from(
        ["SELECT ?x WHERE", "ASK", "SELECT ?x (COUNT(*) AS ?n) WHERE", "PREFIX e: <http://e/> SELECT *"]
    ),
    BODY,
    st.sampled_from(["", " ORDER BY ?x", " GROUP BY ?x LIMIT 1"]),
)


@st.composite
def skeleton_texts(draw) -> str:
    """Random fragment soup, or a well-formed skeleton cut off or with a fragment inserted somewhere."""
    if draw(st.booleans()):
        return draw(st.sampled_from([" ", ""])).join(draw(st.lists(st.sampled_from(FRAGMENTS), max_size=30)))
    text, cut = draw(QUERY), draw(st.integers(0, 400))
    cut = cut % (len(text) + 1)
    return text[:cut] + draw(st.sampled_from(["", *FRAGMENTS])) + draw(st.sampled_from(["", text[cut:]]))


@settings(max_examples=200, deadline=None)
@given(skeleton_texts(), st.text(max_size=3))
# found by this test: a constraint query copied the malformed `SELECTwdt:P31` and did not parse
@example(
    "ASK { ?x SELECTwdt:P31 ?x . ?x wdt:P31 ?x . FILTER(?x != <iri>film</iri>) . "
    "?x wdt:P31 ?x ; wdt:P1 <iri>x</iri> . }",
    "",
)
def test_no_skeleton_text_crashes(text, noise):
    text += noise
    parses(text)
    query_iris(text)
    skeletonize(text, lambda iri: "label")
    for ph in find_placeholders(text):
        assert infer_position(text, ph) in ("subject", "property", "object", "unknown")
        query = constraint_query(text, ph)
        assert query is None or (parses(query) and not find_placeholders(query)), query
        assert len(find_placeholders(substitute(text, ph, WD + "P1"))) == len(find_placeholders(text)) - 1
