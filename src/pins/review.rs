//! What one listed tool means for its pin, decided without I/O: the intake thread reads the
//! tool's row inside a write transaction, asks [`review_tool`], and writes what it returns.
//!
//! For a server with `pin = "enforce"` or `"warn"`:
//! - **never seen**: on the server's first listing (a brand-new server) pinned on first
//!   sight and served; later, a new tool follows `new_tools`: `serve` pins and serves it
//!   (logged, recorded), `hold` keeps it pending, hidden, calls refused, until the operator
//!   approves its digest (logged, recorded);
//! - **the approved definition**: served (a waiting change is dropped: the upstream went
//!   back; an old four-field pin is upgraded to the whole definition);
//! - **another definition**: recorded as pending (`pins list` shows it with its digest);
//!   `enforce` hides the tool and refuses its calls, `warn` serves it and logs the change.
//!
//! Tools no longer listed: a held new tool is dropped at once (it was never trusted); an
//! approved pin is pruned once the tool has been gone for `pin_retention_secs`.

use super::digest::{Pinned, SCHEME, changed_fields};
use super::store::{Approved, Pending, PinRecord, PinSummary};
use super::{NewTools, PinMode};

/// How many tools a summary names of each kind of event (the rest are counted).
pub const SAMPLE: usize = 20;

/// What the review of one server's listing knows besides the tools.
#[derive(Debug, Clone)]
pub struct ReviewCtx {
    pub server: String,
    pub mode: PinMode,
    pub new_tools: NewTools,
    /// The server has never been listed (and is no rename): trust on first sight.
    pub first_sight: bool,
    /// Held regardless of `new_tools` (a server that looks renamed without the operator
    /// saying so).
    pub force_hold: bool,
    /// Digests another configured server running the same program has approved: served
    /// (and pinned) on sight here, whatever else this server lists is held.
    pub vouched: std::collections::HashSet<String>,
    /// The servers those approvals belong to (for `approved_by`).
    pub vouched_by: String,
    pub now_ms: i64,
    /// A pin's `last_seen_ms` is rewritten only when older than this (not on every
    /// listing).
    pub touch_after_ms: i64,
    /// Concrete resources: a URI never pinned is pinned and served at once (a file server
    /// lists files that come and go); only a change of a pinned one waits for approval.
    pub new_on_sight: bool,
}

/// What happens to the tool now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Serve,
    /// Hidden from `tools/list`; calls are refused with this message.
    Hide(String),
}

/// What to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put(Box<PinRecord>),
    Touch,
}

/// What an operator is told about one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    FirstSight,
    NewServed {
        digest: String,
    },
    NewHeld {
        digest: String,
    },
    Changed {
        approved: String,
        seen: String,
        fields: Vec<String>,
        enforced: bool,
    },
    Reverted,
    Upgraded,
    /// Served because another server running the same program approved this digest.
    Vouched,
    /// A resource URI not pinned before: pinned and served (`new_on_sight`).
    NewResource,
    /// A resource URI not pinned before, served unpinned: its server has
    /// `max_resource_pins` pins already.
    OverPinBudget,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolReview {
    pub outcome: Outcome,
    pub write: Option<Write>,
    pub note: Option<Note>,
}

/// The operator approves the pending definition of `before`'s tool, exactly the one whose
/// digest is `digest`: the row to write, or why not (another definition is waiting now,
/// or none is).
pub fn approve(
    before: &PinRecord,
    digest: &str,
    by: &str,
    now_ms: i64,
) -> Result<PinRecord, String> {
    // Named as `pins list` shows them: an upstream's key (or what the operator typed)
    // with a bidi override would reorder this very line.
    let tool = &super::visible::visible(&before.tool).0;
    let digest_shown = super::visible::visible(digest).0;
    let Some(pending) = before.pending.clone() else {
        return Err(match &before.approved {
            Some(a) if a.digest == digest => {
                format!("{tool} sha256:{digest_shown} is already approved")
            }
            Some(a) => format!(
                "{tool} has no definition waiting for approval (its approved one is sha256:{})",
                a.digest
            ),
            None => format!("{tool} has no definition waiting for approval"),
        });
    };
    if pending.digest != digest {
        return Err(format!(
            "{tool}: the definition waiting now is sha256:{}, not sha256:{digest_shown}; nothing was approved (run `toolwall pins list` again)",
            pending.digest
        ));
    }
    let mut after = before.clone();
    after.approved = Some(Approved {
        digest: pending.digest,
        definition: pending.definition,
        scheme: SCHEME,
        approved_ms: now_ms,
        approved_by: Some(by.to_owned()),
    });
    after.pending = None;
    Ok(after)
}

fn vouched_by(ctx: &ReviewCtx) -> String {
    format!("approved under server {} (same program)", ctx.vouched_by)
}

fn held_message(name: &str, server: &str, digest: &str) -> String {
    format!(
        "{name} is a new tool of server {server}, held until an operator approves it: toolwall pins approve {name} --digest {digest}"
    )
}

/// Review one listed tool (`name` is `server__tool`) against its row.
pub fn review_tool(
    ctx: &ReviewCtx,
    name: &str,
    existing: Option<&PinRecord>,
    pinned: &Pinned,
    v1_digest: impl FnOnce() -> String,
) -> ToolReview {
    let now = ctx.now_ms;
    let enforce = ctx.mode == PinMode::Enforce;
    let hold = ctx.force_hold || ctx.new_tools == NewTools::Hold;
    let pending_now = || Pending {
        digest: pinned.digest.clone(),
        definition: pinned.canonical.clone(),
        seen_ms: now,
    };
    let approve_now = |by: Option<&str>| Approved {
        digest: pinned.digest.clone(),
        definition: pinned.canonical.clone(),
        scheme: SCHEME,
        approved_ms: now,
        approved_by: by.map(str::to_owned),
    };
    let touch = |r: &PinRecord| (now - r.last_seen_ms > ctx.touch_after_ms).then_some(Write::Touch);
    let Some(row) = existing else {
        let mut record = PinRecord {
            tool: name.to_owned(),
            server: ctx.server.clone(),
            approved: None,
            pending: None,
            first_seen_ms: now,
            last_seen_ms: now,
        };
        if ctx.new_on_sight && !ctx.first_sight {
            record.approved = Some(approve_now(Some("a new resource")));
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::NewResource),
            };
        }
        if ctx.first_sight && !ctx.force_hold {
            record.approved = Some(approve_now(None));
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::FirstSight),
            };
        }
        if ctx.vouched.contains(&pinned.digest) {
            record.approved = Some(approve_now(Some(&vouched_by(ctx))));
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::Vouched),
            };
        }
        if !hold {
            record.approved = Some(approve_now(Some("new_tools = \"serve\"")));
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::NewServed {
                    digest: pinned.digest.clone(),
                }),
            };
        }
        record.pending = Some(pending_now());
        return ToolReview {
            outcome: Outcome::Hide(held_message(name, &ctx.server, &pinned.digest)),
            write: Some(Write::Put(Box::new(record))),
            note: Some(Note::NewHeld {
                digest: pinned.digest.clone(),
            }),
        };
    };
    let Some(approved) = &row.approved else {
        // A held new tool.
        if ctx.vouched.contains(&pinned.digest) || ctx.new_on_sight {
            let (by, note) = if ctx.new_on_sight {
                ("a new resource".to_owned(), Note::NewResource)
            } else {
                (vouched_by(ctx), Note::Vouched)
            };
            let mut record = row.clone();
            record.approved = Some(approve_now(Some(&by)));
            record.pending = None;
            record.last_seen_ms = now;
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(note),
            };
        }
        if !hold {
            let mut record = row.clone();
            record.approved = Some(approve_now(Some("new_tools = \"serve\"")));
            record.pending = None;
            record.last_seen_ms = now;
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::NewServed {
                    digest: pinned.digest.clone(),
                }),
            };
        }
        let hide = Outcome::Hide(held_message(name, &ctx.server, &pinned.digest));
        if row
            .pending
            .as_ref()
            .is_some_and(|p| p.digest == pinned.digest)
        {
            return ToolReview {
                outcome: hide,
                write: touch(row),
                note: None,
            };
        }
        let mut record = row.clone();
        record.pending = Some(pending_now());
        record.last_seen_ms = now;
        return ToolReview {
            outcome: hide,
            write: Some(Write::Put(Box::new(record))),
            note: Some(Note::NewHeld {
                digest: pinned.digest.clone(),
            }),
        };
    };
    let same = if approved.scheme == SCHEME {
        approved.digest == pinned.digest
    } else {
        v1_digest() == approved.digest
    };
    if same {
        if approved.scheme != SCHEME {
            // An old four-field pin, the same four fields: it now covers everything.
            let mut record = row.clone();
            record.approved = Some(Approved {
                digest: pinned.digest.clone(),
                definition: pinned.canonical.clone(),
                scheme: SCHEME,
                approved_ms: approved.approved_ms,
                approved_by: approved.approved_by.clone(),
            });
            record.pending = None;
            record.last_seen_ms = now;
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::Upgraded),
            };
        }
        if row.pending.is_some() {
            let mut record = row.clone();
            record.pending = None;
            record.last_seen_ms = now;
            return ToolReview {
                outcome: Outcome::Serve,
                write: Some(Write::Put(Box::new(record))),
                note: Some(Note::Reverted),
            };
        }
        return ToolReview {
            outcome: Outcome::Serve,
            write: touch(row),
            note: None,
        };
    }
    let fields = changed_fields(&approved.definition, &pinned.canonical);
    let outcome = if enforce {
        let uses = if name.starts_with("resource/") {
            "reads"
        } else {
            "calls"
        };
        Outcome::Hide(format!(
            "{name} changed since it was approved ({}); it is hidden and its {uses} are refused until an operator runs `toolwall pins approve {name} --digest {}`",
            fields.join(", "),
            pinned.digest
        ))
    } else {
        Outcome::Serve
    };
    if row
        .pending
        .as_ref()
        .is_some_and(|p| p.digest == pinned.digest)
    {
        return ToolReview {
            outcome,
            write: touch(row),
            note: None,
        };
    }
    let mut record = row.clone();
    record.pending = Some(pending_now());
    record.last_seen_ms = now;
    ToolReview {
        outcome,
        write: Some(Write::Put(Box::new(record))),
        note: Some(Note::Changed {
            approved: approved.digest.clone(),
            seen: pinned.digest.clone(),
            fields,
            enforced: enforce,
        }),
    }
}

/// What to do with the pins of tools a listing no longer holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Absent {
    /// Held new tools that vanished: dropped (never trusted, nothing to keep).
    pub drop_held: Vec<String>,
    /// Approved pins gone for longer than the retention, or beyond the cap: pruned.
    pub prune: Vec<String>,
}

/// Decide about `absent` pins (those of the server not in the listing). `cap`: most
/// approved pins of absent tools kept (the oldest go first beyond it).
pub fn absent(mut absent: Vec<PinSummary>, now_ms: i64, retention_ms: i64, cap: usize) -> Absent {
    let mut out = Absent::default();
    absent.sort_by_key(|p| std::cmp::Reverse(p.last_seen_ms));
    let mut kept = 0;
    for p in absent {
        if !p.approved {
            out.drop_held.push(p.tool);
        } else if now_ms - p.last_seen_ms > retention_ms || kept >= cap {
            out.prune.push(p.tool);
        } else {
            kept += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::digest::pinned;
    use serde_json::json;

    fn ctx(first_sight: bool, new_tools: NewTools, mode: PinMode) -> ReviewCtx {
        ReviewCtx {
            server: "up".into(),
            mode,
            new_tools,
            first_sight,
            force_hold: false,
            vouched: Default::default(),
            vouched_by: String::new(),
            now_ms: 1000,
            touch_after_ms: 100,
            new_on_sight: false,
        }
    }

    fn apply(r: &ToolReview, row: Option<PinRecord>) -> Option<PinRecord> {
        match &r.write {
            Some(Write::Put(p)) => Some((**p).clone()),
            Some(Write::Touch) | None => row,
        }
    }

    fn tool(desc: &str) -> Pinned {
        pinned(&json!({"name": "t", "description": desc}))
    }

    #[test]
    fn first_sight_then_change_then_revert() {
        let c = ctx(true, NewTools::Hold, PinMode::Enforce);
        let r = review_tool(&c, "up__t", None, &tool("a"), String::new);
        assert_eq!(r.outcome, Outcome::Serve);
        assert_eq!(r.note, Some(Note::FirstSight));
        let row = apply(&r, None);
        let c = ctx(false, NewTools::Hold, PinMode::Enforce);
        let r = review_tool(&c, "up__t", row.as_ref(), &tool("a"), String::new);
        assert_eq!((r.outcome.clone(), r.write.clone()), (Outcome::Serve, None));
        let r = review_tool(&c, "up__t", row.as_ref(), &tool("b"), String::new);
        let Outcome::Hide(why) = &r.outcome else {
            panic!()
        };
        assert!(
            why.contains(&tool("b").digest) && why.contains("description"),
            "{why}"
        );
        assert!(
            matches!(&r.note, Some(Note::Changed { fields, .. }) if fields == &vec!["description".to_string()])
        );
        let row = apply(&r, row);
        // Seen again: no note, no write.
        let again = review_tool(&c, "up__t", row.as_ref(), &tool("b"), String::new);
        assert_eq!((again.note, again.write), (None, None));
        // A third version replaces the pending one.
        let r3 = review_tool(&c, "up__t", row.as_ref(), &tool("c"), String::new);
        assert!(matches!(r3.note, Some(Note::Changed { .. })));
        let back = review_tool(&c, "up__t", row.as_ref(), &tool("a"), String::new);
        assert_eq!(
            (back.outcome, back.note),
            (Outcome::Serve, Some(Note::Reverted))
        );
        let Some(Write::Put(p)) = back.write else {
            panic!()
        };
        assert!(p.pending.is_none());
    }

    #[test]
    fn new_tools_hold_or_serve_and_warn_serves_changes() {
        let hold = ctx(false, NewTools::Hold, PinMode::Enforce);
        let r = review_tool(&hold, "up__n", None, &tool("a"), String::new);
        assert!(
            matches!(&r.outcome, Outcome::Hide(m) if m.contains("new tool") && m.contains("--digest"))
        );
        let held = apply(&r, None).unwrap();
        assert!(held.approved.is_none());
        // Switching the server to `serve` promotes it.
        let serve = ctx(false, NewTools::Serve, PinMode::Enforce);
        let r = review_tool(&serve, "up__n", Some(&held), &tool("a"), String::new);
        assert_eq!(r.outcome, Outcome::Serve);
        assert!(matches!(r.note, Some(Note::NewServed { .. })));
        let r = review_tool(&serve, "up__m", None, &tool("a"), String::new);
        assert_eq!(r.outcome, Outcome::Serve);
        let Some(Write::Put(p)) = &r.write else {
            panic!()
        };
        assert_eq!(
            p.approved.as_ref().unwrap().approved_by.as_deref(),
            Some("new_tools = \"serve\"")
        );
        // A suspected rename holds even under `serve` and even on first sight.
        let mut forced = ctx(true, NewTools::Serve, PinMode::Enforce);
        forced.force_hold = true;
        assert!(matches!(
            review_tool(&forced, "up__x", None, &tool("a"), String::new).outcome,
            Outcome::Hide(_)
        ));
        // warn: a change is served and noted.
        let warn = ctx(false, NewTools::Serve, PinMode::Warn);
        let row = apply(
            &review_tool(
                &ctx(true, NewTools::Serve, PinMode::Warn),
                "up__w",
                None,
                &tool("a"),
                String::new,
            ),
            None,
        );
        let r = review_tool(&warn, "up__w", row.as_ref(), &tool("b"), String::new);
        assert_eq!(r.outcome, Outcome::Serve);
        assert!(matches!(
            r.note,
            Some(Note::Changed {
                enforced: false,
                ..
            })
        ));
    }

    #[test]
    fn an_old_pin_is_upgraded_when_its_four_fields_match() {
        let c = ctx(false, NewTools::Hold, PinMode::Enforce);
        let def = json!({"name": "t", "description": "a", "title": "new field"});
        let v1 = crate::pins::digest::pinned_v1(&def);
        let row = PinRecord {
            tool: "up__t".into(),
            server: "up".into(),
            approved: Some(Approved {
                digest: v1.digest.clone(),
                definition: v1.canonical.clone(),
                scheme: 1,
                approved_ms: 5,
                approved_by: None,
            }),
            pending: None,
            first_seen_ms: 5,
            last_seen_ms: 5,
        };
        let p = pinned(&def);
        let r = review_tool(&c, "up__t", Some(&row), &p, || v1.digest.clone());
        assert_eq!((r.outcome, r.note), (Outcome::Serve, Some(Note::Upgraded)));
        let other = json!({"name": "t", "description": "b"});
        let r = review_tool(&c, "up__t", Some(&row), &pinned(&other), || {
            crate::pins::digest::pinned_v1(&other).digest
        });
        assert!(matches!(r.outcome, Outcome::Hide(_)));
    }

    #[test]
    fn a_refused_approval_names_the_key_as_pins_list_shows_it() {
        let row = PinRecord {
            tool: "resource/up__doc://a\u{202E}b".into(),
            server: "up".into(),
            approved: None,
            pending: Some(crate::pins::store::Pending {
                digest: "aa".into(),
                definition: "{}".into(),
                seen_ms: 1,
            }),
            first_seen_ms: 1,
            last_seen_ms: 1,
        };
        let e = approve(&row, "bb\u{2066}", "op", 2).unwrap_err();
        assert!(!e.contains('\u{202E}') && !e.contains('\u{2066}'), "{e}");
        assert!(
            e.contains("doc://a\\u{202e}b") && e.contains("bb\\u{2066}"),
            "{e}"
        );
    }

    #[test]
    fn last_seen_is_written_only_when_stale() {
        let c = ctx(false, NewTools::Hold, PinMode::Enforce);
        let mut row = apply(
            &review_tool(
                &ctx(true, NewTools::Hold, PinMode::Enforce),
                "up__t",
                None,
                &tool("a"),
                String::new,
            ),
            None,
        )
        .unwrap();
        row.last_seen_ms = 950;
        assert_eq!(
            review_tool(&c, "up__t", Some(&row), &tool("a"), String::new).write,
            None
        );
        row.last_seen_ms = 800;
        assert_eq!(
            review_tool(&c, "up__t", Some(&row), &tool("a"), String::new).write,
            Some(Write::Touch)
        );
    }

    #[test]
    fn absent_pins_held_dropped_old_pruned_cap_kept() {
        let s = |tool: &str, seen: i64, approved: bool| PinSummary {
            tool: tool.into(),
            last_seen_ms: seen,
            approved,
            pending: !approved,
        };
        let a = absent(
            vec![
                s("h", 990, false),
                s("old", 10, true),
                s("fresh1", 980, true),
                s("fresh2", 970, true),
            ],
            1000,
            500,
            1,
        );
        assert_eq!(a.drop_held, vec!["h".to_string()]);
        assert_eq!(a.prune, vec!["fresh2".to_string(), "old".to_string()]);
    }
}
