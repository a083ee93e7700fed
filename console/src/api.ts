// The toolhost HTTP API, as the console uses it. Every request carries the signed-in key.

export type Access = "read" | "call" | "call_private" | "manage" | "decide" | "set_data";

export interface Whoami {
  tenant: string;
  role: string;
  may: Access[];
  stdio: { command: string; args: string[] } | null;
}

export interface Limits {
  timeout_ms: number;
  fuel: number;
  memory_bytes: number;
  max_result_chars: number;
}

export interface ToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
  strict: boolean;
  group?: string;
  private: boolean;
  limits: Limits;
  cache?: unknown;
  config?: string[];
  needs_approval?: boolean;
  idempotent?: boolean;
  output_schema?: unknown;
}

export type SourceKind = "native" | "wasm" | "http" | "js";

export interface ToolInfo {
  spec: ToolSpec;
  source: { kind: SourceKind; version?: number; installed_at_ms?: number; component?: string };
}

export interface SearchResult {
  name: string;
  description: string;
  score: number;
}

export interface ToolVersion {
  version: number;
  kind: Exclude<SourceKind, "native">;
  spec: ToolSpec;
  component: string;
  bytes: number;
  installed_at_ms: number;
}

export interface ToolVersions {
  tenant: string;
  name: string;
  current: number;
  versions: ToolVersion[];
}

/** One violation in an `invalid_args` error: `path` is a JSON Pointer into the arguments. */
export interface ArgumentError {
  path: string;
  message: string;
}

export interface CallError {
  code: string;
  message: string;
  errors?: ArgumentError[];
  retry_after_ms?: number;
}

export interface LogLine {
  level: string;
  message: string;
}

export interface CallOutcome {
  call_id: string;
  tool: string;
  ok: boolean;
  clipped: { original_chars: number; returned_chars: number } | null;
  cache_hit: boolean;
  retries: number;
  duration_ms: number;
  queued_ms: number;
  fuel_used: number | null;
  log: { lines: LogLine[]; stdout: string; stderr: string; dropped_bytes: number };
  result?: unknown;
  error?: CallError;
}

export interface CallRecord extends CallOutcome {
  arguments: unknown;
  at_ms: number;
  version: number | null;
}

export interface StatsPoint {
  at_ms: number;
  calls: number;
  errors: number;
  /** Null when no call of the minute ran (all held for approval or rejected). */
  p50_ms: number | null;
  p99_ms: number | null;
}

export interface Stats {
  bucket_ms: number;
  tools: { tool: string; points: StatsPoint[] }[];
}

export interface ConfigEntry {
  key: string;
  secret: boolean;
  value: string | null;
}

export interface PendingApproval {
  call_id: string;
  tool: string;
  args: unknown;
  waiting_ms: number;
}

export type ExportFormat = "openai" | "anthropic" | "mcp";

/** An error answer of the API: `{"error": {"code", "message"}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const KEY_STORAGE = "toolhost.key";

export const storedKey = (): string | null => sessionStorage.getItem(KEY_STORAGE);
export const storeKey = (key: string) => sessionStorage.setItem(KEY_STORAGE, key);
export const forgetKey = () => sessionStorage.removeItem(KEY_STORAGE);

let whenRefused: (() => void) | null = null;

/** Called when the API refuses the stored key (401), e.g. after it was revoked. */
export function onKeyRefused(handler: (() => void) | null) {
  whenRefused = handler;
}

async function request<T>(
  method: string,
  path: string,
  body?: { json: unknown } | { bytes: Blob; contentType: string },
  key = storedKey(),
): Promise<T> {
  const headers: Record<string, string> = { Authorization: `Bearer ${key ?? ""}` };
  let payload: BodyInit | undefined;
  if (body && "json" in body) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body.json);
  } else if (body) {
    headers["Content-Type"] = body.contentType;
    payload = body.bytes;
  }
  const response = await fetch(path, { method, headers, body: payload });
  if (response.status === 204) {
    return undefined as T;
  }
  const text = await response.text();
  let parsed: unknown;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    throw new ApiError(
      response.status,
      "bad_response",
      `the server answered ${response.status} with no JSON`,
    );
  }
  if (!response.ok) {
    const error = (parsed as { error?: { code?: string; message?: string } } | undefined)?.error;
    if (response.status === 401 && key === storedKey() && whenRefused) {
      whenRefused();
    }
    throw new ApiError(
      response.status,
      error?.code ?? "http_" + response.status,
      error?.message ?? response.statusText,
    );
  }
  return parsed as T;
}

const tool = (name: string) => `/v1/tools/${encodeURIComponent(name)}`;
const query = (params: Record<string, string | number | undefined>) => {
  const defined = Object.entries(params).filter(([, value]) => value !== undefined && value !== "");
  return new URLSearchParams(defined.map(([k, v]) => [k, String(v)])).toString();
};

/** Checks `key` (without storing it): the identity it signs in as. */
export const whoami = (key?: string) => request<Whoami>("GET", "/v1/whoami", undefined, key);

export const listTools = () => request<{ tools: ToolInfo[] }>("GET", "/v1/tools").then((r) => r.tools);

export const searchTools = (text: string, limit = 20) =>
  request<{ results: SearchResult[] }>("GET", `/v1/search?${query({ q: text, limit })}`).then(
    (r) => r.results,
  );

export const getTool = (name: string) => request<ToolInfo>("GET", tool(name));

export const deleteTool = (name: string) => request<void>("DELETE", tool(name));

export const getVersions = (name: string) => request<ToolVersions>("GET", `${tool(name)}/versions`);

export const rollback = (name: string, to: number) =>
  request<{ current: number }>("POST", `${tool(name)}/rollback`, { json: { to } });

export const callTool = (name: string, args: unknown) =>
  request<CallOutcome>("POST", `${tool(name)}/call`, { json: { arguments: args } });

/** The content type the API takes for a tool file, by its extension; null if none fits. */
export function uploadContentType(fileName: string): string | null {
  const extension = fileName.toLowerCase().split(".").pop();
  switch (extension) {
    case "wasm":
      return "application/wasm";
    case "js":
    case "mjs":
      return "application/javascript";
    case "json":
      return "application/json";
    default:
      return null;
  }
}

export const installTool = (bytes: Blob, contentType: string) =>
  request<{ installed: ToolSpec[] }>("POST", "/v1/tools", { bytes, contentType }).then((r) => r.installed);

export const listCalls = (filter: { tool?: string; outcome?: string; limit?: number }) =>
  request<{ calls: CallRecord[] }>("GET", `/v1/calls?${query(filter)}`).then((r) => r.calls);

export const getStats = (minutes: number) => request<Stats>("GET", `/v1/stats?${query({ minutes })}`);

export const listConfig = () => request<{ config: ConfigEntry[] }>("GET", "/v1/config").then((r) => r.config);

export const setConfig = (key: string, value: string, secret: boolean) =>
  request<void>("PUT", `/v1/config/${encodeURIComponent(key)}`, { json: { value, secret } });

export const removeConfig = (key: string) => request<void>("DELETE", `/v1/config/${encodeURIComponent(key)}`);

export const listApprovals = () =>
  request<{ pending: PendingApproval[] }>("GET", "/v1/approvals").then((r) => r.pending);

export const approve = (callId: string) =>
  request<CallOutcome>("POST", `/v1/approvals/${encodeURIComponent(callId)}/approve`);

export const reject = (callId: string, reason: string) =>
  request<CallOutcome>("POST", `/v1/approvals/${encodeURIComponent(callId)}/reject`, {
    json: reason ? { reason } : {},
  });

export const exportTools = (format: ExportFormat) =>
  request<{ tools: unknown[] }>("GET", `/v1/export?${query({ format })}`).then((r) => r.tools);
