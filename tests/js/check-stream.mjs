// Replays recorded chunk sequences through the AI SDK's own parser and message assembler.
// stdin: [{version: 6|7, chunks: [...], message?: UIMessage}], stdout: [{schemaErrors, streamError, message}].
// `message` is the assistant message a continuation extends, as a Chat would pass it.
import { describeSchemaError, loadSdk } from './lib/chat.mjs';

const input = JSON.parse(await new Promise((resolve) => {
  let data = '';
  process.stdin.on('data', (d) => (data += d));
  process.stdin.on('end', () => resolve(data));
}));

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
process.stdout.write(JSON.stringify(results));
