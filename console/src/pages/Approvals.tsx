import { useEffect, useState } from "react";
import { approve, listApprovals, reject, type CallOutcome, type PendingApproval } from "../api";
import ErrorAlert from "../components/ErrorAlert";
import JsonTree from "../components/JsonTree";
import OutcomeView from "../components/OutcomeView";
import { elapsed } from "../format";
import { useLoad } from "../useLoad";

const POLL_MS = 5000;

interface Decision {
  decision: "approved" | "rejected";
  outcome: CallOutcome;
}

/** Calls held for a person's decision: approving runs them, rejecting ends them. */
export default function Approvals() {
  const pending = useLoad(listApprovals, []);
  const [decisions, setDecisions] = useState<Decision[]>([]);
  const [error, setError] = useState<unknown>(null);
  const { reload } = pending;

  useEffect(() => {
    const timer = setInterval(reload, POLL_MS);
    return () => clearInterval(timer);
  }, [reload]);

  async function decide(call: PendingApproval, decision: Decision["decision"], reason = "") {
    setError(null);
    try {
      const outcome =
        decision === "approved" ? await approve(call.call_id) : await reject(call.call_id, reason);
      setDecisions((previous) => [{ decision, outcome }, ...previous]);
    } catch (failure) {
      setError(failure);
    }
    reload();
  }

  const calls = pending.data ?? [];
  return (
    <>
      <div className="page-head">
        <h1>Approvals</h1>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </div>
      <ErrorAlert error={error ?? pending.error} />
      <section aria-labelledby="pending-heading">
        <h2 id="pending-heading">Waiting</h2>
        {pending.data && calls.length === 0 && <p className="muted">No call is waiting for a decision.</p>}
        <ul className="approval-list">
          {calls.map((call) => (
            <PendingCall key={call.call_id} call={call} onDecide={decide} />
          ))}
        </ul>
      </section>
      <div aria-live="polite">
        {decisions.length > 0 && (
          <section aria-labelledby="decided-heading">
            <h2 id="decided-heading">Decided here</h2>
            {decisions.map(({ decision, outcome }) => (
              <article key={outcome.call_id} className="card">
                <h3>
                  {outcome.tool}: {decision}
                </h3>
                <OutcomeView outcome={outcome} />
              </article>
            ))}
          </section>
        )}
      </div>
    </>
  );
}

function PendingCall({
  call,
  onDecide,
}: {
  call: PendingApproval;
  onDecide: (call: PendingApproval, decision: Decision["decision"], reason?: string) => Promise<void>;
}) {
  const [reason, setReason] = useState("");
  const [deciding, setDeciding] = useState(false);
  const reasonId = `reason-${call.call_id}`;

  async function decide(decision: Decision["decision"]) {
    setDeciding(true);
    await onDecide(call, decision, reason.trim());
    setDeciding(false);
  }

  return (
    <li className="card approval" aria-labelledby={`pending-${call.call_id}`}>
      <h3 id={`pending-${call.call_id}`}>{call.tool}</h3>
      <p className="muted">
        call <code>{call.call_id}</code> · waiting for {elapsed(call.waiting_ms)}
      </p>
      <h4>Arguments</h4>
      <div className="json-tree">
        <JsonTree value={call.args} />
      </div>
      <div className="field">
        <label htmlFor={reasonId}>Reason for rejecting (optional)</label>
        <input id={reasonId} value={reason} onChange={(event) => setReason(event.target.value)} />
      </div>
      <div className="actions">
        <button type="button" className="primary" disabled={deciding} onClick={() => decide("approved")}>
          Approve
        </button>
        <button type="button" className="danger" disabled={deciding} onClick={() => decide("rejected")}>
          Reject
        </button>
      </div>
    </li>
  );
}
