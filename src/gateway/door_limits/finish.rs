//! When a connection ends, and how. A connection that was sent a last answer (an error
//! status, a refusal) lingers before it closes: its write side is shut (the client reads
//! the answer and then EOF) and what it still sends is read and dropped until it closes too
//! or the lingering time ends. Closing at once would make the kernel answer the unread
//! input with a reset, which destroys the answer in the client's receive buffer.

/// What ends a connection; the loop fills it each turn.
#[derive(Debug, Clone, Copy, Default)]
pub struct FinishFacts {
    /// A write failed or the stream became unframeable: close now.
    pub broken: bool,
    /// The peer closed its side (EOF read).
    pub read_closed: bool,
    /// No call of this connection is with the core.
    pub idle: bool,
    /// All output was written.
    pub drained: bool,
    /// Its last answer was queued (HTTP `Connection: close`, a refusal, a 4xx/5xx that
    /// ends the connection).
    pub last_answer: bool,
    /// Already lingering.
    pub lingering: bool,
}

/// What to do with a connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Keep,
    Close,
    /// Shut the write side and read the rest away before closing.
    Linger,
}

pub fn finish(f: FinishFacts) -> Finish {
    if f.broken {
        return Finish::Close;
    }
    if f.lingering {
        return if f.read_closed {
            Finish::Close
        } else {
            Finish::Keep
        };
    }
    if f.last_answer && f.drained {
        // A peer that already closed has nothing more to send: no need to wait.
        return if f.read_closed {
            Finish::Close
        } else {
            Finish::Linger
        };
    }
    if f.read_closed && f.idle && f.drained {
        return Finish::Close;
    }
    Finish::Keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_answer_lingers_once_written() {
        let mut f = FinishFacts {
            last_answer: true,
            idle: true,
            ..FinishFacts::default()
        };
        assert_eq!(finish(f), Finish::Keep, "not written yet");
        f.drained = true;
        assert_eq!(finish(f), Finish::Linger);
        f.read_closed = true;
        assert_eq!(finish(f), Finish::Close, "the peer is gone already");
    }

    #[test]
    fn lingering_ends_at_eof_or_when_broken() {
        let mut f = FinishFacts {
            lingering: true,
            drained: true,
            ..FinishFacts::default()
        };
        assert_eq!(finish(f), Finish::Keep);
        f.read_closed = true;
        assert_eq!(finish(f), Finish::Close);
        let broken = FinishFacts {
            broken: true,
            ..FinishFacts::default()
        };
        assert_eq!(finish(broken), Finish::Close);
    }

    #[test]
    fn a_peer_that_left_is_closed_once_its_calls_are_answered() {
        let mut f = FinishFacts {
            read_closed: true,
            drained: true,
            ..FinishFacts::default()
        };
        assert_eq!(finish(f), Finish::Keep, "a call is still in flight");
        f.idle = true;
        assert_eq!(finish(f), Finish::Close);
    }
}
