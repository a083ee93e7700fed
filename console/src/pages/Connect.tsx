import { useState } from "react";
import { exportTools, type ExportFormat } from "../api";
import CopyBlock from "../components/CopyBlock";
import ErrorAlert from "../components/ErrorAlert";
import { prettyJson } from "../format";
import { useSession } from "../session";
import { useLoad } from "../useLoad";

const FORMATS: { format: ExportFormat; title: string; use: string }[] = [
  { format: "openai", title: "OpenAI", use: "the tools of a Chat Completions or Responses request" },
  { format: "anthropic", title: "Anthropic", use: "the tools of a Messages request" },
  { format: "mcp", title: "MCP", use: "tools as an MCP server lists them" },
];

const KEY_PLACEHOLDER = "<your API key>";

/** What an MCP client or an agent framework needs to reach this tenant's tools. */
export default function Connect() {
  const { key, whoami } = useSession();
  // Off until asked for: the page may be on a shared screen.
  const [showKey, setShowKey] = useState(false);
  const exports = useLoad(() => Promise.all(FORMATS.map(({ format }) => exportTools(format))), []);

  const exported = exports.data;
  const http = {
    mcpServers: {
      toolhost: {
        type: "http",
        url: `${location.origin}/mcp`,
        headers: { Authorization: `Bearer ${showKey ? key : KEY_PLACEHOLDER}` },
      },
    },
  };
  const stdio = whoami.stdio && {
    mcpServers: { toolhost: { command: whoami.stdio.command, args: whoami.stdio.args } },
  };

  return (
    <>
      <h1>Connect</h1>
      <p className="lead">
        Paste one of these into an MCP client's configuration (Claude Desktop, Claude Code, Cursor, VS Code…)
        or into your own agent.
      </p>
      <section className="card" aria-labelledby="http-heading">
        <h2 id="http-heading">MCP over Streamable HTTP</h2>
        <p>
          URL <code>{http.mcpServers.toolhost.url}</code>, with your key in the <code>Authorization</code>{" "}
          header. Clients that name the transport <code>streamable-http</code> take that in place of{" "}
          <code>http</code>.
        </p>
        <div className="field checkbox">
          <input
            id="show-key"
            type="checkbox"
            checked={showKey}
            onChange={(event) => setShowKey(event.target.checked)}
          />
          <label htmlFor="show-key">Put my API key in the snippet</label>
        </div>
        <CopyBlock label="MCP over HTTP configuration" text={prettyJson(http)} />
      </section>
      <section className="card" aria-labelledby="stdio-heading">
        <h2 id="stdio-heading">MCP over stdio</h2>
        {stdio ? (
          <>
            <p>
              For a client on this server's machine that starts toolhost itself, for tenant {whoami.tenant}.
              It opens the data directory directly, so it works while no <code>toolhost serve</code> holds
              that directory; beside a running server, use the HTTP configuration above.
            </p>
            <CopyBlock label="MCP over stdio configuration" text={prettyJson(stdio)} />
          </>
        ) : (
          <p className="muted">This server does not offer a stdio command.</p>
        )}
      </section>
      <section aria-labelledby="export-heading">
        <h2 id="export-heading">Tool definitions</h2>
        <ErrorAlert error={exports.error} />
        {exports.loading && !exports.data && <p aria-live="polite">Loading…</p>}
        {exported &&
          FORMATS.map(({ format, title, use }, index) => (
            <section key={format} className="card" aria-labelledby={`export-${format}`}>
              <h3 id={`export-${format}`}>{title}</h3>
              <p className="muted">As {use}.</p>
              <CopyBlock label={`${title} tool definitions`} text={prettyJson(exported[index])} />
            </section>
          ))}
      </section>
    </>
  );
}
