import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// The server serves dist/index.html at `/` and every other file at its path; routes live in
// the URL's hash, so no path but `/` is the app's.
export default defineConfig({
  base: "./",
  plugins: [react()],
  build: { outDir: "dist", emptyOutDir: true },
  // `npm run dev` passes the API through to a server on :8080.
  server: { proxy: { "/v1": "http://127.0.0.1:8080", "/mcp": "http://127.0.0.1:8080" } },
});
