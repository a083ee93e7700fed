// The toolhost JavaScript SDK: define tools, export them as the `toolhost:plugin` world.
// This module runs inside the component; `toolhost-js build` bundles it with your tool.
import * as helpers from "toolhost:plugin/helpers@0.2.0";
import * as tools from "toolhost:plugin/tools@0.2.0";

import { toJsonSchema } from "./schema.js";

const LEVELS = ["trace", "debug", "info", "warn", "error"];
const NAME = /^[a-zA-Z0-9_-]{1,64}$/;

/** A failure the tool reports itself; `invalidArgs` marks arguments it cannot use. */
export class ToolError extends Error {
  constructor(message, { invalidArgs = false } = {}) {
    super(message);
    this.name = "ToolError";
    this.invalidArgs = invalidArgs;
  }
}

/** Checks a tool definition; the host checks it again, with every rule, at install. */
export function defineTool(def) {
  if (!def || typeof def !== "object") throw new TypeError("defineTool takes an object");
  if (!NAME.test(def.name ?? "")) throw new TypeError(`tool name must match ${NAME}: ${def.name}`);
  if (typeof def.description !== "string") throw new TypeError(`${def.name}: description must be a string`);
  if (typeof def.handler !== "function") throw new TypeError(`${def.name}: handler must be a function`);
  const parameters = toJsonSchema(def.parameters ?? { type: "object" });
  const outputSchema = def.outputSchema === undefined ? undefined : toJsonSchema(def.outputSchema);
  return { ...def, parameters, outputSchema };
}

const bigint = (value) => (value === undefined ? undefined : BigInt(value));

function toolDef(def) {
  const limits = def.limits ?? {};
  return {
    name: def.name,
    description: def.description,
    parameters: JSON.stringify(def.parameters),
    strict: def.strict ?? false,
    group: def.group,
    private: def.private ?? false,
    limits: {
      timeoutMs: bigint(limits.timeoutMs),
      fuel: bigint(limits.fuel),
      memoryBytes: bigint(limits.memoryBytes),
      maxResultChars: bigint(limits.maxResultChars),
    },
    cache: def.cache ? { ttlMs: BigInt(def.cache.ttlMs), keyPath: def.cache.keyPath } : undefined,
    config: def.config ?? [],
    needsApproval: def.needsApproval ?? false,
    idempotent: def.idempotent ?? false,
    retryCountOnStall: def.retryCountOnStall ?? 0,
    outputSchema: def.outputSchema === undefined ? undefined : JSON.stringify(def.outputSchema),
  };
}

/**
 * The world's exports for these tools: `export const { listTools, call } = exportTools(a, b)`.
 */
export function exportTools(...defs) {
  const byName = new Map(defs.map((def) => [def.name, def]));
  return {
    listTools: () => defs.map(toolDef),
    call(name, args, ctx) {
      const def = byName.get(name);
      if (!def) throw { tag: "failed", val: `this component has no tool \`${name}\`` };
      let result;
      try {
        const context = { tenant: ctx.tenant, callId: ctx.callId, tool: ctx.tool, data: JSON.parse(ctx.data) };
        result = def.handler(JSON.parse(args), context);
      } catch (error) {
        throw toToolError(error);
      }
      // An async handler (say, one that awaits `fetch`): ComponentizeJS runs the component's
      // event loop until the promise settles.
      if (result instanceof Promise) {
        return result.then(
          (value) => JSON.stringify(value ?? null),
          (error) => {
            throw toToolError(error);
          },
        );
      }
      return JSON.stringify(result ?? null);
    },
  };
}

function toToolError(error) {
  if (error instanceof ToolError) {
    return { tag: error.invalidArgs ? "invalid-args" : "failed", val: error.message };
  }
  if (error instanceof Error) {
    return { tag: "failed", val: `${error.name}: ${error.message}\n${error.stack ?? ""}`.trimEnd() };
  }
  return { tag: "failed", val: String(error) };
}

/** The call's log, returned with its result. */
export const log = Object.fromEntries(
  LEVELS.map((level) => [level, (...parts) => helpers.log(level, parts.map(String).join(" "))]),
);

/** Storage private to this tool and tenant, kept across calls (values are strings here). */
export const kv = {
  get: (key) => {
    const bytes = helpers.kvGet(key);
    return bytes === undefined ? undefined : new TextDecoder().decode(bytes);
  },
  set: (key, value) => helpers.kvSet(key, new TextEncoder().encode(String(value))),
  delete: (key) => helpers.kvDelete(key),
};

/** The tenant's configuration, for keys the tool lists in `config`. */
export const config = { get: (key) => helpers.configGet(key) };

/** Calls another tool of the same tenant; throws `Error("code: message")` if it fails. */
export function callTool(name, args = {}) {
  return JSON.parse(tools.callTool(name, JSON.stringify(args)));
}
