//! `file_edit`'s semantics, pure: a list of `{old, new, count?}` replacements applied in
//! order, each to the text the previous ones left. Each `old` must occur exactly `count`
//! times (default 1), or nothing is written and the error names the failing operation.

use super::args::EditOperation;
use super::error::{WsError, WsErrorCode};

/// Most operations one call may carry.
pub const MAX_OPERATIONS: usize = 1000;
/// How much of a failing `old` the error quotes.
const QUOTE_CHARS: usize = 80;

/// The edited text and the number of replacements made.
pub fn apply_edits(
    text: &str,
    operations: &[EditOperation],
    max_bytes: usize,
) -> Result<(String, u64), WsError> {
    if operations.is_empty() {
        return Err(WsError::invalid("file_edit: operations is empty"));
    }
    if operations.len() > MAX_OPERATIONS {
        return Err(WsError::new(
            WsErrorCode::TooLarge,
            format!(
                "file_edit: {} operations (at most {MAX_OPERATIONS})",
                operations.len()
            ),
        ));
    }
    let total = operations.len();
    let mut current = text.to_owned();
    let mut replacements = 0u64;
    for (i, op) in operations.iter().enumerate() {
        let n = i + 1;
        if op.old.is_empty() {
            return Err(WsError::invalid(format!(
                "file_edit: operation {n} of {total}: old is empty"
            )));
        }
        let expected = op.count.unwrap_or(1);
        if expected == 0 {
            return Err(WsError::invalid(format!(
                "file_edit: operation {n} of {total}: count must be at least 1"
            )));
        }
        let found = current.matches(op.old.as_str()).count() as u64;
        if found != expected {
            return Err(WsError::new(
                WsErrorCode::EditMismatch,
                format!(
                    "file_edit: operation {n} of {total}: old {} occurs {found} time{} where {expected} {} expected; nothing was written",
                    quote(&op.old),
                    if found == 1 { "" } else { "s" },
                    if expected == 1 { "was" } else { "were" },
                ),
            ));
        }
        // Growth is bounded before it is built.
        let grown = current.len() as u64
            + found * (op.new.len() as u64).saturating_sub(op.old.len() as u64);
        if grown > max_bytes as u64 {
            return Err(WsError::new(
                WsErrorCode::TooLarge,
                format!(
                    "file_edit: operation {n} of {total} would make the file {grown} bytes (max_write_bytes {max_bytes}); nothing was written"
                ),
            ));
        }
        current = current.replace(op.old.as_str(), &op.new);
        replacements += found;
    }
    Ok((current, replacements))
}

fn quote(text: &str) -> String {
    let mut q: String = text.chars().take(QUOTE_CHARS).collect();
    if q.len() < text.len() {
        q.push('…');
    }
    format!("{q:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(old: &str, new: &str, count: Option<u64>) -> EditOperation {
        EditOperation {
            old: old.into(),
            new: new.into(),
            count,
        }
    }

    #[test]
    fn operations_apply_in_order_with_exact_counts() {
        let (out, n) = apply_edits(
            "a b a c",
            &[op("a", "x", Some(2)), op("x c", "done", None)],
            1024,
        )
        .expect("edit");
        assert_eq!(out, "x b done");
        assert_eq!(n, 3);
    }

    #[test]
    fn a_count_mismatch_names_the_operation_and_changes_nothing() {
        let text = "one two two";
        for (ops, failing, found) in [
            (vec![op("one", "1", None), op("two", "2", None)], 2, 2),
            (vec![op("three", "3", None)], 1, 0),
            (vec![op("two", "2", Some(3))], 1, 2),
            (
                vec![
                    op("one", "1", None),
                    op("1", "x", None),
                    op("one", "y", None),
                ],
                3,
                0,
            ),
        ] {
            let e = apply_edits(text, &ops, 1024).expect_err("mismatch");
            assert_eq!(e.code, WsErrorCode::EditMismatch);
            let total = ops.len();
            assert!(
                e.message
                    .contains(&format!("operation {failing} of {total}"))
                    && e.message.contains(&format!("occurs {found} time")),
                "{e}"
            );
            assert!(e.message.contains("nothing was written"), "{e}");
        }
    }

    #[test]
    fn empty_old_zero_count_no_ops_and_growth_are_refused() {
        assert_eq!(
            apply_edits("x", &[op("", "y", None)], 1024)
                .expect_err("empty")
                .code,
            WsErrorCode::InvalidArguments
        );
        assert_eq!(
            apply_edits("x", &[op("x", "y", Some(0))], 1024)
                .expect_err("zero")
                .code,
            WsErrorCode::InvalidArguments
        );
        assert_eq!(
            apply_edits("x", &[], 1024).expect_err("none").code,
            WsErrorCode::InvalidArguments
        );
        let e = apply_edits("xx", &[op("x", "yyyy", Some(2))], 5).expect_err("growth");
        assert_eq!(e.code, WsErrorCode::TooLarge);
        // Overlapping occurrences count as the replacement sees them: non-overlapping.
        assert_eq!(
            apply_edits("aaa", &[op("aa", "b", None)], 16)
                .expect("one")
                .0,
            "ba"
        );
    }
}
