"""The two prompts GRISP trains and runs one model on (paper section 3; docs/method.md sections 3.3 and 2.5).

1. Skeleton generation: question -> SPARQL skeleton with `<iri>label</iri>` placeholders.
2. List-wise re-ranking: question + partially resolved query with the current placeholder marked
   `<rep>label</rep>` (+ in format v2 the items resolved so far, with their labels) + lettered
   alternatives (plus "None of the above") -> one identifier letter.

Training (samples.py, for gen_data.py and train.py) and inference (grisp/pipeline.py for skeletons, rerank.py
for re-ranking) both build their prompts here, so the model always sees exactly the text it was
trained on. Prompts are chat messages; tokenizer.chat_prompt turns them into Qwen's chat format.
"""

import re
from dataclasses import dataclass, field

from grisp.skeleton import with_variant
from grisp.sparql_syntax import compact

SKELETON_SYSTEM = (
    "You translate questions into SPARQL queries over the Wikidata knowledge graph. "
    "Write every knowledge graph IRI as a placeholder <iri>name</iri> holding its label; "
    "end property placeholders with their variant in brackets, e.g. <iri>place of birth (wdt)</iri>. "
    "Do not write PREFIX lines."
)

# The re-ranking prompt has two formats (docs/method.md section 3.3). An adapter is trained on one and must
# be run with it (peft_format.read_prompt_format reads it from the adapter directory):
#   v1: the first adapter's: the query with resolved items as bare ids, one flat list of alternatives;
#   v2: as in the reference implementation, the items resolved so far are listed with label, aliases and
#       description ("Using entities:" / "Using properties:"), and a list holding both kinds is grouped.
PROMPT_FORMATS = ("v1", "v2")
LATEST_PROMPT_FORMAT = "v2"  # what new training runs use

RERANK_SYSTEM = {
    "v1": (
        "You select the knowledge graph item that replaces the placeholder marked <rep>...</rep> "
        "in a SPARQL query for a question. Answer with the letter of the best alternative, "
        'or the letter of "None of the above" if no alternative fits.'
    ),
    "v2": (
        "You select the knowledge graph item that replaces the placeholder marked <rep>...</rep> "
        "in a SPARQL query for a question. Placeholders not resolved yet are marked <iri>...</iri>; "
        "the items already resolved are described below the query. Answer with the letter of the best "
        'alternative, or the letter of "None of the above" if no alternative fits.'
    ),
}

# Single-token identifiers for the alternatives: each capital letter is one Qwen token.
IDENTIFIERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NONE_TEXT = "None of the above"
MAX_ALIASES = {"v1": 3, "v2": 5}  # aliases shown per item


@dataclass
class Alternative:
    """One item as the re-ranker sees it (ids are shown compact, e.g. wd:Q104123)."""

    iri: str
    shown_id: str
    label: str
    aliases: list[str] = field(default_factory=list)
    description: str = ""
    kind: str = "entity"  # "entity" or "property": the v2 prompt groups items by it


def to_alternative(item, variant: str | None = None, kind: str = "entity") -> Alternative:
    """A search.Item as the re-ranker sees it; a property is shown in the placeholder's variant (wdt:P19)."""
    try:
        shown = with_variant(item.id, variant) if variant else item.id
    except ValueError:  # the item is no Wikidata property (an entity, or another KG): show it as is
        shown = item.id
    return Alternative(
        iri=item.id,
        shown_id=compact(shown),
        label=item.label,
        aliases=list(item.aliases),
        description=item.description,
        kind=kind,
    )


def mark_current(text: str, ph) -> str:
    """The query with placeholder `ph` (a skeleton.Placeholder) written `<rep>label</rep>`: the one to re-rank."""
    return text[: ph.start] + "<rep>" + ph.text[len("<iri>") : -len("</iri>")] + "</rep>" + text[ph.end :]


def marked_placeholder(text: str) -> str:
    """What mark_current marked in `text` (a query or a whole re-ranking prompt): the inside of `<rep>...</rep>`."""
    return re.search(r"<rep>(.*?)</rep>", text).group(1)


def skeleton_messages(question: str) -> list[dict]:
    """Chat messages asking for the skeleton of `question`; the answer is the skeleton text."""
    return [
        {"role": "system", "content": SKELETON_SYSTEM},
        {"role": "user", "content": question.strip()},
    ]


def describe(alt: Alternative, show_infos: bool, prompt_format: str) -> str:
    """An item as one line (without identifier).
    v1: `Pulp Fiction (wd:Q104123): 1994 film ...; also known as a, b`; without infos `Pulp Fiction (wd:Q104123)`.
    v2: `Pulp Fiction (wd:Q104123), also known as "a", "b": 1994 film ...`; without infos the description
        is left out and the aliases stay (the reference's "drop infos")."""
    aliases = alt.aliases[: MAX_ALIASES[prompt_format]]
    line = f"{alt.label} ({alt.shown_id})"
    if prompt_format == "v1":
        infos = [alt.description] * bool(alt.description) + ["also known as " + ", ".join(aliases)] * bool(
            aliases
        )
        return line + (": " + "; ".join(infos) if show_infos and infos else "")
    if aliases:
        line += ", also known as " + ", ".join(f'"{a}"' for a in aliases)
    return line + (f": {alt.description}" if show_infos and alt.description else "")


def format_alternative(identifier: str, alt: Alternative, show_infos: bool, prompt_format: str = "v1") -> str:
    """One line of the alternatives list, e.g. `A. Pulp Fiction (wd:Q104123): 1994 film ...`."""
    return f"{identifier}. {describe(alt, show_infos, prompt_format)}"


def format_resolved(resolved: list[Alternative]) -> str:
    """v2: the items resolved so far, by kind, sorted by id (as the reference lists them), with infos."""
    groups = []
    for kind, header in (("entity", "Using entities:"), ("property", "Using properties:")):
        items = sorted((a for a in resolved if a.kind == kind), key=lambda a: a.shown_id)
        if items:
            groups.append(header + "\n" + "\n".join(f"- {describe(a, True, 'v2')}" for a in items))
    return "\n\n".join(groups)


def rerank_messages(
    question: str,
    marked_query: str,
    alternatives: list[Alternative],
    show_infos: bool = True,
    resolved: list[Alternative] = (),
    prompt_format: str = LATEST_PROMPT_FORMAT,
) -> tuple[list[dict], list[str]]:
    """Chat messages for re-ranking `alternatives` plus a final None alternative.

    `marked_query` is the query with earlier placeholders resolved, the current one written
    `<rep>label</rep>` and later ones still `<iri>label</iri>`; `resolved` are the items resolved so far
    (shown by v2 only). Returns the messages and the identifier of each alternative, in the order of
    `alternatives` (shown grouped by kind when both kinds are there, letters running down the list as
    shown), then the identifier of "None of the above".
    """
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {prompt_format!r}; known: {', '.join(PROMPT_FORMATS)}")
    if len(alternatives) + 1 > len(IDENTIFIERS):
        raise ValueError(f"at most {len(IDENTIFIERS) - 1} alternatives, got {len(alternatives)}")
    kinds = [alt.kind for alt in alternatives]
    grouped = prompt_format != "v1" and len(set(kinds)) > 1  # both kinds (a placeholder of unknown position)
    # letters run down the list as shown: by kind (in order of first appearance) when grouped
    kind_order = list(dict.fromkeys(kinds))
    shown = (
        sorted(range(len(alternatives)), key=lambda i: kind_order.index(kinds[i]))
        if grouped
        else range(len(alternatives))
    )
    letter = dict(zip(shown, IDENTIFIERS))
    identifiers = [letter[i] for i in range(len(alternatives))] + [IDENTIFIERS[len(alternatives)]]
    lines = [
        format_alternative(letter[i], alt, show_infos, prompt_format) for i, alt in enumerate(alternatives)
    ]
    none_line = f"{identifiers[-1]}. {NONE_TEXT}"
    if prompt_format == "v1":
        user = f"Question: {question.strip()}\nSPARQL: {marked_query}\nAlternatives:\n" + "\n".join(
            lines + [none_line]
        )
    else:
        parts = [f"Question:\n{question.strip()}", f"SPARQL:\n{marked_query}"]
        if resolved:
            parts.append(format_resolved(list(resolved)))
        if grouped:  # one group per kind
            parts += [
                f"{kind.capitalize()} alternatives:\n"
                + "\n".join(line for line, k in zip(lines, kinds) if k == kind)
                for kind in dict.fromkeys(kinds)
            ]
        else:
            parts.append("Alternatives:\n" + "\n".join(lines))
        parts.append(none_line)
        user = "\n\n".join(parts)
    messages = [
        {"role": "system", "content": RERANK_SYSTEM[prompt_format]},
        {"role": "user", "content": user},
    ]
    return messages, identifiers
