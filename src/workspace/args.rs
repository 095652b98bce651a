//! The arguments of the `ws` tools. They may arrive flat or wrapped as `{"input": {...}}`;
//! both mean the same, and the gateway should unwrap before policy sees them so a rule on
//! `command` cannot be dodged by wrapping.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::borrow::Cow;

use super::error::WsError;

/// The arguments themselves: the object under `input` when that is the only key and holds
/// an object, else the arguments as given.
pub fn unwrap_input(arguments: &Value) -> &Value {
    if let Some(map) = arguments.as_object()
        && map.len() == 1
        && let Some(inner) = map.get("input")
        && inner.is_object()
    {
        return inner;
    }
    arguments
}

/// [`unwrap_input`] over JSON text, for the gateway: `Cow::Borrowed` when nothing changes.
pub fn unwrap_input_text(arguments: &str) -> Cow<'_, str> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v) => {
            let inner = unwrap_input(&v);
            if std::ptr::eq(inner, &v) {
                Cow::Borrowed(arguments)
            } else {
                Cow::Owned(inner.to_string())
            }
        }
        Err(_) => Cow::Borrowed(arguments),
    }
}

/// Parses a tool's arguments (flat or wrapped) into its argument struct.
pub fn parse<T: DeserializeOwned>(tool: &str, arguments: &Value) -> Result<T, WsError> {
    T::deserialize(unwrap_input(arguments)).map_err(|e| WsError::invalid(format!("{tool}: {e}")))
}

/// Seconds, as a JSON number (fractions allowed), never negative.
fn seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    use serde::de::Error;
    let v = Option::<f64>::deserialize(d)?;
    match v {
        Some(s) if !s.is_finite() || s < 0.0 => Err(D::Error::custom(
            "timeout must be a number of seconds, 0 or more",
        )),
        other => Ok(other),
    }
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct WorkerOnly {
    #[serde(default)]
    pub worker: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub command: String,
    /// `shell_run`: seconds to wait before the command goes on as a task.
    /// `shell_dispatch`: seconds the task may run before it is cancelled.
    #[serde(default, deserialize_with = "seconds")]
    pub timeout: Option<f64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct TaskArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub task_id: String,
    /// `task_wait` only.
    #[serde(default, deserialize_with = "seconds")]
    pub timeout: Option<f64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    #[serde(default)]
    pub worker: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub path: String,
    /// Byte offset to start at.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Bytes to read at most.
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    #[serde(rename = "utf-8", alias = "utf8", alias = "text")]
    Utf8,
    Base64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub create_dirs: bool,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct EditOperation {
    pub old: String,
    pub new: String,
    /// How many times `old` must occur (default 1); every occurrence is replaced.
    #[serde(default)]
    pub count: Option<u64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub path: String,
    pub operations: Vec<EditOperation>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub pattern: String,
    #[serde(default)]
    pub root: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    #[serde(default)]
    pub worker: Option<String>,
    pub pattern: String,
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub regex: bool,
    /// Only files whose name (or relative path, when it holds a `/`) matches this glob.
    #[serde(default)]
    pub glob: Option<String>,
    #[serde(default)]
    pub case_insensitive: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_wrapping_is_transparent() {
        let flat = json!({"worker": "w", "command": "ls"});
        let wrapped = json!({"input": {"worker": "w", "command": "ls"}});
        assert_eq!(unwrap_input(&wrapped), &flat);
        assert_eq!(unwrap_input(&flat), &flat);
        // Only a lone `input` holding an object is a wrapper.
        let two = json!({"input": {"a": 1}, "worker": "w"});
        assert_eq!(unwrap_input(&two), &two);
        let scalar = json!({"input": "text"});
        assert_eq!(unwrap_input(&scalar), &scalar);
        let a: ShellArgs = parse("shell_run", &wrapped).expect("wrapped");
        let b: ShellArgs = parse("shell_run", &flat).expect("flat");
        assert_eq!((a.command, a.worker), (b.command, b.worker));
        assert!(matches!(
            unwrap_input_text(r#"{"command":"x"}"#),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            unwrap_input_text(r#"{"input":{"command":"rm -rf /"}}"#),
            r#"{"command":"rm -rf /"}"#
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_the_tool_named() {
        let e = parse::<ShellArgs>("shell_run", &json!({"commnd": "ls"})).expect_err("typo");
        assert!(e.message.starts_with("shell_run:"), "{e}");
        assert!(parse::<ShellArgs>("shell_run", &json!({"command": "ls", "timeout": -1})).is_err());
        let t: ShellArgs =
            parse("shell_run", &json!({"command": "ls", "timeout": 0.5})).expect("fraction");
        assert_eq!(t.timeout, Some(0.5));
        let w: WriteArgs = parse(
            "file_write",
            &json!({"path": "a", "content": "AA==", "encoding": "base64"}),
        )
        .expect("base64");
        assert_eq!(w.encoding, Encoding::Base64);
    }
}
