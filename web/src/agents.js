// The agents a page may talk to (GET /api/agents), shared by the AI SDK page and the AG-UI page.

// The agent a gateway without GET /api/agents serves: one, on the original routes.
export const FALLBACK_AGENT = { name: 'demo_agent', default: true, api: '/api/chat', ws: '/api/chat/ws' };

// The agents this page may talk to, from GET /api/agents: `{default, agents: [{name, api, ws, browser_tools}]}`,
// only those the caller may use. Any failure (an older gateway answers 404) means the one
// default agent on the original routes.
export async function loadAgents() {
  try {
    const response = await fetch('/api/agents', { headers: { accept: 'application/json' }, signal: AbortSignal.timeout(5000) });
    if (!response.ok) throw new Error(`GET /api/agents: ${response.status}`);
    const { agents } = await response.json();
    const usable = (agents ?? []).filter((agent) => agent?.name && agent.api && agent.ws);
    if (usable.length) return usable;
  } catch (error) {
    console.info('Using the default agent only:', error.message);
  }
  return [FALLBACK_AGENT];
}

// An agent's AG-UI route: `/agents/<name>/ag-ui`, or `/ag-ui` (the default agent's) for a gateway
// that lists no agents.
export function aguiRoute(agent) {
  return agent === FALLBACK_AGENT ? '/ag-ui' : `/agents/${encodeURIComponent(agent.name)}/ag-ui`;
}

// The `?agent=` of the page's URL if the caller may use it, else the gateway's default agent.
export function initialAgent(agents, params) {
  return agents.find((a) => a.name === params.get('agent')) ?? agents.find((a) => a.default) ?? agents[0];
}

// Keeps a choice in the page's URL (`?agent=...`), which preselects it on a reload.
export function setParam(key, value) {
  const url = new URL(location.href);
  url.searchParams.set(key, value);
  history.replaceState(null, '', url);
}
