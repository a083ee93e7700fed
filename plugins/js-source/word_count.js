// A stored-source JavaScript tool: `toolhost install word_count.js`. It runs on the host's
// shared JS runtime, so it is callable as soon as it is uploaded.
export const spec = {
  name: "js_word_count",
  description: "Counts the words in a text and finds the most frequent one.",
  strict: true,
  parameters: {
    type: "object",
    required: ["text"],
    properties: { text: { type: "string", description: "The text to count." } },
  },
  // What every answer looks like: MCP lists it as the tool's outputSchema.
  output_schema: {
    type: "object",
    required: ["words", "distinct", "most_frequent"],
    properties: {
      words: { type: "integer" },
      distinct: { type: "integer" },
      most_frequent: {
        anyOf: [
          { type: "null" },
          { type: "object", required: ["word", "count"], properties: { word: { type: "string" }, count: { type: "integer" } } },
        ],
      },
    },
  },
};

export default function (args, ctx) {
  const words = args.text.toLowerCase().match(/[\p{L}\p{N}']+/gu) ?? [];
  const counts = new Map();
  for (const word of words) counts.set(word, (counts.get(word) ?? 0) + 1);
  let top = null;
  for (const [word, count] of counts) if (!top || count > top.count) top = { word, count };
  console.log(`counted ${words.length} words for ${ctx.tenant}`);
  return { words: words.length, distinct: counts.size, most_frequent: top };
}
