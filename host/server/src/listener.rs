//! Accepting connections, with bounds that hold before any request is read: at most
//! `max_connections` open (at the cap, the address holding the most gives up its oldest, so
//! that a new client always gets in), at most `max_per_peer` from one address (an IPv6
//! address counts by its /64, which one host is given whole), and a connection that does not
//! send a request's headers within `header_timeout` (a slow sender, or a kept-alive
//! connection left idle) is closed, as is one whose client takes no bytes of a response for
//! `write_timeout`. Without them anyone, with no key, could hold every file descriptor, and a
//! key's holder every response it never reads. The connections are hyper's, as under
//! `axum::serve`, with its timer set.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutWriter;

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
    /// For the client to take more of a response once the socket's buffer is full: past it
    /// the connection is closed, and the response (up to a call's result, or an MCP stream)
    /// is freed.
    pub write_timeout: Duration,
    /// For a connection asked to make room at the cap to end the request it is serving
    /// (an MCP event stream never ends by itself) before it is closed anyway.
    pub evicted_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            max_per_peer: 256,
            header_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            evicted_grace: Duration::from_secs(5),
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
    let max = limits.max_connections.max(1);
    let open = Arc::new(Semaphore::new(max));
    let peers = PeerCounts::default();
    let live = Live::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, most likely: let some close.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer = peer_of(peer.ip());
        // Over its address's share: closed at once.
        let Some(slot) = peers.enter(peer, limits.max_per_peer) else {
            continue;
        };
        // At the cap, the address holding the most connections gives one up, so that holding
        // connections open cannot lock everyone else out; none freed in time: closed.
        let permit = match open.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                live.ask_one_to_close();
                let freed = open.clone().acquire_owned();
                match tokio::time::timeout(ROOM_WAIT, freed).await {
                    Ok(Ok(permit)) => permit,
                    _ => continue,
                }
            }
        };
        // Without it, a response written in pieces (an MCP event stream) waits out the
        // client's delayed ACK: ~40 ms a request on a keep-alive connection.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        let mut stream = TimeoutWriter::new(stream);
        stream.set_timeout(Some(limits.write_timeout));
        let service = TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(TokioIo::new(Box::pin(stream)), service);
        let close = live.enter(peer);
        let stopped = stopped.clone();
        let grace = limits.evicted_grace;
        tokio::spawn(async move {
            serve_until_closed(connection, &close, stopped, grace).await;
            drop((permit, slot, close));
        });
    }
    drop(listener);
    stopping();
    let _ = stop.send(true);
    // Every connection holds a permit until it has closed.
    let _ = open.acquire_many(max as u32).await;
    Ok(())
}

/// One accepted connection, as hyper serves it.
type Connection = hyper::server::conn::http1::Connection<
    TokioIo<Pin<Box<TimeoutWriter<tokio::net::TcpStream>>>>,
    TowerToHyperService<Router>,
>;

/// Serves one connection to its end. When the server stops, it closes at once if idle, else
/// after the request it is serving; asked to make room at the cap, the same, but within
/// `grace`.
async fn serve_until_closed(
    connection: Connection,
    close: &LiveEntry,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    grace: Duration,
) {
    tokio::pin!(connection);
    // Each fused: once it has happened, it is not waited for again.
    let mut evicted = std::pin::pin!(close.asked().fuse());
    let mut stopping = std::pin::pin!(stopped.wait_for(|&stop| stop).fuse());
    let mut deadline = std::pin::pin!(futures::future::Fuse::terminated());
    let mut closing = false;
    loop {
        tokio::select! {
            // A failed or timed-out connection is the client's affair.
            _ = connection.as_mut() => return,
            () = &mut evicted => {
                deadline.set(tokio::time::sleep(grace).fuse());
            }
            _ = &mut stopping => {}
            () = &mut deadline => return,
        }
        if !closing {
            closing = true;
            connection.as_mut().graceful_shutdown();
        }
    }
}

/// The address a connection counts under: an IPv6 address by its /64 (a host is commonly
/// given a whole /64, so its addresses are one peer), an IPv4 one as it is.
fn peer_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
        v4 => v4,
    }
}

/// How long a connection over the cap waits for another to close before it is closed.
const ROOM_WAIT: Duration = Duration::from_secs(1);

/// Open connections by address, oldest first, each with the signal that asks it to close.
#[derive(Default, Clone)]
struct Live(Arc<Mutex<LiveState>>);

#[derive(Default)]
struct LiveState {
    by_peer: HashMap<IpAddr, std::collections::BTreeMap<u64, Arc<tokio::sync::Notify>>>,
    next: u64,
}

/// One open connection's entry in [`Live`]; dropping it removes the entry.
struct LiveEntry {
    live: Live,
    ip: IpAddr,
    id: u64,
    close: Arc<tokio::sync::Notify>,
}

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enter(&self, ip: IpAddr) -> LiveEntry {
        let close = Arc::new(tokio::sync::Notify::new());
        let mut state = self.lock();
        state.next += 1;
        let id = state.next;
        state
            .by_peer
            .entry(ip)
            .or_default()
            .insert(id, close.clone());
        LiveEntry {
            live: self.clone(),
            ip,
            id,
            close,
        }
    }

    /// Asks the oldest connection of the address holding the most to close.
    fn ask_one_to_close(&self) {
        let mut state = self.lock();
        let busiest = state
            .by_peer
            .iter_mut()
            .max_by_key(|(_, connections)| connections.len());
        if let Some((_, connections)) = busiest
            && let Some((_, close)) = connections.pop_first()
        {
            close.notify_one();
        }
    }
}

impl LiveEntry {
    async fn asked(&self) {
        self.close.notified().await
    }
}

impl Drop for LiveEntry {
    fn drop(&mut self) {
        let mut state = self.live.lock();
        if let Some(connections) = state.by_peer.get_mut(&self.ip) {
            connections.remove(&self.id);
            if connections.is_empty() {
                state.by_peer.remove(&self.ip);
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_peer_counts_by_its_64_and_a_mapped_ipv4_one_as_ipv4() {
        let peer = |ip: &str| peer_of(ip.parse().unwrap());
        assert_eq!(peer("2001:db8:1:2:aaaa::1"), peer("2001:db8:1:2:bbbb::9"));
        assert_eq!(peer("2001:db8:1:2::1").to_string(), "2001:db8:1:2::");
        assert_ne!(peer("2001:db8:1:2::1"), peer("2001:db8:1:3::1"));
        assert_eq!(peer("::ffff:10.0.0.1"), peer("10.0.0.1"));
        assert_ne!(peer("10.0.0.1"), peer("10.0.0.2"));
    }
}
