#!/usr/bin/env node
// toolhost-js build <tool.js|tool.ts> [-o tool.wasm]
//
// Bundles a tool (and this SDK) into one ES module with esbuild, then turns it into a
// WebAssembly component of the `toolhost:plugin` world with ComponentizeJS.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, extname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { componentize } from "@bytecodealliance/componentize-js";
import { build } from "esbuild";

const sdk = resolve(dirname(fileURLToPath(import.meta.url)), "..");

function usage(message) {
  if (message) console.error(`toolhost-js: ${message}`);
  console.error("usage: toolhost-js build <tool.js|tool.ts> [-o tool.wasm]");
  process.exit(2);
}

const [command, input, ...rest] = process.argv.slice(2);
if (command !== "build" || !input) usage();
let output = join(dirname(input), `${basename(input, extname(input))}.wasm`);
for (let i = 0; i < rest.length; i++) {
  if (rest[i] === "-o" || rest[i] === "--output") output = rest[++i] ?? usage("-o needs a path");
  else usage(`unknown argument ${rest[i]}`);
}

const work = await mkdtemp(join(tmpdir(), "toolhost-js-"));
try {
  const bundled = join(work, "tool.js");
  await build({
    entryPoints: [resolve(input)],
    bundle: true,
    format: "esm",
    platform: "neutral",
    target: "es2022",
    outfile: bundled,
    external: ["toolhost:*"],
    alias: { "@toolhost/sdk": join(sdk, "src/index.js") },
    logLevel: "warning",
  });
  const { component } = await componentize({
    sourcePath: bundled,
    witPath: join(sdk, "wit"),
    worldName: "plugin",
    // fetch() goes out through wasi:http, under the tool's network grant; no incoming HTTP.
    disableFeatures: ["fetch-event"],
  });
  await writeFile(output, component);
  console.log(`${output} (${(component.byteLength / 1e6).toFixed(1)} MB)`);
} catch (error) {
  console.error(`toolhost-js: ${error?.message ?? error}`);
  process.exitCode = 1;
} finally {
  await rm(work, { recursive: true, force: true });
}
