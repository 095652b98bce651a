//! The errors of the `ws` tools: `isError: true` with `{code, mcp_error_code, message}`,
//! the shape of every other refusal toolwall gives an agent.

use serde_json::{Value, json};

use crate::mcp::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS, TRANSPORT_ERROR};
use crate::mcp::tool_error::tool_error_result;

/// JSON-RPC's generic server error, for refusals that are about the server's state.
const SERVER_ERROR: i64 = -32000;

/// Stable codes an agent can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsErrorCode {
    InvalidArguments,
    /// No workspace by that id or name among the caller's (another owner's is not found
    /// either).
    WorkerNotFound,
    /// The workspace exists but its worker is not running or not attested.
    WorkerOffline,
    /// An absolute path, `..`, or a link leading out of the root.
    PathOutsideWorkspace,
    NotFound,
    IsDirectory,
    NotDirectory,
    /// A FIFO, device or socket: the file tools read and write regular files only.
    NotRegularFile,
    /// `file_edit` on a file that is not UTF-8 text.
    NotText,
    TooLarge,
    /// A `file_edit` operation did not match as many times as expected; nothing written.
    EditMismatch,
    TaskNotFound,
    /// Every task slot holds a running task.
    TooManyTasks,
    /// The file tools' threads and queue are full.
    Busy,
    /// The kernel (the sandbox) refused the operation.
    PermissionDenied,
    Timeout,
    IoError,
    Internal,
}

impl WsErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            WsErrorCode::InvalidArguments => "invalid_arguments",
            WsErrorCode::WorkerNotFound => "worker_not_found",
            WsErrorCode::WorkerOffline => "worker_offline",
            WsErrorCode::PathOutsideWorkspace => "path_outside_workspace",
            WsErrorCode::NotFound => "not_found",
            WsErrorCode::IsDirectory => "is_directory",
            WsErrorCode::NotDirectory => "not_directory",
            WsErrorCode::NotRegularFile => "not_regular_file",
            WsErrorCode::NotText => "not_text",
            WsErrorCode::TooLarge => "too_large",
            WsErrorCode::EditMismatch => "edit_mismatch",
            WsErrorCode::TaskNotFound => "task_not_found",
            WsErrorCode::TooManyTasks => "too_many_tasks",
            WsErrorCode::Busy => "busy",
            WsErrorCode::PermissionDenied => "permission_denied",
            WsErrorCode::Timeout => "timeout",
            WsErrorCode::IoError => "io_error",
            WsErrorCode::Internal => "internal",
        }
    }

    /// The JSON-RPC code carried alongside: -32602 for what the arguments got wrong,
    /// -32001 for an unreachable worker or a timeout, -32000 for the server's state,
    /// -32603 for failures of the server itself.
    pub fn mcp_error_code(self) -> i64 {
        match self {
            WsErrorCode::InvalidArguments
            | WsErrorCode::WorkerNotFound
            | WsErrorCode::PathOutsideWorkspace
            | WsErrorCode::NotFound
            | WsErrorCode::IsDirectory
            | WsErrorCode::NotDirectory
            | WsErrorCode::NotRegularFile
            | WsErrorCode::NotText
            | WsErrorCode::TooLarge
            | WsErrorCode::EditMismatch
            | WsErrorCode::TaskNotFound => INVALID_PARAMS,
            WsErrorCode::WorkerOffline | WsErrorCode::Timeout => TRANSPORT_ERROR,
            WsErrorCode::TooManyTasks | WsErrorCode::Busy | WsErrorCode::PermissionDenied => {
                SERVER_ERROR
            }
            WsErrorCode::IoError | WsErrorCode::Internal => INTERNAL_ERROR,
        }
    }
}

/// A refusal or failure of a `ws` tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsError {
    pub code: WsErrorCode,
    pub message: String,
}

impl WsError {
    pub fn new(code: WsErrorCode, message: impl Into<String>) -> WsError {
        WsError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> WsError {
        WsError::new(WsErrorCode::InvalidArguments, message)
    }

    /// An OS error on `what`, with the code that says what went wrong.
    pub fn io(what: &str, e: &std::io::Error) -> WsError {
        use std::io::ErrorKind;
        let code = match e.kind() {
            ErrorKind::NotFound => WsErrorCode::NotFound,
            ErrorKind::PermissionDenied => WsErrorCode::PermissionDenied,
            ErrorKind::IsADirectory => WsErrorCode::IsDirectory,
            ErrorKind::NotADirectory => WsErrorCode::NotDirectory,
            ErrorKind::FileTooLarge => WsErrorCode::TooLarge,
            _ if e.raw_os_error() == Some(libc::EXDEV) || e.raw_os_error() == Some(libc::ELOOP) => {
                WsErrorCode::PathOutsideWorkspace
            }
            _ => WsErrorCode::IoError,
        };
        let message = match code {
            WsErrorCode::PermissionDenied => format!("{what}: refused by the sandbox ({e})"),
            WsErrorCode::PathOutsideWorkspace => {
                format!(
                    "{what}: a link on the way leads outside the workspace or is absolute ({e})"
                )
            }
            _ => format!("{what}: {e}"),
        };
        WsError::new(code, message)
    }

    /// The `CallToolResult` an agent receives.
    pub fn to_result(&self) -> Value {
        tool_error_result(
            self.code.as_str(),
            self.code.mcp_error_code(),
            &self.message,
            None,
        )
    }
}

impl std::fmt::Display for WsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// A successful result: the value as JSON text (what most clients show the model) and as
/// `structuredContent`.
pub fn ok_result(value: Value) -> Value {
    let text = value.to_string();
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_code_mcp_code_and_message() {
        let e = WsError::new(WsErrorCode::PathOutsideWorkspace, "../x leaves the root");
        let r = e.to_result();
        assert_eq!(r["isError"], true);
        let err = &r["structuredContent"]["error"];
        assert_eq!(err["code"], "path_outside_workspace");
        assert_eq!(err["mcp_error_code"], INVALID_PARAMS);
        assert_eq!(err["message"], "../x leaves the root");
        let text: Value =
            serde_json::from_str(r["content"][0]["text"].as_str().expect("text")).expect("json");
        assert_eq!(&text, err);
        assert_eq!(WsErrorCode::WorkerOffline.mcp_error_code(), TRANSPORT_ERROR);
    }

    #[test]
    fn os_errors_map_to_codes() {
        let nf = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(WsError::io("a", &nf).code, WsErrorCode::NotFound);
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(
            WsError::io("a", &denied).code,
            WsErrorCode::PermissionDenied
        );
        let xdev = std::io::Error::from_raw_os_error(libc::EXDEV);
        assert_eq!(
            WsError::io("a", &xdev).code,
            WsErrorCode::PathOutsideWorkspace
        );
    }
}
