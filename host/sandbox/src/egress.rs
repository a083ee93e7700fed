//! Where outbound connections may go. Names are resolved here, and every address is checked
//! before connecting to that very address, so a name that later resolves elsewhere (DNS
//! rebinding) cannot reach what the check refused.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use crate::places::Places;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The operator's egress settings, host-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Non-public addresses (loopback, private, link-local, …) that outbound requests may
    /// reach: addresses or CIDR ranges such as `127.0.0.1` or `10.1.0.0/16`. Empty: none.
    pub allow_private: Vec<Cidr>,
    /// New connections one tenant's calls may open a second, after a burst of as many; past
    /// that each waits its turn, within its call's deadline ([`NEW_CONNECTIONS_PER_SECOND`]).
    pub new_connections_per_second: NonZeroU32,
}

/// The default of [`EgressConfig::new_connections_per_second`]. A closed connection keeps its
/// local port for a minute (TIME_WAIT), so the host runs out of ports to one destination at
/// about 470 new connections a second: a tenant opening them faster would cut every tenant
/// off from that destination, and would use the host to flood it.
pub const NEW_CONNECTIONS_PER_SECOND: NonZeroU32 = NonZeroU32::new(100).unwrap();

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            allow_private: Vec::new(),
            new_connections_per_second: NEW_CONNECTIONS_PER_SECOND,
        }
    }
}

/// An address range, written `10.0.0.0/8` or a bare address (`ipnet` does the arithmetic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Cidr(IpNet::from(ip)));
        }
        text.parse::<IpNet>().map(Cidr).map_err(|_| {
            format!("`{text}` is not an IP address or CIDR range (the prefix must be 0 to 32, or 0 to 128 for IPv6)")
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl Cidr {
    /// Whether `ip` (an IPv4-mapped IPv6 address as its IPv4 address) is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&canonical(ip))
    }
}

/// An IPv4 address mapped into IPv6 is checked as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Ranges that are not globally reachable, from IANA's IPv4 and IPv6 Special-Purpose Address
/// Registries (entries whose "Globally Reachable" is False or N/A), plus multicast, and every
/// prefix that embeds an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible), which could
/// carry a connection to a private IPv4 address.
const NON_PUBLIC: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "100:0:0:1::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "3fff::/20",
    "5f00::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

fn non_public() -> &'static [IpNet] {
    static RANGES: OnceLock<Vec<IpNet>> = OnceLock::new();
    RANGES.get_or_init(|| {
        NON_PUBLIC
            .iter()
            .map(|range| range.parse().expect("the table holds valid ranges"))
            .collect()
    })
}

/// Reachable from anywhere on the internet: in none of the [`NON_PUBLIC`] ranges.
pub fn is_public(ip: IpAddr) -> bool {
    let ip = canonical(ip);
    !non_public().iter().any(|range| range.contains(&ip))
}

/// Why egress refused a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The name does not resolve.
    #[error("cannot resolve `{host}`: {reason}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's error.
        reason: String,
    },
    /// The name resolves to an address egress refuses.
    #[error(
        "`{host}` resolves to {ip}, a non-public address the operator has not allowed (egress.allow_private)"
    )]
    Private {
        /// The name.
        host: String,
        /// The refused address.
        ip: IpAddr,
    },
}

impl EgressConfig {
    /// Whether a connection to `ip` is allowed.
    pub fn permits(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.allow_private.iter().any(|c| c.contains(ip))
    }

    /// The addresses of `host:port` that may be connected to, looked up for `tenant`'s call.
    /// Refuses the name if any of its addresses is refused, so that which one is tried first
    /// cannot matter.
    pub async fn resolve(
        &self,
        tenant: &str,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, EgressError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => {
                let name = bare.to_owned();
                let looked_up = LOOKUPS.run(tenant, move || {
                    (name.as_str(), port).to_socket_addrs().map(Vec::from_iter)
                });
                looked_up.await.map_err(|e| EgressError::Resolve {
                    host: host.to_owned(),
                    reason: e.to_string(),
                })?
            }
        };
        if addresses.is_empty() {
            return Err(EgressError::Resolve {
                host: host.to_owned(),
                reason: "no addresses".into(),
            });
        }
        if let Some(refused) = addresses.iter().find(|a| !self.permits(a.ip())) {
            return Err(EgressError::Private {
                host: host.to_owned(),
                ip: refused.ip(),
            });
        }
        Ok(addresses)
    }
}

/// Name lookups at once in the process. A lookup is `getaddrinfo` on one of tokio's blocking
/// threads, which the store and the file system need too, and it blocks for as long as the
/// name server takes, even after the call that asked has ended.
pub const MAX_LOOKUPS: usize = 64;
/// Name lookups at once for one tenant: names whose server never answers hold only their own
/// tenant's places.
pub const MAX_LOOKUPS_PER_TENANT: usize = 8;

static LOOKUPS: LazyLock<Places> =
    LazyLock::new(|| Places::new(MAX_LOOKUPS, MAX_LOOKUPS_PER_TENANT));

/// Each tenant's new connections in the process, whichever host opens them: the ports they
/// use up are the machine's.
static NEW_CONNECTIONS: LazyLock<Pacer> = LazyLock::new(Pacer::default);

/// Spaces each tenant's events: `rate` a second, after a burst of as many (the generic cell
/// rate algorithm). A turn is kept from when it is asked for, so waiters go first come, first
/// served.
#[derive(Default)]
struct Pacer {
    /// Each tenant's next turn if it had no burst left.
    next: Mutex<HashMap<String, Instant>>,
}

impl Pacer {
    /// When `tenant`'s next event may happen, asked at `now`.
    fn turn(&self, tenant: &str, rate: NonZeroU32, now: Instant) -> Instant {
        let interval = Duration::from_secs(1) / rate.get();
        let burst = interval * (rate.get() - 1);
        let mut tenants = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if !tenants.contains_key(tenant) {
            tenants.insert(tenant.to_owned(), now);
        }
        let next = tenants.get_mut(tenant).expect("inserted above");
        let at = next.checked_sub(burst).map_or(now, |at| at.max(now));
        *next = (*next).max(at) + interval;
        at
    }
}

/// Why a connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Policy said no: retrying cannot help.
    #[error(transparent)]
    Refused(EgressError),
    /// The network said no.
    #[error("{0}")]
    Failed(String),
}

impl EgressConfig {
    /// Connects to `host:port` for `tenant`'s call, resolved once and checked address by
    /// address. `granted_ip` is an address the caller's grant names explicitly, allowed even
    /// if non-public.
    pub async fn connect(
        &self,
        tenant: &str,
        host: &str,
        port: u16,
        granted_ip: Option<IpAddr>,
    ) -> Result<TcpStream, ConnectError> {
        let addresses = match granted_ip {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => self
                .resolve(tenant, host, port)
                .await
                .map_err(|e| match e {
                    EgressError::Private { .. } => ConnectError::Refused(e),
                    EgressError::Resolve { .. } => ConnectError::Failed(e.to_string()),
                })?,
        };
        let turn = NEW_CONNECTIONS.turn(tenant, self.new_connections_per_second, Instant::now());
        tokio::time::sleep_until(turn).await;
        let mut last = None;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        let reason = last.map_or_else(String::new, |e| e.to_string());
        Err(ConnectError::Failed(format!(
            "cannot connect to {host}:{port}: {reason}"
        )))
    }
}

/// TLS over `stream` to `host`, verified against Mozilla's roots.
pub async fn tls<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<S>, ConnectError> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    });
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| ConnectError::Failed(format!("TLS name {host}: {e}")))?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, stream)
        .await
        .map_err(|e| ConnectError::Failed(format!("TLS with {host}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn non_public_addresses_are_recognised() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "64:ff9b:1::a00:1",
            "2002:a00:1::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "::10.0.0.1",
            "100::1",
            "3fff::1",
            "224.0.0.1",
            "255.255.255.255",
            "198.18.0.1",
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
        ] {
            assert!(is_public(ip(public)), "{public}");
        }
    }

    #[test]
    fn cidr_ranges_parse_and_match() {
        let range: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(range.contains(ip("10.1.200.3")));
        assert!(!range.contains(ip("10.2.0.1")));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && one.contains(ip("::ffff:127.0.0.1")));
        assert!(!one.contains(ip("127.0.0.2")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("localhost".parse::<Cidr>().is_err());
    }

    #[tokio::test]
    async fn resolution_refuses_private_addresses_unless_allowed() {
        let closed = EgressConfig::default();
        let refused = closed.resolve("acme", "127.0.0.1", 80).await.unwrap_err();
        assert!(matches!(refused, EgressError::Private { .. }));
        assert!(refused.to_string().contains("egress.allow_private"));
        assert!(closed.resolve("acme", "localhost", 80).await.is_err());
        let open = EgressConfig {
            allow_private: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(
            open.resolve("acme", "127.0.0.1", 8080).await.unwrap(),
            ["127.0.0.1:8080".parse().unwrap()]
        );
        assert_eq!(
            open.resolve("acme", "localhost", 8080).await.unwrap()[0].port(),
            8080
        );
    }

    #[test]
    fn each_tenants_new_connections_are_spaced_after_a_burst() {
        let pacer = Pacer::default();
        let rate = NonZeroU32::new(10).unwrap();
        let start = Instant::now();
        let turns: Vec<_> = (0..13).map(|_| pacer.turn("a", rate, start)).collect();
        let tenth = Duration::from_millis(100);
        assert!(
            turns[..10].iter().all(|&at| at == start),
            "the burst goes at once"
        );
        assert_eq!(
            turns[10..],
            [start + tenth, start + 2 * tenth, start + 3 * tenth]
        );
        assert_eq!(
            pacer.turn("b", rate, start),
            start,
            "b has a burst of its own"
        );
        // Idle for a second and a half: the burst is back.
        let later = start + Duration::from_millis(1500);
        let turns: Vec<_> = (0..11).map(|_| pacer.turn("a", rate, later)).collect();
        assert!(turns[..10].iter().all(|&at| at == later), "{turns:?}");
        assert_eq!(turns[10], later + tenth);
    }
}
