// Runs the same scripted WebSocket exchanges through ai 7's WebSocketChatTransport and through
// gateway/static/ws-transport.js (the ai 6 one) over an in-memory fake socket, and prints what each
// did: frames sent, sockets opened and closed, chunks and errors seen by the reader.
// stdout: {"6": {scenario: outcome}, "7": {scenario: outcome}}. No network, no Chat: transport only.
import { loadSdk } from './lib/chat.mjs';
import { loadWebSocketTransport } from './lib/ws.mjs';

const tick = (ms = 0) => new Promise((resolve) => setTimeout(resolve, ms));

// The socket `index` once the transport has sent its first frame on it, which happens a timer after
// the fake socket opens: a fixed tick raced that timer on a loaded machine (parallel test workers).
async function sentOn(sockets, index) {
  for (let waited = 0; waited < 5000; waited += 1) {
    if (sockets[index]?.sent.length) return sockets[index];
    await tick(1);
  }
  throw new Error(`socket ${index} sent nothing within 5000 ticks`);
}

function fakeWebSocket({ refuse = false } = {}) {
  const sockets = [];
  class FakeSocket {
    static OPEN = 1;
    readyState = 0;
    bufferedAmount = 0;
    sent = [];
    closeCalls = [];

    constructor(url, protocols) {
      this.url = String(url);
      this.protocols = protocols ?? null;
      sockets.push(this);
      setTimeout(() => {
        if (refuse) {
          this.readyState = 3;
          this.onerror?.({});
          this.onclose?.({ code: 1006, reason: '' });
          return;
        }
        this.readyState = 1;
        this.onopen?.({});
      }, 1);
    }

    send(data) {
      if (this.readyState !== 1) throw new Error('send on a socket that is not open');
      this.sent.push(JSON.parse(data));
    }

    close(code, reason) {
      this.closeCalls.push(code ?? null);
      // The WebSocket API only lets a client close with 1000 or 3000-4999.
      if (code !== undefined && code !== 1000 && (code < 3000 || code > 4999)) {
        throw new DOMException('invalid code', 'InvalidAccessError');
      }
      if (this.readyState >= 2) return;
      this.readyState = 2;
      setTimeout(() => {
        this.readyState = 3;
        this.onclose?.({ code: code ?? 1005, reason: reason ?? '' });
      }, 1);
    }

    // server side
    frame(value) {
      this.onmessage?.({ data: typeof value === 'string' ? value : JSON.stringify(value) });
    }

    drop(code = 1006) {
      this.readyState = 3;
      this.onclose?.({ code, reason: '' });
    }
  }
  return { FakeSocket, sockets };
}

const chunk = (n) => ({ type: 'text-delta', id: 't', delta: String(n) });

// Reads a stream to its end; returns {chunks, done, error}.
async function drain(stream) {
  const out = { chunks: [], done: false, error: null };
  const reader = stream.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      out.chunks.push(value.delta ?? value.type);
    }
    out.done = true;
  } catch (err) {
    out.error = describe(err);
  }
  return out;
}

function describe(err) {
  if (err == null) return null;
  return { name: err.name, typeError: err instanceof TypeError, message: String(err.message) };
}

const send = (transport, extra = {}) =>
  transport.sendMessages({
    chatId: 'c1',
    messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'hi' }] }],
    abortSignal: undefined,
    trigger: 'submit-message',
    messageId: undefined,
    ...extra,
  });

const sockSummary = (sockets) =>
  sockets.map((s) => ({ url: s.url, sent: s.sent.map((f) => f.type), closeCalls: s.closeCalls }));

const SCENARIOS = {
  async frames(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({
      url: 'http://example.test/api/chat/ws?x=1',
      webSocket: FakeSocket,
      protocols: ['p1'],
      params: async () => ({ token: 'tk' }),
      headers: { 'X-A': '1', Drop: undefined },
      body: () => ({ fromTransport: true, shared: 'transport' }),
    });
    const stream = await send(transport, {
      headers: new Headers({ 'X-B': '2' }),
      body: { shared: 'call' },
      metadata: { m: 1 },
    });
    const [s] = sockets;
    const frame = s.sent[0];
    s.frame({ type: 'chunk', requestId: frame.requestId, sequence: 0, chunk: chunk(0) });
    s.frame({ type: 'end', requestId: frame.requestId });
    const read = await drain(stream);
    const { requestId, ...rest } = frame;
    return { url: s.url, protocols: s.protocols, frame: { ...rest, requestId: typeof requestId }, read };
  },

  async multiplex(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const [a, b] = await Promise.all([send(transport), send(transport)]);
    const [s] = sockets;
    const [ra, rb] = s.sent.map((f) => f.requestId);
    s.frame({ type: 'chunk', requestId: rb, sequence: 0, chunk: chunk('b0') });
    s.frame({ type: 'chunk', requestId: ra, sequence: 0, chunk: chunk('a0') });
    s.frame({ type: 'chunk', requestId: 'someone-else', sequence: 5, chunk: chunk('x') });
    s.frame({ type: 'chunk', requestId: ra, sequence: 1, chunk: chunk('a1') });
    s.frame({ type: 'end', requestId: rb });
    s.frame({ type: 'end', requestId: ra });
    s.frame({ type: 'chunk', requestId: ra, sequence: 2, chunk: chunk('late') });
    return { a: await drain(a), b: await drain(b), sockets: sockSummary(sockets) };
  },

  async duplicates(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const stream = await send(transport);
    const [s] = sockets;
    const id = s.sent[0].requestId;
    for (const n of [0, 1, 1, 0, 2]) s.frame({ type: 'chunk', requestId: id, sequence: n, chunk: chunk(n) });
    s.frame({ type: 'end', requestId: id });
    return { read: await drain(stream) };
  },

  async gap(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const [a, b] = await Promise.all([send(transport), send(transport)]);
    const [s] = sockets;
    const id = s.sent[0].requestId;
    s.frame({ type: 'chunk', requestId: id, sequence: 0, chunk: chunk(0) });
    s.frame({ type: 'chunk', requestId: id, sequence: 2, chunk: chunk(2) });
    const reads = { a: await drain(a), b: await drain(b) };
    await tick(5);
    const next = send(transport); // a new socket
    const second = await sentOn(sockets, 1);
    second.frame({ type: 'end', requestId: second.sent[0].requestId });
    return { ...reads, next: await drain(await next), sockets: sockSummary(sockets) };
  },

  async malformed(T) {
    const results = {};
    const bads = [
      'not json',
      { type: 'chunk' },
      { type: 'bogus', requestId: 'R' },
      { type: 'chunk', requestId: 'R', sequence: -1, chunk: chunk(0) },
    ];
    for (const bad of bads) {
      const { FakeSocket, sockets } = fakeWebSocket();
      const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
      const stream = await send(transport);
      const [s] = sockets;
      const id = s.sent[0].requestId;
      s.frame(typeof bad === 'string' ? bad : { ...bad, ...(bad.requestId ? { requestId: id } : {}) });
      const read = await drain(stream);
      results[JSON.stringify(bad)] = { failed: read.error != null, typeError: read.error?.typeError ?? null };
    }
    return results;
  },

  // ai 7 validates each chunk against its schema and drops the connection on a bad one; ours hands it to
  // the Chat unvalidated (no schema dependency), so this is the one intended difference.
  async invalidChunk(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const stream = await send(transport);
    const [s] = sockets;
    const id = s.sent[0].requestId;
    s.frame({ type: 'chunk', requestId: id, sequence: 0, chunk: { type: 'tool-progress', toolCallId: 'c1' } });
    s.frame({ type: 'end', requestId: id });
    return { read: await drain(stream) };
  },

  async errorFrame(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const [a, b] = await Promise.all([send(transport), send(transport)]);
    const [s] = sockets;
    s.frame({ type: 'error', requestId: s.sent[0].requestId, errorText: 'boom' });
    s.frame({ type: 'error', requestId: s.sent[1].requestId });
    return { a: await drain(a), b: await drain(b), sockets: sockSummary(sockets) };
  },

  async resume(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket, body: { b: 1 } });
    const out = {};
    const none = transport.reconnectToStream({ chatId: 'c1', headers: { h: 'v' } });
    const s = await sentOn(sockets, 0);
    const { requestId, ...frame } = s.sent[0];
    out.frame = frame;
    s.frame({ type: 'no-active', requestId });
    out.noActive = await none;
    for (const opener of ['start', 'chunk', 'end']) {
      const pending = transport.reconnectToStream({ chatId: 'c1' });
      await tick(1);
      const id = s.sent.at(-1).requestId;
      const first = { type: opener, requestId: id };
      s.frame(opener === 'chunk' ? { ...first, sequence: 0, chunk: chunk(0) } : first);
      const stream = await pending;
      if (opener !== 'end') {
        s.frame({ type: 'chunk', requestId: id, sequence: opener === 'chunk' ? 1 : 0, chunk: chunk('r') });
        s.frame({ type: 'end', requestId: id });
      }
      out[opener] = await drain(stream);
    }
    const failing = transport.reconnectToStream({ chatId: 'c1' });
    await tick(1);
    s.frame({ type: 'error', requestId: s.sent.at(-1).requestId, errorText: 'nope' });
    out.error = await failing.then(() => 'resolved', describe);
    return out;
  },

  async abort(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const controller = new AbortController();
    const stream = await send(transport, { abortSignal: controller.signal });
    const [s] = sockets;
    const id = s.sent[0].requestId;
    s.frame({ type: 'chunk', requestId: id, sequence: 0, chunk: chunk(0) });
    const reading = drain(stream);
    await tick(1);
    controller.abort();
    s.frame({ type: 'chunk', requestId: id, sequence: 1, chunk: chunk(1) });
    const read = await reading;
    // cancel() by the reader also tells the server
    const other = await send(transport);
    await other.cancel();
    // an already aborted signal never reaches the wire
    const early = await send(transport, { abortSignal: AbortSignal.abort() }).then(() => 'resolved', describe);
    // aborting a pending resume rejects it with an AbortError
    const c2 = new AbortController();
    const pendingResume = transport.reconnectToStream({ chatId: 'c1', abortSignal: c2.signal });
    await tick(1);
    c2.abort();
    const resumeAbort = await pendingResume.then(() => 'resolved', describe);
    const sent = s.sent.map((f) => f.type);
    const indexOf = (requestId) => s.sent.findIndex((g) => g.requestId === requestId);
    const abortTargets = s.sent.filter((f) => f.type === 'abort').map((f) => indexOf(f.requestId));
    return { read, early, resumeAbort, sent, abortTargets };
  },

  async serverClose(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const stream = await send(transport);
    const [s] = sockets;
    s.frame({ type: 'chunk', requestId: s.sent[0].requestId, sequence: 0, chunk: chunk(0) });
    s.frame({ type: 'end', requestId: s.sent[0].requestId });
    const second = await send(transport);
    s.frame({ type: 'chunk', requestId: s.sent[1].requestId, sequence: 0, chunk: chunk(0) });
    s.drop(1001);
    const reads = { first: await drain(stream), second: await drain(second) };
    const third = await send(transport);
    sockets[1].frame({ type: 'end', requestId: sockets[1].sent[0].requestId });
    return { ...reads, third: await drain(third), sockets: sockSummary(sockets) };
  },

  async refused(T) {
    const { FakeSocket, sockets } = fakeWebSocket({ refuse: true });
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const error = await send(transport).then(() => 'resolved', describe);
    return { error, sockets: sockets.length };
  },

  async close(T) {
    const { FakeSocket, sockets } = fakeWebSocket();
    const transport = new T({ url: 'ws://example.test/ws', webSocket: FakeSocket });
    const stream = await send(transport);
    transport.close();
    const read = await drain(stream);
    const next = send(transport);
    await sentOn(sockets, 1);
    sockets[1].frame({ type: 'end', requestId: sockets[1].sent[0].requestId });
    return { read, next: await drain(await next), sockets: sockSummary(sockets) };
  },

  async badUrl(T) {
    const { FakeSocket } = fakeWebSocket();
    const out = {};
    for (const url of ['/relative', 'ftp://example.test/x', 'ws://example.test/x#frag']) {
      out[url] = await send(new T({ url, webSocket: FakeSocket })).then(() => 'resolved', (e) => e.message);
    }
    return out;
  },
};

const sdk7 = await loadSdk(7);
const report = {};
for (const version of [6, 7]) {
  const T = await loadWebSocketTransport(version, sdk7);
  report[version] = { resumeStreamIsReplay: new T({ url: 'ws://x.test/' }).resumeStreamIsReplay };
  for (const [name, scenario] of Object.entries(SCENARIOS)) {
    try {
      report[version][name] = await scenario(T);
    } catch (err) {
      report[version][name] = { crashed: String(err?.stack ?? err) };
    }
  }
}
process.stdout.write(JSON.stringify(report) + '\n', () => process.exit(0));
