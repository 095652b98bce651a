//! The `ws` server's tool definitions, as agents see them (namespaced by the gateway:
//! `ws__shell_run`, ...). Arguments may also come wrapped as `{"input": {...}}`.

use serde_json::{Value, json};

/// The catalog server name of the workspace tools.
pub const SERVER: &str = "ws";

pub const WORKERS_LIST: &str = "workers_list";
pub const SYSTEM_INFO: &str = "system_info";
pub const SHELL_RUN: &str = "shell_run";
pub const SHELL_DISPATCH: &str = "shell_dispatch";
pub const TASK_GET: &str = "task_get";
pub const TASK_WAIT: &str = "task_wait";
pub const TASK_LIST: &str = "task_list";
pub const TASK_CANCEL: &str = "task_cancel";
pub const FILE_LIST: &str = "file_list";
pub const FILE_READ: &str = "file_read";
pub const FILE_WRITE: &str = "file_write";
pub const FILE_EDIT: &str = "file_edit";
pub const FILE_FIND: &str = "file_find";
pub const FILE_SEARCH: &str = "file_search";

/// Every tool name, in catalog order.
pub const ALL: [&str; 14] = [
    WORKERS_LIST,
    SYSTEM_INFO,
    SHELL_RUN,
    SHELL_DISPATCH,
    TASK_GET,
    TASK_WAIT,
    TASK_LIST,
    TASK_CANCEL,
    FILE_LIST,
    FILE_READ,
    FILE_WRITE,
    FILE_EDIT,
    FILE_FIND,
    FILE_SEARCH,
];

/// Tools the worker runs on its file-tool threads (`threads`, `queue`); the others answer
/// on its loop or start and wait for tasks (`max_tasks`).
pub fn on_file_threads(name: &str) -> bool {
    matches!(
        name,
        FILE_LIST | FILE_READ | FILE_WRITE | FILE_EDIT | FILE_FIND | FILE_SEARCH
    )
}

/// Tools that only read (the MCP `readOnlyHint`).
fn read_only(name: &str) -> bool {
    matches!(
        name,
        WORKERS_LIST
            | SYSTEM_INFO
            | TASK_GET
            | TASK_WAIT
            | TASK_LIST
            | FILE_LIST
            | FILE_READ
            | FILE_FIND
            | FILE_SEARCH
    )
}

fn worker() -> Value {
    json!({
        "type": "string",
        "description": "The workspace: its id (wrk_...) or its name, as ws__workers_list shows"
    })
}

fn path(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

fn tool(name: &str, title: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "name": name,
        "title": title,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": required,
        },
        "annotations": {
            "readOnlyHint": read_only(name),
            "destructiveHint": !read_only(name),
            "openWorldHint": false,
        }
    })
}

/// The definitions, bare names (the gateway adds `ws__`).
pub fn definitions() -> Vec<Value> {
    let relative = "Path relative to the workspace root; absolute paths and .. are refused";
    vec![
        tool(
            WORKERS_LIST,
            "List workspaces",
            "Lists your workspaces: id, name, root directory and whether their worker is online.",
            json!({}),
            &[],
        ),
        tool(
            SYSTEM_INFO,
            "System information",
            "OS, kernel, hostname, CPUs and memory of the machine, and what the workspace may do: tools, limits, network, confinement.",
            json!({ "worker": worker() }),
            &["worker"],
        ),
        tool(
            SHELL_RUN,
            "Run a shell command",
            "Runs `/bin/sh -c command` in the workspace root and waits up to `timeout` seconds (default 30). A command still running then goes on as a task: the answer is {status: \"running\", task_id, preview, hint, next_actions}; follow it with ws__task_wait, ws__task_get or ws__task_cancel. A finished command answers {status: \"completed\"|\"failed\", exit_code, stdout, stderr, truncated, duration_ms}. No network unless the workspace grants ports; writes only inside the workspace.",
            json!({
                "worker": worker(),
                "command": { "type": "string", "description": "Shell command line" },
                "timeout": { "type": "number", "minimum": 0, "description": "Seconds to wait before the command goes on as a task (default 30)" }
            }),
            &["worker", "command"],
        ),
        tool(
            SHELL_DISPATCH,
            "Start a shell command as a task",
            "Starts `/bin/sh -c command` in the workspace root as a task and answers its task_id at once.",
            json!({
                "worker": worker(),
                "command": { "type": "string", "description": "Shell command line" },
                "timeout": { "type": "number", "minimum": 0, "description": "Seconds the task may run before it is cancelled (default and maximum: the workspace's task_max_runtime_secs)" }
            }),
            &["worker", "command"],
        ),
        tool(
            TASK_GET,
            "Get a task",
            "The state of a task: status, exit code, output so far (head and tail beyond the cap), duration.",
            json!({ "worker": worker(), "task_id": { "type": "string" } }),
            &["worker", "task_id"],
        ),
        tool(
            TASK_WAIT,
            "Wait for a task",
            "Waits up to `timeout` seconds (default 30) for a task to end; answers its result, or its running status with a preview.",
            json!({
                "worker": worker(),
                "task_id": { "type": "string" },
                "timeout": { "type": "number", "minimum": 0, "description": "Seconds to wait (default 30)" }
            }),
            &["worker", "task_id"],
        ),
        tool(
            TASK_LIST,
            "List tasks",
            "Recent tasks of the workspace, newest first: running ones and finished ones still kept.",
            json!({ "worker": worker() }),
            &["worker"],
        ),
        tool(
            TASK_CANCEL,
            "Cancel a task",
            "Stops a task: SIGTERM to every process of it, SIGKILL after a grace period; answers once it is gone.",
            json!({ "worker": worker(), "task_id": { "type": "string" } }),
            &["worker", "task_id"],
        ),
        tool(
            FILE_LIST,
            "List a directory",
            "Entries of a directory in the workspace (name, type, size, mode, modification time); links are shown, not followed.",
            json!({ "worker": worker(), "path": path("Directory relative to the workspace root (default: the root)") }),
            &["worker"],
        ),
        tool(
            FILE_READ,
            "Read a file",
            "Reads `limit` bytes from byte `offset` of a file: UTF-8 text as is, anything else as base64 (see `encoding`). `next_offset` continues.",
            json!({
                "worker": worker(),
                "path": path(relative),
                "offset": { "type": "integer", "minimum": 0, "description": "Byte offset (default 0)" },
                "limit": { "type": "integer", "minimum": 0, "description": "Bytes to read (default and maximum: the workspace's max_read_bytes)" }
            }),
            &["worker", "path"],
        ),
        tool(
            FILE_WRITE,
            "Write a file",
            "Writes a whole file (replacing it if it exists; its permissions are kept). `create_dirs` creates missing parent directories.",
            json!({
                "worker": worker(),
                "path": path(relative),
                "content": { "type": "string" },
                "encoding": { "type": "string", "enum": ["utf-8", "base64"], "description": "How content is given (default utf-8)" },
                "create_dirs": { "type": "boolean", "description": "Create missing parent directories (default false)" }
            }),
            &["worker", "path", "content"],
        ),
        tool(
            FILE_EDIT,
            "Edit a file",
            "Replaces text in a UTF-8 file. Operations apply in order; each `old` must occur exactly `count` times (default 1) and every occurrence is replaced. If any operation does not match, nothing is written and the error names it.",
            json!({
                "worker": worker(),
                "path": path(relative),
                "operations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "old": { "type": "string" },
                            "new": { "type": "string" },
                            "count": { "type": "integer", "minimum": 1 }
                        },
                        "required": ["old", "new"]
                    }
                }
            }),
            &["worker", "path", "operations"],
        ),
        tool(
            FILE_FIND,
            "Find files by name",
            "Finds files and directories whose name matches a glob (`*.rs`), or whose path relative to `root` does when the glob holds a `/` (`src/**/*.rs`). Links are not followed; results are bounded.",
            json!({
                "worker": worker(),
                "pattern": { "type": "string", "description": "Glob" },
                "root": path("Directory to search under (default: the workspace root)")
            }),
            &["worker", "pattern"],
        ),
        tool(
            FILE_SEARCH,
            "Search file contents",
            "Finds lines containing `pattern` (a regular expression when `regex` is true) in files under `root`. Binary and large files are skipped; results are bounded.",
            json!({
                "worker": worker(),
                "pattern": { "type": "string" },
                "root": path("Directory to search under (default: the workspace root)"),
                "regex": { "type": "boolean", "description": "Treat pattern as a regular expression (default false)" },
                "glob": { "type": "string", "description": "Only files whose name matches this glob" },
                "case_insensitive": { "type": "boolean" }
            }),
            &["worker", "pattern"],
        ),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_tool_is_defined_once_with_a_schema() {
        let defs = super::definitions();
        let names: Vec<&str> = defs.iter().filter_map(|d| d["name"].as_str()).collect();
        assert_eq!(names, super::ALL.to_vec());
        for d in &defs {
            assert_eq!(d["inputSchema"]["type"], "object");
            let name = d["name"].as_str().unwrap_or_default();
            let required = d["inputSchema"]["required"].as_array().expect("required");
            assert_eq!(
                required.iter().any(|r| r == "worker"),
                name != super::WORKERS_LIST,
                "{name}"
            );
        }
    }
}
