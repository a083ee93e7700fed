import { useState, type DragEvent } from "react";
import { Link } from "react-router-dom";
import { installTool, uploadContentType, type ToolSpec } from "../api";
import ErrorAlert from "../components/ErrorAlert";

/** Installs a tool from a file: a Wasm component, JavaScript source, or an HTTP tool's JSON. */
export default function Upload() {
  const [dragging, setDragging] = useState(false);
  const [uploading, setUploading] = useState<string | null>(null);
  const [installed, setInstalled] = useState<ToolSpec[] | null>(null);
  const [error, setError] = useState<unknown>(null);

  async function upload(file: File) {
    setInstalled(null);
    setError(null);
    const contentType = uploadContentType(file.name);
    if (!contentType) {
      setError(new Error(`${file.name}: pick a .wasm, .js or .json file`));
      return;
    }
    setUploading(file.name);
    try {
      setInstalled(await installTool(file, contentType));
    } catch (failure) {
      setError(failure);
    } finally {
      setUploading(null);
    }
  }

  function drop(event: DragEvent) {
    event.preventDefault();
    setDragging(false);
    const file = event.dataTransfer.files[0];
    if (file) {
      upload(file);
    }
  }

  return (
    <>
      <h1>Upload a tool</h1>
      <p className="lead">
        A <code>.wasm</code> component, JavaScript source (<code>.js</code>, with{" "}
        <code>export const spec</code> and a default function), or an HTTP tool definition (<code>.json</code>
        ). A tool of a name that exists becomes its next version.
      </p>
      <section
        className={`drop-zone${dragging ? " dragging" : ""}`}
        aria-labelledby="drop-heading"
        onDragEnter={(event) => {
          event.preventDefault();
          setDragging(true);
        }}
        onDragOver={(event) => event.preventDefault()}
        onDragLeave={() => setDragging(false)}
        onDrop={drop}
      >
        <h2 id="drop-heading">Drop a tool file here</h2>
        <p className="muted">or</p>
        <input
          id="tool-file"
          className="file-input"
          type="file"
          accept=".wasm,.js,.mjs,.json"
          onChange={(event) => {
            const file = event.target.files?.[0];
            if (file) {
              upload(file);
            }
            event.target.value = "";
          }}
        />
        <label htmlFor="tool-file" className="button">
          Choose a file
        </label>
      </section>
      <div aria-live="polite" className="upload-status">
        {uploading && <p>Uploading {uploading}…</p>}
        {installed && (
          <div className="success">
            <p>
              Installed {installed.length} {installed.length === 1 ? "tool" : "tools"}:
            </p>
            <ul>
              {installed.map((spec) => (
                <li key={spec.name}>
                  <Link to={`/tools/${encodeURIComponent(spec.name)}`}>{spec.name}</Link> — {spec.description}
                </li>
              ))}
            </ul>
          </div>
        )}
      </div>
      <ErrorAlert error={error} />
    </>
  );
}
