// WebSocket side of the chat driver: the transport under test (ai 7's own WebSocketChatTransport, or
// gateway/static/ws-transport.js for ai 6) gets a WebSocket constructor that records every frame both
// ways, checks the frame protocol (sequences, terminals) and validates every chunk with the SDK's own
// uiMessageChunkSchema, independently of what the transport and the Chat make of them.
import { describeSchemaError, sleep } from './chat.mjs';

const OUR_TRANSPORT = new URL('../../../gateway/static/ws-transport.js', import.meta.url);

// ai 7 ships a WebSocket transport; ai 6 apps use the gateway's module, which speaks the same frames.
export async function loadWebSocketTransport(version, sdk) {
  if (version === 7) return sdk.WebSocketChatTransport;
  return (await import(OUR_TRANSPORT.href)).WebSocketChatTransport;
}

// Node 20 has no global WebSocket; undici (a dependency of the SDK) has the standard one.
export async function baseWebSocket() {
  return globalThis.WebSocket ?? (await import('undici')).WebSocket;
}

const TERMINALS = new Set(['end', 'error', 'no-active']);

// ai 7's own server-side check of client frames: what ours sends must pass it too.
export async function loadFrameValidator() {
  return (await import('ai7')).safeValidateWebSocketChatTransportRequest;
}

export function createWsRecorder({ sdk, WebSocket: Base, validateFrame }) {
  const schema = sdk.uiMessageChunkSchema();
  const record = {
    requests: [], // one per send/resume frame: {type, requestId, url, body: <the frame>, socket, ...what came back}
    chunks: [], // [requestIndex, chunk]
    schemaErrors: [],
    terminals: [], // per request: 'end' | 'error' | 'no-active' | null
    sequenceErrors: [], // frame protocol violations: gaps, bad first sequence, late or malformed frames
    frames: { in: 0, out: 0 },
    sockets: [], // {url, opened, close: {code, reason} | null, droppedByDriver}
  };
  const byRequestId = new Map();
  const validations = new Set();
  const live = new Set(); // sockets not closed yet
  let armed = null;

  const problem = (entry, error, frame) => {
    const request = entry ? record.requests.indexOf(entry) : null;
    record.sequenceErrors.push({ request, requestId: frame?.requestId, error });
  };

  const validate = (index, sequence, chunk) => {
    const job = Promise.resolve(schema.validate(chunk)).then((result) => {
      if (!result.success) {
        const error = describeSchemaError(chunk, result.error);
        record.schemaErrors.push({ request: index, index: sequence, chunk, error });
      }
    });
    validations.add(job);
    job.finally(() => validations.delete(job));
  };

  const outgoing = (socketInfo, data) => {
    record.frames.out++;
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      problem(null, 'client sent a frame that is not JSON', null);
      return;
    }
    if (validateFrame) {
      const job = validateFrame({ value: frame }).then((result) => {
        if (!result.success) {
          const why = `client ${frame?.type} frame rejected by ai 7's validator: ${result.error.message}`;
          problem(byRequestId.get(frame?.requestId), why, frame);
        }
      });
      validations.add(job);
      job.finally(() => validations.delete(job));
    }
    if (frame?.type === 'send' || frame?.type === 'resume') {
      const entry = {
        type: frame.type,
        requestId: frame.requestId,
        url: socketInfo.url,
        body: frame,
        socket: record.sockets.indexOf(socketInfo),
        started: false,
        chunkFrames: 0,
        firstSequence: null,
        lastSequence: null,
        gapless: true,
        duplicates: 0,
        terminal: null,
        errorText: null,
        aborted: false,
        dropped: false,
        closedWithSocket: false,
      };
      record.requests.push(entry);
      record.terminals.push(null);
      byRequestId.set(frame.requestId, entry);
    } else if (frame?.type === 'abort') {
      const entry = byRequestId.get(frame.requestId);
      if (entry) entry.aborted = true;
    }
  };

  const incoming = (socketInfo, socket, event) => {
    record.frames.in++;
    if (socketInfo.droppedByDriver) {
      // The socket is "gone": whatever still arrives must not reach the transport.
      event.stopImmediatePropagation();
      return;
    }
    let frame;
    try {
      frame = JSON.parse(typeof event.data === 'string' ? event.data : new TextDecoder().decode(event.data));
    } catch {
      problem(null, 'malformed frame (not JSON)', null);
      return;
    }
    if (frame == null || typeof frame.type !== 'string' || typeof frame.requestId !== 'string') {
      problem(null, `malformed frame ${JSON.stringify(frame)}`, null);
      return;
    }
    const entry = byRequestId.get(frame.requestId);
    if (entry == null) {
      problem(null, `${frame.type} frame for unknown requestId`, frame);
      return;
    }
    const index = record.requests.indexOf(entry);
    if (entry.aborted) return; // frames racing the abort are expected and ignored by the client
    if (entry.terminal != null) {
      problem(entry, `${frame.type} frame after ${entry.terminal}`, frame);
      return;
    }
    if (TERMINALS.has(frame.type)) {
      entry.terminal = frame.type;
      record.terminals[index] = frame.type;
      if (frame.type === 'error') entry.errorText = frame.errorText ?? null;
      return;
    }
    if (frame.type === 'start') {
      if (entry.started) problem(entry, 'second start frame', frame);
      entry.started = true;
      return;
    }
    if (frame.type !== 'chunk') {
      problem(entry, `unknown frame type ${JSON.stringify(frame.type)}`, frame);
      return;
    }
    const { sequence } = frame;
    if (!Number.isSafeInteger(sequence) || sequence < 0) {
      problem(entry, `invalid sequence ${JSON.stringify(sequence)}`, frame);
      return;
    }
    const expected = entry.lastSequence == null ? (entry.body.lastSequence ?? -1) + 1 : entry.lastSequence + 1;
    if (entry.lastSequence != null && sequence <= entry.lastSequence) {
      entry.duplicates++; // the client drops these silently
      return;
    }
    if (sequence !== expected) {
      entry.gapless = false;
      problem(entry, `expected sequence ${expected}, got ${sequence}`, frame);
    }
    entry.firstSequence ??= sequence;
    entry.lastSequence = sequence;
    entry.chunkFrames++;
    record.chunks.push([index, frame.chunk]);
    validate(index, sequence, frame.chunk);
    if (armed && index === armed.requestIndex) fire(entry, socketInfo, socket);
  };

  const fire = (entry, socketInfo, socket) => {
    if (armed.dropAfter != null && entry.chunkFrames === armed.dropAfter) {
      armed.dropped = true;
      entry.dropped = true;
      socketInfo.droppedByDriver = true;
      socket.close(4000, 'driver dropped the socket');
    }
    if (armed.abortAfter != null && entry.chunkFrames === armed.abortAfter) {
      armed.aborted = true;
      // After the transport has handed this chunk to the Chat (its listener runs after ours).
      setTimeout(armed.onAbort, 0);
    }
  };

  const closed = (socketInfo, event) => {
    live.delete(socketInfo);
    socketInfo.close = { code: event?.code ?? null, reason: event?.reason || null };
    for (const entry of record.requests) {
      if (record.sockets[entry.socket] === socketInfo && entry.terminal == null && !entry.aborted) {
        entry.closedWithSocket = true;
      }
    }
  };

  class RecordingWebSocket extends Base {
    #info;

    constructor(url, protocols) {
      super(url, protocols);
      const info = { url: String(url), opened: false, close: null, droppedByDriver: false };
      record.sockets.push(info);
      live.add(info);
      // Registered before the transport sets onmessage, so it sees every frame first.
      this.addEventListener('open', () => (info.opened = true));
      this.addEventListener('message', (event) => incoming(info, this, event));
      this.addEventListener('close', (event) => closed(info, event));
      this.addEventListener('error', () => live.delete(info));
      this.#info = info;
    }

    send(data) {
      outgoing(this.#info, data);
      return super.send(data);
    }
  }

  return {
    webSocket: RecordingWebSocket,
    record,
    // Arms the step's first request (the next one sent): drop the socket, or stop the Chat, after N chunk frames.
    arm({ dropAfter, abortAfter, onAbort }) {
      armed = { requestIndex: record.requests.length, dropAfter, abortAfter, onAbort, dropped: false, aborted: false };
      return armed;
    },
    disarm() {
      armed = null;
    },
    // Requests still waiting for their terminal frame, plus sockets still connecting.
    get inFlight() {
      const connecting = [...live].filter((s) => !s.opened).length;
      const waiting = record.requests.filter(
        (e) => e.terminal == null && !e.aborted && !e.dropped && !e.closedWithSocket,
      ).length;
      return connecting + waiting;
    },
    settled: (ms) => Promise.race([Promise.allSettled([...validations]), sleep(ms)]),
  };
}
