// Run before every tool: cheap. The web platform (web.js) is parsed only when a tool first
// touches one of its globals; until then each is an accessor that loads it. Returns the
// event loop's hooks, which are idle until it is loaded.
((native) => {
  "use strict";
  const g = globalThis;
  const NAMES = [
    "AbortController", "AbortSignal", "Blob", "Crypto", "DOMException", "Event", "EventTarget", "File",
    "Headers", "Request", "Response", "SubtleCrypto", "TextDecoder", "TextEncoder", "URL", "URLSearchParams",
    "clearInterval", "clearTimeout", "crypto", "fetch", "setInterval", "setTimeout", "structuredClone",
  ];
  let eventLoop = null;
  const load = () => {
    eventLoop ??= native.loadWeb()(native);
    return eventLoop;
  };
  for (const name of NAMES) {
    Object.defineProperty(g, name, {
      get() {
        load();
        return g[name];
      },
      set(value) {
        load();
        g[name] = value;
      },
      configurable: true,
    });
  }
  const define = (target, members) => {
    for (const [name, value] of Object.entries(members)) {
      Object.defineProperty(target, name, { value, writable: true, configurable: true });
    }
  };
  // A snapshot would replay one random sequence and a stale clock: these read WASI per call.
  define(Math, { random: () => native.random() });
  const key = Symbol("internal");
  class Performance {
    constructor(token) { if (token !== key) throw new TypeError("Illegal constructor"); }
    now() { return native.now(); }
    get timeOrigin() { return native.timeOrigin(); }
    toJSON() { return { timeOrigin: this.timeOrigin }; }
  }
  define(g, { Performance, performance: new Performance(key) });
  return {
    load,
    next: () => (eventLoop ? eventLoop.next() : null),
    fire: () => eventLoop?.fire(),
  };
});
