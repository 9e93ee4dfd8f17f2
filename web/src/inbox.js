// The approver's inbox: the pending approvals this approver may decide (GET /api/approvals), each
// with its arguments, the rule that asked and a countdown, and Approve / Deny (POST
// /api/approvals/{id}). The key is kept in sessionStorage (this tab only) and sent as a bearer.
import { el, json } from './dom.js';

const KEY_STORAGE = 'adk-gateway.approver-key';
// How long "Approve and allow for 1 hour" grants.
const GRANT_SECONDS = 3600;
const REFRESH_MS = 2000;
// The list is read a page at a time, following the gateway's cursor, up to MAX_PAGES pages: past
// that, the oldest are shown and a note says more wait.
const PAGE_SIZE = 100;
const MAX_PAGES = 10;

const $ = (id) => document.getElementById(id);
const ui = {
  signin: $('signin'),
  signinForm: $('signin-form'),
  key: $('key'),
  session: $('session'),
  refresh: $('refresh'),
  signOut: $('sign-out'),
  banner: $('error-banner'),
  bannerText: $('error-text'),
  status: $('status'),
  empty: $('empty'),
  list: $('approval-list'),
  more: $('more'),
};

let key = sessionStorage.getItem(KEY_STORAGE) ?? '';
const cards = new Map(); // approval id -> {node, facts, note, buttons, approval}
// Ids this page saw decided (or gone): a list fetched before the decision must not bring them back.
const settled = new Set();
let generation = 0; // bumped by sign-in / sign-out, so an older answer is dropped
let timer = 0;
let inFlight = null; // {generation, promise} of the list request on its way
let loaded = false;
let skew = 0; // the gateway's clock minus ours, in seconds, when they differ noticeably
let errorFrom = null; // 'list' or 'action': a good list answer clears only its own error

// ---- the API ---------------------------------------------------------------------------------

async function api(path, init = {}) {
  const response = await fetch(path, {
    ...init,
    // Past the HTTP cache: a list is always fresh, and the browser does not hold a second request
    // for the same URL (another key's) behind one still on its way.
    cache: 'no-store',
    headers: { Accept: 'application/json', Authorization: `Bearer ${key}`, ...(init.headers ?? {}) },
  });
  const served = Date.parse(response.headers.get('Date') ?? '');
  if (!Number.isNaN(served)) {
    const diff = (served - Date.now()) / 1000;
    skew = Math.abs(diff) > 2 ? diff : 0; // the header has whole seconds: ignore less
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page): the status says enough
  }
  return { status: response.status, ok: response.ok, body };
}

const messageOf = ({ status, body }) => body?.error?.message ?? `the gateway answered HTTP ${status}`;

// ---- errors and status -----------------------------------------------------------------------

function showError(message, from) {
  ui.bannerText.textContent = message;
  ui.banner.hidden = false;
  errorFrom = from;
}

function clearError(from) {
  if (from && errorFrom !== from) return;
  ui.banner.hidden = true;
  ui.bannerText.textContent = '';
  errorFrom = null;
}

const say = (text) => (ui.status.textContent = text);

// ---- signing in ------------------------------------------------------------------------------

function showSignedIn() {
  const signedIn = Boolean(key);
  ui.signin.hidden = signedIn;
  ui.session.hidden = !signedIn;
  document.body.dataset.signedIn = String(signedIn);
  ui.empty.hidden = !signedIn || !loaded || cards.size > 0;
}

function signIn(value) {
  value = value.trim();
  if (!value) {
    showError('Enter your approver key.', 'action');
    return;
  }
  key = value;
  sessionStorage.setItem(KEY_STORAGE, key);
  ui.key.value = '';
  generation += 1;
  clearError();
  say('');
  showSignedIn();
  void refresh();
}

// `message`: why (the gateway refused the key), shown in the banner.
function signOut(message) {
  key = '';
  sessionStorage.removeItem(KEY_STORAGE);
  generation += 1;
  clearTimeout(timer);
  loaded = false;
  ui.more.hidden = true;
  for (const id of [...cards.keys()]) removeCard(id);
  showSignedIn();
  if (message) showError(message, 'action');
  else clearError();
  say('');
  ui.key.focus();
}

// ---- the list --------------------------------------------------------------------------------

// Fetches the pending approvals now (Refresh, sign-in) or every REFRESH_MS; never two at once for
// the same key (one still on its way for a key since replaced is left to be dropped).
async function refresh() {
  clearTimeout(timer);
  if (!key) return;
  if (inFlight?.generation === generation) return inFlight.promise;
  const mine = generation;
  const request = (async () => {
    try {
      const approvals = [];
      let cursor = null;
      for (let page = 0; page < MAX_PAGES; page += 1) {
        const query = new URLSearchParams({ state: 'pending', limit: String(PAGE_SIZE) });
        if (cursor) query.set('cursor', cursor);
        const answer = await api(`/api/approvals?${query}`);
        if (mine !== generation) return;
        if (answer.status === 401) return signOut(messageOf(answer));
        if (!answer.ok) return showError(messageOf(answer), 'list');
        approvals.push(...(answer.body?.approvals ?? []));
        cursor = answer.body?.next_cursor ?? null;
        if (!cursor) break;
      }
      clearError('list');
      loaded = true;
      render(approvals);
      ui.more.hidden = !cursor;
      ui.more.textContent = cursor ? `Showing the oldest ${approvals.length}; more wait. Decide some to see the next.` : '';
    } catch (exc) {
      if (mine === generation) showError(`The gateway did not answer: ${exc.message}`, 'list');
    } finally {
      if (inFlight?.promise === request) inFlight = null;
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes ?? 0) + 1); // for tests
      if (mine === generation && key) timer = setTimeout(refresh, REFRESH_MS);
    }
  })();
  inFlight = { generation: mine, promise: request };
  return request;
}

function render(approvals) {
  const shown = approvals.filter((a) => a?.id && !settled.has(a.id));
  const ids = new Set(shown.map((a) => a.id));
  for (const id of [...cards.keys()]) if (!ids.has(id)) removeCard(id);
  for (const approval of shown) {
    const card = cards.get(approval.id);
    if (card) update(card, approval);
    else cards.set(approval.id, createCard(approval));
  }
  // Oldest first, as the gateway lists them; a card being answered keeps its place and its input.
  const nodes = shown.map((a) => cards.get(a.id).node);
  if (!nodes.every((node, i) => ui.list.children[i] === node) || nodes.length !== ui.list.children.length) {
    ui.list.replaceChildren(...nodes);
  }
  showSignedIn();
  tick();
}

function removeCard(id) {
  cards.get(id)?.node.remove();
  cards.delete(id);
  showSignedIn();
}

// ---- one approval ----------------------------------------------------------------------------

const fact = (caption, ...content) => el('div', { class: 'fact' }, el('dt', { class: 'caption' }, caption), el('dd', {}, ...content));

function votesText(approval) {
  const votes = approval.votes ?? [];
  const yes = votes.filter((v) => v.approved).length;
  const quorum = approval.quorum ?? 1;
  const who = votes.map((v) => `${v.user} ${v.approved ? 'approved' : 'denied'}`).join(', ');
  return `${yes} of ${quorum} approval${quorum === 1 ? '' : 's'}${who ? ` (${who})` : ''}`;
}

function facts(approval) {
  return [
    fact('rule', approval.rule ? el('code', { class: 'rule' }, approval.rule) : "the tool's own approval setting"),
    fact('requester', el('span', { class: 'requester' }, approval.requester ?? 'unknown')),
    fact('approvers', approval.approvers ?? 'the requester', approval.self_approval === false ? ' (not the requester)' : ''),
    fact('votes', el('span', { class: 'votes' }, votesText(approval))),
    fact('deadline', el('span', { class: 'countdown', 'data-deadline': approval.deadline ?? '' })),
  ];
}

function createCard(approval) {
  const reason = el('input', { class: 'reason', type: 'text', placeholder: 'Reason (optional)', 'aria-label': 'Reason for denying' });
  const denyForm = el(
    'form',
    { class: 'deny-form', hidden: true, onsubmit: (event) => { event.preventDefault(); void decide(approval.id, false, reason.value.trim()); } },
    reason,
    el('button', { type: 'submit', class: 'deny confirm-deny' }, 'Deny'),
    el('button', { type: 'button', class: 'link', onclick: () => { denyForm.hidden = true; actions.hidden = false; } }, 'Cancel'),
  );
  const actions = el(
    'div',
    { class: 'approval' },
    el('button', { type: 'button', class: 'approve', onclick: () => void decide(approval.id, true) }, 'Approve'),
    // A standing grant decides what one approver may: a call of their group with a quorum of 1.
    approval.approvers && (approval.quorum ?? 1) === 1 &&
      el('button', { type: 'button', class: 'approve grant', onclick: () => void grantThenApprove(approval.id) }, 'Approve and allow for 1 hour'),
    el('button', { type: 'button', class: 'deny', onclick: () => { actions.hidden = true; denyForm.hidden = false; reason.focus(); } }, 'Deny'),
  );
  const factList = el('dl', { class: 'facts' }, ...facts(approval));
  const note = el('p', { class: 'tool-note', hidden: true });
  const node = el(
    'article',
    { class: 'tool tool-waiting inbox-item', 'data-approval-id': approval.id, 'data-tool': approval.tool, 'data-agent': approval.agent },
    el(
      'div',
      { class: 'tool-head' },
      el('span', { class: 'caption' }, 'tool'),
      el('code', { class: 'tool-name' }, approval.tool),
      el('span', { class: 'tool-where' }, `on ${approval.agent}`),
      el('span', { class: 'badge badge-waiting' }, 'waiting for approval'),
    ),
    el('div', { class: 'tool-section' }, el('span', { class: 'caption' }, 'arguments'), json(approval.args ?? {})),
    approval.hint && el('p', { class: 'hint' }, approval.hint),
    factList,
    note,
    actions,
    denyForm,
  );
  return { node, factList, note, buttons: [...node.querySelectorAll('button')], approval };
}

function update(card, approval) {
  const before = card.approval;
  card.approval = approval;
  if (JSON.stringify(before.votes) !== JSON.stringify(approval.votes) || before.deadline !== approval.deadline) {
    card.factList.replaceChildren(...facts(approval));
    tick(); // the new countdown shows at once, not a second later
  }
}

function busy(card, on) {
  for (const button of card.buttons) button.disabled = on;
}

async function decide(id, approved, reason) {
  const card = cards.get(id);
  if (!card) return;
  const { tool, agent } = card.approval;
  busy(card, true);
  say(`Sending your ${approved ? 'approval' : 'denial'} of ${tool}…`);
  const mine = generation;
  let answer;
  try {
    const body = approved || !reason ? { approved } : { approved, reason };
    answer = await api(`/api/approvals/${encodeURIComponent(id)}`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    });
  } catch (exc) {
    busy(card, false);
    say('');
    showError(`The gateway did not answer: ${exc.message}`, 'action');
    return;
  }
  if (mine !== generation) return;
  if (answer.status === 401) return signOut(messageOf(answer));
  if (answer.ok && answer.body?.state === 'pending') {
    // Counted; the quorum needs more approvers.
    update(card, answer.body);
    card.note.textContent = 'Your approval is counted; the call waits for more approvers.';
    card.note.hidden = false;
    busy(card, false);
    clearError('action');
    say('');
    return;
  }
  if (answer.ok) {
    settled.add(id);
    removeCard(id);
    clearError('action');
    const outcome = answer.body?.outcome ?? (approved ? 'approved' : 'denied');
    say(`${tool} on ${agent}: ${outcome}.`);
    return;
  }
  say('');
  showError(messageOf(answer), 'action');
  if ([404, 409, 410].includes(answer.status)) {
    // Decided elsewhere, or its chat is gone: nothing left to answer here.
    settled.add(id);
    removeCard(id);
  } else {
    busy(card, false);
  }
}

// "Approve and allow for 1 hour": a standing grant for the group over this requester's calls of
// the tool (POST /api/grants, docs/approvals.md "Standing grants"), then the approval itself. A grant
// refused leaves the call unanswered, with why.
async function grantThenApprove(id) {
  const card = cards.get(id);
  if (!card) return;
  const { tool, agent, approvers, requester } = card.approval;
  busy(card, true);
  say(`Allowing ${tool} on ${agent} for an hour…`);
  let answer;
  try {
    answer = await api('/api/grants', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ agent, tool, group: approvers, user: requester, ttl: GRANT_SECONDS }),
    });
  } catch (exc) {
    answer = { status: 0, ok: false, body: { error: { message: `The gateway did not answer: ${exc.message}` } } };
  }
  if (answer.status === 401) return signOut(messageOf(answer));
  if (!answer.ok) {
    busy(card, false);
    say('');
    showError(`Not allowed for an hour: ${messageOf(answer)}`, 'action');
    return;
  }
  await decide(id, true);
}

// ---- countdowns ------------------------------------------------------------------------------

function left(seconds) {
  if (seconds <= 0) return 'expired';
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const pad = (n) => String(n).padStart(2, '0');
  return `expires in ${h ? `${h}:${pad(m)}` : m}:${pad(s % 60)}`;
}

function tick() {
  const now = Date.now() / 1000 + skew;
  for (const node of ui.list.querySelectorAll('.countdown')) {
    const deadline = Number.parseFloat(node.dataset.deadline);
    node.textContent = Number.isFinite(deadline) ? left(deadline - now) : 'no deadline';
    node.classList.toggle('expired', Number.isFinite(deadline) && deadline <= now);
  }
}

// ---- wiring ----------------------------------------------------------------------------------

ui.signinForm.addEventListener('submit', (event) => {
  event.preventDefault();
  signIn(ui.key.value);
});
ui.signOut.addEventListener('click', () => signOut());
ui.refresh.addEventListener('click', () => void refresh());
$('error-dismiss').addEventListener('click', () => clearError());
setInterval(tick, 1000);

showSignedIn();
if (key) void refresh();
else ui.key.focus();
