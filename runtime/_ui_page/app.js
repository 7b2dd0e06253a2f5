// tether ui: one small script, no build step. Every text the owner sends is set as text (never as HTML).
"use strict";

const CSRF = document.querySelector('meta[name="tether-csrf"]').content;
const ACTIVE = new Set(["queued", "pending", "running", "waiting", "retry_wait", "needs_attention"]);
const main = document.getElementById("main");
let view = { name: "overview" };
let streams = {}; // operation_id -> {text, status}: partial output while it streams
let rendering = null;

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

async function read(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function act(name, body, errorBox) {
  errorBox.textContent = "";
  const response = await fetch("/api/actions/" + name, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Tether-CSRF": CSRF },
    body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) errorBox.textContent = answer.error || response.statusText;
  else schedule();
  return response.ok;
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

function schedule(delay = 25) {
  if (rendering !== null) return;
  rendering = setTimeout(async () => {
    rendering = null;
    const typing = document.activeElement;
    if (typing && main.contains(typing) && typing.value) { schedule(500); return; } // a person is typing there
    try {
      const node = await RENDER[view.name](view.id);
      main.replaceChildren(node);
    } catch (error) {
      main.replaceChildren(el("p", { class: "error-box" }, String(error.message || error)));
    }
  }, delay);
}

function interactionCard(interaction) {
  const errorBox = el("div", { class: "error-box" });
  const card = el("div", { class: "card attention", "data-interaction": interaction.interaction_id });
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
        act("respond", { interaction_id: interaction.interaction_id, answer: value }, errorBox);
      } }, "Answer")),
      errorBox,
    );
  } else {
    const note = el("input", { type: "text", placeholder: "a note (optional)" });
    const respond = (approve) => act("respond", { interaction_id: interaction.interaction_id, approve, note: note.value || null }, errorBox);
    card.append(
      el("div", {}, el("b", {}, "Approval"), ` of tool ${interaction.tool} (run `, link("#/run/" + interaction.run_id, short(interaction.run_id)), ")"),
      el("div", { class: "mono" }, JSON.stringify(interaction.args)),
      el("div", { class: "row" }, note,
        el("button", { class: "primary", onclick: () => respond(true) }, "Approve"),
        el("button", { onclick: () => respond(false) }, "Deny")),
      errorBox,
    );
  }
  return card;
}

function runActions(run) {
  const errorBox = el("div", { class: "error-box" });
  const row = el("div", { class: "row" });
  if (run.status === "needs_attention" && run.reason === "tool_interrupted" && run.operation_id) {
    const output = el("input", { type: "text", placeholder: "what the model reads as the call's result (JSON or text)" });
    row.append(output, el("button", { class: "primary", onclick: () => {
      let value;
      try { value = JSON.parse(output.value); } catch (error) { value = output.value; }
      act("resolve", { operation_id: run.operation_id, output: value }, errorBox);
    } }, "Resolve"));
  }
  if (run.status === "failed") row.append(el("button", { onclick: () => act("retry", { run_id: run.run_id }, errorBox) }, "Retry"));
  if (ACTIVE.has(run.status)) row.append(el("button", { onclick: () => act("cancel", { run_id: run.run_id }, errorBox) }, "Cancel"));
  return el("div", {}, row, errorBox);
}

const RENDER = {
  async overview() {
    const data = await read("/api/overview");
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
          run.operation_id ? ` on operation ${short(run.operation_id)}` : ""), runActions(run))),
      el("h2", {}, `Runs (newest first, ${data.runs.length})`), table);
  },

  async conversation(id) {
    const data = await read("/api/conversations/" + id);
    const transcript = el("div", { id: "transcript" });
    for (const entry of data.entries) transcript.append(entryNode(entry));
    for (const record of data.partials) {
      if (record.status === "streaming") streams[record.operation_id] = { text: record.text, kind: "assistant" };
    }
    for (const [operation, stream] of Object.entries(streams)) transcript.append(streamNode(operation, stream.text));
    const text = el("textarea", { rows: "2", placeholder: "a message to this conversation" });
    const errorBox = el("div", { class: "error-box" });
    const busy = data.runs.some((run) => ACTIVE.has(run.status));
    const send = (when_busy) => act("submit", { conversation_id: id, text: text.value, when_busy }, errorBox).then((ok) => { if (ok) text.value = ""; });
    const queued = data.submissions.filter((one) => one.status === "queued");
    return el("div", {},
      el("h1", {}, `Conversation ${short(id)}`, data.conversation.agent ? ` · agent ${data.conversation.agent}` : ""),
      data.earlier ? el("p", { class: "muted" }, "(earlier entries are not shown)") : null,
      transcript,
      el("div", { class: "card" }, text, el("div", { class: "row" },
        el("button", { class: "primary", onclick: () => send("follow_up") }, busy ? "Send as a follow-up" : "Send"),
        busy ? el("button", { onclick: () => send("steer") }, "Steer the running run") : null), errorBox),
      queued.length ? el("h2", {}, "Waiting in the inbox") : null,
      queued.map((one) => {
        const box = el("div", { class: "error-box" });
        return el("div", { class: "card" }, `${one.kind} ${short(one.submission_id)}: ${json(one.payload)} `,
          el("button", { onclick: () => act("withdraw", { submission_id: one.submission_id }, box) }, "Withdraw"), box);
      }),
      el("h2", {}, "Runs"),
      data.runs.map((run) => el("div", { class: "card" }, link("#/run/" + run.run_id, "run " + short(run.run_id)), " ", status(run), runActions(run))));
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
      runActions(run),
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

function entryNode(entry) {
  const data = entry.data || {};
  if (entry.kind === "tether.user") return el("div", { class: "entry user" }, el("div", { class: "who" }, "user"), data.text || "");
  if (entry.kind === "tether.assistant") {
    const calls = (data.tool_calls || []).map((call) => el("div", { class: "mono" }, `→ ${call.name} ${JSON.stringify(call.arguments)}`));
    return el("div", { class: "entry assistant", "data-entry": entry.entry_id }, el("div", { class: "who" }, "assistant"), data.text || "", calls);
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

function onPartial(event) {
  if (view.name !== "conversation" || event.conversation_id !== view.id) return;
  const stream = streams[event.operation_id] || { text: "" };
  if (event.status !== "streaming") { delete streams[event.operation_id]; schedule(); return; }
  if (event.offset <= stream.text.length) stream.text = stream.text.slice(0, event.offset) + event.text;
  streams[event.operation_id] = stream;
  const node = document.querySelector(`[data-stream="${event.operation_id}"]`);
  const transcript = document.getElementById("transcript");
  if (node) node.lastChild.textContent = stream.text;
  else if (transcript) transcript.append(streamNode(event.operation_id, stream.text));
}

function listen() {
  const live = document.getElementById("live");
  const source = new EventSource("/api/events");
  source.addEventListener("hello", () => { live.textContent = "live"; live.classList.add("on"); });
  source.addEventListener("partial", (message) => onPartial(JSON.parse(message.data)));
  source.addEventListener("change", (message) => {
    const change = JSON.parse(message.data);
    if (view.name === "conversation" && !change.conversations.includes(view.id)) return;
    if (view.name === "run" && !change.runs.includes(view.id)) return;
    schedule();
  });
  source.addEventListener("resync", () => schedule());
  source.onerror = () => { live.textContent = "reconnecting…"; live.classList.remove("on"); };
}

window.addEventListener("hashchange", route);
listen();
route();
