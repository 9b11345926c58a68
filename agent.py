"""GRASP: a language model answers questions over any SPARQL knowledge graph zero-shot, by exploring it
with function calls until it finds a query whose result answers the question (GRASP paper and demo;
docs/agent.md). Library (Agent, build_agent) and command line.

The loop: system instruction + question -> model turn (text and function calls, grasp/backends.py) ->
results back (grasp/functions.py) -> ... until the model calls answer (ANS) or cancel (CAN), or stops
calling functions, or the step or time limit is reached. know_before_use refuses queries with IRIs no
earlier result showed; with feedback (GRASP-F) a second pass judges the output and may send the agent
back (at most max_feedbacks times). Follow-up questions carry the earlier turns (`past`).

    python agent.py "Who directed Pulp Fiction?"                 # local model, demo KG, trace printed
    python agent.py --backend openai --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct "..."
    python agent.py --file questions.jsonl --out answers.jsonl   # {"question": ...} per line
    python agent.py --follow-up "Who directed Pulp Fiction?"     # then more questions from stdin, same conversation

About 455 lines, over a library's ~350: the loop (~310, Agent.run -> _turns -> _model_turn, _handle_call)
and its command line (~120) stay in one file, the library beside the command that runs it.
"""

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import defaults
from common.jsonl import append_jsonl, read_jsonl
from grasp.backends import BackendCancelled, BackendError, BackendTimeout, ToolCall
from grasp.config import ConfigError, check, load_config, make_backend, override, unset_flag
from grasp.functions import FunctionError, Functions, KnowledgeGraph, check_known, table
from grasp.prompts import FEEDBACK_TOOL, feedback_messages, output_text, system_instruction, task_definitions
from grisp.sparql import SparqlClient, SparqlError

FAILURE = {
    "answer": None,
    "cancel": "dead_end",
    "no_answer": "dead_end",
    "loop": "dead_end",  # as evaluate.py
    "step_limit": "timeout",
    "time_limit": "timeout",
    "error": "error",
    "cancelled": "error",
}  # counts failures


LOOP_WARNING = (
    "You repeated an earlier call exactly. Change your approach to make progress."  # ours, not the user's
)


def arguments_object(text: str) -> dict:
    """A call's arguments as sent (JSON text): the object, or {} for anything else (a malformed call)."""
    try:
        args = json.loads(text or "{}")
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {}


def not_run(call_id: str, step: int) -> dict:
    """The tool message for a call that repeats the call of `step` (so the chat stays valid for `past`)."""
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": f"Not run: the same call as in step {step}; its result is above.",
    }


@dataclass
class AgentResult:
    question: str
    task: str
    status: str  # answer, cancel, no_answer, loop, step_limit, time_limit, error, cancelled
    sparql: str | None = None  # the answer's query, else cancel's best attempt, else the last one executed
    kg: str | None = None
    answer: str | None = None  # the answer text (general-qa: the answer itself)
    explanation: str | None = None  # cancel's reason
    error: str | None = None
    messages: list[dict] = field(default_factory=list)  # the whole conversation (OpenAI format)
    known: set[str] = field(default_factory=set)
    trace: list[dict] = field(default_factory=list)
    steps: int = 0
    calls: Counter = field(default_factory=Counter)
    feedbacks: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # model, functions, total (seconds)

    @property
    def failure(self) -> str | None:
        return FAILURE[self.status]

    def past(self) -> dict:
        """What a follow-up question needs (JSON-serialisable): `agent.run(q, past=result.past())`."""
        return {"messages": self.messages, "known": sorted(self.known)}


class Agent:
    def __init__(self, kgs: dict[str, KnowledgeGraph], backend, options):
        self.kgs, self.backend, self.o = kgs, backend, options  # options: config.AgentConfig

    def run(
        self,
        question: str,
        task: str | None = None,
        kgs: list[str] | None = None,
        past=None,
        on_event=None,
        cancel=None,
    ) -> AgentResult:
        """Answer `question` over the knowledge graphs `kgs` (default all). `past`: a result's past() (or
        its message list); `on_event(event)` sees each trace event as it happens; `cancel` (a
        threading.Event) stops the run between steps (and a backend that raises BackendCancelled, during
        a model turn)."""
        task, start = task or self.o.task, time.monotonic()
        deadline = start + self.o.time_limit_s
        names = kgs or list(self.kgs)
        unknown = [n for n in names if n not in self.kgs]
        if unknown or task not in ("sparql-qa", "general-qa") or not question.strip():
            raise ValueError(
                f"bad question, task {task!r} or knowledge graphs {unknown} "
                f"(configured: {', '.join(self.kgs)})"
            )
        functions, tools, system = self.conversation(task, names)
        past_messages, known = (
            (past.get("messages", []), set(past.get("known", [])))
            if isinstance(past, dict)
            else (list(past or []), set())
        )
        r = AgentResult(question, task, "no_answer", known=known)
        r.timings = {"model": 0.0, "functions": 0.0}

        def emit(event, /, **fields):
            r.trace.append({"event": event, **fields})
            if on_event is not None:
                on_event(r.trace[-1])

        # --- the conversation: the current instruction, earlier turns unchanged, the question
        messages = [
            system,
            *[m for m in past_messages if m["role"] != "system"],
            {"role": "user", "content": question},
        ]
        r.messages, first = messages, len(messages) - 1  # this question's turns start at `first`
        emit(
            "question",
            question=question,
            task=task,
            kgs=", ".join(names),
            backend=getattr(self.backend, "name", ""),
        )
        if not past_messages:
            self._force_examples(r, messages, functions, names, question, deadline, emit)
        # --- model turns until answer / cancel, a turn without calls, or a limit; then the output
        self._turns(r, messages, first, names, functions, tools, start, deadline, emit, cancel)
        self._output(r, messages[first:])
        r.timings["total"] = time.monotonic() - start
        emit(
            "output",
            status=r.status,
            kg=r.kg,
            sparql=r.sparql,
            answer=r.answer,
            explanation=r.explanation,
            steps=r.steps,
            seconds=round(r.timings["total"], 2),
        )
        return r

    def _force_examples(self, r, messages, functions, names, question, deadline, emit) -> None:
        """With force_examples naming one of `names` that has examples, a first call of find_similar_examples
        (or find_examples) made for the model, as if it had made it (a new conversation only)."""
        forced = self.o.force_examples
        if forced in names and self.kgs[forced].examples is not None:
            name = "find_examples" if self.o.random_examples else "find_similar_examples"
            args = {"kg": forced} | ({} if self.o.random_examples else {"question": question})
            forced_call = ToolCall.made("call_examples", name, args)
            messages.append({"role": "assistant", "content": "", "tool_calls": [forced_call.message()]})
            self._call(r, messages, functions, "call_examples", name, args, deadline, emit)

    def _turns(self, r, messages, first, names, functions, tools, start, deadline, emit, cancel) -> None:
        """The loop: model turns, each call answered, until an answer or cancel call (unless the judge sends
        the agent back), a turn without calls, too many repeated turns, cancel, or a limit (r.status)."""
        made, loops = (
            {},
            0,
        )  # the calls run so far (name and arguments -> step, and for a failed one the number of
        # known IRIs then), and how many times the model only repeated them
        while not self._stopped(r, start, deadline, cancel, emit):
            reply = self._model_turn(r, messages, tools, deadline, emit)
            if reply is None:
                break
            # a call made before is not run again: its result is in the conversation already (GRASP's loop
            # check, widened from the turn before to the whole question: small models also cycle)
            # (a call that failed counts as made until the known IRIs grow: know_before_use's fix is to look first)
            keys = [json.dumps([c.name, c.arguments], sort_keys=True) for c in reply.tool_calls]
            repeats = {
                i: made[k][0]
                for i, (c, k) in enumerate(zip(reply.tool_calls, keys))
                if not c.error and k in made and made[k][1] in (None, len(r.known))
            }
            if reply.tool_calls and len(repeats) == len(reply.tool_calls):  # nothing new: a loop
                loops += 1
                emit(
                    "loop",
                    step=r.steps,
                    loops=loops,
                    repeats=", ".join(f"step {s}" for s in repeats.values()),
                )
                messages += [
                    not_run(c.id, repeats[i]) for i, c in enumerate(reply.tool_calls)
                ]  # every call is answered
                if loops > self.o.max_loops:
                    r.status, r.error = "loop", f"the model kept repeating earlier calls ({loops} times)"
                    break
                messages.append({"role": "user", "content": LOOP_WARNING})
                continue
            stop = not reply.tool_calls
            if stop:
                emit("no_call", step=r.steps)
            for i, call in enumerate(reply.tool_calls):  # by position: a remote model may reuse an id
                ran = self._handle_call(r, messages, functions, call, repeats.get(i), deadline, emit)
                if ran is not None:
                    ends, failed = ran
                    stop |= ends
                    made[keys[i]] = (r.steps, len(r.known) if failed else None)
            if not stop:
                continue
            if not (self.o.feedback and r.feedbacks < self.o.max_feedbacks) or not self._feedback(
                r, messages, first, names, deadline, emit
            ):
                break
            made = {}  # sent back: any call may be made again, answering the same included

    def _stopped(self, r: AgentResult, start: float, deadline: float, cancel, emit) -> bool:
        """Whether the run stops before the next model turn: cancelled, or at the step or time limit
        (r.status says which)."""
        if cancel is not None and cancel.is_set():
            r.status = "cancelled"
            emit("cancelled")
            return True
        if r.steps >= self.o.max_steps or time.monotonic() >= deadline:
            r.status = "step_limit" if r.steps >= self.o.max_steps else "time_limit"
            emit("limit", kind=r.status, steps=r.steps, seconds=round(time.monotonic() - start, 2))
            return True
        return False

    def _model_turn(self, r: AgentResult, messages: list[dict], tools: list[dict], deadline: float, emit):
        """One model turn, appended to `messages` and counted as a step: the backend's reply, or None when
        the backend failed or was cancelled (r.status and r.error say so)."""
        try:
            reply = self.backend.chat(messages, tools, deadline)
        except BackendCancelled:  # stopped during generation (serve.py's cancel reaches the local model)
            r.status = "cancelled"
            emit("cancelled", during="generation")
            return None
        except BackendError as e:
            r.status, r.error = ("time_limit" if isinstance(e, BackendTimeout) else "error"), str(e)
            emit("backend_error", error=str(e), timeout=isinstance(e, BackendTimeout))
            return None
        r.steps += 1
        r.timings["model"] += reply.seconds
        emit(
            "model",
            step=r.steps,
            content=reply.content,
            calls=", ".join(c.name for c in reply.tool_calls),
            seconds=round(reply.seconds, 2),
            notes="; ".join(reply.notes),
        )
        messages.append(
            {
                "role": "assistant",
                "content": reply.content,
                **({"tool_calls": [c.message() for c in reply.tool_calls]} if reply.tool_calls else {}),
            }
        )
        return reply

    def _handle_call(
        self, r, messages, functions, call: ToolCall, repeat_of: int | None, deadline, emit
    ) -> tuple[bool, bool] | None:
        """Answer one call of a model turn in `messages`: a malformed one with its error, one that repeats
        the call of step `repeat_of` with a pointer to that result, any other by running it (_call).
        Returns _call's (ends the conversation, failed) for a call that ran, else None."""
        if call.error:
            r.calls["malformed"] += 1
            emit("malformed_call", step=r.steps, name=call.name, raw=call.raw, error=call.error)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": f"Error: {call.error}. Call the function again, correctly.",
                }
            )
            return None
        if repeat_of is not None:
            messages.append(not_run(call.id, repeat_of))
            return None
        return self._call(r, messages, functions, call.id, call.name, call.arguments, deadline, emit)

    def conversation(self, task: str, names: list[str]) -> tuple[Functions, list[dict], dict]:
        """What a conversation over the knowledge graphs `names` starts from: their functions, the tool
        definitions (with the task's answer and cancel) and the system message."""
        functions = Functions({n: self.kgs[n] for n in names}, self.o)
        tools = functions.definitions() + task_definitions(task, names)
        prefixes = {k: v for n in names for k, v in self.kgs[n].prefixes.items()}
        system = {
            "role": "system",
            "content": system_instruction(task, [self.kgs[n] for n in names], prefixes),
        }
        return functions, tools, system

    def _call(self, r, messages, functions, call_id, name, args, deadline, emit) -> tuple[bool, bool]:
        """Run one function call, append its result; (whether it ends the conversation (ANS / CAN), whether
        it failed)."""
        start, stop = time.monotonic(), False
        r.calls[name] += 1
        try:
            if time.monotonic() >= deadline:
                raise FunctionError("not run: the time limit is reached")
            if name in ("answer", "cancel"):  # with know_before_use, their query is checked like EXE's
                best = args.get("best_attempt") if isinstance(args.get("best_attempt"), dict) else {}
                kg, sparql = (
                    (args.get("kg"), args.get("sparql"))
                    if name == "answer"
                    else (best.get("kg"), best.get("sparql"))
                )
                if self.o.know_before_use and sparql and r.task == "sparql-qa":
                    check_known(functions.kg(kg), sparql, r.known)
                result, stop = "Stopping.", True
            else:
                result = functions.call(name, args, r.known, deadline)
        except FunctionError as e:
            result, failed = f"Error: {e}", True
        else:
            failed = False
        seconds = time.monotonic() - start
        r.timings["functions"] += seconds
        emit(
            "call",
            step=r.steps,
            name=name,
            arguments=json.dumps(args, ensure_ascii=False),
            result=result,
            seconds=round(seconds, 2),
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        return stop, failed

    def _output(self, r: AgentResult, turns: list[dict]) -> None:
        """The last answer or cancel of this question (after the last feedback), else fallbacks: a ```sparql
        block of the last text, else the last executed query (as GRASP does)."""
        turns = turns[
            max(i for i, m in enumerate(turns) if m["role"] == "user" and m["content"] != LOOP_WARNING) :
        ]
        calls = [
            (c["function"]["name"], arguments_object(c["function"]["arguments"]))
            for m in turns
            if m.get("tool_calls")
            for c in m["tool_calls"]
        ]
        results = [m["content"] for m in turns if m["role"] == "tool"]
        done = [
            (n, a) for (n, a), res in zip(calls, results) if n in ("answer", "cancel") and res == "Stopping."
        ]
        if done:
            name, args = done[-1]
            if name == "answer":
                r.status, r.answer, r.kg, r.sparql = (
                    "answer",
                    args.get("answer"),
                    args.get("kg"),
                    args.get("sparql"),
                )
            else:
                best = args.get("best_attempt")
                r.status, r.explanation = "cancel", args.get("explanation")
                r.sparql, r.kg = (
                    (best.get("sparql"), best.get("kg")) if isinstance(best, dict) else (None, None)
                )
                r.answer = best if isinstance(best, str) else None
            return
        if r.task != "sparql-qa":
            return
        text = next((m["content"] for m in reversed(turns) if m["role"] == "assistant" and m["content"]), "")
        if "```sparql" in text:
            r.sparql = text.split("```sparql", 1)[1].split("```")[0].strip()
        else:
            executed = [a for n, a in calls if n == "execute" and "sparql" in a]
            r.sparql, r.kg = (executed[-1]["sparql"], executed[-1].get("kg")) if executed else (None, None)

    def _feedback(
        self, r: AgentResult, messages: list[dict], first: int, names: list[str], deadline: float, emit
    ) -> bool:
        """GRASP-F: a judge looks at the output; True if it sends the agent back (status refine / retry)."""
        self._output(r, messages[first:])
        if r.status not in ("answer", "cancel"):
            return False
        result = self.result_text(r, deadline) if r.status == "answer" and r.sparql else ""
        questions = [
            m["content"]
            for m in messages
            if m["role"] == "user"
            and not m["content"].startswith("Feedback")
            and m["content"] != LOOP_WARNING
        ]
        judged = feedback_messages(questions, output_text(r, result), [self.kgs[n] for n in names])
        try:
            reply = self.backend.chat(judged, [FEEDBACK_TOOL], deadline, tool_choice="required")
        except BackendError as e:
            emit("feedback_error", error=str(e))
            return False
        good = [c for c in reply.tool_calls if c.name == "give_feedback" and not c.error]
        if not good:
            emit("feedback_error", error="the judge gave no valid give_feedback call", content=reply.content)
            return False
        status, text = good[0].arguments["status"], good[0].arguments["feedback"]
        emit("feedback", status=status, feedback=text, seconds=round(reply.seconds, 2))
        r.timings["model"] += reply.seconds
        if status == "done":
            return False
        r.feedbacks += 1
        r.status, r.sparql, r.kg, r.answer, r.explanation = (
            "no_answer",
            None,
            None,
            None,
            None,
        )  # a new output is due
        messages.append({"role": "user", "content": f"Feedback on your output ({status}):\n{text}"})
        return True

    def result_text(self, r: AgentResult, deadline: float) -> str:
        """The output's query run again, as a table (for the judge and the command line)."""
        kg = self.kgs.get(r.kg)
        if kg is None:
            return ""
        try:
            result = kg.query(r.sparql, deadline, self.o.sparql_timeout_s)
        except (SparqlError, FunctionError) as e:
            return f"Executing it failed: {e}"
        if result.boolean is not None:
            return f"Its result: {'yes' if result.boolean else 'no'}"
        return (
            "Its result: "
            + table(
                kg, result.variables, result.rows, set(), self.o.result_max_rows, self.o.result_max_columns
            )
            if result.rows
            else "Its result: no rows"
        )


def build_agent(config) -> Agent:
    """The knowledge graphs and the backend of a config.Config."""
    try:
        kgs = {k.name: KnowledgeGraph.from_config(k) for k in config.knowledge_graphs}
    except FunctionError as e:
        raise ConfigError(str(e)) from None
    return Agent(kgs, make_backend(config.model), config.agent)


# ---------------------------------------------------------------------------- command line


def event_text(e: dict) -> str:
    """A trace event for people: model turns, calls with their results (cut), feedback, limits."""
    kind, lines = e["event"], str(e.get("result", "")).splitlines()
    if kind == "question":
        return f"question: {e['question']}  [{e['task']} over {e['kgs']}; {e['backend']}]"
    if kind == "model":
        return (
            f"\n[step {e['step']}] model ({e['seconds']} s)"
            + (f": {e['content']}" if e["content"] else "")
            + (f"\n  note: {e['notes']}" if e["notes"] else "")
        )
    if kind == "call":
        more = f"\n      ... ({len(lines) - 30} more lines)" if len(lines) > 30 else ""
        shown = "\n".join("      " + line for line in lines[:30])
        return f"  -> {e['name']}({e['arguments']})  ({e['seconds']} s)\n{shown}{more}"
    if kind == "output":
        return f"\nstatus: {e['status']} after {e['steps']} steps, {e['seconds']} s"
    return f"  [{kind}] " + ", ".join(f"{k}={v}" for k, v in e.items() if k != "event")


def main(args: argparse.Namespace) -> int:
    # --- configuration: file < environment < flags
    flag = vars(args).get  # a flag not given is absent (argparse.SUPPRESS): the config's value stays
    config = load_config(flag("config"))
    config.model = override(
        config.model,
        backend=flag("backend"),
        model_dir=flag("model_dir"),
        adapter=flag("adapter"),
        base_url=flag("base_url"),
        model=flag("model"),
    )
    config.agent = override(
        config.agent,
        task=flag("task"),
        max_steps=flag("max_steps"),
        time_limit_s=flag("time_limit"),
        feedback=args.feedback or None,
        know_before_use=False if args.no_know_before_use else None,
    )
    check(config)
    for name in flag("kg") or []:  # before the endpoints are asked and the model loads
        config.kg(name)
    questions = read_jsonl(Path(args.file)) if args.file else [{"question": args.question or ""}]
    if not questions or not all(str(q.get("question") or "").strip() for q in questions):
        raise ValueError('no question: pass one (python agent.py "Who directed Pulp Fiction?") or --file')
    for kg in config.knowledge_graphs:  # fail fast on an endpoint that is down
        try:
            SparqlClient(kg.endpoint, retries=0).query("ASK {}")
        except SparqlError as e:
            raise ValueError(
                f"the SPARQL endpoint of {kg.name} does not answer ({e}); start it "
                f"(python endpoint.py start) or fix its endpoint in the config"
            ) from None
    print(
        f"config: {config.source or 'defaults'}; model {asdict(config.model)}; agent {asdict(config.agent)}",
        file=sys.stderr,
    )
    agent = build_agent(config)

    # --- questions
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    past, code = None, 0
    while questions:
        q = questions.pop(0)
        r = agent.run(
            q["question"],
            kgs=flag("kg"),
            past=past,
            on_event=None if args.quiet else lambda e: print(event_text(e), flush=True),
        )
        print(f"answer: {r.answer or r.explanation or '-'}\nsparql: {r.sparql or '-'}")
        if r.sparql and r.kg in agent.kgs and r.task == "sparql-qa":
            print(agent.result_text(r, time.monotonic() + config.agent.sparql_timeout_s))
        if r.error:
            print(f"error: {r.error}", file=sys.stderr)
            code = 1
        if out:
            record = {
                "id": q.get("id"),
                "question": r.question,
                "status": r.status,
                "sparql": r.sparql,
                "kg": r.kg,
                "answer": r.answer,
                "explanation": r.explanation,
                "error": r.error,
                "steps": r.steps,
                "calls": dict(r.calls),
                "seconds": r.timings["total"],
                "trace": r.trace,
            }
            append_jsonl(out, record)
        if args.follow_up and not questions:  # the same conversation: earlier turns and known IRIs carry over
            past = r.past()
            try:
                line = input("\nfollow-up> ").strip()
            except EOFError:
                line = ""
            questions = [{"question": line}] if line else []
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Answer questions over SPARQL knowledge graphs with the GRASP "
        "agent (function calling, zero-shot); prints the trace.",
        formatter_class=defaults.HelpFormatter,
    )
    parser.add_argument("question", nargs="?", help="the question (or --file)")
    # data
    S = argparse.SUPPRESS  # the default lives in the config (one definition); a flag not given stays unset
    parser.add_argument(
        "--config",
        default=S,
        help="TOML or JSON config file (see grasp.toml); default $GRASP_CONFIG or built-in defaults",
    )
    parser.add_argument("--file", default=None, help='JSONL file of questions ({"question": ...} per line)')
    parser.add_argument(
        "--out", default=None, help="write one JSON record per question (answer, query, trace) here"
    )
    parser.add_argument(
        "--kg",
        action="append",
        default=S,
        help="use only this configured knowledge graph (repeatable); default: all of them",
    )
    parser.add_argument(
        "--follow-up", action="store_true", help="after the answer, read follow-up questions from stdin"
    )
    parser.add_argument("--quiet", action="store_true", help="print only the answers, not the trace")
    # model (override the config)
    parser.add_argument(
        "--backend",
        choices=["local", "openai"],
        default=S,
        help=f"model backend {unset_flag('model', 'backend')}",
    )
    parser.add_argument(
        "--model-dir",
        default=S,
        help=f"local backend: Qwen2.5 model directory {unset_flag('model', 'model_dir')}",
    )
    parser.add_argument(
        "--adapter",
        default=S,
        help=f"local backend: LoRA adapter directory, or 'none' for the base model "
        f"{unset_flag('model', 'adapter')}",
    )
    parser.add_argument(
        "--base-url", default=S, help=f"openai backend: server URL {unset_flag('model', 'base_url')}"
    )
    parser.add_argument(
        "--model",
        default=S,
        help="openai backend: model name, e.g. Qwen/Qwen2.5-7B-Instruct (config [model] model)",
    )
    # agent (override the config)
    parser.add_argument(
        "--task",
        choices=["sparql-qa", "general-qa"],
        default=S,
        help=f"answer with a query or with text {unset_flag('agent', 'task')}",
    )
    parser.add_argument("--feedback", action="store_true", help="GRASP-F: judge the answer, maybe try again")
    parser.add_argument(
        "--no-know-before-use", action="store_true", help="allow IRIs no earlier result showed"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=S,
        help=f"model turns per question {unset_flag('agent', 'max_steps')}",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=S,
        help=f"seconds per question {unset_flag('agent', 'time_limit_s')}",
    )
    try:
        sys.exit(main(parser.parse_args()))
    except (ConfigError, ValueError, FileNotFoundError, BackendError) as error:
        sys.exit(f"error: {error}")
