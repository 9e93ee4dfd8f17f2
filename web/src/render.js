// Plain DOM rendering of the chat's messages. A message element is rebuilt only when the SDK
// replaced that message (the state class stores a new object per change), so a long chat stays cheap.
import { getToolName, isToolUIPart } from 'ai';
import { approverNoteText } from './approvers.js';
import { el, json } from './dom.js';

const FINAL_STATES = new Set(['output-available', 'output-error', 'output-denied']);

// What a tool part's `state` means to a person, and the badge colour (a CSS class). `superseded`:
// the part is not in the last message, so the person sent a new message while this call still
// waited, and the gateway cancelled it (docs/approvals.md).
function describeState(part, superseded, inBrowser) {
  if (superseded && !FINAL_STATES.has(part.state)) return ['cancelled', 'denied'];
  switch (part.state) {
    case 'input-streaming':
      return ['receiving input', 'running'];
    case 'input-available':
      return [inBrowser ? 'running in your browser' : 'running', 'running'];
    case 'approval-requested':
      return ['waiting for approval', 'waiting'];
    case 'approval-responded':
      return part.approval.approved ? ['approved, running', 'running'] : ['denied', 'denied'];
    case 'output-available':
      return ['done', 'done'];
    case 'output-error':
      return ['error', 'error'];
    case 'output-denied':
      return ['denied', 'denied'];
    default:
      return [part.state, 'running'];
  }
}

const section = (caption, ...content) => el('div', { class: 'tool-section' }, el('span', { class: 'caption' }, caption), ...content);
const note = (text) => el('p', { class: 'tool-note' }, text);

function renderTool(part, actions, superseded) {
  const name = getToolName(part);
  const inBrowser = actions.runsInBrowser(name);
  const [label, tone] = describeState(part, superseded, inBrowser);
  const where = inBrowser ? 'runs in your browser' : 'runs on the server';
  const hint = part.approval?.descriptor?.hint; // the policy's `hint`, via the gateway
  const approved = part.approval?.approved;
  return el(
    'div',
    { class: `tool tool-${tone}`, 'data-tool': name, 'data-state': part.state, 'data-tool-call-id': part.toolCallId },
    el(
      'div',
      { class: 'tool-head' },
      el('span', { class: 'caption' }, 'tool'),
      el('code', { class: 'tool-name' }, name),
      el('span', { class: 'tool-where' }, where),
      el('span', { class: `badge badge-${tone}` }, label),
    ),
    part.input !== undefined && section('input', json(part.input)),
    part.state === 'approval-requested' && !superseded &&
      el(
        'div',
        { class: 'approval' },
        el('p', { class: 'approval-question' }, hint ? `${hint} ` : '', `Allow ${name} to run with this input?`),
        el('button', { type: 'button', class: 'approve', onclick: () => actions.approve(part, true) }, 'Approve'),
        // A standing grant for this tool in this chat, then this approval (docs/approvals.md "Standing
        // grants"); a browser tool's calls are never a grant's.
        !inBrowser &&
          el('button', { type: 'button', class: 'approve grant', onclick: () => actions.approveForChat(part) }, 'Approve and allow for this chat'),
        el('button', { type: 'button', class: 'deny', onclick: () => actions.approve(part, false) }, 'Deny'),
      ),
    part.state === 'output-available' && section('output', json(part.output)),
    part.state === 'output-error' && section('error', el('p', { class: 'tool-error-text' }, part.errorText)),
    superseded && !FINAL_STATES.has(part.state)
      ? note('You sent a new message before this call finished, so the gateway cancelled it.')
      : decidedElsewhere(part) ??
        (approved === true && part.state !== 'approval-responded'
          ? note('You approved this call.')
          : approved === false || part.state === 'output-denied'
            ? note('You denied this call: the tool did not run.')
            : null),
  );
}

// A decision the person in this chat did not make (ai 7 gets it as the part's approval): a rule of
// the tool's policy, or its approvers through the approvals inbox (docs/approvals.md).
function decidedElsewhere(part) {
  const approval = part.approval;
  if (!approval || approval.approved === undefined) return null;
  const reason = approval.reason ? ` (${approval.reason})` : '';
  const verdict = approval.approved ? 'approved' : 'denied';
  if (approval.isAutomatic) return note(`The gateway's rule ${approval.descriptor?.rule ?? ''} ${verdict} this call automatically${reason}.`);
  if (approval.descriptor?.approvers) return note(`The ${approval.descriptor.approvers} ${verdict} this call${reason}.`);
  return null;
}

// A call its approvers decide: whom it waits for, then who decided (`data-approval`, ai 6 and ai 7).
function renderApprovalWait({ data }) {
  return el('p', { class: 'tool-note', 'data-approval-state': data.state }, approverNoteText(data));
}

function renderPart(part, actions, superseded) {
  if (part.type === 'text') return el('div', { class: 'text' }, part.text);
  if (part.type === 'reasoning') {
    return el('details', { class: 'reasoning', open: part.state === 'streaming' }, el('summary', {}, 'reasoning'), part.text);
  }
  if (part.type === 'file') {
    return part.mediaType?.startsWith('image/')
      ? el('img', { class: 'file', src: part.url, alt: part.filename ?? 'image' })
      : el('a', { class: 'file', href: part.url, download: part.filename ?? true }, part.filename ?? part.mediaType);
  }
  if (isToolUIPart(part)) return renderTool(part, actions, superseded);
  if (part.type === 'data-approval') return renderApprovalWait(part);
  return null; // step-start, other data parts, sources: nothing to show in this demo
}

function renderMessage(message, actions, superseded) {
  const parts = message.parts.map((part) => renderPart(part, actions, superseded)).filter(Boolean);
  return el(
    'article',
    // A message with nothing to show yet (or a response that failed at once) takes no room.
    { class: `message ${message.role}`, 'data-role': message.role, 'data-message-id': message.id, hidden: !parts.length },
    el('div', { class: 'who' }, message.role === 'user' ? 'You' : 'Agent'),
    el('div', { class: 'parts' }, ...parts),
  );
}

export function createMessageList(container, actions) {
  let rendered = new Map(); // message object -> {node, superseded}
  return function render(messages) {
    const next = new Map();
    messages.forEach((message, i) => {
      const superseded = i < messages.length - 1;
      const old = rendered.get(message);
      const node = old?.superseded === superseded ? old.node : renderMessage(message, actions, superseded);
      next.set(message, { node, superseded });
    });
    const nodes = [...next.values()].map((entry) => entry.node);
    const same = nodes.length === container.children.length && nodes.every((node, i) => container.children[i] === node);
    if (!same) container.replaceChildren(...nodes);
    rendered = next;
  };
}
