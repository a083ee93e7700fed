//! Response bodies on their way out: one tenant's hold at most
//! [`MAX_RESPONSE_BYTES_PER_TENANT`] together, all tenants' [`MAX_RESPONSE_BYTES`], from when
//! their handler returns until the last
//! copy of their bytes drops (hyper drops each frame once the socket has taken it, or when the
//! connection ends). The listener cuts off a client that takes nothing for 30 s, not one that
//! takes a byte now and then: without this bound a key's holder could ask for its largest
//! answers (an export, a listing, a call's result) on thousands of connections, read a byte of
//! each now and then, and hold gigabytes of the host's memory.
//!
//! A response of known size (every JSON answer) is charged whole before it is sent, and refused
//! if its tenant has no room. A stream (an MCP event stream) is charged frame by frame as hyper
//! takes them, and a frame with no room ends the stream: an MCP client resumes it with
//! `Last-Event-ID` once its other responses are read. Answers and frames under
//! [`UNCOUNTED_BYTES`] pass without a charge, so most requests pay nothing: hyper polls a
//! stream's next frame only when its write buffer (about 400 KiB) has room, and the listener's
//! connection cap bounds how many such answers there are.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use axum::body::{Body, Bytes};
use axum::response::Response;
use http_body::{Body as _, Frame, SizeHint};

use crate::per_tenant::{ByteRoom, Full, Held, TenantRoom, charged};

/// The bytes one tenant's responses may hold at once, not yet taken by their clients.
pub const MAX_RESPONSE_BYTES_PER_TENANT: usize = 128 << 20;

/// The bytes all tenants' responses may hold at once, unless the server is told otherwise:
/// sixteen tenants at their bound.
pub const MAX_RESPONSE_BYTES: usize = 2 << 30;

/// Answers, and frames of a stream, smaller than this are not counted.
pub const UNCOUNTED_BYTES: usize = 64 << 10;

/// Each tenant's bytes of responses, and all tenants'.
pub(crate) struct Responses(ByteRoom);

impl Responses {
    /// At most `all` bytes of all tenants' responses together.
    pub(crate) fn new(all: usize) -> Self {
        Responses(ByteRoom::new(MAX_RESPONSE_BYTES_PER_TENANT, all))
    }
}

/// The tenant that pays for a request's response: put in the request's extensions empty, and
/// filled once the request's key is known.
#[derive(Clone, Default)]
pub(crate) struct Payer(Arc<OnceLock<String>>);

impl Payer {
    pub(crate) fn is(&self, tenant: &str) {
        let _ = self.0.set(tenant.to_owned());
    }

    pub(crate) fn tenant(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// Why a response was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unsent {
    #[error(
        "the answer was dropped unsent: this tenant's responses that its clients have not yet \
         read hold about {} MiB, its limit; read them, then retry",
        .0 >> 20
    )]
    TenantFull(usize),
    #[error(
        "the answer was dropped unsent: the server's responses that their clients have not yet \
         read, all tenants' together, hold about {} MiB, its limit; retry later",
        .0 >> 20
    )]
    ServerFull(usize),
}

impl From<Full> for Unsent {
    fn from(full: Full) -> Self {
        match full {
            Full::Tenant(bytes) => Unsent::TenantFull(bytes),
            Full::Server(bytes) => Unsent::ServerFull(bytes),
        }
    }
}

impl Responses {
    /// `response` with its bytes charged to `tenant` until they are written; refused if its
    /// size is known and the tenant has no room for it.
    pub(crate) fn charge(&self, tenant: &str, response: Response) -> Result<Response, Unsent> {
        let (parts, body) = response.into_parts();
        let size = body.size_hint().exact();
        if size.is_some_and(|size| size < UNCOUNTED_BYTES as u64) {
            return Ok(Response::from_parts(parts, body));
        }
        let room = self.0.of(tenant);
        let most = self.0.each();
        let paid = match size {
            Some(size) => Some(take(&room, most, size)?),
            None => None,
        };
        let body = Body::new(ChargedBody {
            inner: body,
            room,
            most,
            paid,
        });
        Ok(Response::from_parts(parts, body))
    }
}

/// Room for `size` bytes, if free now. A response larger than a tenant's whole room, `most`
/// (the export of a tenant with many tools), costs the whole room: it may go out, alone.
fn take(room: &TenantRoom, most: usize, size: u64) -> Result<Held, Unsent> {
    let cost = size.min(most as u64) as u32;
    Ok(room.take(cost)?)
}

/// A body whose data frames each hold their bytes' room until dropped.
struct ChargedBody {
    inner: Body,
    room: TenantRoom,
    /// The most one frame costs: a tenant's whole room.
    most: usize,
    /// Taken before the first frame, for a body of known size: its frames are paid from it.
    paid: Option<Held>,
}

impl http_body::Body for ChargedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            ended_or_failed => return Poll::Ready(ended_or_failed),
        };
        let data = match frame.into_data() {
            Ok(data) if !data.is_empty() => data,
            Ok(empty) => return Poll::Ready(Some(Ok(Frame::data(empty)))),
            Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
        };
        let size = data.len().min(this.most);
        let room = match this.paid.as_mut().and_then(|paid| paid.split(size)) {
            Some(room) => room,
            None if data.len() < UNCOUNTED_BYTES => {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            None => match take(&this.room, this.most, size as u64) {
                Ok(room) => room,
                Err(unsent) => return Poll::Ready(Some(Err(axum::Error::new(unsent)))),
            },
        };
        Poll::Ready(Some(Ok(Frame::data(charged(data, room)))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn available(responses: &Responses, tenant: &str) -> usize {
        responses.0.free(tenant).0
    }

    fn sized(bytes: usize) -> Response {
        Response::new(Body::from(vec![b' '; bytes]))
    }

    #[tokio::test]
    async fn a_tenants_responses_hold_its_room_until_their_bytes_are_written() {
        let responses = Responses::new(MAX_RESPONSE_BYTES);
        let half = MAX_RESPONSE_BYTES_PER_TENANT / 2;
        let first = responses.charge("a", sized(half)).unwrap();
        let second = responses.charge("a", sized(half)).unwrap();
        let next = responses.charge("a", sized(UNCOUNTED_BYTES));
        assert_eq!(
            next.err(),
            Some(Unsent::TenantFull(MAX_RESPONSE_BYTES_PER_TENANT))
        );
        let small = responses.charge("a", sized(UNCOUNTED_BYTES - 1));
        assert!(small.is_ok(), "a small answer is not counted");
        let other = responses.charge("b", sized(half));
        assert!(other.is_ok(), "b has room of its own");
        // The server takes the frame and drops the body; the frame waits for the socket.
        let mut body = first.into_body();
        let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(frame.len(), half);
        assert!(body.is_end_stream());
        drop(body);
        assert_eq!(
            available(&responses, "a"),
            0,
            "the frame is not written yet"
        );
        drop(frame);
        assert_eq!(available(&responses, "a"), half);
        // A response dropped unsent gives its room back.
        drop(second);
        assert_eq!(available(&responses, "a"), MAX_RESPONSE_BYTES_PER_TENANT);
    }

    #[tokio::test]
    async fn a_response_larger_than_the_room_goes_out_alone() {
        let responses = Responses::new(MAX_RESPONSE_BYTES);
        let whole = MAX_RESPONSE_BYTES_PER_TENANT + 10;
        let large = responses.charge("a", sized(whole)).unwrap();
        assert_eq!(available(&responses, "a"), 0);
        let next = responses.charge("a", sized(UNCOUNTED_BYTES));
        assert_eq!(
            next.err(),
            Some(Unsent::TenantFull(MAX_RESPONSE_BYTES_PER_TENANT))
        );
        let sent = large.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(sent.len(), whole);
        drop(sent);
        assert_eq!(available(&responses, "a"), MAX_RESPONSE_BYTES_PER_TENANT);
    }

    /// A stream's size is not known up front: each frame is paid as it is taken, and a frame
    /// with no room ends the stream, holding nothing; a small frame passes unpaid.
    #[tokio::test]
    async fn a_streams_frame_with_no_room_ends_the_stream() {
        let responses = Responses::new(MAX_RESPONSE_BYTES);
        let three_quarters = MAX_RESPONSE_BYTES_PER_TENANT / 4 * 3;
        let held = responses.charge("a", sized(three_quarters)).unwrap();
        let quarter = MAX_RESPONSE_BYTES_PER_TENANT / 4;
        let frames = [
            Bytes::from(vec![b'.'; quarter]),
            Bytes::from_static(b"small"),
            Bytes::from(vec![b'!'; UNCOUNTED_BYTES]),
        ];
        let stream = futures::stream::iter(frames.map(Ok::<_, std::io::Error>));
        let response = responses.charge("a", Response::new(Body::from_stream(stream)));
        let mut body = response.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), quarter, "the first frame fits");
        let small = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(small, "small");
        let refused = body.frame().await.unwrap();
        let error = refused.unwrap_err().into_inner();
        assert_eq!(
            error.to_string(),
            Unsent::TenantFull(MAX_RESPONSE_BYTES_PER_TENANT).to_string()
        );
        drop((held, first, body));
        assert_eq!(available(&responses, "a"), MAX_RESPONSE_BYTES_PER_TENANT);
    }

    #[tokio::test]
    async fn all_tenants_responses_are_bounded_together() {
        let each = 2 * UNCOUNTED_BYTES;
        let responses = Responses(ByteRoom::new(each, 3 * UNCOUNTED_BYTES));
        let a = responses.charge("a", sized(each)).unwrap();
        let b = responses.charge("b", sized(UNCOUNTED_BYTES)).unwrap();
        let refused = responses.charge("c", sized(UNCOUNTED_BYTES));
        assert_eq!(
            refused.err(),
            Some(Unsent::ServerFull(3 * UNCOUNTED_BYTES)),
            "c has room, the server has not"
        );
        assert_eq!(
            responses.0.free("c"),
            (each, 0),
            "a refused answer holds nothing"
        );
        drop(a);
        assert!(responses.charge("c", sized(UNCOUNTED_BYTES)).is_ok());
        drop(b);
    }
}
