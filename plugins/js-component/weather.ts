// A TypeScript tool built into a component that calls an HTTP API with `fetch`:
// `toolhost-js build weather.ts`. Like `plugins/js-source/weather.js`, it needs a network
// grant for the API, and reads WEATHER_URL (optional) and WEATHER_TOKEN (a secret).
import { config, defineTool, exportTools, ToolError } from "@toolhost/sdk";

interface Args {
  city: string;
  units?: "metric" | "imperial";
}

const weatherNow = defineTool<Args, unknown>({
  name: "js_component_weather_now",
  description: "Current weather for a city.",
  parameters: {
    type: "object",
    required: ["city"],
    properties: {
      city: { type: "string", description: "The city, such as São Paulo." },
      units: { enum: ["metric", "imperial"] },
    },
  },
  config: ["WEATHER_URL", "WEATHER_TOKEN"],
  handler: async ({ city, units = "metric" }) => {
    const base = config.get("WEATHER_URL") ?? "https://api.weather.example";
    const url = new URL(`/v1/current/${encodeURIComponent(city)}`, base);
    url.searchParams.set("units", units);
    const token = config.get("WEATHER_TOKEN");
    const response = await fetch(url, {
      headers: token ? { Authorization: `Bearer ${token}` } : {},
    });
    if (!response.ok) throw new ToolError(`the weather API answered ${response.status}`);
    return await response.json();
  },
});

export const { listTools, call } = exportTools(weatherNow);
