//! A call's answer judged by its size before anything parses it (sans-IO): beyond the
//! gateway's `gateway.max_answer_bytes` or `gateway.max_json_nodes` (named in the call's
//! meta) it is refused as `too_large` here, in the worker, so neither the worker's
//! credential scrubber nor the gateway builds a tree of it, and the gateway refuses it
//! again on its own bounds whatever a worker says.

use super::error::{UpstreamError, UpstreamErrorCode};
use super::json_nodes;
use crate::workers::relay_wire::CallMeta;

/// `result` unless its text is beyond the bounds in `meta` (0: a bound not named, then
/// the largest the gateway could name).
pub fn check(
    server: &str,
    result: Result<String, UpstreamError>,
    meta: Option<&CallMeta>,
) -> Result<String, UpstreamError> {
    let text = result?;
    let max_bytes = meta
        .map(|m| m.max_answer_bytes)
        .filter(|n| *n > 0)
        .unwrap_or(crate::config::MAX_ANSWER_BYTES);
    if text.len() > max_bytes {
        return Err(UpstreamError::new(
            UpstreamErrorCode::TooLarge,
            format!(
                "server {server}: its answer is {} bytes, more than gateway.max_answer_bytes ({max_bytes})",
                text.len()
            ),
        ));
    }
    let max_nodes = meta
        .map(|m| m.max_json_nodes)
        .filter(|n| *n > 0)
        .unwrap_or(json_nodes::MAX_JSON_NODES);
    if json_nodes::within(text.as_bytes(), max_nodes).is_err() {
        return Err(UpstreamError::new(
            UpstreamErrorCode::TooLarge,
            format!(
                "server {server}: {}",
                json_nodes::too_many("its answer", max_nodes, "gateway.max_json_nodes")
            ),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_either_bound_is_too_large_and_names_the_key() {
        let meta = CallMeta {
            max_answer_bytes: 100,
            max_json_nodes: 10,
            ..CallMeta::default()
        };
        let ok = check("s", Ok(r#"{"content":[]}"#.into()), Some(&meta));
        assert_eq!(ok.unwrap(), r#"{"content":[]}"#);
        let long = check("s", Ok(format!("\"{}\"", "x".repeat(200))), Some(&meta)).unwrap_err();
        assert_eq!(long.code, UpstreamErrorCode::TooLarge);
        assert!(
            long.message.contains("gateway.max_answer_bytes (100)"),
            "{}",
            long.message
        );
        let many = check("s", Ok("[1,2,3,4,5,6,7,8,9,10,11]".into()), Some(&meta)).unwrap_err();
        assert!(
            many.message.contains("gateway.max_json_nodes"),
            "{}",
            many.message
        );
        // An error passes as it is.
        let e = UpstreamError::new(UpstreamErrorCode::Timeout, "late");
        assert_eq!(check("s", Err(e.clone()), Some(&meta)).unwrap_err(), e);
    }
}
