// The web platform's minimum common API (WinterTC), as far as it fits one sandboxed call:
// classes here, and `native` (web.rs) for the network, clocks, randomness, URLs and digests.
// Parsed and run on first use of any of its globals (see bootstrap.js), which costs a few
// milliseconds; a pre-initialised tool has it ready. Returns the event loop's hooks.
((native) => {
  "use strict";
  const g = globalThis;
  // Web globals are writable, configurable and not enumerable (WebIDL).
  const define = (target, members) => {
    for (const [name, value] of Object.entries(members)) {
      Object.defineProperty(target, name, { value, writable: true, configurable: true });
    }
  };
  const report = (error) => console.error(error instanceof Error ? `${error.name}: ${error.message}` : error);

  // --- DOMException -------------------------------------------------------------------------
  const codes = {
    IndexSizeError: 1, NotFoundError: 8, NotSupportedError: 9, InvalidStateError: 11, SyntaxError: 12,
    InvalidAccessError: 15, TypeMismatchError: 17, SecurityError: 18, NetworkError: 19, AbortError: 20,
    QuotaExceededError: 22, TimeoutError: 23, DataCloneError: 25,
  };
  class DOMException extends Error {
    #name;
    #message;
    constructor(message = "", name = "Error") {
      super(String(message));
      delete this.message;
      this.#message = String(message);
      this.#name = String(name);
    }
    get name() { return this.#name; }
    get message() { return this.#message; }
    get code() { return codes[this.#name] ?? 0; }
  }
  // WebIDL attributes are enumerable, and brand-checked (the private fields throw).
  for (const name of ["name", "message", "code"]) {
    Object.defineProperty(DOMException.prototype, name, { ...Object.getOwnPropertyDescriptor(DOMException.prototype, name), enumerable: true });
  }
  const LEGACY_CODES = [
    "INDEX_SIZE_ERR", "DOMSTRING_SIZE_ERR", "HIERARCHY_REQUEST_ERR", "WRONG_DOCUMENT_ERR", "INVALID_CHARACTER_ERR",
    "NO_DATA_ALLOWED_ERR", "NO_MODIFICATION_ALLOWED_ERR", "NOT_FOUND_ERR", "NOT_SUPPORTED_ERR", "INUSE_ATTRIBUTE_ERR",
    "INVALID_STATE_ERR", "SYNTAX_ERR", "INVALID_MODIFICATION_ERR", "NAMESPACE_ERR", "INVALID_ACCESS_ERR", "VALIDATION_ERR",
    "TYPE_MISMATCH_ERR", "SECURITY_ERR", "NETWORK_ERR", "ABORT_ERR", "URL_MISMATCH_ERR", "QUOTA_EXCEEDED_ERR",
    "TIMEOUT_ERR", "INVALID_NODE_TYPE_ERR", "DATA_CLONE_ERR",
  ];
  // WebIDL constants: on the interface and its prototype, enumerable and read-only.
  LEGACY_CODES.forEach((name, i) => {
    for (const target of [DOMException, DOMException.prototype]) {
      Object.defineProperty(target, name, { value: i + 1, enumerable: true });
    }
  });

  // --- Event, EventTarget -------------------------------------------------------------------
  class Event {
    #type;
    #target = null;
    #canceled = false;
    #trusted = false;
    #dispatching = false;
    #bubbles;
    #cancelable;
    #composed;
    #timeStamp = native.now();
    constructor(type, init = {}) {
      if (arguments.length === 0) throw new TypeError("Event needs a type");
      this.#type = String(type);
      this.#bubbles = !!init?.bubbles;
      this.#cancelable = !!init?.cancelable;
      this.#composed = !!init?.composed;
    }
    get type() { return this.#type; }
    get target() { return this.#target; }
    get currentTarget() { return this.#dispatching ? this.#target : null; }
    get srcElement() { return this.#target; }
    get eventPhase() { return this.#dispatching ? 2 : 0; }
    get bubbles() { return this.#bubbles; }
    get cancelable() { return this.#cancelable; }
    get composed() { return this.#composed; }
    get isTrusted() { return this.#trusted; }
    get timeStamp() { return this.#timeStamp; }
    get defaultPrevented() { return this.#canceled; }
    get returnValue() { return !this.#canceled; }
    preventDefault() { if (this.#cancelable) this.#canceled = true; }
    composedPath() { return this.#dispatching ? [this.#target] : []; }
    stopPropagation() {}
    stopImmediatePropagation() {}
    static {
      startDispatch = (event, target) => {
        event.#target = target;
        event.#dispatching = true;
      };
      endDispatch = (event) => void (event.#dispatching = false);
      trustedEvent = (type) => {
        const event = new Event(type);
        event.#trusted = true;
        return event;
      };
    }
  }
  var startDispatch, endDispatch, trustedEvent;

  class EventTarget {
    #listeners = new Map();
    addEventListener(type, listener, options) {
      if (listener == null) return;
      const once = typeof options === "object" && !!options?.once;
      const signal = typeof options === "object" ? options?.signal : undefined;
      if (signal?.aborted) return;
      let list = this.#listeners.get(String(type));
      if (!list) this.#listeners.set(String(type), (list = []));
      if (list.some((entry) => entry.listener === listener)) return;
      list.push({ listener, once });
      signal?.addEventListener("abort", () => this.removeEventListener(type, listener));
    }
    removeEventListener(type, listener) {
      const list = this.#listeners.get(String(type));
      const at = list ? list.findIndex((entry) => entry.listener === listener) : -1;
      if (at >= 0) list.splice(at, 1);
    }
    dispatchEvent(event) {
      if (!(event instanceof Event)) throw new TypeError("dispatchEvent needs an Event");
      startDispatch(event, this);
      const handler = this[`on${event.type}`];
      const listeners = [...(this.#listeners.get(event.type) ?? [])];
      if (typeof handler === "function") listeners.unshift({ listener: handler, once: false });
      for (const { listener, once } of listeners) {
        if (once) this.removeEventListener(event.type, listener);
        try {
          if (typeof listener === "function") listener.call(this, event);
          else listener.handleEvent(event);
        } catch (error) {
          report(error);
        }
      }
      endDispatch(event);
      return !event.defaultPrevented;
    }
  }

  // --- AbortController, AbortSignal ---------------------------------------------------------
  const internal = Symbol("internal");
  var signalAbort;
  class AbortSignal extends EventTarget {
    #aborted = false;
    #reason = undefined;
    // For `AbortSignal.any`: the signals this one follows, and those that follow it.
    #sources = null;
    #dependents = [];
    constructor(key) {
      if (key !== internal) throw new TypeError("Illegal constructor");
      super();
      this.onabort = null;
    }
    get aborted() { return this.#aborted; }
    get reason() { return this.#reason; }
    throwIfAborted() { if (this.#aborted) throw this.#reason; }
    static abort(reason) {
      const signal = new AbortSignal(internal);
      signalAbort(signal, reason);
      return signal;
    }
    static timeout(ms) {
      const signal = new AbortSignal(internal);
      setTimeout(() => signalAbort(signal, new DOMException("The operation timed out.", "TimeoutError")), ms);
      return signal;
    }
    static any(signals) {
      const signal = new AbortSignal(internal);
      signal.#sources = [];
      for (const source of signals) {
        if (!(source instanceof AbortSignal)) throw new TypeError("AbortSignal.any takes AbortSignals");
        if (source.#aborted) {
          signal.#aborted = true;
          signal.#reason = source.#reason;
          return signal;
        }
      }
      // A composite signal follows the originating signals, never another composite.
      for (const source of signals) {
        for (const origin of source.#sources ?? [source]) {
          if (!signal.#sources.includes(origin)) {
            signal.#sources.push(origin);
            origin.#dependents.push(signal);
          }
        }
      }
      return signal;
    }
    static {
      // The DOM's "signal abort": every dependent is aborted before any event fires.
      signalAbort = (signal, reason) => {
        if (signal.#aborted) return;
        signal.#aborted = true;
        signal.#reason = reason === undefined ? new DOMException("This operation was aborted", "AbortError") : reason;
        const dependents = signal.#dependents.filter((dependent) => !dependent.#aborted);
        for (const dependent of dependents) {
          dependent.#aborted = true;
          dependent.#reason = signal.#reason;
        }
        signal.dispatchEvent(trustedEvent("abort"));
        for (const dependent of dependents) dependent.dispatchEvent(trustedEvent("abort"));
      };
    }
  }
  class AbortController {
    #signal = new AbortSignal(internal);
    get signal() { return this.#signal; }
    abort(reason) { signalAbort(this.#signal, reason); }
  }

  // --- Timers -------------------------------------------------------------------------------
  // They fire while the handler's promise is pending (the runtime sleeps until the next one);
  // the call's deadline bounds the wait. A timer still set when the promise settles never fires.
  const timers = new Map();
  let lastTimer = 0;
  const addTimer = (callback, ms, args, repeat) => {
    if (typeof callback !== "function") throw new TypeError("setTimeout and setInterval take a function");
    const delay = Math.max(0, Number(ms) || 0);
    const id = ++lastTimer;
    timers.set(id, { callback, args, due: native.now() + delay, every: repeat ? Math.max(delay, 1) : null });
    return id;
  };
  const clearTimer = (id) => void timers.delete(Number(id));
  const eventLoop = {
    // Milliseconds until the next timer is due, or null when none is set.
    next() {
      let due = Infinity;
      for (const timer of timers.values()) due = Math.min(due, timer.due);
      return due === Infinity ? null : Math.max(0, due - native.now());
    },
    // Runs every timer that is due, earliest first.
    fire() {
      const now = native.now();
      const due = [...timers].filter(([, t]) => t.due <= now).sort((a, b) => a[1].due - b[1].due || a[0] - b[0]);
      for (const [id, timer] of due) {
        if (!timers.has(id)) continue;
        if (timer.every === null) timers.delete(id);
        else timer.due = now + timer.every;
        try {
          timer.callback(...timer.args);
        } catch (error) {
          report(error);
        }
      }
    },
  };

  // --- Encoding -----------------------------------------------------------------------------
  const bytesOf = (data, what) => {
    if (data instanceof ArrayBuffer || (typeof SharedArrayBuffer === "function" && data instanceof SharedArrayBuffer)) {
      return new Uint8Array(data);
    }
    if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    throw new TypeError(`${what} must be an ArrayBuffer or a view of one`);
  };
  const copyOf = (data, what) => bytesOf(data, what).slice();
  const utf8Length = (codePoint) => (codePoint < 0x80 ? 1 : codePoint < 0x800 ? 2 : codePoint < 0x10000 ? 3 : 4);
  // Writes a well-formed string's UTF-8 into `out` from `at`, as far as whole characters fit.
  const writeUtf8 = (text, out, at) => {
    let read = 0;
    let written = at;
    for (const char of text) {
      const c = char.codePointAt(0);
      const n = utf8Length(c);
      if (written + n > out.length) break;
      if (n === 1) out[written] = c;
      else if (n === 2) out.set([0xc0 | (c >> 6), 0x80 | (c & 63)], written);
      else if (n === 3) out.set([0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63)], written);
      else out.set([0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63)], written);
      written += n;
      read += char.length;
    }
    return { read, written: written - at };
  };
  const encodeUtf8 = (text) => {
    text = String(text).toWellFormed();
    let length = 0;
    for (const char of text) length += utf8Length(char.codePointAt(0));
    const out = new Uint8Array(length);
    writeUtf8(text, out, 0);
    return out;
  };
  class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(input = "") { return encodeUtf8(input); }
    encodeInto(source, destination) {
      if (!(destination instanceof Uint8Array)) throw new TypeError("encodeInto writes into a Uint8Array");
      return writeUtf8(String(source).toWellFormed(), destination, 0);
    }
  }
  // The Encoding Standard's labels of the encodings decoded here: UTF-8 and UTF-16.
  const ENCODINGS = new Map([
    ...["unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8"].map((l) => [l, "utf-8"]),
    ...["csunicode", "iso-10646-ucs-2", "ucs-2", "unicode", "unicodefeff", "utf-16", "utf-16le"].map((l) => [l, "utf-16le"]),
    ...["unicodefffe", "utf-16be"].map((l) => [l, "utf-16be"]),
  ]);
  const BOMS = { "utf-8": [0xef, 0xbb, 0xbf], "utf-16le": [0xff, 0xfe], "utf-16be": [0xfe, 0xff] };
  // UTF-16 to a string: U+FFFD for each unpaired surrogate and a final odd byte, or null for
  // either when `fatal`.
  const decodeUtf16 = (bytes, bigEndian, fatal) => {
    const units = new Uint16Array(bytes.length >> 1);
    for (let i = 0; i < units.length; i++) {
      const [a, b] = [bytes[2 * i], bytes[2 * i + 1]];
      units[i] = bigEndian ? (a << 8) | b : a | (b << 8);
    }
    let text = "";
    for (let i = 0; i < units.length; i += 8192) text += String.fromCharCode(...units.subarray(i, i + 8192));
    if (fatal && (!text.isWellFormed() || bytes.length % 2)) return null;
    return text.toWellFormed() + (bytes.length % 2 ? "\uFFFD" : "");
  };
  // UTF-16 bytes at the end that the next chunk may complete: an odd byte, a lead surrogate.
  const incompleteUtf16 = (bytes, bigEndian) => {
    let keep = bytes.length % 2;
    const at = bytes.length - keep - 2;
    const unit = at < 0 ? 0 : bigEndian ? (bytes[at] << 8) | bytes[at + 1] : bytes[at] | (bytes[at + 1] << 8);
    if (unit >= 0xd800 && unit <= 0xdbff) keep += 2;
    return keep;
  };
  // How many bytes at the end of `bytes` start a character that the next chunk may complete
  // (a valid prefix of one, as the Encoding Standard's UTF-8 decoder accepts them).
  const incompleteTail = (bytes) => {
    for (let back = 1; back <= Math.min(3, bytes.length); back++) {
      const at = bytes.length - back;
      const lead = bytes[at];
      if ((lead & 0xc0) === 0x80) continue;
      const need = lead >= 0xf0 && lead <= 0xf4 ? 4 : lead >= 0xe0 && lead <= 0xef ? 3 : lead >= 0xc2 && lead <= 0xdf ? 2 : 1;
      if (need <= back) return 0;
      const [low, high] = lead === 0xe0 ? [0xa0, 0xbf] : lead === 0xed ? [0x80, 0x9f] : lead === 0xf0 ? [0x90, 0xbf] : lead === 0xf4 ? [0x80, 0x8f] : [0x80, 0xbf];
      if (back > 1 && (bytes[at + 1] < low || bytes[at + 1] > high)) return 0;
      return back;
    }
    return 0;
  };
  class TextDecoder {
    #encoding;
    #fatal;
    #ignoreBOM;
    #pending = new Uint8Array(0);
    // Whether the stream's first bytes (and so its BOM, if any) are behind us.
    #begun = false;
    constructor(label = "utf-8", options = {}) {
      this.#encoding = ENCODINGS.get(String(label).trim().toLowerCase());
      if (!this.#encoding) {
        throw new RangeError(`TextDecoder: the encoding "${label}" is not supported (UTF-8 and UTF-16 are)`);
      }
      this.#fatal = !!options?.fatal;
      this.#ignoreBOM = !!options?.ignoreBOM;
    }
    get encoding() { return this.#encoding; }
    get fatal() { return this.#fatal; }
    get ignoreBOM() { return this.#ignoreBOM; }
    decode(input, options = {}) {
      let bytes = input === undefined ? new Uint8Array(0) : bytesOf(input, "TextDecoder.decode's input");
      if (this.#pending.length) {
        const joined = new Uint8Array(this.#pending.length + bytes.length);
        joined.set(this.#pending);
        joined.set(bytes, this.#pending.length);
        bytes = joined;
      }
      const stream = !!options?.stream;
      const utf8 = this.#encoding === "utf-8";
      const bigEndian = this.#encoding === "utf-16be";
      const bom = BOMS[this.#encoding];
      if (!this.#begun && stream && bytes.length < bom.length && bytes.every((b, i) => bom[i] === b)) {
        // Too few bytes yet to tell whether they start with a BOM: wait for more.
        this.#pending = bytes.slice();
        return "";
      }
      // A character cut at the chunk's end waits for the next chunk.
      const keep = !stream ? 0 : utf8 ? incompleteTail(bytes) : incompleteUtf16(bytes, bigEndian);
      this.#pending = bytes.slice(bytes.length - keep);
      bytes = bytes.subarray(0, bytes.length - keep);
      if (!this.#begun && bytes.length) {
        this.#begun = true;
        if (!this.#ignoreBOM && bom.every((b, i) => bytes[i] === b)) bytes = bytes.subarray(bom.length);
      }
      if (!stream) this.#begun = false;
      const text = utf8 ? native.utf8Decode(bytes.slice(), this.#fatal) : decodeUtf16(bytes, bigEndian, this.#fatal);
      if (text === undefined || text === null) {
        this.#pending = new Uint8Array(0);
        this.#begun = false;
        throw new TypeError(`TextDecoder: the input is not valid ${this.#encoding}`);
      }
      return text;
    }
  }

  // --- Blob, File ---------------------------------------------------------------------------
  var blobBytes;
  class Blob {
    #bytes;
    #type;
    constructor(parts = [], options = {}) {
      if (typeof parts !== "object" || parts === null || typeof parts[Symbol.iterator] !== "function") {
        throw new TypeError("Blob takes a sequence of parts");
      }
      const chunks = [...parts].map((part) =>
        part instanceof Blob ? part.#bytes : part instanceof ArrayBuffer || ArrayBuffer.isView(part) ? copyOf(part, "a Blob part") : encodeUtf8(part));
      this.#bytes = new Uint8Array(chunks.reduce((n, chunk) => n + chunk.length, 0));
      chunks.reduce((at, chunk) => (this.#bytes.set(chunk, at), at + chunk.length), 0);
      const type = options?.type === undefined ? "" : String(options.type);
      this.#type = /^[\x20-\x7e]*$/.test(type) ? type.toLowerCase() : "";
    }
    get size() { return this.#bytes.length; }
    get type() { return this.#type; }
    slice(start = 0, end = this.size, type = "") {
      const at = (i) => (i < 0 ? Math.max(this.size + i, 0) : Math.min(i, this.size));
      return new Blob([this.#bytes.subarray(at(start), Math.max(at(start), at(end)))], { type });
    }
    async arrayBuffer() { return this.#bytes.slice().buffer; }
    async bytes() { return this.#bytes.slice(); }
    async text() { return new TextDecoder().decode(this.#bytes); }
    get [Symbol.toStringTag]() { return "Blob"; }
    static { blobBytes = (blob) => blob.#bytes; }
  }
  class File extends Blob {
    #name;
    #lastModified;
    constructor(parts, name, options = {}) {
      if (arguments.length < 2) throw new TypeError("File takes parts and a name");
      super(parts, options);
      this.#name = String(name);
      this.#lastModified = options?.lastModified === undefined ? Date.now() : Number(options.lastModified);
    }
    get name() { return this.#name; }
    get lastModified() { return this.#lastModified; }
    get [Symbol.toStringTag]() { return "File"; }
  }

  // --- URL, URLSearchParams -----------------------------------------------------------------
  const wellFormed = (value) => String(value).toWellFormed();
  var attachQuery, setSearchFromQuery;
  class URLSearchParams {
    #pairs = [];
    #url = null;
    constructor(init = "") {
      if ((init !== null && typeof init === "object") || typeof init === "function") {
        if (typeof init[Symbol.iterator] === "function") {
          for (const pair of init) {
            const items = [...pair];
            if (items.length !== 2) throw new TypeError("URLSearchParams: each pair needs a name and a value");
            this.#pairs.push([wellFormed(items[0]), wellFormed(items[1])]);
          }
        } else {
          // A record: keys that become equal as USVStrings keep the first place, last value.
          const record = new Map();
          for (const name of Reflect.ownKeys(init)) {
            const desc = Reflect.getOwnPropertyDescriptor(init, name);
            if (typeof name === "string" && desc?.enumerable) record.set(wellFormed(name), wellFormed(init[name]));
          }
          this.#pairs = [...record];
        }
      } else {
        let text = wellFormed(init);
        if (text.startsWith("?")) text = text.slice(1);
        this.#pairs = native.formParse(text);
      }
    }
    #update() {
      if (this.#url) setSearchFromQuery(this.#url, this.toString());
    }
    get size() { return this.#pairs.length; }
    append(name, value) {
      this.#pairs.push([wellFormed(name), wellFormed(value)]);
      this.#update();
    }
    delete(name, value) {
      name = wellFormed(name);
      value = value === undefined ? undefined : wellFormed(value);
      this.#pairs = this.#pairs.filter(([n, v]) => n !== name || (value !== undefined && v !== value));
      this.#update();
    }
    get(name) {
      name = wellFormed(name);
      return this.#pairs.find(([n]) => n === name)?.[1] ?? null;
    }
    getAll(name) {
      name = wellFormed(name);
      return this.#pairs.filter(([n]) => n === name).map(([, v]) => v);
    }
    has(name, value) {
      name = wellFormed(name);
      value = value === undefined ? undefined : wellFormed(value);
      return this.#pairs.some(([n, v]) => n === name && (value === undefined || v === value));
    }
    set(name, value) {
      name = wellFormed(name);
      value = wellFormed(value);
      const at = this.#pairs.findIndex(([n]) => n === name);
      if (at < 0) this.#pairs.push([name, value]);
      else this.#pairs = this.#pairs.filter(([n], i) => n !== name || i === at).map((pair, i) => (i === at ? [name, value] : pair));
      this.#update();
    }
    sort() {
      // Stable, by UTF-16 code units (JS's own string order).
      this.#pairs = this.#pairs.map((pair, i) => [pair, i]).sort(([a, i], [b, j]) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : i - j)).map(([pair]) => pair);
      this.#update();
    }
    forEach(callback, thisArg) {
      for (const [name, value] of this) callback.call(thisArg, value, name, this);
    }
    *entries() {
      for (let i = 0; i < this.#pairs.length; i++) yield [...this.#pairs[i]];
    }
    *keys() { for (const [name] of this.entries()) yield name; }
    *values() { for (const [, value] of this.entries()) yield value; }
    [Symbol.iterator]() { return this.entries(); }
    toString() { return native.formSerialize(this.#pairs); }
    get [Symbol.toStringTag]() { return "URLSearchParams"; }
    static {
      attachQuery = (params, url, search) => {
        params.#url = url;
        params.#pairs = native.formParse(search.replace(/^\?/, ""));
      };
    }
  }

  const PARTS = ["href", "origin", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"];
  class URL {
    #parts;
    #query = new URLSearchParams();
    constructor(url, base) {
      if (arguments.length === 0) throw new TypeError("URL needs a url");
      const parts = base === undefined ? native.urlParse(wellFormed(url)) : native.urlParse(wellFormed(url), wellFormed(base));
      if (!parts) throw new TypeError(`Invalid URL: ${url}${base === undefined ? "" : ` against ${base}`}`);
      this.#parts = parts;
      attachQuery(this.#query, this, this.search);
    }
    static canParse(url, base) {
      try {
        new URL(url, base);
        return true;
      } catch {
        return false;
      }
    }
    static parse(url, base) {
      try {
        return new URL(url, base);
      } catch {
        return null;
      }
    }
    #set(part, value) {
      const parts = native.urlSet(this.#parts[0], part, wellFormed(value));
      if (!parts) throw new TypeError(`Invalid URL: ${value}`);
      const searchChanged = parts[9] !== this.#parts[9];
      this.#parts = parts;
      if (part === "href" || part === "search" || searchChanged) attachQuery(this.#query, this, this.search);
    }
    get searchParams() { return this.#query; }
    toString() { return this.#parts[0]; }
    toJSON() { return this.#parts[0]; }
    get [Symbol.toStringTag]() { return "URL"; }
    static {
      // An empty query leaves no `?` behind.
      setSearchFromQuery = (url, query) => void (url.#parts = native.urlSet(url.#parts[0], "search", query));
      PARTS.forEach((part, i) => {
        const get = function () { return this.#parts[i]; };
        const set = part === "origin" ? undefined : function (value) { this.#set(part, value); };
        Object.defineProperty(URL.prototype, part, { get, set, configurable: true, enumerable: true });
      });
    }
  }

  // --- Headers ------------------------------------------------------------------------------
  const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
  const headerName = (name) => {
    name = String(name);
    if (!TOKEN.test(name)) throw new TypeError(`Invalid header name: "${name}"`);
    return name.toLowerCase();
  };
  const headerValue = (value) => {
    value = String(value).replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
    if (/[\0\r\n]/.test(value)) throw new TypeError("Invalid header value");
    return value;
  };
  class Headers {
    #list = [];
    constructor(init) {
      if (init == null) return;
      if (typeof init !== "object") throw new TypeError("Headers takes pairs or a record");
      if (typeof init[Symbol.iterator] === "function") {
        for (const pair of init) {
          const items = [...pair];
          if (items.length !== 2) throw new TypeError("Headers: each pair needs a name and a value");
          this.append(items[0], items[1]);
        }
      } else {
        for (const name of Object.keys(init)) this.append(name, init[name]);
      }
    }
    append(name, value) { this.#list.push([headerName(name), headerValue(value)]); }
    delete(name) {
      name = headerName(name);
      this.#list = this.#list.filter(([n]) => n !== name);
    }
    get(name) {
      name = headerName(name);
      const values = this.#list.filter(([n]) => n === name).map(([, v]) => v);
      return values.length ? values.join(", ") : null;
    }
    getSetCookie() { return this.#list.filter(([n]) => n === "set-cookie").map(([, v]) => v); }
    has(name) {
      name = headerName(name);
      return this.#list.some(([n]) => n === name);
    }
    set(name, value) {
      name = headerName(name);
      value = headerValue(value);
      const at = this.#list.findIndex(([n]) => n === name);
      if (at < 0) this.#list.push([name, value]);
      else this.#list = this.#list.filter(([n], i) => n !== name || i === at).map((pair, i) => (i === at ? [name, value] : pair));
    }
    forEach(callback, thisArg) {
      for (const [name, value] of this) callback.call(thisArg, value, name, this);
    }
    // Sorted and combined, except `set-cookie`, which stays one entry per value.
    *entries() {
      for (const name of [...new Set(this.#list.map(([n]) => n))].sort()) {
        if (name === "set-cookie") for (const value of this.getSetCookie()) yield [name, value];
        else yield [name, this.get(name)];
      }
    }
    *keys() { for (const [name] of this.entries()) yield name; }
    *values() { for (const [, value] of this.entries()) yield value; }
    [Symbol.iterator]() { return this.entries(); }
    get [Symbol.toStringTag]() { return "Headers"; }
  }

  // --- Body, Request, Response --------------------------------------------------------------
  // Bodies are read whole: there are no streams (`body` is not provided).
  const bodyOf = (init, headers) => {
    if (init == null) return null;
    const type = (value) => void (headers.has("content-type") || headers.set("content-type", value));
    if (init instanceof URLSearchParams) {
      type("application/x-www-form-urlencoded;charset=UTF-8");
      return encodeUtf8(init.toString());
    }
    if (init instanceof ArrayBuffer || ArrayBuffer.isView(init)) return copyOf(init, "body");
    if (init instanceof Blob) {
      if (init.type) type(init.type);
      return blobBytes(init).slice();
    }
    type("text/plain;charset=UTF-8");
    return encodeUtf8(String(init));
  };
  var bytesOfBody, setBodyBytes;
  class Body {
    #bytes;
    #used = false;
    constructor(bytes) { this.#bytes = bytes; }
    get bodyUsed() { return this.#used; }
    #take() {
      if (this.#used) return Promise.reject(new TypeError("Body has already been read"));
      this.#used = true;
      return Promise.resolve(this.#bytes ?? new Uint8Array(0));
    }
    async arrayBuffer() { return (await this.#take()).slice().buffer; }
    async bytes() { return (await this.#take()).slice(); }
    async text() { return new TextDecoder().decode(await this.#take()); }
    async json() { return JSON.parse(await this.text()); }
    async blob() { return new Blob([await this.#take()], { type: this.headers?.get("content-type") ?? "" }); }
    static {
      bytesOfBody = (body) => body.#bytes;
      setBodyBytes = (body, bytes) => void (body.#bytes = bytes);
    }
  }

  const METHODS = new Map(["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT"].map((m) => [m.toLowerCase(), m]));
  class Request extends Body {
    #url;
    #method;
    #headers;
    #signal;
    #redirect;
    constructor(input, init = {}) {
      const from = input instanceof Request ? input : null;
      const url = from ? from.url : new URL(String(input)).href;
      let method = String(init.method ?? from?.method ?? "GET");
      if (!TOKEN.test(method)) throw new TypeError(`Invalid method: ${method}`);
      method = METHODS.get(method.toLowerCase()) ?? method;
      if (["CONNECT", "TRACE", "TRACK"].includes(method.toUpperCase())) throw new TypeError(`Forbidden method: ${method}`);
      const headers = new Headers(init.headers ?? from?.headers);
      const given = init.body !== undefined ? init.body : null;
      if (given !== null && (method === "GET" || method === "HEAD")) throw new TypeError(`A ${method} request has no body`);
      super(init.body !== undefined ? bodyOf(given, headers) : from ? bytesOfBody(from) : null);
      this.#url = url;
      this.#method = method;
      this.#headers = headers;
      this.#signal = init.signal ?? from?.signal ?? new AbortController().signal;
      this.#redirect = String(init.redirect ?? from?.redirect ?? "follow");
    }
    get url() { return this.#url; }
    get method() { return this.#method; }
    get headers() { return this.#headers; }
    get signal() { return this.#signal; }
    get redirect() { return this.#redirect; }
    clone() {
      if (this.bodyUsed) throw new TypeError("Body has already been read");
      return new Request(this);
    }
    get [Symbol.toStringTag]() { return "Request"; }
  }

  const NULL_BODY = new Set([101, 103, 204, 205, 304]);
  var responseFrom;
  class Response extends Body {
    #status;
    #statusText;
    #headers;
    #url = "";
    #redirected = false;
    #type = "default";
    constructor(body = null, init = {}) {
      const status = init.status ?? 200;
      if (!Number.isInteger(status) || status < 200 || status > 599) throw new RangeError(`Invalid status: ${status}`);
      const headers = new Headers(init.headers);
      if (body !== null && NULL_BODY.has(status)) throw new TypeError(`A ${status} response has no body`);
      super(bodyOf(body, headers));
      this.#status = status;
      this.#statusText = String(init.statusText ?? "");
      this.#headers = headers;
    }
    get status() { return this.#status; }
    get ok() { return this.#status >= 200 && this.#status < 300; }
    get statusText() { return this.#statusText; }
    get headers() { return this.#headers; }
    get url() { return this.#url; }
    get redirected() { return this.#redirected; }
    get type() { return this.#type; }
    clone() {
      if (this.bodyUsed) throw new TypeError("Body has already been read");
      return responseFrom(this.#status, [...this.#headers], bytesOfBody(this), this.#url, this.#redirected, this.#type);
    }
    static json(data, init = {}) {
      const text = JSON.stringify(data);
      if (text === undefined) throw new TypeError("Response.json: the value has no JSON form");
      const headers = new Headers(init.headers);
      if (!headers.has("content-type")) headers.set("content-type", "application/json");
      return new Response(text, { ...init, headers });
    }
    static error() { return responseFrom(0, [], null, "", false, "error"); }
    static redirect(url, status = 302) {
      if (![301, 302, 303, 307, 308].includes(status)) throw new RangeError(`Invalid redirect status: ${status}`);
      return responseFrom(status, [["location", new URL(url).href]], null, "", false, "default");
    }
    get [Symbol.toStringTag]() { return "Response"; }
    static {
      responseFrom = (status, headers, bytes, url, redirected, type) => {
        const response = new Response(null, { headers });
        setBodyBytes(response, bytes);
        response.#status = status;
        response.#url = url;
        response.#redirected = redirected;
        response.#type = type;
        return response;
      };
    }
  }

  // Headers the host sets itself, or that concern only one connection.
  const HOP_BY_HOP = new Set(["connection", "content-length", "host", "http2-settings", "keep-alive", "proxy-connection", "te", "transfer-encoding", "upgrade"]);
  async function fetch(input, init) {
    const request = new Request(input, init);
    const signal = request.signal;
    let url = request.url;
    let method = request.method;
    let body = bytesOfBody(request);
    let headers = [...request.headers].filter(([name]) => !HOP_BY_HOP.has(name));
    for (let redirects = 0; ; redirects++) {
      signal.throwIfAborted();
      if (!/^https?:$/.test(new URL(url).protocol)) throw new TypeError(`fetch ${url}: only http: and https: URLs`);
      const [status, responseHeaders, bytes] = native.fetch(method, url, headers, body);
      await null;
      signal.throwIfAborted();
      const location = responseHeaders.find(([name]) => name.toLowerCase() === "location")?.[1];
      if ([301, 302, 303, 307, 308].includes(status) && location !== undefined && request.redirect !== "manual") {
        if (request.redirect === "error") throw new TypeError(`fetch ${url}: redirected, and redirect is "error"`);
        if (redirects === 20) throw new TypeError(`fetch ${url}: more than 20 redirects`);
        if ((status === 303 && method !== "HEAD") || ((status === 301 || status === 302) && method === "POST")) {
          method = "GET";
          body = null;
          headers = headers.filter(([name]) => !name.startsWith("content-"));
        }
        url = new URL(location, url).href;
        continue;
      }
      return responseFrom(status, responseHeaders, NULL_BODY.has(status) || method === "HEAD" ? null : bytes, url, redirects > 0, "basic");
    }
  }

  // --- structuredClone ----------------------------------------------------------------------
  const cloneError = (what) => new DOMException(`${what} could not be cloned.`, "DataCloneError");
  const ERRORS = { Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError };
  function structuredClone(value, options = {}) {
    const seen = new Map();
    for (const buffer of options?.transfer ?? []) {
      if (!(buffer instanceof ArrayBuffer)) throw cloneError("A transfer list entry that is not an ArrayBuffer");
      if (seen.has(buffer)) throw cloneError("An ArrayBuffer listed twice");
      seen.set(buffer, null);
    }
    const transfers = [...seen.keys()];
    const clone = (v) => {
      if (typeof v === "symbol") throw cloneError(String(v));
      if (typeof v === "function") throw cloneError(`function ${v.name}`);
      if (v === null || typeof v !== "object") return v;
      if (seen.has(v) && seen.get(v) !== null) return seen.get(v);
      const tag = Object.prototype.toString.call(v).slice(8, -1);
      let out;
      const keep = (copy) => (seen.set(v, copy), copy);
      switch (tag) {
        case "Boolean": case "Number": case "String": case "BigInt":
          return keep(Object(v.valueOf()));
        case "Date":
          return keep(new Date(v.getTime()));
        case "RegExp":
          return keep(new RegExp(v.source, v.flags));
        case "Blob":
          return keep(new Blob([v], { type: v.type }));
        case "File":
          return keep(new File([v], v.name, { type: v.type, lastModified: v.lastModified }));
        case "ArrayBuffer":
          return keep(seen.get(v) === null ? v.transfer() : v.slice(0));
        case "DataView":
          return keep(new DataView(clone(v.buffer), v.byteOffset, v.byteLength));
        case "Map":
          out = keep(new Map());
          for (const [key, val] of v) out.set(clone(key), clone(val));
          return out;
        case "Set":
          out = keep(new Set());
          for (const item of v) out.add(clone(item));
          return out;
        case "Error": {
          const Ctor = ERRORS[v.name] ?? Error;
          out = keep(Object.create(Ctor.prototype));
          for (const key of ["message", "stack", "cause"]) {
            if (Object.hasOwn(v, key)) Object.defineProperty(out, key, { value: key === "cause" ? clone(v[key]) : String(v[key]), writable: true, configurable: true });
          }
          return out;
        }
        case "Array":
          out = keep(new Array(v.length));
          break;
        case "Object":
          out = keep({});
          break;
        default:
          if (ArrayBuffer.isView(v)) return keep(new v.constructor(clone(v.buffer), v.byteOffset, v.length));
          if (v instanceof DOMException) {
            return keep(new DOMException(v.message, v.name));
          }
          throw cloneError(`${tag} object`);
      }
      for (const key of Object.keys(v)) out[key] = clone(v[key]);
      return out;
    };
    const result = clone(value);
    for (const buffer of transfers) if (!buffer.detached) buffer.transfer();
    return result;
  }

  // --- crypto -------------------------------------------------------------------------------
  const INTEGER_ARRAYS = ["Int8Array", "Uint8Array", "Uint8ClampedArray", "Int16Array", "Uint16Array", "Int32Array", "Uint32Array", "BigInt64Array", "BigUint64Array"];
  const DIGESTS = new Map(["SHA-1", "SHA-256", "SHA-384", "SHA-512"].map((name) => [name.toLowerCase(), name]));
  class SubtleCrypto {
    constructor(key) { if (key !== internal) throw new TypeError("Illegal constructor"); }
    async digest(algorithm, data) {
      const name = typeof algorithm === "string" ? algorithm : algorithm?.name;
      const known = DIGESTS.get(String(name).toLowerCase());
      if (!known) throw new DOMException(`Unrecognized digest: ${name} (SHA-1, SHA-256, SHA-384 and SHA-512 are)`, "NotSupportedError");
      return native.digest(known, copyOf(data, "digest's data")).buffer;
    }
  }
  class Crypto {
    #subtle = new SubtleCrypto(internal);
    constructor(key) { if (key !== internal) throw new TypeError("Illegal constructor"); }
    get subtle() { return this.#subtle; }
    getRandomValues(array) {
      const tag = Object.prototype.toString.call(array).slice(8, -1);
      if (!ArrayBuffer.isView(array) || !INTEGER_ARRAYS.includes(tag)) {
        throw new DOMException("getRandomValues takes an integer typed array", "TypeMismatchError");
      }
      if (array.byteLength > 65536) throw new DOMException("getRandomValues fills at most 65536 bytes", "QuotaExceededError");
      new Uint8Array(array.buffer, array.byteOffset, array.byteLength).set(native.randomBytes(array.byteLength));
      return array;
    }
    randomUUID() {
      const b = native.randomBytes(16);
      b[6] = (b[6] & 0x0f) | 0x40;
      b[8] = (b[8] & 0x3f) | 0x80;
      const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
      return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
    }
  }

  // --- Install ------------------------------------------------------------------------------
  define(g, {
    DOMException, Event, EventTarget, AbortController, AbortSignal, TextEncoder, TextDecoder, Blob, File,
    URL, URLSearchParams, Headers, Request, Response, fetch, structuredClone,
    Crypto, SubtleCrypto, crypto: new Crypto(internal),
    setTimeout: (callback, ms, ...args) => addTimer(callback, ms, args, false),
    setInterval: (callback, ms, ...args) => addTimer(callback, ms, args, true),
    clearTimeout: clearTimer,
    clearInterval: clearTimer,
  });
  return eventLoop;
});
