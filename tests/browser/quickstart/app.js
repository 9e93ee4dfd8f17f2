// A stand-in for an existing AI SDK app that lives on its own origin (tests/browser/test_quickstart_origins.py
// serves it from one) and follows README.md's "Point an existing useChat app at the gateway" literally: the
// stock Chat core of ai 6 or ai 7 (`AbstractChat`, what `useChat` wraps) with the README's transport and options,
// pointed at the gateway's absolute URL, and the README's rule for approvals a newer message cancelled.
// ?gateway=http://127.0.0.1:8080&sdk=6|7&transport=sse|ws[&ws-module=copied][&key=CREDENTIAL]
// With `key`, the app holds its user's credential in script (as a JWT from its sign-in): SSE sends it in
// the Authorization header, and the WebSocket opens with a single-use ticket asked for with it
// (docs/security.md), a fresh one for every connection the transport opens.
import * as ai6 from 'ai6';
import * as ai7 from 'ai7';
// ai 6 apps may also copy the gateway's WebSocket transport into their bundle (docs/websocket.md).
import { WebSocketChatTransport as CopiedWebSocketChatTransport } from '../../../gateway/static/ws-transport.js';

const params = new URLSearchParams(location.search);
const GATEWAY = params.get('gateway');
const version = params.get('sdk') === '6' ? 6 : 7;
const ai = version === 6 ? ai6 : ai7;
const kind = params.get('transport') === 'ws' ? 'ws' : 'sse';

// What a UI binding supplies to AbstractChat (as @ai-sdk/react's state does): arrays replaced, clones stored.
class ChatState {
  #messages = [];
  #status = 'ready';
  #error = undefined;
  constructor(onChange) { this.onChange = onChange; }
  get messages() { return this.#messages; }
  set messages(messages) { this.#messages = messages; this.onChange(); }
  get status() { return this.#status; }
  set status(status) { this.#status = status; this.onChange(); }
  get error() { return this.#error; }
  set error(error) { this.#error = error; this.onChange(); }
  pushMessage = (message) => { this.messages = [...this.#messages, structuredClone(message)]; };
  popMessage = () => { this.messages = this.#messages.slice(0, -1); };
  replaceMessage = (index, message) => { this.messages = this.#messages.with(index, structuredClone(message)); };
  snapshot = (value) => structuredClone(value);
}

class Chat extends ai.AbstractChat {
  constructor({ onChange, ...init }) { super({ ...init, state: new ChatState(onChange) }); }
}

const KEY = params.get('key');
const headers = KEY ? { Authorization: `Bearer ${KEY}` } : undefined;
// The transports resolve `params` at every connection they open: each asks for its own ticket.
async function ticket() {
  const answer = await fetch(`${GATEWAY}/api/chat/ws-ticket`, { method: 'POST', headers });
  if (!answer.ok) throw new Error(`no WebSocket ticket: ${answer.status}`);
  return { ticket: (await answer.json()).ticket };
}

// The transports as README.md and docs/websocket.md show them, with the gateway's absolute URL.
async function createTransport() {
  if (kind === 'sse') return new ai.DefaultChatTransport({ api: `${GATEWAY}/api/chat`, headers });
  const ws = `${GATEWAY.replace(/^http/, 'ws')}/api/chat/ws`;
  const options = KEY ? { params: ticket } : {};
  if (version === 7) return new ai.WebSocketChatTransport({ url: `${ws}?aiSdkVersion=7`, ...options });
  if (params.get('ws-module') === 'copied') return new CopiedWebSocketChatTransport({ url: ws, ...options });
  const module = `${GATEWAY}/static/ws-transport.js`; // ai 6: the gateway's module, imported cross-origin
  const { WebSocketChatTransport } = await import(/* webpackIgnore: true */ module);
  return new WebSocketChatTransport({ url: ws, ...options });
}

// README.md's rule: a tool call in an earlier message that never finished was cancelled by the gateway
// (the person sent a new message instead of answering): show it as cancelled, without Approve / Deny.
const FINAL = ['output-available', 'output-error', 'output-denied'];
const cancelled = (messages, index, part) =>
  ai.isToolUIPart(part) && index < messages.length - 1 && !FINAL.includes(part.state);

let chat;
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function renderPart(messages, index, part) {
  if (part.type === 'text') return el('p', { class: 'text' }, part.text);
  if (!ai.isToolUIPart(part)) return null;
  const gone = cancelled(messages, index, part);
  const card = el('div', { class: 'tool', 'data-tool': ai.getToolName(part), 'data-state': part.state },
    el('span', { class: 'badge' }, gone ? 'cancelled' : part.state));
  if (part.state === 'approval-requested' && !gone) {
    for (const [label, approved] of [['Approve', true], ['Deny', false]]) {
      card.append(el('button', { type: 'button', onclick: () => chat.addToolApprovalResponse({ id: part.approval.id, approved }) }, label));
    }
  }
  return card;
}

function render() {
  const { messages } = chat;
  $('messages').replaceChildren(...messages.map((message, index) =>
    el('article', { 'data-role': message.role },
      ...message.parts.map((part) => renderPart(messages, index, part)).filter(Boolean))));
  $('error').hidden = !chat.error;
  $('error').textContent = chat.error ? String(chat.error.message ?? chat.error) : '';
  document.body.dataset.status = chat.status;
}

async function main() {
  $('setup').textContent = `ai ${version}, ${kind}, page ${location.origin}, gateway ${GATEWAY}`;
  let transport;
  try {
    transport = await createTransport();
  } catch (error) {
    $('error').hidden = false;
    $('error').textContent = `could not load the transport: ${error.message ?? error}`;
    document.body.dataset.status = 'error';
    return;
  }
  chat = new Chat({
    transport,
    onChange: render,
    sendAutomaticallyWhen: (o) =>
      ai.lastAssistantMessageIsCompleteWithApprovalResponses(o) || ai.lastAssistantMessageIsCompleteWithToolCalls(o),
  });
  $('composer').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = $('input').value.trim();
    $('input').value = '';
    if (text) chat.sendMessage({ text }).catch(() => {}); // failures land in chat.error
  });
  render();
}

main();
