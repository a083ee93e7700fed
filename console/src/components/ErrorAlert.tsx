import { ApiError } from "../api";

/** An error as the API put it: its code and message, verbatim. */
export default function ErrorAlert({ error }: { error: unknown }) {
  if (!error) {
    return null;
  }
  const code = error instanceof ApiError ? error.code : "error";
  const message = error instanceof Error ? error.message : String(error);
  return (
    <div role="alert" className="alert">
      <code className="error-code">{code}</code> {message}
    </div>
  );
}
