import { Link } from "react-router-dom";
import type { CallOutcome } from "../api";
import { milliseconds } from "../format";
import JsonTree from "./JsonTree";

/** How a call ended: badge, typed error, result, clip report, log, and what it used. */
export default function OutcomeView({ outcome }: { outcome: CallOutcome }) {
  const { error, log } = outcome;
  return (
    <div className="outcome">
      <p className="outcome-head">
        <span className={`badge ${outcome.ok ? "badge-ok" : "badge-error"}`}>
          {outcome.ok ? "ok" : "error"}
        </span>{" "}
        <span>
          {outcome.tool} · call <code>{outcome.call_id}</code>
        </span>
      </p>
      <dl className="facts">
        <dt>Duration</dt>
        <dd>{milliseconds(outcome.duration_ms)}</dd>
        <dt>Queued</dt>
        <dd>{milliseconds(outcome.queued_ms)}</dd>
        <dt>Fuel used</dt>
        <dd>{outcome.fuel_used === null ? "—" : outcome.fuel_used.toLocaleString()}</dd>
        <dt>Cache hit</dt>
        <dd>{outcome.cache_hit ? "yes" : "no"}</dd>
        <dt>Retries</dt>
        <dd>{outcome.retries}</dd>
      </dl>
      {error && (
        <div className="call-error">
          <p>
            <code className="error-code">{error.code}</code> {error.message}
          </p>
          {error.errors && error.errors.length > 0 && (
            <ul>
              {error.errors.map((violation, index) => (
                <li key={index}>
                  <code>{violation.path || "(arguments)"}</code> {violation.message}
                </li>
              ))}
            </ul>
          )}
          {error.code === "approval_required" && (
            <p>
              The call is held until someone decides on it: <Link to="/approvals">open Approvals</Link>.
            </p>
          )}
        </div>
      )}
      {outcome.clipped && (
        <p className="note">
          The result was clipped: {outcome.clipped.original_chars.toLocaleString()} characters cut to{" "}
          {outcome.clipped.returned_chars.toLocaleString()} (limits.max_result_chars).
        </p>
      )}
      {"result" in outcome && (
        <section aria-label="Result">
          <h3>Result</h3>
          <div className="json-tree">
            <JsonTree value={outcome.result} />
          </div>
        </section>
      )}
      <section aria-label="Log">
        <h3>Log</h3>
        {log.lines.length > 0 ? (
          <ul className="log-lines" aria-label="Log lines">
            {log.lines.map((line, index) => (
              <li key={index}>
                <span className={`level level-${line.level}`}>{line.level}</span> {line.message}
              </li>
            ))}
          </ul>
        ) : (
          <p className="muted">No log lines.</p>
        )}
        {log.stdout && (
          <>
            <h4>stdout</h4>
            <pre className="stream">{log.stdout}</pre>
          </>
        )}
        {log.stderr && (
          <>
            <h4>stderr</h4>
            <pre className="stream">{log.stderr}</pre>
          </>
        )}
        {log.dropped_bytes > 0 && (
          <p className="note">{log.dropped_bytes.toLocaleString()} bytes of log were dropped.</p>
        )}
      </section>
    </div>
  );
}
