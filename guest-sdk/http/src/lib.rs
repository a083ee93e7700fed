//! Outbound HTTP through `wasi:http`, for guests: the Rust SDK's `http` module and the JS
//! runtime's `fetch`. The host sends a request only to destinations the tenant granted this
//! tool; any other gets an error that says it was denied.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use wasip2::io::streams::StreamError;

/// A response, read in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET url`.
pub fn get(url: &str) -> Result<Response, String> {
    request("GET", url, &[], None)
}

/// Sends a request and reads the whole response. `url` is `http(s)://authority/path?query`.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Response, String> {
    let headers: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    send(method, url, &headers, body)
}

/// [`request`] with header values as bytes. A body's `content-length` is set here.
pub fn send(
    method: &str,
    url: &str,
    headers: &[(String, Vec<u8>)],
    body: Option<&[u8]>,
) -> Result<Response, String> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("https", rest)) => (Scheme::Https, rest),
        Some(("http", rest)) => (Scheme::Http, rest),
        _ => return Err(format!("{url}: only http:// and https:// URLs")),
    };
    let (authority, path) = rest.find('/').map_or((rest, "/"), |at| rest.split_at(at));
    let mut fields = headers.to_vec();
    if let Some(body) = body {
        fields.retain(|(name, _)| !name.eq_ignore_ascii_case("content-length"));
        fields.push(("content-length".into(), body.len().to_string().into_bytes()));
    }
    let fields = Fields::from_list(&fields).map_err(|e| format!("headers: {e:?}"))?;
    let outgoing = OutgoingRequest::new(fields);
    let method = match method.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_owned()),
    };
    let invalid = |what: &str| format!("{url}: invalid {what}");
    outgoing
        .set_method(&method)
        .map_err(|()| invalid("method"))?;
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    outgoing
        .set_authority(Some(authority))
        .map_err(|()| invalid("host"))?;
    outgoing
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let outgoing_body = outgoing
        .body()
        .map_err(|()| "request body taken".to_owned())?;
    let pending = outgoing_handler::handle(outgoing, None).map_err(|e| describe(url, &e))?;
    {
        let stream = outgoing_body
            .write()
            .map_err(|()| "request body stream taken".to_owned())?;
        for chunk in body.unwrap_or_default().chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("{url}: writing the body: {e:?}"))?;
        }
    }
    OutgoingBody::finish(outgoing_body, None).map_err(|e| describe(url, &e))?;
    pending.subscribe().block();
    let response = pending
        .get()
        .ok_or("the response was not ready")?
        .map_err(|()| "the response was already taken".to_owned())?
        .map_err(|e| describe(url, &e))?;
    let headers = response.headers().entries();
    let status = response.status();
    let incoming = response
        .consume()
        .map_err(|()| "response body taken".to_owned())?;
    let mut body = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| "response stream taken".to_owned())?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => body.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(format!("{url}: reading the body: {}", e.to_debug_string()));
                }
            }
        }
    }
    let _trailers = IncomingBody::finish(incoming);
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn describe(url: &str, error: &ErrorCode) -> String {
    match error {
        ErrorCode::HttpRequestDenied => {
            format!("{url}: denied by the host (not in this tool's network grant)")
        }
        ErrorCode::DestinationIpProhibited => {
            format!("{url}: denied by the host (a non-public address it does not allow)")
        }
        other => format!("{url}: {other:?}"),
    }
}
