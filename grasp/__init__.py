"""The GRASP agent's library (agent.py at the root is its loop and command line): a chat model calls
functions over a SPARQL endpoint and the search indices until it can answer (docs/agent.md).

    functions.py      the functions (EXE, LST, SEN, SPR, SPE, SOP, FSE, FEX) and their definitions
    prompts.py        the agent's instructions, answer/cancel definitions, the feedback judge
    examples.py       the example index for FSE/FEX
    backends.py       chat models behind one protocol: an OpenAI-compatible HTTP API (OpenAIBackend)
    local_backend.py  our Qwen2.5 in-process with constrained tool calls (LocalBackend), streaming
    tool_grammar.py   the grammar of a call that fits the offered functions' schemas
    config.py         the agent's configuration (grasp.toml): knowledge graphs, model, agent, server
    evaluation.py     evaluate.py --system agent
"""
