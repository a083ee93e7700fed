//! MCP over stdin and stdout: the pipes, and a bound on the answers not yet written.
//!
//! rmcp reads the next request while earlier answers wait for the pipe, each in a task of its
//! own: a client that sends and never reads held about 12 KB per request, gigabytes within
//! seconds. [`Bounded`] reads no further while [`MAX_UNWRITTEN_ANSWERS`] answers await the
//! pipe, so the pipe's own back-pressure reaches the client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::sync::Notify;

/// Answers (and notifications) waiting to be written, at most, before reading stops.
pub const MAX_UNWRITTEN_ANSWERS: usize = 64;

/// stdin and stdout, answers bounded.
pub(crate) fn transport() -> impl Transport<RoleServer> + 'static {
    let (reader, writer) = pipes();
    Bounded {
        inner: AsyncRwTransport::new_server(reader, writer),
        unwritten: Arc::default(),
    }
}

type Reader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;
type Writer = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// stdin and stdout as non-blocking pipes where they are pipes (as an MCP client that spawns
/// its server connects them), so each read and write waits in epoll rather than being handed
/// to a thread of tokio's blocking pool and back; tokio's `stdin`/`stdout` otherwise.
fn pipes() -> (Reader, Writer) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let own = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().ok();
    let reader: Reader = match own(std::io::stdin().as_fd()).map(pipe::Receiver::from_owned_fd) {
        Some(Ok(pipe)) => Box::pin(pipe),
        _ => Box::pin(tokio::io::stdin()),
    };
    let writer: Writer = match own(std::io::stdout().as_fd()).map(pipe::Sender::from_owned_fd) {
        Some(Ok(pipe)) => Box::pin(pipe),
        _ => Box::pin(tokio::io::stdout()),
    };
    (reader, writer)
}

/// A transport that reads no further while [`MAX_UNWRITTEN_ANSWERS`] of its messages wait to
/// be written. (Not requests awaiting their answers: a client may cancel a long call, and
/// its cancellation must still be read.)
struct Bounded<T> {
    inner: T,
    unwritten: Arc<Unwritten>,
}

#[derive(Default)]
struct Unwritten {
    count: AtomicUsize,
    /// Woken as each message is written.
    written: Notify,
}

impl Unwritten {
    async fn room(&self) {
        loop {
            let written = self.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            if self.count.load(Ordering::Acquire) < MAX_UNWRITTEN_ANSWERS {
                return;
            }
            written.await;
        }
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Bounded<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.unwritten.count.fetch_add(1, Ordering::AcqRel);
        let (sent, unwritten) = (self.inner.send(item), self.unwritten.clone());
        async move {
            let sent = sent.await;
            unwritten.count.fetch_sub(1, Ordering::AcqRel);
            unwritten.written.notify_waiters();
            sent
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        self.unwritten.room().await;
        self.inner.receive().await
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::{ServerHandler, ServiceExt};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    struct Nothing;
    impl ServerHandler for Nothing {}

    /// A client that sends and does not read holds up its own requests, not the host's
    /// memory: past the bound the server reads no further, so the client's writes wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_does_not_read_is_not_read_either() {
        let (client_out, server_in) = tokio::io::duplex(4096);
        let (server_out, client_in) = tokio::io::duplex(4096);
        let transport = Bounded {
            inner: AsyncRwTransport::new_server(server_in, server_out),
            unwritten: Arc::default(),
        };
        let server = tokio::spawn(async move {
            let running = Nothing.serve(transport).await.map_err(|e| e.to_string())?;
            running.waiting().await.map_err(|e| e.to_string())
        });
        const PINGS: usize = 5_000;
        let writer = tokio::spawn(async move {
            let mut client_out = client_out;
            let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
            let ready = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
            client_out
                .write_all(format!("{init}\n{ready}\n").as_bytes())
                .await?;
            for id in 1..=PINGS {
                let ping = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n");
                client_out.write_all(ping.as_bytes()).await?;
            }
            Ok::<_, std::io::Error>(client_out)
        });
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert!(
            !writer.is_finished(),
            "the server read every request, answers unwritten"
        );
        // Read, and every request is answered.
        let mut lines = tokio::io::BufReader::new(client_in).lines();
        for _ in 0..=PINGS {
            lines.next_line().await.unwrap().expect("an answer");
        }
        drop(writer.await.unwrap().unwrap());
        let _ = server.await;
    }
}
