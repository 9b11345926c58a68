// GRISP's web page: asks serve.py's /api/stream and draws the search as its trace events arrive; in agent
// mode (static/agent.js) it asks /api/agent/stream and draws the agent's steps instead.
// About 390 lines, over the ~350-line budget: the one flow of the page (form, stream, live search, answer) reads
// best in one file; the agent mode lives apart in agent.js.
// Plain browser JavaScript, no build step, no libraries. Every server text goes in as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
let config = null;      // GET /api/config
let running = null;     // {controller, timer, started, agent, job} of the question being answered
let mode = "grisp";     // or "agent" (the mode switch, shown when the server has an agent)
let run = null;         // what the current question has drawn: trace items by seq, labels, cards

// --- small helpers
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function compact(iri) {  // the longest namespace of config.prefixes that starts the IRI -> prefix:local
  let best = null;
  for (const [prefix, ns] of Object.entries(config.prefixes)) {
    if (iri.startsWith(ns) && (!best || ns.length > best[1].length)) best = [prefix, ns];
  }
  return best ? `${best[0]}:${iri.slice(best[1].length)}` : `<${iri}>`;
}

function wikidataPage(iri) {  // an entity or property IRI of Wikidata -> its page, else null
  const m = /^https?:\/\/www\.wikidata\.org\/(entity|prop\/[a-z-\/]*?)\/?([QPL]\d+)$/.exec(iri || "");
  if (!m) return null;
  return `https://www.wikidata.org/wiki/${m[2].startsWith("P") ? "Property:" : ""}${m[2]}`;
}

function iriLink(iri, text) {
  const page = wikidataPage(iri);
  return page ? el("a", {href: page, target: "_blank", rel: "noopener"}, text) : el("span", {}, text);
}

const placeholderLabel = (text) => text.replace(/<\/?iri>/g, "").replaceAll("<sep>", " | ");  // merged wordings

function skeletonCode(text) {  // a skeleton with its placeholders marked
  return el("code", {}, text.split(/(<iri>.*?<\/iri>)/).map((part) =>
    part.startsWith("<iri>") ? el("span", {class: "ph"}, placeholderLabel(part)) : part));
}
const seconds = (s) => `${s.toFixed(s < 10 ? 1 : 0)} s`;

function setStatus(text, busy = false) {
  $("status").textContent = text;
  $("status").classList.toggle("busy", busy);
}

// --- the question form
async function loadConfig() {
  config = await (await fetch("/api/config")).json();
  const adapter = config.adapter ? config.adapter.split("/").pop() : "no adapter";
  // the precision that runs and why, e.g. "precision auto: bfloat16, the CPU has native bf16 (AMD EPYC)"
  $("setup").textContent = `model ${config.model.split("/").pop()} · ${adapter} · precision ${config.why_precision}`
    + ` · endpoint ${config.endpoint}`;
  for (const question of config.examples) {
    const button = el("button", {type: "button"}, question);
    button.addEventListener("click", () => { $("question").value = question; ask(); });
    $("examples").append(button);
  }
  const options = $("options");
  const mode = el("select", {id: "opt-mode"}, el("option", {value: "answer"}, "answer"),
                  el("option", {value: "generate"}, "skeletons only"));
  options.append(el("label", {title: "answer: the full pipeline; skeletons only: generation without resolution"}, "mode", mode));
  for (const [name, value] of Object.entries(config.options)) {
    const choices = config.option_choices[name];
    const input = choices ? el("select", {id: `opt-${name}`}, ...choices.map((c) => el("option", {value: c}, c)))
      : typeof value === "boolean" ? el("input", {type: "checkbox", id: `opt-${name}`})
      : el("input", {type: "number", id: `opt-${name}`, value, step: Number.isInteger(value) ? 1 : "any",
                     max: config.caps[name]});
    if (choices) input.value = value;
    if (config.load_time_options.includes(name)) input.disabled = true;  // set when the server starts
    if (typeof value === "boolean") input.checked = value;
    options.append(el("label", {title: config.option_help[name]}, input, name.replaceAll("_", " ")));
  }
  $("question").maxLength = config.max_question_chars;
  if (config.agent) setupAgent(config.agent);  // agent.js: the mode switch and the agent's options
}

function setMode(chosen) {
  mode = chosen;
  $("options").hidden = mode === "agent";
  $("agentoptions").hidden = mode !== "agent";
  $("stop").textContent = mode === "agent" ? "Cancel" : "Stop";
  $("tagline").textContent = mode === "agent" ? "question → function calls exploring the graph → SPARQL → answer"
                                              : "question → SPARQL skeleton → KG-guided search → answer";
}

function chosenOptions() {  // the options that differ from the server's defaults
  const chosen = {};
  for (const [name, value] of Object.entries(config.options)) {
    const input = $(`opt-${name}`);
    const now = typeof value === "boolean" ? input.checked : typeof value === "string" ? input.value : Number(input.value);
    if (now !== value && !(typeof value !== "boolean" && input.value === "")) chosen[name] = now;
  }
  return chosen;
}

async function ask() {
  const question = $("question").value.trim();
  if (!question || !config) return;
  if (running) running.controller.abort();
  resetRun();
  const controller = new AbortController(), agent = mode === "agent";
  running = {controller, started: null, phase: "Waiting", timer: setInterval(tick, 200), agent, job: null};
  $("go").disabled = true;
  $("stop").hidden = false;
  $("stop").disabled = false;
  setStatus("Sending…", true);
  try {
    const body = agent ? agentRequest(question) : {question, options: chosenOptions(), mode: $("opt-mode").value};
    const response = await fetch(agent ? "/api/agent/stream" : "/api/stream", {
      method: "POST", headers: {"Content-Type": "application/json"}, signal: controller.signal,
      body: JSON.stringify(body)});
    running.job = response.headers.get("X-Job-Id");  // names the agent's run for Cancel
    if (!response.ok) {
      const body = await response.json().catch(() => ({error: response.statusText}));
      const retry = response.headers.get("Retry-After");
      const title = {400: "Bad request", 503: "Server busy"}[response.status] || `HTTP ${response.status}`;
      fail(title, body.error + (retry ? ` (retry in ${retry} s)` : ""));
      return;
    }
    await readStream(response.body.getReader());
  } catch (error) {
    if (error.name === "AbortError") setStatus("Stopped.");
    else fail("Connection lost", `${error.message}; is serve.py still running?`);
  } finally {
    if (running && running.controller === controller) finish();
  }
}

function finish() {
  clearInterval(running.timer);
  running = null;
  $("go").disabled = false;
  $("stop").hidden = true;
}

function tick() {
  if (!running) return;
  const since = running.started === null ? "" : ` ${seconds((performance.now() - running.started) / 1000)}`;
  setStatus(`${running.phase}…${since}`, true);
}

async function readStream(reader) {  // Server-Sent Events: "event: type\ndata: json\n\n" blocks
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) handle(JSON.parse(data));
    }
  }
}

function handle(message) {
  switch (message.type) {
    case "queued":
      running.phase = message.ahead ? `Waiting: ${message.ahead} question(s) ahead` : "Starting";
      break;
    case "started":
      running.started = performance.now();
      running.phase = running.agent ? "Model turn 1" : "Generating skeletons";
      break;
    case "trace": (running.agent ? drawAgentEvent : drawEvent)(message.seq, message.event); break;
    case "answer": (running.agent ? showAgentAnswer : showAnswer)(message.answer); break;
    case "timeout": fail("Timeout", message.message); break;
    case "error":
      if (message.answer) showTimings(message.answer);
      fail(message.kind === "endpoint" ? "Endpoint error" : "Error", message.message); break;
  }
  if (!["answer", "timeout", "error"].includes(message.type)) tick();  // a final message set the status
}

// --- the live search
function resetRun() {
  run = {items: new Map(), labels: new Map(), cards: new Map(), group: null};
  $("skeletons").replaceChildren();
  $("steps").replaceChildren();
  $("searchnote").textContent = "";
  $("search").hidden = true;
  $("agentsteps").replaceChildren();
  $("agent").hidden = true;
  $("result").hidden = true;
  for (const id of ["message", "table", "query", "timings"]) $(id).replaceChildren();
  $("sparql").hidden = true;
}

function drawEvent(seq, event) {  // a new seq appends; a seen seq (a note added fields) redraws in place
  const node = drawers[event.event] ? drawers[event.event](event, seq) : el("div", {class: "step stop"}, event.event);
  if (!node) return;
  const old = run.items.get(seq);
  if (old) old.replaceWith(node);
  else (event.event === "skeleton" ? $("skeletons") : run.group || $("steps")).append(node);
  run.items.set(seq, node);
  $("search").hidden = false;
}

function candidates(event, chosen) {  // the ranked list: re-ranked with None's place, or the index's order
  for (const [iri, label] of event.hits || []) run.labels.set(iri, label);
  const ranked = event.reranked || (event.hits || []).map(([iri, , score]) => [iri, score]);
  const list = el("ol", {class: "cands"});
  let belowNone = false, rank = 0;
  for (const [iri, score] of ranked) {
    const shown = score === null ? "" : score.toFixed(2);
    if (iri === null) {
      belowNone = true;
      list.append(el("li", {class: "none"}, el("span", {class: "rank"}), "None of these", el("span", {class: "score"}, shown)));
      continue;
    }
    const cls = iri === chosen ? "chosen" : belowNone ? "below" : "";
    list.append(el("li", {class: cls, "data-iri": iri}, el("span", {class: "rank"}, ++rank),
                   el("span", {}, iriLink(iri, run.labels.get(iri) || compact(iri)), el("span", {class: "id"}, compact(iri))),
                   el("span", {class: "score"}, shown)));
  }
  const pending = !("hits" in event) ? "searching…" : !("kept" in event) ? "re-ranking…" : null;  // notes to come
  if (!ranked.length && !pending) list.append(el("li", {class: "below"}, el("span"), "no candidates", el("span")));
  if (pending && event.event === "placeholder") list.append(el("li", {class: "below"}, el("span"), pending, el("span")));
  return list;
}

function constraintLine(event) {
  if ("constraint_size" in event) {
    return el("details", {}, el("summary", {}, `constrained to ${event.constraint_size} IRIs by the resolved part`),
              el("pre", {}, event.constraint));
  }
  if ("constraint_error" in event) return el("div", {class: "sub"}, `constraint failed (${event.constraint_error}); searched unconstrained`);
  return null;
}

const drawers = {
  skeleton(e) {
    const kept = e.verdict === "kept";  // a merged beam is not dropped: its wordings joined a kept one
    return el("li", {class: kept ? "kept" : e.verdict === "merged" ? "merged" : "dropped"},
              el("span", {class: "score"}, e.score.toFixed(3)), skeletonCode(e.skeleton),
              el("span", {class: `badge ${kept ? "kept" : ""}`}, e.verdict));
  },
  resolve(e) {
    const kept = [...$("skeletons").querySelectorAll("li.kept")];  // the number-th kept one is resolved now
    for (const li of $("skeletons").children) li.classList.toggle("active", li === kept[e.number]);
    running.phase = `Resolving skeleton ${e.number + 1}`;
    $("searchnote").textContent = `skeleton ${e.number + 1}, ${e.placeholders} placeholder(s)`;
    run.group = el("div", {class: "resolve"},
                   el("div", {class: "title"}, `Resolving skeleton ${e.number + 1}: ${e.placeholders} placeholder(s), left to right`),
                   e.skeleton.includes("<sep>") ? el("div", {class: "sub"}, "with merged wordings: ", skeletonCode(e.skeleton)) : null);
    $("steps").append(run.group);
    return null;
  },
  placeholder(e, seq) {
    const card = {placeholder: e.placeholder};
    card.node = el("div", {class: "step"},
                   el("div", {class: "head"}, el("b", {}, placeholderLabel(e.placeholder)), ` · ${e.position} → ${e.kind} search`),
                   constraintLine(e), candidates(e, null));
    run.cards.set(seq, card);  // a redraw (after a note) replaces the card in place
    return card.node;
  },
  choose(e) {
    const card = [...run.cards.values()].reverse().find((c) => c.placeholder === e.placeholder);
    if (card) {
      for (const li of card.node.querySelectorAll(".cands li")) {
        if (li.dataset.iri === e.iri) li.className = "chosen";
      }
    }
    run.labels.set(e.iri, e.label);
    return null;  // drawn as the highlight in its candidate list
  },
  backtrack(e, seq) {
    for (const c of [...run.cards.values()].filter((c) => c.placeholder === e.to)) {  // what was tried there failed
      for (const li of c.node.querySelectorAll(".cands li.chosen")) li.className = "tried";
    }
    const card = {placeholder: e.to};
    card.node = el("div", {class: "step backtrack"},
                   el("div", {class: "head"}, "↩ backtrack to ", el("b", {}, placeholderLabel(e.to)),
                      ` · ${e.left} alternative(s) left`), e.reranked ? candidates(e, null) : null);
    run.cards.set(seq, card);  // a redraw (after a note) replaces the card in place
    return card.node;
  },
  wording(e, seq) {  // a merged placeholder used up one wording: the next one's candidates
    const card = {placeholder: e.placeholder};
    card.node = el("div", {class: "step"},
                   el("div", {class: "head"}, "next wording of ", el("b", {}, placeholderLabel(e.placeholder)),
                      ` · searching “${e.wording}”`), candidates(e, null));
    run.cards.set(seq, card);  // a redraw (after a note) replaces the card in place
    return card.node;
  },
  validate(e) {
    const detail = e.error || (e.accepted_error ? `accepted despite ${e.accepted_error}`
      : e.boolean !== null && e.boolean !== undefined ? `ASK: ${e.boolean}` : `${e.rows} row(s)`);
    return el("div", {class: `step ${e.ok ? "ok" : "rejected"}`},
              el("div", {class: "head"}, e.ok ? "✓ validated: " : "✗ rejected: ", detail),
              el("details", {}, el("summary", {}, "query"), el("pre", {}, e.query)));
  },
  retry(e) {  // every skeleton dead-ended: the dead ones once more, None's cut lifted (options.retry)
    const which = e.skeletons.map((n) => n + 1).join(", ");
    return el("div", {class: "step backtrack"},
              el("div", {class: "head"}, `↻ every skeleton dead-ended: skeleton(s) ${which} once more, `,
                 "every hit in the re-ranked order"));
  },
  exhausted() { return el("div", {class: "step stop"}, el("div", {class: "head"}, "dead end: every alternative failed")); },
  timeout() { return el("div", {class: "step stop"}, el("div", {class: "head"}, "time budget used up")); },
  endpoint_lost(e) { return el("div", {class: "step stop"}, el("div", {class: "head"}, `endpoint lost: ${e.error}`)); },
  refused(e) { return el("div", {class: "step stop"}, el("div", {class: "head"}, `refused: ${e.reason}`)); },
  declined(e) {  // the answer found is below --min-confidence: declined, its query kept as the guess
    return el("div", {class: "step stop"},
              el("div", {class: "head"}, `declined: confidence ${e.confidence.toFixed(2)} < ${e.min_confidence}; guess: `,
                 el("code", {}, e.guess)));
  },
};

// --- the answer
const FAILURES = {
  no_skeleton: ["No skeleton", "the model wrote no SPARQL skeleton that parses; try rephrasing the question."],
  dead_end: ["Dead end", "no skeleton resolved to a query with a non-empty result on this knowledge graph."],
  timeout: ["Timeout", "the time budget for resolving the skeletons ran out."],
  endpoint_error: ["Endpoint error", "the SPARQL endpoint failed during the search."],
  declined: ["No confident answer", "the query found is below the confidence threshold; it is shown as a guess."],
};

function fail(title, text) {
  $("result").hidden = false;
  $("message").replaceChildren(el("div", {class: "failure"}, el("b", {}, title), text));
  setStatus(`${title}.`);
}

function formatQuery(sparql) {  // one clause a line, for reading; Copy takes the text as the server sent it
  return sparql.replace(/\{\s*/g, "{\n  ").replace(/\s+\.\s+(?=[^}])/g, " .\n  ").replace(/\s*\.?\s*\}/g, " .\n}")
               .replace(/\{\n {2} \.\n\}/g, "{ }");
}

function showTimings(answer) {
  const t = answer.timings;
  const parts = ["generate", "resolve", "search", "constraint", "rerank", "validate"].filter((k) => k in t)
    .map((k) => `${k} ${seconds(t[k])}`);
  $("timings").textContent = `${parts.join(" · ")} · total ${seconds(t.total || 0)} · backtracks ${answer.backtracks}`;
  return t;
}

function showAnswer(answer) {
  $("result").hidden = false;
  const query = answer.sparql || (answer.declined && answer.guess);  // a declined answer's guess stays visible
  if (query) {
    $("sparql").hidden = false;
    $("sparqltitle").textContent = answer.sparql ? "SPARQL" : "SPARQL (declined guess)";
    $("query").textContent = formatQuery(query);
    $("query").dataset.raw = query;
  }
  const t = showTimings(answer);
  if (answer.mode === "generate") {
    const kept = answer.skeletons.length;
    $("message").replaceChildren(kept ? el("p", {}, `${kept} skeleton(s) kept (skeletons only: no resolution).`)
                                      : el("div", {class: "failure"}, el("b", {}, FAILURES.no_skeleton[0]), FAILURES.no_skeleton[1]));
    setStatus("Done.");
    return;
  }
  if (!answer.sparql) {
    const [title, text] = FAILURES[answer.failure] || ["No answer", answer.error || answer.failure || "unknown failure"];
    fail(title, answer.declined ? `${text} (confidence ${answer.confidence.toFixed(2)})` : text);
    return;
  }
  $("table").replaceChildren(resultTable(answer.result, answer.labels));
  const notes = answer.confidence == null ? [] : [el("p", {class: "confidence"},
    `Confidence ${answer.confidence.toFixed(2)}` + (answer.retried ? " (from the second pass)" : ""))];
  if (answer.verified === false) {  // accepted although the endpoint failed on the final query
    notes.push(el("p", {class: "more"}, `Unverified: ${answer.error}`));
  }
  $("message").replaceChildren(...notes);
  setStatus(`Answered in ${seconds(t.total || 0)}.`);
}

function resultTable(result, labels, limit = 100) {
  if (!result) return el("p", {class: "more"}, "No result: KG guidance is off, or the endpoint timed out on the final query.");
  if ("boolean" in result) return el("p", {class: "boolean"}, result.boolean ? "Yes" : "No");
  const vars = result.head.vars, rows = result.results.bindings;
  const cell = (term) => {
    if (!term) return el("td");
    if (term.type === "uri") {
      return el("td", {}, iriLink(term.value, labels[term.value] || compact(term.value)), el("span", {class: "id"}, compact(term.value)));
    }
    const dateOnly = /^(\d{4}-\d{2}-\d{2})T00:00:00Z$/.exec(term.value);
    return el("td", {}, dateOnly ? dateOnly[1] : term.value);
  };
  const table = el("table", {}, el("thead", {}, el("tr", {}, vars.map((v) => el("th", {}, `?${v}`)))),
                   el("tbody", {}, rows.slice(0, limit).map((row) => el("tr", {}, vars.map((v) => cell(row[v]))))));
  const note = rows.length > limit ? el("p", {class: "more"}, `… and ${rows.length - limit} more rows`)
    : el("p", {class: "more"}, `${rows.length} row${rows.length === 1 ? "" : "s"}`);
  return el("div", {}, table, note);
}

async function copyQuery() {
  const text = $("query").dataset.raw || $("query").textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch {  // no clipboard API (not a secure context): select the text for Ctrl+C
    getSelection().selectAllChildren($("query"));
  }
  $("copy").textContent = "Copied";
  setTimeout(() => { $("copy").textContent = "Copy"; }, 1200);
}

document.addEventListener("DOMContentLoaded", () => {
  $("ask").addEventListener("submit", (event) => { event.preventDefault(); ask(); });
  $("stop").addEventListener("click", () => running && (running.agent ? cancelAgent() : running.controller.abort()));
  for (const radio of document.querySelectorAll("input[name=mode]")) {
    radio.addEventListener("change", () => radio.checked && setMode(radio.value));
  }
  $("copy").addEventListener("click", copyQuery);
  loadConfig().catch((error) => fail("No server", `cannot read /api/config (${error.message})`));
});
