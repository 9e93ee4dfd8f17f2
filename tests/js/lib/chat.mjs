// Building blocks for driving the stock AI SDK Chat headlessly (ai 6 and ai 7).
// Everything protocol-related comes from the SDK itself; this file only supplies what a UI
// framework would (state storage) and what a test needs (recording and independent validation).

const SDK_PACKAGES = { 6: 'ai6', 7: 'ai7' };

export async function loadSdk(version) {
  const name = SDK_PACKAGES[version];
  if (!name) throw new Error(`unsupported AI SDK version ${version} (expected 6 or 7)`);
  return import(name);
}

// Mirrors @ai-sdk/react's ReactChatState: arrays are replaced, never mutated, and stored
// messages are structured clones, because the SDK keeps mutating its own streaming copy.
export class MemoryChatState {
  #listeners = new Set();

  constructor(messages = []) {
    this.messages = messages;
    this.status = 'ready';
    this.error = undefined;
  }

  onChange(listener) {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #changed() {
    for (const listener of this.#listeners) listener(this);
  }

  pushMessage = (message) => {
    this.messages = this.messages.concat(this.snapshot(message));
    this.#changed();
  };

  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
    this.#changed();
  };

  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), this.snapshot(message), ...this.messages.slice(index + 1)];
    this.#changed();
  };

  snapshot = (value) => structuredClone(value);
}

// A zod union error lists every branch; keep only the branches whose `type` matched,
// so the report says "delta: expected string" instead of 40 screens of alternatives.
export function describeSchemaError(chunk, error) {
  const issues = error?.issues ?? error?.cause?.issues;
  if (!Array.isArray(issues)) return String(error?.message ?? error);
  const lines = [];
  for (const issue of issues) {
    if (issue.code !== 'invalid_union' || !Array.isArray(issue.errors)) {
      lines.push(`${(issue.path ?? []).join('.') || '<root>'}: ${issue.message}`);
      continue;
    }
    const matching = issue.errors.filter((branch) => !branch.some((i) => i.path?.[0] === 'type'));
    if (matching.length === 0) {
      lines.push(`unknown chunk type ${JSON.stringify(chunk?.type)}`);
    } else {
      for (const i of matching.flat()) lines.push(`${(i.path ?? []).join('.') || '<root>'}: ${i.message}`);
    }
  }
  return [...new Set(lines)].join('; ');
}

// The SDK's TypeValidationError message embeds the whole zod union report; shorten it the same way.
export function describeChatError(sdk, error) {
  if (error == null) return null;
  if (sdk.TypeValidationError?.isInstance?.(error)) {
    const why = describeSchemaError(error.value, error.cause);
    return `Type validation failed for ${JSON.stringify(error.value)}: ${why}`;
  }
  return String(error.message ?? error);
}

// Splits an SSE byte stream into events without using the SDK's parser, so framing bugs the
// SDK happens to tolerate still show up here.
export async function* parseSse(stream) {
  const decoder = new TextDecoder();
  let buffer = '';
  const reader = stream.getReader();
  const flush = function* (final) {
    const events = buffer.split(/\r\n\r\n|\n\n|\r\r/);
    buffer = final ? '' : events.pop();
    for (const block of events) {
      const data = [];
      for (const line of block.split(/\r\n|\n|\r/)) {
        if (line === '' || line.startsWith(':')) continue;
        if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
      }
      if (data.length) yield data.join('\n');
    }
  };
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      yield* flush(false);
    }
    buffer += decoder.decode();
    yield* flush(true);
  } finally {
    reader.releaseLock();
  }
}

// A fetch for DefaultChatTransport that records every exchange and validates every SSE chunk
// with the SDK's own uiMessageChunkSchema on a tee of the body, independent of what the Chat does.
export function createTeeFetch({ sdk, baseFetch = globalThis.fetch }) {
  const schema = sdk.uiMessageChunkSchema();
  const record = { requests: [], chunks: [], schemaErrors: [], doneMarkers: [] };
  const pending = new Set();
  let inFlight = 0;
  // The step's request to stop after N chunks (`arm`): chat.stop(), as a person's Stop button.
  let armed = null;

  const consume = async (index, stream) => {
    let done = 0;
    let position = 0;
    for await (const data of parseSse(stream)) {
      const at = position++;
      if (data === '[DONE]') {
        done++;
        continue;
      }
      if (armed?.requestIndex === index && !armed.aborted && at + 1 === armed.abortAfter) {
        armed.aborted = true;
        record.requests[index].aborted = true;
        // After the Chat's own branch of the tee has had the chunk.
        setTimeout(armed.onAbort, 0);
      }
      if (done) record.schemaErrors.push({ request: index, index: at, chunk: data, error: 'data after [DONE]' });
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch {
        record.schemaErrors.push({ request: index, index: at, chunk: data, error: 'invalid JSON' });
        continue;
      }
      record.chunks.push([index, chunk]);
      const result = await schema.validate(chunk);
      if (!result.success) {
        record.schemaErrors.push({ request: index, index: at, chunk, error: describeSchemaError(chunk, result.error) });
      }
    }
    record.doneMarkers[index] = done;
  };

  const teeFetch = async (input, init = {}) => {
    const index = record.requests.length;
    let body = init.body;
    try {
      body = typeof body === 'string' ? JSON.parse(body) : body ?? null;
    } catch {
      // keep the raw string: a non-JSON body is itself worth seeing in the report
    }
    const entry = {
      method: init.method ?? 'GET',
      url: String(input),
      requestHeaders: Object.fromEntries(new Headers(init.headers)),
      body,
      status: null,
      contentType: null,
      headers: {},
    };
    record.requests.push(entry);
    record.doneMarkers.push(null);
    inFlight++;
    let response;
    try {
      response = await baseFetch(input, init);
    } catch (err) {
      inFlight--;
      entry.fetchError = String(err?.message ?? err);
      throw err;
    }
    entry.status = response.status;
    entry.contentType = response.headers.get('content-type');
    entry.headers = Object.fromEntries(response.headers);
    inFlight--;
    if (!response.body || !entry.contentType?.includes('text/event-stream')) {
      if (response.body) entry.text = await response.clone().text();
      return response;
    }
    const [forChat, forCheck] = response.body.tee();
    const job = consume(index, forCheck).catch((err) => {
      entry.streamError = String(err?.message ?? err);
    });
    pending.add(job);
    const { status, statusText, headers } = response;
    return new Response(forChat, { status, statusText, headers });
  };

  return {
    fetch: teeFetch,
    record,
    // Arms the step's first request (the next one sent): stop the Chat after N chunks of its response.
    arm({ abortAfter, onAbort }) {
      armed = { requestIndex: record.requests.length, abortAfter, onAbort, aborted: false };
      return armed;
    },
    disarm() {
      armed = null;
    },
    // Only until response headers: after that the Chat's activeResponse tells whether it still reads.
    get inFlight() {
      return inFlight;
    },
    // Waits for the independent parse of every body; bounded so a never-ending stream cannot hang the driver.
    settled: (ms) => Promise.race([Promise.allSettled([...pending]), sleep(ms)]),
  };
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// `transport` replaces the default DefaultChatTransport({api, headers, body, fetch}).
export async function createChat({
  version,
  api,
  chatId,
  headers,
  body,
  fetch,
  transport,
  onToolCall,
  chatOptions = {},
}) {
  const sdk = await loadSdk(version);
  const state = new MemoryChatState();
  // The same shape as @ai-sdk/react's Chat: AbstractChat plus a framework-specific state.
  class HeadlessChat extends sdk.AbstractChat {
    constructor(options) {
      super({ ...options, state });
    }
  }
  const chat = new HeadlessChat({
    id: chatId,
    transport: transport ?? new sdk.DefaultChatTransport({ api, headers, body, fetch }),
    sendAutomaticallyWhen: (o) =>
      sdk.lastAssistantMessageIsCompleteWithApprovalResponses(o) || sdk.lastAssistantMessageIsCompleteWithToolCalls(o),
    onToolCall: (arg) => onToolCall?.(chat, arg),
    ...chatOptions,
  });
  return { sdk, chat, state };
}

// Idle means: not submitted/streaming, no active response, no request on the wire, and it stays
// that way for `settleMs`. The settle window covers the automatic continuation, which the SDK
// starts after the previous stream has already ended (or fire-and-forget from addToolApprovalResponse).
export async function waitForIdle(chat, tee, { settleMs = 150, pollMs = 10, deadline = Infinity } = {}) {
  const busy = () =>
    chat.status === 'submitted' || chat.status === 'streaming' || chat.activeResponse != null || tee.inFlight > 0;
  let quietSince = null;
  while (Date.now() < deadline) {
    if (busy()) {
      quietSince = null;
    } else if (quietSince == null) {
      quietSince = Date.now();
    } else if (Date.now() - quietSince >= settleMs) {
      return true;
    }
    await sleep(pollMs);
  }
  return false;
}

export function pendingApprovals(chat) {
  const last = chat.messages.at(-1);
  if (last?.role !== 'assistant') return [];
  return last.parts.filter((p) => p.state === 'approval-requested' && p.approval?.id != null);
}
