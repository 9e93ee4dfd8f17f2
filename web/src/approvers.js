// What a page says about a call its approvers decide (the demo's support_agent refunds above 100).

// What a call its approvers decide says while it waits and once decided (the `data-approval` part
// of the AI SDK routes, the `adk_gateway.approval` activity of the AG-UI route: the same object).
export function approverNoteText(data) {
  const rule = data.rule ? ` (rule ${data.rule})` : '';
  if (data.state === 'waiting') return `Waiting for the ${data.approvers}${rule}: they decide in the approvals inbox.`;
  if (data.state === 'decided') {
    return `${data.approved ? 'Approved' : 'Denied'} by ${(data.by ?? []).join(', ') || 'the approvers'}${data.reason ? `: ${data.reason}` : ''}.`;
  }
  return `No decision from the ${data.approvers}: ${data.state}.`;
}
