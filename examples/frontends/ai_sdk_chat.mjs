// Sends one message through the AI SDK's own chat transport (the one useChat uses by
// default) to runrow's mounted API, prints the answer as it streams, then asks the
// transport to reattach (what useChat does after a page reload): nothing is active by
// then, so the server answers 204 and the transport returns null.
//
//   npm ci && CHAT_URL=http://127.0.0.1:8000/chat node ai_sdk_chat.mjs "hello"
import { randomUUID } from "node:crypto";
import { DefaultChatTransport, readUIMessageStream } from "ai";

const base = process.env.CHAT_URL ?? "http://127.0.0.1:8000/chat";
const transport = new DefaultChatTransport({
  api: `${base}/v1/ai-sdk/chat`, // reattaching GETs `${api}/${chatId}/stream`
  headers: { Authorization: `Bearer ${process.env.CHAT_TOKEN ?? "user-alice"}` },
});
const chatId = process.env.CHAT_ID ?? `chat-${randomUUID()}`;
const text = process.argv[2] ?? "hello";

const stream = await transport.sendMessages({
  trigger: "submit-message",
  chatId,
  messageId: undefined,
  messages: [{ id: randomUUID(), role: "user", parts: [{ type: "text", text }] }],
  abortSignal: undefined,
});
let message;
for await (message of readUIMessageStream({ stream })) {
  const answer = message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  process.stderr.write(`\r${answer}`);
}
process.stderr.write("\n");
const again = await transport.reconnectToStream({ chatId });
console.log(JSON.stringify({ chatId, message, reattached: again !== null }));
