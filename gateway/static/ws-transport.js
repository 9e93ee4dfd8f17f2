// ws-transport.js: an AI SDK ChatTransport over one WebSocket, for ai 6 apps (ai 6 ships none).
// Dependency-free ES module, served by adk-gateway at /static/ws-transport.js.
//
//   import { useChat } from '@ai-sdk/react';
//   import { WebSocketChatTransport } from '/static/ws-transport.js';
//   const transport = new WebSocketChatTransport({ url: 'ws://HOST/api/chat/ws' }); // once, not per render
//   const { messages, sendMessage } = useChat({ transport });
//
// It speaks the frames of ai 7's own WebSocketChatTransport (JSON text), so one server serves both:
//   client -> server  {type:'send', requestId, id, trigger, messageId, messages, headers, body, metadata}
//                     {type:'resume', requestId, id, headers, body, metadata}  (no lastSequence: replay it all)
//                     {type:'abort', requestId}
//   server -> client  {type:'start', requestId}  {type:'chunk', requestId, sequence: 0,1,2.., chunk}
//                     {type:'end', requestId}  {type:'error', requestId, errorText?}  {type:'no-active', requestId}
// Options: {url, protocols?, headers?, body?, params?, webSocket?}. headers, body and params may be values or
// (async) functions. A browser cannot set handshake headers: `headers` travel inside each send/resume frame, and
// the handshake can be authenticated with cookies, `params` (query string) or `protocols`. `webSocket` is a
// WebSocket constructor (default globalThis.WebSocket; pass one in Node < 22).
// Chunks are handed to the Chat as they arrive, without schema validation (ai 7's transport validates them).

const OPEN = 1;
const CLOSING = 2;

const isRecord = (value) => value != null && typeof value === 'object' && !Array.isArray(value);
const asError = (error) => (error instanceof Error ? error : new Error(String(error)));
const resolveOption = async (value) => (typeof value === 'function' ? value() : value);

// crypto.randomUUID needs a secure context; getRandomValues does not.
const newRequestId = () =>
  Array.from(globalThis.crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, '0')).join('');

function lowerCaseHeaders(headers) {
  const out = {};
  if (headers == null) return out;
  const entries =
    typeof Headers !== 'undefined' && headers instanceof Headers
      ? headers.entries()
      : Array.isArray(headers)
        ? headers
        : Object.entries(headers);
  for (const [key, value] of entries) if (value != null) out[key.toLowerCase()] = String(value);
  return out;
}

function abortError(signal) {
  if (signal?.reason instanceof Error) return signal.reason;
  const error = new Error('The WebSocket chat request was aborted.');
  error.name = 'AbortError'; // the Chat treats this name as a user stop, not a failure
  return error;
}

function throwIfAborted(signal) {
  if (signal?.aborted) throw abortError(signal);
}

function raceAbort(promise, signal) {
  if (signal == null) return promise;
  if (signal.aborted) return Promise.reject(abortError(signal));
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortError(signal));
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => (signal.removeEventListener('abort', onAbort), resolve(value)),
      (error) => (signal.removeEventListener('abort', onAbort), reject(error)),
    );
  });
}

function socketUrl(url, params) {
  let target;
  try {
    target = new URL(url, globalThis.location?.href);
  } catch {
    throw new Error('Invalid WebSocket chat URL. Use an absolute URL outside the browser.');
  }
  if (target.protocol === 'http:') target.protocol = 'ws:';
  else if (target.protocol === 'https:') target.protocol = 'wss:';
  if (!['ws:', 'wss:'].includes(target.protocol) || !target.hostname) {
    throw new Error('Invalid WebSocket chat URL. Expected ws:// or wss://.');
  }
  if (target.hash) throw new Error('Invalid WebSocket chat URL. Fragments are not allowed.');
  for (const [key, value] of Object.entries(params ?? {})) target.searchParams.set(key, value);
  return target.toString();
}

async function frameText(data) {
  if (typeof data === 'string') return data;
  if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return new TextDecoder().decode(data);
  if (typeof Blob !== 'undefined' && data instanceof Blob) return data.text();
  return String(data);
}

export class WebSocketChatTransport {
  // resume asks for the whole response again, so the Chat resets the message on the replayed `start`.
  resumeStreamIsReplay = true;
  #options;
  #connection; // {socket?, ready: Promise<WebSocket>, resolve, reject}; one at a time, opened lazily
  #requests = new Map(); // requestId -> {id, kind, signal, lastSequence, stream, controller, response?, settled}

  constructor({ url, protocols, headers, body, params, webSocket } = {}) {
    if (!url) throw new Error('WebSocketChatTransport needs a url.');
    this.#options = { url, protocols, headers, body, params, webSocket };
  }

  async sendMessages({ chatId, messages, abortSignal, trigger, messageId, headers, body, metadata }) {
    const extra = await this.#extra(abortSignal, headers, body);
    return this.#request('send', abortSignal, { id: chatId, trigger, messageId, messages, ...extra, metadata });
  }

  // Resolves with null when the server answers `no-active`.
  async reconnectToStream({ chatId, abortSignal, headers, body, metadata }) {
    const extra = await this.#extra(abortSignal, headers, body);
    return this.#request('resume', abortSignal, { id: chatId, ...extra, metadata });
  }

  // Closes the connection and errors the active streams; a later request opens a new connection.
  close() {
    const connection = this.#connection;
    const error = new Error('WebSocket chat transport was closed.');
    this.#connection = undefined;
    this.#failAll(error);
    if (connection == null) return;
    connection.reject(error);
    try {
      connection.socket?.close(1000, 'Client closed transport');
    } catch {}
  }

  async #extra(signal, headers, body) {
    throwIfAborted(signal);
    const [baseHeaders, baseBody] = await Promise.all([
      resolveOption(this.#options.headers),
      resolveOption(this.#options.body),
    ]);
    throwIfAborted(signal);
    return {
      headers: { ...lowerCaseHeaders(baseHeaders), ...lowerCaseHeaders(headers) },
      body: { ...baseBody, ...body },
    };
  }

  async #request(kind, signal, fields) {
    const socket = await this.#socket(signal);
    throwIfAborted(signal);
    const request = this.#register(kind, signal);
    try {
      if (this.#connection?.socket !== socket || socket.readyState !== OPEN) {
        throw new TypeError('WebSocket chat network connection is not open.');
      }
      socket.send(JSON.stringify({ type: kind, requestId: request.id, ...fields }));
    } catch (error) {
      this.#fail(request, asError(error));
      throw asError(error);
    }
    return kind === 'resume' ? request.response : request.stream;
  }

  #register(kind, signal) {
    const request = { id: newRequestId(), kind, signal, lastSequence: -1, settled: kind !== 'resume' };
    request.stream = new ReadableStream({
      start: (controller) => {
        request.controller = controller;
      },
      cancel: () => this.#abort(request, false),
    });
    if (kind === 'resume') {
      request.response = new Promise((resolve, reject) => Object.assign(request, { resolve, reject }));
      request.response.catch(() => {});
    }
    if (signal != null) {
      request.onAbort = () => this.#abort(request, true);
      signal.addEventListener('abort', request.onAbort, { once: true });
    }
    this.#requests.set(request.id, request);
    return request;
  }

  #socket(signal) {
    let connection = this.#connection;
    const state = connection?.socket?.readyState;
    if (state === OPEN) return connection.socket;
    if (state >= CLOSING) {
      // Closed but its close event is not handled yet: fail what it carried and start afresh.
      this.#terminate(connection, new TypeError('WebSocket chat network connection closed.'), false);
      connection = undefined;
    }
    if (connection == null) {
      connection = this.#connection = {};
      connection.ready = new Promise((resolve, reject) => Object.assign(connection, { resolve, reject }));
      connection.ready.catch(() => {});
      this.#open(connection);
    }
    return raceAbort(connection.ready, signal);
  }

  async #open(connection) {
    try {
      const params = await resolveOption(this.#options.params);
      if (this.#connection !== connection) return;
      const WebSocketImpl = this.#options.webSocket ?? globalThis.WebSocket;
      if (WebSocketImpl == null) throw new Error('No WebSocket implementation available: pass the webSocket option.');
      const socket = new WebSocketImpl(socketUrl(this.#options.url, params), this.#options.protocols);
      connection.socket = socket;
      // Frames are handled strictly in arrival order, also when reading one needs an await (a Blob),
      // and a close is handled only after the frames that came before it.
      let tail = Promise.resolve();
      const later = (job) => {
        tail = tail.then(job).catch((error) => this.#terminate(connection, asError(error)));
      };
      socket.onopen = () => connection.resolve(socket);
      socket.onmessage = (event) => later(async () => this.#onFrame(connection, await frameText(event.data)));
      socket.onerror = () => this.#terminate(connection, new TypeError('WebSocket chat network connection failed.'));
      socket.onclose = (event) =>
        later(() => {
          const reason = event?.reason ? `: ${event.reason}` : '';
          const code = typeof event?.code === 'number' ? ` (code ${event.code}${reason})` : '';
          // A TypeError mentioning "network": the Chat records a disconnect and can resumeStream() afterwards.
          this.#terminate(connection, new TypeError(`WebSocket chat network connection closed${code}.`), false);
        });
    } catch (error) {
      this.#terminate(connection, asError(error), false);
    }
  }

  #onFrame(connection, text) {
    if (this.#connection !== connection) return;
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {}
    if (!isRecord(frame) || typeof frame.type !== 'string' || typeof frame.requestId !== 'string') {
      throw new Error('Invalid WebSocket chat response frame.');
    }
    const request = this.#requests.get(frame.requestId);
    if (request == null) return; // finished or aborted: late frames are dropped
    switch (frame.type) {
      case 'start':
        this.#settle(request, request.stream);
        return;
      case 'chunk': {
        const { sequence } = frame;
        if (!Number.isSafeInteger(sequence) || sequence < 0) throw new Error('Invalid WebSocket chat chunk sequence.');
        if (sequence <= request.lastSequence) return; // already delivered
        if (sequence !== request.lastSequence + 1) {
          const expected = request.lastSequence + 1;
          throw new Error(`Out-of-order WebSocket chat chunk sequence (expected ${expected}, got ${sequence}).`);
        }
        if (!isRecord(frame.chunk)) throw new Error('Invalid WebSocket chat chunk frame.');
        request.lastSequence = sequence;
        this.#settle(request, request.stream);
        request.controller.enqueue(frame.chunk);
        return;
      }
      case 'end':
      case 'no-active':
        this.#settle(request, frame.type === 'end' ? request.stream : null);
        this.#forget(request);
        request.controller.close();
        return;
      case 'error':
        if (frame.errorText !== undefined && typeof frame.errorText !== 'string') {
          throw new Error('Invalid WebSocket chat error response.');
        }
        this.#fail(request, new Error(frame.errorText ?? 'WebSocket chat server returned an error.'));
        return;
      default:
        throw new Error(`Unknown WebSocket chat response type: ${frame.type}.`);
    }
  }

  // A resume's promise resolves on its first frame: with the stream, or null for `no-active`.
  #settle(request, value) {
    if (request.settled) return;
    request.settled = true;
    request.resolve(value);
  }

  #forget(request) {
    this.#requests.delete(request.id);
    if (request.onAbort) request.signal.removeEventListener('abort', request.onAbort);
  }

  #abort(request, closeStream) {
    if (this.#requests.get(request.id) !== request) return;
    if (!request.settled) {
      request.settled = true;
      request.reject(abortError(request.signal));
    }
    this.#forget(request);
    if (closeStream) {
      try {
        request.controller.close();
      } catch {}
    }
    const socket = this.#connection?.socket;
    if (socket?.readyState === OPEN) {
      try {
        socket.send(JSON.stringify({ type: 'abort', requestId: request.id }));
      } catch {}
    }
  }

  #fail(request, error) {
    if (this.#requests.get(request.id) !== request) return;
    if (!request.settled) {
      request.settled = true;
      request.reject(error);
    }
    this.#forget(request);
    try {
      request.controller.error(error);
    } catch {}
  }

  #failAll(error) {
    for (const request of [...this.#requests.values()]) this.#fail(request, error);
  }

  // Every request on the connection fails with `error`; the next request opens a new connection.
  #terminate(connection, error, closeSocket = true) {
    if (this.#connection !== connection) return;
    this.#connection = undefined;
    connection.reject(error);
    this.#failAll(error);
    if (closeSocket) {
      try {
        connection.socket?.close(4000, 'WebSocket chat transport error'); // browsers refuse 1011 from a client
      } catch {}
    }
  }
}
