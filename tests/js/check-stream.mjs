// Replays recorded chunk sequences through the AI SDK's own parser and message assembler.
// stdin: [{version: 6|7, chunks: [...], message?: UIMessage}], stdout: [{schemaErrors, streamError, message}].
// `message` is the assistant message a continuation extends, as a Chat would pass it.
// With `--lines`: one such array per line of stdin, its answer one line of stdout, until stdin ends
// (one Node start for many checks: tests/jsdriver.StreamChecker).
import { createInterface } from 'node:readline';
import { describeSchemaError, loadSdk } from './lib/chat.mjs';

async function check(input) {
  const results = [];
  for (const { version, chunks, message } of input) {
    const sdk = await loadSdk(version);
    const schema = sdk.uiMessageChunkSchema();
    const schemaErrors = [];
    for (const [index, chunk] of chunks.entries()) {
      const result = await schema.validate(chunk);
      if (!result.success) schemaErrors.push({ index, chunk, error: describeSchemaError(chunk, result.error) });
    }
    let streamError = null;
    let last = null;
    const stream = new ReadableStream({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(chunk);
        controller.close();
      },
    });
    try {
      for await (const snapshot of sdk.readUIMessageStream({ stream, message, terminateOnError: true })) last = snapshot;
    } catch (error) {
      streamError = String(error?.message ?? error);
    }
    results.push({ schemaErrors, streamError, message: last });
  }
  return results;
}

if (process.argv.includes('--lines')) {
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (line.trim()) process.stdout.write(JSON.stringify(await check(JSON.parse(line))) + '\n');
  }
} else {
  const input = JSON.parse(await new Promise((resolve) => {
    let data = '';
    process.stdin.on('data', (d) => (data += d));
    process.stdin.on('end', () => resolve(data));
  }));
  process.stdout.write(JSON.stringify(await check(input)));
}
