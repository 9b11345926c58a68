"""tools/dead_ends.py: a dead end is sorted by where the first skeleton ran out of alternatives."""

from tools import dead_ends

WD, WDT = "http://www.wikidata.org/entity/", "http://www.wikidata.org/prop/direct/"
PROPERTIES = {"member of sports team": {"P54"}, "drafted by": {"P647"}}


class FakeClient:
    """Answers every constraint query with the given candidate properties."""

    def __init__(self, candidates):
        self.candidates, self.queries = candidates, []

    def query(self, text):
        self.queries.append(text)
        return type("Result", (), {"iris": lambda _, variable: [WDT + p for p in self.candidates]})()


def trace(entity="Q25369", property_name="member of sports team"):
    """Kobe Bryant resolved, then the property placeholder with its constraint query."""
    return [
        {"event": "resolve", "skeleton": "s", "number": 0, "placeholders": 2},
        {"event": "placeholder", "placeholder": "<iri>Kobe Bryant</iri>", "kind": "entity"},
        {"event": "choose", "placeholder": "<iri>Kobe Bryant</iri>", "iri": WD + entity},
        {
            "event": "placeholder",
            "placeholder": f"<iri>{property_name} (wdt)</iri>",
            "kind": "property",
            "constraint": f"SELECT DISTINCT ?candidate WHERE {{ wd:{entity} ?candidate ?x . }}",
        },
        {"event": "backtrack", "to": "<iri>Kobe Bryant</iri>", "left": 0},
        {"event": "resolve", "skeleton": "t", "number": 1, "placeholders": 1},
        {"event": "placeholder", "placeholder": "<iri>Lakers</iri>", "kind": "entity"},
    ]


def classify(events, candidates=("P647",), answered=("Q25369", "P647")):
    client = FakeClient(candidates)
    return dead_ends.classify(dead_ends.first_resolution(events), set(answered), client, PROPERTIES), client


def test_a_property_the_kg_lacks_for_the_answered_entity():
    kind, client = classify(trace())
    assert kind == "property, KG lacks it"
    assert "PREFIX wd:" in client.queries[0] and "wd:Q25369 ?candidate" in client.queries[0]


def test_a_named_property_among_the_candidates_is_not_the_kgs_fault():
    assert classify(trace(), candidates=("P54", "P647"))[0] == "other"


def test_another_entity_than_the_answer_uses():
    kind, client = classify(trace(entity="Q999"))
    assert kind == "property, other entity" and client.queries == []


def test_the_first_skeleton_only_counts():
    died_at_entity = [trace()[0], trace()[1], trace()[4]]
    assert classify(died_at_entity + trace()[:5])[0] == "entity"  # not the second skeleton's property
    assert classify([])[0] == "other"
