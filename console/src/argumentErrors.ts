import type { ErrorSchema } from "@rjsf/utils";
import type { ArgumentError } from "./api";

/** The segments of a JSON Pointer (RFC 6901): "" is the whole document. */
function pointerSegments(pointer: string): string[] {
  if (pointer === "") {
    return [];
  }
  return pointer
    .replace(/^\//, "")
    .split("/")
    .map((segment) => segment.replace(/~1/g, "/").replace(/~0/g, "~"));
}

interface ErrorNode {
  __errors?: string[];
  [child: string]: ErrorNode | string[] | undefined;
}

/** The server's argument violations as an rjsf error schema, so each marks its own field:
 * `/a/b` becomes `{a: {b: {__errors: [message]}}}`. */
export function errorSchemaFromViolations(violations: ArgumentError[]): ErrorSchema {
  const root: ErrorNode = {};
  for (const { path, message } of violations) {
    let node = root;
    for (const segment of pointerSegments(path)) {
      // Own properties only: a segment such as `__proto__` must not reach Object.prototype.
      if (!Object.hasOwn(node, segment)) {
        Object.defineProperty(node, segment, {
          value: {},
          enumerable: true,
          writable: true,
          configurable: true,
        });
      }
      node = node[segment] as ErrorNode;
    }
    (node.__errors ??= []).push(message);
  }
  return root as ErrorSchema;
}
