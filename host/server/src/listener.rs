//! Accepting connections, with bounds that hold before any request is read: at most
//! `max_connections` open, at most `max_per_peer` from one address, and a connection that
//! does not send a request's headers within `header_timeout` (a slow sender, or a kept-alive
//! connection left idle) is closed. Without them anyone, with no key, could hold every file
//! descriptor. The connections are hyper's, as under `axum::serve`, with its timer set.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Bounds on the HTTP listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections from one IP address.
    pub max_per_peer: usize,
    /// For a request's headers to arrive, counted from the connection's start or the end
    /// of its previous response.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            max_per_peer: 256,
            header_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, calls
/// `stopping` (which ends long-lived streams), and waits for requests in flight.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    stopping: impl FnOnce(),
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = PeerCounts::default();
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            permit = open.clone().acquire_owned() => {
                let permit = permit.expect("never closed");
                tokio::select! {
                    _ = &mut shutdown => break,
                    accepted = listener.accept() => accepted.map(|a| (a, permit)),
                }
            }
        };
        let ((stream, peer), permit) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, most likely: let some close.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over its address's share: closed at once.
        let Some(peer) = peers.enter(peer.ip(), limits.max_per_peer) else {
            continue;
        };
        // Without it, a response written in pieces (an MCP event stream) waits out the
        // client's delayed ACK: ~40 ms a request on a keep-alive connection.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        let service = TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A failed or timed-out connection is the client's affair.
            let _ = connection.await;
            drop((permit, peer));
        });
    }
    drop(listener);
    stopping();
    graceful.shutdown().await;
    Ok(())
}

/// Open connections by peer address.
#[derive(Default, Clone)]
struct PeerCounts(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One open connection of a peer; dropping it closes the count.
struct PeerSlot {
    counts: PeerCounts,
    ip: IpAddr,
}

impl PeerCounts {
    fn enter(&self, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(ip).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}
