// The small DOM helpers both pages use: building elements, and showing a JSON value.

// An element with attributes (`on<event>` adds a listener; null / false leave the attribute out)
// and children (strings become text nodes, so nothing from the server is ever parsed as HTML).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key === 'class') node.className = value;
    else node.setAttribute(key, value === true ? '' : value);
  }
  node.append(...children.filter((child) => child != null && child !== false));
  return node;
}

// Small values on one line, bigger ones indented.
export function json(value) {
  const line = JSON.stringify(value, null, 1)?.replace(/\n\s*/g, ' ') ?? String(value);
  return el('pre', { class: 'json' }, line.length <= 72 ? line : JSON.stringify(value, null, 2));
}
