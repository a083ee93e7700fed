// A TypeScript tool built into a component: `toolhost-js build word_count.ts`.
import { type Context, defineTool, exportTools, log, ToolError } from "@toolhost/sdk";

interface Args {
  text: string;
}

interface Counted {
  words: number;
  distinct: number;
  most_frequent: { word: string; count: number } | null;
}

const wordCount = defineTool<Args, Counted>({
  name: "js_component_word_count",
  description: "Counts the words in a text and finds the most frequent one.",
  strict: true,
  parameters: {
    type: "object",
    required: ["text"],
    properties: { text: { type: "string", description: "The text to count." } },
  },
  outputSchema: {
    type: "object",
    required: ["words", "distinct", "most_frequent"],
    properties: {
      words: { type: "integer" },
      distinct: { type: "integer" },
      most_frequent: {
        anyOf: [
          { type: "object", required: ["word", "count"], properties: { word: { type: "string" }, count: { type: "integer" } } },
          { type: "null" },
        ],
      },
    },
  },
  handler({ text }: Args, ctx: Context): Counted {
    if (text.length > 100_000) throw new ToolError("text is longer than 100 000 characters", { invalidArgs: true });
    // This engine has no Unicode property escapes (\p{L}): letters are spelled out.
    const words = text.toLowerCase().match(/[0-9a-z\u00c0-\uffff']+/g) ?? [];
    const counts = new Map<string, number>();
    for (const word of words) counts.set(word, (counts.get(word) ?? 0) + 1);
    let top: Counted["most_frequent"] = null;
    for (const [word, count] of counts) if (!top || count > top.count) top = { word, count };
    log.info(`counted ${words.length} words for ${ctx.tenant}`);
    return { words: words.length, distinct: counts.size, most_frequent: top };
  },
});

const shout = defineTool({
  name: "js_component_fail",
  description: "Always fails, to show how errors reach the agent.",
  strict: true,
  parameters: { type: "object", properties: { why: { type: "string" } } },
  handler({ why }: { why?: string }): never {
    throw new Error(`failed on purpose: ${why ?? "no reason"}`);
  },
});

export const { listTools, call } = exportTools(wordCount, shout);
