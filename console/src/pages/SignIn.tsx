import { useState, type FormEvent } from "react";
import { whoami, type Whoami } from "../api";
import ErrorAlert from "../components/ErrorAlert";

/** Asks for an API key and checks it with `/v1/whoami` before signing in. */
export default function SignIn({
  notice,
  onSignedIn,
}: {
  notice: string | null;
  onSignedIn: (key: string, identity: Whoami) => void;
}) {
  const [key, setKey] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [checking, setChecking] = useState(false);

  async function signIn(event: FormEvent) {
    event.preventDefault();
    setChecking(true);
    setError(null);
    try {
      onSignedIn(key.trim(), await whoami(key.trim()));
    } catch (refused) {
      setError(refused);
      setChecking(false);
    }
  }

  return (
    <main id="main" className="sign-in">
      <form className="card sign-in-card" onSubmit={signIn}>
        <p className="brand">toolhost</p>
        <h1>Sign in</h1>
        <p className="muted">
          Use an API key of your tenant (<code>toolhost key create</code>). It is kept in this tab only.
        </p>
        {notice && <p className="note">{notice}</p>}
        <label htmlFor="api-key">API key</label>
        <input
          id="api-key"
          type="password"
          autoComplete="off"
          spellCheck={false}
          required
          value={key}
          onChange={(event) => setKey(event.target.value)}
        />
        <ErrorAlert error={error} />
        <button type="submit" className="primary" disabled={checking}>
          {checking ? "Signing in…" : "Sign in"}
        </button>
      </form>
    </main>
  );
}
