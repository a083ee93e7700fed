// Parameters as JSON Schema: a JSON Schema object as is, or a zod 3 schema converted.
// (Zod 4 converts itself: `z.toJSONSchema(schema)`.) Runs in the component and in Node.

/** A zod schema (v3, through its `_def`) or a plain JSON Schema object, as JSON Schema. */
export function toJsonSchema(schema) {
  if (schema && typeof schema === "object" && schema._zod) {
    throw new TypeError("a zod 4 schema: pass z.toJSONSchema(schema) as parameters");
  }
  if (schema && typeof schema === "object" && schema._def) return zodToJsonSchema(schema);
  return schema;
}

function zodToJsonSchema(schema) {
  const def = schema._def;
  const described = (out) => (def.description ? { ...out, description: def.description } : out);
  switch (def.typeName) {
    case "ZodString": return described({ type: "string" });
    case "ZodNumber": return described(def.checks?.some((c) => c.kind === "int") ? { type: "integer" } : { type: "number" });
    case "ZodBoolean": return described({ type: "boolean" });
    case "ZodArray": return described({ type: "array", items: zodToJsonSchema(def.type) });
    case "ZodEnum": return described({ type: "string", enum: def.values });
    case "ZodLiteral": return described({ const: def.value });
    case "ZodNullable": return described({ anyOf: [zodToJsonSchema(def.innerType), { type: "null" }] });
    case "ZodOptional": case "ZodDefault": return zodToJsonSchema(def.innerType);
    case "ZodObject": {
      const shape = typeof def.shape === "function" ? def.shape() : def.shape;
      const properties = {};
      const required = [];
      for (const [key, value] of Object.entries(shape)) {
        properties[key] = zodToJsonSchema(value);
        const kind = value._def.typeName;
        if (kind !== "ZodOptional" && kind !== "ZodDefault") required.push(key);
      }
      return described({ type: "object", properties, ...(required.length ? { required } : {}) });
    }
    default: throw new TypeError(`zod type ${def.typeName} has no JSON Schema here; pass a JSON Schema instead`);
  }
}
