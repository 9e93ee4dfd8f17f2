// The demo page: wires the AI SDK Chat (chat.js), the browser tools (browser-tools.js) and the
// rendering (render.js) to the page's controls.
import { generateId, getToolName, isToolUIPart } from 'ai';
import { runBrowserTool, runsInBrowser } from './browser-tools.js';
import { initialAgent, loadAgents, setParam } from './agents.js';
import { TRANSPORTS, createChat } from './chat.js';
import { chatControls, drawOnFrames, nowPlayingNote, showControls } from './chat-page.js';
import { createMessageList } from './render.js';

const ui = { ...chatControls(), toggle: [...document.querySelectorAll('[data-transport]')] };
const showNowPlaying = nowPlayingNote(ui.nowPlaying);
const scheduleRender = drawOnFrames(render);

// ?transport=ws opens the page on the WebSocket transport; the toggle switches at any time.
const params = new URLSearchParams(location.search);
let transport = params.get('transport') === 'ws' ? 'ws' : 'sse';
// ?agent=<name> opens the page on that agent, if the gateway lets this caller use it; otherwise
// on the gateway's default agent. The selector switches at any time, to a fresh chat.
const agents = await loadAgents();
let agent = initialAgent(agents, params);
ui.agent.replaceChildren(...agents.map((a) => new Option(a.name, a.name)));
let chat = newChat(generateId(), []);

function newChat(id, messages) {
  const chatAgent = agent; // a chat stays with the agent it was opened on
  return createChat({
    id,
    messages,
    agent: chatAgent,
    transport,
    onChange: scheduleRender,
    onToolCall: ({ toolCall }) => {
      // The SDK calls this for every call; one the server runs (an approval that waits for
      // someone else, say) is not the page's to answer.
      if (!runsInBrowser(chatAgent, toolCall.toolName)) return;
      // Not awaited, and answered on whichever Chat is current when the tool finishes (the
      // person may switch transport while the browser asks for the position).
      runBrowserTool(
        toolCall,
        (result) => void chat.addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, ...result }),
        { onPlaying: showNowPlaying },
      );
    },
  });
}

const busy = () => chat.status === 'submitted' || chat.status === 'streaming';

function send(text) {
  text = text.trim();
  if (!text || busy()) return;
  ui.input.value = '';
  chat.sendMessage({ text }).catch(() => {}); // failures land in chat.error (the banner)
}

// Switching transport keeps the conversation: a new Chat with the same id and messages, on the
// other transport. The gateway does not care which transport answers an approval.
function switchTransport(kind) {
  if (kind === transport || busy()) return;
  transport = kind;
  const old = chat;
  chat = newChat(old.id, old.messages);
  void old.dispose(); // closes the WebSocket, if that was the old transport
  setParam('transport', kind);
  scheduleRender();
}

// Switching agent starts a fresh chat: a conversation (and its pending approvals) belongs to the
// agent it was held with, so it does not follow the person to another one.
function switchAgent(name) {
  const next = agents.find((a) => a.name === name);
  if (!next || next === agent || busy()) {
    scheduleRender(); // the selector shows the current agent again
    return;
  }
  agent = next;
  const old = chat;
  chat = newChat(generateId(), []);
  void old.dispose();
  setParam('agent', name);
  scheduleRender();
}

const actions = {
  approve: (part, approved) => void chat.addToolApprovalResponse({ id: part.approval.id, approved }),
  approveForChat: (part) => void allowInChat(part),
  runsInBrowser: (toolName) => runsInBrowser(agent, toolName),
};
const renderMessages = createMessageList(ui.list, actions);

// "Approve and allow for this chat": the person's standing grant for this tool's calls in this chat
// (POST /api/grants, for as long as the gateway lets a grant stand), then this approval. A grant the
// gateway refuses leaves the call unanswered, with why in the banner.
const GRANT_SECONDS = 8 * 3600;
let grantError = null; // why the last grant was refused, shown in the banner until dismissed
async function allowInChat(part) {
  const asked = chat;
  const body = { agent: agent.name, tool: getToolName(part), chat_id: asked.id, ttl: GRANT_SECONDS };
  let problem = null;
  try {
    const response = await fetch('/api/grants', {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json' },
      body: JSON.stringify(body),
    });
    if (!response.ok) problem = (await response.json().catch(() => null))?.error?.message ?? `HTTP ${response.status}`;
  } catch (exc) {
    problem = exc.message;
  }
  grantError = problem && `Not allowed for this chat: ${problem}`;
  scheduleRender();
  if (problem) return;
  void asked.addToolApprovalResponse({ id: part.approval.id, approved: true });
}

// What the chat is waiting for, in words.
function statusText() {
  if (chat.status === 'submitted') return 'Sending…';
  if (chat.status === 'streaming') return 'The agent is answering…';
  if (chat.status === 'error') return '';
  const last = chat.messages.at(-1);
  const tools = last?.role === 'assistant' ? last.parts.filter(isToolUIPart) : [];
  const waiting = tools.filter((part) => part.state === 'approval-requested');
  if (waiting.length) return `Waiting for you: Approve or Deny ${waiting.length > 1 ? `the ${waiting.length} calls` : 'the call'} above.`;
  const running = tools.find((part) => part.state === 'input-available' && runsInBrowser(agent, getToolName(part)));
  if (running) return `Running ${getToolName(running)} in your browser…`;
  return '';
}

function render() {
  renderMessages(chat.messages);
  ui.empty.hidden = chat.messages.length > 0;
  ui.status.textContent = statusText();
  ui.stop.hidden = !busy();
  ui.banner.hidden = !chat.error && !grantError;
  ui.bannerText.textContent = chat.error?.message ?? grantError ?? '';
  ui.endpoint.textContent = TRANSPORTS[transport].label(agent);
  showControls(ui, { agentName: agent.name, busy: busy() });
  for (const button of ui.toggle) {
    button.setAttribute('aria-checked', String(button.dataset.transport === transport));
    button.disabled = busy();
  }
  document.body.dataset.status = chat.status; // for tests and styling
  document.body.dataset.transport = transport;
}

ui.form.addEventListener('submit', (event) => {
  event.preventDefault();
  send(ui.input.value);
});
ui.stop.addEventListener('click', () => void chat.stop());
ui.errorDismiss.addEventListener('click', () => {
  grantError = null;
  chat.clearError();
  scheduleRender();
});
ui.newChat.addEventListener('click', () => {
  const old = chat;
  chat = newChat(generateId(), []);
  void old.dispose();
  scheduleRender();
});
for (const button of ui.examples) button.addEventListener('click', () => send(button.textContent));
for (const button of ui.toggle) button.addEventListener('click', () => switchTransport(button.dataset.transport));
ui.agent.addEventListener('change', () => switchAgent(ui.agent.value));

window.demo = { get chat() { return chat; } }; // for the console: demo.chat.messages
scheduleRender();
