// The parameter schemas a tool may give: JSON Schema as is, zod 3 converted, zod 4 refused
// with the way to convert it. `npm test`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { z } from "zod";
import { z as z4 } from "zod/v4";

import { toJsonSchema } from "../src/schema.js";

test("a JSON Schema is kept as it is", () => {
  const schema = { type: "object", properties: { a: { type: "string" } } };
  assert.equal(toJsonSchema(schema), schema);
});

test("a zod 3 object becomes the JSON Schema the host validates", () => {
  const schema = z.object({
    city: z.string().describe("City name"),
    days: z.number().int().optional(),
    units: z.enum(["metric", "imperial"]).default("metric"),
    tags: z.array(z.string()),
    exact: z.literal(true),
    note: z.string().nullable(),
  });
  assert.deepEqual(toJsonSchema(schema), {
    type: "object",
    properties: {
      city: { type: "string", description: "City name" },
      days: { type: "integer" },
      units: { type: "string", enum: ["metric", "imperial"] },
      tags: { type: "array", items: { type: "string" } },
      exact: { const: true },
      note: { anyOf: [{ type: "string" }, { type: "null" }] },
    },
    required: ["city", "tags", "exact", "note"],
  });
});

test("a zod 3 type with no JSON Schema here is refused by name", () => {
  assert.throws(() => toJsonSchema(z.object({ when: z.date() })), /ZodDate/);
});

test("zod 4 converts itself, and a raw zod 4 schema says how", () => {
  const schema = z4.object({ city: z4.string() });
  assert.throws(() => toJsonSchema(schema), /z\.toJSONSchema/);
  const converted = toJsonSchema(z4.toJSONSchema(schema));
  assert.deepEqual(converted.properties, { city: { type: "string" } });
  assert.deepEqual(converted.required, ["city"]);
});
