// Drives toolhost's MCP server with the official TypeScript SDK client, for tests/mcp.rs.
//
//   node client.mjs http  <url> <api-key>
//   node client.mjs stdio <toolhost binary> <data dir> <tenant> [extra `toolhost mcp` args]
//
// Prints one JSON line per step; after "unknown" it waits for one tools/list_changed
// notification (over stdio only with WAIT_FOR_CHANGE set; the test installs a tool
// meanwhile) and prints "changed" with the new count. With EXAMPLE_CALLS (a JSON list of
// [name, arguments]) it makes those calls after "listed" instead, one "example" step each.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [mode, ...rest] = process.argv.slice(2);
const say = (step, data) => console.log(JSON.stringify({ step, ...data }));

let transport;
if (mode === "http") {
  const [url, key] = rest;
  transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
} else {
  const [binary, dataDir, tenant, ...extra] = rest;
  transport = new StdioClientTransport({
    command: binary,
    args: ["mcp", ...extra],
    env: { ...process.env, TOOLHOST_DATA_DIR: dataDir, TOOLHOST_TENANT: tenant },
    stderr: "ignore",
  });
}

const client = new Client({ name: "toolhost-test", version: "1.0.0" });
let changed;
const changeSeen = new Promise((resolve) => (changed = resolve));
client.setNotificationHandler(ToolListChangedNotificationSchema, () => changed());

await client.connect(transport);
say("initialized", { server: client.getServerVersion(), capabilities: client.getServerCapabilities() });

async function listAll() {
  const tools = [];
  let cursor;
  let pages = 0;
  do {
    const page = await client.listTools(cursor ? { cursor } : {});
    tools.push(...page.tools);
    cursor = page.nextCursor;
    pages += 1;
  } while (cursor);
  return { tools, pages };
}

const { tools, pages } = await listAll();
say("listed", { names: tools.map((t) => t.name), pages, first: tools[0] });

if (process.env.EXAMPLE_CALLS) {
  for (const [name, args] of JSON.parse(process.env.EXAMPLE_CALLS)) {
    say("example", { name, result: await client.callTool({ name, arguments: args }) });
  }
  await client.close();
  say("closed", {});
  process.exit(0);
}

const ok = await client.callTool({ name: "text_stats", arguments: { text: "one two three" } });
say("called", { result: ok });

const bad = await client.callTool({ name: "text_stats", arguments: { text: 42 } });
say("bad_args", { result: bad });

try {
  await client.callTool({ name: "no_such_tool", arguments: {} });
  say("unknown", { threw: false });
} catch (error) {
  say("unknown", { threw: true, message: String(error.message ?? error) });
}

// Over stdio, only when asked: the test then installs a tool through the CLI, which reaches
// `toolhost mcp` through its admin socket.
if (mode === "http" || process.env.WAIT_FOR_CHANGE) {
  say("waiting", {});
  // unref: a pending timer must not keep node alive after the client closes.
  const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error("no list_changed within 20 s")), 20000).unref());
  await Promise.race([changeSeen, timeout]);
  const after = await listAll();
  say("changed", { count: after.tools.length });
}

await client.close();
say("closed", {});
