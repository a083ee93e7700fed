/** A JSON value as a tree of `<details>`: objects and arrays fold, the top levels open. */
export default function JsonTree({
  value,
  label,
  depth = 0,
}: {
  value: unknown;
  label?: string;
  depth?: number;
}) {
  const name = label === undefined ? null : <span className="json-key">{label}: </span>;
  if (value === null || typeof value !== "object") {
    return (
      <div className="json-leaf">
        {name}
        <span className={`json-${value === null ? "null" : typeof value}`}>{JSON.stringify(value)}</span>
      </div>
    );
  }
  const entries = Array.isArray(value)
    ? value.map((item, index) => [String(index), item] as const)
    : Object.entries(value);
  const summary = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
  if (entries.length === 0) {
    return (
      <div className="json-leaf">
        {name}
        {Array.isArray(value) ? "[]" : "{}"}
      </div>
    );
  }
  return (
    <details className="json-node" open={depth < 2}>
      <summary>
        {name}
        <span className="json-count">{summary}</span>
      </summary>
      {entries.map(([key, item]) => (
        <JsonTree key={key} label={key} value={item} depth={depth + 1} />
      ))}
    </details>
  );
}
