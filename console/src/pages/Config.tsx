import { useState, type FormEvent } from "react";
import { listConfig, removeConfig, setConfig } from "../api";
import ErrorAlert from "../components/ErrorAlert";
import { useLoad } from "../useLoad";

/** The tenant's configuration values, which tools declaring a key read. Secrets are
 * write-only: the API never shows them again. */
export default function Config() {
  const config = useLoad(listConfig, []);
  const [key, setKey] = useState("");
  const [value, setValue] = useState("");
  const [secret, setSecret] = useState(false);
  const [status, setStatus] = useState("");
  const [error, setError] = useState<unknown>(null);

  async function save(event: FormEvent) {
    event.preventDefault();
    setError(null);
    try {
      await setConfig(key.trim(), value, secret);
      setStatus(`Saved ${key.trim()}${secret ? " (secret)" : ""}.`);
      setKey("");
      setValue("");
      setSecret(false);
      config.reload();
    } catch (failure) {
      setError(failure);
    }
  }

  async function remove(name: string) {
    if (!window.confirm(`Remove the config key ${name}? Tools that read it no longer get it.`)) {
      return;
    }
    setError(null);
    try {
      await removeConfig(name);
      setStatus(`Removed ${name}.`);
      config.reload();
    } catch (failure) {
      setError(failure);
    }
  }

  const entries = [...(config.data ?? [])].sort((a, b) => a.key.localeCompare(b.key));
  return (
    <>
      <h1>Config</h1>
      <p className="lead">
        Values your tools read by key (declared in their spec's <code>config</code>).
      </p>
      <section className="card" aria-labelledby="config-form-heading">
        <h2 id="config-form-heading">Add or replace a value</h2>
        <form className="config-form" onSubmit={save}>
          <div className="field">
            <label htmlFor="config-key">Key</label>
            <input
              id="config-key"
              required
              autoComplete="off"
              spellCheck={false}
              value={key}
              onChange={(event) => setKey(event.target.value)}
            />
          </div>
          <div className="field grow">
            <label htmlFor="config-value">Value</label>
            <input
              id="config-value"
              type={secret ? "password" : "text"}
              autoComplete="off"
              spellCheck={false}
              value={value}
              onChange={(event) => setValue(event.target.value)}
            />
          </div>
          <div className="field checkbox">
            <input
              id="config-secret"
              type="checkbox"
              checked={secret}
              onChange={(event) => setSecret(event.target.checked)}
            />
            <label htmlFor="config-secret">Secret (write-only)</label>
          </div>
          <button type="submit" className="primary">
            Save
          </button>
        </form>
      </section>
      <p className="muted" aria-live="polite">
        {status}
      </p>
      <ErrorAlert error={error ?? config.error} />
      <section aria-labelledby="config-table-heading">
        <h2 id="config-table-heading">Values</h2>
        {config.data && entries.length === 0 && <p className="muted">No configuration yet.</p>}
        {entries.length > 0 && (
          <div className="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Key</th>
                  <th scope="col">Value</th>
                  <th scope="col" className="action">
                    <span className="visually-hidden">Action</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {entries.map((entry) => (
                  <tr key={entry.key}>
                    <th scope="row">
                      <code>{entry.key}</code>
                    </th>
                    <td>
                      {entry.secret ? (
                        <span className="badge badge-secret">secret</span>
                      ) : (
                        <code className="config-value">{entry.value}</code>
                      )}
                    </td>
                    <td className="action">
                      <button
                        type="button"
                        onClick={() => remove(entry.key)}
                        aria-label={`Remove ${entry.key}`}
                      >
                        Remove
                      </button>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </>
  );
}
