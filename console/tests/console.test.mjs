// The console in a real browser against a running toolhost.
//
//   TOOLHOST_URL=http://127.0.0.1:8080 TOOLHOST_KEY=thk_... npm test --prefix console
//
// TOOLHOST_KEY is an admin key of a tenant; the tests install tools named after this run.
// TOOLHOST_SCREENSHOTS=DIR also saves a screenshot of each page there. CHROMIUM names the
// browser (default /usr/bin/chromium).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { chromium } from "playwright-core";

const BASE_URL = process.env.TOOLHOST_URL?.replace(/\/+$/, "");
const KEY = process.env.TOOLHOST_KEY;
const SCREENSHOTS = process.env.TOOLHOST_SCREENSHOTS;
const AXE = createRequire(import.meta.url).resolve("axe-core/axe.min.js");

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const RUN = Date.now().toString(36);
const GREET = `greet_${RUN}`;
const HELD = `held_${RUN}`;

/** A JavaScript tool that greets `name`, `times` times, and logs "greeting". */
const greetSource = (greeting, { strict = false } = {}) => `
export const spec = {
  name: "${GREET}",
  description: "Greets someone by name.",
  strict: ${strict},
  parameters: {
    type: "object",
    required: ["name"],
    properties: {
      name: { type: "string", minLength: 2 },
      times: { type: "integer", minimum: 1, maximum: 3 },
    },
  },
};
export default function (args) {
  console.log("greeting");
  return { greeting: ("${greeting}" + args.name + "! ").repeat(args.times ?? 1).trim() };
}
`;

/** A JavaScript tool whose calls wait for a person's approval. */
const heldSource = `
export const spec = {
  name: "${HELD}",
  description: "Ships a release once someone approves.",
  needs_approval: true,
  parameters: { type: "object", properties: { note: { type: "string" } } },
};
export default function (args) {
  return { shipped: true, note: args.note ?? null };
}
`;

if (!BASE_URL || !KEY) {
  test("console in a browser", () => {
    assert.fail(
      "TOOLHOST_URL and TOOLHOST_KEY must be set: start a toolhost server that serves console/dist " +
        "(scripts/build-console), then run TOOLHOST_URL=http://127.0.0.1:8080 TOOLHOST_KEY=<an admin key> " +
        "npm test --prefix console",
    );
  });
} else {
  let browser;

  before(async () => {
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
      args: ["--no-sandbox"],
    });
    if (SCREENSHOTS) {
      mkdirSync(SCREENSHOTS, { recursive: true });
    }
  });

  after(async () => {
    await browser?.close();
  });

  const pageErrors = new WeakMap();

  /** Closes the tab, failing if its scripts threw. */
  async function close(page) {
    await page.context().close();
    assert.deepEqual(pageErrors.get(page), [], "the page's scripts threw");
  }

  /** A new tab (with its own sessionStorage) on the console's sign-in page. */
  async function openConsole(viewport = DESKTOP) {
    const context = await browser.newContext({ viewport });
    context.setDefaultTimeout(15_000);
    const page = await context.newPage();
    const errors = [];
    page.on("pageerror", (error) => errors.push(error.message));
    pageErrors.set(page, errors);
    await page.goto(`${BASE_URL}/`);
    return page;
  }

  async function signIn(page) {
    await page.getByLabel("API key").fill(KEY);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { level: 1, name: "Tools" }).waitFor();
  }

  async function openSignedIn(viewport = DESKTOP) {
    const page = await openConsole(viewport);
    await signIn(page);
    return page;
  }

  /** Follows a link of the main navigation and waits for the page's heading. */
  async function goTo(page, label, heading = label) {
    await page
      .getByRole("navigation", { name: "Main" })
      .getByRole("link", { name: label, exact: true })
      .click();
    await page.getByRole("heading", { level: 1, name: heading }).waitFor();
  }

  async function openTool(page, name) {
    await goTo(page, "Tools");
    await page.getByRole("link", { name, exact: true }).click();
    await page.getByRole("heading", { level: 1, name }).waitFor();
  }

  /** Saves the viewport, scrolled to the top, as `file` when TOOLHOST_SCREENSHOTS is set. */
  async function screenshot(page, file) {
    if (!SCREENSHOTS) {
      return;
    }
    await page.evaluate(() => window.scrollTo(0, 0));
    // No hover highlight: the pointer rests in the page's bottom-right corner.
    const viewport = page.viewportSize();
    await page.mouse.move(viewport.width - 1, viewport.height - 1);
    await page.screenshot({ path: join(SCREENSHOTS, file) });
  }

  /** Retries `check` until it passes or `timeoutMs` runs out. */
  async function eventually(check, timeoutMs = 10_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        return await check();
      } catch (error) {
        if (Date.now() > deadline) {
          throw error;
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  }

  const uploadZone = (page) => page.getByRole("region", { name: "Drop a tool file here" });

  /** Drops a file on the upload page's drop zone, as a drag from the desktop does. */
  async function dropFile(page, name, text) {
    const dataTransfer = await page.evaluateHandle(
      ([fileName, content]) => {
        const transfer = new DataTransfer();
        transfer.items.add(new File([content], fileName, { type: "text/javascript" }));
        return transfer;
      },
      [name, text],
    );
    const zone = uploadZone(page);
    await zone.dispatchEvent("dragenter", { dataTransfer });
    await zone.dispatchEvent("dragover", { dataTransfer });
    await zone.dispatchEvent("drop", { dataTransfer });
  }

  async function chooseFile(page, name, text) {
    await page.getByLabel("Choose a file").setInputFiles({
      name,
      mimeType: "text/javascript",
      buffer: Buffer.from(text),
    });
  }

  /** Waits for the upload page to report `name` installed. */
  async function installed(page, name) {
    await page.locator(".success").getByRole("link", { name, exact: true }).waitFor();
  }

  const callButton = (page) => page.getByRole("button", { name: "Call", exact: true });
  const outcome = (page) => page.locator(".call-outcome");

  async function callGreet(page, name, times) {
    await page.getByLabel(/^name/).fill(name);
    await page.getByLabel(/^times/).fill(times === undefined ? "" : String(times));
    await callButton(page).click();
  }

  /** The error text rjsf shows for a field: the element its input is described by. */
  async function fieldError(page, input) {
    const [errorId] = (await input.getAttribute("aria-describedby")).split(" ");
    return (await page.locator(`[id="${errorId}"]`).textContent()) ?? "";
  }

  test("a wrong key is refused and stays on sign-in", { timeout: 60_000 }, async () => {
    const page = await openConsole();
    await page.getByLabel("API key").fill("nope");
    await page.getByRole("button", { name: "Sign in" }).click();
    const alert = page.getByRole("alert");
    await alert.waitFor();
    assert.match(await alert.textContent(), /unauthorized/);
    assert.ok(await page.getByRole("heading", { level: 1, name: "Sign in" }).isVisible());
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
    await close(page);
  });

  test(
    "a tool uploaded by drag and drop is listed and called from its form",
    { timeout: 60_000 },
    async () => {
      const page = await openSignedIn();
      await goTo(page, "Upload", "Upload a tool");
      await dropFile(page, `${GREET}.js`, greetSource("Hello, "));
      await installed(page, GREET);
      await screenshot(page, "upload.png");

      await goTo(page, "Tools");
      await page.getByRole("link", { name: GREET, exact: true }).waitFor();
      await page.getByLabel("Search").fill("greets someone by name");
      await eventually(async () =>
        assert.ok(await page.getByRole("link", { name: GREET, exact: true }).isVisible()),
      );
      await page.getByLabel("Search").fill("");
      await screenshot(page, "tools.png");

      await openTool(page, GREET);
      await callGreet(page, "Ada");
      await outcome(page).getByText("Hello, Ada!").waitFor();
      const log = page.getByRole("list", { name: "Log lines" });
      assert.match(await log.textContent(), /greeting/);
      assert.ok(await outcome(page).getByText("ok", { exact: true }).isVisible());
      await screenshot(page, "tool.png");
      await close(page);
    },
  );

  test(
    "arguments the schema rejects mark the field with the server's message",
    { timeout: 60_000 },
    async () => {
      const page = await openSignedIn();
      await openTool(page, GREET);
      const name = page.getByLabel(/^name/);
      const times = page.getByLabel(/^times/);

      await callGreet(page, "A");
      await outcome(page).getByText("invalid_args").waitFor();
      await eventually(async () => assert.equal(await name.getAttribute("aria-invalid"), "true"));
      const nameError = await fieldError(page, name);
      assert.ok(nameError.length > 0, "the name field shows an error");
      assert.ok(
        (await outcome(page).locator(".call-error").textContent()).includes(nameError),
        `the field's error "${nameError}" is the server's`,
      );
      assert.notEqual(await times.getAttribute("aria-invalid"), "true");

      await callGreet(page, "Ada", 9);
      await eventually(async () => assert.equal(await times.getAttribute("aria-invalid"), "true"));
      assert.notEqual(await name.getAttribute("aria-invalid"), "true");
      assert.ok((await fieldError(page, times)).length > 0, "the times field shows an error");

      // A missing required argument marks the field to fill in.
      await callGreet(page, "");
      await eventually(async () => assert.equal(await name.getAttribute("aria-invalid"), "true"));
      assert.match(await fieldError(page, name), /required/);
      await close(page);
    },
  );

  test("a second version answers until a rollback to the first", { timeout: 60_000 }, async () => {
    const page = await openSignedIn();
    await goTo(page, "Upload", "Upload a tool");
    await chooseFile(page, `${GREET}.js`, greetSource("Hi, "));
    await installed(page, GREET);
    await page.locator(".success").getByRole("link", { name: GREET, exact: true }).click();
    await page.getByRole("heading", { level: 1, name: GREET }).waitFor();

    await callGreet(page, "Ada");
    await outcome(page).getByText("Hi, Ada!").waitFor();

    const versions = page.getByRole("region", { name: "Versions" });
    page.once("dialog", (dialog) => dialog.accept());
    await versions.getByRole("button", { name: "Roll back to v1" }).click();
    await versions.getByText("is now at version 1").waitFor();
    await eventually(async () =>
      assert.match(await versions.getByRole("row", { name: /^v1\b/ }).textContent(), /current/),
    );

    await callButton(page).click();
    await outcome(page).getByText("Hello, Ada!").waitFor();
    await close(page);
  });

  test("a held call is approved, another rejected, on the Approvals page", { timeout: 90_000 }, async () => {
    const page = await openSignedIn();
    await goTo(page, "Upload", "Upload a tool");
    await chooseFile(page, `${HELD}.js`, heldSource);
    await installed(page, HELD);

    await openTool(page, HELD);
    await page.getByLabel(/^note/).fill("ship it");
    await callButton(page).click();
    await outcome(page).getByText("approval_required").waitFor();
    await outcome(page).getByRole("link", { name: "open Approvals" }).click();
    await page.getByRole("heading", { level: 1, name: "Approvals" }).waitFor();

    const waiting = page.getByRole("listitem").filter({ hasText: HELD });
    await waiting.waitFor();
    assert.match(await waiting.textContent(), /ship it/);
    await screenshot(page, "approvals.png");
    await waiting.getByRole("button", { name: "Approve" }).click();
    const decided = page.getByRole("region", { name: "Decided here" });
    await decided.getByText(`${HELD}: approved`).waitFor();
    assert.ok(await decided.getByText("ok", { exact: true }).isVisible());
    assert.match(await decided.textContent(), /shipped/);
    await eventually(async () => assert.equal(await waiting.count(), 0));

    await openTool(page, HELD);
    await page.getByLabel(/^note/).fill("not this one");
    await callButton(page).click();
    await outcome(page).getByText("approval_required").waitFor();
    await goTo(page, "Approvals");
    await waiting.waitFor();
    await waiting.getByLabel(/Reason for rejecting/).fill("not today");
    await waiting.getByRole("button", { name: "Reject" }).click();
    await decided.getByText(`${HELD}: rejected`).waitFor();
    assert.match(await decided.textContent(), /rejected/);
    await close(page);
  });

  test("calls, metrics, config and connect pages", { timeout: 90_000 }, async () => {
    const page = await openSignedIn();

    await goTo(page, "Calls");
    await page.getByLabel("Tool", { exact: true }).selectOption(GREET);
    const rows = page.locator("table.calls tbody tr");
    await eventually(async () => {
      const texts = await rows.allTextContents();
      assert.ok(texts.length >= 4, `at least the 4 calls of ${GREET} made here, got ${texts.length}`);
      assert.ok(
        texts.every((text) => text.includes(GREET)),
        "only that tool's calls",
      );
    });
    await page.getByLabel("Outcome").selectOption("invalid_args");
    await eventually(async () => {
      const texts = await rows.allTextContents();
      assert.ok(texts.length >= 2 && texts.every((text) => text.includes("invalid_args")));
    });
    await page.getByLabel("Outcome").selectOption("");
    await eventually(async () => assert.ok((await rows.count()) >= 4));
    await rows.first().getByRole("button").click();
    const detail = page.getByRole("region", { name: `Call of ${GREET}` });
    await detail.waitFor();
    assert.match(await detail.textContent(), /Ada/);
    await screenshot(page, "calls.png");

    await goTo(page, "Metrics");
    await page.getByLabel("Tool", { exact: true }).selectOption(GREET);
    const chart = page.getByRole("img", { name: new RegExp(`^Calls and error rate .* of ${GREET} `) });
    await chart.waitFor();
    assert.equal(await chart.evaluate((element) => element.tagName), "CANVAS");
    await screenshot(page, "metrics.png");

    await goTo(page, "Config");
    const plainKey = `region_${RUN}`;
    const secretKey = `api_token_${RUN}`;
    await page.getByLabel("Key", { exact: true }).fill(plainKey);
    await page.getByLabel("Value", { exact: true }).fill("eu-west");
    await page.getByRole("button", { name: "Save" }).click();
    const plainRow = page.getByRole("row", { name: new RegExp(plainKey) });
    await plainRow.waitFor();
    assert.match(await plainRow.textContent(), /eu-west/);

    await page.getByLabel("Key", { exact: true }).fill(secretKey);
    await page.getByLabel(/^Secret/).check();
    assert.equal(await page.getByLabel("Value", { exact: true }).getAttribute("type"), "password");
    await page.getByLabel("Value", { exact: true }).fill("s3cret-value");
    await page.getByRole("button", { name: "Save" }).click();
    const secretRow = page.getByRole("row", { name: new RegExp(secretKey) });
    await secretRow.waitFor();
    const secretText = await secretRow.textContent();
    assert.match(secretText, /secret/);
    assert.doesNotMatch(secretText, /s3cret-value/);
    await screenshot(page, "config.png");
    for (const [key, row] of [
      [plainKey, plainRow],
      [secretKey, secretRow],
    ]) {
      page.once("dialog", (dialog) => dialog.accept());
      await row.getByRole("button", { name: `Remove ${key}` }).click();
      await eventually(async () => assert.equal(await row.count(), 0));
    }

    await goTo(page, "Connect");
    const http = page.getByLabel("MCP over HTTP configuration", { exact: true });
    assert.ok((await http.textContent()).includes(`"url": "${BASE_URL}/mcp"`));
    assert.ok(!(await http.textContent()).includes(KEY), "the key is left out until asked for");
    await page.getByLabel("Put my API key in the snippet").check();
    assert.ok((await http.textContent()).includes(`Bearer ${KEY}`));
    await page.getByLabel("Put my API key in the snippet").uncheck();
    assert.ok(!(await http.textContent()).includes(KEY));
    await page.getByLabel("OpenAI tool definitions", { exact: true }).waitFor();
    assert.match(
      await page.getByLabel("MCP tool definitions", { exact: true }).textContent(),
      new RegExp(GREET),
    );
    await screenshot(page, "connect.png");
    await close(page);
  });

  test(
    "on a phone the navigation is behind a Menu button and nothing scrolls sideways",
    { timeout: 60_000 },
    async () => {
      const page = await openSignedIn(PHONE);
      const menu = page.getByRole("button", { name: "Menu" });
      const nav = page.getByRole("navigation", { name: "Main" });
      assert.ok(await menu.isVisible());
      assert.ok(!(await nav.isVisible()));
      assert.equal(await menu.getAttribute("aria-expanded"), "false");
      await page.getByRole("link", { name: GREET, exact: true }).waitFor();
      const width = await page.evaluate(() => document.scrollingElement.scrollWidth);
      assert.ok(width <= PHONE.width + 1, `the page is ${width} px wide`);
      await screenshot(page, "tools-phone.png");

      await menu.click();
      assert.equal(await menu.getAttribute("aria-expanded"), "true");
      await nav.getByRole("link", { name: "Calls", exact: true }).click();
      await page.getByRole("heading", { level: 1, name: "Calls" }).waitFor();
      assert.ok(!(await nav.isVisible()), "the menu closes on the new page");
      await close(page);
    },
  );

  test("signing in works from the keyboard", { timeout: 60_000 }, async () => {
    const page = await openConsole();
    const keyField = page.getByLabel("API key");
    const submit = page.getByRole("button", { name: "Sign in" });
    const focused = (locator) => locator.evaluate((element) => element === document.activeElement);
    for (let presses = 0; !(await focused(keyField)); presses++) {
      assert.ok(presses < 5, "Tab reaches the key field");
      await page.keyboard.press("Tab");
    }
    await page.keyboard.type(KEY);
    await page.keyboard.press("Tab");
    assert.ok(await focused(submit), "Tab moves from the key field to the Sign in button");
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { level: 1, name: "Tools" }).waitFor();
    await close(page);
  });

  test("every page passes axe's WCAG 2.1 A and AA rules", { timeout: 120_000 }, async () => {
    // axe runs as a script injected into the page: this tab alone bypasses the console's
    // content security policy.
    const context = await browser.newContext({ viewport: DESKTOP, bypassCSP: true });
    context.setDefaultTimeout(15_000);
    const page = await context.newPage();
    await page.goto(`${BASE_URL}/`);
    async function audit(where) {
      if (!(await page.evaluate(() => "axe" in window))) {
        await page.addScriptTag({ path: AXE });
      }
      const violations = await page.evaluate(async () => {
        const tags = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"];
        const { violations } = await window.axe.run(document, { runOnly: { type: "tag", values: tags } });
        return violations.map(
          ({ id, impact, nodes }) => `${id} (${impact}) at ${nodes.map((n) => n.target).join(", ")}`,
        );
      });
      assert.deepEqual(violations, [], `${where}: ${violations.join("; ")}`);
    }
    await audit("sign-in");
    await signIn(page);
    const pages = [
      ["Tools"],
      ["Upload", "Upload a tool"],
      ["Calls"],
      ["Metrics"],
      ["Config"],
      ["Approvals"],
      ["Connect"],
    ];
    for (const [label, heading] of pages) {
      await goTo(page, label, heading);
      await audit(label);
    }
    await openTool(page, GREET);
    await callGreet(page, "A");
    await outcome(page).getByText("invalid_args").waitFor();
    await audit("a tool, after a refused call");
    await context.close();
  });

  test("the tools made here are deleted from their pages", { timeout: 60_000 }, async () => {
    const page = await openSignedIn();
    for (const name of [GREET, HELD]) {
      await openTool(page, name);
      page.once("dialog", (dialog) => dialog.accept());
      await page.getByRole("button", { name: `Delete ${name}` }).click();
      await page.getByRole("heading", { level: 1, name: "Tools" }).waitFor();
      await eventually(async () =>
        assert.equal(await page.getByRole("link", { name, exact: true }).count(), 0),
      );
    }
    await close(page);
  });
}
