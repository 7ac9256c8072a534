// Reads a file of SSE text as an AG-UI HttpAgent reads a run's response: its own SSE
// parsing, event schema, verifier (verifyEvents) and message reducer, by handing the
// agent a fetch that answers with the file. Prints {"events", "messages", "error"} as
// JSON: the events the agent accepted, the messages it built from them, and the run's
// error (a RUN_ERROR, or the client rejecting the stream). Exits non-zero when the client
// rejected the stream itself, rather than receiving a RUN_ERROR.
import { readFile } from "node:fs/promises";
import { HttpAgent } from "@ag-ui/client";

const text = await readFile(process.argv[2], "utf8");
const agent = new HttpAgent({
  url: "http://runrow.invalid/agent",
  threadId: process.argv[3] ?? "thread",
  fetch: async () =>
    new Response(text, { status: 200, headers: { "content-type": "text/event-stream" } }),
});
const events = [];
let runError = null;
let error = null;
try {
  await agent.runAgent(
    {},
    {
      onEvent: ({ event }) => {
        events.push(event);
      },
      onRunErrorEvent: ({ event }) => {
        runError = event;
      },
      onRunFailed: ({ error: e }) => {
        error = String(e?.message ?? e);
        return { stopPropagation: true };
      },
    },
  );
} catch (e) {
  error = String(e?.message ?? e);
}
process.stdout.write(JSON.stringify({ events, messages: agent.messages, runError, error }) + "\n");
process.exit(error !== null && runError === null ? 1 : 0);
