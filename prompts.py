"""The two prompts GRISP trains and runs one model on (paper section 3; docs/method.md sections 3.3 and 2.5).

1. Skeleton generation: question -> SPARQL skeleton with `<iri>label</iri>` placeholders.
2. List-wise re-ranking: question + partially resolved query with the current placeholder marked
   `<rep>label</rep>` + lettered alternatives (plus "None of the above") -> one identifier letter.

Training (samples.py, for gen_data.py and train.py) and inference (grisp.py for skeletons, rerank.py
for re-ranking) both build their prompts here, so the model always sees exactly the text it was
trained on. Prompts are chat messages; tokenizer.chat_prompt turns them into Qwen's chat format.
"""
from dataclasses import dataclass, field

from skeleton import with_variant
from sparql_syntax import compact

SKELETON_SYSTEM = (
    "You translate questions into SPARQL queries over the Wikidata knowledge graph. "
    "Write every knowledge graph IRI as a placeholder <iri>name</iri> holding its label; "
    "end property placeholders with their variant in brackets, e.g. <iri>place of birth (wdt)</iri>. "
    "Do not write PREFIX lines."
)

RERANK_SYSTEM = (
    "You select the knowledge graph item that replaces the placeholder marked <rep>...</rep> "
    "in a SPARQL query for a question. Answer with the letter of the best alternative, "
    "or the letter of \"None of the above\" if no alternative fits."
)

# Single-token identifiers for the alternatives: each capital letter is one Qwen token.
IDENTIFIERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NONE_TEXT = "None of the above"
MAX_ALIASES = 3  # aliases shown per alternative


@dataclass
class Alternative:
    """One search result as the re-ranker sees it (ids are shown compact, e.g. wd:Q104123)."""

    iri: str
    shown_id: str
    label: str
    aliases: list[str] = field(default_factory=list)
    description: str = ""


def to_alternative(item, variant: str | None = None) -> Alternative:
    """A search.Item as the re-ranker sees it; a property is shown in the placeholder's variant (wdt:P19)."""
    try:
        shown = with_variant(item.id, variant) if variant else item.id
    except ValueError:  # the item is no Wikidata property (an entity, or another KG): show it as is
        shown = item.id
    return Alternative(iri=item.id, shown_id=compact(shown), label=item.label, aliases=list(item.aliases),
                       description=item.description)


def mark_current(text: str, ph) -> str:
    """The query with placeholder `ph` (a skeleton.Placeholder) written `<rep>label</rep>`: the one to re-rank."""
    return text[:ph.start] + "<rep>" + ph.text[len("<iri>"):-len("</iri>")] + "</rep>" + text[ph.end:]


def skeleton_messages(question: str) -> list[dict]:
    """Chat messages asking for the skeleton of `question`; the answer is the skeleton text."""
    return [
        {"role": "system", "content": SKELETON_SYSTEM},
        {"role": "user", "content": question.strip()},
    ]


def format_alternative(identifier: str, alt: Alternative, show_infos: bool) -> str:
    """One line of the alternatives list, e.g. `A. Pulp Fiction (wd:Q104123): 1994 film ...`."""
    line = f"{identifier}. {alt.label} ({alt.shown_id})"
    if show_infos:
        infos = []
        if alt.description:
            infos.append(alt.description)
        if alt.aliases:
            infos.append("also known as " + ", ".join(alt.aliases[:MAX_ALIASES]))
        if infos:
            line += ": " + "; ".join(infos)
    return line


def rerank_messages(
    question: str, marked_query: str, alternatives: list[Alternative], show_infos: bool = True
) -> tuple[list[dict], list[str]]:
    """Chat messages for re-ranking `alternatives` plus a final None alternative.

    `marked_query` is the query with earlier placeholders resolved, the current one written
    `<rep>label</rep>` and later ones still `<iri>label</iri>`. Returns the messages and the
    identifiers in order; the last identifier stands for "None of the above".
    """
    if len(alternatives) + 1 > len(IDENTIFIERS):
        raise ValueError(f"at most {len(IDENTIFIERS) - 1} alternatives, got {len(alternatives)}")
    identifiers = list(IDENTIFIERS[: len(alternatives) + 1])
    lines = [format_alternative(i, alt, show_infos) for i, alt in zip(identifiers, alternatives)]
    lines.append(f"{identifiers[-1]}. {NONE_TEXT}")
    user = (
        f"Question: {question.strip()}\n"
        f"SPARQL: {marked_query}\n"
        f"Alternatives:\n" + "\n".join(lines)
    )
    messages = [{"role": "system", "content": RERANK_SYSTEM}, {"role": "user", "content": user}]
    return messages, identifiers
