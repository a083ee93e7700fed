// Types for @toolhost/sdk: tools for toolhost written in JavaScript or TypeScript.

/** A JSON Schema object; its top level must be `{ type: "object", ... }`. */
export type JsonSchema = { [key: string]: unknown };

/** What a tool sees of its call. It comes from the host, never from the model. */
export interface Context {
  tenant: string;
  callId: string;
  tool: string;
  /** JSON from the embedding application (`null` if none). */
  data: unknown;
}

/** Per-call limits; each has a host default and a hard cap, checked at install. */
export interface Limits {
  timeoutMs?: number;
  fuel?: number;
  memoryBytes?: number;
  maxResultChars?: number;
}

export interface ToolDefinition<Args = any, Result = unknown> {
  /** `^[a-zA-Z0-9_-]{1,64}$` */
  name: string;
  /** What the tool does, for the model: 1 to 4096 characters. */
  description: string;
  /** A JSON Schema, or a zod object schema (v3) converted to one. */
  parameters?: JsonSchema | { _def: unknown };
  /** The arguments already passed `parameters`. Return any JSON value. */
  /** May be async (say, to await `fetch`): the component runs its event loop until it settles. */
  handler: (args: Args, ctx: Context) => Result | Promise<Result>;
  /** Reject properties the schema does not declare. */
  strict?: boolean;
  group?: string;
  /** Callable by the host application only; never listed to an agent. */
  private?: boolean;
  limits?: Limits;
  /** Reuse a result for calls with the same value at `keyPath` (a JSONPath) within `ttlMs`. */
  cache?: { ttlMs: number; keyPath: string };
  /** Keys of the tenant's configuration this tool reads with `config.get`. */
  config?: string[];
  /** Every call waits until the embedding app approves it. */
  needsApproval?: boolean;
  /** Running a call twice has the same effect as once. */
  idempotent?: boolean;
  /** Runs again after a timeout, up to this many times (0 to 5); needs `idempotent`. */
  retryCountOnStall?: number;
  /**
   * What every result is: a JSON Schema (or a zod 3 object schema) with `type: "object"` at the
   * top. The host checks each result against it (a mismatch is `invalid_output`); MCP clients
   * get it as `outputSchema` and the result as `structuredContent`.
   */
  outputSchema?: JsonSchema | { _def: unknown };
}

export declare function defineTool<Args = any, Result = unknown>(
  def: ToolDefinition<Args, Result>,
): ToolDefinition<Args, Result>;

/** The world's exports: `export const { listTools, call } = exportTools(a, b);` */
export declare function exportTools(...tools: ToolDefinition[]): {
  listTools: () => unknown[];
  call: (tool: string, args: string, ctx: unknown) => string;
};

/** Thrown by a handler: reaches the agent as the `tool_error` outcome with this message. */
export declare class ToolError extends Error {
  constructor(message: string, options?: { invalidArgs?: boolean });
  invalidArgs: boolean;
}

type LogFn = (...parts: unknown[]) => void;
/** Lines returned with the call's result. */
export declare const log: { trace: LogFn; debug: LogFn; info: LogFn; warn: LogFn; error: LogFn };

/** Storage private to this tool and tenant, kept across calls. */
export declare const kv: {
  get(key: string): string | undefined;
  set(key: string, value: string): void;
  /** Whether the key existed. */
  delete(key: string): boolean;
};

/** The tenant's configuration, for keys the tool lists in `config`. */
export declare const config: { get(key: string): string | undefined };

/** Calls another tool of the same tenant; throws `Error("code: message")` if it fails. */
export declare function callTool(name: string, args?: object): unknown;
