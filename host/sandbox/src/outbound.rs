//! `wasi:http` requests from guests. Denied unless the tool's network grant names the
//! destination; then connected through [`EgressConfig`], which resolves the name once and
//! refuses non-public addresses the operator has not allowed.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::egress::{ConnectError, EgressConfig};
use crate::helpers::Helpers;
use toolhost_spec::call::Level;
use toolhost_spec::policy::NetworkRule;

/// Connections one call may hold open at once: each is a file descriptor of the host's.
pub const MAX_CONNECTIONS: usize = 32;

/// One call's outbound HTTP: its tool's grant and the host's egress settings.
pub struct Outbound {
    pub rules: Vec<NetworkRule>,
    pub egress: Arc<EgressConfig>,
    /// Refusals are explained in the call's log; the guest itself gets an error code.
    pub helpers: Helpers,
    /// [`MAX_CONNECTIONS`] places, each held until its connection closes.
    pub connections: Arc<Semaphore>,
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    hyper::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

impl Outbound {
    /// The rule that allows `uri`, if any.
    fn allowing(&self, uri: &hyper::Uri) -> Option<&NetworkRule> {
        let scheme = uri.scheme_str()?;
        let host = uri.host()?;
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        self.rules.iter().find(|r| r.allows(scheme, host, port))
    }
}

impl WasiHttpHooks for Outbound {
    fn send_request(
        &mut self,
        mut request: hyper::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> ResponseFuture {
        let uri = request.uri().clone();
        let helpers = self.helpers.clone();
        let Some(rule) = self.allowing(&uri) else {
            helpers.log(
                Level::Warn,
                &format!("outbound request to {uri} denied: not in this tool's network grant"),
            );
            return Box::new(async { Err(Error::HttpRequestDenied) });
        };
        let Ok(place) = self.connections.clone().try_acquire_owned() else {
            helpers.log(
                Level::Warn,
                &format!("outbound request to {uri} refused: a call may hold at most {MAX_CONNECTIONS} connections open"),
            );
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        };
        // An IP literal the grant names is allowed even if non-public: that is explicit.
        let granted_ip = rule.ip();
        let egress = self.egress.clone();
        Box::new(async move {
            let https = uri.scheme_str() == Some("https");
            let host = uri.host().unwrap_or_default().to_owned();
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let tenant = helpers.tenant().unwrap_or_default();
            let tcp = egress
                .connect(tenant, &host, port, granted_ip)
                .await
                .map_err(|e| {
                    helpers.log(Level::Warn, &format!("outbound request to {uri}: {e}"));
                    match e {
                        ConnectError::Refused(_) => Error::DestinationIpProhibited,
                        ConnectError::Failed(_) => Error::ConnectionRefused,
                    }
                })?;
            let stream: Box<dyn Io> = if https {
                let name = host.trim_start_matches('[').trim_end_matches(']');
                Box::new(
                    crate::egress::tls(tcp, name)
                        .await
                        .map_err(|_| Error::TlsProtocolError)?,
                )
            } else {
                Box::new(tcp)
            };
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            // The request line carries the path only; the host travels in `Host`.
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            *request.uri_mut() = path.parse().map_err(|_| Error::HttpRequestUriInvalid)?;
            // The connection runs on its own task, so the response can arrive.
            let driver = tokio::spawn(async move {
                let _place = place;
                connection.await
            });
            let response = sender.send_request(request).await?;
            let response = response.map(|body| body.map_err(Error::from).boxed_unsync());
            let io: Box<dyn Future<Output = Result<(), Error>> + Send> = Box::new(async move {
                match driver.await {
                    Ok(result) => result.map_err(Error::from),
                    Err(_) => Err(Error::ConnectionTerminated),
                }
            });
            Ok((response, io))
        })
    }
}
