// Builds the demo page into gateway/static/demo/ (git-ignored): index.html, app.js, app.css.
// Run after `npm ci` (the Makefile does both): node build.mjs
import { build } from 'esbuild';
import { copyFile, mkdir, rm } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

const src = fileURLToPath(new URL('./src/', import.meta.url));
const out = fileURLToPath(new URL('../gateway/static/demo/', import.meta.url));

await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
await build({
  entryPoints: [`${src}app.js`, `${src}app.css`],
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
await copyFile(`${src}index.html`, `${out}index.html`);
console.log(`demo page built into ${out}`);
