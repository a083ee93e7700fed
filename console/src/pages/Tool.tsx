import { useMemo, useState } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import Form, { getDefaultRegistry } from "@rjsf/core";
import type { BaseInputTemplateProps, RJSFSchema } from "@rjsf/utils";
import validator from "@rjsf/validator-ajv8";
import {
  ApiError,
  callTool,
  deleteTool,
  getTool,
  getVersions,
  rollback,
  type CallOutcome,
  type ToolInfo,
  type ToolVersions,
} from "../api";
import { errorSchemaFromViolations } from "../argumentErrors";
import ErrorAlert from "../components/ErrorAlert";
import OutcomeView from "../components/OutcomeView";
import { bytes, dateTime, milliseconds, prettyJson } from "../format";
import { may, useSession } from "../session";
import { useLoad } from "../useLoad";

export default function Tool() {
  const { name = "" } = useParams();
  return <ToolPage key={name} name={name} />;
}

function ToolPage({ name }: { name: string }) {
  const session = useSession();
  const canManage = may(session, "manage");
  const info = useLoad(() => getTool(name), [name]);
  // Native tools have no versions: the API answers 404.
  const versions = useLoad(
    () =>
      canManage
        ? getVersions(name).catch((error: unknown) => {
            if (error instanceof ApiError && error.status === 404) {
              return null;
            }
            throw error;
          })
        : Promise.resolve(null),
    [name],
  );
  const reload = () => {
    info.reload();
    versions.reload();
  };

  if (!info.data) {
    return (
      <>
        <h1>{name}</h1>
        {info.loading ? <p aria-live="polite">Loading…</p> : <ErrorAlert error={info.error} />}
      </>
    );
  }
  const { spec, source } = info.data;
  const canCall = may(session, "call") && (!spec.private || may(session, "call_private"));
  return (
    <>
      <div className="page-head">
        <h1>{spec.name}</h1>
        <p className="badges">
          <span className="badge">{source.kind}</span>
          {source.version !== undefined && <span className="badge">v{source.version}</span>}
          {spec.group && <span className="badge badge-group">{spec.group}</span>}
          {spec.needs_approval && <span className="badge badge-warn">needs approval</span>}
        </p>
      </div>
      <p className="lead">{spec.description}</p>
      <ErrorAlert error={info.error} />
      <div className="columns">
        <section className="card" aria-labelledby="details-heading">
          <h2 id="details-heading">Details</h2>
          <ToolDetails info={info.data} />
          {canManage && (
            <p className="links">
              <Link to={`/calls?tool=${encodeURIComponent(spec.name)}`}>Recent calls</Link>
              <Link to={`/metrics?tool=${encodeURIComponent(spec.name)}`}>Metrics</Link>
            </p>
          )}
        </section>
        <section className="card" aria-labelledby="call-heading">
          <h2 id="call-heading">Call</h2>
          {canCall ? (
            <CallForm info={info.data} />
          ) : (
            <p className="muted">Your key's role may not call this tool.</p>
          )}
        </section>
      </div>
      {versions.data && <VersionsTable versions={versions.data} onRolledBack={reload} />}
      <ErrorAlert error={versions.error} />
      {canManage && source.kind !== "native" && <DeleteTool name={spec.name} />}
    </>
  );
}

function ToolDetails({ info: { spec, source } }: { info: ToolInfo }) {
  const yesNo = (value: boolean | undefined) => (value ? "yes" : "no");
  return (
    <>
      <dl className="facts">
        <dt>Source</dt>
        <dd>
          {source.kind}
          {source.version !== undefined && `, version ${source.version}`}
        </dd>
        {source.installed_at_ms !== undefined && (
          <>
            <dt>Installed</dt>
            <dd>{dateTime(source.installed_at_ms)}</dd>
          </>
        )}
        <dt>Strict</dt>
        <dd>{yesNo(spec.strict)}</dd>
        <dt>Private</dt>
        <dd>{yesNo(spec.private)}</dd>
        <dt>Needs approval</dt>
        <dd>{yesNo(spec.needs_approval)}</dd>
        <dt>Idempotent</dt>
        <dd>{yesNo(spec.idempotent)}</dd>
        {spec.config && spec.config.length > 0 && (
          <>
            <dt>Config keys</dt>
            <dd>{spec.config.join(", ")}</dd>
          </>
        )}
      </dl>
      <h3>Limits</h3>
      <dl className="facts">
        <dt>Timeout</dt>
        <dd>{milliseconds(spec.limits.timeout_ms)}</dd>
        <dt>Fuel</dt>
        <dd>{spec.limits.fuel.toLocaleString()}</dd>
        <dt>Memory</dt>
        <dd>{bytes(spec.limits.memory_bytes)}</dd>
        <dt>Result</dt>
        <dd>{spec.limits.max_result_chars.toLocaleString()} characters at most</dd>
      </dl>
      <details className="schema">
        <summary>Parameters schema</summary>
        <pre>{prettyJson(spec.parameters)}</pre>
      </details>
      {spec.output_schema !== undefined && (
        <details className="schema">
          <summary>Output schema</summary>
          <pre>{prettyJson(spec.output_schema)}</pre>
        </details>
      )}
      {spec.cache !== undefined && (
        <details className="schema">
          <summary>Cache</summary>
          <pre>{prettyJson(spec.cache)}</pre>
        </details>
      )}
    </>
  );
}

const DefaultInput = getDefaultRegistry().templates.BaseInputTemplate;

/** rjsf's own input, marked `aria-invalid` while it has an error. */
function InputMarkedInvalid(props: BaseInputTemplateProps) {
  const invalid = (props.rawErrors?.length ?? 0) > 0;
  return <DefaultInput {...props} aria-invalid={invalid || undefined} />;
}

/** The form generated from the tool's schema. It submits whatever is entered: the server
 * validates, and its violations mark the fields at fault. */
function CallForm({ info: { spec } }: { info: ToolInfo }) {
  const [formData, setFormData] = useState<unknown>({});
  const [outcome, setOutcome] = useState<CallOutcome | null>(null);
  const [failure, setFailure] = useState<unknown>(null);
  const [calling, setCalling] = useState(false);
  const extraErrors = useMemo(
    () =>
      outcome?.error?.code === "invalid_args"
        ? errorSchemaFromViolations(outcome.error.errors ?? [])
        : undefined,
    [outcome],
  );

  async function call(args: unknown) {
    setCalling(true);
    setFailure(null);
    try {
      setOutcome(await callTool(spec.name, args ?? {}));
    } catch (error) {
      setOutcome(null);
      setFailure(error);
    } finally {
      setCalling(false);
    }
  }

  return (
    <>
      <Form
        className="call-form"
        schema={spec.parameters as RJSFSchema}
        validator={validator}
        formData={formData}
        onChange={(event) => setFormData(event.formData)}
        onSubmit={(event) => call(event.formData)}
        noHtml5Validate
        noValidate
        showErrorList={false}
        extraErrors={extraErrors}
        templates={{ BaseInputTemplate: InputMarkedInvalid }}
        uiSchema={{
          "ui:submitButtonOptions": {
            submitText: "Call",
            props: { className: "primary", disabled: calling },
          },
        }}
      />
      <div className="call-outcome" aria-live="polite">
        {calling && <p className="muted">Calling…</p>}
        {outcome && (
          <>
            <h3>Outcome</h3>
            <OutcomeView outcome={outcome} />
          </>
        )}
      </div>
      <ErrorAlert error={failure} />
    </>
  );
}

function VersionsTable({ versions, onRolledBack }: { versions: ToolVersions; onRolledBack: () => void }) {
  const [error, setError] = useState<unknown>(null);
  const [status, setStatus] = useState("");

  async function rollBackTo(version: number) {
    if (!window.confirm(`Roll ${versions.name} back to version ${version}?`)) {
      return;
    }
    setError(null);
    try {
      const { current } = await rollback(versions.name, version);
      setStatus(`${versions.name} is now at version ${current}.`);
      onRolledBack();
    } catch (failure) {
      setError(failure);
    }
  }

  const newestFirst = [...versions.versions].sort((a, b) => b.version - a.version);
  return (
    <section className="card" aria-labelledby="versions-heading">
      <h2 id="versions-heading">Versions</h2>
      <p className="muted" aria-live="polite">
        {status}
      </p>
      <ErrorAlert error={error} />
      <div className="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col">Version</th>
              <th scope="col">Kind</th>
              <th scope="col">Installed</th>
              <th scope="col">Size</th>
              <th scope="col">Digest</th>
              <th scope="col" className="action">
                <span className="visually-hidden">Action</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {newestFirst.map((version) => (
              <tr key={version.version}>
                <th scope="row">v{version.version}</th>
                <td>{version.kind}</td>
                <td>{dateTime(version.installed_at_ms)}</td>
                <td>{bytes(version.bytes)}</td>
                <td>
                  <code title={version.component}>{version.component.slice(0, 12)}</code>
                </td>
                <td className="action">
                  {version.version === versions.current ? (
                    <span className="badge badge-ok">current</span>
                  ) : (
                    <button type="button" onClick={() => rollBackTo(version.version)}>
                      Roll back to v{version.version}
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}

function DeleteTool({ name }: { name: string }) {
  const navigate = useNavigate();
  const [error, setError] = useState<unknown>(null);

  async function remove() {
    if (!window.confirm(`Delete ${name} and all its versions? Agents can no longer call it.`)) {
      return;
    }
    try {
      await deleteTool(name);
      navigate("/tools");
    } catch (failure) {
      setError(failure);
    }
  }

  return (
    <section className="card danger-zone" aria-labelledby="delete-heading">
      <h2 id="delete-heading">Delete</h2>
      <p>Removes the tool and every stored version of it.</p>
      <ErrorAlert error={error} />
      <button type="button" className="danger" onClick={remove}>
        Delete {name}
      </button>
    </section>
  );
}
