// Drives @ag-ui/client's HttpAgent (1.0.0, pinned in package.json) against a server under test and
// reports what an AG-UI app would see (tests/jsdriver.py run_agui; tests/integration/test_agui_clients.py).
// stdin: {runs: [...], concurrency?: 4} (or the list of runs alone); the runs go concurrently in this one
// process, at most `concurrency` at once (loading the client dominates a run's cost). A run:
//   {url, agent?, headers?, threadId?, messages?, tools?: [{name, description, parameters}], timeoutMs?, steps}
//   `agent` is a path appended to `url` ("/agents/support_agent/ag-ui"); `messages` the thread the agent
//   starts with (AG-UI messages); `tools` (frontend tools) go with every run.
// A step: {send?, approvals?: "approve" | "deny" | [...], toolOutputs?: {tool_name: output},
//          cancelInterrupts?: true, resume?: [ResumeEntry], resendResume?: true}
//   `send` adds a user message and runs the agent. Then, as an app would: while the last run ended in
//   an interrupt (agent.pendingInterrupts) and `approvals` has a decision for each, it runs again with
//   `resume` (approve: resolved {approved: true}; deny: resolved {approved: false, reason}); while it
//   finished with outcome.pendingToolCallIds and `toolOutputs` has each tool's output, it adds one tool
//   message per call (the output as JSON) and runs again. At most MAX_ROUNDS such runs per step.
//   `cancelInterrupts`: the step's first run answers the open interrupts with status "cancelled" (the
//   AG-UI way of moving on without answering). `resendResume`: the step's first run sends the last
//   resume entries again (a client answering twice), with no new message; `resume`: these entries.
// Every event is recorded off the wire (a teeing fetch: nothing the client's stages strip or drop is
// hidden) and checked with @ag-ui/core's EventSchema (schemaErrors); the client's own pipeline
// (enforce, verify, apply) runs on them too, and what it throws is pipelineErrors.
// stdout: {reports, warnings (the client's console.warn, whole batch)}; a report per run, in input order: {threadId, timedOut, runs: [{input: {resume,
// tools, messageCount}, events, outcome, interrupts, pendingToolCallIds, runErrors, pipelineError,
// status}], events (every run's, in order), schemaErrors, pipelineErrors, runErrors, outcomes,
// messages (the agent's final messages), activities (ACTIVITY_SNAPSHOT contents), handed (browser
// tool calls answered by the driver: {toolCallId, toolName}), httpStatuses}.
import { HttpAgent } from '@ag-ui/client';
import { EventSchema } from '@ag-ui/core/schemas';
import { randomUUID } from 'node:crypto';
import { decisions, readStdin } from './lib/steps.mjs';

const MAX_ROUNDS = 8;
const DENY_REASON = 'Denied by the test driver.';

// The client reports what its stages strip or drop through console.warn; a report keeps them.
const warnings = [];
console.warn = (...args) => warnings.push(args.map(String).join(' '));

// The SSE data payloads of a byte stream, parsed; unparseable ones are reported as such.
async function readSse(stream, onEvent) {
  const decoder = new TextDecoder();
  let buffer = '';
  const flush = (block) => {
    const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, ''));
    if (!data.length) return;
    const text = data.join('\n');
    try {
      onEvent(JSON.parse(text));
    } catch {
      onEvent({ unparseable: text });
    }
  };
  for await (const piece of stream) {
    buffer += decoder.decode(piece, { stream: true });
    const blocks = buffer.split('\n\n');
    buffer = blocks.pop();
    for (const block of blocks) flush(block);
  }
  if (buffer.trim()) flush(buffer);
}

// A fetch that hands the client its response and reads a copy of the body: the events as sent.
function teeingFetch(record) {
  return async (url, init) => {
    const response = await fetch(url, init);
    const current = record.current;
    current.status = response.status;
    current.contentType = response.headers.get('content-type');
    if (!response.ok || !response.body) return response;
    const [mine, theirs] = response.body.tee();
    current.reading = readSse(mine, (event) => {
      current.events.push(event);
      const result = EventSchema.safeParse(event);
      if (!result.success) record.schemaErrors.push({ event, issues: result.error.issues });
    }).catch((error) => {
      current.readError = String(error?.message ?? error);
    });
    return new Response(theirs, { status: response.status, statusText: response.statusText, headers: response.headers });
  };
}

function toolName(agent, toolCallId) {
  for (const message of agent.messages) {
    const call = (message.toolCalls ?? []).find((c) => c.id === toolCallId);
    if (call) return call.function.name;
  }
  return undefined;
}

async function runOnce(agent, record, params, deadline) {
  const current = {
    input: { resume: params.resume ?? null, tools: (params.tools ?? []).map((t) => t.name), messageCount: agent.messages.length },
    events: [], outcome: null, interrupts: [], pendingToolCallIds: [], runErrors: [], pipelineError: null,
    status: null, reading: null,
  };
  record.current = current;
  record.runs.push(current);
  const subscriber = {
    onRunFinishedEvent: ({ outcome, interrupts, pendingToolCallIds }) => {
      current.outcome = outcome;
      current.interrupts = interrupts ?? [];
      current.pendingToolCallIds = pendingToolCallIds ?? [];
    },
    onRunErrorEvent: ({ event }) => {
      current.outcome = 'error';
      current.runErrors.push({ message: event.message, code: event.code ?? null });
    },
  };
  const timer = setTimeout(() => {
    record.timedOut = true;
    agent.abortRun();
  }, Math.max(0, deadline - Date.now()));
  try {
    await agent.runAgent({ runId: randomUUID(), ...params }, subscriber);
  } catch (error) {
    current.pipelineError = String(error?.message ?? error);
  } finally {
    clearTimeout(timer);
  }
  await current.reading;
  delete current.reading;
  return current;
}

function answers(agent, next) {
  const resume = [];
  for (const interrupt of agent.pendingInterrupts) {
    const decision = next();
    if (decision == null) return null;
    const payload = decision === 'approve' ? { approved: true } : { approved: false, reason: DENY_REASON };
    resume.push({ interruptId: interrupt.id, status: 'resolved', payload });
  }
  return resume;
}

function toolMessages(agent, ids, outputs, handed) {
  const messages = [];
  for (const toolCallId of ids) {
    const name = toolName(agent, toolCallId);
    if (name == null || !(name in outputs)) return null;
    messages.push({ id: randomUUID(), role: 'tool', toolCallId, content: JSON.stringify(outputs[name]) });
    handed.push({ toolCallId, toolName: name });
  }
  return messages;
}

async function step(agent, record, spec, state, deadline) {
  const base = state.tools.length ? { tools: state.tools } : {};
  const first = { ...base };
  if (spec.cancelInterrupts) {
    first.resume = agent.pendingInterrupts.map((i) => ({ interruptId: i.id, status: 'cancelled' }));
  } else if (spec.resume) {
    first.resume = spec.resume;
  } else if (spec.resendResume) {
    first.resume = state.lastResume ?? [];
  }
  if (spec.send != null) agent.addMessage({ id: randomUUID(), role: 'user', content: spec.send });
  if (first.resume) state.lastResume = first.resume;
  let last = await runOnce(agent, record, first, deadline);
  const next = decisions(spec.approvals);
  for (let round = 0; round < MAX_ROUNDS && !record.timedOut && !last.pipelineError; round++) {
    if (last.outcome === 'interrupt') {
      const resume = answers(agent, next);
      if (resume == null) break;
      state.lastResume = resume;
      last = await runOnce(agent, record, { ...base, resume }, deadline);
    } else if (last.outcome === 'success' && last.pendingToolCallIds.length) {
      const messages = toolMessages(agent, last.pendingToolCallIds, spec.toolOutputs ?? {}, record.handed);
      if (messages == null) break;
      agent.addMessages(messages);
      last = await runOnce(agent, record, base, deadline);
    } else {
      break;
    }
  }
}

function summary(record, agent) {
  const runs = record.runs;
  const events = runs.flatMap((r) => r.events);
  return {
    threadId: agent.threadId,
    timedOut: record.timedOut,
    runs,
    events,
    schemaErrors: record.schemaErrors,
    pipelineErrors: runs.map((r) => r.pipelineError).filter((e) => e != null),
    runErrors: runs.flatMap((r) => r.runErrors),
    outcomes: runs.map((r) => ({ outcome: r.outcome, pendingToolCallIds: r.pendingToolCallIds, interrupts: r.interrupts })),
    messages: agent.messages,
    activities: events.filter((e) => e.type === 'ACTIVITY_SNAPSHOT' || e.type === 'ACTIVITY_DELTA'),
    handed: record.handed,
    httpStatuses: runs.map((r) => r.status),
  };
}

async function drive(input) {
  const { url, agent: path = '', headers, threadId, messages = [], tools = [], timeoutMs = 30000, steps = [] } = input;
  const deadline = Date.now() + timeoutMs;
  const record = { runs: [], schemaErrors: [], handed: [], timedOut: false, current: null };
  const agent = new HttpAgent({
    url: url + path, headers, threadId: threadId ?? `agui-${randomUUID()}`, initialMessages: messages, fetch: teeingFetch(record),
  });
  const state = { tools, lastResume: null };
  for (const spec of steps) {
    if (record.timedOut) break;
    await step(agent, record, spec, state, deadline);
  }
  return summary(record, agent);
}

// At most `concurrency` runs at once: the gateway caps the streams one user has open (limits.
// max_streams_per_user, 8 in config/gateway.yaml), and every run here is the same user.
async function driveAll(runs, concurrency) {
  const reports = new Array(runs.length);
  let next = 0;
  const worker = async () => {
    while (next < runs.length) {
      const index = next++;
      reports[index] = await drive(runs[index]);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(concurrency, runs.length)) }, worker));
  return reports;
}

const input = await readStdin();
const { runs, concurrency = 4 } = Array.isArray(input) ? { runs: input } : input;
const reports = await driveAll(runs, concurrency);
const output = { reports, warnings };
// Exit explicitly: a server that never closes a stream would otherwise keep node alive.
process.stdout.write(JSON.stringify(output) + '\n', () => process.exit(0));
