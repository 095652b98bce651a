//! `[servers] max_queued_bytes`: the bytes of arguments of calls in flight toward one
//! server (sent to its worker, not answered yet). A server that stops reading its stdin,
//! or answers slowly, otherwise lets agents pin any number of large requests in the
//! gateway and its worker until their timeouts; beyond the bound a call is refused at once
//! and its row says why.

use std::collections::HashMap;

use super::exchange::Exchange;
use super::{Core, Recorder};

/// Bytes in flight per server.
#[derive(Debug, Default)]
pub struct QueuedBytes {
    by_server: HashMap<String, usize>,
}

impl QueuedBytes {
    /// Take `bytes` for `server` within `max`; the refusal's words otherwise.
    pub fn take(&mut self, server: &str, bytes: usize, max: usize) -> Result<(), String> {
        let used = self.by_server.get(server).copied().unwrap_or(0);
        if used.saturating_add(bytes) > max {
            return Err(format!(
                "server {server} has {used} bytes of calls in flight; this call's {bytes} bytes would pass servers.max_queued_bytes ({max}); try again when its calls have ended"
            ));
        }
        *self.by_server.entry(server.to_owned()).or_insert(0) += bytes;
        Ok(())
    }

    pub fn give_back(&mut self, server: &str, bytes: usize) {
        if let Some(used) = self.by_server.get_mut(server) {
            *used = used.saturating_sub(bytes);
            if *used == 0 {
                self.by_server.remove(server);
            }
        }
    }

    #[cfg(test)]
    pub fn of(&self, server: &str) -> usize {
        self.by_server.get(server).copied().unwrap_or(0)
    }
}

impl<R: Recorder> Core<R> {
    /// A call to an upstream server holds its arguments' bytes until it ends.
    pub(super) fn take_queued_bytes(
        &mut self,
        x: &mut Exchange,
        bytes: usize,
    ) -> Result<(), String> {
        self.give_back_queued_bytes(x);
        x.queued_bytes = 0;
        let Some(max) = self.upstreams.as_ref().map(|u| u.max_queued_bytes()) else {
            return Ok(());
        };
        self.queued.take(&x.target.server, bytes, max)?;
        x.queued_bytes = bytes;
        Ok(())
    }

    pub(super) fn give_back_queued_bytes(&mut self, x: &Exchange) {
        if x.queued_bytes > 0 {
            self.queued.give_back(&x.target.server, x.queued_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_taken_within_the_bound_and_given_back() {
        let mut q = QueuedBytes::default();
        q.take("a", 60, 100).unwrap();
        let e = q.take("a", 50, 100).unwrap_err();
        assert!(
            e.contains("servers.max_queued_bytes (100)") && e.contains("server a"),
            "{e}"
        );
        // Another server has its own bound.
        q.take("b", 100, 100).unwrap();
        q.give_back("a", 60);
        assert_eq!(q.of("a"), 0);
        q.take("a", 100, 100).unwrap();
        q.give_back("zzz", 5);
    }
}
