// Checks AG-UI 1.0 event streams with the protocol's own packages (tests/test_agui_events.py).
// stdin: [{events: [...], messages?: [...]}], stdout: [{schemaErrors, verifyError, runError, messages}]:
// - schemaErrors: each event that @ag-ui/core's EventSchema refuses, with zod's issues;
// - verifyError: what @ag-ui/client's verifyEvents (the check that refuses events out of order) threw;
// - runError, messages: the whole client pipeline (an AbstractAgent's runAgent: enforce, chunk
//   transform, verify, apply) over the same events, and the messages it assembled, starting from
//   `messages` (the thread the client held before the run; none by default).
import { AbstractAgent, verifyEvents } from '@ag-ui/client';
import { EventSchema } from '@ag-ui/core/schemas';
import { from, lastValueFrom, toArray } from 'rxjs';

class Replay extends AbstractAgent {
  constructor(events, messages) {
    super({ threadId: events[0]?.threadId ?? 't1', initialMessages: messages });
    this.events = events;
  }

  run() {
    return from(structuredClone(this.events));
  }
}

async function check({ events, messages = [] }) {
  const schemaErrors = [];
  for (const [index, event] of events.entries()) {
    const result = EventSchema.safeParse(event);
    if (!result.success) schemaErrors.push({ index, event, issues: result.error.issues });
  }
  let verifyError = null;
  try {
    await lastValueFrom(from(structuredClone(events)).pipe(verifyEvents(), toArray()));
  } catch (error) {
    verifyError = String(error?.message ?? error);
  }
  let runError = null;
  const agent = new Replay(events, messages);
  let failed = null;
  try {
    await agent.runAgent({ runId: events[0]?.runId }, { onRunErrorEvent: ({ event }) => { failed = event.message; } });
  } catch (error) {
    runError = String(error?.message ?? error);
  }
  return { schemaErrors, verifyError, runError, runErrorEvent: failed, messages: agent.messages };
}

const input = JSON.parse(await new Promise((resolve) => {
  let data = '';
  process.stdin.on('data', (d) => (data += d));
  process.stdin.on('end', () => resolve(data));
}));
const results = [];
for (const stream of input) results.push(await check(stream));
process.stdout.write(JSON.stringify(results));
