// Plain DOM rendering of an AG-UI thread (agui-thread.js). AG-UI keeps a turn as several messages
// (the assistant's text, its tool calls, each result a `tool` message, activities); the page shows
// each run of them as one "Agent" block with a card per tool call, as the AI SDK page does, and
// reuses that page's CSS. A block is rebuilt only when what it shows changed.
import { APPROVAL_ACTIVITY, parseJson } from './agui-thread.js';
import { approverNoteText } from './approvers.js';
import { el, json } from './dom.js';

// A card's state: its `data-state`, the badge's words and colour (a CSS class of app.css).
const STATES = {
  'waiting-approval': ['waiting for approval', 'waiting'],
  'waiting-approvers': ['waiting for the approvers', 'waiting'],
  answered: ['answered, sending', 'running'],
  'in-browser': ['running in your browser', 'running'],
  running: ['running', 'running'],
  done: ['done', 'done'],
  error: ['error', 'error'],
  denied: ['denied', 'denied'],
  cancelled: ['cancelled', 'denied'],
  open: ['no result', 'denied'],
};

const section = (caption, ...content) => el('div', { class: 'tool-section' }, el('span', { class: 'caption' }, caption), ...content);
const note = (text) => el('p', { class: 'tool-note' }, text);

// ---- the model: plain data, compared to decide what to rebuild ---------------------------------

function cardState(call, thread) {
  if (call.result) {
    const output = parseJson(call.result.content);
    if (call.result.error || (output && typeof output === 'object' && 'error' in output)) return 'error';
    // A call the person moved on from is denied to the agent; the page says why: cancelled.
    if (output?.denied === true) return call.decision?.cancelled ? 'cancelled' : 'denied';
    return 'done';
  }
  if (call.interrupt && thread.answered(call.interrupt.id)) return call.decision?.cancelled ? 'cancelled' : 'answered';
  if (call.interrupt) return 'waiting-approval';
  if (call.approvers?.state === 'waiting') return 'waiting-approvers';
  if (thread.handed.has(call.id)) return 'in-browser';
  if (call.decision?.cancelled) return 'cancelled';
  return thread.busy ? 'running' : 'open';
}

function toolCard(toolCall, related, thread, actions) {
  const call = {
    id: toolCall.id,
    name: toolCall.function.name,
    input: parseJson(toolCall.function.arguments),
    result: related.results.get(toolCall.id) ?? null,
    approvers: related.approvers.get(toolCall.id)?.content ?? null,
    interrupt: thread.interruptFor(toolCall.id) ?? null,
    decision: thread.decisions.get(toolCall.id) ?? null,
    inBrowser: actions.runsInBrowser(toolCall.function.name),
  };
  return { kind: 'tool', ...call, state: cardState(call, thread) };
}

// The thread as blocks: each user message one, each run of other messages one.
function blocks(thread, actions) {
  const messages = thread.messages;
  const related = { results: new Map(), approvers: new Map() };
  for (const message of messages) {
    if (message.role === 'tool') related.results.set(message.toolCallId, message);
    if (message.role === 'activity' && message.content?.toolCallId) related.approvers.set(message.content.toolCallId, message);
  }
  const out = [];
  for (const message of messages) {
    if (message.role === 'user') {
      out.push({ role: 'user', id: message.id, parts: [{ kind: 'text', text: textOf(message.content) }] });
      continue;
    }
    if (out.at(-1)?.role !== 'assistant') out.push({ role: 'assistant', id: message.id, parts: [] });
    out.at(-1).parts.push(...partsOf(message, related, thread, actions));
  }
  return out;
}

function partsOf(message, related, thread, actions) {
  if (message.role === 'assistant') {
    const text = message.content ? [{ kind: 'text', text: textOf(message.content) }] : [];
    return [...text, ...(message.toolCalls ?? []).map((call) => toolCard(call, related, thread, actions))];
  }
  if (message.role === 'reasoning') return [{ kind: 'reasoning', text: message.content }];
  if (message.role === 'activity' && message.activityType === APPROVAL_ACTIVITY && message.content?.state === 'automatic') {
    return [{ kind: 'rule', ...message.content }];
  }
  return []; // tool results and approvers' activities show in their call's card
}

const textOf = (content) =>
  typeof content === 'string' ? content : (content ?? []).map((part) => part.text ?? '').join('');

// ---- the DOM ------------------------------------------------------------------------------------

function renderCard(card, actions) {
  const [label, tone] = STATES[card.state];
  const output = card.result ? parseJson(card.result.content) : undefined;
  return el(
    'div',
    { class: `tool tool-${tone}`, 'data-tool': card.name, 'data-state': card.state, 'data-tool-call-id': card.id },
    el(
      'div',
      { class: 'tool-head' },
      el('span', { class: 'caption' }, 'tool'),
      el('code', { class: 'tool-name' }, card.name),
      el('span', { class: 'tool-where' }, card.inBrowser ? 'runs in your browser' : 'runs on the server'),
      el('span', { class: `badge badge-${tone}` }, label),
    ),
    section('input', json(card.input)),
    card.state === 'waiting-approval' && approvalBox(card, actions),
    card.state === 'done' && section('output', json(output)),
    card.state === 'error' && section('error', el('p', { class: 'tool-error-text' }, card.result.error || output?.error)),
    card.approvers && el('p', { class: 'tool-note', 'data-approval-state': card.approvers.state }, approverNoteText(card.approvers)),
    decisionNote(card),
  );
}

function approvalBox(card, actions) {
  const { interrupt } = card;
  const until = interrupt.expiresAt ? ` (answer by ${new Date(interrupt.expiresAt).toLocaleTimeString()})` : '';
  return el(
    'div',
    { class: 'approval' },
    el('p', { class: 'approval-question' }, `${interrupt.message} Allow ${card.name} to run with this input?${until}`),
    el('button', { type: 'button', class: 'approve', onclick: () => actions.answer(interrupt, true) }, 'Approve'),
    el('button', { type: 'button', class: 'deny', onclick: () => actions.answer(interrupt, false) }, 'Deny'),
  );
}

function decisionNote({ decision, state }) {
  if (!decision) return null;
  if (decision.cancelled) return note('You sent a new message before answering, so the gateway cancelled this call.');
  if (!decision.approved) return note('You denied this call: the tool did not run.');
  return note(state === 'answered' ? 'You approved this call; the answer is sent once every waiting call has one.' : 'You approved this call.');
}

function renderPart(part, actions) {
  if (part.kind === 'text') return el('div', { class: 'text' }, part.text);
  if (part.kind === 'reasoning') return el('details', { class: 'reasoning' }, el('summary', {}, 'reasoning'), part.text);
  if (part.kind === 'rule') {
    const verdict = part.approved ? 'approved' : 'denied';
    return note(`A rule of the gateway ${verdict} a call automatically${part.reason ? ` (${part.reason})` : ''}.`);
  }
  return renderCard(part, actions);
}

function renderBlock(block, actions) {
  return el(
    'article',
    { class: `message ${block.role}`, 'data-role': block.role, 'data-message-id': block.id, hidden: !block.parts.length },
    el('div', { class: 'who' }, block.role === 'user' ? 'You' : 'Agent'),
    el('div', { class: 'parts' }, ...block.parts.map((part) => renderPart(part, actions))),
  );
}

// `actions`: {answer(interrupt, approved), runsInBrowser(toolName)}.
export function createThreadView(container, actions) {
  let rendered = new Map(); // a block's JSON -> its node
  return function render(thread) {
    const next = new Map();
    const nodes = blocks(thread, actions).map((block) => {
      const key = JSON.stringify(block);
      const node = rendered.get(key) ?? renderBlock(block, actions);
      next.set(key, node);
      return node;
    });
    const same = nodes.length === container.children.length && nodes.every((node, i) => container.children[i] === node);
    if (!same) container.replaceChildren(...nodes);
    rendered = next;
  };
}
