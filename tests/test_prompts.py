"""prompts.py: the two re-ranking prompt formats. v1 is frozen (the first adapter was trained on it,
byte for byte); v2 lists the items resolved so far with their labels, keeps aliases when infos are
dropped, and groups a list that holds both kinds."""

import pytest

from grisp.prompts import RERANK_SYSTEM, Alternative, rerank_messages

FILM = Alternative(
    "http://www.wikidata.org/entity/Q104123",
    "wd:Q104123",
    "Pulp Fiction",
    ["Pulp fiction", "PF", "a3", "a4", "a5", "a6"],
    "1994 film",
)
GENRE = Alternative("http://www.wikidata.org/entity/Q351718", "wd:Q351718", "pulp fiction", [], "genre")
DIRECTOR = Alternative(
    "http://www.wikidata.org/entity/P57",
    "wdt:P57",
    "director",
    ["directed by"],
    "director of a film",
    kind="property",
)
QUERY = "SELECT ?x WHERE { wd:Q104123 <rep>director (wdt)</rep> ?x . }"


def user(messages):
    return messages[1]["content"]


def test_v1_is_the_first_adapters_prompt_unchanged():
    messages, identifiers = rerank_messages(
        "who directed it?", QUERY, [FILM, GENRE], resolved=[DIRECTOR], prompt_format="v1"
    )
    assert messages[0]["content"] == RERANK_SYSTEM["v1"]
    assert user(messages) == (
        "Question: who directed it?\n"
        f"SPARQL: {QUERY}\n"
        "Alternatives:\n"
        "A. Pulp Fiction (wd:Q104123): 1994 film; also known as Pulp fiction, PF, a3\n"
        "B. pulp fiction (wd:Q351718): genre\n"
        "C. None of the above"
    )
    assert identifiers == ["A", "B", "C"]
    without = user(rerank_messages("q", QUERY, [FILM], show_infos=False, prompt_format="v1")[0])
    assert without.endswith("A. Pulp Fiction (wd:Q104123)\nB. None of the above")


def test_v2_shows_the_resolved_items_with_labels_and_infos():
    messages, identifiers = rerank_messages(
        "who directed pulp fiction?", QUERY, [DIRECTOR], resolved=[FILM, GENRE]
    )
    assert messages[0]["content"] == RERANK_SYSTEM["v2"]
    assert user(messages) == (
        "Question:\nwho directed pulp fiction?\n\n"
        f"SPARQL:\n{QUERY}\n\n"
        "Using entities:\n"
        '- Pulp Fiction (wd:Q104123), also known as "Pulp fiction", "PF", "a3", "a4", "a5": 1994 film\n'
        "- pulp fiction (wd:Q351718): genre\n\n"
        "Alternatives:\n"
        'A. director (wdt:P57), also known as "directed by": director of a film\n\n'
        "B. None of the above"
    )
    assert identifiers == ["A", "B"]
    # properties get their own block, items are sorted by id within a kind; nothing resolved: no block
    block = user(rerank_messages("q", QUERY, [FILM], resolved=[GENRE, DIRECTOR, FILM])[0])
    assert (
        "Using entities:\n- Pulp Fiction (wd:Q104123)" in block
        and "\n\nUsing properties:\n- director (wdt:P57)" in block
    )
    assert "Using" not in user(rerank_messages("q", QUERY, [FILM])[0])


GROUPED = (
    "Entity alternatives:\n"
    'A. Pulp Fiction (wd:Q104123), also known as "Pulp fiction", "PF", "a3", "a4", "a5"\n'
    "B. pulp fiction (wd:Q351718)\n\n"
    "Property alternatives:\n"
    'C. director (wdt:P57), also known as "directed by"\n\n'
    "D. None of the above"
)


def test_v2_drops_only_the_description_and_groups_both_kinds():
    text = user(rerank_messages("q", QUERY, [FILM, GENRE, DIRECTOR], show_infos=False)[0])
    assert text.endswith(GROUPED)


def test_grouped_kinds_keep_their_letters_in_the_order_shown():
    """Alternatives in score order may mix kinds (after a backtrack): the letters must still run A, B, C down
    the grouped list, and each alternative keep its own letter (they ran A, C / B before)."""
    messages, identifiers = rerank_messages("q", QUERY, [FILM, DIRECTOR, GENRE], show_infos=False)
    assert identifiers == ["A", "C", "B", "D"]  # FILM, DIRECTOR, GENRE, None
    assert user(messages).endswith(GROUPED)  # letters as in the list above, each alternative its own
    assert rerank_messages("q", QUERY, [FILM, DIRECTOR, GENRE], prompt_format="v1")[1] == ["A", "B", "C", "D"]


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown prompt format 'v9'"):
        rerank_messages("q", QUERY, [FILM], prompt_format="v9")
