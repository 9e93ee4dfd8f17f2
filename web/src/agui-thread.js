// The AG-UI side of the AG-UI page: one thread with the gateway's AG-UI route, on the stock
// `HttpAgent` of @ag-ui/client. The agent object keeps the thread's messages and the interrupts
// its last run ended with; this class adds what a UI needs on top (is a run going, the person's
// answers, the error to show) and drives the two ways a run hands control back to the page:
// approvals (RUN_FINISHED outcome `interrupt`, answered by `resume` on the next run) and browser
// tools (outcome `success` with `pendingToolCallIds`, answered by tool messages on the next run).
import { HttpAgent, randomUUID } from '@ag-ui/client';
import { aguiRoute } from './agents.js';
import { runBrowserTool, runsInBrowser } from './browser-tools.js';

export const APPROVAL_ACTIVITY = 'adk_gateway.approval';

// What the page tells the gateway about the browser tools it runs. The gateway checks the names
// against the agent's policy (`runs_in: browser`, listed by GET /api/agents); the model already
// knows the tools from the agent's own code, so the description is for people reading the request.
const DESCRIPTIONS = {
  get_location: "The browser's position (Geolocation API).",
  change_bgm: 'Plays a short chord as background music (WebAudio).',
};

function declaredTools(agent) {
  return (agent.browser_tools ?? []).map((name) => ({
    name,
    description: DESCRIPTIONS[name] ?? `${name}, run in the browser.`,
    parameters: { type: 'object', properties: {} },
  }));
}

// A thread id is the gateway's chat id: letters, digits, `_` and `-` (a UUID is all of those).
const newId = () => randomUUID();

export class AguiThread {
  // 'ready', 'running' (a run streams) or 'browser' (the page runs the tools a run handed over).
  status = 'ready';
  error = null; // {message, code?} of the last run, until the next one starts
  // The person's answers, by tool call id: {approved, cancelled?}. Kept for the whole thread, so a
  // card still says who decided it after the run that carried the answer.
  decisions = new Map();
  // Browser tool calls the page is running now (their ids).
  handed = new Set();
  #answers = new Map(); // interrupt id -> resume entry, until the run that carries them ends

  constructor({ agent, onChange, onPlaying }) {
    this.agent = agent;
    this.onChange = onChange;
    this.onPlaying = onPlaying;
    this.http = new HttpAgent({ url: aguiRoute(agent), threadId: newId() });
    this.http.subscribe({ onMessagesChanged: () => this.onChange() });
  }

  get id() { return this.http.threadId; }
  get messages() { return this.http.messages; }
  get busy() { return this.status !== 'ready'; }

  // The interrupts the last run ended with that the person has not answered yet.
  get unanswered() {
    return this.http.pendingInterrupts.filter((interrupt) => !this.#answers.has(interrupt.id));
  }

  interruptFor(toolCallId) {
    return this.http.pendingInterrupts.find((interrupt) => interrupt.toolCallId === toolCallId);
  }

  send(text) {
    if (this.busy) return;
    this.http.addMessage({ id: newId(), role: 'user', content: text });
    // A new message instead of an answer cancels the calls still waiting for one, as on the AI SDK
    // page (docs/approvals.md); the client refuses a run that leaves an interrupt unaddressed.
    for (const interrupt of this.unanswered) {
      this.#answers.set(interrupt.id, { interruptId: interrupt.id, status: 'cancelled' });
      this.decisions.set(interrupt.toolCallId, { approved: false, cancelled: true });
    }
    void this.#run(this.#resume());
  }

  // The person's Approve / Deny on one interrupt. The run resumes once every interrupt the last
  // run ended with has an answer (two payments in one turn are answered together).
  answer(interrupt, approved) {
    if (this.busy || this.answered(interrupt.id)) return;
    this.#answers.set(interrupt.id, { interruptId: interrupt.id, status: 'resolved', payload: { approved } });
    this.decisions.set(interrupt.toolCallId, { approved });
    this.onChange();
    if (!this.unanswered.length) void this.#run(this.#resume());
  }

  answered(interruptId) {
    return this.#answers.has(interruptId);
  }

  // The answers to every interrupt the last run ended with, for the next run's input.
  #resume() {
    const resume = this.http.pendingInterrupts.map((interrupt) => this.#answers.get(interrupt.id)).filter(Boolean);
    return resume.length ? { resume } : {};
  }

  stop() {
    this.http.abortRun(); // the client ends the run quietly; the gateway sees the browser leave
  }

  async #run(params) {
    this.status = 'running';
    this.error = null;
    this.onChange();
    let pending = [];
    try {
      await this.http.runAgent({ ...params, tools: declaredTools(this.agent) }, {
        onRunFinishedEvent: (event) => {
          if (event.outcome === 'success') pending = this.#browserCalls(event.pendingToolCallIds, event.messages);
        },
        onRunErrorEvent: ({ event }) => {
          this.error = { message: event.message, code: event.code };
        },
        onCustomEvent: ({ event, messages }) => this.#ruleDecision(event, messages),
        // A failed request (an HTTP error, a broken stream): shown on the page, not thrown (the
        // client would log it to the console and reject).
        onRunFailed: ({ error }) => {
          this.error = { message: failureText(error), code: error.payload?.error?.code };
          return { stopPropagation: true };
        },
      });
    } catch (error) {
      this.error = { message: error.message }; // refused before any request, e.g. an expired interrupt
    }
    this.#answers.clear();
    if (this.error) {
      // Answers the gateway refused did not count: their interrupts are open again.
      for (const interrupt of this.http.pendingInterrupts) this.decisions.delete(interrupt.toolCallId);
    } else if (pending.length) {
      await this.#runBrowserTools(pending);
      return this.#run({});
    }
    this.status = 'ready';
    this.onChange();
  }

  // A call a rule of the gateway decided (CUSTOM adk_gateway.approval): shown where it happened,
  // as an activity message of its own (the client leaves activity out of what it sends back).
  // An approvers' decision has its activity already.
  #ruleDecision(event, messages) {
    if (event.name !== APPROVAL_ACTIVITY || !event.value?.approvalId) return undefined;
    const known = messages.some((message) => message.id === `approval-${event.value.approvalId}`);
    if (known) return undefined;
    const note = {
      id: `rule-${event.value.approvalId}`,
      role: 'activity',
      activityType: APPROVAL_ACTIVITY,
      content: { state: 'automatic', ...event.value },
    };
    return { messages: [...messages, note] };
  }

  // The calls among `ids` that are the page's to run. Without the run's own list the client counts
  // every call it started and saw no result for; one the server runs (a refund its approvers have
  // not decided when the run ended) is left alone, as the AI SDK page leaves it: an answer from the
  // page would be taken as that call's output.
  #browserCalls(ids, messages) {
    const calls = messages.flatMap((message) => message.toolCalls ?? []);
    return ids.filter((id) => runsInBrowser(this.agent, calls.find((call) => call.id === id)?.function.name));
  }

  async #runBrowserTools(ids) {
    this.status = 'browser';
    for (const id of ids) this.handed.add(id);
    this.onChange();
    const calls = this.messages.flatMap((message) => message.toolCalls ?? []);
    const results = await Promise.all(ids.map((id) => {
      const call = calls.find((each) => each.id === id);
      const toolCall = { toolCallId: id, toolName: call?.function.name ?? 'unknown', input: parseJson(call?.function.arguments) };
      return new Promise((resolve) => runBrowserTool(toolCall, resolve, { onPlaying: this.onPlaying }))
        .then((result) => toolMessage(id, result));
    }));
    this.handed.clear();
    this.http.addMessages(results);
  }
}

// browser-tools.js answers `{output}` or `{state: 'output-error', errorText}` (the AI SDK's shape);
// AG-UI's tool message carries the output as a JSON string, and a failure in `error` too.
function toolMessage(toolCallId, result) {
  const base = { id: newId(), role: 'tool', toolCallId };
  if (result.state === 'output-error') return { ...base, content: JSON.stringify({ error: result.errorText }), error: result.errorText };
  return { ...base, content: JSON.stringify(result.output ?? null) };
}

export function parseJson(text) {
  try {
    return JSON.parse(text || '{}');
  } catch {
    return text;
  }
}

// The client's HTTP failure is "HTTP <status>: <body>"; the gateway's body says it in a sentence.
function failureText(error) {
  const message = error.payload?.error?.message;
  return typeof message === 'string' ? `${message} (HTTP ${error.status})` : error.message;
}
