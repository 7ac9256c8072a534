// Runs runrow's agent through AG-UI's own HttpAgent against runrow's mounted API and
// prints the messages it built from the event stream.
//
//   npm ci && CHAT_URL=http://127.0.0.1:8000/chat node ag_ui_run.mjs "hello"
import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";

const base = process.env.CHAT_URL ?? "http://127.0.0.1:8000/chat";
const agent = new HttpAgent({
  url: `${base}/v1/ag-ui`,
  headers: { Authorization: `Bearer ${process.env.CHAT_TOKEN ?? "user-alice"}` },
  threadId: process.env.CHAT_ID ?? `thread-${randomUUID()}`,
});
agent.messages = [{ id: randomUUID(), role: "user", content: process.argv[2] ?? "hello" }];
await agent.runAgent(
  { runId: randomUUID() },
  { onTextMessageContentEvent: ({ event }) => process.stderr.write(event.delta) },
);
process.stderr.write("\n");
console.log(JSON.stringify({ threadId: agent.threadId, messages: agent.messages }));
