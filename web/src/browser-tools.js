// The tools this page can run in the browser (the demo config's `runs_in: browser` tools). Each one
// gets the call's input and a `respond` function, and calls it exactly once with either
// `{output}` or `{state: 'output-error', errorText}`: what `chat.addToolOutput` takes.

// What a gateway that does not list an agent's browser tools (GET /api/agents without
// `browser_tools`) is taken to run in the browser: the demo agent's.
const DEMO_BROWSER_TOOLS = ['get_location', 'change_bgm'];

// Whether `agent` (an entry of GET /api/agents) runs `toolName` in the browser. The AI SDK calls
// onToolCall for every tool call, server-run ones too: only these are the page's to answer.
export function runsInBrowser(agent, toolName) {
  return (agent.browser_tools ?? DEMO_BROWSER_TOOLS).includes(toolName);
}

export function runBrowserTool(toolCall, respond, { onPlaying } = {}) {
  switch (toolCall.toolName) {
    case 'get_location':
      return getLocation(respond);
    case 'change_bgm':
      return changeBgm(toolCall.input ?? {}, respond, onPlaying);
    default:
      // A tool the gateway runs in the browser that this page does not implement: say so, rather
      // than leaving the agent waiting until the policy's timeout.
      return respond({ state: 'output-error', errorText: `This page has no browser tool named ${toolCall.toolName}.` });
  }
}

// get_location: the browser's Geolocation API. Denied, unavailable or too slow: an error output,
// which the agent reads ("I could not get your location: ...").
function getLocation(respond) {
  if (!('geolocation' in navigator)) {
    respond({ state: 'output-error', errorText: 'This browser has no geolocation.' });
    return;
  }
  navigator.geolocation.getCurrentPosition(
    ({ coords }) =>
      respond({
        output: {
          latitude: round(coords.latitude),
          longitude: round(coords.longitude),
          accuracy_m: Math.round(coords.accuracy),
        },
      }),
    (error) => respond({ state: 'output-error', errorText: `Location unavailable: ${geolocationReason(error)}` }),
    { timeout: 15000, maximumAge: 60000 },
  );
}

function geolocationReason(error) {
  if (error.code === error.PERMISSION_DENIED) return 'the permission was denied.';
  if (error.code === error.TIMEOUT) return 'the browser took too long to find the position.';
  return error.message || 'the position could not be determined.';
}

const round = (value) => Math.round(value * 1e5) / 1e5;

// change_bgm: "background music" is a short generated chord, one per track number (WebAudio).
// Where audio cannot play, the output says what would have played.
let audio;

function changeBgm(input, respond, onPlaying) {
  const track = Number.isInteger(input.track) ? input.track : Number.parseInt(input.track, 10);
  if (!Number.isFinite(track)) {
    respond({ state: 'output-error', errorText: `Not a track number: ${JSON.stringify(input.track)}` });
    return;
  }
  const notes = chordFor(track);
  const description = `track ${track}: a 1.5 s chord of ${notes.map((hz) => `${Math.round(hz)} Hz`).join(', ')}`;
  let played;
  try {
    audio ??= new AudioContext();
    void audio.resume(); // a page may only start audio after a click; the example buttons are one
    playChord(audio, notes);
    played = audio.state === 'running' ? 'playing' : 'queued (the browser has not allowed audio yet)';
  } catch (error) {
    played = `not played: ${error.message}`;
  }
  onPlaying?.(`Track ${track}`, description);
  respond({ output: { track, playing: true, sound: description, audio: played } });
}

// Track n: a major chord whose root climbs a whole tone per track, from A3.
function chordFor(track) {
  const root = 220 * 2 ** ((((track - 1) % 12) * 2) / 12);
  return [1, 5 / 4, 3 / 2].map((ratio) => root * ratio);
}

function playChord(context, notes) {
  const start = context.currentTime + 0.05;
  const gain = context.createGain();
  gain.gain.setValueAtTime(0.0001, start);
  gain.gain.exponentialRampToValueAtTime(0.15, start + 0.05);
  gain.gain.exponentialRampToValueAtTime(0.0001, start + 1.5);
  gain.connect(context.destination);
  notes.forEach((hz, i) => {
    const osc = context.createOscillator();
    osc.type = 'triangle';
    osc.frequency.value = hz;
    osc.connect(gain);
    osc.start(start + i * 0.12);
    osc.stop(start + 1.6);
  });
}
