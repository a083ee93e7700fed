//! What a tool may ask of the host: the host side of the WIT `helpers` interface, shared by
//! Wasm and native tools so both get the same behaviour and the same caps.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::call::{CallLog, Level, LogLine};

/// Each of: helper log lines (all together), stdout, stderr.
pub const MAX_LOG_BYTES: usize = 64 * 1024;

/// One call's handle on the host. Cheap to clone; every clone writes to the same call.
#[derive(Clone, Default)]
pub struct Helpers {
    log: Arc<Mutex<LogBuffer>>,
}

#[derive(Default)]
struct LogBuffer {
    lines: Vec<LogLine>,
    line_bytes: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped_bytes: u64,
}

#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Helpers {
    /// Appends a line to the call's log; past the cap it is counted, not kept.
    pub fn log(&self, level: Level, message: &str) {
        let mut log = self.buffer();
        if log.line_bytes + message.len() > MAX_LOG_BYTES {
            log.dropped_bytes += message.len() as u64;
            return;
        }
        log.line_bytes += message.len();
        log.lines.push(LogLine {
            level,
            message: message.to_owned(),
        });
    }

    /// Appends the guest's output, keeping the first [`MAX_LOG_BYTES`] of each stream.
    pub(crate) fn write(&self, stream: Stream, bytes: &[u8]) {
        let mut log = self.buffer();
        let log = &mut *log;
        let sink = match stream {
            Stream::Stdout => &mut log.stdout,
            Stream::Stderr => &mut log.stderr,
        };
        let kept = bytes.len().min(MAX_LOG_BYTES - sink.len());
        sink.extend_from_slice(&bytes[..kept]);
        log.dropped_bytes += (bytes.len() - kept) as u64;
    }

    /// The log as it stands.
    pub fn snapshot(&self) -> CallLog {
        let log = self.buffer();
        CallLog {
            lines: log.lines.clone(),
            stdout: String::from_utf8_lossy(&log.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&log.stderr).into_owned(),
            dropped_bytes: log.dropped_bytes,
        }
    }

    fn buffer(&self) -> MutexGuard<'_, LogBuffer> {
        // A panic while holding this lock cannot leave the buffer inconsistent.
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_and_the_rest_counted() {
        let helpers = Helpers::default();
        helpers.write(Stream::Stdout, &vec![b'x'; MAX_LOG_BYTES - 10]);
        helpers.write(Stream::Stdout, &[b'y'; 25]);
        helpers.write(Stream::Stderr, b"err");
        let log = helpers.snapshot();
        assert_eq!(log.stdout.len(), MAX_LOG_BYTES);
        assert!(log.stdout.ends_with("yyyyyyyyyy"));
        assert_eq!(log.stderr, "err");
        assert_eq!(log.dropped_bytes, 15);
    }

    #[test]
    fn log_lines_are_capped_in_total() {
        let helpers = Helpers::default();
        let line = "z".repeat(1000);
        for _ in 0..100 {
            helpers.log(Level::Info, &line);
        }
        let log = helpers.snapshot();
        assert_eq!(log.lines.len(), MAX_LOG_BYTES / 1000);
        assert_eq!(log.dropped_bytes, (100 - log.lines.len() as u64) * 1000);
    }
}
