// Drives the stock AI SDK Chat (ai 6 or ai 7) against a server and reports what a browser would see.
// stdin: {version, api, chatId?, headers?, body?, timeoutMs?, settleMs?, transport?: 'sse'|'ws', wsUrl?,
//         steps: [{send, approvals?, toolOutputs?, dropSocketAfterChunks?, abortAfterChunks?} | {resume: true}]}
// transport 'ws' (wsUrl, default api): ai 7 uses its own WebSocketChatTransport, ai 6 the gateway's
// gateway/static/ws-transport.js; both over a WebSocket that records and checks every frame (lib/ws.mjs).
// Step options: `resume` calls chat.resumeStream() instead of sending. `abortAfterChunks: N` calls
// chat.stop() after N chunks of the step's first response (SSE: the fetch is aborted; ws: an `abort`
// frame). ws only: `dropSocketAfterChunks: N` closes the socket after N chunk frames of it, then calls
// chat.resumeStream() (a `resume` on a new socket); `dropContinuationAfterChunks: N` does the same in the
// response that continues after the step's first approvals are answered (the message's second response).
// `holdAnswersUntil: PATH` (a step option): once the step's approvals are on screen, the driver writes
// PATH + '.ready' and answers them only when PATH exists (the test does something in between, such as
// restarting the agent). `keepGoingAfterError: true` (top level): a step that ends in a Chat error does
// not end the run, the next step is sent as a person would after reading it; `stepErrors` reports each
// step's error (null if none).
// stdout: one JSON report. Exit code 0 whenever a report was produced; the caller asserts on `ok`.
// stdin may also be an array of such objects: they run concurrently in this one process (loading
// the SDK dominates a run's cost) and stdout is the array of reports in the same order.
import { createChat, createTeeFetch, describeChatError, loadSdk, pendingApprovals, waitForIdle } from './lib/chat.mjs';
import { baseWebSocket, createWsRecorder, loadFrameValidator, loadWebSocketTransport } from './lib/ws.mjs';
import { existsSync, writeFileSync } from 'node:fs';
import { decisions, readStdin } from './lib/steps.mjs';

async function holdUntil(path, deadline) {
  writeFileSync(path + '.ready', '');
  while (!existsSync(path)) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return true;
}

async function run(input) {
  const { version, api, chatId, headers, body, timeoutMs = 20000, settleMs = 150, steps = [] } = input;
  const { transport: transportKind = 'sse', wsUrl = api, keepGoingAfterError = false } = input;
  if (transportKind !== 'sse' && transportKind !== 'ws') throw new Error(`unknown transport ${transportKind}`);
  const ws = transportKind === 'ws';
  for (const option of ['dropSocketAfterChunks', 'dropContinuationAfterChunks']) {
    if (!ws && steps.some((s) => s[option] != null)) throw new Error(`${option} needs transport "ws"`);
  }
  const deadline = Date.now() + timeoutMs;
  const sdk = await loadSdk(version);
  // `tee` records the wire: the teeing fetch for SSE, the recording WebSocket for ws.
  let tee;
  let transport;
  if (ws) {
    tee = createWsRecorder({ sdk, WebSocket: await baseWebSocket(), validateFrame: await loadFrameValidator() });
    const WebSocketChatTransport = await loadWebSocketTransport(version, sdk);
    transport = new WebSocketChatTransport({ url: wsUrl, headers, body, webSocket: tee.webSocket });
  } else {
    tee = createTeeFetch({ sdk });
  }
  const toolCalls = [];
  let toolOutputs = {};

  const { chat } = await createChat({
    version,
    api,
    chatId,
    headers,
    body,
    fetch: tee.fetch,
    transport,
    onToolCall: (chat, { toolCall }) => {
      toolCalls.push(toolCall);
      if (!(toolCall.toolName in toolOutputs)) return;
      // Not awaited: onToolCall runs inside the SDK's serial job queue and addToolOutput queues
      // another job, so awaiting it here would deadlock (ai docs: 04-ai-sdk-ui/03-chatbot-tool-usage).
      const output = toolOutputs[toolCall.toolName];
      void chat.addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output });
    },
  });

  let timedOut = false;
  const stepErrors = [];
  const idle = async () => {
    if (!(await waitForIdle(chat, tee, { settleMs, deadline }))) timedOut = true;
    return !timedOut;
  };

  for (const step of steps) {
    toolOutputs = step.toolOutputs ?? {};
    const next = decisions(step.approvals);
    let armed = null;
    if (step.dropSocketAfterChunks != null || step.abortAfterChunks != null) {
      armed = tee.arm({
        dropAfter: step.dropSocketAfterChunks,
        abortAfter: step.abortAfterChunks,
        onAbort: () => void chat.stop(),
      });
    }
    // Not awaited directly: sendMessage (and resumeStream) also await any automatic continuation,
    // which must not outlive the deadline unobserved.
    const sent = (step.resume ? chat.resumeStream() : chat.sendMessage({ text: step.send })).catch((err) => err);
    if (!(await idle())) break;
    await sent;
    if (armed?.dropped) {
      // The Chat saw a network disconnect (status 'error'); a page would now resume the stream.
      tee.disarm();
      const resumed = chat.resumeStream().catch((err) => err);
      if (!(await idle())) break;
      await resumed;
    }
    if (armed) tee.disarm();
    // Answer like a person would: after the turn has ended and the buttons are on screen.
    // Each answer may trigger the SDK's automatic continuation, whose reply may ask again.
    let dropContinuation = step.dropContinuationAfterChunks;
    if (step.holdAnswersUntil != null && pendingApprovals(chat).length && !(await holdUntil(step.holdAnswersUntil, deadline))) {
      timedOut = true;
      break;
    }
    for (let parts = pendingApprovals(chat); parts.length && !timedOut; parts = pendingApprovals(chat)) {
      // The next request is the answer's: the continuation is its response.
      armed = dropContinuation == null ? null : tee.arm({ dropAfter: dropContinuation });
      dropContinuation = null;
      let answered = 0;
      for (const part of parts) {
        const decision = next();
        if (decision == null) break;
        await chat.addToolApprovalResponse({ id: part.approval.id, approved: decision === 'approve' });
        answered++;
      }
      if (!answered || !(await idle())) break;
      if (armed?.dropped) {
        tee.disarm();
        const resumed = chat.resumeStream().catch((err) => err);
        if (!(await idle())) break;
        await resumed;
      }
      armed = null;
    }
    stepErrors.push(describeChatError(sdk, chat.error));
    if (timedOut || (chat.status === 'error' && !keepGoingAfterError)) break;
  }

  await tee.settled(timedOut ? 100 : 2000);
  const { record } = tee;
  const error = describeChatError(sdk, chat.error);
  const report = {
    ok: !timedOut && chat.status !== 'error' && !error && record.schemaErrors.length === 0,
    version,
    transport: transportKind,
    chatId: chat.id,
    status: chat.status,
    error,
    timedOut,
    messages: chat.messages,
    toolCalls,
    chunks: record.chunks,
    schemaErrors: record.schemaErrors,
    requests: record.requests,
    stepErrors,
  };
  if (!ws) return { ...report, doneMarkers: record.doneMarkers };
  return {
    ...report,
    ok: report.ok && record.sequenceErrors.length === 0,
    terminals: record.terminals,
    frames: record.frames,
    sequenceErrors: record.sequenceErrors,
    sockets: record.sockets,
  };
}

const input = await readStdin();
const report = Array.isArray(input) ? await Promise.all(input.map(run)) : await run(input);
// Exit explicitly: a server that never closes a stream would otherwise keep node alive.
process.stdout.write(JSON.stringify(report) + '\n', () => process.exit(0));
