//! The web console's files (`console/`, built by `scripts/build-console`), served at `/`.
//! A release build carries them inside the binary; a debug build reads them from
//! `console/dist` on each request, so a rebuilt console needs no restart.

use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "../../console/dist"]
#[allow_missing = true]
struct Assets;

/// The console may run what it loads from here and talk to this server only. (`unsafe-eval`:
/// the schema-form library compiles each tool's JSON Schema into a validator.)
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self' 'unsafe-eval'; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
    frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The console's file at `uri`, or `None` when there is none (the caller answers 404). `/`
/// is `index.html`; without built assets it says how to build them.
pub fn file(method: &Method, uri: &Uri) -> Option<Response> {
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    let path = match uri.path().trim_start_matches('/') {
        "" => "index.html",
        path => path,
    };
    let Some(file) = Assets::get(path) else {
        return (path == "index.html").then(not_built);
    };
    let mut response = file.data.into_response();
    let headers = response.headers_mut();
    let content_type = HeaderValue::from_str(file.metadata.mimetype())
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_TYPE, content_type);
    // Bundled files carry their hash in their name; the page that names them must be fresh.
    let cache = match path.starts_with("assets/") {
        true => "public, max-age=31536000, immutable",
        false => "no-cache",
    };
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Some(response)
}

fn not_built() -> Response {
    let message = "This toolhost was built without its web console. Run `scripts/build-console` \
        (Node.js 20 or later), then build toolhost again.\n";
    (StatusCode::NOT_FOUND, message).into_response()
}
