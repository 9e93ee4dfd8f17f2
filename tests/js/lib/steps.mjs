// What the drivers share about their input: stdin read as JSON, and a step's approval decisions.

export async function readStdin() {
  let text = '';
  for await (const piece of process.stdin) text += piece;
  return JSON.parse(text);
}

// `approvals` of a step: one decision for every approval ("approve" | "deny"), or a list taken in
// order; each call gives the next decision, undefined when there is none.
export function decisions(approvals) {
  if (approvals == null) return () => undefined;
  if (typeof approvals === 'string') return () => approvals;
  const queue = [...approvals];
  return () => queue.shift();
}
