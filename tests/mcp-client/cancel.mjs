// Cancels a running call with the official TypeScript SDK client, for tests/it/mcp.rs:
//
//   node cancel.mjs <url> <api-key>
//
// Calls `busy` for 20 s and aborts it after 300 ms (the SDK sends notifications/cancelled),
// then calls `busy` for 1 ms until the tenant's one concurrent place is free again. Prints one
// JSON line: the abort, and how long after it the next call ran.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, key] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: "toolhost-test", version: "1.0.0" });
await client.connect(transport);

let aborted = null;
try {
  await client.callTool({ name: "busy", arguments: { ms: 20000 } }, undefined, {
    signal: AbortSignal.timeout(300),
    timeout: 60000,
  });
} catch (error) {
  aborted = String(error.message ?? error);
}
const abortedAt = Date.now();
// The cancellation and this call travel as separate requests: retry while the first is
// still being stopped, and say how long that took (20 s if it was never stopped).
let next;
do {
  next = await client.callTool({ name: "busy", arguments: { ms: 1 } });
} while (next.isError && Date.now() - abortedAt < 10000);
console.log(JSON.stringify({ aborted, nextAfterMs: Date.now() - abortedAt, next }));
await client.close();
