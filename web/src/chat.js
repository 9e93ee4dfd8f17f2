// The AI SDK side of the page: the stock `AbstractChat` from `ai`, a tiny state class for it, and
// the two transports. Everything protocol-related (streams, approvals, tool outputs, automatic
// continuations) is the SDK's own code; this file only supplies what a UI framework would.
import {
  AbstractChat,
  DefaultChatTransport,
  WebSocketChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
} from 'ai';

// The state AbstractChat reads and writes (what @ai-sdk/react's ReactChatState does with hooks).
// Arrays are replaced, never mutated, and stored messages are clones, because the SDK keeps
// mutating its own copy of the message it is streaming. Every change calls `onChange`.
export class ChatState {
  #messages;
  #status = 'ready';
  #error = undefined;

  constructor(messages, onChange) {
    this.#messages = messages;
    this.onChange = onChange;
  }

  get messages() { return this.#messages; }
  set messages(messages) { this.#messages = messages; this.onChange(); }
  get status() { return this.#status; }
  set status(status) { this.#status = status; this.onChange(); }
  get error() { return this.#error; }
  set error(error) { this.#error = error; this.onChange(); }

  pushMessage = (message) => {
    this.messages = [...this.#messages, this.snapshot(message)];
  };

  popMessage = () => {
    this.messages = this.#messages.slice(0, -1);
  };

  replaceMessage = (index, message) => {
    this.messages = this.#messages.with(index, this.snapshot(message));
  };

  snapshot = (value) => structuredClone(value);
}

export class Chat extends AbstractChat {
  constructor({ messages = [], onChange, ...init }) {
    super({ ...init, state: new ChatState(messages, onChange) });
  }
}

const withQuery = (url, key, value) => `${url}${url.includes('?') ? '&' : '?'}${key}=${value}`;

// The gateway assumes an ai 6 client unless told otherwise; this page runs ai 7, so it says so.
// Each transport talks to one agent's routes (`api`, `ws` from /api/agents).
export const TRANSPORTS = {
  sse: {
    label: (agent) => `POST ${agent.api} (Server-Sent Events)`,
    create: (agent) => new DefaultChatTransport({ api: agent.api, headers: { 'x-ai-sdk-version': '7' } }),
  },
  ws: {
    label: (agent) => `${agent.ws.startsWith('/') ? `ws://…${agent.ws}` : agent.ws} (one WebSocket, many requests)`,
    // Relative URLs are resolved against the page and http: becomes ws:.
    create: (agent) => new WebSocketChatTransport({ url: withQuery(agent.ws, 'aiSdkVersion', '7') }),
  },
};

// A Chat wired the way docs/approvals.md tells app developers to: the person's decisions, and the
// browser tools' outputs, are sent back as soon as the last assistant message is complete.
export function createChat({ id, messages, agent, transport, onChange, onToolCall }) {
  return new Chat({
    id,
    messages,
    onChange,
    transport: TRANSPORTS[transport].create(agent),
    sendAutomaticallyWhen: (o) =>
      lastAssistantMessageIsCompleteWithApprovalResponses(o) || lastAssistantMessageIsCompleteWithToolCalls(o),
    // Browser tools (runs_in: browser) arrive here. onToolCall must not await addToolOutput: the SDK
    // processes the stream and the output in one queue, so awaiting it here would deadlock.
    onToolCall,
  });
}
