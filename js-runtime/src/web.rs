//! The web platform's minimum common API (WinterTC) for tools: the JS classes are in
//! `web.js`; what needs the outside world or a well-kept implementation is here, behind them.
//! `fetch` goes out through `wasi:http`, so the host applies the tool's network grant, its
//! egress rules and the call's deadline; URLs are the `url` crate's (WHATWG); digests are
//! RustCrypto's; clocks and randomness are WASI's.

use std::sync::atomic::{AtomicU64, Ordering};

use rquickjs::function::{Func, Opt};
use rquickjs::{Array, Ctx, Exception, Function, Object, Result, TypedArray};
use url::{Url, quirks};
use wasip2::clocks::{monotonic_clock, wall_clock};
use wasip2::random::{insecure, random};

/// `performance.now()` counts from here: the start of the current call.
static CALL_START_NS: AtomicU64 = AtomicU64::new(0);
/// `performance.timeOrigin`: the wall clock at the start of the current call, in ms.
static TIME_ORIGIN_MS: AtomicU64 = AtomicU64::new(0);

/// Marks the start of a call (also of one that begins from a snapshot).
pub fn begin_call() {
    CALL_START_NS.store(monotonic_clock::now(), Ordering::Relaxed);
    let wall = wall_clock::now();
    let ms = wall.seconds * 1000 + u64::from(wall.nanoseconds) / 1_000_000;
    TIME_ORIGIN_MS.store(ms, Ordering::Relaxed);
}

/// Blocks the guest until `ms` from now; the host's deadline still ends the call.
pub fn sleep_ms(ms: f64) {
    if ms > 0.0 {
        monotonic_clock::subscribe_duration((ms * 1e6) as u64).block();
    }
}

/// Installs the globals (the web platform itself on first use); returns the event loop's
/// `{load, next, fire}` hooks.
pub fn install<'js>(ctx: &Ctx<'js>) -> Result<Object<'js>> {
    let native = Object::new(ctx.clone())?;
    native.set("now", Func::from(now))?;
    native.set(
        "timeOrigin",
        Func::from(|| TIME_ORIGIN_MS.load(Ordering::Relaxed) as f64),
    )?;
    native.set("random", Func::from(insecure_random))?;
    native.set("randomBytes", Func::from(random_bytes))?;
    native.set("digest", Func::from(digest))?;
    native.set("utf8Decode", Func::from(utf8_decode))?;
    native.set("urlParse", Func::from(url_parse))?;
    native.set("urlSet", Func::from(url_set))?;
    native.set("formParse", Func::from(form_parse))?;
    native.set("formSerialize", Func::from(form_serialize))?;
    native.set("fetch", Func::from(fetch))?;
    native.set(
        "loadWeb",
        Func::from(|ctx: Ctx<'js>| ctx.eval::<Function, _>(include_str!("web.js"))),
    )?;
    let bootstrap: Function = ctx.eval(include_str!("bootstrap.js"))?;
    bootstrap.call((native,))
}

/// A copy of a `Uint8Array`'s bytes (none if its buffer is detached).
fn bytes(array: &TypedArray<'_, u8>) -> Vec<u8> {
    // SAFETY: no JavaScript runs while the slice is copied.
    unsafe { array.as_bytes() }.unwrap_or_default().to_vec()
}

/// Milliseconds since the call began, with microsecond resolution.
fn now() -> f64 {
    let elapsed = monotonic_clock::now().saturating_sub(CALL_START_NS.load(Ordering::Relaxed));
    (elapsed / 1_000) as f64 / 1_000.0
}

/// `Math.random()`: fresh per call, since a snapshot would otherwise replay one sequence.
fn insecure_random() -> f64 {
    (insecure::get_insecure_random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn random_bytes<'js>(ctx: Ctx<'js>, len: u32) -> Result<TypedArray<'js, u8>> {
    TypedArray::new(ctx, random::get_random_bytes(u64::from(len)))
}

fn digest<'js>(
    ctx: Ctx<'js>,
    algorithm: String,
    data: TypedArray<'js, u8>,
) -> Result<TypedArray<'js, u8>> {
    use sha2::Digest;
    let data = &bytes(&data);
    let hash = match algorithm.as_str() {
        "SHA-1" => sha1::Sha1::digest(data).to_vec(),
        "SHA-256" => sha2::Sha256::digest(data).to_vec(),
        "SHA-384" => sha2::Sha384::digest(data).to_vec(),
        "SHA-512" => sha2::Sha512::digest(data).to_vec(),
        other => return Err(Exception::throw_type(&ctx, &format!("no digest {other}"))),
    };
    TypedArray::new(ctx, hash)
}

/// UTF-8 to a string, with U+FFFD for each maximal bad subpart (as the Encoding Standard),
/// or `None` for bad input when `fatal`.
fn utf8_decode(data: TypedArray<'_, u8>, fatal: bool) -> Option<String> {
    let data = &bytes(&data);
    if fatal {
        std::str::from_utf8(data).ok().map(str::to_owned)
    } else {
        Some(String::from_utf8_lossy(data).into_owned())
    }
}

/// The WHATWG URL's parts, as `URL`'s getters return them, in the order `web.js` reads.
fn parts(url: &Url) -> Vec<String> {
    [
        quirks::href(url),
        &origin(url),
        quirks::protocol(url),
        quirks::username(url),
        quirks::password(url),
        quirks::host(url),
        quirks::hostname(url),
        quirks::port(url),
        quirks::pathname(url),
        quirks::search(url),
        quirks::hash(url),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The URL Standard's origin. A `blob:` URL has its inner URL's origin only when that is
/// http(s) (the `url` crate gives any inner URL's).
fn origin(url: &Url) -> String {
    if url.scheme() == "blob" {
        let inner = Url::parse(url.path());
        if !inner.is_ok_and(|inner| matches!(inner.scheme(), "http" | "https")) {
            return "null".into();
        }
    }
    quirks::origin(url)
}

/// `input` parsed against `base`, or `None` where `new URL` throws.
fn url_parse(input: String, base: Opt<String>) -> Option<Vec<String>> {
    let url = match base.0 {
        Some(base) => Url::parse(&base).ok()?.join(&input).ok()?,
        None => Url::parse(&input).ok()?,
    };
    Some(parts(&url))
}

/// `href` with one part set as `URL`'s setter does (a value it refuses changes nothing), or
/// `None` for an `href` that does not parse, which only setting `href` itself reports.
fn url_set(href: String, part: String, value: String) -> Option<Vec<String>> {
    let mut url = Url::parse(&href).ok()?;
    match part.as_str() {
        "href" => quirks::set_href(&mut url, &value).ok()?,
        "protocol" => drop(quirks::set_protocol(&mut url, &value)),
        "username" => drop(quirks::set_username(&mut url, &value)),
        "password" => drop(quirks::set_password(&mut url, &value)),
        "host" => drop(quirks::set_host(&mut url, &value)),
        "hostname" => drop(quirks::set_hostname(&mut url, &value)),
        "port" => drop(quirks::set_port(&mut url, &value)),
        "pathname" => quirks::set_pathname(&mut url, &value),
        "search" => quirks::set_search(&mut url, &value),
        "hash" => quirks::set_hash(&mut url, &value),
        _ => {}
    }
    Some(parts(&url))
}

/// `application/x-www-form-urlencoded` to name/value pairs.
fn form_parse(input: String) -> Vec<Vec<String>> {
    url::form_urlencoded::parse(input.as_bytes())
        .map(|(name, value)| vec![name.into_owned(), value.into_owned()])
        .collect()
}

fn form_serialize(pairs: Vec<Vec<String>>) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for pair in &pairs {
        if let [name, value] = pair.as_slice() {
            out.append_pair(name, value);
        }
    }
    out.finish()
}

/// One request and its whole response as `[status, [[name, value]…], body]`; a refusal or a
/// network error is a `TypeError` naming the URL and the reason, as `fetch` rejects with.
fn fetch<'js>(
    ctx: Ctx<'js>,
    method: String,
    url: String,
    headers: Vec<Vec<String>>,
    body: Opt<Option<TypedArray<'js, u8>>>,
) -> Result<Array<'js>> {
    let headers: Vec<(String, Vec<u8>)> = headers
        .into_iter()
        .filter_map(|pair| match <[String; 2]>::try_from(pair) {
            Ok([name, value]) => Some((name, value.into_bytes())),
            Err(_) => None,
        })
        .collect();
    let body = body.0.flatten().map(|body| bytes(&body));
    let response = toolhost_guest_http::send(&method, &url, &headers, body.as_deref())
        .map_err(|message| Exception::throw_type(&ctx, &format!("fetch {message}")))?;
    let out = Array::new(ctx.clone())?;
    out.set(0, response.status)?;
    let headers = Array::new(ctx.clone())?;
    for (i, (name, value)) in response.headers.into_iter().enumerate() {
        let value = String::from_utf8_lossy(&value).into_owned();
        headers.set(i, vec![name, value])?;
    }
    out.set(1, headers)?;
    out.set(2, TypedArray::new(ctx, response.body)?)?;
    Ok(out)
}
