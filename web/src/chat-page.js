// What the two chat pages (index.html over the AI SDK, agui.html over AG-UI) share on screen:
// their controls, the now-playing note of the browser's music, and how the examples and the agent
// picker follow the chosen agent and whether a response is under way.

const $ = (id) => document.getElementById(id);

export function chatControls() {
  return {
    list: $('message-list'),
    empty: $('empty'),
    form: $('composer'),
    input: $('input'),
    send: $('send'),
    stop: $('stop'),
    status: $('status'),
    banner: $('error-banner'),
    bannerText: $('error-text'),
    endpoint: $('endpoint'),
    agent: $('agent'),
    nowPlaying: $('now-playing'),
    examples: [...document.querySelectorAll('.example')],
    errorDismiss: $('error-dismiss'),
    newChat: $('new-chat'),
  };
}

// `show(title, description)`: the note beside the controls for 4 s (change_bgm's onPlaying).
export function nowPlayingNote(node) {
  let timer;
  return function show(title, description) {
    node.textContent = `♪ ${title}`;
    node.title = description;
    node.hidden = false;
    clearTimeout(timer);
    timer = setTimeout(() => (node.hidden = true), 4000);
  };
}

// The agent picker shows `agentName`; examples marked with data-agent are that agent's (unmarked
// ones suit any agent); nothing can be sent while `busy`.
export function showControls(ui, { agentName, busy }) {
  ui.agent.value = agentName;
  ui.agent.disabled = busy;
  ui.send.disabled = busy;
  for (const button of ui.examples) {
    button.hidden = Boolean(button.dataset.agent) && button.dataset.agent !== agentName;
    button.disabled = busy;
  }
  document.body.dataset.agent = agentName; // for tests and styling
}

// Draws the page at most once a frame, however many changes arrive, and keeps a reader who was at
// the bottom there. Returns `schedule()`, which asks for the next frame's drawing.
export function drawOnFrames(draw) {
  let frame = 0;
  const run = () => {
    frame = 0;
    const atBottom = innerHeight + scrollY >= document.body.scrollHeight - 40;
    draw();
    if (atBottom) scrollTo(0, document.body.scrollHeight);
  };
  return () => {
    frame ||= requestAnimationFrame(run);
  };
}
