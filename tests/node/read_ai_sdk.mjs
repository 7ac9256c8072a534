// Reads a file of SSE text the way the AI SDK's DefaultChatTransport reads a response
// (parseJsonEventStream + uiMessageChunkSchema), feeds the chunks to readUIMessageStream
// and prints {"message", "errors", "chunkTypes"} as JSON. A chunk the schema rejects, or a
// chunk the message state cannot apply, exits non-zero.
import { readFile } from "node:fs/promises";
import { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } from "ai";

const text = await readFile(process.argv[2], "utf8");
const body = new Response(text).body;
const chunkTypes = [];
const chunks = parseJsonEventStream({ stream: body, schema: uiMessageChunkSchema }).pipeThrough(
  new TransformStream({
    transform(part, controller) {
      if (!part.success) throw part.error; // as the transport does: a bad chunk fails the request
      chunkTypes.push(part.value.type);
      controller.enqueue(part.value);
    },
  }),
);
const errors = [];
let message = null;
for await (const snapshot of readUIMessageStream({
  stream: chunks,
  terminateOnError: false,
  onError: (error) => errors.push(String(error?.message ?? error)),
})) {
  message = snapshot;
}
// Each "error" chunk (the run's own failure) reaches onError once; any further error is
// the client failing to apply the stream.
const errorChunks = chunkTypes.filter((t) => t === "error").length;
process.stdout.write(JSON.stringify({ message, errors, chunkTypes }) + "\n");
process.exit(errors.length > errorChunks ? 1 : 0);
