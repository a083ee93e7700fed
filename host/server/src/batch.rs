//! JSON-RPC batches, which MCP allowed in 2025-03-26 (and 2024-11-05) and removed in
//! 2025-06-18. rmcp takes one message per request, so a batch is split here: each message
//! goes through rmcp on its own, at once, and the answers come back as one JSON array in the
//! order of the requests. A batch of notifications and responses only is accepted with 202.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

/// The most messages one batch may hold: each runs at once.
pub const MAX_BATCH: usize = 32;

/// The bytes all answers of one batch may take together, as read from rmcp: an answer past
/// it is an error that says to send its request alone.
const MAX_BATCH_ANSWER_BYTES: usize = crate::server::MAX_REQUEST_BYTES * 16;

/// Whether `body` is a batch (a JSON array), by its first character.
pub(crate) fn is_batch(body: &[u8]) -> bool {
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}

/// Why a batch is not taken, as a JSON-RPC error (its `id` is null: the batch has none).
fn refused(code: i64, message: &str) -> Response {
    let error = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
}

/// Answers the batch in `body`; `one` answers a single message, as `/mcp` would alone.
pub(crate) async fn answer<F, Fut>(parts: &Parts, body: &[u8], one: F) -> Response
where
    F: Fn(Request<Body>) -> Fut,
    Fut: Future<Output = Response>,
{
    let version = parts
        .headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok());
    // Without the header a client speaks 2025-03-26 (the header came with 2025-06-18).
    if version.is_some_and(|v| v >= "2025-06-18") {
        return refused(
            -32600,
            "JSON-RPC batches were removed from MCP in 2025-06-18: send one message per request",
        );
    }
    let Ok(Value::Array(messages)) = serde_json::from_slice::<Value>(body) else {
        return refused(-32700, "the batch is not valid JSON");
    };
    if messages.is_empty() || messages.len() > MAX_BATCH {
        let message = format!("a batch holds 1 to {MAX_BATCH} messages");
        return refused(-32600, &message);
    }
    if let Some(at) = messages.iter().position(|m| !is_message(m)) {
        let message = format!("message {at} of the batch is not a JSON-RPC 2.0 message");
        return refused(-32600, &message);
    }
    if messages.iter().any(|m| m["method"] == "initialize") {
        return refused(-32600, "`initialize` may not be part of a batch");
    }
    let budget = AtomicUsize::new(MAX_BATCH_ANSWER_BYTES);
    let budget = &budget;
    let answers = futures::future::join_all(messages.iter().map(|message| {
        let mut request = Request::new(Body::from(message.to_string()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = parts.headers.clone();
        request.headers_mut().remove(header::CONTENT_LENGTH);
        *request.extensions_mut() = parts.extensions.clone();
        let refusal = crate::server::invalid_params(message.to_string().as_bytes());
        let answer = refusal.is_none().then(|| one(request));
        async move {
            let response = match (refusal, answer) {
                (Some(refusal), _) => refusal,
                (None, Some(answer)) => answer.await,
                (None, None) => unreachable!("one of the two is set"),
            };
            answer_of(message, response, budget).await
        }
    }))
    .await;
    let answers: Vec<Value> = answers.into_iter().flatten().collect();
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    let mut response = axum::Json(Value::Array(answers)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A request or notification (a `method`), or a response (an `id` with a `result` or an
/// `error`), that rmcp reads as it would one sent alone.
fn is_message(message: &Value) -> bool {
    let id_is = |allowed_null: bool| match message.get("id") {
        Some(Value::String(_) | Value::Number(_)) => true,
        Some(Value::Null) => allowed_null,
        _ => false,
    };
    let shaped = match (
        message.get("method"),
        message.get("result"),
        message.get("error"),
    ) {
        (Some(Value::String(_)), None, None) => message.get("id").is_none() || id_is(false),
        (None, Some(Value::Object(_)), None) => id_is(false),
        (None, None, Some(error)) => {
            id_is(true) && error["code"].is_i64() && error["message"].is_string()
        }
        _ => false,
    };
    const MEMBERS: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];
    let known = message
        .as_object()
        .is_some_and(|m| m.keys().all(|k| MEMBERS.contains(&k.as_str())));
    message["jsonrpc"] == "2.0"
        && known
        && shaped
        && message.get("params").is_none_or(Value::is_object)
        && rmcp::model::ClientJsonRpcMessage::deserialize(message).is_ok()
}

/// The answer to one request of a batch (none for a notification or a response), read from
/// what `/mcp` answered it alone: JSON, or the SSE stream that ends with it.
async fn answer_of(message: &Value, response: Response, budget: &AtomicUsize) -> Option<Value> {
    let id = message
        .get("id")
        .filter(|_| message.get("method").is_some())?;
    let status = response.status();
    let Some(body) = read_within(response.into_body(), budget).await else {
        let message = format!(
            "the batch's answers passed {MAX_BATCH_ANSWER_BYTES} bytes: send this request alone"
        );
        return Some(
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": message}}),
        );
    };
    let text = String::from_utf8_lossy(&body);
    let found = text
        .lines()
        .filter_map(|line| {
            serde_json::from_str::<Value>(line.strip_prefix("data:").unwrap_or(line).trim()).ok()
        })
        .find(|answer| answer.get("id") == Some(id) && answer.get("jsonrpc").is_some());
    Some(found.unwrap_or_else(|| {
        // Refused before rmcp answered it (its session, its size, its tenant's caps).
        let message = format!("{status}: {}", text.trim());
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": message}})
    }))
}

/// A body read whole, taking its bytes from the batch's `budget`; `None` once that ran out.
async fn read_within(body: Body, budget: &AtomicUsize) -> Option<Bytes> {
    let mut stream = body.into_data_stream();
    let mut read = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        let taken = budget.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
            left.checked_sub(chunk.len())
        });
        taken.ok()?;
        read.extend_from_slice(&chunk);
    }
    Some(read.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers of a megabyte each: a batch of 32 would have been read whole into memory.
    #[tokio::test]
    async fn a_batch_reads_at_most_its_budget_of_answers() {
        let pings: Vec<Value> = (0..MAX_BATCH)
            .map(|id| json!({"jsonrpc": "2.0", "id": id, "method": "ping"}))
            .collect();
        let body = serde_json::to_vec(&pings).unwrap();
        let (parts, _) = Request::new(()).into_parts();
        let pad = "x".repeat(crate::server::MAX_REQUEST_BYTES);
        let one = |request: Request<Body>| {
            let pad = pad.clone();
            async move {
                let bytes = axum::body::to_bytes(request.into_body(), usize::MAX).await;
                let asked: Value = serde_json::from_slice(&bytes.unwrap()).unwrap();
                let answer = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"pad": pad}});
                format!("data: {answer}\n\n").into_response()
            }
        };
        let response = answer(&parts, &body, one).await;
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await;
        let answers: Vec<Value> = serde_json::from_slice(&bytes.unwrap()).unwrap();
        assert_eq!(answers.len(), MAX_BATCH, "every request is answered");
        let whole = answers.iter().filter(|a| a.get("result").is_some()).count();
        assert!((1..16).contains(&whole), "{whole} answers read whole");
        let refused = answers.iter().find(|a| a.get("error").is_some()).unwrap();
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains("send this request alone"), "{message}");
    }
}
