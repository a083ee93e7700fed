//! An HTTP/1.1 client on one kept-alive connection, as the benches drive `toolhost serve`.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;

/// An MCP `initialize` request (protocol 2025-06-18).
pub fn initialize() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "load-bench", "version": "1"}}})
    .to_string()
}

pub async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// One POST on a kept-alive connection: status, headers and body (an MCP answer's SSE
/// framing left in).
pub async fn post(
    conn: &mut SendRequest<Full<Bytes>>,
    path: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, String) {
    let mut request = hyper::Request::post(path)
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    if conn.ready().await.is_err() {
        return (0, Default::default(), String::new());
    }
    let Ok(response) = conn.send_request(request).await else {
        return (0, Default::default(), String::new());
    };
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// One GET on a kept-alive connection: status and body.
pub async fn get(conn: &mut SendRequest<Full<Bytes>>, path: &str, key: &str) -> (u16, String) {
    let request = hyper::Request::get(path)
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    if conn.ready().await.is_err() {
        return (0, String::new());
    }
    let Ok(response) = conn.send_request(request).await else {
        return (0, String::new());
    };
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, String::from_utf8_lossy(&body).into_owned())
}
