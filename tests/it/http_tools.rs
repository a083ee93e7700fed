//! HTTP tools with no code, against a scripted server on loopback that the tests grant
//! explicitly: templates and their escaping, secrets, retries and backoff, `Retry-After`,
//! limits, egress refusals, proxies and persistence.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use toolhost::egress::EgressConfig;
use toolhost::http_tool::HttpToolDef;
use toolhost::{CallError, CallOutcome, Caller, Host, HostConfig, InstallError, ToolError};

/// What the server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: String,
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

/// One scripted answer; when the script runs out the server answers 200 `{"ok": true}`.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    delay: Duration,
}

fn reply(status: u16, body: &str) -> Reply {
    Reply {
        status,
        headers: vec![("content-type", "application/json".into())],
        body: body.into(),
        delay: Duration::ZERO,
    }
}

#[derive(Clone, Default)]
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
}

impl Server {
    async fn start() -> (Self, SocketAddr) {
        let server = Server::default();
        let state = server.clone();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = state.clone();
                async move {
                    state.seen.lock().unwrap().push(Seen {
                        method,
                        uri: uri.to_string(),
                        headers,
                        body,
                        at: Instant::now(),
                    });
                    let next = state.script.lock().unwrap().pop_front();
                    let reply = next.unwrap_or_else(|| reply(200, r#"{"ok": true}"#));
                    tokio::time::sleep(reply.delay).await;
                    let mut response =
                        (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
                    for (name, value) in reply.headers {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                    response
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (server, addr)
    }

    fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.script.lock().unwrap().extend(replies);
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn loopback_host() -> Host {
    Host::open(HostConfig {
        egress: EgressConfig {
            allow_private: vec!["127.0.0.1".parse().unwrap()],
            ..Default::default()
        },
        ..crate::plugins::config()
    })
    .await
    .unwrap()
}

fn def(name: &str, request: Value) -> HttpToolDef {
    serde_json::from_value(json!({
        "spec": {
            "name": name,
            "description": "Calls the test server.",
            "parameters": {"type": "object", "properties": {
                "id": {"type": "string"},
                "q": {"type": "string"},
                "n": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}}
            }},
            "limits": {"timeout_ms": 5000}
        },
        "request": request
    }))
    .unwrap()
}

async fn call(host: &Host, tool: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant("acme"), tool, args).await
}

fn tool_error(outcome: &CallOutcome) -> &str {
    match &outcome.result {
        Err(CallError::Tool(ToolError::Failed(m) | ToolError::InvalidArgs(m))) => m,
        other => panic!("expected a tool error, got {other:?}"),
    }
}

#[tokio::test]
async fn every_template_location_is_filled_and_escaped() {
    let (server, addr) = Server::start().await;
    let host = loopback_host().await;
    host.install_http(
        "acme",
        def(
            "lookup",
            json!({
                "method": "post",
                "url": format!("http://{addr}/users/{{{{id}}}}/items"),
                "query": {"q": "{{q}}", "n": "{{n}}", "fixed": "yes"},
                "headers": {"X-Query": "{{q}}", "X-Fixed": "1"},
                "body": {"id": "{{id}}", "n": "{{n}}", "tags": "{{tags}}", "note": "for {{id}}"}
            }),
        ),
    )
    .await
    .unwrap();
    let args = json!({"id": "../admin?x=1#y z", "q": "a&b=c d", "n": 7, "tags": ["t1", "t2"]});
    let out = call(&host, "lookup", args).await;
    assert_eq!(out.result, Ok(json!({"ok": true})));
    let seen = &server.seen()[0];
    assert_eq!(seen.method, Method::POST);
    assert_eq!(
        seen.uri,
        "/users/..%2Fadmin%3Fx%3D1%23y%20z/items?fixed=yes&n=7&q=a%26b%3Dc+d"
    );
    assert_eq!(seen.headers["x-query"], "a&b=c d");
    assert_eq!(seen.headers["x-fixed"], "1");
    assert_eq!(seen.headers["content-type"], "application/json");
    assert_eq!(seen.headers["host"], addr.to_string());
    let body: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(
        body,
        json!({"id": "../admin?x=1#y z", "n": 7, "tags": ["t1", "t2"], "note": "for ../admin?x=1#y z"})
    );

    // Optional arguments that are absent leave their entries out.
    call(&host, "lookup", json!({"id": "7"})).await;
    let seen = &server.seen()[1];
    assert_eq!(seen.uri, "/users/7/items?fixed=yes");
    assert!(!seen.headers.contains_key("x-query"));
    let body: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(body, json!({"id": "7", "note": "for 7"}));

    // A value that would add a header line never leaves the host.
    let injected = call(
        &host,
        "lookup",
        json!({"id": "1", "q": "x\r\nX-Admin: yes"}),
    )
    .await;
    assert!(tool_error(&injected).contains("X-Query"));
    let empty_segment = call(&host, "lookup", json!({"id": ".."})).await;
    assert!(tool_error(&empty_segment).contains("path segment"));
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn secrets_fill_templates_and_never_reach_the_agent() {
    let (server, addr) = Server::start().await;
    let host = loopback_host().await;
    let spec = host
        .install_http(
            "acme",
            def(
                "authed",
                json!({
                    "method": "get",
                    "url": format!("http://{addr}/me"),
                    "headers": {"Authorization": "Bearer {{secret.API_TOKEN}}"}
                }),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        spec.config,
        ["API_TOKEN"],
        "the secret is declared for the tool"
    );

    let missing = call(&host, "authed", json!({})).await;
    assert!(tool_error(&missing).contains("API_TOKEN"));
    assert!(server.seen().is_empty());

    host.set_config("acme", "API_TOKEN", "s3cr3t-value", true)
        .await
        .unwrap();
    // The server echoes the token in a success and in a failure.
    server.script([
        reply(200, r#"{"token": "s3cr3t-value"}"#),
        reply(403, r#"{"error": "bad token s3cr3t-value"}"#),
    ]);
    let ok = call(&host, "authed", json!({})).await;
    assert_eq!(
        server.seen()[0].headers["authorization"],
        "Bearer s3cr3t-value"
    );
    let text = ok.result.unwrap().to_string();
    assert!(!text.contains("s3cr3t-value"), "{text}");
    let failed = call(&host, "authed", json!({})).await;
    let message = tool_error(&failed);
    assert!(message.starts_with("HTTP 403"), "{message}");
    assert!(!message.contains("s3cr3t-value"), "{message}");
    assert!(!format!("{:?}", failed.log).contains("s3cr3t-value"));

    // Echoed in the encodings APIs use: each is redacted too.
    host.set_config("acme", "API_TOKEN", "s3cr3t/value+1", true)
        .await
        .unwrap();
    let echoes = [
        ("percent-encoded", "s3cr3t%2Fvalue%2B1"),
        ("JSON-escaped", "s3cr3t\\/value+1"),
        ("in Basic credentials", "dXNlcjpzM2NyM3QvdmFsdWUrMQ=="),
    ];
    for (how, echoed) in echoes {
        server.script([reply(200, &format!(r#"{{"seen": "{echoed}"}}"#))]);
        let out = call(&host, "authed", json!({})).await;
        let text = out.result.unwrap().to_string();
        assert!(
            text.contains("[redacted]") && !text.contains(echoed),
            "{how}: {text}"
        );
    }
}

#[tokio::test]
async fn retries_back_off_exponentially_and_honour_retry_after() {
    let (server, addr) = Server::start().await;
    let host = loopback_host().await;
    let retrying = |name: &str, path: &str| {
        def(
            name,
            json!({
                "method": "get",
                "url": format!("http://{addr}/{path}"),
                "retry": {"max_attempts": 3, "initial_delay_ms": 100, "exponential_factor": 3}
            }),
        )
    };
    host.install_http("acme", retrying("flaky", "flaky"))
        .await
        .unwrap();
    host.install_http("acme", retrying("limited", "limited"))
        .await
        .unwrap();
    host.install_http("acme", retrying("missing", "missing"))
        .await
        .unwrap();

    // 503, 500, then 200: waits of 100 ms, then 300 ms.
    server.script([reply(503, "{}"), reply(500, "{}")]);
    let out = call(&host, "flaky", json!({})).await;
    assert_eq!(out.result, Ok(json!({"ok": true})));
    let at: Vec<Instant> = server.seen().iter().map(|s| s.at).collect();
    assert_eq!(at.len(), 3);
    let (first, second) = (at[1] - at[0], at[2] - at[1]);
    // Lower bounds, and their order: a busy machine only ever lengthens a wait.
    assert!(first >= Duration::from_millis(100), "{first:?}");
    assert!(second >= Duration::from_millis(300), "{second:?}");
    assert!(
        first < second,
        "the backoff grows: {first:?} then {second:?}"
    );

    // 429 with Retry-After: 1 waits a second, not 100 ms.
    let mut limited = reply(429, "{}");
    limited.headers.push(("retry-after", "1".into()));
    server.script([limited]);
    let out = call(&host, "limited", json!({})).await;
    assert_eq!(out.result, Ok(json!({"ok": true})));
    let at: Vec<Instant> = server.seen()[3..].iter().map(|s| s.at).collect();
    assert!(
        at[1] - at[0] >= Duration::from_secs(1),
        "{:?}",
        at[1] - at[0]
    );

    // A 404 is an answer, not a failure to retry.
    server.script([reply(404, r#"{"error": "no such thing"}"#)]);
    let out = call(&host, "missing", json!({})).await;
    assert!(tool_error(&out).starts_with("HTTP 404 Not Found: {\"error\""));
    assert_eq!(server.seen().len(), 6);

    // Every attempt failing: the last answer is the outcome.
    server.script([reply(502, "{}"), reply(502, "{}"), reply(502, "{}")]);
    let out = call(&host, "flaky", json!({})).await;
    assert!(tool_error(&out).starts_with("HTTP 502"));
    assert_eq!(server.seen().len(), 9);

    // A Retry-After no deadline can wait for ends the call with the answer, at once, and
    // the host goes on serving (it once panicked the request task).
    let mut forever = reply(429, "{}");
    forever
        .headers
        .push(("retry-after", "18446744073709551615".into()));
    server.script([forever]);
    let out = call(&host, "limited", json!({})).await;
    assert!(tool_error(&out).starts_with("HTTP 429"), "{:?}", out.result);
    assert_eq!(server.seen().len(), 10, "no retry");
}

#[tokio::test]
async fn connection_errors_are_retried_and_then_reported() {
    // A port with nothing listening.
    let closed = crate::process::free_addr();
    let host = loopback_host().await;
    host.install_http(
        "acme",
        def(
            "down",
            json!({
                "method": "get",
                "url": format!("http://{closed}/"),
                "retry": {"max_attempts": 3, "initial_delay_ms": 50, "exponential_factor": 1}
            }),
        ),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let out = call(&host, "down", json!({})).await;
    assert!(
        tool_error(&out).contains("cannot connect"),
        "{:?}",
        out.result
    );
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "two waits of 50 ms"
    );
}

#[tokio::test]
async fn limits_bound_the_response_and_the_time() {
    let (server, addr) = Server::start().await;
    let host = loopback_host().await;
    let mut slow = def(
        "slow",
        json!({"method": "get", "url": format!("http://{addr}/slow")}),
    );
    slow.spec.limits.timeout_ms = 200;
    host.install_http("acme", slow).await.unwrap();
    host.install_http(
        "acme",
        def(
            "small",
            json!({"method": "get", "url": format!("http://{addr}/big"), "max_response_bytes": 100}),
        ),
    ).await
    .unwrap();
    host.install_http(
        "acme",
        def(
            "page",
            json!({"method": "get", "url": format!("http://{addr}/page")}),
        ),
    )
    .await
    .unwrap();

    let mut late = reply(200, "{}");
    late.delay = Duration::from_secs(5);
    server.script([late]);
    let out = call(&host, "slow", json!({})).await;
    assert_eq!(out.result, Err(CallError::Timeout { limit_ms: 200 }));

    server.script([reply(200, &format!("\"{}\"", "x".repeat(500)))]);
    let out = call(&host, "small", json!({})).await;
    assert!(tool_error(&out).contains("request.max_response_bytes"));

    server.script([Reply {
        status: 200,
        headers: vec![("content-type", "text/html; charset=utf-8".into())],
        body: "<p>hi</p>".into(),
        delay: Duration::ZERO,
    }]);
    let out = call(&host, "page", json!({})).await;
    assert_eq!(
        out.result,
        Ok(json!({"status": 200, "content_type": "text/html; charset=utf-8", "body": "<p>hi</p>"}))
    );
    // JSON of more values than are parsed comes back as text, as larger JSON does.
    let zeros = format!("[{}0]", "0,".repeat(1_500_000));
    server.script([Reply {
        status: 200,
        headers: vec![("content-type", "application/json".into())],
        body: zeros,
        delay: Duration::ZERO,
    }]);
    let url = format!("http://{addr}/zeros");
    let request = json!({"method": "get", "url": url, "max_response_bytes": 4 << 20});
    host.install_http("acme", def("zeros", request))
        .await
        .unwrap();
    let out = call(&host, "zeros", json!({})).await;
    let result = out.result.unwrap();
    assert_eq!(result["status"], 200, "returned as text");
    assert_eq!(result["content_type"], "application/json");
}

#[tokio::test]
async fn private_addresses_need_the_operators_grant() {
    let (server, addr) = Server::start().await;
    let closed = Host::open(crate::plugins::config()).await.unwrap();
    for (name, url) in [
        ("by_ip", format!("http://{addr}/")),
        ("by_name", format!("http://localhost:{}/", addr.port())),
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/".to_owned(),
        ),
    ] {
        closed
            .install_http("acme", def(name, json!({"method": "get", "url": url})))
            .await
            .unwrap();
        let out = call(&closed, name, json!({})).await;
        assert!(
            tool_error(&out).contains("egress.allow_private"),
            "{name}: {:?}",
            out.result
        );
    }
    assert!(server.seen().is_empty(), "nothing was sent");
}

/// Each closed connection keeps a local port for a minute: a tenant opening hundreds a second
/// would use up the ports to its destination, for every tenant. One tenant's new connections go
/// 100 a second after a burst of 100, and another tenant's go at once meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_new_connections_are_paced_and_another_tenants_are_not() {
    use toolhost::egress::NEW_CONNECTIONS_PER_SECOND;
    let host = Arc::new(loopback_host().await);
    let (server, addr) = Server::start().await;
    // Tenants of their own: the pace is the process's, and other tests call as `acme`.
    for tenant in ["flood", "quiet"] {
        let url = format!("http://{addr}/{tenant}");
        let tool = def("get", json!({"method": "get", "url": url}));
        host.install_http(tenant, tool).await.unwrap();
    }
    let burst = NEW_CONNECTIONS_PER_SECOND.get() as usize;
    // Two seconds' worth past the burst, eight calls at a time.
    let calls = burst + 2 * burst;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (host, next) = (host.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < calls {
                    let out = host.call(&Caller::tenant("flood"), "get", json!({})).await;
                    assert!(out.result.is_ok(), "{:?}", out.result);
                }
            })
        })
        .collect();
    let past_the_burst = async {
        while server.seen().len() < burst + 10 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), past_the_burst)
        .await
        .expect("the flood's burst arrives");
    let quiet = host.call(&Caller::tenant("quiet"), "get", json!({})).await;
    assert!(quiet.result.is_ok(), "{:?}", quiet.result);
    for worker in workers {
        worker.await.unwrap();
    }
    let seen = server.seen();
    let flood: Vec<Instant> = (seen.iter().filter(|s| s.uri == "/flood"))
        .map(|s| s.at)
        .collect();
    assert_eq!(flood.len(), calls);
    let (first, last) = (flood.iter().min().unwrap(), flood.iter().max().unwrap());
    assert!(
        *last - *first >= Duration::from_millis(1800),
        "{} connections in {:?}",
        calls,
        *last - *first
    );
    let quiet_at = seen.iter().find(|s| s.uri == "/quiet").unwrap().at;
    assert!(quiet_at < *last, "quiet waited behind the flood");
}

#[tokio::test]
async fn a_proxy_gets_the_absolute_url_and_its_own_headers() {
    let (proxy, addr) = Server::start().await;
    let host = loopback_host().await;
    host.install_http(
        "acme",
        def(
            "proxied",
            json!({
                "method": "get",
                "url": "http://localhost:8/v1/things",
                "headers": {"X-Api": "1"},
                "proxy": {"url": format!("http://{addr}"), "headers": {"Proxy-Authorization": "Basic {{secret.PROXY}}"}}
            }),
        ),
    ).await
    .unwrap();
    host.set_config("acme", "PROXY", "dXNlcjpwdw==", true)
        .await
        .unwrap();
    let out = call(&host, "proxied", json!({})).await;
    assert_eq!(out.result, Ok(json!({"ok": true})));
    let seen = &proxy.seen()[0];
    // The address egress checked, so the proxy cannot resolve the name elsewhere.
    assert_eq!(seen.uri, "http://127.0.0.1:8/v1/things");
    assert_eq!(seen.headers["host"], "localhost:8");
    assert_eq!(seen.headers["proxy-authorization"], "Basic dXNlcjpwdw==");
    assert_eq!(seen.headers["x-api"], "1");
}

/// An allowed proxy once carried requests to any target, such as a cloud metadata address:
/// the target passes the same egress rules as a direct request.
#[tokio::test]
async fn a_proxy_does_not_carry_requests_where_egress_would_not_go() {
    let (proxy, addr) = Server::start().await;
    let host = loopback_host().await;
    for (name, url) in [
        ("metadata", "http://169.254.169.254/latest/meta-data/"),
        ("tunnelled", "https://10.0.0.1/"),
        ("unresolvable", "http://api.example.invalid/"),
    ] {
        let request =
            json!({"method": "get", "url": url, "proxy": {"url": format!("http://{addr}")}});
        host.install_http("acme", def(name, request)).await.unwrap();
        let out = call(&host, name, json!({})).await;
        let error = tool_error(&out).to_owned();
        let why = if name == "unresolvable" {
            "must resolve here"
        } else {
            "egress.allow_private"
        };
        assert!(error.contains(why), "{name}: {error}");
    }
    assert!(proxy.seen().is_empty(), "nothing reached the proxy");
}

#[tokio::test]
async fn definitions_are_validated_versioned_and_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = Server::start().await;
    let config = || HostConfig {
        data_dir: Some(dir.path().to_owned()),
        egress: EgressConfig {
            allow_private: vec!["127.0.0.0/8".parse().unwrap()],
            ..Default::default()
        },
        ..crate::plugins::config()
    };
    {
        let host = Host::open(config()).await.unwrap();
        let bad = host
            .install_http(
                "acme",
                def(
                    "bad",
                    json!({"method": "get", "url": "http://{{id}}.example.com/"}),
                ),
            )
            .await;
        assert!(
            matches!(&bad, Err(InstallError::Spec(e)) if e.field == "request.url"),
            "{bad:?}"
        );
        let url = format!("http://{addr}/v");
        for _ in 0..2 {
            host.install_http(
                "acme",
                def("versioned", json!({"method": "get", "url": url})),
            )
            .await
            .unwrap();
        }
        assert_eq!(host.versions("acme", "versioned").await.unwrap().current, 2);
    }
    let host = Host::open(config()).await.unwrap();
    let info = host.describe("acme", "versioned").unwrap();
    assert!(matches!(
        info.source,
        toolhost::Source::Http { version: 2, .. }
    ));
    assert_eq!(
        call(&host, "versioned", json!({})).await.result,
        Ok(json!({"ok": true}))
    );
    assert!(host.describe("globex", "versioned").is_none());
}
