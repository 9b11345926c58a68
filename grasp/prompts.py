"""What the GRASP agent tells its model: the system instruction of each task, the stopping functions
ANS / CAN, and the judge of GRASP-F (GRASP paper Section 3.1 and the demo's tasks; docs/agent.md).
Written in our own words after the authors' public instructions; only text, no logic.

    system_instruction("sparql-qa", kgs)                  # role, method, knowledge graphs, prefixes, rules
    task_definitions("sparql-qa", ["wikidata"])           # answer(kg, sparql, answer), cancel(explanation, ...)
    feedback_messages(questions, output_text(result, table))   # the judge's conversation: it calls give_feedback
"""

from grasp.functions import string_arg, tool_def

SPARQL_QA = """You are a question answering assistant. Your job is to find a SPARQL query that answers \
the user's question over the knowledge graphs below. You explore the knowledge graphs with the functions \
you are given.

Work step by step:
1. Think about which entities and properties the question needs.
2. Find them with the search functions. Where you already know an entity or property, search among its \
neighbours (search_property_of_entity, search_object_of_property).
3. Build the query gradually: execute small queries first, check their results, refine, and go back to \
step 2 when needed.
4. Finish with answer (the final query and a short answer) or, if you cannot find a query, cancel."""

GENERAL_QA = """You are a question answering assistant. Your job is to answer the user's question, using \
the knowledge graphs below: explore them with the functions you are given.

Work step by step:
1. Think about which information the question needs and how the knowledge graphs may hold it.
2. Find the entities and properties with the search functions.
3. Query the knowledge graphs to collect and check the information, refining as you go.
4. Finish with answer (your answer as text) or, if you cannot answer, cancel."""

RULES = {
    "sparql-qa": [
        "Execute your final query before you answer, and check that its result is plausible; if it is "
        "not, refine the query.",
        "The query must return the IRIs of the answer items; labels are optional.",
        "Do all filtering, counting, sorting and arithmetic in SPARQL, not in your answer.",
        "A yes/no question needs an ASK query.",
    ],
    "general-qa": [
        "Base your answer on what the knowledge graphs say; even if you know the answer, check it with them.",
    ],
}


def system_instruction(task: str, kgs: list, prefixes: dict[str, str]) -> str:
    """The instruction for `task` over the knowledge graphs `kgs` (grasp.functions.KnowledgeGraph)."""
    graphs = "\n".join(f"- {kg.name}: {kg.description or 'no description'}" for kg in kgs)
    declared = "\n".join(f"{name}: <{iri}>" for name, iri in prefixes.items())
    rules = "\n".join(f"{i}. {rule}" for i, rule in enumerate(RULES[task], start=1))
    return (
        f"{SPARQL_QA if task == 'sparql-qa' else GENERAL_QA}\n\nKnowledge graphs:\n{graphs}\n\n"
        f"These prefixes can be used in queries and function calls without declaring them:\n{declared}\n\n"
        f"Rules:\n{rules}"
    )


def task_definitions(task: str, kgs: list[str]) -> list[dict]:
    """ANS and CAN of the task (OpenAI tools format)."""
    if task == "general-qa":
        return [
            tool_def(
                "answer",
                "Give your final answer to the question. This ends the conversation.",
                {"answer": string_arg("the answer")},
            ),
            tool_def(
                "cancel",
                "Give up if you cannot answer the question. This ends the conversation.",
                {"explanation": string_arg("why you could not answer")},
                {"best_attempt": string_arg("your best answer so far, if any")},
            ),
        ]
    kg = {"kg": string_arg("the knowledge graph the query is for", kgs)}
    return [
        tool_def(
            "answer",
            "Give the final SPARQL query and a short answer to the question based on its result. "
            "This ends the conversation.",
            kg
            | {
                "sparql": string_arg("the final SPARQL query"),
                "answer": string_arg("the answer, in a few words"),
            },
        ),
        tool_def(
            "cancel",
            "Give up if you cannot find a SPARQL query that answers the question. This ends the "
            "conversation.",
            {"explanation": string_arg("why you could not find a query")},
            {
                "best_attempt": {
                    "type": "object",
                    "description": "your best query so far, if any",
                    "properties": kg | {"sparql": string_arg("the query")},
                    "required": ["kg", "sparql"],
                    "additionalProperties": False,
                }
            },
        ),
    ]


FEEDBACK_TOOL = tool_def(
    "give_feedback",
    "Judge the output of the question answering system. Status done: the output is correct "
    "and complete; refine: it is sensible but needs refinement; retry: it is wrong and must be reworked.",
    {
        "status": string_arg("your verdict", ["done", "refine", "retry"]),
        "feedback": string_arg("your reasons and, unless done, how to improve the output"),
    },
)

FEEDBACK_SYSTEM = """You check the output of a question answering system that answers questions over \
knowledge graphs with SPARQL queries. You are given the user's question and either the system's answer \
(its final SPARQL query, the knowledge graph, the query's result and a short answer) or its explanation \
why it gave up. Judge whether the output answers the question correctly and completely, then call \
give_feedback."""


def output_text(r, result: str) -> str:
    """What the judge reads about an agent.AgentResult: the answer, its query and `result` (the query's
    result as text), or the explanation of a cancel and its best attempt."""
    if r.status == "answer":
        query = f"\n\nSPARQL query over {r.kg}:\n```sparql\n{r.sparql}\n```\n\n{result}" if r.sparql else ""
        return f"The system answered: {r.answer}{query}"
    attempt = f"\n\nIts best attempt over {r.kg}:\n```sparql\n{r.sparql}\n```" if r.sparql else ""
    return f"The system gave up: {r.explanation}{attempt}"


def feedback_messages(questions: list[str], output: str, kgs: list) -> list[dict]:
    """The judge's conversation about `output` (text describing the answer or the cancel)."""
    graphs = "\n".join(f"- {kg.name}: {kg.description or 'no description'}" for kg in kgs)
    earlier = "".join(f"Earlier question: {q}\n" for q in questions[:-1])
    return [
        {"role": "system", "content": f"{FEEDBACK_SYSTEM}\n\nKnowledge graphs:\n{graphs}"},
        {"role": "user", "content": f"{earlier}Question: {questions[-1]}\n\n{output}"},
    ]
