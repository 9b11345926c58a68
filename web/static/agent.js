// The page's agent mode: asks serve.py's /api/agent/stream (serve_agent.py) and draws each step of the
// GRASP agent as it arrives: the model's turn (its text and the functions it calls), each call with its
// arguments and result, then the answer. Cancel asks /api/agent/cancel, which stops the agent on the
// server; the stream then ends with the agent's own "cancelled" step. Uses app.js's helpers (el, $, ...).
"use strict";

const STATUS_TEXT = {  // AgentResult.status -> the headline of the answer panel
  answer: "Answer", cancel: "The agent gave up", no_answer: "No answer", loop: "Stopped: the agent repeated itself",
  step_limit: "Stopped: step limit", time_limit: "Stopped: time limit", error: "Error", cancelled: "Cancelled",
};

function setupAgent(info) {  // the mode switch, the agent's options, the setup line
  $("modes").hidden = false;
  const task = el("select", {id: "agent-task"}, info.tasks.map((t) => el("option", {value: t}, t)));
  task.value = info.task;
  $("agentoptions").append(
    el("label", {title: "sparql-qa: the answer is a SPARQL query; general-qa: a text answer"}, "task", task),
    el("span", {class: "note"}, `${info.backend}${info.precision ? ` in ${info.precision}` : ""} · at most ${info.max_steps} steps, ${info.time_limit_s} s`
       + (info.know_before_use ? " · know before use" : "") + (info.feedback ? " · feedback" : "")));
  $("agentnote").textContent = `over ${info.kgs.map((k) => k.name).join(", ")}`;
}

function agentRequest(question) {
  return {question, task: $("agent-task").value};
}

async function cancelAgent() {
  if (!running || !running.job) return;
  $("stop").disabled = true;
  running.phase = "Cancelling";
  try {
    await fetch("/api/agent/cancel", {method: "POST", headers: {"Content-Type": "application/json"},
                                      body: JSON.stringify({id: running.job})});
  } catch {
    running.controller.abort();  // the server is gone: at least stop waiting for it
  }
}

function callArguments(text) {  // '{"kg": "wikidata", "sparql": "..."}' -> lines; a query in a block of its own
  let args;
  try { args = JSON.parse(text); } catch { return [el("pre", {}, text)]; }
  return Object.entries(args).map(([key, value]) => {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    const block = key === "sparql" || text.includes("\n");
    return el("div", {class: "arg"}, el("span", {class: "key"}, key), block ? el("pre", {}, text) : text);
  });
}

function agentStep(kind, head, ...body) {
  return el("li", {class: `step ${kind}`}, el("div", {class: "head"}, head), ...body);
}

const agentDrawers = {
  question() { return null; },  // the question is in the box
  model(e) {
    running.phase = e.calls ? `Step ${e.step}: ${e.calls}` : `Step ${e.step}`;
    return agentStep("model", [el("b", {}, `Step ${e.step}`), ` · model, ${seconds(e.seconds)}`],
                     e.content ? el("p", {class: "thought"}, e.content) : null,
                     e.notes ? el("div", {class: "sub"}, e.notes) : null);
  },
  call(e) {
    running.phase = `Model turn ${e.step + 1}`;
    const lines = e.result.split("\n").length;
    return agentStep("call", [el("b", {}, e.name), ` · ${seconds(e.seconds)}`], ...callArguments(e.arguments),
                     el("details", lines <= 12 ? {open: ""} : {}, el("summary", {}, `result (${lines} lines)`),
                        el("pre", {class: "result"}, e.result)));
  },
  malformed_call(e) {
    return agentStep("rejected", ["✗ malformed call ", el("b", {}, e.name)], el("div", {class: "sub"}, e.error));
  },
  no_call(e) { return agentStep("stop", `step ${e.step}: the model answered without calling a function`); },
  loop(e) {
    return agentStep("backtrack", `↩ step ${e.step} repeated ${e.repeats} (${e.loops}×); not run again`);
  },
  feedback(e) {
    return agentStep(e.status === "done" ? "ok" : "backtrack", ["feedback: ", el("b", {}, e.status)],
                     el("p", {class: "thought"}, e.feedback));
  },
  feedback_error(e) { return agentStep("stop", `feedback failed: ${e.error}`); },
  limit(e) {
    return agentStep("stop", `${e.kind === "step_limit" ? "step" : "time"} limit reached after ${e.steps} steps`);
  },
  backend_error(e) { return agentStep("stop", `model error: ${e.error}`); },
  cancelled(e) { return agentStep("stop", `cancelled${e.during ? " during the model's turn" : " between steps"}`); },
  output() { return null; },  // the answer panel shows it
};

function drawAgentEvent(seq, event) {
  const node = agentDrawers[event.event] ? agentDrawers[event.event](event) : agentStep("stop", event.event);
  if (node) $("agentsteps").append(node);
  $("agent").hidden = false;
}

function showAgentAnswer(a) {
  $("result").hidden = false;
  const headline = STATUS_TEXT[a.status] || a.status;
  const text = a.answer || a.explanation || a.error;
  if (a.status === "answer") {
    $("message").replaceChildren(el("p", {class: "answertext"}, text || "(no text)"));
  } else {
    $("message").replaceChildren(el("div", {class: "failure"}, el("b", {}, headline), text || ""));
  }
  if (a.sparql) {
    $("sparql").hidden = false;
    $("query").textContent = formatQuery(a.sparql);
    $("query").dataset.raw = a.sparql;
  }
  if (a.result) $("table").replaceChildren(resultTable(a.result, a.labels));
  else if (a.result_error) $("table").replaceChildren(el("p", {class: "more"}, `The query failed: ${a.result_error}`));
  const calls = Object.entries(a.calls).map(([name, n]) => `${name} ${n}`).join(", ");
  const t = a.timings;
  $("timings").textContent = `model ${seconds(t.model || 0)} · functions ${seconds(t.functions || 0)} · total `
    + `${seconds(t.total || 0)} · ${a.steps} step(s)` + (calls ? ` · calls: ${calls}` : "");
  setStatus(a.status === "answer" ? `Answered in ${seconds(t.total || 0)}.` : `${headline}.`);
}
