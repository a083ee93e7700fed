// A stored-source JavaScript tool that calls an HTTP API: `toolhost install weather.js`.
// The tenant grants it the API (`"network": ["https://api.weather.example"]` in its policy)
// and sets WEATHER_URL (optional) and WEATHER_TOKEN (a secret) in its configuration.
export const spec = {
  name: "js_weather_now",
  description: "Current weather for a city.",
  parameters: {
    type: "object",
    required: ["city"],
    properties: {
      city: { type: "string", description: "The city, such as São Paulo." },
      units: { enum: ["metric", "imperial"] },
    },
  },
  // The configuration keys it reads with `toolhost.config.get`.
  config: ["WEATHER_URL", "WEATHER_TOKEN"],
};

export default async function ({ city, units = "metric" }) {
  const base = toolhost.config.get("WEATHER_URL") ?? "https://api.weather.example";
  const url = new URL(`/v1/current/${encodeURIComponent(city)}`, base);
  url.searchParams.set("units", units);
  const token = toolhost.config.get("WEATHER_TOKEN");
  const response = await fetch(url, {
    headers: token ? { Authorization: `Bearer ${token}` } : {},
  });
  if (!response.ok) throw new Error(`the weather API answered ${response.status}: ${await response.text()}`);
  return await response.json();
}
