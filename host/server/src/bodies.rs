//! Request bodies read whole before their request can go on (the JSON routes' and `/mcp`'s):
//! each within [`BODY_READ_TIMEOUT`] of its first byte asked for, and one tenant's bodies held
//! at most [`MAX_BODY_BYTES_PER_TENANT`] together, all tenants' [`MAX_BODY_BYTES`], from the
//! first byte read until the last copy of the bytes is dropped (parsed, or handed to rmcp and
//! parsed there). Without them a key's holder could trickle bodies on thousands of connections
//! without end, or hold gigabytes of them; the listener's bounds count connections, not bytes.

use std::time::Duration;

use axum::body::{Body, Bytes};
use futures::StreamExt;

use crate::per_tenant::{ByteRoom, Full, Held, TenantRoom, charged};

/// The longest a request's body may take to arrive.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The bytes one tenant's request bodies may hold at once, read or being read.
pub const MAX_BODY_BYTES_PER_TENANT: usize = 64 << 20;

/// The bytes all tenants' request bodies may hold at once, unless the server is told otherwise:
/// sixteen tenants at their bound.
pub const MAX_BODY_BYTES: usize = 1 << 30;

/// Each tenant's bytes of request bodies, and all tenants'.
pub(crate) struct Bodies(ByteRoom);

impl Bodies {
    /// At most `all` bytes of all tenants' bodies together.
    pub(crate) fn new(all: usize) -> Self {
        Bodies(ByteRoom::new(MAX_BODY_BYTES_PER_TENANT, all))
    }
}

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the body is larger than {0} bytes, its limit")]
    TooLarge(usize),
    #[error("the body did not arrive within {} s", BODY_READ_TIMEOUT.as_secs())]
    Timeout,
    #[error(
        "this tenant's request bodies in memory already hold about {0} bytes, its limit: retry when some of its requests end"
    )]
    TenantFull(usize),
    #[error(
        "the server's request bodies in memory, all tenants' together, already hold about {0} bytes, its limit: retry later"
    )]
    ServerFull(usize),
    #[error("the body could not be read: {0}")]
    Failed(String),
}

impl Bodies {
    /// `body` read whole, if at most `limit` bytes and within the tenant's bytes; the bytes
    /// count against the tenant for as long as any copy of them lives.
    pub(crate) async fn read(
        &self,
        tenant: &str,
        body: Body,
        limit: usize,
    ) -> Result<Bytes, BodyError> {
        // A declared length past the limit is refused before a byte is read or waited for.
        if http_body::Body::size_hint(&body).lower() > limit as u64 {
            return Err(BodyError::TooLarge(limit));
        }
        let room = self.0.of(tenant);
        let read = read_within(body, limit, &room);
        tokio::time::timeout(BODY_READ_TIMEOUT, read)
            .await
            .map_err(|_| BodyError::Timeout)?
    }
}

async fn read_within(body: Body, limit: usize, room: &TenantRoom) -> Result<Bytes, BodyError> {
    let mut stream = body.into_data_stream();
    let mut held: Option<Held> = None;
    let (mut chunks, mut read) = (Vec::new(), 0);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| BodyError::Failed(error.to_string()))?;
        read += chunk.len();
        if read > limit {
            return Err(BodyError::TooLarge(limit));
        }
        // Within `limit`, which is far below u32::MAX.
        let more = room.take(chunk.len() as u32).map_err(|full| match full {
            Full::Tenant(bytes) => BodyError::TenantFull(bytes),
            Full::Server(bytes) => BodyError::ServerFull(bytes),
        })?;
        match &mut held {
            Some(held) => held.merge(more),
            None => held = Some(more),
        }
        chunks.push(chunk);
    }
    let Some(held) = held else {
        return Ok(Bytes::new());
    };
    // Most bodies arrive as one chunk: kept as it came, not copied.
    let bytes = match <[Bytes; 1]>::try_from(chunks) {
        Ok([one]) => one,
        Err(chunks) => Bytes::from(chunks.concat()),
    };
    Ok(charged(bytes, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn available(bodies: &Bodies, tenant: &str) -> usize {
        bodies.0.free(tenant).0
    }

    #[tokio::test]
    async fn a_tenants_bodies_hold_its_room_until_their_last_copy_drops() {
        let bodies = Bodies::new(MAX_BODY_BYTES);
        let half = MAX_BODY_BYTES_PER_TENANT / 2;
        let first = bodies.read("a", Body::from(vec![b' '; half]), half).await;
        let first = first.unwrap();
        assert_eq!(first.len(), half);
        let copy = first.clone();
        drop(first);
        assert_eq!(available(&bodies, "a"), MAX_BODY_BYTES_PER_TENANT - half);
        let second = bodies.read("a", Body::from(vec![b' '; half]), half).await;
        let refused = bodies.read("a", Body::from(" "), 1).await;
        assert_eq!(
            refused,
            Err(BodyError::TenantFull(MAX_BODY_BYTES_PER_TENANT))
        );
        assert_eq!(available(&bodies, "a"), 0, "a refused body holds nothing");
        let other = bodies.read("b", Body::from(vec![b' '; half]), half).await;
        assert!(other.is_ok(), "b has room of its own");
        drop((copy, second));
        assert_eq!(available(&bodies, "a"), MAX_BODY_BYTES_PER_TENANT);
        let empty = bodies.read("a", Body::empty(), 1).await.unwrap();
        assert!(empty.is_empty());
    }

    #[tokio::test]
    async fn a_body_past_its_limit_or_its_time_is_refused_and_holds_nothing() {
        let bodies = Bodies::new(MAX_BODY_BYTES);
        let large = bodies.read("a", Body::from(vec![b' '; 11]), 10).await;
        assert_eq!(large, Err(BodyError::TooLarge(10)));
        // Declared larger, then stalled: refused at once, not after the read timeout.
        let declared = http_body_util::StreamBody::new(futures::stream::pending::<
            Result<http_body::Frame<Bytes>, std::io::Error>,
        >());
        let declared = Declared(declared, 11);
        let refused = bodies.read("a", Body::new(declared), 10);
        let refused = tokio::time::timeout(Duration::from_secs(5), refused).await;
        assert_eq!(refused, Ok(Err(BodyError::TooLarge(10))));
        // Two bytes, then nothing more: the sender stalls.
        let stalled = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("{}")) })
            .chain(futures::stream::pending());
        tokio::time::pause();
        let slow = bodies.read("a", Body::from_stream(stalled), 10).await;
        assert_eq!(slow, Err(BodyError::Timeout));
        assert_eq!(available(&bodies, "a"), MAX_BODY_BYTES_PER_TENANT);
    }

    #[tokio::test]
    async fn all_tenants_bodies_are_bounded_together() {
        let bodies = Bodies(ByteRoom::new(10, 25));
        let a = bodies
            .read("a", Body::from(vec![b' '; 10]), 10)
            .await
            .unwrap();
        let b = bodies
            .read("b", Body::from(vec![b' '; 10]), 10)
            .await
            .unwrap();
        let c = bodies
            .read("c", Body::from(vec![b' '; 4]), 10)
            .await
            .unwrap();
        let refused = bodies.read("c", Body::from(vec![b' '; 2]), 10).await;
        assert_eq!(
            refused,
            Err(BodyError::ServerFull(25)),
            "c has room, the server has not"
        );
        assert_eq!(bodies.0.free("c"), (6, 1), "a refused body holds nothing");
        drop(a);
        let again = bodies.read("c", Body::from(vec![b' '; 2]), 10).await;
        assert_eq!(again.map(|bytes| bytes.len()), Ok(2));
        drop((b, c));
    }

    /// A body that declares `.1` bytes (as a `Content-Length` does) and sends what `.0` does.
    struct Declared<B>(B, u64);

    impl<B: http_body::Body + Unpin> http_body::Body for Declared<B> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
            std::pin::Pin::new(&mut self.0).poll_frame(cx)
        }

        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.1)
        }
    }
}
