//! The stdin thread's side of the connection: connecting (with backoff), the meta line,
//! stream ids, and writing frames. Only this thread writes to the socket.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolwall_relay::frame::{self, FLAG_NOTIFICATION};

use super::jsonrpc_error::{TRANSPORT_ERROR, error_line};
use super::options::Target;
use super::session::{Pending, Session};
use super::transport::Stream;
use super::{diag, socket_reader, stdout_line};

/// Wait after the first failed connect before trying again.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between connect attempts; the wait doubles up to it.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Frame buffer capacity kept between frames.
const KEPT_CAPACITY: usize = 64 * 1024;

struct Connected {
    generation: u64,
    writer: Stream,
    /// The next request's stream id; 0 once all are used (then a new connection starts at 1).
    next_stream_id: u32,
}

struct Backoff {
    delay: Duration,
    retry_at: Option<Instant>,
    last_error: String,
}

pub struct Link {
    target: Target,
    name: String,
    session: Arc<Session>,
    current: Option<Connected>,
    backoff: Backoff,
    frame: Vec<u8>,
}

impl Link {
    /// `name` must already be sanitised.
    pub fn new(target: Target, name: String, session: Arc<Session>) -> Self {
        Self {
            target,
            name,
            session,
            current: None,
            backoff: Backoff {
                delay: RECONNECT_BACKOFF_MIN,
                retry_at: None,
                last_error: String::new(),
            },
            frame: Vec::new(),
        }
    }

    /// Connect now if not connected; a failure is reported and retried later.
    pub fn connect_early(&mut self) {
        let _ = self.ensure_connected();
    }

    /// Frame a request on the next stream id. Failures are answered on stdout.
    pub fn send_request(&mut self, payload: &[u8], mut request: Pending) {
        // A second try covers a connection found dead between connecting and registering;
        // nothing was sent on it, so this is not a replay.
        for _ in 0..2 {
            let (generation, stream_id) = match self.next_stream() {
                Ok(ids) => ids,
                Err(why) => return answer_locally(&request.id, &why),
            };
            if let Err(e) = self.encode(stream_id, 0, payload) {
                return answer_locally(&request.id, &e.to_string());
            }
            match self.session.register(generation, stream_id, request) {
                Ok(()) => return self.write_frame(),
                Err(back) => {
                    request = back;
                    self.retire();
                }
            }
        }
        let why = format!("transport disconnected before {} was sent", request.method);
        answer_locally(&request.id, &why);
    }

    /// Frame a notification on stream 0. It cannot be answered, so failures are only noted.
    pub fn send_notification(&mut self, payload: &[u8]) {
        if let Err(why) = self.ensure_connected() {
            return diag::warn(format_args!("dropped a notification: {why}"));
        }
        match self.encode(0, FLAG_NOTIFICATION, payload) {
            Ok(()) => self.write_frame(),
            Err(e) => diag::warn(format_args!("dropped a notification: {e}")),
        }
    }

    fn encode(
        &mut self,
        stream_id: u32,
        flags: u16,
        payload: &[u8],
    ) -> Result<(), frame::EncodeError> {
        self.frame.clear();
        if self.frame.capacity() > KEPT_CAPACITY {
            self.frame.shrink_to(KEPT_CAPACITY);
        }
        frame::encode(&mut self.frame, stream_id, flags, &self.name, payload)
    }

    fn next_stream(&mut self) -> Result<(u64, u32), String> {
        self.ensure_connected()?;
        let conn = self
            .current
            .as_mut()
            .ok_or_else(|| format!("not connected to {}", self.target))?;
        let stream_id = conn.next_stream_id;
        conn.next_stream_id = stream_id.checked_add(1).unwrap_or(0);
        Ok((conn.generation, stream_id))
    }

    fn ensure_connected(&mut self) -> Result<(), String> {
        if let Some(conn) = &self.current {
            if conn.next_stream_id != 0 && self.session.is_open(conn.generation) {
                return Ok(());
            }
            self.retire();
        }
        let now = Instant::now();
        if let Some(retry_at) = self.backoff.retry_at
            && now < retry_at
        {
            return Err(format!(
                "cannot connect to {}: {} (next attempt in {} ms)",
                self.target,
                self.backoff.last_error,
                (retry_at - now).as_millis()
            ));
        }
        match self.connect() {
            Ok(conn) => {
                diag::info(format_args!(
                    "connected to {} as {:?}",
                    self.target, self.name
                ));
                self.backoff.delay = RECONNECT_BACKOFF_MIN;
                self.backoff.retry_at = None;
                self.current = Some(conn);
                Ok(())
            }
            Err(e) => {
                let why = format!("cannot connect to {}: {e}", self.target);
                diag::warn(format_args!("{why}"));
                self.backoff.retry_at = Some(now + self.backoff.delay);
                self.backoff.delay = (self.backoff.delay * 2).min(RECONNECT_BACKOFF_MAX);
                self.backoff.last_error = e.to_string();
                Err(why)
            }
        }
    }

    fn connect(&self) -> io::Result<Connected> {
        let mut writer = Stream::connect(&self.target)?;
        let reader = writer.try_clone()?;
        let generation = self.session.open_connection();
        let started = socket_reader::spawn(
            Arc::clone(&self.session),
            generation,
            reader,
            self.target.to_string(),
        )
        .and_then(|()| writer.write_all(&frame::meta_line_for(&self.name)));
        if let Err(e) = started {
            self.session.close_connection(generation);
            writer.shutdown();
            return Err(e);
        }
        Ok(Connected {
            generation,
            writer,
            next_stream_id: 1,
        })
    }

    /// Drop the current connection; its pending requests get -32001.
    fn retire(&mut self) {
        if let Some(conn) = self.current.take() {
            self.session.close_connection(conn.generation);
            conn.writer.shutdown();
        }
    }

    fn write_frame(&mut self) {
        let Some(conn) = self.current.as_mut() else {
            return;
        };
        if let Err(e) = conn.writer.write_all(&self.frame) {
            diag::warn(format_args!("writing to {}: {e}", self.target));
            self.retire();
        }
    }
}

fn answer_locally(id: &str, why: &str) {
    stdout_line::write(error_line(Some(id), TRANSPORT_ERROR, why).as_bytes());
}
