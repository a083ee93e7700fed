import { useEffect, useState } from "react";
import { Link } from "react-router-dom";
import { listTools, searchTools, type ToolInfo } from "../api";
import ErrorAlert from "../components/ErrorAlert";
import { may, useSession } from "../session";
import { useFilterParams } from "../useFilterParams";
import { useLoad } from "../useLoad";

const SEARCH_DELAY_MS = 250;

/** Every tool of the tenant, filtered by group and kind, or ranked by a search. */
export default function Tools() {
  const session = useSession();
  const filters = useFilterParams();
  const text = filters.get("q");
  const group = filters.get("group");
  const kind = filters.get("kind");

  const [searched, setSearched] = useState(text.trim());
  useEffect(() => {
    const timer = setTimeout(() => setSearched(text.trim()), SEARCH_DELAY_MS);
    return () => clearTimeout(timer);
  }, [text]);

  const tools = useLoad(listTools, []);
  const search = useLoad(() => (searched ? searchTools(searched) : Promise.resolve(null)), [searched]);

  const all = tools.data ?? [];
  const groups = [...new Set(all.flatMap((tool) => (tool.spec.group ? [tool.spec.group] : [])))].sort();
  const kinds = [...new Set(all.map((tool) => tool.source.kind))].sort();
  const byName = new Map(all.map((tool) => [tool.spec.name, tool]));
  const ranked: { tool: ToolInfo; score?: number }[] =
    searched && search.data
      ? search.data.flatMap((hit) => {
          const tool = byName.get(hit.name);
          return tool ? [{ tool, score: hit.score }] : [];
        })
      : [...all].sort((a, b) => a.spec.name.localeCompare(b.spec.name)).map((tool) => ({ tool }));
  const shown = ranked.filter(
    ({ tool }) => (!group || tool.spec.group === group) && (!kind || tool.source.kind === kind),
  );

  return (
    <>
      <div className="page-head">
        <h1>Tools</h1>
        {may(session, "manage") && (
          <Link className="button primary" to="/upload">
            Upload a tool
          </Link>
        )}
      </div>
      <form className="filters" role="search" onSubmit={(event) => event.preventDefault()}>
        <div className="field grow">
          <label htmlFor="tool-search">Search</label>
          <input
            id="tool-search"
            type="search"
            placeholder="What should the tool do?"
            value={text}
            onChange={(event) => filters.set("q", event.target.value)}
          />
        </div>
        <div className="field">
          <label htmlFor="tool-group">Group</label>
          <select
            id="tool-group"
            value={group}
            onChange={(event) => filters.set("group", event.target.value)}
          >
            <option value="">All groups</option>
            {groups.map((name) => (
              <option key={name}>{name}</option>
            ))}
          </select>
        </div>
        <div className="field">
          <label htmlFor="tool-kind">Kind</label>
          <select id="tool-kind" value={kind} onChange={(event) => filters.set("kind", event.target.value)}>
            <option value="">All kinds</option>
            {kinds.map((name) => (
              <option key={name}>{name}</option>
            ))}
          </select>
        </div>
      </form>
      <ErrorAlert error={tools.error ?? search.error} />
      <p className="muted" aria-live="polite">
        {tools.loading && !tools.data
          ? "Loading…"
          : searched
            ? `${shown.length} ${shown.length === 1 ? "match" : "matches"} for “${searched}”, best first`
            : `${shown.length} of ${all.length} tools`}
      </p>
      <ul className="tool-list">
        {shown.map(({ tool, score }) => (
          <li key={tool.spec.name} className="card tool-card">
            <h2>
              <Link to={`/tools/${encodeURIComponent(tool.spec.name)}`}>{tool.spec.name}</Link>
            </h2>
            <p className="badges">
              <span className="badge">{tool.source.kind}</span>
              {tool.source.version !== undefined && <span className="badge">v{tool.source.version}</span>}
              {tool.spec.group && <span className="badge badge-group">{tool.spec.group}</span>}
              {tool.spec.private && <span className="badge">private</span>}
              {tool.spec.needs_approval && <span className="badge badge-warn">needs approval</span>}
              {score !== undefined && <span className="score">score {score.toFixed(2)}</span>}
            </p>
            <p className="description">{tool.spec.description}</p>
          </li>
        ))}
      </ul>
    </>
  );
}
