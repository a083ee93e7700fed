import { useEffect, useRef, useState } from "react";
import { listCalls, listTools, type CallRecord } from "../api";
import ErrorAlert from "../components/ErrorAlert";
import JsonTree from "../components/JsonTree";
import OutcomeView from "../components/OutcomeView";
import { dateTime, milliseconds } from "../format";
import { useFilterParams } from "../useFilterParams";
import { useLoad } from "../useLoad";

const CALLS_SHOWN = 100;
/** The stable error codes a call ends with (toolhost_spec's `CallError::code`). */
const ERROR_CODES = [
  "approval_required",
  "cancelled",
  "denied",
  "internal",
  "invalid_args",
  "invalid_output",
  "memory_limit",
  "node_lost",
  "not_found",
  "out_of_fuel",
  "rate_limited",
  "rejected",
  "storage_unavailable",
  "timeout",
  "tool_error",
  "trap",
];

/** The tenant's recent calls, newest first, filtered by tool and outcome. */
export default function Calls() {
  const filters = useFilterParams();
  const tool = filters.get("tool");
  const outcome = filters.get("outcome");

  const tools = useLoad(listTools, []);
  const calls = useLoad(() => listCalls({ tool, outcome, limit: CALLS_SHOWN }), [tool, outcome]);
  const [opened, setOpened] = useState<CallRecord | null>(null);

  const toolNames = [
    ...new Set([...(tools.data ?? []).map((t) => t.spec.name), ...(tool ? [tool] : [])]),
  ].sort();

  return (
    <>
      <div className="page-head">
        <h1>Calls</h1>
        <button type="button" onClick={calls.reload}>
          Refresh
        </button>
      </div>
      <form className="filters" onSubmit={(event) => event.preventDefault()}>
        <div className="field">
          <label htmlFor="calls-tool">Tool</label>
          <select id="calls-tool" value={tool} onChange={(event) => filters.set("tool", event.target.value)}>
            <option value="">All tools</option>
            {toolNames.map((name) => (
              <option key={name}>{name}</option>
            ))}
          </select>
        </div>
        <div className="field">
          <label htmlFor="calls-outcome">Outcome</label>
          <select
            id="calls-outcome"
            value={outcome}
            onChange={(event) => filters.set("outcome", event.target.value)}
          >
            <option value="">Any outcome</option>
            <option value="ok">ok</option>
            {ERROR_CODES.map((code) => (
              <option key={code}>{code}</option>
            ))}
          </select>
        </div>
      </form>
      <ErrorAlert error={calls.error} />
      <p className="muted" aria-live="polite">
        {calls.loading && !calls.data ? "Loading…" : `${calls.data?.length ?? 0} calls, newest first`}
      </p>
      <div className="table-wrap">
        <table className="calls">
          <thead>
            <tr>
              <th scope="col">Time</th>
              <th scope="col">Tool</th>
              <th scope="col">Outcome</th>
              <th scope="col" className="number">
                Duration
              </th>
            </tr>
          </thead>
          <tbody>
            {(calls.data ?? []).map((call, index) => (
              // A held call has two records under one id: `approval_required`, then its end.
              <tr
                key={`${call.call_id}@${call.at_ms}#${index}`}
                className={opened === call ? "selected" : undefined}
                onClick={() => setOpened(call)}
              >
                <td>
                  <button
                    type="button"
                    className="link"
                    aria-label={`Open the call of ${call.tool} at ${dateTime(call.at_ms)}`}
                    onClick={(event) => {
                      event.stopPropagation();
                      setOpened(call);
                    }}
                  >
                    {dateTime(call.at_ms)}
                  </button>
                </td>
                <td>{call.tool}</td>
                <td>
                  <span className={`badge ${call.ok ? "badge-ok" : "badge-error"}`}>
                    {call.ok ? "ok" : call.error?.code}
                  </span>
                </td>
                <td className="number">{milliseconds(call.duration_ms)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {opened && <CallDetail record={opened} />}
    </>
  );
}

function CallDetail({ record }: { record: CallRecord }) {
  const headingRef = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    headingRef.current?.focus();
  }, [record]);
  return (
    <section className="card call-detail" aria-labelledby="call-detail-heading">
      <h2 id="call-detail-heading" ref={headingRef} tabIndex={-1}>
        Call of {record.tool}
      </h2>
      <p className="muted">
        {dateTime(record.at_ms)}
        {record.version !== null && ` · version ${record.version}`}
      </p>
      <h3>Arguments</h3>
      <div className="json-tree">
        <JsonTree value={record.arguments} />
      </div>
      <OutcomeView outcome={record} />
    </section>
  );
}
