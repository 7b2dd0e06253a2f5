// tether ui: one small script, no build step. Every text the owner sends is set as text (never as HTML).
"use strict";

const CSRF = document.querySelector('meta[name="tether-csrf"]').content;
const ACTIVE = new Set(["queued", "pending", "running", "waiting", "retry_wait", "needs_attention"]);
const main = document.getElementById("main");
let view = { name: "overview" };
let streams = {}; // operation_id -> {text}: partial output while it streams (a model's text, a tool's progress)
let rendering = null;
let drawn = 0; // draws started: a draw shows what it read only if no later one started meanwhile
let owner = { up: null, db: "", why: "", message: "" }; // whether the owner answers, as the event stream last said
let streamOpen = false;
const refusals = {}; // an action's key -> {code, message}: its last refusal, kept across redraws until it succeeds

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

const short = (id) => (id || "").slice(-8);
const json = (value) => (typeof value === "string" ? value : JSON.stringify(value));
const link = (hash, text) => el("a", { href: hash }, text);
const status = (run) => el("span", { class: "status " + run.status, "data-status": run.status },
  run.status + (run.reason ? ` (${run.reason})` : ""));
const byId = (records, key) => Object.fromEntries((records || []).map((record) => [record[key], record]));

// An error of the API is {"error": {"code", "message"}}: the code is one of the project's (protocol's ErrorCode).
function refusal(response, body) {
  const error = (body && body.error) || {};
  return { code: error.code || "http_" + response.status, message: error.message || response.statusText };
}

async function read(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw Object.assign(new Error(), refusal(response, body));
  return body;
}

function errorBox(key) {
  const box = el("div", { class: "error-box", "data-refused": key });
  showRefusal(box, refusals[key]);
  return box;
}

function showRefusal(box, refused) {
  box.replaceChildren();
  if (!refused) { box.removeAttribute("data-code"); return; }
  box.setAttribute("data-code", refused.code);
  box.append(el("code", { class: "code" }, refused.code), " ", refused.message);
}

// One action of the page; key names it (its refusal is shown in the box of that key until it succeeds).
async function act(name, body, key) {
  let refused = null;
  try {
    const response = await fetch("/api/actions/" + name, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Tether-CSRF": CSRF },
      body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => null);
    if (!response.ok) refused = refusal(response, answer);
  } catch (error) {
    refused = { code: "owner_unavailable", message: "tether ui did not answer (" + error.message + "); nothing was done" };
  }
  if (refused) refusals[key] = refused;
  else delete refusals[key];
  for (const box of document.querySelectorAll("[data-refused]")) if (box.dataset.refused === key) showRefusal(box, refused);
  if (!refused) schedule();
  return !refused;
}

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  if (parts[0] === "conversation" && parts[1]) view = { name: "conversation", id: parts[1] };
  else if (parts[0] === "run" && parts[1]) view = { name: "run", id: parts[1] };
  else if (parts[0] === "tasks") view = { name: "tasks" };
  else if (parts[0] === "usage") view = { name: "usage" };
  else view = { name: "overview" };
  streams = {};
  schedule(0);
}

function typing() {
  const field = document.activeElement;
  return Boolean(field && main.contains(field) && field.value);
}

// Read the view again and draw it, unless a person types in one of its fields (before the read or during it: then
// later); of two draws in flight, only the later one is shown.
function schedule(delay = 25) {
  if (rendering !== null) return;
  rendering = setTimeout(async () => {
    rendering = null;
    if (typing()) { schedule(500); return; }
    const mine = ++drawn;
    let node;
    try {
      node = await RENDER[view.name](view.id);
    } catch (error) {
      node = error.code === "owner_unavailable" ? ownerDown(error.message) :
        el("p", { class: "error-box", "data-code": error.code || "" }, error.code ? el("code", { class: "code" }, error.code) : null,
          " ", String(error.message || error));
    }
    if (mine !== drawn) return;
    if (typing()) { schedule(500); return; }
    main.replaceChildren(node);
  }, delay);
}

function ownerDown(message) {
  const db = owner.db || "DB";
  return el("div", { class: "card attention", "data-owner": "down" },
    el("h1", {}, "No owner is running for this database"),
    el("p", {}, "Start it, and this page reconnects by itself: ", el("code", {}, `tether up --db ${db}`),
      " (or ", el("code", {}, `tether owner --db ${db}`), ")."),
    el("p", { class: "muted" }, owner.why ? "Last attempt to reach it: " + owner.why + "." : message));
}

function showOwner() {
  const live = document.getElementById("live");
  if (!streamOpen) { live.textContent = "reconnecting…"; live.className = "live"; return; }
  live.textContent = owner.up ? "live" : "owner not running";
  live.className = owner.up ? "live on" : "live down";
}

function interactionCard(interaction) {
  const key = "respond:" + interaction.interaction_id;
  const card = el("div", { class: "card attention", "data-interaction": interaction.interaction_id, "data-kind": interaction.kind });
  if (interaction.kind === "question") {
    const input = el("input", { type: "text", placeholder: "the answer, as JSON (true, 3, \"text\")" });
    const schema = interaction.args && interaction.args.schema;
    card.append(
      el("div", {}, el("b", {}, "Question"), ` from tool ${interaction.tool} (run `, link("#/run/" + interaction.run_id, short(interaction.run_id)), ")"),
      el("p", {}, (interaction.args && interaction.args.text) || ""),
      schema ? el("div", { class: "muted mono" }, "schema: " + JSON.stringify(schema)) : null,
      el("div", { class: "row" }, input, el("button", { class: "primary", onclick: () => {
        let value;
        try { value = JSON.parse(input.value); } catch (error) { value = input.value; }
        act("respond", { interaction_id: interaction.interaction_id, answer: value }, key);
      } }, "Answer")),
      errorBox(key),
    );
  } else {
    const note = el("input", { type: "text", placeholder: "a note (optional)" });
    const respond = (approve) => act("respond", { interaction_id: interaction.interaction_id, approve, note: note.value || null }, key);
    card.append(
      el("div", {}, el("b", {}, "Approval"), ` of tool ${interaction.tool} (run `, link("#/run/" + interaction.run_id, short(interaction.run_id)), ")"),
      el("div", { class: "mono" }, JSON.stringify(interaction.args)),
      el("div", { class: "row" }, note,
        el("button", { class: "primary", onclick: () => respond(true) }, "Approve"),
        el("button", { onclick: () => respond(false) }, "Deny")),
      errorBox(key),
    );
  }
  return card;
}

// A run's buttons; operations: the operation records known by id (the one a run that needs attention is blocked on).
function runActions(run, operations) {
  const key = "run:" + run.run_id;
  const row = el("div", { class: "row" });
  let blocked = null;
  if (run.status === "needs_attention" && run.reason === "tool_interrupted" && run.operation_id) {
    const op = (operations || {})[run.operation_id];
    blocked = el("div", { class: "blocked", "data-blocked-on": run.operation_id },
      "Tool ", el("b", { "data-tool": "" }, op ? op.name : "(unknown)"),
      op ? ` (attempt ${op.attempt}, recovery ${op.policy || "manual"}) was cut off before its result; arguments ` : " was cut off before its result",
      op ? el("code", { class: "mono", "data-arguments": "" }, JSON.stringify(op.arguments)) : null,
      ". Find out what it did, then resolve it with the output the model reads:");
    const output = el("input", { type: "text", placeholder: "what the model reads as the call's result (JSON or text)" });
    row.append(output, el("button", { class: "primary", onclick: () => {
      let value;
      try { value = JSON.parse(output.value); } catch (error) { value = output.value; }
      act("resolve", { operation_id: run.operation_id, output: value }, key);
    } }, "Resolve"));
  }
  if (run.status === "failed") row.append(el("button", { onclick: () => act("retry", { run_id: run.run_id }, key) }, "Retry"));
  if (ACTIVE.has(run.status)) row.append(el("button", { onclick: () => act("cancel", { run_id: run.run_id }, key) }, "Cancel"));
  return el("div", {}, blocked, row, errorBox(key));
}

const RENDER = {
  async overview() {
    const data = await read("/api/overview");
    const operations = byId(data.operations, "operation_id");
    const attention = data.runs.filter((run) => run.status === "needs_attention");
    const table = el("table", {}, el("tr", {}, ["run", "agent", "status", "conversation", "answer", "tokens"].map((h) => el("th", {}, h))));
    for (const run of data.runs) {
      table.append(el("tr", { "data-run": run.run_id },
        el("td", {}, link("#/run/" + run.run_id, short(run.run_id))),
        el("td", {}, run.agent), el("td", {}, status(run)),
        el("td", {}, link("#/conversation/" + run.conversation_id, short(run.conversation_id))),
        el("td", {}, run.answer ? run.answer.text.slice(0, 80) : ""),
        el("td", {}, String((run.usage.input_tokens || 0) + (run.usage.output_tokens || 0)))));
    }
    return el("div", {},
      el("h1", {}, "Needs a person"),
      data.interactions.length || attention.length ? null : el("p", { class: "muted" }, "Nothing waits for a person."),
      data.interactions.map(interactionCard),
      attention.map((run) => el("div", { class: "card attention", "data-attention": run.run_id },
        el("div", {}, "Run ", link("#/run/" + run.run_id, short(run.run_id)), ` (${run.agent}) `, status(run),
          " in conversation ", link("#/conversation/" + run.conversation_id, short(run.conversation_id))),
        runActions(run, operations))),
      el("h2", {}, `Runs (newest first, ${data.runs.length})`), table);
  },

  async conversation(id) {
    const data = await read("/api/conversations/" + id);
    const operations = byId(data.operations, "operation_id");
    const submissions = byId(data.submissions, "submission_id");
    const transcript = el("div", { id: "transcript" });
    for (const entry of data.entries) transcript.append(entryNode(entry, submissions));
    for (const record of data.partials) {
      if (record.status === "streaming") streams[record.operation_id] = { text: record.text };
    }
    for (const [operation, stream] of Object.entries(streams)) {
      if (!operations[operation]) transcript.append(streamNode(operation, stream.text));
    }
    // What the run does now, live: its tool calls without a result, then what they ask a person.
    for (const op of data.operations) transcript.append(toolNode(op));
    for (const interaction of data.interactions) {
      transcript.append(el("div", { class: "entry asking", "data-open-question": interaction.interaction_id },
        el("div", { class: "who" }, interaction.kind === "question" ? `question from tool ${interaction.tool} · waiting for a person`
          : `approval of tool ${interaction.tool} · waiting for a person`),
        interactionCard(interaction)));
    }
    const text = el("textarea", { rows: "2", placeholder: "a message to this conversation" });
    const key = "submit:" + id;
    const busy = data.runs.some((run) => ACTIVE.has(run.status));
    const send = (when_busy) => act("submit", { conversation_id: id, text: text.value, when_busy }, key).then((ok) => { if (ok) text.value = ""; });
    const queued = data.submissions.filter((one) => one.status === "queued");
    return el("div", {},
      el("h1", {}, `Conversation ${short(id)}`, data.conversation.agent ? ` · agent ${data.conversation.agent}` : ""),
      data.earlier ? el("p", { class: "muted" }, "(earlier entries are not shown)") : null,
      transcript,
      el("div", { class: "card" }, text, el("div", { class: "row" },
        el("button", { class: "primary", onclick: () => send("follow_up") }, busy ? "Send as a follow-up" : "Send"),
        busy ? el("button", { onclick: () => send("steer") }, "Steer the running run") : null), errorBox(key)),
      queued.length ? el("h2", {}, "Waiting in the inbox") : null,
      queued.map((one) => {
        const withdraw = "withdraw:" + one.submission_id;
        return el("div", { class: "card", "data-submission": one.submission_id, "data-when-busy": admission(one) },
          el("b", {}, admissionLabel(one)), ` ${short(one.submission_id)}: ${json(one.payload)} `,
          el("button", { onclick: () => act("withdraw", { submission_id: one.submission_id }, withdraw) }, "Withdraw"), errorBox(withdraw));
      }),
      el("h2", {}, "Runs"),
      data.runs.map((run) => el("div", { class: "card" }, link("#/run/" + run.run_id, "run " + short(run.run_id)), " ", status(run), runActions(run, operations))));
  },

  async run(id) {
    const data = await read("/api/runs/" + id);
    const run = data.run;
    const journal = el("table", {}, el("tr", {}, ["#", "operation", "kind", "status", "attempt", "policy", "result"].map((h) => el("th", {}, h))));
    data.operations.forEach((op, index) => journal.append(el("tr", { "data-operation": op.operation_id },
      el("td", {}, String(index + 1)), el("td", { class: "mono" }, short(op.operation_id)),
      el("td", {}, op.kind === "model" ? `model turn ${op.turn}` : (op.parent_operation_id ? "  ↳ " : "") + op.name),
      el("td", { class: "status " + op.status }, op.status), el("td", {}, String(op.attempt)), el("td", {}, op.policy || ""),
      el("td", { class: "mono" }, op.error ? op.error : json(op.result).slice(0, 120)))));
    return el("div", {},
      el("h1", {}, `Run ${short(run.run_id)} · ${run.agent} `, status(run)),
      el("p", {}, "Conversation ", link("#/conversation/" + run.conversation_id, short(run.conversation_id)),
        run.answer ? el("span", {}, " · answer: ", el("i", {}, run.answer.text)) : null,
        run.error ? el("span", { class: "error-box" }, " · " + run.error) : null),
      runActions(run, byId(data.operations, "operation_id")),
      data.interactions.filter((one) => one.status === "open").map(interactionCard),
      el("h2", {}, "Journal"), journal,
      el("p", { class: "muted" }, `usage: ${run.usage.input_tokens} in, ${run.usage.output_tokens} out` +
        (run.usage.cost !== null && run.usage.cost !== undefined ? `, cost ${run.usage.cost}` : "")));
  },

  async tasks() {
    const data = await read("/api/tasks");
    return el("div", {}, el("h1", {}, `Live tasks (${data.count}) as of seq ${data.seq}`), el("pre", { class: "tree" }, data.lines.join("\n")));
  },

  async usage() {
    const data = await read("/api/usage");
    return el("div", {}, el("h1", {}, "Usage"), ["model", "tool", "conversation"].map((scope) => el("div", {},
      el("h2", {}, scope),
      el("table", {}, el("tr", {}, ["key", "input", "output", "cost"].map((h) => el("th", {}, h))),
        data[scope].map((total) => el("tr", {}, el("td", { class: "mono" }, total.key),
          el("td", {}, String(total.usage.input_tokens)), el("td", {}, String(total.usage.output_tokens)),
          el("td", {}, total.usage.cost === null ? "" : String(total.usage.cost))))))));
  },
};

// How an input was admitted (its submission's when_busy): a steer joins the running run at its next boundary; any
// other input has a run of its own (a follow-up's, queued after the active one, while it waits in the inbox).
const admission = (submission) => (submission.kind === "input" ? submission.when_busy : submission.kind);
function admissionLabel(submission) {
  if (submission.kind !== "input") return submission.kind;
  return submission.when_busy === "steer" ? "steer (joins the running run at its next boundary)" : "follow-up (its own run, after the active one)";
}

function entryNode(entry, submissions) {
  const data = entry.data || {};
  if (entry.kind === "tether.user") {
    const submission = submissions[data.submission_id];
    const steer = submission && submission.when_busy === "steer";
    return el("div", { class: "entry user", "data-entry": entry.entry_id, "data-when-busy": steer ? "steer" : "input" },
      el("div", { class: "who" }, steer ? "user · steer" : "user"), data.text || "");
  }
  if (entry.kind === "tether.assistant") {
    const calls = (data.tool_calls || []).map((call) => el("div", { class: "mono" }, `→ ${call.name} ${JSON.stringify(call.arguments)}`));
    return el("div", { class: "entry assistant", "data-entry": entry.entry_id }, el("div", { class: "who" }, "assistant"), data.text || "", calls);
  }
  if (entry.kind === "tether.aborted_answer") {  // what a cut-off or failed attempt had streamed: never an answer
    return el("div", { class: "entry aborted", "data-entry": entry.entry_id, "data-aborted": data.ended || "interrupted" },
      el("div", { class: "who" }, `assistant · attempt ${data.attempt} ${data.ended || "interrupted"} · not an answer, never sent to the model`),
      (data.text || "") + (data.truncated ? "…" : ""));
  }
  if (entry.kind === "tether.tool_result") {
    return el("div", { class: "entry tool" + (data.is_error ? " error" : "") }, el("div", { class: "who" }, `tool ${data.name}`), data.content || "");
  }
  if (entry.kind === "tether.reset") return el("div", { class: "entry" }, el("div", { class: "who" }, "reset"), data.handoff || "(the context starts again)");
  return el("div", { class: "entry" }, el("div", { class: "who" }, entry.kind), JSON.stringify(data));
}

function streamNode(operation, text) {
  return el("div", { class: "entry assistant streaming", "data-stream": operation }, el("div", { class: "who" }, "streaming…"), text);
}

// A tool call without a result: running (with its progress as it streams), or cut off and waiting to be resolved.
function toolNode(op) {
  const running = op.status === "started";
  const stream = streams[op.operation_id];
  return el("div", { class: "entry tool streaming", "data-running-tool": op.operation_id, "data-status": op.status },
    el("div", { class: "who" }, `${op.parent_operation_id ? "↳ " : ""}tool ${op.name} · ` +
      (running ? `running (attempt ${op.attempt})` : "cut off: waits for a person to resolve it")),
    el("div", { class: "mono" }, JSON.stringify(op.arguments)),
    el("div", { "data-tool-output": op.operation_id }, stream ? stream.text : ""));
}

function onPartial(event) {
  if (view.name !== "conversation" || event.conversation_id !== view.id) return;
  const stream = streams[event.operation_id] || { text: "" };
  if (event.status !== "streaming") { delete streams[event.operation_id]; schedule(); return; }
  if (event.offset <= stream.text.length) stream.text = stream.text.slice(0, event.offset) + event.text;
  streams[event.operation_id] = stream;
  const output = document.querySelector(`[data-tool-output="${event.operation_id}"]`);
  const node = document.querySelector(`[data-stream="${event.operation_id}"]`);
  const transcript = document.getElementById("transcript");
  if (output) output.textContent = stream.text;
  else if (node) node.lastChild.textContent = stream.text;
  else if (transcript) transcript.append(streamNode(event.operation_id, stream.text));
}

function onOwner(state) {
  const cameBack = state.up && owner.up === false;
  owner = state;
  showOwner();
  if (cameBack || !state.up) schedule(0);
}

function listen() {
  const source = new EventSource("/api/events");
  source.addEventListener("hello", (message) => {
    streamOpen = true;
    owner = JSON.parse(message.data);
    showOwner();
    schedule(0); // what is shown may have been read before the stream opened (or before the owner answered)
  });
  source.addEventListener("owner", (message) => onOwner(JSON.parse(message.data)));
  source.addEventListener("partial", (message) => onPartial(JSON.parse(message.data)));
  source.addEventListener("change", (message) => {
    const change = JSON.parse(message.data);
    if (view.name === "conversation" && !change.conversations.includes(view.id)) return;
    if (view.name === "run" && !change.runs.includes(view.id)) return;
    schedule();
  });
  source.addEventListener("resync", () => schedule());
  source.onerror = () => { streamOpen = false; showOwner(); };
}

window.addEventListener("hashchange", route);
listen();
route();
