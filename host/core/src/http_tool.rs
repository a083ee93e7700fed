//! Tools with no code: a spec plus one HTTP request whose parts are filled from the validated
//! arguments with `{{param}}`, and from the tenant's secrets with `{{secret.NAME}}`.
//!
//! Every value is escaped for where it lands: a path segment, a query value, a header or a
//! JSON body. Templates may not touch the scheme, host or port, and a value that would add a
//! header line is refused, so arguments cannot redirect the request.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use toolhost_sandbox::egress::{ConnectError, EgressConfig, EgressError};
use toolhost_sandbox::helpers::Helpers;
use toolhost_sandbox::places::Places;
use toolhost_spec::call::ToolError;
use toolhost_spec::spec::{SpecError, ToolSpec, is_valid_config_key};

/// What a tenant submits: the tool as agents see it, and the request a call makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolDef {
    /// The tool as agents see it.
    pub spec: ToolSpec,
    /// The request each call makes.
    pub request: HttpRequestDef,
}

/// The request a call makes; `{{param}}` and `{{secret.KEY}}` templates are filled per call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestDef {
    /// The HTTP method.
    pub method: Method,
    /// `http(s)://host[:port]/path`; templates only in the path.
    pub url: String,
    /// Query parameters, appended to the URL's own. An entry that is exactly one `{{param}}`
    /// whose argument is absent is left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    /// Header values may hold templates; names may not. An entry that is exactly one
    /// `{{param}}` whose argument is absent is left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A JSON body. A string that is exactly `{{param}}` becomes the argument's JSON value
    /// (and its key is left out when the argument is absent); other templates in strings are
    /// filled as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Send the request through this proxy.
    pub proxy: Option<ProxyDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Retry failed attempts (default: one attempt).
    pub retry: Option<RetryPolicy>,
    /// A response body past this many bytes fails the call.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
}

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// `GET`
    Get,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `PATCH`
    Patch,
    /// `DELETE`
    Delete,
}

/// An HTTP proxy (`http://host:port`), with headers sent to the proxy only, such as
/// `Proxy-Authorization: Basic {{secret.PROXY_AUTH}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyDef {
    /// `http://host:port`.
    pub url: String,
    /// Headers for the proxy (templates allowed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// Attempts on connection errors, 5xx and 429. The n-th retry waits
/// `initial_delay_ms * exponential_factor^(n-1)`, or what `Retry-After` asks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included ([`MAX_ATTEMPTS`] at most).
    pub max_attempts: u32,
    /// The wait before the first retry ([`MAX_INITIAL_DELAY_MS`] at most).
    pub initial_delay_ms: u64,
    /// Each wait is the last times this ([`MAX_EXPONENTIAL_FACTOR`] at most).
    pub exponential_factor: f64,
}

/// The most attempts a retry policy may ask for.
pub const MAX_ATTEMPTS: u32 = 10;
/// The longest first wait, in milliseconds.
pub const MAX_INITIAL_DELAY_MS: u64 = 60_000;
/// The largest growth factor of the wait.
pub const MAX_EXPONENTIAL_FACTOR: f64 = 10.0;
/// The largest `max_response_bytes`.
pub const MAX_RESPONSE_BYTES: u64 = 16 << 20;
const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1 << 20;
/// Error messages quote at most this much of a failed response.
const ERROR_BODY_CHARS: usize = 500;

fn default_max_response_bytes() -> u64 {
    DEFAULT_MAX_RESPONSE_BYTES
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Param(String),
    Secret(String),
}

fn parse_template(text: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            parts.push(Part::Text(rest[..open].to_owned()));
        }
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("`{{{{` without `}}}}` in `{text}`"))?;
        let name = after[..close].trim();
        parts.push(match name.strip_prefix("secret.") {
            Some(key) if is_valid_config_key(key) => Part::Secret(key.to_owned()),
            Some(key) => return Err(format!("`{key}` is not a valid secret name")),
            None if toolhost_spec::spec::is_valid_name(name) => Part::Param(name.to_owned()),
            None => return Err(format!("`{{{{{name}}}}}` is not a parameter name")),
        });
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.to_owned()));
    }
    Ok(parts)
}

/// The single parameter a template consists of, if that is all it is.
fn lone_param(parts: &[Part]) -> Option<&str> {
    match parts {
        [Part::Param(name)] => Some(name),
        _ => None,
    }
}

impl HttpToolDef {
    /// Checks the spec and the request, and returns the spec with the secrets the request
    /// uses added to its `config` keys.
    pub fn validate(&self) -> Result<ToolSpec, SpecError> {
        self.spec.validate()?;
        let name = &self.spec.name;
        let fail = |field: &str, rule: String| SpecError::new(name, field, rule);
        let request = &self.request;
        let declared: Vec<&String> = self
            .spec
            .parameters
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().collect())
            .unwrap_or_default();
        let mut secrets = Vec::new();
        let mut check = |field: &str, text: &str| -> Result<(), SpecError> {
            for part in parse_template(text).map_err(|rule| fail(field, rule))? {
                match part {
                    Part::Param(p) if !declared.contains(&&p) => {
                        return Err(fail(
                            field,
                            format!("`{{{{{p}}}}}` is not a property of the parameters schema"),
                        ));
                    }
                    Part::Secret(key) if !secrets.contains(&key) => secrets.push(key),
                    _ => {}
                }
            }
            Ok(())
        };

        let (origin, path) = split_url(&request.url).map_err(|rule| fail("request.url", rule))?;
        if origin.contains("{{") {
            return Err(fail(
                "request.url",
                "templates may not change the scheme, host or port".into(),
            ));
        }
        if path.contains(['?', '#']) {
            return Err(fail(
                "request.url",
                "put query parameters in request.query; fragments are not sent".into(),
            ));
        }
        check("request.url", path)?;
        for (key, value) in &request.query {
            if key.contains("{{") {
                return Err(fail("request.query", "names may not be templates".into()));
            }
            check("request.query", value)?;
        }
        check_headers("request.headers", &request.headers, &mut check, &fail)?;
        if let Some(body) = &request.body {
            let mut strings = Vec::new();
            collect_strings(body, &mut strings);
            for s in strings {
                check("request.body", s)?;
            }
            if request.method == Method::Get {
                return Err(fail("request.body", "a GET request has no body".into()));
            }
        }
        if let Some(proxy) = &request.proxy {
            let (origin, path) =
                split_url(&proxy.url).map_err(|rule| fail("request.proxy.url", rule))?;
            if !origin.starts_with("http://") || !matches!(path, "" | "/") || origin.contains("{{")
            {
                return Err(fail(
                    "request.proxy.url",
                    "must be http://host:port, without templates".into(),
                ));
            }
            check_headers("request.proxy.headers", &proxy.headers, &mut check, &fail)?;
        }
        if let Some(retry) = &request.retry {
            if !(1..=MAX_ATTEMPTS).contains(&retry.max_attempts) {
                let rule = format!("must be 1 to {MAX_ATTEMPTS}, got {}", retry.max_attempts);
                return Err(fail("request.retry.max_attempts", rule));
            }
            if !(1..=MAX_INITIAL_DELAY_MS).contains(&retry.initial_delay_ms) {
                let rule = format!(
                    "must be 1 to {MAX_INITIAL_DELAY_MS}, got {}",
                    retry.initial_delay_ms
                );
                return Err(fail("request.retry.initial_delay_ms", rule));
            }
            if !(1.0..=MAX_EXPONENTIAL_FACTOR).contains(&retry.exponential_factor) {
                let rule = format!(
                    "must be 1 to {MAX_EXPONENTIAL_FACTOR}, got {}",
                    retry.exponential_factor
                );
                return Err(fail("request.retry.exponential_factor", rule));
            }
        }
        if !(1..=MAX_RESPONSE_BYTES).contains(&request.max_response_bytes) {
            let rule = format!(
                "must be 1 to {MAX_RESPONSE_BYTES}, got {}",
                request.max_response_bytes
            );
            return Err(fail("request.max_response_bytes", rule));
        }
        let mut spec = self.spec.clone();
        for key in secrets {
            if !spec.config.contains(&key) {
                spec.config.push(key);
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

fn check_headers(
    field: &str,
    headers: &BTreeMap<String, String>,
    check: &mut impl FnMut(&str, &str) -> Result<(), SpecError>,
    fail: &impl Fn(&str, String) -> SpecError,
) -> Result<(), SpecError> {
    for (key, value) in headers {
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            return Err(fail(field, format!("`{key}` is not a header name")));
        };
        if SET_BY_THE_HOST.contains(&name.as_str()) {
            return Err(fail(
                field,
                format!("header `{key}` is set from the URL and the body, not by a definition"),
            ));
        }
        if HeaderValue::from_bytes(value.as_bytes()).is_err() {
            return Err(fail(
                field,
                format!("header `{key}` has a line break or control character"),
            ));
        }
        check(field, value)?;
    }
    Ok(())
}

/// Headers the request's URL, body and connection decide: one a definition set would be sent
/// twice (`Host`) or cut the body short (`Content-Length`).
const SET_BY_THE_HOST: [&str; 8] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
];

fn collect_strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

/// `("https://host:port", "/path")`, checking the scheme and that there is a host.
fn split_url(url: &str) -> Result<(&str, &str), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with http:// or https://")?;
    let origin_len = url.len() - rest.len() + rest.find('/').unwrap_or(rest.len());
    let (origin, path) = url.split_at(origin_len);
    if origin.len() == url.len() - rest.len() {
        return Err("has no host".into());
    }
    if origin.contains('@') {
        return Err("may not hold credentials; use a header with a secret".into());
    }
    // Checked whole here, so that a port or host that cannot be is refused at install rather
    // than at every call (templates are not allowed in the origin).
    if !origin.contains("{{") {
        url::Url::parse(origin).map_err(|e| format!("is not a valid URL: {e}"))?;
    }
    Ok((origin, path))
}

/// A request ready to send.
#[derive(Debug)]
struct Rendered {
    method: Method,
    url: url::Url,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<Vec<u8>>,
    proxy: Option<(url::Url, Vec<(HeaderName, HeaderValue)>)>,
}

/// Fills templates from `args` and secrets, each escaped for where it lands.
struct Filler<'a> {
    args: &'a Value,
    /// The secrets the templates name, read before filling (a store read is async).
    secrets: &'a HashMap<String, String>,
}

/// Every template string of a request: the URL, query values, headers, body and proxy
/// headers.
fn templates(def: &HttpRequestDef) -> Vec<&str> {
    let mut texts = vec![def.url.as_str()];
    texts.extend(def.query.values().map(String::as_str));
    texts.extend(def.headers.values().map(String::as_str));
    if let Some(body) = &def.body {
        collect_strings(body, &mut texts);
    }
    if let Some(proxy) = &def.proxy {
        texts.extend(proxy.headers.values().map(String::as_str));
    }
    texts
}

/// The secrets `def`'s templates name, read through the call's helpers (which redact them
/// from everything the call reports).
async fn read_secrets(
    def: &HttpRequestDef,
    helpers: &Helpers,
) -> Result<HashMap<String, String>, ToolError> {
    let mut secrets = HashMap::new();
    for text in templates(def) {
        for part in parse_template(text).map_err(ToolError::failed)? {
            let Part::Secret(key) = part else { continue };
            if secrets.contains_key(&key) {
                continue;
            }
            let secret = helpers
                .config_get(&key)
                .await
                .map_err(|e| ToolError::failed(format!("secret `{key}`: {e}")))?
                .ok_or_else(|| {
                    ToolError::failed(format!(
                        "secret `{key}` is not set in this tenant's configuration"
                    ))
                })?;
            secrets.insert(key, secret);
        }
    }
    Ok(secrets)
}

impl Filler<'_> {
    /// `None` when the argument is absent.
    fn arg(&self, name: &str) -> Option<&Value> {
        self.args.get(name).filter(|v| !v.is_null())
    }

    fn text(&self, parts: &[Part], escape: impl Fn(&str) -> String) -> Result<String, ToolError> {
        let mut out = String::new();
        for part in parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Param(name) => out.push_str(&escape(&as_text(self.arg(name)))),
                Part::Secret(key) => {
                    let secret = self
                        .secrets
                        .get(key)
                        .ok_or_else(|| ToolError::failed(format!("secret `{key}` was not read")))?;
                    out.push_str(&escape(secret));
                }
            }
        }
        Ok(out)
    }

    fn headers(
        &self,
        headers: &BTreeMap<String, String>,
    ) -> Result<Vec<(HeaderName, HeaderValue)>, ToolError> {
        let mut out = Vec::new();
        for (key, template) in headers {
            let parts = parse_template(template).map_err(ToolError::failed)?;
            if lone_param(&parts).is_some_and(|p| self.arg(p).is_none()) {
                continue;
            }
            let value = self.text(&parts, str::to_owned)?;
            let invalid = || {
                ToolError::invalid_args(format!(
                    "the value for header `{key}` has a line break or control character"
                ))
            };
            if value.contains(['\r', '\n', '\0']) {
                return Err(invalid());
            }
            let name = HeaderName::from_bytes(key.as_bytes()).map_err(ToolError::failed)?;
            out.push((name, HeaderValue::from_str(&value).map_err(|_| invalid())?));
        }
        Ok(out)
    }

    fn body(&self, template: &Value) -> Result<Option<Value>, ToolError> {
        Ok(match template {
            Value::String(s) => {
                let parts = parse_template(s).map_err(ToolError::failed)?;
                match lone_param(&parts) {
                    Some(name) => self.arg(name).cloned(),
                    None => Some(Value::String(self.text(&parts, str::to_owned)?)),
                }
            }
            Value::Array(items) => Some(Value::Array(
                items
                    .iter()
                    .map(|v| Ok(self.body(v)?.unwrap_or(Value::Null)))
                    .collect::<Result<_, ToolError>>()?,
            )),
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, value) in map {
                    if let Some(value) = self.body(value)? {
                        out.insert(key.clone(), value);
                    }
                }
                Some(Value::Object(out))
            }
            other => Some(other.clone()),
        })
    }

    fn render(&self, def: &HttpRequestDef) -> Result<Rendered, ToolError> {
        let (origin, path) = split_url(&def.url).map_err(ToolError::failed)?;
        if origin.contains("{{") {
            return Err(ToolError::failed("request.url: templates in the host"));
        }
        let path_parts = parse_template(path).map_err(ToolError::failed)?;
        for part in &path_parts {
            if let Part::Param(name) = part {
                match self.arg(name).map(|v| as_text(Some(v))) {
                    None => {
                        return Err(ToolError::invalid_args(format!(
                            "`{name}` is needed for the URL path"
                        )));
                    }
                    Some(v) if v.is_empty() || v == "." || v == ".." => {
                        return Err(ToolError::invalid_args(format!(
                            "`{name}` may not be empty, `.` or `..`: it is a path segment"
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        let path = self.text(&path_parts, |v| {
            percent_encoding::utf8_percent_encode(v, PATH_SEGMENT).to_string()
        })?;
        let mut url = url::Url::parse(&format!("{origin}{path}"))
            .map_err(|e| ToolError::failed(format!("request.url: {e}")))?;
        // The parsed origin must still be the declared one: nothing above may move it.
        if url.origin() != url::Url::parse(origin).map_err(ToolError::failed)?.origin() {
            return Err(ToolError::invalid_args(
                "the arguments would change the host",
            ));
        }
        let mut pairs = Vec::new();
        for (key, template) in &def.query {
            let parts = parse_template(template).map_err(ToolError::failed)?;
            if lone_param(&parts).is_some_and(|p| self.arg(p).is_none()) {
                continue;
            }
            pairs.push((key, self.text(&parts, str::to_owned)?));
        }
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        let body = match &def.body {
            Some(template) => {
                let value = self.body(template)?.unwrap_or(Value::Null);
                Some(serde_json::to_vec(&value).map_err(ToolError::failed)?)
            }
            None => None,
        };
        let proxy = match &def.proxy {
            Some(proxy) => Some((
                url::Url::parse(&proxy.url).map_err(ToolError::failed)?,
                self.headers(&proxy.headers)?,
            )),
            None => None,
        };
        Ok(Rendered {
            method: def.method,
            url,
            headers: self.headers(&def.headers)?,
            body,
            proxy,
        })
    }
}

/// Everything but the unreserved characters of RFC 3986, so a value stays one segment.
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn as_text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Why one attempt failed.
enum AttemptError {
    /// Worth another attempt: the connection failed or broke.
    Connection(String),
    /// Not worth one: refused by egress, a response too large, and the like.
    Fatal(ToolError),
}

struct Response {
    status: StatusCode,
    content_type: String,
    retry_after: Option<Duration>,
    body: Bytes,
}

/// Runs the request with its retries, within `deadline`.
pub(crate) async fn call(
    def: &HttpRequestDef,
    args: &Value,
    helpers: &Helpers,
    egress: &EgressConfig,
    deadline: Instant,
) -> Result<Value, ToolError> {
    let secrets = read_secrets(def, helpers).await?;
    let rendered = Filler {
        args,
        secrets: &secrets,
    }
    .render(def)?;
    let retry = def.retry.unwrap_or(RetryPolicy {
        max_attempts: 1,
        initial_delay_ms: 1,
        exponential_factor: 1.0,
    });
    let mut delay = Duration::from_millis(retry.initial_delay_ms);
    let mut attempt = 1;
    loop {
        let tenant = helpers.tenant().unwrap_or_default();
        let result = send(&rendered, def.max_response_bytes, (egress, tenant)).await;
        let retryable = match &result {
            Ok(r) => r.status.is_server_error() || r.status == StatusCode::TOO_MANY_REQUESTS,
            Err(AttemptError::Connection(_)) => true,
            Err(AttemptError::Fatal(_)) => false,
        };
        let wait = match &result {
            Ok(Response {
                retry_after: Some(after),
                ..
            }) => *after,
            _ => delay,
        };
        // Checked: a remote `Retry-After` of 2^64 - 1 seconds overflows an `Instant`.
        let past_deadline = Instant::now()
            .checked_add(wait)
            .is_none_or(|resume| resume >= deadline);
        if !retryable || attempt >= retry.max_attempts || past_deadline {
            return finish_off_workers(result, helpers).await;
        }
        helpers.log(
            toolhost_spec::call::Level::Debug,
            &format!(
                "attempt {attempt} failed; retrying in {} ms",
                wait.as_millis()
            ),
        );
        tokio::time::sleep(wait).await;
        attempt += 1;
        delay = Duration::try_from_secs_f64(delay.as_secs_f64() * retry.exponential_factor)
            .unwrap_or(Duration::MAX);
    }
}

/// Responses larger than this are redacted and parsed on a blocking thread: tens of
/// milliseconds and more for megabytes, which other tenants' calls must not wait behind.
const INLINE_RESPONSE_BYTES: usize = 64 << 10;

/// Large responses redacted and parsed at once: 8 in the process, 2 of one tenant's.
static FINISHING: LazyLock<Places> = LazyLock::new(|| Places::new(8, 2));

/// [`finish`], on a blocking thread in one of the tenant's places for a large response.
async fn finish_off_workers(
    result: Result<Response, AttemptError>,
    helpers: &Helpers,
) -> Result<Value, ToolError> {
    let large = result
        .as_ref()
        .is_ok_and(|response| response.body.len() > INLINE_RESPONSE_BYTES);
    if !large {
        return finish(result, helpers);
    }
    let (tenant, helpers) = (helpers.tenant().unwrap_or_default(), helpers.clone());
    FINISHING
        .run(tenant, move || finish(result, &helpers))
        .await
}

fn finish(result: Result<Response, AttemptError>, helpers: &Helpers) -> Result<Value, ToolError> {
    let response = match result {
        Ok(response) => response,
        Err(AttemptError::Connection(message)) => return Err(ToolError::failed(message)),
        Err(AttemptError::Fatal(error)) => return Err(error),
    };
    // An API that echoes the request must not hand a secret to the agent.
    let text = helpers.redact(&String::from_utf8_lossy(&response.body));
    if !response.status.is_success() {
        let mut message = format!("HTTP {}", response.status);
        if !text.is_empty() {
            let quoted: String = text.chars().take(ERROR_BODY_CHARS).collect();
            message = format!("{message}: {quoted}");
        }
        return Err(ToolError::failed(message));
    }
    let is_json = response
        .content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim() == "application/json" || t.trim().ends_with("+json"));
    // Past what a guest's result may be, as text: parsed, a value holds many times its bytes.
    if is_json
        && text.len() <= crate::exec::MAX_RESULT_BYTES
        && toolhost_spec::clip::json_values(&text) <= toolhost_spec::clip::MAX_PARSED_VALUES
        && let Ok(value) = serde_json::from_str(&text)
    {
        return Ok(value);
    }
    Ok(serde_json::json!({
        "status": response.status.as_u16(),
        "content_type": response.content_type,
        "body": text,
    }))
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// `egress` for the tenant whose call this is.
async fn send(
    request: &Rendered,
    max_bytes: u64,
    egress: (&EgressConfig, &str),
) -> Result<Response, AttemptError> {
    let target = &request.url;
    let host = target.host_str().unwrap_or_default().to_owned();
    let port = target.port_or_known_default().unwrap_or(80);
    let https = target.scheme() == "https";
    let mut pinned = None;
    let (stream, absolute_form): (Box<dyn Io>, bool) =
        match &request.proxy {
            None => {
                let tcp = connect(egress, &host, port).await?;
                match https {
                    true => (Box::new(tls(tcp, &host).await?), false),
                    false => (Box::new(tcp), false),
                }
            }
            Some((proxy, proxy_headers)) => {
                // The proxy reaches the target for us: the target passes egress here, and the
                // proxy is handed the address that passed, never the name to resolve again.
                let (config, tenant) = egress;
                let checked = config.resolve(tenant, &host, port).await.map_err(|e| match e {
                EgressError::Private { .. } => AttemptError::Fatal(ToolError::failed(e)),
                EgressError::Resolve { .. } => AttemptError::Connection(format!(
                    "{e} (a proxied request's target must resolve here, for egress to check it)"
                )),
            })?[0];
                pinned = Some(checked);
                let proxy_host = proxy.host_str().unwrap_or_default();
                let tcp = connect(egress, proxy_host, proxy.port().unwrap_or(80)).await?;
                if https {
                    let tunnel = connect_tunnel(tcp, &checked.to_string(), proxy_headers).await?;
                    (Box::new(tls(tunnel, &host).await?), false)
                } else {
                    (Box::new(tcp), true)
                }
            }
        };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| AttemptError::Connection(format!("HTTP handshake with {host}: {e}")))?;
    tokio::spawn(connection);

    let uri = if absolute_form {
        // The checked address in the URL; the name stays in `Host`.
        let mut at = target.clone();
        if let Some(checked) = pinned {
            let _ = at.set_ip_host(checked.ip());
        }
        at.as_str().to_owned()
    } else {
        target[url::Position::BeforePath..url::Position::AfterQuery].to_owned()
    };
    let method = match request.method {
        Method::Get => hyper::Method::GET,
        Method::Post => hyper::Method::POST,
        Method::Put => hyper::Method::PUT,
        Method::Patch => hyper::Method::PATCH,
        Method::Delete => hyper::Method::DELETE,
    };
    let mut builder = Request::builder().method(method).uri(uri);
    let authority = &target[url::Position::BeforeHost..url::Position::AfterPort];
    builder = builder.header(HOST, authority);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    if let Some((_, proxy_headers)) = request.proxy.as_ref().filter(|_| absolute_form) {
        for (name, value) in proxy_headers {
            builder = builder.header(name, value);
        }
    }
    if request.body.is_some() && !request.headers.iter().any(|(n, _)| n == CONTENT_TYPE) {
        builder = builder.header(CONTENT_TYPE, "application/json");
    }
    let body = Full::new(Bytes::from(request.body.clone().unwrap_or_default()));
    let http_request = builder
        .body(body)
        .map_err(|e| AttemptError::Fatal(ToolError::failed(e)))?;
    let response = sender
        .send_request(http_request)
        .await
        .map_err(|e| AttemptError::Connection(format!("request to {host} failed: {e}")))?;
    let status = response.status();
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header(CONTENT_TYPE).unwrap_or_default();
    let retry_after = header(RETRY_AFTER).and_then(|v| parse_retry_after(&v));
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| AttemptError::Connection(format!("reading the response: {e}")))?;
        if let Some(data) = frame.data_ref() {
            if bytes.len() as u64 + data.len() as u64 > max_bytes {
                return Err(AttemptError::Fatal(ToolError::failed(format!(
                    "the response is larger than {max_bytes} bytes (request.max_response_bytes)"
                ))));
            }
            bytes.extend_from_slice(data);
        }
    }
    Ok(Response {
        status,
        content_type,
        retry_after,
        body: bytes.into(),
    })
}

/// Seconds, or an HTTP date.
fn parse_retry_after(value: &str) -> Option<Duration> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value.trim()).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// Connects to an address egress allows; a refusal is final, a failure worth a retry.
async fn connect(
    (egress, tenant): (&EgressConfig, &str),
    host: &str,
    port: u16,
) -> Result<TcpStream, AttemptError> {
    egress
        .connect(tenant, host, port, None)
        .await
        .map_err(|e| match e {
            ConnectError::Refused(refused) => AttemptError::Fatal(ToolError::failed(refused)),
            ConnectError::Failed(message) => AttemptError::Connection(message),
        })
}

async fn tls<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<S>, AttemptError> {
    toolhost_sandbox::egress::tls(stream, host)
        .await
        .map_err(|e| match e {
            ConnectError::Refused(refused) => AttemptError::Fatal(ToolError::failed(refused)),
            ConnectError::Failed(message) => AttemptError::Connection(message),
        })
}

/// Opens a tunnel through an HTTP proxy with `CONNECT`.
async fn connect_tunnel(
    tcp: TcpStream,
    authority: &str,
    proxy_headers: &[(HeaderName, HeaderValue)],
) -> Result<TokioIo<hyper::upgrade::Upgraded>, AttemptError> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| AttemptError::Connection(format!("proxy handshake: {e}")))?;
    tokio::spawn(connection.with_upgrades());
    let mut builder = Request::builder()
        .method(hyper::Method::CONNECT)
        .uri(authority)
        .header(HOST, authority);
    for (name, value) in proxy_headers {
        builder = builder.header(name, value);
    }
    let request = builder
        .body(Full::new(Bytes::new()))
        .map_err(|e| AttemptError::Fatal(ToolError::failed(e)))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| AttemptError::Connection(format!("proxy CONNECT: {e}")))?;
    if !response.status().is_success() {
        return Err(AttemptError::Fatal(ToolError::failed(format!(
            "the proxy refused CONNECT {authority}: {}",
            response.status()
        ))));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| AttemptError::Connection(format!("proxy tunnel: {e}")))?;
    Ok(TokioIo::new(upgraded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// JSON past a guest result's size is not parsed (a value holds many times its text):
    /// the tool answers it as text, as for any other type.
    #[tokio::test]
    async fn a_json_response_larger_than_a_result_is_answered_as_text() {
        let response = |body: String| Response {
            status: StatusCode::OK,
            content_type: "application/json".into(),
            retry_after: None,
            body: body.into_bytes().into(),
        };
        let small = finish_off_workers(Ok(response("[0,0]".into())), &Helpers::default()).await;
        assert_eq!(small.unwrap(), json!([0, 0]));
        let zeros = format!("[{}0]", "0,".repeat(crate::exec::MAX_RESULT_BYTES / 2));
        let large = finish_off_workers(Ok(response(zeros)), &Helpers::default()).await;
        let large = large.unwrap();
        assert_eq!(large["status"], 200);
        assert!(large["body"].as_str().unwrap().starts_with("[0,0,"));
    }

    fn def(request: Value) -> HttpToolDef {
        serde_json::from_value(json!({
            "spec": {
                "name": "t",
                "description": "A tool.",
                "parameters": {"type": "object", "properties": {
                    "id": {"type": "string"}, "q": {"type": "string"}, "n": {"type": "integer"}
                }}
            },
            "request": request
        }))
        .unwrap()
    }

    fn field(request: Value) -> String {
        def(request).validate().unwrap_err().field
    }

    #[test]
    fn templates_parse_params_and_secrets() {
        assert_eq!(
            parse_template("/a/{{id}}/b?{{ secret.TOKEN }}").unwrap(),
            [
                Part::Text("/a/".into()),
                Part::Param("id".into()),
                Part::Text("/b?".into()),
                Part::Secret("TOKEN".into())
            ]
        );
        assert!(parse_template("{{id").is_err());
        assert!(parse_template("{{a b}}").is_err());
    }

    #[test]
    fn definitions_are_checked_field_by_field() {
        let ok = def(
            json!({"method": "get", "url": "https://api.example.com/u/{{id}}",
            "headers": {"Authorization": "Bearer {{secret.API_TOKEN}}"}}),
        );
        assert_eq!(ok.validate().unwrap().config, ["API_TOKEN"]);
        assert_eq!(
            field(json!({"method": "get", "url": "https://{{id}}.example.com/"})),
            "request.url"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/{{nope}}"})),
            "request.url"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "ftp://a.com/"})),
            "request.url"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://u:p@a.com/"})),
            "request.url"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/x?y=1"})),
            "request.url"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/", "headers": {"Bad Name": "x"}})),
            "request.headers"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/", "body": {"a": 1}})),
            "request.body"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/",
                "retry": {"max_attempts": 0, "initial_delay_ms": 1, "exponential_factor": 1}})),
            "request.retry.max_attempts"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/",
                "retry": {"max_attempts": 2, "initial_delay_ms": 1, "exponential_factor": 0.5}})),
            "request.retry.exponential_factor"
        );
        assert_eq!(
            field(
                json!({"method": "get", "url": "https://a.com/", "proxy": {"url": "https://p:1"}})
            ),
            "request.proxy.url"
        );
        assert_eq!(
            field(json!({"method": "get", "url": "https://a.com/", "max_response_bytes": 0})),
            "request.max_response_bytes"
        );
        // Refused at install, not failed at every call.
        for url in [
            "http://a.com:99999/",
            "http://a b.com/",
            "http://:80/",
            "http://[fe80::1%25eth0]/",
        ] {
            assert_eq!(field(json!({"method": "get", "url": url})), "request.url");
        }
        let proxy = json!({"url": "http://p:99999"});
        let bad_proxy = json!({"method": "get", "url": "https://a.com/", "proxy": proxy});
        assert_eq!(field(bad_proxy), "request.proxy.url");
        for (name, value) in [
            ("Host", "internal.example"),
            ("Content-Length", "5"),
            ("transfer-encoding", "chunked"),
            ("X-Fine", "a\u{1}b"),
        ] {
            let headers = json!({ name: value });
            let request = json!({"method": "get", "url": "https://a.com/", "headers": headers});
            assert_eq!(field(request), "request.headers", "{name}");
        }
    }

    fn render(request: Value, args: Value) -> Result<Rendered, ToolError> {
        let def = def(request);
        Filler {
            args: &args,
            secrets: &HashMap::new(),
        }
        .render(&def.request)
    }

    #[test]
    fn each_location_escapes_its_values() {
        let r = render(
            json!({"method": "post", "url": "http://a.com/u/{{id}}/x",
                "query": {"q": "{{q}}", "n": "{{n}}", "fixed": "1"},
                "headers": {"X-Q": "{{q}}"},
                "body": {"id": "{{id}}", "n": "{{n}}", "text": "id={{id}}", "list": ["{{n}}"]}}),
            json!({"id": "a/../b?c#d e", "q": "x&y=z", "n": 5}),
        )
        .unwrap();
        assert_eq!(r.url.host_str(), Some("a.com"));
        assert_eq!(r.url.path(), "/u/a%2F..%2Fb%3Fc%23d%20e/x");
        assert_eq!(r.url.query(), Some("fixed=1&n=5&q=x%26y%3Dz"));
        assert_eq!(r.headers[0].1, "x&y=z");
        let body: Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"id": "a/../b?c#d e", "n": 5, "text": "id=a/../b?c#d e", "list": [5]})
        );
    }

    #[test]
    fn absent_arguments_leave_their_entries_out() {
        let r = render(
            json!({"method": "post", "url": "http://a.com/",
                "query": {"q": "{{q}}"}, "headers": {"X-Q": "{{q}}"}, "body": {"q": "{{q}}", "k": 1}}),
            json!({}),
        )
        .unwrap();
        assert_eq!(r.url.query(), None);
        assert!(r.headers.is_empty());
        assert_eq!(r.body.unwrap(), br#"{"k":1}"#);
    }

    #[test]
    fn values_that_would_inject_or_escape_are_refused() {
        let header = render(
            json!({"method": "get", "url": "http://a.com/", "headers": {"X-Q": "{{q}}"}}),
            json!({"q": "x\r\nX-Admin: 1"}),
        );
        assert!(matches!(header, Err(ToolError::InvalidArgs(m)) if m.contains("X-Q")));
        for id in ["..", ".", ""] {
            let path = render(
                json!({"method": "get", "url": "http://a.com/u/{{id}}"}),
                json!({ "id": id }),
            );
            assert!(matches!(path, Err(ToolError::InvalidArgs(_))), "{id:?}");
        }
        let missing = render(
            json!({"method": "get", "url": "http://a.com/u/{{id}}"}),
            json!({}),
        );
        assert!(matches!(missing, Err(ToolError::InvalidArgs(m)) if m.contains("id")));
        // A template next to the host is refused even if validation was skipped; one in the
        // path keeps a host-looking value in the path.
        let r = render(
            json!({"method": "get", "url": "http://a.com{{id}}"}),
            json!({"id": "@evil.com"}),
        );
        assert!(r.is_err());
        let r = render(
            json!({"method": "get", "url": "http://a.com/{{id}}"}),
            json!({"id": "@evil.com:80"}),
        )
        .unwrap();
        assert_eq!(r.url.host_str(), Some("a.com"));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        let past = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_retry_after(past), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
        // Remote input: the largest value parses, and waiting for it is simply past any
        // deadline (a panic here once killed the request task).
        let forever = parse_retry_after("18446744073709551615").unwrap();
        assert!(Instant::now().checked_add(forever).is_none());
    }

    mod fuzz {
        //! A remote server's answer and a tenant's definition are untrusted input: no
        //! status, header, body or definition may panic the host.

        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn templates_and_retry_after_parse_without_panicking(text in ".{0,60}") {
                let _ = parse_template(&text);
                let _ = parse_retry_after(&text);
            }

            #[test]
            fn any_response_is_turned_into_an_outcome(
                status in 100u16..1000,
                content_type in ".{0,40}",
                body in proptest::collection::vec(any::<u8>(), 0..200),
            ) {
                let response = Response {
                    status: StatusCode::from_u16(status).unwrap(),
                    content_type,
                    retry_after: None,
                    body: body.into(),
                };
                let _ = finish(Ok(response), &Helpers::default());
            }

            #[test]
            fn a_mutated_definition_is_refused_or_valid(
                edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            ) {
                let valid = serde_json::to_vec(&json!({
                    "spec": {"name": "weather", "description": "Weather.", "parameters": {
                        "type": "object", "required": ["city"],
                        "properties": {"city": {"type": "string"}}}},
                    "request": {"method": "get", "url": "https://api.example.com/{{city}}",
                                "query": {"key": "{{secret.KEY}}"},
                                "retry": {"max_attempts": 3, "initial_delay_ms": 10, "exponential_factor": 2}}
                })).unwrap();
                let mut bytes = valid;
                for (at, byte) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
                if let Ok(def) = serde_json::from_slice::<HttpToolDef>(&bytes) {
                    let _ = def.validate();
                }
            }
        }
    }
}
