// Builds the demo pages into gateway/static/demo/ (git-ignored): the AI SDK chat (index.html,
// app.js, app.css), the AG-UI chat (agui.html, agui.js, with app.css) and the approvers' inbox
// (inbox.html, inbox.js, inbox.css).
// Run after `npm ci` (the Makefile does both): node build.mjs
import { build } from 'esbuild';
import { copyFile, mkdir, rm } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

const src = fileURLToPath(new URL('./src/', import.meta.url));
const out = fileURLToPath(new URL('../gateway/static/demo/', import.meta.url));

await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
await build({
  entryPoints: ['app.js', 'app.css', 'agui.js', 'inbox.js', 'inbox.css'].map((name) => `${src}${name}`),
  outdir: out,
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: 'es2022',
  minify: true,
  sourcemap: 'linked',
  legalComments: 'linked',
  logLevel: 'warning',
});
for (const page of ['index.html', 'agui.html', 'inbox.html']) await copyFile(`${src}${page}`, `${out}${page}`);
console.log(`demo pages built into ${out}`);
