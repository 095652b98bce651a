//! `local__echo`: returns its text as one text block. Zero I/O: the probe for what the
//! path itself costs.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::mcp::tool_error::tool_error_result;

pub const NAME: &str = "echo";

pub fn definition() -> Value {
    json!({
        "name": NAME,
        "title": "Echo",
        "description": "Returns the given text unchanged. Useful to check the path to toolwall.",
        "inputSchema": {
            "type": "object",
            "properties": { "text": { "type": "string", "description": "Text to return" } },
            "required": ["text"],
            "additionalProperties": false
        },
        "annotations": { "readOnlyHint": true, "openWorldHint": false, "idempotentHint": true }
    })
}

#[derive(Deserialize)]
struct Args {
    text: String,
}

/// The CallToolResult as JSON text, from the arguments as JSON text.
pub fn call(arguments: &str) -> String {
    match serde_json::from_str::<Args>(arguments) {
        Ok(args) => {
            let mut out = String::with_capacity(args.text.len() + 48);
            out.push_str("{\"content\":[{\"type\":\"text\",\"text\":");
            // A String always serializes.
            out.push_str(&serde_json::to_string(&args.text).unwrap_or_default());
            out.push_str("}]}");
            out
        }
        Err(e) => {
            let message = format!("echo needs {{\"text\": string}}: {e}");
            tool_error_result("invalid_arguments", -32602, &message, None).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn echoes_and_refuses() {
        let ok: serde_json::Value =
            serde_json::from_str(&super::call(r#"{"text":"a\"b"}"#)).unwrap();
        assert_eq!(ok["content"][0]["text"], "a\"b");
        let bad: serde_json::Value = serde_json::from_str(&super::call(r#"{"t":1}"#)).unwrap();
        assert_eq!(bad["isError"], true);
    }
}
