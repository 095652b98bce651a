//! Rows waiting for the next commit: one queue of small ops whose texts and bodies live in
//! one shared byte arena, so staging a call costs copies but (in steady state) no
//! allocation, and a commit clears both without freeing them.
//!
//! Each op owns the arena bytes between the previous op's end and its own `end`, so dropping
//! the oldest ops frees a prefix of the arena; that prefix is reclaimed once it is at least
//! half of the arena (amortised O(1) per dropped op).

use std::collections::VecDeque;

/// Arena capacity kept across commits; a burst beyond it is given back afterwards.
const ARENA_KEEP_BYTES: usize = 1 << 20;
/// Queue capacity kept across commits.
const OPS_KEEP: usize = 16 * 1024;

/// A byte range of the arena. `u32` keeps ops small; the configured bound on staged bytes
/// keeps the arena far below 4 GiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    start: u32,
    len: u32,
}

/// One staged row. Strings are spans of the arena; digests are 32 raw bytes in the arena.
#[derive(Debug, Clone)]
pub enum Op {
    Blob {
        ts_ms: i64,
        digest: Span,
        body: Span,
        size: i64,
        truncated: bool,
    },
    CallStart {
        id: i64,
        ts_ms: i64,
        bytes_received: i64,
        transport: Span,
        principal: Span,
        process_name: Span,
        server_name: Span,
        tool_name: Span,
        method: Span,
        request_id: Span,
        decision: Span,
        policy_rule: Option<Span>,
        policy_reason: Option<Span>,
        arguments_preview: Span,
        request_digest: Option<Span>,
    },
    CallEnd {
        id: i64,
        duration_us: i64,
        bytes_sent: i64,
        decided_at_ms: Option<i64>,
        decision: Span,
        policy_rule: Option<Span>,
        policy_reason: Option<Span>,
        error_message: Option<Span>,
        approved_by: Option<Span>,
        response_preview: Span,
        response_digest: Option<Span>,
        rewritten_digest: Option<Span>,
        original_digest: Option<Span>,
    },
    RuleEvent {
        call_id: i64,
        seq: u32,
        ts_ms: i64,
        rule_id: Span,
        action: Span,
        phase: Span,
        layer: Span,
    },
    Event {
        ts_ms: i64,
        kind: Span,
        detail: Span,
    },
}

impl Op {
    /// Moves every span `by` bytes towards the arena start (after a prefix was reclaimed).
    fn shift_down(&mut self, by: u32) {
        self.visit_spans(&mut |span| span.start = span.start.saturating_sub(by));
    }

    /// Calls `s` on every span the op holds (present optional ones included), in a fixed
    /// order. The patterns name every field (no `..`), so a field added later cannot be
    /// forgotten here without a compile error; a forgotten span would be corrupted by
    /// reclaiming.
    fn visit_spans(&mut self, s: &mut impl FnMut(&mut Span)) {
        fn o(span: &mut Option<Span>, s: &mut impl FnMut(&mut Span)) {
            if let Some(span) = span {
                s(span);
            }
        }
        match self {
            Op::Blob {
                ts_ms: _,
                digest,
                body,
                size: _,
                truncated: _,
            } => {
                s(digest);
                s(body);
            }
            Op::CallStart {
                transport,
                principal,
                process_name,
                server_name,
                tool_name,
                method,
                request_id,
                decision,
                policy_rule,
                policy_reason,
                arguments_preview,
                request_digest,
                id: _,
                ts_ms: _,
                bytes_received: _,
            } => {
                for span in [
                    transport,
                    principal,
                    process_name,
                    server_name,
                    tool_name,
                    method,
                    request_id,
                    decision,
                    arguments_preview,
                ] {
                    s(span);
                }
                for span in [policy_rule, policy_reason, request_digest] {
                    o(span, s);
                }
            }
            Op::CallEnd {
                decision,
                policy_rule,
                policy_reason,
                error_message,
                approved_by,
                response_preview,
                response_digest,
                rewritten_digest,
                original_digest,
                id: _,
                duration_us: _,
                bytes_sent: _,
                decided_at_ms: _,
            } => {
                s(decision);
                s(response_preview);
                for span in [
                    policy_rule,
                    policy_reason,
                    error_message,
                    approved_by,
                    response_digest,
                    rewritten_digest,
                    original_digest,
                ] {
                    o(span, s);
                }
            }
            Op::RuleEvent {
                rule_id,
                action,
                phase,
                layer,
                call_id: _,
                seq: _,
                ts_ms: _,
            } => {
                for span in [rule_id, action, phase, layer] {
                    s(span);
                }
            }
            Op::Event {
                ts_ms: _,
                kind,
                detail,
            } => {
                s(kind);
                s(detail);
            }
        }
    }
}

struct Entry {
    /// Arena offset just past this op's bytes.
    end: u32,
    op: Op,
}

/// The staging queue with its bounds.
pub struct Staged {
    arena: Vec<u8>,
    /// Arena bytes before this offset belong to dropped ops.
    dead: usize,
    entries: VecDeque<Entry>,
    max_rows: usize,
    max_bytes: usize,
    /// Rows dropped since the last commit that reported them.
    dropped_rows: u64,
}

impl Staged {
    pub fn new(max_rows: usize, max_bytes: usize) -> Self {
        Staged {
            arena: Vec::new(),
            dead: 0,
            entries: VecDeque::new(),
            max_rows,
            max_bytes,
            dropped_rows: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held for staged rows (texts, digests, bodies).
    pub fn live_bytes(&self) -> usize {
        self.arena.len() - self.dead
    }

    pub fn dropped_rows(&self) -> u64 {
        self.dropped_rows
    }

    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.entries.iter().map(|entry| &entry.op)
    }

    /// The bytes of a span; empty for a span that does not fit (never happens by
    /// construction, but a bug here must not panic the gateway).
    pub fn bytes(&self, span: Span) -> &[u8] {
        let start = span.start as usize;
        self.arena
            .get(start..start + span.len as usize)
            .unwrap_or_default()
    }

    /// The 32 bytes of a digest span.
    pub fn digest(&self, span: Span) -> [u8; super::body::DIGEST_LEN] {
        let mut out = [0u8; super::body::DIGEST_LEN];
        let bytes = self.bytes(span);
        if bytes.len() == out.len() {
            out.copy_from_slice(bytes);
        }
        out
    }

    /// Copies `bytes` into the arena.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Span {
        // Bounds at open keep the arena below u32::MAX; saturate rather than wrap if not.
        let start = u32::try_from(self.arena.len()).unwrap_or(u32::MAX);
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.arena.extend_from_slice(bytes);
        Span { start, len }
    }

    /// Appends with `write`, returning the span it wrote.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> Span {
        let start = self.arena.len();
        write(&mut self.arena);
        Span {
            start: u32::try_from(start).unwrap_or(u32::MAX),
            len: u32::try_from(self.arena.len() - start).unwrap_or(u32::MAX),
        }
    }

    /// Forgets the arena bytes written after `span` started (an abandoned write).
    pub fn truncate_to(&mut self, span: Span) {
        self.arena.truncate(span.start as usize);
    }

    /// Queues an op that owns every arena byte written since the previous op, then drops
    /// the oldest ops while a bound is exceeded.
    pub fn push_op(&mut self, op: Op) {
        let end = u32::try_from(self.arena.len()).unwrap_or(u32::MAX);
        self.entries.push_back(Entry { end, op });
        self.enforce_bounds();
    }

    fn enforce_bounds(&mut self) {
        let mut dropped = 0u64;
        while self.entries.len() > self.max_rows
            || (self.live_bytes() > self.max_bytes && self.entries.len() > 1)
        {
            let Some(oldest) = self.entries.pop_front() else {
                break;
            };
            self.dead = oldest.end as usize;
            dropped += 1;
        }
        if dropped == 0 {
            return;
        }
        self.dropped_rows += dropped;
        if self.dead * 2 >= self.arena.len() {
            self.reclaim_dead_prefix();
        }
    }

    fn reclaim_dead_prefix(&mut self) {
        let by = self.dead;
        let by32 = u32::try_from(by).unwrap_or(u32::MAX);
        self.arena.drain(..by);
        for entry in &mut self.entries {
            entry.end = entry.end.saturating_sub(by32);
            entry.op.shift_down(by32);
        }
        self.dead = 0;
    }

    /// After a successful commit: forget every op and the drop count, keep the memory
    /// unless a burst made it large.
    pub fn clear_committed(&mut self) {
        self.entries.clear();
        self.arena.clear();
        self.dead = 0;
        self.dropped_rows = 0;
        if self.arena.capacity() > ARENA_KEEP_BYTES {
            self.arena.shrink_to(ARENA_KEEP_BYTES);
        }
        if self.entries.capacity() > OPS_KEEP {
            self.entries.shrink_to(OPS_KEEP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(staged: &mut Staged, text: &str) {
        let kind = staged.push_bytes(b"k");
        let detail = staged.push_bytes(text.as_bytes());
        staged.push_op(Op::Event {
            ts_ms: 0,
            kind,
            detail,
        });
    }

    fn details(staged: &Staged) -> Vec<String> {
        staged
            .ops()
            .map(|op| match op {
                Op::Event { detail, .. } => {
                    String::from_utf8(staged.bytes(*detail).to_vec()).unwrap()
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn drops_oldest_beyond_row_bound_and_keeps_the_rest_intact() {
        let mut staged = Staged::new(3, 1 << 20);
        for i in 0..10 {
            event(&mut staged, &format!("detail-{i}"));
        }
        assert_eq!(staged.len(), 3);
        assert_eq!(staged.dropped_rows(), 7);
        assert_eq!(details(&staged), ["detail-7", "detail-8", "detail-9"]);
        // Reclaiming kept the arena near the live size.
        assert!(staged.arena.len() <= 2 * staged.live_bytes() + 16);
    }

    #[test]
    fn drops_oldest_beyond_byte_bound() {
        let mut staged = Staged::new(1000, 100);
        for i in 0..10 {
            event(&mut staged, &format!("{i}{}", "x".repeat(39)));
        }
        assert!(staged.live_bytes() <= 100);
        assert_eq!(staged.len() as u64 + staged.dropped_rows(), 10);
        let kept = details(&staged);
        assert!(kept.last().unwrap().starts_with('9'));
    }

    /// An op of each kind with placeholder spans; `present` says which optional ones exist.
    fn template(kind: u8, present: u8) -> Op {
        let z = Span::default();
        let opt = |bit: u8| (present & (1 << bit) != 0).then_some(z);
        match kind % 5 {
            0 => Op::Blob {
                ts_ms: 1,
                digest: z,
                body: z,
                size: 0,
                truncated: false,
            },
            1 => Op::CallStart {
                id: 1,
                ts_ms: 1,
                bytes_received: 0,
                transport: z,
                principal: z,
                process_name: z,
                server_name: z,
                tool_name: z,
                method: z,
                request_id: z,
                decision: z,
                policy_rule: opt(0),
                policy_reason: opt(1),
                arguments_preview: z,
                request_digest: opt(2),
            },
            2 => Op::CallEnd {
                id: 1,
                duration_us: 0,
                bytes_sent: 0,
                decided_at_ms: None,
                decision: z,
                policy_rule: opt(0),
                policy_reason: opt(1),
                error_message: opt(2),
                approved_by: opt(3),
                response_preview: z,
                response_digest: opt(4),
                rewritten_digest: opt(5),
                original_digest: opt(6),
            },
            3 => Op::RuleEvent {
                call_id: 1,
                seq: 0,
                ts_ms: 1,
                rule_id: z,
                action: z,
                phase: z,
                layer: z,
            },
            _ => Op::Event {
                ts_ms: 1,
                kind: z,
                detail: z,
            },
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]
        /// Whatever is staged and dropped, every kept op reads back exactly the bytes it
        /// was staged with, across arena reclaims, and the bounds hold.
        #[test]
        fn kept_ops_read_back_intact(
            max_rows in 1usize..12,
            max_bytes in 64usize..2048,
            ops in proptest::collection::vec(
                (0u8..5, proptest::prelude::any::<u8>(),
                 proptest::collection::vec("[a-z0-9]{0,40}", 12)),
                1..80,
            ),
        ) {
            let mut staged = Staged::new(max_rows, max_bytes);
            let mut model: VecDeque<Vec<String>> = VecDeque::new();
            for (kind, present, texts) in &ops {
                let mut op = template(*kind, *present);
                let mut texts = texts.iter();
                let mut contents = Vec::new();
                op.visit_spans(&mut |span| {
                    let text = texts.next().cloned().unwrap_or_default();
                    *span = staged.push_bytes(text.as_bytes());
                    contents.push(text);
                });
                staged.push_op(op);
                model.push_back(contents);
                while model.len() > staged.len() {
                    model.pop_front();
                }
                proptest::prop_assert!(staged.len() <= max_rows);
                proptest::prop_assert!(staged.live_bytes() <= max_bytes || staged.len() == 1);
                proptest::prop_assert!(staged.arena.len() <= 2 * staged.live_bytes() + 1024);
            }
            proptest::prop_assert_eq!(staged.len() as u64 + staged.dropped_rows(), ops.len() as u64);
            for (op, expected) in staged.ops().zip(&model) {
                let mut got = Vec::new();
                op.clone().visit_spans(&mut |span| {
                    got.push(String::from_utf8(staged.bytes(*span).to_vec()).unwrap());
                });
                proptest::prop_assert_eq!(&got, expected);
            }
        }
    }

    #[test]
    fn clear_resets_everything() {
        let mut staged = Staged::new(1, 1 << 20);
        event(&mut staged, "a");
        event(&mut staged, "b");
        assert_eq!(staged.dropped_rows(), 1);
        staged.clear_committed();
        assert_eq!(
            (staged.len(), staged.live_bytes(), staged.dropped_rows()),
            (0, 0, 0)
        );
    }
}
