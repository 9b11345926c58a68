"""The GRASP agent's configuration: one file (TOML or JSON), defaults for everything, environment overrides.

In the spirit of GRASP's single YAML file (docs/agent.md): the knowledge graphs (name, SPARQL endpoint,
index directory, description, extra prefixes, an optional example set for few-shot functions), the
model backend, the agent's options and serve.py's `[server]` table. Read by agent.py, evaluate.py
(`--system agent`) and serve.py, so the web page, its agent mode and the command line see the same graphs.

    config = load_config("grasp.toml")      # or load_config() for the defaults (the demo KG, local model)
    config.knowledge_graphs[0].endpoint, config.model.backend, config.agent.max_steps, config.server.port
    config.model = override(config.model, model_dir=args.model_dir)   # a flag given (not None) wins

Precedence: dataclass defaults < the file (path argument, else $GRASP_CONFIG) < environment variables
GRASP_MODEL_<FIELD>, GRASP_AGENT_<FIELD>, GRASP_SERVER_<FIELD>, GRASP_KG_<NAME>_<FIELD> (e.g.
GRASP_MODEL_BACKEND=openai, GRASP_AGENT_MAX_STEPS=10, GRASP_KG_WIKIDATA_ENDPOINT=http://...) <
command-line flags of the scripts (`override`).
The API key is never in the file: `api_key_env` names the environment variable that holds it.
"""

import json
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import get_type_hints

from common import defaults
from grasp.backends import OpenAIBackend

TASKS = ("sparql-qa", "general-qa")
BACKENDS = ("local", "openai")


class ConfigError(ValueError):
    """A configuration the user can fix; the message names the file, key and value."""


@dataclass
class KgConfig:
    name: str  # what the model calls it (the `kg` argument of every function)
    endpoint: str = defaults.ENDPOINT_URL  # SPARQL endpoint URL
    index: str | None = str(defaults.DEMO_INDEX_DIR)  # build_index.py output; None: no search functions
    description: str = ""  # one line for the system instruction
    prefixes: dict = field(default_factory=dict)  # extra prefixes beyond sparql_syntax.PREFIXES
    examples: str | None = None  # question-SPARQL pairs for FSE/FEX: a benchmark name or a JSONL file
    example_index: str | None = (
        None  # where their embedding index lives (default GRISP_HOME/examples/<examples>)
    )


@dataclass
class ModelConfig:
    backend: str = "local"  # "local" (our model in-process) or "openai" (any OpenAI-compatible API)
    temperature: float | None = None  # None: greedy (local), the server's default (openai)
    # local backend
    model_dir: str = str(defaults.MODEL_DIR)
    adapter: str | None = str(
        defaults.AGENT_ADAPTER_DIR
    )  # a LoRA adapter (PEFT layout) on model_dir; None: base model
    device: str = "auto"
    # auto: bfloat16 where the CPU has native bf16, else float32; or float32, bfloat16, int8, fp16-weights
    precision: str = "auto"
    max_reasoning_tokens: int = 128  # free text before a call, per turn
    max_call_tokens: int = 768  # tokens of one constrained call
    # OpenAI-compatible backend
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""  # the model name the server expects
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key ("" for none)
    timeout_s: float = 120.0
    tool_choice: str = "auto"  # "auto" or "required" (the local backend always requires a call)


@dataclass
class AgentConfig:
    task: str = "sparql-qa"  # or "general-qa": the answer is text, not a query
    know_before_use: bool = True  # EXE/ANS refuse IRIs no earlier function result showed
    feedback: bool = False  # GRASP-F: a second pass judges the answer and may send the agent back
    max_feedbacks: int = 2
    max_steps: int = 30  # model turns per question
    max_loops: int = (
        1  # turns that only repeat earlier calls the model may make (it is told); then the run stops
    )
    time_limit_s: float = 300.0  # per question, model and functions together
    search_top_k: int = 10  # results of SEN, SPR, SPE, SOP
    list_k: int = 10  # triples shown by LST
    result_max_rows: int = 10  # EXE tables: first and last half of the rows
    result_max_columns: int = 10  # and of the columns
    num_examples: int = 3  # FSE / FEX
    force_examples: str | None = None  # a KG name: start every question with an FSE (or FEX) call on it
    random_examples: bool = False  # FEX (random examples) instead of FSE (similar ones)
    sparql_timeout_s: float = 30.0  # per query the functions send
    seed: int = 0  # of FEX's random choice


@dataclass
class ServerConfig:
    """serve.py: where it listens, its queue and limits, and GRISP's side of the page."""

    host: str = "127.0.0.1"  # 0.0.0.0 exposes the server to the network
    port: int = 8000
    max_waiting: int = 8  # jobs (questions, agent runs, chat completions) that may wait; more get 503
    time_limit_s: float = (
        120.0  # per GRISP question and per chat completion; an agent run has agent.time_limit_s
    )
    kg: str | None = None  # the knowledge graph GRISP answers over (its endpoint and index); None: the first
    adapter: str | None = str(
        defaults.ADAPTER_DIR
    )  # GRISP's LoRA adapter on model.model_dir; None: the base model
    examples: str | None = str(defaults.DEMO_DIR / "questions.jsonl")  # the page's example questions (JSONL)
    agent: bool = True  # the page's agent mode and /v1/chat/completions (the local backend loads its model)
    threads: int = 0  # torch CPU threads (0: torch's default)


@dataclass
class Config:
    knowledge_graphs: list[KgConfig] = field(
        default_factory=lambda: [
            KgConfig(
                "wikidata",
                description="a small subset of Wikidata (films, their directors, cast, writers and "
                "composers, people, places, awards); Wikidata IRIs and prefixes",
            )
        ]
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    source: str | None = None  # the file it came from

    def kg(self, name: str) -> KgConfig:
        for kg in self.knowledge_graphs:
            if kg.name == name:
                return kg
        names = ", ".join(k.name for k in self.knowledge_graphs)
        raise ConfigError(f"no knowledge graph {name!r}; configured: {names}")


def convert(value, typ, where: str):
    """`value` (from a file or an environment string) as the field type `typ`; ConfigError if it is not."""
    optional = str(typ).endswith("| None")
    base = {"str | None": str, "float | None": float}.get(str(typ), typ)
    if value is None or (
        optional and isinstance(value, str) and value.strip().lower() in ("", "none", "null")
    ):
        if optional:
            return None
        raise ConfigError(f"{where} must be set")
    if base is bool:
        if isinstance(value, str) and value.strip().lower() in (
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        ):
            return value.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(value, bool):
            return value
    elif base in (int, float) and not isinstance(value, bool):
        try:
            number = base(value)
            if base is int and isinstance(value, float) and value != number:
                raise ValueError
            return number
        except (TypeError, ValueError):
            pass
    elif base is str and isinstance(value, (str, Path)):
        return str(value)
    elif base is dict and isinstance(value, dict):
        return value
    name = getattr(base, "__name__", str(base))
    raise ConfigError(f"{where} must be {name}{' or none' if optional else ''}, not {value!r}")


def _section(cls, values: dict, where: str, base_dir: Path | None):
    """A dataclass from a dict of file values, with unknown keys and bad types named."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a table of settings, not {values!r}")
    hints, names = get_type_hints(cls), [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(names)}")
    out = {key: convert(value, hints[key], f"{where}.{key}") for key, value in values.items()}
    for key in ("index", "example_index", "model_dir", "adapter"):  # paths: ~ and relative to the file
        if out.get(key) and not str(out[key]).startswith(("http://", "https://")):
            path = Path(out[key]).expanduser()
            out[key] = str(path if path.is_absolute() or base_dir is None else base_dir / path)
    return out


def _from_env(obj, prefix: str, env: dict):
    """`obj` with the fields that have a PREFIX<FIELD> environment variable replaced."""
    hints = get_type_hints(type(obj))
    changes = {}
    for f in fields(obj):
        key = prefix + f.name.upper()
        if key in env and f.name not in ("name", "prefixes"):
            changes[f.name] = convert(env[key], hints[f.name], f"${key}")
    return replace(obj, **changes)


def load_config(path: str | Path | None = None, env: dict | None = None) -> Config:
    """The configuration from `path` (else $GRASP_CONFIG, else the defaults) with environment overrides."""
    env = dict(os.environ if env is None else env)
    path = path or env.get("GRASP_CONFIG")
    data, base_dir = {}, None
    if path:
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist (see grasp.toml for an example)")
        try:
            data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(
                f"{path} is not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {e}"
            ) from None
        base_dir = path.parent
        unknown = sorted(set(data) - {"knowledge_graphs", "model", "agent", "server"})
        if unknown:
            raise ConfigError(
                f"{path}: unknown section(s) {', '.join(unknown)}; "
                f"known: knowledge_graphs, model, agent, server"
            )
    config = Config(source=str(path) if path else None)
    if "knowledge_graphs" in data:
        kgs = data["knowledge_graphs"]
        if not isinstance(kgs, list) or not kgs:
            raise ConfigError(
                f"{path}: knowledge_graphs must be a non-empty list of tables ([[knowledge_graphs]])"
            )
        config.knowledge_graphs = []
        for i, kg in enumerate(kgs):
            if not isinstance(kg, dict) or not kg.get("name"):
                raise ConfigError(f"{path}: knowledge_graphs[{i}] needs a name")
            config.knowledge_graphs.append(
                KgConfig(**_section(KgConfig, kg, f"knowledge_graphs[{i}]", base_dir))
            )
    config.model = ModelConfig(**_section(ModelConfig, data.get("model", {}), "model", base_dir))
    config.agent = AgentConfig(**_section(AgentConfig, data.get("agent", {}), "agent", base_dir))
    config.server = ServerConfig(**_section(ServerConfig, data.get("server", {}), "server", base_dir))
    # --- environment overrides
    sections = {"GRASP_MODEL_": "model", "GRASP_AGENT_": "agent", "GRASP_SERVER_": "server"}
    for prefix, name in sections.items():
        setattr(config, name, _from_env(getattr(config, name), prefix, env))
    config.knowledge_graphs = [
        _from_env(kg, f"GRASP_KG_{kg.name.upper().replace('-', '_')}_", env) for kg in config.knowledge_graphs
    ]
    for key in env:
        prefix = next((p for p in sections if key.startswith(p)), None)
        if prefix is not None:
            known = [f.name for f in fields(getattr(config, sections[prefix]))]
            if key[len(prefix) :].lower() not in known:
                raise ConfigError(f"${key} names no setting; known: {', '.join(known)}")
    check(config)
    return config


def override(section, **values):
    """`section` (config.model, .agent, .server or a KgConfig) with the command-line flags that were
    given (not None), converted to the fields' types ("none" clears an optional field)."""
    hints = get_type_hints(type(section))
    return replace(
        section,
        **{
            key: convert(value, hints[key], "--" + key.replace("_", "-"))
            for key, value in values.items()
            if value is not None
        },
    )


def unset_flag(section: str, name: str) -> str:
    """What a script's flag left unset takes, for its --help: "(config [model] backend, default local)"."""
    default = getattr({"model": ModelConfig, "agent": AgentConfig, "server": ServerConfig}[section], name)
    return f"(config [{section}] {name}, default {default})"


def check(config: Config) -> None:
    """Raise ConfigError naming every bad value (closed sets, positive limits, unique KG names)."""
    a, m, srv = config.agent, config.model, config.server
    names = [kg.name for kg in config.knowledge_graphs]
    problems = [
        msg
        for ok, msg in [
            (m.backend in BACKENDS, f"model.backend = {m.backend!r} must be one of {', '.join(BACKENDS)}"),
            (
                m.backend != "openai" or bool(m.model),
                "model.model (the name the server expects) must be set for the openai backend",
            ),
            (
                m.tool_choice in ("auto", "required"),
                f"model.tool_choice = {m.tool_choice!r} must be auto or required",
            ),
            (a.task in TASKS, f"agent.task = {a.task!r} must be one of {', '.join(TASKS)}"),
            (a.max_steps >= 1, f"agent.max_steps = {a.max_steps} must be >= 1"),
            (a.time_limit_s > 0, f"agent.time_limit_s = {a.time_limit_s} must be > 0"),
            (
                a.max_feedbacks >= 0 and a.max_loops >= 0,
                "agent.max_feedbacks and agent.max_loops must be >= 0",
            ),
            (
                min(a.search_top_k, a.list_k, a.result_max_rows, a.result_max_columns, a.num_examples) >= 1,
                "agent.search_top_k, list_k, result_max_rows, result_max_columns and num_examples must be >= 1",
            ),
            (len(set(names)) == len(names), f"knowledge graph names must be unique: {names}"),
            (
                a.force_examples is None or a.force_examples in names,
                f"agent.force_examples = {a.force_examples!r} must name a knowledge graph ({', '.join(names)})",
            ),
            (
                srv.kg is None or srv.kg in names,
                f"server.kg = {srv.kg!r} must name a knowledge graph ({', '.join(names)})",
            ),
            (0 <= srv.port <= 65535, f"server.port = {srv.port} must be in [0, 65535]"),
            (srv.max_waiting >= 0, f"server.max_waiting = {srv.max_waiting} must be >= 0"),
            (srv.time_limit_s > 0, f"server.time_limit_s = {srv.time_limit_s} must be > 0"),
            (srv.threads >= 0, f"server.threads = {srv.threads} must be >= 0 (0: torch's own choice)"),
        ]
        if not ok
    ]
    for kg in config.knowledge_graphs:
        if not kg.endpoint.startswith(("http://", "https://")):
            problems.append(
                f"knowledge graph {kg.name}: endpoint {kg.endpoint!r} must start with http:// or https://"
            )
    if problems:
        where = f" in {config.source}" if config.source else ""
        raise ConfigError(f"bad configuration{where}: " + "; ".join(problems))


def make_backend(model_config):
    """The chat backend a ModelConfig describes (grasp/backends.py; the API key comes from the environment)."""
    m = model_config
    if m.backend == "openai":
        return OpenAIBackend(
            m.base_url,
            m.model,
            os.environ.get(m.api_key_env) if m.api_key_env else None,
            m.timeout_s,
            m.temperature,
            m.tool_choice,
        )
    if m.backend == "local":
        from grasp.local_backend import LocalBackend  # torch and the model stack only for this backend

        return LocalBackend(
            m.model_dir,
            m.adapter,
            m.device,
            m.precision,
            m.max_reasoning_tokens,
            m.max_call_tokens,
            temperature=m.temperature,
        )
    raise ValueError(f"unknown backend {m.backend!r}; use 'local' or 'openai'")
