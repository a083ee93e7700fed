//! Where outbound connections may go. Names are resolved here, and every address is checked
//! before connecting to that very address, so a name that later resolves elsewhere (DNS
//! rebinding) cannot reach what the check refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The operator's egress settings, host-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Non-public addresses (loopback, private, link-local, …) that outbound requests may
    /// reach: addresses or CIDR ranges such as `127.0.0.1` or `10.1.0.0/16`. Empty: none.
    pub allow_private: Vec<Cidr>,
}

/// An address range, written `10.0.0.0/8` or a bare address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, prefix) = text.split_once('/').unwrap_or((text, ""));
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("`{text}` is not an IP address or CIDR range"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: the prefix must be 0 to {max}"))?
        };
        Ok(Cidr { network, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
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
    pub fn contains(&self, ip: IpAddr) -> bool {
        fn bits(ip: IpAddr) -> u128 {
            match ip {
                IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
                IpAddr::V6(v6) => u128::from(v6),
            }
        }
        let ip = canonical(ip);
        if ip.is_ipv4() != self.network.is_ipv4() {
            return false;
        }
        let shift = if ip.is_ipv4() { 32 } else { 128 } - u32::from(self.prefix);
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (shift + if ip.is_ipv4() { 96 } else { 0 })
        };
        bits(ip) & mask == bits(self.network) & mask
    }
}

/// An IPv4 address mapped into IPv6 is checked as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Reachable from anywhere on the internet: not loopback, private, link-local, shared,
/// documentation, multicast, unspecified or otherwise reserved.
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
        || first == 0x2001 && ip.segments()[1] == 0x0db8 // documentation
        || first == 0x0064 && ip.segments()[1] == 0xff9b) // NAT64, which can reach IPv4 private
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("cannot resolve `{host}`: {reason}")]
    Resolve { host: String, reason: String },
    #[error(
        "`{host}` resolves to {ip}, a non-public address the operator has not allowed (egress.allow_private)"
    )]
    Private { host: String, ip: IpAddr },
}

impl EgressConfig {
    /// Whether a connection to `ip` is allowed.
    pub fn permits(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.allow_private.iter().any(|c| c.contains(ip))
    }

    /// The addresses of `host:port` that may be connected to. Refuses the name if any of its
    /// addresses is refused, so that which one is tried first cannot matter.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, EgressError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|e| EgressError::Resolve {
                    host: host.to_owned(),
                    reason: e.to_string(),
                })?
                .collect(),
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
    /// Connects to `host:port`, resolved once and checked address by address. `granted_ip`
    /// is an address the caller's grant names explicitly, allowed even if non-public.
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
        granted_ip: Option<IpAddr>,
    ) -> Result<TcpStream, ConnectError> {
        let addresses = match granted_ip {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => self.resolve(host, port).await.map_err(|e| match e {
                EgressError::Private { .. } => ConnectError::Refused(e),
                EgressError::Resolve { .. } => ConnectError::Failed(e.to_string()),
            })?,
        };
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
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
        for public in ["1.1.1.1", "93.184.216.34", "2606:4700:4700::1111"] {
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
        let refused = closed.resolve("127.0.0.1", 80).await.unwrap_err();
        assert!(matches!(refused, EgressError::Private { .. }));
        assert!(refused.to_string().contains("egress.allow_private"));
        assert!(closed.resolve("localhost", 80).await.is_err());
        let open = EgressConfig {
            allow_private: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
        };
        assert_eq!(
            open.resolve("127.0.0.1", 8080).await.unwrap(),
            ["127.0.0.1:8080".parse().unwrap()]
        );
    }
}
