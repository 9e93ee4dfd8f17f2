// The AG-UI demo page: wires an AG-UI thread (agui-thread.js, the stock HttpAgent of
// @ag-ui/client), the browser tools (browser-tools.js) and the rendering (agui-render.js) to the
// page's controls. The AI SDK page (app.js) is the same demo over the gateway's other protocol.
import { aguiRoute, initialAgent, loadAgents, setParam } from './agents.js';
import { AguiThread } from './agui-thread.js';
import { createThreadView } from './agui-render.js';
import { runsInBrowser } from './browser-tools.js';
import { chatControls, drawOnFrames, nowPlayingNote, showControls } from './chat-page.js';

const ui = chatControls();
const showNowPlaying = nowPlayingNote(ui.nowPlaying);
const scheduleRender = drawOnFrames(render);

// ?agent=<name> opens the page on that agent (if the caller may use it); the selector switches to
// a fresh thread, since a thread and its interrupts belong to the agent it was held with.
const agents = await loadAgents();
let agent = initialAgent(agents, new URLSearchParams(location.search));
ui.agent.replaceChildren(...agents.map((a) => new Option(a.name, a.name)));
let thread = newThread();

function newThread() {
  return new AguiThread({ agent, onChange: scheduleRender, onPlaying: showNowPlaying });
}

function send(text) {
  text = text.trim();
  if (!text || thread.busy) return;
  ui.input.value = '';
  thread.send(text);
}

function restart() {
  thread.stop();
  thread = newThread();
  scheduleRender();
}

function switchAgent(name) {
  const next = agents.find((a) => a.name === name);
  if (next && next !== agent && !thread.busy) {
    agent = next;
    setParam('agent', name);
    restart();
  }
  scheduleRender(); // the selector shows the current agent again if the switch was refused
}

const renderThread = createThreadView(ui.list, {
  answer: (interrupt, approved) => thread.answer(interrupt, approved),
  runsInBrowser: (toolName) => runsInBrowser(agent, toolName),
});

// What the thread is waiting for, in words.
function statusText() {
  if (thread.status === 'browser') return 'Running the tool in your browser…';
  if (thread.status === 'running') {
    const waiting = thread.messages.some((m) => m.role === 'activity' && m.content?.state === 'waiting');
    return waiting ? 'Waiting for the approvers: the run goes on when they decide in the approvals inbox.' : 'The agent is answering…';
  }
  const open = thread.unanswered.length;
  if (open) return `Waiting for you: Approve or Deny ${open > 1 ? `the ${open} calls` : 'the call'} above.`;
  return '';
}

function render() {
  renderThread(thread);
  ui.empty.hidden = thread.messages.length > 0;
  ui.status.textContent = statusText();
  ui.stop.hidden = thread.status !== 'running';
  ui.banner.hidden = !thread.error;
  ui.bannerText.textContent = thread.error ? `${thread.error.message}${thread.error.code ? ` (${thread.error.code})` : ''}` : '';
  ui.endpoint.textContent = `POST ${aguiRoute(agent)} (AG-UI 1.0 over Server-Sent Events)`;
  showControls(ui, { agentName: agent.name, busy: thread.busy });
  document.body.dataset.status = thread.status; // for tests and styling
}

ui.form.addEventListener('submit', (event) => {
  event.preventDefault();
  send(ui.input.value);
});
ui.stop.addEventListener('click', () => thread.stop());
ui.errorDismiss.addEventListener('click', () => {
  thread.error = null;
  scheduleRender();
});
ui.newChat.addEventListener('click', restart);
for (const button of ui.examples) button.addEventListener('click', () => send(button.textContent));
ui.agent.addEventListener('change', () => switchAgent(ui.agent.value));

window.demo = { get thread() { return thread; } }; // for the console: demo.thread.messages
scheduleRender();
