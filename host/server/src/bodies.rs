//! Request bodies read whole before their request can go on (the JSON routes' and `/mcp`'s):
//! each within [`BODY_READ_TIMEOUT`] of its first byte asked for, and one tenant's bodies held
//! at most [`MAX_BODY_BYTES_PER_TENANT`] together, from the first byte read until the last
//! copy of the bytes is dropped (parsed, or handed to rmcp and parsed there). Without them a
//! key's holder could trickle bodies on thousands of connections without end, or hold
//! gigabytes of them; the listener's bounds count connections, not bytes.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::per_tenant::{TenantSemaphores, charged};

/// The longest a request's body may take to arrive.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The bytes one tenant's request bodies may hold at once, read or being read.
pub const MAX_BODY_BYTES_PER_TENANT: usize = 64 << 20;

/// Each tenant's bytes of request bodies.
pub(crate) struct Bodies(TenantSemaphores);

impl Default for Bodies {
    fn default() -> Self {
        Bodies(TenantSemaphores::new(MAX_BODY_BYTES_PER_TENANT))
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
        "this tenant's request bodies in memory already hold about {MAX_BODY_BYTES_PER_TENANT} bytes, its limit: retry when some of its requests end"
    )]
    TenantFull,
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
        let room = self.0.of(tenant);
        let read = read_within(body, limit, &room);
        tokio::time::timeout(BODY_READ_TIMEOUT, read)
            .await
            .map_err(|_| BodyError::Timeout)?
    }
}

async fn read_within(body: Body, limit: usize, room: &Arc<Semaphore>) -> Result<Bytes, BodyError> {
    let mut stream = body.into_data_stream();
    let mut held: Option<OwnedSemaphorePermit> = None;
    let (mut chunks, mut read) = (Vec::new(), 0);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| BodyError::Failed(error.to_string()))?;
        read += chunk.len();
        if read > limit {
            return Err(BodyError::TooLarge(limit));
        }
        // Within `limit`, which is far below u32::MAX.
        let more = (room.clone().try_acquire_many_owned(chunk.len() as u32))
            .map_err(|_| BodyError::TenantFull)?;
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
        bodies.0.of(tenant).available_permits()
    }

    #[tokio::test]
    async fn a_tenants_bodies_hold_its_room_until_their_last_copy_drops() {
        let bodies = Bodies::default();
        let half = MAX_BODY_BYTES_PER_TENANT / 2;
        let first = bodies.read("a", Body::from(vec![b' '; half]), half).await;
        let first = first.unwrap();
        assert_eq!(first.len(), half);
        let copy = first.clone();
        drop(first);
        assert_eq!(available(&bodies, "a"), MAX_BODY_BYTES_PER_TENANT - half);
        let second = bodies.read("a", Body::from(vec![b' '; half]), half).await;
        let refused = bodies.read("a", Body::from(" "), 1).await;
        assert_eq!(refused, Err(BodyError::TenantFull));
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
        let bodies = Bodies::default();
        let large = bodies.read("a", Body::from(vec![b' '; 11]), 10).await;
        assert_eq!(large, Err(BodyError::TooLarge(10)));
        // Two bytes, then nothing more: the sender stalls.
        let stalled = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("{}")) })
            .chain(futures::stream::pending());
        tokio::time::pause();
        let slow = bodies.read("a", Body::from_stream(stalled), 10).await;
        assert_eq!(slow, Err(BodyError::Timeout));
        assert_eq!(available(&bodies, "a"), MAX_BODY_BYTES_PER_TENANT);
    }
}
