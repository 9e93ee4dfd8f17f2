// A resume, as the stock AI SDK Chat (ai 6 or ai 7, DefaultChatTransport) lives it, against recorded streams.
// stdin: [{version, first, continuation, replay, approved?, toolOutput?, dropAfter, stored: [[UIMessage...], ...]}]:
//   `first` asks for an approval (answered with `approved`) or calls a browser tool (whose output the page
//   adds: `toolOutput` {tool, toolCallId, output}), `continuation` answers that request, `replay` is what
//   GET /api/chat/{id}/stream sends on a resume (chunk lists; each is sent as SSE with its [DONE]).
// stdout: [{unbroken, dropped, reloaded: [...], errors: {...}}], the last assistant message of each way:
//   unbroken: the first response, the person answers, the continuation, all read whole;
//   dropped: the same page, whose connection fails (a network TypeError) after `dropAfter` chunks of the
//     continuation, then calls resumeStream() as useChat does on reconnect;
//   reloaded: a new page whose messages came from the app's storage (each of `stored`), calling resumeStream().
import { createChat, describeChatError, pendingApprovals, sleep, waitForIdle } from './lib/chat.mjs';

const input = JSON.parse(await new Promise((resolve) => {
  let data = '';
  process.stdin.on('data', (d) => (data += d));
  process.stdin.on('end', () => resolve(data));
}));

const encoder = new TextEncoder();

// An SSE body that hands out one chunk per pull; with `failAfter`, the connection fails after that many.
function sseBody(chunks, failAfter) {
  let index = 0;
  return new ReadableStream({
    async pull(controller) {
      if (failAfter != null && index === failAfter) {
        await sleep(50); // let what was sent reach the Chat, as a real network would
        controller.error(new TypeError('network error'));
        return;
      }
      if (index === chunks.length) {
        controller.enqueue(encoder.encode('data: [DONE]\n\n'));
        controller.close();
        return;
      }
      controller.enqueue(encoder.encode(`data: ${JSON.stringify(chunks[index++])}\n\n`));
    },
  });
}

function server({ posts, replay }) {
  const queue = [...posts];
  return async (url, init = {}) => {
    const headers = { 'content-type': 'text/event-stream', 'x-vercel-ai-ui-message-stream': 'v1' };
    if ((init.method ?? 'GET') === 'GET') {
      if (!String(url).endsWith('/stream')) throw new Error(`unexpected GET ${url}`);
      return new Response(sseBody(replay), { status: 200, headers });
    }
    const next = queue.shift();
    if (next == null) throw new Error('unexpected POST: no response left');
    return new Response(sseBody(next.chunks, next.failAfter), { status: 200, headers });
  };
}

const idle = { inFlight: 0 };

async function chatWith(version, fetch, messages) {
  const { chat, state, sdk } = await createChat({ version, api: 'http://gateway.test/api/chat', chatId: 'c1', fetch });
  if (messages) state.messages = structuredClone(messages);
  return { chat, sdk };
}

async function answerAll(chat, approved, toolOutput) {
  if (toolOutput != null) await chat.addToolOutput(toolOutput);
  for (const part of pendingApprovals(chat)) await chat.addToolApprovalResponse({ id: part.approval.id, approved });
  await waitForIdle(chat, idle, { deadline: Date.now() + 5000 });
}

const results = [];
for (const { version, first, continuation, replay, approved, toolOutput, dropAfter, stored = [] } of input) {
  const errors = {};
  const note = (name, sdk, chat) => {
    const text = describeChatError(sdk, chat.error);
    if (text) errors[name] = text;
  };

  let { chat, sdk } = await chatWith(version, server({ posts: [{ chunks: first }, { chunks: continuation }], replay }));
  await chat.sendMessage({ text: 'pay 50 to Hanako' });
  await waitForIdle(chat, idle, { deadline: Date.now() + 5000 });
  await answerAll(chat, approved, toolOutput);
  note('unbroken', sdk, chat);
  const unbroken = chat.messages.at(-1);

  ({ chat, sdk } = await chatWith(
    version, server({ posts: [{ chunks: first }, { chunks: continuation, failAfter: dropAfter }], replay }),
  ));
  await chat.sendMessage({ text: 'pay 50 to Hanako' });
  await waitForIdle(chat, idle, { deadline: Date.now() + 5000 });
  await answerAll(chat, approved, toolOutput);
  const cut = chat.status;
  await chat.resumeStream();
  await waitForIdle(chat, idle, { deadline: Date.now() + 5000 });
  note('dropped', sdk, chat);
  const dropped = { statusAfterCut: cut, message: chat.messages.at(-1), count: chat.messages.length };

  const reloaded = [];
  for (const [index, messages] of stored.entries()) {
    ({ chat, sdk } = await chatWith(version, server({ posts: [], replay }), messages));
    await chat.resumeStream();
    await waitForIdle(chat, idle, { deadline: Date.now() + 5000 });
    note(`reloaded ${index}`, sdk, chat);
    reloaded.push({ message: chat.messages.at(-1), count: chat.messages.length });
  }
  results.push({ unbroken, dropped, reloaded, errors });
}
// Drop undefined-valued keys the way a JSON round trip (the app's storage) would.
process.stdout.write(JSON.stringify(results));
